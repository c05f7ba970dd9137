//! Hand-made extender requests: parsing, the pass-through rules, filter and prioritize replies
//! (checked byte for byte) and the score mapping.

use std::collections::BTreeMap;

use super::*;
use crate::algorithms::Kind;
use crate::snapshot::{Assigned, Dim};

/// Three nodes of 8 CPUs and 64 GB: `a` empty, `b` runs one `busy` (4 CPUs), `c` has only 2 CPUs
/// and runs one `busy` too (overcommitted already). App `web` asks for 2 CPUs and 16 GB.
fn snapshot() -> Snapshot {
    let mut s = Snapshot::default();
    for (node, cpu) in [("a", 8.0), ("b", 8.0), ("c", 2.0)] {
        s.node_capacities.insert(
            node.into(),
            BTreeMap::from([(Dim::Cpu, cpu), (Dim::Mem, 64.0)]),
        );
    }
    for node in ["b", "c"] {
        s.assigned_apps.insert(
            node.into(),
            BTreeMap::from([("busy".into(), Assigned::Count(1))]),
        );
    }
    s.apps_spec.insert(
        "web".into(),
        BTreeMap::from([(Dim::Cpu, 2.0), (Dim::Mem, 16.0)]),
    );
    s.apps_spec
        .insert("busy".into(), BTreeMap::from([(Dim::Cpu, 4.0)]));
    s
}

fn fit() -> Algorithm {
    Algorithm::new(Kind::Fit {
        cpu_scale_factor: 1.0,
    })
}

fn least_used_bar() -> Algorithm {
    Algorithm::new(Kind::LeastUsedBar {
        cpu_scale_factor: 1.0,
        bar_weights: BTreeMap::new(),
        least_used_weights: BTreeMap::new(),
        least_used_weight: 1.0,
    })
}

fn request(namespace: &str, labels: &str, nodes: &str) -> ExtenderArgs {
    ExtenderArgs::from_json(
        format!(
            r#"{{"Pod": {{"metadata": {{"name": "web-1", "namespace": "{namespace}", "labels": {labels}}},
                 "spec": {{"containers": []}}}},
                "Nodes": null, "NodeNames": {nodes}}}"#
        )
        .as_bytes(),
    )
    .unwrap()
}

