//! A verwalter `query.wasm` in Rust, for `wasm32-unknown-unknown`: derives this node's roles and
//! their variables from the schedule the way verwalter's built-in (compat) derivation does, so a
//! config dir renders the same with this module as without it, and answers two queries.
//!
//! The module interface is verwalter 0.13's (docs/scheduler.md, "query.wasm"): exports
//! `memory`, `alloc(len) -> ptr`, `dealloc(ptr)` and three entry points taking
//! `(ptr, len) -> ptr` with JSON in and JSON out, each answering serde's `Result`:
//! `{"Ok": ..}` or `{"Err": {"kind": .., "message": ..}}`.
//!
//! - `init({"schedule": <envelope>, "hostname": ..})`, once per schedule: derives the roles.
//! - `render_roles({"deployment_id", "previous_schedule"})`: `{role: variables}` of this node.
//! - `query({"path", "body"})`: `roles` (this node's role names) and `role/<name>` (one role's
//!   variables); any other path is an `UnknownPath` error.
//!
//! The derivation (verwalter's docs/rendering.md, "Role variables"): the roles are the keys of
//! `nodes[hostname].roles`; each role's variables merge four sources, later wins: `vars`,
//! `roles[role]`, `nodes[hostname].vars`, `nodes[hostname].roles[role]`. When both values of a
//! key are objects their keys merge (later wins per inner key); deeper values are replaced whole.
//! `role` is set to the role's name, `node` to the hostname unless a source sets it. A missing or
//! `null` source is skipped, and so is an empty array: a Lua scheduler's empty table comes out as
//! `[]` (Lua cannot tell `{}` from `[]`).
//!
//! One difference remains: a source that is neither an object, `null` nor `[]` fails only the
//! roles it concerns in the compat derivation, while here it fails `render_roles` (a query.wasm
//! can only answer the whole node's roles or an error), so nothing of that schedule is rendered.

use std::cell::RefCell;

use serde_json::{Map, Value, json};

/// Bytes before each allocation that keep its size, so that `dealloc(ptr)` needs no length.
const HEADER: usize = 8;

/// Allocates `len` bytes for the host.
#[unsafe(no_mangle)]
pub extern "C" fn alloc(len: i32) -> i32 {
    let size = len as usize + HEADER;
    let layout = std::alloc::Layout::from_size_align(size, HEADER).expect("a valid layout");
    // SAFETY: the layout is non-zero in size; its size is written in front for `dealloc`.
    unsafe {
        let base = std::alloc::alloc(layout);
        if base.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        (base as *mut usize).write(size);
        base.add(HEADER) as usize as i32
    }
}

/// Frees what `alloc` returned.
#[unsafe(no_mangle)]
pub extern "C" fn dealloc(ptr: i32) {
    // SAFETY: `ptr` came from `alloc`, which wrote the size in front of it.
    unsafe {
        let base = (ptr as usize - HEADER) as *mut u8;
        let size = (base as *const usize).read();
        std::alloc::dealloc(
            base,
            std::alloc::Layout::from_size_align_unchecked(size, HEADER),
        );
    }
}

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn log_panic(
        payload: *const u8,
        payload_len: usize,
        file: *const u8,
        file_len: usize,
        line: u32,
    );
}

/// Reports a panic's message to verwalter (`env.log_panic`) before the module traps.
#[cfg(target_arch = "wasm32")]
fn report_panics() {
    std::panic::set_hook(Box::new(|info| {
        let message = info.payload_as_str().unwrap_or("(no message)");
        let (file, line) = info.location().map_or(("?", 0), |l| (l.file(), l.line()));
        // SAFETY: both slices live for the duration of the call.
        unsafe {
            log_panic(
                message.as_ptr(),
                message.len(),
                file.as_ptr(),
                file.len(),
                line,
            )
        }
    }));
}

#[cfg(not(target_arch = "wasm32"))]
fn report_panics() {}

/// The `Err` of an answer: a kind (0.13 used `Deserialize`, `Internal`, `Uninitialized`...) and
/// a message; verwalter shows them as `<kind>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError {
    pub kind: &'static str,
    pub message: String,
}

impl QueryError {
    fn new(kind: &'static str, message: impl Into<String>) -> QueryError {
        QueryError {
            kind,
            message: message.into(),
        }
    }
}

/// What `init` learnt, kept for the calls that follow (one instance serves one schedule).
struct Node {
    hostname: String,
    /// The schedule's hash, given back by the `roles` query.
    hash: String,
    /// This node's roles with their variables, or why the schedule gives none.
    roles: Result<Map<String, Value>, QueryError>,
}

thread_local! {
    static NODE: RefCell<Option<Node>> = const { RefCell::new(None) };
}

/// Reads the JSON input at `ptr`, runs `call` on it, and writes its answer as the `Ok`/`Err`
/// envelope into memory from `alloc`; returns where.
fn answer(ptr: i32, len: i32, call: fn(Value) -> Result<Value, QueryError>) -> i32 {
    report_panics();
    // SAFETY: the host wrote `len` bytes at `ptr`, into memory it got from `alloc`.
    let input = unsafe { std::slice::from_raw_parts(ptr as usize as *const u8, len as usize) };
    let result = match serde_json::from_slice(input) {
        Ok(value) => call(value),
        Err(e) => Err(QueryError::new(
            "Deserialize",
            format!("the input is not JSON: {e}"),
        )),
    };
    let envelope = match result {
        Ok(value) => json!({"Ok": value}),
        Err(e) => json!({"Err": {"kind": e.kind, "message": e.message}}),
    };
    let bytes = serde_json::to_vec(&envelope).expect("JSON values serialize");
    let out = alloc(bytes.len() as i32);
    // SAFETY: `alloc` returned `bytes.len()` writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as usize as *mut u8, bytes.len());
    }
    out
}

