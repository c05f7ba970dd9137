//! ernest's templating of a dispatched change (`graph.templating: ernest`, the default).
//!
//! Only a string that is exactly `$(path)` (longer than three bytes, starting with `$(` and
//! ending with `)`) is a reference; a reference inside a longer string is text. The path is
//! looked up in the whole build ([`crate::refs::find_path`], gjson's paths) and the string
//! becomes the value's text as gjson gives it ([`gjson_text`]): a string as it is, a number in
//! plain decimal (`5432` → `"5432"`, `1e3` → `"1000"`), `true`/`false`, an object or array as
//! its JSON text. Found text that is itself a whole reference is looked up in turn. When the
//! text is empty or `null` (a `null`, an empty string, the string `"null"`) or nothing is
//! found, the string stays as it was: the change is dispatched with the `$(...)` text in it.
//! Nothing is ever refused.
//!
//! Where this differs from ernest: a chain of references that comes back to one it started
//! from leaves the string as it was (ernest recursed until its stack overflowed).
//!
//! `graph.templating: extended` uses [`crate::refs::Resolver`] instead: typed values,
//! references inside longer strings, and an unresolvable reference errors the component.

use serde_json::Value;

use crate::refs::find_path;

/// `value` with every string that is a whole `$(path)` reference replaced as ernest replaces it,
/// against `doc` (the whole build).
pub(crate) fn template(doc: &Value, value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(map_string(doc, text)),
        Value::Array(items) => Value::Array(items.iter().map(|v| template(doc, v)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), template(doc, v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The path of a string that is a whole reference (`$(path)`, more than three bytes).
pub(crate) fn whole_reference(text: &str) -> Option<&str> {
    if text.len() > 3 && text.starts_with("$(") && text.ends_with(')') {
        Some(&text[2..text.len() - 1])
    } else {
        None
    }
}

/// One string: replaced when it is a whole reference that finds a non-empty text.
fn map_string(doc: &Value, text: &str) -> String {
    let mut current = text.to_string();
    let mut seen: Vec<String> = Vec::new();
    loop {
        let Some(path) = whole_reference(&current) else {
            return current;
        };
        let found = find_path(doc, path).map_or_else(String::new, |v| gjson_text(&v));
        if whole_reference(&found).is_some() {
            // A reference to a reference: follow it, unless the chain comes back.
            seen.push(current);
            if seen.contains(&found) {
                return text.to_string();
            }
            current = found;
            continue;
        }
        if found.is_empty() || found == "null" {
            return current;
        }
        return found;
    }
}

/// A value as gjson's `Result.String()` gives it: a string as it is, `null` as nothing, a number
/// in plain decimal notation (through a 64-bit float, as gjson reads numbers), `true` and
/// `false`, an object or array as its compact JSON text.
pub(crate) fn gjson_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        // Rust prints an f64 in plain decimal, shortest round-trip digits, as Go's
        // `strconv.FormatFloat(f, 'f', -1, 64)` does.
        Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), |f| f.to_string()),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
