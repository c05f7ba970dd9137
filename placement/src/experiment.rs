//! The simulator's input files: a node set and a task set in YAML, turned into the [`Snapshot`]
//! and the task list [`simulate`](crate::simulate()) runs on.
//!
//! Node set (`nodes.yaml`): `groups` of identical nodes and/or explicit `nodes`:
//!
//! ```yaml
//! groups:
//!   - count: 60               # node00 … node59: zero-padded to the digits of count − 1
//!     name_prefix: node
//!     capacity: {cpu: 40, mem: 192, membw_read: 150, membw_write: 150}
//!     type: dram              # optional: dram | pmem
//! nodes:
//!   - name: big-1
//!     capacity: {cpu: 80, mem: 1000, membw_read: 40, membw_write: 10}
//!     type: pmem
//!     dram_hit_ratio: 0.98    # optional; DramHitRatioProvision and Score read it
//! ```
//!
//! Task set (`tasks.yaml`): task types with their requests and counts, and the order in which
//! the tasks arrive:
//!
//! ```yaml
//! types:
//!   - name: mbw
//!     requests: {cpu: 1, mem: 1, membw_read: 10, membw_write: 5}
//!     count: 100
//!     profile: 2.5            # optional; Score's app profile
//! order: interleaved          # interleaved (default) | sequential | shuffled
//! seed: 7                     # shuffled only, required there
//! ```
//!
//! `interleaved` takes one task of each type in turn, in the listed order, skipping types that
//! ran out; `sequential` takes all of the first type, then all of the next; `shuffled` puts the
//! tasks in the sequential order and shuffles them with Fisher–Yates driven by SplitMix64 seeded
//! with `seed`, the same on every machine and every version.
//!
//! Every error names the line (and column) it is about.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Deserialize;

use crate::snapshot::{Dim, NodeFacts, NodeType, Snapshot};

/// The most bytes a config, node or task file of the simulator may hold: far above any
/// experiment (wca's is 1 KiB), far below what would take the machine's memory.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// The most nodes of a simulation, groups and single nodes together (the simulated cluster is
/// a snapshot in memory: 5,000 nodes is the size benchmarked).
pub(crate) const MAX_NODES: usize = 100_000;
/// The most task instances of a simulation, all types together (each is placed on every
/// algorithm and kept in the report).
pub(crate) const MAX_TASKS: usize = 1_000_000;

/// A node or task file that could not be used: what is wrong and where.
#[derive(Debug, Clone, PartialEq)]
pub struct InputError {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub(crate) column: Option<usize>,
    pub(crate) message: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{l}:{c}: {}", self.message),
            (Some(l), None) => write!(f, "{l}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for InputError {}

impl From<serde_norway::Error> for InputError {
    fn from(err: serde_norway::Error) -> InputError {
        let location = err.location();
        let mut message = err.to_string();
        if let Some(loc) = &location {
            // serde_norway appends the position to the message; it is given apart here.
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message = stripped.to_string();
            }
        }
        InputError {
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
            message,
        }
    }
}

/// The nodes of a simulation.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSet {
    #[serde(default)]
    pub(crate) groups: Vec<NodeGroup>,
    #[serde(default)]
    pub(crate) nodes: Vec<NodeSpec>,
}

/// `count` nodes of one shape, named `name_prefix` + a zero-padded index from 0.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawGroup")]
pub(crate) struct NodeGroup {
    pub(crate) count: usize,
    pub(crate) name_prefix: String,
    pub(crate) capacity: BTreeMap<Dim, f64>,
    pub(crate) node_type: Option<NodeType>,
    pub(crate) dram_hit_ratio: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    count: usize,
    name_prefix: String,
    capacity: BTreeMap<Dim, f64>,
    #[serde(default, rename = "type")]
    node_type: Option<NodeType>,
    #[serde(default)]
    dram_hit_ratio: Option<f64>,
}

