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

use super::json_text::{self, At, Kind};
use super::{FULL_SCHEDULE_SHOWN, Masked, UNHASHED_VARS, is_secret};
use crate::schedule::data::TextPart;

/// Variables whose compact JSON is at most this long are logged whole on a role's first attempt.
pub(crate) const WHOLE_MAX: usize = 64 * 1024;
/// A value whose compact JSON is longer is shown as its kind, size and digest.
pub(crate) const VALUE_MAX: usize = 1024;
/// At most this many changed paths are listed; past them, the entry only says there are more.
pub(crate) const PATHS_MAX: usize = 50;

/// The variables last logged for a role: the deployment that logged them, and the values.
pub struct Logged<'a> {
    pub deployment_id: &'a str,
    pub vars: &'a Map<String, Value>,
    /// Variables kept as text ([`TextPart`]), none of them a key of `vars`.
    pub texts: &'a [(String, TextPart)],
}

/// The role log's entry for `vars` and the variables kept as text, `texts` (none of them a key
/// of `vars`), whole lines; `last`: the variables last logged for `role` (`None` on its first
/// attempt since the daemon started).
pub fn entry(
    role: &str,
    last: Option<Logged<'_>>,
    vars: &Map<String, Value>,
    texts: &[(String, TextPart)],
) -> String {
    match last {
        None if texts.is_empty() => whole(role, vars),
        None => {
            // Once per role after a start: the values kept as text are parsed to be shown.
            let mut all = vars.clone();
            all.extend(texts.iter().map(|(key, part)| (key.clone(), part.parse())));
            whole(role, &all)
        }
        Some(last) => changes(role, &last, vars, texts),
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
                Some(text) if text.len() > VALUE_MAX => Value::from(digest(kind_of(value), &text)),
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

/// A value compared by the role log: a tree, or the canonical JSON text of one (a big value of
/// a role's own variables, kept as text; see [`TextPart`]).
#[derive(Clone, Copy)]
enum Item<'a> {
    Tree(&'a Value),
    Text(At<'a>),
}

/// The top-level variables, `vars` and `texts` together, in key order.
fn top_items<'a>(
    vars: &'a Map<String, Value>,
    texts: &'a [(String, TextPart)],
) -> Vec<(&'a str, Item<'a>)> {
    let mut items: Vec<(&str, Item)> = vars
        .iter()
        .map(|(k, v)| (k.as_str(), Item::Tree(v)))
        .collect();
    if !texts.is_empty() {
        items.extend(
            texts
                .iter()
                .map(|(k, p)| (k.as_str(), Item::Text(At::root(p.text(), p.tape())))),
        );
        items.sort_by(|a, b| a.0.cmp(b.0));
    }
    items
}

/// A later entry: the paths that differ from the variables last logged.
fn changes(
    role: &str,
    last: &Logged<'_>,
    vars: &Map<String, Value>,
    texts: &[(String, TextPart)],
) -> String {
    let mut lines = Lines::default();
    diff_objects(
        &mut String::new(),
        top_items(last.vars, last.texts),
        top_items(vars, texts),
        true,
        &mut lines,
    );
    let Lines {
        shown: lines,
        count,
        more,
    } = lines;
    if count == 0 {
        return format!(
            "Template variables: unchanged since deployment {}\n",
            last.deployment_id
        );
    }
    let mut text = match more {
        false => format!(
            "Template variables: {count} {} since deployment {} (the whole: {}):\n",
            if count == 1 { "change" } else { "changes" },
            last.deployment_id,
            where_whole(role)
        ),
        true => format!(
            "Template variables: more than {PATHS_MAX} changes since deployment {} (the first \
             {PATHS_MAX} listed; the whole: {}):\n",
            last.deployment_id,
            where_whole(role)
        ),
    };
    for line in &lines {
        let _ = writeln!(text, "  {line}");
    }
    if more {
        text.push_str("  ... and more\n");
    }
    text
}

/// The differences found: the first [`PATHS_MAX`] as lines to print, and whether there is
/// another. The search stops at that one: when a big shared value changes throughout, finding
/// (or even counting) its thousands of differences costs each node more CPU per change than
/// taking the schedule does, for lines the entry would not show.
#[derive(Default)]
struct Lines {
    shown: Vec<String>,
    count: usize,
    /// A difference past the first [`PATHS_MAX`] was found.
    more: bool,
}

impl Lines {
    /// Lines already full: the first difference found ends the search.
    fn full_already() -> Lines {
        Lines {
            shown: Vec::new(),
            count: PATHS_MAX,
            more: false,
        }
    }

    /// Whether the next difference is the one past the limit (its path need not be written).
    fn full(&self) -> bool {
        self.count >= PATHS_MAX
    }

    /// Whether the search is over: a difference past the limit was found.
    fn done(&self) -> bool {
        self.more
    }

    fn push(&mut self, line: impl FnOnce() -> String) {
        if self.count < PATHS_MAX {
            self.shown.push(line());
            self.count += 1;
        } else {
            self.more = true;
        }
    }
}

/// The entries of an object as items, in key order.
fn tree_items(map: &Map<String, Value>) -> impl Iterator<Item = (&str, Item<'_>)> {
    map.iter().map(|(k, v)| (k.as_str(), Item::Tree(v)))
}

/// The differences between two objects at `path`, given as their entries in key order: the keys
/// of `old` in order (removed or changed), then the keys only `new` has (added). Both are walked
/// side by side, one comparison of keys per step.
fn diff_objects<'a, K: AsRef<str>>(
    path: &mut String,
    old: impl IntoIterator<Item = (K, Item<'a>)>,
    new: impl IntoIterator<Item = (K, Item<'a>)>,
    top: bool,
    out: &mut Lines,
) {
    // Values that change every pass, and the placeholder of the whole schedule.
    let skipped = |key: &K| top && UNHASHED_VARS.contains(&key.as_ref());
    let mut added = Vec::new();
    let mut news = new.into_iter().filter(|(k, _)| !skipped(k)).peekable();
    for (key, old_value) in old.into_iter().filter(|(k, _)| !skipped(k)) {
        if out.done() {
            return;
        }
        let key = key.as_ref();
        let mut new_value = None;
        while let Some((k, _)) = news.peek() {
            let order = k.as_ref().cmp(key);
            if order == std::cmp::Ordering::Greater {
                break;
            }
            let (k, v) = news.next().expect("peeked");
            if order == std::cmp::Ordering::Equal {
                new_value = Some(v);
                break;
            }
            added.push((k, v));
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
            return;
        }
        let len = push_key(path, key.as_ref(), top);
        out.push(|| format!("added {path}: {}", show(key.as_ref(), new_value)));
        path.truncate(len);
    }
}

/// Compares the values at `path` (whose last key is `key`), descending into objects and into
/// arrays of the same length. Two texts are compared as text; a text and a tree, as trees.
fn diff(path: &mut String, key: &str, old: Item<'_>, new: Item<'_>, out: &mut Lines) {
    match (old, new) {
        (Item::Tree(old), Item::Tree(new)) => diff_trees(path, key, old, new, out),
        (Item::Text(old), Item::Text(new)) => diff_texts(path, key, old, new, out),
        (Item::Text(old), Item::Tree(new)) => {
            let old = serde_json::from_str(old.get()).expect("a checked JSON text");
            diff_trees(path, key, &old, new, out);
        }
        (Item::Tree(old), Item::Text(new)) => {
            let new = serde_json::from_str(new.get()).expect("a checked JSON text");
            diff_trees(path, key, old, &new, out);
        }
    }
}

fn diff_trees(path: &mut String, key: &str, old: &Value, new: &Value, out: &mut Lines) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) if !is_secret(key) => {
            diff_objects(path, tree_items(a), tree_items(b), false, out)
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() && !is_secret(key) => {
            for (index, (a, b)) in a.iter().zip(b).enumerate() {
                if out.done() {
                    return;
                }
                let len = path.len();
                if !out.full() {
                    let _ = write!(path, "[{index}]");
                }
                diff_trees(path, key, a, b, out);
                path.truncate(len);
            }
        }
        _ if old == new => {}
        _ => out.push(|| {
            format!(
                "changed {path}: {} -> {}",
                show(key, Item::Tree(old)),
                show(key, Item::Tree(new))
            )
        }),
    }
}

/// [`diff_trees`] of two canonical JSON texts, read through their tapes without building trees:
/// the same lines. Past [`PATHS_MAX`] lines, only whether they differ ([`differs`]).
fn diff_texts<'a>(path: &mut String, key: &str, old: At<'a>, new: At<'a>, out: &mut Lines) {
    if out.full() {
        out.more |= differs(key, old, new);
        return;
    }
    let (old_text, new_text) = (old.get(), new.get());
    if old_text == new_text {
        return;
    }
    if !is_secret(key) {
        match (json_text::kind(old_text), json_text::kind(new_text)) {
            (Kind::Object, Kind::Object) => {
                // Canonical objects (plain keys in increasing order, checked first) are walked
                // as they stand, as far as the lines go; others are taken apart and sorted.
                if plain_keys(&old) && plain_keys(&new) {
                    let items = |at: At<'a>| {
                        at.children().map(|(key, value)| {
                            let key = key.expect("an object's entries have keys").get();
                            (&key[1..key.len() - 1], Item::Text(value))
                        })
                    };
                    return diff_objects(path, items(old), items(new), false, out);
                }
                let (a, b) = (json_text::entries(&old), json_text::entries(&new));
                let items = |e: Vec<_>| e.into_iter().map(|(k, v)| (k, Item::Text(v)));
                return diff_objects(path, items(a), items(b), false, out);
            }
            (Kind::Array, Kind::Array) => {
                let (a, b) = (json_text::items(&old), json_text::items(&new));
                if a.len() == b.len() {
                    for (index, (a, b)) in a.into_iter().zip(b).enumerate() {
                        if out.done() {
                            return;
                        }
                        let len = path.len();
                        if !out.full() {
                            let _ = write!(path, "[{index}]");
                        }
                        diff_texts(path, key, a, b, out);
                        path.truncate(len);
                    }
                    return;
                }
            }
            _ => {}
        }
    }
    if same_value(old_text, new_text) {
        return;
    }
    out.push(|| {
        format!(
            "changed {path}: {} -> {}",
            show(key, Item::Text(old)),
            show(key, Item::Text(new))
        )
    });
}

