//! The data placement decides on, and the resource arithmetic every algorithm shares.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

/// A resource dimension, named as wca names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dim {
    Cpu,
    Mem,
    MembwRead,
    MembwWrite,
    /// Read and write bandwidth folded into one number: `read + ratio · write`.
    MembwFlat,
    Wss,
}

impl Dim {
    pub fn name(self) -> &'static str {
        match self {
            Dim::Cpu => "cpu",
            Dim::Mem => "mem",
            Dim::MembwRead => "membw_read",
            Dim::MembwWrite => "membw_write",
            Dim::MembwFlat => "membw_flat",
            Dim::Wss => "wss",
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What runs on a node of one app: a count, or the task names (only their number counts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Assigned {
    Count(u64),
    Tasks(Vec<String>),
}

impl Assigned {
    pub(crate) fn count(&self) -> u64 {
        match self {
            Assigned::Count(n) => *n,
            Assigned::Tasks(tasks) => tasks.len() as u64,
        }
    }
}

/// Whether a node's memory is persistent memory (PMEM) or plain DRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeType {
    Pmem,
    Dram,
}

/// Facts about a node other than its capacity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFacts {
    #[serde(default)]
    pub platform_dram_hit_ratio: Option<f64>,
    #[serde(default)]
    pub node_type: Option<NodeType>,
}

/// One consistent view of the cluster, as wca's data provider returns it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// `{node: {dim: capacity}}`.
    #[serde(default)]
    pub node_capacities: BTreeMap<String, BTreeMap<Dim, f64>>,
    /// `{node: {app: count or [task]}}`: what already runs where.
    #[serde(default)]
    pub assigned_apps: BTreeMap<String, BTreeMap<String, Assigned>>,
    /// `{app: {dim: request}}`: one instance's request.
    #[serde(default)]
    pub apps_spec: BTreeMap<String, BTreeMap<Dim, f64>>,
    /// `{node: facts}`: DRAM hit ratio and node type.
    #[serde(default)]
    pub nodes: BTreeMap<String, NodeFacts>,
    /// `{app: profile}`: Score's app profiles (lower goes to PMEM).
    #[serde(default)]
    pub app_profiles: BTreeMap<String, f64>,
}

impl Snapshot {
    pub fn is_pmem(&self, node: &str) -> bool {
        self.nodes.get(node).and_then(|f| f.node_type) == Some(NodeType::Pmem)
    }

    /// How many instances of `app` run on `node`.
    pub fn count(&self, node: &str, app: &str) -> u64 {
        self.assigned_apps
            .get(node)
            .and_then(|apps| apps.get(app))
            .map_or(0, Assigned::count)
    }

    /// The sum of the requests of what runs on `node` (apps without a spec count as nothing).
    pub fn used(&self, node: &str) -> BTreeMap<Dim, f64> {
        let mut used = BTreeMap::new();
        for (app, assigned) in self.assigned_apps.get(node).into_iter().flatten() {
            for (dim, req) in self.apps_spec.get(app).into_iter().flatten() {
                *used.entry(*dim).or_insert(0.0) += req * assigned.count() as f64;
            }
        }
        used
    }

    /// The node's capacity, CPU multiplied by `cpu_scale_factor` on PMEM nodes.
    pub(crate) fn capacity(&self, node: &str, cpu_scale_factor: f64) -> BTreeMap<Dim, f64> {
        let mut cap = self.node_capacities.get(node).cloned().unwrap_or_default();
        if self.is_pmem(node)
            && let Some(cpu) = cap.get_mut(&Dim::Cpu)
        {
            *cpu *= cpu_scale_factor;
        }
        cap
    }