impl TryFrom<RawGroup> for NodeGroup {
    type Error = String;
    fn try_from(raw: RawGroup) -> Result<NodeGroup, String> {
        if raw.count == 0 {
            return Err("a group needs a count of at least 1".into());
        }
        if raw.count > MAX_NODES {
            return Err(format!(
                "count: {} is over the limit of {MAX_NODES} nodes",
                raw.count
            ));
        }
        check_amounts("capacity", &raw.capacity)?;
        check_ratio(raw.dram_hit_ratio)?;
        Ok(NodeGroup {
            count: raw.count,
            name_prefix: raw.name_prefix,
            capacity: raw.capacity,
            node_type: raw.node_type,
            dram_hit_ratio: raw.dram_hit_ratio,
        })
    }
}

/// One node given by name.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawNode")]
pub(crate) struct NodeSpec {
    pub(crate) name: String,
    pub(crate) capacity: BTreeMap<Dim, f64>,
    pub(crate) node_type: Option<NodeType>,
    pub(crate) dram_hit_ratio: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    capacity: BTreeMap<Dim, f64>,
    #[serde(default, rename = "type")]
    node_type: Option<NodeType>,
    #[serde(default)]
    dram_hit_ratio: Option<f64>,
}

impl TryFrom<RawNode> for NodeSpec {
    type Error = String;
    fn try_from(raw: RawNode) -> Result<NodeSpec, String> {
        if raw.name.is_empty() {
            return Err("a node needs a name".into());
        }
        check_amounts("capacity", &raw.capacity)?;
        check_ratio(raw.dram_hit_ratio)?;
        Ok(NodeSpec {
            name: raw.name,
            capacity: raw.capacity,
            node_type: raw.node_type,
            dram_hit_ratio: raw.dram_hit_ratio,
        })
    }
}

fn check_amounts(what: &str, amounts: &BTreeMap<Dim, f64>) -> Result<(), String> {
    if amounts.is_empty() {
        return Err(format!("{what} is empty: give at least one dimension"));
    }
    for (dim, v) in amounts {
        if !v.is_finite() || *v < 0.0 {
            return Err(format!("{what} {dim}: {v} is not a number ≥ 0"));
        }
    }
    Ok(())
}

fn check_ratio(ratio: Option<f64>) -> Result<(), String> {
    match ratio {
        Some(r) if !(0.0..=1.0).contains(&r) => {
            Err(format!("dram_hit_ratio {r} is not between 0 and 1"))
        }
        _ => Ok(()),
    }
}