/// Whether two canonical JSON texts that differ hold equal values (numbers written as floats:
/// `0.0` and `-0.0`).
fn same_value(old: &str, new: &str) -> bool {
    json_text::may_equal(old, new)
        && serde_json::from_str::<Value>(old).ok() == serde_json::from_str::<Value>(new).ok()
}

/// Whether [`diff_texts`] finds a difference between `old` and `new` (at a path whose last key
/// is `key`), decided without writing a line: the role log past [`PATHS_MAX`]. Both tapes are
/// walked side by side without allocating, up to the first difference (an object's keys
/// compared as they are written, which is their order when no key has an escape); an object
/// whose keys are not so (escapes, or not in increasing order: text that is not canonical) is
/// taken apart by [`json_text::entries`] as for listing.
fn differs(key: &str, old: At<'_>, new: At<'_>) -> bool {
    let (old_text, new_text) = (old.get(), new.get());
    if old_text == new_text {
        return false;
    }
    match (json_text::kind(old_text), json_text::kind(new_text)) {
        (Kind::Object, Kind::Object) if !is_secret(key) => {
            objects_differ(old, new).unwrap_or_else(|| entries_differ(old, new))
        }
        (Kind::Array, Kind::Array) if !is_secret(key) => {
            items_differ(key, old, new).unwrap_or_else(|| !same_value(old_text, new_text))
        }
        _ => !same_value(old_text, new_text),
    }
}

