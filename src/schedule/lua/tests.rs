//! The scheduler contract and the sandbox, on real files in a temp dir.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use verwalter_controllers::machinery::watchdog as progress;
use verwalter_controllers::state::{Peer, ScheduleStamp};

use super::*;

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn input() -> SchedulerInput {
    let peer = Peer {
        id: "77985419c732412ea38b94db00000002".into(),
        addr: None,
        name: "beta.example.com".into(),
        hostname: "beta".into(),
        schedule: Some(ScheduleStamp {
            timestamp: 5,
            hash: "ab".into(),
            origin: "cd".into(),
        }),
        known_since: 1,
        last_report_direct: None,
        errors: 0,
    };
    SchedulerInput {
        now: 1_533_912_710_123,
        current_host: "alpha".into(),
        current_id: "77985419c732412ea38b94db00000001".into(),
        parents: vec![Arc::new(json!({"state": {"x": 1}}))],
        actions: BTreeMap::from([(1_533_912_710_000, json!({"button": {"role": "app"}}))]),
        runtime: Arc::new(json!({"app": {"v1": {"n": 2, "gone": null}}})),
        peers: BTreeMap::from([(peer.id.clone(), peer)]),
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

/// Loads `main` (plus extra files) and runs it once.
fn run_main(main: &str, extra: &[(&str, &str)]) -> Result<SchedulerOutput, SchedulerError> {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "main.lua", main);
    for (rel, text) in extra {
        write(tmp.path(), rel, text);
    }
    Sandbox::load(tmp.path(), "scheduler/v1", small())?.run(&input())
}

fn run_body(body: &str) -> Result<SchedulerOutput, SchedulerError> {
    run_main(
        &format!("return {{ scheduler = function(state)\n{body}\nend }}"),
        &[],
    )
}

fn err(body: &str) -> SchedulerError {
    eprintln!("case: {body}");
    run_body(body).expect_err("the run must fail")
}

/// Like [`err`] for runs that must fail for memory: the same 32 MiB as [`small`], with a time
/// budget a loaded test machine cannot exhaust before the memory cap is reached.
fn memory_err(body: &str) -> SchedulerError {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "main.lua",
        &format!("return {{ scheduler = function(state)\n{body}\nend }}"),
    );
    let limits = Limits {
        time: Duration::from_secs(30),
        ..small()
    };
    Sandbox::load(tmp.path(), "scheduler/v1", limits)
        .unwrap()
        .run(&input())
        .expect_err("the run must fail")
}

#[test]
fn string_return_is_parsed_json_and_log() {
    let out = run_body(r#"return '{"roles": {"web": {"n": 1}}}', "made a schedule""#).unwrap();
    assert_eq!(out.data, json!({"roles": {"web": {"n": 1}}}));
    assert_eq!(out.log, "made a schedule");
}

#[test]
fn table_return_is_converted() {
    let out = run_body(
        r#"print("hello", 1)
           return {roles = {web = {n = 1, list = {1, 2.5, "x"}, empty = {}}}, nodes = {["a-b"] = {[1] = true, [3] = false}}}"#,
    )
    .unwrap();
    assert_eq!(
        out.data,
        json!({"roles": {"web": {"n": 1, "list": [1, 2.5, "x"], "empty": {}}}, "nodes": {"a-b": {"1": true, "3": false}}})
    );
    assert_eq!(out.log, "hello\t1\n", "print goes to the scheduler log");
}

#[test]
fn a_returned_table_becomes_the_canonical_text_without_a_tree() {
    let out = run_body(
        r#"return {vars = {b = 0.1, a = -0.0, big = 1e300, n = math.mininteger}, ["é\n"] = {"q\"", {}}}"#,
    )
    .unwrap();
    assert!(
        !out.data.is_parsed(),
        "written straight from Lua: no tree made"
    );
    assert_eq!(
        out.data.canonical(),
        r#"{"vars":{"a":-0.0,"b":0.1,"big":1e+300,"n":-9223372036854775808},"é\n":["q\"",{}]}"#
    );
    // A table the writer declines goes the tree's way, which names the problem.
    let e = run_body("return {nodes = {a = {f = print}}}").unwrap_err();
    assert_eq!(
        e.message,
        "cannot convert the returned table: nodes.a.f is a function, which JSON cannot represent"
    );
    let e = run_body("return {1, 2}").unwrap_err();
    assert_eq!(
        e.message,
        "the schedule must be a JSON object, got an array"
    );
}

/// `after_run` makes the tree of a run's schedule off the run's wait, but not again for a run
/// that returns the same text as the last one parsed (a rerun with nothing changed); a changed
/// schedule is parsed, and so is the earlier text when it comes back.
#[test]
fn after_run_parses_a_schedule_only_when_its_text_changed() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        &format!("{SCHEDULER_DIR}/main.lua"),
        "return { scheduler = function(state) return {n = state.runtime.n} end }",
    );
    let mut engine = LuaEngine {
        config_dir: tmp.path().to_path_buf(),
        limits: small(),
        loaded: None,
        made: None,
        parsed: None,
    };
    let mut run = |n: u64| {
        let mut input = input();
        input.runtime = Arc::new(json!({"n": n}));
        let out = engine.run("v", &input).unwrap();
        assert!(!out.data.is_parsed(), "no tree on the run's path");
        engine.after_run();
        out.data.is_parsed()
    };
    assert!(run(1), "the first schedule is parsed");
    assert!(!run(1), "the same text again is not");
    assert!(!run(1));
    assert!(run(2), "a changed schedule is");
    assert!(!run(2));
    assert!(run(1), "and the earlier one when it comes back");
}

#[test]
fn nested_require_passes_the_module_name() {
    let out = run_main(
        r#"local a = require "lib/a"
           local again = require "lib/a"
           return { scheduler = function(s) return {a = a, same = (a == again), dotted = require "b.lua"} end }"#,
        &[
            ("lib/a.lua", "local name = ...\nlocal b = require 'lib/b'\nreturn {name = name, b = b}"),
            ("lib/b.lua", "return (...) .. '!'"),
            ("b.lua", "return 'by extension'"),
        ],
    )
    .unwrap();
    assert_eq!(
        out.data,
        json!({"a": {"name": "lib/a", "b": "lib/b!"}, "same": true, "dotted": "by extension"})
    );
}

