//! The algorithms: the two filter passes and prioritize, with every parameter wca has.
//!
//! Quirk decisions (also in `docs/placement.md`):
//! - **LeastUsed's default weights.** wca's default `least_used_weights` gives every dimension
//!   weight 1 *and adds `membw_flat: 1`*, which also counts in `Σ w` when no bandwidth dimension is
//!   in use: with `[cpu, mem]` an empty node scores 2/3 (6 after scaling), never 10. We do **not**
//!   keep that: by default each dimension in use (after flattening) weighs 1, so an empty node
//!   scores 10; weights are only summed over dimensions in use, and a weight given for a dimension
//!   not in use is ignored.
//! - **Truncation.** Scores are `(priority × max_node_score) as i64`: truncated toward zero like
//!   Python's `int()`, not rounded and not clamped (LeastUsedBAR reaches 20; a negative priority
//!   stays negative), as wca does.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::snapshot::{self, Amounts, Dim, Snapshot, Usage};

/// An algorithm with its common parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Algorithm {
    /// The dimensions checked and scored (default `[cpu, mem]`).
    #[serde(default = "default_dimensions")]
    pub dimensions: Vec<Dim>,
    /// What a priority of 1.0 becomes (default 10).
    #[serde(default = "default_max_node_score")]
    pub(crate) max_node_score: f64,
    pub kind: Kind,
}

pub(crate) fn default_dimensions() -> Vec<Dim> {
    vec![Dim::Cpu, Dim::Mem]
}

fn default_max_node_score() -> f64 {
    10.0
}

fn one() -> f64 {
    1.0
}

fn default_threshold() -> f64 {
    0.97
}

/// Which algorithm, with its own parameters and wca's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Kind {
    /// Accepts every node, scores 0.
    Nop,
    /// Rejects a node where a dimension would go below zero; scores 0.
    Fit {
        /// Multiplies CPU capacity on PMEM nodes (1.0).
        #[serde(default = "one")]
        cpu_scale_factor: f64,
    },
    /// Fit; scores `1 − variance` of the used fractions.
    Bar {
        #[serde(default = "one")]
        cpu_scale_factor: f64,
        /// Per-dimension weights of the variance with more than 2 dimensions (missing: 1).
        #[serde(default)]
        bar_weights: BTreeMap<Dim, f64>,
    },
    /// Fit; scores the weighted mean of the free fractions.
    LeastUsed {
        #[serde(default = "one")]
        cpu_scale_factor: f64,
        /// Per-dimension weights (missing: 1).
        #[serde(default)]
        least_used_weights: BTreeMap<Dim, f64>,
    },
    /// Fit; scores `least_used · least_used_weight + bar`.
    LeastUsedBar {
        #[serde(default = "one")]
        cpu_scale_factor: f64,
        #[serde(default)]
        bar_weights: BTreeMap<Dim, f64>,
        #[serde(default)]
        least_used_weights: BTreeMap<Dim, f64>,
        #[serde(default = "one")]
        least_used_weight: f64,
    },
    /// Fit, then only the best class of node shapes; scores as LeastUsedBAR.
    HierBar {
        #[serde(default = "one")]
        cpu_scale_factor: f64,
        #[serde(default)]
        bar_weights: BTreeMap<Dim, f64>,
        #[serde(default)]
        least_used_weights: BTreeMap<Dim, f64>,
        #[serde(default = "one")]
        least_used_weight: f64,
        /// Merges node shapes into two classes split by `cap_read / cap_write > merge_threshold`.
        #[serde(default)]
        merge_threshold: Option<f64>,
    },
    /// Accepts a node while `count(app on node) < targeted_assigned_apps_counts[node][app]`.
    StaticAssigner {
        targeted_assigned_apps_counts: BTreeMap<String, BTreeMap<String, u64>>,
    },
    /// Rejects nodes whose `platform_dram_hit_ratio < threshold`.
    DramHitRatioProvision {
        #[serde(default = "default_threshold")]
        threshold: f64,
    },
    /// Fit plus the DRAM hit ratio on PMEM nodes, then PMEM or DRAM nodes by app profile.
    Score {
        #[serde(default = "one")]
        cpu_scale_factor: f64,
        #[serde(default = "default_threshold")]
        threshold: f64,
        #[serde(default)]
        score_target: Option<f64>,
        #[serde(default)]
        strict_mode_placement: bool,
    },
}

