//! The Kubernetes scheduler extender without I/O: its wire types and what to answer.
//!
//! kube-scheduler POSTs an [`ExtenderArgs`] (the pod, and the candidate nodes as `NodeNames`, or
//! as a full `Nodes` list when the extender is not `nodeCacheCapable`) to `/filter` and
//! `/prioritize`. [`filter`] answers an [`ExtenderFilterResult`] and [`prioritize`] a list of
//! [`HostPriority`]; both take the algorithm, the snapshot in force (none before the first load)
//! and the namespaces to schedule.
//!
//! The rules (also in `docs/placement.md`, "Extender"):
//! - A pod outside the scheduled namespaces, or without an `app` label, passes through: filter
//!   keeps every node, prioritize answers `[]` (no opinion), as wca does.
//! - Before the first snapshot, filter answers with an in-band `Error` (kube-scheduler then fails
//!   that scheduling attempt and retries, or skips the extender when it is `ignorable`);
//!   prioritize, whose reply has no error field, answers `[]`.
//! - An app the snapshot has no request for (`apps_spec`) passes through like a pod without the
//!   label: a new app has no history in Prometheus yet, and refusing it would keep it from ever
//!   being scheduled (wca failed the request). The verdict says so, for the log and metrics.
//! - Scores are mapped into kube-scheduler's 0..=10 by [`kube_score`]: rescaled by the
//!   algorithm's best possible score, then clamped.
//! - `NodeNames` is always an array: kube-scheduler takes a `null` as "no node fits".

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::algorithms::{Algorithm, PlacementError};
use crate::snapshot::{Snapshot, Usage};

/// kube-scheduler's `MaxExtenderPriority`: an extender's scores go from 0 to this.
pub(crate) const MAX_EXTENDER_PRIORITY: i64 = 10;
/// The namespace wca schedules when none are configured.
pub(crate) const DEFAULT_NAMESPACE: &str = "default";
/// The pod label that names its app (as wca reads it).
pub(crate) const APP_LABEL: &str = "app";

/// What kube-scheduler sends (`ExtenderArgs`). Keys are Go field names (`Pod`, `Nodes`,
/// `NodeNames`), matched without regard to case as Go's decoder does; other keys are ignored.
#[derive(Debug, Default)]
pub struct ExtenderArgs {
    pub pod: Pod,
    /// The full node objects, sent when the extender is not `nodeCacheCapable`.
    pub(crate) nodes: Option<NodeList>,
    /// The candidate names, sent when it is.
    pub(crate) node_names: Option<Vec<String>>,
}

/// The part of a `v1.Pod` the extender reads.
#[derive(Debug, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
}

/// The part of a `v1.ObjectMeta` the extender reads (`null` taken as missing).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ObjectMeta {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    #[serde(default)]
    pub(crate) labels: Option<BTreeMap<String, String>>,
}

impl Pod {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("")
    }
    /// The `app` label, if set and not empty.
    pub fn app(&self) -> Option<&str> {
        let app = self.metadata.labels.as_ref()?.get(APP_LABEL)?;
        (!app.is_empty()).then_some(app.as_str())
    }
}

/// A `v1.NodeList`: only the items matter; each is kept as sent, to be echoed back.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct NodeList {
    #[serde(default)]
    pub(crate) items: Vec<Node>,
}

/// One `v1.Node` as sent: its name, and the whole object unparsed.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) raw: Box<RawValue>,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        #[derive(Deserialize)]
        struct Named {
            metadata: NameOnly,
        }
        #[derive(Deserialize)]
        struct NameOnly {
            name: String,
        }
        let raw = Box::<RawValue>::deserialize(d)?;
        let named: Named = serde_json::from_str(raw.get())
            .map_err(|e| de::Error::custom(format_args!("a Node needs metadata.name: {e}")))?;
        Ok(Node {
            name: named.metadata.name,
            raw,
        })
    }
}

impl<'de> Deserialize<'de> for ExtenderArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ExtenderArgs, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ExtenderArgs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object with Pod and NodeNames or Nodes")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ExtenderArgs, A::Error> {
                let mut pod = None;
                let mut args = ExtenderArgs::default();
                while let Some(key) = map.next_key::<String>()? {
                    // Go's encoding/json matches keys case-insensitively; the last one wins.
                    match key.to_ascii_lowercase().as_str() {
                        "pod" => pod = Some(map.next_value()?),
                        "nodes" => args.nodes = map.next_value()?,
                        "nodenames" => args.node_names = map.next_value()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                args.pod = pod.ok_or_else(|| de::Error::missing_field("Pod"))?;
                Ok(args)
            }
        }
        d.deserialize_map(V)
    }
}

/// A request body that is not an `ExtenderArgs`: where and what.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct WireError {
    /// The field, like `Pod.metadata.labels.app` or `NodeNames[2]`; empty for the whole body.
    pub path: String,
    pub(crate) message: String,
}

