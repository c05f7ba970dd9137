//! The offline commands and start-up errors.

use std::path::Path;
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

/// `verwalter <command> --config-dir <dir> <args>`: see [`run`].
fn run_on(command: &str, dir: &Path, args: &[&str]) -> (i32, String, String) {
    run(&[&[command, "--config-dir", dir.to_str().unwrap()], args].concat())
}

/// `verwalter schedule` on `dir` that must succeed: the schedule it printed and its stderr.
fn schedule_of(dir: &Path, args: &[&str]) -> (serde_json::Value, String) {
    let (code, stdout, stderr) = run_on("schedule", dir, args);
    assert_eq!(code, 0, "{stderr}");
    (serde_json::from_str(&stdout).unwrap(), stderr)
}

/// A temp copy of example `name` with `files` (path in the config dir, text) written over it.
fn edited_example(name: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&example(name), tmp.path());
    for (path, text) in files {
        std::fs::write(tmp.path().join(path), text).unwrap();
    }
    tmp
}

#[test]
fn check_accepts_the_example_and_names_every_problem() {
    let (code, stdout, stderr) = run_on("check", &example("minimal"), &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("ok"), "{stdout}");

    let tmp = edited_example(
        "minimal",
        &[
            ("runtime/web/v9.yaml", "image: x\ninstances: [1\n"),
            ("runtime/cache/v2.json", "{\"image\": }"),
            (
                "scheduler/v1/main.lua",
                "return {scheduler = function(state)\n  return nil .. 'x'\nend}\n",
            ),
        ],
    );
    let (code, _, stderr) = run_on("check", tmp.path(), &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("runtime/web/v9.yaml:3"), "{stderr}");
    assert!(stderr.contains("runtime/cache/v2.json:1"), "{stderr}");
    assert!(stderr.contains("scheduler/v1/main.lua:2"), "{stderr}");
    assert!(stderr.contains("3 problem(s)"), "{stderr}");
}

#[test]
fn schedule_prints_the_schedule_and_log_and_replays_an_input_file() {
    let dir = example("minimal");
    let (schedule, stderr) = schedule_of(&dir, &["--hostname", "alpha"]);
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
    let input_args = ["--input", input.to_str().unwrap()];
    let (schedule, _) = schedule_of(&dir, &input_args);
    assert_eq!(
        schedule["data"]["nodes"]["gamma"]["roles"]["db"]["instances"],
        4
    );
    assert!(schedule["data"]["roles"].get("web").is_none());

    // With peers, the instances are dealt out one at a time, going on where the previous role
    // stopped (roles in name order): to this node first, then to the peers by host name; every
    // node gets every role with its share (issue 31: all went to the node that ran the scheduler).
    let peer = |name: &str| serde_json::json!({"id": name, "hostname": name, "name": format!("{name}.local"), "known_since": 0, "errors": 0});
    std::fs::write(
        &input,
        serde_json::json!({
            "now": 1, "current_host": "beta", "current_id": MACHINE_ID, "parents": [], "actions": {},
            "runtime": {"web": {"v2": {"instances": 4}}, "cache": {"v1": {"instances": 1}}},
            "peers": {"p1": peer("gamma"), "p2": peer("alpha")}, "metrics": {}
        })
        .to_string(),
    )
    .unwrap();
    let (code, stdout, stderr) = run_on("schedule", &dir, &input_args);
    assert_eq!(code, 0, "{stderr}");
    let schedule: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        schedule["data"]["nodes"],
        serde_json::json!({
            "alpha": {"roles": {"cache": {"instances": 0}, "web": {"instances": 2}}},
            "beta": {"roles": {"cache": {"instances": 1}, "web": {"instances": 1}}},
            "gamma": {"roles": {"cache": {"instances": 0}, "web": {"instances": 1}}},
        })
    );
    assert!(
        stderr.contains(
            "cache: v1 x1 on beta=1 alpha=0 gamma=0\nweb: v2 x4 on beta=1 alpha=2 gamma=1"
        ),
        "{stderr}"
    );

    std::fs::write(&input, "{\n  \"now\": \"soon\"\n}").unwrap();
    let (code, _, stderr) = run_on("schedule", &dir, &input_args);
    assert_eq!(code, 1);
    assert!(stderr.contains("input.json:2"), "{stderr}");
}

