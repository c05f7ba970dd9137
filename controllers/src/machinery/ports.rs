//! Traits for every side effect the controllers need; `src/` implements them, `testing` fakes them.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::state::{Schedule, SchedulerFailure, SchedulerInput, SchedulerOutput};

/// A failed scheduler run: the kind, a message with file and line where known, and the log the
/// script wrote before failing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct SchedulerError {
    pub kind: SchedulerFailure,
    pub message: String,
    pub log: String,
}

/// Runs the user's scheduler. Implementations run it off the async runtime.
pub trait Scheduler: Send + Sync + 'static {
    /// Runs the scheduler once. `code_version` is the content hash of the scheduler sources: an
    /// implementation reloads its code when it differs from the loaded one.
    fn run(
        &self,
        code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>>;
}

/// A port could not write or remove what it keeps on disk (the storage dir).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct StorageError {
    /// The file or dir, as messages show it.
    pub path: String,
    /// The OS error's kind: a full disk (`StorageFull`), a read-only file system, a missing
    /// permission...
    pub kind: std::io::ErrorKind,
    /// What failed and the OS error (`cannot write: No space left on device`).
    pub message: String,
}

impl StorageError {
    /// `what` (`cannot write`) failed on `path` with `error`.
    pub fn io(path: &std::path::Path, what: &str, error: &std::io::Error) -> StorageError {
        StorageError {
            path: path.display().to_string(),
            kind: error.kind(),
            message: format!("{what}: {error}"),
        }
    }
}

/// Persists the schedule in force so a restarted node starts from it.
pub trait ScheduleStore: Send + Sync + 'static {
    /// Writes the envelope with `schedule.data`'s canonical text as it is.
    fn save(&self, schedule: &Schedule) -> Result<(), StorageError>;
}

/// One role to render and apply: what the render controller hands to the [`RoleApplier`].
#[derive(Debug, Clone)]
pub struct RoleJob {
    pub role: String,
    /// Template dir relative to `templates/` (already checked to be a plain relative path).
    pub template: String,
    pub deployment_id: String,
    /// Every variable the templates see, but those in `unparsed`.
    pub vars: Arc<serde_json::Map<String, serde_json::Value>>,
    /// Big values of the role's own variables kept as their text, in key order, none of them a
    /// key of `vars` (see [`crate::schedule::data::ScheduleData::skeleton`]): the applier parses
    /// those its templates may read, and the role log compares them as text.
    pub unparsed: Vec<(String, crate::schedule::data::TextPart)>,
}

/// Why a role could not be rendered and applied. Each message names the file, line or command
/// that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The template dir cannot be loaded: a template or `*.render.yaml` does not parse.
    #[error("{0}")]
    Templates(String),
    /// A template failed with the role's variables.
    #[error("{0}")]
    Render(String),
    /// A rendered file could not be staged in the storage dir.
    #[error("{0}")]
    Staging(StorageError),
    /// An apply command failed, or ran out of time.
    #[error("{0}")]
    Command(String),
}

impl ApplyError {
    /// The same error, its message prefixed with where it happened (`templates/web/nginx`).
    /// A staging error stays as it is: its path names the role's staging file.
    pub fn within(self, place: &str) -> ApplyError {
        let at = |message: String| format!("{place}: {message}");
        match self {
            ApplyError::Templates(m) => ApplyError::Templates(at(m)),
            ApplyError::Render(m) => ApplyError::Render(at(m)),
            ApplyError::Staging(e) => ApplyError::Staging(e),
            ApplyError::Command(m) => ApplyError::Command(at(m)),
        }
    }
}

/// Renders a role's templates and runs its commands (`src/render`, `src/render/apply`).
pub trait RoleApplier: Send + Sync + 'static {
    fn apply(&self, job: RoleJob) -> BoxFuture<'static, Result<(), ApplyError>>;
}

/// The applied hash of every role, kept across restarts (the storage dir).
pub trait AppliedStore: Send + Sync + 'static {
    fn load(&self) -> std::collections::HashMap<String, String>;
    fn save(&self, role: &str, hash: &str) -> Result<(), StorageError>;
    fn remove(&self, role: &str) -> Result<(), StorageError>;
}