/// [`differs`] for two objects that are not canonical, through [`json_text::entries`].
#[cold]
#[inline(never)]
fn entries_differ(old: At<'_>, new: At<'_>) -> bool {
    let mut lines = Lines::full_already();
    let (a, b) = (json_text::entries(&old), json_text::entries(&new));
    let items = |e: Vec<_>| e.into_iter().map(|(k, v)| (k, Item::Text(v)));
    diff_objects(&mut String::new(), items(a), items(b), false, &mut lines);
    lines.more
}

/// [`differs`] for two arrays, item by item: `None` when their lengths differ (they are then
/// compared whole).
fn items_differ(key: &str, old: At<'_>, new: At<'_>) -> Option<bool> {
    let (mut olds, mut news) = (old.children(), new.children());
    loop {
        match (olds.next(), news.next()) {
            (None, None) => return Some(false),
            (Some((_, a)), Some((_, b))) => {
                if differs(key, a, b) {
                    return Some(true);
                }
            }
            _ => return None,
        }
    }
}

/// The next entry of `entries` (`Some(None)` past the last), its key as written; `None` when
/// that key is not plain or not after `last`.
#[inline(always)]
fn next_plain<'a>(
    entries: &mut json_text::Children<'a>,
    last: &mut Option<&'a str>,
) -> Option<Option<(&'a str, At<'a>)>> {
    let Some((key, value)) = entries.next() else {
        return Some(None);
    };
    let key = key?.get();
    let key = &key[1..key.len() - 1];
    if key.bytes().any(|b| b == b'\\') || last.is_some_and(|last| last >= key) {
        return None;
    }
    *last = Some(key);
    Some(Some((key, value)))
}

