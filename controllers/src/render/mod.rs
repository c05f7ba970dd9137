//! The render controller: every role assigned to this node converges on its own.
//!
//! Per role, desired = hash of (role variables without per-pass values + the files of its
//! template dir, + the schedule hash when a template mentions `full_schedule`). When it differs
//! from the hash last applied (kept in the storage dir), or a `force_render_all` is newer than the
//! role's last render, the role is rendered and applied. A failure is retried with the driver's
//! backoff (first retry within a second, at most every 5 minutes) without a new schedule; other
//! roles go on.
//!
//! One deployment id names each pass: when the first role needing work is found, every role of
//! the node that needs work then joins that pass; the pass ends when each had its attempt.
//!
//! Roles on a node can depend on each other: a role's `depends_on` variable (a list of role
//! names, or one name) holds it back until every role it names has applied the current schedule
//! (its applied hash equals its desired one). Until then it is *waiting*; when one of them fails
//! (or is blocked itself) it is *blocked*, and leaves its pass as blocked, not failed. Roles
//! without dependencies between them still run in parallel (the driver's bound). When a role
//! applies, starts failing (or fails with another error) or clears, the roles that depend on it
//! are woken (no polling); a role failing again as before wakes no one, so the roles of a cycle
//! do not wake each other past their backoff. A cycle, or a dependency on a role this node does
//! not have, is an error of the roles involved, retried with the backoff like any failure; every
//! other role still applies. With [`ErrorPolicy::Halt`] a failure holds back every other role of the
//! node that needs work until it clears (what runs finishes), ernest's rule.
//!
//! A string variable `$(role.path)` takes the value at `path` of another role's variables on
//! this node (see [`crate::refs`]), resolved once per schedule; a cycle through references is an
//! error of the role.
//!
//! The deployment log is written outside the state lock, and never decides anything: a log that
//! cannot be written is reported in `roles.deployment_log`, and roles go on.
//!
//! Which roles the node has, and their variables, comes from the [`RoleSource`] port, once per
//! schedule (and again when the source's version, e.g. the module file, changes): the compat merge ([`CompatRoles`], the default) reads them from the schedule as it
//! is; a hook (`query.wasm`) gives `{role: vars}`, which is then read as if the schedule were
//! `{"nodes": {host: {"roles": ..}}}` (so `template`, `depends_on` and references work the same).
//! While a hook runs, the driver sees one key, the source's name (never a role name); when it
//! fails, that key fails (status, metric, log), no role of the schedule is rendered, and what was
//! applied stays.

pub mod vars;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use rand::Rng;
use serde_json::Value;
use sha1::{Digest, Sha1};

use crate::graph::{ErrorPolicy, Graph, GraphError};
use crate::machinery::clock::Clock;
use crate::machinery::driver::{Driver, DriverConfig, Reconciler, Requeue};
use crate::machinery::ports::{
    AppliedStore, ApplyError, CompatRoles, DeploymentLog, RoleApplier, RoleJob, RoleOutcome,
    RoleSource, RolesRequest, StorageError,
};
use crate::machinery::store::Field;
use crate::node::Store;
use crate::refs;
use crate::schedule::data::TextPart;
use crate::state::{
    BlockedState, Deployment, RoleBlocked, RoleFailure, RolesStatus, Schedule, ScheduleData,
    Templates,
};

/// Values of a role's own variables kept as text, by key ([`RoleJob::unparsed`]).
type Unparsed = Vec<(String, TextPart)>;
/// A variable source whose canonical text is at least this long enters a role's desired hash as
/// its length and XXH3-128 digest rather than whole: a megabyte of shared variables is hashed in
/// a twentieth of SHA-1's time on each node, at each change (docs/benchmarks.md, issue 32 §1).
/// The desired hash only decides whether a role renders again on this node (it is not sent
/// anywhere); a role whose variables change is one whose text changes, and two texts of a
/// megabyte with the same 128-bit digest are not met by chance.
pub(crate) const DIGESTED_MIN: usize = 64 * 1024;

/// Feeds one variable source's canonical `text` into a desired hash: its length, then the text,
/// or its XXH3-128 digest when it is [`DIGESTED_MIN`] bytes or more (the length decides which,
/// so the two never read alike).
fn feed_source(hasher: &mut Sha1, text: &[u8]) {
    hasher.update((text.len() as u64).to_le_bytes());
    if text.len() >= DIGESTED_MIN {
        hasher.update(xxhash_rust::xxh3::xxh3_128(text).to_le_bytes());
    } else {
        hasher.update(text);
    }
}

/// Length of a deployment id (as in verwalter 0.13).
pub(crate) const DEPLOYMENT_ID_LEN: usize = 24;

/// A new random deployment id: 24 ASCII letters and digits.
pub fn deployment_id() -> String {
    rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(DEPLOYMENT_ID_LEN)
        .map(char::from)
        .collect()
}

/// Why a role's pass failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The schedule gives the role unusable variables (bad name, no template).
    #[error("{0}")]
    Vars(String),
    /// The template dir is missing.
    #[error("{0}")]
    Templates(String),
    /// Rendering or a command failed.
    #[error("{0}")]
    Apply(ApplyError),
    /// The applied hash could not be stored.
    #[error("{0}")]
    Store(StorageError),
    /// `depends_on` cannot be followed: a cycle, a role not on this node, a bad value.
    #[error("{0}")]
    Dependencies(String),
    /// The [`RoleSource`] could not give this node's roles: the schedule is not rendered.
    #[error("{0}")]
    Roles(String),
}

impl RenderError {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            RenderError::Vars(_) => "vars",
            RenderError::Templates(_) => "templates",
            RenderError::Apply(_) => "apply",
            RenderError::Store(_) => "store",
            RenderError::Dependencies(_) => "dependencies",
            RenderError::Roles(_) => "roles",
        }
    }
}

/// What a role should look like now.
#[derive(Debug, Clone)]
struct Desired {
    hash: String,
    template: String,
    /// Whether its variables hold `$(...)` references (resolved when it is applied).
    has_refs: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    hash: String,
    /// The `force_render` generation this role last rendered under.
    forced: u64,
}

#[derive(Debug)]
struct Pass {
    id: String,
    schedule: String,
    force: u64,
    started: u64,
    roles: Vec<String>,
    /// Roles of the pass that have not had their attempt yet.
    pending: BTreeSet<String>,
    failed: Vec<String>,
    /// Roles that left the pass blocked, with why.
    blocked: Vec<(String, String)>,
}