/// What the code around an algorithm needs to know about it, written once per algorithm in
/// [`Kind::spec`]: adding a [`Kind`] variant makes the compiler point there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    /// The wca config tag it is written with (`!BAR`), also its name in Lua's `placement.*`.
    pub(crate) tag: &'static str,
    /// Pass 1 and the score read only the node's capacity and used amounts, so the placer may
    /// evaluate nodes of the same load once.
    pub(crate) by_load: bool,
    /// It has a pass 2 over pass 1's survivors together ([`Algorithm::app_fit_nodes`]).
    pub(crate) two_pass: bool,
    /// It refuses an app that has no entry in `apps_spec`.
    pub(crate) needs_spec: bool,
    /// Its `cpu_scale_factor`, for those that have one.
    pub(crate) cpu_scale_factor: Option<f64>,
    /// The best priority it gives a node (before `× max_node_score`); 0 for those that score
    /// every node 0.
    pub(crate) best_priority: f64,
    /// It has a reschedule hook ([`crate::reschedule`]): which running instances should move.
    pub reschedules: bool,
}

impl Kind {
    /// The algorithm's [`Spec`]: every field written for every algorithm.
    pub fn spec(&self) -> Spec {
        match self {
            Kind::Nop => Spec {
                tag: "NOPAlgorithm",
                by_load: true,
                two_pass: false,
                needs_spec: false,
                cpu_scale_factor: None,
                best_priority: 0.0,
                reschedules: false,
            },
            Kind::Fit { cpu_scale_factor } => Spec {
                tag: "Fit",
                by_load: true,
                two_pass: false,
                needs_spec: true,
                cpu_scale_factor: Some(*cpu_scale_factor),
                best_priority: 0.0,
                reschedules: false,
            },
            Kind::Bar {
                cpu_scale_factor, ..
            } => Spec {
                tag: "BAR",
                by_load: true,
                two_pass: false,
                needs_spec: true,
                cpu_scale_factor: Some(*cpu_scale_factor),
                best_priority: 1.0,
                reschedules: false,
            },
            Kind::LeastUsed {
                cpu_scale_factor, ..
            } => Spec {
                tag: "LeastUsed",
                by_load: true,
                two_pass: false,
                needs_spec: true,
                cpu_scale_factor: Some(*cpu_scale_factor),
                best_priority: 1.0,
                reschedules: false,
            },
            Kind::LeastUsedBar {
                cpu_scale_factor,
                least_used_weight,
                ..
            } => Spec {
                tag: "LeastUsedBAR",
                by_load: true,
                two_pass: false,
                needs_spec: true,
                cpu_scale_factor: Some(*cpu_scale_factor),
                best_priority: least_used_weight.max(0.0) + 1.0,
                reschedules: false,
            },
            Kind::HierBar {
                cpu_scale_factor,
                least_used_weight,
                ..
            } => Spec {
                tag: "HierBAR",
                by_load: false,
                two_pass: true,
                needs_spec: true,
                cpu_scale_factor: Some(*cpu_scale_factor),
                best_priority: least_used_weight.max(0.0) + 1.0,
                reschedules: false,
            },
            Kind::StaticAssigner { .. } => Spec {
                tag: "StaticAssigner",
                by_load: false,
                two_pass: false,
                needs_spec: false,
                cpu_scale_factor: None,
                best_priority: 0.0,
                reschedules: false,
            },
            Kind::DramHitRatioProvision { .. } => Spec {
                tag: "DramHitRatioProvision",
                by_load: false,
                two_pass: false,
                needs_spec: false,
                cpu_scale_factor: None,
                best_priority: 0.0,
                reschedules: false,
            },
            Kind::Score {
                cpu_scale_factor, ..
            } => Spec {
                tag: "Score",
                by_load: false,
                two_pass: true,
                needs_spec: true,
                cpu_scale_factor: Some(*cpu_scale_factor),
                best_priority: 0.0,
                reschedules: true,
            },
        }
    }

