//! A build's result is never lost (issue 29, section 3), and builds are shared among executors
//! (section 4): against a real `nats-server` with JetStream (`-js`), whose stream `RESULTS`
//! captures the results with a duplicate window, beside a core-NATS client that sees every
//! message with its headers.
//!
//! The kill between storing a result and publishing it (or between publishing it and marking it
//! sent) comes from `VERWALTER_TEST_GRAPH_CRASH`, a switch of debug builds: no SIGKILL from
//! outside can be timed into those microseconds. The trial kills at random moments as well,
//! chosen by the number of messages the executor has published, from a seeded generator:
//! `GRAPH_CRASH_SEED` replays a run, `GRAPH_CRASH_TRIALS` sets the number of kills (10 by
//! default; the run in docs/reliability.md had 50).

use std::collections::{BTreeMap, HashMap};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

const STREAM: &str = "RESULTS";

/// A `nats-server` with JetStream, its store in `dir`.
fn jetstream(dir: &Path) -> Nats {
    let store = dir.join("jetstream");
    Nats::with_args(
        dir,
        None,
        &["-js".as_ref(), "-sd".as_ref(), store.as_os_str()],
    )
}

/// `$JS.API` request; panics on an error reply.
async fn js_api(client: &async_nats::Client, subject: String, body: Value) -> Value {
    let reply = client
        .request(subject.clone(), serde_json::to_vec(&body).unwrap().into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert!(reply.get("error").is_none(), "{subject}: {reply}");
    reply
}

/// The stream that captures every build's result, deduplicating by `Nats-Msg-Id` for 10
/// minutes.
async fn create_stream(client: &async_nats::Client) {
    let config = json!({"name": STREAM, "subjects": ["build.*.done", "build.*.error"],
        "storage": "memory", "duplicate_window": 600_000_000_000u64});
    js_api(client, format!("$JS.API.STREAM.CREATE.{STREAM}"), config).await;
}

/// The `Nats-Msg-Id` of a header block (`NATS/1.0\r\nName: value\r\n...`).
fn msg_id_of(headers: &str) -> Option<String> {
    headers.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("Nats-Msg-Id")
            .then(|| value.trim().to_string())
    })
}

/// Every message the stream holds: (its `Nats-Msg-Id`, payload). A message published to the
/// stream with an acknowledgement first: once it is acknowledged, everything the stream got
/// before it (a result the core client saw already) is stored or dropped as a duplicate.
async fn stream_messages(client: &async_nats::Client) -> Vec<(Option<String>, Value)> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, "sentinel");
    let ack = client
        .request_with_headers("build.sentinel.done", headers, "{}".into())
        .await
        .unwrap();
    let ack: Value = serde_json::from_slice(&ack.payload).unwrap();
    assert_eq!(ack["stream"], STREAM, "{ack}");
    let info = js_api(client, format!("$JS.API.STREAM.INFO.{STREAM}"), json!({})).await;
    let state = &info["state"];
    let (first, last) = (
        state["first_seq"].as_u64().unwrap(),
        state["last_seq"].as_u64().unwrap(),
    );
    let mut messages = Vec::new();
    for seq in first..=last {
        let got = js_api(
            client,
            format!("$JS.API.STREAM.MSG.GET.{STREAM}"),
            json!({"seq": seq}),
        )
        .await;
        let message = &got["message"];
        use base64::Engine;
        let decode = |field: &Value| {
            field
                .as_str()
                .map(|text| {
                    base64::engine::general_purpose::STANDARD
                        .decode(text)
                        .unwrap()
                })
                .unwrap_or_default()
        };
        let headers = String::from_utf8(decode(&message["hdrs"])).unwrap();
        let id = msg_id_of(&headers);
        if id.as_deref() == Some("sentinel") {
            continue;
        }
        let payload = serde_json::from_slice(&decode(&message["data"])).unwrap_or(Value::Null);
        messages.push((id, payload));
    }
    messages
}

/// A message as the watcher saw it: (subject, its `Nats-Msg-Id`, payload).
type Seen = (String, Option<String>, Value);