    /// [`Snapshot::capacity`] without a copy when nothing is scaled (not a PMEM node, or a
    /// factor of 1): what the algorithms read for every node of every decision.
    pub(crate) fn capacity_ref(
        &self,
        node: &str,
        cpu_scale_factor: f64,
    ) -> Cow<'_, BTreeMap<Dim, f64>> {
        match self.node_capacities.get(node) {
            Some(cap)
                if cpu_scale_factor == 1.0
                    || !cap.contains_key(&Dim::Cpu)
                    || !self.is_pmem(node) =>
            {
                Cow::Borrowed(cap)
            }
            _ => Cow::Owned(self.capacity(node, cpu_scale_factor)),
        }
    }

    /// Used plus one more instance of `app` on `node`, per dimension.
    pub fn demand(&self, node: &str, app: &str) -> BTreeMap<Dim, f64> {
        self.demand_using(None, node, app)
    }

    /// [`Snapshot::demand`] with the used amounts from `usage` (which must be
    /// `Usage::of(self)`), when given.
    pub(crate) fn demand_using(
        &self,
        usage: Option<&Usage>,
        node: &str,
        app: &str,
    ) -> BTreeMap<Dim, f64> {
        let mut demand = match usage {
            Some(usage) => usage.used(node),
            None => self.used(node),
        };
        for (dim, req) in self.apps_spec.get(app).into_iter().flatten() {
            *demand.entry(*dim).or_insert(0.0) += req;
        }
        demand
    }
}

/// Amounts per dimension, as the arithmetic below reads them: a map, or the dense [`PerDim`] the
/// incremental placer ([`crate::placer`]) keeps per node.
pub trait Amounts {
    /// The amount of `dim`; `None` when it is not given.
    fn amount(&self, dim: Dim) -> Option<f64>;
}

impl Amounts for BTreeMap<Dim, f64> {
    fn amount(&self, dim: Dim) -> Option<f64> {
        self.get(&dim).copied()
    }
}

impl Amounts for std::borrow::Cow<'_, BTreeMap<Dim, f64>> {
    fn amount(&self, dim: Dim) -> Option<f64> {
        self.get(&dim).copied()
    }
}

impl<T: Amounts + ?Sized> Amounts for &T {
    fn amount(&self, dim: Dim) -> Option<f64> {
        (**self).amount(dim)
    }
}

/// Every dimension's amount in a fixed array, without allocating.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct PerDim(pub(crate) [Option<f64>; 6]);

impl PerDim {
    pub(crate) fn of(map: &BTreeMap<Dim, f64>) -> PerDim {
        let mut out = PerDim::default();
        for (d, v) in map {
            out.0[*d as usize] = Some(*v);
        }
        out
    }

    /// `self + request` as [`Snapshot::demand`] adds them: a dimension of the request starts
    /// from 0 when `self` lacks it.
    pub(crate) fn plus(&self, request: &PerDim) -> PerDim {
        let mut out = *self;
        for (slot, req) in out.0.iter_mut().zip(request.0) {
            if let Some(r) = req {
                *slot = Some(slot.unwrap_or(0.0) + r);
            }
        }
        out
    }
}

impl Amounts for PerDim {
    fn amount(&self, dim: Dim) -> Option<f64> {
        self.0[dim as usize]
    }
}

/// [`Snapshot::used`] of every node, summed once: deciding thousands of nodes, or many requests,
/// on one snapshot then looks each node's usage up instead of summing its apps again. It is only
/// right for the snapshot it was made from: whoever changes the snapshot makes a new one (the
/// main crate's `SnapshotStore` keeps the two together).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    used: HashMap<String, BTreeMap<Dim, f64>>,
}

impl Usage {
    pub fn of(snapshot: &Snapshot) -> Usage {
        Usage {
            used: snapshot
                .assigned_apps
                .keys()
                .map(|node| (node.clone(), snapshot.used(node)))
                .collect(),
        }
    }

    /// What runs on `node` uses, as [`Snapshot::used`] says.
    pub fn used(&self, node: &str) -> BTreeMap<Dim, f64> {
        self.used.get(node).cloned().unwrap_or_default()
    }
}

/// Free capacity per dimension in `dims` for a demand (used + requested). Read and write memory
/// bandwidth, when both are asked and the node has both, share one bus: with
/// `ratio = cap_read / cap_write`, free read is `cap_read − (read + write·ratio)` and free write
/// `cap_write − (write + read/ratio)`. A dimension the node has no capacity for is `None`.
pub fn free(cap: &impl Amounts, demand: &impl Amounts, dims: &[Dim]) -> Vec<(Dim, Option<f64>)> {
    let ratio = bandwidth_ratio(cap, dims);
    dims.iter()
        .map(|&d| (d, free_of(cap, demand, ratio, d)))
        .collect()
}