    /// The best raw score the algorithm can give: its best priority × `max_node_score`.
    pub(crate) fn score_ceiling(&self, max_node_score: f64) -> f64 {
        self.spec().best_priority * max_node_score
    }

    /// The names of `variant`'s own parameters, from its serde definition (none for an unknown
    /// variant).
    pub fn parameters(variant: &str) -> &'static [&'static str] {
        crate::probe::variant_fields::<Kind>(variant).unwrap_or(&[])
    }
}

/// The outcome of filtering: the nodes kept (sorted) and why each other node was dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FilterResult {
    pub nodes: Vec<String>,
    pub failed: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    #[error("app {app:?} has no spec (no entry in apps_spec)")]
    UnknownApp { app: String },
}

impl Algorithm {
    pub fn new(kind: Kind) -> Algorithm {
        Algorithm {
            dimensions: default_dimensions(),
            max_node_score: default_max_node_score(),
            kind,
        }
    }

    pub fn with_dimensions(mut self, dims: &[Dim]) -> Algorithm {
        self.dimensions = dims.to_vec();
        self
    }

    /// The parameters every algorithm takes besides its [`Kind`]'s own, from the serde
    /// definition (`dimensions`, `max_node_score`).
    pub fn common_parameters() -> Vec<&'static str> {
        let fields = crate::probe::fields::<Algorithm>().unwrap_or(&[]);
        fields.iter().copied().filter(|f| *f != "kind").collect()
    }

    /// The algorithm's `cpu_scale_factor` (1.0 for those without one).
    pub(crate) fn cpu_scale_factor(&self) -> f64 {
        self.kind.spec().cpu_scale_factor.unwrap_or(1.0)
    }

    fn needs_spec(&self) -> bool {
        self.kind.spec().needs_spec
    }

    /// An algorithm that needs the app's spec refuses an app `snap` has none for.
    fn check_known_app(&self, snap: &Snapshot, app: &str) -> Result<(), PlacementError> {
        if self.needs_spec() && !snap.apps_spec.contains_key(app) {
            return Err(PlacementError::UnknownApp { app: app.into() });
        }
        Ok(())
    }

    /// `node`'s capacity (CPU scaled) and its demand with one more `app`, the used amounts from
    /// `usage` when given.
    fn load_of<'s>(
        &self,
        snap: &'s Snapshot,
        usage: Option<&Usage>,
        node: &str,
        app: &str,
    ) -> (Cow<'s, BTreeMap<Dim, f64>>, BTreeMap<Dim, f64>) {
        (
            snap.capacity_ref(node, self.cpu_scale_factor()),
            snap.demand_using(usage, node, app),
        )
    }

    /// Both filter passes over `nodes` for one instance of `app`.
    pub fn filter(
        &self,
        snap: &Snapshot,
        app: &str,
        nodes: &[String],
    ) -> Result<FilterResult, PlacementError> {
        self.filter_using(snap, None, app, nodes)
    }

    /// [`Algorithm::filter`] with the nodes' used amounts taken from `usage` (which must be
    /// `Usage::of(snap)`) instead of being summed per node: the same result, faster.
    pub(crate) fn filter_using(
        &self,
        snap: &Snapshot,
        usage: Option<&Usage>,
        app: &str,
        nodes: &[String],
    ) -> Result<FilterResult, PlacementError> {
        self.check_known_app(snap, app)?;
        let mut result = FilterResult::default();
        let sorted: BTreeSet<&String> = nodes.iter().collect();
        for node in sorted {
            match self.app_fit_node_using(snap, usage, node, app) {
                Ok(()) => result.nodes.push(node.clone()),
                Err(reason) => {
                    result.failed.insert(node.clone(), reason);
                }
            }
        }
        let rejected = self.app_fit_nodes(snap, &result.nodes, app);
        result.nodes.retain(|n| !rejected.contains_key(n));
        result.failed.extend(rejected);
        Ok(result)
    }

    /// Pass 1: one node on its own.
    pub fn app_fit_node(&self, snap: &Snapshot, node: &str, app: &str) -> Result<(), String> {
        self.app_fit_node_using(snap, None, node, app)
    }

    /// [`Algorithm::app_fit_node`] with the used amounts from `usage` (see [`Algorithm::filter_using`]).
    pub(crate) fn app_fit_node_using(
        &self,
        snap: &Snapshot,
        usage: Option<&Usage>,
        node: &str,
        app: &str,
    ) -> Result<(), String> {
        self.app_fit_node_given(snap, node, app, || self.load_of(snap, usage, node, app))
    }

    /// Pass 1 with the node's capacity (CPU scaled) and demand (used + requested) from `load`,
    /// called only by the algorithms that read them: the incremental placer keeps them per node.
    pub(crate) fn app_fit_node_given<C: Amounts, D: Amounts>(
        &self,
        snap: &Snapshot,
        node: &str,
        app: &str,
        load: impl FnOnce() -> (C, D),
    ) -> Result<(), String> {
        let fit = || {
            let (cap, demand) = load();
            snapshot::fit(&cap, &demand, &self.dimensions)
        };
        match &self.kind {
            Kind::Nop => Ok(()),
            Kind::Fit { .. }
            | Kind::Bar { .. }
            | Kind::LeastUsed { .. }
            | Kind::LeastUsedBar { .. }
            | Kind::HierBar { .. } => fit(),
            Kind::StaticAssigner {
                targeted_assigned_apps_counts,
            } => {
                let Some(apps) = targeted_assigned_apps_counts.get(node) else {
                    return Err("Node is not in targeted_assigned_apps_counts.".into());
                };
                let Some(&target) = apps.get(app) else {
                    return Err(format!("No target count for app {app} on this node."));
                };
                let count = snap.count(node, app);
                if count < target {
                    Ok(())
                } else {
                    Err(format!(
                        "App {app} has {count} of its targeted {target} instances here."
                    ))
                }
            }
            Kind::DramHitRatioProvision { threshold } => dram_hit_ratio(snap, node, *threshold),
            Kind::Score { threshold, .. } => {
                // wca checks both and joins the two texts (`'{} {}'.format(..)`, with a stray
                // space when only one fails); here the failing ones are joined by one space.
                let fits = fit();
                let dram = if snap.is_pmem(node) {
                    dram_hit_ratio(snap, node, *threshold)
                } else {
                    Ok(())
                };
                match (fits, dram) {
                    (Ok(()), Ok(())) => Ok(()),
                    (Err(a), Err(b)) => Err(format!("{a} {b}")),
                    (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
                }
            }
        }
    }

    /// Pass 2: the survivors of pass 1 together; returns the nodes it rejects with reasons.
    pub fn app_fit_nodes(
        &self,
        snap: &Snapshot,
        nodes: &[String],
        app: &str,
    ) -> BTreeMap<String, String> {
        match &self.kind {
            Kind::HierBar {
                merge_threshold, ..
            } => hier_bar_classes(snap, nodes, app, &self.dimensions, *merge_threshold),
            Kind::Score {
                score_target,
                strict_mode_placement,
                ..
            } => score_node_type(snap, nodes, app, *score_target, *strict_mode_placement),
            Kind::Nop
            | Kind::Fit { .. }
            | Kind::Bar { .. }
            | Kind::LeastUsed { .. }
            | Kind::LeastUsedBar { .. }
            | Kind::StaticAssigner { .. }
            | Kind::DramHitRatioProvision { .. } => BTreeMap::new(),
        }
    }

    /// The priority of `node` for one more `app`, before scaling (1.0 is the best for most),
    /// with the used amounts from `usage` when given (see [`Algorithm::filter_using`]).
    pub(crate) fn priority_for_node_using(
        &self,
        snap: &Snapshot,
        usage: Option<&Usage>,
        node: &str,
        app: &str,
    ) -> f64 {
        self.priority_given(|| self.load_of(snap, usage, node, app))
    }

    /// The priority with the node's capacity (CPU scaled) and demand from `load`, as
    /// [`Algorithm::app_fit_node_given`].
    pub(crate) fn priority_given<C: Amounts, D: Amounts>(
        &self,
        load: impl FnOnce() -> (C, D),
    ) -> f64 {
        let score = |f: &[(Dim, f64)]| match &self.kind {
            Kind::Bar { bar_weights, .. } => bar(f, bar_weights),
            Kind::LeastUsed {
                least_used_weights, ..
            } => least_used(f, least_used_weights),
            Kind::LeastUsedBar {
                bar_weights,
                least_used_weights,
                least_used_weight,
                ..
            }
            | Kind::HierBar {
                bar_weights,
                least_used_weights,
                least_used_weight,
                ..
            } => least_used(f, least_used_weights) * least_used_weight + bar(f, bar_weights),
            Kind::Nop
            | Kind::Fit { .. }
            | Kind::StaticAssigner { .. }
            | Kind::DramHitRatioProvision { .. }
            | Kind::Score { .. } => 0.0,
        };
        match &self.kind {
            Kind::Bar { .. }
            | Kind::LeastUsed { .. }
            | Kind::LeastUsedBar { .. }
            | Kind::HierBar { .. } => {
                let (cap, demand) = load();
                snapshot::with_fractions(&cap, &demand, &self.dimensions, score)
            }
            Kind::Nop
            | Kind::Fit { .. }
            | Kind::StaticAssigner { .. }
            | Kind::DramHitRatioProvision { .. }
            | Kind::Score { .. } => 0.0,
        }
    }

    /// Scores for `nodes` in sorted order: `int(priority × max_node_score)`, truncated, no clamp.
    pub fn prioritize(
        &self,
        snap: &Snapshot,
        app: &str,
        nodes: &[String],
    ) -> Result<Vec<(String, i64)>, PlacementError> {
        self.prioritize_using(snap, None, app, nodes)
    }

    /// [`Algorithm::prioritize`] with the used amounts from `usage` (see
    /// [`Algorithm::filter_using`]).
    pub(crate) fn prioritize_using(
        &self,
        snap: &Snapshot,
        usage: Option<&Usage>,
        app: &str,
        nodes: &[String],
    ) -> Result<Vec<(String, i64)>, PlacementError> {
        self.check_known_app(snap, app)?;
        let sorted: BTreeSet<&String> = nodes.iter().collect();
        Ok(sorted
            .into_iter()
            .map(|n| {
                let p = self.priority_for_node_using(snap, usage, n, app);
                (n.clone(), (p * self.max_node_score) as i64)
            })
            .collect())
    }
}