/// The tasks of a simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSet {
    pub(crate) types: Vec<TaskType>,
    pub(crate) order: Order,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTaskSet {
    types: Vec<TaskType>,
    #[serde(default)]
    order: RawOrder,
    #[serde(default)]
    seed: Option<u64>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawOrder {
    #[default]
    Interleaved,
    Sequential,
    Shuffled,
}

/// One kind of task: an app with its request per instance and how many instances come.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawTaskType")]
pub(crate) struct TaskType {
    pub(crate) name: String,
    pub(crate) requests: BTreeMap<Dim, f64>,
    pub(crate) count: usize,
    /// Score's app profile (lower goes to PMEM).
    pub(crate) profile: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTaskType {
    name: String,
    requests: BTreeMap<Dim, f64>,
    count: usize,
    #[serde(default)]
    profile: Option<f64>,
}

impl TryFrom<RawTaskType> for TaskType {
    type Error = String;
    fn try_from(raw: RawTaskType) -> Result<TaskType, String> {
        if raw.name.is_empty() {
            return Err("a task type needs a name".into());
        }
        check_amounts("requests", &raw.requests)?;
        if raw.profile.is_some_and(|p| !p.is_finite()) {
            return Err("profile is not a number".into());
        }
        if raw.count > MAX_TASKS {
            return Err(format!(
                "count: {} is over the limit of {MAX_TASKS} tasks",
                raw.count
            ));
        }
        Ok(TaskType {
            name: raw.name,
            requests: raw.requests,
            count: raw.count,
            profile: raw.profile,
        })
    }
}

/// The order the tasks arrive in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    Interleaved,
    Sequential,
    Shuffled { seed: u64 },
}

/// Reads a node set; a node name given twice is refused with the line of the second.
pub fn parse_nodes(yaml: &str) -> Result<NodeSet, InputError> {
    let set: NodeSet = serde_norway::from_str(yaml)?;
    if set.groups.is_empty() && set.nodes.is_empty() {
        return Err(InputError {
            line: None,
            column: None,
            message: "no nodes: give `groups` or `nodes`".into(),
        });
    }
    // Each group is within the limit (checked as it is read); together they may not be.
    let mut total = 0usize;
    for (i, group) in set.groups.iter().enumerate() {
        total = total.saturating_add(group.count);
        if total > MAX_NODES {
            return Err(InputError {
                line: group_line(yaml, i),
                column: None,
                message: format!(
                    "groups[{i}].count: the groups come to {total} nodes up to here, over the \
                     limit of {MAX_NODES}"
                ),
            });
        }
    }
    if total.saturating_add(set.nodes.len()) > MAX_NODES {
        return Err(InputError {
            line: top_level_key(yaml, "nodes"),
            column: None,
            message: format!(
                "nodes: {} nodes with the groups' {total}, over the limit of {MAX_NODES}",
                set.nodes.len()
            ),
        });
    }
    let mut seen = BTreeSet::new();
    for name in node_names(&set) {
        if !seen.insert(name.clone()) {
            return Err(InputError {
                line: line_of(yaml, &name),
                column: None,
                message: format!("node {name:?} is given twice"),
            });
        }
    }
    Ok(set)
}

/// Reads a task set; a type name given twice is refused with the line of the second, a bad
/// `order`/`seed` pair with the line of the key.
pub fn parse_tasks(yaml: &str) -> Result<TaskSet, InputError> {
    let raw: RawTaskSet = serde_norway::from_str(yaml)?;
    let at = |line: Option<usize>, message: String| InputError {
        line,
        column: None,
        message,
    };
    if raw.types.is_empty() {
        return Err(at(
            top_level_key(yaml, "types"),
            "types is empty: give at least one task type".into(),
        ));
    }
    let mut total = 0usize;
    for t in &raw.types {
        total = total.saturating_add(t.count);
        if total > MAX_TASKS {
            return Err(at(
                line_of(yaml, &t.name),
                format!(
                    "task type {:?}: the types come to {total} tasks up to here, over the limit \
                     of {MAX_TASKS}",
                    t.name
                ),
            ));
        }
    }
    let mut seen = BTreeSet::new();
    for t in &raw.types {
        if !seen.insert(&t.name) {
            return Err(at(
                line_of(yaml, &t.name),
                format!("task type {:?} is given twice", t.name),
            ));
        }
    }
    let order = match (raw.order, raw.seed) {
        (RawOrder::Shuffled, Some(seed)) => Order::Shuffled { seed },
        (RawOrder::Shuffled, None) => {
            return Err(at(
                top_level_key(yaml, "order"),
                "order: shuffled needs a seed (e.g. `seed: 1`)".into(),
            ));
        }
        (_, Some(_)) => {
            return Err(at(
                top_level_key(yaml, "seed"),
                "seed is only used with order: shuffled".into(),
            ));
        }
        (RawOrder::Interleaved, None) => Order::Interleaved,
        (RawOrder::Sequential, None) => Order::Sequential,
    };
    Ok(TaskSet {
        types: raw.types,
        order,
    })
}

/// The line of the `i`-th item of the top-level `groups:` list (block style, `- ` items).
fn group_line(yaml: &str, i: usize) -> Option<usize> {
    let start = top_level_key(yaml, "groups")?;
    let mut indent = None;
    let mut seen = 0;
    for (n, line) in yaml.lines().enumerate().skip(start) {
        if !line.is_empty() && !line.starts_with([' ', '-', '#']) {
            // The next top-level key: the list ended.
            return None;
        }
        let trimmed = line.trim_start();
        if !trimmed.starts_with("- ") && trimmed != "-" {
            continue;
        }
        let at = line.len() - trimmed.len();
        if *indent.get_or_insert(at) != at {
            continue;
        }
        if seen == i {
            return Some(n + 1);
        }
        seen += 1;
    }
    None
}

/// The line of `key:` at the top level (column 1).
fn top_level_key(yaml: &str, key: &str) -> Option<usize> {
    yaml.lines()
        .position(|l| {
            l.strip_prefix(key)
                .is_some_and(|rest| rest.starts_with(':'))
        })
        .map(|i| i + 1)
}

/// The line of the last `name: <name>`, for errors found after parsing.
fn line_of(yaml: &str, name: &str) -> Option<usize> {
    yaml.lines()
        .enumerate()
        .filter(|(_, l)| {
            l.split_once("name:")
                .is_some_and(|(_, v)| v.trim().trim_matches(['"', '\'']) == name)
        })
        .map(|(i, _)| i + 1)
        .last()
}

/// Every node's name: the groups' in order, then the explicit nodes'.
fn node_names(set: &NodeSet) -> Vec<String> {
    let mut names = Vec::new();
    for g in &set.groups {
        let width = (g.count - 1).max(1).to_string().len();
        names.extend((0..g.count).map(|i| format!("{}{i:0width$}", g.name_prefix)));
    }
    names.extend(set.nodes.iter().map(|n| n.name.clone()));
    names
}

/// The snapshot the simulation starts from: every node empty, every task type's request.
pub fn snapshot(nodes: &NodeSet, tasks: &TaskSet) -> Snapshot {
    let mut snap = Snapshot::default();
    let shapes = nodes
        .groups
        .iter()
        .flat_map(|g| std::iter::repeat_n(g, g.count))
        .map(|g| (&g.capacity, g.node_type, g.dram_hit_ratio))
        .chain(
            nodes
                .nodes
                .iter()
                .map(|n| (&n.capacity, n.node_type, n.dram_hit_ratio)),
        );
    for (name, (capacity, node_type, ratio)) in node_names(nodes).into_iter().zip(shapes) {
        if node_type.is_some() || ratio.is_some() {
            snap.nodes.insert(
                name.clone(),
                NodeFacts {
                    platform_dram_hit_ratio: ratio,
                    node_type,
                },
            );
        }
        snap.node_capacities.insert(name, capacity.clone());
    }
    for t in &tasks.types {
        snap.apps_spec.insert(t.name.clone(), t.requests.clone());
        if let Some(p) = t.profile {
            snap.app_profiles.insert(t.name.clone(), p);
        }
    }
    snap
}

/// The tasks (app names) in the order they arrive.
pub fn task_list(tasks: &TaskSet) -> Vec<String> {
    let sequential = || {
        tasks
            .types
            .iter()
            .flat_map(|t| std::iter::repeat_n(t.name.clone(), t.count))
            .collect::<Vec<_>>()
    };
    match tasks.order {
        Order::Sequential => sequential(),
        Order::Interleaved => {
            let most = tasks.types.iter().map(|t| t.count).max().unwrap_or(0);
            (0..most)
                .flat_map(|round| {
                    tasks
                        .types
                        .iter()
                        .filter(move |t| round < t.count)
                        .map(|t| t.name.clone())
                })
                .collect()
        }
        Order::Shuffled { seed } => {
            let mut list = sequential();
            let mut rng = SplitMix64(seed);
            for i in (1..list.len()).rev() {
                let j = (rng.next() % (i as u64 + 1)) as usize;
                list.swap(i, j);
            }
            list
        }
    }
}

/// The names of `loaded` (algorithms loaded from `config_yaml`) in the order the file's
/// `algorithms:` map lists them; names the map does not list (or all, if the file cannot be read
/// that way) follow in sorted order.
pub fn config_order<'a>(
    config_yaml: &str,
    loaded: impl IntoIterator<Item = &'a String>,
) -> Vec<String> {
    let loaded: BTreeSet<&String> = loaded.into_iter().collect();
    let listed: Vec<String> = serde_norway::from_str::<serde_norway::Value>(config_yaml)
        .ok()
        .and_then(|v| {
            v.get("algorithms").and_then(|a| a.as_mapping()).map(|m| {
                m.keys()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect()
            })
        })
        .unwrap_or_default();
    let mut order: Vec<String> = listed.into_iter().filter(|n| loaded.contains(n)).collect();
    for name in loaded {
        if !order.contains(name) {
            order.push(name.clone());
        }
    }
    order
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny generator whose sequence is fixed by its
/// definition, so a seed gives the same order everywhere, unlike a library's default RNG.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests;
