use super::*;
use crate::config::{ProviderKind, Queries};

fn node_json(name: &str, labels: &str, cpu: &str, memory: &str) -> String {
    format!(
        r#"{{"metadata": {{"name": "{name}", "labels": {{{labels}}}}},
            "status": {{"capacity": {{"cpu": "{cpu}", "memory": "{memory}", "pods": "110"}}}}}}"#
    )
}

fn pod_json(uid: &str, name: &str, app: Option<&str>, node: Option<&str>, phase: &str) -> String {
    let labels = app.map_or(String::new(), |a| format!(r#""labels": {{"app": "{a}"}},"#));
    let node = node.map_or(String::new(), |n| format!(r#""nodeName": "{n}""#));
    format!(
        r#"{{"metadata": {{"name": "{name}", "namespace": "default", "uid": "{uid}", {labels}
              "resourceVersion": "7"}},
            "spec": {{{node}}}, "status": {{"phase": "{phase}"}}}}"#
    )
}

fn list(kind: &str, items: &[String]) -> Vec<u8> {
    format!(
        r#"{{"kind": "{kind}", "apiVersion": "v1", "metadata": {{"resourceVersion": "100"}},
            "items": [{}]}}"#,
        items.join(",")
    )
    .into_bytes()
}

#[test]
fn quantities_in_every_unit() {
    assert_eq!(parse_quantity("4"), Some(4.0));
    assert_eq!(parse_quantity("500m"), Some(0.5));
    assert_eq!(parse_quantity("1.5"), Some(1.5));
    assert_eq!(parse_quantity("2k"), Some(2000.0));
    assert_eq!(parse_quantity("1Gi"), Some(1073741824.0));
    assert_eq!(parse_quantity("1e3"), Some(1000.0));
    assert_eq!(parse_quantity("12Zi"), None);
    assert_eq!(parse_quantity("Ki"), None);
    assert_eq!(parse_quantity(""), None);
    // wca: int(Ki · 1024 / 1e9).
    assert_eq!(memory_gb("16318504Ki"), Some(16.0));
    assert_eq!(memory_gb("976562Ki"), Some(0.0));
    assert_eq!(memory_gb("64Gi"), Some(68.0));
    assert_eq!(memory_gb("192G"), Some(192.0));
    assert_eq!(memory_gb("1000000000"), Some(1.0));
}

