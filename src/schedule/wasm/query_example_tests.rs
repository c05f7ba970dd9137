//! The shipped example `query.wasm` (examples/wasm-query) against the built-in (compat)
//! derivation: on every schedule it gives the roles and variables `vars` gives, and the render
//! controller reads the same variables out of its answer as out of the schedule itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use verwalter_controllers::machinery::ports::{NodeRoles, RoleSource, RolesRequest};
use verwalter_controllers::render::vars;
use verwalter_controllers::state::Schedule;

use super::query::{QueryHook, QueryModule};
use super::runtime::WasmLimits;

fn scheduler_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/wasm-query/scheduler/v1")
}

/// A debug build interprets the module many times slower than a release one.
fn generous() -> WasmLimits {
    WasmLimits {
        memory: 256 << 20,
        time: Duration::from_secs(60),
    }
}

/// Each role of `host` with its variables as the render controller reads them out of `data`, or
/// the error that fails the role.
type Rendered = BTreeMap<String, Result<Map<String, Value>, String>>;

fn rendered(data: &Value, host: &str) -> Rendered {
    vars::node_roles(data, host)
        .into_iter()
        .map(|role| {
            let result = vars::role_vars(data, host, &role).map_err(|e| e.to_string());
            (role, result)
        })
        .collect()
}

/// What the render controller makes of a role source's answer: the schedule
/// `{"nodes": {host: {"roles": <answer>}}}` (controllers/src/render/mod.rs, `derive_roles`).
fn rendered_from_source(roles: &NodeRoles, host: &str) -> Rendered {
    let mut nodes = Map::new();
    nodes.insert(host.to_string(), json!({"roles": roles}));
    rendered(&json!({"nodes": nodes}), host)
}

/// Checks the module's answer for `data` on `host` against the compat derivation: the same
/// roles, each with exactly the merged variables (`role` and `node` included) where the compat
/// derivation has them, and the same variables or the same error once rendered.
fn assert_same_as_compat(roles: &NodeRoles, data: &Value, host: &str) {
    let compat = rendered(data, host);
    let names: Vec<&String> = roles.keys().collect();
    assert_eq!(
        names,
        compat.keys().collect::<Vec<_>>(),
        "roles of {host} in {data}"
    );
    for (role, expected) in &compat {
        if let Ok(expected) = expected {
            assert_eq!(
                &roles[role],
                &Value::Object(expected.clone()),
                "variables of {role} on {host} in {data}"
            );
        }
    }
    assert_eq!(
        rendered_from_source(roles, host),
        compat,
        "rendered roles of {host} in {data}"
    );
}

fn schedule_of(data: &Value) -> Schedule {
    Schedule::new(data.clone(), 1, "ab".into())
}

/// The hook over the shipped module answers `render_roles` for `data` on `host`.
fn hook_roles(hook: &QueryHook, data: &Value, host: &str) -> Result<NodeRoles, String> {
    let request = RolesRequest {
        schedule: schedule_of(data),
        previous: None,
        host: host.into(),
        deployment_id: "d1".into(),
    };
    let future = hook.roles(request).expect("the example has a query.wasm");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(future).map_err(|e| e.0)
}

