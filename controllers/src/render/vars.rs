//! Role variables: what a node renders for each of its roles, derived from the schedule.
//!
//! Four sources, later wins: `vars` < `roles[r]` < `nodes[host].vars` < `nodes[host].roles[r]`.
//! When the values of a key are objects in both, their keys are merged (later wins per inner key);
//! values one level further down are replaced whole. This is the rule verwalter documents; 0.13's
//! code let the order of other keys decide, this one is deterministic.
//!
//! The roles rendered on a node are the keys of `nodes[host].roles` (0.13's behaviour: a role
//! only under `roles` is not rendered anywhere).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::state::json_kind;

pub(crate) mod json_text;
pub mod logged;

/// Version string templates see as `verwalter_version`.
pub(crate) const VERWALTER_VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// Variables that change on every pass or with any part of the schedule; they are left out of a
/// role's desired hash (see [`write_hashed_source`]).
pub(crate) const UNHASHED_VARS: &[&str] = &["deployment_id", "timestamp", "full_schedule"];

/// Keys of a role's own variables that are always parsed, never left as text (see
/// [`crate::schedule::data::ScheduleData::skeleton`]): the ones the render controller reads
/// and the ones a pass sets.
pub(crate) const KEPT_PARSED: &[&str] = &[
    "template",
    "depends_on",
    "role",
    "node",
    "verwalter_version",
    "deployment_id",
    "timestamp",
    "full_schedule",
];

/// Whether templates with the texts `sources` may read the variable `key`: one names it (has its
/// name anywhere in its text), or one of their tags (`{{ … }}`, `{% … %}`) may read variables it
/// does not name ([`reads_unnamed`]). A big value of a role's own variables that no template
/// of its dir may read is not parsed for the render
/// ([`crate::schedule::data::ScheduleData::skeleton`]).
pub fn templates_may_read<'a>(sources: impl IntoIterator<Item = &'a str>, key: &str) -> bool {
    sources
        .into_iter()
        .any(|text| text.contains(key) || reads_unnamed(text))
}

/// Whether a template's tags may reach a variable without its name: the variables whole or by
/// a name made at render time (Handlebars' `this`, `.`, `@root`, `lookup`, parent paths `../`,
/// `./`; Tera's `__tera_context`). Text outside the tags is not read.
fn reads_unnamed(text: &str) -> bool {
    const WORDS: &[&str] = &["this", "@root", "lookup", "__tera_context", "..", "./"];
    let word = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'@' | b']' | b')');
    let mut rest = text;
    while let Some(open) = rest.find("{{").into_iter().chain(rest.find("{%")).min() {
        let close = if rest[open..].starts_with("{{") {
            "}}"
        } else {
            "%}"
        };
        let body = &rest[open + 2..];
        let end = body.find(close).unwrap_or(body.len());
        let tag = &body.as_bytes()[..end];
        // A dot that is not between two parts of a path (`a.b`, `a.[b]`, `1.5`): a path of
        // its own, the current context.
        let bare_dot = (0..tag.len()).any(|i| {
            tag[i] == b'.'
                && !(i > 0
                    && word(tag[i - 1])
                    && tag.get(i + 1).is_some_and(|&b| word(b) || b == b'['))
        });
        if bare_dot || WORDS.iter().any(|w| body[..end].contains(w)) {
            return true;
        }
        rest = &body[end..];
    }
    false
}

/// Words that mark a key as holding a secret (matched case-insensitively within the key).
const SECRET_WORDS: &[&str] = &["password", "secret", "token", "key"];

/// Whether key `key` looks like it holds a secret: contains one of [`SECRET_WORDS`], any case.
fn is_secret(key: &str) -> bool {
    SECRET_WORDS.iter().any(|word| {
        key.as_bytes()
            .windows(word.len())
            .any(|w| w.eq_ignore_ascii_case(word.as_bytes()))
    })
}

/// Role variables as people read them (the role log), written by serde without copying them:
/// the value of every key that looks like a secret (contains `password`, `secret`, `token` or
/// `key`, any case) is `"***"`, at any depth, and `full_schedule` is a pointer to
/// `/v1/schedule`.
pub(crate) struct MaskedVars<'a>(pub &'a Map<String, Value>);

/// What [`MaskedVars`] shows for `full_schedule`.
pub(crate) const FULL_SCHEDULE_SHOWN: &str = "(the whole schedule; see /v1/schedule)";

/// A value inside [`MaskedVars`], secrets masked at any depth; `None`: a secret's, `"***"`.
struct Masked<'a>(Option<&'a Value>);

