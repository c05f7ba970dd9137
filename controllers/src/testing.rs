//! Fakes of the ports and fixtures, for tests here and in the daemon crate.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::machinery::clock::Clock;
use crate::machinery::ports::{
    ActionJournal, AppliedStore, ApplyError, DeploymentLog, JournalError, RoleApplier, RoleJob,
    RoleOutcome, SavedJournal, ScheduleStore, Scheduler, SchedulerError, StorageError,
};
use crate::schedule::ScheduleObserver;
use crate::state::SchedulerFailure;
use crate::state::{Inputs, Schedule, SchedulerInput, SchedulerOutput};

/// A scheduler that returns queued results (or echoes `runtime` as the schedule) and records
/// every input it got.
#[derive(Default)]
pub struct FakeScheduler {
    pub inputs: Mutex<Vec<Arc<SchedulerInput>>>,
    pub(crate) results: Mutex<VecDeque<Result<Value, SchedulerError>>>,
}

impl FakeScheduler {
    pub fn runs(&self) -> usize {
        self.inputs.lock().unwrap().len()
    }

    /// The next run fails with this message.
    pub fn fail_next(&self, message: &str) {
        self.results.lock().unwrap().push_back(Err(SchedulerError {
            kind: SchedulerFailure::Runtime,
            message: message.into(),
            log: String::new(),
        }));
    }
}

impl Scheduler for FakeScheduler {
    fn run(
        &self,
        _code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        self.inputs.lock().unwrap().push(input.clone());
        let queued = self.results.lock().unwrap().pop_front();
        let result = match queued {
            Some(result) => result,
            None => Ok(json!({"echo": *input.runtime})),
        };
        Box::pin(async move {
            result.map(|data| SchedulerOutput {
                data: crate::state::ScheduleData::from_value(data),
                log: "fake log".into(),
            })
        })
    }
}

/// Records saved schedules; while `fail` holds an error, every save fails with it and is
/// counted in `failed`.
#[derive(Default)]
pub struct MemoryScheduleStore {
    pub(crate) saved: Mutex<Vec<Schedule>>,
    pub fail: Mutex<Option<StorageError>>,
    pub failed: AtomicU64,
}

/// The error of a schedule write to a full disk: `schedule.json: No space left on device`.
pub fn disk_full() -> StorageError {
    StorageError {
        path: "schedule.json".into(),
        kind: std::io::ErrorKind::StorageFull,
        message: "No space left on device".into(),
    }
}

impl MemoryScheduleStore {
    /// The hashes of the schedules saved, in order.
    pub fn hashes(&self) -> Vec<String> {
        let saved = self.saved.lock().unwrap();
        saved.iter().map(|s| s.hash.clone()).collect()
    }
}

impl ScheduleStore for MemoryScheduleStore {
    fn save(&self, schedule: &Schedule) -> Result<(), StorageError> {
        if let Some(error) = self.fail.lock().unwrap().clone() {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(error);
        }
        self.saved.lock().unwrap().push(schedule.clone());
        Ok(())
    }
}

/// A settable wall clock.
#[derive(Debug, Default)]
pub struct FakeClock(pub AtomicU64);

