//! ernest's builds without the NATS: what to dispatch, what an answer changes, when a build ends.
//!
//! A build is ernest's mapping (`id`, `edges`, `components` = current state, `changes` = the
//! work list). A [`BuildRun`] follows one build on a [`Graph`] of its changes plus the synthetic
//! `start` and `end` vertices, with the graph module's [`Execution`] deciding what is ready: a
//! completion costs O(out-degree), a cycle or an edge to a missing component fails the build at
//! once with one error naming it, and [`Execution::outcome`] says when nothing more can happen.
//!
//! Edges are execution order, as in ernest's mappings: `source` runs before `destination`.
//! ernest's builder writes the edges of stateful deletes already reversed (an instance is
//! deleted before its network), so they are followed as given and not reversed a second time.
//!
//! What is kept per build is plain data ([`BuildRun`] serializes to one JSON snapshot): the
//! mapping with each change's `_state`, the deadline of each running component and the result
//! with whether it was handed out for publishing. Between snapshots, a run hands out what each
//! step changed as a small [`Delta`] ([`BuildRun::take_delta`]: the changes touched, the
//! components put or deleted in order, the deadlines added or removed, the result), numbered by
//! [`BuildRun::seq`]; the executor's loop appends it to the build's journal instead of
//! rewriting the whole build. [`BuildRun::restore_with`] applies the records newer than the
//! snapshot and rebuilds the graph and the progress from the result, so a restarted executor
//! goes on without dispatching a completed component again. [`Executor`] routes NATS messages
//! to the runs it holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::graph::{ErrorPolicy, Execution, Graph, GraphError, Outcome, VertexState};
use crate::refs::{Resolver, has_refs};

/// One component (or change): user-defined JSON with ernest's `_`-fields; every field is kept.
pub(crate) type Component = Map<String, Value>;

/// The actions a build message may carry: `build.<action>`.
pub const BUILD_ACTIONS: &[&str] = &["create", "delete", "patch", "import", "sync"];
/// ernest's synthetic first and last vertices; `start` counts as completed when a build starts.
pub(crate) const START: &str = "start";
pub(crate) const END: &str = "end";

/// ernest's `_state` values.
pub(crate) const WAITING: &str = "waiting";
pub(crate) const RUNNING: &str = "running";
pub(crate) const COMPLETED: &str = "completed";
pub(crate) const ERRORED: &str = "errored";

/// The key of a summarised result's note.
pub(crate) const SUMMARY_KEY: &str = "result_summary";

/// A terminal message's payload that fits in `max` bytes: `payload` itself when it fits. Else a
/// summary: the build's fields without its `components`, `changes` and `edges` (counted
/// instead), the largest other fields dropped and `error` shortened as needed, and under
/// [`SUMMARY_KEY`] why (the whole size, `max`) and where the whole build is (`stored_at`, the
/// build's file). The summary is valid JSON within `max` for any `max` of at least 512 bytes.
pub(crate) fn fit_result(payload: Vec<u8>, max: usize, stored_at: Option<&str>) -> Vec<u8> {
    if payload.len() <= max {
        return payload;
    }
    let whole = payload.len();
    let mut map = match serde_json::from_slice::<Value>(&payload) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let count = |map: &Map<String, Value>, key: &str| {
        map.get(key)
            .and_then(Value::as_array)
            .map_or(0, |a| a.len())
    };
    let mut note = Map::new();
    note.insert(
        "reason".into(),
        Value::from(format!(
            "the whole result is {whole} bytes, over the {max} bytes the NATS server takes \
             (max_payload)"
        )),
    );
    note.insert("bytes".into(), Value::from(whole));
    note.insert("max_payload".into(), Value::from(max));
    for key in ["components", "changes", "edges"] {
        note.insert(key.into(), Value::from(count(&map, key)));
        map.remove(key);
    }
    if let Some(at) = stored_at {
        note.insert("stored_at".into(), Value::from(at));
    }
    let size = |map: &Map<String, Value>| serde_json::to_vec(map).map_or(usize::MAX, |b| b.len());
    map.insert(SUMMARY_KEY.into(), Value::Object(note.clone()));
    // Drop the largest other fields, one at a time, keeping `id`, `error` and the note.
    while size(&map) > max {
        let largest = map
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "id" | "error" | SUMMARY_KEY))
            .map(|(k, v)| (serde_json::to_vec(v).map_or(0, |b| b.len()), k.clone()))
            .max();
        match largest {
            Some((_, key)) => {
                map.remove(&key);
            }
            None => break,
        }
    }
    // Then shorten `error`, then `id`, to what is left (a byte budget; cut at a char boundary).
    for key in ["error", "id", "stored_at"] {
        let over = size(&map).saturating_sub(max);
        if over == 0 {
            break;
        }
        let text = if key == "stored_at" {
            map.get(SUMMARY_KEY)
                .and_then(|n| n.get(key))
                .and_then(Value::as_str)
        } else {
            map.get(key).and_then(Value::as_str)
        };
        let Some(text) = text else { continue };
        let cut = shorten(text, over + 64);
        if key == "stored_at" {
            if let Some(Value::Object(n)) = map.get_mut(SUMMARY_KEY) {
                n.insert(key.into(), Value::from(cut));
            }
        } else {
            map.insert(key.into(), Value::from(cut));
        }
    }
    let bytes = serde_json::to_vec(&map).unwrap_or_default();
    if bytes.len() <= max {
        bytes
    } else {
        // Only a `max` far below any real server's: the bare note.
        format!("{{\"{SUMMARY_KEY}\":{{\"bytes\":{whole},\"max_payload\":{max}}}}}").into_bytes()
    }
}