/// A role's desired state and the (schedule, templates) snapshots it was computed for. The
/// snapshots are held, not just their addresses: a freed snapshot's address can be reused by a
/// new one with other content, which must not be taken for the old.
type Cached = (
    Arc<Option<Schedule>>,
    Arc<Templates>,
    Result<Arc<Desired>, RenderError>,
);

/// The schedule a node's roles are read from, or why the role source could not give them.
type View = Result<Arc<Option<Schedule>>, String>;

/// A deployment-log entry, decided under the state lock and written after it is released.
#[derive(Debug)]
enum LogEntry {
    Start {
        id: String,
        schedule: String,
        roles: Vec<String>,
        changes: Vec<String>,
    },
    Finish {
        id: String,
        failed: Vec<String>,
        blocked: Vec<(String, String)>,
    },
    /// A role of pass `id` had its attempt, at `at` (ms).
    Role {
        id: String,
        role: String,
        outcome: RoleOutcome,
        at: u64,
    },
}

/// The dependencies between this node's roles for one schedule (see the module docs).
#[derive(Debug, Default)]
struct Deps {
    graph: Graph,
    /// Roles whose `depends_on` cannot be followed, with why.
    problems: HashMap<String, String>,
}

impl Deps {
    fn build(data: &Value, host: &str) -> Deps {
        let roles = vars::node_roles(data, host);
        let mut problems = HashMap::new();
        let mut lists = Vec::with_capacity(roles.len());
        for role in &roles {
            match depends_on(data, host, role) {
                Ok(list) => lists.push((role.as_str(), list)),
                Err(problem) => {
                    problems.insert(role.clone(), problem);
                    lists.push((role.as_str(), Vec::new()));
                }
            }
        }
        let (graph, errors) = Graph::from_depends_on(
            lists
                .iter()
                .map(|(role, list)| (*role, list.iter().map(String::as_str))),
        );
        for error in errors {
            if let GraphError::Missing { vertex, missing } = error {
                problems.entry(vertex.clone()).or_insert_with(|| {
                    format!(
                        "role {vertex:?} depends on {missing:?}, which is not a role of this node"
                    )
                });
            }
        }
        for (members, cycle) in graph.cyclic_groups() {
            let text = graph.named_cycle(&cycle).join(" -> ");
            for v in members {
                let role = graph.name(v);
                problems.insert(
                    role.to_string(),
                    format!("role {role:?} is in a dependency cycle: {text}"),
                );
            }
        }
        Deps { graph, problems }
    }

    fn dependents(&self, role: &str) -> Vec<String> {
        self.graph.id(role).map_or_else(Vec::new, |id| {
            self.graph
                .dependents(id)
                .iter()
                .map(|&d| self.graph.name(d).to_string())
                .collect()
        })
    }
}

/// What this controller makes of a schedule for `host` before any template is read: per role
/// of the node, its merged variables with `$(role.path)` references resolved (or why not), and
/// the dependency problems (missing roles, cycles) by role. The same functions a render pass
/// calls (the fuzz harness, `tests/fuzz/`, feeds it schedules).
#[derive(Debug)]
pub struct ScheduleCheck {
    pub roles: Vec<(String, RoleVars)>,
    pub(crate) dependency_problems: HashMap<String, String>,
    pub waves: Option<Vec<Vec<String>>>,
}

/// A role's resolved variables, or why they cannot be had.
pub(crate) type RoleVars = Result<serde_json::Map<String, Value>, String>;

impl ScheduleCheck {
    /// What a render pass makes of `role` before reading its template: its resolved variables,
    /// or the error that fails it, in the pass's order (unusable variables or an unresolvable
    /// reference first, then its dependencies: a cycle, a role this node does not have, a bad
    /// `depends_on`). `None` for a role this node does not have. The offline tools
    /// (`verwalter check`, `verwalter render`) say what the daemon says with it.
    pub fn role(&self, role: &str) -> Option<RoleVars> {
        let (_, vars) = self.roles.iter().find(|(name, _)| name == role)?;
        Some(match (vars, self.dependency_problems.get(role)) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), Some(problem)) => Err(problem.clone()),
            (Ok(vars), None) => Ok(vars.clone()),
        })
    }

    /// The error of each role that fails before its template is read (see [`Self::role`]), in
    /// the order of the node's roles.
    pub fn problems(&self) -> Vec<String> {
        self.roles
            .iter()
            .filter_map(|(role, _)| self.role(role)?.err())
            .collect()
    }
}

/// See [`ScheduleCheck`].
pub fn check_schedule(data: &Value, host: &str) -> ScheduleCheck {
    let deps = Deps::build(data, host);
    let mut doc = serde_json::Map::new();
    for role in vars::node_roles(data, host) {
        if let Ok(merged) = vars::role_vars(data, host, &role) {
            doc.insert(role, Value::Object(merged));
        }
    }
    let doc = Value::Object(doc);
    let roles = vars::node_roles(data, host)
        .into_iter()
        .map(|role| {
            let resolved = resolve_role_vars(data, host, &role, &doc);
            (role, resolved)
        })
        .collect();
    let waves = deps.graph.waves().ok().map(|waves| {
        waves
            .into_iter()
            .map(|wave| {
                wave.into_iter()
                    .map(|v| deps.graph.name(v).to_string())
                    .collect()
            })
            .collect()
    });
    ScheduleCheck {
        roles,
        dependency_problems: deps.problems,
        waves,
    }
}

/// The merged variables of `role` on `host` with `$(role.path)` references resolved against
/// `doc`. The `role` variable, and `node` when no source sets it, are the literal names: a role
/// named `a$(b.c)` is not a reference (found by fuzzing: such a role's `role` variable was
/// resolved, or failed it).
fn resolve_role_vars(
    data: &Value,
    host: &str,
    role: &str,
    doc: &Value,
) -> Result<serde_json::Map<String, Value>, String> {
    let node_set = vars::sources(data, host, role)
        .map_err(|e| e.to_string())?
        .iter()
        .flatten()
        .any(|source| source.contains_key("node"));
    let mut merged = vars::role_vars(data, host, role).map_err(|e| e.to_string())?;
    let role_name = merged.remove("role");
    let host_name = if node_set {
        None
    } else {
        merged.remove("node")
    };
    match refs::Resolver::new(doc).resolve(&Value::Object(merged), "") {
        Ok(Value::Object(mut resolved)) => {
            resolved.extend(role_name.map(|v| ("role".to_string(), v)));
            resolved.extend(host_name.map(|v| ("node".to_string(), v)));
            Ok(resolved)
        }
        Ok(_) => unreachable!("an object resolves to an object"),
        Err(e) => Err(format!("role {role:?}: variable {e}")),
    }
}

