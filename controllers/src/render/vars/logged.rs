//! What a role's deployment log says about its variables.
//!
//! The first attempt of a role after the daemon starts logs the variables whole (secrets masked),
//! or, when they are big, every top-level key with its value or, for a big value, its size and
//! digest. Every later attempt logs only what changed since the variables last logged for the
//! role: one line per added, changed or removed JSON path. The whole variables are always at
//! `GET /v1/roles_data` (`to_render.<role>`), and the entry says so when it leaves something out.

use std::fmt::Write as _;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{FULL_SCHEDULE_SHOWN, Masked, UNHASHED_VARS, is_secret};

/// Variables whose compact JSON is at most this long are logged whole on a role's first attempt.
pub(crate) const WHOLE_MAX: usize = 64 * 1024;
/// A value whose compact JSON is longer is shown as its kind, size and digest.
pub(crate) const VALUE_MAX: usize = 1024;
/// At most this many changed paths are listed; the rest are counted.
pub(crate) const PATHS_MAX: usize = 50;

/// The variables last logged for a role: the deployment that logged them, and the values.
pub struct Logged<'a> {
    pub deployment_id: &'a str,
    pub vars: &'a Map<String, Value>,
}

/// The role log's entry for `vars`, whole lines; `last`: the variables last logged for `role`
/// (`None` on its first attempt since the daemon started).
pub fn entry(role: &str, last: Option<Logged<'_>>, vars: &Map<String, Value>) -> String {
    match last {
        None => whole(role, vars),
        Some(last) => changes(role, &last, vars),
    }
}

fn where_whole(role: &str) -> String {
    format!("GET /v1/roles_data, to_render.{}", path_key(role, true))
}

/// The first entry: the variables whole when small, else each top-level key's value or digest.
fn whole(role: &str, vars: &Map<String, Value>) -> String {
    let masked = super::MaskedVars(vars);
    let size = serde_json::to_vec(&masked).map(|v| v.len()).unwrap_or(0);
    if size <= WHOLE_MAX {
        let mut text = String::from("Template variables: ");
        text.push_str(&serde_json::to_string_pretty(&masked).unwrap_or_default());
        text.push('\n');
        return text;
    }
    let mut shown = Map::new();
    for (key, value) in vars {
        let value = if key == "full_schedule" {
            Value::from(FULL_SCHEDULE_SHOWN)
        } else if is_secret(key) {
            Value::from("***")
        } else {
            match compact(value) {
                Some(text) if text.len() > VALUE_MAX => Value::from(digest(value, &text)),
                _ => serde_json::to_value(Masked(Some(value))).unwrap_or(Value::Null),
            }
        };
        shown.insert(key.clone(), value);
    }
    format!(
        "Template variables ({size} bytes; values over {VALUE_MAX} bytes shown as their size \
         and digest, the whole: {}): {}\n",
        where_whole(role),
        serde_json::to_string_pretty(&shown).unwrap_or_default()
    )
}

/// A later entry: the paths that differ from the variables last logged.
fn changes(role: &str, last: &Logged<'_>, vars: &Map<String, Value>) -> String {
    let mut lines = Lines::default();
    diff_objects(&mut String::new(), last.vars, vars, true, &mut lines);
    let Lines {
        shown: lines,
        count,
    } = lines;
    if count == 0 {
        return format!(
            "Template variables: unchanged since deployment {}\n",
            last.deployment_id
        );
    }
    let mut text = format!(
        "Template variables: {count} {} since deployment {} (the whole: {}):\n",
        if count == 1 { "change" } else { "changes" },
        last.deployment_id,
        where_whole(role)
    );
    for line in &lines {
        let _ = writeln!(text, "  {line}");
    }
    if count > PATHS_MAX {
        let _ = writeln!(text, "  ... and {} more", count - PATHS_MAX);
    }
    text
}

/// The differences found: the first [`PATHS_MAX`] as lines to print, and how many in all. The
/// lines past the limit are counted, not written: when a big shared value changes throughout,
/// writing thousands of lines only to drop them cost more than finding them.
#[derive(Default)]
struct Lines {
    shown: Vec<String>,
    count: usize,
}

impl Lines {
    /// Whether further lines are only counted (their paths need not be written).
    fn full(&self) -> bool {
        self.count >= PATHS_MAX
    }

    fn push(&mut self, line: impl FnOnce() -> String) {
        if self.count < PATHS_MAX {
            self.shown.push(line());
        }
        self.count += 1;
    }
}

