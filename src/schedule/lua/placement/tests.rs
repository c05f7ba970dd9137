//! `placement.*` through the real sandbox: results checked by hand, bad arguments, the limits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use verwalter_controllers::machinery::ports::SchedulerError;
use verwalter_controllers::state::SchedulerFailure;
use verwalter_controllers::state::{SchedulerInput, SchedulerOutput};
use verwalter_placement::config;

use super::super::{Limits, Sandbox};
use super::*;

fn input() -> SchedulerInput {
    SchedulerInput {
        now: 1,
        current_host: "alpha".into(),
        current_id: "77985419c732412ea38b94db00000001".into(),
        parents: Vec::new(),
        actions: BTreeMap::new(),
        runtime: Arc::new(json!({})),
        peers: BTreeMap::new(),
        metrics: json!({}),
        datacenters: None,
    }
}

fn small() -> Limits {
    Limits {
        memory: 32 * 1024 * 1024,
        time: Duration::from_millis(300),
    }
}

/// Runs `body` as the scheduler function's body (`state` in scope).
fn run_with(body: &str, limits: Limits) -> Result<SchedulerOutput, SchedulerError> {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("main.lua"),
        format!("return {{ scheduler = function(state)\n{body}\nend }}"),
    )
    .unwrap();
    Sandbox::load(tmp.path(), "scheduler/v1", limits)?.run(&input())
}

fn run(body: &str) -> Value {
    match run_with(body, small()) {
        Ok(out) => (**out.data.tree()).clone(),
        Err(e) => panic!("{body}\nfailed: {e:?}"),
    }
}

fn fails(body: &str) -> SchedulerError {
    run_with(body, small()).expect_err("the run must fail")
}

const FIT_NODES: &str = r#"
    local args = {
        algorithm = "Fit",
        nodes = {n1 = {cpu = 4, mem = 8}, n2 = {cpu = 2, mem = 8}, n3 = {cpu = 4, mem = 1}},
        apps = {web = {cpu = 2, mem = 2}},
        running = {n1 = {web = 1}},
    }
"#;

#[test]
fn fit_filters_prioritizes_and_places_in_turn() {
    // n1 runs one web (2 cpu, 2 mem): one more makes 4 cpu of 4; n2 takes one; n3 lacks memory.
    let out = run(&format!(
        "{FIT_NODES}
        args.app = 'web'
        local f = placement.filter(args)
        local p = placement.prioritize(args)
        args.count = 3
        return {{filter = f, prioritize = p, place = placement.place(args)}}"
    ));
    assert_eq!(
        out["filter"],
        json!({"nodes": ["n1", "n2"], "failed": {"n3": "Could not fit node for dimensions: missing (mem: 1.0)."}})
    );
    // Fit scores every node 0, prioritize does not filter.
    assert_eq!(out["prioritize"], json!({"n1": 0, "n2": 0, "n3": 0}));
    // All tie at 0, so the first name wins: n1, which is then full; n2; then nothing is left.
    assert_eq!(
        out["place"],
        json!({
            "chosen": {"web": ["n1", "n2"]},
            "placed": {"n1": {"web": 1}, "n2": {"web": 1}},
            "unplaced": {"web": 1},
            "failed": {"web": {
                "n1": "Could not fit node for dimensions: missing (cpu: 2.0).",
                "n2": "Could not fit node for dimensions: missing (cpu: 2.0).",
                "n3": "Could not fit node for dimensions: missing (mem: 1.0)."
            }}
        })
    );
}