/// `text` shortened by at least `by` bytes (its JSON escapes counted), with a note of how much
/// was cut.
fn shorten(text: &str, by: usize) -> String {
    // The escaped length can exceed the text's: budget on the escaped form.
    let escaped = serde_json::to_string(text).map_or(text.len(), |s| s.len());
    let keep_escaped = escaped.saturating_sub(by + 40);
    let mut kept = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = serde_json::to_string(&c.to_string()).map_or(4, |s| s.len() - 2);
        if used + w > keep_escaped {
            break;
        }
        used += w;
        kept.push(c);
    }
    let cut = text.len() - kept.len();
    format!("{kept}... ({cut} bytes cut)")
}

/// The mapping a `build.*` message carries and `<action>.done` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Build {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) username: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) action: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) options: Option<Value>,
    #[serde(default)]
    pub(crate) edges: Vec<Edge>,
    /// The current state: what exists.
    #[serde(default)]
    pub(crate) components: Vec<Component>,
    /// The desired changes: the work list.
    #[serde(default)]
    pub changes: Vec<Component>,
    /// Fields this executor does not know (`datacenters`, ...), kept and returned.
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

/// `source` runs before `destination`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Edge {
    pub source: String,
    pub(crate) destination: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) length: Option<Value>,
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

/// A component's `_component_id` (`type::name`).
pub(crate) fn component_id(c: &Component) -> Option<&str> {
    c.get("_component_id").and_then(Value::as_str)
}

fn field<'a>(c: &'a Component, key: &str) -> &'a str {
    c.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The fields a change's dispatch subject is made of, in order.
const SUBJECT_FIELDS: [&str; 3] = ["_component", "_action", "_provider"];

/// Changes of a new build that lack a field of their dispatch subject (missing, empty or not
/// text): what is missing where, naming up to ten changes per field. Without one, a change
/// would go out on a subject with an empty token, which no worker answers.
fn missing_subject_fields(changes: &[Component]) -> Option<String> {
    const SHOWN: usize = 10;
    let problems: Vec<String> = SUBJECT_FIELDS
        .iter()
        .filter_map(|&key| {
            let ids: Vec<&str> = changes
                .iter()
                .filter(|c| field(c, key).is_empty())
                .map(|c| component_id(c).unwrap_or(""))
                .collect();
            if ids.is_empty() {
                return None;
            }
            let mut named = ids[..ids.len().min(SHOWN)].join(", ");
            if ids.len() > SHOWN {
                named.push_str(&format!(" and {} more", ids.len() - SHOWN));
            }
            Some(format!("no {key} (missing, empty or not text) in {named}"))
        })
        .collect();
    (!problems.is_empty()).then(|| {
        format!(
            "{}: a change is dispatched on <_component>.<_action>.<_provider>",
            problems.join("; ")
        )
    })
}

/// Why a filled change cannot be dispatched on `<_component>.<_action>.<_provider>`, if it
/// cannot: a field that is not text, is empty, or has whitespace or a NATS wildcard (`*`,
/// `>`) in it. A dot is let through, as ernest sends it (the subject has more tokens).
fn bad_subject_token(payload: &Value) -> Option<String> {
    SUBJECT_FIELDS.iter().find_map(|&key| {
        let value = payload.get(key);
        let why = match value.and_then(Value::as_str) {
            None => "is missing or not text",
            Some("") => "is empty",
            Some(t) if t.chars().any(char::is_whitespace) => "contains whitespace",
            Some(t) if t.contains(['*', '>']) => "contains a NATS wildcard (* or >)",
            Some(_) => return None,
        };
        let shown = value.map_or_else(|| "null".to_string(), Value::to_string);
        Some(format!(
            "{key} {shown} cannot be a token of the dispatch subject: it {why}"
        ))
    })
}

/// The subject a change is dispatched on: `<_component>.<_action>.<_provider>`.
pub(crate) fn dispatch_subject(c: &Component) -> String {
    format!(
        "{}.{}.{}",
        field(c, "_component"),
        field(c, "_action"),
        field(c, "_provider")
    )
}

/// What a NATS message is to the executor, by its subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject<'a> {
    /// `build.<action>`: a build to start (the subject without `build.` is the action).
    Build(&'a str),
    /// `<type>.<action>.<provider>.done|error`: a component's answer (`true`: an error).
    Answer {
        errored: bool,
    },
    Other,
}

impl<'a> Subject<'a> {
    pub(crate) fn parse(subject: &'a str) -> Subject<'a> {
        if let Some(action) = subject.strip_prefix("build.")
            && BUILD_ACTIONS.contains(&action)
        {
            return Subject::Build(action);
        }
        // An answer is a dispatch subject (three tokens) plus `.done`/`.error`, so
        // `build.create.done` (three) is never one. ernest took any subject ending so.
        let tokens: Vec<&str> = subject.split('.').collect();
        match tokens.as_slice() {
            [_, _, _, "done"] => Subject::Answer { errored: false },
            [_, _, _, "error"] => Subject::Answer { errored: true },
            _ => Subject::Other,
        }
    }
}

/// When a running component must have answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Deadline {
    pub(crate) dispatched_ms: u64,
    pub(crate) deadline_ms: u64,
}