fn dram_hit_ratio(snap: &Snapshot, node: &str, threshold: f64) -> Result<(), String> {
    match snap.nodes.get(node).and_then(|f| f.platform_dram_hit_ratio) {
        None => Err("No platform_dram_hit_ratio known for the node.".into()),
        Some(r) if r < threshold => {
            Err("Could not fit node because of dram hit ratio violation.".into())
        }
        Some(_) => Ok(()),
    }
}

/// BAR: `1 − variance` of the fractions. More than 2 dimensions: `Σ (f − mean)² · w / n`;
/// 2: `|f1 − f2|` (weights ignored); 1 or none: 0.
pub fn bar(fractions: &[(Dim, f64)], weights: &BTreeMap<Dim, f64>) -> f64 {
    let variance = match fractions {
        [] | [_] => 0.0,
        [(_, a), (_, b)] => (a - b).abs(),
        _ => {
            let n = fractions.len() as f64;
            let mean = fractions.iter().map(|(_, f)| f).sum::<f64>() / n;
            fractions
                .iter()
                .map(|(d, f)| (f - mean).powi(2) * weights.get(d).copied().unwrap_or(1.0))
                .sum::<f64>()
                / n
        }
    };
    1.0 - variance
}

/// LeastUsed: `Σ (1 − f) · w / Σ w` over the dimensions in use (missing weights are 1).
pub fn least_used(fractions: &[(Dim, f64)], weights: &BTreeMap<Dim, f64>) -> f64 {
    let w = |d: &Dim| weights.get(d).copied().unwrap_or(1.0);
    let total: f64 = fractions.iter().map(|(d, _)| w(d)).sum();
    if total == 0.0 {
        return 0.0;
    }
    fractions.iter().map(|(d, f)| (1.0 - f) * w(d)).sum::<f64>() / total
}

