//! The wasm scheduler: the example module against its Lua twin, and hostile modules (written
//! as WAT text) each stopped with a clear error.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use verwalter_controllers::state::SchedulerFailure;
use verwalter_controllers::state::{Peer, Schedule, SchedulerInput};

use super::query::{QueryModule, unwrap_envelope};
use super::*;
use crate::schedule::ConfigDirScheduler;
use crate::schedule::lua::LuaScheduler;
use verwalter_controllers::machinery::watchdog as progress;

fn limits() -> WasmLimits {
    WasmLimits {
        memory: 16 << 20,
        time: Duration::from_millis(300),
    }
}

fn input_with(peers: usize, roles: usize) -> SchedulerInput {
    let mut runtime = serde_json::Map::new();
    for r in 0..roles {
        let mut versions = serde_json::Map::new();
        for v in 1..=3 {
            versions.insert(
                format!("v{v}"),
                json!({"image": format!("role-{r:03}.v{v}"), "instances": 1 + r % 7,
                       "cpu": 1 + r % 4, "memory": 2 + r % 8}),
            );
        }
        runtime.insert(format!("role-{r:03}"), Value::Object(versions));
    }
    let peers = (1..=peers)
        .map(|i| {
            let id = format!("77985419c732412ea38b94db{i:08x}");
            let peer = Peer {
                id: id.clone(),
                addr: Some(format!("10.0.0.{i}:8379")),
                name: format!("node-{i:04}.example.com"),
                hostname: format!("node-{i:04}"),
                schedule: None,
                known_since: 1_700_000_000_000,
                last_report_direct: None,
                errors: 0,
            };
            (id, peer)
        })
        .collect();
    SchedulerInput {
        now: 1_700_000_001_000,
        current_host: "node-0000".into(),
        current_id: "77985419c732412ea38b94db00000000".into(),
        parents: vec![],
        actions: BTreeMap::from([(1_700_000_000_001, json!({"button": {"role": "x"}}))]),
        runtime: Arc::new(Value::Object(runtime)),
        peers,
        metrics: json!({}),
        datacenters: None,
    }
}

fn small_input() -> SchedulerInput {
    input_with(1, 1)
}

/// The protocol's `alloc` (a bump allocator from the global `$next`, growing memory as needed)
/// and a `dealloc` that frees nothing, for the test modules.
const BUMP_ALLOC: &str = r#"(func (export "alloc") (param $len i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (local.get $len)))
    (block $fits
      (br_if $fits (i32.le_u (global.get $next) (i32.mul (memory.size) (i32.const 65536))))
      (drop (memory.grow (i32.add (i32.const 1) (i32.div_u (global.get $next) (i32.const 65536))))))
    (local.get $p))
  (func (export "dealloc") (param i32))"#;

/// A module with the protocol's exports (a bump allocator that grows memory as needed),
/// `data` at address 16, `imports` and `scheduler`'s `body`.
fn module(imports: &str, data: &str, body: &str) -> Vec<u8> {
    let text = format!(
        r#"(module
  {imports}
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 4096))
  (global $dirty (mut i32) (i32.const 0))
  (data (i32.const 16) "{data}")
  {BUMP_ALLOC}
  (func (export "scheduler") (param $ptr i32) (param $len i32) (result i32)
    {body}))"#
    );
    wat::parse_str(text).expect("test module assembles")
}

const OK_RESULT: &str = r#"{\"schedule\": {\"nodes\": {}, \"vars\": {\"a\": 1}}, \"log\": \"hello\", \"actions\": {\"1700000000001\": {\"ok\": \"done\"}}} trailing bytes"#;

fn run(bytes: &[u8], input: &SchedulerInput) -> Result<SchedulerOutput, SchedulerError> {
    WasmRun::from_bytes("scheduler.wasm", bytes, limits())?.run(input)
}

fn failure(bytes: &[u8]) -> SchedulerError {
    run(bytes, &small_input()).expect_err("the module must fail")
}

#[test]
fn a_result_becomes_schedule_log_and_action_answers() {
    let bytes = module("", OK_RESULT, "(i32.const 16)");
    let output = run(&bytes, &small_input()).unwrap();
    assert_eq!(output.log, "hello");
    assert_eq!(
        output.data,
        json!({"nodes": {}, "vars": {"a": 1}, "actions": {"1700000000001": {"ok": "done"}}})
    );
}