#[test]
fn a_scheduler_split_into_modules_runs() {
    // examples/modules: modules that `require "string"` and find their siblings from `...`.
    let dir = example("modules");
    let (schedule, stderr) = schedule_of(&dir, &["--hostname", "alpha"]);
    assert_eq!(
        schedule["data"]["roles"],
        serde_json::json!({"web": {"version": "v2", "instances": 3}, "worker": {"version": "v1", "instances": 1}})
    );
    assert_eq!(
        schedule["data"]["nodes"]["alpha"]["roles"]["web"]["instances"],
        3
    );
    assert!(
        stderr.contains("web: v2 x3 on alpha\nworker: v1 x1 on alpha"),
        "{stderr}"
    );
    let (code, stdout, stderr) = run_on("check", &dir, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("ok"), "{stdout}");
}

#[test]
fn the_placement_example_places_roles_with_the_library() {
    // examples/placement-scheduler: placement.place with LeastUsedBAR, one instance of a role per machine.
    let dir = example("placement-scheduler");
    let (schedule, stderr) = schedule_of(&dir, &["--hostname", "alpha"]);
    let roles_on = |schedule: &serde_json::Value, host: &str| -> Vec<String> {
        schedule["data"]["nodes"][host]["roles"]
            .as_object()
            .map_or(Vec::new(), |r| r.keys().cloned().collect())
    };
    // cache and db score alike on alpha and beta (the first name wins ties); gamma has too little
    // memory for a db, and then scores best for web.
    assert_eq!(roles_on(&schedule, "alpha"), ["cache", "db", "web"]);
    assert_eq!(roles_on(&schedule, "beta"), ["cache", "db"]);
    assert_eq!(roles_on(&schedule, "gamma"), ["web"]);
    assert_eq!(
        schedule["data"]["nodes"]["gamma"]["roles"]["web"],
        serde_json::json!({"version": "v2", "image": "web.v2"})
    );
    assert!(
        stderr.contains(
            "db: v1 on alpha, beta\n  1 instance(s) not placed:\n    \
             alpha: App db has 1 instances here, max_per_node is 1.\n    \
             beta: App db has 1 instances here, max_per_node is 1.\n    \
             gamma: Could not fit node for dimensions: missing (mem: 8.0).\n\
             web: v2 on alpha, gamma"
        ),
        "{stderr}"
    );

    // A web instance the last schedule put on beta stays there (one on a machine no longer
    // listed does not); only the missing one is placed.
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("input.json");
    let role = |instances: u32, cpu: u32, mem: u32| serde_json::json!({"v1": {"image": "x", "instances": instances, "cpu": cpu, "mem": mem}});
    std::fs::write(
        &input,
        serde_json::json!({
            "now": 1, "current_host": "alpha", "current_id": MACHINE_ID, "actions": {},
            "parents": [{"nodes": {"beta": {"roles": {"web": {}}}, "zeta": {"roles": {"web": {}}}}}],
            "runtime": {
                "nodes": {"alpha": {"cpu": 8, "mem": 32}, "beta": {"cpu": 8, "mem": 32}, "gamma": {"cpu": 4, "mem": 8}},
                "roles": {"web": role(2, 2, 4), "db": role(3, 4, 16), "cache": role(2, 1, 8)}
            },
            "peers": {}, "metrics": {}
        })
        .to_string(),
    )
    .unwrap();
    let (schedule, stderr) = schedule_of(&dir, &["--input", input.to_str().unwrap()]);
    assert!(stderr.contains("web: v1 on beta, gamma"), "{stderr}");
    assert_eq!(roles_on(&schedule, "beta"), ["cache", "db", "web"]);
    assert!(schedule["data"]["nodes"].get("zeta").is_none());

    let (code, stdout, stderr) = run_on("check", &dir, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("ok"), "{stdout}");
}

