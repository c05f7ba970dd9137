//! The placer against the slow path: `place` once per instance on a snapshot updated after each.

use std::collections::BTreeMap;

use super::*;
use crate::algorithms::Kind;
use crate::simulate::place;
use crate::snapshot::{Dim, NodeFacts, NodeType};

/// A small deterministic generator (xorshift), so the cases are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A value with a few decimals, so sums are not exact in binary.
    fn amount(&mut self, max: u64) -> f64 {
        (self.below(max * 10) + 1) as f64 / 10.0
    }
}

const DIMS: [Dim; 4] = [Dim::Cpu, Dim::Mem, Dim::MembwRead, Dim::MembwWrite];
const APPS: [&str; 4] = ["a", "b", "c", "d"];

fn snapshot(rng: &mut Rng, nodes: usize) -> Snapshot {
    let mut snap = Snapshot::default();
    // A few node shapes, so HierBAR has classes.
    let shapes: Vec<BTreeMap<Dim, f64>> = (0..3)
        .map(|_| DIMS.iter().map(|d| (*d, rng.amount(40) + 10.0)).collect())
        .collect();
    for i in 0..nodes {
        let name = format!("n{i:02}");
        let shape = shapes[rng.below(3) as usize].clone();
        snap.node_capacities.insert(name.clone(), shape);
        snap.nodes.insert(
            name.clone(),
            NodeFacts {
                platform_dram_hit_ratio: Some(0.9 + rng.below(10) as f64 / 100.0),
                node_type: Some(if rng.below(3) == 0 {
                    NodeType::Pmem
                } else {
                    NodeType::Dram
                }),
            },
        );
        for app in APPS {
            if rng.below(3) == 0 {
                snap.assigned_apps
                    .entry(name.clone())
                    .or_default()
                    .insert(app.into(), Assigned::Count(rng.below(3)));
            }
        }
    }
    for (k, app) in APPS.iter().enumerate() {
        snap.apps_spec.insert(
            app.to_string(),
            DIMS.iter().map(|d| (*d, rng.amount(6))).collect(),
        );
        snap.app_profiles.insert(app.to_string(), k as f64);
    }
    snap
}

fn algorithms(snap: &Snapshot) -> Vec<Algorithm> {
    let weights: BTreeMap<Dim, f64> = [(Dim::Cpu, 2.0), (Dim::Mem, 0.5)].into();
    let targets = snap
        .node_capacities
        .keys()
        .enumerate()
        .map(|(i, n)| {
            let counts = APPS
                .iter()
                .map(|a| (a.to_string(), (i % 4) as u64))
                .collect();
            (n.clone(), counts)
        })
        .collect();
    let kinds = vec![
        Kind::Nop,
        Kind::Fit {
            cpu_scale_factor: 1.5,
        },
        Kind::Bar {
            cpu_scale_factor: 1.0,
            bar_weights: weights.clone(),
        },
        Kind::LeastUsed {
            cpu_scale_factor: 1.0,
            least_used_weights: weights.clone(),
        },
        Kind::LeastUsedBar {
            cpu_scale_factor: 1.0,
            bar_weights: BTreeMap::new(),
            least_used_weights: BTreeMap::new(),
            least_used_weight: 2.0,
        },
        Kind::HierBar {
            cpu_scale_factor: 1.0,
            bar_weights: BTreeMap::new(),
            least_used_weights: BTreeMap::new(),
            least_used_weight: 1.0,
            merge_threshold: None,
        },
        Kind::HierBar {
            cpu_scale_factor: 1.0,
            bar_weights: BTreeMap::new(),
            least_used_weights: BTreeMap::new(),
            least_used_weight: 1.0,
            merge_threshold: Some(1.0),
        },
        Kind::StaticAssigner {
            targeted_assigned_apps_counts: targets,
        },
        Kind::DramHitRatioProvision { threshold: 0.95 },
        Kind::Score {
            cpu_scale_factor: 1.0,
            threshold: 0.95,
            score_target: None,
            strict_mode_placement: false,
        },
        Kind::Score {
            cpu_scale_factor: 2.0,
            threshold: 0.93,
            score_target: Some(1.0),
            strict_mode_placement: true,
        },
    ];
    let mut out = Vec::new();
    for kind in kinds {
        out.push(Algorithm::new(kind.clone()));
        out.push(Algorithm::new(kind).with_dimensions(&DIMS));
    }
    out
}