impl ExtenderArgs {
    /// Parses a request body; an error names the bad field.
    pub fn from_json(body: &[u8]) -> Result<ExtenderArgs, WireError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let args: ExtenderArgs =
            serde_path_to_error::deserialize(&mut de).map_err(|e| WireError {
                path: match e.path().to_string() {
                    p if p == "." || p == "?" => String::new(),
                    p => p,
                },
                message: e.into_inner().to_string(),
            })?;
        de.end().map_err(|e| WireError {
            path: String::new(),
            message: e.to_string(),
        })?;
        Ok(args)
    }

    /// The candidate node names: `NodeNames` when sent, else the names of `Nodes`.
    pub fn candidates(&self) -> Vec<&str> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.iter().map(String::as_str).collect(),
            (None, Some(list)) => list.items.iter().map(|n| n.name.as_str()).collect(),
            (None, None) => Vec::new(),
        }
    }

    /// The candidate names as the algorithms take them: `NodeNames` itself when sent (no copy).
    fn candidate_names(&self) -> Cow<'_, [String]> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => Cow::Borrowed(names),
            (None, Some(list)) => Cow::Owned(list.items.iter().map(|n| n.name.clone()).collect()),
            (None, None) => Cow::Borrowed(&[]),
        }
    }
}

/// What `/filter` answers (`ExtenderFilterResult`), keys as kube-scheduler's Go struct names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ExtenderFilterResult {
    /// The kept node objects, only when the request sent a full `Nodes` list (kube-scheduler
    /// without `nodeCacheCapable` reads this one); `null` otherwise.
    #[serde(rename = "Nodes")]
    pub(crate) nodes: Option<NodeListReply>,
    /// The kept node names: always an array.
    #[serde(rename = "NodeNames")]
    pub node_names: Vec<String>,
    /// Refused nodes with the reason.
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: BTreeMap<String, String>,
    /// Never filled: the algorithms do not tell nodes that preemption could help from others.
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub(crate) failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Non-empty fails kube-scheduler's call (e.g. before the data is loaded).
    #[serde(rename = "Error")]
    pub(crate) error: String,
}

/// A `v1.NodeList` of node objects as the request sent them.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct NodeListReply {
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) items: Vec<Box<RawValue>>,
}

impl PartialEq for NodeListReply {
    fn eq(&self, other: &NodeListReply) -> bool {
        self.metadata == other.metadata
            && self.items.len() == other.items.len()
            && self
                .items
                .iter()
                .zip(&other.items)
                .all(|(a, b)| a.get() == b.get())
    }
}

/// One entry of what `/prioritize` answers (`HostPriorityList`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    /// 0..=[`MAX_EXTENDER_PRIORITY`].
    #[serde(rename = "Score")]
    pub score: i64,
}

/// Why the reply is what it is; its label is the `result` of the request metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The algorithm decided.
    Decided,
    /// The pod's namespace is not scheduled: passed through.
    OtherNamespace,
    /// The pod has no `app` label: passed through.
    NoApp,
    /// The snapshot has no request for the pod's app: passed through.
    UnknownApp,
    /// No snapshot yet: filter answers an `Error`, prioritize `[]`.
    NotLoaded,
}

impl Verdict {
    pub const ALL: [Verdict; 5] = [
        Verdict::Decided,
        Verdict::OtherNamespace,
        Verdict::NoApp,
        Verdict::UnknownApp,
        Verdict::NotLoaded,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Decided => "decided",
            Verdict::OtherNamespace => "other_namespace",
            Verdict::NoApp => "no_app_label",
            Verdict::UnknownApp => "unknown_app",
            Verdict::NotLoaded => "not_loaded",
        }
    }
}

/// A reply and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision<T> {
    pub reply: T,
    pub verdict: Verdict,
}

/// The in-band error before the first snapshot.
pub const NOT_LOADED: &str =
    "verwalter: the placement data is not loaded yet (no snapshot from the data sources so far)";

/// Which namespaces are scheduled; `[default]` unless configured, as wca.
pub fn default_namespaces() -> Vec<String> {
    vec![DEFAULT_NAMESPACE.to_owned()]
}

/// What stands between the request and the algorithm: the pod's app and the snapshot, or the
/// verdict that passes it by.
fn gate<'a>(
    snapshot: Option<&'a Snapshot>,
    args: &'a ExtenderArgs,
    namespaces: &[String],
) -> Result<(&'a str, &'a Snapshot), Verdict> {
    if !namespaces.iter().any(|n| n == args.pod.namespace()) {
        return Err(Verdict::OtherNamespace);
    }
    let app = args.pod.app().ok_or(Verdict::NoApp)?;
    let snapshot = snapshot.ok_or(Verdict::NotLoaded)?;
    Ok((app, snapshot))
}

