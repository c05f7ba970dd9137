//! What the Kubernetes API and Prometheus answer, read into a [`Snapshot`] the way wca's
//! `ClusterDataProvider` (and `ClusterScoreDataProvider`) reads it. Pure: the caller does the
//! HTTP and hands over the bodies.
//!
//! - Kubernetes: [`parse_node_list`] (CPU and memory capacity, control-plane nodes skipped),
//!   [`parse_pod_list`] and [`parse_watch_line`] into a [`PodIndex`] keyed by pod uid, so a watch
//!   event (a pod bound to a node, deleted, relabelled) changes the counts at once and exactly.
//! - Prometheus: [`parse_query_reply`] (an instant query's JSON) into [`Sample`]s;
//!   [`plan_queries`] says which queries a provider runs for the algorithm's dimensions and
//!   [`PromData::read`] interprets their results.
//! - [`combine`] puts both together as wca does (DRAM nodes 200/200 bandwidth, PMEM nodes'
//!   bandwidth and WSS from the queries truncated to integers, requests as they come).
//!
//! Where wca would crash on odd input (a node without a memory capacity, a series without the
//! label the query groups by) the whole answer is refused with a [`SourceError`] naming the
//! object, so the caller keeps its last good data and reports the error.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;

use crate::config::{ProviderKind, Queries};
use crate::snapshot::{Assigned, Dim, NodeFacts, NodeType, Snapshot};

/// wca's read and write bandwidth of a DRAM-only node, in GB/s, when no query gives it.
pub(crate) const DRAM_MEMBW_DEFAULT: f64 = 200.0;
/// `ClusterScoreDataProvider`'s node types: one query for all nodes (labels `nodename`,
/// `nodetype` = `pmem` or `dram`), as wca's newer code runs it.
pub(crate) const NODE_TYPES_QUERY: &str = "node_type";
/// Nodes carrying one of these labels are control-plane nodes and are left out, as wca leaves
/// out `node-role.kubernetes.io/master` (newer clusters label them `control-plane` only).
pub(crate) const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/master",
    "node-role.kubernetes.io/control-plane",
];
/// The label that names a pod's app.
pub(crate) const APP_LABEL: &str = "app";
/// The label node-level queries group by.
pub(crate) const NODE_LABEL: &str = "nodename";

/// Why a source's answer could not be used. The I/O side builds the transport variants; the
/// parsers here return the others.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SourceError {
    /// Config or local files: no host, an unreadable token or CA file, a bad URL.
    #[error("{0}")]
    Setup(String),
    /// Connection refused, reset, a TLS failure.
    #[error("{url}: cannot connect: {message}")]
    Connect { url: String, message: String },
    /// No complete answer within the time limit.
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    /// An HTTP status other than 200 (the body's start, for the reason).
    #[error("{url}: HTTP {status}{}", if body.is_empty() { String::new() } else { format!(": {body}") })]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    /// A watch that can no longer resume from its resource version (HTTP 410 or an ERROR event
    /// with code 410): list again.
    #[error("{what}: resource version too old (410 Gone): {message}")]
    Gone { what: String, message: String },
    /// A body that is not the JSON the API speaks.
    #[error("{what}: not the expected JSON: {message}")]
    BadReply { what: String, message: String },
    /// Prometheus answered `"status": "error"`.
    #[error("prometheus: {error_type}: {error}")]
    Prometheus { error_type: String, error: String },
    /// Well-formed JSON whose content cannot be used (a node without capacity, a series
    /// without its label, a value that is not a number).
    #[error("{0}")]
    Data(String),
}