/// [`free`] of one dimension, given the bandwidth ratio.
fn free_of(cap: &impl Amounts, demand: &impl Amounts, ratio: Option<f64>, d: Dim) -> Option<f64> {
    let want = |d: Dim| demand.amount(d).unwrap_or(0.0);
    match (d, ratio) {
        (Dim::MembwRead, Some(r)) => cap
            .amount(d)
            .map(|c| c - (want(Dim::MembwRead) + want(Dim::MembwWrite) * r)),
        (Dim::MembwWrite, Some(r)) => cap
            .amount(d)
            .map(|c| c - (want(Dim::MembwWrite) + want(Dim::MembwRead) / r)),
        _ => cap.amount(d).map(|c| c - want(d)),
    }
}

/// `cap_read / cap_write` when both bandwidth dimensions are in use and the node has both.
fn bandwidth_ratio(cap: &impl Amounts, dims: &[Dim]) -> Option<f64> {
    if !(dims.contains(&Dim::MembwRead) && dims.contains(&Dim::MembwWrite)) {
        return None;
    }
    match (cap.amount(Dim::MembwRead), cap.amount(Dim::MembwWrite)) {
        (Some(r), Some(w)) if w > 0.0 => Some(r / w),
        _ => None,
    }
}

/// Fit's check: `Err(reason)` when a dimension would go below zero, the reason byte for byte as
/// wca words it (`Could not fit node for dimensions: missing (cpu: 2.0),(mem: 8.0).`, the
/// shortfall per dimension; cpu and mem first, then the others in the order of `dims`).
pub(crate) fn fit(cap: &impl Amounts, demand: &impl Amounts, dims: &[Dim]) -> Result<(), String> {
    let mut missing = Vec::new();
    let mut unknown = Vec::new();
    // Dimension by dimension rather than through `free`: this runs for every node and instance
    // placed, and allocates nothing when the node fits.
    let ratio = bandwidth_ratio(cap, dims);
    // wca's data provider builds a node's capacity with cpu and mem first, then the other
    // dimensions in the order of `dimensions`; the reason lists them in that order.
    let ordered = [Dim::Cpu, Dim::Mem]
        .into_iter()
        .filter(|d| dims.contains(d))
        .chain(
            dims.iter()
                .copied()
                .filter(|d| *d != Dim::Cpu && *d != Dim::Mem),
        );
    for dim in ordered {
        match free_of(cap, demand, ratio, dim) {
            Some(f) if f < 0.0 => missing.push(format!("({dim}: {})", py_float(-f))),
            Some(_) => {}
            None => unknown.push(dim.name()),
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "No capacity known for dimensions: {}.",
            unknown.join(", ")
        ));
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "Could not fit node for dimensions: missing {}.",
            missing.join(",")
        ))
    }
}

/// The fraction of each dimension used with one more instance: `(used + requested) / capacity`.
/// With both bandwidth dimensions (and a node that has both) they are flattened into one
/// `membw_flat = (read + ratio·write) / (cap_read + ratio·cap_write)`: demand and capacity are
/// flattened alike, as wca's `divide_resources` does (so the denominator is `2·cap_read`).
/// A dimension without capacity counts as full.
pub fn fractions(cap: &impl Amounts, demand: &impl Amounts, dims: &[Dim]) -> Vec<(Dim, f64)> {
    with_fractions(cap, demand, dims, <[(Dim, f64)]>::to_vec)
}