#[test]
fn a_backtracking_pattern_ends_schedule_and_check_with_a_timeout() {
    // Issue 10: a pattern that backtracks for ages ran in C, where the time budget could not
    // stop it, and `schedule` and `check` hung forever.
    let backtracks = "return {scheduler = function(state)\n  \
        string.find(string.rep('a', 40), string.rep('a*', 40) .. 'b')\nend}\n";
    let tmp = edited_example("minimal", &[("scheduler/v1/main.lua", backtracks)]);
    let (code, _, stderr) = run_on("schedule", tmp.path(), &["--hostname", "alpha"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("scheduler (timeout): scheduler exceeded its time budget of 2s"),
        "{stderr}"
    );
    let (code, _, stderr) = run_on("check", tmp.path(), &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("scheduler (timeout)"), "{stderr}");
}

#[test]
fn bad_settings_exit_3_with_every_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let settings = tmp.path().join("verwalter.yaml");
    std::fs::write(
        &settings,
        "port: 1\nscheduler:\n  period-ms: 5\nrender:\n  command-timeout-secs: 0\n",
    )
    .unwrap();
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
    assert!(
        stderr.contains("render.command-timeout-secs: must be above 0"),
        "{stderr}"
    );
    let (code, stdout, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert!(stdout.contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn check_names_a_broken_template_and_a_role_without_a_template() {
    let broken = [("templates/minimal/v1/role.conf.hbs", "ok\n{{#if}}\n")];
    let tmp = edited_example("minimal", &broken);
    let main = tmp.path().join("scheduler/v1/main.lua");
    let lua = std::fs::read_to_string(&main).unwrap();
    std::fs::write(
        &main,
        lua.replace("template = \"minimal/v1\"", "template = \"../outside\""),
    )
    .unwrap();
    let (code, _, stderr) = run_on("check", tmp.path(), &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("templates/minimal/v1/role.conf.hbs: line "),
        "{stderr}"
    );
    assert!(
        stderr.contains("role \"web\": `template` \"../outside\""),
        "{stderr}"
    );
}

#[test]
fn render_shows_files_and_commands_from_vars_or_a_schedule() {
    let dir = example("minimal");
    let tmp = tempfile::tempdir().unwrap();
    let vars = tmp.path().join("vars.yaml");
    std::fs::write(
        &vars,
        "template: minimal/v1\nnode: alpha\ncluster: demo\nversion: v7\ninstances: 3\n",
    )
    .unwrap();
    let vars_args = ["--role", "web", "--vars", vars.to_str().unwrap()];
    let (code, stdout, stderr) = run_on("render", &dir, &[&vars_args[..], &["--dry-run"]].concat());
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("--- files.conf = templates/minimal/v1/role.conf.hbs ---"),
        "{stdout}"
    );
    assert!(stdout.contains("# web on alpha (cluster demo)"), "{stdout}");
    assert!(stdout.contains("version: v7\ninstances: 3\n"), "{stdout}");
    assert!(stdout.contains("would run: cat "), "{stdout}");

    // Without --dry-run the command runs: `cat` prints the rendered file.
    let (code, stdout, _) = run_on("render", &dir, &vars_args);
    assert_eq!(code, 0);
    assert_eq!(stdout.matches("version: v7").count(), 2, "{stdout}");

    // From a schedule envelope as /v1/schedule serves it.
    let schedule = tmp.path().join("schedule.json");
    std::fs::write(
        &schedule,
        r#"{"timestamp": 1, "hash": "x", "origin": "o", "data": {
            "vars": {"template": "minimal/v1", "cluster": "prod"},
            "roles": {"web": {"version": "v2"}},
            "nodes": {"alpha": {"roles": {"web": {"instances": 5}}}}}}"#,
    )
    .unwrap();
    let base = ["--schedule", schedule.to_str().unwrap(), "--dry-run"];
    let (code, stdout, stderr) = run_on(
        "render",
        &dir,
        &[&base[..], &["--role", "web", "--hostname", "alpha"]].concat(),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("(cluster prod)") && stdout.contains("instances: 5"),
        "{stdout}"
    );
    let (code, _, stderr) = run_on(
        "render",
        &dir,
        &[&base[..], &["--role", "web", "--hostname", "beta"]].concat(),
    );
    assert_eq!(code, 1);
    assert!(stderr.contains("not assigned to \"beta\""), "{stderr}");
}