impl serde::Serialize for MaskedVars<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (key, value) in self.0 {
            if key == "full_schedule" {
                map.serialize_entry(key, FULL_SCHEDULE_SHOWN)?;
            } else {
                map.serialize_entry(key, &Masked::entry(key, value))?;
            }
        }
        map.end()
    }
}

impl<'a> Masked<'a> {
    /// The value of `key`: `"***"` if the key looks like a secret.
    fn entry(key: &str, value: &'a Value) -> Masked<'a> {
        Masked((!is_secret(key)).then_some(value))
    }
}

impl serde::Serialize for Masked<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(value) = self.0 else {
            return s.serialize_str("***");
        };
        match value {
            Value::Object(object) => {
                let mut map = s.serialize_map(Some(object.len()))?;
                for (key, value) in object {
                    map.serialize_entry(key, &Masked::entry(key, value))?;
                }
                map.end()
            }
            Value::Array(items) => s.collect_seq(items.iter().map(|v| Masked(Some(v)))),
            other => other.serialize(s),
        }
    }
}

/// A role that cannot be rendered as the schedule stands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("role {role:?}: {message}")]
pub struct VarsError {
    pub role: String,
    pub message: String,
}

impl VarsError {
    fn new(role: &str, message: impl Into<String>) -> VarsError {
        VarsError {
            role: role.to_string(),
            message: message.into(),
        }
    }
}

/// The roles assigned to `host` by the schedule `data`, sorted: the keys of
/// `nodes[host].roles`. Empty when the node or its roles are missing.
pub fn node_roles(data: &Value, host: &str) -> Vec<String> {
    match data.pointer_get(&["nodes", host, "roles"]) {
        Some(Value::Object(roles)) => roles.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// The schedule data a role source's answer stands for: `roles` (a `query.wasm`'s
/// `render_roles`, `{role: vars}`) as `nodes[host].roles`, with the schedule's `changes` kept,
/// so that [`node_roles`] and [`role_vars`] read it as they read a schedule.
pub fn roles_view(data: &Value, host: &str, roles: Map<String, Value>) -> Value {
    let mut view = Map::new();
    if let Some(changes) = data.get("changes") {
        view.insert("changes".into(), changes.clone());
    }
    let mut node = Map::new();
    node.insert("roles".into(), Value::Object(roles));
    let mut nodes = Map::new();
    nodes.insert(host.to_string(), Value::Object(node));
    view.insert("nodes".into(), Value::Object(nodes));
    Value::Object(view)
}

/// Every role the schedule mentions: keys of `roles` and of every node's `roles`.
pub fn all_roles(data: &Value) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    if let Some(Value::Object(roles)) = data.get("roles") {
        all.extend(roles.keys().cloned());
    }
    if let Some(Value::Object(nodes)) = data.get("nodes") {
        for node in nodes.values() {
            if let Some(Value::Object(roles)) = node.get("roles") {
                all.extend(roles.keys().cloned());
            }
        }
    }
    all
}

/// Why `role` is not usable as a file name (it names the role's log dir and staging dir), or
/// `None` when it is.
pub fn unsafe_role_name(role: &str) -> Option<&'static str> {
    if role.is_empty() {
        Some("a role name must not be empty")
    } else if role.starts_with('.') {
        Some("a role name must not start with `.` (the log dir keeps `.index`, `.global` there)")
    } else if role.contains(['/', '\\']) {
        Some("a role name must not contain `/` or `\\`")
    } else if role.chars().any(char::is_control) {
        Some("a role name must not contain control characters")
    } else if role.len() > 200 {
        Some("a role name must be at most 200 bytes")
    } else {
        None
    }
}

/// The four sources of `role`'s variables on `host`, lowest precedence first (missing or null
/// ones, and empty arrays, as `None`), after checking the role name and that each source is an
/// object. An empty array is an empty object: a scheduler's empty table may come out as either
/// (Lua cannot tell them apart).
pub(crate) fn sources<'a>(
    data: &'a Value,
    host: &str,
    role: &str,
) -> Result<[Option<&'a Map<String, Value>>; 4], VarsError> {
    if let Some(why) = unsafe_role_name(role) {
        return Err(VarsError::new(role, why));
    }
    let paths: [&[&str]; 4] = [
        &["vars"],
        &["roles", role],
        &["nodes", host, "vars"],
        &["nodes", host, "roles", role],
    ];
    let mut out = [None; 4];
    for (slot, path) in out.iter_mut().zip(paths) {
        *slot = match data.pointer_get(path) {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) if items.is_empty() => None,
            Some(Value::Object(source)) => Some(source),
            Some(other) => {
                return Err(VarsError::new(
                    role,
                    format!(
                        "schedule field `{}` must be an object, got {}",
                        path.join("."),
                        json_kind(other)
                    ),
                ));
            }
        };
    }
    Ok(out)
}

