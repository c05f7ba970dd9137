//! Typed observed and desired state shared by the controllers and the HTTP API.
//!
//! `serde_json::Value` appears only where the data really is user-defined JSON: the runtime
//! tree, schedule `data` and action bodies.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use serde_json::value::RawValue;

pub use crate::schedule::data::ScheduleData;

/// A machine id: 32 lowercase hex characters (16 bytes on the wire).
pub type NodeId = String;

/// The schedule envelope, as stored on disk and served at `/v1/schedule` (verwalter 0.13 shape).
/// Deserializing keeps `data` as the text it came as when that text hashes to `hash` (see
/// [`ScheduleData`]); [`Schedule::verify`] checks the hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Envelope")]
pub struct Schedule {
    /// Wall-clock milliseconds when the leader produced it.
    pub timestamp: u64,
    /// [`crate::schedule::hash::schedule_hash`] of `data`.
    pub hash: String,
    /// The scheduler's output: a JSON object, as canonical text parsed on demand.
    pub data: ScheduleData,
    /// Machine id of the leader that produced it.
    pub origin: NodeId,
}

/// [`Schedule`] as it is read, `data` still raw.
#[derive(Deserialize)]
struct Envelope {
    timestamp: u64,
    hash: String,
    data: Box<RawValue>,
    origin: NodeId,
}

impl TryFrom<Envelope> for Schedule {
    type Error = serde_json::Error;

    fn try_from(envelope: Envelope) -> Result<Schedule, serde_json::Error> {
        Ok(Schedule {
            data: ScheduleData::from_raw(envelope.data, &envelope.hash)?,
            timestamp: envelope.timestamp,
            hash: envelope.hash,
            origin: envelope.origin,
        })
    }
}

/// Why an envelope from a peer was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("not a schedule: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Hash(#[from] HashMismatch),
}

/// The fields of an envelope in the form [`Schedule::write_json`] writes, `data` as a range of
/// the body.
struct Written {
    timestamp: u64,
    hash: String,
    data: std::ops::Range<usize>,
    origin: NodeId,
}

/// Splits `body` if it is an envelope as [`Schedule::write_json`] writes it (a trailing newline
/// allowed, as the storage dir has): `{"timestamp":N,"hash":"<40 hex>","data":…,"origin":"<id>"}`
/// with a plain id (no escapes). `None` for any other form.
fn split_written(body: &[u8]) -> Option<Written> {
    let rest = body.strip_prefix(b"{\"timestamp\":")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // JSON has no leading zeros (found by fuzzing: `"timestamp":00` was read here, refused by
    // serde_json).
    if digits > 1 && rest[0] == b'0' {
        return None;
    }
    let timestamp = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    let rest = rest[digits..].strip_prefix(b",\"hash\":\"")?;
    let hash = rest.get(..40)?;
    if !hash.iter().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    rest[40..].strip_prefix(b"\",\"data\":")?;
    let start = body.len() - rest.len() + 40 + b"\",\"data\":".len();
    // JSON's whitespace only (`trim_ascii_end` would also take a form feed, which serde_json
    // refuses; found by fuzzing).
    let mut end = body;
    while let [rest @ .., b' ' | b'\t' | b'\n' | b'\r'] = end {
        end = rest;
    }
    let end = end.strip_suffix(b"\"}")?;
    let marker = b",\"origin\":\"";
    let at = end.windows(marker.len()).rposition(|w| w == marker)?;
    let origin = &end[at + marker.len()..];
    if at < start
        || origin
            .iter()
            .any(|b| *b == b'"' || *b == b'\\' || *b < 0x20)
    {
        return None;
    }
    Some(Written {
        timestamp,
        hash: String::from_utf8(hash.to_vec()).ok()?,
        data: start..at,
        origin: String::from_utf8(origin.to_vec()).ok()?,
    })
}

/// What peers tell each other about a schedule (timestamp, hash, origin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleStamp {
    pub timestamp: u64,
    pub hash: String,
    pub origin: NodeId,
}

/// A schedule whose `hash` does not match its `data`.
#[derive(Debug, thiserror::Error)]
#[error("schedule hash mismatch: envelope says {claimed}, data hashes to {actual}")]
pub struct HashMismatch {
    pub(crate) claimed: String,
    pub(crate) actual: String,
}

impl Schedule {
    /// Wraps scheduler output into an envelope, computing its hash.
    pub fn new(data: Value, timestamp: u64, origin: NodeId) -> Schedule {
        let data = ScheduleData::from_value(data);
        Schedule {
            timestamp,
            hash: data.hash(),
            data,
            origin,
        }
    }