impl FakeClock {
    pub fn at(ms: u64) -> Arc<FakeClock> {
        Arc::new(FakeClock(AtomicU64::new(ms)))
    }
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Counts scheduler outcomes.
#[derive(Debug, Default)]
pub struct CountingObserver {
    pub runs: AtomicU64,
    pub(crate) failures: AtomicU64,
}

impl ScheduleObserver for CountingObserver {
    fn run(&self, failure: Option<SchedulerFailure>, _duration: Duration) {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if failure.is_some() {
            self.failures.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Builder for test schedules: `Schedule::test().with_role("web", "v2").build()`.
#[derive(Debug, Clone)]
pub struct ScheduleBuilder {
    data: Value,
    timestamp: u64,
    origin: String,
}

impl Schedule {
    pub fn test() -> ScheduleBuilder {
        ScheduleBuilder {
            data: json!({"roles": {}, "nodes": {}, "vars": {}}),
            timestamp: 1_500_000_000_000,
            origin: "0123456789abcdef0123456789abcdef".into(),
        }
    }
}

impl ScheduleBuilder {
    pub fn with_role(mut self, role: &str, version: &str) -> Self {
        self.data["roles"][role] = json!({"version": version});
        self
    }
    pub fn with_node_role(mut self, node: &str, role: &str, vars: Value) -> Self {
        self.data["nodes"][node]["roles"][role] = vars;
        self
    }
    pub fn at(mut self, timestamp: u64) -> Self {
        self.timestamp = timestamp;
        self
    }
    pub fn build(self) -> Schedule {
        Schedule::new(self.data, self.timestamp, self.origin)
    }
}

/// Inputs with a runtime tree and hashes derived from it.
pub fn inputs(runtime: Value) -> Inputs {
    let hash = crate::schedule::hash::schedule_hash(&runtime);
    Inputs {
        runtime: Arc::new(runtime),
        scheduler_hash: "code-1".into(),
        hash,
        errors: Vec::new(),
        metrics: None,
    }
}

/// A role applier that records every job and fails the roles told to.
#[derive(Default)]
pub struct FakeApplier {
    pub(crate) jobs: Mutex<Vec<RoleJob>>,
    /// Role -> error message for its next attempts.
    pub(crate) failing: Mutex<std::collections::HashMap<String, String>>,
    /// Role -> a gate its next attempts wait at ([`FakeApplier::gate`]).
    pub(crate) gates: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Notify>>>,
}

impl FakeApplier {
    /// The roles applied so far, in order.
    pub fn roles(&self) -> Vec<String> {
        self.jobs
            .lock()
            .unwrap()
            .iter()
            .map(|j| j.role.clone())
            .collect()
    }
    pub fn fail(&self, role: &str, message: &str) {
        self.failing
            .lock()
            .unwrap()
            .insert(role.into(), message.into());
    }
    pub fn heal(&self, role: &str) {
        self.failing.lock().unwrap().remove(role);
    }
    /// Makes `role`'s attempts wait (recorded, not finished) until the gate returned is
    /// notified, once per attempt.
    pub fn gate(&self, role: &str) -> Arc<tokio::sync::Notify> {
        self.gates
            .lock()
            .unwrap()
            .entry(role.into())
            .or_default()
            .clone()
    }
}

impl RoleApplier for FakeApplier {
    fn apply(&self, job: RoleJob) -> BoxFuture<'static, Result<(), ApplyError>> {
        let failure = self.failing.lock().unwrap().get(&job.role).cloned();
        let gate = self.gates.lock().unwrap().get(&job.role).cloned();
        self.jobs.lock().unwrap().push(job);
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.notified().await;
            }
            failure.map_or(Ok(()), |m| Err(ApplyError::Command(m)))
        })
    }
}

/// Applied hashes in memory.
#[derive(Default)]
pub struct MemoryAppliedStore(pub Mutex<std::collections::HashMap<String, String>>);

impl AppliedStore for MemoryAppliedStore {
    fn load(&self) -> std::collections::HashMap<String, String> {
        self.0.lock().unwrap().clone()
    }
    fn save(&self, role: &str, hash: &str) -> Result<(), StorageError> {
        self.0.lock().unwrap().insert(role.into(), hash.into());
        Ok(())
    }
    fn remove(&self, role: &str) -> Result<(), StorageError> {
        self.0.lock().unwrap().remove(role);
        Ok(())
    }
}

/// A role held back in a deployment, and why.
pub(crate) type BlockedRole = (String, String);

/// A deployment log that records starts `(id, roles)` and finishes `(id, failed)`.
#[derive(Default)]
pub struct RecordingDeploymentLog {
    pub started: Mutex<Vec<(String, Vec<String>)>>,
    pub changes: Mutex<Vec<String>>,
    pub finished: Mutex<Vec<(String, Vec<String>)>>,
    /// The blocked roles of each finished deployment, with why.
    pub blocked: Mutex<Vec<(String, Vec<BlockedRole>)>>,
    /// What [`DeploymentLog::problem`] answers.
    pub(crate) problem: Mutex<Option<String>>,
    /// Every entry in the order given: `start <id>`, `<outcome> <role> <id> at <ms>`,
    /// `finish <id>`.
    pub(crate) entries: Mutex<Vec<String>>,
}