#[test]
fn the_input_arrives_as_0_13_json_with_string_action_keys() {
    // The module answers {"schedule": <its input>}: it writes `{"schedule":` (data at 16) into
    // the free bytes just before the input (which alloc put at 4096) and `}` just after it.
    let body = r#"
    (memory.copy (i32.sub (local.get $ptr) (i32.const 12)) (i32.const 16) (i32.const 12))
    (i32.store8 (i32.add (local.get $ptr) (local.get $len)) (i32.const 125))
    (i32.sub (local.get $ptr) (i32.const 12))"#;
    let bytes = module("", r#"{\"schedule\":"#, body);
    let output = run(&bytes, &small_input()).unwrap();
    assert_eq!(output.data.tree()["current_host"], "node-0000");
    assert_eq!(
        output.data.tree()["actions"]["1700000000001"],
        json!({"button": {"role": "x"}})
    );
    assert_eq!(output.data.tree()["now"], 1_700_000_001_000u64);
    assert_eq!(output.data.tree()["parents"], json!([]));
}

#[test]
fn a_runaway_loop_is_stopped_at_the_time_budget() {
    let bytes = module("", "", "(loop $forever (br $forever)) (i32.const 0)");
    // Stopped by the budget, not by an end of the loop it never reaches: the failure's kind
    // says so (no wall-clock bound here: a loaded machine stretches the time to the stop).
    let error = failure(&bytes);
    assert_eq!(error.kind, SchedulerFailure::Timeout, "{error:?}");
    assert!(error.message.contains("time budget"), "{}", error.message);
}

#[test]
fn memory_growth_past_the_limit_is_stopped() {
    let bytes = module(
        "",
        "",
        "(loop $more (drop (memory.grow (i32.const 16))) (br $more)) (i32.const 0)",
    );
    let error = failure(&bytes);
    assert_eq!(error.kind, SchedulerFailure::Memory, "{error:?}");
    assert!(error.message.contains("memory"), "{}", error.message);
}

#[test]
fn an_initial_memory_over_the_limit_is_refused() {
    let text = r#"(module
      (memory (export "memory") 1000)
      (func (export "alloc") (param i32) (result i32) (i32.const 0))
      (func (export "dealloc") (param i32))
      (func (export "scheduler") (param i32 i32) (result i32) (i32.const 0)))"#;
    let error = failure(&wat::parse_str(text).unwrap());
    assert_eq!(error.kind, SchedulerFailure::Memory, "{error:?}");
    assert!(error.message.contains("16 MiB"), "{}", error.message);
}

/// A scheduler module with a table of `elements`, and a query module with the same.
fn modules_with_table(elements: u32) -> [(&'static str, Vec<u8>); 2] {
    let table = format!("(table {elements} funcref)");
    let scheduler = module(&table, OK_RESULT, "(i32.const 16)");
    let query = wat::parse_str(format!(
        r#"(module
  (memory (export "memory") 1)
  {table}
  (global $next (mut i32) (i32.const 8192))
  (data (i32.const 16) "{{\"Ok\": null}}")
  {BUMP_ALLOC}
  (func (export "init") (param i32 i32) (result i32) (i32.const 16))
  (func (export "render_roles") (param i32 i32) (result i32) (i32.const 16))
  (func (export "query") (param i32 i32) (result i32) (i32.const 16)))"#
    ))
    .unwrap();
    [("scheduler", scheduler), ("query", query)]
}

/// Calls the module's first entry point: `scheduler`, or `init` of a query module.
fn first_call(kind: &str, bytes: &[u8], limits: WasmLimits) -> Result<(), CallError> {
    match kind {
        "scheduler" => {
            let mut module = WasmModule::load("scheduler.wasm", bytes, &["scheduler"], limits)?;
            module.call_json("scheduler", &small_input()).map(drop)
        }
        _ => {
            let mut module = QueryModule::from_bytes("query.wasm", bytes, limits).unwrap();
            module.init(&schedule(), "alpha").map_err(|e| CallError {
                kind: SchedulerFailure::Runtime,
                message: e.message,
            })?;
            Ok(())
        }
    }
}

#[test]
fn a_table_over_the_memory_limit_is_refused() {
    // 3,000,000 elements count 24 MB: over the 16 MiB limit (with the memory) in both kinds of
    // module. (The attack was `(table 1000000000 funcref)`: gigabytes allocated; this size stays
    // harmless even where it is not refused.)
    for (kind, bytes) in modules_with_table(3_000_000) {
        let mut module = WasmModule::load(
            "m.wasm",
            &bytes,
            if kind == "scheduler" {
                &["scheduler"]
            } else {
                &["init", "render_roles", "query"]
            },
            limits(),
        )
        .unwrap();
        let error = module.call("alloc", b"").unwrap_err();
        assert_eq!(error.kind, SchedulerFailure::Memory, "{kind}: {error:?}");
        assert!(
            error
                .message
                .contains("cannot instantiate: tried to grow a table past the limit of 16 MiB")
                && error.message.contains("3000000 elements"),
            "{kind}: {}",
            error.message
        );
        let error = first_call(kind, &bytes, limits()).unwrap_err();
        assert!(
            error.message.contains("a table past the limit"),
            "{kind}: {}",
            error.message
        );
    }
    // A table that fits with the memory is taken: 1,000,000 elements count 8 MB.
    for (kind, bytes) in modules_with_table(1_000_000) {
        first_call(kind, &bytes, limits()).unwrap_or_else(|e| panic!("{kind}: {e:?}"));
    }
}

