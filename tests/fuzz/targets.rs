//! The fuzz targets: each takes bytes, calls the parser or decoder the daemon uses on such bytes
//! (the same function, in the same order of checks), and returns the outcome class. A panic, a
//! hang or a broken property (`assert!`) is a finding.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::engine::Target;
use super::structured::Shape;

/// Every target, in the order of the reports.
pub const TARGETS: &[Target] = &[
    Target {
        name: "runtime_yaml",
        run: runtime_yaml,
        dict: YAML,
        max_len: 8192,
        shape: Shape::Yaml,
    },
    Target {
        name: "runtime_json",
        run: runtime_json,
        dict: JSON,
        max_len: 8192,
        shape: Shape::Json,
    },
    Target {
        name: "settings",
        run: settings,
        dict: SETTINGS,
        max_len: 4096,
        shape: Shape::Yaml,
    },
    Target {
        name: "render_yaml",
        run: render_yaml,
        dict: RENDER,
        max_len: 4096,
        shape: Shape::Yaml,
    },
    Target {
        name: "templates",
        run: templates,
        dict: TEMPLATE,
        max_len: 4096,
        shape: Shape::Bytes,
    },
    Target {
        name: "schedule_vars",
        run: schedule_vars,
        dict: VARS,
        max_len: 8192,
        shape: Shape::Json,
    },
    Target {
        name: "refs",
        run: refs,
        dict: REFS,
        max_len: 512,
        shape: Shape::Bytes,
    },
    Target {
        name: "graph",
        run: graph,
        dict: &["a", "b", "c", ": ", " ", "\n", "a: a\n", "x: y z\n"],
        max_len: 2048,
        shape: Shape::Bytes,
    },
    Target {
        name: "election_packet",
        run: election_packet,
        dict: CBOR,
        max_len: 1024,
        shape: Shape::Cbor,
    },
    Target {
        name: "schedule",
        run: schedule,
        dict: JSON,
        max_len: 8192,
        shape: Shape::Json,
    },
    Target {
        name: "schedule_data",
        run: schedule_data,
        dict: SCHEDULE_DATA,
        max_len: 8192,
        shape: Shape::Json,
    },
    Target {
        name: "action_journal",
        run: action_journal,
        dict: JSON,
        max_len: 8192,
        shape: Shape::Bytes,
    },
    Target {
        name: "http",
        run: http,
        dict: HTTP,
        max_len: 4096,
        shape: Shape::Bytes,
    },
    Target {
        name: "paths",
        run: paths,
        dict: &[
            "/", "..", ".", "./", "../", "//", "\0", "~", "out", "in", "a/b", "\\",
        ],
        max_len: 256,
        shape: Shape::Bytes,
    },
    Target {
        name: "cantal_peers",
        run: cantal_peers,
        dict: JSON,
        max_len: 8192,
        shape: Shape::Json,
    },
    Target {
        name: "prometheus_reply",
        run: prometheus_reply,
        dict: PROMETHEUS,
        max_len: 8192,
        shape: Shape::Json,
    },
    Target {
        name: "metrics_yaml",
        run: metrics_yaml,
        dict: METRICS,
        max_len: 4096,
        shape: Shape::Yaml,
    },
    Target {
        name: "kube_api",
        run: kube_api,
        dict: KUBE,
        max_len: 8192,
        shape: Shape::Json,
    },
    Target {
        name: "placement_config",
        run: placement_config,
        dict: PLACEMENT,
        max_len: 8192,
        shape: Shape::Yaml,
    },
    Target {
        name: "placement_snapshot",
        run: placement_snapshot,
        dict: PLACEMENT,
        max_len: 8192,
        shape: Shape::Yaml,
    },
    Target {
        name: "graphql_query",
        run: graphql_query,
        dict: GRAPHQL,
        max_len: 4096,
        shape: Shape::Bytes,
    },
    Target {
        name: "extender",
        run: extender,
        dict: KUBE,
        max_len: 8192,
        shape: Shape::Json,
    },
];

// Dictionaries: tokens of each input language.

