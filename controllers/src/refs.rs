//! `$(path)` references inside JSON values, resolved against a JSON document.
//!
//! A string that is exactly `$(path)` becomes the value found at `path` (any JSON type); a
//! reference inside a longer string is replaced by the value's text (a string as is, `null` as
//! nothing, other values as compact JSON). A value found at a path may hold references itself:
//! they are resolved first, against the same document; a chain that comes back to a path it
//! started from is an error naming the chain. Each path is resolved once per [`Resolver`].
//!
//! Paths follow gjson's syntax (ernest's templating uses gjson), the part of it that picks
//! values: `a.b.c` (object keys, `\.` for a dot inside a key), `items.2` (an array index),
//! `items.#` (an array's length), `items.#.name` (that key of every element),
//! `items.#(name=="web")` or `items.#[name="web"]` (the first element matching; a trailing `#`,
//! `#(...)#`, gives all of them), with `==` / `=`, `!=`, `<`, `<=`, `>`, `>=` against a quoted
//! string, a number, `true`, `false` or `null`.
//!
//! A reference whose first key is not in the document is left as it is: `$(date)` in a shell
//! command is not a reference. Once the first key matches, a path that finds nothing is an error.

use std::collections::HashMap;

use serde_json::Value;

/// Why references could not be resolved. `at` is where the reference was found (a dotted path
/// into the value being resolved, or `$(path)` of the value it came from).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("{at}: $({path}) finds nothing")]
    NotFound { at: String, path: String },
    #[error("{at}: $({text}) is not a valid path: {why}")]
    Syntax {
        at: String,
        text: String,
        why: String,
    },
    /// The paths of the chain; the first is repeated at the end.
    #[error("reference cycle: {}", .chain.iter().map(|p| format!("$({p})")).collect::<Vec<_>>().join(" -> "))]
    Cycle { chain: Vec<String> },
}

/// Whether the JSON `text` may hold a `$(` in a string: it has `$(`, or a `\u` escape (which
/// may spell one), found in one pass over bytes that are seldom `$` or `\`.
pub(crate) fn json_may_hold_refs(text: &str) -> bool {
    let bytes = text.as_bytes();
    memchr::memchr2_iter(b'$', b'\\', bytes).any(|at| {
        matches!(
            (bytes[at], bytes.get(at + 1)),
            (b'$', Some(b'(')) | (b'\\', Some(b'u'))
        )
    })
}

/// Whether `value` holds a `$(` anywhere (a cheap check before resolving).
pub fn has_refs(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains("$("),
        Value::Array(items) => items.iter().any(has_refs),
        Value::Object(map) => map.values().any(has_refs),
        _ => false,
    }
}

/// Resolves references against one document, remembering what it resolved.
pub struct Resolver<'d> {
    doc: &'d Value,
    done: HashMap<String, Value>,
    /// Paths being resolved, outermost first (for cycle detection).
    stack: Vec<String>,
}

impl<'d> Resolver<'d> {
    pub fn new(doc: &'d Value) -> Resolver<'d> {
        Resolver {
            doc,
            done: HashMap::new(),
            stack: Vec::new(),
        }
    }

    /// `value` with every reference replaced; `at` names where `value` is (for errors).
    pub fn resolve(&mut self, value: &Value, at: &str) -> Result<Value, RefError> {
        match value {
            Value::String(text) if text.contains("$(") => self.resolve_text(text, at),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| self.resolve(item, &format!("{at}.{i}")))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array),
            Value::Object(map) => {
                let mut out = serde_json::Map::with_capacity(map.len());
                for (key, item) in map {
                    let inner = if at.is_empty() {
                        key.clone()
                    } else {
                        format!("{at}.{key}")
                    };
                    out.insert(key.clone(), self.resolve(item, &inner)?);
                }
                Ok(Value::Object(out))
            }
            other => Ok(other.clone()),
        }
    }

    fn resolve_text(&mut self, text: &str, at: &str) -> Result<Value, RefError> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("$(") {
            let body = &rest[start + 2..];
            let Some(len) = closing_paren(body) else {
                break;
            };
            let path = &body[..len];
            let whole = start == 0 && len + 3 == rest.len() && out.is_empty();
            match self.lookup(path, at)? {
                None => out.push_str(&rest[..start + 3 + len]),
                Some(found) if whole => return Ok(found),
                Some(found) => {
                    out.push_str(&rest[..start]);
                    match found {
                        Value::String(s) => out.push_str(&s),
                        Value::Null => {}
                        other => out.push_str(&other.to_string()),
                    }
                }
            }
            rest = &body[len + 1..];
        }
        out.push_str(rest);
        Ok(Value::String(out))
    }

    /// The resolved value at `path`; `None` when its first key is not in the document.
    fn lookup(&mut self, path: &str, at: &str) -> Result<Option<Value>, RefError> {
        if let Some(found) = self.done.get(path) {
            return Ok(Some(found.clone()));
        }
        let steps = parse_path(path).map_err(|why| RefError::Syntax {
            at: at.to_string(),
            text: path.to_string(),
            why,
        })?;
        if let Some(Step::Key(first)) = steps.first()
            && self.doc.get(first.as_str()).is_none()
        {
            return Ok(None);
        }
        if let Some(pos) = self.stack.iter().position(|p| p == path) {
            let mut chain = self.stack[pos..].to_vec();
            chain.push(path.to_string());
            return Err(RefError::Cycle { chain });
        }
        let raw = select(self.doc, &steps).ok_or_else(|| RefError::NotFound {
            at: at.to_string(),
            path: path.to_string(),
        })?;
        self.stack.push(path.to_string());
        let resolved = self.resolve(&raw, &format!("$({path})"));
        self.stack.pop();
        let resolved = resolved?;
        self.done.insert(path.to_string(), resolved.clone());
        Ok(Some(resolved))
    }
}