impl DeploymentLog for RecordingDeploymentLog {
    fn deployment_start(
        &self,
        id: &str,
        _schedule_hash: &str,
        roles: &[String],
        changes: &[String],
    ) {
        self.started
            .lock()
            .unwrap()
            .push((id.into(), roles.to_vec()));
        self.changes.lock().unwrap().extend(changes.iter().cloned());
        self.entries.lock().unwrap().push(format!("start {id}"));
    }
    fn deployment_finish(&self, id: &str, failed: &[String], blocked: &[(String, String)]) {
        self.finished
            .lock()
            .unwrap()
            .push((id.into(), failed.to_vec()));
        self.blocked
            .lock()
            .unwrap()
            .push((id.into(), blocked.to_vec()));
        self.entries.lock().unwrap().push(format!("finish {id}"));
    }
    fn role_finished(&self, id: &str, role: &str, outcome: &RoleOutcome, at: u64) {
        self.entries
            .lock()
            .unwrap()
            .push(format!("{} {role} {id} at {at}", outcome.name()));
    }
    fn problem(&self) -> Option<String> {
        self.problem.lock().unwrap().clone()
    }
}

/// Templates with the given files (path -> content hash).
pub fn templates(files: &[(&str, &str)]) -> crate::state::Templates {
    crate::state::Templates {
        files: Arc::new(
            files
                .iter()
                .map(|(path, hash)| {
                    (
                        path.to_string(),
                        crate::state::TemplateFile {
                            hash: hash.to_string(),
                            mentions_full_schedule: false,
                        },
                    )
                })
                .collect(),
        ),
    }
}

/// One call the action queue made to a [`MemoryJournal`], failed or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalCall {
    Append(Vec<u8>),
    Rewrite(Vec<u8>),
    RemoveLegacy,
}

/// An action journal in memory: the file's bytes, the older versions' file, every call, and
/// failures to switch on (a full disk, an unreadable file).
#[derive(Debug, Default)]
pub struct MemoryJournal {
    /// The journal file; `None` while there is none.
    pub(crate) file: Mutex<Option<Vec<u8>>>,
    /// The older versions' `actions.json`.
    pub legacy: Mutex<Option<Vec<u8>>>,
    pub calls: Mutex<Vec<JournalCall>>,
    /// `load` fails (the file exists but cannot be read).
    pub(crate) unreadable: std::sync::atomic::AtomicBool,
    /// Appends fail after half of their bytes landed (what a failed sync may leave).
    pub(crate) fail_appends: std::sync::atomic::AtomicBool,
    /// Rewrites fail and leave the file as it was.
    pub(crate) fail_rewrites: std::sync::atomic::AtomicBool,
    /// While set, an append lands at once but is acknowledged only for a permit of this.
    pub(crate) gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
}

impl MemoryJournal {
    /// A journal holding `bytes`.
    pub fn holding(bytes: &[u8]) -> Arc<MemoryJournal> {
        let journal = MemoryJournal::default();
        *journal.file.lock().unwrap() = Some(bytes.to_vec());
        Arc::new(journal)
    }

    /// The journal's text.
    pub fn text(&self) -> String {
        String::from_utf8(self.file.lock().unwrap().clone().unwrap_or_default()).unwrap()
    }

    pub fn calls(&self) -> Vec<JournalCall> {
        self.calls.lock().unwrap().clone()
    }

    /// From now on each append waits for a permit of the returned gate before it is
    /// acknowledged (a slow sync).
    pub fn hold_appends(&self) -> Arc<tokio::sync::Semaphore> {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *self.gate.lock().unwrap() = Some(gate.clone());
        gate
    }

    fn error(what: &str) -> JournalError {
        JournalError::Write {
            path: "memory/actions.journal".into(),
            source: Arc::new(std::io::Error::other(what.to_string())),
        }
    }
}

impl ActionJournal for MemoryJournal {
    fn load(&self) -> Result<SavedJournal, JournalError> {
        if self.unreadable.load(Ordering::SeqCst) {
            return Err(JournalError::Read {
                path: "memory/actions.journal".into(),
                source: Arc::new(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
            });
        }
        Ok(SavedJournal {
            journal: self.file.lock().unwrap().clone(),
            legacy: self.legacy.lock().unwrap().clone().map(Ok),
        })
    }

    fn append(&self, records: Vec<u8>) -> BoxFuture<'static, Result<(), JournalError>> {
        self.calls
            .lock()
            .unwrap()
            .push(JournalCall::Append(records.clone()));
        let mut file = self.file.lock().unwrap();
        let file = file.get_or_insert_with(Vec::new);
        let result = if self.fail_appends.load(Ordering::SeqCst) {
            file.extend_from_slice(&records[..records.len() / 2]);
            Err(MemoryJournal::error("No space left on device"))
        } else {
            file.extend_from_slice(&records);
            Ok(())
        };
        let gate = self.gate.lock().unwrap().clone();
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.acquire().await.expect("the gate stays open").forget();
            }
            result
        })
    }

    fn rewrite(&self, records: Vec<u8>) -> BoxFuture<'static, Result<(), JournalError>> {
        self.calls
            .lock()
            .unwrap()
            .push(JournalCall::Rewrite(records.clone()));
        let result = if self.fail_rewrites.load(Ordering::SeqCst) {
            Err(MemoryJournal::error("Read-only file system"))
        } else {
            *self.file.lock().unwrap() = Some(records);
            Ok(())
        };
        Box::pin(std::future::ready(result))
    }

    fn remove_legacy(&self) -> BoxFuture<'static, Result<(), JournalError>> {
        self.calls.lock().unwrap().push(JournalCall::RemoveLegacy);
        *self.legacy.lock().unwrap() = None;
        Box::pin(std::future::ready(Ok(())))
    }
}

