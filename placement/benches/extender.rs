//! The extender's decision for one kube-scheduler request with 5,000 `NodeNames`, without HTTP:
//! the request body parsed, filtered or prioritized (LeastUsedBAR on cpu and mem), and the reply
//! serialized, as the server does per request (HierBAR's filter too). The cluster: 5,000 nodes each running three of
//! 50 apps. (`benches/extender.sh` measures the same through the real server.)
//!
//! `cargo bench -p verwalter-placement --bench extender`

use std::collections::BTreeMap;

use criterion::{Criterion, criterion_group, criterion_main};
use verwalter_placement::extender::{self, ExtenderArgs};
use verwalter_placement::{Algorithm, Assigned, Dim, Kind, Snapshot, Usage};

const NODES: usize = 5000;
const APPS: usize = 50;

fn snapshot() -> Snapshot {
    let mut s = Snapshot::default();
    for a in 0..APPS {
        s.apps_spec.insert(
            format!("app-{a:02}"),
            BTreeMap::from([
                (Dim::Cpu, 1.0 + (a % 4) as f64),
                (Dim::Mem, 2.0 + (a % 8) as f64 * 2.0),
            ]),
        );
    }
    for n in 0..NODES {
        let big = if n % 3 == 0 { 2.0 } else { 1.0 };
        let node = format!("node-{n:04}");
        s.node_capacities.insert(
            node.clone(),
            BTreeMap::from([(Dim::Cpu, 40.0 * big), (Dim::Mem, 192.0 * big)]),
        );
        let apps = (0..3)
            .map(|k| {
                (
                    format!("app-{:02}", (n * 7 + k * 13) % APPS),
                    Assigned::Count(1 + (n + k) as u64 % 2),
                )
            })
            .collect();
        s.assigned_apps.insert(node, apps);
    }
    s
}

fn body() -> String {
    let names: Vec<String> = (0..NODES).map(|n| format!("\"node-{n:04}\"")).collect();
    format!(
        r#"{{"Pod":{{"metadata":{{"name":"app-07-x2k4p","namespace":"default","labels":{{"app":"app-07"}}}},"spec":{{"containers":[{{"name":"main","image":"app:1"}}]}}}},"Nodes":null,"NodeNames":[{}]}}"#,
        names.join(",")
    )
}

fn algorithm() -> Algorithm {
    Algorithm::new(Kind::LeastUsedBar {
        cpu_scale_factor: 1.0,
        bar_weights: BTreeMap::new(),
        least_used_weights: BTreeMap::new(),
        least_used_weight: 1.0,
    })
}

/// HierBAR on the same dimensions: the node shapes (two sizes here) grouped into classes per
/// request.
fn hier_bar() -> Algorithm {
    Algorithm::new(Kind::HierBar {
        cpu_scale_factor: 1.0,
        bar_weights: BTreeMap::new(),
        least_used_weights: BTreeMap::new(),
        least_used_weight: 1.0,
        merge_threshold: None,
    })
}

fn bench(c: &mut Criterion) {
    let snapshot = snapshot();
    let body = body();
    let algorithm = algorithm();
    let hier_bar = hier_bar();
    let namespaces = extender::default_namespaces();
    let args = ExtenderArgs::from_json(body.as_bytes()).unwrap();
    // As the store keeps it beside the snapshot.
    let usage = Usage::of(&snapshot);
    let mut group = c.benchmark_group("extender_5000_nodes");
    group.sample_size(30);
    group.bench_function("filter_request", |b| {
        b.iter(|| {
            let args = ExtenderArgs::from_json(body.as_bytes()).unwrap();
            let d = extender::filter(
                &algorithm,
                Some(&snapshot),
                Some(&usage),
                &args,
                &namespaces,
            );
            serde_json::to_vec(&d.reply).unwrap()
        })
    });
    group.bench_function("hier_bar_filter_request", |b| {
        b.iter(|| {
            let args = ExtenderArgs::from_json(body.as_bytes()).unwrap();
            let d = extender::filter(&hier_bar, Some(&snapshot), Some(&usage), &args, &namespaces);
            serde_json::to_vec(&d.reply).unwrap()
        })
    });
    group.bench_function("prioritize_request", |b| {
        b.iter(|| {
            let args = ExtenderArgs::from_json(body.as_bytes()).unwrap();
            let d = extender::prioritize(
                &algorithm,
                Some(&snapshot),
                Some(&usage),
                &args,
                &namespaces,
            );
            serde_json::to_vec(&d.reply).unwrap()
        })
    });
    group.bench_function("filter_decision_only", |b| {
        b.iter(|| {
            extender::filter(
                &algorithm,
                Some(&snapshot),
                Some(&usage),
                &args,
                &namespaces,
            )
        })
    });
    group.bench_function("prioritize_decision_only", |b| {
        b.iter(|| {
            extender::prioritize(
                &algorithm,
                Some(&snapshot),
                Some(&usage),
                &args,
                &namespaces,
            )
        })
    });
    // Without the usage index: each node's apps summed again per request.
    group.bench_function("filter_decision_unindexed", |b| {
        b.iter(|| extender::filter(&algorithm, Some(&snapshot), None, &args, &namespaces))
    });
    group.bench_function("prioritize_decision_unindexed", |b| {
        b.iter(|| extender::prioritize(&algorithm, Some(&snapshot), None, &args, &namespaces))
    });
    group.bench_function("usage_index", |b| b.iter(|| Usage::of(&snapshot)));
    group.bench_function("parse_only", |b| {
        b.iter(|| ExtenderArgs::from_json(body.as_bytes()).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