/// How a build ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResultKind {
    Done,
    Error,
}

impl ResultKind {
    /// The metric label and the word in the log.
    pub fn label(self) -> &'static str {
        match self {
            ResultKind::Done => "done",
            ResultKind::Error => "error",
        }
    }
}

/// Whether the one terminal message was handed out for publishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Sent {
    /// Stored before publishing; a restart that finds this publishes it again (it may not have
    /// reached the server), with the same message id.
    Sending,
    /// Published and flushed to the server.
    Sent,
}

/// A finished build's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct BuildResult {
    pub kind: ResultKind,
    /// `build.create.done`, ...
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub finished_ms: u64,
    pub sent: Sent,
}

/// A message to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub subject: String,
    pub payload: Vec<u8>,
    /// The build's terminal message (after publishing and a flush, [`BuildRun::mark_sent`]).
    pub(crate) terminal: bool,
}

/// What an answer did.
#[derive(Debug, Clone, PartialEq)]
pub enum Answered {
    /// Applied; the component ran this long from its dispatch.
    Applied { latency_ms: u64, errored: bool },
    /// The component is not running (answered before, or timed out): nothing changed.
    Duplicate,
    /// No change of the build has this `_component_id`.
    Unknown,
}

/// How a dispatched change's `$(path)` references are filled (`graph.templating`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Templating {
    /// ernest's ([`template`]): whole-string references only, as text; what finds nothing
    /// stays as it is.
    #[default]
    Ernest,
    /// [`Resolver`]'s: typed values, references inside longer strings, and a reference that
    /// finds nothing errors the component.
    Extended,
}

impl Templating {
    /// What the executor did before `graph.templating` existed.
    fn before_the_setting() -> Templating {
        Templating::Extended
    }

    /// `ernest` or `extended`.
    pub fn parse(text: &str) -> Result<Templating, String> {
        match text {
            "ernest" => Ok(Templating::Ernest),
            "extended" => Ok(Templating::Extended),
            other => Err(format!(
                "{other:?} is not a templating mode (ernest or extended)"
            )),
        }
    }
}

/// Settings of the runs an executor starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunSettings {
    pub policy: ErrorPolicy,
    /// How long a dispatched component may take to answer.
    pub component_timeout: Duration,
    pub templating: Templating,
}

/// The graph and progress rebuilt from the stored state (not stored themselves).
#[derive(Debug, Clone)]
struct Live {
    graph: Graph,
    progress: Execution,
    /// Per vertex: its position in `changes` (`None` for `start` and `end`).
    change_of: Vec<Option<usize>>,
}

/// A change to `components` by ernest's completion rules, in the order it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ComponentOp {
    /// Replaces the component with the same `_component_id`, or adds it at the end.
    Put(Component),
    /// Removes the components with this `_component_id`.
    Delete(Option<String>),
}

/// What a run's steps changed since the last snapshot or delta: one journal record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// The run's [`BuildRun::seq`] once this record is applied; replay takes a record only
    /// when it follows the run's seq directly.
    pub(crate) seq: u64,
    /// The run's `received_ms`: a record of an earlier build with the same id (left behind by
    /// a stop between the new build's first snapshot and the emptying of the journal) does
    /// not match and is skipped.
    pub received_ms: u64,
    /// Entries of `build.changes` that were modified, by position, as they are now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<(usize, Component)>,
    /// Changes to `build.components`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) components: Vec<ComponentOp>,
    /// Running components added (with their deadline) or removed, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) running: Vec<(String, Option<Deadline>)>,
    /// The result, when it was set or changed (a result is never taken back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) result: Option<BuildResult>,
}

/// What changed in a run since the last snapshot or delta (not stored).
#[derive(Debug, Clone, Default)]
struct Dirty {
    changes: BTreeSet<usize>,
    components: Vec<ComponentOp>,
    running: Vec<(String, Option<Deadline>)>,
    result: bool,
}

impl Dirty {
    fn is_empty(&self) -> bool {
        self.changes.is_empty()
            && self.components.is_empty()
            && self.running.is_empty()
            && !self.result
    }
}

/// One build being executed (see the module docs). Serializes to what a restart needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildRun {
    /// The subject the build came on: `build.create`, ...; its result is `<subject>.done|error`.
    pub subject: String,
    pub policy: ErrorPolicy,
    pub(crate) component_timeout_ms: u64,
    /// How references are filled. A file written before the setting existed was started with
    /// what is now `extended`, and goes on with it.
    #[serde(default = "Templating::before_the_setting")]
    pub templating: Templating,
    pub received_ms: u64,
    pub(crate) build: Build,
    /// The running components and when they must answer.
    #[serde(default)]
    pub(crate) running: BTreeMap<String, Deadline>,
    #[serde(default)]
    pub(crate) result: Option<BuildResult>,
    /// The number of the last snapshot or journal record this state is (0 in files written
    /// before the journal).
    #[serde(default)]
    pub(crate) seq: u64,
    #[serde(skip)]
    live: Option<Live>,
    #[serde(skip)]
    dirty: Dirty,
    /// Why the graph cannot run; the next [`BuildRun::pump`] ends the build with it.
    #[serde(skip)]
    invalid: Option<String>,
}