    /// [`Schedule::new`] of data already in its canonical form (a scheduler's output).
    pub fn from_data(data: ScheduleData, timestamp: u64, origin: NodeId) -> Schedule {
        Schedule {
            timestamp,
            hash: data.hash(),
            data,
            origin,
        }
    }

    /// Checks that `hash` matches `data` (schedules read from disk or from peers).
    pub fn verify(&self) -> Result<(), HashMismatch> {
        let actual = self.data.hash();
        if actual == self.hash {
            Ok(())
        } else {
            Err(HashMismatch {
                claimed: self.hash.clone(),
                actual,
            })
        }
    }

    /// The envelope as compact JSON, the data's canonical text as it is (no second
    /// serialisation of the data): what `/v1/schedule` serves and the storage dir keeps.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let (head, tail) = self.json_envelope();
        out.reserve(head.len() + self.data.len() + tail.len());
        out.extend_from_slice(&head);
        out.extend_from_slice(self.data.canonical().as_bytes());
        out.extend_from_slice(&tail);
    }

    /// What [`Schedule::write_json`] writes before and after the data.
    pub fn json_envelope(&self) -> (Vec<u8>, Vec<u8>) {
        let mut head = format!("{{\"timestamp\":{},\"hash\":", self.timestamp).into_bytes();
        serde_json::to_writer(&mut head, &self.hash).expect("a string serializes");
        head.extend_from_slice(b",\"data\":");
        let mut tail = b",\"origin\":".to_vec();
        serde_json::to_writer(&mut tail, &self.origin).expect("a string serializes");
        tail.push(b'}');
        (head, tail)
    }

    /// Reads and checks an envelope that node `host` received from a peer. One written by
    /// [`Schedule::write_json`] (this version's peers serve that) is read in one pass over its
    /// data ([`ScheduleData::received`]); any other JSON form of it (verwalter 0.13 peers) is
    /// read with serde_json and its hash checked as [`Schedule::verify`] does.
    pub fn from_peer(body: Vec<u8>, host: &str) -> Result<Schedule, ReadError> {
        Schedule::read_peer(body, host, None)
    }

    /// [`Schedule::from_peer`] for a body whose bytes are vouched for as schedule `hash` made by
    /// one of `makers`: the caller found their SHA-1 (or that of the coding they came in) to be
    /// what those nodes announced for `hash`. Its data is then not hashed again (a megabyte is
    /// half a millisecond of SHA-1), only checked to be JSON, provided the envelope names `hash`
    /// and one of `makers` as its origin (a node vouches only for its own schedules); anything
    /// else is read as [`Schedule::from_peer`] reads it.
    pub fn from_vouched_peer(
        body: Vec<u8>,
        host: &str,
        hash: &str,
        makers: &[String],
    ) -> Result<Schedule, ReadError> {
        Schedule::read_peer(body, host, Some((hash, makers)))
    }

    fn read_peer(
        body: Vec<u8>,
        host: &str,
        vouched: Option<(&str, &[String])>,
    ) -> Result<Schedule, ReadError> {
        let Some(parts) = split_written(&body) else {
            return Schedule::from_json(&body);
        };
        let text = match String::from_utf8(body) {
            Ok(text) => text,
            Err(e) => return Schedule::from_json(e.as_bytes()),
        };
        let range = parts.data.clone();
        let taken = match vouched {
            Some((hash, makers)) if *hash == parts.hash && makers.contains(&parts.origin) => {
                ScheduleData::received_vouched(text, range, host)
            }
            _ => ScheduleData::received(text, range, &parts.hash, host),
        };
        let (data, checked) = match taken {
            // Its SHA-1 is the hash: checked.
            Ok(data) => (data, true),
            Err(text) => {
                let data = text.get(parts.data).unwrap_or_default();
                match ScheduleData::from_text(data, &parts.hash) {
                    Ok(data) => (data, false),
                    // Not one JSON value between `"data":` and the last `,"origin":` (more
                    // fields after the data, say; found by fuzzing): the whole envelope is
                    // read as serde_json reads it.
                    Err(_) => return Schedule::from_json(text.as_bytes()),
                }
            }
        };
        let schedule = Schedule {
            timestamp: parts.timestamp,
            hash: parts.hash,
            data,
            origin: parts.origin,
        };
        if !checked {
            schedule.verify()?;
        }
        Ok(schedule)
    }

    /// Reads an envelope with serde_json and checks its hash.
    fn from_json(bytes: &[u8]) -> Result<Schedule, ReadError> {
        let schedule: Schedule = serde_json::from_slice(bytes)?;
        schedule.verify()?;
        Ok(schedule)
    }

    /// This schedule with its data cut to what node `host` renders from
    /// ([`ScheduleData::node_view`]); timestamp, hash and origin stay those of the whole.
    pub fn node_view(&self, host: &str) -> Schedule {
        Schedule {
            data: self.data.node_view_data(host),
            ..self.clone()
        }
    }

    pub fn stamp(&self) -> ScheduleStamp {
        ScheduleStamp {
            timestamp: self.timestamp,
            hash: self.hash.clone(),
            origin: self.origin.clone(),
        }
    }
}