/// `depends_on` of `role`: from the source of highest precedence that sets it (a list replaces
/// a list whole, as every list does in the merge); a list of role names or one name. An empty
/// object is an empty list: a Lua scheduler's empty table comes out as `{}` (Lua cannot tell
/// `{}` from `[]`), and `null` is none.
fn depends_on(data: &Value, host: &str, role: &str) -> Result<Vec<String>, String> {
    // A role with unusable sources fails on its own (`RenderController::desired`).
    let Ok(sources) = vars::sources(data, host, role) else {
        return Ok(Vec::new());
    };
    let Some(value) = sources
        .iter()
        .rev()
        .flatten()
        .find_map(|source| source.get("depends_on"))
    else {
        return Ok(Vec::new());
    };
    let bad = || format!("role {role:?}: depends_on must be a list of role names, got {value}");
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Object(map) if map.is_empty() => Ok(Vec::new()),
        Value::String(name) => Ok(vec![name.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string).ok_or_else(bad))
            .collect(),
        _ => Err(bad()),
    }
}

/// What the dependencies of a role that needs work allow now.
enum Gate {
    Go,
    Hold {
        state: BlockedState,
        on: Vec<String>,
        root_cause: Vec<String>,
        reason: String,
    },
}

#[derive(Debug, Default)]
struct State {
    applied: HashMap<String, Applied>,
    /// Desired state per role, cached for one (schedule, templates) snapshot pair.
    cache: HashMap<String, Cached>,
    passes: Vec<Pass>,
    /// Digest of the sources every role shares (`vars`, `nodes[host].vars`) for one schedule
    /// snapshot (held, as in [`Cached`]), so a pass over many roles encodes them once.
    shared: Option<(Arc<Option<Schedule>>, [u8; 20])>,
    /// The dependencies of this node's roles for one schedule snapshot (held, as in [`Cached`]).
    deps: Option<(Arc<Option<Schedule>>, Arc<Deps>)>,
    /// Every role of this node by name with its merged variables (references unresolved), for
    /// resolving `$(role.path)`, for one schedule snapshot.
    refs_doc: Option<(Arc<Option<Schedule>>, Arc<Value>)>,
    /// The roles of this node for one schedule snapshot (held, as in [`Cached`]): the schedule
    /// they are read from (the same snapshot with [`CompatRoles`]), or why the source failed.
    view: Option<(Arc<Option<Schedule>>, Option<String>, View)>,
    /// The last schedule whose roles were derived, for the source's `previous`.
    previous: Option<Schedule>,
    /// The deployment id given to the source with the roles, for the first pass they start.
    next_pass_id: Option<String>,
    /// The schedule whose `changes` went into the log last (each schedule's once).
    changes_logged: Option<String>,
    /// Log entries not written yet, in the order they were decided.
    log_queue: Vec<LogEntry>,
}