fn web(nodes: &str) -> ExtenderArgs {
    request("default", r#"{"app": "web"}"#, nodes)
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap()
}

fn ns() -> Vec<String> {
    default_namespaces()
}

#[test]
fn keys_match_in_any_case_and_other_keys_are_ignored() {
    for body in [
        r#"{"Pod": {"metadata": {"name": "p", "namespace": "default"}}, "NodeNames": ["a"]}"#,
        r#"{"pod": {"metadata": {"name": "p", "namespace": "default"}}, "nodenames": ["a"]}"#,
        r#"{"pod": {"metadata": {"name": "p", "namespace": "default"}}, "nodeNames": ["a"], "extra": 1}"#,
        r#"{"POD": {"metadata": {"name": "p", "namespace": "default"}}, "NODENAMES": ["a"]}"#,
    ] {
        let args = ExtenderArgs::from_json(body.as_bytes()).unwrap();
        assert_eq!(args.pod.name(), "p", "{body}");
        assert_eq!(args.candidates(), vec!["a"], "{body}");
    }
}

#[test]
fn a_bad_body_names_the_field() {
    let err = |body: &str| ExtenderArgs::from_json(body.as_bytes()).unwrap_err();
    let e = err(r#"{"NodeNames": ["a"]}"#);
    assert_eq!(e.to_string(), "missing field `Pod` at line 1 column 20");
    let e = err(r#"{"Pod": {"metadata": {"labels": {"app": 7}}}, "NodeNames": []}"#);
    assert_eq!(e.path, "Pod.metadata.labels.app");
    assert!(e.message.starts_with("invalid type: integer `7`"), "{e}");
    let e = err(r#"{"Pod": {}, "NodeNames": ["a", 2]}"#);
    assert_eq!(e.path, "NodeNames[1]");
    let e = err(r#"{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}"#);
    assert_eq!(e.path, "Nodes.items[0]");
    assert!(e.message.contains("metadata.name"), "{e}");
    let e = err(r#"{"Pod": {}} trailing"#);
    assert!(e.path.is_empty() && e.message.contains("trailing"), "{e}");
    let e = err("[1]");
    assert!(e.message.contains("invalid type: sequence"), "{e}");
}

#[test]
fn filter_refuses_what_does_not_fit_with_wcas_reason() {
    let d = filter(
        &fit(),
        Some(&snapshot()),
        None,
        &web(r#"["c", "a", "b"]"#),
        &ns(),
    );
    assert_eq!(d.verdict, Verdict::Decided);
    assert_eq!(
        json(&d.reply),
        r#"{"Nodes":null,"NodeNames":["a","b"],"FailedNodes":{"c":"Could not fit node for dimensions: missing (cpu: 4.0)."},"FailedAndUnresolvableNodes":{},"Error":""}"#
    );
}

#[test]
fn a_node_the_snapshot_does_not_know_is_refused() {
    let d = filter(
        &fit(),
        Some(&snapshot()),
        None,
        &web(r#"["a", "zz"]"#),
        &ns(),
    );
    assert_eq!(d.reply.node_names, vec!["a"]);
    assert_eq!(
        d.reply.failed_nodes["zz"],
        "No capacity known for dimensions: cpu, mem."
    );
}

#[test]
fn pods_of_other_namespaces_pass_through_and_namespaces_are_configurable() {
    let args = request("kube-system", r#"{"app": "web"}"#, r#"["c", "a"]"#);
    let d = filter(&fit(), Some(&snapshot()), None, &args, &ns());
    assert_eq!(d.verdict, Verdict::OtherNamespace);
    assert_eq!(
        json(&d.reply),
        r#"{"Nodes":null,"NodeNames":["c","a"],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}"#
    );
    let p = prioritize(&least_used_bar(), Some(&snapshot()), None, &args, &ns());
    assert_eq!(
        (json(&p.reply).as_str(), p.verdict),
        ("[]", Verdict::OtherNamespace)
    );

    let both = vec!["default".to_owned(), "kube-system".to_owned()];
    let d = filter(&fit(), Some(&snapshot()), None, &args, &both);
    assert_eq!(d.verdict, Verdict::Decided);
    assert_eq!(d.reply.node_names, vec!["a"]);
    let only_other = vec!["batch".to_owned()];
    let d = filter(
        &fit(),
        Some(&snapshot()),
        None,
        &web(r#"["c"]"#),
        &only_other,
    );
    assert_eq!(d.verdict, Verdict::OtherNamespace, "default is not implied");
}

#[test]
fn pods_without_an_app_label_pass_through() {
    for labels in ["null", "{}", r#"{"tier": "web"}"#, r#"{"app": ""}"#] {
        let args = request("default", labels, r#"["c"]"#);
        let d = filter(&fit(), Some(&snapshot()), None, &args, &ns());
        assert_eq!(d.verdict, Verdict::NoApp, "{labels}");
        assert_eq!(d.reply.node_names, vec!["c"]);
        assert!(d.reply.failed_nodes.is_empty());
        let p = prioritize(&least_used_bar(), Some(&snapshot()), None, &args, &ns());
        assert_eq!(p.reply, vec![]);
    }
}

#[test]
fn before_the_first_snapshot_filter_answers_an_error_in_band() {
    let d = filter(&fit(), None, None, &web(r#"["a", "b"]"#), &ns());
    assert_eq!(d.verdict, Verdict::NotLoaded);
    assert_eq!(
        json(&d.reply),
        format!(
            r#"{{"Nodes":null,"NodeNames":["a","b"],"FailedNodes":{{}},"FailedAndUnresolvableNodes":{{}},"Error":"{NOT_LOADED}"}}"#
        )
    );
    let p = prioritize(&least_used_bar(), None, None, &web(r#"["a"]"#), &ns());
    assert_eq!((p.reply, p.verdict), (vec![], Verdict::NotLoaded));
    // Other namespaces pass even then: the extender never holds them up.
    let other = request("kube-system", r#"{"app": "web"}"#, r#"["a"]"#);
    let d = filter(&fit(), None, None, &other, &ns());
    assert_eq!(
        (d.verdict, d.reply.error.as_str()),
        (Verdict::OtherNamespace, "")
    );
}

#[test]
fn an_app_without_a_spec_passes_through() {
    let args = request("default", r#"{"app": "new-app"}"#, r#"["c", "a"]"#);
    let d = filter(&fit(), Some(&snapshot()), None, &args, &ns());
    assert_eq!(d.verdict, Verdict::UnknownApp);
    assert_eq!(d.reply.node_names, vec!["c", "a"]);
    assert!(d.reply.error.is_empty() && d.reply.failed_nodes.is_empty());
    let p = prioritize(&least_used_bar(), Some(&snapshot()), None, &args, &ns());
    assert_eq!((p.reply, p.verdict), (vec![], Verdict::UnknownApp));
    // An algorithm that needs no spec decides anyway.
    let nop = Algorithm::new(Kind::Nop);
    assert_eq!(
        filter(&nop, Some(&snapshot()), None, &args, &ns()).verdict,
        Verdict::Decided
    );
}

#[test]
fn a_full_nodes_list_is_answered_with_names_and_the_kept_objects() {
    let body = r#"{"Pod": {"metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}}},
        "Nodes": {"metadata": {"resourceVersion": "9"}, "items": [
            {"metadata": {"name": "c", "labels": {"zone": "z1"}}, "status": {}},
            {"metadata": {"name": "a"}, "spec": {"unschedulable": false}}]},
        "NodeNames": null}"#;
    let args = ExtenderArgs::from_json(body.as_bytes()).unwrap();
    assert_eq!(args.candidates(), vec!["c", "a"]);
    let d = filter(&fit(), Some(&snapshot()), None, &args, &ns());
    assert_eq!(
        json(&d.reply),
        r#"{"Nodes":{"metadata":{},"items":[{"metadata": {"name": "a"}, "spec": {"unschedulable": false}}]},"NodeNames":["a"],"FailedNodes":{"c":"Could not fit node for dimensions: missing (cpu: 4.0)."},"FailedAndUnresolvableNodes":{},"Error":""}"#
    );
    let p = prioritize(&least_used_bar(), Some(&snapshot()), None, &args, &ns());
    assert_eq!(
        json(&p.reply),
        r#"[{"Host":"a","Score":8},{"Host":"c","Score":0}]"#
    );
}

#[test]
fn no_candidates_is_an_empty_array_never_null() {
    let args = ExtenderArgs::from_json(
        br#"{"Pod": {"metadata": {"namespace": "default", "labels": {"app": "web"}}}}"#,
    )
    .unwrap();
    let d = filter(&fit(), Some(&snapshot()), None, &args, &ns());
    assert!(json(&d.reply).contains(r#""NodeNames":[]"#));
}

#[test]
fn least_used_bar_scores_are_rescaled_into_0_to_10() {
    // a: f = (0.25, 0.25): least used 0.75, bar 1 → 1.75 → raw 17 → 17·10/20 = 8.5 → 8.
    // b: f = (6/8, 16/64) = (0.75, 0.25): least used 0.5, bar 0.5 → 1.0 → raw 10 → 5.
    // c: f = (6/2, 0.25): least used −0.625, bar −1.75 → raw −23 → 0.
    let p = prioritize(
        &least_used_bar(),
        Some(&snapshot()),
        None,
        &web(r#"["c", "b", "a"]"#),
        &ns(),
    );
    assert_eq!(p.verdict, Verdict::Decided);
    assert_eq!(
        json(&p.reply),
        r#"[{"Host":"a","Score":8},{"Host":"b","Score":5},{"Host":"c","Score":0}]"#
    );
}

/// A node the snapshot has no capacity for scores 0, the lowest, as filter refuses it; before,
/// it scored above a known full node (each fraction taken as 1). wca fails the whole request on
/// it (`nodes_capacities[node]`, a KeyError).
#[test]
fn a_node_the_snapshot_does_not_know_scores_0() {
    let p = prioritize(
        &least_used_bar(),
        Some(&snapshot()),
        None,
        &web(r#"["c", "zz", "a"]"#),
        &ns(),
    );
    assert_eq!(
        json(&p.reply),
        r#"[{"Host":"a","Score":8},{"Host":"c","Score":0},{"Host":"zz","Score":0}]"#
    );
}

#[test]
fn a_usage_index_gives_the_same_replies() {
    let snap = snapshot();
    let usage = Usage::of(&snap);
    let args = web(r#"["c", "b", "a", "zz"]"#);
    for algorithm in [fit(), least_used_bar()] {
        assert_eq!(
            filter(&algorithm, Some(&snap), Some(&usage), &args, &ns()),
            filter(&algorithm, Some(&snap), None, &args, &ns())
        );
        assert_eq!(
            prioritize(&algorithm, Some(&snap), Some(&usage), &args, &ns()),
            prioritize(&algorithm, Some(&snap), None, &args, &ns())
        );
    }
}

#[test]
fn the_score_mapping_keeps_order_and_stays_in_range() {
    let lub = score_ceiling(&least_used_bar());
    assert_eq!(lub, 20.0);
    assert_eq!(
        [20, 19, 11, 10, 1, 0, -5].map(|raw| kube_score(raw, lub)),
        [10, 9, 5, 5, 0, 0, 0]
    );
    // BAR and LeastUsed at the default max_node_score: unchanged, clamped at the ends.
    let bar = Algorithm::new(Kind::Bar {
        cpu_scale_factor: 1.0,
        bar_weights: BTreeMap::new(),
    });
    let ceiling = score_ceiling(&bar);
    assert_eq!(
        [0, 7, 10, -3].map(|r| kube_score(r, ceiling)),
        [0, 7, 10, 0]
    );
    // A larger max_node_score is rescaled.
    let mut fine = bar.clone();
    fine.max_node_score = 100.0;
    assert_eq!(kube_score(55, score_ceiling(&fine)), 5);
    // least_used_weight counts in the ceiling.
    let mut heavy = least_used_bar();
    if let Kind::LeastUsedBar {
        least_used_weight, ..
    } = &mut heavy.kind
    {
        *least_used_weight = 3.0;
    }
    assert_eq!(score_ceiling(&heavy), 40.0);
    assert_eq!(kube_score(40, 40.0), 10);
    // Algorithms that score nothing give 0 everywhere.
    assert_eq!(score_ceiling(&fit()), 0.0);
    assert_eq!(kube_score(0, 0.0), 0);
    let p = prioritize(&fit(), Some(&snapshot()), None, &web(r#"["a"]"#), &ns());
    assert_eq!(
        p.reply,
        vec![HostPriority {
            host: "a".into(),
            score: 0
        }]
    );
}