impl SourceError {
    /// A short, bounded name for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceError::Setup(_) => "setup",
            SourceError::Connect { .. } => "connect",
            SourceError::Timeout { .. } => "timeout",
            SourceError::Status { .. } => "http_status",
            SourceError::Gone { .. } => "gone",
            SourceError::BadReply { .. } => "bad_reply",
            SourceError::Prometheus { .. } => "prometheus_error",
            SourceError::Data(_) => "bad_data",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes quantities

/// A Kubernetes quantity (`4`, `500m`, `1.5`, `16Gi`, `8000000Ki`, `1e3`, `2k`) as a number of
/// base units; `None` when it is not one.
pub(crate) fn parse_quantity(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if number.is_empty() || number == "+" || number == "-" {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0_f64.powi(2),
        "Gi" => 1024.0_f64.powi(3),
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => {
            let power: i32 = exp[1..].parse().ok()?;
            10f64.powi(power)
        }
        _ => return None,
    };
    let out = value * factor;
    out.is_finite().then_some(out)
}

/// A memory quantity in whole GB, as wca converts `Ki`: `int(bytes / 1e9)`.
pub(crate) fn memory_gb(text: &str) -> Option<f64> {
    parse_quantity(text).map(|bytes| (bytes / 1e9).trunc())
}

// ---------------------------------------------------------------------------------------------
// Kubernetes objects (only the fields read)

#[derive(Debug, Default, Deserialize)]
struct ObjectMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(bound = "T: Deserialize<'de>")]
struct List<T> {
    #[serde(default)]
    items: Option<Vec<T>>,
    #[serde(default)]
    metadata: ObjectMeta,
}

/// A quantity as the API sends it (a string), or a bare number from a lenient server.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Quantity {
    Text(String),
    Number(f64),
}

impl Quantity {
    fn text(&self) -> String {
        match self {
            Quantity::Text(t) => t.clone(),
            Quantity::Number(n) => n.to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct KubeNode {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<NodeStatus>,
}

#[derive(Debug, Deserialize)]
struct NodeStatus {
    #[serde(default)]
    capacity: Option<BTreeMap<String, Quantity>>,
}

#[derive(Debug, Deserialize)]
struct KubePod {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<PodSpec>,
    #[serde(default)]
    status: Option<PodStatus>,
}

#[derive(Debug, Deserialize)]
struct PodSpec {
    #[serde(default, rename = "nodeName")]
    node_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct PodStatus {
    #[serde(default)]
    phase: Option<String>,
}

/// CPU (cores) and memory (whole GB) of a node, from `status.capacity`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeCapacity {
    pub(crate) cpu: f64,
    pub(crate) mem: f64,
}

/// `/api/v1/nodes`, read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Nodes {
    /// Worker nodes and their capacity.
    pub capacity: BTreeMap<String, NodeCapacity>,
    /// Control-plane nodes, left out (their pods are not counted either).
    pub(crate) control_plane: BTreeSet<String>,
}

fn bad_json(what: &str, e: serde_json::Error) -> SourceError {
    SourceError::BadReply {
        what: what.to_owned(),
        message: e.to_string(),
    }
}

/// A v1 list's items and metadata; a body that is not one, or a list without `items`, is refused.
fn parse_list<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> Result<(Vec<T>, ObjectMeta), SourceError> {
    let list: List<T> = serde_json::from_slice(body).map_err(|e| bad_json(what, e))?;
    let items = list.items.ok_or_else(|| SourceError::BadReply {
        what: what.into(),
        message: "no `items`".into(),
    })?;
    Ok((items, list.metadata))
}

/// A v1 `NodeList`: each worker node's `status.capacity` `cpu` (cores) and `memory` (whole GB).
/// A node without either, or with one that is not a quantity, refuses the whole list.
pub fn parse_node_list(body: &[u8]) -> Result<Nodes, SourceError> {
    const WHAT: &str = "node list";
    let (items, _) = parse_list::<KubeNode>(body, WHAT)?;
    let mut nodes = Nodes::default();
    for (i, node) in items.into_iter().enumerate() {
        let name = node
            .metadata
            .name
            .ok_or_else(|| SourceError::Data(format!("node list: item {i} has no name")))?;
        let labels = node.metadata.labels.unwrap_or_default();
        if CONTROL_PLANE_LABELS.iter().any(|l| labels.contains_key(*l)) {
            nodes.control_plane.insert(name);
            continue;
        }
        let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
        let read = |key: &str, convert: fn(&str) -> Option<f64>| -> Result<f64, SourceError> {
            let q = capacity.get(key).ok_or_else(|| {
                SourceError::Data(format!("node {name}: no status.capacity.{key}"))
            })?;
            let text = q.text();
            convert(&text).ok_or_else(|| {
                SourceError::Data(format!(
                    "node {name}: status.capacity.{key} {text:?} is not a quantity"
                ))
            })
        };
        let cpu = read("cpu", parse_quantity)?;
        let mem = read("memory", memory_gb)?;
        nodes.capacity.insert(name, NodeCapacity { cpu, mem });
    }
    Ok(nodes)
}

/// A pod as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub(crate) uid: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// The `app` label; pods without it are not counted.
    pub(crate) app: Option<String>,
    /// `spec.nodeName`: set when the pod is bound to a node.
    pub(crate) node: Option<String>,
    /// `Succeeded` or `Failed`: holds nothing on its node any more.
    pub(crate) finished: bool,
}

impl Pod {
    /// Whether it counts on a node: the `app` label, bound, not finished.
    pub(crate) fn counted_on(&self) -> Option<(&str, &str)> {
        match (&self.node, &self.app, self.finished) {
            (Some(node), Some(app), false) => Some((node, app)),
            _ => None,
        }
    }
}

fn read_pod(pod: KubePod, what: &str) -> Result<Pod, SourceError> {
    let meta = pod.metadata;
    let name = meta
        .name
        .ok_or_else(|| SourceError::Data(format!("{what}: a pod without a name")))?;
    let namespace = meta.namespace.unwrap_or_default();
    // Without a uid (a hand-written test double, say) the name identifies it in its namespace.
    let uid = meta.uid.unwrap_or_else(|| format!("{namespace}/{name}"));
    let app = meta
        .labels
        .and_then(|mut l| l.remove(APP_LABEL))
        .filter(|a| !a.is_empty());
    let node = pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty());
    let finished = matches!(
        pod.status.and_then(|s| s.phase).as_deref(),
        Some("Succeeded" | "Failed")
    );
    Ok(Pod {
        uid,
        namespace,
        name,
        app,
        node,
        finished,
    })
}

