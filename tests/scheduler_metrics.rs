//! `state.metrics`: the queries of `scheduler/v1/metrics.yaml` against a small test double of
//! Prometheus' query API (below; not a real Prometheus, the placement `sources` test runs one),
//! seen by a Lua scheduler that writes what it gets into the schedule, read back over
//! `/v1/schedule`; and the offline `verwalter schedule` with and without `--no-metrics`, and
//! `verwalter check` on a bad file.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

const SOON: Duration = Duration::from_secs(15);

/// A test double of Prometheus' `GET /api/v1/query?query=…`: answers `node_load1` with one
/// series `{instance="n1"}` of the value the test sets, `up` with two series, anything else
/// with an empty vector; or, when told to fail, HTTP 500. Thread per connection, one request
/// per connection (`Connection: close`).
#[derive(Clone)]
struct PromDouble {
    state: Arc<Mutex<(String, bool)>>,
    port: u16,
}

impl PromDouble {
    fn start(load: &str) -> PromDouble {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let double = PromDouble {
            state: Arc::new(Mutex::new((load.to_string(), false))),
            port,
        };
        let state = double.state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let state = state.clone();
                std::thread::spawn(move || answer(stream, &state));
            }
        });
        double
    }

    fn set_load(&self, load: &str) {
        self.state.lock().unwrap().0 = load.to_string();
    }

    fn set_failing(&self, failing: bool) {
        self.state.lock().unwrap().1 = failing;
    }
}

fn answer(stream: std::net::TcpStream, state: &Mutex<(String, bool)>) {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {}
        }
    }
    let target = request_line.split_whitespace().nth(1).unwrap_or("");
    let query = target.split_once("query=").map_or("", |(_, q)| q);
    let query = query.split('&').next().unwrap_or("");
    let (load, failing) = state.lock().unwrap().clone();
    let (status, body) = if failing {
        ("500 Internal Server Error", "overloaded\n".to_string())
    } else {
        let result = match query {
            "node_load1" => format!(r#"{{"metric":{{"instance":"n1"}},"value":[1.0,"{load}"]}}"#),
            "up" => r#"{"metric":{"instance":"n1","job":"node"},"value":[1.0,"1"]},{"metric":{"instance":"n2","job":"node"},"value":[1.0,"0"]}"#.to_string(),
            _ => String::new(),
        };
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{result}]}}}}"#
        );
        ("200 OK", body)
    };
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A scheduler that puts what it sees of `state.metrics` into the schedule:
/// `seen = {name = {values = {{instance, value}}, age, updated, error}}`.
const SCHEDULER: &str = r#"
local json = require "lib/json"
return {scheduler = function(state)
    local seen = {}
    for name, q in pairs(state.metrics) do
        local values = {}
        for i, s in ipairs(q.samples) do
            values[i] = {instance = s.labels.instance, value = s.value}
        end
        seen[name] = {values = values, count = #q.samples, age = q.age,
                      updated = q.updated, error = q.error}
    end
    seen.__runs = "yes"
    return json.encode({seen = seen}), "ok"
end}
"#;

fn metrics_yaml(port: u16) -> String {
    format!(
        "# what the scheduler gets as state.metrics\nprometheus: http://127.0.0.1:{port}\n\
         interval: 0.2\ntimeout: 2\nqueries:\n  load: node_load1\n  up: up\n"
    )
}

fn site(port: u16) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let (tmp, config, storage) = example_site("minimal");
    std::fs::write(config.join("scheduler/v1/main.lua"), SCHEDULER).unwrap();
    std::fs::write(config.join("scheduler/v1/metrics.yaml"), metrics_yaml(port)).unwrap();
    (tmp, config, storage)
}

fn seen(schedule: &Value, query: &str) -> Value {
    schedule["data"]["seen"][query].clone()
}

