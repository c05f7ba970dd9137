//! A node whose scheduler is a WebAssembly module (`examples/wasm-scheduler`): it schedules,
//! serves the module, and a module replaced by a trapping or runaway one leaves the last good
//! schedule in force with the error in `/v1/status`. A node with `examples/wasm-query`'s
//! `query.wasm` renders what it renders without it, and answers queries.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::*;

const SOON: Duration = Duration::from_secs(15);

/// Writes `bytes` to `path` complete under another name, then renames it into place.
fn replace_module(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

/// A module with the protocol's exports whose `scheduler` runs `body`.
pub(crate) fn module(body: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
  (memory (export "memory") 1)
  (func (export "alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "dealloc") (param i32))
  (func (export "scheduler") (param i32 i32) (result i32) {body}))"#
    ))
    .unwrap()
}

#[test]
fn a_wasm_scheduler_schedules_and_a_broken_module_keeps_the_last_schedule() {
    let (_tmp, config, storage) = example_site("wasm-scheduler");
    let _ = std::fs::remove_file(config.join("scheduler/v1/main.lua"));
    let daemon = Daemon::start(&config, &storage);

    let first = daemon.wait_json(SOON, "/v1/schedule", "no schedule", |_| true);
    let data = &first["data"];
    assert_eq!(data["roles"]["web"]["version"], "v2", "{first}");
    assert_eq!(data["roles"]["web"]["template"], "svc/v1");
    assert_eq!(data["nodes"]["alpha"]["roles"]["db"]["image"], "db.v1");
    // The run's log is published just after its schedule.
    let log = wait_for(SOON, || match daemon.get("/v1/scheduler_debug_info") {
        Some((200, log)) => Some(log),
        _ => None,
    })
    .expect("the scheduler's log");
    assert!(
        log.contains("placed 2 roles over 1 nodes, 1 instances unplaced"),
        "{log}"
    );
    // (The module itself is binary: the route tests in src/http check its bytes and headers.)
    let (code, _) = daemon.get("/v1/wasm/query.wasm").unwrap();
    assert_eq!(code, 404);

    // A module that traps: the error shows, the schedule stays.
    let module_path = config.join("scheduler/v1/scheduler.wasm");
    replace_module(&module_path, &module("unreachable"));
    let status = daemon.wait_json(SOON, "/v1/status", "trap not reported", |s| {
        s["errors"]["scheduler"]
            .as_str()
            .is_some_and(|m| m.contains("scheduler failed: trapped"))
    });
    let message = status["errors"]["scheduler"].as_str().unwrap();
    assert!(
        message.starts_with("scheduler/v1/scheduler.wasm: "),
        "{message}"
    );
    assert_eq!(status["schedule_id"], first["hash"]);
    assert_eq!(daemon.json("/v1/schedule").unwrap()["hash"], first["hash"]);

    // A runaway module is stopped at the time budget; the API answers meanwhile.
    replace_module(&module_path, &module("(loop $l (br $l)) (i32.const 0)"));
    let status = daemon.wait_json(SOON, "/v1/status", "timeout not reported", |s| {
        s["errors"]["scheduler"]
            .as_str()
            .is_some_and(|m| m.contains("time budget"))
    });
    assert_eq!(status["schedule_id"], first["hash"]);
    let (_, metrics) = daemon.get("/metrics").unwrap();
    assert!(
        metrics.contains("verwalter_scheduler_failures_total{reason=\"timeout\"}"),
        "{metrics}"
    );

    // The good module back: the error clears.
    let good =
        std::fs::read(example("wasm-scheduler").join("scheduler/v1/scheduler.wasm")).unwrap();
    replace_module(&module_path, &good);
    daemon.wait_json(SOON, "/v1/status", "error not cleared", |s| {
        s["errors"].get("scheduler").is_none()
    });
}