/// Schedules written to catch each rule of the derivation.
fn cases() -> Vec<(Value, &'static str)> {
    vec![
        // A key set at every level: the most specific wins at each; objects merge one level.
        (
            json!({
                "vars": {"template": "svc/v1", "k": 1, "a": 1, "b": 1,
                         "obj": {"x": 1, "y": 1, "deep": {"p": 1, "q": 1}}, "swap": {"o": 1},
                         "flat": 1},
                "roles": {"web": {"k": 2, "a": 2, "b": 2, "obj": {"y": 2, "z": 2},
                                  "swap": 5, "flat": {"now": "object"}}},
                "nodes": {"alpha": {
                    "vars": {"k": 3, "b": 3, "obj": {"z": 3, "deep": {"p": 3}}},
                    "roles": {"web": {"k": 4, "obj": {"w": 4}, "role": "ignored"},
                              "db": {"template": "db/v1", "k": 4}}}}
            }),
            "alpha",
        ),
        // A source sets `node`: the hostname is not filled in.
        (
            json!({"vars": {"template": "svc/v1", "node": "alpha.dc1"},
                   "nodes": {"alpha": {"roles": {"web": {}}}}}),
            "alpha",
        ),
        // A node without roles, a node missing, roles that are not an object.
        (
            json!({"vars": {"template": "svc/v1"}, "roles": {"web": {}},
                   "nodes": {"alpha": {"vars": {"k": 1}}, "beta": {"roles": ["web"]},
                             "gamma": "text"}}),
            "alpha",
        ),
        (
            json!({"vars": {"template": "svc/v1"}, "nodes": {"beta": {"roles": {"web": {}}}}}),
            "alpha",
        ),
        (json!({"nodes": {"beta": {"roles": ["web"]}}}), "beta"),
        (json!({"nodes": {"gamma": "text"}}), "gamma"),
        (json!({}), "alpha"),
        // Roles of the node missing from `roles`, and a role only in `roles` (rendered nowhere);
        // `roles` itself not an object, `null` sources.
        (
            json!({"vars": {"template": "svc/v1"},
                   "roles": {"web": {"port": 80}, "retired": {"port": 1}},
                   "nodes": {"alpha": {"roles": {"web": null, "cache": {"size": 3}}}}}),
            "alpha",
        ),
        (
            json!({"vars": null, "roles": [1, 2],
                   "nodes": {"alpha": {"vars": null,
                                       "roles": {"web": {"template": "svc/v1"}}}}}),
            "alpha",
        ),
        // Roles the render controller refuses the same way either way: no template, a bad name.
        (
            json!({"roles": {"web": {"template": "svc/v1"}},
                   "nodes": {"alpha": {"roles": {"web": {}, "bare": {}, ".hidden": {}}}}}),
            "alpha",
        ),
        // A hostname with `/` and `~` is a key like any other, as are unicode names.
        (
            json!({"vars": {"template": "svc/v1"},
                   "nodes": {"a/b~1": {"vars": {"n": "slash"}, "roles": {"wéb": {"k": 1}}},
                             "a": {"b~1": {"roles": {"wrong": {}}}}}}),
            "a/b~1",
        ),
        // An empty array is an empty source: a Lua scheduler's empty table (issue 29).
        (
            json!({"vars": [], "roles": {"web": [], "db": {"template": "svc/v1"}},
                   "nodes": {"alpha": {"vars": [],
                                       "roles": {"web": {"template": "svc/v1", "k": 1},
                                                 "db": []}}}}),
            "alpha",
        ),
        // The example's own schedule shape: nested limits and log settings.
        (
            json!({"vars": {"template": "svc/v1", "cluster": "example", "port": 80,
                            "log": {"level": "info", "format": "text"}},
                   "roles": {"web": {"version": "v2", "port": 8080,
                                     "limits": {"cpu": 2, "memory": 512},
                                     "log": {"level": "warn"}},
                             "worker": {"version": "v1"}, "retired": {"version": "v0"}},
                   "nodes": {"alpha": {"vars": {"zone": "zone-1", "log": {"level": "debug"}},
                                       "roles": {"web": {"instances": 2, "limits": {"cpu": 1},
                                                         "log": {"format": "json"}},
                                                 "worker": {"instances": 1}}}}}),
            "alpha",
        ),
    ]
}

#[test]
fn the_example_query_wasm_derives_what_the_compat_derivation_does() {
    let hook = QueryHook::new(scheduler_dir(), generous());
    assert!(hook.present(), "examples/wasm-query has no query.wasm");
    for (data, host) in cases() {
        let roles = hook_roles(&hook, &data, host)
            .unwrap_or_else(|e| panic!("render_roles failed on {data}: {e}"));
        assert_same_as_compat(&roles, &data, host);
    }
    // The first case really is decided by precedence: spot-check what the docs promise.
    let (data, host) = &cases()[0];
    let roles = hook_roles(&hook, data, host).unwrap();
    assert_eq!(
        roles["web"],
        json!({"template": "svc/v1", "k": 4, "a": 2, "b": 3,
               "obj": {"x": 1, "y": 2, "z": 3, "w": 4, "deep": {"p": 3}},
               "swap": 5, "flat": {"now": "object"}, "role": "web", "node": "alpha"})
    );
}

/// Variables of a random shape: scalars, objects, objects of objects, `null`; keys drawn from a
/// few names so the sources collide.
fn random_value(rng: &mut SmallRng, depth: u32) -> Value {
    match rng.random_range(0..if depth == 0 { 3 } else { 5 }) {
        0 => json!(rng.random_range(0..10)),
        1 => json!(format!("s{}", rng.random_range(0..5))),
        2 => Value::Null,
        _ => {
            let mut map = Map::new();
            for _ in 0..rng.random_range(0..4) {
                let key = ["x", "y", "z", "node", "role"][rng.random_range(0..5)];
                map.insert(key.into(), random_value(rng, depth - 1));
            }
            Value::Object(map)
        }
    }
}

/// A source: mostly an object of random variables, sometimes missing, `null` or `[]`.
fn random_source(rng: &mut SmallRng) -> Option<Value> {
    match rng.random_range(0..7) {
        0 => None,
        1 => Some(Value::Null),
        2 => Some(json!([])),
        _ => {
            let mut map = Map::new();
            for _ in 0..rng.random_range(0..5) {
                let key = ["a", "b", "obj", "node", "role", "template"][rng.random_range(0..6)];
                let value = if key == "template" {
                    json!("svc/v1")
                } else {
                    random_value(rng, 2)
                };
                map.insert(key.into(), value);
            }
            Some(Value::Object(map))
        }
    }
}