fn go_on(_: Placed) -> bool {
    true
}

/// `place` once per instance, counting each, as `simulate` does.
fn slow(
    alg: &Algorithm,
    mut snap: Snapshot,
    nodes: &[String],
    app: &str,
    count: u64,
) -> Vec<String> {
    let mut chosen = Vec::new();
    for _ in 0..count {
        let (best, _) = place(alg, &snap, app, nodes).unwrap();
        let Some(node) = best else { break };
        let apps = snap.assigned_apps.entry(node.clone()).or_default();
        let n = apps.get(app).map_or(0, Assigned::count);
        apps.insert(app.into(), Assigned::Count(n + 1));
        chosen.push(node);
    }
    chosen
}

#[test]
fn the_placer_chooses_as_place_does_for_every_algorithm() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..12 {
        let snap = snapshot(&mut rng, 5 + round * 3);
        // Some candidates twice and one unknown node: both paths take them the same way.
        let mut candidates: Vec<String> = snap.node_capacities.keys().rev().cloned().collect();
        candidates.push(candidates[0].clone());
        candidates.push("stranger".into());
        for alg in algorithms(&snap) {
            let mut placer = Placer::new(&alg, snap.clone(), &candidates);
            let mut expected_snap = snap.clone();
            for app in APPS {
                let count = 1 + rng.below(12);
                // Filter and prioritize equal the algorithm's own, before and after placements.
                assert_eq!(
                    placer.filter(app, &mut go_on).unwrap(),
                    alg.filter(placer.snapshot(), app, &candidates).unwrap(),
                    "{alg:?}"
                );
                assert_eq!(
                    placer.prioritize(app, &mut go_on).unwrap(),
                    alg.prioritize(placer.snapshot(), app, &candidates).unwrap()
                );
                let expected = slow(&alg, expected_snap.clone(), &candidates, app, count);
                let got = placer.place(app, count, None, &mut go_on).unwrap();
                let names: Vec<String> = got
                    .chosen
                    .iter()
                    .map(|i| placer.nodes()[*i].clone())
                    .collect();
                assert_eq!(names, expected, "{alg:?}, app {app}, round {round}");
                assert_eq!(got.unplaced, count - expected.len() as u64);
                for node in &expected {
                    let apps = expected_snap.assigned_apps.entry(node.clone()).or_default();
                    let n = apps.get(app).map_or(0, Assigned::count);
                    apps.insert(app.into(), Assigned::Count(n + 1));
                }
                // Why nodes refuse the next instance: the filter on the updated snapshot.
                let next = alg.filter(&expected_snap, app, &candidates).unwrap();
                assert_eq!(got.failed, next.failed, "{alg:?}");
            }
        }
    }
}

fn two_nodes() -> (Snapshot, Vec<String>) {
    let mut snap = Snapshot::default();
    for n in ["n1", "n2"] {
        snap.node_capacities
            .insert(n.into(), [(Dim::Cpu, 4.0), (Dim::Mem, 8.0)].into());
    }
    snap.apps_spec
        .insert("web".into(), [(Dim::Cpu, 1.0), (Dim::Mem, 1.0)].into());
    (snap, vec!["n1".into(), "n2".into()])
}

#[test]
fn max_per_node_refuses_a_node_that_has_enough() {
    let (snap, nodes) = two_nodes();
    let alg = Algorithm::new(Kind::Nop);
    let mut placer = Placer::new(&alg, snap, &nodes);
    // NOP ties everywhere: without the limit every instance goes to n1.
    let got = placer.place("web", 3, Some(1), &mut go_on).unwrap();
    assert_eq!(got.chosen, vec![0, 1]);
    assert_eq!(got.unplaced, 1);
    assert_eq!(
        got.failed["n1"],
        "App web has 1 instances here, max_per_node is 1."
    );
}

