use super::*;

const NODES: &str = "\
groups:
  - count: 12
    name_prefix: n
    capacity: {cpu: 40, mem: 192}
    type: dram
nodes:
  - name: big
    capacity: {cpu: 80, mem: 1000, membw_read: 40, membw_write: 10}
    type: pmem
    dram_hit_ratio: 0.98
";

fn tasks(order: &str) -> String {
    format!(
        "\
types:
  - name: a
    requests: {{cpu: 1, mem: 2}}
    count: 3
  - name: b
    requests: {{cpu: 2, mem: 1}}
    count: 1
    profile: 0.5
  - name: c
    requests: {{cpu: 4}}
    count: 2
{order}"
    )
}

#[test]
fn groups_are_named_with_zero_padded_indexes_and_nodes_keep_their_facts() {
    let nodes = parse_nodes(NODES).unwrap();
    let set = parse_tasks(&tasks("")).unwrap();
    let snap = snapshot(&nodes, &set);
    let names: Vec<&String> = snap.node_capacities.keys().collect();
    assert_eq!(names.len(), 13);
    assert_eq!(names[0], "big");
    assert_eq!(names[1], "n00");
    assert_eq!(names[12], "n11");
    assert_eq!(snap.node_capacities["n07"][&Dim::Mem], 192.0);
    assert!(snap.is_pmem("big"));
    assert_eq!(snap.nodes["big"].platform_dram_hit_ratio, Some(0.98));
    assert_eq!(snap.nodes["n03"].node_type, Some(NodeType::Dram));
    assert_eq!(snap.apps_spec["c"], BTreeMap::from([(Dim::Cpu, 4.0)]));
    assert_eq!(snap.app_profiles, BTreeMap::from([("b".to_string(), 0.5)]));
    assert!(snap.assigned_apps.is_empty());
    // One node of a group: index 0 in one digit.
    let one = parse_nodes("groups: [{count: 1, name_prefix: x-, capacity: {cpu: 1}}]").unwrap();
    assert_eq!(node_names(&one), ["x-0"]);
}

#[test]
fn orders_interleave_follow_or_shuffle_by_seed() {
    let list = |order: &str| task_list(&parse_tasks(&tasks(order)).unwrap()).join(",");
    assert_eq!(list(""), "a,b,c,a,c,a");
    assert_eq!(list("order: interleaved\n"), "a,b,c,a,c,a");
    assert_eq!(list("order: sequential\n"), "a,a,a,b,c,c");
    let shuffled = list("order: shuffled\nseed: 7\n");
    assert_eq!(shuffled, list("order: shuffled\nseed: 7\n"));
    let mut sorted: Vec<&str> = shuffled.split(',').collect();
    sorted.sort();
    assert_eq!(sorted.join(","), "a,a,a,b,c,c");
    // Another seed, another order (for these two seeds; fixed by SplitMix64's definition).
    assert_ne!(shuffled, list("order: shuffled\nseed: 8\n"));
}

#[test]
fn splitmix64_gives_its_published_sequence() {
    // The first outputs for seed 1234567 (the reference implementation's test vector).
    let mut rng = SplitMix64(1234567);
    assert_eq!(rng.next(), 6457827717110365317);
    assert_eq!(rng.next(), 3203168211198807973);
}

fn err_nodes(yaml: &str) -> String {
    parse_nodes(yaml).unwrap_err().to_string()
}

fn err_tasks(yaml: &str) -> String {
    parse_tasks(yaml).unwrap_err().to_string()
}

#[test]
fn bad_node_files_are_refused_with_the_line() {
    let e = err_nodes(
        "groups:\n  - count: 2\n    name_prefix: n\n    capacity: {cpu: 1}\n    cout: 3\n",
    );
    assert!(
        e.starts_with("5:5:") && e.contains("unknown field `cout`"),
        "{e}"
    );
    let e = err_nodes("nodes:\n  - name: a\n    capacity: {cpu: 1, disk: 3}\n");
    assert!(e.starts_with("3:") && e.contains("disk"), "{e}");
    let e = err_nodes("nodes:\n  - name: a\n    capacity: {cpu: -1}\n");
    assert!(
        e.starts_with("2:") && e.contains("cpu: -1 is not a number ≥ 0"),
        "{e}"
    );
    let e = err_nodes("nodes:\n  - name: a\n    capacity: {cpu: 1}\n    type: ssd\n");
    assert!(e.starts_with("4:") && e.contains("ssd"), "{e}");
    let e = err_nodes("groups:\n  - count: 0\n    name_prefix: n\n    capacity: {cpu: 1}\n");
    assert!(e.starts_with("2:") && e.contains("at least 1"), "{e}");
    let e = err_nodes(
        "groups:\n  - count: 2\n    name_prefix: n\n    capacity: {cpu: 1}\nnodes:\n  - name: n1\n    capacity: {cpu: 1}\n",
    );
    assert_eq!(e, "6: node \"n1\" is given twice");
    assert_eq!(
        err_nodes("groups: []\n"),
        "no nodes: give `groups` or `nodes`"
    );
    let e = err_nodes("nodes:\n  - name: a\n    capacity: {cpu: [1\n");
    assert!(e.starts_with("3:"), "{e}");
}

