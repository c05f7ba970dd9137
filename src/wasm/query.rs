//! `scheduler/v1/query.wasm`: verwalter 0.13's hook that derives a node's roles and variables
//! from the schedule (reference §3.9), and answers `POST /v1/query/<path>`.
//!
//! The module exports `init`, `render_roles` and `query` besides the scheduler protocol's
//! `memory`, `alloc` and `dealloc` ([`super::runtime`]); each takes JSON and returns serde's
//! `Result` as JSON: `{"Ok": ..}` or `{"Err": {"kind": .., "message": .., "causes"?: [..]}}`.
//! `init({"schedule": <schedule envelope>, "hostname": ..})` is called once per schedule before
//! the others.

use std::path::Path;

use serde_json::{Value, json};
use verwalter_controllers::state::Schedule;

use super::runtime::{WasmLimits, WasmModule};
use super::{QUERY_WASM, read_module};
use crate::inputs::SCHEDULER_DIR;

/// Why a query.wasm call failed: the module's own `Err` (with its kind) or a failure of the
/// module itself (trap, time budget, memory, bad output).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct QueryError {
    pub message: String,
}

fn failed(message: String) -> QueryError {
    QueryError { message }
}

/// A loaded `query.wasm`.
pub struct QueryModule {
    module: WasmModule,
    name: String,
}

impl std::fmt::Debug for QueryModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueryModule")
    }
}

/// Whether `scheduler_dir` (`<config-dir>/scheduler/v1`) has a `query.wasm`.
pub fn has_query_wasm(scheduler_dir: &Path) -> bool {
    scheduler_dir.join(QUERY_WASM).is_file()
}

impl QueryModule {
    /// Loads `query.wasm` from `scheduler_dir` (`<config-dir>/scheduler/v1`).
    pub fn load(scheduler_dir: &Path, limits: WasmLimits) -> Result<QueryModule, QueryError> {
        let name = format!("{SCHEDULER_DIR}/{QUERY_WASM}");
        let bytes = read_module(&scheduler_dir.join(QUERY_WASM))
            .map_err(|e| failed(format!("{name}: cannot read: {e}")))?;
        Self::from_bytes(&name, &bytes, limits)
    }

    pub fn from_bytes(
        name: &str,
        bytes: &[u8],
        limits: WasmLimits,
    ) -> Result<QueryModule, QueryError> {
        let module = WasmModule::load(name, bytes, &["init", "render_roles", "query"], limits)
            .map_err(|e| failed(e.message))?;
        Ok(QueryModule {
            module,
            name: name.to_string(),
        })
    }

    fn call(&mut self, entry: &str, input: &Value) -> Result<Value, QueryError> {
        let result = self
            .module
            .call_json(entry, input)
            .map_err(|e| failed(e.message))?;
        unwrap_envelope(result).map_err(|m| failed(format!("{}: {entry}: {m}", self.name)))
    }

    /// `init({"schedule", "hostname"})`: readies the module for `schedule` on node `hostname`.
    pub fn init(&mut self, schedule: &Schedule, hostname: &str) -> Result<(), QueryError> {
        self.call("init", &json!({"schedule": schedule, "hostname": hostname}))
            .map(|_| ())
    }

    /// `render_roles({"deployment_id", "previous_schedule"})`: the roles to render on this node
    /// with their variables, `{role: vars}`.
    pub fn render_roles(
        &mut self,
        deployment_id: &str,
        previous: Option<&Schedule>,
    ) -> Result<serde_json::Map<String, Value>, QueryError> {
        let value = self.call(
            "render_roles",
            &json!({"deployment_id": deployment_id, "previous_schedule": previous}),
        )?;
        let roles = match value {
            Value::Object(roles) => roles,
            other => {
                return Err(failed(format!(
                    "{}: render_roles returned {other}, not an object of roles",
                    self.name
                )));
            }
        };
        for (role, vars) in &roles {
            if !vars.is_object() {
                return Err(failed(format!(
                    "{}: render_roles: the variables of role {role:?} are not an object",
                    self.name
                )));
            }
        }
        Ok(roles)
    }

    /// `query({"path", "body"})`: the answer to `POST /v1/query/<path>`.
    pub fn query(&mut self, path: &str, body: &Value) -> Result<Value, QueryError> {
        self.call("query", &json!({"path": path, "body": body}))
    }
}

/// `{"Ok": v}` -> `v`; `{"Err": {kind, message, causes?}}` -> its text.
pub fn unwrap_envelope(value: Value) -> Result<Value, String> {
    let Value::Object(mut map) = value else {
        return Err(format!(
            "returned {value}, not {{\"Ok\": ..}} or {{\"Err\": ..}}"
        ));
    };
    if map.len() == 1 {
        if let Some(ok) = map.remove("Ok") {
            return Ok(ok);
        }
        if let Some(err) = map.remove("Err") {
            let kind = err["kind"].as_str().unwrap_or("Error");
            let message = err["message"]
                .as_str()
                .map_or_else(|| err.to_string(), String::from);
            let mut text = format!("{kind}: {message}");
            if let Some(causes) = err["causes"].as_array() {
                for cause in causes {
                    text.push_str(": ");
                    text.push_str(cause.as_str().unwrap_or(&cause.to_string()));
                }
            }
            return Err(text);
        }
    }
    Err(format!(
        "returned {}, not {{\"Ok\": ..}} or {{\"Err\": ..}}",
        Value::Object(map)
    ))
}
