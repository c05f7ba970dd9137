//! `verwalter extender` as kube-scheduler meets it: recorded requests (`fixtures/extender/`,
//! written from the wire format) through the real HTTP server with replies checked byte for
//! byte, the in-band `Error` (and `/readyz` 503 with the reason) while no snapshot is loaded,
//! namespaces, `/metrics` and `/status`, the snapshot file reloaded (a bad one keeps the last
//! good), start errors, the daemon serving the extender by its settings; and hostile clients against its connection and body
//! limits (docs/placement.md, "Connection and body limits").

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::{self, BIN, http_get, http_post, metric, replace_file, wait_for};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extender")
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

/// The port of an `Extender listening. addr=<ip>:<port>` log line.
pub(crate) fn extender_port(log: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains("Extender listening."))?;
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))?;
    addr.rsplit(':').next()?.parse().ok()
}

/// A running `verwalter extender`; killed when dropped.
pub(crate) struct Extender {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Extender {
    /// `verwalter extender --listen 127.0.0.1:0` with `args`, its log in `dir`.
    pub(crate) fn start(dir: &Path, args: &[&str]) -> Extender {
        Extender::start_logging(dir, args, "info")
    }

    /// [`Extender::start`] with `RUST_LOG` set to `rust_log`.
    fn start_logging(dir: &Path, args: &[&str], rust_log: &str) -> Extender {
        let log = dir.join("extender.log");
        let mut command = Command::new(BIN);
        command
            .arg("extender")
            .args(["--listen", "127.0.0.1:0"])
            .args(args);
        // "" starts it without RUST_LOG (the config's `loggers:` then apply).
        if rust_log.is_empty() {
            command.env_remove("RUST_LOG");
        } else {
            command.env("RUST_LOG", rust_log);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut extender = Extender {
            child,
            port: 0,
            log,
        };
        let port = wait_for(Duration::from_secs(30), || {
            if let Ok(Some(status)) = extender.child.try_wait() {
                panic!("the extender exited ({status}):\n{}", extender.logs());
            }
            extender_port(&extender.logs())
        });
        extender.port = port.unwrap_or_else(|| panic!("no listening line:\n{}", extender.logs()));
        extender
    }

    /// With the fixtures' config and `snapshot`.
    fn with_snapshot(dir: &Path, snapshot: &Path, more: &[&str]) -> Extender {
        Extender::with_snapshot_logging(dir, snapshot, more, "info")
    }

    fn with_snapshot_logging(
        dir: &Path,
        snapshot: &Path,
        more: &[&str],
        rust_log: &str,
    ) -> Extender {
        let config = fixtures().join("config.yaml");
        let mut args = vec![
            "--config",
            config.to_str().unwrap(),
            "--snapshot",
            snapshot.to_str().unwrap(),
        ];
        args.extend_from_slice(more);
        Extender::start_logging(dir, &args, rust_log)
    }

    /// The value of `series` on its `/metrics`.
    fn metric(&self, series: &str) -> f64 {
        metric(self.port, series).unwrap_or_else(|| panic!("no {series}:\n{}", self.logs()))
    }

    /// Polls `/metrics` until `series` is `value`.
    fn wait_metric(&self, series: &str, value: f64) {
        wait_for(Duration::from_secs(20), || {
            (metric(self.port, series) == Some(value)).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{series} never {value} (now {:?}):\n{}",
                metric(self.port, series),
                self.logs()
            )
        });
    }