const JSON: &[&str] = &[
    "{", "}", "[", "]", ",", ":", "\"", "null", "true", "false", "\"\":", "[[[[", "]]]]",
    "{\"a\":", "\\u0000", "\\ud800", "\"\\\"", "-0.0e-0", "1E400",
];
const YAML: &[&str] = &[
    "- ",
    ": ",
    "---\n",
    "...\n",
    "? ",
    "&a ",
    "*a",
    "<<: *a",
    "!!str ",
    "!!binary ",
    "!Tag ",
    "|\n  ",
    ">-\n  ",
    "'",
    "\"",
    "~",
    "null",
    "yes",
    "0x1F",
    "0o17",
    "1_000",
    ".nan",
    "-.inf",
    "[",
    "]",
    "{",
    "}",
    "\n  ",
    "\t",
    "%YAML 1.2\n",
    "#",
    "!!float ",
    "!!int ",
];
const SETTINGS: &[&str] = &[
    "port: ",
    "host: ",
    "scheduler:\n  ",
    "memory-limit-mib: ",
    "time-limit-ms: ",
    "period-ms: ",
    "render:\n  ",
    "parallel: ",
    "command-timeout-secs: ",
    "dependency-failure: halt",
    "logs:\n  ",
    "segment-mib: ",
    "max-age-days: ",
    "max-total-mib: ",
    "actions:\n  ",
    "max-pending-kib: ",
    "election:\n  ",
    "heartbeat-ms: ",
    "leader-timeout-min-ms: ",
    "leader-timeout-max-ms: ",
    "start-timeout-ms: ",
    "prefetch-ms: ",
    "minority-window-ms: ",
    "http:\n  ",
    "max-connections: ",
    "idle-timeout-ms: ",
    "peers:\n  - ",
    "id: ",
    "addr: ",
    "cantal-url: ",
    "inputs:\n  ",
    "debounce-ms: ",
    "default-frontend: ",
    "placement-extender:\n  ",
    "18446744073709551615",
    ": ",
    "- ",
];
const RENDER: &[&str] = &[
    "templates:\n  ",
    "commands:\n- ",
    "!Cmd ",
    "!Sh ",
    "!RootCommand ",
    "!Copy ",
    "!SplitText ",
    "!CleanFiles ",
    "!Condition ",
    "!PeekLog ",
    "src: ",
    "dest: ",
    "mode: ",
    "section: ",
    "validate: ",
    "pattern: ",
    "keep-list: ",
    "dirs-changed: ",
    "{{ templates.",
    "{{ files.",
    "}}",
    "_anchor: &a ",
    "*a",
    "[",
    "]",
    "- ",
    ": ",
    "/etc/",
    "*",
    "**",
    "{}",
    "0o777",
    "0o7777777777",
];
const TEMPLATE: &[&str] = &[
    "{{",
    "}}",
    "{{#each ",
    "{{/each}}",
    "{{#if ",
    "{{else}}",
    "{{/if}}",
    "{{> ",
    "{{!",
    "{{~",
    "~}}",
    "@index",
    "this",
    "../",
    "{%",
    "%}",
    "{% for x in ",
    "{% endfor %}",
    "{% if ",
    "{% endif %}",
    "{% set ",
    "{% macro ",
    "{% include ",
    "{% raw %}",
    "| json_encode",
    "| length",
    "| join(sep=",
    "range(end=",
    "daemons",
    "role",
    "node",
    "full_schedule",
    "vars.",
    "[0]",
    ".0",
    "\"",
    "(",
    ")",
];
const VARS: &[&str] = &[
    "\"nodes\":",
    "\"roles\":",
    "\"vars\":",
    "\"template\":",
    "\"depends_on\":",
    "\"alpha\":",
    "\"$(",
    ")\"",
    "$(a.b)",
    "$(b.x.0)",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"a\"",
    "\"b\"",
    "null",
];
/// The keys a node's view is cut by, and the escapes, numbers and nesting at the edges of what
/// serde_json takes.
const SCHEDULE_DATA: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\"nodes\"",
    "\"alpha\"",
    "\"vars\"",
    "\"roles\"",
    "\"changes\"",
    "\\u0061",
    "\\ud800",
    "\\udc00",
    "\\ud83d\\ude00",
    "\\n",
    "\\",
    "\t",
    "\u{1f}",
    "\u{7f}",
    "\u{e9}",
    "0",
    "-0",
    "01",
    "1.5",
    "1e400",
    "0e999999",
    "-",
    "true",
    "null",
    " ",
    "[[[[[[[[[[[[[[[[",
    "]]]]]]]]]]]]]]]]",
];
const GRAPHQL: &[&str] = &[
    "{",
    "}",
    "(",
    ")",
    "...",
    "... on Status",
    "fragment F on Status ",
    "fragment G on Status ",
    "...F",
    "...G",
    "query ",
    "mutation ",
    "subscription ",
    "status",
    "roles",
    "__typename",
    "$v",
    ": ",
    "@include(if: true)",
    "\"",
    ",",
    " ",
    "\n",
    "#",
];
const REFS: &[&str] = &[
    "$(", ")", ".", "#", "#(", "==", "!=", "<", ">", "%", "!%", "*", "?", "\\", "|", "@", "a", "b",
    "list", "0", "-1", "name", "\"", "&&", "||", "..",
];
const CBOR: &[&str] = &[
    "\u{0}", "\u{18}", "\u{19}", "\u{1a}", "\u{1b}", "\u{1f}", "\u{40}", "\u{50}", "\u{60}",
    "\u{7f}", "\u{80}", "\u{84}", "\u{9f}", "\u{a0}", "\u{a4}", "\u{bf}", "\u{c0}", "\u{f4}",
    "\u{f5}", "\u{f6}", "\u{f9}", "\u{fa}", "\u{fb}", "\u{ff}",
];
const HTTP: &[&str] = &[
    "GET ",
    "POST ",
    "PUT ",
    "/v1/",
    "action",
    "status",
    "schedule",
    "schedule/",
    "log/role/",
    "log/global/",
    "log/external/",
    "backup/",
    "backups",
    "roles_data",
    "pending_actions",
    "action_is_pending/",
    "force_render_all",
    "peers",
    "election",
    "scheduler_input",
    ".pretty",
    ".json",
    "/~",
    "/common/",
    "?",
    "%2e%2e%2f",
    "%00",
    "../",
    "\nContent-Type: application/json",
    "\nContent-Type: text/plain",
    "\nOrigin: http://evil.example",
    "\nHost: alpha",
    "\nRange: bytes=",
    "\nIf-Modified-Since: ",
    "\n\n",
    "{\"button\":",
    "{",
    "}",
];
const PROMETHEUS: &[&str] = &[
    "\"status\":",
    "\"success\"",
    "\"error\"",
    "\"data\":",
    "\"resultType\":",
    "\"vector\"",
    "\"scalar\"",
    "\"matrix\"",
    "\"string\"",
    "\"result\":",
    "\"metric\":",
    "\"value\":",
    "\"values\":",
    "\"NaN\"",
    "\"+Inf\"",
    "\"-Inf\"",
    "\"1e400\"",
    "\"nodename\":",
    "\"app\":",
    "\"nodetype\":",
    "\"node\":",
    "\"errorType\":",
    "{",
    "}",
    "[",
    "]",
];
const METRICS: &[&str] = &[
    "prometheus: ",
    "!Prometheus\n  ",
    "host: ",
    "port: ",
    "ssl: ",
    "!SSL\n    ",
    "ca: ",
    "!Env ",
    "FUZZ_URL",
    "FUZZ_PORT",
    "interval: ",
    "timeout: ",
    "queries:\n  ",
    "http://127.0.0.1:9090",
    "https://",
    "5s",
    "0s",
    "1ms",
    "999999999999h",
    ": ",
    "- ",
];
const KUBE: &[&str] = &[
    "\"items\":",
    "\"metadata\":",
    "\"name\":",
    "\"namespace\":",
    "\"labels\":",
    "\"app\":",
    "\"status\":",
    "\"capacity\":",
    "\"allocatable\":",
    "\"cpu\":",
    "\"memory\":",
    "\"spec\":",
    "\"nodeName\":",
    "\"containers\":",
    "\"resources\":",
    "\"requests\":",
    "\"phase\":",
    "\"type\":",
    "\"ADDED\"",
    "\"DELETED\"",
    "\"MODIFIED\"",
    "\"BOOKMARK\"",
    "\"ERROR\"",
    "\"object\":",
    "\"resourceVersion\":",
    "\"uid\":",
    "\"Pod\":",
    "\"Nodes\":",
    "\"NodeNames\":",
    "\"500m\"",
    "\"1Gi\"",
    "\"1e3\"",
    "\"1E\"",
    "\"0.5Ki\"",
    "\"-1\"",
    "\"99999999999Ei\"",
    "{",
    "}",
    "[",
    "]",
];
const PLACEMENT: &[&str] = &[
    "algorithm: ",
    "algorithms:\n  ",
    "!Fit",
    "!BAR",
    "!LeastUsed",
    "!LeastUsedBAR",
    "!HierBAR",
    "!NOP",
    "!StaticAssigner",
    "!DramHitRatioProvision",
    "!Score",
    "!Env ",
    "!Prometheus",
    "dimensions: ",
    "[cpu, mem, membw_read, membw_write, wss, membw_flat]",
    "least_used_weights: ",
    "alias: ",
    "data_provider: ",
    "kubeapi: ",
    "monitored_namespaces: ",
    "reschedule_interval: ",
    "score_target: ",
    "max_node_score: ",
    "targeted_assigned_apps_counts: ",
    "capacity: ",
    "assigned: ",
    "requested: ",
    "nodes: ",
    "apps: ",
    "cpu: ",
    "mem: ",
    "1e308",
    "-1",
    ".nan",
    "&a ",
    "*a",
    "<<: *a",
    ": ",
    "- ",
];

fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

fn class<T, E: std::fmt::Display>(result: &Result<T, E>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

/// A runtime file `x.yaml` as `src/inputs/runtime.rs` reads it; what parses must come back the
/// same through JSON (the tree goes to the scheduler as JSON).
fn runtime_yaml(bytes: &[u8]) -> String {
    let parsed = verwalter::inputs::runtime::parse_file("yaml", bytes);
    if let Ok(value) = &parsed {
        let json = serde_json::to_vec(value).expect("a runtime value serializes");
        let again: Value = serde_json::from_slice(&json).expect("its JSON parses");
        assert_eq!(&again, value, "runtime YAML -> JSON -> value differs");
    }
    match parsed {
        Ok(_) => "ok".into(),
        Err((_, message)) => message,
    }
}

/// A runtime file `x.json`; parse -> serialize -> parse gives the same value.
fn runtime_json(bytes: &[u8]) -> String {
    let parsed = verwalter::inputs::runtime::parse_file("json", bytes);
    if let Ok(value) = &parsed {
        let json = serde_json::to_vec(value).expect("a runtime value serializes");
        let again = verwalter::inputs::runtime::parse_file("json", &json)
            .unwrap_or_else(|e| panic!("serialized runtime JSON refused: {e:?}"));
        assert_eq!(&again, value, "runtime JSON round trip differs");
    }
    match parsed {
        Ok(_) => "ok".into(),
        Err((_, message)) => message,
    }
}

thread_local! {
    /// A scratch dir per fuzz worker (settings files, a config dir, a path boundary).
    static SCRATCH: tempfile::TempDir = tempfile::tempdir().expect("a temp dir");
}

fn scratch() -> PathBuf {
    SCRATCH.with(|d| d.path().to_path_buf())
}

/// The settings file (`--settings`), loaded by `Config::load` as `verwalter run` loads it: every
/// problem reported at once, never a panic.
fn settings(bytes: &[u8]) -> String {
    let dir = scratch();
    let path = dir.join("settings.yaml");
    std::fs::write(&path, bytes).unwrap();
    let args = verwalter::config::RunArgs {
        settings: Some(path),
        config_dir: Some(dir.join("config")),
        override_machine_id: Some("0123456789abcdef0123456789abcdef".into()),
        hostname: Some("fuzz".into()),
        ..Default::default()
    };
    match verwalter::config::Config::load(&args) {
        Ok(_) => "ok".into(),
        Err(e) => {
            assert!(!e.problems.is_empty(), "an error without a problem");
            e.problems.join("; ")
        }
    }
}

/// A `*.render.yaml` as `TemplateSet::load_dir` reads it: the nesting check, the parse, and the
/// commands checked against its templates.
fn render_yaml(bytes: &[u8]) -> String {
    let Some(text) = text(bytes) else {
        return "not UTF-8".into();
    };
    let max = verwalter::inputs::nesting::MAX_NESTING;
    if verwalter::inputs::nesting::yaml_too_deep(text, max).is_some() {
        return "too deep".into();
    }
    match verwalter::render::template_set::parse_render_file(text) {
        Ok(file) => {
            let names: BTreeSet<String> = file.templates.keys().cloned().collect();
            class(&verwalter::render::apply::validate(&file.commands, &names))
        }
        Err(e) => e,
    }
}

/// The variables a template sees (`vars.rs`, `with_pass`): nested maps, lists, the schedule.
fn template_vars() -> verwalter::render::Vars {
    let vars = json!({
        "role": "web", "node": "alpha", "template": "web/v1", "version": "v2",
        "deployment_id": "0123456789abcdefghijklmn", "timestamp": "2026-11-24T12:00:00Z",
        "verwalter_version": "0.14.0",
        "daemons": {"web": {"image": "web/v2", "config": "/cfg.yaml", "instances": 2,
                            "variables": {"PORT": 8080, "TAGS": ["a", "b"]}}},
        "list": [1, -2.5, null, true, "x", {"k": [[]]}],
        "full_schedule": {"nodes": {"alpha": {"roles": {"web": {}}}}},
    });
    let Value::Object(map) = vars else {
        unreachable!()
    };
    verwalter::render::Vars::new(map)
}

/// A template of a template dir, as Handlebars (`.hbs`) and as Tera (`.tera`), loaded and
/// rendered with role variables the way `TemplateSet` does.
fn templates(bytes: &[u8]) -> String {
    use verwalter::render::engines::{Engine, HandlebarsEngine, TeraEngine};
    let Some(source) = text(bytes) else {
        return "not UTF-8".into();
    };
    let vars = template_vars();
    let mut hbs = HandlebarsEngine::default();
    let hbs = match hbs.add("t.hbs", source) {
        Ok(()) => class(&hbs.render("t.hbs", &vars)),
        Err(e) => e,
    };
    let mut tera = TeraEngine::default();
    let tera = match tera.add("t.tera", source) {
        Ok(()) => class(&tera.render("t.tera", &vars)),
        Err(e) => e,
    };
    format!("{hbs} / {tera}")
}

/// Schedule data as the render controller reads it for one node: the roles, their merged
/// variables with `$(role.path)` resolved, `depends_on` into a graph.
fn schedule_vars(bytes: &[u8]) -> String {
    let Ok(data) = serde_json::from_slice::<Value>(bytes) else {
        return "not JSON".into();
    };
    let host = data
        .get("nodes")
        .and_then(Value::as_object)
        .and_then(|n| n.keys().next().cloned())
        .unwrap_or_else(|| "alpha".into());
    let check = verwalter_controllers::render::check_schedule(&data, &host);
    let mut classes = Vec::new();
    for (role, vars) in &check.roles {
        match vars {
            Ok(vars) => {
                assert_eq!(
                    vars.get("role"),
                    Some(&json!(role)),
                    "role variable of {role}"
                );
                classes.push("ok".to_string());
            }
            Err(e) => classes.push(e.clone()),
        }
    }
    if let Some(waves) = &check.waves {
        let placed: usize = waves.iter().map(Vec::len).sum();
        assert_eq!(placed, check.roles.len(), "every role in one wave");
    }
    classes.sort();
    classes.dedup();
    classes.join("|")
}

/// A document the `refs` target resolves paths against: roles with nested objects, lists,
/// numbers, references of their own and a cycle.
fn refs_doc() -> Value {
    json!({
        "a": {"b": 1, "list": [{"name": "x", "port": 80}, {"name": "y", "port": 81}],
              "s": "text", "r": "$(b.x)", "n": null, "t": true},
        "b": {"x": [1, 2, 3], "y": "$(a.s)", "deep": {"er": {"est": "$(a.list.0.name)"}}},
        "c": {"self": "$(c.other)", "other": "$(c.self)"},
        "weird key": {"with.dot": 1, "with*star": 2, "": 3},
    })
}

/// A variable's text with `$(path)` references (`controllers/src/refs.rs`) resolved against a
/// document of roles.
fn refs(bytes: &[u8]) -> String {
    let Some(text) = text(bytes) else {
        return "not UTF-8".into();
    };
    let doc = refs_doc();
    let value = json!({"v": text, "list": [text, {"in": text}]});
    let found = verwalter_controllers::refs::Resolver::new(&doc).resolve(&value, "fuzz");
    if let Ok(resolved) = &found {
        assert!(resolved.is_object(), "an object resolves to an object");
        if !verwalter_controllers::refs::has_refs(&value) {
            assert_eq!(resolved, &value, "a value without references changed");
        }
    }
    class(&found)
}

/// `depends_on` lists (`role: dep dep`, one role a line) into `Graph::from_depends_on`, the
/// order and waves, the cycles named, and one execution with `Execution` to its end.
fn graph(bytes: &[u8]) -> String {
    use verwalter_controllers::graph::{ErrorPolicy, Execution, Graph};
    let Some(text) = text(bytes) else {
        return "not UTF-8".into();
    };
    let mut lists = Vec::new();
    for line in text.lines() {
        let (name, deps) = line.split_once(':').unwrap_or((line, ""));
        lists.push((name.trim(), deps.split_whitespace().collect::<Vec<_>>()));
    }
    let (graph, errors) = Graph::from_depends_on(lists.iter().map(|(n, d)| (*n, d.clone())));
    let order = graph.order();
    match &order {
        Ok(order) => {
            assert_eq!(order.len(), graph.len(), "the order lists every vertex");
            let mut position = vec![0; graph.len()];
            for (i, &v) in order.iter().enumerate() {
                position[v] = i;
            }
            for v in 0..graph.len() {
                for &d in graph.dependents(v) {
                    assert!(
                        position[v] < position[d],
                        "a dependency after its dependent"
                    );
                }
            }
        }
        Err(_) => {
            let cycles = graph.cycles();
            assert!(!cycles.is_empty(), "no order but no cycle");
            for cycle in &cycles {
                assert!(!graph.named_cycle(cycle).is_empty());
            }
        }
    }
    let _ = graph.waves();
    for (members, _) in graph.cyclic_groups() {
        assert!(!members.is_empty());
    }
    let policy = if bytes.len().is_multiple_of(2) {
        ErrorPolicy::BlockDependents
    } else {
        ErrorPolicy::Halt
    };
    let mut progress = Execution::new(&graph, policy);
    let mut steps = 0;
    loop {
        let ready = progress.take_ready();
        if ready.is_empty() {
            break;
        }
        for v in ready {
            steps += 1;
            assert!(steps <= graph.len(), "a vertex handed out twice");
            assert!(!progress.start(v), "a running vertex started again");
            let done = if graph.name(v).len() % 3 == 0 {
                progress.fail(&graph, v)
            } else {
                progress.complete(&graph, v)
            };
            assert!(done, "a running vertex did not end");
        }
    }
    assert!(progress.running() == 0, "a vertex still runs");
    assert!(
        progress.outcome().is_some(),
        "nothing runs or can start, but no outcome"
    );
    format!(
        "{} errors, order {}, outcome {:?}",
        errors.len().min(3),
        order.is_ok(),
        progress.outcome().is_some()
    )
}

/// An election packet off the UDP socket (CBOR, verwalter 0.13's shape), without and with a
/// shared key; what decodes encodes back to the same packet.
fn election_packet(bytes: &[u8]) -> String {
    use verwalter_controllers::cluster::election::wire::{AuthKey, Packet};
    let key = AuthKey::new(b"fuzz-key-0123456789abcdef".to_vec()).unwrap();
    let plain = Packet::decode(bytes);
    if let Ok(packet) = &plain {
        let again = Packet::decode(&packet.encode().expect("a decoded packet encodes"))
            .expect("an encoded packet decodes");
        assert_eq!(&again, packet, "packet round trip differs");
        let signed = packet.encode_with(Some(&key)).expect("a packet signs");
        let again = Packet::decode_with(&signed, Some(&key)).expect("a signed packet decodes");
        assert_eq!(&again, packet, "signed packet round trip differs");
        let _ = packet.message();
    }
    let keyed = Packet::decode_with(bytes, Some(&key));
    format!("{} / {}", class(&plain), class(&keyed))
}

/// A schedule envelope as a follower fetches it or the storage dir holds it: parsed, its hash
/// checked; what parses serializes and parses back the same. The follower's one-pass reading
/// (`Schedule::from_peer`) must agree with serde_json's: the same schedule taken or refused,
/// and the same node view as cut from the parsed tree.
fn schedule(bytes: &[u8]) -> String {
    use verwalter_controllers::state::Schedule;
    let parsed = serde_json::from_slice::<Schedule>(bytes);
    let from_peer = Schedule::from_peer(bytes.to_vec(), "alpha");
    let Ok(schedule) = parsed else {
        assert!(from_peer.is_err(), "from_peer took what serde refused");
        return class(&parsed);
    };
    let verified = schedule.verify();
    match (&from_peer, &verified) {
        (Ok(read), Ok(())) => {
            assert_eq!(read, &schedule, "from_peer read another schedule");
            let tree = (**schedule.data.tree()).clone();
            let whole = Schedule::new(tree, schedule.timestamp, schedule.origin.clone());
            assert_eq!(read.data.node_view("alpha"), whole.data.node_view("alpha"));
            assert_eq!(read.data.all_roles(), whole.data.all_roles());
        }
        (Err(_), Err(_)) => {}
        _ => panic!("from_peer and serde disagree: {from_peer:?} vs {verified:?}"),
    }
    let mut written = Vec::new();
    schedule.write_json(&mut written);
    let json = serde_json::to_vec(&schedule).expect("a schedule serializes");
    assert_eq!(json, written, "write_json differs from serde's form");
    let again: Schedule = serde_json::from_slice(&json).expect("a serialized schedule parses");
    assert_eq!(again, schedule, "schedule round trip differs");
    assert_eq!(again.verify().is_ok(), verified.is_ok());
    class(&verified)
}

/// A schedule's data as a follower takes it from a peer, in the form peers write and with the
/// hash of exactly these bytes, so that every input reaches the one-pass check of
/// `Schedule::from_peer` (the `schedule` target's inputs mostly fail their hash first): taken
/// exactly when serde_json parses the data, kept as it came, with the node view and role list
/// of the parsed tree.
fn schedule_data(bytes: &[u8]) -> String {
    use verwalter_controllers::state::Schedule;
    let Ok(text) = std::str::from_utf8(bytes) else {
        return "not UTF-8".into();
    };
    let hash = verwalter_controllers::schedule::hash::hash_canonical(bytes);
    let body = format!("{{\"timestamp\":1,\"hash\":\"{hash}\",\"data\":{text},\"origin\":\"x\"}}");
    let taken = Schedule::from_peer(body.into_bytes(), "alpha");
    let tree = match serde_json::from_str::<Value>(text) {
        Ok(tree) => tree,
        Err(e) => {
            assert!(
                taken.is_err(),
                "from_peer took data serde refuses: {taken:?}"
            );
            return format!("refused: {}", class(&Err::<(), _>(e)));
        }
    };
    let taken = taken.expect("from_peer refused data serde parses");
    assert_eq!(taken.data.canonical(), text, "not kept as it came");
    assert_eq!(taken.hash, hash);
    let whole = Schedule::new(tree, 1, "x".into());
    assert_eq!(taken.data.node_view("alpha"), whole.data.node_view("alpha"));
    assert_eq!(taken.data.all_roles(), whole.data.all_roles());
    if whole.data.tree().is_object() {
        "object".into()
    } else {
        "other".into()
    }
}

/// The action journal (`<storage>/actions.journal`) replayed by `ActionQueue::open` at start.
fn action_journal(bytes: &[u8]) -> String {
    use verwalter_controllers::actions::ActionQueue;
    use verwalter_controllers::testing::MemoryJournal;
    let writer = verwalter_controllers::node::StoreWriter::new(None);
    let queue = ActionQueue::open(
        verwalter_controllers::machinery::store::Field::new(Default::default()),
        writer.store(),
        MemoryJournal::holding(bytes),
        Arc::new(verwalter_controllers::machinery::clock::SystemClock),
        Default::default(),
    );
    match queue {
        Ok(_) => "ok".into(),
        Err(e) => format!("{e}"),
    }
}

/// A leading node's router and the runtime it runs on, one per fuzz worker.
struct HttpApp {
    runtime: tokio::runtime::Runtime,
    app: axum::Router,
}

thread_local! {
    static HTTP_APP: RefCell<Option<HttpApp>> = const { RefCell::new(None) };
}

fn http_app() -> HttpApp {
    use verwalter_controllers::cluster::election::ElectionState;
    let writer = verwalter_controllers::node::StoreWriter::new(Some(
        verwalter_controllers::state::Schedule::new(
            json!({"nodes": {"alpha": {"roles": {"web": {"template": "web"}}}}}),
            1_764_000_000_000,
            "77985419c732412ea38b94db00000001".into(),
        ),
    ));
    writer.election.set(ElectionState {
        is_leader: true,
        is_stable: true,
        epoch: 1,
        ..Default::default()
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let actions = {
        let _guard = runtime.enter();
        verwalter_controllers::actions::ActionQueue::open(
            verwalter_controllers::machinery::store::Field::new(Default::default()),
            writer.store(),
            Arc::new(verwalter_controllers::testing::MemoryJournal::default()),
            Arc::new(verwalter_controllers::machinery::clock::SystemClock),
            Default::default(),
        )
        .unwrap()
    };
    // The queue's writer (journal appends, answers to the requests that wait for them).
    runtime.spawn(
        actions
            .clone()
            .run(tokio_util::sync::CancellationToken::new()),
    );
    let state = verwalter::http::AppState {
        store: writer.store(),
        force_render: Arc::new(verwalter_controllers::machinery::store::Field::new(0)),
        actions,
        logs: None,
        log_dirs: Default::default(),
        backups_dir: scratch().join("backups"),
        metrics: Arc::new(verwalter::metrics::Metrics::new()),
        node: Arc::new(verwalter_controllers::status::NodeInfo {
            id: "77985419c732412ea38b94db00000001".into(),
            name: "alpha.example.com".into(),
            hostname: "alpha".into(),
            addr: "127.0.0.1:8379".into(),
            port: 8379,
            debug_force_leader: false,
            default_frontend: "common".into(),
            version: verwalter::http::version(),
        }),
        frontend_dir: scratch().join("frontend"),
        scheduler_dir: scratch().join("scheduler/v1"),
        query: verwalter::schedule::wasm::query::QueryHook::new(
            scratch().join("scheduler/v1"),
            verwalter::schedule::wasm::WasmLimits {
                memory: 64 << 20,
                time: std::time::Duration::from_secs(1),
            },
        ),
        http: Default::default(),
        liveness: Default::default(),
        alive_window: std::time::Duration::from_secs(75),
        datacenters: None,
    };
    // The writer must outlive the app: its fields are the store's senders.
    std::mem::forget(writer);
    HttpApp {
        runtime,
        app: verwalter::http::router(state),
    }
}

/// An HTTP request (`METHOD PATH`, header lines, a blank line, the body) through the daemon's
/// router as `tower::ServiceExt::oneshot` sends it, on a node that leads: an answer for every
/// request, and JSON where it says JSON. The three routes that wait by design (the event
/// stream, `wait_action`, the leader redirects' long polls) are left out.
fn http(bytes: &[u8]) -> String {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;
    let (head, body) = match bytes.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&bytes[..at], &bytes[at + 2..]),
        None => (bytes, &[][..]),
    };
    let head = String::from_utf8_lossy(head);
    let mut lines = head.lines();
    let first = lines.next().unwrap_or_default();
    let (method, path) = first.split_once(' ').unwrap_or(("GET", first));
    let lower = path.to_ascii_lowercase();
    if ["events", "wait_action", "leader-redirect"]
        .iter()
        .any(|p| lower.contains(p))
    {
        return "waits by design".into();
    }
    let mut request = Request::builder().method(method).uri(path);
    let mut has_host = false;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            has_host |= name.trim().eq_ignore_ascii_case("host");
            request = request.header(name.trim(), value.trim());
        }
    }
    if !has_host {
        request = request.header("host", "127.0.0.1:8379");
    }
    let Ok(request) = request.body(Body::from(body.to_vec())) else {
        return "not a request".into();
    };
    HTTP_APP.with(|cell| {
        let mut cell = cell.borrow_mut();
        let app = cell.get_or_insert_with(http_app);
        let router = app.app.clone();
        app.runtime.block_on(async move {
            let response = router.oneshot(request).await.expect("the router answers");
            let status = response.status();
            let json = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
            let body = axum::body::to_bytes(response.into_body(), 64 << 20)
                .await
                .expect("a body within 64 MiB");
            if json {
                serde_json::from_slice::<Value>(&body)
                    .unwrap_or_else(|e| panic!("{status}: a JSON answer that is not JSON: {e}"));
            }
            assert!(
                !status.is_server_error() || status.as_u16() == 503,
                "{status} for {method} {path}: {}",
                String::from_utf8_lossy(&body)
            );
            format!("{method} {status}")
        })
    })
}