/// Whether the keys of the object at `at` are plain and each greater than the one before (as
/// in canonical text).
fn plain_keys(at: &At<'_>) -> bool {
    rest_plain(&mut at.children(), None)
}

/// Whether the keys left in `entries` are plain and each greater than the one before.
fn rest_plain<'a>(entries: &mut json_text::Children<'a>, mut last: Option<&'a str>) -> bool {
    loop {
        match next_plain(entries, &mut last) {
            Some(Some(_)) => {}
            Some(None) => return true,
            None => return false,
        }
    }
}

/// [`differs`] for two objects, walked side by side: `None` when a key of either has an escape
/// or is not greater than the key before it (the walk goes on past a difference to see that:
/// a key given twice may undo it).
fn objects_differ(old: At<'_>, new: At<'_>) -> Option<bool> {
    let (mut olds, mut news) = (old.children(), new.children());
    let (mut last_old, mut last_new) = (None, None);
    let mut a = next_plain(&mut olds, &mut last_old)?;
    let mut b = next_plain(&mut news, &mut last_new)?;
    loop {
        match (a, b) {
            (None, None) => return Some(false),
            (Some((old_key, old_value)), Some((new_key, new_value)))
                if old_key == new_key && !differs(old_key, old_value, new_value) =>
            {
                a = next_plain(&mut olds, &mut last_old)?;
                b = next_plain(&mut news, &mut last_new)?;
            }
            // A value that differs, a key removed or added.
            _ => {
                let plain = rest_plain(&mut olds, last_old) && rest_plain(&mut news, last_new);
                return plain.then_some(true);
            }
        }
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
fn show(key: &str, value: Item<'_>) -> String {
    if is_secret(key) {
        return "\"***\"".to_string();
    }
    match value {
        Item::Tree(value) => match compact(value) {
            Some(text) if text.len() > VALUE_MAX => digest(kind_of(value), &text),
            _ => serde_json::to_string(&Masked(Some(value))).unwrap_or_default(),
        },
        Item::Text(at) if at.get().len() > VALUE_MAX => {
            let text = at.get();
            let kind = match json_text::kind(text) {
                Kind::Object => "object",
                Kind::Array => "array",
                Kind::String => "string",
                Kind::Other => "value",
            };
            digest(kind, text)
        }
        // The compact JSON of a string, number or literal is its canonical text; an object or
        // array may hold secrets to mask.
        Item::Text(at) => match json_text::kind(at.get()) {
            Kind::Object | Kind::Array => {
                let value: Value = serde_json::from_str(at.get()).expect("a checked JSON text");
                serde_json::to_string(&Masked(Some(&value))).unwrap_or_default()
            }
            Kind::String | Kind::Other => at.get().to_string(),
        },
    }
}

fn compact(value: &Value) -> Option<String> {
    serde_json::to_string(value).ok()
}

/// How [`digest`] names the kind of `value`.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        _ => "value",
    }
}