#[test]
fn node_list_gives_capacities_and_skips_control_plane() {
    let body = list(
        "NodeList",
        &[
            node_json("n1", r#""kubernetes.io/hostname": "n1""#, "4", "16318504Ki"),
            node_json("n2", "", "500m", "64Gi"),
            node_json(
                "master",
                r#""node-role.kubernetes.io/master": """#,
                "8",
                "8Gi",
            ),
            node_json(
                "cp",
                r#""node-role.kubernetes.io/control-plane": """#,
                "8",
                "8Gi",
            ),
        ],
    );
    let nodes = parse_node_list(&body).unwrap();
    assert_eq!(
        nodes.capacity,
        BTreeMap::from([
            (
                "n1".into(),
                NodeCapacity {
                    cpu: 4.0,
                    mem: 16.0
                }
            ),
            (
                "n2".into(),
                NodeCapacity {
                    cpu: 0.5,
                    mem: 68.0
                }
            ),
        ])
    );
    assert_eq!(
        nodes.control_plane,
        BTreeSet::from(["cp".to_owned(), "master".to_owned()])
    );
}

#[test]
fn a_node_without_capacity_refuses_the_list_naming_it() {
    let body =
        br#"{"items": [{"metadata": {"name": "n9"}, "status": {"capacity": {"cpu": "4"}}}]}"#;
    assert_eq!(
        parse_node_list(body).unwrap_err().to_string(),
        "node n9: no status.capacity.memory"
    );
    let body = list("NodeList", &[node_json("n3", "", "4", "12Zi")]);
    assert_eq!(
        parse_node_list(&body).unwrap_err().to_string(),
        "node n3: status.capacity.memory \"12Zi\" is not a quantity"
    );
    let err = parse_node_list(b"<html>oops</html>").unwrap_err();
    assert_eq!(err.kind(), "bad_reply");
    assert_eq!(parse_node_list(b"{}").unwrap_err().kind(), "bad_reply");
}

#[test]
fn pod_list_counts_bound_labelled_running_pods_per_node() {
    let body = list(
        "PodList",
        &[
            pod_json("u1", "redis-1", Some("redis"), Some("n1"), "Running"),
            pod_json("u2", "redis-2", Some("redis"), Some("n1"), "Pending"),
            pod_json("u3", "web-1", Some("web"), Some("n2"), "Running"),
            // Not bound yet, no app label, finished, on a control-plane node: not counted.
            pod_json("u4", "redis-3", Some("redis"), None, "Pending"),
            pod_json("u5", "sidecar", None, Some("n1"), "Running"),
            pod_json("u6", "job-1", Some("job"), Some("n2"), "Succeeded"),
            pod_json("u7", "cp-1", Some("redis"), Some("master"), "Running"),
        ],
    );
    let (pods, rv) = parse_pod_list(&body).unwrap();
    assert_eq!(rv.as_deref(), Some("100"));
    let mut index = PodIndex::default();
    index.replace_namespace("default", pods);
    let skip = BTreeSet::from(["master".to_owned()]);
    let assigned = index.assigned_apps(&skip);
    assert_eq!(
        assigned,
        BTreeMap::from([
            (
                "n1".to_owned(),
                BTreeMap::from([("redis".to_owned(), Assigned::Count(2))])
            ),
            (
                "n2".to_owned(),
                BTreeMap::from([("web".to_owned(), Assigned::Count(1))])
            ),
        ])
    );
    // A pod without labels at all (wca would crash on it) is just not counted.
    let body = br#"{"items": [{"metadata": {"name": "bare", "namespace": "default"}, "spec": {"nodeName": "n1"}}]}"#;
    let (pods, _) = parse_pod_list(body).unwrap();
    assert_eq!(pods[0].counted_on(), None);
}

fn event(kind: &str, pod: &str) -> WatchEvent {
    parse_watch_line(format!(r#"{{"type": "{kind}", "object": {pod}}}"#).as_bytes()).unwrap()
}

#[test]
fn watch_events_keep_counts_exact() {
    let mut index = PodIndex::default();
    let (pods, _) = parse_pod_list(&list(
        "PodList",
        &[pod_json(
            "u1",
            "redis-1",
            Some("redis"),
            Some("n1"),
            "Running",
        )],
    ))
    .unwrap();
    index.replace_namespace("default", pods);
    let none = BTreeSet::new();
    let count = |index: &PodIndex, node: &str| {
        index
            .assigned_apps(&none)
            .get(node)
            .and_then(|a| a.get("redis"))
            .map_or(0, Assigned::count)
    };

    // Created unbound: nothing yet. Bound by kube-scheduler (MODIFIED with nodeName): counted.
    let added = event(
        "ADDED",
        &pod_json("u2", "redis-2", Some("redis"), None, "Pending"),
    );
    assert!(!index.apply(&added));
    assert_eq!(count(&index, "n1"), 1);
    let bound = event(
        "MODIFIED",
        &pod_json("u2", "redis-2", Some("redis"), Some("n1"), "Pending"),
    );
    assert_eq!(bound.resource_version(), Some("7"));
    assert!(index.apply(&bound));
    assert_eq!(count(&index, "n1"), 2);
    // The same event twice (a watch resumed a little early) counts once.
    assert!(!index.apply(&bound));
    assert_eq!(count(&index, "n1"), 2);
    // Finished, then deleted.
    let done = event(
        "MODIFIED",
        &pod_json("u2", "redis-2", Some("redis"), Some("n1"), "Failed"),
    );
    assert!(index.apply(&done));
    assert_eq!(count(&index, "n1"), 1);
    let deleted = event(
        "DELETED",
        &pod_json("u1", "redis-1", Some("redis"), Some("n1"), "Running"),
    );
    assert!(index.apply(&deleted));
    assert_eq!(count(&index, "n1"), 0);
    // A relist replaces the namespace's pods wholesale.
    index.replace_namespace(
        "default",
        vec![Pod {
            uid: "u9".into(),
            namespace: "default".into(),
            name: "redis-9".into(),
            app: Some("redis".into()),
            node: Some("n2".into()),
            finished: false,
        }],
    );
    assert_eq!(index.len(), 1);
    assert_eq!(count(&index, "n2"), 1);
}

#[test]
fn bookmarks_and_errors() {
    let bookmark = parse_watch_line(
        br#"{"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12345"}}}"#,
    )
    .unwrap();
    assert_eq!(bookmark.resource_version(), Some("12345"));
    let gone = parse_watch_line(
        br#"{"type": "ERROR", "object": {"kind": "Status", "status": "Failure", "code": 410,
             "reason": "Expired", "message": "too old resource version: 1 (2)"}}"#,
    )
    .unwrap();
    assert_eq!(
        gone,
        WatchEvent::Error {
            code: Some(410),
            message: "Expired: too old resource version: 1 (2)".into()
        }
    );
    assert_eq!(
        parse_watch_line(br#"{"type": "SURPRISE", "object": {}}"#)
            .unwrap_err()
            .kind(),
        "bad_reply"
    );
}

#[test]
fn prometheus_replies() {
    let ok = br#"{"status":"success","data":{"resultType":"vector","result":[
        {"metric":{"app":"redis","__name__":"app_req"},"value":[1700000000.123,"1.5"]},
        {"metric":{},"value":[1700000000.123,"NaN"]}]}}"#;
    let samples = parse_query_reply(ok).unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0].metric["app"], "redis");
    assert_eq!(samples[0].value, 1.5);
    assert!(samples[1].value.is_nan());
    let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1,"+Inf"]}}"#;
    assert_eq!(parse_query_reply(scalar).unwrap()[0].value, f64::INFINITY);
    let err = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 5"}"#;
    assert_eq!(
        parse_query_reply(err).unwrap_err().to_string(),
        "prometheus: bad_data: parse error at char 5"
    );
    let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
    assert_eq!(parse_query_reply(matrix).unwrap_err().kind(), "bad_reply");
    assert_eq!(
        parse_query_reply(b"garbage").unwrap_err().kind(),
        "bad_reply"
    );
}

