//! The graph executor's loop: messages in, build files written, messages out, deadlines kept.
//!
//! Each step takes the messages waiting (up to [`BATCH`]), applies them to the [`Executor`],
//! writes every build they changed through the [`BuildStore`] port, and only then publishes
//! through the [`GraphBus`] port: a dispatch is never on the bus before the file that says the
//! component runs (with its deadline), and a completion, once a later dispatch depends on it, is
//! on disk. A terminal message is stored as `sending` before it is published, and as `sent`
//! after a flush. A restart publishes a `sending` one again (it may not have reached the server)
//! and a `sent` one never; each carries the same message id ([`result_msg_id`]), so a client may
//! see a result twice, never zero times.
//!
//! A build is written as a snapshot (the whole run) or as one journal record (what the step
//! changed, [`BuildRun::take_delta`]); see [`needs_snapshot`] for when. A chain of components
//! thus costs one small append per step instead of rewriting a build that grows with each
//! answer.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{BuildRun, Executor, ResultKind, Step};
use crate::machinery::backoff::Backoff;
use crate::machinery::clock::Clock;
use crate::machinery::ports::{BuildStore, GraphBus};

/// Messages taken into one step at most: one file write per build and step, whatever the
/// number of answers, keeps a wide build's per-component cost low.
pub(crate) const BATCH: usize = 1024;
/// A flush (a round trip to the server) that takes longer is given up for now; the client still
/// sends what it holds once it is connected again.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// A build file that cannot be written is tried again this often; nothing about that build is
/// published meanwhile.
const STORE_RETRY: Duration = Duration::from_secs(1);
const STORE_BACKOFF: Backoff = Backoff::fixed(STORE_RETRY);
/// A journal may grow to the size of its snapshot before the next write is a snapshot (so
/// replay never reads more than about twice the build), but at least to this: a small build's
/// snapshot is cheap, yet rewriting it every few steps would cost the fsyncs of a whole file.
pub(crate) const JOURNAL_MIN: usize = 64 * 1024;

/// The `Nats-Msg-Id` of build `id`'s result: the same each time it is published, so a JetStream
/// stream's duplicate window keeps one copy and a core-NATS client can drop a repeat.
pub(crate) fn result_msg_id(id: &str) -> String {
    format!("{id}.result")
}

/// What the loop knows of a build's journal: present once this process wrote the build's
/// snapshot.
#[derive(Debug, Clone, Copy)]
struct Journal {
    snapshot_len: usize,
    /// Bytes appended since that snapshot.
    appended: usize,
}

/// Whether the next write of a build is a snapshot rather than a journal record: when this
/// process has not written its snapshot yet (a new build, or the first write after a restart,
/// which also drops a torn record at the journal's end), after a failed write (`journal` is
/// then `None`: a failed append may have left part of a record, after which nothing may be
/// appended), when the journal outgrew `max(JOURNAL_MIN, snapshot)`, and once the build has its
/// result (its last writes; the snapshot leaves an empty journal behind).
fn needs_snapshot(journal: Option<&Journal>, finished: bool) -> bool {
    match journal {
        None => true,
        Some(j) => finished || j.appended > j.snapshot_len.max(JOURNAL_MIN),
    }
}

/// What reaches the loop.
#[derive(Debug)]
pub enum Input {
    Message {
        subject: String,
        payload: Vec<u8>,
    },
    /// The connection came back: what waited in the client is flushed.
    Reconnected,
}

/// What the loop reports, for metrics.
pub trait GraphObserver: Send + Sync + 'static {
    /// A component answered (or timed out) this long after its dispatch.
    fn answered(&self, _errored: bool, _latency: Duration) {}
    fn finished(&self, _result: ResultKind) {}
    /// Components dispatched and not answered, over every build.
    fn in_flight(&self, _components: usize) {}
}

impl GraphObserver for () {}