/// Names and paths from the schedule, settings and requests that become file names: what
/// `paths.rs`, `vars.rs` and `config.rs` accept stays inside its dir.
fn paths(bytes: &[u8]) -> String {
    let Some(rel) = text(bytes) else {
        return "not UTF-8".into();
    };
    let dir = scratch().join("boundary");
    if !dir.exists() {
        std::fs::create_dir_all(dir.join("in/sub")).unwrap();
        std::os::unix::fs::symlink("/tmp", dir.join("out")).unwrap();
        std::os::unix::fs::symlink("sub", dir.join("in/link")).unwrap();
    }
    let boundary = verwalter::machinery::paths::Boundary::new(&dir).unwrap();
    let plain = verwalter::machinery::paths::is_plain_relative(rel);
    let joined = boundary.join_plain(rel);
    assert_eq!(joined.is_some(), plain);
    if let Some(Ok(path)) = &joined {
        assert!(path.starts_with(boundary.real()), "{rel:?} led to {path:?}");
    }
    if verwalter_controllers::render::vars::unsafe_template_name(rel).is_none() {
        assert!(
            plain,
            "template {rel:?} accepted but not a plain relative path"
        );
    }
    if verwalter_controllers::render::vars::unsafe_role_name(rel).is_none() {
        assert!(
            !rel.contains('/') && rel != "." && rel != "..",
            "role {rel:?}"
        );
    }
    let frontend = verwalter::config::check_frontend(&dir, rel);
    if frontend.is_ok() && rel != verwalter::config::BUILTIN_FRONTEND {
        assert!(plain, "frontend {rel:?} accepted but not plain");
    }
    if let Some((first, leads)) = boundary.first_exit(&dir.join(rel)) {
        assert!(!leads.starts_with(boundary.real()), "{first:?}");
    }
    match joined {
        None => "not plain".into(),
        Some(Ok(_)) => "inside".into(),
        Some(Err(verwalter::machinery::paths::Escape::Outside(_))) => "outside".into(),
        Some(Err(verwalter::machinery::paths::Escape::Unresolved(e))) => format!("{:?}", e.kind()),
    }
}