/// A problem with one input file; the rest of the inputs are still used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputError {
    /// Path relative to the config dir, e.g. `runtime/app/v1.yaml`.
    pub path: String,
    /// 1-based line, where the parser knows it.
    pub line: Option<u64>,
    pub message: String,
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.path, line, self.message),
            None => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// The config dir as last read: runtime tree, scheduler sources and their content hashes.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Inputs {
    /// The runtime tree (`runtime/**`), a JSON object.
    pub runtime: Arc<Value>,
    /// Content hash of `scheduler/v1/**`; the Lua sandbox reloads when it changes.
    pub scheduler_hash: String,
    /// Content hash over runtime and scheduler files together.
    pub hash: String,
    /// Unreadable or invalid files, sorted by path.
    pub errors: Vec<InputError>,
    /// `scheduler/v1/metrics.yaml` as last loaded (`None`: no such file). A bad file keeps the
    /// last good declaration ([`crate::schedule::scheduler_metrics::keep_metrics_declaration`]).
    #[serde(skip)]
    pub metrics: Option<Arc<crate::schedule::scheduler_metrics::MetricsDeclaration>>,
}

/// A peer as the scheduler and `/v1/peers` see it (verwalter 0.13 shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub id: NodeId,
    /// `ip:port` of the peer's verwalter, when known.
    pub addr: Option<String>,
    pub name: String,
    pub hostname: String,
    /// The last schedule stamp the peer reported.
    pub schedule: Option<ScheduleStamp>,
    pub known_since: u64,
    pub last_report_direct: Option<u64>,
    /// Failing roles and error domains the peer reported.
    pub errors: u64,
}

/// The peer list and when it was last refreshed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Peers {
    /// Other nodes, keyed by id; never includes this node.
    pub peers: BTreeMap<NodeId, Peer>,
    /// Wall-clock ms of the last refresh, `None` before the first one.
    pub timestamp: Option<u64>,
}

/// Pending operator actions, keyed by action id (`unix_seconds * 1000 + n`).
pub type Actions = BTreeMap<u64, Value>;

/// Everything the scheduler gets, in verwalter 0.13's shape (`/v1/scheduler_input`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerInput {
    pub now: u64,
    pub current_host: String,
    pub current_id: NodeId,
    /// The `data` of each parent schedule.
    pub parents: Vec<Arc<Value>>,
    pub actions: Actions,
    pub runtime: Arc<Value>,
    /// Other nodes (never this one), keyed by id.
    pub peers: BTreeMap<NodeId, Peer>,
    /// The queries of `scheduler/v1/metrics.yaml` with their last good answers and age
    /// ([`crate::schedule::scheduler_metrics::SchedulerMetrics::view`]); an empty object without the file
    /// (as verwalter 0.13 always gave).
    pub metrics: Value,
    /// The other data centers as this DC's leader's exchange sees them
    /// ([`crate::cluster::datacenters::View`], docs/datacenters.md); absent when the node is in
    /// no DC or its exchange is not running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datacenters: Option<Value>,
}

/// What a successful scheduler run returned.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerOutput {
    /// The schedule data: a JSON object, as its canonical text (a scheduler that makes a tree
    /// hands it over with [`ScheduleData::from_value`]).
    pub data: ScheduleData,
    /// The scheduler's log text.
    pub log: String,
}

/// Why a scheduler run failed; each kind is a bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerFailure {
    /// `main.lua` or a module failed to load.
    Load,
    /// The script raised an error.
    Runtime,
    /// The script ran past its time budget.
    Timeout,
    /// The script used more memory than its cap.
    Memory,
    /// The script returned something that is not a schedule.
    BadOutput,
    /// The scheduler host itself failed (thread gone).
    Internal,
}