/// The differences between two objects at `path`: the keys of `old` in order (removed or
/// changed), then the keys only `new` has (added). Both maps iterate in key order, so they are
/// walked side by side, one comparison of keys per step.
fn diff_objects(
    path: &mut String,
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    top: bool,
    out: &mut Lines,
) {
    // Values that change every pass, and the placeholder of the whole schedule.
    let skipped = |key: &String| top && UNHASHED_VARS.contains(&key.as_str());
    let mut added = Vec::new();
    let mut news = new.iter().filter(|(k, _)| !skipped(k)).peekable();
    for (key, old_value) in old.iter().filter(|(k, _)| !skipped(k)) {
        let mut new_value = None;
        while let Some((k, v)) = news.peek() {
            match (*k).cmp(key) {
                std::cmp::Ordering::Less => added.push(*news.peek().expect("peeked")),
                std::cmp::Ordering::Equal => new_value = Some(*v),
                std::cmp::Ordering::Greater => break,
            }
            news.next();
            if new_value.is_some() {
                break;
            }
        }
        let len = if out.full() {
            path.len()
        } else {
            push_key(path, key, top)
        };
        match new_value {
            None => out.push(|| format!("removed {path} (was {})", show(key, old_value))),
            Some(new_value) => diff(path, key, old_value, new_value, out),
        }
        path.truncate(len);
    }
    added.extend(news);
    for (key, new_value) in added {
        if out.full() {
            out.push(String::new);
            continue;
        }
        let len = push_key(path, key, top);
        out.push(|| format!("added {path}: {}", show(key, new_value)));
        path.truncate(len);
    }
}

/// Compares the values at `path` (whose last key is `key`), descending into objects and into
/// arrays of the same length.
fn diff(path: &mut String, key: &str, old: &Value, new: &Value, out: &mut Lines) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) if !is_secret(key) => {
            diff_objects(path, a, b, false, out)
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() && !is_secret(key) => {
            for (index, (a, b)) in a.iter().zip(b).enumerate() {
                let len = path.len();
                if !out.full() {
                    let _ = write!(path, "[{index}]");
                }
                diff(path, key, a, b, out);
                path.truncate(len);
            }
        }
        _ if old == new => {}
        _ => out.push(|| format!("changed {path}: {} -> {}", show(key, old), show(key, new))),
    }
}