impl BuildRun {
    /// A build received on `subject` at `now_ms`. A graph that cannot run (a cycle, an edge to a
    /// missing component, a change given twice, a change without a `_component`, `_action` or
    /// `_provider` to dispatch it on) finishes the build at once with an error naming it;
    /// [`BuildRun::pump`] hands that error out.
    pub fn new(subject: &str, build: Build, settings: RunSettings, now_ms: u64) -> BuildRun {
        let mut run = BuildRun {
            subject: subject.to_string(),
            policy: settings.policy,
            component_timeout_ms: u64::try_from(settings.component_timeout.as_millis())
                .unwrap_or(u64::MAX),
            templating: settings.templating,
            received_ms: now_ms,
            build,
            running: BTreeMap::new(),
            result: None,
            seq: 0,
            live: None,
            dirty: Dirty::default(),
            invalid: None,
        };
        for change in &mut run.build.changes {
            change.insert("_state".into(), Value::from(WAITING));
        }
        // ernest sets the build's action to the subject it came on (`build.create`).
        run.build.action = Some(Value::from(subject));
        run.invalid = run
            .rebuild()
            .err()
            .or_else(|| missing_subject_fields(&run.build.changes));
        run
    }

    /// A stored run, with its graph and progress rebuilt: completed changes stay completed,
    /// running ones keep their deadline (their answer is still taken), errored ones count as
    /// failed under the run's policy.
    pub fn restore(bytes: &[u8]) -> Result<BuildRun, serde_json::Error> {
        BuildRun::restore_with(bytes, std::iter::empty())
    }

    /// A stored run from its snapshot and its journal records (one [`Delta`] each, oldest
    /// first): records not newer than the snapshot are skipped (a stop between writing a
    /// snapshot and emptying the journal leaves them), the others applied in order. Replay stops
    /// at the first record that does not parse (the torn tail a kill during an append leaves;
    /// that append was not reported durable, so nothing published depends on it) or does not
    /// follow the one before, with a warning. Then the graph and progress are rebuilt as
    /// [`BuildRun::restore`] does.
    pub fn restore_with<'a>(
        snapshot: &[u8],
        records: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<BuildRun, serde_json::Error> {
        let mut run: BuildRun = serde_json::from_slice(snapshot)?;
        for (n, record) in records.into_iter().enumerate() {
            let delta: Delta = match serde_json::from_slice(record) {
                Ok(delta) => delta,
                Err(error) => {
                    tracing::warn!(build = %run.id(), record = n, %error,
                        "Journal replay stopped at a record that does not parse (a write cut \
                         short by a stop); the records from there on are not applied.");
                    break;
                }
            };
            if delta.seq <= run.seq || delta.received_ms != run.received_ms {
                continue;
            }
            if let Err(why) = run.apply(delta) {
                tracing::warn!(build = %run.id(), record = n, %why,
                    "Journal replay stopped at a record that does not fit the build; the \
                     records from there on are not applied.");
                break;
            }
        }
        if run.result.is_none()
            && let Err(error) = run.rebuild()
        {
            // Only a stored file edited by hand gets here: the graph was checked at the start.
            run.invalid = Some(error);
        }
        Ok(run)
    }

    /// The journal records of `journal`: its lines, the empty ones left out.
    pub fn journal_records(journal: &[u8]) -> impl Iterator<Item = &[u8]> {
        journal.split(|&b| b == b'\n').filter(|l| !l.is_empty())
    }

    /// Applies one journal record; nothing changes when it does not fit.
    fn apply(&mut self, delta: Delta) -> Result<(), String> {
        if delta.seq != self.seq.saturating_add(1) {
            return Err(format!(
                "record {} does not follow {} (a record is missing)",
                delta.seq, self.seq
            ));
        }
        if let Some((i, _)) = delta
            .changes
            .iter()
            .find(|(i, _)| *i >= self.build.changes.len())
        {
            return Err(format!(
                "change #{i} does not exist ({} changes)",
                self.build.changes.len()
            ));
        }
        for (i, change) in delta.changes {
            self.build.changes[i] = change;
        }
        for op in &delta.components {
            apply_op(&mut self.build.components, op);
        }
        for (id, deadline) in delta.running {
            match deadline {
                Some(deadline) => self.running.insert(id, deadline),
                None => self.running.remove(&id),
            };
        }
        if delta.result.is_some() {
            self.result = delta.result;
        }
        self.seq = delta.seq;
        Ok(())
    }

    /// What changed since the last snapshot or delta, as the next journal record (`None`:
    /// nothing changed). Numbers it with the next [`BuildRun::seq`].
    pub fn take_delta(&mut self) -> Option<Delta> {
        if self.dirty.is_empty() {
            return None;
        }
        let dirty = std::mem::take(&mut self.dirty);
        self.seq = self.seq.saturating_add(1);
        Some(Delta {
            seq: self.seq,
            received_ms: self.received_ms,
            changes: dirty
                .changes
                .into_iter()
                .map(|i| (i, self.build.changes[i].clone()))
                .collect(),
            components: dirty.components,
            running: dirty.running,
            result: if dirty.result {
                self.result.clone()
            } else {
                None
            },
        })
    }

