//! The offline commands and start-up errors.

use std::process::Command;

use crate::util::*;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_accepts_the_example_and_names_every_problem() {
    let dir = example("minimal");
    let (code, stdout, stderr) = run(&["check", "--config-dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("ok"), "{stdout}");

    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&dir, tmp.path());
    std::fs::write(
        tmp.path().join("runtime/web/v9.yaml"),
        "image: x\ninstances: [1\n",
    )
    .unwrap();
    std::fs::write(tmp.path().join("runtime/cache/v2.json"), "{\"image\": }").unwrap();
    std::fs::write(
        tmp.path().join("scheduler/v1/main.lua"),
        "return {scheduler = function(state)\n  return nil .. 'x'\nend}\n",
    )
    .unwrap();
    let (code, _, stderr) = run(&["check", "--config-dir", tmp.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("runtime/web/v9.yaml:3"), "{stderr}");
    assert!(stderr.contains("runtime/cache/v2.json:1"), "{stderr}");
    assert!(stderr.contains("scheduler/v1/main.lua:2"), "{stderr}");
    assert!(stderr.contains("3 problem(s)"), "{stderr}");
}

#[test]
fn schedule_prints_the_schedule_and_log_and_replays_an_input_file() {
    let dir = example("minimal");
    let (code, stdout, stderr) = run(&[
        "schedule",
        "--config-dir",
        dir.to_str().unwrap(),
        "--hostname",
        "alpha",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let schedule: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(schedule["data"]["roles"]["web"]["version"], "v2");
    assert_eq!(
        schedule["data"]["nodes"]["alpha"]["roles"]["web"]["instances"],
        2
    );
    assert!(stderr.contains("web: v2 x2 on alpha"), "{stderr}");

    // An input captured from /v1/scheduler_input replays offline.
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("input.json");
    std::fs::write(
        &input,
        serde_json::json!({
            "now": 1, "current_host": "gamma", "current_id": MACHINE_ID, "parents": [], "actions": {},
            "runtime": {"db": {"v7": {"instances": 4}}}, "peers": {}, "metrics": {}
        })
        .to_string(),
    )
    .unwrap();
    let (code, stdout, stderr) = run(&[
        "schedule",
        "--config-dir",
        dir.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let schedule: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        schedule["data"]["nodes"]["gamma"]["roles"]["db"]["instances"],
        4
    );
    assert!(schedule["data"]["roles"].get("web").is_none());

    std::fs::write(&input, "{\n  \"now\": \"soon\"\n}").unwrap();
    let (code, _, stderr) = run(&[
        "schedule",
        "--config-dir",
        dir.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("input.json:2"), "{stderr}");
}

#[test]
fn bad_settings_exit_3_with_every_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let settings = tmp.path().join("verwalter.yaml");
    std::fs::write(&settings, "port: 1\nscheduler:\n  period-ms: 5\n").unwrap();
    let (code, _, stderr) = run(&[
        "run",
        "--settings",
        settings.to_str().unwrap(),
        "--override-machine-id",
        "nothex",
    ]);
    assert_eq!(code, 3);
    assert!(stderr.contains("32 hex digits"), "{stderr}");
    assert!(stderr.contains("period-ms: 5 is too short"), "{stderr}");
    let (code, stdout, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert!(stdout.contains(env!("CARGO_PKG_VERSION")));
}