#[test]
fn table_growth_past_the_limit_is_stopped() {
    // Grows a table by 500,000 elements (4 MB counted) ten times: past 16 MiB at the 4th.
    let table = "(table $t 0 funcref)";
    let grow = r#"(local $i i32)
    (loop $more
      (drop (table.grow $t (ref.null func) (i32.const 500000)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 10))))
    (i32.const 16)"#;
    let error = failure(&module(table, OK_RESULT, grow));
    assert_eq!(error.kind, SchedulerFailure::Memory, "{error:?}");
    assert!(
        error
            .message
            .contains("scheduler failed: tried to grow a table past the limit of 16 MiB"),
        "{}",
        error.message
    );
    // The same module in query.wasm's `query`.
    let bytes = query_module_with(
        r#"{\"Ok\": null}"#,
        r#"{\"Ok\": {}}"#,
        r#"{\"Ok\": 1}"#,
        "(table $t 0 funcref)",
        &grow.replace("(i32.const 16)", "(i32.const 4096)"),
    );
    let mut query = QueryModule::from_bytes("query.wasm", &bytes, limits()).unwrap();
    query.init(&schedule(), "alpha").unwrap();
    let error = query.query("x", &json!({})).unwrap_err();
    assert!(
        error
            .message
            .contains("query failed: tried to grow a table past the limit of 16 MiB"),
        "{}",
        error.message
    );
    // Growth within the limit is taken (three times: 12 MB with the memory's 64 KiB).
    let fits = grow.replace("(i32.const 10)", "(i32.const 3)");
    assert!(run(&module(table, OK_RESULT, &fits), &small_input()).is_ok());
}

#[test]
fn memory_grows_to_the_limit_in_one_step_and_no_further() {
    // 128 MiB: one `memory.grow` of 2,000 pages (125 MiB) costs 2M fuel, more than a slice.
    let big = WasmLimits {
        memory: 128 << 20,
        time: Duration::from_secs(10),
    };
    let grow = |pages: u32| {
        module(
            "",
            OK_RESULT,
            &format!(
                "(if (i32.eq (memory.grow (i32.const {pages})) (i32.const -1)) (then unreachable)) \
                 (i32.const 16)"
            ),
        )
    };
    let mut run = WasmRun::from_bytes("scheduler.wasm", &grow(2000), big).unwrap();
    run.run(&small_input())
        .expect("a grow to 125 MiB under a limit of 128 MiB succeeds");
    // One page more than the limit holds (1 + 2048) is refused.
    let mut run = WasmRun::from_bytes("scheduler.wasm", &grow(2048), big).unwrap();
    let error = run.run(&small_input()).unwrap_err();
    assert_eq!(error.kind, SchedulerFailure::Memory, "{error:?}");
    assert!(
        error
            .message
            .contains("tried to grow its memory past the limit of 128 MiB"),
        "{}",
        error.message
    );
    // A table's elements count against the same limit: with 1,000,000 of them (8 MB), the
    // 125 MiB memory no longer fits.
    let table_and_grow = module(
        "(table 1000000 funcref)",
        OK_RESULT,
        "(drop (memory.grow (i32.const 2000))) (i32.const 16)",
    );
    let error = WasmRun::from_bytes("scheduler.wasm", &table_and_grow, big)
        .unwrap()
        .run(&small_input())
        .unwrap_err();
    assert!(
        error
            .message
            .contains("to 125.1 MiB with 7.6 MiB of table elements"),
        "{}",
        error.message
    );
}

#[test]
fn a_start_function_past_its_fuel_says_so() {
    let text = format!(
        r#"(module
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 4096))
  {BUMP_ALLOC}
  (func $forever (loop $l (br $l)))
  (start $forever)
  (func (export "scheduler") (param i32 i32) (result i32) (i32.const 0)))"#
    );
    let bytes = wat::parse_str(text).unwrap();
    let mut module = WasmModule::load("scheduler.wasm", &bytes, &["scheduler"], limits()).unwrap();
    // A million instructions (the daemon's modules get START_FUEL, 64 million), plus the fuel
    // to grow to the 16 MiB limit.
    module.set_start_fuel(1_000_000);
    let error = module.call_json("scheduler", &small_input()).unwrap_err();
    assert_eq!(error.kind, SchedulerFailure::Timeout, "{error:?}");
    assert!(
        error.message.contains(
            "scheduler.wasm: cannot instantiate: its start function ran out of its fuel \
             budget of 1262144 units (1000000 instructions and the growing of its memory"
        ),
        "{}",
        error.message
    );
    assert!(
        !error.message.contains("time budget of"),
        "{}",
        error.message
    );
}