#[test]
fn the_scheduler_sees_the_declared_queries_keeps_the_last_answer_and_shows_a_bad_file() {
    let prom = PromDouble::start("1.5");
    let (_tmp, config, storage) = site(prom.port);
    // A period of an hour: every run after the first is one a change asked for.
    let settings = storage.with_extension("settings.yaml");
    std::fs::write(&settings, "scheduler:\n  period-ms: 3600000\n").unwrap();
    let daemon = Daemon::launch(
        &config,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    );

    let first = daemon.wait_json(SOON, "/v1/schedule", "no metrics in the schedule", |s| {
        seen(s, "load")["values"][0]["value"] == 1.5
    });
    let load = seen(&first, "load");
    assert_eq!(load["values"][0]["instance"], "n1", "{first}");
    assert!(load.get("error").is_none(), "no error: nil: {load}");
    assert!(load["age"].as_f64().is_some_and(|a| a >= 0.0), "{load}");
    assert!(load["updated"].as_u64().is_some(), "{load}");
    let up = seen(&first, "up");
    assert_eq!(up["count"], 2, "{up}");
    assert_eq!(
        up["values"][1],
        serde_json::json!({"instance": "n2", "value": 0})
    );

    // Rounds that confirm the same values run no scheduler: two more rounds (four answers)
    // come and go with the run count unchanged.
    let runs = metric(daemon.port, "verwalter_scheduler_runs_total").unwrap();
    let ok = "verwalter_scheduler_metrics_queries_total{result=\"ok\"}";
    let answered = metric(daemon.port, ok).unwrap();
    wait_for(SOON, || {
        metric(daemon.port, ok).filter(|n| *n >= answered + 4.0)
    })
    .expect("no further rounds");
    assert_eq!(
        metric(daemon.port, "verwalter_scheduler_runs_total"),
        Some(runs)
    );

    // New values re-run the scheduler (the period is an hour).
    prom.set_load("2.5");
    daemon.wait_json(SOON, "/v1/schedule", "new value not seen", |s| {
        seen(s, "load")["values"][0]["value"] == 2.5
    });

    // A failing Prometheus: the last answer stays, with the error.
    prom.set_failing(true);
    let failed = daemon.wait_json(SOON, "/v1/schedule", "error not seen", |s| {
        seen(s, "load")["error"]
            .as_str()
            .is_some_and(|e| e.contains("HTTP 500"))
    });
    let load = seen(&failed, "load");
    assert_eq!(load["values"][0]["value"], 2.5, "kept: {load}");
    assert!(seen(&failed, "up")["error"].is_string(), "{failed}");
    let failing = wait_for(SOON, || {
        metric(daemon.port, "verwalter_scheduler_metrics_failing").filter(|n| *n == 2.0)
    });
    assert_eq!(failing, Some(2.0), "{}", daemon.logs());
    assert!(
        metric(
            daemon.port,
            "verwalter_scheduler_metrics_queries_total{result=\"http_status\"}"
        )
        .is_some_and(|n| n >= 2.0)
    );
    assert!(daemon.logs().contains("Scheduler metrics query failed"));

    // A bad metrics.yaml is shown with its line; the queries it had go on.
    std::fs::write(
        config.join("scheduler/v1/metrics.yaml"),
        format!("{}  broken: ''\n", metrics_yaml(prom.port)),
    )
    .unwrap();
    let status = daemon.wait_json(SOON, "/v1/status", "bad metrics.yaml not shown", |s| {
        s["errors"].get("scheduler/v1/metrics.yaml").is_some()
    });
    let message = status["errors"]["scheduler/v1/metrics.yaml"]
        .as_str()
        .unwrap();
    assert!(message.starts_with("line 8: "), "{message}");
    assert!(message.contains("empty"), "{message}");
    prom.set_failing(false);
    let back = daemon.wait_json(SOON, "/v1/schedule", "recovery not seen", |s| {
        let load = seen(s, "load");
        load.get("error").is_none() && load["values"][0]["value"] == 2.5
    });
    assert!(
        seen(&back, "broken").is_null(),
        "the bad file's query: {back}"
    );
    assert!(seen(&back, "up")["count"] == 2, "{back}");
    assert!(daemon.logs().contains("scheduler/v1/metrics.yaml"));
}

/// `verwalter schedule` on `dir` with `args`: the schedule's `data`.
fn offline(dir: &Path, args: &[&str]) -> (Value, String) {
    let out = Command::new(BIN)
        .args([
            "schedule",
            "--hostname",
            "alpha",
            "--override-machine-id",
            MACHINE_ID,
        ])
        .arg("--config-dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let schedule: Value = serde_json::from_slice(&out.stdout).unwrap();
    (schedule["data"].clone(), stderr)
}

#[test]
fn offline_schedule_runs_the_queries_once_unless_told_not_to() {
    let prom = PromDouble::start("0.75");
    let (_tmp, config, _storage) = site(prom.port);
    let (data, _) = offline(&config, &[]);
    assert_eq!(data["seen"]["load"]["values"][0]["value"], 0.75, "{data}");
    assert_eq!(data["seen"]["load"]["age"], 0, "{data}");
    let (data, _) = offline(&config, &["--no-metrics"]);
    assert!(data["seen"].get("load").is_none(), "{data}");
    prom.set_failing(true);
    let (data, stderr) = offline(&config, &[]);
    assert_eq!(data["seen"]["load"]["count"], 0, "{data}");
    assert!(
        data["seen"]["load"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("HTTP 500")),
        "{data}"
    );
    assert!(
        stderr.contains("warning:") && stderr.contains("\"load\""),
        "{stderr}"
    );
    // `verwalter check` names a bad metrics.yaml with its line and fails.
    std::fs::write(
        config.join("scheduler/v1/metrics.yaml"),
        metrics_yaml(prom.port).replace("interval: 0.2", "interval: 0"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args([
            "check",
            "--hostname",
            "alpha",
            "--no-metrics",
            "--config-dir",
        ])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("scheduler/v1/metrics.yaml:3: interval: 0 is not a positive number"),
        "{stderr}"
    );
}
