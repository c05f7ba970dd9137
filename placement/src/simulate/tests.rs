use super::*;
use crate::algorithms::Kind;
use crate::experiment;

fn caps(pairs: &[(Dim, f64)]) -> BTreeMap<Dim, f64> {
    pairs.iter().copied().collect()
}

/// The experiment shipped in `examples/placement/`: wca's 60 nodes and 300 tasks.
fn shipped() -> (Snapshot, Vec<String>) {
    let nodes =
        experiment::parse_nodes(include_str!("../../../examples/placement/nodes.yaml")).unwrap();
    let tasks =
        experiment::parse_tasks(include_str!("../../../examples/placement/tasks.yaml")).unwrap();
    (
        experiment::snapshot(&nodes, &tasks),
        experiment::task_list(&tasks),
    )
}

/// The algorithms of the shipped `config.yaml`, in its order.
fn shipped_algorithms() -> Vec<(String, Algorithm)> {
    let yaml = include_str!("../../../examples/placement/config.yaml");
    let loaded = crate::config::load(yaml, |_| None).unwrap();
    experiment::config_order(yaml, loaded.keys())
        .into_iter()
        .map(|n| {
            let alg = loaded[&n].algorithm.clone();
            (n, alg)
        })
        .collect()
}

#[test]
fn place_picks_the_highest_score_and_the_first_name_on_ties() {
    let mut snap = Snapshot::default();
    for n in ["b", "a", "c"] {
        snap.node_capacities
            .insert(n.into(), caps(&[(Dim::Cpu, 10.0), (Dim::Mem, 10.0)]));
    }
    snap.apps_spec
        .insert("app".into(), caps(&[(Dim::Cpu, 1.0), (Dim::Mem, 1.0)]));
    let nodes: Vec<String> = ["c", "b", "a"].map(String::from).to_vec();
    let lu = Algorithm::new(Kind::LeastUsed {
        cpu_scale_factor: 1.0,
        least_used_weights: BTreeMap::new(),
    });
    assert_eq!(
        place(&lu, &snap, "app", &nodes).unwrap().0.as_deref(),
        Some("a")
    );
    // Half of "a" used: (1 − 0.6) = 0.4 → 4; "b" and "c" score 9 and tie: "b" wins.
    snap.assigned_apps
        .insert("a".into(), [("app".to_string(), Assigned::Count(5))].into());
    assert_eq!(
        place(&lu, &snap, "app", &nodes).unwrap().0.as_deref(),
        Some("b")
    );
    // Nothing fits: no node, every reason given.
    snap.apps_spec
        .insert("big".into(), caps(&[(Dim::Cpu, 11.0)]));
    let (chosen, filtered) = place(&lu, &snap, "big", &nodes).unwrap();
    assert_eq!(chosen, None);
    assert_eq!(
        filtered.failed["c"],
        "Could not fit node for dimensions: missing (cpu: 1.0)."
    );
}

#[test]
fn report_counts_broken_assignments_and_wca_balance_by_hand() {
    // Two nodes {cpu 4, mem 4}; NOP sends all three tasks {cpu 2, mem 1} to "a".
    let mut snap = Snapshot::default();
    for n in ["a", "b"] {
        snap.node_capacities
            .insert(n.into(), caps(&[(Dim::Cpu, 4.0), (Dim::Mem, 4.0)]));
    }
    snap.apps_spec
        .insert("t".into(), caps(&[(Dim::Cpu, 2.0), (Dim::Mem, 1.0)]));
    let tasks = vec!["t".to_string(); 3];
    let r = simulate(&Algorithm::new(Kind::Nop), snap.clone(), &tasks).unwrap();
    assert_eq!(r.placements, vec![Some("a".to_string()); 3]);
    // The third task overflows cpu (6 > 4): one broken assignment of three, one node of two.
    assert_eq!(r.broken_assignments, 1);
    assert!((r.broken_assignments_pct - 100.0 / 3.0).abs() < 1e-9);
    assert_eq!(r.broken_nodes, ["a"]);
    assert_eq!(r.broken_nodes_pct, 50.0);
    assert_eq!(r.assigned, 3);
    assert_eq!(r.scheduled_pct, 100.0);
    // cpu 6/8, mem 3/8; mean 56.25.
    assert_eq!(r.utilisation_pct[&Dim::Cpu], 75.0);
    assert_eq!(r.utilisation_pct[&Dim::Mem], 37.5);
    assert_eq!(r.utilisation_mean_pct, 56.25);
    // Fractions a: 1.5, 0.75; b: 0, 0. Mean 0.5625; Σ(x − m)² = 1.546875; / (4 − 1) = 0.515625.
    assert!(
        (r.balance - (1.0 - 0.515625)).abs() < 1e-12,
        "{}",
        r.balance
    );

    // Fit on cpu: the third task fits nowhere... no: "b" takes it. Two tasks of cpu 2 fill "a".
    let fit = Algorithm::new(Kind::Fit {
        cpu_scale_factor: 1.0,
    });
    let r = simulate(&fit, snap.clone(), &tasks).unwrap();
    assert_eq!(r.placements[2].as_deref(), Some("b"));
    assert_eq!(r.broken_assignments, 0);
    // Five tasks: the fifth finds no node and is counted per app.
    let r = simulate(&fit, snap, &vec!["t".to_string(); 5]).unwrap();
    assert_eq!(r.placements[4], None);
    assert_eq!(r.unscheduled, BTreeMap::from([("t".to_string(), 1)]));
    assert_eq!(r.scheduled_pct, 80.0);
    assert_eq!(r.broken_assignments_pct, 0.0);
}