#[test]
fn a_trap_is_a_runtime_error_with_the_panic_message() {
    let error = failure(&module("", "", "unreachable"));
    assert_eq!(error.kind, SchedulerFailure::Runtime, "{error:?}");
    assert!(
        error.message.contains("scheduler failed: trapped"),
        "{}",
        error.message
    );

    // A Rust module reports its panic through env.log_panic, then traps.
    let imports = r#"(import "env" "log_panic" (func $log_panic (param i32 i32 i32 i32 i32)))"#;
    // A second report in the same call is ignored (a module reporting in a loop costs little).
    let body = "(call $log_panic (i32.const 16) (i32.const 5) (i32.const 21) (i32.const 8) \
                (i32.const 42)) \
                (call $log_panic (i32.const 21) (i32.const 3) (i32.const 16) (i32.const 5) \
                (i32.const 7)) unreachable";
    let error = failure(&module(imports, "boom!src/x.rs", body));
    assert_eq!(error.kind, SchedulerFailure::Runtime);
    assert!(
        error.message.contains("panicked at src/x.rs:42: boom!"),
        "{}",
        error.message
    );
    assert!(!error.message.contains(":7:"), "{}", error.message);

    // Pointers outside the memory do not take the host down.
    let body = "(call $log_panic (i32.const -1) (i32.const -1) (i32.const 70000) (i32.const 9) \
                (i32.const 1)) unreachable";
    let error = failure(&module(imports, "", body));
    assert!(
        error.message.contains("panicked at :1: "),
        "{}",
        error.message
    );
}

#[test]
fn the_instance_is_made_anew_after_a_trap() {
    // Traps when its input is long, and from then on whenever the same instance is called.
    let body = r#"
    (if (global.get $dirty) (then unreachable))
    (if (i32.gt_u (local.get $len) (i32.const 2000))
      (then (global.set $dirty (i32.const 1)) unreachable))
    (i32.const 16)"#;
    let bytes = module("", OK_RESULT, body);
    let mut run = WasmRun::from_bytes("scheduler.wasm", &bytes, limits()).unwrap();
    assert!(run.run(&small_input()).is_ok());
    let error = run.run(&input_with(5, 40)).unwrap_err();
    assert_eq!(error.kind, SchedulerFailure::Runtime);
    let again = run.run(&small_input());
    assert!(again.is_ok(), "the trapped instance was reused: {again:?}");
}

