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
//! For the algorithms whose pass 1 and score read nothing but a node's capacity and used amounts
//! (NOP, Fit, BAR, LeastUsed, LeastUsedBAR), candidates whose capacity and used amounts are equal
//! bit for bit form one class ([`Classes`]), judged once per app: a fleet of a few node shapes
//! running a few request sizes has tens of classes for a thousand nodes. `max_per_node` is checked
//! per node beside it. The others (HierBAR and Score read which nodes passed, StaticAssigner and
//! DramHitRatioProvision the node's name) evaluate every node.
//!
//! Long calls can be stopped: every step reports its work to a `check` function given by the
//! caller (the Lua sandbox stops at its deadline), which is asked at least every
//! [`CHECK_EVERY`] units of work (a node evaluated, a node compared, a placement).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::algorithms::{Algorithm, FilterResult, PlacementError};
use crate::snapshot::{Assigned, PerDim, Snapshot};

/// Units of work between two calls of the `check` function.
pub(crate) const CHECK_EVERY: u64 = 1024;

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
pub struct Placed {
    pub placed: u64,
}

/// Counts work and asks `check` now and then.
struct Meter<'c> {
    check: &'c mut dyn FnMut(Placed) -> bool,
    until_check: u64,
}

impl<'c> Meter<'c> {
    /// A meter that asks `check` after the first [`CHECK_EVERY`] units of work.
    fn new(check: &'c mut dyn FnMut(Placed) -> bool) -> Self {
        Meter {
            check,
            until_check: CHECK_EVERY,
        }
    }