#[test]
fn a_shortfall_below_wca_tolerance_does_not_break_a_node() {
    let mut snap = Snapshot::default();
    snap.node_capacities
        .insert("a".into(), caps(&[(Dim::Cpu, 0.3)]));
    snap.apps_spec.insert("t".into(), caps(&[(Dim::Cpu, 0.1)]));
    // 0.1 + 0.1 + 0.1 is 0.30000000000000004 in binary floating point.
    let nop = Algorithm::new(Kind::Nop);
    let r = simulate(&nop, snap.clone(), &vec!["t".to_string(); 3]).unwrap();
    assert_eq!(r.broken_assignments, 0);
    let r = simulate(&nop, snap, &vec!["t".to_string(); 4]).unwrap();
    assert_eq!(r.broken_assignments, 1);
}

#[test]
fn shipped_experiment_fit_family_keeps_nodes_whole_and_nop_breaks_them() {
    let (snap, tasks) = shipped();
    assert_eq!(snap.node_capacities.len(), 60);
    assert_eq!(tasks.len(), 300);
    assert_eq!(tasks[..4], ["mbw", "mem", "cpu", "mbw"]);
    let runs: BTreeMap<String, SimulationReport> = shipped_algorithms()
        .into_iter()
        .map(|(n, alg)| {
            let r = simulate(&alg, snap.clone(), &tasks).unwrap();
            (n, r)
        })
        .collect();
    assert_eq!(runs.len(), 11);
    // Every algorithm that filters with Fit on all four dimensions: no node broken.
    for name in ["fit", "bar", "least-used", "least-used-bar", "hier-bar"] {
        let r = &runs[name];
        assert_eq!(r.broken_nodes_pct, 0.0, "{name}: {:?}", r.broken_nodes);
        assert_eq!(r.broken_assignments, 0, "{name}");
    }
    // NOP puts all 300 tasks on node00, which breaks.
    let nop = &runs["nop"];
    assert_eq!(nop.scheduled_pct, 100.0);
    assert_eq!(nop.broken_nodes, ["node00"]);
    assert!(nop.broken_nodes_pct > 0.0);
    // Fit blind to bandwidth piles the mbw tasks up and breaks nodes (wca's point).
    let blind = &runs["fit-cpu-mem"];
    assert_eq!(blind.broken_nodes.len(), 4, "{blind:?}");
    assert_eq!(blind.broken_assignments, 64, "{blind:?}");
    // wca's published scheduled shares: 78 % for its baseline (LeastUsedBAR on cpu and mem),
    // 73 % for Fit with bandwidth (235 and 220 of 300 here). Their broken and utilisation
    // figures came from an older version of the algorithms and report; see docs/placement.md.
    assert_eq!(runs["least-used-bar-cpu-mem"].assigned, 235);
    assert_eq!(runs["fit"].assigned, 220);
}

#[test]
fn shipped_experiment_runs_are_deterministic() {
    let (snap, tasks) = shipped();
    // A few of them (each run is a quarter second in a debug build); the CLI test compares the
    // JSON of all of them byte for byte.
    let some = ["nop", "least-used-bar-cpu-mem", "hier-bar"];
    for (name, alg) in shipped_algorithms()
        .into_iter()
        .filter(|(n, _)| some.contains(&n.as_str()))
    {
        let first = simulate(&alg, snap.clone(), &tasks).unwrap();
        let second = simulate(&alg, snap.clone(), &tasks).unwrap();
        assert_eq!(first, second, "{name}");
    }
}