#[test]
fn output_of_the_wrong_type_is_refused() {
    let cases = [
        (r#"[1, 2]"#, "an array, not an object"),
        (
            r#"{\"schedule\": 5, \"log\": \"\"}"#,
            "`schedule` is a number",
        ),
        (r#"{\"log\": \"only a log\"}"#, "has no `schedule`"),
        (r#"{\"schedule\": {}, \"log\": 7}"#, "`log` is a number"),
        (
            r#"{\"schedule\": {}, \"actions\": [1]}"#,
            "`actions` is an array",
        ),
        ("not json", "did not return JSON"),
    ];
    for (data, expected) in cases {
        let error = failure(&module("", data, "(i32.const 16)"));
        assert_eq!(error.kind, SchedulerFailure::BadOutput, "{data}: {error:?}");
        assert!(
            error.message.contains(expected),
            "{data}: {}",
            error.message
        );
    }
    // A pointer past the memory's end.
    let error = failure(&module("", "", "(i32.const 0x7fffffff)"));
    assert_eq!(error.kind, SchedulerFailure::BadOutput);
    assert!(
        error.message.contains("outside the module's memory"),
        "{}",
        error.message
    );
}

#[test]
fn a_missing_export_is_named() {
    let text = r#"(module
      (memory (export "memory") 1)
      (func (export "alloc") (param i32) (result i32) (i32.const 0)))"#;
    let error = failure(&wat::parse_str(text).unwrap());
    assert_eq!(error.kind, SchedulerFailure::Load);
    assert!(
        error
            .message
            .contains("does not export `dealloc`, `scheduler`"),
        "{}",
        error.message
    );
    // Exported with the wrong signature.
    let text = r#"(module
      (memory (export "memory") 1)
      (func (export "alloc") (param i32) (result i32) (i32.const 0))
      (func (export "dealloc") (param i32))
      (func (export "scheduler") (param i32) (result i32) (i32.const 0)))"#;
    let error = failure(&wat::parse_str(text).unwrap());
    assert_eq!(error.kind, SchedulerFailure::Load);
    assert!(
        error
            .message
            .contains("`scheduler` must be a function (i32, i32) -> i32"),
        "{}",
        error.message
    );
}

#[test]
fn an_unknown_import_is_named() {
    for import in [
        r#"(import "env" "getrandom" (func (param i32 i32) (result i32)))"#,
        r#"(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))"#,
    ] {
        let error = failure(&module(import, OK_RESULT, "(i32.const 16)"));
        assert_eq!(error.kind, SchedulerFailure::Load);
        let name = if import.contains("getrandom") {
            "`env.getrandom`"
        } else {
            "`wasi_snapshot_preview1.fd_write`"
        };
        assert!(error.message.contains(name), "{}", error.message);
        assert!(error.message.contains("env.log_panic"), "{}", error.message);
    }
    // Not a module at all.
    let error = failure(b"\0asm junk");
    assert_eq!(error.kind, SchedulerFailure::Load);
    assert!(error.message.contains("not a valid WebAssembly module"));
}

#[test]
fn the_libm_shims_compute() {
    let imports = r#"(import "env" "pow" (func $pow (param f64 f64) (result f64)))
      (import "env" "ldexp" (func $ldexp (param f64 i32) (result f64)))
      (import "env" "fmod" (func $fmod (param f64 f64) (result f64)))"#;
    // Returns {"schedule":{}} when pow(2,10) + ldexp(1,3) + fmod(7,4) == 1035, else traps.
    let body = r#"
    (if (f64.ne (f64.add (f64.add (call $pow (f64.const 2) (f64.const 10))
                                  (call $ldexp (f64.const 1) (i32.const 3)))
                         (call $fmod (f64.const 7) (f64.const 4)))
                (f64.const 1035))
      (then unreachable))
    (i32.const 16)"#;
    let output = run(
        &module(imports, r#"{\"schedule\":{}}"#, body),
        &small_input(),
    )
    .unwrap();
    assert_eq!(output.data, json!({}));
    assert_eq!(
        super::runtime::ldexp(1e-300, 1100),
        1e-300 * 2f64.powi(1000) * 2f64.powi(100)
    );
    assert_eq!(super::runtime::ldexp(3.0, -2), 0.75);
}

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The shipped example module (examples/wasm-scheduler) and the Lua scheduler it was written
/// after (benches/placement) give the same schedule and log on the same input.
#[test]
fn the_example_module_schedules_as_its_lua_twin() {
    let wasm = std::fs::read(repo("examples/wasm-scheduler/scheduler/v1/scheduler.wasm")).unwrap();
    let lua = crate::schedule::lua::Sandbox::load(
        &repo("benches/placement/scheduler/v1"),
        "scheduler/v1",
        crate::schedule::lua::Limits::default(),
    )
    .unwrap();
    // A debug build interprets some 50 times slower than a release one.
    let generous = WasmLimits {
        memory: 256 << 20,
        time: Duration::from_secs(60),
    };
    let mut module = WasmRun::from_bytes("scheduler.wasm", &wasm, generous).unwrap();
    for (peers, roles) in [(0, 1), (3, 10), (20, 30)] {
        let input = input_with(peers, roles);
        let expected = lua.run(&input).unwrap();
        let got = module.run(&input).unwrap();
        assert_eq!(got.log, expected.log, "{peers} peers, {roles} roles");
        assert_eq!(got.data, expected.data, "{peers} peers, {roles} roles");
        // The same hash, so a follower of either accepts the other's schedule.
        let a = Schedule::from_data(got.data, input.now, input.current_id.clone());
        let b = Schedule::from_data(expected.data, input.now, input.current_id.clone());
        assert_eq!(a.hash, b.hash);
    }
    assert!(
        lua.run(&input_with(20, 30))
            .unwrap()
            .log
            .contains("placed 30 roles over 21 nodes"),
        "the comparison must cover real placements"
    );
}

#[test]
fn a_config_dir_with_scheduler_wasm_runs_it_instead_of_main_lua() {
    let dir = tempfile::tempdir().unwrap();
    let sched = dir.path().join("scheduler/v1");
    std::fs::create_dir_all(&sched).unwrap();
    std::fs::write(
        sched.join("main.lua"),
        r#"return {scheduler = function() return '{"from": "lua"}', "" end}"#,
    )
    .unwrap();
    let lua =
        LuaScheduler::start(dir.path().into(), crate::schedule::lua::Limits::default()).unwrap();
    let wasm = WasmScheduler::start(dir.path().into(), limits()).unwrap();
    let scheduler = ConfigDirScheduler::new(dir.path().into(), lua, wasm);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let input = Arc::new(small_input());
    let first = runtime.block_on(scheduler.run("a", input.clone())).unwrap();
    assert_eq!(first.data, json!({"from": "lua"}));

    std::fs::write(
        sched.join(SCHEDULER_WASM),
        module("", OK_RESULT, "(i32.const 16)"),
    )
    .unwrap();
    let second = runtime.block_on(scheduler.run("b", input.clone())).unwrap();
    assert_eq!(second.log, "hello");

    // A new module version is loaded; a broken one fails with its error and the next good
    // version runs again.
    std::fs::write(sched.join(SCHEDULER_WASM), module("", "", "unreachable")).unwrap();
    let third = runtime
        .block_on(scheduler.run("c", input.clone()))
        .unwrap_err();
    assert_eq!(third.kind, SchedulerFailure::Runtime);
    assert!(
        third
            .message
            .starts_with("scheduler/v1/scheduler.wasm: scheduler failed")
    );
    std::fs::write(sched.join(SCHEDULER_WASM), b"garbage").unwrap();
    let fourth = runtime
        .block_on(scheduler.run("d", input.clone()))
        .unwrap_err();
    assert_eq!(fourth.kind, SchedulerFailure::Load);
    std::fs::write(
        sched.join(SCHEDULER_WASM),
        module("", OK_RESULT, "(i32.const 16)"),
    )
    .unwrap();
    assert!(runtime.block_on(scheduler.run("e", input)).is_ok());
}

/// A config dir whose `scheduler.wasm` is `bytes`.
fn wasm_dir(bytes: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let sched = dir.path().join("scheduler/v1");
    std::fs::create_dir_all(&sched).unwrap();
    std::fs::write(sched.join(SCHEDULER_WASM), bytes).unwrap();
    dir
}

#[tokio::test]
async fn a_held_run_stops_the_watchdog_pings_until_the_thread_is_free() {
    use verwalter_controllers::machinery::watchdog::Verdict;
    let dir = wasm_dir(&module("", OK_RESULT, "(i32.const 16)"));
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = std::sync::Mutex::new(held);
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    // The first run holds the thread until released, as a call the fuel cannot stop would.
    let hook: BeforeRun = Arc::new(move || {
        if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            held.lock().unwrap().recv().unwrap();
        }
    });
    let records = Progress::watched(Duration::from_secs(1));
    let scheduler = WasmScheduler::start_with(
        dir.path().into(),
        WasmLimits {
            time: Duration::from_millis(50),
            ..limits()
        },
        Duration::from_millis(50),
        Some(hook),
    )
    .unwrap()
    .watched(&records);
    let input = Arc::new(small_input());

    let e = scheduler.run("v1", input.clone()).await.unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Timeout);
    assert!(e.message.contains("did not return within"), "{}", e.message);
    // Still held: within its limit it is no stall, past budget, grace and margin it is.
    let now = tokio::time::Instant::now();
    assert_eq!(records.verdict(now), Verdict::Alive);
    let stall = match records.verdict(now + progress::MARGIN + Duration::from_secs(1)) {
        Verdict::Stalled(stall) => stall,
        alive => panic!("{alive:?}"),
    };
    assert_eq!(
        (stall.controller, stall.key.as_deref()),
        ("wasm scheduler thread", Some("run"))
    );
    assert_eq!(stall.limit, Duration::from_millis(100) + progress::MARGIN);

    // While it is held, the next runs are refused at once, as the Lua scheduler's are: no run
    // reaches the thread.
    let e = scheduler.run("v1", input.clone()).await.unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Timeout);
    assert!(
        e.message.starts_with("the wasm scheduler is stuck"),
        "{}",
        e.message
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Released, the thread takes the next run once it is free; by the time its result is out,
    // neither run is on the records.
    release.send(()).unwrap();
    let scheduler = WasmScheduler {
        thread: scheduler.thread.with_grace(Duration::from_secs(30)),
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let out = loop {
        match scheduler.run("v1", input.clone()).await {
            Ok(out) => break out,
            Err(e) if e.message.starts_with("the wasm scheduler is stuck") => {
                assert!(std::time::Instant::now() < deadline, "never freed");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("{}", e.message),
        }
    };
    assert_eq!(out.log, "hello");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(
        records.verdict(tokio::time::Instant::now() + Duration::from_secs(3600)),
        Verdict::Alive
    );
}

#[tokio::test]
async fn a_looping_module_stopped_by_its_budget_leaves_no_stall() {
    use verwalter_controllers::machinery::watchdog::Verdict;
    let dir = wasm_dir(&module(
        "",
        "",
        "(loop $forever (br $forever)) (i32.const 0)",
    ));
    let records = Progress::watched(Duration::from_secs(1));
    let scheduler = WasmScheduler::start(dir.path().into(), limits())
        .unwrap()
        .watched(&records);
    let e = scheduler
        .run("v1", Arc::new(small_input()))
        .await
        .unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Timeout, "{e:?}");
    assert!(e.message.contains("time budget"), "{}", e.message);
    assert_eq!(
        records.verdict(tokio::time::Instant::now() + Duration::from_secs(3600)),
        Verdict::Alive
    );
}

/// A query.wasm whose entry points return `init_result`, `render_result` and `query_result`
/// (JSON text at fixed addresses).
pub(crate) fn query_module(init_result: &str, render_result: &str, query_result: &str) -> Vec<u8> {
    query_module_with(
        init_result,
        render_result,
        query_result,
        "",
        "(i32.const 4096)",
    )
}

/// A query module with fixed `init` and `render_roles` answers whose `query` runs `query_body`
/// (the result is where its answer starts: `query_result` at 4096, or in `extra_data`).
fn query_module_with(
    init_result: &str,
    render_result: &str,
    query_result: &str,
    extra_data: &str,
    query_body: &str,
) -> Vec<u8> {
    let text = format!(
        r#"(module
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 8192))
  (global $queries (mut i32) (i32.const 0))
  (data (i32.const 16) "{init_result}")
  (data (i32.const 1024) "{render_result}")
  (data (i32.const 4096) "{query_result}")
  {extra_data}
  {BUMP_ALLOC}
  (func (export "init") (param i32 i32) (result i32) (i32.const 16))
  (func (export "render_roles") (param i32 i32) (result i32) (i32.const 1024))
  (func (export "query") (param i32 i32) (result i32) {query_body}))"#
    );
    wat::parse_str(text).unwrap()
}