impl SchedulerFailure {
    pub const ALL: [SchedulerFailure; 6] = [
        SchedulerFailure::Load,
        SchedulerFailure::Runtime,
        SchedulerFailure::Timeout,
        SchedulerFailure::Memory,
        SchedulerFailure::BadOutput,
        SchedulerFailure::Internal,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SchedulerFailure::Load => "load",
            SchedulerFailure::Runtime => "runtime",
            SchedulerFailure::Timeout => "timeout",
            SchedulerFailure::Memory => "memory",
            SchedulerFailure::BadOutput => "bad_output",
            SchedulerFailure::Internal => "internal",
        }
    }
}

/// The scheduler as the API and metrics see it: last input, log, error.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SchedulerStatus {
    /// The input of the last run (kept after a failed run, for debugging).
    pub last_input: Option<Arc<SchedulerInput>>,
    /// Log text of the last run, or the error and log of a failed one.
    pub debug_info: Option<String>,
    /// The error of the last run; `None` after a success.
    pub error: Option<String>,
    /// What kind of failure `error` is.
    pub failure: Option<SchedulerFailure>,
    /// Wall-clock ms of the last successful run.
    pub last_success: Option<u64>,
    /// The input of the last successful run (kept after failed runs): the actions it consumed.
    pub last_success_input: Option<Arc<SchedulerInput>>,
    /// The entries of the last successful run's `datacenters` output that were not used, each
    /// named with its path and why (docs/datacenters.md); the rest was used.
    pub datacenters_errors: Vec<String>,
}

/// One file under `templates/`, as the watcher last read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TemplateFile {
    /// Content hash.
    pub hash: String,
    /// The text mentions `full_schedule`: roles using this template dir re-render whenever the
    /// schedule changes, not only when their own variables do.
    pub mentions_full_schedule: bool,
}

/// Every file under `templates/` by path relative to it (`web/v1/nginx.conf.hbs`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Templates {
    pub files: Arc<BTreeMap<String, TemplateFile>>,
}

impl Templates {
    /// The files of template dir `dir` (relative to `templates/`), in path order.
    pub fn dir<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a String, &'a TemplateFile)> {
        let prefix = format!("{dir}/");
        self.files
            .range(prefix.clone()..)
            .take_while(move |(path, _)| path.starts_with(&prefix))
    }

    /// Feeds what template dir `dir` is made of (each file's path and content hash, in path
    /// order) to `hasher`. This is the one fingerprint of a template dir: the render
    /// controller's desired hash and the applier's cache of parsed dirs both key on it.
    pub(crate) fn hash_dir(&self, dir: &str, hasher: &mut sha1::Sha1) -> TemplateDirSummary {
        use sha1::Digest;
        let mut summary = TemplateDirSummary::default();
        for (path, file) in self.dir(dir) {
            summary.files += 1;
            summary.mentions_full_schedule |= file.mentions_full_schedule;
            hasher.update((path.len() as u64).to_le_bytes());
            hasher.update(path.as_bytes());
            hasher.update(file.hash.as_bytes());
        }
        summary
    }

    /// [`Templates::hash_dir`] alone, in hex.
    pub fn fingerprint(&self, dir: &str) -> String {
        use sha1::Digest;
        let mut hasher = sha1::Sha1::new();
        self.hash_dir(dir, &mut hasher);
        hex::encode(hasher.finalize())
    }
}

/// What [`Templates::hash_dir`] saw of a template dir.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TemplateDirSummary {
    pub files: usize,
    /// A file mentions `full_schedule`.
    pub mentions_full_schedule: bool,
}

/// Why a role on this node is not in its desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoleFailure {
    /// What failed, with file, line or command where known.
    pub message: String,
    /// Wall-clock ms of the first failure in this run of failures.
    pub since: u64,
    /// Failed attempts in a row.
    pub attempts: u32,
    /// The deployment of the last attempt (for the deployment log), if it got that far.
    pub deployment_id: Option<String>,
}

/// A render pass: one deployment id over the roles that needed rendering.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deployment {
    pub id: String,
    /// Hash of the schedule the pass rendered.
    pub schedule: String,
    pub started: u64,
    /// Set when every role of the pass had its attempt.
    pub finished: Option<u64>,
    pub roles: Vec<String>,
    pub failed: Vec<String>,
    /// Roles of the pass that did not apply because something they depend on failed, or because
    /// the pass halted (`render.dependency-failure: halt`).
    pub blocked: Vec<String>,
}