/// The template dir of `role` (the `template` variable as merged), checked to be a safe path.
pub(crate) fn role_template(
    role: &str,
    sources: &[Option<&Map<String, Value>>; 4],
) -> Result<String, VarsError> {
    // Later sources win and a string is replaced whole: the last source with the key decides.
    match sources
        .iter()
        .rev()
        .flatten()
        .find_map(|s| s.get("template"))
    {
        Some(Value::String(t)) => match unsafe_template_name(t) {
            Some(why) => Err(VarsError::new(role, format!("`template` {t:?}: {why}"))),
            None => Ok(t.clone()),
        },
        Some(other) => Err(VarsError::new(
            role,
            format!("`template` must be a string, got {}", json_kind(other)),
        )),
        None => Err(VarsError::new(
            role,
            "no `template` variable: set it in the schedule to a dir under templates/",
        )),
    }
}

/// Canonical JSON of a source as a role's desired hash covers it: without [`UNHASHED_VARS`].
pub(crate) fn write_hashed_source(source: Option<&Map<String, Value>>, out: &mut Vec<u8>) {
    match source {
        None => out.extend_from_slice(b"null"),
        Some(map) => crate::schedule::hash::write_canonical_object(
            map.iter()
                .filter(|(k, _)| !UNHASHED_VARS.contains(&k.as_str())),
            out,
        ),
    }
}

/// Merged variables of `role` on `host`, without the per-pass additions (see [`with_pass`]):
/// the four sources merged, plus `role` and `node` (`node` only when the sources set none).
pub fn role_vars(data: &Value, host: &str, role: &str) -> Result<Map<String, Value>, VarsError> {
    let sources = sources(data, host, role)?;
    role_template(role, &sources)?;
    let mut merged = Map::new();
    for source in sources.into_iter().flatten() {
        merge_into(&mut merged, source);
    }
    merged.insert("role".into(), Value::String(role.into()));
    merged
        .entry("node")
        .or_insert_with(|| Value::String(host.into()));
    Ok(merged)
}

/// The variables templates see: `vars` plus this pass's `deployment_id`, `timestamp` (RFC 3339),
/// `verwalter_version` and, when given, `full_schedule` (the render controller gives it to
/// template dirs that mention it: copying a large schedule into every role's variables is the
/// most expensive part of a render otherwise).
pub fn with_pass(
    mut vars: Map<String, Value>,
    deployment_id: &str,
    timestamp: &str,
    full_schedule: Option<&Value>,
) -> Map<String, Value> {
    vars.insert("deployment_id".into(), deployment_id.into());
    vars.insert("timestamp".into(), timestamp.into());
    vars.insert("verwalter_version".into(), VERWALTER_VERSION.into());
    if let Some(schedule) = full_schedule {
        vars.insert("full_schedule".into(), schedule.clone());
    }
    vars
}

/// Why a `template` value cannot name a dir under `templates/`, or `None` when it can: it must be
/// a relative path of plain components (it comes from the schedule and becomes a path).
pub fn unsafe_template_name(template: &str) -> Option<&'static str> {
    if template.is_empty() {
        return Some("must not be empty");
    }
    if template.starts_with('/') {
        return Some("must be a path relative to templates/");
    }
    if template.chars().any(char::is_control) || template.contains('\\') {
        return Some("must not contain control characters or `\\`");
    }
    if template
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == ".." || c.starts_with('.'))
    {
        return Some("must consist of plain path components (no `.`, `..`, hidden or empty ones)");
    }
    None
}

/// Later wins; two objects merge one level deep.
fn merge_into(merged: &mut Map<String, Value>, source: &Map<String, Value>) {
    for (key, value) in source {
        match (merged.get_mut(key), value) {
            (Some(Value::Object(existing)), Value::Object(inner)) => {
                for (k, v) in inner {
                    existing.insert(k.clone(), v.clone());
                }
            }
            _ => {
                merged.insert(key.clone(), value.clone());
            }
        }
    }
}

trait PointerGet {
    fn pointer_get(&self, path: &[&str]) -> Option<&Value>;
}

impl PointerGet for Value {
    /// Like `Value::pointer`, with keys taken literally (a host or role may contain `/` or `~`).
    fn pointer_get(&self, path: &[&str]) -> Option<&Value> {
        path.iter()
            .try_fold(self, |v, key| v.as_object()?.get(*key))
    }
}

#[cfg(test)]
mod tests;
