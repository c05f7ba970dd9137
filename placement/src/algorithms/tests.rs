//! Each algorithm on hand-computed cases: the scores and reasons a user sees.

use std::collections::BTreeMap;

use super::*;
use crate::snapshot::{Assigned, NodeFacts, NodeType};

fn caps(pairs: &[(Dim, f64)]) -> BTreeMap<Dim, f64> {
    pairs.iter().copied().collect()
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// One node `n` of the given capacity, one app `app` of the given request.
fn one(cap: &[(Dim, f64)], req: &[(Dim, f64)]) -> Snapshot {
    let mut s = Snapshot::default();
    s.node_capacities.insert("n".into(), caps(cap));
    s.apps_spec.insert("app".into(), caps(req));
    s
}

fn score(alg: &Algorithm, snap: &Snapshot) -> i64 {
    alg.prioritize(snap, "app", &names(&["n"])).unwrap()[0].1
}

fn bar_alg(dims: &[Dim], weights: &[(Dim, f64)]) -> Algorithm {
    Algorithm::new(Kind::Bar {
        cpu_scale_factor: 1.0,
        bar_weights: caps(weights),
    })
    .with_dimensions(dims)
}

fn least_used_alg(weights: &[(Dim, f64)]) -> Algorithm {
    Algorithm::new(Kind::LeastUsed {
        cpu_scale_factor: 1.0,
        least_used_weights: caps(weights),
    })
}

const CPU_MEM: [Dim; 2] = [Dim::Cpu, Dim::Mem];

#[test]
fn nop_accepts_everything_and_scores_zero() {
    let snap = one(&[(Dim::Cpu, 1.0)], &[(Dim::Cpu, 100.0)]);
    let nop = Algorithm::new(Kind::Nop);
    let r = nop
        .filter(&snap, "unknown-app", &names(&["n", "m"]))
        .unwrap();
    assert_eq!(r.nodes, names(&["m", "n"]));
    assert!(r.failed.is_empty());
    assert_eq!(score(&nop, &snap), 0);
}

#[test]
fn fit_rejects_with_the_shortfall_and_scales_cpu_on_pmem() {
    let mut snap = one(
        &[(Dim::Cpu, 4.0), (Dim::Mem, 8.0)],
        &[(Dim::Cpu, 6.0), (Dim::Mem, 2.0)],
    );
    snap.node_capacities
        .insert("p".into(), caps(&[(Dim::Cpu, 4.0), (Dim::Mem, 8.0)]));
    snap.nodes.insert(
        "p".into(),
        NodeFacts {
            node_type: Some(NodeType::Pmem),
            ..NodeFacts::default()
        },
    );
    // Used: one instance already on n (6 cpu, 2 mem) → demand 12 cpu, 4 mem.
    let fit = |f| {
        Algorithm::new(Kind::Fit {
            cpu_scale_factor: f,
        })
    };
    let r = fit(1.0).filter(&snap, "app", &names(&["n", "p"])).unwrap();
    assert!(r.nodes.is_empty());
    assert_eq!(
        r.failed["n"],
        "Could not fit node for dimensions: missing (cpu: 2.0)."
    );
    // A factor of 2 makes the PMEM node 8 cpus: 6 fit; the DRAM node stays at 4.
    let r = fit(2.0).filter(&snap, "app", &names(&["n", "p"])).unwrap();
    assert_eq!(r.nodes, names(&["p"]));
    assert_eq!(
        r.failed["n"],
        "Could not fit node for dimensions: missing (cpu: 2.0)."
    );
    // Several dimensions short: cpu and mem first (the order of wca's capacities), whatever the
    // order of `dimensions`, joined by `,`; fractions print as Python does.
    snap.apps_spec
        .insert("app".into(), caps(&[(Dim::Cpu, 4.5), (Dim::Mem, 8.25)]));
    snap.assigned_apps
        .insert("n".into(), [("app".to_string(), Assigned::Count(1))].into());
    let r = fit(1.0)
        .with_dimensions(&[Dim::Mem, Dim::Cpu])
        .filter(&snap, "app", &names(&["n"]))
        .unwrap();
    assert_eq!(
        r.failed["n"],
        "Could not fit node for dimensions: missing (cpu: 5.0),(mem: 8.5)."
    );
    assert_eq!(score(&fit(1.0), &snap), 0);
}

#[test]
fn fit_combines_read_and_write_bandwidth() {
    // ratio = 100 / 50 = 2. Request read 50 and write 30: read needs 50 + 30·2 = 110 > 100.
    let snap = one(
        &[(Dim::MembwRead, 100.0), (Dim::MembwWrite, 50.0)],
        &[(Dim::MembwRead, 50.0), (Dim::MembwWrite, 30.0)],
    );
    let fit = Algorithm::new(Kind::Fit {
        cpu_scale_factor: 1.0,
    });
    let both = fit
        .clone()
        .with_dimensions(&[Dim::MembwRead, Dim::MembwWrite]);
    assert_eq!(
        both.app_fit_node(&snap, "n", "app").unwrap_err(),
        // read: 110 − 100 = 10; write: 30 + 50/2 = 55 − 50 = 5.
        "Could not fit node for dimensions: missing (membw_read: 10.0),(membw_write: 5.0)."
    );
    // Checked apart, each alone fits.
    assert_eq!(
        fit.with_dimensions(&[Dim::MembwRead])
            .app_fit_node(&snap, "n", "app"),
        Ok(())
    );
}

#[test]
fn bar_by_number_of_dimensions() {
    // 1 dimension: variance 0 → 10.
    let snap = one(&[(Dim::Cpu, 10.0)], &[(Dim::Cpu, 3.0)]);
    assert_eq!(score(&bar_alg(&[Dim::Cpu], &[]), &snap), 10);
    // 2 dimensions: f = 0.5 and 0.25 → 1 − 0.25 = 0.75 → 7 (7.5 truncated); weights ignored.
    let snap = one(
        &[(Dim::Cpu, 10.0), (Dim::Mem, 8.0)],
        &[(Dim::Cpu, 5.0), (Dim::Mem, 2.0)],
    );
    assert_eq!(score(&bar_alg(&CPU_MEM, &[]), &snap), 7);
    assert_eq!(score(&bar_alg(&CPU_MEM, &[(Dim::Cpu, 5.0)]), &snap), 7);
    // 3 dimensions: f = 0.2, 0.5, 0.8, mean 0.5, (0.09 + 0 + 0.09) / 3 = 0.06 → 0.94 → 9.
    let snap = one(
        &[(Dim::Cpu, 10.0), (Dim::Mem, 10.0), (Dim::Wss, 10.0)],
        &[(Dim::Cpu, 2.0), (Dim::Mem, 5.0), (Dim::Wss, 8.0)],
    );
    let dims = [Dim::Cpu, Dim::Mem, Dim::Wss];
    assert_eq!(score(&bar_alg(&dims, &[]), &snap), 9);
    // Weight 3 on wss: (0.09 + 0 + 0.27) / 3 = 0.12 → 0.88 → 8.
    assert_eq!(score(&bar_alg(&dims, &[(Dim::Wss, 3.0)]), &snap), 8);
}

#[test]
fn bar_flattens_bandwidth_into_one_dimension() {
    // cpu 0.5; membw_flat = (20 + 2·10) / (100 + 2·50) = 0.2 → two dimensions: 1 − 0.3 = 0.7
    // → 7 (as wca; dividing by cap_read alone gave 0.4 and 9).
    let snap = one(
        &[
            (Dim::Cpu, 10.0),
            (Dim::MembwRead, 100.0),
            (Dim::MembwWrite, 50.0),
        ],
        &[
            (Dim::Cpu, 5.0),
            (Dim::MembwRead, 20.0),
            (Dim::MembwWrite, 10.0),
        ],
    );
    let alg = bar_alg(&[Dim::Cpu, Dim::MembwRead, Dim::MembwWrite], &[]);
    assert_eq!(score(&alg, &snap), 7);
}

#[test]
fn least_used_weights_and_the_dropped_membw_flat_quirk() {
    // An empty node with a zero request: every fraction 0. wca's defaults add `membw_flat: 1`
    // to Σ w, giving 2/3 → 6; we score it 10.
    let snap = one(
        &[(Dim::Cpu, 10.0), (Dim::Mem, 8.0)],
        &[(Dim::Cpu, 0.0), (Dim::Mem, 0.0)],
    );
    assert_eq!(score(&least_used_alg(&[]), &snap), 10);
    // A weight for a dimension not in use changes nothing.
    assert_eq!(score(&least_used_alg(&[(Dim::MembwFlat, 1.0)]), &snap), 10);
    // f = 0.5, 0.25: (0.5 + 0.75) / 2 = 0.625 → 6; cpu weight 3: (1.5 + 0.75) / 4 = 0.5625 → 5.
    let snap = one(
        &[(Dim::Cpu, 10.0), (Dim::Mem, 8.0)],
        &[(Dim::Cpu, 5.0), (Dim::Mem, 2.0)],
    );
    assert_eq!(score(&least_used_alg(&[]), &snap), 6);
    assert_eq!(score(&least_used_alg(&[(Dim::Cpu, 3.0)]), &snap), 5);
}

#[test]
fn least_used_bar_sums_without_clamp() {
    let lub = |w| {
        Algorithm::new(Kind::LeastUsedBar {
            cpu_scale_factor: 1.0,
            bar_weights: BTreeMap::new(),
            least_used_weights: BTreeMap::new(),
            least_used_weight: w,
        })
    };
    // f = 0.5, 0.25: least used 0.625 + bar 0.75 = 1.375 → 13; weight 2: 2.0 → 20.
    let snap = one(
        &[(Dim::Cpu, 10.0), (Dim::Mem, 8.0)],
        &[(Dim::Cpu, 5.0), (Dim::Mem, 2.0)],
    );
    assert_eq!(score(&lub(1.0), &snap), 13);
    assert_eq!(score(&lub(2.0), &snap), 20);
    // An empty node: 1 + 1 = 2 → 20, over MaxExtenderPriority, as wca sends it.
    let snap = one(
        &[(Dim::Cpu, 10.0), (Dim::Mem, 8.0)],
        &[(Dim::Cpu, 0.0), (Dim::Mem, 0.0)],
    );
    assert_eq!(score(&lub(1.0), &snap), 20);
}

#[test]
fn scores_truncate_and_scale_with_max_node_score() {
    let snap = one(
        &[(Dim::Cpu, 10.0), (Dim::Mem, 8.0)],
        &[(Dim::Cpu, 5.0), (Dim::Mem, 2.0)],
    );
    // BAR 0.75 · 100 = 75; · 3 = 2.25 → 2.
    let mut alg = bar_alg(&CPU_MEM, &[]);
    alg.max_node_score = 100.0;
    assert_eq!(score(&alg, &snap), 75);
    alg.max_node_score = 3.0;
    assert_eq!(score(&alg, &snap), 2);
    // An overcommitted node (prioritize without filter): f = 2.5, 0 → 1 − 2.5 → −15, not clamped.
    let snap = one(
        &[(Dim::Cpu, 10.0), (Dim::Mem, 8.0)],
        &[(Dim::Cpu, 25.0), (Dim::Mem, 0.0)],
    );
    assert_eq!(score(&bar_alg(&CPU_MEM, &[]), &snap), -15);
    // Nodes come back in sorted order whatever the input order.
    let mut snap = snap;
    snap.node_capacities
        .insert("a".into(), caps(&[(Dim::Cpu, 10.0), (Dim::Mem, 8.0)]));
    let order: Vec<String> = bar_alg(&CPU_MEM, &[])
        .prioritize(&snap, "app", &names(&["n", "a"]))
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(order, names(&["a", "n"]));
}

fn hier(merge_threshold: Option<f64>, dims: &[Dim]) -> Algorithm {
    Algorithm::new(Kind::HierBar {
        cpu_scale_factor: 1.0,
        bar_weights: BTreeMap::new(),
        least_used_weights: BTreeMap::new(),
        least_used_weight: 1.0,
        merge_threshold,
    })
    .with_dimensions(dims)
}

#[test]
fn hier_bar_keeps_the_best_class() {
    let mut snap = Snapshot::default();
    for n in ["a1", "a2"] {
        snap.node_capacities
            .insert(n.into(), caps(&[(Dim::Cpu, 10.0), (Dim::Mem, 100.0)]));
    }
    snap.node_capacities
        .insert("b1".into(), caps(&[(Dim::Cpu, 10.0), (Dim::Mem, 10.0)]));
    snap.node_capacities
        .insert("tiny".into(), caps(&[(Dim::Cpu, 0.5), (Dim::Mem, 10.0)]));
    snap.apps_spec
        .insert("app".into(), caps(&[(Dim::Cpu, 1.0), (Dim::Mem, 1.0)]));
    let alg = hier(None, &CPU_MEM);
    // Class a: 0.1, 0.01 → sample std dev 0.09/√2; class b: 0.1, 0.1 → 0. tiny fails pass 1.
    let r = alg
        .filter(&snap, "app", &names(&["a1", "a2", "b1", "tiny"]))
        .unwrap();
    assert_eq!(r.nodes, names(&["b1"]));
    assert_eq!(
        r.failed["a1"],
        "Not best class (best_variance=0.00 this=0.06)"
    );
    assert_eq!(r.failed["a2"], r.failed["a1"]);
    assert_eq!(
        r.failed["tiny"],
        "Could not fit node for dimensions: missing (cpu: 0.5)."
    );
    // Without a candidate of class b, class a is the best present.
    let r = alg.filter(&snap, "app", &names(&["a1", "a2"])).unwrap();
    assert_eq!(r.nodes, names(&["a1", "a2"]));
    // Priority is LeastUsedBAR's: f = 0.1, 0.01 → 0.945 + 0.91 = 1.855 → 18.
    assert_eq!(
        alg.prioritize(&snap, "app", &names(&["a1"])).unwrap(),
        vec![("a1".into(), 18)]
    );
}

#[test]
fn hier_bar_merge_threshold_joins_shapes_by_bandwidth_ratio() {
    let dims = [Dim::Cpu, Dim::Mem, Dim::MembwRead, Dim::MembwWrite];
    let mut snap = Snapshot::default();
    let node = |cpu, mem, r, w| {
        caps(&[
            (Dim::Cpu, cpu),
            (Dim::Mem, mem),
            (Dim::MembwRead, r),
            (Dim::MembwWrite, w),
        ])
    };
    snap.node_capacities
        .insert("p1".into(), node(10.0, 100.0, 100.0, 50.0)); // ratio 2
    snap.node_capacities
        .insert("p2".into(), node(20.0, 100.0, 90.0, 45.0)); // ratio 2
    snap.node_capacities
        .insert("q1".into(), node(10.0, 10.0, 40.0, 40.0)); // ratio 1
    snap.apps_spec
        .insert("app".into(), caps(&[(Dim::Cpu, 3.0), (Dim::Mem, 10.0)]));
    let all = names(&["p1", "p2", "q1"]);
    // Three shapes, bandwidth flattened (request 0): p1 (0.3, 0.1, 0) → 0.15, p2 (0.15, 0.1, 0)
    // → 0.08, q1 (0.3, 1, 0) → 0.51.
    let r = hier(None, &dims).filter(&snap, "app", &all).unwrap();
    assert_eq!(r.nodes, names(&["p2"]));
    assert_eq!(
        r.failed["p1"],
        "Not best class (best_variance=0.08 this=0.15)"
    );
    assert_eq!(
        r.failed["q1"],
        "Not best class (best_variance=0.08 this=0.51)"
    );
    // merge_threshold 1.5: p1 and p2 form one class averaged to cpu 15, mem 100, read 95,
    // write 47.5 → (0.2, 0.1, 0) → 0.10; q1 alone (ratio 1) → 0.51.
    let r = hier(Some(1.5), &dims).filter(&snap, "app", &all).unwrap();
    assert_eq!(r.nodes, names(&["p1", "p2"]));
    assert_eq!(
        r.failed["q1"],
        "Not best class (best_variance=0.10 this=0.51)"
    );
    // Merging, a node without membw_read capacity belongs to no class.
    snap.node_capacities
        .insert("plain".into(), caps(&[(Dim::Cpu, 10.0), (Dim::Mem, 100.0)]));
    assert_eq!(
        hier(Some(1.5), &dims).app_fit_nodes(&snap, &names(&["plain"]), "app")["plain"],
        "Node has no membw_read and membw_write capacity to class it by."
    );
    // A threshold of 2 or more puts all three in one class (no ratio is above it).
    let r = hier(Some(2.0), &dims).filter(&snap, "app", &all).unwrap();
    assert_eq!(r.nodes, all);
}

#[test]
fn static_assigner_counts_against_targets() {
    let mut snap = Snapshot::default();
    snap.assigned_apps.insert(
        "n1".into(),
        [("a".to_string(), Assigned::Tasks(names(&["a-0"])))].into(),
    );
    let targets: BTreeMap<String, BTreeMap<String, u64>> = [
        ("n1".to_string(), [("a".to_string(), 2)].into()),
        ("n2".to_string(), [("b".to_string(), 1)].into()),
    ]
    .into();
    let alg = Algorithm::new(Kind::StaticAssigner {
        targeted_assigned_apps_counts: targets,
    });
    let nodes = names(&["n1", "n2", "n3"]);
    let r = alg.filter(&snap, "a", &nodes).unwrap();
    assert_eq!(r.nodes, names(&["n1"]));
    assert_eq!(r.failed["n2"], "No target count for app a on this node.");
    assert_eq!(
        r.failed["n3"],
        "Node is not in targeted_assigned_apps_counts."
    );
    // The second instance reaches the target: the node is full for a.
    snap.assigned_apps
        .insert("n1".into(), [("a".to_string(), Assigned::Count(2))].into());
    let r = alg.filter(&snap, "a", &nodes).unwrap();
    assert!(r.nodes.is_empty());
    assert_eq!(
        r.failed["n1"],
        "App a has 2 of its targeted 2 instances here."
    );
    assert_eq!(alg.prioritize(&snap, "a", &nodes).unwrap()[0].1, 0);
}

fn facts(ratio: Option<f64>, node_type: Option<NodeType>) -> NodeFacts {
    NodeFacts {
        platform_dram_hit_ratio: ratio,
        node_type,
    }
}

#[test]
fn dram_hit_ratio_threshold() {
    let mut snap = Snapshot::default();
    snap.nodes.insert("good".into(), facts(Some(0.98), None));
    snap.nodes.insert("edge".into(), facts(Some(0.97), None));
    snap.nodes.insert("bad".into(), facts(Some(0.96), None));
    let nodes = names(&["bad", "edge", "good", "unknown"]);
    let alg = |threshold| Algorithm::new(Kind::DramHitRatioProvision { threshold });
    let r = alg(0.97).filter(&snap, "a", &nodes).unwrap();
    assert_eq!(r.nodes, names(&["edge", "good"]));
    assert_eq!(
        r.failed["bad"],
        "Could not fit node because of dram hit ratio violation."
    );
    assert_eq!(
        r.failed["unknown"],
        "No platform_dram_hit_ratio known for the node."
    );
    assert_eq!(
        alg(0.95).filter(&snap, "a", &nodes).unwrap().nodes,
        names(&["bad", "edge", "good"])
    );
}

fn score_snapshot() -> Snapshot {
    let mut snap = Snapshot::default();
    for n in ["pmem1", "pmem-hot", "dram1", "dram-hot"] {
        snap.node_capacities
            .insert(n.into(), caps(&[(Dim::Cpu, 10.0), (Dim::Mem, 10.0)]));
    }
    snap.nodes
        .insert("pmem1".into(), facts(Some(0.99), Some(NodeType::Pmem)));
    snap.nodes
        .insert("pmem-hot".into(), facts(Some(0.9), Some(NodeType::Pmem)));
    snap.nodes
        .insert("dram1".into(), facts(Some(0.99), Some(NodeType::Dram)));
    snap.nodes
        .insert("dram-hot".into(), facts(Some(0.9), Some(NodeType::Dram)));
    for (app, profile) in [("low", 1.0), ("mid", 2.0), ("high", 3.0)] {
        snap.apps_spec
            .insert(app.into(), caps(&[(Dim::Cpu, 1.0), (Dim::Mem, 1.0)]));
        snap.app_profiles.insert(app.into(), profile);
    }
    snap
}

fn score_alg(score_target: Option<f64>, strict: bool) -> Algorithm {
    Algorithm::new(Kind::Score {
        cpu_scale_factor: 1.0,
        threshold: 0.97,
        score_target,
        strict_mode_placement: strict,
    })
}

#[test]
fn score_sends_low_profiles_to_pmem() {
    let snap = score_snapshot();
    let all = names(&["dram-hot", "dram1", "pmem-hot", "pmem1"]);
    // The hit ratio is checked on PMEM nodes only.
    let r = score_alg(None, false).filter(&snap, "low", &all).unwrap();
    assert_eq!(
        r.failed["pmem-hot"],
        "Could not fit node because of dram hit ratio violation."
    );
    assert_eq!(r.nodes, names(&["pmem1"]));
    assert_eq!(
        r.failed["dram1"],
        "'low' not preferred for dram type of node"
    );
    // Not the lowest profile: DRAM, including the DRAM node with a low hit ratio.
    let r = score_alg(None, false).filter(&snap, "mid", &all).unwrap();
    assert_eq!(r.nodes, names(&["dram-hot", "dram1"]));
    assert_eq!(
        r.failed["pmem1"],
        "'mid' not preferred for pmem type of node"
    );
    // With score_target 2, mid (2 ≤ 2) goes to PMEM; high does not.
    assert_eq!(
        score_alg(Some(2.0), false)
            .filter(&snap, "mid", &all)
            .unwrap()
            .nodes,
        names(&["pmem1"])
    );
    assert_eq!(
        score_alg(Some(2.0), false)
            .filter(&snap, "high", &all)
            .unwrap()
            .nodes,
        names(&["dram-hot", "dram1"])
    );
    assert_eq!(
        score_alg(None, false)
            .prioritize(&snap, "low", &all)
            .unwrap()[0]
            .1,
        0
    );
    // A lower threshold lets the hot PMEM node through.
    let mut low_threshold = score_alg(None, false);
    if let Kind::Score { threshold, .. } = &mut low_threshold.kind {
        *threshold = 0.85;
    }
    assert_eq!(
        low_threshold.filter(&snap, "low", &all).unwrap().nodes,
        names(&["pmem-hot", "pmem1"])
    );
}

#[test]
fn score_needs_three_profiles_and_strict_mode_leaves_nothing() {
    let mut snap = score_snapshot();
    let pmem_only = names(&["pmem1"]);
    // "low" wants PMEM; offered only DRAM: non-strict keeps the candidates, strict drops them.
    let dram_only = names(&["dram1"]);
    assert_eq!(
        score_alg(None, false)
            .filter(&snap, "low", &dram_only)
            .unwrap()
            .nodes,
        dram_only
    );
    let r = score_alg(None, true)
        .filter(&snap, "low", &dram_only)
        .unwrap();
    assert!(r.nodes.is_empty());
    assert_eq!(
        r.failed["dram1"],
        "'low' not preferred for dram type of node"
    );
    // With two profiles only, every app goes to DRAM.
    snap.app_profiles.remove("high");
    let r = score_alg(None, true)
        .filter(&snap, "low", &pmem_only)
        .unwrap();
    assert_eq!(
        r.failed["pmem1"],
        "'low' not preferred for pmem type of node"
    );
}

#[test]
fn an_app_without_spec_is_an_error() {
    let snap = Snapshot::default();
    let fit = Algorithm::new(Kind::Fit {
        cpu_scale_factor: 1.0,
    });
    assert_eq!(
        fit.filter(&snap, "ghost", &names(&["n"]))
            .unwrap_err()
            .to_string(),
        "app \"ghost\" has no spec (no entry in apps_spec)"
    );
}

#[test]
fn defaults_when_deserialized() {
    let alg: Algorithm = serde_json::from_str(r#"{"kind": {"Score": {}}}"#).unwrap();
    assert_eq!(alg.dimensions, CPU_MEM);
    assert_eq!(alg.max_node_score, 10.0);
    assert_eq!(
        alg.kind,
        Kind::Score {
            cpu_scale_factor: 1.0,
            threshold: 0.97,
            score_target: None,
            strict_mode_placement: false
        }
    );
}

#[test]
fn hier_bar_tie_between_classes_keeps_the_first_class_in_node_order() {
    // wca's case: n0 16/32 and n1 8/16, request 1/2: both classes spread 0 (1/16 = 2/32 and
    // 1/8 = 2/16); wca keeps the first class in node order, n0's (we kept the smaller shape, n1).
    let mut snap = Snapshot::default();
    snap.node_capacities
        .insert("n0".into(), caps(&[(Dim::Cpu, 16.0), (Dim::Mem, 32.0)]));
    snap.node_capacities
        .insert("n1".into(), caps(&[(Dim::Cpu, 8.0), (Dim::Mem, 16.0)]));
    snap.apps_spec
        .insert("app".into(), caps(&[(Dim::Cpu, 1.0), (Dim::Mem, 2.0)]));
    let r = hier(None, &CPU_MEM)
        .filter(&snap, "app", &names(&["n0", "n1"]))
        .unwrap();
    assert_eq!(r.nodes, names(&["n0"]));
    assert_eq!(
        r.failed["n1"],
        "Not best class (best_variance=0.00 this=0.00)"
    );
}

#[test]
fn hier_bar_class_value_uses_the_mean_of_real_capacities() {
    // One class (int shape cpu 2, mem 4) of a 2.9-cpu and a 2.0-cpu node: mean cpu 2.45. Request
    // 0.5/1: fractions 0.5 / 2.45 = 0.204 and 0.25 → spread 0.03 (as wca); from the int shape
    // (2, 4) it was 0.25, 0.25 → 0, and the class tied with c's (int 10, 20 → 0.05, 0.05).
    let mut snap = Snapshot::default();
    snap.node_capacities
        .insert("a".into(), caps(&[(Dim::Cpu, 2.9), (Dim::Mem, 4.0)]));
    snap.node_capacities
        .insert("b".into(), caps(&[(Dim::Cpu, 2.0), (Dim::Mem, 4.0)]));
    snap.node_capacities
        .insert("c".into(), caps(&[(Dim::Cpu, 10.0), (Dim::Mem, 20.5)]));
    snap.apps_spec
        .insert("app".into(), caps(&[(Dim::Cpu, 0.5), (Dim::Mem, 1.0)]));
    // c: 0.05, 1 / 20.5 = 0.0488 → spread 0.0009 < 0.03: c's class wins.
    let r = hier(None, &CPU_MEM)
        .filter(&snap, "app", &names(&["a", "b", "c"]))
        .unwrap();
    assert_eq!(r.nodes, names(&["c"]));
    assert_eq!(
        r.failed["a"],
        "Not best class (best_variance=0.00 this=0.03)"
    );
}

#[test]
fn score_pass_one_joins_both_texts_when_both_checks_fail() {
    // pmem-hot (DRAM hit ratio 0.9) with an app too big for it: wca joins the two texts with a
    // space, as here; when only one fails, wca's stray space is not kept.
    let mut snap = score_snapshot();
    snap.apps_spec
        .insert("big".into(), caps(&[(Dim::Cpu, 12.0), (Dim::Mem, 1.0)]));
    let alg = score_alg(None, false);
    assert_eq!(
        alg.app_fit_node(&snap, "pmem-hot", "big").unwrap_err(),
        "Could not fit node for dimensions: missing (cpu: 2.0). \
         Could not fit node because of dram hit ratio violation."
    );
    assert_eq!(
        alg.app_fit_node(&snap, "pmem-hot", "low").unwrap_err(),
        "Could not fit node because of dram hit ratio violation."
    );
    assert_eq!(
        alg.app_fit_node(&snap, "dram-hot", "big").unwrap_err(),
        "Could not fit node for dimensions: missing (cpu: 2.0)."
    );
}

/// One algorithm of each kind, with the defaults.
fn one_of_each() -> Vec<Kind> {
    let kinds: Vec<Kind> = [
        "Nop",
        "Fit",
        "Bar",
        "LeastUsed",
        "LeastUsedBar",
        "HierBar",
        "StaticAssigner",
        "DramHitRatioProvision",
        "Score",
    ]
    .iter()
    .map(|variant| {
        let params = match *variant {
            "Nop" => return Kind::Nop,
            "StaticAssigner" => serde_json::json!({"targeted_assigned_apps_counts": {}}),
            _ => serde_json::json!({}),
        };
        serde_json::from_value(serde_json::json!({ *variant: params })).unwrap()
    })
    .collect();
    kinds
}

#[test]
fn every_kind_has_a_spec_and_reaches_its_score_ceiling_on_an_empty_node() {
    let mut seen = Vec::new();
    for kind in one_of_each() {
        let spec = kind.spec();
        seen.push((
            spec.tag,
            spec.by_load,
            spec.two_pass,
            spec.needs_spec,
            spec.cpu_scale_factor,
            kind.score_ceiling(10.0),
        ));
        // An app that asks for nothing on an empty node gets the best score there is.
        let alg = Algorithm::new(kind.clone());
        let snap = one(
            &[(Dim::Cpu, 10.0), (Dim::Mem, 10.0)],
            &[(Dim::Cpu, 0.0), (Dim::Mem, 0.0)],
        );
        assert_eq!(
            score(&alg, &snap) as f64,
            kind.score_ceiling(10.0),
            "{kind:?}"
        );
    }
    assert_eq!(
        seen,
        [
            ("NOPAlgorithm", true, false, false, None, 0.0),
            ("Fit", true, false, true, Some(1.0), 0.0),
            ("BAR", true, false, true, Some(1.0), 10.0),
            ("LeastUsed", true, false, true, Some(1.0), 10.0),
            ("LeastUsedBAR", true, false, true, Some(1.0), 20.0),
            ("HierBAR", false, true, true, Some(1.0), 20.0),
            ("StaticAssigner", false, false, false, None, 0.0),
            ("DramHitRatioProvision", false, false, false, None, 0.0),
            ("Score", false, true, true, Some(1.0), 0.0),
        ]
    ); // Only Score has a reschedule hook.
    let rescheduling: Vec<&str> = one_of_each()
        .iter()
        .filter(|k| k.spec().reschedules)
        .map(|k| k.spec().tag)
        .collect();
    assert_eq!(rescheduling, ["Score"]);
}

#[test]
fn parameter_names_are_read_from_the_serde_definition() {
    assert_eq!(
        Algorithm::common_parameters(),
        ["dimensions", "max_node_score"]
    );
    assert!(Kind::parameters("Nop").is_empty());
    assert_eq!(Kind::parameters("Fit"), ["cpu_scale_factor"]);
    assert_eq!(
        Kind::parameters("HierBar"),
        [
            "cpu_scale_factor",
            "bar_weights",
            "least_used_weights",
            "least_used_weight",
            "merge_threshold"
        ]
    );
    assert_eq!(
        Kind::parameters("StaticAssigner"),
        ["targeted_assigned_apps_counts"]
    );
    // The Kind variant's name, not the wca tag.
    assert!(Kind::parameters("HierBAR").is_empty());
}