#[unsafe(no_mangle)]
pub extern "C" fn init(ptr: i32, len: i32) -> i32 {
    answer(ptr, len, init_with)
}

#[unsafe(no_mangle)]
pub extern "C" fn render_roles(ptr: i32, len: i32) -> i32 {
    answer(ptr, len, render_roles_with)
}

#[unsafe(no_mangle)]
pub extern "C" fn query(ptr: i32, len: i32) -> i32 {
    answer(ptr, len, query_with)
}

/// `init`: keeps the hostname and the schedule's hash, and derives the node's roles (a schedule
/// that gives none is an error of `render_roles` and of the queries, not of `init`).
pub fn init_with(input: Value) -> Result<Value, QueryError> {
    let hostname = input["hostname"]
        .as_str()
        .ok_or_else(|| QueryError::new("Deserialize", "`hostname` must be a string"))?;
    let schedule = &input["schedule"];
    let data = schedule
        .get("data")
        .ok_or_else(|| QueryError::new("Deserialize", "`schedule` has no `data`"))?;
    let node = Node {
        hostname: hostname.to_string(),
        hash: schedule["hash"].as_str().unwrap_or_default().to_string(),
        roles: node_roles(data, hostname),
    };
    NODE.with(|slot| *slot.borrow_mut() = Some(node));
    Ok(Value::Null)
}

/// Runs `f` on what `init` kept; an `Uninitialized` error before `init`.
fn with_node<T>(f: impl FnOnce(&Node) -> Result<T, QueryError>) -> Result<T, QueryError> {
    NODE.with(|slot| match slot.borrow().as_ref() {
        Some(node) => f(node),
        None => Err(QueryError::new("Uninitialized", "init was not called")),
    })
}

/// `render_roles`: every role of the node with its variables. `previous_schedule` would allow
/// answering only the roles that changed; verwalter renders a role only when its variables or
/// templates changed anyway, so every role is given, as the compat derivation does.
pub fn render_roles_with(input: Value) -> Result<Value, QueryError> {
    if !input.is_object() {
        return Err(QueryError::new(
            "Deserialize",
            "the input must be {\"deployment_id\", \"previous_schedule\"}",
        ));
    }
    with_node(|node| node.roles.clone().map(Value::Object))
}

/// `query`: `roles` answers `{"node", "schedule", "roles": [names]}`, `role/<name>` that role's
/// variables. The body is not read.
pub fn query_with(input: Value) -> Result<Value, QueryError> {
    let path = input["path"]
        .as_str()
        .ok_or_else(|| QueryError::new("Deserialize", "`path` must be a string"))?;
    with_node(|node| {
        let roles = node.roles.as_ref().map_err(Clone::clone)?;
        match path.split_once('/') {
            None if path == "roles" => Ok(json!({
                "node": node.hostname,
                "schedule": node.hash,
                "roles": roles.keys().collect::<Vec<_>>(),
            })),
            Some(("role", name)) => roles.get(name).cloned().ok_or_else(|| {
                QueryError::new(
                    "NotFound",
                    format!("{name:?} is not a role of node {:?}", node.hostname),
                )
            }),
            _ => Err(QueryError::new(
                "UnknownPath",
                format!("no query {path:?}: this query.wasm answers `roles` and `role/<name>`"),
            )),
        }
    })
}

/// The roles of `host` under the schedule `data` with their variables (see the module docs).
pub fn node_roles(data: &Value, host: &str) -> Result<Map<String, Value>, QueryError> {
    let Some(Value::Object(assigned)) = lookup(data, &["nodes", host, "roles"]) else {
        return Ok(Map::new());
    };
    let mut roles = Map::new();
    for role in assigned.keys() {
        roles.insert(role.clone(), Value::Object(role_vars(data, host, role)?));
    }
    Ok(roles)
}

/// The variables of `role` on `host`: the four sources merged, lowest first, plus `role` and
/// `node`.
fn role_vars(data: &Value, host: &str, role: &str) -> Result<Map<String, Value>, QueryError> {
    let sources: [&[&str]; 4] = [
        &["vars"],
        &["roles", role],
        &["nodes", host, "vars"],
        &["nodes", host, "roles", role],
    ];
    let mut merged = Map::new();
    for path in sources {
        match lookup(data, path) {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) if items.is_empty() => {}
            Some(Value::Object(source)) => merge_into(&mut merged, source),
            Some(other) => {
                return Err(QueryError::new(
                    "BadSchedule",
                    format!(
                        "role {role:?}: schedule field `{}` must be an object, got {}",
                        path.join("."),
                        type_name(other)
                    ),
                ));
            }
        }
    }
    merged.insert("role".into(), Value::String(role.into()));
    merged
        .entry("node")
        .or_insert_with(|| Value::String(host.into()));
    Ok(merged)
}

/// Puts `source` over `merged`: a later value replaces an earlier one, except that two objects
/// merge their keys (one level: the inner values are replaced whole).
fn merge_into(merged: &mut Map<String, Value>, source: &Map<String, Value>) {
    for (key, value) in source {
        if let (Some(Value::Object(earlier)), Value::Object(later)) = (merged.get_mut(key), value) {
            for (k, v) in later {
                earlier.insert(k.clone(), v.clone());
            }
        } else {
            merged.insert(key.clone(), value.clone());
        }
    }
}

/// The value at `path`, each key taken literally (a hostname may contain `/`); `None` when a
/// step is missing or not an object.
fn lookup<'a>(data: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(data, |value, key| value.as_object()?.get(*key))
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