/// `/filter`: which candidates the pod may go to. `usage`, when given, must be
/// `Usage::of(snapshot)` (it only makes the decision faster).
pub fn filter(
    algorithm: &Algorithm,
    snapshot: Option<&Snapshot>,
    usage: Option<&Usage>,
    args: &ExtenderArgs,
    namespaces: &[String],
) -> Decision<ExtenderFilterResult> {
    let candidates = args.candidate_names();
    let pass = |verdict: Verdict| {
        let mut reply = kept(args, candidates.to_vec());
        if verdict == Verdict::NotLoaded {
            reply.error = NOT_LOADED.to_owned();
        }
        Decision { reply, verdict }
    };
    let (app, snapshot) = match gate(snapshot, args, namespaces) {
        Ok(found) => found,
        Err(verdict) => return pass(verdict),
    };
    match algorithm.filter_using(snapshot, usage, app, &candidates) {
        Ok(result) => {
            let mut reply = kept(args, result.nodes);
            reply.failed_nodes = result.failed;
            Decision {
                reply,
                verdict: Verdict::Decided,
            }
        }
        Err(PlacementError::UnknownApp { .. }) => pass(Verdict::UnknownApp),
    }
}

/// A filter reply keeping `node_names` (and, when the request sent node objects, those objects).
fn kept(args: &ExtenderArgs, node_names: Vec<String>) -> ExtenderFilterResult {
    let nodes = match (&args.node_names, &args.nodes) {
        (None, Some(list)) => {
            let keep: BTreeSet<&str> = node_names.iter().map(String::as_str).collect();
            Some(NodeListReply {
                metadata: BTreeMap::new(),
                items: list
                    .items
                    .iter()
                    .filter(|n| keep.contains(n.name.as_str()))
                    .map(|n| n.raw.clone())
                    .collect(),
            })
        }
        _ => None,
    };
    ExtenderFilterResult {
        nodes,
        node_names,
        ..ExtenderFilterResult::default()
    }
}

/// `/prioritize`: a score from 0 to 10 for each candidate, in sorted order (`usage` as for
/// [`filter`]).
pub fn prioritize(
    algorithm: &Algorithm,
    snapshot: Option<&Snapshot>,
    usage: Option<&Usage>,
    args: &ExtenderArgs,
    namespaces: &[String],
) -> Decision<Vec<HostPriority>> {
    let pass = |verdict| Decision {
        reply: Vec::new(),
        verdict,
    };
    let (app, snapshot) = match gate(snapshot, args, namespaces) {
        Ok(found) => found,
        Err(verdict) => return pass(verdict),
    };
    match algorithm.prioritize_using(snapshot, usage, app, &args.candidate_names()) {
        Ok(scores) => {
            let ceiling = score_ceiling(algorithm);
            Decision {
                // A node without a known capacity scores the lowest, 0: filter refuses it, and
                // the algorithms would take each of its fractions as 1 (wca fails the request).
                reply: scores
                    .into_iter()
                    .map(|(host, raw)| HostPriority {
                        score: if snapshot.node_capacities.contains_key(&host) {
                            kube_score(raw, ceiling)
                        } else {
                            0
                        },
                        host,
                    })
                    .collect(),
                verdict: Verdict::Decided,
            }
        }
        Err(PlacementError::UnknownApp { .. }) => pass(Verdict::UnknownApp),
    }
}

/// The best raw score the algorithm can give (`priority × max_node_score` at its best
/// priority, [`crate::Kind::score_ceiling`]): `max_node_score` for BAR and LeastUsed,
/// `(least_used_weight + 1) × max_node_score` for LeastUsedBAR and HierBAR, 0 for the algorithms
/// that score everything 0.
pub(crate) fn score_ceiling(algorithm: &Algorithm) -> f64 {
    algorithm.kind.score_ceiling(algorithm.max_node_score)
}

/// An algorithm's raw score in kube-scheduler's range: `floor(raw × 10 / ceiling)`, clamped to
/// 0..=10. Rescaling keeps the order LeastUsedBAR's scores up to 20 have (a clamp alone would
/// tie every node above 10); an overcommitted node's negative score becomes 0. With the default
/// `max_node_score` of 10, BAR and LeastUsed scores pass unchanged. A ceiling of 0 (the
/// algorithm scores nothing) gives 0.
pub(crate) fn kube_score(raw: i64, ceiling: f64) -> i64 {
    if ceiling <= 0.0 || !ceiling.is_finite() {
        return 0;
    }
    let scaled = (raw as f64 * MAX_EXTENDER_PRIORITY as f64 / ceiling).floor();
    (scaled as i64).clamp(0, MAX_EXTENDER_PRIORITY)
}

#[cfg(test)]
mod tests;