#[test]
fn require_stays_inside_the_scheduler_dir() {
    let e = run_main("require '../../etc/passwd'\nreturn {}", &[]).unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Load);
    assert!(
        e.message
            .contains("relative path inside the scheduler directory"),
        "{}",
        e.message
    );
    let e = run_main("require '/etc/passwd'\nreturn {}", &[]).unwrap_err();
    assert!(e.message.contains("relative path inside"), "{}", e.message);
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "secret.lua", "return 'leaked'");
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "main.lua",
        "return {scheduler = function() return {v = require 'link'} end}",
    );
    std::os::unix::fs::symlink(
        outside.path().join("secret.lua"),
        tmp.path().join("link.lua"),
    )
    .unwrap();
    let e = Sandbox::load(tmp.path(), "scheduler/v1", small())
        .unwrap()
        .run(&input())
        .unwrap_err();
    let real_secret = outside.path().canonicalize().unwrap().join("secret.lua");
    assert!(
        e.message.contains(&format!(
            "module \"link\" refused: scheduler/v1/link.lua: symlink to {}, outside ",
            real_secret.display()
        )),
        "{}",
        e.message
    );
    let e = run_main("require 'missing'\nreturn {}", &[]).unwrap_err();
    assert!(
        e.message.contains("module \"missing\" not found"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("scheduler/v1/main.lua:1"),
        "names the requiring line: {}",
        e.message
    );
}

#[test]
fn code_reached_through_symlinks_must_stay_inside_the_config_dir() {
    // Issue 10: `require` checked only that a module led somewhere inside the scheduler dir's
    // real path, so `scheduler/v1` (or `scheduler/`) linked elsewhere let any file run as
    // scheduler code, and `main.lua` was not checked at all.
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "secret.lua", "return 'leaked'");
    write(
        outside.path(),
        "main.lua",
        "return {scheduler = function() return {v = 'outside'} end}",
    );
    let real_outside = outside.path().canonicalize().unwrap();
    let config = tempfile::tempdir().unwrap();
    let real_config = config.path().canonicalize().unwrap();
    let dir = config.path().join("scheduler/v1");
    let load = || Sandbox::load_within(&dir, "scheduler/v1", config.path(), small());
    let run = || load().and_then(|s| s.run(&input()));
    let refused = |link: &str, target: &Path| {
        format!(
            "{link}: symlink to {}, outside {}; links may not leave it",
            target.display(),
            real_config.display()
        )
    };
    let set_module = |name: &str| {
        let main = format!(
            "NAME = {name:?}\nreturn {{scheduler = function() return {{v = require(NAME)}} end}}"
        );
        write(config.path(), "scheduler/v1/main.lua", &main);
    };

    // A link inside the config dir works, even out of scheduler/v1.
    set_module("common");
    write(config.path(), "shared/common.lua", "return 'shared'");
    symlink("../../shared/common.lua", dir.join("common.lua")).unwrap();
    assert_eq!(run().unwrap().data, json!({"v": "shared"}));

    // A module linked to a file outside, or through a linked dir, names the link and its target.
    symlink(real_outside.join("secret.lua"), dir.join("link.lua")).unwrap();
    set_module("link");
    let e = run().unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Runtime, "{}", e.message);
    assert!(
        e.message.starts_with(&format!(
            "scheduler/v1/main.lua:2: module \"link\" refused: {}",
            refused("scheduler/v1/link.lua", &real_outside.join("secret.lua"))
        )),
        "{}",
        e.message
    );
    symlink(outside.path(), dir.join("lib")).unwrap();
    set_module("lib/secret");
    let e = run().unwrap_err();
    assert!(
        e.message
            .contains(&refused("scheduler/v1/lib", &real_outside)),
        "{}",
        e.message
    );

    // main.lua itself, and the scheduler dir itself, are held to the same rule.
    fs::remove_file(dir.join("main.lua")).unwrap();
    symlink(real_outside.join("main.lua"), dir.join("main.lua")).unwrap();
    let e = load().unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Load);
    assert_eq!(
        e.message,
        refused("scheduler/v1/main.lua", &real_outside.join("main.lua"))
    );
    fs::remove_dir_all(config.path().join("scheduler")).unwrap();
    fs::create_dir(config.path().join("scheduler")).unwrap();
    symlink(outside.path(), &dir).unwrap();
    let e = load().unwrap_err();
    assert_eq!(e.message, refused("scheduler/v1", &real_outside));
}

#[test]
fn state_fields_and_types() {
    let out = run_body(
        r#"local t = {}
           t.now = math.type(state.now)
           t.host = state.current_host
           t.id = state.current_id
           t.parents = #state.parents
           t.parent_x = state.parents[1].state.x
           for id, action in pairs(state.actions) do t.action_key = math.type(id); t.action_id = id; t.role = action.button.role end
           t.runtime_n = state.runtime.app.v1.n
           t.null_is_nil = state.runtime.app.v1.gone == nil
           local n = 0
           for id, peer in pairs(state.peers) do n = n + 1; t.peer_host = peer.hostname; t.peer_addr_nil = peer.addr == nil; t.stamp = peer.schedule.hash end
           t.peers = n
           t.metrics = type(state.metrics)
           return t"#,
    )
    .unwrap();
    assert_eq!(
        out.data,
        json!({
            "now": "integer", "host": "alpha", "id": "77985419c732412ea38b94db00000001",
            "parents": 1, "parent_x": 1,
            "action_key": "integer", "action_id": 1_533_912_710_000u64, "role": "app",
            "runtime_n": 2, "null_is_nil": true,
            "peer_host": "beta", "peer_addr_nil": true, "stamp": "ab", "peers": 1,
            "metrics": "table",
        })
    );
}