/// Whether a gated role waits for its dependencies to apply or cannot go on until a fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockedState {
    /// A role it depends on has not applied this schedule yet (it will, or it will fail).
    Waiting,
    /// A role it depends on failed or is blocked, or the pass halted after a failure.
    Blocked,
}

/// Why a role that needs work does not apply now (`depends_on`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoleBlocked {
    pub state: BlockedState,
    /// The roles it waits for (or, after a halt, the roles that failed).
    pub on: Vec<String>,
    /// Where the chain of `on` ends: for a blocked role, the roles that failed (or whose
    /// dependencies cannot be followed), however many blocked roles lie between; for a waiting
    /// role, the roles not applied yet that wait for nothing themselves. Equal to `on` when the
    /// direct dependencies are the end.
    pub root_cause: Vec<String>,
    pub reason: String,
    /// When it was first seen waiting or blocked (ms since the epoch).
    pub since: u64,
    /// The pass it belongs to.
    pub deployment_id: Option<String>,
}

/// Observed: the roles of this node and how their rendering went.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct RolesStatus {
    /// Roles that are failing now, by name.
    pub failed: BTreeMap<String, RoleFailure>,
    /// Roles that need work but wait for the roles they depend on, by name.
    pub blocked: BTreeMap<String, RoleBlocked>,
    /// The latest render pass.
    pub last_deployment: Option<Deployment>,
    /// Why the deployment log cannot be written, if it cannot (deployments go on without it).
    pub deployment_log: Option<String>,
}

/// What one peer last told this node in election packets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Report {
    /// The schedule it holds (a leader: the one it produced).
    pub schedule: Option<ScheduleStamp>,
    /// Its failing roles and error domains (from its pongs).
    pub errors: u64,
    /// The election epoch of its last packet.
    pub epoch: u64,
}

/// Observed: election reports by peer id (written by the election transport when a stamp,
/// error count or epoch changes, not on every packet).
pub type Reports = BTreeMap<NodeId, Report>;

/// The schedules a new leader gathered from its peers for its first scheduler run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prefetched {
    /// The epoch of the leadership they were gathered for (0: none yet).
    pub epoch: u64,
    pub schedules: Vec<Schedule>,
    /// A schedule of another node that a peer heard from lately reported and that is being
    /// fetched (or tried again) to join these: the scheduler waits for it, so that the next
    /// schedule after a heal has the other side's among its parents (issue 28).
    pub awaiting: Option<ScheduleStamp>,
}

/// What kind of JSON value `value` is, for messages: `"a boolean"`, `"an array"`, `"null"`...
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn templates(files: &[(&str, &str, bool)]) -> Templates {
        Templates {
            files: Arc::new(
                files
                    .iter()
                    .map(|(path, hash, full)| {
                        let file = TemplateFile {
                            hash: hash.to_string(),
                            mentions_full_schedule: *full,
                        };
                        (path.to_string(), file)
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn a_template_dir_fingerprint_changes_with_its_files_only() {
        let base = templates(&[("web/a.hbs", "1", false), ("webx/b.hbs", "2", false)]);
        let edited = templates(&[("web/a.hbs", "9", false), ("webx/b.hbs", "2", false)]);
        let renamed = templates(&[("web/c.hbs", "1", false), ("webx/b.hbs", "2", false)]);
        let other = templates(&[("web/a.hbs", "1", false), ("webx/b.hbs", "7", true)]);
        let web = base.fingerprint("web");
        assert_ne!(web, edited.fingerprint("web"));
        assert_ne!(web, renamed.fingerprint("web"));
        // `webx/` is another dir, though its name starts with `web`.
        assert_eq!(web, other.fingerprint("web"));
        let mut hasher = <sha1::Sha1 as sha1::Digest>::new();
        let summary = other.hash_dir("webx", &mut hasher);
        assert_eq!(summary.files, 1);
        assert!(summary.mentions_full_schedule);
        assert_eq!(templates(&[]).hash_dir("web", &mut hasher).files, 0);
    }

    #[test]
    fn json_kinds_read_as_in_a_sentence() {
        let kinds: Vec<&str> = [
            serde_json::json!(null),
            serde_json::json!(true),
            serde_json::json!(1.5),
            serde_json::json!("x"),
            serde_json::json!([]),
            serde_json::json!({}),
        ]
        .iter()
        .map(json_kind)
        .collect();
        assert_eq!(
            kinds,
            [
                "null",
                "a boolean",
                "a number",
                "a string",
                "an array",
                "an object"
            ]
        );
    }
}
