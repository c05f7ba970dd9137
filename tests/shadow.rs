//! Shadow schedulers on a daemon (docs/scheduler.md#shadow-schedulers): `examples/minimal`
//! with candidates beside `scheduler/v1`: a copy of it (`twin`), one that adds a key (`extra`),
//! one that fails, one that loops and one that eats memory; and what a shadow never reaches (the
//! answers to actions, followers).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use verwalter_controllers::schedule::hash::schedule_hash;

use crate::util::{Daemon, copy_tree, doc_block, example_site, metric, replace_file, wait_for};

const SOON: Duration = Duration::from_secs(60);

/// `scheduler/<name>/main.lua` with `module` as the module it returns.
pub(crate) fn lua_shadow(config: &Path, name: &str, module: &str) {
    let dir = config.join("scheduler").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("main.lua"), module).unwrap();
}

/// A copy of `scheduler/v1` whose module is `module` (`scheduler` the real function).
pub(crate) fn v1_shadow(config: &Path, name: &str, module: &str) {
    let dir = config.join("scheduler").join(name);
    copy_tree(&config.join("scheduler/v1"), &dir);
    let main = std::fs::read_to_string(dir.join("main.lua")).unwrap();
    let real_end = "return {scheduler = scheduler}\n";
    assert!(
        main.ends_with(real_end),
        "the example's main.lua changed its end"
    );
    let main = format!("{}{module}", &main[..main.len() - real_end.len()]);
    std::fs::write(dir.join("main.lua"), main).unwrap();
}

pub(crate) fn site() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let (tmp, config, storage) = example_site("minimal");
    v1_shadow(&config, "twin", "return {scheduler = scheduler}\n");
    v1_shadow(
        &config,
        "extra",
        "return {scheduler = function(state)\n  local text, log = scheduler(state)\n  \
         return '{\"shadow_note\":\"extra\",' .. text:sub(2), log\nend}\n",
    );
    lua_shadow(
        &config,
        "fail",
        "return {scheduler = function(state) error('the failing shadow') end}\n",
    );
    lua_shadow(
        &config,
        "loop",
        "return {scheduler = function(state) while true do end end}\n",
    );
    lua_shadow(
        &config,
        "hog",
        "return {scheduler = function(state)\n  local t, s = {}, string.rep('x', 1 << 16)\n  \
         for i = 1, 1e9 do t[i] = s .. i end\nend}\n",
    );
    // A table that contains itself: refused on the way back as the real scheduler's would be.
    lua_shadow(
        &config,
        "deep",
        "return {scheduler = function(state)\n  local t = {}\n  t.again = t\n  \
         return {roles = t}, 'log'\nend}\n",
    );
    std::fs::write(
        config.join("scheduler/shadow.yaml"),
        "shadows: [twin, extra, fail, loop, hog, v1, nowhere, deep]\nkeep-runs: 10\n",
    )
    .unwrap();
    (tmp, config, storage)
}

/// The daemon on `config`, scheduling only when something changes.
pub(crate) fn start(config: &Path, storage: &Path) -> Daemon {
    let settings = storage.with_extension("settings.yaml");
    std::fs::write(
        &settings,
        "scheduler:\n  period-ms: 3600000\n  time-limit-ms: 2000\n  memory-limit-mib: 64\n",
    )
    .unwrap();
    Daemon::launch(
        config,
        storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    )
}

/// The runs of `shadow` kept, newest first.
fn runs(daemon: &Daemon, shadow: &str) -> Vec<Value> {
    daemon
        .json(&format!("/v1/shadow/{shadow}/runs"))
        .map(|r| r["runs"].as_array().unwrap().clone())
        .unwrap_or_default()
}

/// Waits until `shadow` has a run whose real schedule is `real_hash`, and returns it whole.
pub(crate) fn run_on(daemon: &Daemon, shadow: &str, real_hash: &str) -> Value {
    let summary = wait_for(SOON, || {
        runs(daemon, shadow)
            .into_iter()
            .find(|r| r["real_hash"] == real_hash)
    })
    .unwrap_or_else(|| panic!("no run of {shadow} on {real_hash}:\n{}", daemon.logs()));
    let id = summary["run"].as_u64().unwrap();
    daemon
        .json(&format!("/v1/shadow/{shadow}/runs/{id}"))
        .unwrap()
}

