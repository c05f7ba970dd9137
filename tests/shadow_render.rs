//! Shadow renders (issue 34): a role rendered with a candidate template beside its real one,
//! file by file, with no command run and nothing of the role's applied state touched, through
//! the API of a running node and through `verwalter render --shadow` (the docs' example as
//! written).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::*;

const SOON: Duration = Duration::from_secs(20);

/// A `minimal/v2` beside the example's `minimal/v1`: the file renamed `instances` to `replicas`,
/// a new file, and commands that would leave `marker` and `marker.sh` in `marks` if they ran.
fn add_candidate(config: &Path, marks: &Path) {
    let dir = config.join("templates/minimal/v2");
    std::fs::create_dir_all(&dir).unwrap();
    let m = marks.join("marker");
    let m = m.display();
    std::fs::write(
        dir.join("role.render.yaml"),
        format!(
            "templates:\n  conf: role.conf.hbs\n  limits: limits.hbs\ncommands:\n\
             - !Cmd [touch, \"{m}\"]\n- !Sh \"touch {m}.sh\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("role.conf.hbs"),
        "# {{role}} on {{node}} (cluster {{cluster}}), deployment {{deployment_id}}\n\
         version: {{version}}\nreplicas: {{instances}}\n",
    )
    .unwrap();
    std::fs::write(dir.join("limits.hbs"), "nofile=4096\n").unwrap();
}

/// `text` with what follows `deployment ` on each line cut (ids differ from pass to pass).
fn without_ids(text: &str) -> String {
    text.lines()
        .map(|l| match l.split_once("deployment ") {
            Some((head, _)) => format!("{head}deployment <id>\n"),
            None => format!("{l}\n"),
        })
        .collect()
}

#[test]
fn a_shadow_render_on_a_node_gives_the_file_diff_and_applies_nothing() {
    let (site, config, storage) = example_site("minimal");
    add_candidate(&config, site.path());
    let daemon = Daemon::start(&config, &storage);
    // The real render of web (minimal/v1) is applied: its hash, staging file and log are in.
    let applied = wait_for(SOON, || {
        std::fs::read_to_string(storage.join("roles/web.applied")).ok()
    })
    .expect("web is applied");
    let staged = std::fs::read_to_string(storage.join("staging/web/0.conf")).unwrap();
    // The whole first pass (web and cache) is in the deployment log before it is compared.
    let index = wait_for(SOON, || {
        let index = deployment_index(&storage.join("log"));
        index
            .iter()
            .any(|entry| entry[3] == "DeploymentFinish")
            .then_some(index)
    })
    .expect("the first pass finishes");

    let (code, body) = http_post(
        daemon.port,
        "/v1/shadow/render/web",
        "application/json",
        br#"{"template_version": "v2"}"#,
    );
    assert_eq!(code, 200, "{body}");
    // What docs/http-api.md shows, the deployment id aside (one pass for both sides: its line
    // is context, not a change).
    let ids_masked = |mut v: Value| {
        for file in v["files"].as_array_mut().unwrap() {
            file["diff"] = Value::String(without_ids(file["diff"].as_str().unwrap()));
        }
        v
    };
    let got: Value = serde_json::from_str(&body).unwrap();
    let documented = doc_block("http-api.md", "## `/v1/shadow/render/<role>`", "json");
    let documented: Value = serde_json::from_str(&documented).unwrap();
    assert_eq!(ids_masked(got.clone()), ids_masked(documented));
    assert_eq!(
        without_ids(got["files"][0]["diff"].as_str().unwrap()),
        "--- real/templates/minimal/v1/role.conf.hbs\n\
         +++ shadow/templates/minimal/v2/role.conf.hbs\n\
         @@ -1,3 +1,3 @@\n # web on alpha (cluster demo), deployment <id>\n version: v2\n\
         -instances: 2\n+replicas: 2\n"
    );
    // Nothing ran and nothing of the role changed: no marker, the same applied hash, staging
    // file and deployment log; the scratch dir is gone.
    assert!(!site.path().join("marker").exists());
    assert!(!site.path().join("marker.sh").exists());
    assert_eq!(
        std::fs::read_to_string(storage.join("roles/web.applied")).unwrap(),
        applied
    );
    assert_eq!(
        std::fs::read_to_string(storage.join("staging/web/0.conf")).unwrap(),
        staged
    );
    assert_eq!(deployment_index(&storage.join("log")), index);
    let scratch: Vec<_> = std::fs::read_dir(storage.join("shadow-render"))
        .unwrap()
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");

    // Refusals name what is wrong.
    let post = |path: &str, content_type: &str, body: &str| {
        http_post(daemon.port, path, content_type, body.as_bytes())
    };
    let (code, body) = post(
        "/v1/shadow/render/web",
        "application/json",
        r#"{"template_version": "v9"}"#,
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("shadow: templates/minimal/v9"), "{body}");
    // ... and the log says so.
    wait_for(SOON, || {
        let log = std::fs::read_to_string(&daemon.log).ok()?;
        log.lines()
            .any(|l| l.contains("Shadow render failed.") && l.contains("templates/minimal/v9"))
            .then_some(())
    })
    .expect("the failure is logged");
    let (code, body) = post(
        "/v1/shadow/render/nope",
        "application/json",
        r#"{"template_version": "v2"}"#,
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("role \\\"nope\\\" is not assigned to \\\"alpha\\\""),
        "{body}"
    );
    let (code, body) = post(
        "/v1/shadow/render/web",
        "application/json",
        r#"{"template_version": "../../etc"}"#,
    );
    assert_eq!(code, 400, "{body}");
    let (code, _) = post("/v1/shadow/render/web", "text/plain", "v2");
    assert_eq!(code, 415);
    assert!(!site.path().join("marker").exists());
}

#[test]
fn render_shadow_runs_the_docs_example_as_written_and_no_command() {
    let tmp = tempfile::tempdir().unwrap();
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::os::unix::fs::symlink(top.join("examples"), tmp.path().join("examples")).unwrap();
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |code: &str| {
        let out = Command::new("sh")
            .args(["-e", "-c", code])
            .current_dir(tmp.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let example = doc_block("rendering.md", "## Shadow renders", "sh");
    let (code, stdout, stderr) = run(&example);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let shown = doc_block("rendering.md", "## Shadow renders", "text");
    assert_eq!(without_ids(&stdout), without_ids(&shown), "{stderr}");

    // Commands that would leave a mark do not run; a candidate that renders the same says so.
    add_candidate(&tmp.path().join("demo"), tmp.path());
    let shadow = |extra: &str| {
        run(&format!(
            "verwalter render --config-dir demo --role web --schedule schedule.json \
             --hostname alpha {extra}"
        ))
    };
    let (code, stdout, stderr) = shadow("--shadow minimal/v2");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("=== role.render.yaml:limits (added) ===\n"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(
            "web: templates/minimal/v1 -> templates/minimal/v2: 2 differing, 0 the same; no \
             command was run\n"
        ),
        "{stdout}"
    );
    assert!(!tmp.path().join("marker").exists());
    assert!(!tmp.path().join("marker.sh").exists());
    let (code, stdout, _) = shadow("--shadow v1");
    assert_eq!(code, Some(0));
    assert_eq!(
        stdout,
        "web: templates/minimal/v1 -> templates/minimal/v1: 0 differing, 1 the same; no command \
         was run\n"
    );
    // Another schedule's variables (a shadow scheduler's): what it changes in the files.
    let schedule: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("schedule.json")).unwrap())
            .unwrap();
    let mut other = schedule["data"].clone();
    other["roles"]["web"]["instances"] = json!(5);
    other["nodes"]["alpha"]["roles"]["web"]["instances"] = json!(5);
    std::fs::write(tmp.path().join("shadow.json"), other.to_string()).unwrap();
    let (code, stdout, stderr) = shadow("--shadow-schedule shadow.json");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("\n-instances: 2\n+instances: 5\n"),
        "{stdout}"
    );
    // Errors: an unknown candidate, and --shadow-schedule without --schedule.
    let (code, _, stderr) = shadow("--shadow v9");
    assert_eq!(code, Some(1));
    assert!(
        stderr.starts_with("verwalter render: shadow: templates/minimal/v9"),
        "{stderr}"
    );
    let (code, _, _) = run(
        "verwalter render --config-dir demo --role web --vars x.yaml \
                            --shadow-schedule shadow.json",
    );
    assert_eq!(code, Some(2));
}

