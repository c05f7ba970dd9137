//! `verwalter graph` against Debian's real `nats-server` (`make nats-deps`), on loopback, with a
//! worker written here (an async-nats client) that answers the dispatches.
//!
//! The test client subscribes to `>` once, so it sees every message in the order the server
//! delivered them to it: "nothing was published before X" is checked against an event that must
//! come after X (a probe build's dispatch), never by waiting.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use crate::util::BIN;

const WAIT: Duration = Duration::from_secs(30);

/// The `nats-server` binary: `$NATS_SERVER`, Debian's `/usr/bin/nats-server`, or on `PATH`.
fn nats_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("NATS_SERVER") {
        return p.into();
    }
    let debian = Path::new("/usr/bin/nats-server");
    if debian.exists() {
        return debian.to_owned();
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("nats-server"))
                .find(|p| p.is_file())
        })
        .expect("nats-server is missing: `make nats-deps` (apt-get install nats-server)")
}

/// A `nats-server` child on 127.0.0.1, killed on drop.
pub(crate) struct Nats {
    child: Child,
    pub(crate) port: u16,
    log: PathBuf,
}

impl Nats {
    /// On a port the server picks (`-p -1`), read back from its log.
    pub(crate) fn start(dir: &Path) -> Nats {
        Nats::on(dir, None)
    }

    /// `port`: again on the port of a server that was stopped.
    fn on(dir: &Path, port: Option<u16>) -> Nats {
        Nats::with_args(dir, port, &[])
    }

    /// A server that takes payloads of at most `bytes` (its config file says so).
    fn with_max_payload(dir: &Path, bytes: usize) -> Nats {
        let config = dir.join("nats.conf");
        std::fs::write(&config, format!("max_payload: {bytes}\n")).unwrap();
        Nats::with_args(dir, None, &["-c".as_ref(), config.as_os_str()])
    }

    /// A server that takes only user `user` with `password`.
    pub(crate) fn with_password(dir: &Path, user: &str, password: &str) -> Nats {
        let config = dir.join("nats-auth.conf");
        let text =
            format!("authorization {{\n  user: \"{user}\"\n  password: \"{password}\"\n}}\n");
        std::fs::write(&config, text).unwrap();
        Nats::with_args(dir, None, &["-c".as_ref(), config.as_os_str()])
    }

    pub(crate) fn with_args(dir: &Path, port: Option<u16>, args: &[&std::ffi::OsStr]) -> Nats {
        let log = dir.join(format!("nats-{}.log", port.unwrap_or(0)));
        let child = Command::new(nats_binary())
            .args(args)
            .args(["-a", "127.0.0.1", "-p"])
            .arg(port.map_or("-1".to_string(), |p| p.to_string()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut nats = Nats {
            child,
            port: 0,
            log,
        };
        let found = wait_until(|| {
            let text = std::fs::read_to_string(&nats.log).unwrap_or_default();
            if !text.contains("Server is ready") {
                return None;
            }
            let line = text
                .lines()
                .find(|l| l.contains("Listening for client connections on"))?;
            line.rsplit(':').next()?.trim().parse::<u16>().ok()
        });
        nats.port = found.unwrap_or_else(|| {
            panic!(
                "nats-server did not start:\n{}",
                std::fs::read_to_string(&nats.log).unwrap_or_default()
            )
        });
        nats
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `verwalter graph` as a child, killed on drop.
pub(crate) struct Executor {
    child: Child,
    log: PathBuf,
}

impl Executor {
    pub(crate) fn start(url: &str, storage: &Path, timeout_s: f64, log: &Path) -> Executor {
        Executor::start_with(url, storage, timeout_s, log, &[])
    }

    pub(crate) fn start_with(
        url: &str,
        storage: &Path,
        timeout_s: f64,
        log: &Path,
        args: &[&str],
    ) -> Executor {
        let child = Command::new(BIN)
            .args(["graph", "--nats-url", url, "--storage-dir"])
            .arg(storage)
            .arg("--component-timeout")
            .arg(timeout_s.to_string())
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let executor = Executor {
            child,
            log: log.to_owned(),
        };
        executor.wait_log("Graph executor running.", 1);
        executor
    }

    pub(crate) fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `text` is in the log `n` times.
    pub(crate) fn wait_log(&self, text: &str, n: usize) {
        if wait_until(|| (self.logs().matches(text).count() >= n).then_some(())).is_none() {
            panic!("no {n}x {text:?} in the executor's log:\n{}", self.logs());
        }
    }

    fn kill9(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        let _ = self.child.wait();
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn wait_until<T>(mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    crate::util::wait_for(WAIT, &mut probe)
}

/// The test's NATS client: every message it sees, in order, and a way to answer.
pub(crate) struct Client {
    client: async_nats::Client,
    seen: Arc<Mutex<Vec<(String, Value)>>>,
    reconnects: Arc<Mutex<usize>>,
}

impl Client {
    pub(crate) async fn connect(url: &str) -> Client {
        let reconnects = Arc::new(Mutex::new(0usize));
        let counted = reconnects.clone();
        let client = async_nats::ConnectOptions::new()
            .reconnect_delay_callback(|n| Duration::from_millis(100 * n as u64).min(WAIT / 15))
            .event_callback(move |event| {
                let counted = counted.clone();
                async move {
                    if matches!(event, async_nats::Event::Connected) {
                        *counted.lock().unwrap() += 1;
                    }
                }
            })
            .connect(url)
            .await
            .unwrap();
        let mut all = client.subscribe(">").await.unwrap();
        client.flush().await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Some(m) = all.next().await {
                let payload = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
                log.lock().unwrap().push((m.subject.to_string(), payload));
            }
        });
        Client {
            client,
            seen,
            reconnects,
        }
    }

    pub(crate) async fn publish(&self, subject: &str, payload: &Value) {
        self.client
            .publish(
                subject.to_string(),
                serde_json::to_vec(payload).unwrap().into(),
            )
            .await
            .unwrap();
        self.client.flush().await.unwrap();
    }

    /// Messages seen so far whose subject `matches`.
    fn seen(&self, matches: impl Fn(&str, &Value) -> bool) -> Vec<(String, Value)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, p)| matches(s, p))
            .cloned()
            .collect()
    }

    /// Waits until `n` messages match, and returns them.
    pub(crate) async fn wait(
        &self,
        n: usize,
        what: &str,
        matches: impl Fn(&str, &Value) -> bool,
    ) -> Vec<(String, Value)> {
        let deadline = Instant::now() + WAIT;
        loop {
            let found = self.seen(&matches);
            if found.len() >= n {
                return found;
            }
            if Instant::now() > deadline {
                panic!("waited for {n} x {what}; seen: {:#?}", self.subjects());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn subjects(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(s, p)| {
                format!(
                    "{s} {}",
                    p.get("_component_id")
                        .or(p.get("id"))
                        .unwrap_or(&Value::Null)
                )
            })
            .collect()
    }

    /// Answers a dispatch with `.done` (or `.error`), its payload plus `extra`.
    pub(crate) async fn answer(&self, dispatch: &(String, Value), errored: bool, extra: Value) {
        let mut payload = dispatch.1.clone();
        for (k, v) in extra.as_object().unwrap() {
            payload[k] = v.clone();
        }
        let suffix = if errored { "error" } else { "done" };
        self.publish(&format!("{}.{suffix}", dispatch.0), &payload)
            .await;
    }
}

/// A dispatch: three tokens, not one of the executor's results.
fn is_dispatch(subject: &str) -> bool {
    subject.split('.').count() == 3 && !subject.starts_with("build.")
}

pub(crate) fn dispatch_of<'a>(
    build: &'a str,
    id: &'a str,
) -> impl Fn(&str, &Value) -> bool + use<'a> {
    move |s, p| is_dispatch(s) && p["service"] == build && p["_component_id"] == id
}

pub(crate) fn result_of<'a>(build: &'a str) -> impl Fn(&str, &Value) -> bool + use<'a> {
    move |s, p| s.starts_with("build.") && s.split('.').count() == 3 && p["id"] == build
}