    fn spend(&mut self, work: u64, placed: u64) -> Result<(), PlaceError> {
        if self.until_check > work {
            self.until_check -= work;
            return Ok(());
        }
        self.until_check = CHECK_EVERY;
        if (self.check)(Placed { placed }) {
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
    /// Per app: the candidates that run instances of it, with how many (`Snapshot::count`
    /// without looking the node up among all nodes, for `max_per_node`); an app not here runs
    /// nowhere. Kept sparse: a call may name thousands of apps and nodes.
    counts: HashMap<String, Vec<(usize, u64)>>,
    /// The algorithm has a pass 2 that reads the set of pass-1 survivors.
    two_pass: bool,
    /// The candidates by class, when the algorithm judges a node by its capacity and used amounts
    /// alone.
    classes: Option<Classes>,
    placed: u64,
}

/// Candidates with equal capacity and used amounts (bit for bit), for the algorithms that judge
/// a node by nothing else: one evaluation per class stands for each member's.
#[derive(Debug, Clone, Default)]
struct Classes {
    /// Per candidate: its class.
    of: Vec<usize>,
    /// Per class: its members in candidate order (empty for a slot not in use).
    members: Vec<BTreeSet<usize>>,
    /// Per class: capacity and used amounts.
    load: Vec<(PerDim, PerDim)>,
    /// The class of a capacity and used amounts.
    index: HashMap<LoadKey, usize>,
    /// Class slots left empty, to use again.
    free: Vec<usize>,
}

/// Capacity and used amounts, bit for bit, with which dimensions are given.
type LoadKey = ([u64; 12], u16);

fn load_key(cap: &PerDim, used: &PerDim) -> LoadKey {
    let mut bits = [0; 12];
    let mut given = 0u16;
    for (k, v) in cap.0.iter().chain(&used.0).enumerate() {
        if let Some(v) = v {
            bits[k] = v.to_bits();
            given |= 1 << k;
        }
    }
    (bits, given)
}

impl Classes {
    fn new(cap: &[PerDim], used: &[PerDim]) -> Classes {
        let mut classes = Classes::default();
        for i in 0..cap.len() {
            let c = classes.class_for(&cap[i], &used[i]).0;
            classes.members[c].insert(i);
            classes.of.push(c);
        }
        classes
    }

    /// The class of this load, and whether it was made now.
    fn class_for(&mut self, cap: &PerDim, used: &PerDim) -> (usize, bool) {
        let key = load_key(cap, used);
        if let Some(&c) = self.index.get(&key) {
            return (c, false);
        }
        let c = match self.free.pop() {
            Some(c) => {
                self.load[c] = (*cap, *used);
                c
            }
            None => {
                self.members.push(BTreeSet::new());
                self.load.push((*cap, *used));
                self.members.len() - 1
            }
        };
        self.index.insert(key, c);
        (c, true)
    }

    /// Moves candidate `i` to the class of its new load; returns the class if it was made now.
    fn moved(&mut self, i: usize, cap: &PerDim, used: &PerDim) -> Option<usize> {
        let old = self.of[i];
        let (c, new) = self.class_for(cap, used);
        if c == old {
            return None;
        }
        self.members[old].remove(&i);
        if self.members[old].is_empty() {
            self.index
                .remove(&load_key(&self.load[old].0, &self.load[old].1));
            self.free.push(old);
        }
        self.members[c].insert(i);
        self.of[i] = c;
        new.then_some(c)
    }
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
        let cap: Vec<PerDim> = nodes
            .iter()
            .map(|n| PerDim::of(&snap.capacity(n, scale)))
            .collect();
        let used: Vec<PerDim> = nodes.iter().map(|n| PerDim::of(&snap.used(n))).collect();
        let mut counts: HashMap<String, Vec<(usize, u64)>> = HashMap::new();
        for (i, node) in nodes.iter().enumerate() {
            for (app, assigned) in snap.assigned_apps.get(node).into_iter().flatten() {
                if assigned.count() > 0 {
                    counts
                        .entry(app.clone())
                        .or_default()
                        .push((i, assigned.count()));
                }
            }
        }
        // Pass 1 and the score of these read the node's capacity and used amounts only.
        let spec = alg.kind.spec();
        let by_load = spec.by_load;
        let classes = by_load.then(|| Classes::new(&cap, &used));
        Placer {
            alg,
            snap,
            nodes,
            cap,
            used,
            counts,
            two_pass: spec.two_pass,
            classes,
            placed: 0,
        }
    }

    /// The placer without classes: every node evaluated on its own (the tests compare both).
    #[cfg(test)]
    fn node_by_node(mut self) -> Self {
        self.classes = None;
        self
    }

    /// The candidates in sorted order; [`Placement::chosen`] indexes them.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The snapshot with every placement so far counted in `assigned_apps`.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> &Snapshot {
        &self.snap
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

    /// Pass 1 and, for a node that passes, its score for one more `app`; `counts` are the app's
    /// per candidate.
    fn eval(
        &self,
        i: usize,
        app: &str,
        request: &PerDim,
        max_per_node: Option<u64>,
        counts: &[u64],
    ) -> Eval {
        if let Some(reason) = over_max(app, counts[i], max_per_node) {
            return (Err(reason), 0);
        }
        self.judge(&self.nodes[i], &self.cap[i], &self.used[i], app, request)
    }

    /// Pass 1 and the score of a node with capacity `cap` and `used` amounts.
    fn judge(&self, node: &str, cap: &PerDim, used: &PerDim, app: &str, request: &PerDim) -> Eval {
        let load = || (*cap, used.plus(request));
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
        counts: &[u64],
        meter: &mut Meter,
    ) -> Result<Vec<Eval>, PlaceError> {
        let request = self.request(app);
        let mut out = Vec::with_capacity(self.nodes.len());
        for i in 0..self.nodes.len() {
            meter.spend(1, self.placed)?;
            out.push(self.eval(i, app, &request, max_per_node, counts));
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
        check: &mut dyn FnMut(Placed) -> bool,
    ) -> Result<FilterResult, PlaceError> {
        self.known(app)?;
        let mut meter = Meter::new(check);
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
        check: &mut dyn FnMut(Placed) -> bool,
    ) -> Result<Vec<(String, i64)>, PlaceError> {
        self.known(app)?;
        let mut meter = Meter::new(check);
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
        check: &mut dyn FnMut(Placed) -> bool,
    ) -> Result<Placement, PlaceError> {
        self.known(app)?;
        let mut meter = Meter::new(check);
        // The app's counts, one per candidate while it is placed; kept sparse again however it
        // ends.
        let mut counts = vec![0; self.nodes.len()];
        for &(i, n) in self.counts.get(app).into_iter().flatten() {
            counts[i] = n;
        }
        let result = match self.classes.take() {
            Some(mut classes) => {
                let result = self.place_by_class(
                    &mut classes,
                    app,
                    count,
                    max_per_node,
                    &mut counts,
                    &mut meter,
                );
                self.classes = Some(classes);
                result
            }
            None => self.place_by_node(app, count, max_per_node, &mut counts, &mut meter),
        };
        let running: Vec<(usize, u64)> = counts
            .into_iter()
            .enumerate()
            .filter(|(_, n)| *n > 0)
            .collect();
        if running.is_empty() {
            self.counts.remove(app);
        } else {
            self.counts.insert(app.to_string(), running);
        }
        result
    }

    fn place_by_node(
        &mut self,
        app: &str,
        count: u64,
        max_per_node: Option<u64>,
        counts: &mut [u64],
        meter: &mut Meter,
    ) -> Result<Placement, PlaceError> {
        let request = self.request(app);
        let mut evals = self.eval_all(app, max_per_node, counts, meter)?;
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
            self.add(i, app, counts);
            out.chosen.push(i);
            let passed = evals[i].0.is_ok();
            evals[i] = self.eval(i, app, &request, max_per_node, counts);
            if passed != evals[i].0.is_ok() {
                pass2 = self.pass2(app, &evals);
            }
        }
        out.failed = self.failed(&evals, &pass2);
        Ok(out)
    }

    /// [`Placer::place_by_node`] with one evaluation per class: the same choices (the highest
    /// score, the first candidate in sorted order among equals) and the same reasons.
    fn place_by_class(
        &mut self,
        classes: &mut Classes,
        app: &str,
        count: u64,
        max_per_node: Option<u64>,
        counts: &mut [u64],
        meter: &mut Meter,
    ) -> Result<Placement, PlaceError> {
        let request = self.request(app);
        let judge = |placer: &Self, classes: &Classes, c: usize| {
            let first = *classes.members[c]
                .first()
                .expect("a class in use has members");
            let (cap, used) = &classes.load[c];
            placer.judge(&placer.nodes[first], cap, used, app, &request)
        };
        // Work is counted per node, as the node-by-node path counts it, so `check` is asked as
        // often.
        meter.spend(self.nodes.len() as u64, self.placed)?;
        let mut evals: Vec<Option<Eval>> = (0..classes.members.len())
            .map(|c| (!classes.members[c].is_empty()).then(|| judge(self, classes, c)))
            .collect();
        let blocked = |counts: &[u64], i: usize| max_per_node.is_some_and(|max| counts[i] >= max);
        let mut out = Placement::default();
        for done in 0..count {
            meter.spend(self.nodes.len() as u64 + 1, self.placed)?;
            // (score, candidate): the highest score, the first candidate among equals.
            let mut best: Option<(i64, usize)> = None;
            for (c, eval) in evals.iter().enumerate() {
                let Some((Ok(()), score)) = eval else {
                    continue;
                };
                if best.is_some_and(|(s, _)| *score < s) {
                    continue;
                }
                let Some(&i) = classes.members[c].iter().find(|&&i| !blocked(counts, i)) else {
                    continue;
                };
                if best.is_none_or(|(s, b)| *score > s || i < b) {
                    best = Some((*score, i));
                }
            }
            let Some((_, i)) = best else {
                out.unplaced = count - done;
                break;
            };
            self.add(i, app, counts);
            out.chosen.push(i);
            if let Some(c) = classes.moved(i, &self.cap[i], &self.used[i]) {
                if evals.len() <= c {
                    evals.resize(c + 1, None);
                }
                evals[c] = Some(judge(self, classes, c));
            }
        }
        // Why each refused node would refuse one more: `max_per_node` first, as `eval` checks.
        let mut failed = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some(reason) = over_max(app, counts[i], max_per_node) {
                failed.push((node.clone(), reason));
            } else if let Some((Err(reason), _)) = &evals[classes.of[i]] {
                failed.push((node.clone(), reason.clone()));
            }
        }
        out.failed = failed.into_iter().collect();
        Ok(out)
    }

    /// Counts one more `app` on candidate `i` and sums its used amounts again.
    fn add(&mut self, i: usize, app: &str, counts: &mut [u64]) {
        let node = &self.nodes[i];
        let apps = self.snap.assigned_apps.entry(node.clone()).or_default();
        let n = apps.get(app).map_or(0, Assigned::count);
        apps.insert(app.to_string(), Assigned::Count(n + 1));
        counts[i] = n + 1;
        self.used[i] = PerDim::of(&self.snap.used(node));
        self.placed += 1;
    }
}

/// The refusal of a node that already runs `count` instances of `app`, at `max_per_node` or more.
fn over_max(app: &str, count: u64, max_per_node: Option<u64>) -> Option<String> {
    match max_per_node {
        Some(max) if count >= max => Some(format!(
            "App {app} has {count} instances here, max_per_node is {max}."
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