fn sample(labels: &[(&str, &str)], value: f64) -> Sample {
    Sample {
        metric: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        value,
    }
}

const ALL: [Dim; 5] = [
    Dim::Cpu,
    Dim::Mem,
    Dim::MembwRead,
    Dim::MembwWrite,
    Dim::Wss,
];

#[test]
fn the_plan_follows_the_dimensions_and_the_provider() {
    let q = Queries::default();
    let kinds = |kind, dims: &[Dim]| -> Vec<QueryKind> {
        plan_queries(kind, &q, dims)
            .unwrap()
            .into_iter()
            .map(|p| p.kind)
            .collect()
    };
    assert_eq!(
        kinds(ProviderKind::Cluster, &[Dim::Cpu, Dim::Mem]),
        vec![
            QueryKind::AppRequest(Dim::Cpu),
            QueryKind::AppRequest(Dim::Mem),
            QueryKind::DramHitRatio
        ]
    );
    let score = kinds(ProviderKind::ClusterScore, &ALL);
    assert_eq!(
        score[..4],
        [
            QueryKind::PmemNodes,
            QueryKind::MembwCapacityRead,
            QueryKind::MembwCapacityWrite,
            QueryKind::NodeCapacityWss
        ]
    );
    assert!(score.ends_with(&[QueryKind::AppProfiles, QueryKind::NodeTypes]));
    assert_eq!(
        plan_queries(ProviderKind::Cluster, &q, &[Dim::MembwFlat])
            .unwrap_err()
            .to_string(),
        "no APP_REQUESTED_RESOURCES_QUERY_MAP entry for dimension membw_flat"
    );
}

fn kube() -> KubeData {
    let nodes = parse_node_list(&list(
        "NodeList",
        &[
            node_json("dram1", "", "40", "196608000Ki"),
            node_json("pmem1", "", "80", "1048576000Ki"),
        ],
    ))
    .unwrap();
    let mut pods = PodIndex::default();
    let (list, _) = parse_pod_list(&list(
        "PodList",
        &[pod_json(
            "u1",
            "redis-1",
            Some("redis"),
            Some("pmem1"),
            "Running",
        )],
    ))
    .unwrap();
    pods.replace_namespace("default", list);
    KubeData { nodes, pods }
}

