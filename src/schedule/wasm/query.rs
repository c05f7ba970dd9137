//! `scheduler/v1/query.wasm`: verwalter 0.13's hook that derives a node's roles and variables
//! from the schedule (reference §3.9), and answers `POST /v1/query/<path>`.
//!
//! The module exports `init`, `render_roles` and `query` besides the scheduler protocol's
//! `memory`, `alloc` and `dealloc` ([`super::runtime`]); each takes JSON and returns serde's
//! `Result` as JSON: `{"Ok": ..}` or `{"Err": {"kind": .., "message": .., "causes"?: [..]}}`.
//! `init({"schedule": <schedule envelope>, "hostname": ..})` is called once per schedule before
//! the others.
//!
//! [`QueryHook`] is the node's one `query.wasm`: the render controller's [`RoleSource`] and what
//! answers `/v1/query`. It is read when the file exists, compiled anew when its bytes change,
//! instantiated and `init`ed once per schedule (0.13: a new instance per schedule), and dropped
//! after a call that failed (trap, budget, bad output) so the next one starts from a fresh
//! instance; an `Err` the module answered keeps it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use verwalter_controllers::machinery::ports::{NodeRoles, RoleSource, RolesError, RolesRequest};
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
    /// The module answered with its own `{"Err": ..}`: it is working, and its instance is kept.
    pub(crate) answered: bool,
}

fn failed(message: String) -> QueryError {
    QueryError {
        message,
        answered: false,
    }
}

/// A loaded `query.wasm`.
pub(crate) struct QueryModule {
    module: WasmModule,
    name: String,
}

impl std::fmt::Debug for QueryModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueryModule")
    }
}

/// Whether `scheduler_dir` (`<config-dir>/scheduler/v1`) has a `query.wasm`.
pub(crate) fn has_query_wasm(scheduler_dir: &Path) -> bool {
    scheduler_dir.join(QUERY_WASM).is_file()
}

impl QueryModule {
    /// Loads `query.wasm` from `scheduler_dir` (`<config-dir>/scheduler/v1`).
    pub(crate) fn load(
        scheduler_dir: &Path,
        limits: WasmLimits,
    ) -> Result<QueryModule, QueryError> {
        let name = format!("{SCHEDULER_DIR}/{QUERY_WASM}");
        let bytes = read_module(&scheduler_dir.join(QUERY_WASM))
            .map_err(|e| failed(format!("{name}: cannot read: {e}")))?;
        Self::from_bytes(&name, &bytes, limits)
    }

    pub(crate) fn from_bytes(
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

    fn call<T: serde::Serialize>(&mut self, entry: &str, input: &T) -> Result<Value, QueryError> {
        let result = self
            .module
            .call_json(entry, input)
            .map_err(|e| failed(e.message))?;
        let answered = result
            .as_object()
            .is_some_and(|map| map.len() == 1 && map.contains_key("Err"));
        unwrap_envelope(result).map_err(|m| QueryError {
            message: format!("{}: {entry}: {m}", self.name),
            answered,
        })
    }

    /// `init({"schedule", "hostname"})`: readies the module for `schedule` on node `hostname`.
    pub(crate) fn init(&mut self, schedule: &Schedule, hostname: &str) -> Result<(), QueryError> {
        // A struct, not a `json!` tree: the schedule's data goes in as the text it is held as.
        #[derive(serde::Serialize)]
        struct Init<'a> {
            schedule: &'a Schedule,
            hostname: &'a str,
        }
        self.call("init", &Init { schedule, hostname }).map(|_| ())
    }

    /// `render_roles({"deployment_id", "previous_schedule"})`: the roles to render on this node
    /// with their variables, `{role: vars}`.
    pub(crate) fn render_roles(
        &mut self,
        deployment_id: &str,
        previous: Option<&Schedule>,
    ) -> Result<serde_json::Map<String, Value>, QueryError> {
        #[derive(serde::Serialize)]
        struct RenderRoles<'a> {
            deployment_id: &'a str,
            previous_schedule: Option<&'a Schedule>,
        }
        let input = RenderRoles {
            deployment_id,
            previous_schedule: previous,
        };
        let value = self.call("render_roles", &input)?;
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
    pub(crate) fn query(&mut self, path: &str, body: &Value) -> Result<Value, QueryError> {
        self.call("query", &json!({"path": path, "body": body}))
    }
}