/// A v1 `PodList` (one namespace): its pods and the list's `resourceVersion` to watch from.
pub fn parse_pod_list(body: &[u8]) -> Result<(Vec<Pod>, Option<String>), SourceError> {
    const WHAT: &str = "pod list";
    let (items, metadata) = parse_list::<KubePod>(body, WHAT)?;
    let pods = items
        .into_iter()
        .map(|p| read_pod(p, WHAT))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((pods, metadata.resource_version))
}

/// One line of a pod watch (`?watch=1`).
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// `ADDED` or `MODIFIED`: the pod as it is now.
    Upsert {
        pod: Pod,
        resource_version: Option<String>,
    },
    /// `DELETED`.
    Deleted {
        pod: Pod,
        resource_version: Option<String>,
    },
    /// `BOOKMARK`: nothing changed up to this resource version.
    Bookmark { resource_version: Option<String> },
    /// `ERROR`: the watch ends; `code` 410 means list again.
    Error { code: Option<u16>, message: String },
}

impl WatchEvent {
    /// The resource version to resume from after this event.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            WatchEvent::Upsert {
                resource_version, ..
            }
            | WatchEvent::Deleted {
                resource_version, ..
            }
            | WatchEvent::Bookmark { resource_version } => resource_version.as_deref(),
            WatchEvent::Error { .. } => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct Status {
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// One JSON line of a watch stream.
pub fn parse_watch_line(line: &[u8]) -> Result<WatchEvent, SourceError> {
    const WHAT: &str = "pod watch";
    let raw: RawEvent = serde_json::from_slice(line).map_err(|e| bad_json(WHAT, e))?;
    let pod = |object: serde_json::Value| -> Result<(Pod, Option<String>), SourceError> {
        let pod: KubePod = serde_json::from_value(object).map_err(|e| bad_json(WHAT, e))?;
        let rv = pod.metadata.resource_version.clone();
        Ok((read_pod(pod, WHAT)?, rv))
    };
    match raw.kind.as_str() {
        "ADDED" | "MODIFIED" => {
            let (pod, resource_version) = pod(raw.object)?;
            Ok(WatchEvent::Upsert {
                pod,
                resource_version,
            })
        }
        "DELETED" => {
            let (pod, resource_version) = pod(raw.object)?;
            Ok(WatchEvent::Deleted {
                pod,
                resource_version,
            })
        }
        "BOOKMARK" => {
            let meta: ObjectMeta = raw
                .object
                .get("metadata")
                .cloned()
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| bad_json(WHAT, e))?
                .unwrap_or_default();
            Ok(WatchEvent::Bookmark {
                resource_version: meta.resource_version,
            })
        }
        "ERROR" => {
            let status: Status =
                serde_json::from_value(raw.object).map_err(|e| bad_json(WHAT, e))?;
            let message = [status.reason, status.message]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ");
            Ok(WatchEvent::Error {
                code: status.code,
                message,
            })
        }
        other => Err(SourceError::BadReply {
            what: WHAT.into(),
            message: format!("unknown event type {other:?}"),
        }),
    }
}