/// How a role's attempt in a pass ended ([`DeploymentLog::role_finished`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleOutcome {
    Applied,
    Failed,
    /// Held back by its dependencies (or a halt), with why.
    Blocked(String),
}

impl RoleOutcome {
    /// `applied`, `failed` or `blocked`.
    pub fn name(&self) -> &'static str {
        match self {
            RoleOutcome::Applied => "applied",
            RoleOutcome::Failed => "failed",
            RoleOutcome::Blocked(_) => "blocked",
        }
    }
}

/// Deployment-level entries of the deployment log (role entries are the applier's).
pub trait DeploymentLog: Send + Sync + 'static {
    /// `changes`: the schedule's `changes` list (the toolbox's scheduler wrapper writes one),
    /// given on the first pass of each schedule, empty otherwise.
    fn deployment_start(&self, id: &str, schedule_hash: &str, roles: &[String], changes: &[String]);
    /// `blocked`: roles held back by their dependencies (or a halt), with why.
    fn deployment_finish(&self, id: &str, failed: &[String], blocked: &[(String, String)]);
    /// A role of pass `id` had its attempt: applied, failed or left the pass blocked, at `at`
    /// (ms since the epoch). Given as each role finishes, before the pass's
    /// [`Self::deployment_finish`]; a role that moved on to a newer pass before its attempt gets
    /// it in that pass. The log files need nothing more (each role's own log has its entries),
    /// so the default does nothing; the NATS tee publishes it (`role.applied`...).
    fn role_finished(&self, id: &str, role: &str, outcome: &RoleOutcome, at: u64) {
        let _ = (id, role, outcome, at);
    }
    /// Why the log cannot be written now (any stream, role logs too), or `None`. Writing never
    /// fails a deployment; this is how a broken log is reported.
    fn problem(&self) -> Option<String>;
}

/// Why the action journal could not be read or written (the I/O error is shared, so the one
/// failure of a batch reaches every request in it).
#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    /// The journal exists but cannot be read. Taking it for "no actions" would rewrite it empty
    /// and lose every pending action, so the daemon does not start.
    #[error("cannot read the action journal {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
}

/// What the action journal's storage held at start.
#[derive(Debug, Default)]
pub struct SavedJournal {
    /// The journal's bytes; `None` when there is no journal yet.
    pub journal: Option<Vec<u8>>,
    /// The pending actions of versions before the journal (`actions.json`) when that file
    /// exists: its bytes, or why it could not be read.
    pub legacy: Option<Result<Vec<u8>, JournalError>>,
}

/// The storage of the leader's pending actions (`src/actions/journal.rs`): a file of records
/// the [action queue](crate::actions) encodes and decides about; this only reads and writes
/// bytes. The queue never calls two writes at once.
pub trait ActionJournal: Send + Sync + 'static {
    /// Reads what an earlier run left.
    fn load(&self) -> Result<SavedJournal, JournalError>;
    /// Appends `records` and syncs them; resolves once they are on disk. On failure none of
    /// them may be taken as written (the file is cut back where that can be done).
    fn append(&self, records: Vec<u8>) -> BoxFuture<'static, Result<(), JournalError>>;
    /// Replaces the whole journal with `records`, atomically and synced. After a failure the
    /// next append must not land in a file this replace may have unlinked.
    fn rewrite(&self, records: Vec<u8>) -> BoxFuture<'static, Result<(), JournalError>>;
    /// Removes the older versions' file once its actions are in the journal.
    fn remove_legacy(&self) -> BoxFuture<'static, Result<(), JournalError>>;
}

/// NATS's default `max_payload` (1 MiB), for a server that did not announce one.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// A message bus could not take a message (the graph executor's NATS connection).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BusError(pub String);