#[test]
fn bad_task_files_are_refused_with_the_line() {
    let e = err_tasks("types:\n  - name: a\n    requests: {cpu: 1}\n    count: x\n");
    assert!(e.starts_with("4:") && e.contains("invalid type"), "{e}");
    let e = err_tasks("types:\n  - name: a\n    requests: {cpu: 1}\n    count: 1\norder: random\n");
    assert!(e.starts_with("5:") && e.contains("random"), "{e}");
    let e =
        err_tasks("types:\n  - name: a\n    requests: {cpu: 1}\n    count: 1\norder: shuffled\n");
    assert!(e.contains("shuffled needs a seed"), "{e}");
    assert!(e.starts_with("5:"), "{e}");
    let e = err_tasks("types:\n  - name: a\n    requests: {cpu: 1}\n    count: 1\nseed: 3\n");
    assert_eq!(e, "5: seed is only used with order: shuffled");
    let e = err_tasks(
        "types:\n  - name: a\n    requests: {cpu: 1}\n    count: 1\n  - name: a\n    requests: {cpu: 2}\n    count: 1\n",
    );
    assert_eq!(e, "5: task type \"a\" is given twice");
    let e = err_tasks("types:\n  - name: a\n    requests: {}\n    count: 1\n");
    assert!(
        e.starts_with("2:") && e.contains("requests is empty"),
        "{e}"
    );
    let e = err_tasks("types:\n  - name: a\n    request: {cpu: 1}\n    count: 1\n");
    assert!(
        e.starts_with("3:5:") && e.contains("unknown field `request`"),
        "{e}"
    );
}

#[test]
fn counts_over_the_limits_are_refused_with_the_line() {
    // One group, or one task type, over the limit: refused as it is read, before anything is
    // made of it.
    let e =
        err_nodes("groups:\n  - count: 100000000\n    name_prefix: n\n    capacity: {cpu: 1}\n");
    assert!(
        e.starts_with("2:") && e.contains("count: 100000000 is over the limit of 100000 nodes"),
        "{e}"
    );
    let e = err_tasks("types:\n  - name: a\n    requests: {cpu: 1}\n    count: 100000000\n");
    assert!(
        e.starts_with("2:") && e.contains("count: 100000000 is over the limit of 1000000 tasks"),
        "{e}"
    );
    // Each within the limit, together over it: the group or type that goes over is named.
    let group = |count: usize, prefix: &str| {
        format!("  - count: {count}\n    name_prefix: {prefix}\n    capacity: {{cpu: 1}}\n")
    };
    let yaml = format!("groups:\n{}{}", group(60_000, "a"), group(60_000, "b"));
    assert_eq!(
        err_nodes(&yaml),
        "5: groups[1].count: the groups come to 120000 nodes up to here, over the limit of 100000"
    );
    let yaml = format!(
        "groups:\n{}nodes:\n  - name: x\n    capacity: {{cpu: 1}}\n",
        group(MAX_NODES, "a")
    );
    assert_eq!(
        err_nodes(&yaml),
        "5: nodes: 1 nodes with the groups' 100000, over the limit of 100000"
    );
    let e = err_tasks(
        "types:\n  - name: a\n    requests: {cpu: 1}\n    count: 600000\n  - name: b\n    requests: {cpu: 1}\n    count: 600000\n",
    );
    assert_eq!(
        e,
        "5: task type \"b\": the types come to 1200000 tasks up to here, over the limit of 1000000"
    );
    // At the limits exactly: taken.
    assert!(parse_nodes(&format!("groups:\n{}", group(MAX_NODES, "a"))).is_ok());
    let at_limit =
        format!("types:\n  - name: a\n    requests: {{cpu: 1}}\n    count: {MAX_TASKS}\n");
    assert!(parse_tasks(&at_limit).is_ok());
}