/// Waits until `shadow` is on no run (its last run kept and the gate told), so that the next
/// round starts a run of it rather than recording a skip.
fn idle(daemon: &Daemon, shadow: &str) {
    daemon.wait_json(SOON, "/v1/shadow", "the shadow stays busy", |s| {
        s["shadows"].as_array().is_some_and(|l| {
            l.iter()
                .any(|x| x["name"] == shadow && x["busy_with"].is_null())
        })
    });
}

/// The schedule in force's hash, and the hash of the input that made it.
pub(crate) fn real_round(daemon: &Daemon) -> (String, String) {
    let schedule = daemon.json("/v1/schedule").unwrap();
    let input = daemon.json("/v1/scheduler_input").unwrap();
    (
        schedule["hash"].as_str().unwrap().to_string(),
        schedule_hash(&input),
    )
}

fn failed(run: &Value, kind: &str) {
    assert!(
        run["result"] == "failed" || run["result"] == "skipped",
        "{run}"
    );
    if run["result"] == "failed" {
        assert_eq!(run["error"]["kind"], kind, "{run}");
    }
}

#[test]
fn every_real_round_has_each_shadow_on_its_input_and_bad_shadows_change_nothing() {
    let (_tmp, config, storage) = site();
    let daemon = start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let (real, input_hash) = real_round(&daemon);

    // An identical shadow: the same input, the same schedule, an empty diff.
    let twin = run_on(&daemon, "twin", &real);
    assert_eq!(twin["result"], "identical", "{twin}");
    assert_eq!(twin["input_hash"], input_hash.as_str());
    assert_eq!(twin["paths_differing"], 0);
    assert_eq!(twin["diff"]["identical"], true);
    assert_eq!(twin["diff"]["changes"], serde_json::json!([]));
    assert_eq!(
        schedule_hash(&twin["output"]),
        real,
        "the twin made the real schedule"
    );

    // A shadow that differs: one path, shown in the diff.
    let extra = run_on(&daemon, "extra", &real);
    assert_eq!(extra["result"], "differs", "{extra}");
    assert_eq!(extra["input_hash"], input_hash.as_str());
    assert_eq!(extra["paths_differing"], 1);
    let change = &extra["diff"]["changes"][0];
    assert_eq!(change["path"], "shadow_note", "{extra}");
    assert_eq!(change["kind"], "added");
    assert_eq!(change["shadow"], "extra");

    // Failing, looping, memory-hungry: each recorded with its failure.
    let fail = run_on(&daemon, "fail", &real);
    assert_eq!(fail["result"], "failed");
    assert_eq!(fail["error"]["kind"], "runtime", "{fail}");
    assert!(
        fail["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the failing shadow"),
        "{fail}"
    );
    assert_eq!(run_on(&daemon, "loop", &real)["error"]["kind"], "timeout");
    let hog = run_on(&daemon, "hog", &real);
    assert_eq!(hog["error"]["kind"], "memory", "{hog}");
    // Its memory at the end: the cap's worth (64 MiB), garbage included.
    assert!(hog["memory_bytes"].as_u64().unwrap() > 32 << 20, "{hog}");
    // Output the real scheduler's checks refuse: the same check, the same kind and message.
    let deep = run_on(&daemon, "deep", &real);
    assert_eq!(deep["error"]["kind"], "bad_output", "{deep}");
    assert!(
        deep["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is nested too deep"),
        "{deep}"
    );

    // What is wrong in shadow.yaml is named; those entries never run.
    let list = daemon.json("/v1/shadow").unwrap();
    let problems = list["problems"].to_string();
    assert!(
        problems.contains("shadows[5]: v1 is the scheduler in force"),
        "{list}"
    );
    assert!(
        problems.contains("shadows[6]: scheduler/nowhere has neither"),
        "{list}"
    );
    let names: Vec<&str> = list["shadows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["twin", "extra", "fail", "loop", "hog", "deep"]);
    assert_eq!(list["keep_runs"], 10);

    // The real scheduler went on as if there were no shadows: its schedule is the twin's, no
    // error, and the next real round comes and is published while the loop may still run.
    let status = daemon.json("/v1/status").unwrap();
    assert!(status["scheduler"]["error"].is_null(), "{status}");
    idle(&daemon, "twin");
    replace_file(
        &config.join("runtime/web/v3.yaml"),
        &std::fs::read_to_string(config.join("runtime/web/v2.yaml")).unwrap(),
    );
    daemon.wait_json(SOON, "/v1/schedule", "no second schedule", |s| {
        s["hash"] != real.as_str()
    });
    let (second, second_input) = real_round(&daemon);
    let twin = run_on(&daemon, "twin", &second);
    assert_eq!(twin["input_hash"], second_input.as_str());
    assert_eq!(twin["result"], "identical");
    for (shadow, kind) in [("fail", "runtime"), ("loop", "timeout"), ("hog", "memory")] {
        failed(&run_on(&daemon, shadow, &second), kind);
    }

    // Every real run has a run of each shadow (or a recorded skip): as many as the real runs.
    let real_runs = metric(daemon.port, "verwalter_scheduler_runs_total").unwrap() as usize;
    for shadow in ["twin", "extra", "fail", "loop", "hog"] {
        wait_for(SOON, || {
            (runs(&daemon, shadow).len() == real_runs).then_some(())
        })
        .unwrap_or_else(|| panic!("{shadow}: not one run per real run ({real_runs})"));
    }
    let twins = runs(&daemon, "twin");
    assert!(
        twins.iter().all(|r| r["result"] == "identical"),
        "{twins:?}"
    );

    // The metrics.
    let series = |s: &str| metric(daemon.port, s);
    assert_eq!(
        series("verwalter_shadow_runs_total{result=\"identical\",shadow=\"twin\"}"),
        Some(real_runs as f64)
    );
    assert_eq!(
        series("verwalter_shadow_paths_differing{shadow=\"extra\"}"),
        Some(1.0)
    );
    assert_eq!(series("verwalter_shadow_config_problems"), Some(2.0));
    assert!(
        series("verwalter_shadow_run_duration_seconds_count{shadow=\"twin\"}")
            .is_some_and(|n| n >= 2.0)
    );
}

#[test]
fn runs_are_kept_across_a_restart_with_their_numbers() {
    let (_tmp, config, storage) = site();
    // docs/scheduler.md's example, with `v2` a copy of `v1`.
    v1_shadow(&config, "v2", "return {scheduler = scheduler}\n");
    let example = doc_block("scheduler.md", "### Marking a shadow", "yaml");
    std::fs::write(config.join("scheduler/shadow.yaml"), example).unwrap();
    let daemon = start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let (real, _) = real_round(&daemon);
    let first = run_on(&daemon, "v2", &real);
    assert_eq!(first["result"], "identical");
    assert_eq!(daemon.json("/v1/shadow").unwrap()["keep_runs"], 20);
    daemon.terminate();
    assert!(
        storage
            .join(format!("shadow/v2/{}.json", first["run"]))
            .is_file()
    );

    let daemon = start(&config, &storage);
    let kept = runs(&daemon, "v2");
    assert_eq!(kept[kept.len() - 1]["run"], first["run"], "{kept:?}");
    // The restart's round is a new run, numbered after the kept one.
    let next = wait_for(SOON, || {
        runs(&daemon, "v2")
            .into_iter()
            .find(|r| r["run"].as_u64() > first["run"].as_u64())
    })
    .expect("no run after the restart");
    assert_eq!(next["result"], "identical");
}

/// `verwalter shadow ARGS...`: exit status and stdout (stderr appended).
fn shadow_cli(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(crate::util::BIN)
        .arg("shadow")
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn the_cli_prints_the_latest_diff_and_promote_puts_a_shadow_in_force() {
    let (_tmp, config, storage) = site();
    std::fs::write(
        config.join("scheduler/shadow.yaml"),
        "shadows: [twin, extra]\n",
    )
    .unwrap();
    let daemon = start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let (real, _) = real_round(&daemon);
    run_on(&daemon, "twin", &real);
    let extra = run_on(&daemon, "extra", &real);
    let url = format!("http://127.0.0.1:{}", daemon.port);

    // GraphQL: each shadow, its latest run with the diff, its history.
    let query = r#"{"query": "{ shadows { name configured latest { run result pathsDiffering inputHash diff output codeVersion realError } history { run result diff } } }"}"#;
    let (code, body) = crate::util::http_post(
        daemon.port,
        "/v1/graphql",
        "application/json",
        query.as_bytes(),
    );
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let shadows = &answer["data"]["shadows"];
    assert_eq!(shadows[0]["name"], "twin", "{answer}");
    assert_eq!(shadows[0]["latest"]["result"], "identical");
    assert_eq!(shadows[1]["name"], "extra");
    assert_eq!(shadows[1]["configured"], true);
    assert_eq!(shadows[1]["latest"]["run"], extra["run"]);
    assert_eq!(shadows[1]["latest"]["pathsDiffering"], 1);
    assert_eq!(shadows[1]["latest"]["inputHash"], extra["input_hash"]);
    assert_eq!(shadows[1]["latest"]["diff"], extra["diff"]);
    assert_eq!(shadows[1]["latest"]["output"], extra["output"]);
    assert!(
        shadows[1]["latest"]["output"]["shadow_note"].is_string(),
        "{answer}"
    );
    assert_eq!(shadows[1]["latest"]["codeVersion"], extra["code_version"]);
    assert!(shadows[1]["latest"]["realError"].is_null(), "{answer}");
    assert_eq!(shadows[1]["history"][0]["result"], "differs");
    assert!(
        shadows[1]["history"][0]["diff"].is_null(),
        "summaries only: {answer}"
    );

    let (code, text) = shadow_cli(&["diff", "--url", &url, "--name", "twin"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(": identical to the real schedule\n"),
        "{text}"
    );
    let (code, text) = shadow_cli(&["diff", "--url", &url, "--name", "extra"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.starts_with(&format!("shadow extra, run {} at ", extra["run"])),
        "{text}"
    );
    assert!(
        text.contains("differs from the real schedule in 1 paths\n"),
        "{text}"
    );
    assert!(text.contains("  + shadow_note: \"extra\"\n"), "{text}");
    let (code, text) = shadow_cli(&["diff", "--url", &url]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("shadow twin,") && text.contains("shadow extra,"),
        "{text}"
    );
    let (code, text) = shadow_cli(&["diff", "--url", &url, "--name", "nope"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("has no shadow scheduler \"nope\""), "{text}");

    // Refused: v1 itself, a dir without a scheduler.
    let dir = config.to_str().unwrap();
    let (code, text) = shadow_cli(&["promote", "v1", "--config-dir", dir]);
    assert_eq!(
        (code, text.trim()),
        (
            1,
            "verwalter shadow promote: v1 is the scheduler in force already"
        )
    );
    let (code, text) = shadow_cli(&["promote", "nowhere", "--config-dir", dir]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("scheduler/nowhere has neither main.lua nor scheduler.wasm"),
        "{text}"
    );

    // The promotion: `extra` is v1, the old v1 aside, `extra` out of shadow.yaml; the running
    // daemon takes the new code as any edit of v1, and the twin now differs from it.
    let old_main = std::fs::read(config.join("scheduler/v1/main.lua")).unwrap();
    let (code, text) = shadow_cli(&["promote", "extra", "--config-dir", dir]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("scheduler/extra is now scheduler/v1\n"),
        "{text}"
    );
    assert!(
        text.contains("extra taken out of scheduler/shadow.yaml\n"),
        "{text}"
    );
    assert!(!config.join("scheduler/extra").exists());
    let aside: Vec<_> = std::fs::read_dir(config.join("scheduler"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("v1-replaced-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(config.join("scheduler").join(&aside[0]).join("main.lua")).unwrap(),
        old_main
    );
    let left: serde_json::Value = serde_norway::from_str(
        &std::fs::read_to_string(config.join("scheduler/shadow.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(left["shadows"], serde_json::json!(["twin"]));
    let promoted = daemon.wait_json(
        SOON,
        "/v1/schedule",
        "the promoted scheduler never ran",
        |s| s["data"]["shadow_note"] == "extra",
    );
    let twin = run_on(&daemon, "twin", promoted["hash"].as_str().unwrap());
    assert_eq!(twin["result"], "differs");
    assert_eq!(twin["diff"]["changes"][0]["path"], "shadow_note");
    assert_eq!(twin["diff"]["changes"][0]["kind"], "removed");
}

#[test]
fn wasm_shadows_run_as_a_wasm_v1_does() {
    let (_tmp, config, storage) = example_site("wasm-scheduler");
    let module = std::fs::read(config.join("scheduler/v1/scheduler.wasm")).unwrap();
    for (name, bytes) in [
        ("same", module),
        ("trap", crate::wasm::module("unreachable")),
    ] {
        let dir = config.join("scheduler").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("scheduler.wasm"), bytes).unwrap();
    }
    std::fs::write(
        config.join("scheduler/shadow.yaml"),
        "shadows: [same, trap]\n",
    )
    .unwrap();
    let daemon = start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let (real, input_hash) = real_round(&daemon);
    let same = run_on(&daemon, "same", &real);
    assert_eq!(same["result"], "identical", "{same}");
    assert_eq!(same["input_hash"], input_hash.as_str());
    assert!(
        same["log"].as_str().unwrap().contains("placed 2 roles"),
        "{same}"
    );
    let trap = run_on(&daemon, "trap", &real);
    assert_eq!(trap["result"], "failed", "{trap}");
    let message = trap["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("scheduler/trap/scheduler.wasm: "),
        "{message}"
    );
    assert!(message.contains("trapped"), "{message}");
    let status = daemon.json("/v1/status").unwrap();
    assert!(status["errors"].get("scheduler").is_none(), "{status}");
}

#[test]
fn a_shadow_still_running_is_skipped_for_the_next_round_which_is_not_held_back() {
    let (_tmp, config, storage) = site();
    std::fs::write(
        config.join("scheduler/shadow.yaml"),
        "shadows: [loop, twin]\n",
    )
    .unwrap();
    // A budget long enough that the next round surely comes while `loop` still runs.
    let settings = storage.with_extension("settings.yaml");
    std::fs::write(
        &settings,
        "scheduler:\n  period-ms: 3600000\n  time-limit-ms: 4000\n",
    )
    .unwrap();
    let daemon = Daemon::launch(
        &config,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    let first = daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    // The twin is done with the first round (recorded and no longer busy) before the second
    // comes, so only the loop can be busy then.
    let twin_first = run_on(&daemon, "twin", first["hash"].as_str().unwrap());
    assert_eq!(twin_first["result"], "identical", "{twin_first}");
    daemon.wait_json(SOON, "/v1/shadow", "the twin stays busy", |s| {
        s["shadows"].as_array().is_some_and(|l| {
            l.iter()
                .any(|x| x["name"] == "twin" && x["busy_with"].is_null())
        })
    });
    replace_file(
        &config.join("runtime/web/v3.yaml"),
        &std::fs::read_to_string(config.join("runtime/web/v2.yaml")).unwrap(),
    );
    let second = daemon.wait_json(SOON, "/v1/schedule", "no second schedule", |s| {
        s["hash"] != first["hash"]
    });
    // The real round was published, and the twin ran on it, while the loop still ran.
    let twin = run_on(&daemon, "twin", second["hash"].as_str().unwrap());
    assert_eq!(twin["result"], "identical");
    let skipped = run_on(&daemon, "loop", second["hash"].as_str().unwrap());
    assert_eq!(skipped["result"], "skipped", "{skipped}");
    let ran = run_on(&daemon, "loop", first["hash"].as_str().unwrap());
    assert_eq!(skipped["skipped"]["busy_with"], ran["run"], "{skipped}");
    assert!(skipped["output"].is_null() && skipped["duration_ms"].is_null());
    // The run it was busy with ends at its budget, a timeout; nothing was queued behind it.
    let ran = wait_for(SOON, || {
        let run = daemon.json(&format!("/v1/shadow/loop/runs/{}", ran["run"]))?;
        run["error"].is_object().then_some(run)
    })
    .unwrap();
    assert_eq!(ran["error"]["kind"], "timeout", "{ran}");
    assert_eq!(runs(&daemon, "loop").len(), 2);
    assert_eq!(
        metric(
            daemon.port,
            "verwalter_shadow_runs_total{result=\"skipped\",shadow=\"loop\"}"
        ),
        Some(1.0)
    );
}

/// `verwalter shadow diff`'s text with what differs from run to run masked: in each header
/// line, the run number, its time and the two hashes.
fn masked_diff(text: &str) -> String {
    text.lines()
        .map(|l| {
            let header = l.strip_prefix("shadow ").and_then(|rest| {
                let (name, _) = rest.split_once(", run ")?;
                let (_, tail) = rest.split_once("): ")?;
                Some(format!(
                    "shadow {name}, run <n> at <time> (input <hash>, real schedule <hash>): {tail}\n"
                ))
            });
            header.unwrap_or_else(|| format!("{l}\n"))
        })
        .collect()
}

#[test]
fn the_docs_diff_sample_is_real_output_and_its_promote_runs_as_written() {
    let (tmp, config, storage) = example_site("minimal");
    // As the doc says: `v2` keeps web on v1 (the example's newest is v2) and adds a key.
    v1_shadow(
        &config,
        "v2",
        "return {scheduler = function(state)\n  local text, log = scheduler(state)\n  \
         text = text:gsub('\"version\":\"v2\"', '\"version\":\"v1\"')\n  \
         return '{\"shadow_note\":\"extra\",' .. text:sub(2), log\nend}\n",
    );
    std::fs::write(config.join("scheduler/shadow.yaml"), "shadows: [v2]\n").unwrap();
    let daemon = start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let (real, _) = real_round(&daemon);
    let run = run_on(&daemon, "v2", &real);
    assert_eq!(run["result"], "differs", "{run}");
    let heading = "### Reading the diff, and promoting a shadow";
    let url = format!("http://127.0.0.1:{}", daemon.port);
    let (code, text) = shadow_cli(&["diff", "--url", &url, "--name", "v2"]);
    assert_eq!(code, 1, "{text}");
    let sample = doc_block("scheduler.md", heading, "text");
    assert_eq!(masked_diff(&text), masked_diff(&sample), "{text}");

    // The promotion, as written, from the dir that holds `./config`.
    let example = doc_block("scheduler.md", heading, "sh");
    let bin_dir = Path::new(crate::util::BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("sh")
        .args(["-e", "-c", &example])
        .current_dir(tmp.path())
        .env("PATH", &path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("scheduler/v2 is now scheduler/v1\n"),
        "{stdout}"
    );
    assert!(!config.join("scheduler/v2").exists());
    daemon.wait_json(SOON, "/v1/schedule", "the promoted v2 never ran", |s| {
        s["data"]["shadow_note"] == "extra" && s["data"]["roles"]["web"]["version"] == "v1"
    });
}

#[test]
fn a_shadows_answers_to_actions_are_shown_and_never_sent() {
    let (_tmp, config, storage) = crate::util::example_site("minimal");
    // The real scheduler answers an action only when its button asks for a reply; the shadow
    // answers every action, on the same input.
    lua_shadow(
        &config,
        "v1",
        "return {scheduler = function(state)\n  local replies = {}\n  \
         for id, action in pairs(state.actions) do\n    \
         if action.button.reply then replies[id] = {real = true} end\n  end\n  \
         return {actions = replies, nodes = {}}, 'ok'\nend}\n",
    );
    lua_shadow(
        &config,
        "answers",
        "return {scheduler = function(state)\n  local replies = {}\n  \
         for id, action in pairs(state.actions) do\n    \
         replies[id] = {shadow = action.button.reply}\n  end\n  \
         return {actions = replies, nodes = {}}, 'ok'\nend}\n",
    );
    std::fs::write(config.join("scheduler/shadow.yaml"), "shadows: [answers]\n").unwrap();
    let daemon = start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let wait_action = |body: &str| {
        crate::util::http_post(
            daemon.port,
            "/v1/wait_action",
            "application/json",
            body.as_bytes(),
        )
    };
    // Only the real scheduler's answer comes back; without one, none (204), though the shadow
    // answers the very action (it sees the actions of each round it runs for; one skipped while
    // it was busy did not, so the 204 is asked again until the shadow has answered one).
    let (code, body) = wait_action(r#"{"button": {"reply": true}}"#);
    assert_eq!((code, body.as_str()), (200, r#"{"real":true}"#));
    let answered = |wanted: &Value| {
        runs(&daemon, "answers").iter().any(|r| {
            daemon
                .json(&format!("/v1/shadow/answers/runs/{}", r["run"]))
                .and_then(|run| run["output"]["actions"].as_object().cloned())
                .is_some_and(|a| a.values().any(|v| v == wanted))
        })
    };
    let mut shadow_answered = false;
    for _ in 0..5 {
        let (code, body) = wait_action(r#"{"button": {"reply": false}}"#);
        assert_eq!(code, 204, "{body}");
        // The shadow is done with the rounds so far: idle, its latest run on the schedule in
        // force (no round comes by itself: the period is an hour).
        wait_for(SOON, || {
            let list = daemon.json("/v1/shadow")?;
            let shadow = &list["shadows"][0];
            let schedule = daemon.json("/v1/schedule")?;
            (shadow["busy_with"].is_null() && shadow["latest"]["real_hash"] == schedule["hash"])
                .then_some(())
        })
        .unwrap_or_else(|| panic!("the shadow never caught up:\n{}", daemon.logs()));
        if answered(&serde_json::json!({"shadow": false})) {
            shadow_answered = true;
            break;
        }
    }
    assert!(
        shadow_answered,
        "the shadow answered no action:\n{}",
        daemon.logs()
    );
    // ... and nowhere in the schedule in force, which holds the real one's answers only.
    let schedule = daemon.json("/v1/schedule").unwrap();
    assert!(!schedule.to_string().contains(r#""shadow":"#), "{schedule}");
}

#[test]
fn a_shadow_never_reaches_the_followers() {
    // Rounds every second, so the shadow runs soon after it is named.
    let cluster = crate::cluster::Cluster::start_with(2, Some("scheduler:\n  period-ms: 1000\n"));
    let (leader, _) = cluster.converged();
    // Every node's config dir names `extra` (a copy of v1 that adds `shadow_note`) a shadow;
    // only the leader runs it, at its next round.
    for n in 1..=2 {
        let config = cluster.tmp.path().join(format!("config{n}"));
        v1_shadow(
            &config,
            "extra",
            "return {scheduler = function(state)\n  local text, log = scheduler(state)\n  \
             return '{\"shadow_note\":\"extra\",' .. text:sub(2), log\nend}\n",
        );
        replace_file(&config.join("scheduler/shadow.yaml"), "shadows: [extra]\n");
    }
    let leading = cluster.nodes[leader].as_ref().unwrap();
    let follower = cluster.follower(leader);
    let real_hash = wait_for(SOON, || {
        let runs = leading.json("/v1/shadow/extra/runs")?;
        let latest = &runs["runs"][0];
        (latest["result"] == "differs").then(|| latest["real_hash"].as_str().map(String::from))?
    })
    .unwrap_or_else(|| panic!("the leader ran no shadow:\n{}", cluster.logs()));
    // The follower takes the real schedule of that round, and nothing of the shadow's.
    let schedule = wait_for(SOON, || {
        let s = follower.json("/v1/schedule")?;
        (s["hash"] == real_hash.as_str()).then_some(s)
    })
    .unwrap_or_else(|| panic!("the follower never took {real_hash}:\n{}", cluster.logs()));
    assert!(!schedule.to_string().contains("shadow_note"), "{schedule}");
    let roles = follower.json("/v1/roles_data").unwrap();
    assert!(!roles.to_string().contains("shadow_note"), "{roles}");
    let shadows = follower.json("/v1/shadow").unwrap();
    assert!(
        shadows["shadows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["latest"].is_null()),
        "{shadows}"
    );
    assert!(
        !leading
            .json("/v1/schedule")
            .unwrap()
            .to_string()
            .contains("shadow_note")
    );
}

#[test]
fn a_run_that_cannot_be_kept_on_disk_is_shown_in_memory_with_its_error() {
    let (_tmp, config, storage) = site();
    std::fs::write(config.join("scheduler/shadow.yaml"), "shadows: [twin]\n").unwrap();
    // A file where the twin's dir of runs should be.
    std::fs::create_dir_all(storage.join("shadow")).unwrap();
    std::fs::write(storage.join("shadow/twin"), "in the way").unwrap();
    let daemon = start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let (real, _) = real_round(&daemon);
    let twin = run_on(&daemon, "twin", &real);
    assert_eq!(twin["result"], "identical", "{twin}");
    let list = daemon.json("/v1/shadow").unwrap();
    let error = list["shadows"][0]["write_error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        error.starts_with("cannot write ") && error.contains("shadow/twin/"),
        "{list}"
    );
    assert!(
        metric(
            daemon.port,
            "verwalter_shadow_write_errors_total{shadow=\"twin\"}"
        )
        .is_some_and(|n| n >= 1.0)
    );
    assert!(
        daemon
            .logs()
            .contains("Cannot write a shadow run; it is kept in memory only."),
        "{}",
        daemon.logs()
    );
}