/// `<object, 1048576 bytes, sha256:0123456789abcdef>`: the kind, the size of the compact JSON and
/// the start of its SHA-256 (of the value as it is, secrets included, so that any change shows).
fn digest(kind: &str, text: &str) -> String {
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
    use crate::schedule::hash::canonical_json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn after(old: Value, new: Value) -> String {
        let old = map(old);
        let last = Logged {
            deployment_id: "dep1",
            vars: &old,
            texts: &[],
        };
        entry("web", Some(last), &map(new), &[])
    }

    #[test]
    fn the_first_entry_is_the_whole_variables_masked() {
        let text = entry(
            "web",
            None,
            &map(json!({"port": 80, "db_password": "hunter2", "full_schedule": {"x": 1}})),
            &[],
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
        let text = entry("web", None, &map(json!({"port": 80, "blob": big})), &[]);
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
    fn nested_changes_past_the_limit_are_said_to_be_more_and_the_first_listed() {
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
        assert!(
            lines[0].starts_with(
                "Template variables: more than 50 changes since deployment dep1 (the first 50 \
                 listed; the whole: GET /v1/roles_data, to_render.web):"
            ),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1], "  changed svc.s00.image: \"i:1\" -> \"i:2\"");
        assert_eq!(
            lines[PATHS_MAX],
            "  changed svc.s49.image: \"i:1\" -> \"i:2\""
        );
        assert_eq!(lines[PATHS_MAX + 1], "  ... and more");
        assert_eq!(lines.len(), PATHS_MAX + 2);
    }

    #[test]
    fn maps_iterate_in_key_order_as_the_side_by_side_walk_needs() {
        // serde_json's `preserve_order` feature would keep insertion order instead.
        let map = map(json!({"b": 1, "a": 2, "c": 3}));
        assert!(map.keys().is_sorted());
    }

    #[test]
    fn fifty_changes_are_all_listed_and_one_more_is_said_to_be_more() {
        let changes = |n: usize| {
            let old: Map<String, Value> = (0..60).map(|i| (format!("k{i:02}"), json!(i))).collect();
            let new: Map<String, Value> = (0..60)
                .map(|i| (format!("k{i:02}"), json!(if i < n { i + 1 } else { i })))
                .collect();
            after(Value::Object(old), Value::Object(new))
        };
        let fifty = changes(PATHS_MAX);
        assert!(fifty.starts_with("Template variables: 50 changes since deployment dep1"));
        assert_eq!(fifty.lines().count(), 1 + PATHS_MAX, "{fifty}");
        assert!(fifty.ends_with("  changed k49: 49 -> 50\n"), "{fifty}");
        for n in [PATHS_MAX + 1, 60] {
            let text = changes(n);
            assert!(
                text.starts_with("Template variables: more than 50 changes since deployment dep1"),
                "{text}"
            );
            assert_eq!(text.lines().count(), 1 + PATHS_MAX + 1);
            assert!(
                text.ends_with("  changed k49: 49 -> 50\n  ... and more\n"),
                "{text}"
            );
        }
    }

    /// Whether [`differs`] finds a difference between two JSON texts, and how many listing
    /// their parsed trees finds (at most [`PATHS_MAX`]).
    fn found(old: &str, new: &str, key: &str) -> (bool, usize) {
        let (old_tape, new_tape) = (json_text::tape(old), json_text::tape(new));
        let differs = differs(key, At::root(old, &old_tape), At::root(new, &new_tape));
        let mut listed = Lines::default();
        let (old, new): (Value, Value) = (
            serde_json::from_str(old).unwrap(),
            serde_json::from_str(new).unwrap(),
        );
        diff_trees(&mut String::new(), key, &old, &new, &mut listed);
        (differs, listed.count)
    }

    #[test]
    fn a_difference_past_the_limit_is_found_where_listing_finds_one() {
        let services =
            |v: u32| -> String {
                let all: Map<String, Value> = (0..300)
                .map(|i| {
                    let service = json!({"image": format!("i:{}", if i % 3 == 0 { v } else { 1 }),
                                         "args": ["a", i, if i % 5 == 0 { v } else { 0 }],
                                         "env": {"API_TOKEN": v, "X": {"y": v}},
                                         "w": if i % 7 == 0 && v == 2 { json!(-0.0) }
                                              else { json!(0.0) }});
                    (format!("s{:03}", if v == 2 && i % 11 == 0 { i + 1000 } else { i }), service)
                })
                .collect();
                String::from_utf8(canonical_json(&Value::Object(all))).unwrap()
            };
        let (old, new) = (services(1), services(2));
        assert_eq!(found(&old, &new, "svc"), (true, PATHS_MAX));
        assert_eq!(found(&old, &old, "svc"), (false, 0));
        // The same texts, not canonical: keys with escapes, out of order, given twice; kinds
        // that change; arrays whose length changes; a secret's object compared whole.
        let cases = [
            (
                r#"{"a\"b":1,"c":{"d\\e":2,"f":3}}"#,
                r#"{"a\"b":2,"c":{"d\\e":3,"g":3}}"#,
            ),
            (r#"{"b":1,"a":{"x":1},"b":2}"#, r#"{"a":{"x":2},"b":3}"#),
            (
                r#"{"a":{"x":1},"b":3}"#,
                r#"{"b":1,"a":{"x":2,"x":3},"b":3}"#,
            ),
            (
                r#"{"a":[1,2],"b":[1,{"c":1}],"d":{"e":1}}"#,
                r#"{"a":[1,2,3],"b":[2,{"c":2}],"d":[1]}"#,
            ),
            (
                r#"{"db_secret":{"a":1,"b":2},"k":[0.0,-0.0,1.5]}"#,
                r#"{"db_secret":{"a":2,"b":3},"k":[-0.0,0.0,1.50]}"#,
            ),
            (
                r#"{"a":"x","b":null,"c":true}"#,
                r#"{"a":"x","b":false,"c":true,"d":{}}"#,
            ),
            (r#"[{"a":1},{"b":[1,2]}]"#, r#"[{"a":2},{"b":[1,3]}]"#),
            (r#"{"":1,"a":{}}"#, r#"{"":2,"a":{"":1}}"#),
            // The only difference in the last item of many.
            (
                r#"{"a":[1,2,3,{"b":[4,5]}]}"#,
                r#"{"a":[1,2,3,{"b":[4,6]}]}"#,
            ),
        ];
        for (old, new) in cases {
            let (differs, listed) = found(old, new, "x");
            assert!(differs, "{old} -> {new}");
            assert!(listed > 0, "{old} -> {new}");
        }
        // Texts that differ but hold the same values: keys out of order or given twice (the
        // last one counts), numbers written as floats. The walk does not stop at what looks
        // like a difference before such a key.
        let same = [
            (r#"{"a":1,"c":2}"#, r#"{"c":2,"a":1}"#),
            (r#"{"a":1,"b":1,"a":2}"#, r#"{"a":2,"b":1}"#),
            (
                r#"{"a":{"x":1},"b":{"y":1,"y":2}}"#,
                r#"{"a":{"x":1},"b":{"y":2}}"#,
            ),
            (r#"{"a":[0.0]}"#, r#"{"a":[-0.0]}"#),
        ];
        for (old, new) in same {
            assert_eq!(found(old, new, "x"), (false, 0), "{old} -> {new}");
        }
        assert_eq!(
            found(r#"{"a":{"x":1}}"#, r#"{"a":{"x":2}}"#, "token"),
            (true, 1)
        );
    }

    /// `vars` with the keys `as_text` moved out into texts.
    fn split(
        vars: &Map<String, Value>,
        as_text: &[&str],
    ) -> (Map<String, Value>, Vec<(String, TextPart)>) {
        let mut kept = vars.clone();
        let mut texts = Vec::new();
        for key in as_text {
            if let Some(value) = kept.remove(*key) {
                texts.push((key.to_string(), TextPart::of(&value)));
            }
        }
        (kept, texts)
    }

    /// The entries for `old` then `new` are the same whichever keys are kept as text.
    fn same_either_way(old: Value, new: Value, as_text: &[&str]) -> String {
        let (old, new) = (map(old), map(new));
        let tree = entry(
            "web",
            Some(Logged {
                deployment_id: "dep1",
                vars: &old,
                texts: &[],
            }),
            &new,
            &[],
        );
        for old_keys in [as_text, &[]] {
            for new_keys in [as_text, &[]] {
                let (old_vars, old_texts) = split(&old, old_keys);
                let (new_vars, new_texts) = split(&new, new_keys);
                let last = Logged {
                    deployment_id: "dep1",
                    vars: &old_vars,
                    texts: &old_texts,
                };
                let text = entry("web", Some(last), &new_vars, &new_texts);
                assert_eq!(text, tree, "old as text: {old_keys:?}, new: {new_keys:?}");
            }
        }
        let (new_vars, new_texts) = split(&new, as_text);
        assert_eq!(
            entry("web", None, &new_vars, &new_texts),
            entry("web", None, &new, &[])
        );
        tree
    }

    #[test]
    fn values_kept_as_text_are_logged_as_their_trees_would_be() {
        let services = |v: u32| -> Value {
            (0..80)
                .map(|i| {
                    let service = json!({"image": format!("i:{v}"), "n": i, "args": ["a", i],
                                         "env": {"API_TOKEN": format!("t{v}"), "X": 1},
                                         "weight": if i == 3 { json!(0.0) } else { json!(1.5) }});
                    (format!("s{i:02}"), service)
                })
                .collect::<Map<String, Value>>()
                .into()
        };
        let mut new = services(2);
        new["s03"]["weight"] = json!(-0.0);
        new["s04"]["args"] = json!(["a", 4, "extra"]);
        new["s05"]["n"] = json!("five");
        new["s06"]["env"]["NEW"] = json!("\"quoted\" \u{e9}");
        new["s07"].as_object_mut().unwrap().remove("env");
        new["s08"]["image"] = json!("x".repeat(2000));
        new.as_object_mut()
            .unwrap()
            .insert("a \"key\"".into(), json!({"k": [1, {"b": 2}]}));
        let text = same_either_way(
            json!({"svc": services(1), "x": 1, "list": [1, 2], "secret_cfg": {"a": 1}}),
            json!({"svc": new, "x": 2, "list": [1, 2, 3], "secret_cfg": {"a": 2}}),
            &["svc", "list", "secret_cfg"],
        );
        assert!(
            text.starts_with("Template variables: more than 50 changes since deployment dep1"),
            "{text}"
        );
        assert!(
            text.contains("  changed svc.s00.env.API_TOKEN: \"***\" -> \"***\"\n"),
            "{text}"
        );
        assert!(
            text.contains("  changed list: [1,2] -> [1,2,3]\n"),
            "{text}"
        );
        // Whichever way round, nothing changed is nothing changed, and the first changes are
        // listed in the same order.
        same_either_way(
            json!({"svc": services(1), "deployment_id": "a"}),
            json!({"svc": services(1), "deployment_id": "b"}),
            &["svc"],
        );
        let lines = same_either_way(
            json!({"svc": services(1), "b": {"c": [0.0, "s"]}}),
            json!({"svc": {"s00": {"image": "j", "added": [1]}}, "b": {"c": [-0.0, "t"]}}),
            &["svc", "b"],
        );
        assert!(lines.contains("  added svc.s00.added: [1]\n"), "{lines}");
        assert!(
            lines.contains("  removed svc.s01 (was {\"args\":[\"a\",1],"),
            "{lines}"
        );
        assert!(
            lines.contains("  changed b.c[1]: \"s\" -> \"t\"\n"),
            "{lines}"
        );
        assert!(!lines.contains("b.c[0]"), "{lines}");
    }
}