/// The pods of the monitored namespaces, keyed by uid: a list replaces a namespace's pods, a
/// watch event changes one pod, so counts stay exact whichever comes first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodIndex {
    pods: BTreeMap<String, Pod>,
}

impl PodIndex {
    /// Replaces every pod of `namespace` with `pods` (a fresh list).
    pub fn replace_namespace(&mut self, namespace: &str, pods: Vec<Pod>) {
        self.pods.retain(|_, p| p.namespace != namespace);
        for pod in pods {
            self.pods.insert(pod.uid.clone(), pod);
        }
    }

    /// Applies a watch event; `true` when a count may have changed.
    pub fn apply(&mut self, event: &WatchEvent) -> bool {
        match event {
            WatchEvent::Upsert { pod, .. } => {
                let before = self.pods.insert(pod.uid.clone(), pod.clone());
                before.as_ref().and_then(Pod::counted_on) != pod.counted_on()
            }
            WatchEvent::Deleted { pod, .. } => self
                .pods
                .remove(&pod.uid)
                .is_some_and(|p| p.counted_on().is_some()),
            WatchEvent::Bookmark { .. } | WatchEvent::Error { .. } => false,
        }
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// `{node: {app: count}}` of the counted pods, leaving out the nodes in `skip`.
    pub(crate) fn assigned_apps(
        &self,
        skip: &BTreeSet<String>,
    ) -> BTreeMap<String, BTreeMap<String, Assigned>> {
        let mut counts: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (node, app) in self.pods.values().filter_map(Pod::counted_on) {
            if skip.contains(node) {
                continue;
            }
            *counts
                .entry(node.to_owned())
                .or_default()
                .entry(app.to_owned())
                .or_default() += 1;
        }
        counts
            .into_iter()
            .map(|(node, apps)| {
                let apps = apps
                    .into_iter()
                    .map(|(app, n)| (app, Assigned::Count(n)))
                    .collect();
                (node, apps)
            })
            .collect()
    }
}

/// Everything read from the Kubernetes API.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeData {
    pub nodes: Nodes,
    pub pods: PodIndex,
}

// ---------------------------------------------------------------------------------------------
// Prometheus

/// One series of an instant query's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub metric: BTreeMap<String, String>,
    /// The value; `NaN` and the infinities as Prometheus writes them (`"NaN"`, `"+Inf"`).
    pub value: f64,
}

