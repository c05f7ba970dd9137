//! `examples/lithos` end to end: the daemon on a temp copy of the example renders each role's
//! lithos processes config and hands it to the stand-in `lithos_switch` (the crate
//! `lithos-switch`, `examples/lithos/lithos_switch.rs`), which is first in the daemon's `PATH`
//! and installs the files under a temp `LITHOS_ROOT`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::*;

/// Generous: the render controller's first retry comes within about a second, a new schedule
/// within about a second of an edit; this only bounds how long a broken build waits.
const SOON: Duration = Duration::from_secs(20);

/// The directory holding the stand-in (see [`package_binary`]).
fn stand_in_dir() -> PathBuf {
    package_binary(
        "lithos-switch",
        "lithos_switch",
        &example("lithos").join("lithos_switch.rs"),
    )
    .parent()
    .unwrap()
    .to_path_buf()
}

struct Site {
    _tmp: tempfile::TempDir,
    config: PathBuf,
    root: PathBuf,
    log_dir: PathBuf,
    daemon: Daemon,
}

impl Site {
    fn start() -> Site {
        let stand_in = stand_in_dir();
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("config");
        let root = tmp.path().join("lithos");
        let storage = tmp.path().join("storage");
        copy_tree(&example("lithos"), &config);
        let path = match std::env::var("PATH") {
            Ok(rest) if !rest.is_empty() => format!("{}:{rest}", stand_in.display()),
            _ => stand_in.display().to_string(),
        };
        let daemon = Daemon::start_with(
            &config,
            &storage,
            &[("PATH", &path), ("LITHOS_ROOT", root.to_str().unwrap())],
        );
        Site {
            _tmp: tmp,
            config,
            root,
            log_dir: storage.join("log"),
            daemon,
        }
    }

    fn processes_text(&self, role: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join("processes").join(format!("{role}.yaml"))).ok()
    }

    /// `$LITHOS_ROOT/processes/<role>.yaml`, parsed.
    fn processes(&self, role: &str) -> Option<Value> {
        let text = self.processes_text(role)?;
        Some(serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{role}: {e}\n{text}")))
    }

    /// `(sandbox, result)` of each line of `$LITHOS_ROOT/calls.log`.
    fn calls(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(self.root.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let mut parts = line.splitn(3, ' ');
                let _time = parts.next();
                let sandbox = parts.next().unwrap_or_default().to_string();
                (sandbox, parts.next().unwrap_or_default().to_string())
            })
            .collect()
    }

    fn status(&self) -> Value {
        self.daemon.json("/v1/status").unwrap_or_default()
    }

    /// `[time, deployment_id, pointer, marker]` lines of the deployment log index.
    fn index(&self) -> Vec<Value> {
        deployment_index(&self.log_dir)
    }

    /// Deployment ids under which `role` started.
    fn role_starts(&self, role: &str) -> Vec<String> {
        self.index()
            .iter()
            .filter(|l| l[3] == "RoleStart" && l[2]["fields"][0] == role)
            .map(|l| l[1].as_str().unwrap().to_string())
            .collect()
    }

    fn finished(&self, deployment_id: &str) -> bool {
        self.index()
            .iter()
            .any(|l| l[1] == deployment_id && l[3] == "DeploymentFinish")
    }

    /// Writes the runtime file of web `version` (image `web.<version>`), the way a deploy tool
    /// should (see [`replace_file`]).
    fn write_web(&self, version: &str, instances: i64) {
        replace_file(
            &self.config.join(format!("runtime/web/{version}.yaml")),
            &format!("image: web.{version}\nconfig: /config/web.yaml\ninstances: {instances}\n"),
        );
    }

    /// Waits until the installed web config runs the image of `version`; fails with `what`.
    fn wait_web_switched(&self, version: &str, what: &str) {
        let image = format!("web.{version}");
        wait_for(SOON, || {
            let web = self.processes("web")?;
            (web["web"]["image"] == image.as_str()).then_some(())
        })
        .unwrap_or_else(|| self.fail(what));
    }

    fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\ncalls: {:?}\nstatus: {}\ndaemon log:\n{}",
            self.calls(),
            self.status(),
            self.daemon.logs()
        )
    }
}

