//! wca-scheduler's own test vectors as ours: every case of `wca-vectors.json` (the assertions of
//! upstream's `tests/scheduler` that check an algorithm's decision, score, reason, resource
//! arithmetic or simulator figure, each naming the upstream test it comes from) run through our
//! functions. A case where verwalter decides otherwise on purpose (docs/placement.md,
//! "Differences from wca") carries `ours: {expect, why}`, and our answer is checked instead.
//!
//! The file is written by `wca-vectors.py` from upstream's test modules (see its header).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use verwalter_placement::algorithms::{
    bar, class_mean, hier_bar_classes_of, least_used, node_shape, sample_std_dev,
};
use verwalter_placement::snapshot::{fractions, free};
use verwalter_placement::{Algorithm, Dim, Kind, NodeFacts, NodeType, Snapshot, Usage};

const FIXTURE: &str = include_str!("wca-vectors.json");

fn dim(name: &str) -> Dim {
    serde_json::from_value(json!(name)).unwrap_or_else(|e| panic!("dimension {name:?}: {e}"))
}

fn resources(v: &Value) -> BTreeMap<Dim, f64> {
    v.as_object()
        .expect("resources are an object")
        .iter()
        .map(|(k, x)| (dim(k), x.as_f64().expect("an amount is a number")))
        .collect()
}

fn dims(v: &Value) -> Vec<Dim> {
    v.as_array()
        .expect("dimensions are a list")
        .iter()
        .map(|d| dim(d.as_str().unwrap()))
        .collect()
}

fn pairs(v: &Value) -> Vec<(Dim, f64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (dim(p[0].as_str().unwrap()), p[1].as_f64().unwrap()))
        .collect()
}

fn snapshot(v: &Value) -> Snapshot {
    serde_json::from_value(v.clone()).expect("a snapshot")
}

/// `got` against an expected number: exact, or `{approx, tolerance}` as pytest's `approx`.
fn number(name: &str, got: f64, expect: &Value) {
    match expect {
        Value::Object(o) => {
            let want = o["approx"].as_f64().unwrap();
            let tol = o["tolerance"].as_f64().unwrap();
            assert!(
                (got - want).abs() <= tol,
                "{name}: {got} is not {want} ± {tol}"
            );
        }
        _ => assert_eq!(got, expect.as_f64().unwrap(), "{name}"),
    }
}

/// Resources compared as wca's dict equality: every expected dimension, a missing one as 0 when
/// `missing_is_zero` (our maps leave out what nothing uses), and nothing else but zeros.
fn same_resources(name: &str, got: &BTreeMap<Dim, f64>, expect: &Value, missing_is_zero: bool) {
    let want = resources(expect);
    for (d, w) in &want {
        let g = match got.get(d) {
            Some(g) => *g,
            None if missing_is_zero => 0.0,
            None => panic!("{name}: no {d:?} in {got:?}, want {want:?}"),
        };
        assert_eq!(g, *w, "{name}: {d:?} in {got:?}, want {want:?}");
    }
    for (d, g) in got {
        assert!(
            want.contains_key(d) || *g == 0.0,
            "{name}: unexpected {d:?} = {g} in {got:?}"
        );
    }
}

fn score(target: &Value, strict: bool) -> Algorithm {
    Algorithm::new(Kind::Score {
        cpu_scale_factor: 1.0,
        threshold: 0.97,
        score_target: target.as_f64(),
        strict_mode_placement: strict,
    })
}