/// A core-NATS client that sees every message (`>`) in the order the server delivers them to
/// it, with its `Nats-Msg-Id`.
struct Watcher {
    client: async_nats::Client,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Watcher {
    async fn connect(url: &str) -> Watcher {
        let client = async_nats::connect(url).await.unwrap();
        let mut all = client.subscribe(">").await.unwrap();
        client.flush().await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Some(m) = all.next().await {
                let id = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                    .map(|v| v.to_string());
                let payload = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
                log.lock()
                    .unwrap()
                    .push((m.subject.to_string(), id, payload));
            }
        });
        Watcher { client, seen }
    }

    async fn publish(&self, subject: &str, payload: &Value) {
        let bytes = serde_json::to_vec(payload).unwrap();
        self.client
            .publish(subject.to_string(), bytes.into())
            .await
            .unwrap();
        self.client.flush().await.unwrap();
    }

    /// The messages seen so far that `matches`: (subject, msg id, payload).
    fn seen(&self, matches: impl Fn(&str, &Value) -> bool) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(s, _, p)| matches(s, p))
            .cloned()
            .collect()
    }

    fn count(&self, matches: impl Fn(&str, &Value) -> bool) -> usize {
        self.seen(matches).len()
    }

    /// Waits until `n` messages match.
    fn wait(&self, n: usize, what: &str, matches: impl Fn(&str, &Value) -> bool) -> Vec<Seen> {
        let found = wait_until(|| {
            let found = self.seen(&matches);
            (found.len() >= n).then_some(found)
        });
        found.unwrap_or_else(|| {
            let seen: Vec<String> = self.seen(|_, _| true).iter().map(|m| m.0.clone()).collect();
            panic!("waited for {n} x {what}; seen: {seen:#?}")
        })
    }
}

/// A worker on its own connection: answers every dispatch at once with `.done`, or `.error`
/// when the component says `"fail": true`; the answer is the dispatch plus `"worked": true`.
async fn worker(url: &str) -> tokio::task::JoinHandle<()> {
    let client = async_nats::connect(url).await.unwrap();
    let mut dispatches = client.subscribe("*.*.*").await.unwrap();
    client.flush().await.unwrap();
    tokio::spawn(async move {
        while let Some(m) = dispatches.next().await {
            if !is_dispatch(&m.subject) {
                continue;
            }
            let Ok(mut payload) = serde_json::from_slice::<Value>(&m.payload) else {
                continue;
            };
            let suffix = if payload["fail"] == true {
                "error"
            } else {
                "done"
            };
            payload["worked"] = json!(true);
            let answer = serde_json::to_vec(&payload).unwrap();
            let subject = format!("{}.{suffix}", m.subject);
            let _ = client.publish(subject, answer.into()).await;
        }
    })
}

/// `verwalter graph` with `VERWALTER_TEST_GRAPH_CRASH=crash` when given.
fn executor(
    url: &str,
    storage: &Path,
    timeout_s: f64,
    log: &Path,
    crash: Option<&str>,
) -> Executor {
    let mut command = Command::new(BIN);
    command
        .args(["graph", "--nats-url", url, "--storage-dir"])
        .arg(storage)
        .arg("--component-timeout")
        .arg(timeout_s.to_string())
        .env("RUST_LOG", "info")
        .env_remove("VERWALTER_TEST_GRAPH_CRASH")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(point) = crash {
        command.env("VERWALTER_TEST_GRAPH_CRASH", point);
    }
    let executor = Executor {
        child: command.spawn().unwrap(),
        log: log.to_owned(),
    };
    executor.wait_log("Graph executor running.", 1);
    executor
}

/// Waits until the executor has died by SIGKILL (its crash switch).
fn wait_killed(executor: &mut Executor) {
    use std::os::unix::process::ExitStatusExt;
    let status = wait_until(|| executor.child.try_wait().unwrap());
    let status = status.unwrap_or_else(|| panic!("still running:\n{}", executor.logs()));
    assert_eq!(status.signal(), Some(9), "{}", executor.logs());
}