    /// A snapshot is about to be written instead of a delta: forgets what changed, and moves
    /// [`BuildRun::seq`] on, so the snapshot is newer than every record written before it and
    /// older than every record after it.
    pub fn clear_delta(&mut self) {
        self.dirty = Dirty::default();
        self.seq = self.seq.saturating_add(1);
    }

    pub fn id(&self) -> &str {
        &self.build.id
    }

    /// Whether the build has its result (it may still have to be published).
    pub fn finished(&self) -> bool {
        self.result.is_some()
    }

    /// Builds the graph from the changes and edges, and replays the stored states into a new
    /// progress.
    fn rebuild(&mut self) -> Result<(), String> {
        if let Some(i) = self
            .build
            .changes
            .iter()
            .position(|c| component_id(c).is_none())
        {
            return Err(format!("change #{i} has no _component_id"));
        }
        self.rebuild_graph().map_err(|error| match error {
            GraphError::Missing { vertex, missing } => {
                format!(
                    "an edge joins {vertex:?} to {missing:?}, which is not a component of the build"
                )
            }
            other => other.to_string(),
        })
    }

    fn rebuild_graph(&mut self) -> Result<(), GraphError> {
        let changes = &self.build.changes;
        let mut names: Vec<&str> = vec![START, END];
        let mut positions: HashMap<&str, usize> = HashMap::new();
        for (i, change) in changes.iter().enumerate() {
            let id = component_id(change).unwrap_or("");
            names.push(id);
            positions.insert(id, i);
        }
        // An edge to a component that exists and does not change (in `components` only) has
        // nothing to wait for: it is left out. Any other unknown name is an error.
        let current: std::collections::HashSet<&str> = self
            .build
            .components
            .iter()
            .filter_map(component_id)
            .collect();
        let is_vertex = |n: &str| n == START || n == END || positions.contains_key(n);
        let edges = self
            .build
            .edges
            .iter()
            .filter(|e| {
                let settled = |n: &str| !is_vertex(n) && current.contains(n);
                !settled(&e.source) && !settled(&e.destination)
            })
            .map(|e| (e.source.as_str(), e.destination.as_str()));
        let graph = Graph::from_edges(names.iter().copied(), edges)?;
        let order = graph.order()?;
        let change_of: Vec<Option<usize>> = (0..graph.len())
            .map(|v| positions.get(graph.name(v)).copied())
            .collect();
        let mut progress = Execution::new(&graph, self.policy);
        let state_of = |v: usize| change_of[v].map(|i| field(&changes[i], "_state"));
        // Completions first, in dependency order, then what ran, then what failed: a halt must
        // not keep a running component from being marked running.
        for &v in &order {
            if state_of(v).is_none_or(|s| s == COMPLETED) {
                progress.complete(&graph, v);
            }
        }
        for &v in &order {
            if matches!(state_of(v), Some(RUNNING | ERRORED)) {
                progress.start(v);
            }
        }
        for &v in &order {
            if state_of(v) == Some(ERRORED) {
                progress.fail(&graph, v);
            }
        }
        self.live = Some(Live {
            graph,
            progress,
            change_of,
        });
        Ok(())
    }

    fn finish(&mut self, kind: ResultKind, error: Option<String>, now_ms: u64) {
        self.result = Some(BuildResult {
            kind,
            subject: format!("{}.{}", self.subject, kind.label()),
            error,
            finished_ms: now_ms,
            sent: Sent::Sending,
        });
        self.dirty.result = true;
    }