/// A copy of `examples/wasm-query` (with its `query.wasm` or without it) on a daemon, its
/// template copying each role's rendered file into `out/` and recording the call: the files once
/// both roles (`web`, `worker`) have rendered, by name.
fn render_wasm_query_example(
    with_query_wasm: bool,
) -> (tempfile::TempDir, Daemon, BTreeMap<String, String>) {
    let (tmp, config, storage) = example_site("wasm-query");
    if !with_query_wasm {
        std::fs::remove_file(config.join("scheduler/v1/query.wasm")).unwrap();
    }
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let o = out.display();
    replace_file(
        &config.join("templates/svc/v1/role.render.yaml"),
        &format!(
            "templates:\n  conf: role.conf.hbs\ncommands:\n\
             - !Copy {{src: '{{{{ files.conf }}}}', dest: '{o}/{{{{ role }}}}.conf'}}\n\
             - !Sh 'echo {{{{ role }}}} >> {o}/calls.log'\n"
        ),
    );
    let daemon = Daemon::start(&config, &storage);
    let mut calls = wait_for(SOON, || {
        let calls = std::fs::read_to_string(out.join("calls.log")).ok()?;
        let calls: Vec<String> = calls.lines().map(String::from).collect();
        (calls.len() >= 2).then_some(calls)
    })
    .unwrap_or_else(|| panic!("the roles never rendered:\n{}", daemon.logs()));
    calls.sort();
    assert_eq!(calls, ["web", "worker"], "each role rendered once");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "conf") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            files.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    (tmp, daemon, files)
}

fn query(daemon: &Daemon, path: &str) -> (u16, Value) {
    let (code, body) = http_post(daemon.port, path, "application/json", b"{}");
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (code, value)
}

#[test]
fn the_query_wasm_example_renders_what_the_built_in_derivation_renders_and_answers_queries() {
    let (_tmp, daemon, with_module) = render_wasm_query_example(true);
    // Every level of the schedule shows: `port` from the role over the cluster's (web) or the
    // cluster's alone (worker), `limits` and `log` merged from three levels.
    assert_eq!(
        with_module.get("web.conf").map(String::as_str),
        Some(
            "# web on alpha in cluster example, zone-1\nversion: v2\nimage: web.v2\nport: 8080\n\
             instances: 2\nlimits: cpu 1, memory 512\nlog: debug, json\n"
        ),
        "{with_module:?}"
    );
    assert_eq!(
        with_module.get("worker.conf").map(String::as_str),
        Some(
            "# worker on alpha in cluster example, zone-1\nversion: v1\nimage: worker.v1\n\
             port: 80\ninstances: 1\nlimits: cpu 1, memory 128\nlog: debug, text\n"
        ),
        "{with_module:?}"
    );
    assert_eq!(with_module.len(), 2, "`retired` is rendered nowhere");

    // The module answers about the schedule in force.
    let hash = daemon.json("/v1/schedule").unwrap()["hash"].clone();
    let (code, roles) = query(&daemon, "/v1/query/roles");
    assert_eq!(code, 200, "{roles}");
    assert_eq!(
        roles,
        json!({"node": "alpha", "schedule": hash, "roles": ["web", "worker"]})
    );
    let (code, worker) = query(&daemon, "/v1/query/role/worker");
    assert_eq!(code, 200, "{worker}");
    assert_eq!(worker["port"], 80);
    assert_eq!(worker["log"], json!({"level": "debug", "format": "text"}));
    // A path it does not know: its `Err`, as a 500 (0.13's mapping of a query error).
    let (code, error) = query(&daemon, "/v1/query/nodes");
    assert_eq!(code, 500, "{error}");
    assert_eq!(
        error["error"],
        "scheduler/v1/query.wasm: query: UnknownPath: no query \"nodes\": this query.wasm \
         answers `roles` and `role/<name>`"
    );
    // Failed queries leave rendering alone: nothing failed, nothing rendered again.
    let status = daemon.json("/v1/status").unwrap();
    assert_eq!(status["failed_roles"], json!([]), "{status}");
    drop(daemon);

    // Without the module the built-in derivation renders the same files, and there is no query
    // interface.
    let (_tmp, daemon, built_in) = render_wasm_query_example(false);
    assert_eq!(built_in, with_module);
    let (code, error) = query(&daemon, "/v1/query/roles");
    assert_eq!(code, 500);
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("no query interface")),
        "{error}"
    );
}