/// cantal's `/all_peers.json`: the peers taken are well-formed and never this node.
fn cantal_peers(bytes: &[u8]) -> String {
    let own = "0123456789abcdef0123456789abcdef";
    match verwalter::cluster::peers::parse_cantal(bytes, 8379, own) {
        Ok(parsed) => {
            for (id, peer) in &parsed.peers {
                assert_eq!(id, &peer.id);
                assert_ne!(id, own);
                assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()));
                assert!(!id.bytes().any(|b| b.is_ascii_uppercase()));
            }
            format!("ok, {} skipped", parsed.skipped.len().min(2))
        }
        Err(e) => e,
    }
}

/// A Prometheus instant-query reply (`placement/src/sources.rs`, used by the data sources and
/// the scheduler's metrics), read for every kind of query the placement sources run, then
/// combined into a snapshot.
fn prometheus_reply(bytes: &[u8]) -> String {
    use verwalter_placement::snapshot::Dim;
    use verwalter_placement::sources::{
        KubeData, PlannedQuery, PromData, QueryKind, combine, parse_query_reply,
    };
    let samples = match parse_query_reply(bytes) {
        Ok(samples) => samples,
        Err(e) => return e.to_string(),
    };
    let dims = [
        Dim::Cpu,
        Dim::Mem,
        Dim::MembwRead,
        Dim::MembwWrite,
        Dim::MembwFlat,
        Dim::Wss,
    ];
    let kinds = [
        QueryKind::PmemNodes,
        QueryKind::MembwCapacityRead,
        QueryKind::MembwCapacityWrite,
        QueryKind::NodeCapacityWss,
        QueryKind::NodeCapacityDramMembw,
        QueryKind::AppRequest(Dim::Cpu),
        QueryKind::AppRequest(Dim::MembwRead),
        QueryKind::DramHitRatio,
        QueryKind::AppProfiles,
        QueryKind::NodeTypes,
    ];
    let results: Vec<(PlannedQuery, Vec<_>)> = kinds
        .iter()
        .map(|&kind| {
            (
                PlannedQuery {
                    kind,
                    promql: "fuzz".into(),
                },
                samples.clone(),
            )
        })
        .collect();
    match PromData::read(&results) {
        Ok(prom) => {
            let _ = combine(&KubeData::default(), Some(&prom), &dims);
            "ok".into()
        }
        Err(e) => e.to_string(),
    }
}