/// The kill between storing a result and publishing it (`before-result`) or between
/// publishing it and marking it sent (`after-result`), then a restart: returns the results of
/// build `lost` the core client saw, with the probe after them, and those the stream kept.
async fn killed_around_the_result(crash: &str) -> (Vec<Seen>, Vec<(Option<String>, Value)>) {
    let tmp = tempfile::tempdir().unwrap();
    let storage = tmp.path().join("graph");
    let nats = jetstream(tmp.path());
    let watcher = Watcher::connect(&nats.url()).await;
    create_stream(&watcher.client).await;
    let _worker = worker(&nats.url()).await;
    let mut first = executor(
        &nats.url(),
        &storage,
        60.0,
        &tmp.path().join("executor-1.log"),
        Some(crash),
    );
    watcher.publish("build.create", &probe_build("lost")).await;
    wait_killed(&mut first);
    let file = std::fs::read_to_string(storage.join("b-lost.json")).unwrap();
    let file: Value = serde_json::from_str(&file).unwrap();
    assert_eq!(file["result"]["sent"], "sending", "{file:#}");

    let second = executor(
        &nats.url(),
        &storage,
        60.0,
        &tmp.path().join("executor-2.log"),
        None,
    );
    second.wait_log(
        "its result may not have been published, and is published again",
        1,
    );
    // The restart publishes the result before it takes any message: once the probe build's
    // dispatch is seen, every copy of the result is.
    watcher.publish("build.create", &probe_build("after")).await;
    watcher.wait(1, "the probe's dispatch", dispatch_of("after", "probe::p"));
    let core = watcher.seen(result_of("lost"));
    let stream: Vec<_> = stream_messages(&watcher.client)
        .await
        .into_iter()
        .filter(|(_, p)| p["id"] == "lost")
        .collect();
    // The restart marked it sent (after a flush) before it took the probe.
    let file = std::fs::read_to_string(storage.join("b-lost.json")).unwrap();
    let file: Value = serde_json::from_str(&file).unwrap();
    assert_eq!(file["result"]["sent"], "sent", "{file:#}");
    (core, stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_killed_before_its_publish_is_published_on_restart() {
    let (core, stream) = killed_around_the_result("before-result").await;
    assert_eq!(core.len(), 1, "{core:#?}");
    assert_eq!(core[0].0, "build.create.done");
    assert_eq!(core[0].1.as_deref(), Some("lost.result"));
    assert_eq!(core[0].2["changes"][0]["worked"], true, "the whole build");
    assert_eq!(stream.len(), 1, "{stream:#?}");
    assert_eq!(stream[0].0.as_deref(), Some("lost.result"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_killed_before_it_was_marked_sent_is_seen_twice_and_kept_once() {
    let (core, stream) = killed_around_the_result("after-result").await;
    // Twice on core NATS, with one message id; once in the stream (its duplicate window).
    assert_eq!(core.len(), 2, "{core:#?}");
    for (subject, id, payload) in &core {
        assert_eq!(subject, "build.create.done");
        assert_eq!(id.as_deref(), Some("lost.result"));
        assert_eq!(payload, &core[0].2);
    }
    assert_eq!(stream.len(), 1, "{stream:#?}");
    assert_eq!(stream[0].0.as_deref(), Some("lost.result"));
}

/// A build of `n` components `c::0..n`, each after 0 to 2 earlier ones, one in ten failing.
fn random_build(id: &str, rng: &mut SmallRng) -> Value {
    let n = rng.random_range(2..=6usize);
    let changes: Vec<Value> = (0..n)
        .map(|i| {
            json!({"_component_id": format!("c::{i}"), "_component": "c", "_action": "create",
                   "_provider": "fake", "fail": rng.random_range(0..10) == 0})
        })
        .collect();
    let mut edges = Vec::new();
    for i in 1..n {
        for _ in 0..rng.random_range(0..=2usize) {
            let before = rng.random_range(0..i);
            edges.push(json!({"source": format!("c::{before}"), "destination": format!("c::{i}")}));
        }
    }
    json!({"id": id, "changes": changes, "edges": edges})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_random_moments_the_executor_sends_every_result_and_no_component_twice() {
    let trials: usize = std::env::var("GRAPH_CRASH_TRIALS")
        .map(|n| n.parse().expect("GRAPH_CRASH_TRIALS is a number"))
        .unwrap_or(10);
    let seed: u64 = std::env::var("GRAPH_CRASH_SEED")
        .map(|n| n.parse().expect("GRAPH_CRASH_SEED is a number"))
        .unwrap_or(29);
    let mut rng = SmallRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let storage = tmp.path().join("graph");
    let nats = jetstream(tmp.path());
    let watcher = Watcher::connect(&nats.url()).await;
    create_stream(&watcher.client).await;
    let _worker = worker(&nats.url()).await;
    // A dispatch or an answer lost to a kill ends in this timeout.
    let timeout_s = 1.5;
    let from_executor =
        |s: &str, p: &Value| is_dispatch(s) || (s.starts_with("build.") && p["id"].is_string());
    let mut kills: BTreeMap<&str, usize> = BTreeMap::new();
    let mut builds = Vec::new();
    for trial in 0..trials {
        let what = format!("seed {seed}, trial {trial}");
        // Every fifth kill at each crash switch; the others by SIGKILL at a random moment.
        let mode = match trial % 5 {
            1 => "before-result",
            3 => "after-result",
            _ => "kill -9",
        };
        let crash = (mode != "kill -9").then_some(mode);
        let log = tmp.path().join(format!("executor-{trial}.log"));
        let mut running = executor(&nats.url(), &storage, timeout_s, &log, crash);
        let id = format!("t{trial}");
        let build = random_build(&id, &mut rng);
        let n = build["changes"].as_array().unwrap().len();
        let before = watcher.count(from_executor);
        watcher.publish("build.create", &build).await;
        // The build is stored once a dispatch of it is out: a kill from now on may not lose it.
        // A crash switch may kill the executor first, at a resumed build's result.
        let dispatched = |s: &str, p: &Value| is_dispatch(s) && p["service"] == id.as_str();
        let stored = wait_until(|| {
            if watcher.count(dispatched) > 0 {
                Some(true)
            } else {
                running.child.try_wait().unwrap().map(|_| false)
            }
        });
        let stored = stored.unwrap_or_else(|| {
            panic!(
                "{what}: no dispatch
{}",
                running.logs()
            )
        });
        // Died before it: a build that reached no file was lost with the process, as any
        // message that arrives while the executor is down (core NATS keeps none).
        if stored || storage.join(format!("b-{id}.json")).exists() {
            builds.push(id.clone());
        }
        if !stored {
            wait_killed(&mut running);
            *kills.entry(mode).or_default() += 1;
            continue;
        }
        match crash {
            Some(_) => wait_killed(&mut running),
            None => {
                // After 1 to n + 1 more messages from the executor (dispatches and results of
                // this build and the resumed ones), or this build's result.
                let point = rng.random_range(1..=n + 1);
                let reached = wait_until(|| {
                    (watcher.count(from_executor) >= before + point
                        || watcher.count(result_of(&id)) > 0)
                        .then_some(())
                });
                assert!(reached.is_some(), "{what}: stalled\n{}", running.logs());
                running.kill9();
            }
        }
        *kills.entry(mode).or_default() += 1;
    }
    // The last start finishes everything left.
    let last = executor(
        &nats.url(),
        &storage,
        timeout_s,
        &tmp.path().join("executor-last.log"),
        None,
    );
    for id in &builds {
        watcher.wait(
            1,
            &format!("seed {seed}: the result of {id}"),
            result_of(id),
        );
    }
    // Settled: a probe's result comes after everything the resumed builds published.
    watcher.publish("build.create", &probe_build("probe")).await;
    watcher.wait(1, "the probe's result", result_of("probe"));
    drop(last);

    let mut twice = 0;
    for id in &builds {
        let core = watcher.seen(result_of(id));
        for (_, msg_id, payload) in &core {
            assert_eq!(msg_id.as_deref(), Some(format!("{id}.result").as_str()));
            assert_eq!(
                payload, &core[0].2,
                "seed {seed}: {id}'s result is the same each time"
            );
        }
        if core.len() > 1 {
            twice += 1;
        }
        let mut dispatched: HashMap<String, usize> = HashMap::new();
        for (_, _, p) in watcher.seen(|s, p| is_dispatch(s) && p["service"] == id.as_str()) {
            *dispatched
                .entry(p["_component_id"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        for (component, times) in dispatched {
            assert_eq!(
                times, 1,
                "seed {seed}: {id}'s {component} dispatched {times} times"
            );
        }
    }
    let stream = stream_messages(&watcher.client).await;
    for id in &builds {
        let kept = stream
            .iter()
            .filter(|(_, p)| p["id"] == id.as_str())
            .count();
        assert_eq!(kept, 1, "seed {seed}: the stream keeps one result of {id}");
    }
    eprintln!(
        "graph crash trials: {trials} kills (seed {seed}) {kills:?}; every build ended with a \
         result (the stream kept one each; {twice} builds' results seen twice on core NATS), \
         no component dispatched twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_executors_on_one_server_run_each_build_once() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(tmp.path());
    let watcher = Watcher::connect(&nats.url()).await;
    let _worker = worker(&nats.url()).await;
    let executors: Vec<Executor> = (0..2)
        .map(|i| {
            executor(
                &nats.url(),
                &tmp.path().join(format!("graph-{i}")),
                60.0,
                &tmp.path().join(format!("executor-{i}.log")),
                None,
            )
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(4);
    let ids: Vec<String> = (0..16).map(|i| format!("shared-{i}")).collect();
    for id in &ids {
        let mut build = random_build(id, &mut rng);
        for change in build["changes"].as_array_mut().unwrap() {
            change["fail"] = json!(false);
        }
        watcher.publish("build.create", &build).await;
    }
    for id in &ids {
        let results = watcher.wait(1, &format!("{id}'s result"), result_of(id));
        assert_eq!(results[0].0, "build.create.done", "{id}");
    }
    // Each build was taken by one executor (its owner logged it before its result).
    let started: Vec<usize> = executors
        .iter()
        .map(|e| e.logs().matches("Build started.").count())
        .collect();
    assert_eq!(started.iter().sum::<usize>(), ids.len(), "{started:?}");
    for id in &ids {
        assert_eq!(watcher.count(result_of(id)), 1, "{id}: one result");
        let mut dispatched: HashMap<String, usize> = HashMap::new();
        for (_, _, p) in watcher.seen(|s, p| is_dispatch(s) && p["service"] == id.as_str()) {
            assert_eq!(p["_state"], "running");
            *dispatched
                .entry(p["_component_id"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        assert!(!dispatched.is_empty(), "{id}");
        for (component, times) in dispatched {
            assert_eq!(times, 1, "{id}'s {component} dispatched {times} times");
        }
    }
}