/// Runs one case; returns what it checked, for the count.
fn run(case: &Value, snapshots: &Value) {
    let test = case["test"].as_str().unwrap();
    let expect = case.get("ours").map_or(&case["expect"], |o| &o["expect"]);
    let snap_of = |c: &Value| snapshot(&snapshots[c["snapshot"].as_str().unwrap()]);
    match case["kind"].as_str().unwrap() {
        "sum" => {
            // used (one instance of b) + requested (a): our demand.
            let mut snap = Snapshot::default();
            snap.apps_spec.insert("a".into(), resources(&case["a"]));
            snap.apps_spec.insert("b".into(), resources(&case["b"]));
            snap.assigned_apps.insert(
                "n".into(),
                [("b".to_string(), verwalter_placement::Assigned::Count(1))].into(),
            );
            same_resources(test, &snap.demand("n", "a"), expect, false);
        }
        "subtract" => {
            let a = resources(&case["a"]);
            let keys: Vec<Dim> = a.keys().copied().collect();
            // The ratio applies only to read and write bandwidth, which these have none of.
            assert!(!keys.contains(&Dim::MembwRead), "{test}");
            let got: BTreeMap<Dim, f64> = free(&a, &resources(&case["b"]), &keys)
                .into_iter()
                .map(|(d, f)| (d, f.expect("a capacity")))
                .collect();
            same_resources(test, &got, expect, false);
        }
        "flatten" => {
            // Our flattening shows in the fractions: over a capacity whose flat amount is 1
            // (read 0.5 and write 0.5 / ratio: 0.5 + ratio · 0.5 / ratio) and cpu, mem 1, the
            // fractions are the flattened amounts.
            let a = resources(&case["a"]);
            let ratio = case["ratio"].as_f64().unwrap();
            let cap: BTreeMap<Dim, f64> = a
                .keys()
                .map(|d| match d {
                    Dim::MembwRead => (*d, 0.5),
                    Dim::MembwWrite => (*d, 0.5 / ratio),
                    _ => (*d, 1.0),
                })
                .collect();
            let keys: Vec<Dim> = a.keys().copied().collect();
            let got: BTreeMap<Dim, f64> = fractions(&cap, &a, &keys).into_iter().collect();
            same_resources(test, &got, expect, false);
        }
        "divide" => {
            let (a, b) = (resources(&case["a"]), resources(&case["b"]));
            // Our ratio is the capacity's read / write: the ratio upstream passes.
            assert_eq!(
                b[&Dim::MembwRead] / b[&Dim::MembwWrite],
                case["ratio"].as_f64().unwrap(),
                "{test}"
            );
            let keys: Vec<Dim> = a.keys().copied().collect();
            let got: BTreeMap<Dim, f64> = fractions(&b, &a, &keys).into_iter().collect();
            same_resources(test, &got, expect, false);
        }
        "used_free_requested" => {
            let snap = snapshot(&json!({
                "node_capacities": case["node_capacities"],
                "assigned_apps": case["assigned_apps"],
                "apps_spec": case["apps_spec"],
            }));
            let (node, app) = (
                case["node"].as_str().unwrap(),
                case["app"].as_str().unwrap(),
            );
            let dims = dims(&case["dimensions"]);
            let cap = &snap.node_capacities[node];
            let used = snap.used(node);
            same_resources(test, &used, &expect["used"], true);
            let free: BTreeMap<Dim, f64> = free(cap, &used, &dims)
                .into_iter()
                .map(|(d, f)| (d, f.unwrap()))
                .collect();
            same_resources(test, &free, &expect["free"], false);
            same_resources(test, &snap.apps_spec[app], &expect["requested"], false);
            same_resources(test, cap, &expect["capacity"], false);
            let fr: BTreeMap<Dim, f64> = fractions(cap, &snap.demand(node, app), &dims)
                .into_iter()
                .collect();
            // No read/write ratio (None): nothing is flattened.
            assert!(expect["membw_read_write_ratio"].is_null(), "{test}");
            assert!(!fr.contains_key(&Dim::MembwFlat), "{test}");
            same_resources(test, &fr, &expect["requested_fraction"], false);
        }
        "used_on_node" => {
            let snap = snapshot(&json!({
                "assigned_apps": {"n": case["assigned_apps"]},
                "apps_spec": case["apps_spec"],
            }));
            same_resources(test, &snap.used("n"), expect, true);
        }
        "nodes_used" => {
            let snap = snapshot(&json!({
                "assigned_apps": case["apps_on_node"],
                "apps_spec": case["apps_spec"],
            }));
            let usage = Usage::of(&snap);
            let want = expect.as_object().unwrap();
            assert_eq!(
                snap.assigned_apps.keys().collect::<BTreeSet<_>>(),
                want.keys().collect::<BTreeSet<_>>(),
                "{test}"
            );
            for (node, w) in want {
                same_resources(test, &usage.used(node), w, true);
            }
        }
        "variance" => {
            let weights = resources(&case["weights"]);
            let variance = 1.0 - bar(&pairs(&case["fractions"]), &weights);
            number(test, variance, expect);
        }
        "least_used_score" => {
            let weights = resources(&case["weights"]);
            number(
                test,
                least_used(&pairs(&case["fractions"]), &weights),
                expect,
            );
        }
        "class_mean" => {
            let list: Vec<BTreeMap<Dim, f64>> = case["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(resources)
                .collect();
            same_resources(test, &class_mean(&list), expect, false);
        }
        "shape" => {
            let r = resources(&case["resources"]);
            let keys: Vec<Dim> = r.keys().copied().collect();
            let want: Vec<(Dim, i64)> = expect
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (dim(p[0].as_str().unwrap()), p[1].as_i64().unwrap()))
                .collect();
            assert_eq!(node_shape(&r, &keys), want, "{test}");
        }
        "shape_diff" => {
            // wca's `_shape_diff`: the sample standard deviation of the differences.
            let (a, b) = (resources(&case["first"]), resources(&case["second"]));
            let diffs: Vec<f64> = a.iter().map(|(d, v)| v - b[d]).collect();
            number(test, sample_std_dev(&diffs), expect);
        }
        "merge_shapes" => {
            let mut snap = Snapshot::default();
            for (i, n) in case["nodes"].as_array().unwrap().iter().enumerate() {
                snap.node_capacities.insert(format!("n{i}"), resources(n));
            }
            let classes = hier_bar_classes_of(
                &snap,
                &[Dim::MembwRead, Dim::MembwWrite],
                case["merge_threshold"].as_f64(),
            );
            assert_eq!(classes.len() as u64, expect.as_u64().unwrap(), "{test}");
        }
        "dram_fit_node" => {
            let snap = snap_of(case);
            let alg = Algorithm::new(Kind::DramHitRatioProvision {
                threshold: case["threshold"].as_f64().unwrap(),
            });
            let got = match alg.app_fit_node(
                &snap,
                case["node"].as_str().unwrap(),
                case["app"].as_str().unwrap(),
            ) {
                Ok(()) => json!([true, ""]),
                Err(reason) => json!([false, reason]),
            };
            assert_eq!(&got, expect, "{test}");
        }
        "score_node_type" => {
            // Pass 2 over one PMEM and one DRAM node, strict: the type kept is the app's type.
            let mut snap = Snapshot {
                app_profiles: serde_json::from_value(case["app_profiles"].clone()).unwrap(),
                ..Snapshot::default()
            };
            for (n, t) in [("D", NodeType::Dram), ("P", NodeType::Pmem)] {
                snap.nodes.insert(
                    n.into(),
                    NodeFacts {
                        node_type: Some(t),
                        ..NodeFacts::default()
                    },
                );
            }
            let nodes = vec!["D".to_string(), "P".to_string()];
            let failed = score(&case["score_target"], true).app_fit_nodes(
                &snap,
                &nodes,
                case["app"].as_str().unwrap(),
            );
            let kept: Vec<&String> = nodes.iter().filter(|n| !failed.contains_key(*n)).collect();
            let want = if expect == "pmem" { "P" } else { "D" };
            assert_eq!(kept, [want], "{test}: {case}");
        }
        "score_fit_node_type" => {
            // A node of the type asked about among the candidates (with one of the other type,
            // so that pass 2 refuses rather than keeps all): accepted, or refused with its text.
            let snap = snap_of(case);
            let want_pmem = case["node_type"] == "pmem";
            let node = snap
                .nodes
                .iter()
                .find(|(_, f)| (f.node_type == Some(NodeType::Pmem)) == want_pmem)
                .map(|(n, _)| n.clone())
                .unwrap();
            let other = snap
                .nodes
                .iter()
                .find(|(_, f)| (f.node_type == Some(NodeType::Pmem)) != want_pmem)
                .map(|(n, _)| n.clone())
                .unwrap();
            let failed = score(&case["score_target"], false).app_fit_nodes(
                &snap,
                &[node.clone(), other],
                case["app"].as_str().unwrap(),
            );
            let got = match failed.get(&node) {
                None => json!([true, ""]),
                Some(reason) => json!([false, reason]),
            };
            assert_eq!(&got, expect, "{test}");
        }
        "score_app_fit_nodes" => {
            let snap = snap_of(case);
            let nodes: Vec<String> = serde_json::from_value(case["nodes"].clone()).unwrap();
            let failed = score(
                &case["score_target"],
                case["strict_mode_placement"].as_bool().unwrap(),
            )
            .app_fit_nodes(&snap, &nodes, case["app"].as_str().unwrap());
            let kept: Vec<&String> = nodes.iter().filter(|n| !failed.contains_key(*n)).collect();
            assert_eq!(json!(kept), expect["nodes"], "{test}");
            if let Some(want) = expect.get("failed") {
                assert_eq!(&json!(failed), want, "{test}");
            }
        }
        "score_reschedule" => {
            let snap = snap_of(case);
            let moves =
                verwalter_placement::reschedule(&score(&case["score_target"], false), &snap);
            let tasks: Vec<String> = moves.into_iter().map(|m| m.task.unwrap()).collect();
            assert_eq!(json!(tasks), *expect, "{test}");
        }
        "run_until_first_failure" => {
            // wca's run_until_first_failure: identical tasks until one is not scheduled; the
            // simulator then holds every task made, the unscheduled one included.
            let mut snap = Snapshot::default();
            for (n, cap) in case["nodes"].as_object().unwrap() {
                snap.node_capacities.insert(n.clone(), resources(cap));
            }
            snap.apps_spec
                .insert("task".into(), resources(&case["task"]));
            let kind = match case["algorithm"].as_str().unwrap() {
                "Fit" => Kind::Fit {
                    cpu_scale_factor: 1.0,
                },
                "LeastUsedBAR" => Kind::LeastUsedBar {
                    cpu_scale_factor: 1.0,
                    bar_weights: BTreeMap::new(),
                    least_used_weights: BTreeMap::new(),
                    least_used_weight: 1.0,
                },
                other => panic!("{test}: algorithm {other}"),
            };
            let alg = Algorithm::new(kind).with_dimensions(&dims(&case["dimensions"]));
            let tasks = vec!["task".to_string(); 1000];
            let report = verwalter_placement::simulate(&alg, snap, &tasks).unwrap();
            let first_failure = report
                .placements
                .iter()
                .position(Option::is_none)
                .expect("a task is left unscheduled");
            assert_eq!(
                (first_failure + 1) as u64,
                expect.as_u64().unwrap(),
                "{test}"
            );
        }
        "simulate" => {
            // A run of wca's simulator and the figures of its report: ours in the same units
            // (wca's `scheduled` is the number of tasks, its `assigned%` and `assigned_broken%`
            // per task and truncated, `utilization%` the truncated mean).
            let mut snap = Snapshot::default();
            for (n, cap) in case["nodes"].as_object().unwrap() {
                snap.node_capacities.insert(n.clone(), resources(cap));
            }
            snap.apps_spec = serde_json::from_value(case["apps_spec"].clone()).unwrap();
            let kind = match case["algorithm"].as_str().unwrap() {
                "StaticAssigner" => Kind::StaticAssigner {
                    targeted_assigned_apps_counts: serde_json::from_value(
                        case["targeted_assigned_apps_counts"].clone(),
                    )
                    .unwrap(),
                },
                other => panic!("{test}: algorithm {other}"),
            };
            let alg = Algorithm::new(kind).with_dimensions(&dims(&case["dimensions"]));
            let tasks: Vec<String> = serde_json::from_value(case["tasks"].clone()).unwrap();
            let r = verwalter_placement::simulate(&alg, snap, &tasks).unwrap();
            let n = tasks.len() as f64;
            let close = |name: &str, got: f64| {
                let want = expect[name].as_f64().unwrap();
                // Python's statistics work in exact fractions; ours in floats.
                assert!(
                    (got - want).abs() <= 1e-9,
                    "{test}: {name} {got}, want {want}"
                );
            };
            assert_eq!(json!(tasks.len()), expect["scheduled"], "{test}");
            assert_eq!(
                json!((r.assigned as f64 / n * 100.0) as i64),
                expect["assigned%"],
                "{test}"
            );
            assert_eq!(
                json!((r.broken_assignments as f64 / n * 100.0) as i64),
                expect["assigned_broken%"],
                "{test}"
            );
            close("balance", r.balance);
            close("cpu_util%", r.utilisation_pct[&Dim::Cpu]);
            close("mem_util%", r.utilisation_pct[&Dim::Mem]);
            assert_eq!(
                json!(r.utilisation_mean_pct as i64),
                expect["utilization%"],
                "{test}"
            );
        }
        other => panic!("{test}: unknown kind {other}"),
    }
}

#[test]
fn upstream_test_vectors_pass() {
    let fixture: Value = serde_json::from_str(FIXTURE).expect("wca-vectors.json is JSON");
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 74, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        assert!(
            case["test"]
                .as_str()
                .unwrap()
                .starts_with("tests/scheduler/")
        );
        if let Some(ours) = case.get("ours") {
            assert!(
                ours["why"].as_str().is_some_and(|w| !w.is_empty()),
                "{case}: a difference says why"
            );
        }
        let result = std::panic::catch_unwind(|| run(case, &fixture["snapshots"]));
        if let Err(e) = result {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {msg}", case["test"]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