/// The scheduler's `metrics.yaml` (`src/schedule/scheduler_metrics/file.rs`), with `!Env` lookups.
fn metrics_yaml(bytes: &[u8]) -> String {
    let env = |name: &str| match name {
        "FUZZ_URL" => Some("http://127.0.0.1:9090".to_string()),
        "FUZZ_PORT" => Some("9090".to_string()),
        _ => None,
    };
    match verwalter::schedule::scheduler_metrics::file::parse(bytes, env) {
        Ok(_) => "ok".into(),
        Err((_, message)) => message,
    }
}

/// The Kubernetes API's answers: a node list, a pod list and a watch line (the input is tried
/// as each), applied to a pod index and combined into a snapshot.
fn kube_api(bytes: &[u8]) -> String {
    use verwalter_placement::snapshot::Dim;
    use verwalter_placement::sources::{
        KubeData, PodIndex, combine, parse_node_list, parse_pod_list, parse_watch_line,
    };
    let nodes = parse_node_list(bytes);
    let pods = parse_pod_list(bytes);
    let event = parse_watch_line(bytes);
    let mut index = PodIndex::default();
    if let Ok((pods, _)) = &pods {
        index.replace_namespace("default", pods.clone());
    }
    if let Ok(event) = &event {
        index.apply(event);
        index.apply(event);
    }
    let kube = KubeData {
        nodes: nodes.as_ref().cloned().unwrap_or_default(),
        pods: index,
    };
    let _ = combine(&kube, None, &[Dim::Cpu, Dim::Mem]);
    format!("{} / {} / {}", class(&nodes), class(&pods), class(&event))
}