fn random_schedule(rng: &mut SmallRng) -> Value {
    let names = ["web", "db", "cache"];
    let mut data = Map::new();
    if let Some(vars) = random_source(rng) {
        data.insert("vars".into(), vars);
    }
    let mut roles = Map::new();
    for name in names {
        if let Some(source) = random_source(rng) {
            roles.insert(name.into(), source);
        }
    }
    data.insert("roles".into(), Value::Object(roles));
    let mut nodes = Map::new();
    for host in ["alpha", "beta"] {
        let mut node = Map::new();
        if let Some(vars) = random_source(rng) {
            node.insert("vars".into(), vars);
        }
        if rng.random_range(0..5) > 0 {
            let mut mine = Map::new();
            for name in names {
                if rng.random_range(0..3) > 0 {
                    mine.insert(name.into(), random_source(rng).unwrap_or(Value::Null));
                }
            }
            node.insert("roles".into(), Value::Object(mine));
        }
        nodes.insert(host.into(), Value::Object(node));
    }
    data.insert("nodes".into(), Value::Object(nodes));
    Value::Object(data)
}

#[test]
fn the_example_query_wasm_agrees_with_the_compat_derivation_on_random_schedules() {
    let bytes = std::fs::read(scheduler_dir().join("query.wasm")).unwrap();
    let mut module = QueryModule::from_bytes("query.wasm", &bytes, generous()).unwrap();
    let mut rng = SmallRng::seed_from_u64(16);
    let mut with_roles = 0;
    for _ in 0..150 {
        let data = random_schedule(&mut rng);
        let host = ["alpha", "beta"][rng.random_range(0..2)];
        module.init(&schedule_of(&data), host).unwrap();
        let roles = module
            .render_roles("d1", None)
            .unwrap_or_else(|e| panic!("render_roles failed on {data}: {}", e.message));
        assert_same_as_compat(&roles, &data, host);
        with_roles += usize::from(!roles.is_empty());
    }
    assert!(
        with_roles > 50,
        "too few schedules gave roles: {with_roles}"
    );
}

#[test]
fn a_source_that_is_not_an_object_fails_the_example_as_it_fails_compat_roles() {
    let hook = QueryHook::new(scheduler_dir(), generous());
    for (field, data) in [
        (
            "vars",
            json!({"vars": "text", "nodes": {"alpha": {"roles": {"web": {}}}}}),
        ),
        (
            "nodes.alpha.roles.web",
            json!({"vars": {"template": "svc/v1"}, "nodes": {"alpha": {"roles": {"web": 5}}}}),
        ),
    ] {
        let compat = rendered(&data, "alpha");
        let why = compat["web"].as_ref().unwrap_err();
        assert!(why.contains(&format!("schedule field `{field}`")), "{why}");
        // The module cannot fail one role: it fails them all, saying the same.
        let error = hook_roles(&hook, &data, "alpha").unwrap_err();
        assert!(
            error.starts_with("scheduler/v1/query.wasm: render_roles: BadSchedule: ")
                && error.ends_with(why.as_str()),
            "{error} / {why}"
        );
    }
}

#[test]
fn the_example_query_wasm_answers_its_queries() {
    let hook = QueryHook::new(scheduler_dir(), generous());
    let (data, host) = cases().pop().unwrap();
    let schedule = schedule_of(&data);
    let roles = hook
        .with_module(&schedule, host, |m| m.query("roles", &json!({})))
        .unwrap();
    assert_eq!(
        roles,
        json!({"node": "alpha", "schedule": schedule.hash, "roles": ["web", "worker"]})
    );
    let web = hook
        .with_module(&schedule, host, |m| m.query("role/web", &Value::Null))
        .unwrap();
    assert_eq!(
        Value::Object(vars::role_vars(&data, host, "web").unwrap()),
        web
    );
    assert_eq!(web["limits"], json!({"cpu": 1, "memory": 512}));
    let error = hook
        .with_module(&schedule, host, |m| m.query("role/retired", &json!({})))
        .unwrap_err();
    assert_eq!(
        error.message,
        "scheduler/v1/query.wasm: query: NotFound: \"retired\" is not a role of node \"alpha\""
    );
    let error = hook
        .with_module(&schedule, host, |m| m.query("nodes", &json!({})))
        .unwrap_err();
    assert!(
        error
            .message
            .starts_with("scheduler/v1/query.wasm: query: UnknownPath: no query \"nodes\""),
        "{}",
        error.message
    );
    // Before `init` there is nothing to answer from.
    let bytes = std::fs::read(scheduler_dir().join("query.wasm")).unwrap();
    let mut fresh = QueryModule::from_bytes("query.wasm", &bytes, generous()).unwrap();
    let error = fresh.render_roles("d1", None).unwrap_err();
    assert_eq!(
        error.message,
        "query.wasm: render_roles: Uninitialized: init was not called"
    );
}