/// Renders the roles of node `host` (see the module docs).
pub struct RenderController {
    store: Store,
    host: String,
    applier: Arc<dyn RoleApplier>,
    applied_store: Arc<dyn AppliedStore>,
    log: Arc<dyn DeploymentLog>,
    clock: Arc<dyn Clock>,
    out: Field<RolesStatus>,
    state: Mutex<State>,
    /// Held while queued log entries are written, so they reach the log in order.
    log_writer: Mutex<()>,
    policy: ErrorPolicy,
    roles: Arc<dyn RoleSource>,
    /// Asks the driver for a pass of one role (set by [`RenderController::driver`]).
    wake: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl RenderController {
    pub fn new(
        store: Store,
        host: String,
        out: Field<RolesStatus>,
        applier: Arc<dyn RoleApplier>,
        applied_store: Arc<dyn AppliedStore>,
        log: Arc<dyn DeploymentLog>,
        clock: Arc<dyn Clock>,
    ) -> RenderController {
        let applied = applied_store
            .load()
            .into_iter()
            .map(|(role, hash)| (role, Applied { hash, forced: 0 }))
            .collect();
        RenderController {
            store,
            host,
            applier,
            applied_store,
            log,
            clock,
            out,
            state: Mutex::new(State {
                applied,
                ..State::default()
            }),
            log_writer: Mutex::new(()),
            policy: ErrorPolicy::default(),
            roles: Arc::new(CompatRoles),
            wake: std::sync::OnceLock::new(),
        }
    }

    /// What a failing role holds back (see the module docs); by default only its dependents.
    pub fn error_policy(mut self, policy: ErrorPolicy) -> RenderController {
        self.policy = policy;
        self
    }

    /// Where this node's roles and their variables come from; by default [`CompatRoles`].
    pub fn role_source(mut self, roles: Arc<dyn RoleSource>) -> RenderController {
        self.roles = roles;
        self
    }

    /// The roles of this node for the schedule in force, or `None` while they are not known
    /// (no schedule, the role source has not answered or failed). The cleanup controller asks.
    pub fn node_roles(&self) -> Option<BTreeSet<String>> {
        let real = self.store.schedule.peek();
        match self.view_now(&real)? {
            Ok(view) => view.as_ref().as_ref().map(|s| {
                vars::node_roles(s.data.skeleton(), &self.host)
                    .into_iter()
                    .collect()
            }),
            Err(_) => None,
        }
    }

    /// The schedule this node's roles are read from for snapshot `real`, when known now: the
    /// cached answer of the source, or `real` cut to this node's part when the source derives
    /// nothing ([`CompatRoles`]; see [`Schedule::node_view`]).
    fn view_now(&self, real: &Arc<Option<Schedule>>) -> Option<View> {
        let version = self.roles.version();
        let mut st = self.state.lock().unwrap();
        if let Some((s, v, view)) = &st.view
            && Arc::ptr_eq(s, real)
            && *v == version
        {
            return Some(view.clone());
        }
        let Some(schedule) = real.as_ref() else {
            return Some(Ok(real.clone()));
        };
        let request = RolesRequest {
            schedule: schedule.clone(),
            previous: None,
            host: self.host.clone(),
            deployment_id: String::new(),
        };
        // A source that derives roles answers in `derive_roles`; its future is dropped unpolled.
        match self.roles.roles(request) {
            None => {
                let view = Arc::new(Some(schedule.node_view(&self.host)));
                st.view = Some((real.clone(), version, Ok(view.clone())));
                Some(Ok(view))
            }
            Some(_) => None,
        }
    }

    /// Asks the role source for this node's roles under the schedule in force, then wakes them.
    async fn derive_roles(self: Arc<Self>) -> Result<Requeue, RenderError> {
        let real = self.store.schedule.peek();
        if let Some(Ok(_)) = self.view_now(&real) {
            return Ok(Requeue::None);
        }
        let Some(schedule) = real.as_ref().clone() else {
            return Ok(Requeue::None);
        };
        let id = deployment_id();
        let version = self.roles.version();
        let request = RolesRequest {
            schedule: schedule.clone(),
            previous: self.state.lock().unwrap().previous.clone(),
            host: self.host.clone(),
            deployment_id: id.clone(),
        };
        let answer = match self.roles.roles(request) {
            None => Ok(None),
            Some(future) => future.await.map(Some),
        };
        let key = self.roles.name().to_string();
        match answer {
            Ok(roles) => {
                let view = match roles {
                    None => Arc::new(Some(schedule.node_view(&self.host))),
                    Some(roles) => Arc::new(Some(Schedule {
                        data: ScheduleData::from_value(vars::roles_view(
                            &schedule.data.node_view(&self.host),
                            &self.host,
                            roles,
                        )),
                        ..schedule.clone()
                    })),
                };
                let roles = view
                    .as_ref()
                    .as_ref()
                    .map(|s| vars::node_roles(s.data.skeleton(), &self.host))
                    .unwrap_or_default();
                {
                    let mut st = self.state.lock().unwrap();
                    st.view = Some((real.clone(), version, Ok(view)));
                    st.previous = Some(schedule);
                    st.next_pass_id = Some(id);
                }
                self.clear_failure(&key);
                if let Some(wake) = self.wake.get() {
                    for role in roles {
                        let _ = wake.send(role);
                    }
                }
                Ok(Requeue::None)
            }
            Err(e) => {
                let message = format!("{e}; the schedule is not rendered");
                self.state.lock().unwrap().view =
                    Some((real.clone(), version, Err(message.clone())));
                let _ = self.record_failure(&key, message.clone(), None);
                Err(RenderError::Roles(message))
            }
        }
    }

    /// A driver that wakes on a new schedule, changed templates and `force_render_all`.
    pub fn driver(self: Arc<Self>, config: DriverConfig) -> Driver<RenderController> {
        let store = self.store.clone();
        let (wake, wakes) = tokio::sync::mpsc::unbounded_channel();
        // A second driver of one controller would not be woken; there is one.
        let _ = self.wake.set(wake);
        Driver::new(self, config)
            .wake_keys(wakes)
            .trigger(store.schedule.trigger())
            .trigger(store.templates.trigger())
            .trigger(store.force_render.trigger())
    }

    /// Drops what is kept about roles not in `keep`: failures, applied hashes (memory and
    /// storage), cached desired state. The cleanup controller calls it.
    pub(crate) fn retain_roles(&self, keep: &BTreeSet<String>) -> Vec<String> {
        let gone: Vec<String> = {
            let mut st = self.state.lock().unwrap();
            st.cache.retain(|role, _| keep.contains(role));
            let gone: Vec<String> = st
                .applied
                .keys()
                .filter(|role| !keep.contains(*role))
                .cloned()
                .collect();
            for role in &gone {
                st.applied.remove(role);
            }
            gone
        };
        for role in &gone {
            if let Err(e) = self.applied_store.remove(role) {
                tracing::warn!(role, error = %e, "Cannot remove the applied hash of a role gone from the schedule.");
            }
        }
        self.out.update(|s| {
            s.failed.retain(|role, _| keep.contains(role));
            s.blocked.retain(|role, _| keep.contains(role));
        });
        gone
    }

    /// The desired hash covers what the merged variables are made of (the four sources, the
    /// role and the node) rather than the merged result: the same inputs give the same result,
    /// and the shared sources are encoded once per schedule instead of once per role.
    fn desired(
        &self,
        shared: &[u8; 20],
        schedule: &Schedule,
        templates: &Templates,
        role: &str,
        refs_doc: impl FnOnce() -> Arc<Value>,
    ) -> Result<Desired, RenderError> {
        let vars_error = |e: vars::VarsError| RenderError::Vars(e.to_string());
        let sources =
            vars::sources(schedule.data.skeleton(), &self.host, role).map_err(vars_error)?;
        let template = vars::role_template(role, &sources).map_err(vars_error)?;
        let mut hasher = Sha1::new();
        hasher.update(shared);
        let mut bytes = Vec::with_capacity(256);
        for (index, source) in [(1, sources[1]), (3, sources[3])] {
            // The role's own variables as they stand in a view cut from received text are
            // already the canonical text the hash covers when no key is left out of it: a big
            // role shared by every node is not written out again on each of them.
            let text = match source {
                Some(map)
                    if index == 1 && !vars::UNHASHED_VARS.iter().any(|k| map.contains_key(*k)) =>
                {
                    schedule.data.role_text(role)
                }
                _ => None,
            };
            let text = match text {
                Some(text) => text.as_bytes(),
                None => {
                    bytes.clear();
                    // The skeleton holds null for the values kept as text: the role's own
                    // variables are then written from the tree.
                    let tree;
                    let source = match index == 1 && !schedule.data.unparsed(role).is_empty() {
                        true => {
                            tree = vars::sources(schedule.data.tree(), &self.host, role)
                                .map_err(vars_error)?;
                            tree[1]
                        }
                        false => source,
                    };
                    vars::write_hashed_source(source, &mut bytes);
                    &bytes
                }
            };
            feed_source(&mut hasher, text);
        }
        for text in [role, &self.host] {
            hasher.update((text.len() as u64).to_le_bytes());
            hasher.update(text.as_bytes());
        }
        let dir = templates.hash_dir(&template, &mut hasher);
        if dir.files == 0 {
            return Err(RenderError::Templates(format!(
                "role {role:?}: template dir templates/{template} is missing or empty"
            )));
        }
        if dir.mentions_full_schedule {
            hasher.update(schedule.hash.as_bytes());
        }
        // The sources are parts of the data, whose text holds `$(` wherever a string of them
        // does (JSON writes `$` and `(` as they are; text with `\u` escapes is walked): a
        // megabyte of shared variables is searched as text rather than walked as a tree.
        let text = schedule.data.canonical();
        let has_refs = refs::json_may_hold_refs(text)
            && sources
                .iter()
                .flatten()
                .any(|source| source.values().any(refs::has_refs));
        if has_refs {
            // What references find lives in other roles' sources, which the hash does not cover:
            // the resolved variables are hashed instead.
            let resolved = self.resolved_vars(schedule.data.tree(), role, refs_doc())?;
            hasher.update(Value::Object(resolved).to_string().as_bytes());
        }
        Ok(Desired {
            hash: hex::encode(hasher.finalize()),
            template,
            has_refs,
        })
    }

    /// The merged variables of `role` (without references to resolve), and the values of its
    /// own variables kept as text ([`ScheduleData::unparsed`]), which the merged variables
    /// then leave out: merged from the skeleton, unless a value kept as text has its key in
    /// another source too (the merge needs the value then, and reads the tree).
    fn role_vars(
        &self,
        data: &ScheduleData,
        role: &str,
    ) -> Result<(serde_json::Map<String, Value>, Unparsed), RenderError> {
        let vars_error = |e: vars::VarsError| RenderError::Vars(e.to_string());
        let unparsed = data.unparsed(role);
        let sources = vars::sources(data.skeleton(), &self.host, role).map_err(vars_error)?;
        let elsewhere = |key: &String| {
            [0, 2, 3]
                .into_iter()
                .any(|i| sources[i].is_some_and(|s| s.contains_key(key)))
        };
        if unparsed.is_empty() || unparsed.iter().any(|(key, _)| elsewhere(key)) {
            let merged = vars::role_vars(data.tree(), &self.host, role).map_err(vars_error)?;
            return Ok((merged, Vec::new()));
        }
        let mut merged = vars::role_vars(data.skeleton(), &self.host, role).map_err(vars_error)?;
        for (key, _) in &unparsed {
            merged.remove(key);
        }
        Ok((merged, unparsed))
    }

    /// The merged variables of `role` with its `$(role.path)` references resolved against `doc`
    /// (see [`State::refs_doc`]).
    fn resolved_vars(
        &self,
        data: &Value,
        role: &str,
        doc: Arc<Value>,
    ) -> Result<serde_json::Map<String, Value>, RenderError> {
        resolve_role_vars(data, &self.host, role, &doc).map_err(RenderError::Vars)
    }

    /// Every role of this node with its merged variables, for one schedule snapshot.
    fn refs_doc(
        &self,
        slot: &mut Option<(Arc<Option<Schedule>>, Arc<Value>)>,
        schedule: &Arc<Option<Schedule>>,
    ) -> Arc<Value> {
        if let Some((s, doc)) = slot
            && Arc::ptr_eq(s, schedule)
        {
            return doc.clone();
        }
        let mut doc = serde_json::Map::new();
        if let Some(sched) = schedule.as_ref() {
            for role in vars::node_roles(sched.data.tree(), &self.host) {
                if let Ok(merged) = vars::role_vars(sched.data.tree(), &self.host, &role) {
                    doc.insert(role, Value::Object(merged));
                }
            }
        }
        let doc = Arc::new(Value::Object(doc));
        *slot = Some((schedule.clone(), doc.clone()));
        doc
    }

    /// The dependencies of this node's roles, for one schedule snapshot.
    fn deps_cached(&self, st: &mut State, schedule: &Arc<Option<Schedule>>) -> Arc<Deps> {
        if let Some((s, deps)) = &st.deps
            && Arc::ptr_eq(s, schedule)
        {
            return deps.clone();
        }
        let deps = Arc::new(match schedule.as_ref() {
            Some(sched) => Deps::build(sched.data.skeleton(), &self.host),
            None => Deps::default(),
        });
        st.deps = Some((schedule.clone(), deps.clone()));
        deps
    }

    /// Digest of `vars` and `nodes[host].vars` of `schedule` (see [`State::shared`]).
    fn shared_digest(&self, schedule: &Schedule) -> [u8; 20] {
        let mut hasher = Sha1::new();
        let mut bytes = Vec::new();
        let data = schedule.data.skeleton();
        let node_vars = data
            .get("nodes")
            .and_then(|n| n.get(&self.host))
            .and_then(|n| n.get("vars"));
        for source in [data.get("vars"), node_vars] {
            bytes.clear();
            vars::write_hashed_source(source.and_then(Value::as_object), &mut bytes);
            feed_source(&mut hasher, &bytes);
        }
        hasher.finalize().into()
    }

    /// Desired state of `role` for these snapshots, computed once per snapshot pair.
    fn desired_cached(
        &self,
        st: &mut State,
        schedule: &Arc<Option<Schedule>>,
        templates: &Arc<Templates>,
        role: &str,
    ) -> Result<Arc<Desired>, RenderError> {
        if let Some((s, t, cached)) = st.cache.get(role)
            && Arc::ptr_eq(s, schedule)
            && Arc::ptr_eq(t, templates)
        {
            return cached.clone();
        }
        let Some(sched) = schedule.as_ref() else {
            return Err(RenderError::Vars("no schedule".into()));
        };
        let shared = match &st.shared {
            Some((s, digest)) if Arc::ptr_eq(s, schedule) => *digest,
            _ => {
                let digest = self.shared_digest(sched);
                st.shared = Some((schedule.clone(), digest));
                digest
            }
        };
        let refs_doc = &mut st.refs_doc;
        let result = self
            .desired(&shared, sched, templates, role, || {
                self.refs_doc(refs_doc, schedule)
            })
            .map(Arc::new);
        st.cache.insert(
            role.to_string(),
            (schedule.clone(), templates.clone(), result.clone()),
        );
        result
    }

    fn needs_work(st: &State, role: &str, desired: &Desired, force: u64) -> bool {
        match st.applied.get(role) {
            Some(applied) => applied.hash != desired.hash || applied.forced < force,
            None => true,
        }
    }

    /// The pass `role` belongs to, opening one (with every role needing work now) if needed.
    fn join_pass(
        &self,
        st: &mut State,
        schedule: &Arc<Option<Schedule>>,
        templates: &Arc<Templates>,
        role: &str,
        force: u64,
    ) -> String {
        let sched_hash = schedule
            .as_ref()
            .as_ref()
            .map_or("", |s| &s.hash)
            .to_string();
        if let Some(pass) = st
            .passes
            .iter_mut()
            .find(|p| p.schedule == sched_hash && p.force == force && p.pending.contains(role))
        {
            return pass.id.clone();
        }
        // A new pass: roles still pending in older passes move to it.
        let mut roles = BTreeSet::new();
        roles.insert(role.to_string());
        let data_roles = schedule
            .as_ref()
            .as_ref()
            .map(|s| vars::node_roles(s.data.skeleton(), &self.host))
            .unwrap_or_default();
        for other in data_roles {
            if other == role {
                continue;
            }
            if let Ok(d) = self.desired_cached(st, schedule, templates, &other)
                && Self::needs_work(st, &other, &d, force)
            {
                roles.insert(other);
            }
        }
        let id = st.next_pass_id.take().unwrap_or_else(deployment_id);
        for old in &mut st.passes {
            old.pending.retain(|r| !roles.contains(r));
        }
        let roles_list: Vec<String> = roles.iter().cloned().collect();
        let changes = if st.changes_logged.as_deref() == Some(sched_hash.as_str()) {
            Vec::new()
        } else {
            st.changes_logged = Some(sched_hash.clone());
            schedule_changes(schedule.as_ref().as_ref())
        };
        st.log_queue.push(LogEntry::Start {
            id: id.clone(),
            schedule: sched_hash.clone(),
            roles: roles_list.clone(),
            changes,
        });
        let pass = Pass {
            id: id.clone(),
            schedule: sched_hash,
            force,
            started: self.clock.now_ms(),
            roles: roles_list,
            pending: roles,
            failed: Vec::new(),
            blocked: Vec::new(),
        };
        self.publish_pass(&pass, None);
        st.passes.push(pass);
        self.close_finished(st);
        id
    }

    /// Marks `role`'s attempt in pass `id` done, with how it ended (queued for the log as it
    /// happens, with its time); ends passes with nothing pending.
    fn leave_pass(&self, st: &mut State, id: &str, role: &str, outcome: RoleOutcome) {
        if let Some(pass) = st.passes.iter_mut().find(|p| p.id == id)
            && pass.pending.remove(role)
        {
            match &outcome {
                RoleOutcome::Applied => {}
                RoleOutcome::Failed => pass.failed.push(role.to_string()),
                RoleOutcome::Blocked(reason) => {
                    pass.blocked.push((role.to_string(), reason.clone()))
                }
            }
            st.log_queue.push(LogEntry::Role {
                id: id.to_string(),
                role: role.to_string(),
                outcome,
                at: self.clock.now_ms(),
            });
        }
        self.close_finished(st);
    }

    fn close_finished(&self, st: &mut State) {
        let now = self.clock.now_ms();
        let mut i = 0;
        while i < st.passes.len() {
            if st.passes[i].pending.is_empty() {
                let mut pass = st.passes.remove(i);
                // In name order, as `roles`: the order roles ended in varies from run to run.
                pass.failed.sort();
                pass.blocked.sort();
                tracing::info!(
                    deployment = %pass.id,
                    schedule = %pass.schedule,
                    roles = pass.roles.len(),
                    failed = pass.failed.len(),
                    blocked = pass.blocked.len(),
                    "Deployment finished."
                );
                st.log_queue.push(LogEntry::Finish {
                    id: pass.id.clone(),
                    failed: pass.failed.clone(),
                    blocked: pass.blocked.clone(),
                });
                self.publish_pass(&pass, Some(now));
            } else {
                i += 1;
            }
        }
    }

    fn publish_pass(&self, pass: &Pass, finished: Option<u64>) {
        let deployment = Deployment {
            id: pass.id.clone(),
            schedule: pass.schedule.clone(),
            started: pass.started,
            finished,
            roles: pass.roles.clone(),
            failed: pass.failed.clone(),
            blocked: pass.blocked.iter().map(|(role, _)| role.clone()).collect(),
        };
        self.out.update(|s| {
            // An older pass finishing late does not hide a newer one.
            let newer = s
                .last_deployment
                .as_ref()
                .is_some_and(|d| d.started > deployment.started && d.id != deployment.id);
            if !newer {
                s.last_deployment = Some(deployment);
            }
        });
    }

    /// Records a failed attempt of `role`; `true` when that changed what its dependents see (it
    /// did not fail before, or failed with another message). Only then are they woken: a role
    /// that fails again as it failed before changes nothing for them, and waking them would let
    /// two failing roles (a cycle) wake each other past their backoff without end.
    fn record_failure(&self, role: &str, message: String, deployment_id: Option<String>) -> bool {
        let now = self.clock.now_ms();
        let changed = self
            .out
            .get()
            .failed
            .get(role)
            .is_none_or(|f| f.message != message);
        self.out.update(|s| {
            let entry = s.failed.entry(role.to_string()).or_insert(RoleFailure {
                message: String::new(),
                since: now,
                attempts: 0,
                deployment_id: None,
            });
            entry.message = message;
            entry.attempts += 1;
            entry.deployment_id = deployment_id;
        });
        changed
    }

    /// Forgets that `role` fails or waits; `true` when it did.
    fn clear_failure(&self, role: &str) -> bool {
        let status = self.out.get();
        if status.failed.contains_key(role) || status.blocked.contains_key(role) {
            self.out.update(|s| {
                s.failed.remove(role);
                s.blocked.remove(role);
            });
            return true;
        }
        false
    }

    /// Records why `role` does not apply now; `true` when that changed what its dependents see
    /// (it was not blocked in that state, or with that root cause, before).
    fn record_blocked(
        &self,
        role: &str,
        state: BlockedState,
        on: Vec<String>,
        root_cause: Vec<String>,
        reason: String,
        deployment_id: &str,
    ) -> bool {
        let now = self.clock.now_ms();
        let before = self.out.get().blocked.get(role).cloned();
        let entry = RoleBlocked {
            state,
            on,
            root_cause,
            reason,
            since: before
                .as_ref()
                .filter(|b| b.state == state)
                .map_or(now, |b| b.since),
            deployment_id: Some(deployment_id.to_string()),
        };
        if before.as_ref() == Some(&entry) {
            return false;
        }
        let changed_state = before.as_ref().map(|b| b.state) != Some(state);
        if changed_state {
            tracing::info!(role, state = ?state, on = ?entry.on, root_cause = ?entry.root_cause, reason = %entry.reason, "Role held back by its dependencies.");
        }
        // The roles that depend on it take their root cause from it. (Held-back roles form no
        // cycle: the roles of a cycle fail, they are not held back; so this ends.)
        let changed_root = before.as_ref().map(|b| &b.root_cause) != Some(&entry.root_cause);
        self.out.update(|s| {
            s.blocked.insert(role.to_string(), entry);
        });
        changed_state || changed_root
    }

    /// What the dependencies of `role` (which needs work) allow now.
    fn gate(
        &self,
        st: &mut State,
        schedule: &Arc<Option<Schedule>>,
        templates: &Arc<Templates>,
        deps: &Deps,
        role: &str,
        force: u64,
    ) -> Gate {
        let status = self.out.get();
        // A failing role itself retries (its backoff): that is how a halt ends.
        if self.policy == ErrorPolicy::Halt && !status.failed.contains_key(role) {
            let failing: Vec<String> = status
                .failed
                .keys()
                .filter(|r| r.as_str() != role)
                .cloned()
                .collect();
            if !failing.is_empty() {
                let reason = format!(
                    "the deployment halted: {} failed (render.dependency-failure: halt)",
                    failing.join(", ")
                );
                return Gate::Hold {
                    state: BlockedState::Blocked,
                    root_cause: failing.clone(),
                    on: failing,
                    reason,
                };
            }
        }
        let Some(id) = deps.graph.id(role) else {
            return Gate::Go;
        };
        let (mut waiting, mut blocked) = (Vec::new(), Vec::new());
        for &d in deps.graph.dependencies(id) {
            let name = deps.graph.name(d);
            let current = self
                .desired_cached(st, schedule, templates, name)
                .is_ok_and(|desired| !Self::needs_work(st, name, &desired, force));
            if current {
                continue;
            }
            let stuck = status.failed.contains_key(name)
                || deps.problems.contains_key(name)
                || status
                    .blocked
                    .get(name)
                    .is_some_and(|b| b.state == BlockedState::Blocked);
            if stuck {
                blocked.push(name.to_string());
            } else {
                waiting.push(name.to_string());
            }
        }
        // Where each chain ends: a failed role (or one whose dependencies cannot be followed) is
        // its own end; a held-back one has found its end already.
        let root_cause = |on: &[String]| -> Vec<String> {
            let mut roots = BTreeSet::new();
            for name in on {
                let held = status.blocked.get(name).map(|b| &b.root_cause);
                match held {
                    Some(roots_of)
                        if !status.failed.contains_key(name)
                            && !deps.problems.contains_key(name)
                            && !roots_of.is_empty() =>
                    {
                        roots.extend(roots_of.iter().cloned())
                    }
                    _ => {
                        roots.insert(name.clone());
                    }
                }
            }
            roots.into_iter().collect()
        };
        if !blocked.is_empty() {
            let reason = format!(
                "depends on {}, which failed or is blocked",
                blocked.join(", ")
            );
            Gate::Hold {
                state: BlockedState::Blocked,
                root_cause: root_cause(&blocked),
                on: blocked,
                reason,
            }
        } else if !waiting.is_empty() {
            let reason = format!("waits for {} to apply", waiting.join(", "));
            Gate::Hold {
                state: BlockedState::Waiting,
                root_cause: root_cause(&waiting),
                on: waiting,
                reason,
            }
        } else {
            Gate::Go
        }
    }

    /// Asks for a pass of the roles whose gate may have changed now that `role` applied, failed,
    /// cleared or got blocked: its dependents; with [`ErrorPolicy::Halt`], every held-back role
    /// and every role still pending in a pass.
    fn wake_after(&self, role: &str, deps: &Deps) {
        let Some(wake) = self.wake.get() else {
            return;
        };
        let mut roles: BTreeSet<String> = deps.dependents(role).into_iter().collect();
        if self.policy == ErrorPolicy::Halt {
            roles.extend(self.out.get().blocked.keys().cloned());
            let st = self.state.lock().unwrap();
            for pass in &st.passes {
                roles.extend(pass.pending.iter().cloned());
            }
        }
        roles.remove(role);
        for role in roles {
            let _ = wake.send(role);
        }
    }

    /// Writes the queued log entries, then publishes whether the log can be written. Called
    /// without the state lock.
    fn flush_log(&self) {
        let _writer = self.log_writer.lock().unwrap();
        let entries = std::mem::take(&mut self.state.lock().unwrap().log_queue);
        for entry in entries {
            match entry {
                LogEntry::Start {
                    id,
                    schedule,
                    roles,
                    changes,
                } => self.log.deployment_start(&id, &schedule, &roles, &changes),
                LogEntry::Finish {
                    id,
                    failed,
                    blocked,
                } => self.log.deployment_finish(&id, &failed, &blocked),
                LogEntry::Role {
                    id,
                    role,
                    outcome,
                    at,
                } => self.log.role_finished(&id, &role, &outcome, at),
            }
        }
        let problem = self.log.problem();
        if self.out.get().deployment_log != problem {
            self.out.update(|s| s.deployment_log = problem);
        }
    }

    async fn pass(self: Arc<Self>, role: String) -> Result<Requeue, RenderError> {
        let result = self.clone().attempt(role).await;
        self.flush_log();
        result
    }

    async fn attempt(self: Arc<Self>, role: String) -> Result<Requeue, RenderError> {
        let real = self.store.schedule.peek();
        // Roles of a schedule whose roles are not known (yet) wait for `derive_roles`.
        let Some(Ok(schedule)) = self.view_now(&real) else {
            return Ok(Requeue::None);
        };
        let templates = self.store.templates.peek();
        let force = *self.store.force_render.peek();
        if schedule.is_none() {
            return Ok(Requeue::None);
        }
        let Ready {
            desired,
            id,
            deps,
            refs_doc,
        } = match self.ready(&schedule, &templates, &role, force) {
            Ok(ready) => ready,
            Err(done) => return done,
        };
        if self.out.get().blocked.contains_key(&role) {
            self.out.update(|s| {
                s.blocked.remove(&role);
            });
        }
        // `DeploymentStart` goes into the log before the role's own entries.
        self.flush_log();
        let now = self.clock.now_ms();
        // Checked by `desired` already; the schedule snapshot is the same.
        let (merged, unparsed) = match (refs_doc, schedule.as_ref()) {
            (Some(doc), Some(s)) => (self.resolved_vars(s.data.tree(), &role, doc)?, Vec::new()),
            (_, Some(s)) => self.role_vars(&s.data, &role)?,
            (_, None) => return Ok(Requeue::None),
        };
        let mentions_full_schedule = templates
            .dir(&desired.template)
            .any(|(_, f)| f.mentions_full_schedule);
        let full = vars::with_pass(
            merged,
            &id,
            &crate::machinery::clock::rfc3339(now),
            // The whole tree is parsed only for templates that read it (a follower keeps the
            // schedule as text otherwise, see `ScheduleData`).
            mentions_full_schedule.then(|| {
                real.as_ref()
                    .as_ref()
                    .map_or(&Value::Null, |s| s.data.tree().as_ref())
            }),
        );
        let job = RoleJob {
            role: role.clone(),
            template: desired.template.clone(),
            deployment_id: id.clone(),
            vars: Arc::new(full),
            unparsed,
        };
        let result = match self.applier.apply(job).await {
            Ok(()) => self
                .applied_store
                .save(&role, &desired.hash)
                .map_err(RenderError::Store),
            Err(e) => Err(RenderError::Apply(e)),
        };
        self.settle(&role, &desired, id, &deps, force, result)
    }

    /// Whether `role` goes ahead to apply now: what it applies and in which pass; else the
    /// attempt's result (its desired state or dependencies fail, it needs no work, or it is
    /// held), recorded already.
    fn ready(
        &self,
        schedule: &Arc<Option<Schedule>>,
        templates: &Arc<Templates>,
        role: &str,
        force: u64,
    ) -> Result<Ready, Result<Requeue, RenderError>> {
        let mut st = self.state.lock().unwrap();
        let deps = self.deps_cached(&mut st, schedule);
        let desired = match self.desired_cached(&mut st, schedule, templates, role) {
            Ok(d) => d,
            Err(e) => {
                drop(st);
                if self.record_failure(role, e.to_string(), None) {
                    self.wake_after(role, &deps);
                }
                return Err(Err(e));
            }
        };
        if let Some(problem) = deps.problems.get(role) {
            let e = RenderError::Dependencies(problem.clone());
            // Another role's pass took it in (it needs work): it leaves that pass failed,
            // or the pass would never end.
            let pending = st
                .passes
                .iter()
                .find(|p| p.pending.contains(role))
                .map(|p| p.id.clone());
            if let Some(id) = pending {
                self.leave_pass(&mut st, &id, role, RoleOutcome::Failed);
            }
            drop(st);
            if self.record_failure(role, e.to_string(), None) {
                self.wake_after(role, &deps);
            }
            return Err(Err(e));
        }
        if !Self::needs_work(&st, role, &desired, force) {
            // Still pending in a pass that already has what it wants of the role: a newer pass
            // took the role over from the one its attempt ran in, and that attempt applied it.
            // It leaves that pass applied, or the pass would never end.
            let holding: Vec<String> = st
                .passes
                .iter()
                .filter(|p| p.pending.contains(role))
                .map(|p| p.id.clone())
                .collect();
            for id in holding {
                self.leave_pass(&mut st, &id, role, RoleOutcome::Applied);
            }
            drop(st);
            if self.clear_failure(role) {
                self.wake_after(role, &deps);
            }
            return Err(Ok(Requeue::None));
        }
        let id = self.join_pass(&mut st, schedule, templates, role, force);
        if let Gate::Hold {
            state,
            on,
            root_cause,
            reason,
        } = self.gate(&mut st, schedule, templates, &deps, role, force)
        {
            if state == BlockedState::Blocked {
                self.leave_pass(&mut st, &id, role, RoleOutcome::Blocked(reason.clone()));
            }
            drop(st);
            if self.record_blocked(role, state, on, root_cause, reason, &id) {
                self.wake_after(role, &deps);
            }
            return Err(Ok(Requeue::None));
        }
        let refs_doc = desired
            .has_refs
            .then(|| self.refs_doc(&mut st.refs_doc, schedule));
        Ok(Ready {
            desired,
            id,
            deps,
            refs_doc,
        })
    }

    /// After `role`'s apply in pass `id`: it leaves the pass, and is recorded as applied or
    /// failed.
    fn settle(
        &self,
        role: &str,
        desired: &Desired,
        id: String,
        deps: &Deps,
        force: u64,
        result: Result<(), RenderError>,
    ) -> Result<Requeue, RenderError> {
        let mut st = self.state.lock().unwrap();
        let outcome = if result.is_ok() {
            RoleOutcome::Applied
        } else {
            RoleOutcome::Failed
        };
        self.leave_pass(&mut st, &id, role, outcome);
        match result {
            Ok(()) => {
                st.applied.insert(
                    role.to_owned(),
                    Applied {
                        hash: desired.hash.clone(),
                        forced: force,
                    },
                );
                // A pass that took the role over while this attempt ran still waits for it:
                // once more at once, which either leaves it (nothing more to do) or tries again.
                let again = st.passes.iter().any(|p| p.pending.contains(role));
                drop(st);
                self.clear_failure(role);
                self.wake_after(role, deps);
                Ok(again.then_some(std::time::Duration::ZERO))
            }
            Err(e) => {
                drop(st);
                if self.record_failure(role, e.to_string(), Some(id)) {
                    self.wake_after(role, deps);
                }
                Err(e)
            }
        }
    }
}

/// What a role's attempt applies once it may go ahead ([`RenderController::ready`]).
struct Ready {
    desired: Arc<Desired>,
    /// The pass (deployment id) the role is in.
    id: String,
    deps: Arc<Deps>,
    /// The schedule with its `$(...)` references resolved, when the role's vars have some.
    refs_doc: Option<Arc<Value>>,
}

impl Reconciler for RenderController {
    type Key = String;
    type Error = RenderError;

    fn name(&self) -> &'static str {
        "render"
    }

    fn keys(&self) -> Vec<String> {
        let real = self.store.schedule.peek();
        match self.view_now(&real) {
            Some(Ok(view)) => match view.as_ref() {
                Some(s) => vars::node_roles(s.data.skeleton(), &self.host),
                None => Vec::new(),
            },
            // The source is asked (again, after a failure: the driver's backoff).
            _ => vec![self.roles.name().to_string()],
        }
    }

    async fn reconcile(self: Arc<Self>, role: String) -> Result<Requeue, RenderError> {
        if role == self.roles.name() {
            return self.derive_roles().await;
        }
        self.pass(role).await
    }

    fn error_reason(&self, error: &RenderError) -> &'static str {
        error.reason()
    }
}

/// The strings of the schedule's `changes` list (other items are shown as JSON).
fn schedule_changes(schedule: Option<&Schedule>) -> Vec<String> {
    match schedule.and_then(|s| s.data.skeleton().get("changes")) {
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