fn service_build() -> Value {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/graphs/ernest-service/build.json"),
    )
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// What the example's fake cloud answers for each kind of component.
pub(crate) fn outputs(id: &str) -> Value {
    match id {
        "network::web" => json!({"network_aws_id": "subnet-1"}),
        "firewall::web-sg" => json!({"security_group_aws_id": "sg-1"}),
        "instance::web-1" => json!({"instance_aws_id": "i-1", "ip": "10.0.1.11"}),
        "instance::web-2" => json!({"instance_aws_id": "i-2", "ip": "10.0.1.12"}),
        "elb::web-lb" => json!({"dns_name": "web-lb.example"}),
        _ => json!({}),
    }
}

/// A build with one component, to probe the executor's order of events.
fn probe_build(id: &str) -> Value {
    json!({"id": id, "changes": [{"_component_id": "probe::p", "_component": "probe",
        "_action": "create", "_provider": "fake"}]})
}

/// A `nats-server` in `dir`, `verwalter graph` connected to it (storage `dir/graph`, log
/// `dir/executor.log`, components timed out after 60 s) and a test client.
async fn started(dir: &Path) -> (Nats, Executor, Client) {
    let nats = Nats::start(dir);
    let executor = Executor::start(
        &nats.url(),
        &dir.join("graph"),
        60.0,
        &dir.join("executor.log"),
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    let client = Client::connect(&nats.url()).await;
    (nats, executor, client)
}

/// Sends a probe build and waits for its dispatch: every message the executor received
/// before it has been handled, and what that published was delivered before the dispatch.
async fn probe(client: &Client, id: &'static str) -> (String, Value) {
    client.publish("build.create", &probe_build(id)).await;
    client
        .wait(1, id, dispatch_of(id, "probe::p"))
        .await
        .remove(0)
}

/// The index of the first message matching `f` in what the client saw.
fn position(client: &Client, f: impl Fn(&str, &Value) -> bool) -> usize {
    client
        .seen
        .lock()
        .unwrap()
        .iter()
        .position(|(s, p)| f(s, p))
        .expect("seen")
}

/// docs/graphs.md's build under "The build", sent exactly as written: the network goes first,
/// the firewall's `network_aws_id` is filled from the network's answer, and the result has
/// ernest's fields (`action` from the subject, `name`, `username`, `options`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_build_example_of_the_docs_runs_as_the_docs_say() {
    let example: Value = serde_json::from_str(&crate::util::doc_block(
        "graphs.md",
        "### The build",
        "json",
    ))
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (_nats, _executor, client) = started(tmp.path()).await;

    client.publish("build.create", &example).await;
    let network = client
        .wait(1, "the network", dispatch_of("shop-1", "network::web"))
        .await
        .remove(0);
    assert_eq!(network.0, "network.create.fake");
    assert!(
        client
            .seen(dispatch_of("shop-1", "firewall::web-sg"))
            .is_empty()
    );
    client
        .answer(&network, false, json!({"network_aws_id": "subnet-9"}))
        .await;
    let firewall = client
        .wait(1, "the firewall", dispatch_of("shop-1", "firewall::web-sg"))
        .await
        .remove(0);
    assert_eq!(firewall.0, "firewall.create.fake");
    assert_eq!(firewall.1["network_aws_id"], "subnet-9");
    client.answer(&firewall, false, json!({})).await;

    let result = client
        .wait(1, "the result", result_of("shop-1"))
        .await
        .remove(0);
    assert_eq!(result.0, "build.create.done");
    let build = &result.1;
    assert_eq!(build["action"], "build.create");
    assert_eq!(build["name"], "shop");
    assert_eq!(build["username"], "ann");
    assert_eq!(build["user_id"], 1);
    assert_eq!(build["options"], json!({}));
    assert_eq!(build["datacenters"]["items"][0]["region"], "eu-west-1");
    assert_eq!(build["components"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ernest_service_builds_in_dependency_order_with_one_result() {
    let tmp = tempfile::tempdir().unwrap();
    let (_nats, executor, client) = started(tmp.path()).await;

    client.publish("build.create", &service_build()).await;
    // The worker answers each dispatch as it comes, with what a cloud would fill in.
    let mut answered = 0;
    while answered < 5 {
        let dispatches = client
            .wait(answered + 1, "a dispatch", |s, p| {
                is_dispatch(s) && p["service"] == "shop-1"
            })
            .await;
        for d in &dispatches[answered..] {
            let id = d.1["_component_id"].as_str().unwrap().to_string();
            client.answer(d, false, outputs(&id)).await;
            answered += 1;
        }
    }
    let results = client.wait(1, "the result", result_of("shop-1")).await;
    assert_eq!(results[0].0, "build.create.done");

    let order: Vec<String> = client
        .seen(|s, p| is_dispatch(s) && p["service"] == "shop-1")
        .iter()
        .map(|(s, p)| format!("{s} {}", p["_component_id"].as_str().unwrap()))
        .collect();
    assert_eq!(order[0], "network.create.fake network::web");
    assert_eq!(order[1], "firewall.create.fake firewall::web-sg");
    assert!(order[2..4].contains(&"instance.create.fake instance::web-1".to_string()));
    assert!(order[2..4].contains(&"instance.create.fake instance::web-2".to_string()));
    assert_eq!(order[4], "elb.create.fake elb::web-lb");
    // References resolved against other components' answers and the build's own fields.
    let lb = &client.seen(dispatch_of("shop-1", "elb::web-lb"))[0].1;
    assert_eq!(lb["instance_aws_ids"], json!(["i-1", "i-2"]));
    assert_eq!(lb["backends"], json!(["10.0.1.11", "10.0.1.12"]));
    assert_eq!(lb["datacenter_region"], "eu-west-1");
    assert_eq!(lb["_state"], "running");
    let fw = &client.seen(dispatch_of("shop-1", "firewall::web-sg"))[0].1;
    assert_eq!(fw["network_aws_id"], "subnet-1");

    let graph = &results[0].1;
    assert!(
        graph["changes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["_state"] == "completed"),
        "{graph:#}"
    );
    let components: Vec<&str> = graph["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["_component_id"].as_str().unwrap())
        .collect();
    assert_eq!(components.len(), 5);
    assert_eq!(components[0], "network::web");
    assert_eq!(components[4], "elb::web-lb");
    assert_eq!(graph["datacenters"]["items"][0]["region"], "eu-west-1");

    // Exactly one result: a later build's result comes, and still one for shop-1.
    let p = probe(&client, "later").await;
    client.answer(&p, false, json!({})).await;
    client.wait(1, "the later result", result_of("later")).await;
    assert_eq!(client.seen(result_of("shop-1")).len(), 1);
    executor.wait_log("Build shop-1 finished: done", 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_the_servers_max_payload_is_published_as_a_summary() {
    const MAX: usize = 32 * 1024;
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::with_max_payload(tmp.path(), MAX);
    let storage = tmp.path().join("graph");
    let executor = Executor::start(
        &nats.url(),
        &storage,
        60.0,
        &tmp.path().join("executor.log"),
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    let client = Client::connect(&nats.url()).await;

    // 40 components at once, each answered with 1 KB: the whole result (answers in `changes`
    // and `components`) is about 85 KB, over the 32 KiB this server takes.
    client
        .publish("build.create", &synthetic("wide", 40, |_| vec![]))
        .await;
    let dispatches = client
        .wait(40, "40 dispatches", |s, p| {
            is_dispatch(s) && p["service"] == "wide"
        })
        .await;
    for d in &dispatches {
        client
            .answer(d, false, json!({"blob": "x".repeat(1000)}))
            .await;
    }
    let results = client.wait(1, "the result", result_of("wide")).await;
    assert_eq!(results[0].0, "build.create.done");
    let note = &results[0].1["result_summary"];
    assert_eq!(note["components"], 40, "{:#}", results[0].1);
    assert_eq!(note["max_payload"], MAX, "the server's announced limit");
    assert!(note["bytes"].as_u64().unwrap() > MAX as u64, "{note}");
    // Where the rest is: the build's file, which holds the whole build.
    let stored_at = PathBuf::from(note["stored_at"].as_str().unwrap());
    assert_eq!(stored_at, storage.join("b-wide.json"));
    let read = || -> Value { serde_json::from_slice(&std::fs::read(&stored_at).unwrap()).unwrap() };
    assert_eq!(read()["build"]["components"].as_array().unwrap().len(), 40);
    // Once flushed, the file says the result went out.
    wait_until(|| (read()["result"]["sent"] == "sent").then_some(()))
        .expect("the result marked sent");
    executor.wait_log("publishing a summary", 1);

    // A cycle build just under the limit, whose `.error` naming the cycle takes it over.
    let mut ring = synthetic("ring", 120, |i| vec![(i + 119) % 120]);
    let bare = serde_json::to_vec(&ring).unwrap().len();
    ring["padding"] = json!("p".repeat(MAX - 800 - bare));
    client.publish("build.create", &ring).await;
    let results = client
        .wait(1, "the cycle's result", result_of("ring"))
        .await;
    assert_eq!(results[0].0, "build.create.error");
    let error = results[0].1["error"].as_str().unwrap();
    assert!(error.starts_with("dependency cycle: "), "{error}");
    assert_eq!(results[0].1["result_summary"]["changes"], 120);
    executor.wait_log("publishing a summary", 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_nats_url_is_never_logged() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::with_password(tmp.path(), "watcher", "s3cret-pw");
    let with = |password: &str| {
        nats.url()
            .replace("nats://", &format!("nats://watcher:{password}@"))
    };
    // A wrong password, logged at debug (async-nats's own lines included): refused, the
    // executor says it cannot connect, and neither password is in its log.
    let log = tmp.path().join("refused.log");
    let mut refused = Command::new(BIN)
        .args(["graph", "--nats-url", &with("wr0ng-pw"), "--storage-dir"])
        .arg(tmp.path().join("g1"))
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let text = wait_until(|| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("Graph executor cannot connect to NATS")
            .then_some(text)
    });
    let _ = refused.kill();
    let _ = refused.wait();
    let text = text.unwrap_or_else(|| panic!("{}", std::fs::read_to_string(&log).unwrap()));
    assert!(!text.contains("wr0ng-pw"), "{text}");
    assert!(text.contains("nats://watcher:***@127.0.0.1:"), "{text}");

    // The right one: connected, and the log names the user only.
    let executor = Executor::start(
        &with("s3cret-pw"),
        &tmp.path().join("g2"),
        60.0,
        &tmp.path().join("executor.log"),
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    let text = executor.logs();
    assert!(!text.contains("s3cret-pw"), "{text}");
    assert!(text.contains("nats://watcher:***@127.0.0.1:"), "{text}");
}

/// network -> (web-1, web-2) -> lb, halting on error as ernest.
pub(crate) fn two_instances(id: &str) -> Value {
    let mut build = service_build();
    build["id"] = json!(id);
    // Without the firewall: the instances come right after the network.
    let changes: Vec<Value> = build["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["_component_id"] != "firewall::web-sg")
        .cloned()
        .map(|mut c| {
            c.as_object_mut().unwrap().remove("security_group_aws_ids");
            c
        })
        .collect();
    build["changes"] = json!(changes);
    build["edges"] = json!([
        {"source": "network::web", "destination": "instance::web-1"},
        {"source": "network::web", "destination": "instance::web-2"},
        {"source": "instance::web-1", "destination": "elb::web-lb"},
        {"source": "instance::web-2", "destination": "elb::web-lb"}
    ]);
    build
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_while_others_run_gives_one_error_after_they_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let (_nats, executor, client) = started(tmp.path()).await;

    client.publish("build.create", &two_instances("b1")).await;
    let net = client
        .wait(1, "network", dispatch_of("b1", "network::web"))
        .await;
    client.answer(&net[0], false, outputs("network::web")).await;
    let web1 = client
        .wait(1, "web-1", dispatch_of("b1", "instance::web-1"))
        .await
        .remove(0);
    let web2 = client
        .wait(1, "web-2", dispatch_of("b1", "instance::web-2"))
        .await
        .remove(0);

    client
        .answer(&web1, true, json!({"error_message": "quota exceeded"}))
        .await;
    // The probe's dispatch comes after the executor handled web-1's error: nothing for b1 was
    // published in between (no result while web-2 runs, and no load balancer).
    probe(&client, "probe-1").await;
    assert!(
        client.seen(result_of("b1")).is_empty(),
        "{:#?}",
        client.subjects()
    );
    assert!(client.seen(dispatch_of("b1", "elb::web-lb")).is_empty());

    client
        .answer(&web2, false, outputs("instance::web-2"))
        .await;
    let results = client.wait(1, "b1's result", result_of("b1")).await;
    assert_eq!(results[0].0, "build.create.error");
    let graph = &results[0].1;
    let error = graph["error"].as_str().unwrap();
    assert!(
        error.contains("instance::web-1 (quota exceeded)"),
        "{error}"
    );
    let state = |id: &str| {
        graph["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["_component_id"] == id)
            .unwrap()["_state"]
            .clone()
    };
    assert_eq!(state("instance::web-1"), "errored");
    assert_eq!(
        state("instance::web-2"),
        "completed",
        "in flight, it finished"
    );
    assert_eq!(state("elb::web-lb"), "waiting", "never started");
    assert!(
        position(&client, result_of("b1"))
            > position(&client, |s, p| s.ends_with(".done")
                && p["_component_id"] == "instance::web-2")
    );

    // A duplicate answer after the result changes nothing; one error only.
    client.answer(&web2, false, json!({})).await;
    let p = probe(&client, "probe-2").await;
    client.answer(&p, false, json!({})).await;
    client
        .wait(1, "probe-2's result", result_of("probe-2"))
        .await;
    assert_eq!(client.seen(result_of("b1")).len(), 1);
    executor.wait_log("Build b1 finished: error", 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_times_out_into_one_error() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(tmp.path());
    let executor = Executor::start_with(
        &nats.url(),
        &tmp.path().join("graph"),
        0.5,
        &tmp.path().join("executor.log"),
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let metrics_port = {
        let line = wait_until(|| {
            executor
                .logs()
                .lines()
                .find(|l| l.contains("Graph executor metrics at"))
                .map(str::to_string)
        })
        .expect("the metrics address is logged");
        let addr = line
            .split("http://")
            .nth(1)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_string();
        addr.rsplit(':').next().unwrap().parse::<u16>().unwrap()
    };
    let client = Client::connect(&nats.url()).await;

    client.publish("build.create", &two_instances("lost")).await;
    // The network's answer never comes.
    client
        .wait(1, "network", dispatch_of("lost", "network::web"))
        .await;
    let results = client.wait(1, "the result", result_of("lost")).await;
    assert_eq!(results[0].0, "build.create.error");
    let network = &results[0].1["changes"][0];
    assert_eq!(network["_state"], "errored");
    assert_eq!(network["error_code"], "timeout");
    assert!(
        network["error_message"]
            .as_str()
            .unwrap()
            .contains("timed out")
    );
    executor.wait_log("Component timed out.", 1);
    // The answer that comes after all is ignored, and there is one result.
    let net = client.seen(dispatch_of("lost", "network::web")).remove(0);
    client.answer(&net, false, json!({})).await;
    probe(&client, "probe").await;
    assert_eq!(client.seen(result_of("lost")).len(), 1);
    assert!(
        client
            .seen(dispatch_of("lost", "instance::web-1"))
            .is_empty()
    );
    // `--metrics-listen` serves the executor's families.
    let metric = |series: &str| crate::util::metric(metrics_port, series);
    assert_eq!(
        metric("verwalter_graph_builds_total{result=\"error\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric("verwalter_graph_component_duration_seconds_count{result=\"error\"}"),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_executor_resumes_without_dispatching_completed_components() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = tmp.path().join("graph");
    let nats = Nats::start(tmp.path());
    let mut executor = Executor::start(
        &nats.url(),
        &storage,
        60.0,
        &tmp.path().join("executor-1.log"),
    );
    let client = Client::connect(&nats.url()).await;

    client.publish("build.create", &service_build()).await;
    for id in ["network::web", "firewall::web-sg"] {
        let d = client
            .wait(1, id, dispatch_of("shop-1", id))
            .await
            .remove(0);
        client.answer(&d, false, outputs(id)).await;
    }
    let web1 = client
        .wait(1, "web-1", dispatch_of("shop-1", "instance::web-1"))
        .await
        .remove(0);
    let web2 = client
        .wait(1, "web-2", dispatch_of("shop-1", "instance::web-2"))
        .await
        .remove(0);
    client
        .answer(&web1, false, outputs("instance::web-1"))
        .await;
    // web-1's completion is on disk once the executor handled it (the probe proves it did).
    probe(&client, "probe-1").await;
    executor.kill9();

    let executor = Executor::start(
        &nats.url(),
        &storage,
        60.0,
        &tmp.path().join("executor-2.log"),
    );
    executor.wait_log("Build resumed.", 1);
    executor.wait_log("Graph executor connected to NATS.", 1);
    // web-2 was running: its answer, coming now, is taken.
    client
        .answer(&web2, false, outputs("instance::web-2"))
        .await;
    let lb = client
        .wait(1, "the balancer", dispatch_of("shop-1", "elb::web-lb"))
        .await
        .remove(0);
    assert_eq!(lb.1["instance_aws_ids"], json!(["i-1", "i-2"]));
    client.answer(&lb, false, outputs("elb::web-lb")).await;
    let results = client.wait(1, "the result", result_of("shop-1")).await;
    assert_eq!(results[0].0, "build.create.done");
    for id in [
        "network::web",
        "firewall::web-sg",
        "instance::web-1",
        "instance::web-2",
        "elb::web-lb",
    ] {
        assert_eq!(
            client.seen(dispatch_of("shop-1", id)).len(),
            1,
            "{id} dispatched once"
        );
    }
    // The probe build, unfinished at the kill, was resumed as well and still takes its answer.
    let p = client.seen(dispatch_of("probe-1", "probe::p")).remove(0);
    client.answer(&p, false, json!({})).await;
    client
        .wait(1, "probe-1's result", result_of("probe-1"))
        .await;
    assert_eq!(client.seen(result_of("shop-1")).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_nats_server_does_not_stop_a_build() {
    let tmp = tempfile::tempdir().unwrap();
    let mut nats = Nats::start(tmp.path());
    let executor = Executor::start(
        &nats.url(),
        &tmp.path().join("graph"),
        60.0,
        &tmp.path().join("executor.log"),
    );
    let client = Client::connect(&nats.url()).await;

    client.publish("build.create", &two_instances("b1")).await;
    let net = client
        .wait(1, "network", dispatch_of("b1", "network::web"))
        .await
        .remove(0);
    client.answer(&net, false, outputs("network::web")).await;
    let web1 = client
        .wait(1, "web-1", dispatch_of("b1", "instance::web-1"))
        .await
        .remove(0);
    let web2 = client
        .wait(1, "web-2", dispatch_of("b1", "instance::web-2"))
        .await
        .remove(0);

    let port = nats.port;
    nats.stop();
    executor.wait_log("Graph executor lost its NATS connection", 1);
    let _nats = Nats::on(tmp.path(), Some(port));
    executor.wait_log("Graph executor reconnected to NATS.", 1);
    let reconnected = crate::util::wait_for(WAIT, || {
        (*client.reconnects.lock().unwrap() >= 2).then_some(())
    });
    assert!(reconnected.is_some(), "the test client reconnects");
    // The executor's subscriptions are back once a new build reaches it.
    probe(&client, "probe").await;

    client
        .answer(&web1, false, outputs("instance::web-1"))
        .await;
    client
        .answer(&web2, false, outputs("instance::web-2"))
        .await;
    let lb = client
        .wait(1, "the balancer", dispatch_of("b1", "elb::web-lb"))
        .await
        .remove(0);
    client.answer(&lb, false, outputs("elb::web-lb")).await;
    let results = client.wait(1, "the result", result_of("b1")).await;
    assert_eq!(results[0].0, "build.create.done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_runs_the_executor_by_its_settings_with_its_metrics() {
    let (tmp, config_dir, storage) = crate::util::example_site("minimal");
    let nats = Nats::start(tmp.path());
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(
        &settings,
        format!(
            "graph:\n  nats-url: {}\n  component-timeout: 0.5\n",
            nats.url()
        ),
    )
    .unwrap();
    let daemon = crate::util::Daemon::launch(
        &config_dir,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    let logged = |text: &str| {
        let found = crate::util::wait_for(WAIT, || daemon.logs().contains(text).then_some(()));
        assert!(found.is_some(), "no {text:?}:\n{}", daemon.logs());
    };
    logged("Graph executor connected to NATS.");
    let client = Client::connect(&nats.url()).await;

    client.publish("build.create", &two_instances("d1")).await;
    let net = client
        .wait(1, "network", dispatch_of("d1", "network::web"))
        .await
        .remove(0);
    client.answer(&net, false, outputs("network::web")).await;
    // The instances never answer: they time out, and the build ends in one error.
    let results = client.wait(1, "the result", result_of("d1")).await;
    assert_eq!(results[0].0, "build.create.error");
    logged("Build d1 finished: error");
    // Its file is under the daemon's storage dir by default.
    assert!(storage.join("graph/b-d1.json").is_file());

    let port = daemon.port;
    let metric = |series: &str| crate::util::metric(port, series);
    assert_eq!(
        metric("verwalter_graph_builds_total{result=\"error\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric("verwalter_graph_builds_total{result=\"done\"}"),
        Some(0.0)
    );
    assert_eq!(metric("verwalter_graph_components_in_flight"), Some(0.0));
    assert_eq!(
        metric("verwalter_graph_component_duration_seconds_count{result=\"done\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric("verwalter_graph_component_duration_seconds_count{result=\"error\"}"),
        Some(2.0),
        "two timeouts"
    );
}

/// A build of `n` components `c::i`, each after `after(i)` (indices of earlier components).
fn synthetic(id: &str, n: usize, after: impl Fn(usize) -> Vec<usize>) -> Value {
    let name = |i: usize| format!("c::{i:04}");
    let changes: Vec<Value> = (0..n)
        .map(|i| {
            json!({"_component_id": name(i), "_component": "c", "_action": "create",
                        "_provider": "fake", "size": i})
        })
        .collect();
    let edges: Vec<Value> = (0..n)
        .flat_map(|i| after(i).into_iter().map(move |j| (j, i)))
        .map(|(j, i)| json!({"source": name(j), "destination": name(i), "length": 1}))
        .collect();
    json!({"id": id, "changes": changes, "edges": edges})
}

/// Runs `build` with an instant worker; returns the wall time and, per dispatch after the
/// first, the time from the worker's previous `.done` to that dispatch.
async fn timed(client: &async_nats::Client, build: &Value) -> (Duration, Vec<Duration>) {
    let id = build["id"].as_str().unwrap().to_string();
    let mut dispatches = client.subscribe("c.create.fake").await.unwrap();
    let mut results = client.subscribe("build.create.*").await.unwrap();
    client.flush().await.unwrap();
    let started = Instant::now();
    client
        .publish("build.create", serde_json::to_vec(build).unwrap().into())
        .await
        .unwrap();
    let n = build["changes"].as_array().unwrap().len();
    let mut gaps = Vec::with_capacity(n);
    let mut last_done: Option<Instant> = None;
    for _ in 0..n {
        let m = dispatches.next().await.unwrap();
        if let Some(at) = last_done {
            gaps.push(at.elapsed());
        }
        client
            .publish(format!("{}.done", m.subject), m.payload)
            .await
            .unwrap();
        last_done = Some(Instant::now());
    }
    let result = results.next().await.unwrap();
    let wall = started.elapsed();
    let payload: Value = serde_json::from_slice(&result.payload).unwrap();
    assert_eq!(result.subject.as_str(), "build.create.done");
    assert_eq!(payload["id"], id.as_str());
    (wall, gaps)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// `make bench-graph`: 1,000-component builds through a real nats-server with an instant
/// worker, the executor's build files on the disk under $TMPDIR and on /dev/shm (tmpfs, no
/// fsync cost). Prints figures; asserts only that the builds finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: make bench-graph"]
async fn bench_thousand_components() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(tmp.path());
    let shm = Path::new("/dev/shm");
    let mut places = vec![("disk", tmp.path().to_owned())];
    if shm.is_dir() {
        places.push(("tmpfs", tempfile::tempdir_in(shm).unwrap().keep()));
    }
    let client = async_nats::connect(nats.url()).await.unwrap();
    for (place, dir) in &places {
        let storage = dir.join("graph");
        let _executor = Executor::start(&nats.url(), &storage, 300.0, &dir.join("bench.log"));
        let shapes: Vec<(&str, Value)> = vec![
            (
                "chain",
                synthetic("chain", 1000, |i| if i == 0 { vec![] } else { vec![i - 1] }),
            ),
            ("independent", synthetic("independent", 1000, |_| vec![])),
            (
                "10 waves of 100",
                synthetic("waves", 1000, |i| {
                    // Two components of the wave before: the waves stay in order without 90,000
                    // edges (over NATS's 1 MiB payload limit).
                    let wave = i / 100;
                    if wave == 0 {
                        vec![]
                    } else {
                        vec![i - 100, (wave - 1) * 100 + (i + 1) % 100]
                    }
                }),
            ),
        ];
        for (shape, build) in shapes {
            let (wall, mut gaps) = timed(&client, &build).await;
            let per = wall.as_secs_f64() * 1000.0 / 1000.0;
            if shape == "chain" {
                gaps.sort();
                println!(
                    "graph bench [{place}] {shape}: wall {:.0} ms, {per:.3} ms/component; \
                     .done -> next dispatch median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
                    wall.as_secs_f64() * 1000.0,
                    percentile(&gaps, 0.5),
                    percentile(&gaps, 0.9),
                    percentile(&gaps, 0.99),
                );
            } else {
                println!(
                    "graph bench [{place}] {shape}: wall {:.0} ms, {per:.3} ms/component",
                    wall.as_secs_f64() * 1000.0
                );
            }
        }
    }
    for (place, dir) in &places {
        if *place == "tmpfs" {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_delete_runs_in_reverse_order_and_empties_the_service() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(tmp.path());
    let _executor = Executor::start(
        &nats.url(),
        &tmp.path().join("graph"),
        60.0,
        &tmp.path().join("executor.log"),
    );
    let client = Client::connect(&nats.url()).await;
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/graphs/ernest-service/delete.json"),
    )
    .unwrap();
    let build: Value = serde_json::from_str(&text).unwrap();
    client.publish("build.delete", &build).await;
    let id = "shop-1-delete";
    let mut answered = 0;
    while answered < 5 {
        let dispatches = client
            .wait(answered + 1, "a dispatch", |s, p| {
                is_dispatch(s) && p["service"] == id
            })
            .await;
        for d in &dispatches[answered..] {
            client.answer(d, false, json!({})).await;
            answered += 1;
        }
    }
    let results = client.wait(1, "the result", result_of(id)).await;
    assert_eq!(results[0].0, "build.delete.done");
    assert_eq!(results[0].1["components"], json!([]), "everything deleted");
    let order: Vec<String> = client
        .seen(|s, p| is_dispatch(s) && p["service"] == id)
        .iter()
        .map(|(s, p)| format!("{s} {}", p["_component_id"].as_str().unwrap()))
        .collect();
    assert_eq!(order[0], "elb.delete.fake elb::web-lb");
    assert_eq!(order[3], "firewall.delete.fake firewall::web-sg");
    assert_eq!(order[4], "network.delete.fake network::web");
}

/// `verwalter run` on `config` whose settings file (in `dir`) sends its deployment events to
/// `nats` under the prefix `vw.test`.
fn publishing_events(
    dir: &Path,
    config: &Path,
    storage: &Path,
    nats: &Nats,
) -> crate::util::Daemon {
    let settings = dir.join("settings.yaml");
    std::fs::write(
        &settings,
        format!(
            "deployment-events:\n  nats-url: {}\n  prefix: vw.test\n",
            nats.url()
        ),
    )
    .unwrap();
    crate::util::Daemon::launch(
        config,
        storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_publishes_its_deployment_events_when_its_settings_say_so() {
    let (tmp, config_dir, storage) = crate::util::example_site("minimal");
    let nats = Nats::start(tmp.path());
    // Listening before the daemon starts: its first deployment is among the events.
    let client = Client::connect(&nats.url()).await;
    let daemon = publishing_events(tmp.path(), &config_dir, &storage, &nats);
    let finished = client
        .wait(1, "a finished deployment", |s, _| {
            s == "vw.test.deployment.finished"
        })
        .await
        .remove(0);
    assert_eq!(finished.1["node"], "alpha");
    assert_eq!(finished.1["failed"], json!([]));
    let id = finished.1["deployment_id"].as_str().unwrap().to_string();
    let started =
        client.seen(|s, p| s == "vw.test.deployment.started" && p["deployment_id"] == id.as_str());
    assert_eq!(started.len(), 1, "{:#?}", client.subjects());
    let roles = started[0].1["roles"].as_array().unwrap().clone();
    assert!(!roles.is_empty());
    let applied =
        client.seen(|s, p| s == "vw.test.role.applied" && p["deployment_id"] == id.as_str());
    assert_eq!(applied.len(), roles.len(), "one event per role of the pass");
    assert!(
        position(&client, |s, p| s == "vw.test.role.applied"
            && p["deployment_id"] == id.as_str())
            < position(&client, |s, _| s == "vw.test.deployment.finished")
    );
    drop(daemon);
}

/// Issue 29: the `role.*` events of a pass came all at its end, in name order, without a time.
/// Now each comes as its role finishes: `web` applies at once while `api` waits in its command
/// for a file the test writes only once `web`'s event has come (with the old events, that wait
/// never ended: the pass, and so every event, waited for `api`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_event_is_published_as_the_role_finishes_with_its_time() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config");
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let o = out.display();
    crate::util::replace_file(
        &config.join("scheduler/v1/main.lua"),
        crate::render::PASSTHROUGH,
    );
    // Waits (up to 20 s) for out/go-<role> when the role's `wait` is set.
    crate::util::replace_file(
        &config.join("templates/gate/v1/gate.render.yaml"),
        &format!(
            "templates:\n  conf: gate.conf.hbs\ncommands:\n\
             - !Sh 'test -z \"$(cat {{{{ files.conf }}}})\" || for i in $(seq 400); do \
               test -e {o}/go-{{{{ role }}}} && break; sleep 0.05; done'\n"
        ),
    );
    crate::util::replace_file(&config.join("templates/gate/v1/gate.conf.hbs"), "{{wait}}");
    crate::util::replace_file(
        &config.join("runtime/schedule.json"),
        &json!({"vars": {"template": "gate/v1", "wait": ""},
                "nodes": {"alpha": {"roles": {"api": {"wait": "yes"}, "web": {}}}}})
        .to_string(),
    );
    let nats = Nats::start(tmp.path());
    let client = Client::connect(&nats.url()).await;
    let daemon = publishing_events(tmp.path(), &config, &tmp.path().join("storage"), &nats);
    let role = |what: &'static str, name: &'static str| {
        move |s: &str, p: &Value| s == format!("vw.test.role.{what}") && p["role"] == name
    };
    let web = client
        .wait(1, "web applied", role("applied", "web"))
        .await
        .remove(0)
        .1;
    assert!(client.seen(role("applied", "api")).is_empty());
    assert!(
        client
            .seen(|s, _| s == "vw.test.deployment.finished")
            .is_empty()
    );
    std::fs::write(out.join("go-api"), "").unwrap();
    let api = client
        .wait(1, "api applied", role("applied", "api"))
        .await
        .remove(0)
        .1;
    let finished = client
        .wait(1, "the pass finished", |s, _| {
            s == "vw.test.deployment.finished"
        })
        .await
        .remove(0)
        .1;
    for event in [&web, &api] {
        assert_eq!(event["deployment_id"], finished["deployment_id"]);
        let ms = event["time_ms"].as_u64().unwrap();
        assert_eq!(
            event["time"],
            verwalter_controllers::machinery::clock::rfc3339(ms),
            "{event}"
        );
    }
    assert!(web["time_ms"].as_u64() <= api["time_ms"].as_u64());
    assert!(position(&client, role("applied", "web")) < position(&client, role("applied", "api")));
    assert!(
        position(&client, role("applied", "api"))
            < position(&client, |s, _| s == "vw.test.deployment.finished")
    );
    drop(daemon);
}

/// A file of `tests/data/ernest/` (upstream's expectations, as data).
fn ernest_data(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/ernest")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ids_sorted(items: &[(String, Value)]) -> Vec<String> {
    let mut ids: Vec<String> = items
        .iter()
        .map(|(_, p)| p["_component_id"].as_str().unwrap_or("").to_string())
        .collect();
    ids.sort();
    ids
}

fn strings_sorted(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// Upstream's `scheduler_test.go` cases (`tests/data/ernest/scheduler.json`), each played by a
/// worker against `verwalter graph` with its default settings: what each answer dispatches,
/// the one result after the last answer, and what the result holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_scheduler_cases_hold_over_nats() {
    let tmp = tempfile::tempdir().unwrap();
    let (_nats, _executor, client) = started(tmp.path()).await;
    let data = ernest_data("scheduler.json");
    let cases = data["cases"].as_array().unwrap();
    assert!(cases.len() >= 13);
    let mut ids = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        let name = format!("{} / {}", case["source"], case["test"]);
        let id = format!("case-{n}");
        let mut build = ernest_data(&format!("fixtures/{}", case["fixture"].as_str().unwrap()));
        build["id"] = json!(id);
        for (k, v) in case["build_with"].as_object().into_iter().flatten() {
            build[k] = v.clone();
        }
        for change in build["changes"].as_array_mut().unwrap() {
            for (k, v) in case["changes_with"].as_object().into_iter().flatten() {
                change[k] = v.clone();
            }
        }
        let subject = case["subject"].as_str().unwrap_or("build.create");
        let of_build = |s: &str, p: &Value| is_dispatch(s) && p["service"] == id.as_str();
        client.publish(subject, &build).await;
        // The dispatches of each step: those after its answer (or the build) and before the
        // next answer, which is sent only once the step's dispatches are all seen.
        let sent_build = |s: &str, p: &Value| s == subject && p["id"] == id.as_str();
        client.wait(1, &name, sent_build).await;
        let mut marks = vec![position(&client, sent_build)];
        let mut count = 0;
        let mut answered: Vec<String> = Vec::new();
        for step in case["steps"].as_array().unwrap() {
            if let Some(target) = step["answer"].as_str() {
                let dispatch = client.seen(dispatch_of(&id, target)).remove(0);
                let mut extra = step["with"].as_object().cloned().unwrap_or_default();
                extra.insert("_state".into(), step["state"].clone());
                client
                    .answer(&dispatch, step["state"] == "errored", Value::Object(extra))
                    .await;
                answered.push(target.to_string());
                let sent = format!(
                    "{}.{}",
                    dispatch.0,
                    if step["state"] == "errored" {
                        "error"
                    } else {
                        "done"
                    }
                );
                let echo = |s: &str, p: &Value| {
                    s == sent && p["service"] == id.as_str() && p["_component_id"] == target
                };
                client.wait(1, &name, echo).await;
                marks.push(position(&client, echo));
            }
            let expected = strings_sorted(&step["dispatched"]);
            count += expected.len();
            client.wait(count, &name, of_build).await;
        }
        // What the finishing answers dispatch is after this.
        marks.push(client.seen.lock().unwrap().len());
        if case["finish"] == true {
            // Every other dispatch is answered as completed until the result comes.
            loop {
                let open: Vec<(String, Value)> = client
                    .seen(of_build)
                    .into_iter()
                    .filter(|(_, p)| {
                        !answered.contains(&p["_component_id"].as_str().unwrap().to_string())
                    })
                    .collect();
                if open.is_empty() && !client.seen(result_of(&id)).is_empty() {
                    break;
                }
                for d in &open {
                    client
                        .answer(d, false, json!({"_state": "completed"}))
                        .await;
                    answered.push(d.1["_component_id"].as_str().unwrap().to_string());
                }
                if open.is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert!(answered.len() < 100, "{name}: no result");
            }
        }
        let result = client.wait(1, &name, result_of(&id)).await.remove(0);
        let last_answer = client
            .seen
            .lock()
            .unwrap()
            .iter()
            .rposition(|(s, p)| {
                (s.ends_with(".done") || s.ends_with(".error"))
                    && p["service"] == id.as_str()
                    && p.get("_component_id").is_some()
            })
            .unwrap();
        assert!(
            position(&client, result_of(&id)) > last_answer,
            "{name}: the result before the last answer"
        );
        // Each step dispatched exactly what ernest dispatches.
        let all: Vec<(String, Value)> = client.seen.lock().unwrap().clone();
        for (k, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let from = marks[k];
            let to = marks[k + 1];
            let between: Vec<(String, Value)> = all
                .iter()
                .enumerate()
                .filter(|(i, (s, p))| *i > from && *i < to && of_build(s, p))
                .map(|(_, m)| m.clone())
                .collect();
            assert_eq!(
                ids_sorted(&between),
                strings_sorted(&step["dispatched"]),
                "{name}: step {k}"
            );
            assert!(
                between.iter().all(|(_, p)| p["_state"] == "running"),
                "{name}"
            );
        }
        assert_eq!(
            result.0,
            format!("{subject}.{}", case["result"].as_str().unwrap()),
            "{name}"
        );
        let graph = &result.1;
        assert_eq!(graph["action"], subject, "{name}");
        let component = |cid: &str| {
            graph["components"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["_component_id"] == cid)
                .cloned()
        };
        for cid in strings_sorted(&case["components_with"]) {
            assert!(component(&cid).is_some(), "{name}: {cid} in components");
        }
        for cid in strings_sorted(&case["components_without"]) {
            assert!(component(&cid).is_none(), "{name}: {cid} not in components");
        }
        if let Some(n) = case["components_count"].as_u64() {
            assert_eq!(
                graph["components"].as_array().unwrap().len() as u64,
                n,
                "{name}"
            );
        }
        for (cid, fields) in case["component_fields"].as_object().into_iter().flatten() {
            let c = component(cid).unwrap();
            for (k, v) in fields.as_object().unwrap() {
                assert_eq!(&c[k], v, "{name}: {cid}.{k}");
            }
        }
        for (cid, state) in case["changes"].as_object().into_iter().flatten() {
            let c = graph["changes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["_component_id"] == cid.as_str())
                .unwrap();
            assert_eq!(&c["_state"], state, "{name}: the change {cid}");
        }
        ids.push(id);
    }
    // One result per case: a later build's dispatch comes after any second one would have.
    probe(&client, "after-cases").await;
    for id in &ids {
        assert_eq!(client.seen(result_of(id)).len(), 1, "{id}");
    }
}

/// ernest's own import fixture, as it is: its finds' references to the credentials' missing
/// `region` (and to `datacenters`, which the fixture lacks) stay as text, and all 11 finds are
/// dispatched; the build does not end in `.error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ernests_import_fixture_dispatches_its_finds() {
    let tmp = tempfile::tempdir().unwrap();
    let (_nats, _executor, client) = started(tmp.path()).await;
    let mut build = ernest_data("fixtures/import-graph.json");
    build["id"] = json!("import-1");
    client.publish("build.import", &build).await;
    let finds = |s: &str, p: &Value| !s.starts_with("build.") && p["service"] == "import-1";
    let dispatched = client.wait(11, "the finds", finds).await;
    let vpc = dispatched
        .iter()
        .find(|(_, p)| p["_component_id"] == "vpc::query")
        .unwrap();
    assert_eq!(vpc.0, "vpc.find.$(datacenters.items.0.type)");
    assert_eq!(vpc.1["aws_access_key_id"], "test");
    assert_eq!(vpc.1["aws_secret_access_key"], "test");
    assert_eq!(
        vpc.1["datacenter_region"],
        "$(components.#[_component_id=\"credentials::aws\"].region)"
    );
    probe(&client, "after-import").await;
    assert!(
        client.seen(result_of("import-1")).is_empty(),
        "{:#?}",
        client.subjects()
    );
    assert_eq!(client.seen(finds).len(), 11);
}

/// A change's `_provider` taken from a component (2.1): dispatched on the provider it names.
/// The result carries the build's subject as `action`, and ernest's `name`, `username` and
/// `options` though the build has none.
fn provider_build(id: &str) -> Value {
    json!({"id": id, "action": "create",
        "components": [{"_component_id": "credentials::aws", "_component": "credentials",
                        "_provider": "aws", "port": 5432}],
        "changes": [{"_component_id": "network::web", "_component": "network",
            "_action": "create", "_state": "waiting",
            "_provider": "$(components.#[_component_id=\"credentials::aws\"]._provider)",
            "port": "$(components.#[_component_id=\"credentials::aws\"].port)",
            "url": "db:$(components.#[_component_id=\"credentials::aws\"].port)"}],
        "edges": [{"source": "start", "destination": "network::web"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_is_templated_and_the_result_is_shaped_as_ernests() {
    let tmp = tempfile::tempdir().unwrap();
    let (_nats, _executor, client) = started(tmp.path()).await;
    client.publish("build.create", &provider_build("p-1")).await;
    let d = client
        .wait(1, "the dispatch", dispatch_of("p-1", "network::web"))
        .await
        .remove(0);
    assert_eq!(d.0, "network.create.aws");
    assert_eq!(d.1["port"], "5432", "ernest's templating gives text");
    assert_eq!(
        d.1["url"],
        "db:$(components.#[_component_id=\"credentials::aws\"].port)"
    );
    client.answer(&d, false, json!({})).await;
    let result = client
        .wait(1, "the result", result_of("p-1"))
        .await
        .remove(0);
    assert_eq!(result.0, "build.create.done");
    assert_eq!(result.1["action"], "build.create");
    assert_eq!(
        (
            &result.1["name"],
            &result.1["username"],
            &result.1["options"]
        ),
        (&json!(""), &json!(""), &Value::Null)
    );
    assert!(result.1.as_object().unwrap().contains_key("options"));
}

/// `--templating extended`: typed values, references inside longer strings, and a reference
/// that finds nothing errors its component.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_templating_is_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(tmp.path());
    let executor = Executor::start_with(
        &nats.url(),
        &tmp.path().join("graph"),
        60.0,
        &tmp.path().join("executor.log"),
        &["--templating", "extended"],
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    let client = Client::connect(&nats.url()).await;
    client.publish("build.create", &provider_build("x-1")).await;
    let d = client
        .wait(1, "the dispatch", dispatch_of("x-1", "network::web"))
        .await
        .remove(0);
    assert_eq!(d.0, "network.create.aws");
    assert_eq!(d.1["port"], 5432);
    assert_eq!(d.1["url"], "db:5432");
    client.answer(&d, false, json!({})).await;
    client.wait(1, "the result", result_of("x-1")).await;

    let mut bad = provider_build("x-2");
    bad["changes"][0]["missing"] =
        json!("$(components.#[_component_id=\"credentials::aws\"].region)");
    client.publish("build.create", &bad).await;
    let result = client
        .wait(1, "the error", result_of("x-2"))
        .await
        .remove(0);
    assert_eq!(result.0, "build.create.error");
    assert_eq!(result.1["changes"][0]["error_code"], "reference");
}

/// ernest's own `test-graph.json` as it is: its changes have no `_provider` (ernest's scheduler
/// panics on it). Nothing goes out on `network.create.`: the build ends at once, long before
/// the components' timeout, in one `.error` naming the changes and the field. A `_provider`
/// with whitespace (which no NATS subject can hold) errors its component at dispatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_without_a_provider_fails_the_build_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(tmp.path());
    // Far past the client's wait: a result that came from a timeout would not be seen.
    let executor = Executor::start(
        &nats.url(),
        &tmp.path().join("graph"),
        600.0,
        &tmp.path().join("executor.log"),
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    let client = Client::connect(&nats.url()).await;
    let mut build = ernest_data("fixtures/test-graph.json");
    build["id"] = json!("no-provider");
    client.publish("build.create", &build).await;
    let result = client
        .wait(1, "the error", result_of("no-provider"))
        .await
        .remove(0);
    assert_eq!(result.0, "build.create.error");
    let error = result.1["error"].as_str().unwrap();
    assert!(
        error.starts_with(
            "no _provider (missing, empty or not text) in network::web-new, instance::web-new-1, "
        ),
        "{error}"
    );
    assert!(error.contains("instance::web-3"), "{error}");
    for change in result.1["changes"].as_array().unwrap() {
        assert_eq!(change["_state"], "waiting", "{change}");
    }
    // Nothing of it was dispatched (before its result, on one connection).
    let sent = |s: &str, p: &Value| !s.starts_with("build.") && p["service"] == "no-provider";
    assert_eq!(client.seen(sent), vec![]);

    let mut spaced = provider_build("spaced");
    spaced["components"][0]["_provider"] = json!("aws east");
    client.publish("build.create", &spaced).await;
    let result = client
        .wait(1, "the error", result_of("spaced"))
        .await
        .remove(0);
    assert_eq!(result.0, "build.create.error");
    let network = &result.1["changes"][0];
    assert_eq!(network["error_code"], "subject");
    assert_eq!(
        network["error_message"],
        "_provider \"aws east\" cannot be a token of the dispatch subject: it contains whitespace"
    );
    assert_eq!(client.seen(result_of("no-provider")).len(), 1, "one result");
}

/// A build's result across kills, and two executors on one server (`graph_nats/delivery.rs`).
mod delivery;