#[derive(Debug, Deserialize)]
struct QueryReply {
    status: String,
    #[serde(default)]
    data: Option<QueryData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct QueryData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct VectorItem {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (serde_json::Value, String),
}

fn prom_float(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}

/// An instant query's reply (`GET /api/v1/query`): the series of a `vector` (a `scalar` is one
/// series without labels); `"status": "error"` becomes [`SourceError::Prometheus`].
pub fn parse_query_reply(body: &[u8]) -> Result<Vec<Sample>, SourceError> {
    const WHAT: &str = "prometheus reply";
    let bad = |message: String| SourceError::BadReply {
        what: WHAT.into(),
        message,
    };
    let reply: QueryReply = serde_json::from_slice(body).map_err(|e| bad_json(WHAT, e))?;
    if reply.status != "success" {
        return Err(SourceError::Prometheus {
            error_type: reply.error_type.unwrap_or_else(|| reply.status.clone()),
            error: reply.error.unwrap_or_default(),
        });
    }
    let data = reply.data.ok_or_else(|| bad("no `data`".into()))?;
    let value = |text: &str| prom_float(text).ok_or_else(|| bad(format!("value {text:?}")));
    match data.result_type.as_str() {
        "vector" => {
            let items: Vec<VectorItem> =
                serde_json::from_value(data.result).map_err(|e| bad_json(WHAT, e))?;
            items
                .into_iter()
                .map(|item| {
                    Ok(Sample {
                        value: value(&item.value.1)?,
                        metric: item.metric,
                    })
                })
                .collect()
        }
        "scalar" => {
            let (_, text): (serde_json::Value, String) =
                serde_json::from_value(data.result).map_err(|e| bad_json(WHAT, e))?;
            Ok(vec![Sample {
                metric: BTreeMap::new(),
                value: value(&text)?,
            }])
        }
        other => Err(bad(format!(
            "result type {other:?}; an instant query of a vector is needed"
        ))),
    }
}

/// What a query is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QueryKind {
    /// `NODES_PMM_MEMORY_MODE`: nodes with PMEM in memory mode.
    PmemNodes,
    /// `MEMBW_CAPACITY_READ` of PMEM nodes.
    MembwCapacityRead,
    /// `MEMBW_CAPACITY_WRITE` of PMEM nodes.
    MembwCapacityWrite,
    /// `NODE_CAPACITY_MEM_WSS` of PMEM nodes.
    NodeCapacityWss,
    /// `NODE_CAPACITY_DRAM_MEMBW`: read and write bandwidth of DRAM nodes.
    NodeCapacityDramMembw,
    /// `APP_REQUESTED_RESOURCES_QUERY_MAP[dim]`.
    AppRequest(Dim),
    /// The DRAM hit ratio of nodes.
    DramHitRatio,
    /// Score's app profiles (label `app`).
    AppProfiles,
    /// Score's node types (labels `nodename`, `nodetype`).
    NodeTypes,
}

impl QueryKind {
    /// What the query gives, with its unit, as `verwalter check --placement-config` shows it.
    pub(crate) fn describe(self) -> String {
        use crate::config::unit_of;
        match self {
            QueryKind::PmemNodes => "PMEM nodes (NODES_PMM_MEMORY_MODE)".into(),
            QueryKind::MembwCapacityRead => {
                "PMEM nodes' read bandwidth, GB/s (MEMBW_CAPACITY_READ)".into()
            }
            QueryKind::MembwCapacityWrite => {
                "PMEM nodes' write bandwidth, GB/s (MEMBW_CAPACITY_WRITE)".into()
            }
            QueryKind::NodeCapacityWss => "PMEM nodes' WSS, GB (NODE_CAPACITY_MEM_WSS)".into(),
            QueryKind::NodeCapacityDramMembw => {
                "DRAM nodes' bandwidth, GB/s (NODE_CAPACITY_DRAM_MEMBW)".into()
            }
            QueryKind::AppRequest(dim) => format!(
                "app requests {dim}, {} (APP_REQUESTED_RESOURCES_QUERY_MAP)",
                unit_of(dim)
            ),
            QueryKind::DramHitRatio => "DRAM hit ratio (NODES_DRAM_HIT_RATIO)".into(),
            QueryKind::AppProfiles => "app profiles (Score)".into(),
            QueryKind::NodeTypes => "node types (Score)".into(),
        }
    }
}

/// A query to run, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedQuery {
    pub kind: QueryKind,
    pub promql: String,
}

fn has(dims: &[Dim], d: Dim) -> bool {
    dims.contains(&d)
}

fn membw(dims: &[Dim]) -> bool {
    has(dims, Dim::MembwRead) && has(dims, Dim::MembwWrite)
}