#[test]
fn a_check_that_says_stop_stops_a_long_placement() {
    let (snap, nodes) = two_nodes();
    let alg = Algorithm::new(Kind::Nop);
    let mut placer = Placer::new(&alg, snap, &nodes);
    let mut calls = 0;
    let mut stop_at_5000 = |p: Placed| {
        calls += 1;
        p.placed < 5000
    };
    let got = placer.place("web", u64::MAX, None, &mut stop_at_5000);
    assert_eq!(got, Err(PlaceError::Stopped));
    assert!(calls > 1);
    // Nothing was lost: the placements made until then are counted.
    assert!(placer.snapshot().count("n1", "web") >= 5000);
    assert_eq!(
        placer.place("nope", 1, None, &mut go_on).unwrap().chosen,
        vec![0],
        "NOP needs no spec"
    );
    let fit = Algorithm::new(Kind::Fit {
        cpu_scale_factor: 1.0,
    });
    let mut placer = Placer::new(&fit, two_nodes().0, &nodes);
    assert_eq!(
        placer.place("nope", 1, None, &mut go_on),
        Err(PlaceError::Placement(PlacementError::UnknownApp {
            app: "nope".into()
        }))
    );
}

/// Nodes of a few shapes with a few request sizes running: many candidates share a class.
fn fleet(rng: &mut Rng, nodes: usize) -> Snapshot {
    let mut snap = Snapshot::default();
    let shapes: Vec<BTreeMap<Dim, f64>> = (0..2)
        .map(|_| DIMS.iter().map(|d| (*d, rng.amount(20) + 10.0)).collect())
        .collect();
    for (k, app) in APPS.iter().enumerate() {
        // Two apps of the same size, and one without a request in one dimension.
        let size = rng.amount(4);
        let spec = DIMS
            .iter()
            .filter(|d| k != 3 || **d != Dim::Mem)
            .map(|d| (*d, if k == 1 { snap.apps_spec["a"][d] } else { size }))
            .collect();
        snap.apps_spec.insert(app.to_string(), spec);
    }
    for i in 0..nodes {
        let name = format!("n{i:03}");
        snap.node_capacities
            .insert(name.clone(), shapes[rng.below(2) as usize].clone());
        if rng.below(4) == 0 {
            let app = APPS[rng.below(4) as usize];
            snap.assigned_apps
                .entry(name)
                .or_default()
                .insert(app.into(), Assigned::Count(1 + rng.below(2)));
        }
    }
    snap
}

#[test]
fn classes_choose_and_refuse_as_node_by_node_does() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for round in 0..8 {
        let snap = if round % 2 == 0 {
            fleet(&mut rng, 40 + round * 10)
        } else {
            snapshot(&mut rng, 10 + round * 3)
        };
        let mut candidates: Vec<String> = snap.node_capacities.keys().cloned().collect();
        candidates.push("stranger".into());
        for alg in algorithms(&snap) {
            let mut by_class = Placer::new(&alg, snap.clone(), &candidates);
            let mut by_node = Placer::new(&alg, snap.clone(), &candidates).node_by_node();
            for step in 0..10 {
                let app = APPS[rng.below(4) as usize];
                let count = rng.below(if step % 3 == 0 { 200 } else { 20 });
                let max_per_node =
                    [None, Some(0), Some(1), Some(2), Some(3)][rng.below(5) as usize];
                let want = by_node.place(app, count, max_per_node, &mut go_on);
                let got = by_class.place(app, count, max_per_node, &mut go_on);
                assert_eq!(
                    got, want,
                    "{alg:?}, app {app}, count {count}, max {max_per_node:?}"
                );
            }
            assert_eq!(by_class.snapshot(), by_node.snapshot(), "{alg:?}");
        }
    }
}

#[test]
fn equal_nodes_make_one_class_and_a_placement_moves_its_node() {
    let (mut snap, _) = two_nodes();
    for n in ["n3", "n4"] {
        snap.node_capacities
            .insert(n.into(), [(Dim::Cpu, 4.0), (Dim::Mem, 8.0)].into());
    }
    let nodes: Vec<String> = snap.node_capacities.keys().cloned().collect();
    let alg = Algorithm::new(Kind::LeastUsedBar {
        cpu_scale_factor: 1.0,
        bar_weights: BTreeMap::new(),
        least_used_weights: BTreeMap::new(),
        least_used_weight: 1.0,
    });
    let mut placer = Placer::new(&alg, snap, &nodes);
    let live = |p: &Placer| {
        let c = p.classes.as_ref().unwrap();
        c.members.iter().filter(|m| !m.is_empty()).count()
    };
    assert_eq!(live(&placer), 1);
    let got = placer.place("web", 2, None, &mut go_on).unwrap();
    // The emptiest node first, the first in order among equals: n1, then n2.
    assert_eq!(got.chosen, vec![0, 1]);
    // n1 and n2 run one web each now: one class; n3 and n4 the other.
    assert_eq!(live(&placer), 2);
}