/// Where the graph executor publishes (NATS in `src/ernest/`; a recorder in tests).
pub trait GraphBus: Send + Sync + 'static {
    /// Queues a message for the server; while disconnected it waits in the client.
    fn publish(
        &self,
        subject: String,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), BusError>>;
    /// Queues a build's result with the NATS header `Nats-Msg-Id: <msg_id>`, the same each time
    /// the result is published (a restart may publish it again), so a JetStream stream keeps one
    /// and a client can tell a repeat.
    fn publish_result(
        &self,
        subject: String,
        payload: Vec<u8>,
        msg_id: String,
    ) -> BoxFuture<'static, Result<(), BusError>>;
    /// Returns once everything queued before has reached the server.
    fn flush(&self) -> BoxFuture<'static, Result<(), BusError>>;
    /// The largest payload the server takes (NATS's `max_payload`, announced when it connects).
    fn max_payload(&self) -> usize {
        DEFAULT_MAX_PAYLOAD
    }
}

/// One stored build: its last snapshot and the journal records appended since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredBuild {
    pub snapshot: Vec<u8>,
    /// The records, one per line; the last may be cut short by a stop.
    pub journal: Vec<u8>,
}

/// The graph executor's builds on disk: per build a snapshot, replaced atomically, and a
/// journal of records appended since.
pub trait BuildStore: Send + Sync + 'static {
    /// Replaces build `id`'s snapshot with `bytes`, then empties its journal (both durable when
    /// this returns `Ok`).
    fn save(&self, id: String, bytes: Vec<u8>) -> BoxFuture<'static, Result<(), StorageError>>;
    /// Appends `record` (one line, with its `\n`) to build `id`'s journal: durable when this
    /// returns `Ok`. After an `Err` the journal may end in part of `record`: the caller writes
    /// a snapshot next, never another record.
    fn append(&self, id: String, record: Vec<u8>) -> BoxFuture<'static, Result<(), StorageError>>;
    /// Every stored build, with a problem per file that could not be read.
    fn load(&self) -> (Vec<StoredBuild>, Vec<StorageError>);
    /// Where build `id` can be read by people (its snapshot's path), for a result too large to
    /// publish whole.
    fn location(&self, _id: &str) -> Option<String> {
        None
    }
}

/// What a [`RoleSource`] is asked: the roles of node `host` for `schedule`.
#[derive(Debug, Clone)]
pub struct RolesRequest {
    pub schedule: Schedule,
    /// The schedule this node's roles were derived from before, if any.
    pub previous: Option<Schedule>,
    pub host: String,
    /// The id the first render pass of this schedule will carry.
    pub deployment_id: String,
}

/// The roles of a node with their variables, `{role: {variable: value}}`.
pub type NodeRoles = serde_json::Map<String, serde_json::Value>;

/// Why a [`RoleSource`] could not give a node's roles: the schedule is then not rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RolesError(pub String);

/// How a node's roles and their variables are derived from the schedule: the compat merge
/// ([`CompatRoles`], [`crate::render::vars`]) by default, or a hook such as `scheduler/v1/query.wasm`
/// (`src/schedule/wasm/query.rs`).
pub trait RoleSource: Send + Sync + 'static {
    /// Where the roles come from as status and metrics name it (`scheduler/v1/query.wasm`): it
    /// contains `/`, so it never names a role.
    fn name(&self) -> &str;
    /// What the roles depend on besides the schedule (the module file's size and time); when it
    /// changes they are derived again for the schedule in force (at the render driver's next
    /// scan). `None` for a source that depends on the schedule only.
    fn version(&self) -> Option<String> {
        None
    }
    /// `None`: the roles are the schedule's own, derived by the compat merge, with nothing to
    /// call. `Some`: resolves (off the async runtime; it does nothing until polled) to the
    /// node's roles with their variables, or why they cannot be had.
    fn roles(
        &self,
        request: RolesRequest,
    ) -> Option<BoxFuture<'static, Result<NodeRoles, RolesError>>>;
}

/// The default [`RoleSource`]: the roles of `nodes[host].roles`, their variables merged from
/// the schedule as [`crate::render::vars`] says.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CompatRoles;

impl RoleSource for CompatRoles {
    fn name(&self) -> &str {
        "schedule/compat"
    }

    fn roles(
        &self,
        _request: RolesRequest,
    ) -> Option<BoxFuture<'static, Result<NodeRoles, RolesError>>> {
        None
    }
}