pub struct ExecutorLoop {
    executor: Executor,
    bus: Arc<dyn GraphBus>,
    store: Arc<dyn BuildStore>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn GraphObserver>,
    /// Per build whose snapshot this process wrote: its journal since.
    journals: HashMap<String, Journal>,
    /// Builds whose result the client took and no flush has confirmed yet.
    unflushed: HashSet<String>,
}

impl ExecutorLoop {
    pub fn new(
        executor: Executor,
        bus: Arc<dyn GraphBus>,
        store: Arc<dyn BuildStore>,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn GraphObserver>,
    ) -> ExecutorLoop {
        ExecutorLoop {
            executor,
            bus,
            store,
            clock,
            observer,
            journals: HashMap::new(),
            unflushed: HashSet::new(),
        }
    }

    /// Resumes the stored builds, then runs until `shutdown` or until `inbox` closes.
    pub async fn run(mut self, mut inbox: mpsc::Receiver<Input>, shutdown: CancellationToken) {
        let (stored, problems) = self.store.load();
        for problem in problems {
            tracing::error!(%problem, "Build file skipped: it cannot be read.");
        }
        let mut step = Step::default();
        for stored in stored {
            let records = BuildRun::journal_records(&stored.journal);
            match BuildRun::restore_with(&stored.snapshot, records) {
                Ok(run) => merge(&mut step, self.executor.resume(run, self.clock.now_ms())),
                Err(error) => {
                    tracing::error!(%error, "Build file skipped: it is not a stored build.")
                }
            }
        }
        self.carry(step, &shutdown).await;
        loop {
            let wait = self
                .executor
                .next_deadline()
                .map(|d| Duration::from_millis(d.saturating_sub(self.clock.now_ms())));
            let step = tokio::select! {
                _ = shutdown.cancelled() => break,
                input = inbox.recv() => {
                    let Some(input) = input else { break };
                    let mut step = Step::default();
                    let mut reconnected = false;
                    self.take(input, &mut step, &mut reconnected);
                    for _ in 1..BATCH {
                        match inbox.try_recv() {
                            Ok(input) => self.take(input, &mut step, &mut reconnected),
                            Err(_) => break,
                        }
                    }
                    if reconnected {
                        self.reconnected(&shutdown).await;
                    }
                    step
                }
                _ = sleep(wait) => self.executor.tick(self.clock.now_ms()),
            };
            self.carry(step, &shutdown).await;
        }
    }

    fn take(&mut self, input: Input, step: &mut Step, reconnected: &mut bool) {
        match input {
            Input::Message { subject, payload } => {
                let now = self.clock.now_ms();
                merge(step, self.executor.message(&subject, &payload, now));
            }
            Input::Reconnected => *reconnected = true,
        }
    }

    /// After a reconnect: flush what the client held, take as sent the results it held (their
    /// flush had failed), and publish again those it refused.
    async fn reconnected(&mut self, shutdown: &CancellationToken) {
        match tokio::time::timeout(FLUSH_TIMEOUT, self.bus.flush()).await {
            Ok(Ok(())) => {
                tracing::info!("Graph executor flushed its messages after the reconnect.");
                let sent: Vec<String> = self.unflushed.drain().collect();
                for id in &sent {
                    self.executor.mark_sent(id);
                }
                self.save(&sent, shutdown).await;
                self.executor.forget_finished();
                let mut again = Step::default();
                for id in self.executor.sending() {
                    if let Some(out) = self.executor.run(&id).and_then(|r| r.terminal_message()) {
                        tracing::info!(build = %id, "Publishing the build's result again.");
                        again.publish.push((id, out));
                    }
                }
                if !again.publish.is_empty() {
                    self.carry(again, shutdown).await;
                }
            }
            Ok(Err(error)) => tracing::warn!(%error, "Flush after the reconnect failed."),
            Err(_) => tracing::warn!("Flush after the reconnect timed out."),
        }
    }

