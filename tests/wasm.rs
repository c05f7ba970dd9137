//! A node whose scheduler is a WebAssembly module (`examples/wasm-scheduler`): it schedules,
//! serves the module, and a module replaced by a trapping or runaway one leaves the last good
//! schedule in force with the error in `/v1/status`.

use std::path::Path;
use std::time::Duration;

use crate::util::*;

const SOON: Duration = Duration::from_secs(15);

/// Writes `bytes` to `path` complete under another name, then renames it into place.
fn replace_module(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

/// A module with the protocol's exports whose `scheduler` runs `body`.
fn module(body: &str) -> Vec<u8> {
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
    let (code, log) = daemon.get("/v1/scheduler_debug_info").unwrap();
    assert_eq!(code, 200);
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