fn results(dram_membw: bool) -> Vec<(PlannedQuery, Vec<Sample>)> {
    let mut q = Queries::default();
    if dram_membw {
        q.node_capacity_dram_membw = Some("dram_bw".into());
    }
    let plan = plan_queries(ProviderKind::ClusterScore, &q, &ALL).unwrap();
    plan.into_iter()
        .map(|p| {
            let n = |v| vec![sample(&[("nodename", "pmem1")], v)];
            let samples = match p.kind {
                QueryKind::PmemNodes => n(1.0),
                QueryKind::MembwCapacityRead => n(70.9),
                QueryKind::MembwCapacityWrite => n(20.2),
                QueryKind::NodeCapacityWss => n(300.7),
                QueryKind::NodeCapacityDramMembw => vec![sample(&[("nodename", "dram1")], 150.0)],
                QueryKind::AppRequest(d) => vec![
                    sample(&[("app", "redis")], if d == Dim::Cpu { 2.9 } else { 10.5 }),
                    // A series without the app label is skipped, as wca skips it.
                    sample(&[], 99.0),
                ],
                QueryKind::DramHitRatio => vec![sample(&[("nodename", "pmem1")], 0.97)],
                QueryKind::AppProfiles => vec![sample(&[("app", "redis")], -3.5)],
                QueryKind::NodeTypes => vec![
                    sample(&[("nodename", "pmem1"), ("nodetype", "pmem")], 1.0),
                    sample(&[("nodename", "dram1"), ("nodetype", "dram")], 1.0),
                ],
            };
            (p, samples)
        })
        .collect()
}

#[test]
fn combine_as_wca() {
    let prom = PromData::read(&results(false)).unwrap();
    let snap = combine(&kube(), Some(&prom), &ALL);
    let caps = |n: &str| snap.node_capacities[n].clone();
    // 196608000 Ki = 201.3 GB -> 201; DRAM: 200/200 bandwidth, WSS = memory.
    assert_eq!(
        caps("dram1"),
        BTreeMap::from([
            (Dim::Cpu, 40.0),
            (Dim::Mem, 201.0),
            (Dim::MembwRead, 200.0),
            (Dim::MembwWrite, 200.0),
            (Dim::Wss, 201.0)
        ])
    );
    // PMEM: bandwidth and WSS from the queries, truncated.
    assert_eq!(
        caps("pmem1"),
        BTreeMap::from([
            (Dim::Cpu, 80.0),
            (Dim::Mem, 1073.0),
            (Dim::MembwRead, 70.0),
            (Dim::MembwWrite, 20.0),
            (Dim::Wss, 300.0)
        ])
    );
    // Requests as the queries answer them (wca's `float(value)`), not truncated.
    assert_eq!(snap.apps_spec["redis"][&Dim::Cpu], 2.9);
    assert_eq!(snap.apps_spec["redis"][&Dim::Mem], 10.5);
    assert_eq!(snap.apps_spec.len(), 1);
    assert_eq!(snap.count("pmem1", "redis"), 1);
    assert_eq!(snap.nodes["pmem1"].platform_dram_hit_ratio, Some(0.97));
    assert!(snap.is_pmem("pmem1"));
    assert_eq!(snap.nodes["dram1"].node_type, Some(NodeType::Dram));
    assert_eq!(snap.app_profiles["redis"], -3.5);

    // NODE_CAPACITY_DRAM_MEMBW, when configured, gives DRAM nodes' bandwidth.
    let prom = PromData::read(&results(true)).unwrap();
    let snap = combine(&kube(), Some(&prom), &ALL);
    assert_eq!(snap.node_capacities["dram1"][&Dim::MembwRead], 150.0);
    assert_eq!(snap.node_capacities["dram1"][&Dim::MembwWrite], 150.0);

    // CPU and memory only: no bandwidth, no PMEM query, so no node type.
    let snap = combine(&kube(), Some(&prom), &[Dim::Cpu, Dim::Mem]);
    assert_eq!(snap.node_capacities["dram1"].len(), 2);
    // Without Prometheus at all, every node is a DRAM node.
    let snap = combine(&kube(), None, &ALL);
    assert_eq!(snap.node_capacities["pmem1"][&Dim::MembwRead], 200.0);
    assert!(snap.apps_spec.is_empty());
}