#[test]
fn a_script_that_changes_its_peers_cannot_affect_the_next_run() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "main.lua",
        r#"return {scheduler = function(state)
               local seen
               for id, peer in pairs(state.peers) do seen = peer.hostname; peer.hostname = "changed"; peer.extra = {1} end
               state.peers["new"] = {hostname = "injected"}
               return {seen = seen}
           end}"#,
    );
    let sandbox = Sandbox::load(tmp.path(), "scheduler/v1", small()).unwrap();
    for _ in 0..3 {
        assert_eq!(
            sandbox.run(&input()).unwrap().data,
            json!({"seen": "beta"}),
            "without a check in between"
        );
    }
    for _ in 0..3 {
        assert_eq!(
            sandbox.run(&input()).unwrap().data,
            json!({"seen": "beta"}),
            "with checks in between"
        );
        sandbox.after_run();
    }
    // An unchanged table is reused and still gives the same input.
    write(
        tmp.path(),
        "main.lua",
        "return {scheduler = function(state) local n = 0 for _ in pairs(state.peers) do n = n + 1 end return {n = n, h = state.peers['77985419c732412ea38b94db00000002'].hostname} end}",
    );
    let sandbox = Sandbox::load(tmp.path(), "scheduler/v1", small()).unwrap();
    for _ in 0..3 {
        assert_eq!(
            sandbox.run(&input()).unwrap().data,
            json!({"n": 1, "h": "beta"})
        );
        sandbox.after_run();
    }
    let mut other = input();
    other
        .peers
        .values_mut()
        .for_each(|p| p.hostname = "gamma".into());
    assert_eq!(
        sandbox.run(&other).unwrap().data,
        json!({"n": 1, "h": "gamma"}),
        "new peers, new table"
    );
}

#[test]
fn a_script_that_changes_its_runtime_cannot_affect_the_next_run() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "main.lua",
        r#"return {scheduler = function(state)
               local seen = state.runtime.app.v1.n
               state.runtime.app.v1.n = 99
               state.runtime.app.v2 = {n = 1}
               state.runtime.injected = true
               return {seen = seen, injected = state.runtime.injected ~= nil}
           end}"#,
    );
    let sandbox = Sandbox::load(tmp.path(), "scheduler/v1", small()).unwrap();
    // A runtime without nulls reads back the same, so its table is reused when unmodified.
    let mut clean = input();
    clean.runtime = Arc::new(json!({"app": {"v1": {"n": 2}}}));
    for _ in 0..3 {
        assert_eq!(
            sandbox.run(&clean).unwrap().data,
            json!({"seen": 2, "injected": true}),
            "with checks in between"
        );
        sandbox.after_run();
    }
    // Unmodified, the reused table gives the same input; a new tree gives a new table.
    write(
        tmp.path(),
        "main.lua",
        "return {scheduler = function(state) return {n = state.runtime.app.v1.n} end}",
    );
    let sandbox = Sandbox::load(tmp.path(), "scheduler/v1", small()).unwrap();
    for _ in 0..3 {
        assert_eq!(sandbox.run(&clean).unwrap().data, json!({"n": 2}));
        sandbox.after_run();
    }
    let mut other = clean.clone();
    other.runtime = Arc::new(json!({"app": {"v1": {"n": 3}}}));
    assert_eq!(
        sandbox.run(&other).unwrap().data,
        json!({"n": 3}),
        "new runtime, new table"
    );
}

#[test]
fn bad_outputs_are_reported() {
    assert_eq!(err("return nil").kind, SchedulerFailure::BadOutput);
    assert!(
        err("return '[1,2]', ''")
            .message
            .contains("must be a JSON object, got an array")
    );
    assert!(err("return '{bad', ''").message.contains("invalid JSON"));
    assert!(
        err("return {}, {}")
            .message
            .contains("(the log) must be a string")
    );
    assert!(
        err("return {f = print}")
            .message
            .contains("f is a function")
    );
    let e = err("local t = {}; t.self = t; return t");
    assert!(e.message.contains("nested too deep"), "{}", e.message);
    // 100 tables in the schedule are fine; a schedule nested deeper than followers can read is
    // refused where it is made.
    let nest =
        |n: usize| format!("local t = {{}} for i = 1, {n} do t = {{t}} end return {{t = t}}");
    let e = err(&nest(101));
    assert!(e.message.contains("more than 100 tables"), "{}", e.message);
    let deep = run_body(&format!("{}, ''", nest(99))).unwrap();
    let schedule = verwalter_controllers::state::Schedule::from_data(deep.data, 1, "ab".repeat(16));
    let mut body = Vec::new();
    schedule.write_json(&mut body);
    let read: verwalter_controllers::state::Schedule = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        read, schedule,
        "a follower reads the deepest schedule a leader makes"
    );
    let e = run_main("return 42", &[]).unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Load);
    assert!(
        e.message
            .contains("must return a table with a `scheduler` function")
    );
}

#[test]
fn lua_errors_name_file_and_line() {
    let e = err("local x = 1\nerror('no nodes for role web')");
    assert_eq!(e.kind, SchedulerFailure::Runtime);
    assert!(
        e.message
            .contains("scheduler/v1/main.lua:3: no nodes for role web"),
        "{}",
        e.message
    );
    let e = run_main("return {scheduler = function( end}", &[]).unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Load);
    assert!(
        e.message.contains("scheduler/v1/main.lua:1"),
        "{}",
        e.message
    );
    let e = run_main(
        "return {scheduler = function() return require('m').f() end}",
        &[("m.lua", "return {f = function()\n  return nil + 1\nend}")],
    )
    .unwrap_err();
    assert!(e.message.contains("scheduler/v1/m.lua:2"), "{}", e.message);
}