#[test]
fn least_used_bar_scores_and_spreads() {
    // a: cpu 2/8 = 0.25, mem 4/10 = 0.4: least used (0.75 + 0.6) / 2 = 0.675, BAR 1 − 0.15 = 0.85,
    // 1.525 → 15. b: 2/10 = 0.2, 4/16 = 0.25: 0.775 + 0.95 = 1.725 → 17.
    let nodes = "nodes = {a = {cpu = 8, mem = 10}, b = {cpu = 10, mem = 16}}, apps = {x = {cpu = 2, mem = 4}}";
    let out = run(&format!(
        "local default = placement.prioritize{{algorithm = 'LeastUsedBAR', {nodes}, app = 'x'}}
         -- least used weighted 3:1 and counted twice: a (0.75·3 + 0.6) / 4 · 2 + 0.85 = 2.275 → 22;
         -- b (0.8·3 + 0.75) / 4 · 2 + 0.95 = 2.525 → 25.
         local weighted = placement.prioritize{{
             algorithm = {{kind = 'LeastUsedBAR', least_used_weight = 2, least_used_weights = {{cpu = 3}}}},
             {nodes}, app = 'x'}}
         -- Placing 3: b (17 > 15); then b scores 0.55 + 0.9 → 14 < a's 15: a; then a scores
         -- 0.35 + 0.7 → 10 < b's 14: b.
         local placed = placement.place{{algorithm = 'LeastUsedBAR', {nodes}, app = 'x', count = 3}}
         return {{default = default, weighted = weighted, placed = placed}}"
    ));
    assert_eq!(out["default"], json!({"a": 15, "b": 17}));
    assert_eq!(out["weighted"], json!({"a": 22, "b": 25}));
    assert_eq!(
        out["placed"],
        json!({"chosen": {"x": ["b", "a", "b"]}, "placed": {"a": {"x": 1}, "b": {"x": 2}}, "unplaced": {}, "failed": {}})
    );
}

