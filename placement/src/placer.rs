//! Placing many instances quickly: the same choices as [`crate::place`] called once per instance
//! on a snapshot updated after each, without recomputing every node for every instance.
//!
//! [`crate::place`] recomputes each node's used amounts from its assigned apps, for every node,
//! for every instance: a thousand instances on a thousand nodes are a million such sums. The
//! [`Placer`] keeps each candidate's capacity and used amounts in a dense [`PerDim`], and for one
//! app evaluates every node once; after a placement only the node that took the instance changes
//! (filter pass 1 and the priority read only the node itself), and pass 2 (HierBAR, Score), which
//! reads only which nodes passed pass 1, runs again only when that set changes. The node that took
//! the instance has its used amounts summed again from its assigned apps, exactly as the snapshot
//! sums them, so results are equal to the slow path's to the last bit (a test compares them).
//!
//! Long calls can be stopped: every step reports its work to a `check` function given by the
//! caller (the Lua sandbox stops at its deadline), which is asked at least every
//! [`CHECK_EVERY`] units of work (a node evaluated, a node compared, a placement).

use std::collections::{BTreeMap, BTreeSet};

use crate::algorithms::{Algorithm, FilterResult, Kind, PlacementError};
use crate::snapshot::{Assigned, PerDim, Snapshot};

/// Units of work between two calls of the `check` function.
pub const CHECK_EVERY: u64 = 1024;

/// Why a placer call did not finish.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlaceError {
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The `check` function said stop.
    #[error("stopped by the caller")]
    Stopped,
}

/// What the caller's `check` function is told: the placements made so far by this placer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub placed: u64,
}

/// Counts work and asks `check` now and then.
struct Meter<'c> {
    check: &'c mut dyn FnMut(Progress) -> bool,
    until_check: u64,
}

impl Meter<'_> {
    fn spend(&mut self, work: u64, placed: u64) -> Result<(), PlaceError> {
        if self.until_check > work {
            self.until_check -= work;
            return Ok(());
        }
        self.until_check = CHECK_EVERY;
        if (self.check)(Progress { placed }) {
            Ok(())
        } else {
            Err(PlaceError::Stopped)
        }
    }
}

/// The instances of one app placed by [`Placer::place`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// The chosen nodes in order, as indices into [`Placer::nodes`] (one per instance placed).
    pub chosen: Vec<usize>,
    /// Instances that found no node (placing stops at the first).
    pub unplaced: u64,
    /// Why each refused node would refuse one more instance, after these placements: for an app
    /// with unplaced instances, why they found no node.
    pub failed: BTreeMap<String, String>,
}

/// A snapshot with the candidates' capacities and used amounts kept dense, for many placements.
#[derive(Debug, Clone)]
pub struct Placer<'a> {
    alg: &'a Algorithm,
    snap: Snapshot,
    /// The candidates, sorted, without duplicates.
    nodes: Vec<String>,
    /// Per candidate: capacity with the algorithm's CPU scale applied.
    cap: Vec<PerDim>,
    /// Per candidate: the sum of what runs there.
    used: Vec<PerDim>,
    /// Per candidate: how many instances of each app run there (`Snapshot::count` without
    /// looking the node up among all nodes, for `max_per_node`).
    counts: Vec<BTreeMap<String, u64>>,
    /// The algorithm has a pass 2 that reads the set of pass-1 survivors.
    two_pass: bool,
    placed: u64,
}

/// Filter pass 1 and the score of one candidate for one app.
type Eval = (Result<(), String>, i64);