/// Calls `f` with [`fractions`], kept on the stack when there are at most 8 dimensions (the
/// priority of every node for every instance placed asks for them; an allocation each time
/// showed in profiles).
pub(crate) fn with_fractions<R>(
    cap: &impl Amounts,
    demand: &impl Amounts,
    dims: &[Dim],
    f: impl FnOnce(&[(Dim, f64)]) -> R,
) -> R {
    let want = |d: Dim| demand.amount(d).unwrap_or(0.0);
    let of = |d: Dim, amount: f64| match cap.amount(d) {
        Some(c) if c > 0.0 => amount / c,
        _ => 1.0,
    };
    let ratio = bandwidth_ratio(cap, dims);
    let each = dims.iter().filter_map(|&d| match (d, ratio) {
        (Dim::MembwRead, Some(r)) => {
            let flat_cap = cap.amount(Dim::MembwRead).unwrap_or(0.0)
                + r * cap.amount(Dim::MembwWrite).unwrap_or(0.0);
            let flat = want(Dim::MembwRead) + r * want(Dim::MembwWrite);
            Some((
                Dim::MembwFlat,
                if flat_cap > 0.0 { flat / flat_cap } else { 1.0 },
            ))
        }
        (Dim::MembwWrite, Some(_)) => None,
        _ => Some((d, of(d, want(d)))),
    });
    const ON_STACK: usize = 8;
    if dims.len() > ON_STACK {
        return f(&each.collect::<Vec<_>>());
    }
    let mut buf = [(Dim::Cpu, 0.0); ON_STACK];
    let mut n = 0;
    for item in each {
        buf[n] = item;
        n += 1;
    }
    f(&buf[..n])
}