    /// Takes the step the run can take now: completes `start` and `end` as they become ready,
    /// dispatches every ready change (stored as `running` with its deadline; the message carries
    /// its `$(...)` references resolved against the whole build; one whose references cannot be
    /// resolved or whose subject cannot be formed is errored instead) and, once nothing more can
    /// happen, the one terminal message. Called after every change to the run; a second call
    /// with nothing new returns nothing.
    pub fn pump(&mut self, now_ms: u64) -> Vec<Outgoing> {
        let mut out = Vec::new();
        if self.result.is_some() {
            return out;
        }
        if let Some(error) = self.invalid.take() {
            self.finish(ResultKind::Error, Some(error), now_ms);
            out.extend(self.terminal_message());
            return out;
        }
        let Some(live) = self.live.as_mut() else {
            return out;
        };
        let mut doc: Option<Value> = None;
        loop {
            let ready = live.progress.take_ready();
            if ready.is_empty() {
                break;
            }
            for v in ready {
                let Some(i) = live.change_of[v] else {
                    live.progress.complete(&live.graph, v);
                    continue;
                };
                let change = &mut self.build.changes[i];
                change.insert("service".into(), Value::from(self.build.id.clone()));
                change.insert("_state".into(), Value::from(RUNNING));
                let change = change.clone();
                self.dirty.changes.insert(i);
                let id = component_id(&change).unwrap_or("").to_string();
                let change = Value::Object(change);
                let filled = if has_refs(&change) {
                    // One view of the build per step: references name other components' fields,
                    // which only answers change.
                    let doc = doc.get_or_insert_with(|| {
                        serde_json::to_value(&self.build).unwrap_or(Value::Null)
                    });
                    match self.templating {
                        Templating::Ernest => Ok(template::template(doc, &change)),
                        Templating::Extended => Resolver::new(doc).resolve(&change, &id),
                    }
                } else {
                    Ok(change)
                };
                // The subject is formed from the filled change: one that cannot be formed
                // errors the component now (its answer could never come back).
                let resolved = filled
                    .map_err(|error| ("reference", error.to_string()))
                    .and_then(|payload| match bad_subject_token(&payload) {
                        Some(why) => Err(("subject", why)),
                        None => Ok(payload),
                    });
                match resolved {
                    Ok(payload) => {
                        let deadline = Deadline {
                            dispatched_ms: now_ms,
                            deadline_ms: now_ms.saturating_add(self.component_timeout_ms),
                        };
                        self.running.insert(id.clone(), deadline);
                        self.dirty.running.push((id, Some(deadline)));
                        // The subject from the templated change, as ernest sends it: a
                        // `_provider` of `$(...)` is the provider it names.
                        let subject = payload.as_object().map(dispatch_subject);
                        out.push(Outgoing {
                            subject: subject.unwrap_or_default(),
                            payload: serde_json::to_vec(&payload).unwrap_or_default(),
                            terminal: false,
                        });
                        if let Some(sent) = out.last() {
                            let id = component_id(&self.build.changes[i]).unwrap_or("");
                            let timeout_s = self.component_timeout_ms as f64 / 1000.0;
                            tracing::info!(build = %self.build.id, component = %id,
                                subject = %sent.subject, timeout_s, "Component dispatched.");
                        }
                    }
                    Err((code, error)) => {
                        tracing::warn!(build = %self.build.id, component = %id,
                            error_code = code, %error, "Component not dispatched.");
                        let change = &mut self.build.changes[i];
                        change.insert("_state".into(), Value::from(ERRORED));
                        change.insert("error_code".into(), Value::from(code));
                        change.insert("error_message".into(), Value::from(error));
                        live.progress.fail(&live.graph, v);
                    }
                }
            }
        }
        if let Some(outcome) = live.progress.outcome() {
            let (kind, error) = match outcome {
                Outcome::Completed => (ResultKind::Done, None),
                Outcome::Failed { failed, blocked } => {
                    let names: Vec<String> = failed
                        .iter()
                        .map(|&v| {
                            let name = live.graph.name(v);
                            let why = live.change_of[v]
                                .map(|i| field(&self.build.changes[i], "error_message"))
                                .unwrap_or("");
                            if why.is_empty() {
                                name.to_string()
                            } else {
                                format!("{name} ({why})")
                            }
                        })
                        .collect();
                    let not_started = blocked
                        .iter()
                        .filter(|&&v| live.change_of[v].is_some())
                        .count();
                    (
                        ResultKind::Error,
                        Some(format!(
                            "failed: {}; {not_started} not started",
                            names.join(", ")
                        )),
                    )
                }
            };
            self.finish(kind, error, now_ms);
        }
        if let Some(terminal) = self.terminal_message() {
            out.push(terminal);
        }
        out
    }

    /// The terminal message of a finished build: the whole build, plus `error` for an error.
    /// As in ernest's, `name`, `username` (`""` when the build has none) and `options` (`null`)
    /// are always there.
    pub(crate) fn terminal_message(&self) -> Option<Outgoing> {
        let result = self.result.as_ref()?;
        let mut payload = serde_json::to_value(&self.build).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut payload {
            for (key, empty) in [
                ("name", Value::from("")),
                ("username", Value::from("")),
                ("options", Value::Null),
            ] {
                map.entry(key).or_insert(empty);
            }
            if let Some(error) = &result.error {
                map.insert("error".into(), Value::from(error.clone()));
            }
        }
        Some(Outgoing {
            subject: result.subject.clone(),
            payload: serde_json::to_vec(&payload).unwrap_or_default(),
            terminal: true,
        })
    }

    /// The terminal message was published and flushed.
    pub(crate) fn mark_sent(&mut self) {
        if let Some(result) = &mut self.result {
            result.sent = Sent::Sent;
            self.dirty.result = true;
        }
    }

    /// A `.done` (`errored: false`) or `.error` answer for one of this build's changes. A
    /// completion applies ernest's rules to `components` (create/find add, update/get replace,
    /// delete removes) and replaces the entry in `changes`; an error replaces the entry only.
    /// [`BuildRun::pump`] takes the next step.
    pub fn answer(&mut self, payload: Component, errored: bool, now_ms: u64) -> Answered {
        let Some(id) = component_id(&payload).map(str::to_string) else {
            return Answered::Unknown;
        };
        let Some(live) = self.live.as_mut() else {
            return Answered::Duplicate;
        };
        let Some(v) = live.graph.id(&id).filter(|&v| live.change_of[v].is_some()) else {
            return Answered::Unknown;
        };
        if self.result.is_some() || live.progress.state(v) != VertexState::Running {
            return Answered::Duplicate;
        }
        let i = live.change_of[v].unwrap_or_default();
        let mut entry = payload;
        entry.insert(
            "_state".into(),
            Value::from(if errored { ERRORED } else { COMPLETED }),
        );
        // The answer's own `_action` may be missing; the change's says what was asked.
        let action = field(&self.build.changes[i], "_action").to_string();
        if !errored {
            let ops = apply_completion(&mut self.build.components, &action, &entry);
            self.dirty.components.extend(ops);
            live.progress.complete(&live.graph, v);
        } else {
            live.progress.fail(&live.graph, v);
        }
        self.build.changes[i] = entry;
        self.dirty.changes.insert(i);
        let latency_ms = self.running.remove(&id).map_or(0, |d| {
            self.dirty.running.push((id, None));
            now_ms.saturating_sub(d.dispatched_ms)
        });
        Answered::Applied {
            latency_ms,
            errored,
        }
    }