/// The value at `path` in `doc` as it is there (references inside it are not resolved); `None`
/// when `path` is not a valid path or finds nothing. ernest's templating
/// (`ernest::template`) looks paths up with this.
pub(crate) fn find_path(doc: &Value, path: &str) -> Option<Value> {
    select(doc, &parse_path(path).ok()?)
}

/// Length of the path before the `)` closing `$(`, skipping parentheses and quotes inside
/// queries.
fn closing_paren(body: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => {
                if depth == 0 {
                    return Some(i);
                }
                depth -= 1;
            }
            _ => {}
        }
    }
    None
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    /// `#`: the length, or (followed by more steps) the rest applied to every element.
    Each,
    Query {
        path: Vec<Step>,
        op: Op,
        value: Value,
        all: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

fn parse_path(path: &str) -> Result<Vec<Step>, String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    let mut steps = Vec::new();
    let chars: Vec<char> = path.chars().collect();
    let mut i = 0;
    while i <= chars.len() {
        if chars.get(i) == Some(&'#') && matches!(chars.get(i + 1), Some('(') | Some('[')) {
            let close = if chars[i + 1] == '(' { ')' } else { ']' };
            let start = i + 2;
            let mut j = start;
            let mut quoted = false;
            while j < chars.len() && (quoted || chars[j] != close) {
                if chars[j] == '"' {
                    quoted = !quoted;
                }
                if chars[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            if j >= chars.len() {
                return Err(format!("`#{}` is not closed", chars[i + 1]));
            }
            let condition: String = chars[start..j].iter().collect();
            let mut all = false;
            j += 1;
            if chars.get(j) == Some(&'#') {
                all = true;
                j += 1;
            }
            steps.push(parse_query(&condition, all)?);
            match chars.get(j) {
                None => break,
                Some('.') => i = j + 1,
                Some(c) => return Err(format!("unexpected {c:?} after a query")),
            }
            continue;
        }
        let mut key = String::new();
        while i < chars.len() && chars[i] != '.' {
            if chars[i] == '\\' && i + 1 < chars.len() {
                i += 1;
            }
            key.push(chars[i]);
            i += 1;
        }
        if key.is_empty() {
            return Err("an empty key (two dots, or a dot at an end)".into());
        }
        steps.push(if key == "#" {
            Step::Each
        } else {
            Step::Key(key)
        });
        if i >= chars.len() {
            break;
        }
        i += 1;
        if i == chars.len() {
            return Err("an empty key (two dots, or a dot at an end)".into());
        }
    }
    Ok(steps)
}

fn parse_query(condition: &str, all: bool) -> Result<Step, String> {
    let ops = [
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("=", Op::Eq),
        ("<", Op::Lt),
        (">", Op::Gt),
    ];
    let (pos, text, op) = ops
        .iter()
        .filter_map(|(text, op)| condition.find(text).map(|pos| (pos, *text, *op)))
        .min_by_key(|(pos, text, _)| (*pos, std::cmp::Reverse(text.len())))
        .ok_or_else(|| format!("the query `{condition}` has no comparison"))?;
    let key = condition[..pos].trim();
    let raw = condition[pos + text.len()..].trim();
    let value = if raw.starts_with('"') {
        serde_json::from_str::<String>(raw)
            .map(Value::String)
            .map_err(|_| format!("the string {raw} is not closed or escaped well"))?
    } else {
        serde_json::from_str::<Value>(raw)
            .ok()
            .filter(|v| !v.is_object() && !v.is_array())
            .ok_or_else(|| format!("{raw:?}: a quoted string, a number, true, false or null"))?
    };
    Ok(Step::Query {
        path: parse_path(key)?,
        op,
        value,
        all,
    })
}

fn select(value: &Value, steps: &[Step]) -> Option<Value> {
    let Some((step, rest)) = steps.split_first() else {
        return Some(value.clone());
    };
    match step {
        Step::Key(key) => {
            let next = match value {
                Value::Object(map) => map.get(key)?,
                Value::Array(items) => items.get(key.parse::<usize>().ok()?)?,
                _ => return None,
            };
            select(next, rest)
        }
        Step::Each => {
            let items = value.as_array()?;
            if rest.is_empty() {
                return Some(Value::from(items.len()));
            }
            Some(Value::Array(
                items.iter().filter_map(|item| select(item, rest)).collect(),
            ))
        }
        Step::Query {
            path,
            op,
            value: wanted,
            all,
        } => {
            let items = value.as_array()?;
            let matches = |item: &&Value| {
                select(item, path).is_some_and(|found| compare(&found, *op, wanted))
            };
            if *all {
                Some(Value::Array(
                    items
                        .iter()
                        .filter(matches)
                        .filter_map(|item| select(item, rest))
                        .collect(),
                ))
            } else {
                select(items.iter().find(matches)?, rest)
            }
        }
    }
}

fn compare(found: &Value, op: Op, wanted: &Value) -> bool {
    use std::cmp::Ordering;
    let ordering = match (found, wanted) {
        (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(a), Some(b)) => a.partial_cmp(&b),
            _ => None,
        },
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (a, b) => (a == b).then_some(Ordering::Equal),
    };
    match op {
        Op::Eq => ordering == Some(Ordering::Equal),
        Op::Ne => ordering != Some(Ordering::Equal),
        Op::Lt => ordering == Some(Ordering::Less),
        Op::Le => matches!(ordering, Some(Ordering::Less | Ordering::Equal)),
        Op::Gt => ordering == Some(Ordering::Greater),
        Op::Ge => matches!(ordering, Some(Ordering::Greater | Ordering::Equal)),
    }
}

#[cfg(test)]
mod tests;