#[test]
fn static_assigner_places_up_to_its_targets() {
    // No requests needed: StaticAssigner counts instances only.
    let out = run(r#"
        return placement.place{
            algorithm = {kind = "StaticAssigner", targeted_assigned_apps_counts = {n1 = {web = 2}, n2 = {web = 1}}},
            nodes = {n1 = {}, n2 = {}, n3 = {}},
            running = {n1 = {web = {"web-1"}}},
            app = "web", count = 3,
        }"#);
    assert_eq!(
        out,
        json!({
            "chosen": {"web": ["n1", "n2"]},
            "placed": {"n1": {"web": 1}, "n2": {"web": 1}},
            "unplaced": {"web": 1},
            "failed": {"web": {
                "n1": "App web has 2 of its targeted 2 instances here.",
                "n2": "App web has 1 of its targeted 1 instances here.",
                "n3": "Node is not in targeted_assigned_apps_counts."
            }}
        })
    );
}

#[test]
fn several_apps_in_order_with_max_per_node() {
    // NOP ties everywhere; max_per_node = 1 spreads each app. web first takes n1; db then n1, n2
    // (web on n1 does not count against db). The candidates leave n3 out.
    let out = run(r#"
        return placement.place{
            algorithm = "NOPAlgorithm",
            nodes = {n1 = {}, n2 = {}, n3 = {}},
            candidates = {"n2", "n1"},
            instances = {{app = "web"}, {app = "db", count = 3}},
            max_per_node = 1,
        }"#);
    assert_eq!(
        out,
        json!({
            "chosen": {"web": ["n1"], "db": ["n1", "n2"]},
            "placed": {"n1": {"web": 1, "db": 1}, "n2": {"db": 1}},
            "unplaced": {"db": 1},
            "failed": {
                "web": {"n1": "App web has 1 instances here, max_per_node is 1."},
                "db": {
                    "n1": "App db has 1 instances here, max_per_node is 1.",
                    "n2": "App db has 1 instances here, max_per_node is 1."
                }
            }
        })
    );
    // A global only: `require "placement"` is still a module of the scheduler's own.
    let e = fails("return require('placement')");
    assert!(
        e.message.contains("module \"placement\" not found"),
        "{}",
        e.message
    );
}

#[test]
fn bad_arguments_are_named_with_their_path_and_line() {
    let base = "algorithm = 'Fit', nodes = {n1 = {cpu = 4}}, apps = {web = {cpu = 1}}";
    for (call, expected) in [
        (
            "placement.place{algorithm = 'Fit', nodes = {n1 = {cpu = '4'}}, app = 'web'}",
            r#"placement.place: nodes["n1"].cpu: expected a number, got string"#,
        ),
        (
            "placement.filter{algorithm = 'LeastUsedBar', nodes = {}, app = 'web'}",
            r#"placement.filter: algorithm: unknown algorithm "LeastUsedBar" (algorithms: NOPAlgorithm, Fit, BAR, LeastUsed, LeastUsedBAR, HierBAR, StaticAssigner, DramHitRatioProvision, Score)"#,
        ),
        (
            "placement.filter{algorithm = {kind = 'Fit', bar_weights = {}}, nodes = {}, app = 'web'}",
            "placement.filter: algorithm.bar_weights: Fit has no such parameter (parameters: dimensions, max_node_score, cpu_scale_factor)",
        ),
        (
            "placement.filter{algorithm = {kind = 'BAR', dimensions = {'cpu', 'disk'}}, nodes = {}, app = 'web'}",
            r#"placement.filter: algorithm.dimensions[2]: unknown dimension "disk" (dimensions: cpu, mem, membw_read, membw_write, membw_flat, wss)"#,
        ),
        (
            "placement.filter{algorithm = {kind = 'StaticAssigner'}, nodes = {}, app = 'web'}",
            "placement.filter: algorithm.targeted_assigned_apps_counts is missing (StaticAssigner needs it)",
        ),
        (
            "placement.prioritize{algorithm = 'Fit', nodes = {n1 = {memory = 1}}, app = 'web'}",
            r#"placement.prioritize: nodes["n1"].memory: unknown key (dimensions: cpu, mem, membw_read, membw_write, membw_flat, wss; facts: node_type, platform_dram_hit_ratio)"#,
        ),
        (
            &format!("placement.filter{{{base}}}"),
            "placement.filter: argument `app` is missing",
        ),
        (
            &format!("placement.place{{{base}, app = 'web', count = -1}}"),
            "placement.place: count: expected a whole number of 0 or more, got -1",
        ),
        (
            &format!("placement.place{{{base}, app = 'db'}}"),
            r#"placement.place: apps["db"] is missing: Fit needs the app's request"#,
        ),
        (
            &format!("placement.place{{{base}, node = 'n1', app = 'web'}}"),
            "placement.place: unknown argument `node` (arguments: algorithm, nodes, apps, running, profiles, candidates, app, count, instances, max_per_node)",
        ),
        (
            &format!("placement.place{{{base}, instances = {{{{app = 'web', count = 'all'}}}}}}"),
            "placement.place: instances[1].count: expected a whole number, got string",
        ),
        (
            &format!("placement.place{{{base}, running = {{n1 = {{web = true}}}}, app = 'web'}}"),
            r#"placement.place: running["n1"]["web"]: expected a count or a list of task names, got boolean"#,
        ),
        (
            "placement.place{algorithm = 'Fit', nodes = {{cpu = 1}}, app = 'web'}",
            "placement.place: nodes: expected a table keyed by node names, got a list",
        ),
        (
            "placement.place('web')",
            "placement.place: expected a table argument (placement.place{...}), got string",
        ),
    ] {
        let e = fails(&format!("local x = 1\nlocal r = {call}"));
        assert_eq!(e.kind, SchedulerFailure::Runtime, "{call}");
        assert!(
            e.message
                .starts_with(&format!("scheduler/v1/main.lua:3: {expected}")),
            "{call}:\n{}\nexpected {expected}",
            e.message
        );
    }
    // A bad argument is an ordinary error: pcall catches it as a string (called by pcall
    // itself, it has no Lua line to name, as with Lua's own functions).
    let out =
        run("local ok, e = pcall(placement.place, {algorithm = 'Fit'})\nreturn {ok = ok, e = e}");
    assert_eq!(
        out,
        json!({"ok": false, "e": "placement.place: argument `nodes` is missing"})
    );
}

/// `n` nodes of 64 cpu and 256 mem, named `n0001`...
const MANY_NODES: &str = r#"
    local function cluster(n)
        local nodes = {}
        for i = 1, n do nodes[string.format("n%04d", i)] = {cpu = 64, mem = 256} end
        return nodes
    end
"#;

#[test]
fn a_huge_placement_stops_at_the_time_budget() {
    // A million instances over 5,000 nodes: each one compares every node, billions of steps in
    // Rust where the watchdog cannot interrupt. The placer asks the deadline as it goes; without
    // that the call would run for many seconds and then fail for memory instead.
    let call = "placement.place{algorithm = 'LeastUsed', nodes = cluster(5000), apps = {x = {cpu = 0.001, mem = 0.001}}, app = 'x', count = 1000000}";
    let e = fails(&format!("{MANY_NODES}\nreturn {call}"));
    assert_eq!(e.kind, SchedulerFailure::Timeout, "{e:?}");
    assert!(e.message.contains(TIMEOUT_MARK), "{}", e.message);
    // pcall cannot swallow it.
    let e = fails(&format!(
        "{MANY_NODES}\nlocal ok = pcall(function() return {call} end)\nreturn {{ok = ok}}"
    ));
    assert_eq!(e.kind, SchedulerFailure::Timeout, "{e:?}");
}

#[test]
fn a_placement_whose_result_outgrows_the_memory_cap_fails_for_memory() {
    // NOP on one node takes every instance: the list of chosen nodes would outgrow the cap long
    // before the deadline. The time budget is long so that only the memory cap can stop it.
    let limits = Limits {
        time: Duration::from_secs(30),
        ..small()
    };
    let e = run_with(
        "return placement.place{algorithm = 'NOPAlgorithm', nodes = {n1 = {}}, app = 'x', count = math.maxinteger}",
        limits,
    )
    .unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Memory, "{e:?}");
}

/// The algorithm a YAML config with one algorithm loads to.
fn from_config(yaml_algorithm: &str) -> Algorithm {
    let loaded = config::load(
        &format!("algorithms:\n  a: {yaml_algorithm}\n"),
        |_: &str| None,
    )
    .unwrap();
    loaded["a"].algorithm.clone()
}

#[test]
fn lua_algorithms_take_the_config_loaders_names_and_defaults() {
    for name in [
        "NOPAlgorithm",
        "Fit",
        "BAR",
        "LeastUsed",
        "LeastUsedBAR",
        "HierBAR",
        "DramHitRatioProvision",
        "Score",
    ] {
        assert_eq!(
            read_algorithm(&json!(name)).unwrap(),
            from_config(&format!("!{name}")),
            "{name}"
        );
        assert_eq!(
            read_algorithm(&json!({"kind": name})).unwrap(),
            from_config(&format!("!{name} {{}}")),
            "{name}"
        );
    }
    // Every parameter, spelled as in the config.
    for (lua, yaml) in [
        (
            json!({"kind": "HierBAR", "dimensions": ["cpu", "mem", "membw_read", "membw_write"], "max_node_score": 5,
                   "cpu_scale_factor": 2, "bar_weights": {"cpu": 2}, "least_used_weights": {"mem": 3},
                   "least_used_weight": 0.5, "merge_threshold": 1.5}),
            "!HierBAR {dimensions: [cpu, mem, membw_read, membw_write], max_node_score: 5, cpu_scale_factor: 2, bar_weights: {cpu: 2}, least_used_weights: {mem: 3}, least_used_weight: 0.5, merge_threshold: 1.5}",
        ),
        (
            json!({"kind": "Score", "threshold": 0.9, "score_target": 2, "strict_mode_placement": true, "cpu_scale_factor": 0.5}),
            "!Score {threshold: 0.9, score_target: 2, strict_mode_placement: true, cpu_scale_factor: 0.5}",
        ),
        (
            json!({"kind": "StaticAssigner", "targeted_assigned_apps_counts": {"n1": {"web": 2}}}),
            "!StaticAssigner {targeted_assigned_apps_counts: {n1: {web: 2}}}",
        ),
        (
            json!({"kind": "DramHitRatioProvision", "threshold": 0.5}),
            "!DramHitRatioProvision {threshold: 0.5}",
        ),
    ] {
        assert_eq!(read_algorithm(&lua).unwrap(), from_config(yaml), "{yaml}");
    }
}

#[test]
fn the_algorithm_and_parameter_lists_the_errors_print_are_serdes() {
    // The lists are read from the serde definitions (`AlgorithmTag`, `Algorithm`, `Kind`):
    // these are the names a script may use, as they were written by hand before.
    let unknown = read_algorithm(&json!("Nope")).unwrap_err();
    assert_eq!(
        unknown,
        format!(
            "algorithm: unknown algorithm \"Nope\" (algorithms: {})",
            config::algorithm_tags().join(", ")
        )
    );
    for (tag, parameters) in [
        ("NOPAlgorithm", ""),
        ("Fit", ", cpu_scale_factor"),
        ("BAR", ", cpu_scale_factor, bar_weights"),
        ("LeastUsed", ", cpu_scale_factor, least_used_weights"),
        (
            "LeastUsedBAR",
            ", cpu_scale_factor, bar_weights, least_used_weights, least_used_weight",
        ),
        (
            "HierBAR",
            ", cpu_scale_factor, bar_weights, least_used_weights, least_used_weight, merge_threshold",
        ),
        ("StaticAssigner", ", targeted_assigned_apps_counts"),
        ("DramHitRatioProvision", ", threshold"),
        (
            "Score",
            ", cpu_scale_factor, threshold, score_target, strict_mode_placement",
        ),
    ] {
        assert_eq!(
            read_algorithm(&json!({"kind": tag, "nope": 1})).unwrap_err(),
            format!(
                "algorithm.nope: {tag} has no such parameter (parameters: dimensions, max_node_score{parameters})"
            )
        );
    }
    // The YAML config's older names are refused here, as the refused wca tags are.
    for tag in ["FitGeneric", "BARGeneric", "Score2", "Bar"] {
        let e = read_algorithm(&json!({"kind": tag})).unwrap_err();
        assert!(e.starts_with("algorithm.kind: unknown algorithm"), "{e}");
    }
}

#[test]
fn a_bad_parameter_is_named_by_its_path_in_luas_words() {
    let dims = "cpu, mem, membw_read, membw_write, membw_flat, wss";
    let counts = |v: Value| json!({"kind": "StaticAssigner", "targeted_assigned_apps_counts": v});
    for (lua, expected) in [
        (json!(5), "algorithm: expected an algorithm name or a table with `kind`, got number".to_string()),
        (json!({"kind": 5}), "algorithm.kind: expected a string, got number".into()),
        (json!({"cpu_scale_factor": 1}), "algorithm.kind is missing".into()),
        (json!({"kind": "Fit", "cpu_scale_factor": "x"}), "algorithm.cpu_scale_factor: expected a number, got string".into()),
        (json!({"kind": "BAR", "bar_weights": [1]}), "algorithm.bar_weights: expected a table keyed by dimension names, got a list".into()),
        (json!({"kind": "BAR", "bar_weights": 5}), "algorithm.bar_weights: expected a table keyed by dimension names, got number".into()),
        (json!({"kind": "BAR", "bar_weights": {"disk": 1}}), format!("algorithm.bar_weights.disk: unknown dimension (dimensions: {dims})")),
        (json!({"kind": "LeastUsed", "least_used_weights": {"wss": []}}), "algorithm.least_used_weights.wss: expected a number, got table".into()),
        (json!({"kind": "HierBAR", "merge_threshold": "x"}), "algorithm.merge_threshold: expected a number, got string".into()),
        (json!("StaticAssigner"), "algorithm.targeted_assigned_apps_counts is missing (StaticAssigner needs it)".into()),
        (counts(json!([1])), "algorithm.targeted_assigned_apps_counts: expected a table keyed by node names, got a list".into()),
        (counts(json!({"n1": 5})), r#"algorithm.targeted_assigned_apps_counts["n1"]: expected a table keyed by app names, got number"#.into()),
        (counts(json!({"n1": {"web": -1}})), r#"algorithm.targeted_assigned_apps_counts["n1"]["web"]: expected a whole number of 0 or more, got -1"#.into()),
        (counts(json!({"n1": {"web": 2.5}})), r#"algorithm.targeted_assigned_apps_counts["n1"]["web"]: expected a whole number of 0 or more, got 2.5"#.into()),
        (counts(json!({"cpu": {"web": "x"}})), r#"algorithm.targeted_assigned_apps_counts["cpu"]["web"]: expected a whole number, got string"#.into()),
        (json!({"kind": "Score", "strict_mode_placement": 1}), "algorithm.strict_mode_placement: expected a boolean, got number".into()),
        (json!({"kind": "Fit", "dimensions": 5}), "algorithm.dimensions: expected a list, got number".into()),
        (json!({"kind": "Fit", "dimensions": {"a": 1}}), "algorithm.dimensions: expected a list, got a table with other keys than 1..n".into()),
        (json!({"kind": "Fit", "dimensions": ["cpu", 5]}), "algorithm.dimensions[2]: expected a string, got number".into()),
        (json!({"kind": "Fit", "dimensions": ["disk"]}), format!("algorithm.dimensions[1]: unknown dimension \"disk\" (dimensions: {dims})")),
        (json!({"kind": "NOPAlgorithm", "max_node_score": []}), "algorithm.max_node_score: expected a number, got table".into()),
    ] {
        assert_eq!(read_algorithm(&lua).unwrap_err(), expected, "{lua}");
    }
    // A whole number may come as a Lua float (`2.0`, `4 / 2`), as Lua's own functions take it.
    assert_eq!(
        read_algorithm(&counts(json!({"n1": {"web": 2.0}}))).unwrap(),
        from_config("!StaticAssigner {targeted_assigned_apps_counts: {n1: {web: 2}}}")
    );
}

#[test]
fn the_example_in_the_docs_gives_what_the_docs_say() {
    // docs/placement.md, "Lua API".
    let out = run(r#"
        return placement.place{
            algorithm = {kind = "LeastUsedBAR", dimensions = {"cpu", "mem"}},
            nodes = {alpha = {cpu = 8, mem = 32}, beta = {cpu = 8, mem = 32}, gamma = {cpu = 4, mem = 8}},
            apps = {web = {cpu = 2, mem = 4}, db = {cpu = 4, mem = 16}},
            running = {alpha = {web = 1}},
            instances = {{app = "db", count = 3}, {app = "web", count = 2}},
            max_per_node = 1,
        }"#);
    let max = |app: &str| format!("App {app} has 1 instances here, max_per_node is 1.");
    assert_eq!(
        out,
        json!({
            "placed": {"alpha": {"db": 1}, "beta": {"db": 1, "web": 1}, "gamma": {"web": 1}},
            "chosen": {"db": ["beta", "alpha"], "web": ["gamma", "beta"]},
            "unplaced": {"db": 1},
            "failed": {
                "db": {"alpha": max("db"), "beta": max("db"), "gamma": "Could not fit node for dimensions: missing (mem: 8.0)."},
                "web": {"alpha": max("web"), "beta": max("web"), "gamma": max("web")}
            }
        })
    );
}