    /// Running components whose deadline passed become errored, with a message saying they
    /// timed out. Returns their ids.
    pub(crate) fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let expired: Vec<String> = self
            .running
            .iter()
            .filter(|(_, d)| d.deadline_ms <= now_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            let Some(i) = self
                .build
                .changes
                .iter()
                .position(|c| component_id(c) == Some(id))
            else {
                continue;
            };
            let mut payload = self.build.changes[i].clone();
            let waited = self
                .running
                .get(id)
                .map_or(0, |d| now_ms.saturating_sub(d.dispatched_ms));
            payload.insert("error_code".into(), Value::from("timeout"));
            payload.insert(
                "error_message".into(),
                Value::from(format!(
                    "timed out: no answer within {} s",
                    Duration::from_millis(waited).as_secs_f64()
                )),
            );
            self.answer(payload, true, now_ms);
        }
        expired
    }

    /// The earliest deadline of a running component.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.running.values().map(|d| d.deadline_ms).min()
    }

    /// Components dispatched and not answered.
    pub fn in_flight(&self) -> usize {
        self.running.len()
    }
}

/// ernest's completion rules on the current state; returns what they did, in order. An
/// `update` or `get` of a component that is not in the state changes nothing, as in ernest.
fn apply_completion(
    components: &mut Vec<Component>,
    action: &str,
    done: &Component,
) -> Vec<ComponentOp> {
    let id = component_id(done);
    if matches!(action, "update" | "get") && !components.iter().any(|c| component_id(c) == id) {
        return Vec::new();
    }
    let ops = completion_ops(action, done);
    for op in &ops {
        apply_op(components, op);
    }
    ops
}

