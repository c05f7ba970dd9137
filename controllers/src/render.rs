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
//! The deployment log is written outside the state lock, and never decides anything: a log that
//! cannot be written is reported in `roles.deployment_log`, and roles go on.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use rand::Rng;
use serde_json::Value;
use sha1::{Digest, Sha1};

use crate::driver::{Driver, DriverConfig, Reconciler, Requeue};
use crate::ports::{
    AppliedStore, ApplyError, Clock, DeploymentLog, RoleApplier, RoleJob, StorageError,
};
use crate::state::{Deployment, RoleFailure, RolesStatus, Schedule, Templates};
use crate::store::{Field, Store};
use crate::vars;

/// Length of a deployment id (as in verwalter 0.13).
pub const DEPLOYMENT_ID_LEN: usize = 24;

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
}

impl RenderError {
    pub fn reason(&self) -> &'static str {
        match self {
            RenderError::Vars(_) => "vars",
            RenderError::Templates(_) => "templates",
            RenderError::Apply(_) => "apply",
            RenderError::Store(_) => "store",
        }
    }
}

/// What a role should look like now.
#[derive(Debug, Clone)]
struct Desired {
    hash: String,
    template: String,
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
}

/// A role's desired state and the (schedule, templates) snapshots it was computed for. The
/// snapshots are held, not just their addresses: a freed snapshot's address can be reused by a
/// new one with other content, which must not be taken for the old.
type Cached = (
    Arc<Option<Schedule>>,
    Arc<Templates>,
    Result<Arc<Desired>, RenderError>,
);

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
        }
    }

    /// A driver that wakes on a new schedule, changed templates and `force_render_all`.
    pub fn driver(self: Arc<Self>, config: DriverConfig) -> Driver<RenderController> {
        let store = self.store.clone();
        Driver::new(self, config)
            .trigger(store.schedule.trigger())
            .trigger(store.templates.trigger())
            .trigger(store.force_render.trigger())
    }

    /// Drops what is kept about roles not in `keep`: failures, applied hashes (memory and
    /// storage), cached desired state. The cleanup controller calls it.
    pub fn retain_roles(&self, keep: &BTreeSet<String>) -> Vec<String> {
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
        self.out
            .update(|s| s.failed.retain(|role, _| keep.contains(role)));
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
    ) -> Result<Desired, RenderError> {
        let vars_error = |e: vars::VarsError| RenderError::Vars(e.to_string());
        let sources = vars::sources(&schedule.data, &self.host, role).map_err(vars_error)?;
        let template = vars::role_template(role, &sources).map_err(vars_error)?;
        let mut hasher = Sha1::new();
        hasher.update(shared);
        let mut bytes = Vec::with_capacity(256);
        for source in [sources[1], sources[3]] {
            bytes.clear();
            vars::write_hashed_source(source, &mut bytes);
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
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
        Ok(Desired {
            hash: hex::encode(hasher.finalize()),
            template,
        })
    }

    /// Digest of `vars` and `nodes[host].vars` of `schedule` (see [`State::shared`]).
    fn shared_digest(&self, schedule: &Schedule) -> [u8; 20] {
        let mut hasher = Sha1::new();
        let mut bytes = Vec::new();
        let data = &schedule.data;
        let node_vars = data
            .get("nodes")
            .and_then(|n| n.get(&self.host))
            .and_then(|n| n.get("vars"));
        for source in [data.get("vars"), node_vars] {
            bytes.clear();
            vars::write_hashed_source(source.and_then(Value::as_object), &mut bytes);
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
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
        let result = self.desired(&shared, sched, templates, role).map(Arc::new);
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
            .map(|s| vars::node_roles(&s.data, &self.host))
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
        let id = deployment_id();
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
        };
        self.publish_pass(&pass, None);
        st.passes.push(pass);
        self.close_finished(st);
        id
    }

    /// Marks `role`'s attempt in pass `id` done; ends passes with nothing pending.
    fn leave_pass(&self, st: &mut State, id: &str, role: &str, failed: bool) {
        if let Some(pass) = st.passes.iter_mut().find(|p| p.id == id) {
            pass.pending.remove(role);
            if failed {
                pass.failed.push(role.to_string());
            }
        }
        self.close_finished(st);
    }

    fn close_finished(&self, st: &mut State) {
        let now = self.clock.now_ms();
        let mut i = 0;
        while i < st.passes.len() {
            if st.passes[i].pending.is_empty() {
                let pass = st.passes.remove(i);
                tracing::info!(
                    deployment = %pass.id,
                    schedule = %pass.schedule,
                    roles = pass.roles.len(),
                    failed = pass.failed.len(),
                    "Deployment finished."
                );
                st.log_queue.push(LogEntry::Finish {
                    id: pass.id.clone(),
                    failed: pass.failed.clone(),
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

    fn record_failure(&self, role: &str, message: String, deployment_id: Option<String>) {
        let now = self.clock.now_ms();
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
    }

    fn clear_failure(&self, role: &str) {
        if self.out.get().failed.contains_key(role) {
            self.out.update(|s| {
                s.failed.remove(role);
            });
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
                LogEntry::Finish { id, failed } => self.log.deployment_finish(&id, &failed),
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
        let schedule = self.store.schedule.peek();
        let templates = self.store.templates.peek();
        let force = *self.store.force_render.peek();
        if schedule.is_none() {
            return Ok(Requeue::None);
        }
        let (desired, id) = {
            let mut st = self.state.lock().unwrap();
            let desired = match self.desired_cached(&mut st, &schedule, &templates, &role) {
                Ok(d) => d,
                Err(e) => {
                    drop(st);
                    self.record_failure(&role, e.to_string(), None);
                    return Err(e);
                }
            };
            if !Self::needs_work(&st, &role, &desired, force) {
                drop(st);
                self.clear_failure(&role);
                return Ok(Requeue::None);
            }
            let id = self.join_pass(&mut st, &schedule, &templates, &role, force);
            (desired, id)
        };
        // `DeploymentStart` goes into the log before the role's own entries.
        self.flush_log();
        let now = self.clock.now_ms();
        let data = schedule.as_ref().as_ref().map_or(&Value::Null, |s| &s.data);
        // Checked by `desired` already; the schedule snapshot is the same.
        let merged = vars::role_vars(data, &self.host, &role)
            .map_err(|e| RenderError::Vars(e.to_string()))?;
        let mentions_full_schedule = templates
            .dir(&desired.template)
            .any(|(_, f)| f.mentions_full_schedule);
        let full = vars::with_pass(
            merged,
            &id,
            &crate::wallclock::rfc3339(now),
            mentions_full_schedule.then_some(data),
        );
        let job = RoleJob {
            role: role.clone(),
            template: desired.template.clone(),
            deployment_id: id.clone(),
            vars: Arc::new(full),
        };
        let result = match self.applier.apply(job).await {
            Ok(()) => self
                .applied_store
                .save(&role, &desired.hash)
                .map_err(RenderError::Store),
            Err(e) => Err(RenderError::Apply(e)),
        };
        let mut st = self.state.lock().unwrap();
        self.leave_pass(&mut st, &id, &role, result.is_err());
        match result {
            Ok(()) => {
                st.applied.insert(
                    role.clone(),
                    Applied {
                        hash: desired.hash.clone(),
                        forced: force,
                    },
                );
                drop(st);
                self.clear_failure(&role);
                Ok(Requeue::None)
            }
            Err(e) => {
                drop(st);
                self.record_failure(&role, e.to_string(), Some(id));
                Err(e)
            }
        }
    }
}

impl Reconciler for RenderController {
    type Key = String;
    type Error = RenderError;

    fn name(&self) -> &'static str {
        "render"
    }

    fn keys(&self) -> Vec<String> {
        match self.store.schedule.peek().as_ref() {
            Some(s) => vars::node_roles(&s.data, &self.host),
            None => Vec::new(),
        }
    }

    async fn reconcile(self: Arc<Self>, role: String) -> Result<Requeue, RenderError> {
        self.pass(role).await
    }

    fn error_reason(&self, error: &RenderError) -> &'static str {
        error.reason()
    }
}

/// The strings of the schedule's `changes` list (other items are shown as JSON).
fn schedule_changes(schedule: Option<&Schedule>) -> Vec<String> {
    match schedule.and_then(|s| s.data.get("changes")) {
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