    /// A connection that has sent `head` and `body` and keeps the socket open.
    fn send_raw(&self, head: &str, body: &[u8]) -> TcpStream {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        stream
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn post(&self, verb: &str, body: &str) -> (u16, String) {
        http_post(self.port, verb, "application/json", body.as_bytes())
    }

    pub(crate) fn status(&self) -> serde_json::Value {
        let (code, body) = http_get(self.port, "/status").unwrap();
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Polls `/status` until `ready` holds.
    pub(crate) fn wait_status(&self, what: &str, ready: impl Fn(&serde_json::Value) -> bool) {
        wait_for(Duration::from_secs(20), || {
            Some(self.status()).filter(&ready)
        })
        .unwrap_or_else(|| panic!("{what}: {}\n{}", self.status(), self.logs()));
    }

    pub(crate) fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Extender {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const CASES: [&str; 6] = [
    "nodenames",
    "full-nodes",
    "lowercase-keys",
    "other-namespace",
    "no-app-label",
    "unknown-app",
];

#[test]
fn recorded_requests_get_the_replies_kube_scheduler_expects() {
    let tmp = tempfile::tempdir().unwrap();
    let ext = Extender::with_snapshot(tmp.path(), &fixtures().join("snapshot.yaml"), &[]);
    for case in CASES {
        let request = fixture(&format!("{case}.request.json"));
        for verb in ["filter", "prioritize"] {
            let (code, body) = ext.post(&format!("/{verb}"), &request);
            assert_eq!(code, 200, "{case} {verb}: {body}");
            assert_eq!(
                body,
                fixture(&format!("{case}.{verb}.json")),
                "{case} {verb}"
            );
        }
    }
    // The reply shapes kube-scheduler depends on, spelled out for the main case.
    assert_eq!(
        ext.post("/filter", &fixture("nodenames.request.json")).1,
        r#"{"Nodes":null,"NodeNames":["node-1","node-3"],"FailedNodes":{"node-2":"Could not fit node for dimensions: missing (cpu: 2.0),(mem: 8.0)."},"FailedAndUnresolvableNodes":{},"Error":""}"#
    );
    assert_eq!(
        ext.post("/prioritize", &fixture("nodenames.request.json"))
            .1,
        r#"[{"Host":"node-1","Score":9},{"Host":"node-2","Score":3},{"Host":"node-3","Score":8}]"#
    );
    // A full Nodes list: the kept node objects come back as sent.
    let full: serde_json::Value =
        serde_json::from_str(&ext.post("/filter", &fixture("full-nodes.request.json")).1).unwrap();
    let sent: serde_json::Value =
        serde_json::from_str(&fixture("full-nodes.request.json")).unwrap();
    assert_eq!(full["Nodes"]["items"][0], sent["Nodes"]["items"][0]);
    assert_eq!(full["Nodes"]["items"][1], sent["Nodes"]["items"][2]);

    let (code, body) = ext.post("/filter", r#"{"Pod": {}, "NodeNames": "node-1"}"#);
    assert_eq!(code, 400);
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["field"], "NodeNames", "{body}");
    assert!(
        ext.logs().contains("passing the pod through"),
        "unknown app logged"
    );
}

#[test]
fn while_no_snapshot_is_loaded_filter_answers_an_error_then_decides_once_the_file_is_good() {
    let tmp = tempfile::tempdir().unwrap();
    let snapshot = tmp.path().join("data/snapshot.yaml");
    std::fs::create_dir_all(snapshot.parent().unwrap()).unwrap();
    let ext = Extender::with_snapshot(tmp.path(), &snapshot, &[]);
    let request = fixture("nodenames.request.json");

    let (code, body) = ext.post("/filter", &request);
    assert_eq!(code, 200);
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        reply["Error"]
            .as_str()
            .unwrap()
            .contains("placement data is not loaded yet"),
        "{body}"
    );
    assert_eq!(
        reply["NodeNames"],
        serde_json::json!(["node-1", "node-2", "node-3"])
    );
    assert_eq!(ext.post("/prioritize", &request).1, "[]");
    // Another namespace passes even now.
    let other = ext
        .post("/filter", &fixture("other-namespace.request.json"))
        .1;
    assert_eq!(other, fixture("other-namespace.filter.json"));
    let status = ext.status();
    assert_eq!(status["loaded"], false);
    assert!(
        status["errors"]["snapshot-file"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot read"),
        "{status}"
    );
    // The log says what is true: nothing was ever loaded, so no "last good" one stays.
    let logs = ext.logs();
    assert!(
        logs.contains("Cannot use the snapshot file; no snapshot loaded yet"),
        "{logs}"
    );
    assert!(!logs.contains("last good"), "{logs}");

    // An invalid file: still not loaded, the problem shown with its line.
    replace_file(&snapshot, "node_capacities:\n  node-1: {gpu: 1}\n");
    ext.wait_status("the parse error shown", |s| {
        s["errors"]["snapshot-file"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("snapshot.yaml:2"))
    });
    assert!(ext.post("/filter", &request).1.contains("not loaded yet"));
    // Not ready, saying why and what the file's problem is; alive all the same.
    let (code, body) = http_get(ext.port, "/readyz").unwrap();
    assert_eq!(code, 503, "{body}");
    let mut lines = body.lines();
    assert_eq!(
        lines.next(),
        Some(
            "not ready: the placement data is not loaded yet (no snapshot from the data sources \
             so far)"
        )
    );
    let problem = lines.next().unwrap();
    assert!(
        problem.starts_with("snapshot-file: ") && problem.contains("snapshot.yaml:2"),
        "{body}"
    );
    assert_eq!(http_get(ext.port, "/healthz"), Some((200, "ok\n".into())));

    // The file becomes good: decided, as with the file given from the start.
    replace_file(&snapshot, &fixture("snapshot.yaml"));
    ext.wait_status("loaded", |s| s["loaded"] == true);
    assert_eq!(http_get(ext.port, "/readyz"), Some((200, "ok\n".into())));
    assert_eq!(
        ext.post("/filter", &request).1,
        fixture("nodenames.filter.json")
    );
    let status = ext.status();
    assert_eq!(status["errors"], serde_json::json!({}));
    assert_eq!(
        (status["nodes"].as_u64(), status["apps"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(
        metric(
            ext.port,
            r#"verwalter_extender_requests_total{result="not_loaded",verb="filter"}"#
        ),
        Some(2.0)
    );
}

#[test]
fn a_changed_snapshot_file_is_reloaded_and_a_bad_one_keeps_the_last_good() {
    let tmp = tempfile::tempdir().unwrap();
    let snapshot = tmp.path().join("snapshot.json");
    let nodes = |node2_cpu: u32| {
        format!(
            r#"{{"node_capacities": {{"node-1": {{"cpu": 4, "mem": 8}}, "node-2": {{"cpu": {node2_cpu}, "mem": 64}}, "node-3": {{"cpu": 1, "mem": 1}}}},
                "apps_spec": {{"web": {{"cpu": 4, "mem": 16}}}}}}"#
        )
    };
    replace_file(&snapshot, &nodes(2));
    let ext = Extender::with_snapshot(tmp.path(), &snapshot, &[]);
    let request = fixture("nodenames.request.json");
    let kept = |ext: &Extender| {
        let reply: serde_json::Value =
            serde_json::from_str(&ext.post("/filter", &request).1).unwrap();
        reply["NodeNames"].clone()
    };
    assert_eq!(kept(&ext), serde_json::json!([]));
    assert_eq!(ext.status()["generation"], 1);

    // node-2 grows: reloaded without a restart.
    replace_file(&snapshot, &nodes(16));
    ext.wait_status("the new file", |s| s["generation"] == 2);
    assert_eq!(kept(&ext), serde_json::json!(["node-2"]));

    // A broken file: the last good snapshot stays in force, the problem is shown and logged.
    replace_file(&snapshot, "{\"node_capacities\": ");
    ext.wait_status("the error", |s| s["errors"]["snapshot-file"].is_object());
    assert_eq!(kept(&ext), serde_json::json!(["node-2"]));
    let status = ext.status();
    assert_eq!(
        (status["loaded"].clone(), status["generation"].clone()),
        (true.into(), 2.into())
    );
    assert!(
        status["errors"]["snapshot-file"]["message"]
            .as_str()
            .unwrap()
            .contains("snapshot.json:1: EOF while parsing"),
        "{status}"
    );
    assert_eq!(
        metric(
            ext.port,
            r#"verwalter_placement_source_failing{source="snapshot-file"}"#
        ),
        Some(1.0)
    );
    assert!(
        ext.logs()
            .contains("Cannot use the snapshot file; the last good snapshot stays."),
        "{}",
        ext.logs()
    );

    // Fixed again: the error goes, the metric with it.
    replace_file(&snapshot, &nodes(16));
    ext.wait_status("the error cleared", |s| {
        s["errors"] == serde_json::json!({})
    });
    let (_, text) = http_get(ext.port, "/metrics").unwrap();
    assert!(
        !text.contains("verwalter_placement_source_failing{"),
        "{text}"
    );
}

/// A data provider whose Kubernetes API refuses connections from the start: the log says no
/// data is loaded yet, not that the last good data is kept.
#[test]
fn a_source_failing_before_any_data_says_nothing_is_loaded() {
    let tmp = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let config = tmp.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "algorithm: !Fit\n  data_provider: !ClusterDataProvider\n    kubeapi: !Kubeapi\n      \
             host: http://127.0.0.1\n      port: {port}\n      client_token_path: {dir}/none\n",
            dir = tmp.path().display()
        ),
    )
    .unwrap();
    let ext = Extender::start(tmp.path(), &["--config", config.to_str().unwrap()]);
    ext.wait_status("the kubernetes error", |s| {
        s["errors"]["kubernetes"].is_object()
    });
    let logs = ext.logs();
    assert!(
        logs.contains("placement data source failed; no placement data loaded yet"),
        "{logs}"
    );
    assert!(!logs.contains("keeping the last good data"), "{logs}");
}

/// Plain HTTP sent to the extender's TLS port (kube-scheduler set up with `enableHTTPS: false`,
/// say) is closed and logged at warn with the client's address, not dropped silently.
#[test]
fn plain_http_to_the_tls_port_is_logged_with_the_peer() {
    let tmp = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_path, key_path) = (tmp.path().join("tls.crt"), tmp.path().join("tls.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let ext = Extender::with_snapshot(
        tmp.path(),
        &fixtures().join("snapshot.yaml"),
        &[
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
    );
    let body = fixture("nodenames.request.json");
    let mut stream = ext.send_raw(
        &format!(
            "POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        ),
        body.as_bytes(),
    );
    let local = stream.local_addr().unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let line = wait_for(Duration::from_secs(20), || {
        ext.logs()
            .lines()
            .find(|l| l.contains("Plain HTTP (or another protocol) sent to the TLS port"))
            .map(str::to_owned)
    })
    .unwrap_or_else(|| panic!("no log line:\n{}", ext.logs()));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&format!("peer={local}")), "{line}");
}

/// wca's `loggers:` take effect: `wca.scheduler: DEBUG` logs each decision with its reasons;
/// a logger verwalter has no counterpart for is refused with a line saying what to use; without
/// it (`INFO`), no decision is logged.
#[test]
fn wcas_loggers_set_the_log_filter_and_decisions_are_logged_with_their_reasons() {
    let request = fixture("nodenames.request.json");
    let start = |loggers: &str| {
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("config.yaml");
        std::fs::write(
            &config,
            format!("loggers:\n{loggers}algorithm: !LeastUsedBAR\n  dimensions: [cpu, mem]\n"),
        )
        .unwrap();
        let snapshot = fixtures().join("snapshot.yaml");
        let args = [
            "--config",
            config.to_str().unwrap(),
            "--snapshot",
            snapshot.to_str().unwrap(),
        ];
        (Extender::start_logging(tmp.path(), &args, ""), tmp)
    };

    let (ext, _tmp) = start("  wca.scheduler: DEBUG\n  urllib3: INFO\n");
    // The line is written before the reply is sent.
    assert_eq!(ext.post("/filter", &request).0, 200);
    assert_eq!(ext.post("/prioritize", &request).0, 200);
    let logs = ext.logs();
    let filter = logs
        .lines()
        .find(|l| l.contains("Filter decided."))
        .unwrap_or_else(|| panic!("no decision logged:\n{logs}"));
    assert!(filter.contains("DEBUG"), "{filter}");
    assert!(
        filter.contains("verwalter::placement::decisions"),
        "{filter}"
    );
    assert!(filter.contains(r#"kept=["node-1", "node-3"]"#), "{filter}");
    assert!(
        filter
            .contains(r#"failed={"node-2": "Could not fit node for dimensions: missing (cpu: 2.0"#),
        "{filter}"
    );
    let prioritize = logs
        .lines()
        .find(|l| l.contains("Prioritize decided."))
        .unwrap_or_else(|| panic!("no decision logged:\n{logs}"));
    // The scores of the recorded reply, as logged.
    let reply: Vec<serde_json::Value> =
        serde_json::from_str(&fixture("nodenames.prioritize.json")).unwrap();
    let scores: Vec<String> = reply
        .iter()
        .map(|p| format!("({}, {})", p["Host"], p["Score"]))
        .collect();
    assert!(
        prioritize.contains(&format!("scores=[{}]", scores.join(", "))),
        "{prioritize}"
    );
    // docs/placement.md shows these two lines.
    let doc = include_str!("../docs/placement.md");
    let block = &doc[doc
        .find("```text\nDEBUG verwalter::placement::decisions:")
        .expect("placement.md shows the decisions' log lines")
        + "```text\n".len()..];
    for shown in block[..block.find("```").unwrap()].lines() {
        let found = logs.lines().any(|l| match shown.split_once("...") {
            Some((head, _)) => l.contains(head),
            None => l.ends_with(shown),
        });
        assert!(found, "{shown:?} not in:\n{logs}");
    }
    assert!(
        logs.contains("loggers: urllib3 is not a wca logger verwalter has a counterpart for"),
        "{logs}"
    );
    assert!(
        logs.contains("RUST_LOG=info,verwalter::placement::decisions=debug"),
        "{logs}"
    );
    drop(ext);

    let (ext, _tmp) = start("  wca.scheduler: INFO\n");
    assert_eq!(ext.post("/filter", &request).0, 200);
    let logs = ext.logs();
    assert!(!logs.contains("decided."), "{logs}");
    assert!(!logs.contains("not applied"), "{logs}");
}

#[test]
fn namespaces_are_chosen_by_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let ext = Extender::with_snapshot(
        tmp.path(),
        &fixtures().join("snapshot.yaml"),
        &["--namespace", "batch"],
    );
    // The batch pod is decided, the default one passes.
    let batch = ext
        .post("/filter", &fixture("other-namespace.request.json"))
        .1;
    assert_eq!(batch, fixture("nodenames.filter.json"));
    let default = ext.post("/filter", &fixture("nodenames.request.json")).1;
    assert_eq!(default, fixture("other-namespace.filter.json"));
    assert_eq!(
        ext.post("/prioritize", &fixture("nodenames.request.json"))
            .1,
        "[]"
    );
    assert_eq!(ext.status()["namespaces"], serde_json::json!(["batch"]));
}

#[test]
fn metrics_count_requests_and_show_nodes_and_apps() {
    let tmp = tempfile::tempdir().unwrap();
    let ext = Extender::with_snapshot(tmp.path(), &fixtures().join("snapshot.yaml"), &[]);
    for case in [
        "nodenames",
        "other-namespace",
        "no-app-label",
        "unknown-app",
    ] {
        ext.post("/filter", &fixture(&format!("{case}.request.json")));
    }
    ext.post("/prioritize", &fixture("nodenames.request.json"));
    ext.post("/prioritize", "{");
    let (code, text) = http_get(ext.port, "/metrics").unwrap();
    assert_eq!(code, 200);
    for line in [
        r#"verwalter_extender_requests_total{result="decided",verb="filter"} 1"#,
        r#"verwalter_extender_requests_total{result="other_namespace",verb="filter"} 1"#,
        r#"verwalter_extender_requests_total{result="no_app_label",verb="filter"} 1"#,
        r#"verwalter_extender_requests_total{result="unknown_app",verb="filter"} 1"#,
        r#"verwalter_extender_requests_total{result="decided",verb="prioritize"} 1"#,
        r#"verwalter_extender_requests_total{result="bad_request",verb="prioritize"} 1"#,
        r#"verwalter_extender_request_duration_seconds_count{verb="filter"} 4"#,
        r#"verwalter_placement_node_capacity{node="node-2",resource="cpu"} 8"#,
        r#"verwalter_placement_node_used{node="node-2",resource="cpu"} 6"#,
        r#"verwalter_placement_node_free{node="node-2",resource="mem"} 8"#,
        r#"verwalter_placement_app_requested{app="web",resource="mem"} 16"#,
        "verwalter_placement_snapshot_loaded 1",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    let status = ext.status();
    assert_eq!(status["algorithm"], "least-used-bar");
    assert!(status["age_seconds"].as_f64().unwrap() >= 0.0);
    assert!(status["updated"].as_str().unwrap().ends_with('Z'));
}

/// `verwalter extender` that must not start: exit status 3 and one line naming the cause.
fn refused(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("extender")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn start_problems_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.yaml");
    let path = config.to_str().unwrap();
    std::fs::write(&config, "algorithms:\n  a: !Fit\n").unwrap();
    let err = refused(&["--config", path]);
    assert!(
        err.contains("no placement data source") && err.contains("--snapshot FILE"),
        "{err}"
    );
    std::fs::write(&config, "algorithms:\n  a: !Fit\n  b: !BAR\n").unwrap();
    let err = refused(&["--config", path, "--snapshot", "x.json"]);
    assert!(err.contains("several algorithms (a, b)"), "{err}");
    std::fs::write(&config, "algorithms:\n  a: !Fits\n").unwrap();
    let err = refused(&["--config", path]);
    assert!(
        err.contains("config.yaml: config:") && err.contains("line 2"),
        "{err}"
    );
    // A device as the config is refused without being read; so are bad limits.
    let err = refused(&["--config", "/dev/zero"]);
    assert!(
        err.contains("/dev/zero: cannot read: not a regular file (a character device)"),
        "{err}"
    );
    std::fs::write(&config, "algorithms:\n  a: !Fit\n").unwrap();
    let err = refused(&["--config", path, "--max-body-bytes", "0"]);
    assert!(err.contains("--max-body-bytes: must be above 0"), "{err}");
}

#[test]
fn the_daemon_serves_the_extender_when_its_settings_say_so() {
    let (tmp, config_dir, storage) = util::example_site("minimal");
    // With wca's `loggers:`, which the daemon does not apply (it says what to use instead).
    std::fs::write(
        tmp.path().join("placement.yaml"),
        format!(
            "loggers: {{wca.scheduler: DEBUG}}\n{}",
            fixture("config.yaml")
        ),
    )
    .unwrap();
    std::fs::copy(
        fixtures().join("snapshot.yaml"),
        tmp.path().join("snapshot.yaml"),
    )
    .unwrap();
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(
        &settings,
        "placement-extender:\n  listen: 127.0.0.1:0\n  config: placement.yaml\n  snapshot: snapshot.yaml\n  max-body-bytes: 1000\n",
    )
    .unwrap();
    let daemon = util::Daemon::launch(
        &config_dir,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    let port = wait_for(Duration::from_secs(10), || extender_port(&daemon.logs()))
        .unwrap_or_else(|| panic!("no extender line:\n{}", daemon.logs()));
    assert_ne!(port, daemon.port, "the extender has its own address");
    assert!(
        daemon.logs().contains(
            "placement-extender.config: loggers: not applied by the daemon (its log filter is \
             set before the settings are read); use RUST_LOG instead, e.g. \
             RUST_LOG=info,verwalter::placement::decisions=debug"
        ),
        "{}",
        daemon.logs()
    );
    let (code, body) = http_post(
        port,
        "/filter",
        "application/json",
        fixture("nodenames.request.json").as_bytes(),
    );
    assert_eq!((code, body), (200, fixture("nodenames.filter.json")));
    // Its limits are the settings': a body over `max-body-bytes` is refused up front.
    let mut over = TcpStream::connect(("127.0.0.1", port)).unwrap();
    over.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    over.write_all(filter_head(1001).as_bytes()).unwrap();
    let answer = read_answer(&mut over);
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    // The daemon's API is not on the extender's address, nor the extender on the daemon's.
    assert_eq!(http_get(port, "/v1/status").unwrap().0, 404);
    let (code, _) = http_post(daemon.port, "/filter", "application/json", b"{}");
    assert_ne!(code, 200);

    // A bad placement config stops the daemon at start, named.
    std::fs::write(
        tmp.path().join("placement.yaml"),
        "algorithms:\n  a: !Nope\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["run", "--hostname", "alpha", "--port", "0"])
        .args(["--override-machine-id", util::MACHINE_ID])
        .arg("--settings")
        .arg(&settings)
        .arg("--config-dir")
        .arg(&config_dir)
        .arg("--storage-dir")
        .arg(tmp.path().join("storage2"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("placement-extender.config: ") && stderr.contains("placement.yaml"),
        "{stderr}"
    );
    drop(daemon);
}

/// A request head for `POST /filter` announcing `length` bytes of body.
fn filter_head(length: u64) -> String {
    format!(
        "POST /filter HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    )
}

/// What the server sent on `stream` until it closed it (or reset it: then what came before).
fn read_answer(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("no answer: {e} (after {answer:?})"),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Clients that send a request head and one byte of its body, then nothing, hold every
/// connection the cap allows; a real request still gets its answer: the oldest of them is closed
/// to make room (as the daemon's API does with idle connections and clients that do not read).
#[test]
fn clients_trickling_bodies_at_the_cap_make_room_for_a_real_request() {
    let tmp = tempfile::tempdir().unwrap();
    let ext = Extender::with_snapshot_logging(
        tmp.path(),
        &fixtures().join("snapshot.yaml"),
        // A body timeout far away: only the eviction can free a connection here.
        &["--max-connections", "3", "--body-timeout-ms", "600000"],
        "info,verwalter::placement::extender=debug",
    );
    let reading = "Reading a request body.";
    let mut slow = Vec::new();
    for n in 1..=3 {
        slow.push(ext.send_raw(&filter_head(1000), b"{"));
        // Its head is parsed and its body being read: the connection is busy, not idle.
        wait_for(Duration::from_secs(20), || {
            (ext.logs().matches(reading).count() == n).then_some(())
        })
        .unwrap_or_else(|| panic!("slow client {n} not reading:\n{}", ext.logs()));
    }
    let (code, body) = ext.post("/filter", &fixture("nodenames.request.json"));
    assert_eq!(
        (code, body.as_str()),
        (200, fixture("nodenames.filter.json").as_str()),
        "{}",
        ext.logs()
    );
    // The oldest slow client was the one closed. (The probe of /metrics, at the cap too, may
    // close the real request's connection if it is not gone yet: at least one.)
    assert_eq!(read_answer(&mut slow[0]), "");
    assert!(ext.metric("verwalter_extender_connections_closed_total{reason=\"evicted\"}") >= 1.0);
}

/// Keep-alive connections left idle at the cap are closed to make room at once (they used to
/// hold every slot until the header timeout).
#[test]
fn idle_keep_alive_connections_at_the_cap_make_room() {
    let tmp = tempfile::tempdir().unwrap();
    let ext = Extender::with_snapshot(
        tmp.path(),
        &fixtures().join("snapshot.yaml"),
        &["--max-connections", "2", "--idle-timeout-ms", "600000"],
    );
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut stream = ext.send_raw("GET /status HTTP/1.1\r\nHost: extender\r\n\r\n", b"");
        // The answer is read whole (by its length), and the connection kept open.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(str::to_owned)
            })
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).unwrap();
        idle.push(stream);
    }
    let (code, _) = ext.post("/filter", &fixture("nodenames.request.json"));
    assert_eq!(code, 200, "{}", ext.logs());
    assert_eq!(
        read_answer(&mut idle[0]),
        "",
        "the oldest idle one was closed"
    );
}

/// A `Content-Length` over the body cap is refused with 413 before any of the body comes; a
/// body that keeps trickling in (never idle) is ended by the whole-body timeout with 408.
#[test]
fn an_oversized_length_gets_413_at_once_and_a_trickled_body_408() {
    let tmp = tempfile::tempdir().unwrap();
    let ext = Extender::with_snapshot(
        tmp.path(),
        &fixtures().join("snapshot.yaml"),
        &["--body-timeout-ms", "300", "--idle-timeout-ms", "600000"],
    );
    let mut huge = ext.send_raw(&filter_head(100_000_000_000), b"");
    let answer = read_answer(&mut huge);
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(answer.contains("over 67108864 bytes"), "{answer}");

    let mut trickle = ext.send_raw(&filter_head(1000), b"{");
    let mut writer = trickle.try_clone().unwrap();
    let feeder = std::thread::spawn(move || {
        // A byte every 50 ms (the attack; no wait on the extender): far within any idle
        // timeout between pieces, stopped by the extender closing the connection.
        for _ in 0..600 {
            if writer.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let answer = read_answer(&mut trickle);
    // The 408 is sent, but a client still sending may see the connection reset before it
    // reads it; the count says what the extender did either way.
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408 "),
        "{answer}"
    );
    ext.wait_metric(
        "verwalter_extender_bodies_refused_total{reason=\"timeout\"}",
        1.0,
    );
    assert_eq!(
        ext.metric("verwalter_extender_bodies_refused_total{reason=\"too_large\"}"),
        1.0
    );
    feeder.join().unwrap();
}

/// The bytes of all bodies held at once stay within `--body-budget-bytes`: while one request
/// holds nearly all of it, another is answered 503 (to retry), and once the first is answered
/// the budget is free again.
#[test]
fn request_bodies_together_stay_within_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let ext = Extender::with_snapshot(
        tmp.path(),
        &fixtures().join("snapshot.yaml"),
        &[
            "--max-body-bytes",
            "100000",
            "--body-budget-bytes",
            "100000",
        ],
    );
    let held = "verwalter_extender_body_bytes";
    // A real request padded to the full size, sent but for its last 10 bytes.
    let mut big = fixture("nodenames.request.json").into_bytes();
    big.resize(100_000, b' ');
    let mut first = ext.send_raw(&filter_head(100_000), &big[..99_990]);
    ext.wait_metric(held, 99_990.0);
    let (code, body) = ext.post("/filter", &fixture("nodenames.request.json"));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("retry later"), "{body}");
    assert_eq!(
        ext.metric("verwalter_extender_bodies_refused_total{reason=\"budget\"}"),
        1.0
    );
    // The rest comes: the first is answered, and gives its share back.
    first.write_all(&big[99_990..]).unwrap();
    let mut head = [0u8; 12];
    first.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    drop(first);
    ext.wait_metric(held, 0.0);
    let (code, body) = ext.post("/filter", &fixture("nodenames.request.json"));
    assert_eq!((code, body), (200, fixture("nodenames.filter.json")));
}