#[test]
fn check_derives_the_roles_with_query_wasm_and_names_its_problems() {
    let (code, stdout, stderr) = run_on("check", &example("wasm-query"), &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(": ok; the scheduler returned"), "{stdout}");

    let failing_init = crate::render::query_wasm(
        r#"{\"Err\": {\"kind\": \"InitError\", \"message\": \"no cluster named prod\"}}"#,
        r#"{\"Ok\": {}}"#,
        r#"{\"Ok\": null}"#,
    );
    let bad_role = crate::render::query_wasm(
        r#"{\"Ok\": null}"#,
        r#"{\"Ok\": {\"api\": {\"template\": \"../outside\"}}}"#,
        r#"{\"Ok\": null}"#,
    );
    for (module, says) in [
        (
            failing_init,
            "scheduler/v1/query.wasm: init: InitError: no cluster named prod",
        ),
        (bad_role, "role \"api\": `template` \"../outside\""),
    ] {
        let tmp = edited_example("minimal", &[]);
        std::fs::write(tmp.path().join("scheduler/v1/query.wasm"), module).unwrap();
        let (code, _, stderr) = run_on("check", tmp.path(), &[]);
        assert_eq!(code, 1, "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

#[test]
fn render_from_a_schedule_takes_the_roles_query_wasm_derives() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("config");
    copy_tree(&example("minimal"), &dir);
    let schedule = tmp.path().join("schedule.json");
    std::fs::write(
        &schedule,
        r#"{"vars": {"template": "minimal/v1", "cluster": "prod"},
            "nodes": {"alpha": {"roles": {"web": {"version": "v1", "instances": 1}}}}}"#,
    )
    .unwrap();
    // The module gives node alpha role `api` (not the schedule's `web`), with its own variables.
    std::fs::write(
        dir.join("scheduler/v1/query.wasm"),
        crate::render::query_wasm(
            r#"{\"Ok\": null}"#,
            r#"{\"Ok\": {\"api\": {\"template\": \"minimal/v1\", \"node\": \"alpha\", \"cluster\": \"wasm\", \"version\": \"v9\", \"instances\": 4}}}"#,
            r#"{\"Ok\": null}"#,
        ),
    )
    .unwrap();
    let base = ["--schedule", schedule.to_str().unwrap(), "--dry-run"];
    let base = [&base[..], &["--hostname", "alpha"]].concat();
    let (code, stdout, stderr) = run_on("render", &dir, &[&base[..], &["--role", "api"]].concat());
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("# api on alpha (cluster wasm)")
            && stdout.contains("version: v9\ninstances: 4\n"),
        "{stdout}"
    );
    let (code, _, stderr) = run_on("render", &dir, &[&base[..], &["--role", "web"]].concat());
    assert_eq!(code, 1);
    assert!(stderr.contains("(its roles: api)"), "{stderr}");

    // A module that fails says so, naming itself.
    std::fs::write(
        dir.join("scheduler/v1/query.wasm"),
        crate::render::query_wasm(
            r#"{\"Err\": {\"kind\": \"InitError\", \"message\": \"no cluster named prod\"}}"#,
            r#"{\"Ok\": {}}"#,
            r#"{\"Ok\": null}"#,
        ),
    )
    .unwrap();
    let (code, _, stderr) = run_on("render", &dir, &[&base[..], &["--role", "api"]].concat());
    assert_eq!(code, 1);
    assert!(
        stderr.contains("scheduler/v1/query.wasm: init: InitError: no cluster named prod"),
        "{stderr}"
    );
}