#[test]
fn sandbox_has_no_way_out() {
    for (body, expected) in [
        ("os.execute('touch /tmp/pwned')", "global 'os'"),
        ("io.open('/etc/passwd')", "global 'io'"),
        ("dofile('/etc/passwd')", "global 'dofile'"),
        ("loadfile('/etc/passwd')", "global 'loadfile'"),
        ("package.loadlib('libc.so.6', 'system')", "global 'package'"),
        ("debug.sethook(print, '', 1)", "field 'sethook'"),
        ("debug.getregistry()", "field 'getregistry'"),
        ("string.dump(function() end)", "field 'dump'"),
        ("(''):dump()", "method 'dump'"),
        ("coroutine.wrap(print)", "global 'coroutine'"),
    ] {
        let e = err(body);
        assert_eq!(e.kind, SchedulerFailure::Runtime, "{body}");
        assert!(e.message.contains(expected), "{body}: {}", e.message);
    }
    // Binary chunks cannot be loaded, even handed over as text.
    let e = err(r#"local f, msg = load("\27Lua\84\0\25\147\13\10\26\10", "x", "b"); error(msg)"#);
    assert!(
        e.message.contains("attempt to load a binary chunk"),
        "{}",
        e.message
    );
    // Text chunks still load, with or without an environment.
    let out = run_body("local f = load('return 1 + 1'); local g = load('return x', 'c', 't', {x = 5}); return {a = f(), b = g()}").unwrap();
    assert_eq!(out.data, json!({"a": 2, "b": 5}));
    // traceback is there.
    let out = run_body("return {tb = debug.traceback('here')}").unwrap();
    assert!(
        out.data.tree()["tb"]
            .as_str()
            .unwrap()
            .starts_with("here\nstack traceback:")
    );
    assert!(!Path::new("/tmp/pwned").exists());
}

#[test]
fn endless_loop_hits_the_time_budget_even_under_pcall() {
    let e = err("while true do end");
    assert_eq!(e.kind, SchedulerFailure::Timeout);
    assert!(e.message.contains("time budget"), "{}", e.message);
    let e = err("while true do pcall(function() while true do end end) end");
    assert_eq!(e.kind, SchedulerFailure::Timeout);
    let e = err(
        "while true do xpcall(function() while true do end end, function(m) while true do end end) end",
    );
    assert_eq!(e.kind, SchedulerFailure::Timeout);
    // Finalizers run with hooks off, so the sandbox refuses them.
    let e = err("setmetatable({}, {__gc = function() while true do end end}); collectgarbage()");
    assert!(e.message.contains("__gc"), "{}", e.message);
    let e = run_main("while true do end", &[]).unwrap_err();
    assert_eq!(
        e.kind,
        SchedulerFailure::Timeout,
        "the budget applies to loading main.lua too"
    );
}

#[test]
fn memory_bomb_hits_the_cap() {
    let e = memory_err("local t = {} for i = 1, 1e9 do t[i] = i end");
    assert_eq!(e.kind, SchedulerFailure::Memory, "{}", e.message);
    let e = memory_err("local s = 'x' while true do s = s .. s end");
    assert_eq!(e.kind, SchedulerFailure::Memory, "{}", e.message);
    let e = memory_err("return string.rep('x', 1 << 30)");
    assert_eq!(e.kind, SchedulerFailure::Memory, "{}", e.message);
}

#[tokio::test]
async fn the_thread_survives_failures_and_reloads_on_code_change() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("scheduler/v1");
    write(
        &dir,
        "main.lua",
        "return {scheduler = function() while true do end end}",
    );
    let scheduler = LuaScheduler::start(tmp.path().to_path_buf(), small()).unwrap();
    let e = scheduler.run("v1", Arc::new(input())).await.unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Timeout);
    write(
        &dir,
        "main.lua",
        "return {scheduler = function(s) return {host = s.current_host} end}",
    );
    // Same version string: the poisoned state was dropped, so the new code is loaded anyway.
    let out = scheduler.run("v1", Arc::new(input())).await.unwrap();
    assert_eq!(out.data, json!({"host": "alpha"}));
    write(
        &dir,
        "main.lua",
        "return {scheduler = function(s) return {v = 2} end}",
    );
    let out = scheduler.run("v1", Arc::new(input())).await.unwrap();
    assert_eq!(
        out.data,
        json!({"host": "alpha"}),
        "same version: the loaded code is kept"
    );
    let out = scheduler.run("v2", Arc::new(input())).await.unwrap();
    assert_eq!(out.data, json!({"v": 2}));
}

#[tokio::test]
async fn the_thread_parses_a_schedules_tree_after_handing_over_its_text() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        &tmp.path().join("scheduler/v1"),
        "main.lua",
        "return {scheduler = function(s) return {host = s.current_host} end}",
    );
    let scheduler = LuaScheduler::start(tmp.path().to_path_buf(), small()).unwrap();
    let first = scheduler.run("v1", Arc::new(input())).await.unwrap();
    // The thread takes the next run only after the last one's after-run work.
    let second = scheduler.run("v1", Arc::new(input())).await.unwrap();
    assert!(first.data.is_parsed(), "parsed on the thread after the run");
    assert_eq!(first.data, json!({"host": "alpha"}));
    assert_eq!(second.data.canonical(), r#"{"host":"alpha"}"#);
}

#[test]
fn a_result_sharing_one_table_many_times_is_stopped_at_the_memory_limit() {
    // Issue 10: 20,000 references to a 100,000-element table made the conversion allocate until
    // the daemon aborted. Scaled down, it still converts to ~100 MB of JSON values while the Lua
    // state holds well under 1 MB of it: past the 32 MiB limit of `small()`.
    let e = memory_err(
        "local big = {} for i = 1, 10000 do big[i] = i end
         local many = {} for i = 1, 300 do many[i] = big end
         return {roles = {web = many}}",
    );
    assert_eq!(e.kind, SchedulerFailure::Memory, "{}", e.message);
    assert!(
        e.message
            .contains("the returned table converts to more than 32 MiB of JSON"),
        "{}",
        e.message
    );
    // The same shape under the limit is converted as before.
    let out = run_body(
        "local small = {1, 2} local many = {} for i = 1, 3 do many[i] = small end return {m = many}",
    )
    .unwrap();
    assert_eq!(out.data, json!({"m": [[1, 2], [1, 2], [1, 2]]}));
}