    /// Writes, then publishes, what a step asks for.
    async fn carry(&mut self, step: Step, shutdown: &CancellationToken) {
        for (errored, ms) in &step.answered {
            self.observer.answered(*errored, Duration::from_millis(*ms));
        }
        if !self.save(&step.save, shutdown).await {
            return;
        }
        let mut terminals = Vec::new();
        let max = self.bus.max_payload();
        for (id, mut out) in step.publish {
            if out.terminal && out.payload.len() > max {
                // A result the server would refuse is published as a summary that fits, saying
                // where the whole build is; never not at all.
                let whole = out.payload.len();
                let at = self.store.location(&id);
                out.payload = super::fit_result(out.payload, max, at.as_deref());
                tracing::warn!(build = %id, subject = %out.subject, bytes = whole,
                    max_payload = max, stored_at = at.as_deref().unwrap_or(""),
                    "The build's result is over the server's max_payload; publishing a summary.");
            }
            let published = if out.terminal {
                let msg_id = result_msg_id(&id);
                self.bus
                    .publish_result(out.subject.clone(), out.payload, msg_id)
            } else {
                self.bus.publish(out.subject.clone(), out.payload)
            };
            match published.await {
                Ok(()) if out.terminal => {
                    self.unflushed.insert(id.clone());
                    terminals.push(id);
                }
                Ok(()) => {}
                // The client refuses only what it cannot send as it is: an operator must look.
                // The file keeps the result as `sending`; the next reconnect or start publishes
                // it again.
                Err(error) if out.terminal => tracing::error!(build = %id,
                    subject = %out.subject, %error, "The build's result cannot be published."),
                Err(error) => tracing::warn!(build = %id, subject = %out.subject, %error,
                    "Publish failed; the component will time out."),
            }
        }
        for (id, result) in &step.finished {
            self.observer.finished(*result);
            tracing::info!(build = %id, result = result.label(), "Build {id} finished: {}",
                result.label());
        }
        self.observer.in_flight(self.executor.in_flight());
        if terminals.is_empty() {
            return;
        }
        match tokio::time::timeout(FLUSH_TIMEOUT, self.bus.flush()).await {
            Ok(Ok(())) => {
                for id in &terminals {
                    self.unflushed.remove(id);
                    self.executor.mark_sent(id);
                }
                self.save(&terminals, shutdown).await;
                self.executor.forget_finished();
            }
            Ok(Err(error)) => tracing::warn!(%error, "Flush after a build's result failed."),
            Err(_) => tracing::warn!("Flush after a build's result timed out."),
        }
    }

    /// Writes what changed in the builds of `ids` (a snapshot or a journal record each),
    /// retrying until each is written; `false` on shutdown first.
    async fn save(&mut self, ids: &[String], shutdown: &CancellationToken) -> bool {
        let mut seen = HashSet::new();
        for id in ids.iter().filter(|id| seen.insert(id.as_str())) {
            // Until written: a run forgotten meanwhile has nothing left to write.
            let mut failures = 0;
            while let Some(run) = self.executor.run_mut(id) {
                let finished = run.finished();
                let written = if needs_snapshot(self.journals.get(id), finished) {
                    run.clear_delta();
                    let Ok(bytes) = serde_json::to_vec(&*run) else {
                        break;
                    };
                    let len = bytes.len();
                    let written = self.store.save(id.clone(), bytes).await;
                    if written.is_ok() && !finished {
                        let journal = Journal {
                            snapshot_len: len,
                            appended: 0,
                        };
                        self.journals.insert(id.clone(), journal);
                    } else {
                        // After a failure the next write is a snapshot again; a finished build
                        // is written as snapshots only, and forgotten soon.
                        self.journals.remove(id);
                    }
                    written
                } else {
                    let Some(delta) = run.take_delta() else {
                        break;
                    };
                    let Ok(mut record) = serde_json::to_vec(&delta) else {
                        break;
                    };
                    record.push(b'\n');
                    let len = record.len();
                    let written = self.store.append(id.clone(), record).await;
                    match (&written, self.journals.get_mut(id)) {
                        (Ok(()), Some(journal)) => journal.appended += len,
                        _ => {
                            self.journals.remove(id);
                        }
                    }
                    written
                };
                match written {
                    Ok(()) => break,
                    Err(problem) => {
                        tracing::error!(build = %id, %problem,
                            "Cannot write the build's file; nothing of it is published until it is written.");
                        failures += 1;
                        tokio::select! {
                            _ = shutdown.cancelled() => return false,
                            _ = tokio::time::sleep(STORE_BACKOFF.nominal(failures)) => {}
                        }
                    }
                }
            }
        }
        true
    }
}