/// A string as Python's `repr` prints it (`'app'`; `"it's"` when it holds a `'` and no `"`).
pub(crate) fn py_repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// A float as Python's `repr` (and `str`, the same for floats since Python 3.2) prints it:
/// `2.0`, `0.5`, `1e-05`, `1.5e+16`, `inf`, `nan`; so reasons read as wca's do.
pub(crate) fn py_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    // repr is the shortest round-trip digits, written positionally for exponents -4..16.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e}'s exponent is a number");
    if v != 0.0 && !(-4..16).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    if v.fract() == 0.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(Dim, f64)]) -> BTreeMap<Dim, f64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn bandwidth_read_and_write_share_the_bus() {
        // ratio = 100 / 50 = 2: free read = 100 − (20 + 10·2) = 60; free write = 50 − (10 + 20/2) = 30.
        let cap = map(&[(Dim::MembwRead, 100.0), (Dim::MembwWrite, 50.0)]);
        let demand = map(&[(Dim::MembwRead, 20.0), (Dim::MembwWrite, 10.0)]);
        let free = free(&cap, &demand, &[Dim::MembwRead, Dim::MembwWrite]);
        assert_eq!(
            free,
            vec![(Dim::MembwRead, Some(60.0)), (Dim::MembwWrite, Some(30.0))]
        );
        // Flattened, demand and capacity alike: (20 + 2·10) / (100 + 2·50) = 0.2.
        let f = fractions(&cap, &demand, &[Dim::MembwRead, Dim::MembwWrite]);
        assert_eq!(f, vec![(Dim::MembwFlat, 0.2)]);
    }

    #[test]
    fn flat_capacity_is_read_plus_ratio_times_write() {
        // wca's test_divide_resources: demand (cpu 3, mem 3, read 4, write 1) over capacity
        // (2, 2, 8, 2), ratio 4: membw_flat = (4 + 4·1) / (8 + 4·2) = 0.5 (dividing by cap_read
        // alone gave 1.0).
        let cap = map(&[
            (Dim::Cpu, 2.0),
            (Dim::Mem, 2.0),
            (Dim::MembwRead, 8.0),
            (Dim::MembwWrite, 2.0),
        ]);
        let demand = map(&[
            (Dim::Cpu, 3.0),
            (Dim::Mem, 3.0),
            (Dim::MembwRead, 4.0),
            (Dim::MembwWrite, 1.0),
        ]);
        let dims = [Dim::Cpu, Dim::Mem, Dim::MembwRead, Dim::MembwWrite];
        assert_eq!(
            fractions(&cap, &demand, &dims),
            vec![(Dim::Cpu, 1.5), (Dim::Mem, 1.5), (Dim::MembwFlat, 0.5)]
        );
    }

    #[test]
    fn floats_and_strings_print_as_python_repr() {
        for (v, text) in [
            (2.0, "2.0"),
            (0.5, "0.5"),
            (-0.0, "-0.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e16, "1.5e+16"),
            (1e16, "1e+16"),
            (4294967262.0, "4294967262.0"),
            (f64::INFINITY, "inf"),
            (f64::NAN, "nan"),
        ] {
            assert_eq!(py_float(v), text, "{v}");
        }
        assert_eq!(py_repr_str("web"), "'web'");
        assert_eq!(py_repr_str("it's"), "\"it's\"");
        assert_eq!(py_repr_str("a'\"b"), "'a\\'\"b'");
    }

    #[test]
    fn fractions_of_more_dimensions_than_kept_on_the_stack() {
        let cap = map(&[(Dim::Cpu, 4.0), (Dim::Mem, 8.0)]);
        let demand = map(&[(Dim::Cpu, 1.0), (Dim::Mem, 2.0)]);
        let dims = [Dim::Cpu, Dim::Mem].repeat(5);
        let f = fractions(&cap, &demand, &dims);
        assert_eq!(f.len(), 10);
        assert_eq!(f[8], (Dim::Cpu, 0.25));
        assert_eq!(f[9], (Dim::Mem, 0.25));
        // The same through a dense PerDim.
        assert_eq!(fractions(&PerDim::of(&cap), &PerDim::of(&demand), &dims), f);
    }

    #[test]
    fn read_alone_is_not_combined() {
        let cap = map(&[(Dim::MembwRead, 100.0), (Dim::MembwWrite, 50.0)]);
        let demand = map(&[(Dim::MembwRead, 20.0), (Dim::MembwWrite, 10.0)]);
        assert_eq!(
            free(&cap, &demand, &[Dim::MembwRead]),
            vec![(Dim::MembwRead, Some(80.0))]
        );
    }

    #[test]
    fn fit_names_the_shortfall() {
        let cap = map(&[(Dim::Cpu, 4.0), (Dim::Mem, 8.0)]);
        let demand = map(&[(Dim::Cpu, 2.5), (Dim::Mem, 10.0)]);
        assert_eq!(
            fit(&cap, &demand, &[Dim::Cpu, Dim::Mem]).unwrap_err(),
            "Could not fit node for dimensions: missing (mem: 2.0)."
        );
        assert_eq!(
            fit(&cap, &demand, &[Dim::Cpu, Dim::Wss]).unwrap_err(),
            "No capacity known for dimensions: wss."
        );
    }

    #[test]
    fn capacity_ref_scales_cpu_only_on_pmem_nodes_and_copies_only_then() {
        let mut s = Snapshot::default();
        for node in ["dram", "pmem"] {
            s.node_capacities
                .insert(node.into(), map(&[(Dim::Cpu, 10.0), (Dim::Mem, 4.0)]));
        }
        s.nodes.insert(
            "pmem".into(),
            NodeFacts {
                node_type: Some(NodeType::Pmem),
                ..NodeFacts::default()
            },
        );
        assert!(matches!(s.capacity_ref("dram", 0.5), Cow::Borrowed(_)));
        assert!(matches!(s.capacity_ref("pmem", 1.0), Cow::Borrowed(_)));
        assert_eq!(*s.capacity_ref("pmem", 0.5), s.capacity("pmem", 0.5));
        assert_eq!(s.capacity_ref("pmem", 0.5)[&Dim::Cpu], 5.0);
        assert!(s.capacity_ref("unknown", 0.5).is_empty());
    }

    #[test]
    fn assigned_apps_accept_counts_and_task_lists() {
        let s: Snapshot = serde_json::from_str(
            r#"{"assigned_apps": {"n1": {"a": 2, "b": ["b-1", "b-2", "b-3"]}},
                "apps_spec": {"a": {"cpu": 1.5}, "b": {"cpu": 1}}}"#,
        )
        .unwrap();
        assert_eq!(s.count("n1", "b"), 3);
        assert_eq!(s.used("n1"), map(&[(Dim::Cpu, 6.0)]));
    }
}