#[test]
fn render_check_dir_parses_and_renders_a_template_dir() {
    let dir = example("minimal").join("templates/minimal/v1");
    let (code, stdout, stderr) = run(&["render", "-C", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.ends_with("ok\n"), "{stdout}");

    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("app");
    copy_tree(&dir, &broken);
    std::fs::write(
        broken.join("role.render.yaml"),
        "templates: {conf: nope.hbs}\n",
    )
    .unwrap();
    let (code, _, stderr) = run(&["render", "--check-dir", broken.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("role.render.yaml") && stderr.contains("nope.hbs"),
        "{stderr}"
    );
}

#[test]
fn check_ends_on_symlink_loops_and_names_links_out_big_and_deep_files() {
    let tmp = edited_example("minimal", &[]);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.yaml"), "password: hunter2\n").unwrap();
    let rt = tmp.path().join("runtime");
    std::fs::create_dir_all(rt.join("d")).unwrap();
    // The loops from the issue made the walk take 2^64 steps: check never ended.
    std::os::unix::fs::symlink("..", rt.join("d/up")).unwrap();
    std::os::unix::fs::symlink("../d", rt.join("d/self")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.yaml"), rt.join("secret.yaml")).unwrap();
    std::fs::write(rt.join("deep.yaml"), format!("a: {}", "[".repeat(100_000))).unwrap();
    std::fs::write(rt.join("big.txt"), "x".repeat(2 << 20)).unwrap();

    let mut child = Command::new(BIN)
        .args(["check", "--config-dir", tmp.path().to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_for(std::time::Duration::from_secs(60), || {
        child.try_wait().unwrap()
    });
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("verwalter check did not end on a symlink loop");
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("runtime/d/up: symlink loop"), "{stderr}");
    assert!(stderr.contains("runtime/d/self: symlink loop"), "{stderr}");
    let secret = outside.path().canonicalize().unwrap().join("secret.yaml");
    assert!(
        stderr.contains(&format!(
            "runtime/secret.yaml: symlink to {}, outside",
            secret.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("runtime/deep.yaml:1: nested deeper than 128 levels"),
        "{stderr}"
    );
    assert!(
        stderr.contains("runtime/big.txt: 2097152 bytes; runtime files are limited"),
        "{stderr}"
    );
    assert!(stderr.contains("5 problem(s)"), "{stderr}");
}

/// `verwalter check --placement-config FILE` with the environment `env`.
fn check_placement(file: &Path, env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(["check", "--placement-config", file.to_str().unwrap()])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_loads_wca_scheduler_config_and_names_the_line_of_a_problem() {
    let wca = Path::new(env!("CARGO_MANIFEST_DIR")).join("placement/tests/wca-configs");
    let kube = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
    ];
    let (code, stdout, stderr) = check_placement(&wca.join("config.yaml"), &kube);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("config.yaml: ok"), "{stdout}");
    assert!(
        stdout.contains(
            "algorithm \"algorithm\": !Score, dimensions [mem, cpu, membw_write, membw_read, wss]"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("Prometheus http://100.64.176.36:30900"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Kubernetes API https://10.96.0.1:443"),
        "{stdout}"
    );

    // docs/running.md shows this output whole: the PromQL run for the algorithm's dimensions.
    let doc = include_str!("../docs/running.md");
    let command = "  verwalter check --placement-config config.yaml\n";
    let shown = &doc[doc.find(command).expect("running.md shows the check") + command.len()..];
    let shown = &shown[..shown.find("\n\n$ ").unwrap() + 1];
    let path = wca.join("config.yaml").display().to_string();
    assert_eq!(stdout.replace(&path, "config.yaml"), shown);

    // The same file without the environment wca's pod has: the unset !Env names its line.
    let (code, _, stderr) = check_placement(&wca.join("config.yaml"), &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("config.yaml:5: "), "{stderr}");
    assert!(stderr.contains("KUBERNETES_SERVICE_HOST"), "{stderr}");

    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("algorithm: !Fit\nextra: !Magic {}\n", ":2: ", "Magic"),
        (
            "algorithm: !Fit\n  least_used_weight: 2\n",
            ":2: ",
            "least_used_weight",
        ),
        (
            "algorithm: !Fit\n  cpu_scale_factor: lots\n",
            ":2: ",
            "invalid type",
        ),
        (
            "algorithm: !Fit\n  data_provider: !ClusterDataProvider\n    kubeapi: !Kubeapi\n      port: http\n",
            ":4: ",
            "port \"http\"",
        ),
        (
            "loggers: {}\nalgorithm: !FitRiskAlgorithm {}\n",
            ":2: ",
            "does not support",
        ),
    ];
    for (i, (text, line, word)) in cases.into_iter().enumerate() {
        let file = tmp.path().join(format!("bad{i}.yaml"));
        std::fs::write(&file, text).unwrap();
        let (code, stdout, stderr) = check_placement(&file, &kube);
        assert_eq!(code, 1, "{text}: {stdout}");
        let expected = format!("bad{i}.yaml{line}");
        assert!(stderr.contains(&expected), "{text}: {stderr}");
        assert!(stderr.contains(word), "{text}: {stderr}");
    }
}

/// A config dir whose scheduler passes `schedule` through (`runtime/schedule.json`), with the
/// `service/v1` template of docs/graphs.md's example.
fn passthrough_dir(schedule: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    replace_file(
        &dir.join("scheduler/v1/main.lua"),
        crate::render::PASSTHROUGH,
    );
    replace_file(&dir.join("runtime/schedule.json"), schedule);
    crate::render::service_template(dir, &dir.join("out"));
    tmp
}

/// Issue 29: `verwalter check` said ok for a dependency cycle, a dependency on a role the node
/// does not have and a `$(...)` reference that finds nothing; `render --dry-run` printed
/// `$(database.host)` as it is. Both now say what the daemon says (its messages, from the same
/// code), and render docs/graphs.md's example as the daemon renders it.
#[test]
fn check_and_render_report_the_dependency_and_reference_errors_the_daemon_reports() {
    let example = doc_block(
        "graphs.md",
        "## Roles in dependency order (`depends_on`)",
        "json",
    );
    let good = passthrough_dir(&example);
    let (code, stdout, stderr) = run_on("check", good.path(), &["--hostname", "alpha"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(": ok;"), "{stdout}");
    let schedule = good.path().join("runtime/schedule.json");
    let render = |dir: &Path, role: &str| {
        run_on(
            "render",
            dir,
            &[
                "--schedule",
                dir.join("runtime/schedule.json").to_str().unwrap(),
                "--hostname",
                "alpha",
                "--role",
                role,
                "--dry-run",
            ],
        )
    };
    let (code, stdout, stderr) = render(good.path(), "app");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(
            "--- files.conf = templates/service/v1/service.conf.tera ---\npg://10.0.0.5:5432/app\n"
        ),
        "{stdout}"
    );
    assert!(schedule.is_file());

    let bad = passthrough_dir(
        &serde_json::json!({
            "vars": {"template": "service/v1"},
            "nodes": {"alpha": {"roles": {
                "x": {"depends_on": ["y"]},
                "y": {"depends_on": ["x"]},
                "e": {"depends_on": ["ghost"]},
                "database": {},
                "app": {"depends_on": ["database"],
                        "db_url": "pg://$(database.host):$(database.port)/app"},
                "fine": {},
            }}}
        })
        .to_string(),
    );
    let (code, stdout, stderr) = run_on("check", bad.path(), &["--hostname", "alpha"]);
    assert_eq!(code, 1, "{stdout}");
    for message in [
        "schedule: role \"x\" is in a dependency cycle: x -> y -> x",
        "schedule: role \"y\" is in a dependency cycle: x -> y -> x",
        "schedule: role \"e\" depends on \"ghost\", which is not a role of this node",
        "schedule: role \"app\": variable db_url: $(database.host) finds nothing",
    ] {
        assert!(stderr.contains(message), "{message}:\n{stderr}");
    }
    assert!(stderr.contains("4 problem(s)"), "{stderr}");
    // render refuses such a role as the daemon fails it, and renders the others.
    for (role, message) in [
        (
            "x",
            "verwalter render: role \"x\" is in a dependency cycle: x -> y -> x\n",
        ),
        (
            "app",
            "verwalter render: role \"app\": variable db_url: $(database.host) finds nothing\n",
        ),
    ] {
        let (code, stdout, stderr) = render(bad.path(), role);
        assert_eq!(code, 1, "{stdout}");
        assert!(stderr.ends_with(message), "{stderr}");
    }
    let (code, _, stderr) = render(bad.path(), "fine");
    assert_eq!(code, 0, "{stderr}");
}

/// The shell code of a markdown file that runs `target/release/verwalter` offline (every ```sh
/// block naming it, and every inline code span that starts with it; blocks that start the
/// daemon, `verwalter run`, are left to the daemon's tests), as written.
fn offline_commands(markdown: &str) -> Vec<String> {
    const BIN_PATH: &str = "target/release/verwalter ";
    let mut commands = Vec::new();
    let mut parts = markdown.split("```");
    let mut prose = parts.next();
    while let Some(text) = prose {
        // Inline spans may wrap over a line break: joined with a space, as the shell would.
        for (i, span) in text.split('`').enumerate() {
            if i % 2 == 1 && span.starts_with(BIN_PATH) {
                commands.push(span.split_whitespace().collect::<Vec<_>>().join(" "));
            }
        }
        if let Some(block) = parts.next()
            && let Some(code) = block.strip_prefix("sh\n")
            && code.contains(BIN_PATH)
            && !code.contains("verwalter run ")
        {
            commands.push(code.to_string());
        }
        prose = parts.next();
    }
    commands
}

/// Issue 31: the README's offline commands were `cargo run -- ...`, which compiled a debug build
/// from nothing without a word. They now use the binary `make run` built,
/// `target/release/verwalter`; here every one of them, and those of the examples' READMEs, runs
/// as written (with this test's binary at that path, in a dir that has the checkout's
/// `examples/` and the README's `captured-input.json`, copied from a live node's
/// `/v1/scheduler_input`).
#[test]
fn readme_offline_commands_run_as_written_with_the_built_binary() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("target/release")).unwrap();
    std::os::unix::fs::symlink(BIN, tmp.path().join("target/release/verwalter")).unwrap();
    std::os::unix::fs::symlink(top.join("examples"), tmp.path().join("examples")).unwrap();
    let (_site, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let input = wait_for(std::time::Duration::from_secs(20), || {
        let (code, body) = http_get(daemon.port, "/v1/scheduler_input")?;
        (code == 200 && body.contains("\"runtime\"")).then_some(body)
    })
    .expect("the node serves its scheduler input");
    std::fs::write(tmp.path().join("captured-input.json"), input).unwrap();

    let mut outputs = Vec::new();
    for readme in [
        "README.md",
        "examples/modules/README.md",
        "examples/placement-scheduler/README.md",
        "examples/wasm-scheduler/README.md",
        "examples/placement/README.md",
    ] {
        let text = std::fs::read_to_string(top.join(readme)).unwrap();
        assert!(
            !text.contains("cargo run -- "),
            "{readme}: a `cargo run --` without the word on its build"
        );
        for code in offline_commands(&text) {
            let out = Command::new("sh")
                .args(["-e", "-c", &code])
                .current_dir(tmp.path())
                .output()
                .unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
            assert!(
                out.status.success(),
                "{readme}:\n{code}\nfailed:\n{stdout}\n{stderr}"
            );
            outputs.push((readme, code, stdout, stderr));
        }
    }
    let counts: Vec<(&str, usize)> = ["README.md", "examples/"]
        .iter()
        .map(|p| (*p, outputs.iter().filter(|o| o.0.starts_with(p)).count()))
        .collect();
    // README.md: the two blocks of the tour, the placement scheduler, the simulator and the
    // wasm scheduler; one command in each example.
    assert_eq!(counts, [("README.md", 5), ("examples/", 4)]);
    let tour = &outputs[0];
    assert!(tour.2.contains("examples/minimal: ok;"), "{}", tour.2);
    assert!(tour.3.contains("web: v2 x2 on alpha"), "{}", tour.3);
    let render = &outputs[1];
    assert!(
        render.2.contains("# web on alpha (cluster demo)")
            && render
                .2
                .contains("--- commands (dry run) ---\nwould run: cat "),
        "{}\n{}",
        render.2,
        render.3
    );
    let schedule: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("schedule.json")).unwrap())
            .unwrap();
    assert_eq!(schedule["data"]["roles"]["web"]["version"], "v2");
}

/// The shell commands of the README's tour block (the one under "A five-minute tour"), one per
/// entry: comments and blank lines left out, lines ending in `\` joined with the next.
fn tour_commands(readme: &str) -> Vec<String> {
    let (_, after) = readme.split_once("\n## A five-minute tour\n").unwrap();
    let (_, block) = after.split_once("```sh\n").unwrap();
    let block = block.split_once("```").unwrap().0;
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = line.trim_end();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(start) => {
                current.push_str(start);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    commands
}

/// Issue 31: the README's tour, each command as written, against a node started as `make run`
/// starts it (`examples/minimal`, logs in `target/demo/log`, in a scratch dir), only the port
/// being the one the system gave it. A command that reads what the node reports is run again
/// until it shows what the README says it shows (the node answers within a second, as the tour
/// says, but a busy test machine may take longer); one that changes something runs once.
#[test]
fn the_readme_tour_runs_as_written() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(top.join("README.md")).unwrap();
    let commands = tour_commands(&readme);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("examples/minimal");
    copy_tree(&top.join("examples/minimal"), &config);
    let storage = tmp.path().join("target/demo/storage");
    std::fs::create_dir_all(&storage).unwrap();
    // The daemon's logs are `<storage>/log`; the tour reads them as `target/demo/log`.
    std::os::unix::fs::symlink(storage.join("log"), tmp.path().join("target/demo/log")).unwrap();
    let daemon = Daemon::start(&config, &storage);
    let address = format!("127.0.0.1:{}", daemon.port);

    // What each command of the tour shows, by a piece of the command.
    // The first piece a command contains decides: the more particular ones come first.
    let expected = [
        ("grep '^web:'", "web: v3 x3 on "),
        ("grep -A3 '\"errors\"'", "runtime/web/v4.yaml"),
        ("/v1/status.pretty | head", "\"leader\""),
        ("/v1/schedule.pretty", "\"roles\""),
        ("/v1/scheduler_input.pretty", "\"runtime\""),
        ("/v1/scheduler_debug_info", "web: v"),
        ("/v1/roles_data.pretty", "\"web\""),
        ("cat target/demo/log/web/latest", "web"),
        ("/v1/wait_action", "{\"ok\":\"web: 3 instance(s)\"}"),
        ("grep '^verwalter_scheduler'", "verwalter_scheduler"),
    ];
    let mut used = std::collections::BTreeSet::new();
    for command in &commands {
        let command = command.replace("127.0.0.1:8379", &address);
        let which = expected
            .iter()
            .position(|(piece, _)| command.contains(piece));
        let wanted = which.map(|i| expected[i].1);
        // A command that changes something (a file, an action) runs once; one that reads runs
        // again until it shows what is wanted.
        let writes =
            command.contains(" -d ") || !command.contains("curl") && !command.starts_with("cat ");
        let timeout = std::time::Duration::from_secs(if writes { 0 } else { 30 });
        let mut last = String::new();
        let ok = wait_for(timeout, || {
            let out = Command::new("sh")
                .args(["-e", "-c", &command])
                .current_dir(tmp.path())
                .output()
                .unwrap();
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            (out.status.success() && wanted.is_none_or(|text| stdout.contains(text))).then_some(())
        });
        assert!(
            ok.is_some(),
            "README tour: `{command}` did not show {wanted:?}:\n{last}\n{}",
            daemon.logs()
        );
        used.extend(which);
    }
    // Every expectation was met by a command of the tour (none left unused by a README edit).
    assert_eq!(used.len(), expected.len(), "{commands:#?}");
}