impl<'a> Placer<'a> {
    /// A placer for `alg` over `candidates` (any order, duplicates ignored) of `snap`.
    pub fn new(alg: &'a Algorithm, snap: Snapshot, candidates: &[String]) -> Placer<'a> {
        let nodes: Vec<String> = candidates
            .iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .cloned()
            .collect();
        let scale = alg.cpu_scale_factor();
        let cap = nodes
            .iter()
            .map(|n| PerDim::of(&snap.capacity(n, scale)))
            .collect();
        let used = nodes.iter().map(|n| PerDim::of(&snap.used(n))).collect();
        let counts = nodes
            .iter()
            .map(|n| {
                snap.assigned_apps.get(n).map_or(BTreeMap::new(), |apps| {
                    apps.iter().map(|(a, n)| (a.clone(), n.count())).collect()
                })
            })
            .collect();
        Placer {
            alg,
            snap,
            nodes,
            cap,
            used,
            counts,
            two_pass: matches!(alg.kind, Kind::HierBar { .. } | Kind::Score { .. }),
            placed: 0,
        }
    }

    /// The candidates in sorted order; [`Placement::chosen`] indexes them.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The snapshot with every placement so far counted in `assigned_apps`.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    pub fn into_snapshot(self) -> Snapshot {
        self.snap
    }

    /// The error `Algorithm::filter` gives for an app it cannot judge (no spec).
    fn known(&self, app: &str) -> Result<(), PlacementError> {
        self.alg.filter(&self.snap, app, &[]).map(|_| ())
    }

    fn request(&self, app: &str) -> PerDim {
        self.snap
            .apps_spec
            .get(app)
            .map(PerDim::of)
            .unwrap_or_default()
    }

    /// Pass 1 and, for a node that passes, its score for one more `app`.
    fn eval(&self, i: usize, app: &str, request: &PerDim, max_per_node: Option<u64>) -> Eval {
        let node = &self.nodes[i];
        if let Some(max) = max_per_node {
            let count = self.counts[i].get(app).copied().unwrap_or(0);
            if count >= max {
                return (
                    Err(format!(
                        "App {app} has {count} instances here, max_per_node is {max}."
                    )),
                    0,
                );
            }
        }
        let load = || (self.cap[i], self.used[i].plus(request));
        match self.alg.app_fit_node_given(&self.snap, node, app, load) {
            Ok(()) => {
                let priority = self.alg.priority_given(load);
                (Ok(()), (priority * self.alg.max_node_score) as i64)
            }
            Err(reason) => (Err(reason), 0),
        }
    }

    fn eval_all(
        &self,
        app: &str,
        max_per_node: Option<u64>,
        meter: &mut Meter,
    ) -> Result<Vec<Eval>, PlaceError> {
        let request = self.request(app);
        let mut out = Vec::with_capacity(self.nodes.len());
        for i in 0..self.nodes.len() {
            meter.spend(1, self.placed)?;
            out.push(self.eval(i, app, &request, max_per_node));
        }
        Ok(out)
    }