/// Appends `key` to a dotted path; returns the length to truncate back to.
fn push_key(path: &mut String, key: &str, top: bool) -> usize {
    let len = path.len();
    if key_is_plain(key) {
        if !top {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push_str(&path_key(key, top));
    }
    len
}

fn key_is_plain(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A key as written in a path: plain keys as they are, others JSON-quoted (in brackets when not
/// at the start).
fn path_key(key: &str, first: bool) -> String {
    if key_is_plain(key) {
        key.to_string()
    } else if first {
        Value::from(key).to_string()
    } else {
        format!("[{}]", Value::from(key))
    }
}

/// A value as a change line shows it: compact JSON, secrets masked, big ones as a digest.
fn show(key: &str, value: &Value) -> String {
    if is_secret(key) {
        return "\"***\"".to_string();
    }
    match compact(value) {
        Some(text) if text.len() > VALUE_MAX => digest(value, &text),
        _ => serde_json::to_string(&Masked(Some(value))).unwrap_or_default(),
    }
}

fn compact(value: &Value) -> Option<String> {
    serde_json::to_string(value).ok()
}

/// `<object, 1048576 bytes, sha256:0123456789abcdef>`: the kind, the size of the compact JSON and
/// the start of its SHA-256 (of the value as it is, secrets included, so that any change shows).
fn digest(value: &Value, text: &str) -> String {
    let kind = match value {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        _ => "value",
    };
    let hash = Sha256::digest(text.as_bytes());
    format!(
        "<{kind}, {} bytes, sha256:{}>",
        text.len(),
        &hex::encode(hash)[..16]
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn after(old: Value, new: Value) -> String {
        let old = map(old);
        let last = Logged {
            deployment_id: "dep1",
            vars: &old,
        };
        entry("web", Some(last), &map(new))
    }

    #[test]
    fn the_first_entry_is_the_whole_variables_masked() {
        let text = entry(
            "web",
            None,
            &map(json!({"port": 80, "db_password": "hunter2", "full_schedule": {"x": 1}})),
        );
        assert_eq!(
            text,
            "Template variables: {\n  \"db_password\": \"***\",\n  \"full_schedule\": \
             \"(the whole schedule; see /v1/schedule)\",\n  \"port\": 80\n}\n"
        );
    }

    #[test]
    fn big_variables_are_logged_by_key_with_digests_of_big_values() {
        let big = "x".repeat(WHOLE_MAX);
        let text = entry("web", None, &map(json!({"port": 80, "blob": big})));
        assert!(text.len() < 1024, "{text}");
        assert!(text.starts_with(&format!(
            "Template variables ({} bytes; values over 1024 bytes shown as their size and \
             digest, the whole: GET /v1/roles_data, to_render.web): {{\n",
            WHOLE_MAX + 21
        )));
        assert!(
            text.contains("\"blob\": \"<string, 65538 bytes, sha256:"),
            "{text}"
        );
        assert!(text.contains("\"port\": 80"), "{text}");
    }

    #[test]
    fn changes_are_listed_by_path() {
        let text = after(
            json!({"deployment_id": "a", "timestamp": "t1", "version": "1.0",
                   "svc": {"web": {"image": "w:1", "port": 80}, "db": {"image": "d:1"}},
                   "hosts": ["a", "b"], "old": true}),
            json!({"deployment_id": "b", "timestamp": "t2", "version": "1.1",
                   "svc": {"web": {"image": "w:2", "port": 80}, "db": {"image": "d:1"},
                           "a.b": 1},
                   "hosts": ["a", "c"], "new": [1]}),
        );
        assert_eq!(
            text,
            "Template variables: 6 changes since deployment dep1 (the whole: GET /v1/roles_data, \
             to_render.web):\n\
             \x20 changed hosts[1]: \"b\" -> \"c\"\n\
             \x20 removed old (was true)\n\
             \x20 changed svc.web.image: \"w:1\" -> \"w:2\"\n\
             \x20 added svc[\"a.b\"]: 1\n\
             \x20 changed version: \"1.0\" -> \"1.1\"\n\
             \x20 added new: [1]\n"
        );
    }

    #[test]
    fn nothing_changed_but_the_pass() {
        let text = after(
            json!({"deployment_id": "a", "timestamp": "t1", "full_schedule": {"v": 1}, "x": 1}),
            json!({"deployment_id": "b", "timestamp": "t2", "full_schedule": {"v": 2}, "x": 1}),
        );
        assert_eq!(
            text,
            "Template variables: unchanged since deployment dep1\n"
        );
    }

    #[test]
    fn secrets_are_masked_in_changes_and_big_values_digested() {
        let big1 = "a".repeat(2000);
        let big2 = "b".repeat(2000);
        let text = after(
            json!({"db_password": "hunter2", "cfg": {"api": {"token": "t0k"}}, "blob": big1,
                   "list": [1, 2]}),
            json!({"db_password": "hunter3", "cfg": {"api": {"token": "t1k"}}, "blob": big2,
                   "list": [1, 2, 3]}),
        );
        assert!(!text.contains("hunter") && !text.contains("t0k") && !text.contains("t1k"));
        assert!(
            text.contains("  changed db_password: \"***\" -> \"***\"\n"),
            "{text}"
        );
        assert!(
            text.contains("  changed cfg.api.token: \"***\" -> \"***\"\n"),
            "{text}"
        );
        assert!(
            text.contains("  changed list: [1,2] -> [1,2,3]\n"),
            "{text}"
        );
        let line = text.lines().find(|l| l.contains("blob")).unwrap();
        let parts: Vec<&str> = line.split(" -> ").collect();
        assert!(parts[0].starts_with("  changed blob: <string, 2002 bytes, sha256:"));
        assert!(parts[1].starts_with("<string, 2002 bytes, sha256:"));
        assert_ne!(
            parts[0][parts[0].len() - 17..],
            parts[1][parts[1].len() - 17..]
        );
    }

    #[test]
    fn nested_changes_past_the_limit_are_counted_and_the_first_listed() {
        let services = |v: u32| -> Value {
            (0..80)
                .map(|i| {
                    (
                        format!("s{i:02}"),
                        json!({"image": format!("i:{v}"), "n": i}),
                    )
                })
                .collect::<Map<String, Value>>()
                .into()
        };
        let text = after(
            json!({"svc": services(1), "x": 1}),
            json!({"svc": services(2), "x": 2}),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("Template variables: 81 changes since deployment dep1"));
        assert_eq!(lines[1], "  changed svc.s00.image: \"i:1\" -> \"i:2\"");
        assert_eq!(
            lines[PATHS_MAX],
            "  changed svc.s49.image: \"i:1\" -> \"i:2\""
        );
        assert_eq!(lines[PATHS_MAX + 1], "  ... and 31 more");
        assert_eq!(lines.len(), PATHS_MAX + 2);
    }

    #[test]
    fn maps_iterate_in_key_order_as_the_side_by_side_walk_needs() {
        // serde_json's `preserve_order` feature would keep insertion order instead.
        let map = map(json!({"b": 1, "a": 2, "c": 3}));
        assert!(map.keys().is_sorted());
    }

    #[test]
    fn many_changes_are_counted_past_the_limit() {
        let old: Map<String, Value> = (0..60).map(|i| (format!("k{i:02}"), json!(i))).collect();
        let new: Map<String, Value> = (0..60)
            .map(|i| (format!("k{i:02}"), json!(i + 1)))
            .collect();
        let text = after(Value::Object(old), Value::Object(new));
        assert!(text.starts_with("Template variables: 60 changes since deployment dep1"));
        assert_eq!(text.lines().count(), 1 + PATHS_MAX + 1);
        assert!(text.ends_with("  ... and 10 more\n"), "{text}");
    }
}