/// What a node running a [`crate::cluster::replication::Replication`] machine holds and hears, kept the
/// way the daemon keeps it (the election transport notes packets, `src/cluster/replication.rs` carries
/// out the actions): the world of the replication tests and of the election simulation.
#[derive(Debug, Default)]
pub struct ReplicaWorld {
    pub held: Option<Schedule>,
    pub replaced: Vec<Schedule>,
    pub prefetched: crate::state::Prefetched,
    pub reports: crate::state::Reports,
    pub sightings: crate::cluster::replication::Sightings,
    pub packets: std::collections::BTreeMap<crate::state::NodeId, u64>,
    /// The nodes known (the relay tree's members); empty: every follower asks its leader.
    pub nodes: Vec<crate::state::NodeId>,
}

impl ReplicaWorld {
    /// An election packet from `peer` in `epoch`, holding `stamp`, arrives at node `me` at
    /// `now_ms`: the peer was heard, its report replaced, and a schedule another node made is
    /// a sighting.
    pub fn note_packet(
        &mut self,
        me: &str,
        peer: &crate::state::NodeId,
        epoch: u64,
        stamp: Option<crate::state::ScheduleStamp>,
        now_ms: u64,
    ) {
        self.packets.insert(peer.clone(), now_ms);
        if let Some(stamp) = &stamp
            && stamp.origin != me
        {
            self.sightings.saw(peer, stamp, now_ms);
        }
        let report = crate::state::Report {
            schedule: stamp,
            errors: 0,
            epoch,
        };
        self.reports.insert(peer.clone(), report);
    }

    /// The snapshot the machine looks at.
    pub fn view<'a>(
        &'a self,
        election: &'a crate::cluster::election::ElectionState,
        now_ms: u64,
    ) -> crate::cluster::replication::World<'a> {
        crate::cluster::replication::World {
            election,
            reports: &self.reports,
            held: self.held.as_ref(),
            sightings: &self.sightings,
            packets: &self.packets,
            now_ms,
            nodes: &self.nodes,
        }
    }

    /// Carries out the store writes `action` asks for (a fetch is the caller's).
    pub fn keep(&mut self, action: &crate::cluster::replication::Effect) {
        use crate::cluster::replication::Effect;
        match action {
            Effect::Accept(schedule) => self.held = Some(schedule.clone()),
            Effect::Replaced(list) => self.replaced = list.clone(),
            Effect::Gathered { parents, .. }
            | Effect::AddedParent { parents, .. }
            | Effect::Awaiting { parents } => self.prefetched = parents.clone(),
            Effect::Fetch(_) | Effect::Failed { .. } => {}
        }
    }
}

/// The keys of `/v1/status`, in verwalter 0.13's order (the frontend and scripts read them).
pub const STATUS_KEYS: &[&str] = &[
    "version",
    "id",
    "name",
    "hostname",
    "peers",
    "peers_timestamp",
    "leader",
    "roles",
    "last_stable_timestamp",
    "num_errors",
    "errors",
    "failed_roles",
    "blocked_roles",
    "debug_force_leader",
    "metrics",
    "fetch_state",
    "election_state",
    "schedule_id",
    "schedule_status",
    "default_frontend",
    "failing_nodes",
    "last_deployment",
];

/// A dependency graph for tests and benchmarks: `n` vertices `v0..`, each with `per` edges from
/// random earlier vertices (deterministic, so acyclic).
pub fn layered_graph(n: usize, per: usize) -> (Vec<String>, Vec<(String, String)>) {
    let names: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
    let mut edges = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 1..n {
        for _ in 0..per.min(i) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let j = (x % i as u64) as usize;
            edges.push((names[j].clone(), names[i].clone()));
        }
    }
    (names, edges)
}