/// The queries a provider of `kind` runs for an algorithm over `dims`, as wca runs them: the
/// PMEM and bandwidth queries only with both bandwidth dimensions (WSS also with `wss`), one
/// request query per dimension, the DRAM hit ratio, and Score's two with `ClusterScore`. A
/// dimension without a request query is an error.
pub fn plan_queries(
    kind: ProviderKind,
    queries: &Queries,
    dims: &[Dim],
) -> Result<Vec<PlannedQuery>, SourceError> {
    let mut plan = Vec::new();
    let mut add = |kind, promql: &str| {
        plan.push(PlannedQuery {
            kind,
            promql: promql.to_owned(),
        })
    };
    if membw(dims) || has(dims, Dim::Wss) {
        add(QueryKind::PmemNodes, &queries.nodes_pmm_memory_mode);
    }
    if membw(dims) {
        add(QueryKind::MembwCapacityRead, &queries.membw_capacity_read);
        add(QueryKind::MembwCapacityWrite, &queries.membw_capacity_write);
        if let Some(q) = &queries.node_capacity_dram_membw {
            add(QueryKind::NodeCapacityDramMembw, q);
        }
    }
    if has(dims, Dim::Wss) {
        add(QueryKind::NodeCapacityWss, &queries.node_capacity_mem_wss);
    }
    for &dim in dims {
        let q = queries.app_requested_resources.get(&dim).ok_or_else(|| {
            SourceError::Setup(format!(
                "no APP_REQUESTED_RESOURCES_QUERY_MAP entry for dimension {dim}"
            ))
        })?;
        add(QueryKind::AppRequest(dim), q);
    }
    add(QueryKind::DramHitRatio, &queries.nodes_dram_hit_ratio);
    if kind == ProviderKind::ClusterScore {
        add(QueryKind::AppProfiles, crate::config::APP_PROFILES_QUERY);
        add(QueryKind::NodeTypes, NODE_TYPES_QUERY);
    }
    Ok(plan)
}

/// The query results, interpreted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromData {
    /// Nodes with PMEM in memory mode; `None` when not asked (no bandwidth or WSS dimension).
    pub(crate) pmem_nodes: Option<BTreeSet<String>>,
    pub(crate) membw_read: BTreeMap<String, f64>,
    pub(crate) membw_write: BTreeMap<String, f64>,
    pub(crate) wss: BTreeMap<String, f64>,
    /// From `NODE_CAPACITY_DRAM_MEMBW` when configured.
    pub(crate) dram_membw: BTreeMap<String, f64>,
    /// `{app: {dim: request}}`, as the queries answer them (wca takes `float(value)`: a request
    /// of 0.5 cores or 0.25 GB must not become 0).
    pub(crate) app_requests: BTreeMap<String, BTreeMap<Dim, f64>>,
    pub(crate) dram_hit_ratio: BTreeMap<String, f64>,
    pub(crate) app_profiles: BTreeMap<String, f64>,
    pub(crate) node_types: BTreeMap<String, NodeType>,
}

fn label<'a>(q: &PlannedQuery, s: &'a Sample, name: &str) -> Result<&'a str, SourceError> {
    s.metric.get(name).map(String::as_str).ok_or_else(|| {
        SourceError::Data(format!(
            "query {:?}: a series without the label {name} ({:?})",
            q.promql, s.metric
        ))
    })
}

fn finite(q: &PlannedQuery, s: &Sample) -> Result<f64, SourceError> {
    if s.value.is_finite() {
        Ok(s.value)
    } else {
        Err(SourceError::Data(format!(
            "query {:?}: value {} for {:?} is not a number",
            q.promql, s.value, s.metric
        )))
    }
}

impl PromData {
    /// Reads the results of [`plan_queries`]'s queries. Node-level series must carry
    /// `nodename` and app-level ones `app` (request series without `app` are skipped, as wca
    /// skips them); values must be finite.
    pub fn read(results: &[(PlannedQuery, Vec<Sample>)]) -> Result<PromData, SourceError> {
        let mut data = PromData::default();
        for (q, samples) in results {
            let per_node = |truncate: bool| -> Result<BTreeMap<String, f64>, SourceError> {
                samples
                    .iter()
                    .map(|s| {
                        let v = finite(q, s)?;
                        Ok((
                            label(q, s, NODE_LABEL)?.to_owned(),
                            if truncate { v.trunc() } else { v },
                        ))
                    })
                    .collect()
            };
            match q.kind {
                QueryKind::PmemNodes => {
                    data.pmem_nodes = Some(
                        samples
                            .iter()
                            .map(|s| label(q, s, NODE_LABEL).map(str::to_owned))
                            .collect::<Result<_, _>>()?,
                    );
                }
                QueryKind::MembwCapacityRead => data.membw_read = per_node(true)?,
                QueryKind::MembwCapacityWrite => data.membw_write = per_node(true)?,
                QueryKind::NodeCapacityWss => data.wss = per_node(true)?,
                QueryKind::NodeCapacityDramMembw => data.dram_membw = per_node(true)?,
                QueryKind::DramHitRatio => data.dram_hit_ratio = per_node(false)?,
                QueryKind::AppRequest(dim) => {
                    for s in samples {
                        let Some(app) = s.metric.get(APP_LABEL) else {
                            continue;
                        };
                        let v = finite(q, s)?;
                        data.app_requests
                            .entry(app.clone())
                            .or_default()
                            .insert(dim, v);
                    }
                }
                QueryKind::AppProfiles => {
                    for s in samples {
                        let app = label(q, s, APP_LABEL)?.to_owned();
                        data.app_profiles.insert(app, finite(q, s)?);
                    }
                }
                QueryKind::NodeTypes => {
                    for s in samples {
                        let node = label(q, s, NODE_LABEL)?.to_owned();
                        let t = match label(q, s, "nodetype")? {
                            "pmem" => NodeType::Pmem,
                            "dram" => NodeType::Dram,
                            other => {
                                return Err(SourceError::Data(format!(
                                    "query {:?}: node {node} has nodetype {other:?}, \
                                     not pmem or dram",
                                    q.promql
                                )));
                            }
                        };
                        data.node_types.insert(node, t);
                    }
                }
            }
        }
        Ok(data)
    }
}