/// What a completed `action` does to the current state.
fn completion_ops(action: &str, done: &Component) -> Vec<ComponentOp> {
    match action {
        "create" | "update" | "get" => vec![ComponentOp::Put(done.clone())],
        // A find answers with what it found, each one a component of its own; an answer
        // without a `components` list found nothing.
        "find" => done
            .get("components")
            .and_then(Value::as_array)
            .map(|found| {
                found
                    .iter()
                    .filter_map(Value::as_object)
                    .map(|c| ComponentOp::Put(c.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        "delete" => vec![ComponentOp::Delete(component_id(done).map(str::to_string))],
        _ => Vec::new(),
    }
}

/// One completion rule on the current state (live, and when a journal is replayed).
fn apply_op(components: &mut Vec<Component>, op: &ComponentOp) {
    match op {
        ComponentOp::Put(c) => {
            let id = component_id(c);
            match components.iter_mut().find(|x| component_id(x) == id) {
                Some(slot) => *slot = c.clone(),
                None => components.push(c.clone()),
            }
        }
        ComponentOp::Delete(id) => components.retain(|c| component_id(c) != id.as_deref()),
    }
}

/// What the executor must do after a message or a tick.
#[derive(Debug, Default)]
pub struct Step {
    /// Builds whose stored state changed: write them before publishing anything.
    pub(crate) save: Vec<String>,
    pub(crate) publish: Vec<(String, Outgoing)>,
    /// Answers applied: (errored, dispatch-to-answer ms), for the latency histogram.
    pub(crate) answered: Vec<(bool, u64)>,
    /// Builds that got their result in this step.
    pub finished: Vec<(String, ResultKind)>,
}

impl Step {
    fn absorb(&mut self, run: &BuildRun, out: Vec<Outgoing>) {
        let id = run.id().to_string();
        if !self.save.contains(&id) {
            self.save.push(id.clone());
        }
        for o in out {
            if o.terminal
                && let Some(result) = &run.result
            {
                self.finished.push((id.clone(), result.kind));
            }
            self.publish.push((id.clone(), o));
        }
    }
}

/// The runs of one executor, and how messages reach them.
#[derive(Debug)]
pub struct Executor {
    settings: RunSettings,
    runs: HashMap<String, BuildRun>,
}

impl Executor {
    pub fn new(settings: RunSettings) -> Executor {
        Executor {
            settings,
            runs: HashMap::new(),
        }
    }

    /// Takes back a stored run. Returns what to publish now: the dispatches of changes that
    /// became ready before the stop, or the result of a finished build that was stored as
    /// `Sending` (it may or may not have reached the server, so it goes out again: a client may
    /// see it twice, never zero times). A result stored as `Sent` is not published again.
    pub(crate) fn resume(&mut self, run: BuildRun, now_ms: u64) -> Step {
        let mut step = Step::default();
        let mut run = run;
        if let Some(result) = &run.result {
            if result.sent == Sent::Sending
                && let Some(terminal) = run.terminal_message()
            {
                tracing::warn!(build = %run.id(), subject = %result.subject,
                    "Build finished before the stop; its result may not have been published, \
                     and is published again.");
                let id = run.id().to_string();
                step.publish.push((id.clone(), terminal));
                self.runs.insert(id, run);
            }
            return step;
        }
        let out = run.pump(now_ms);
        if !out.is_empty() {
            step.absorb(&run, out);
        }
        tracing::info!(build = %run.id(), running = run.in_flight(), "Build resumed.");
        self.runs.insert(run.id().to_string(), run);
        step
    }

    /// A message from NATS.
    pub fn message(&mut self, subject: &str, payload: &[u8], now_ms: u64) -> Step {
        let mut step = Step::default();
        match Subject::parse(subject) {
            Subject::Build(_) => {
                let build: Build = match serde_json::from_slice(payload) {
                    Ok(build) => build,
                    Err(error) => {
                        tracing::warn!(%subject, %error, "Build message ignored: not a build.");
                        return step;
                    }
                };
                if self.runs.get(&build.id).is_some_and(|r| !r.finished()) {
                    tracing::warn!(%subject, build = %build.id,
                        "Build message ignored: this build is running already.");
                    return step;
                }
                let mut run = BuildRun::new(subject, build, self.settings, now_ms);
                tracing::info!(build = %run.id(), %subject, changes = run.build.changes.len(),
                    "Build started.");
                let out = run.pump(now_ms);
                step.absorb(&run, out);
                self.runs.insert(run.id().to_string(), run);
            }
            Subject::Answer { errored } => {
                let Ok(answer) = serde_json::from_slice::<Component>(payload) else {
                    tracing::debug!(%subject, "Answer ignored: not a JSON object.");
                    return step;
                };
                let service = field(&answer, "service").to_string();
                let id = component_id(&answer).unwrap_or("").to_string();
                let Some(run) = self.runs.get_mut(&service) else {
                    // At debug: with several executors on one server every answer reaches
                    // each, and all but the owner come here.
                    tracing::debug!(%subject, build = %service, component = %id,
                        "Answer ignored: no such build here.");
                    return step;
                };
                match run.answer(answer, errored, now_ms) {
                    Answered::Applied {
                        latency_ms,
                        errored,
                    } => {
                        step.answered.push((errored, latency_ms));
                        let result = if errored { "error" } else { "done" };
                        tracing::info!(build = %service, component = %id, %subject, result,
                            duration_s = latency_ms as f64 / 1000.0, "Component {result}.");
                        let out = run.pump(now_ms);
                        step.absorb(run, out);
                    }
                    Answered::Duplicate => {
                        tracing::info!(%subject, build = %service, component = %id,
                            "Answer ignored: the component is not running (a duplicate, or late).");
                    }
                    Answered::Unknown => {
                        tracing::info!(%subject, build = %service, component = %id,
                            "Answer ignored: the build has no such component.");
                    }
                }
            }
            Subject::Other => {}
        }
        self.forget_sent();
        step
    }

    /// Times out the components whose deadline passed.
    pub(crate) fn tick(&mut self, now_ms: u64) -> Step {
        let mut step = Step::default();
        for run in self.runs.values_mut() {
            if run.next_deadline().is_none_or(|d| d > now_ms) {
                continue;
            }
            for id in run.expire(now_ms) {
                tracing::warn!(build = %run.id(), component = %id,
                    timeout_s = run.component_timeout_ms / 1000, "Component timed out.");
                step.answered.push((true, run.component_timeout_ms));
            }
            let out = run.pump(now_ms);
            step.absorb(run, out);
        }
        step
    }

    /// The earliest deadline of any running component.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.runs.values().filter_map(BuildRun::next_deadline).min()
    }

    pub fn run(&self, id: &str) -> Option<&BuildRun> {
        self.runs.get(id)
    }

    /// For writing a run: [`BuildRun::take_delta`] and [`BuildRun::clear_delta`].
    pub(crate) fn run_mut(&mut self, id: &str) -> Option<&mut BuildRun> {
        self.runs.get_mut(id)
    }

    /// The terminal message of `id` was published and flushed.
    pub(crate) fn mark_sent(&mut self, id: &str) {
        if let Some(run) = self.runs.get_mut(id) {
            run.mark_sent();
        }
    }

    /// Finished runs whose result went out are kept on disk only.
    fn forget_sent(&mut self) {
        self.runs
            .retain(|_, r| r.result.as_ref().is_none_or(|res| res.sent != Sent::Sent));
    }

    /// Builds whose result was handed out for publishing and not flushed yet.
    pub(crate) fn sending(&self) -> Vec<String> {
        self.runs
            .values()
            .filter(|r| {
                r.result
                    .as_ref()
                    .is_some_and(|res| res.sent == Sent::Sending)
            })
            .map(|r| r.id().to_string())
            .collect()
    }

    /// Drops finished runs whose result was sent (after their file was written).
    pub(crate) fn forget_finished(&mut self) {
        self.forget_sent();
    }

    /// Components dispatched and not answered, over every build.
    pub fn in_flight(&self) -> usize {
        self.runs.values().map(BuildRun::in_flight).sum()
    }

    /// Builds not finished.
    pub fn unfinished(&self) -> usize {
        self.runs.values().filter(|r| !r.finished()).count()
    }
}

pub mod build_retention;
pub mod executor_loop;
pub mod template;

#[cfg(test)]
mod tests;