/// wca's placement config (`placement/src/config.rs`) as the extender and `check
/// --placement-config` load it, with `!Env`.
fn placement_config(bytes: &[u8]) -> String {
    let Some(text) = text(bytes) else {
        return "not UTF-8".into();
    };
    let env = |name: &str| (name == "FUZZ").then(|| "1".to_string());
    match verwalter_placement::config::load_config(text, env) {
        Ok(config) => {
            let _ = verwalter_placement::config::describe(&config);
            "ok".into()
        }
        Err(e) => e.to_string(),
    }
}

/// The placement snapshot file (`src/placement/snapshot_file.rs`), as YAML and as JSON.
fn placement_snapshot(bytes: &[u8]) -> String {
    use verwalter::placement::snapshot_file::parse;
    let yaml = parse(Path::new("snapshot.yaml"), bytes);
    let json = parse(Path::new("snapshot.json"), bytes);
    if let Ok(snapshot) = &yaml {
        let _ = verwalter_placement::snapshot::Usage::of(snapshot);
    }
    format!("{} / {}", class(&yaml), class(&json))
}

/// The algorithm and snapshot of `tests/fixtures/extender/`.
struct ExtenderFixture {
    algorithm: verwalter_placement::algorithms::Algorithm,
    snapshot: verwalter_placement::snapshot::Snapshot,
}