/// What `<config-dir>/scheduler/v1/query.wasm` derives for `hostname` from `schedule`, for the
/// offline commands (`verwalter check`, `verwalter render`): loaded, `init`ed and asked for
/// `render_roles` once, within the scheduler's default limits. `None` without a `query.wasm`.
pub fn derive_offline(
    config_dir: &Path,
    schedule: &Schedule,
    hostname: &str,
    deployment_id: &str,
) -> Result<Option<serde_json::Map<String, Value>>, QueryError> {
    let dir = config_dir.join(SCHEDULER_DIR);
    if !has_query_wasm(&dir) {
        return Ok(None);
    }
    let mut module = QueryModule::load(&dir, crate::schedule::lua::Limits::default().into())?;
    module.init(schedule, hostname)?;
    module.render_roles(deployment_id, None).map(Some)
}

/// `{"Ok": v}` -> `v`; `{"Err": {kind, message, causes?}}` -> its text.
pub(crate) fn unwrap_envelope(value: Value) -> Result<Value, String> {
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

/// The node's `scheduler/v1/query.wasm` (see the module docs). Clones share the module.
#[derive(Clone)]
pub struct QueryHook {
    dir: PathBuf,
    limits: WasmLimits,
    loaded: Arc<Mutex<Option<Loaded>>>,
}

/// A compiled module, instantiated and initialised for one schedule.
struct Loaded {
    bytes: Vec<u8>,
    module: QueryModule,
    /// The hash of the schedule `init` took, with the host.
    schedule: String,
}

impl std::fmt::Debug for QueryHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueryHook({})", self.dir.display())
    }
}

impl QueryHook {
    /// The hook of `scheduler_dir` (`<config-dir>/scheduler/v1`), run within `limits` (the
    /// scheduler's `time-limit-ms` and `memory-limit-mib`).
    pub fn new(scheduler_dir: PathBuf, limits: WasmLimits) -> QueryHook {
        QueryHook {
            dir: scheduler_dir,
            limits,
            loaded: Arc::new(Mutex::new(None)),
        }
    }

    /// Whether there is a `query.wasm` to run.
    pub(crate) fn present(&self) -> bool {
        has_query_wasm(&self.dir)
    }

    /// Runs `call` on the module initialised for `schedule` on `hostname`: compiled again when
    /// the file changed, instantiated and `init`ed again for another schedule. Blocks: call it
    /// off the async runtime. A call that fails drops the instance, unless the module answered
    /// with its own `Err` (a query it refuses, say).
    pub(crate) fn with_module<T>(
        &self,
        schedule: &Schedule,
        hostname: &str,
        call: impl FnOnce(&mut QueryModule) -> Result<T, QueryError>,
    ) -> Result<T, QueryError> {
        let name = format!("{SCHEDULER_DIR}/{QUERY_WASM}");
        let bytes = read_module(&self.dir.join(QUERY_WASM))
            .map_err(|e| failed(format!("{name}: cannot read: {e}")))?;
        let key = format!("{}@{hostname}", schedule.hash);
        let mut slot = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let current = slot
            .as_ref()
            .is_some_and(|l| l.bytes == bytes && l.schedule == key);
        if !current {
            *slot = None;
            let mut module = QueryModule::from_bytes(&name, &bytes, self.limits)?;
            module.init(schedule, hostname)?;
            *slot = Some(Loaded {
                bytes,
                module,
                schedule: key,
            });
        }
        let loaded = slot.as_mut().expect("loaded above");
        let result = call(&mut loaded.module);
        if result.as_ref().is_err_and(|e| !e.answered) {
            *slot = None;
        }
        result
    }
}

impl RoleSource for QueryHook {
    fn name(&self) -> &str {
        "scheduler/v1/query.wasm"
    }

    /// The file's size and modification time: a changed `query.wasm` derives the roles again.
    fn version(&self) -> Option<String> {
        let meta = std::fs::metadata(self.dir.join(QUERY_WASM)).ok()?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Some(format!("{}:{modified}", meta.len()))
    }

    /// `None` without a `query.wasm` (the compat merge); else `render_roles`, off the runtime.
    fn roles(
        &self,
        request: RolesRequest,
    ) -> Option<BoxFuture<'static, Result<NodeRoles, RolesError>>> {
        if !self.present() {
            return None;
        }
        let hook = self.clone();
        Some(Box::pin(async move {
            let answer = tokio::task::spawn_blocking(move || {
                hook.with_module(&request.schedule, &request.host, |module| {
                    module.render_roles(&request.deployment_id, request.previous.as_ref())
                })
            })
            .await;
            match answer {
                Ok(result) => result.map_err(|e| RolesError(e.message)),
                Err(e) => Err(RolesError(format!(
                    "the query.wasm call did not finish: {e}"
                ))),
            }
        }))
    }
}