#[test]
fn lithos_example_switches_both_roles_then_only_the_changed_one_and_recovers_from_a_bad_config() {
    let site = Site::start();

    // Both roles are rendered and switched once, each by its own template engine.
    wait_for(SOON, || {
        let done = site.processes_text("web").is_some()
            && site.processes_text("worker").is_some()
            && site.calls().len() >= 2;
        done.then_some(())
    })
    .unwrap_or_else(|| site.fail("the roles were not switched"));
    let mut calls = site.calls();
    calls.sort();
    assert_eq!(
        calls,
        vec![("web".into(), "ok".into()), ("worker".into(), "ok".into())]
    );
    let web = site.processes("web").unwrap();
    assert_eq!(
        web,
        json!({"web": {"kind": "Daemon", "image": "web.v2", "config": "/config/web.yaml",
                       "instances": 3, "variables": {"PORT": "8080"}}})
    );
    let worker = site.processes("worker").unwrap();
    assert_eq!(
        worker,
        json!({"worker": {"kind": "Daemon", "image": "worker.v2", "config": "/config/worker.yaml",
                          "instances": 2, "variables": {"QUEUE": "jobs"}}})
    );
    assert!(site.processes_text("web").unwrap().contains("version v2"));
    let status = wait_for(SOON, || {
        let s = site.status();
        (s["failed_roles"] == json!([])).then_some(s)
    })
    .unwrap_or_else(|| site.fail("failed roles"));
    assert_eq!(status["num_errors"], 0, "{status}");
    let first_web = site.role_starts("web");
    assert_eq!(first_web.len(), 1);
    assert_eq!(site.role_starts("worker"), first_web, "one deployment id");
    let roles_data = site.daemon.json("/v1/roles_data").unwrap();
    assert_eq!(
        roles_data["to_render"]["worker"]["template"],
        "lithos-hbs/v1"
    );
    assert_eq!(roles_data["to_render"]["web"]["template"], "lithos-tera/v1");

    // A new version of web: web is switched again under a new deployment id, worker is not.
    let worker_before = site.processes_text("worker").unwrap();
    site.write_web("v3", 2);
    site.wait_web_switched("v3", "web v3 was not switched");
    let web_starts = site.role_starts("web");
    assert_eq!(web_starts.len(), 2, "{web_starts:?}");
    let new_id = web_starts[1].clone();
    assert_ne!(new_id, first_web[0]);
    // Once that deployment is over, nothing else ran.
    wait_for(SOON, || site.finished(&new_id).then_some(()))
        .unwrap_or_else(|| site.fail("the deployment did not finish"));
    let calls = site.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(calls[2], ("web".into(), "ok".into()));
    assert_eq!(site.role_starts("worker"), first_web, "worker not rendered");
    assert_eq!(site.processes_text("worker").unwrap(), worker_before);
    assert_eq!(site.processes("web").unwrap()["web"]["instances"], 2);

    // A version lithos would refuse: the scheduler passes it on, lithos_switch refuses it, the
    // role is shown as failing and retried; the installed config stays the last good one.
    site.write_web("v4", -1);
    let status = wait_for(SOON, || {
        let s = site.status();
        (s["failed_roles"] == json!(["web"])).then_some(s)
    })
    .unwrap_or_else(|| site.fail("web did not fail"));
    let error = status["errors"]["role web"].as_str().unwrap_or_default();
    assert!(
        error.contains("lithos_switch exited with status 1"),
        "{status}"
    );
    assert!(status["num_errors"].as_u64().unwrap() >= 1, "{status}");
    let refused = |calls: &[(String, String)]| {
        calls
            .iter()
            .filter(|(sandbox, result)| {
                sandbox == "web" && result.contains("not a valid lithos processes config")
            })
            .count()
    };
    // Retried without a new schedule (the backoff's first retry).
    wait_for(SOON, || (refused(&site.calls()) >= 2).then_some(()))
        .unwrap_or_else(|| site.fail("web was not retried"));
    let web = site.processes("web").unwrap();
    assert_eq!(
        web["web"]["image"], "web.v3",
        "the bad config is not installed"
    );
    let others: BTreeSet<String> = site.calls()[3..]
        .iter()
        .map(|(sandbox, _)| sandbox.clone())
        .collect();
    assert_eq!(others, BTreeSet::from(["web".to_string()]));

    // Fixed: the failure clears without a restart.
    site.write_web("v4", 1);
    site.wait_web_switched("v4", "the fixed v4 was not switched");
    let status = wait_for(SOON, || {
        let s = site.status();
        (s["failed_roles"] == json!([])).then_some(s)
    })
    .unwrap_or_else(|| site.fail("the failure did not clear"));
    assert_eq!(status["num_errors"], 0, "{status}");
    assert_eq!(site.processes("web").unwrap()["web"]["instances"], 1);
    assert_eq!(site.calls().last().unwrap(), &("web".into(), "ok".into()));
    assert_eq!(site.processes_text("worker").unwrap(), worker_before);
}