#[test]
fn series_without_their_label_or_number_are_refused() {
    let q = PlannedQuery {
        kind: QueryKind::MembwCapacityRead,
        promql: "sum(bw)".into(),
    };
    let err = PromData::read(&[(q.clone(), vec![sample(&[], 1.0)])]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "query \"sum(bw)\": a series without the label nodename ({})"
    );
    let err = PromData::read(&[(q, vec![sample(&[("nodename", "n1")], f64::NAN)])]).unwrap_err();
    assert!(err.to_string().contains("is not a number"), "{err}");
    let types = PlannedQuery {
        kind: QueryKind::NodeTypes,
        promql: "node_type".into(),
    };
    let err = PromData::read(&[(
        types,
        vec![sample(&[("nodename", "n1"), ("nodetype", "hbm")], 1.0)],
    )])
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "query \"node_type\": node n1 has nodetype \"hbm\", not pmem or dram"
    );
}

/// docs/placement.md shows the default `!Queries` block; it must be exactly the defaults: every
/// query that has a default written out, with its text, and nothing else.
#[test]
fn the_documented_default_queries_are_the_defaults() {
    let doc = include_str!("../../../docs/placement.md");
    let marker = "# The default queries";
    let start = doc
        .find(marker)
        .expect("docs/placement.md has the default queries' block");
    let block = &doc[start..];
    let block = &block[..block.find("```").expect("the block ends")];
    let config = crate::config::load_config(block, |_| None).expect("the block loads");
    let provider = config.algorithms[crate::config::SINGLE_ALGORITHM]
        .data_provider
        .as_ref()
        .unwrap();
    let defaults = Queries::default();
    assert_eq!(provider.queries, defaults);
    // Written out, not left to the defaults: each key of the block has a default, and each
    // default is in the block.
    let value: serde_norway::Value = serde_norway::from_str(block).unwrap();
    let find = |v: &serde_norway::Value, key: &str| -> serde_norway::Value {
        let v = match v {
            serde_norway::Value::Tagged(t) => t.value.clone(),
            other => other.clone(),
        };
        v.get(key).cloned().unwrap_or_else(|| panic!("no {key}"))
    };
    let queries = find(
        &find(&find(&value, "algorithm"), "data_provider"),
        "queries",
    );
    let queries = match queries {
        serde_norway::Value::Tagged(t) => t.value,
        other => other,
    };
    let text = |key: &str| queries.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    assert_eq!(
        text("NODES_PMM_MEMORY_MODE"),
        Some(defaults.nodes_pmm_memory_mode)
    );
    assert_eq!(
        text("MEMBW_CAPACITY_READ"),
        Some(defaults.membw_capacity_read)
    );
    assert_eq!(
        text("MEMBW_CAPACITY_WRITE"),
        Some(defaults.membw_capacity_write)
    );
    assert_eq!(
        text("NODE_CAPACITY_MEM_WSS"),
        Some(defaults.node_capacity_mem_wss)
    );
    assert_eq!(
        text("NODES_DRAM_HIT_RATIO"),
        Some(defaults.nodes_dram_hit_ratio)
    );
    let map: BTreeMap<Dim, String> = serde_norway::from_value(
        queries
            .get("APP_REQUESTED_RESOURCES_QUERY_MAP")
            .cloned()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(map, defaults.app_requested_resources);
    assert_eq!(
        queries.as_mapping().unwrap().len(),
        6,
        "no other key: {queries:?}"
    );
}

/// The default queries answer in the units of the Kubernetes API's capacities: a pod asking
/// 4 GiB (wca's `task_requested_mem_bytes`) fits a node of 16 GB. Before, its request came back
/// as 4294967296 and every node refused it (`missing (mem: 4294967262.0)`).
#[test]
fn default_queries_answer_in_gb_like_the_node_capacities() {
    let q = Queries::default();
    for (dim, query) in &q.app_requested_resources {
        match dim {
            Dim::Cpu => assert!(!query.contains("1e9"), "cores: {query}"),
            _ => assert!(query.ends_with(" / 1e9"), "{dim} in GB or GB/s: {query}"),
        }
    }
    for query in [
        &q.membw_capacity_read,
        &q.membw_capacity_write,
        &q.node_capacity_mem_wss,
    ] {
        assert!(query.ends_with(" / 1e9"), "{query}");
    }
}