/// A node shape: its capacity over `dims` as `(dim, int(value))` pairs, sorted by dimension.
pub(crate) type Shape = Vec<(Dim, i64)>;

/// A node's shape (wca's `_resources_to_shape`): its capacity in `dims` (those it has), each
/// truncated to an integer as Python's `int()`, sorted by dimension.
pub fn node_shape(cap: &BTreeMap<Dim, f64>, dims: &[Dim]) -> Shape {
    let mut shape: Shape = cap
        .iter()
        .filter(|(d, _)| dims.contains(d))
        .map(|(d, v)| (*d, *v as i64))
        .collect();
    shape.sort();
    shape
}

/// The mean capacity of a class's members per dimension (wca's `_calc_average_resources`): the
/// sum over the members divided by their number; empty for no members.
pub fn class_mean<'a>(
    members: impl IntoIterator<Item = &'a BTreeMap<Dim, f64>>,
) -> BTreeMap<Dim, f64> {
    let mut sum: BTreeMap<Dim, f64> = BTreeMap::new();
    let mut n = 0usize;
    for cap in members {
        n += 1;
        for (d, v) in cap {
            *sum.entry(*d).or_insert(0.0) += v;
        }
    }
    for v in sum.values_mut() {
        *v /= n as f64;
    }
    sum
}