    /// Pass 2 over the pass-1 survivors: the nodes it refuses, by index, with reasons.
    fn pass2(&self, app: &str, evals: &[Eval]) -> BTreeMap<usize, String> {
        if !self.two_pass {
            return BTreeMap::new();
        }
        let survivors: Vec<String> = evals
            .iter()
            .zip(&self.nodes)
            .filter(|((pass, _), _)| pass.is_ok())
            .map(|(_, n)| n.clone())
            .collect();
        let rejected = self.alg.app_fit_nodes(&self.snap, &survivors, app);
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| rejected.get(n).map(|r| (i, r.clone())))
            .collect()
    }

    fn failed(&self, evals: &[Eval], pass2: &BTreeMap<usize, String>) -> BTreeMap<String, String> {
        let mut failed: BTreeMap<String, String> = evals
            .iter()
            .zip(&self.nodes)
            .filter_map(|((pass, _), n)| pass.as_ref().err().map(|r| (n.clone(), r.clone())))
            .collect();
        failed.extend(
            pass2
                .iter()
                .map(|(i, r)| (self.nodes[*i].clone(), r.clone())),
        );
        failed
    }

    /// Both filter passes for one instance of `app`: equal to `Algorithm::filter` on the
    /// candidates.
    pub fn filter(
        &self,
        app: &str,
        check: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<FilterResult, PlaceError> {
        self.known(app)?;
        let mut meter = Meter {
            check,
            until_check: CHECK_EVERY,
        };
        let request = self.request(app);
        let mut evals = Vec::with_capacity(self.nodes.len());
        for i in 0..self.nodes.len() {
            meter.spend(1, self.placed)?;
            let node = &self.nodes[i];
            let load = || (self.cap[i], self.used[i].plus(&request));
            evals.push((self.alg.app_fit_node_given(&self.snap, node, app, load), 0));
        }
        let pass2 = self.pass2(app, &evals);
        let nodes = evals
            .iter()
            .enumerate()
            .filter(|(i, (pass, _))| pass.is_ok() && !pass2.contains_key(i))
            .map(|(i, _)| self.nodes[i].clone())
            .collect();
        Ok(FilterResult {
            nodes,
            failed: self.failed(&evals, &pass2),
        })
    }

    /// The scores of every candidate for one more `app`, unfiltered, in sorted order: equal to
    /// `Algorithm::prioritize` on the candidates.
    pub fn prioritize(
        &self,
        app: &str,
        check: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<Vec<(String, i64)>, PlaceError> {
        self.known(app)?;
        let mut meter = Meter {
            check,
            until_check: CHECK_EVERY,
        };
        let request = self.request(app);
        let mut out = Vec::with_capacity(self.nodes.len());
        for (i, node) in self.nodes.iter().enumerate() {
            meter.spend(1, self.placed)?;
            let p = self
                .alg
                .priority_given(|| (self.cap[i], self.used[i].plus(&request)));
            out.push((node.clone(), (p * self.alg.max_node_score) as i64));
        }
        Ok(out)
    }

    /// Places up to `count` instances of `app` one after another, each counted on its node before
    /// the next is placed; each goes where `place` would put it. With `max_per_node`, a node
    /// already running that many instances of `app` is refused as well (a verwalter addition:
    /// wca has no such limit). Stops at the first instance no node takes.
    pub fn place(
        &mut self,
        app: &str,
        count: u64,
        max_per_node: Option<u64>,
        check: &mut dyn FnMut(Progress) -> bool,
    ) -> Result<Placement, PlaceError> {
        self.known(app)?;
        let mut meter = Meter {
            check,
            until_check: CHECK_EVERY,
        };
        let request = self.request(app);
        let mut evals = self.eval_all(app, max_per_node, &mut meter)?;
        let mut pass2 = self.pass2(app, &evals);
        let mut out = Placement::default();
        for done in 0..count {
            meter.spend(self.nodes.len() as u64 + 1, self.placed)?;
            // The highest score; the first in sorted order among equals, as `place` picks.
            let mut best: Option<(usize, i64)> = None;
            for (i, (pass, score)) in evals.iter().enumerate() {
                if pass.is_ok() && best.is_none_or(|(_, s)| *score > s) && !pass2.contains_key(&i) {
                    best = Some((i, *score));
                }
            }
            let Some((i, _)) = best else {
                out.unplaced = count - done;
                break;
            };
            self.add(i, app);
            out.chosen.push(i);
            let passed = evals[i].0.is_ok();
            evals[i] = self.eval(i, app, &request, max_per_node);
            if passed != evals[i].0.is_ok() {
                pass2 = self.pass2(app, &evals);
            }
        }
        out.failed = self.failed(&evals, &pass2);
        Ok(out)
    }

    /// Counts one more `app` on candidate `i` and sums its used amounts again.
    fn add(&mut self, i: usize, app: &str) {
        let node = &self.nodes[i];
        let apps = self.snap.assigned_apps.entry(node.clone()).or_default();
        let n = apps.get(app).map_or(0, Assigned::count);
        apps.insert(app.to_string(), Assigned::Count(n + 1));
        self.counts[i].insert(app.to_string(), n + 1);
        self.used[i] = PerDim::of(&self.snap.used(node));
        self.placed += 1;
    }
}

#[cfg(test)]
mod tests;