#[test]
fn a_query_the_module_refuses_keeps_its_instance_and_a_failed_call_does_not() {
    // `query` refuses every call; the first on an instance says "first", later ones "again".
    let bytes = query_module_with(
        r#"{\"Ok\": null}"#,
        r#"{\"Ok\": {}}"#,
        r#"{\"Err\": {\"kind\": \"UnknownPath\", \"message\": \"first\"}}"#,
        r#"(data (i32.const 6000) "{\"Err\": {\"kind\": \"UnknownPath\", \"message\": \"again\"}}")"#,
        "(if (result i32) (global.get $queries) (then (i32.const 6000)) \
         (else (global.set $queries (i32.const 1)) (i32.const 4096)))",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(QUERY_WASM), &bytes).unwrap();
    let hook = super::query::QueryHook::new(dir.path().to_path_buf(), limits());
    let ask = || {
        let error = hook
            .with_module(&schedule(), "alpha", |m| m.query("x", &json!({})))
            .unwrap_err();
        assert!(error.answered, "{error:?}");
        error.message
    };
    let said = |word: &str| format!("scheduler/v1/query.wasm: query: UnknownPath: {word}");
    assert_eq!(ask(), said("first"));
    assert_eq!(ask(), said("again"), "the refusal dropped the instance");
    assert_eq!(ask(), said("again"));
    // A call that failed (a trap, the budget, output that is no envelope) drops the instance:
    // the next call gets a fresh one.
    let failed = hook.with_module(&schedule(), "alpha", |_| {
        Err::<(), _>(super::query::QueryError {
            message: "trapped".into(),
            answered: false,
        })
    });
    assert!(failed.is_err());
    assert_eq!(ask(), said("first"));
}