/// HierBAR's classes of nodes (wca's shapes, merged or not), each a list of member nodes in node
/// order, the classes in wca's order:
///
/// - every known node (not only the candidates) goes into the class of its shape over `dims`;
///   classes are ordered by their first node in node order;
/// - with `merge_threshold` and at least two shapes, the shapes are merged into two classes by
///   `cap_read / cap_write > merge_threshold` of the shape (the class above first, an empty class
///   left out); a shape without both bandwidth dimensions (or with a write of 0) belongs to no
///   class.
pub fn hier_bar_classes_of(
    snap: &Snapshot,
    dims: &[Dim],
    merge_threshold: Option<f64>,
) -> Vec<Vec<String>> {
    // Shapes in the order of their first node, each with its nodes.
    let mut shapes: Vec<(Shape, Vec<String>)> = Vec::new();
    let mut index: BTreeMap<Shape, usize> = BTreeMap::new();
    for (node, cap) in &snap.node_capacities {
        let shape = node_shape(cap, dims);
        match index.get(&shape) {
            Some(&i) => shapes[i].1.push(node.clone()),
            None => {
                index.insert(shape.clone(), shapes.len());
                shapes.push((shape, vec![node.clone()]));
            }
        }
    }
    match merge_threshold {
        Some(threshold) if shapes.len() >= 2 => {
            let (mut above, mut below) = (Vec::new(), Vec::new());
            for (shape, members) in &shapes {
                let get = |d| shape.iter().find(|(x, _)| *x == d).map(|(_, v)| *v as f64);
                let (Some(read), Some(write)) = (get(Dim::MembwRead), get(Dim::MembwWrite)) else {
                    continue;
                };
                if write == 0.0 {
                    continue;
                }
                if read / write > threshold {
                    above.extend(members.iter().cloned());
                } else {
                    below.extend(members.iter().cloned());
                }
            }
            [above, below]
                .into_iter()
                .filter(|m| !m.is_empty())
                .collect()
        }
        _ => shapes.into_iter().map(|(_, members)| members).collect(),
    }
}

