//! The structural diff of two schedules (the real one and a shadow scheduler's): which roles and
//! nodes were added, removed or changed, and the JSON paths that differ.
//!
//! Paths are written as [`crate::refs`] reads them (gjson's style): object keys joined by dots,
//! array elements by their index (`roles.web.ports.3`), and in a key every ASCII punctuation
//! character but `_`, `-` and `:` escaped with a backslash (`nodes.host\.example\.com`), so
//! `$(path)` finds the value. The empty path is the whole schedule.
//!
//! The walk compares objects key by key and arrays index by index: a value of another type, or
//! another scalar, is one `changed` path; a key or element only one side has is one `added` or
//! `removed` path holding its whole subtree (an array that grew lists its new elements); equal
//! subtrees are passed over with serde_json's `==` (bench: `controllers/benches/diff.rs`). The
//! paths come out in the order of a walk with sorted keys, so the same two schedules always give
//! the same diff, and a schedule compared with itself gives the empty one.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashSet};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// At most this many changes are listed (`truncated` says more differ; `paths_differing` counts
/// them all): enough to read, and a bound on what a run keeps whatever the schedules hold.
pub const MAX_CHANGES: usize = 1_000;

/// What differs between a real schedule and a shadow one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleDiff {
    /// No path differs.
    pub identical: bool,
    /// How many paths differ, listed or not.
    pub paths_differing: usize,
    /// By the role names the schedules know (see [`diff`]).
    pub roles: Summary,
    /// By the keys of `nodes` (hostnames).
    pub nodes: Summary,
    /// The first [`MAX_CHANGES`] differing paths, in walk order.
    pub changes: Vec<Change>,
    /// More paths differ than `changes` lists.
    pub truncated: bool,
}

/// Names only the shadow has, only the real schedule has, and both have with different content.
/// Each list is sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// One differing path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub path: String,
    pub kind: ChangeKind,
    /// The real schedule's value (absent when the path was added).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub real: Option<Value>,
    /// The shadow's value (absent when the path was removed).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub shadow: Option<Value>,
}

/// A field that is there is `Some`, `null` included (serde's `Option` would read `null` as
/// absent, and a value that changed from `null` would lose its side).
fn present<'de, D: Deserializer<'de>>(de: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(de).map(Some)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// Only the shadow has it.
    Added,
    /// Only the real schedule has it.
    Removed,
    /// Both have it, with another value or type.
    Changed,
}

impl ScheduleDiff {
    /// No path differs.
    pub fn is_empty(&self) -> bool {
        self.paths_differing == 0
    }

    /// How many paths differ (the listed ones and those past [`MAX_CHANGES`]).
    pub fn paths_differing(&self) -> usize {
        self.paths_differing
    }
}

/// The diff of `shadow` against `real`.
///
/// Roles are the keys of `roles` and of every `nodes.<hostname>.roles` (the schedule's
/// conventional keys, docs/scheduler.md); a role both have is changed when `roles.<role>` or
/// any `nodes.<hostname>.roles.<role>` differs (its variables or where it runs). A node is
/// changed when anything under `nodes.<hostname>` differs.
pub fn diff(real: &Value, shadow: &Value) -> ScheduleDiff {
    let mut walk = Walk {
        segments: Vec::new(),
        changes: Vec::new(),
        count: 0,
        roles: BTreeSet::new(),
        nodes: BTreeSet::new(),
    };
    walk.value(real, shadow);
    let hosts = |v| object_at(v, "nodes").into_iter().flat_map(|m| m.keys());
    ScheduleDiff {
        identical: walk.count == 0,
        paths_differing: walk.count,
        roles: summary(
            role_names(real),
            role_names(shadow),
            &walk.roles,
            walk.count == 0,
        ),
        nodes: summary(hosts(real), hosts(shadow), &walk.nodes, walk.count == 0),
        truncated: walk.count > walk.changes.len(),
        changes: walk.changes,
    }
}

#[derive(Clone, Copy)]
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

struct Walk<'a> {
    /// The path to where the walk is (a path is written out only for a change that is listed).
    segments: Vec<Segment<'a>>,
    changes: Vec<Change>,
    count: usize,
    /// Roles and nodes under a differing path, or with a differing path under them.
    roles: BTreeSet<&'a str>,
    nodes: BTreeSet<&'a str>,
}

impl<'a> Walk<'a> {
    fn value(&mut self, real: &'a Value, shadow: &'a Value) {
        match (real, shadow) {
            // Equal subtrees (most of them, as a rule) are skipped with serde_json's own
            // comparison, a few times faster than walking them; it stops at the first
            // difference, so a differing subtree costs at most one partial pass per level.
            (r, s) if r == s => {}
            (Value::Object(r), Value::Object(s)) => self.object(r, s),
            (Value::Array(r), Value::Array(s)) => self.array(r, s),
            (r, s) => self.change(ChangeKind::Changed, Some(r), Some(s)),
        }
    }