// ---------------------------------------------------------------------------------------------
// Both together

/// The snapshot wca's provider would return for `dims`: worker nodes' CPU and memory from the
/// Kubernetes API; with both bandwidth dimensions, PMEM nodes' bandwidth from the capacity
/// queries and DRAM nodes' from `NODE_CAPACITY_DRAM_MEMBW` or 200/200; with `wss`, PMEM nodes'
/// WSS from its query and DRAM nodes' equal to their memory; pods counted per node and app;
/// apps' requests, DRAM hit ratios, and (Score) app profiles and node types from Prometheus.
/// A node's type is Score's `node_type` where given, else PMEM or DRAM by the PMEM query.
/// Without Prometheus (`None`), nodes are DRAM nodes and apps have no requests.
pub fn combine(kube: &KubeData, prom: Option<&PromData>, dims: &[Dim]) -> Snapshot {
    let empty = PromData::default();
    let p = prom.unwrap_or(&empty);
    let is_pmem = |node: &str| p.pmem_nodes.as_ref().is_some_and(|s| s.contains(node));
    let mut snap = Snapshot::default();
    for (node, cap) in &kube.nodes.capacity {
        let mut caps = BTreeMap::from([(Dim::Cpu, cap.cpu), (Dim::Mem, cap.mem)]);
        let pmem = is_pmem(node);
        if membw(dims) {
            if pmem {
                if let Some(&r) = p.membw_read.get(node) {
                    caps.insert(Dim::MembwRead, r);
                }
                if let Some(&w) = p.membw_write.get(node) {
                    caps.insert(Dim::MembwWrite, w);
                }
            } else {
                let bw = p
                    .dram_membw
                    .get(node)
                    .copied()
                    .unwrap_or(DRAM_MEMBW_DEFAULT);
                caps.insert(Dim::MembwRead, bw);
                caps.insert(Dim::MembwWrite, bw);
            }
        }
        if has(dims, Dim::Wss) {
            let wss = if pmem {
                p.wss.get(node).copied()
            } else {
                Some(cap.mem)
            };
            if let Some(w) = wss {
                caps.insert(Dim::Wss, w);
            }
        }
        snap.node_capacities.insert(node.clone(), caps);
        let node_type = p.node_types.get(node).copied().or_else(|| {
            p.pmem_nodes.as_ref().map(|s| {
                if s.contains(node) {
                    NodeType::Pmem
                } else {
                    NodeType::Dram
                }
            })
        });
        let facts = NodeFacts {
            platform_dram_hit_ratio: p.dram_hit_ratio.get(node).copied(),
            node_type,
        };
        if facts != NodeFacts::default() {
            snap.nodes.insert(node.clone(), facts);
        }
    }
    snap.assigned_apps = kube.pods.assigned_apps(&kube.nodes.control_plane);
    snap.apps_spec = p.app_requests.clone();
    snap.app_profiles = p.app_profiles.clone();
    snap
}

#[cfg(test)]
mod tests;