/// A HierBAR class's value (wca's `calculate_class_variances`): the sample standard deviation
/// over the dimensions of `requested / mean capacity of the members`, bandwidth flattened as in
/// the scores. A dimension the class has no (or zero) capacity for is left out.
pub(crate) fn hier_bar_class_value(
    snap: &Snapshot,
    members: &[String],
    app: &str,
    dims: &[Dim],
) -> f64 {
    let mean: BTreeMap<Dim, f64> =
        class_mean(members.iter().filter_map(|n| snap.node_capacities.get(n)))
            .into_iter()
            .filter(|(d, _)| dims.contains(d))
            .collect();
    let requested = snap.apps_spec.get(app).cloned().unwrap_or_default();
    let values: Vec<f64> = snapshot::fractions(&mean, &requested, dims)
        .into_iter()
        .filter(|(d, _)| *d == Dim::MembwFlat || mean.get(d).is_some_and(|c| *c > 0.0))
        .map(|(_, f)| f)
        .collect();
    sample_std_dev(&values)
}

/// HierBAR pass 2, as wca's `HierBAR.app_fit_nodes`: the classes of [`hier_bar_classes_of`],
/// each valued by [`hier_bar_class_value`]; the class with the lowest value that holds a
/// candidate wins (a tie: the first class); every other candidate fails with `Not best class
/// (best_variance=0.07 this=0.14)`, its own class's value after the winner's, two decimals.
fn hier_bar_classes(
    snap: &Snapshot,
    nodes: &[String],
    app: &str,
    dims: &[Dim],
    merge_threshold: Option<f64>,
) -> BTreeMap<String, String> {
    let mut dims = dims.to_vec();
    dims.sort();
    dims.dedup();
    let classes = hier_bar_classes_of(snap, &dims, merge_threshold);
    let values: Vec<f64> = classes
        .iter()
        .map(|members| hier_bar_class_value(snap, members, app, &dims))
        .collect();
    let candidates: BTreeSet<&String> = nodes.iter().collect();
    let mut order: Vec<usize> = (0..classes.len()).collect();
    // Stable: equal values keep the class order.
    order.sort_by(|a, b| values[*a].total_cmp(&values[*b]));
    let best = order
        .into_iter()
        .find(|i| classes[*i].iter().any(|m| candidates.contains(m)));
    let mut class_of: BTreeMap<&String, usize> = BTreeMap::new();
    for (i, members) in classes.iter().enumerate() {
        for m in members {
            class_of.insert(m, i);
        }
    }
    let mut failed = BTreeMap::new();
    for node in nodes {
        match (class_of.get(node), best) {
            (Some(&i), Some(b)) if i != b => {
                failed.insert(
                    node.clone(),
                    format!(
                        "Not best class (best_variance={:.2} this={:.2})",
                        values[b], values[i]
                    ),
                );
            }
            (Some(_), _) => {}
            (None, _) => {
                failed.insert(
                    node.clone(),
                    "Node has no membw_read and membw_write capacity to class it by.".into(),
                );
            }
        }
    }
    failed
}

/// The sample standard deviation (n − 1); 0 for fewer than two values.
pub fn sample_std_dev(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
}

/// Score pass 2: PMEM nodes for an app with a low profile, DRAM nodes otherwise.
fn score_node_type(
    snap: &Snapshot,
    nodes: &[String],
    app: &str,
    score_target: Option<f64>,
    strict: bool,
) -> BTreeMap<String, String> {
    let profiles = &snap.app_profiles;
    let profile = profiles.get(app).copied();
    let lowest = profiles.values().copied().min_by(f64::total_cmp);
    let to_pmem = profiles.len() > 2
        && match (score_target, profile) {
            (Some(target), Some(p)) => p <= target,
            (None, Some(p)) => Some(p) == lowest,
            (_, None) => false,
        };
    // wca's text for a node of the other type (its `_app_fit_node_type`; wca then drops it).
    let other = if to_pmem { "dram" } else { "pmem" };
    let rejected: BTreeMap<String, String> = nodes
        .iter()
        .filter(|n| snap.is_pmem(n) != to_pmem)
        .map(|n| {
            (
                n.clone(),
                format!(
                    "{} not preferred for {other} type of node",
                    snapshot::py_repr_str(app)
                ),
            )
        })
        .collect();
    if rejected.len() == nodes.len() && !strict {
        return BTreeMap::new();
    }
    rejected
}

#[cfg(test)]
mod tests;