fn merge(into: &mut Step, step: Step) {
    for id in step.save {
        if !into.save.contains(&id) {
            into.save.push(id);
        }
    }
    into.publish.extend(step.publish);
    into.answered.extend(step.answered);
    into.finished.extend(step.finished);
}

async fn sleep(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use futures::FutureExt;
    use serde_json::{Value, json};

    use super::*;
    use crate::ernest::RunSettings;
    use crate::graph::ErrorPolicy;
    use crate::machinery::ports::{BusError, StorageError, StoredBuild};

    /// Records what is published, with the files as they were at that moment.
    #[derive(Default)]
    struct World {
        files: Mutex<HashMap<String, StoredBuild>>,
        /// (subject, payload, the build as its files gave it back when it was published)
        published: Mutex<Vec<(String, Value, Option<Value>)>>,
        flushes: Mutex<usize>,
        /// The writes: (`save` or `append`, build, bytes, whether it failed).
        writes: Mutex<Vec<(&'static str, String, usize, bool)>>,
        /// This many of the next appends fail, after writing half their record.
        failing_appends: Mutex<usize>,
        /// The server's max_payload, when not NATS's default.
        max_payload: Mutex<Option<usize>>,
        /// The message ids of the results published, in order.
        result_ids: Mutex<Vec<String>>,
        /// Where the process "dies" (its bus never returns again): before a result is
        /// published, or at the flush after it.
        crash: Mutex<Option<&'static str>>,
        /// This many of the next results are refused by the client.
        refused_results: Mutex<usize>,
    }

    impl World {
        /// What a restart would read of build `id`: its snapshot with the journal replayed.
        fn stored(&self, id: &str) -> Option<Value> {
            let files = self.files.lock().unwrap();
            let stored = files.get(id)?;
            let records = BuildRun::journal_records(&stored.journal);
            let run = BuildRun::restore_with(&stored.snapshot, records).unwrap();
            Some(serde_json::to_value(&run).unwrap())
        }

        fn writes(&self) -> Vec<(&'static str, String, usize, bool)> {
            self.writes.lock().unwrap().clone()
        }
    }

    struct Bus(Arc<World>);
    impl GraphBus for Bus {
        fn publish(
            &self,
            subject: String,
            payload: Vec<u8>,
        ) -> futures::future::BoxFuture<'static, Result<(), BusError>> {
            let payload: Value = serde_json::from_slice(&payload).unwrap();
            let service = payload
                .get("service")
                .or(payload.get("id"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let file = self.0.stored(&service);
            self.0
                .published
                .lock()
                .unwrap()
                .push((subject, payload, file));
            async { Ok(()) }.boxed()
        }
        fn publish_result(
            &self,
            subject: String,
            payload: Vec<u8>,
            msg_id: String,
        ) -> futures::future::BoxFuture<'static, Result<(), BusError>> {
            if *self.0.crash.lock().unwrap() == Some("before-result") {
                return futures::future::pending().boxed();
            }
            {
                let mut refused = self.0.refused_results.lock().unwrap();
                if *refused > 0 {
                    *refused -= 1;
                    return async { Err(BusError("connection closed".into())) }.boxed();
                }
            }
            self.0.result_ids.lock().unwrap().push(msg_id);
            self.publish(subject, payload)
        }
        fn flush(&self) -> futures::future::BoxFuture<'static, Result<(), BusError>> {
            if *self.0.crash.lock().unwrap() == Some("after-result") {
                return futures::future::pending().boxed();
            }
            *self.0.flushes.lock().unwrap() += 1;
            async { Ok(()) }.boxed()
        }
        fn max_payload(&self) -> usize {
            self.0
                .max_payload
                .lock()
                .unwrap()
                .unwrap_or(crate::machinery::ports::DEFAULT_MAX_PAYLOAD)
        }
    }

    struct Store(Arc<World>);
    impl BuildStore for Store {
        fn save(
            &self,
            id: String,
            bytes: Vec<u8>,
        ) -> futures::future::BoxFuture<'static, Result<(), StorageError>> {
            let len = bytes.len();
            self.0.files.lock().unwrap().insert(
                id.clone(),
                StoredBuild {
                    snapshot: bytes,
                    journal: Vec::new(),
                },
            );
            self.0.writes.lock().unwrap().push(("save", id, len, false));
            async { Ok(()) }.boxed()
        }
        fn append(
            &self,
            id: String,
            record: Vec<u8>,
        ) -> futures::future::BoxFuture<'static, Result<(), StorageError>> {
            let fail = {
                let mut failing = self.0.failing_appends.lock().unwrap();
                let fail = *failing > 0;
                *failing = failing.saturating_sub(1);
                fail
            };
            let written = if fail {
                &record[..record.len() / 2]
            } else {
                &record[..]
            };
            let mut files = self.0.files.lock().unwrap();
            let stored = files.get_mut(&id).expect("a record after the snapshot");
            stored.journal.extend_from_slice(written);
            self.0
                .writes
                .lock()
                .unwrap()
                .push(("append", id, record.len(), fail));
            async move {
                if fail {
                    Err(StorageError {
                        path: "b1.journal".into(),
                        kind: std::io::ErrorKind::StorageFull,
                        message: "cannot append: No space left on device".into(),
                    })
                } else {
                    Ok(())
                }
            }
            .boxed()
        }
        fn load(&self) -> (Vec<StoredBuild>, Vec<StorageError>) {
            (
                self.0.files.lock().unwrap().values().cloned().collect(),
                Vec::new(),
            )
        }
        fn location(&self, id: &str) -> Option<String> {
            Some(format!("/files/{id}.json"))
        }
    }

    /// Wall-clock ms that follow tokio's (paused) time.
    struct TokioClock(tokio::time::Instant);
    impl Clock for TokioClock {
        fn now_ms(&self) -> u64 {
            1_000_000 + self.0.elapsed().as_millis() as u64
        }
    }

    fn start(world: &Arc<World>) -> (mpsc::Sender<Input>, CancellationToken) {
        let looped = ExecutorLoop::new(
            Executor::new(RunSettings {
                policy: ErrorPolicy::Halt,
                component_timeout: Duration::from_secs(30),
                templating: Default::default(),
            }),
            Arc::new(Bus(world.clone())),
            Arc::new(Store(world.clone())),
            Arc::new(TokioClock(tokio::time::Instant::now())),
            Arc::new(()),
        );
        let (tx, rx) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        tokio::spawn(looped.run(rx, shutdown.clone()));
        (tx, shutdown)
    }

    fn build() -> Vec<u8> {
        serde_json::to_vec(&json!({"id": "b1", "changes": [
            {"_component_id": "a::1", "_component": "a", "_action": "create", "_provider": "p"},
            {"_component_id": "a::2", "_component": "a", "_action": "create", "_provider": "p"}
        ], "edges": [{"source": "a::1", "destination": "a::2"}]}))
        .unwrap()
    }

    async fn published(world: &World, n: usize) -> Vec<(String, Value, Option<Value>)> {
        for _ in 0..1000 {
            let p = world.published.lock().unwrap().clone();
            if p.len() >= n {
                return p;
            }
            tokio::task::yield_now().await;
        }
        panic!(
            "expected {n} messages: {:?}",
            world.published.lock().unwrap()
        );
    }

    fn msg(subject: &str, payload: &Value) -> Input {
        Input::Message {
            subject: subject.into(),
            payload: serde_json::to_vec(payload).unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_file_is_written_before_a_dispatch_and_the_result_is_published_once() {
        let world = Arc::new(World::default());
        let (tx, shutdown) = start(&world);
        tx.send(Input::Message {
            subject: "build.create".into(),
            payload: build(),
        })
        .await
        .unwrap();
        let p = published(&world, 1).await;
        let (subject, payload, file) = &p[0];
        assert_eq!(subject, "a.create.p");
        let file = file.as_ref().expect("written before the dispatch");
        assert_eq!(file["build"]["changes"][0]["_state"], "running");
        assert!(file["running"]["a::1"]["deadline_ms"].is_u64());

        tx.send(msg("a.create.p.done", payload)).await.unwrap();
        let p = published(&world, 2).await;
        let file = p[1].2.as_ref().unwrap();
        assert_eq!(
            file["build"]["changes"][0]["_state"], "completed",
            "the completion is on disk before the next dispatch"
        );
        let second = p[1].1.clone();
        tx.send(msg("a.create.p.done", &second)).await.unwrap();
        tx.send(msg("a.create.p.done", &second)).await.unwrap();
        let p = published(&world, 3).await;
        assert_eq!(p[2].0, "build.create.done");
        assert_eq!(p[2].2.as_ref().unwrap()["result"]["sent"], "sending");
        // Let the loop finish the step: the file then says the result went out.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let stored = world.stored("b1").unwrap();
        assert_eq!(stored["result"]["sent"], "sent");
        assert_eq!(world.published.lock().unwrap().len(), 3, "one result");
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_answer_times_out_and_a_restart_does_not_dispatch_again() {
        let world = Arc::new(World::default());
        let (tx, shutdown) = start(&world);
        tx.send(Input::Message {
            subject: "build.create".into(),
            payload: build(),
        })
        .await
        .unwrap();
        published(&world, 1).await;
        // A restart: a second loop on the same files dispatches nothing already running.
        shutdown.cancel();
        tokio::task::yield_now().await;
        let (_tx2, shutdown2) = start(&world);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(world.published.lock().unwrap().len(), 1);
        // No answer comes: after the timeout, one error.
        tokio::time::sleep(Duration::from_secs(31)).await;
        let p = published(&world, 2).await;
        assert_eq!(p[1].0, "build.create.error");
        assert!(p[1].1["error"].as_str().unwrap().contains("timed out"));
        shutdown2.cancel();
    }

    /// Runs build `b1` until the loop "dies" at `crash`, then restarts on the same files.
    /// Returns the world once the restarted loop has published the result and settled.
    async fn killed_at(crash: &'static str) -> Arc<World> {
        let world = Arc::new(World::default());
        *world.crash.lock().unwrap() = Some(crash);
        let (tx, _dead) = start(&world);
        tx.send(msg(
            "build.create",
            &serde_json::from_slice(&build()).unwrap(),
        ))
        .await
        .unwrap();
        let p = published(&world, 1).await;
        tx.send(msg("a.create.p.done", &p[0].1)).await.unwrap();
        let p = published(&world, 2).await;
        tx.send(msg("a.create.p.done", &p[1].1)).await.unwrap();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let stored = world.stored("b1").unwrap();
        assert_eq!(
            stored["result"]["sent"], "sending",
            "stored before the publish"
        );
        // The first loop hangs where the process died; a second one starts on its files.
        *world.crash.lock().unwrap() = None;
        let (_tx, shutdown) = start(&world);
        let before = world.result_ids.lock().unwrap().len();
        let p = published(&world, 2 + before + 1).await;
        assert_eq!(p.last().unwrap().0, "build.create.done");
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(world.stored("b1").unwrap()["result"]["sent"], "sent");
        shutdown.cancel();
        world
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_killed_before_its_publish_goes_out_on_restart_with_its_message_id() {
        let world = killed_at("before-result").await;
        assert_eq!(*world.result_ids.lock().unwrap(), ["b1.result"]);
        let p = world.published.lock().unwrap().clone();
        let subjects: Vec<&str> = p.iter().map(|m| m.0.as_str()).collect();
        assert_eq!(subjects, ["a.create.p", "a.create.p", "build.create.done"]);
        assert_eq!(
            p[2].1["changes"][1]["_state"], "completed",
            "the whole build"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_killed_before_it_was_marked_sent_goes_out_again_with_the_same_id() {
        let world = killed_at("after-result").await;
        // Twice, never zero times: the same id lets a stream or a client keep one.
        assert_eq!(
            *world.result_ids.lock().unwrap(),
            ["b1.result", "b1.result"]
        );
        let p = world.published.lock().unwrap().clone();
        assert_eq!(p.len(), 4, "{p:?}");
        assert_eq!(p[2].1, p[3].1, "the same result both times");
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_the_client_refused_is_published_again_after_a_reconnect() {
        let world = Arc::new(World::default());
        *world.refused_results.lock().unwrap() = 1;
        let (tx, shutdown) = start(&world);
        tx.send(Input::Message {
            subject: "build.create".into(),
            payload: build(),
        })
        .await
        .unwrap();
        let p = published(&world, 1).await;
        tx.send(msg("a.create.p.done", &p[0].1)).await.unwrap();
        let p = published(&world, 2).await;
        tx.send(msg("a.create.p.done", &p[1].1)).await.unwrap();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(world.published.lock().unwrap().len(), 2, "refused");
        assert_eq!(world.stored("b1").unwrap()["result"]["sent"], "sending");
        tx.send(Input::Reconnected).await.unwrap();
        let p = published(&world, 3).await;
        assert_eq!(p[2].0, "build.create.done");
        assert_eq!(*world.result_ids.lock().unwrap(), ["b1.result"]);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(world.stored("b1").unwrap()["result"]["sent"], "sent");
        // A second reconnect has nothing left to send.
        tx.send(Input::Reconnected).await.unwrap();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(world.published.lock().unwrap().len(), 3);
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_over_the_servers_max_payload_is_published_as_a_summary() {
        let world = Arc::new(World::default());
        *world.max_payload.lock().unwrap() = Some(700);
        let (tx, shutdown) = start(&world);
        tx.send(Input::Message {
            subject: "build.create".into(),
            payload: build(),
        })
        .await
        .unwrap();
        // Each answer brings 300 bytes: the whole result (both in `changes` and `components`)
        // is over 700.
        let mut n = 1;
        let result = loop {
            let p = published(&world, n).await;
            let (subject, mut payload, _) = p[n - 1].clone();
            if subject.starts_with("build.") {
                break (subject, payload);
            }
            payload["blob"] = json!("x".repeat(300));
            tx.send(msg(&format!("{subject}.done"), &payload))
                .await
                .unwrap();
            n += 1;
        };
        assert_eq!(result.0, "build.create.done");
        let summary = &result.1;
        assert_eq!(summary["id"], "b1");
        assert!(summary.get("components").is_none(), "{summary:#}");
        let note = &summary[crate::ernest::SUMMARY_KEY];
        assert_eq!(note["components"], 2);
        assert_eq!(note["changes"], 2);
        assert_eq!(note["max_payload"], 700);
        assert!(note["bytes"].as_u64().unwrap() > 700, "{note}");
        assert_eq!(note["stored_at"], "/files/b1.json");
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        // It went out: the build is marked sent, and the file keeps the whole build.
        let stored = world.stored("b1").unwrap();
        assert_eq!(stored["result"]["sent"], "sent");
        assert_eq!(stored["build"]["components"][1]["blob"], "x".repeat(300));
        shutdown.cancel();
    }

    fn kinds(writes: &[(&'static str, String, usize, bool)]) -> Vec<&'static str> {
        writes.iter().map(|w| w.0).collect()
    }

    /// Answers every dispatch of build `b1` as it comes until the build's result is out.
    async fn answer_all(world: &World, tx: &mpsc::Sender<Input>) -> Value {
        let mut n = 1;
        loop {
            let p = published(world, n).await;
            let (subject, payload, _) = p[n - 1].clone();
            if subject.starts_with("build.") {
                return payload;
            }
            tx.send(msg(&format!("{subject}.done"), &payload))
                .await
                .unwrap();
            n += 1;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_build_is_a_snapshot_first_then_journal_records_then_a_snapshot_when_finished() {
        let world = Arc::new(World::default());
        let (tx, shutdown) = start(&world);
        tx.send(Input::Message {
            subject: "build.create".into(),
            payload: build(),
        })
        .await
        .unwrap();
        let result = answer_all(&world, &tx).await;
        assert_eq!(result["changes"][1]["_state"], "completed");
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        // The new build, a::1 done with a::2 dispatched, a::2 done with the result `sending`,
        // the result `sent`.
        assert_eq!(
            kinds(&world.writes()),
            ["save", "append", "save", "save"],
            "{:?}",
            world.writes()
        );
        let files = world.files.lock().unwrap().clone();
        assert!(
            files["b1"].journal.is_empty(),
            "the last snapshot emptied it"
        );
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_failed_append_the_build_is_written_as_a_snapshot() {
        let world = Arc::new(World::default());
        let (tx, shutdown) = start(&world);
        tx.send(Input::Message {
            subject: "build.create".into(),
            payload: build(),
        })
        .await
        .unwrap();
        let p = published(&world, 1).await;
        *world.failing_appends.lock().unwrap() = 1;
        tx.send(msg("a.create.p.done", &p[0].1)).await.unwrap();
        // The loop waits STORE_RETRY, then writes a snapshot.
        tokio::time::sleep(STORE_RETRY * 2).await;
        let p = published(&world, 2).await;
        assert_eq!(p[1].0, "a.create.p");
        let file = p[1].2.as_ref().unwrap();
        assert_eq!(file["build"]["changes"][0]["_state"], "completed");
        assert_eq!(file["build"]["changes"][1]["_state"], "running");
        let writes = world.writes();
        assert_eq!(kinds(&writes[..3]), ["save", "append", "save"]);
        assert!(writes[1].3, "the append failed");
        let files = world.files.lock().unwrap().clone();
        assert!(
            files["b1"].journal.is_empty(),
            "the half record is gone with the snapshot"
        );
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_journal_grown_past_its_snapshot_is_replaced_by_a_snapshot() {
        let world = Arc::new(World::default());
        let (tx, shutdown) = start(&world);
        // A chain of 40 components of 4 KiB each: a step's record (the answered change, the
        // component it adds, the next change running) is about 12 KiB.
        let n = 40;
        let blob = "x".repeat(4096);
        let changes: Vec<Value> = (0..n)
            .map(|i| {
                json!({"_component_id": format!("a::{i}"), "_component": "a",
                       "_action": "create", "_provider": "p", "blob": blob})
            })
            .collect();
        let edges: Vec<Value> = (1..n)
            .map(|i| json!({"source": format!("a::{}", i - 1), "destination": format!("a::{i}")}))
            .collect();
        let payload = json!({"id": "b1", "changes": changes, "edges": edges});
        tx.send(msg("build.create", &payload)).await.unwrap();
        let result = answer_all(&world, &tx).await;
        assert_eq!(result["components"].as_array().unwrap().len(), n);
        let writes = world.writes();
        let mut appended = 0;
        let mut limit = 0;
        let mut snapshots_between = 0;
        for (i, (kind, _, len, _)) in writes.iter().enumerate() {
            if *kind == "save" {
                if i > 0 && i < writes.len() - 2 {
                    snapshots_between += 1;
                }
                appended = 0;
                limit = (*len).max(JOURNAL_MIN);
            } else {
                assert!(
                    appended <= limit,
                    "an append after the journal outgrew its snapshot: {writes:?}"
                );
                appended += len;
            }
        }
        assert!(
            snapshots_between >= 1,
            "the journal was compacted: {writes:?}"
        );
        assert!(
            kinds(&writes).iter().filter(|k| **k == "append").count() > n / 2,
            "most steps are records: {writes:?}"
        );
        shutdown.cancel();
    }
}
