//! Placing one instance (`place`) and wca's cluster simulator (`simulate`), as pure functions.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::algorithms::{Algorithm, FilterResult, PlacementError};
use crate::snapshot::{self, Assigned, Dim, Snapshot};

/// Filters `nodes`, prioritizes the survivors and picks the best: the highest score; among equal
/// scores the first node in sorted name order. `None` when no node passes the filter; the filter
/// result says why each node failed.
pub fn place(
    alg: &Algorithm,
    snap: &Snapshot,
    app: &str,
    nodes: &[String],
) -> Result<(Option<String>, FilterResult), PlacementError> {
    let filtered = alg.filter(snap, app, nodes)?;
    let scores = alg.prioritize(snap, app, &filtered.nodes)?;
    // `prioritize` returns sorted names; keeping the first of the maximum keeps the smallest name.
    let mut best: Option<(&String, i64)> = None;
    for (node, score) in &scores {
        if best.is_none_or(|(_, s)| *score > s) {
            best = Some((node, *score));
        }
    }
    Ok((best.map(|(n, _)| n.clone()), filtered))
}

/// wca's quality report for one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulationReport {
    /// Nodes at least one assignment overflowed, in percent of all nodes.
    pub broken_nodes_pct: f64,
    /// Assignments that overflowed their node (wca's "broken assignments").
    pub broken_assignments: usize,
    /// `broken_assignments / assigned × 100`: wca's `broken%` in its published experiment.
    pub broken_assignments_pct: f64,
    /// Tasks that found a node.
    pub assigned: usize,
    /// `assigned / tasks × 100`.
    pub scheduled_pct: f64,
    /// `Σ used / Σ capacity` per dimension over all nodes, in percent.
    pub utilisation_pct: BTreeMap<Dim, f64>,
    /// The mean of `utilisation_pct` over the dimensions: wca's `utilization%`.
    pub utilisation_mean_pct: f64,
    /// `1 − variance` of every node's `used / capacity` in every dimension it has, taken as one
    /// list (the sample variance, `n − 1`, as Python's `statistics.variance` in wca's report).
    pub balance: f64,
    /// The broken nodes, sorted.
    pub(crate) broken_nodes: Vec<String>,
    /// Tasks that found no node, per app.
    pub(crate) unscheduled: BTreeMap<String, usize>,
    /// Where each task went (`None`: not scheduled), in task order.
    pub placements: Vec<Option<String>>,
}

/// How far below zero a free amount may go and still fit, as wca's simulator allows (it checks
/// `free > 0 or |free| < 0.0001`), so that sums of fractional requests do not break a node.
const TOLERANCE: f64 = 1e-4;

/// Runs the tasks (app names, in order) through `alg` on the nodes of `snap`, as wca's cluster
/// simulator does: for each task, filter all nodes, prioritize the survivors, assign to the best
/// ([`place`]); a task no node passes stays unscheduled (no retry). The assignment is checked
/// against every dimension the node has capacity for, whatever `alg` looks at (read and write
/// bandwidth combined as Fit combines them); one that overflows counts as broken and marks the
/// node broken, and the node still takes the task.
pub fn simulate(
    alg: &Algorithm,
    mut snap: Snapshot,
    tasks: &[String],
) -> Result<SimulationReport, PlacementError> {
    let nodes: Vec<String> = snap.node_capacities.keys().cloned().collect();
    let mut broken = BTreeSet::new();
    let mut broken_assignments = 0;
    let mut unscheduled: BTreeMap<String, usize> = BTreeMap::new();
    let mut placements = Vec::with_capacity(tasks.len());
    for app in tasks {
        let (chosen, _) = place(alg, &snap, app, &nodes)?;
        match &chosen {
            Some(node) => {
                let cap = snap.capacity(node, 1.0);
                let dims: Vec<Dim> = cap.keys().copied().collect();
                let overflows = snapshot::free(&cap, &snap.demand(node, app), &dims)
                    .iter()
                    .any(|(_, free)| free.is_some_and(|f| f < -TOLERANCE));
                if overflows {
                    broken_assignments += 1;
                    broken.insert(node.clone());
                }
                let apps = snap.assigned_apps.entry(node.clone()).or_default();
                let n = apps.get(app).map_or(0, Assigned::count);
                apps.insert(app.clone(), Assigned::Count(n + 1));
            }
            None => *unscheduled.entry(app.clone()).or_default() += 1,
        }
        placements.push(chosen);
    }
    let pct = |part: usize, whole: usize| {
        if whole == 0 {
            0.0
        } else {
            part as f64 * 100.0 / whole as f64
        }
    };
    let mut used_sum: BTreeMap<Dim, f64> = BTreeMap::new();
    let mut cap_sum: BTreeMap<Dim, f64> = BTreeMap::new();
    let mut fractions = Vec::new();
    for node in &nodes {
        let cap = snap.capacity(node, 1.0);
        let used = snap.used(node);
        for (dim, c) in &cap {
            let u = used.get(dim).copied().unwrap_or(0.0);
            *used_sum.entry(*dim).or_insert(0.0) += u;
            *cap_sum.entry(*dim).or_insert(0.0) += c;
            if *c > 0.0 {
                fractions.push(u / c);
            }
        }
    }
    let utilisation_pct: BTreeMap<Dim, f64> = cap_sum
        .iter()
        .filter(|(_, c)| **c > 0.0)
        .map(|(d, c)| (*d, used_sum.get(d).copied().unwrap_or(0.0) * 100.0 / c))
        .collect();
    let utilisation_mean_pct = if utilisation_pct.is_empty() {
        0.0
    } else {
        utilisation_pct.values().sum::<f64>() / utilisation_pct.len() as f64
    };
    let assigned = placements.iter().filter(|p| p.is_some()).count();
    Ok(SimulationReport {
        broken_nodes_pct: pct(broken.len(), nodes.len()),
        broken_assignments,
        broken_assignments_pct: pct(broken_assignments, assigned),
        assigned,
        scheduled_pct: pct(assigned, tasks.len()),
        utilisation_pct,
        utilisation_mean_pct,
        balance: 1.0 - sample_variance(&fractions),
        broken_nodes: broken.into_iter().collect(),
        unscheduled,
        placements,
    })
}

/// `Σ (x − mean)² / (n − 1)`; 0 for fewer than two values.
fn sample_variance(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
}

#[cfg(test)]
mod tests;