/// `scheduler/wide`: the example's scheduler, but each node's share of each role is 7 where it
/// was 2 (a role variable a template prints).
pub(crate) fn wide_shadow(config: &Path) {
    crate::shadow::v1_shadow(
        config,
        "wide",
        "return {scheduler = function(state)\n  local text, log = scheduler(state)\n  \
         return (text:gsub('\"instances\":2', '\"instances\":7')), log\nend}\n",
    );
}

#[test]
fn a_shadow_render_from_a_shadow_schedulers_output_shows_what_it_would_change_in_the_files() {
    let (site, config, storage) = example_site("minimal");
    add_candidate(&config, site.path());
    // `wide` (below); `bare` assigns no role; `fail` fails.
    wide_shadow(&config);
    crate::shadow::lua_shadow(
        &config,
        "bare",
        "return {scheduler = function(state) return '{\"roles\":{},\"nodes\":{}}', '' end}\n",
    );
    crate::shadow::lua_shadow(
        &config,
        "fail",
        "return {scheduler = function(state) error('the failing shadow') end}\n",
    );
    std::fs::write(
        config.join("scheduler/shadow.yaml"),
        "shadows: [wide, bare, fail]\n",
    )
    .unwrap();
    let daemon = crate::shadow::start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let (real, _) = crate::shadow::real_round(&daemon);
    let wide = crate::shadow::run_on(&daemon, "wide", &real);
    assert_eq!(wide["result"], "differs", "{wide}");
    let bare = crate::shadow::run_on(&daemon, "bare", &real);
    assert_eq!(bare["result"], "differs", "{bare}");
    let fail = crate::shadow::run_on(&daemon, "fail", &real);
    assert_eq!(fail["result"], "failed", "{fail}");
    let post = |body: &str| {
        http_post(
            daemon.port,
            "/v1/shadow/render/web",
            "application/json",
            body.as_bytes(),
        )
    };

    // The role's variables from `wide`'s output, the same template: what the shadow changes.
    let (code, body) = post(r#"{"shadow": "wide"}"#);
    assert_eq!(code, 200, "{body}");
    let got: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(got["real_template"], "minimal/v1", "{got}");
    assert_eq!(got["shadow_template"], "minimal/v1", "{got}");
    assert_eq!(got["files"].as_array().unwrap().len(), 1, "{got}");
    assert_eq!(
        without_ids(got["files"][0]["diff"].as_str().unwrap()),
        "--- real/templates/minimal/v1/role.conf.hbs\n\
         +++ shadow/templates/minimal/v1/role.conf.hbs\n\
         @@ -1,3 +1,3 @@\n # web on alpha (cluster demo), deployment <id>\n version: v2\n\
         -instances: 2\n+instances: 7\n"
    );
    // With a candidate template too: both changes in one diff, and the candidate's new file.
    let (code, body) = post(r#"{"shadow": "wide", "template_version": "v2"}"#);
    assert_eq!(code, 200, "{body}");
    let got: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(got["shadow_template"], "minimal/v2", "{got}");
    assert!(
        got["files"][0]["diff"]
            .as_str()
            .unwrap()
            .ends_with("-instances: 2\n+replicas: 7\n"),
        "{got}"
    );
    assert_eq!(got["files"][1]["kind"], "added", "{got}");

    // Errors name what is missing.
    let refused = |body: &str, wanted: &str| {
        let (code, answer) = post(body);
        assert_eq!(code, 400, "{body}: {answer}");
        let error: Value = serde_json::from_str(&answer).unwrap();
        let error = error["error"].as_str().unwrap();
        assert!(error.contains(wanted), "{body}: {error}");
    };
    refused(r#"{"shadow": "nope"}"#, r#"no shadow "nope""#);
    refused(
        r#"{"shadow": "fail"}"#,
        r#"shadow "fail" has no run with an output"#,
    );
    refused(
        r#"{"shadow": "bare"}"#,
        &format!(
            r#"shadow: role "web" is not assigned to "alpha" in shadow "bare"'s run {} (its roles: none)"#,
            bare["run"]
        ),
    );
    refused("{}", "name a candidate");
    wait_for(SOON, || {
        let log = std::fs::read_to_string(&daemon.log).ok()?;
        log.lines()
            .any(|l| l.contains("Shadow render failed.") && l.contains("no shadow"))
            .then_some(())
    })
    .expect("the refusal is logged");
    // Nothing ran.
    assert!(!site.path().join("marker").exists());
    assert!(!site.path().join("marker.sh").exists());
}

/// Runs `code` with `sh -e` in `dir` (with the tested binary first on `PATH`): exit status,
/// stdout, stderr.
fn sh_in(dir: &Path, code: &str) -> (Option<i32>, String, String) {
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .args(["-e", "-c", code])
        .current_dir(dir)
        .env("PATH", &path)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn the_render_examples_run_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::os::unix::fs::symlink(top.join("examples"), tmp.path().join("examples")).unwrap();
    // The dry run: its output as shown, the deployment id and the temporary dir's name aside.
    let heading = "**The example config dir, showing the commands instead of running them:**";
    let (code, stdout, stderr) = sh_in(tmp.path(), &doc_block("rendering.md", heading, "sh"));
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let masked = |text: &str| -> String {
        without_ids(text)
            .lines()
            .map(|l| match l.strip_prefix("would run: cat ") {
                Some(file) if file.contains("/verwalter-render.") => {
                    format!(
                        "would run: cat <tmp>/{}\n",
                        file.rsplit('/').next().unwrap()
                    )
                }
                _ => format!("{l}\n"),
            })
            .collect()
    };
    let shown = doc_block("rendering.md", heading, "text");
    assert_eq!(masked(&stdout), masked(&shown), "{stdout}");
    assert!(stdout.contains("would run: cat /"), "{stdout}");

    // Hand-written variables: the command runs.
    let heading = "**Hand-written variables** (commands run unless `-n`):";
    let (code, stdout, stderr) = sh_in(tmp.path(), &doc_block("rendering.md", heading, "sh"));
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("version: v7\ninstances: 3\n"),
        "{stdout}\n{stderr}"
    );
}