#[test]
fn a_json_string_that_parses_past_the_memory_limit_is_stopped() {
    // Issue 10: a returned JSON string was parsed without a meter. 2 million empty arrays are a
    // 6 MB string, well inside a 32 MiB limit, but over 60 MB of JSON values. The time budget is
    // generous so that a slow machine cannot turn the memory error into a timeout.
    let limits = Limits {
        memory: 32 * 1024 * 1024,
        time: Duration::from_secs(30),
    };
    let run = |returned: &str| {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "main.lua",
            &format!("return {{scheduler = function() return {returned} end}}"),
        );
        Sandbox::load(tmp.path(), "scheduler/v1", limits)
            .unwrap()
            .run(&input())
    };
    let e = run(r#"'{"a": [' .. string.rep('[],', 2000000) .. '[]]}'"#).unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Memory, "{}", e.message);
    assert_eq!(
        e.message,
        "scheduler ran out of its memory limit: the returned JSON text parses to more than 32 MiB of JSON values"
    );
    // The same text, smaller, parses as before; so does a text of big strings under the limit.
    let out = run(r#"'{"a": [' .. string.rep('[],', 1000) .. '[]]}'"#).unwrap();
    assert_eq!(out.data.tree()["a"].as_array().unwrap().len(), 1001);
    let out = run(r#"'{"s": "' .. string.rep('x', 4000000) .. '"}'"#).unwrap();
    assert_eq!(out.data.tree()["s"].as_str().unwrap().len(), 4_000_000);
}

#[test]
fn the_metered_json_parse_agrees_with_serde_json_and_stops_at_the_deadline() {
    let ample = convert::Budget {
        bytes: usize::MAX,
        deadline: std::time::Instant::now() + Duration::from_secs(60),
    };
    for text in [
        r#"{"a": [1, -2, 3.5, 1e300, 18446744073709551615, -9223372036854775808], "b": null}"#,
        r#"{"s": "esc \" \\ \u00e9 \ud83d\ude00", "t": true, "f": false, "o": {}}"#,
        r#"{"dup": 1, "dup": 2, "nested": [[[{"x": [[]]}]]]}"#,
        r#"  [1, "two", {"3": [4]}]  "#,
    ] {
        assert_eq!(
            convert::parse_json_text(text, ample).unwrap(),
            serde_json::from_str::<Value>(text).unwrap(),
            "{text}"
        );
    }
    for bad in ["{bad", "{} {}", "[1,]", "", "[1e999]"] {
        let expected = serde_json::from_str::<Value>(bad).unwrap_err().to_string();
        match convert::parse_json_text(bad, ample) {
            Err(convert::ParseError::Invalid(e)) => assert_eq!(e.to_string(), expected, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    let text = format!("[{}[]]", "[],".repeat(100_000));
    let passed = convert::Budget {
        bytes: usize::MAX,
        deadline: std::time::Instant::now(),
    };
    assert!(matches!(
        convert::parse_json_text(&text, passed),
        Err(convert::ParseError::Timeout)
    ));
}

#[test]
fn converting_a_result_stops_at_the_deadline() {
    let lua = mlua::Lua::new();
    let table: mlua::Table = lua
        .load("local t = {} for i = 1, 100000 do t[i] = {i} end return t")
        .eval()
        .unwrap();
    let value = mlua::Value::Table(table);
    let passed = convert::Budget {
        bytes: usize::MAX,
        deadline: std::time::Instant::now(),
    };
    assert_eq!(
        convert::lua_to_json(&lua, &value, passed),
        Err(convert::ConvertError::Timeout)
    );
    let ample = convert::Budget {
        bytes: usize::MAX,
        deadline: std::time::Instant::now() + Duration::from_secs(60),
    };
    assert_eq!(
        convert::lua_to_json(&lua, &value, ample).unwrap()[99_999],
        json!([100_000])
    );
}

/// `body`'s table `x` is refused for two keys that become the same JSON key.
fn assert_key_clash(body: &str) {
    let e = err(body);
    assert_eq!(e.kind, SchedulerFailure::BadOutput, "{body}");
    assert!(
        e.message
            .starts_with("cannot convert the returned table: x has two keys that both become"),
        "{body}: {}",
        e.message
    );
}

#[test]
fn a_table_with_keys_1_and_string_1_is_an_error() {
    for body in [
        "return {x = {[1] = 'a', ['1'] = 'b'}}",
        "return {x = {[true] = 'a', ['true'] = 'b'}}",
        "return {x = {[2] = 'a', ['2'] = 'b', [5] = 'c'}}",
    ] {
        assert_key_clash(body);
    }
}

#[test]
fn a_large_table_converts_whole_and_its_clashing_keys_are_caught() {
    // More keys than the conversion inserts one by one: the rest are sorted and merged.
    let out = run_body(
        "local t = {} for i = 1, 200 do t['k' .. i] = i; t[i * 1000] = -i end return {x = t}",
    )
    .unwrap();
    let mut want = serde_json::Map::new();
    for i in 1..=200i64 {
        want.insert(format!("k{i}"), json!(i));
        want.insert(format!("{}", i * 1000), json!(-i));
    }
    assert_eq!(out.data, json!({"x": want}));
    // A clash among the late keys, and one between a late key and an early one.
    for body in [
        "local t = {} for i = 1, 100 do t['k' .. i] = i end t[7000] = 1 t['7000'] = 2 return {x = t}",
        "local t = {['5'] = 0} for i = 1, 100 do t[i] = 'v' .. i; t['k' .. i] = i end return {x = t}",
    ] {
        assert_key_clash(body);
    }
}

#[test]
fn print_output_is_capped() {
    // Issue 10: print output was outside the memory cap (0.6 GB in 2 s). 10 MB of prints keep
    // the first 2 MiB and a marker; the run itself still succeeds.
    let out = run_body(
        "local line = string.rep('x', 100000)
         for i = 1, 100 do print(i, line) end
         return {ok = true}, 'returned log'",
    )
    .unwrap();
    assert_eq!(out.data, json!({"ok": true}));
    let printed = out.log.strip_suffix("returned log").unwrap();
    assert!(printed.starts_with("1\txxx"), "{}", &printed[..20]);
    assert!(
        printed.ends_with(sandbox::PRINT_TRUNCATED),
        "the marker ends it"
    );
    assert!(
        printed.len() <= sandbox::PRINT_LIMIT + sandbox::PRINT_TRUNCATED.len() + 1,
        "{}",
        printed.len()
    );
    assert_eq!(printed.matches("truncated").count(), 1);
}

#[test]
fn require_returns_the_loaded_libraries_and_loads_a_module_once() {
    // Issue 10: scheduler libraries begin modules with `local string = require "string"`.
    let out = run_main(
        r#"local string = require "string"
           local a = require "lib/a"
           local b = require "lib/b.lua"
           return { scheduler = function()
               return {
                   libs = require "_G" == _G and require "table" == table and require "math" == math
                       and require "utf8" == utf8 and require "debug" == debug and string == _G.string,
                   no_dump = string.dump == nil,
                   upper = string.upper("x"),
                   loads = loads, a = a, b = b,
               }
           end }"#,
        &[
            ("lib/a.lua", "local table = require 'table'\nlocal here = (...):match('(.-)[^/]+$')\nreturn table.concat({'a', require(here .. 'counted')}, '+')"),
            ("lib/b.lua", "return 'b+' .. require('lib/counted')"),
            ("lib/counted.lua", "loads = (loads or 0) + 1\nreturn 'counted'"),
        ],
    )
    .unwrap();
    assert_eq!(
        out.data,
        json!({"libs": true, "no_dump": true, "upper": "X", "loads": 1, "a": "a+counted", "b": "b+counted"})
    );
    // Libraries the sandbox leaves out are not there to require either.
    for name in ["os", "io", "coroutine", "package"] {
        let e = run_main(&format!("require '{name}'\nreturn {{}}"), &[]).unwrap_err();
        assert!(
            e.message.contains(&format!("module \"{name}\" not found")),
            "{name}: {}",
            e.message
        );
    }
}

/// Runs `cases` (Lua expressions) through a harness and returns one line per case: the
/// results' types and values, or the error message.
const PATTERN_HARNESS: &str = r#"
local function collect(iter)
    local out = {}
    while true do
        local v = table.pack(iter())
        if v[1] == nil then break end
        out[#out + 1] = table.concat(v, "|", 1, v.n)
    end
    return table.concat(out, " ")
end
local lines = {}
for i, case in ipairs(CASES) do
    local f = assert(load("local collect = ...; return " .. case, "=case"))
    local r = table.pack(pcall(f, collect))
    local parts = {}
    if r[1] then
        for j = 2, r.n do
            local v = r[j]
            parts[#parts + 1] = math.type(v) or type(v)
            if type(v) ~= "table" then parts[#parts + 1] = tostring(v) end
        end
    else
        parts[1] = "error: " .. tostring(r[2])
    end
    lines[i] = case .. " => " .. table.concat(parts, " ")
end
return table.concat(lines, "\n@@\n")
"#;

const PATTERN_CASES: &[&str] = &[
    r#"string.find("hello world", "o w")"#,
    r#"string.find("hello world", "o", 6)"#,
    r#"string.find("hello", "l+")"#,
    r#"string.find("hello", "^h(e)(l+)")"#,
    r#"string.find("hello", "^e")"#,
    r#"string.find("hello", "()ll()")"#,
    r#"string.find("hello", "", 10)"#,
    r#"string.find("hello", "", 6)"#,
    r#"string.find("hello", "", 0)"#,
    r#"string.find("hello", "xyz", -100)"#,
    r#"string.find("hello", "l", -2)"#,
    r#"string.find("a.b", ".", 1, true)"#,
    r#"string.find("a+b", "+", 1, true)"#,
    r#"string.find("a+b", "+", 1, false)"#,
    r#"string.find("a+b", "a+", 1, 0)"#,
    r#"string.find(12345, 34)"#,
    r#"string.find("x$", "$")"#,
    r#"string.find("x$", "x$")"#,
    r#"string.find("x$y", "$y")"#,
    r#"string.find("hello", "l", 1.0)"#,
    r#"string.find("hello", "l", 1.5)"#,
    r#"string.find("hello", "l", "2")"#,
    r#"string.find("hello", "l", {})"#,
    r#"string.find(nil, "x")"#,
    r#"string.find("x")"#,
    r#"("hello"):find("l")"#,
    r#"string.match("key = value", "^(%w+)%s*=%s*(%w+)$")"#,
    r#"string.match("  trim me  ", "^%s*(.-)%s*$")"#,
    r#"string.match("a [[x] y] b", "%b[]")"#,
    r#"string.match("a [x", "%b[]")"#,
    r#"string.match("THE (quick) fox", "%f[%a]%a+", 5)"#,
    r#"string.match("hello", "%f[%l]")"#,
    r#"string.match("abc", "((a)(b))")"#,
    r#"string.match("abcabc", "(abc)%1")"#,
    r#"string.match("abcab", "(abc)%1")"#,
    r#"string.match("aa", "()a%1")"#,
    r#"string.match("v1.10.2", "^v(%d+)%.(%d+)%.(%d+)$")"#,
    r#"string.match("x", "[]]")"#,
    r#"string.match("]", "[]]")"#,
    r#"string.match("^", "[^^]")"#,
    r#"string.match("a^", "[^^]")"#,
    r#"string.match("a-b", "[a%-]+")"#,
    r#"string.match("b-z", "[a-c-]+")"#,
    r#"string.match("hello", "[^l]+")"#,
    r#"string.match("Az09_", "[%w_]+")"#,
    r#"string.match("\v\t x", "%s+")"#,
    r#"string.match("\v", "%S")"#,
    r#"string.match("caf\195\169", "%a+")"#,
    r#"string.match("a.b,c;d", "%p")"#,
    r#"string.match("ab12", "%x+")"#,
    r#"string.match("AbC", "%u%l%u")"#,
    r#"string.match("\0\1", "%c+") == "\0\1""#,
    r#"string.match("x y", "%g+")"#,
    r#"string.match("xyz", "x?y?z?w?")"#,
    r#"string.match("xxx", "x-$")"#,
    r#"string.match("xxxy", "(x-)(x*)y")"#,
    r#"string.match("hello", ".-l")"#,
    r#"string.match("hello", "h.+o")"#,
    r#"string.match("hello", "", 3)"#,
    r#"string.match("hello", "()", 3)"#,
    r#"string.match("hello", "l", 10)"#,
    r#"string.match("x", "%")"#,
    r#"string.match("x", "[a")"#,
    r#"string.match("x", "[a%")"#,
    r#"string.match("x", "(x")"#,
    r#"string.match("x", "x)")"#,
    r#"string.match("x", "%1")"#,
    r#"string.match("xx", "(x)%2")"#,
    r#"string.match("x", "%f")"#,
    r#"string.match("x", "%fx")"#,
    r#"string.match("x", "%b")"#,
    r#"string.match("x", "%bx")"#,
    r#"string.match(string.rep("a", 40), string.rep("(a)", 33))"#,
    r#"string.match(string.rep("a", 300), string.rep("a?", 300))"#,
    r#"string.match("THE END", "%f[%z]")"#,
    r#"string.find("THE END", "%f[%A]", 2)"#,
    r#"string.find("x.y", "%f[%.]")"#,
    r#"string.match("a-z", "[a-]+")"#,
    r#"string.match("-az", "[-a]+")"#,
    r#"string.match("q%", "[%a%%]+")"#,
    r#"string.match("f(a(b)c)d", "%b()")"#,
    r#"string.match("abc", ".-$")"#,
    r#"string.match("abc", "^(.-)b")"#,
    r#"string.find("abc", "b", -1)"#,
    r#"string.find("", "")"#,
    r#"string.find("", "", 2)"#,
    r#"string.match("\0a\0", "%z")"#,
    r#"string.gsub("abc", "()b", {[2] = "X"})"#,
    r#"string.gsub("abc", "%w", function(c) return c == "b" and false or c:upper() end)"#,
    r#"string.gsub("abc def", "(%w+)", "<%1>", 1)"#,
    r#"string.gsub("hello world", "o", "0")"#,
    r#"string.gsub("hello world", "(o)", "[%1]")"#,
    r#"string.gsub("hello", "", "-")"#,
    r#"string.gsub("abc", "%w", "%0%0")"#,
    r#"string.gsub("abc", "%w", "%%")"#,
    r#"string.gsub("abc", "%w", "%1")"#,
    r#"string.gsub("abc", "%w", "%2")"#,
    r#"string.gsub("abc", "%w", "%x")"#,
    r#"string.gsub("abc", "%w", "x%")"#,
    r#"string.gsub("hello world", "%w+", {hello = "HI", world = false})"#,
    r#"string.gsub("hello world", "(%w)(%w*)", {h = 1, w = 2.5})"#,
    r#"string.gsub("hello world", "%w+", function(w) return #w end)"#,
    r#"string.gsub("hello world", "(%w+) (%w+)", function(a, b) return b .. " " .. a end)"#,
    r#"string.gsub("hello world", "%w+", function(w) return 1.0 end)"#,
    r#"string.gsub("hello world", "%w+", function(w) return {} end)"#,
    r#"string.gsub("hello world", "%w+", function(w) error("boom") end)"#,
    r#"string.gsub("hello world", "%w+", function(w) end)"#,
    r#"string.gsub("abc", "b*", "-")"#,
    r#"string.gsub("abc", "^a", "x")"#,
    r#"string.gsub("abc", "^", "x")"#,
    r#"string.gsub("abc", "$", "x")"#,
    r#"string.gsub("aaa", "a", "b", 2)"#,
    r#"string.gsub("aaa", "a", "b", -1)"#,
    r#"string.gsub("aaa", "a", "b", 2.0)"#,
    r#"string.gsub("abc", "()", "%1")"#,
    r#"string.gsub(123, "2", 5)"#,
    r#"string.gsub("x", "x")"#,
    r#"string.gsub("x", "x", true)"#,
    r#"string.gsub("abc", "(", "x")"#,
    r#"collect(string.gmatch("one two  three", "%a+"))"#,
    r#"collect(string.gmatch("k1=v1, k2=v2", "(%w+)=(%w+)"))"#,
    r#"collect(string.gmatch("abc", ""))"#,
    r#"collect(string.gmatch("abc", "b*"))"#,
    r#"collect(string.gmatch("hello", "l", 4))"#,
    r#"collect(string.gmatch("hello", "l", -1))"#,
    r#"collect(string.gmatch("hello", "l", 10))"#,
    r#"collect(string.gmatch("hello", "()l"))"#,
    r#"collect(string.gmatch("^a^b", "^%a"))"#,
    r#"collect(string.gmatch("x", "("))"#,
    r#"string.gmatch(nil, "x")"#,
    r#"("x"):rep(3, ",")"#,
    r#"string.rep("", 3, "")"#,
    r#"string.rep("ab", 3)"#,
    r#"string.rep("ab", -1)"#,
    r#"string.rep("", "x")"#,
    r#"string.rep("x")"#,
    r#"string.rep("x", 2.5)"#,
    r#"string.rep("x", "2")"#,
    r#"string.rep("x", "2.5")"#,
    r#"string.rep("x", 2, 3)"#,
    r#"string.rep("x", 2, {})"#,
    r#"string.rep({}, 2)"#,
    r#"string.rep("x", math.maxinteger)"#,
    r#"string.rep("x", 1 << 62, "yy")"#,
    r#"table.move({1, 2}, 1, 2, 1, nil)[2]"#,
    r#"table.move({1, 2}, 1, 2, 1, 5)"#,
    r#"table.move({1, 2}, "1", 2, 1)[1]"#,
    r#"table.move({1, 2}, 1, nil, 1)"#,
    r#"table.move(setmetatable({}, {__index = function(_, k) return k * 10 end}), 1, 3, 1, {})[3]"#,
    r#"string.rep(5, 2)"#,
    r#"table.concat(table.move({1, 2, 3}, 1, 3, 2), ",")"#,
    r#"table.concat(table.move({1, 2, 3, 4, 5}, 2, 4, 1), ",")"#,
    r#"table.concat(table.move({1, 2, 3}, 1, 3, 1, {}), ",")"#,
    r#"table.concat(table.move({1, 2, 3}, 2, 1, 1, {9}), ",")"#,
    r#"table.move({}, 1, 0, 5)"#,
    r#"table.move({}, 1, 2, 1.5)"#,
    r#"table.move(nil, 1, 2, 1)"#,
    r#"table.move({}, math.mininteger, 2, 1)"#,
    r#"table.move({}, 1, 2, math.maxinteger)"#,
];

/// Random small patterns and subjects (malformed ones included), through all four functions.
fn random_pattern_cases(count: usize) -> Vec<String> {
    use rand::{Rng, SeedableRng};
    const TOKENS: &[&str] = &[
        "a", "b", "1", " ", ".", "%a", "%d", "%s", "%W", "[ab]", "[^a]", "[a-c]", "[%d ]", "(",
        ")", "()", "*", "+", "-", "?", "^", "$", "%1", "%2", "%b()", "%f[%w]", "%", "[", "]",
    ];
    const SUBJECT: &[u8] = b"ab1 ()c";
    let mut rng = rand::rngs::SmallRng::seed_from_u64(10);
    (0..count)
        .map(|i| {
            let pattern: String = (0..rng.random_range(1..7))
                .map(|_| TOKENS[rng.random_range(0..TOKENS.len())])
                .collect();
            let subject: String = (0..rng.random_range(0..10))
                .map(|_| SUBJECT[rng.random_range(0..SUBJECT.len())] as char)
                .collect();
            let init = rng.random_range(-3..5);
            match i % 4 {
                0 => format!("string.find({subject:?}, {pattern:?}, {init})"),
                1 => format!("string.match({subject:?}, {pattern:?})"),
                2 => format!("string.gsub({subject:?}, {pattern:?}, \"<%0>\")"),
                _ => format!("collect(string.gmatch({subject:?}, {pattern:?}))"),
            }
        })
        .collect()
}

/// The pattern functions, `string.rep` and `table.move` agree with Lua's own, result for result
/// and error for error (with the line it names).
#[test]
fn pattern_functions_agree_with_lua() {
    let mut cases: Vec<String> = PATTERN_CASES.iter().map(|c| c.to_string()).collect();
    cases.extend(random_pattern_cases(4000));
    let harness = |lua: &mlua::Lua| -> String {
        let cases = lua
            .create_sequence_from(cases.iter().map(String::as_str))
            .unwrap();
        lua.globals().set("CASES", cases).unwrap();
        lua.load(PATTERN_HARNESS)
            .set_name("=harness")
            .eval::<String>()
            .unwrap()
    };
    let expected = harness(&mlua::Lua::new());
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "main.lua",
        &format!(
            "return {{scheduler = function() CASES = {{ {} }}\nreturn {{out = load({PATTERN_HARNESS:?}, '=harness')()}} end}}",
            cases
                .iter()
                .map(|c| format!("{c:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    // A correctness test: the time budget is far above what the harness needs, so that a
    // loaded machine does not fail it.
    let limits = Limits {
        time: Duration::from_secs(30),
        ..small()
    };
    let out = Sandbox::load(tmp.path(), "scheduler/v1", limits)
        .unwrap()
        .run(&input())
        .unwrap();
    let got = out.data.tree()["out"].as_str().unwrap().to_string();
    let mut differences = Vec::new();
    for (want, have) in expected.split("\n@@\n").zip(got.split("\n@@\n")) {
        if want != have {
            differences.push(format!("lua:  {want}\nours: {have}"));
        }
    }
    assert_eq!(expected.split("\n@@\n").count(), cases.len());
    assert_eq!(got.split("\n@@\n").count(), cases.len());
    // The random cases reach both matches and malformed patterns.
    assert!(expected.matches("=> error:").count() > 300, "{expected}");
    assert!(expected.matches("=> integer").count() > 50, "{expected}");
    assert!(expected.matches("=> string").count() > 300, "{expected}");
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

#[test]
fn c_functions_that_could_spin_stop_at_the_time_budget() {
    // Issue 10: a backtracking pattern ran in C where the budget could not stop it.
    let evil = r#"string.rep("a", 40), string.rep("a*", 40) .. "b""#;
    for body in [
        format!("string.find({evil})"),
        format!("pcall(string.match, {evil}) while true do end"),
        format!("for x in string.gmatch({evil}) do end"),
        format!("string.gsub({evil}, '')"),
        "return string.find(string.rep('a', 30), string.rep('(a-)', 30) .. '%1b')".into(),
        // A loop that moves nils allocates nothing, so only the clock stops it.
        "table.move({}, 1, 1e12, 2)".into(),
    ] {
        // Stopped by the budget (the failure's kind says so; no wall-clock bound, which a loaded
        // machine stretches).
        let e = err(&body);
        assert_eq!(e.kind, SchedulerFailure::Timeout, "{body}: {}", e.message);
    }
    // Nothing to copy, so nothing to wait for.
    let out = run_body("return {r = string.rep('', 1e15), s = ('x'):rep(3, ',')}").unwrap();
    assert_eq!(out.data, json!({"r": "", "s": "x,x,x"}));
    // gsub builds its result outside the Lua state; the memory cap still holds.
    let e = memory_err("string.gsub(string.rep('x', 1e6), 'x', string.rep('y', 100))");
    assert_eq!(e.kind, SchedulerFailure::Memory, "{}", e.message);
}

#[tokio::test]
async fn a_stuck_run_is_reported_and_no_second_thread_is_started() {
    // Issue 10: a run stuck in C code left a spinning thread behind on every retry.
    let tmp = tempfile::tempdir().unwrap();
    write(
        &tmp.path().join("scheduler/v1"),
        "main.lua",
        "return {scheduler = function() return {ok = true} end}",
    );
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = Mutex::new(held);
    let threads = Arc::new(Mutex::new(Vec::new()));
    let seen = threads.clone();
    // The first run holds the thread until released, as an unstoppable C call would.
    let hook: BeforeRun = Arc::new(move || {
        let mut seen = seen.lock().unwrap();
        seen.push(std::thread::current().id());
        if seen.len() == 1 {
            drop(seen);
            held.lock().unwrap().recv().unwrap();
        }
    });
    let limits = Limits {
        time: Duration::from_millis(50),
        ..small()
    };
    let scheduler = LuaScheduler::start_with(
        tmp.path().to_path_buf(),
        limits,
        Duration::from_millis(50),
        Some(hook),
    )
    .unwrap();
    let records = Progress::watched(Duration::from_secs(1));
    let scheduler = scheduler.watched(&records);
    let e = scheduler.run("v1", Arc::new(input())).await.unwrap_err();
    assert_eq!(e.kind, SchedulerFailure::Timeout);
    assert!(e.message.contains("did not return within"), "{}", e.message);
    // The stuck run is a stall of the watchdog once past its budget, grace and margin.
    let past_limit = tokio::time::Instant::now() + progress::MARGIN + Duration::from_secs(1);
    let stall = match records.verdict(past_limit) {
        progress::Verdict::Stalled(stall) => stall,
        alive => panic!("{alive:?}"),
    };
    assert_eq!(
        (stall.controller, stall.key.as_deref()),
        ("scheduler thread", Some("run"))
    );
    for _ in 0..3 {
        let e = scheduler.run("v1", Arc::new(input())).await.unwrap_err();
        assert_eq!(e.kind, SchedulerFailure::Timeout);
        assert!(e.message.starts_with("scheduler is stuck"), "{}", e.message);
    }
    assert_eq!(threads.lock().unwrap().len(), 1, "no run started meanwhile");

    release.send(()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let out = loop {
        match scheduler.run("v1", Arc::new(input())).await {
            Ok(out) => break out,
            Err(e) if e.message.starts_with("scheduler is stuck") => {
                assert!(std::time::Instant::now() < deadline, "never freed");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("{}", e.message),
        }
    };
    assert_eq!(out.data, json!({"ok": true}));
    // Free again: the run's record goes as the thread finishes it.
    let freed = std::time::Instant::now() + Duration::from_secs(30);
    while records.verdict(tokio::time::Instant::now() + progress::MARGIN * 2)
        != progress::Verdict::Alive
    {
        assert!(std::time::Instant::now() < freed, "still a stall");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let threads = threads.lock().unwrap();
    assert_eq!(threads.len(), 2);
    assert_eq!(threads[0], threads[1], "the same thread runs again");
}