    /// A merge of the two key lists: serde_json's maps iterate in key order (a `BTreeMap`; a
    /// test fails if a dependency turns on `preserve_order`).
    fn object(&mut self, real: &'a Map<String, Value>, shadow: &'a Map<String, Value>) {
        let mut real = real.iter().peekable();
        let mut shadow = shadow.iter().peekable();
        loop {
            let order = match (real.peek(), shadow.peek()) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some((r, _)), Some((s, _))) => r.cmp(s),
            };
            match order {
                Ordering::Equal => {
                    let ((key, r), (_, s)) = (real.next().unwrap(), shadow.next().unwrap());
                    self.segments.push(Segment::Key(key));
                    self.value(r, s);
                }
                Ordering::Less => {
                    let (key, r) = real.next().unwrap();
                    self.segments.push(Segment::Key(key));
                    self.change(ChangeKind::Removed, Some(r), None);
                }
                Ordering::Greater => {
                    let (key, s) = shadow.next().unwrap();
                    self.segments.push(Segment::Key(key));
                    self.change(ChangeKind::Added, None, Some(s));
                }
            }
            self.segments.pop();
        }
    }

    fn array(&mut self, real: &'a [Value], shadow: &'a [Value]) {
        for i in 0..real.len().max(shadow.len()) {
            self.segments.push(Segment::Index(i));
            match (real.get(i), shadow.get(i)) {
                (Some(r), Some(s)) => self.value(r, s),
                (Some(r), None) => self.change(ChangeKind::Removed, Some(r), None),
                (None, Some(s)) => self.change(ChangeKind::Added, None, Some(s)),
                (None, None) => unreachable!("the index is below one of the lengths"),
            }
            self.segments.pop();
        }
    }

    fn change(&mut self, kind: ChangeKind, real: Option<&'a Value>, shadow: Option<&'a Value>) {
        self.count += 1;
        self.touch(real, shadow);
        if self.changes.len() < MAX_CHANGES {
            self.changes.push(Change {
                path: path_text(&self.segments),
                kind,
                real: real.cloned(),
                shadow: shadow.cloned(),
            });
        }
    }

    /// Notes the roles and nodes a differing path is in or holds (`real` and `shadow` are the
    /// values at the path).
    fn touch(&mut self, real: Option<&'a Value>, shadow: Option<&'a Value>) {
        use Segment::Key;
        let sides = || real.into_iter().chain(shadow);
        let keys = |map: &'a Map<String, Value>| map.keys().map(String::as_str);
        let (roles, nodes) = (&mut self.roles, &mut self.nodes);
        match self.segments.as_slice() {
            [] => {
                for side in sides() {
                    roles.extend(role_names(side).map(String::as_str));
                    nodes.extend(object_at(side, "nodes").into_iter().flat_map(keys));
                }
            }
            [Key("roles")] => roles.extend(sides().filter_map(Value::as_object).flat_map(keys)),
            [Key("roles"), Key(role), ..] => _ = roles.insert(role),
            [Key("nodes")] => {
                for (host, node) in sides().filter_map(Value::as_object).flat_map(|m| m.iter()) {
                    nodes.insert(host);
                    roles.extend(object_at(node, "roles").into_iter().flat_map(keys));
                }
            }
            [Key("nodes"), Key(host), rest @ ..] => {
                nodes.insert(host);
                match rest {
                    [] => {
                        roles.extend(sides().filter_map(|v| object_at(v, "roles")).flat_map(keys))
                    }
                    [Key("roles")] => {
                        roles.extend(sides().filter_map(Value::as_object).flat_map(keys));
                    }
                    [Key("roles"), Key(role), ..] => _ = roles.insert(role),
                    _ => {}
                }
            }
            _ => {}
        }
    }
}

fn path_text(segments: &[Segment<'_>]) -> String {
    let mut out = String::new();
    for (n, segment) in segments.iter().enumerate() {
        if n > 0 {
            out.push('.');
        }
        match segment {
            Segment::Key(key) => push_escaped(&mut out, key),
            Segment::Index(i) => out.push_str(&i.to_string()),
        }
    }
    out
}

/// `key` as one step of a path: ASCII punctuation but `_`, `-` and `:` behind a backslash (what
/// gjson escapes; [`crate::refs`] takes any escaped character as itself).
pub(crate) fn push_escaped(out: &mut String, key: &str) {
    for c in key.chars() {
        if c.is_ascii_punctuation() && !matches!(c, '_' | '-' | ':') {
            out.push('\\');
        }
        out.push(c);
    }
}

fn object_at<'v>(value: &'v Value, key: &str) -> Option<&'v Map<String, Value>> {
    value.get(key).and_then(Value::as_object)
}

/// Names only the shadow has, only the real one has, and both have and `touched`. Nothing when
/// nothing differs (two equal schedules name the same); else the names go into hash sets (a
/// schedule names its roles once per node: thousands of names), and only what is listed is
/// sorted.
fn summary<'a>(
    real: impl Iterator<Item = &'a String>,
    shadow: impl Iterator<Item = &'a String>,
    touched: &BTreeSet<&str>,
    identical: bool,
) -> Summary {
    if identical {
        return Summary::default();
    }
    let real: HashSet<&str> = real.map(String::as_str).collect();
    let shadow: HashSet<&str> = shadow.map(String::as_str).collect();
    let sorted = |names: &mut dyn Iterator<Item = &&str>| {
        let mut names: Vec<String> = names.map(|n| n.to_string()).collect();
        names.sort_unstable();
        names
    };
    Summary {
        added: sorted(&mut shadow.difference(&real)),
        removed: sorted(&mut real.difference(&shadow)),
        // `touched` is sorted already.
        changed: touched
            .iter()
            .filter(|n| real.contains(*n) && shadow.contains(*n))
            .map(|n| n.to_string())
            .collect(),
    }
}

/// The role names of a schedule: the keys of `roles` and of each `nodes.<hostname>.roles`.
fn role_names(schedule: &Value) -> impl Iterator<Item = &String> {
    let placed = object_at(schedule, "nodes")
        .into_iter()
        .flat_map(|nodes| nodes.values())
        .filter_map(|node| object_at(node, "roles"))
        .flat_map(|roles| roles.keys());
    object_at(schedule, "roles")
        .into_iter()
        .flat_map(|roles| roles.keys())
        .chain(placed)
}

#[cfg(test)]
mod tests;