fn extender_fixture() -> &'static ExtenderFixture {
    static FIXTURE: std::sync::OnceLock<ExtenderFixture> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender");
        let config = std::fs::read_to_string(dir.join("config.yaml")).unwrap();
        let algorithms = verwalter_placement::config::load(&config, |_| None).unwrap();
        let algorithm = algorithms.into_values().next().unwrap().algorithm;
        let path = dir.join("snapshot.yaml");
        let snapshot =
            verwalter::placement::snapshot_file::parse(&path, &std::fs::read(&path).unwrap())
                .unwrap();
        ExtenderFixture {
            algorithm,
            snapshot,
        }
    })
}

/// A kube-scheduler request to the extender (`/filter`, `/prioritize`): parsed as the server
/// parses it, answered by both decisions; the answers serialize, and scores stay in 0..=10.
fn extender(bytes: &[u8]) -> String {
    use verwalter_placement::extender::{ExtenderArgs, filter, prioritize};
    let fixture = extender_fixture();
    let args = match ExtenderArgs::from_json(bytes) {
        Ok(args) => args,
        Err(e) => return e.to_string(),
    };
    let namespaces = verwalter_placement::extender::default_namespaces();
    let usage = verwalter_placement::snapshot::Usage::of(&fixture.snapshot);
    let filtered = filter(
        &fixture.algorithm,
        Some(&fixture.snapshot),
        Some(&usage),
        &args,
        &namespaces,
    );
    serde_json::to_vec(&filtered.reply).expect("a filter reply serializes");
    let scored = prioritize(
        &fixture.algorithm,
        Some(&fixture.snapshot),
        None,
        &args,
        &namespaces,
    );
    for host in &scored.reply {
        assert!((0..=10).contains(&host.score), "score {}", host.score);
    }
    serde_json::to_vec(&scored.reply).expect("a prioritize reply serializes");
    let unloaded = filter(&fixture.algorithm, None, None, &args, &namespaces);
    serde_json::to_vec(&unloaded.reply).expect("a filter reply serializes");
    format!("{} / {}", filtered.verdict.label(), scored.verdict.label())
}

/// A GraphQL query through what `/v1/graphql` decides before it runs one
/// (`http::query_cost`: parsed, then counted with its fragments expanded).
fn graphql_query(bytes: &[u8]) -> String {
    let Some(text) = text(bytes) else {
        return "not UTF-8".into();
    };
    match verwalter::http::query_cost(text) {
        Ok(()) => "ok".into(),
        Err(message) => {
            assert!(!message.is_empty(), "a refusal says why");
            if message.contains("selects more than") {
                "over the cap".into()
            } else {
                "refused".into()
            }
        }
    }
}