fn schedule() -> Schedule {
    Schedule::new(json!({"roles": {"web": {}}}), 1, "ab".into())
}

#[test]
fn query_wasm_answers_through_ok_envelopes() {
    let bytes = query_module(
        r#"{\"Ok\": null}"#,
        r#"{\"Ok\": {\"web\": {\"template\": \"web/v1\", \"port\": 80}}}"#,
        r#"{\"Ok\": {\"answer\": 42}}"#,
    );
    let mut module = QueryModule::from_bytes("query.wasm", &bytes, limits()).unwrap();
    module.init(&schedule(), "alpha").unwrap();
    let roles = module.render_roles("dep1", None).unwrap();
    assert_eq!(roles["web"], json!({"template": "web/v1", "port": 80}));
    assert_eq!(
        module.query("x/y", &json!({"q": 1})).unwrap(),
        json!({"answer": 42})
    );
}

#[test]
fn query_wasm_errors_say_what_failed() {
    let bytes = query_module(
        r#"{\"Err\": {\"kind\": \"Deserialize\", \"message\": \"bad schedule\", \"causes\": [\"missing field\"]}}"#,
        r#"{\"Ok\": [1]}"#,
        r#"{\"Oops\": 1}"#,
    );
    let mut module = QueryModule::from_bytes("query.wasm", &bytes, limits()).unwrap();
    let error = module.init(&schedule(), "alpha").unwrap_err();
    assert_eq!(
        error.message,
        "query.wasm: init: Deserialize: bad schedule: missing field"
    );
    let error = module.render_roles("dep1", None).unwrap_err();
    assert!(
        error.message.contains("not an object of roles"),
        "{}",
        error.message
    );
    let error = module.query("x", &json!(null)).unwrap_err();
    assert!(error.message.contains("not {\"Ok\""), "{}", error.message);
    // A scheduler module is not a query module.
    let scheduler = module_bytes_without_query_exports();
    let error = QueryModule::from_bytes("query.wasm", &scheduler, limits()).unwrap_err();
    assert!(
        error
            .message
            .contains("does not export `init`, `render_roles`, `query`"),
        "{}",
        error.message
    );
}

fn module_bytes_without_query_exports() -> Vec<u8> {
    module("", OK_RESULT, "(i32.const 16)")
}

#[test]
fn envelopes_unwrap() {
    assert_eq!(unwrap_envelope(json!({"Ok": 1})), Ok(json!(1)));
    assert_eq!(
        unwrap_envelope(json!({"Err": {"kind": "Internal", "message": "m"}})),
        Err("Internal: m".into())
    );
    assert!(unwrap_envelope(json!({"Ok": 1, "Err": 2})).is_err());
    assert!(unwrap_envelope(json!([])).is_err());
}

#[test]
fn the_query_hook_derives_roles_off_the_runtime_and_reloads_a_changed_module() {
    use verwalter_controllers::machinery::ports::{RoleSource, RolesRequest};
    let dir = tempfile::tempdir().unwrap();
    let hook = super::query::QueryHook::new(dir.path().to_path_buf(), limits());
    let request = RolesRequest {
        schedule: schedule(),
        previous: None,
        host: "alpha".into(),
        deployment_id: "d1".into(),
    };
    // Without query.wasm the compat merge derives the roles: nothing to call.
    assert!(hook.roles(request.clone()).is_none());

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    std::fs::write(
        dir.path().join(QUERY_WASM),
        query_module(
            r#"{\"Err\": {\"kind\": \"InitError\", \"message\": \"no cluster\"}}"#,
            r#"{\"Ok\": {}}"#,
            r#"{\"Ok\": 1}"#,
        ),
    )
    .unwrap();
    let error = runtime
        .block_on(hook.roles(request.clone()).unwrap())
        .unwrap_err();
    assert_eq!(
        error.0,
        "scheduler/v1/query.wasm: init: InitError: no cluster"
    );
    // A changed file is compiled again on the next call.
    std::fs::write(
        dir.path().join(QUERY_WASM),
        query_module(
            r#"{\"Ok\": null}"#,
            r#"{\"Ok\": {\"web\": {\"template\": \"web/v1\"}}}"#,
            r#"{\"Ok\": 2}"#,
        ),
    )
    .unwrap();
    let roles = runtime.block_on(hook.roles(request).unwrap()).unwrap();
    assert_eq!(Value::Object(roles), json!({"web": {"template": "web/v1"}}));
    // `/v1/query` shares the instance.
    let answer = hook.with_module(&schedule(), "alpha", |m| m.query("x", &json!({})));
    assert_eq!(answer.unwrap(), json!(2));
}

#[test]
fn a_table_grow_short_of_fuel_fails_instead_of_running_again() {
    // wasmi 2.0 cannot resume a `table.grow` that ran out of fuel at its place: resumed, the
    // function ran again from its start. The module counts its runs in `$dirty`: a second pass
    // would trap at `unreachable`. 16,000,000 elements cost a slice's worth of fuel, more than is
    // left of it after the call began.
    let big = WasmLimits {
        memory: 256 << 20,
        time: Duration::from_secs(10),
    };
    let body = r#"(global.set $dirty (i32.add (global.get $dirty) (i32.const 1)))
    (if (i32.ne (global.get $dirty) (i32.const 1)) (then unreachable))
    (drop (table.grow $t (ref.null func) (i32.const 16000000)))
    (i32.const 16)"#;
    let bytes = module("(table $t 0 funcref)", OK_RESULT, body);
    let error = WasmRun::from_bytes("scheduler.wasm", &bytes, big)
        .unwrap()
        .run(&small_input())
        .unwrap_err();
    assert_eq!(error.kind, SchedulerFailure::Memory, "{error:?}");
    assert!(
        error
            .message
            .contains("scheduler failed: a table.grow needing 1000000 fuel ran out of the fuel"),
        "{}",
        error.message
    );
}
