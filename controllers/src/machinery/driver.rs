//! The loop every controller runs in: wake on a store change, a requeue timer, a periodic resync
//! or shutdown; run one reconcile pass per key with dedup (one running + one pending per key),
//! exponential backoff with jitter per key (reset on success) and a bound on concurrent passes.
//!
//! The reconciler is level-triggered: it is never told why it woke, it reads the store and takes
//! one idempotent step. A store change runs a key at once even while it backs off (the change may
//! be the fix); the backoff timer and the resync respect the backoff.
//!
//! A failure is logged (WARN) when a key starts failing or its error changes; an attempt that
//! fails as the one before is logged at debug level only, so a key failing for hours logs one
//! line (the observer still sees every pass).

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use std::panic::AssertUnwindSafe;

use futures::future::{self, FutureExt};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::machinery::backoff::Backoff;
use crate::machinery::store::Trigger;
use crate::machinery::watchdog::{self, DriverBeat, Progress};

/// When to look at a key again after a successful pass.
pub(crate) type Requeue = Option<Duration>;

/// One controller: a set of keys and a reconcile step per key.
pub trait Reconciler: Send + Sync + 'static {
    type Key: Clone + Eq + Hash + Debug + Send + Sync + 'static;
    type Error: std::fmt::Display + Send + 'static;

    /// Controller name: span name suffix and metric label.
    fn name(&self) -> &'static str;

    /// The keys that should exist now (read from the store on every wake).
    fn keys(&self) -> Vec<Self::Key>;

    /// One idempotent step towards the desired state of `key`.
    fn reconcile(
        self: Arc<Self>,
        key: Self::Key,
    ) -> impl Future<Output = Result<Requeue, Self::Error>> + Send + 'static;

    /// A bounded metric label for an error.
    fn error_reason(&self, error: &Self::Error) -> &'static str;
}

/// How a driver runs its reconciler.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Every key is looked at this often even without a change (a missed event costs at most
    /// one resync period).
    pub resync: Duration,
    pub backoff: Backoff,
    /// Passes running at once across keys.
    pub max_concurrent: usize,
    /// How long shutdown waits for running passes before aborting them.
    pub shutdown_grace: Duration,
    /// Seed of the jitter generator (fixed in tests for reproducible delays).
    pub seed: u64,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            resync: Duration::from_secs(60),
            backoff: Backoff::default(),
            max_concurrent: 4,
            // Long enough for a scheduler run or a render command to finish cleanly.
            shutdown_grace: Duration::from_secs(5),
            seed: rand::random(),
        }
    }
}

/// Receives per-pass outcomes and queue state (the daemon turns them into metrics).
pub trait DriverObserver: Send + Sync + 'static {
    /// A pass finished; `failure` is the error reason when it failed.
    fn pass(&self, controller: &'static str, failure: Option<&'static str>, duration: Duration);
    /// Queue state after every change: passes running, keys waiting, keys backing off.
    fn queue(&self, controller: &'static str, running: usize, waiting: usize, backing_off: usize);
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoObserver;

impl DriverObserver for NoObserver {
    fn pass(&self, _: &'static str, _: Option<&'static str>, _: Duration) {}
    fn queue(&self, _: &'static str, _: usize, _: usize, _: usize) {}
}

/// A pass's result; `Err(())` when the pass panicked.
type PassResult<R> = Result<Result<Requeue, <R as Reconciler>::Error>, ()>;

enum Event<T, K> {
    Shutdown,
    Wake(K),
    Done(Result<T, tokio::task::JoinError>),
    Changed,
    Timer,
}

#[derive(Debug, Default)]
struct KeyState {
    running: bool,
    /// A wake arrived while running: run again when the pass ends.
    pending: bool,
    /// Waiting for a free concurrency slot.
    queued: bool,
    failures: u32,
    /// The error of the last failed pass, while the key fails: an error repeated by the next
    /// attempt is not logged again.
    last_error: Option<String>,
    backoff_until: Option<Instant>,
    /// Next timed look: a requeue or the end of a backoff.
    due: Option<Instant>,
}

/// Runs a [`Reconciler`] until shutdown.
pub struct Driver<R: Reconciler> {
    reconciler: Arc<R>,
    config: DriverConfig,
    triggers: Vec<Box<dyn Trigger>>,
    observer: Arc<dyn DriverObserver>,
    keys: HashMap<R::Key, KeyState>,
    waiting: VecDeque<R::Key>,
    running: usize,
    tasks: JoinSet<(R::Key, PassResult<R>, Duration)>,
    rng: SmallRng,
    /// Where the loop's turns and the running passes are recorded for the watchdog.
    beat: Option<DriverBeat>,
    /// Keys the reconciler asks to look at again (see [`Driver::wake_keys`]).
    wakes: Option<tokio::sync::mpsc::UnboundedReceiver<R::Key>>,
}

impl<R: Reconciler> Driver<R> {
    pub fn new(reconciler: Arc<R>, config: DriverConfig) -> Driver<R> {
        let rng = SmallRng::seed_from_u64(config.seed);
        Driver {
            reconciler,
            config,
            triggers: Vec::new(),
            observer: Arc::new(NoObserver),
            keys: HashMap::new(),
            waiting: VecDeque::new(),
            running: 0,
            tasks: JoinSet::new(),
            rng,
            beat: None,
            wakes: None,
        }
    }

    /// Runs a pass of each key received here, as a change would (a key not among the current
    /// keys rescans them when the reconciler lists it now, and is ignored otherwise): the reconciler asks for the keys its own progress unblocked, without
    /// waking every key.
    pub(crate) fn wake_keys(mut self, wakes: tokio::sync::mpsc::UnboundedReceiver<R::Key>) -> Self {
        self.wakes = Some(wakes);
        self
    }

    /// Wake on changes of this store field.
    pub(crate) fn trigger(mut self, trigger: Box<dyn Trigger>) -> Self {
        self.triggers.push(trigger);
        self
    }

    pub fn observer(mut self, observer: Arc<dyn DriverObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// Records the loop's turns and the running passes in `progress` (the watchdog's rule:
    /// `controllers/src/machinery/watchdog.rs`); a pass may go `step_limit` without a step.
    pub fn progress(mut self, progress: &Progress, step_limit: Duration) -> Self {
        self.beat = Some(progress.driver(self.reconciler.name(), step_limit, Instant::now()));
        self
    }

    /// Runs until `shutdown` is cancelled, then lets running passes finish within the grace
    /// period.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let name = self.reconciler.name();
        let mut next_resync = Instant::now() + self.config.resync;
        // The first pass looks at every key, as after a change; changes made before it are
        // covered by it.
        for trigger in &mut self.triggers {
            trigger.mark_seen();
        }
        self.scan(true);
        loop {
            self.report();
            let mut timer = self
                .next_timer()
                .map_or(next_resync, |t| t.min(next_resync));
            if let Some(beat) = &self.beat {
                // Turning the loop even when idle is what tells the watchdog it is not stuck.
                let now = Instant::now();
                beat.turned(now);
                if let Some(every) = beat.turn_every() {
                    timer = timer.min(now + every);
                }
            }
            let mut triggers = std::mem::take(&mut self.triggers);
            let mut wakes = self.wakes.take();
            let event = {
                let woken = async {
                    match wakes.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => future::pending().await,
                    }
                };
                let changed = async {
                    if triggers.is_empty() {
                        future::pending::<()>().await;
                    } else {
                        future::select_all(triggers.iter_mut().map(|t| t.changed())).await;
                    }
                };
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => Event::Shutdown,
                    Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => Event::Done(done),
                    _ = changed => Event::Changed,
                    Some(key) = woken => Event::Wake(key),
                    _ = tokio::time::sleep_until(timer) => Event::Timer,
                }
            };
            self.triggers = triggers;
            self.wakes = wakes;
            match event {
                Event::Shutdown => break,
                Event::Done(Ok((key, result, elapsed))) => self.finished(key, result, elapsed),
                Event::Done(Err(e)) => {
                    // Panics are caught inside the task; this is an abort, which only shutdown does.
                    tracing::debug!(controller = name, error = %e, "Reconcile task ended abnormally.");
                }
                Event::Changed => self.scan(true),
                Event::Wake(key) => {
                    if self.keys.contains_key(&key) {
                        self.want(key, true);
                    } else if self.reconciler.keys().contains(&key) {
                        // A key the reconciler learned of since the last scan (the render
                        // controller's roles, once its role source answered).
                        self.scan(true);
                    }
                }
                Event::Timer => {
                    let now = Instant::now();
                    if now >= next_resync {
                        next_resync = now + self.config.resync;
                        self.scan(false);
                    }
                    self.fire_due(now);
                }
            }
        }
        let grace = tokio::time::sleep(self.config.shutdown_grace);
        tokio::pin!(grace);
        while !self.tasks.is_empty() {
            tokio::select! {
                _ = &mut grace => {
                    tracing::warn!(controller = name, running = self.tasks.len(), "Aborting passes still running at shutdown.");
                    self.tasks.abort_all();
                    break;
                }
                _ = self.tasks.join_next() => {}
            }
        }
    }

    /// Looks at every current key; drops state of keys that are gone.
    fn scan(&mut self, bypass_backoff: bool) {
        let keys = self.reconciler.keys();
        let wanted: std::collections::HashSet<&R::Key> = keys.iter().collect();
        self.keys.retain(|k, s| s.running || wanted.contains(k));
        self.waiting.retain(|k| wanted.contains(k));
        for key in keys {
            self.want(key, bypass_backoff);
        }
    }

    fn fire_due(&mut self, now: Instant) {
        let due: Vec<R::Key> = self
            .keys
            .iter()
            .filter(|(_, s)| !s.running && s.due.is_some_and(|d| d <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            if let Some(state) = self.keys.get_mut(&key) {
                state.due = None;
            }
            self.want(key, true);
        }
    }

    fn want(&mut self, key: R::Key, bypass_backoff: bool) {
        let now = Instant::now();
        let state = self.keys.entry(key.clone()).or_default();
        if state.running {
            state.pending = true;
            return;
        }
        if state.queued {
            return;
        }
        if !bypass_backoff && state.backoff_until.is_some_and(|until| until > now) {
            state.due = state.backoff_until;
            return;
        }
        if self.running >= self.config.max_concurrent.max(1) {
            state.queued = true;
            self.waiting.push_back(key);
            return;
        }
        self.start(key);
    }

    fn start(&mut self, key: R::Key) {
        let state = self.keys.entry(key.clone()).or_default();
        state.running = true;
        state.queued = false;
        state.due = None;
        self.running += 1;
        let reconciler = self.reconciler.clone();
        let span = tracing::info_span!("reconcile", controller = reconciler.name(), key = ?key);
        let mark = self
            .beat
            .as_ref()
            .map(|beat| beat.pass(format!("{key:?}"), Instant::now()));
        self.tasks.spawn(
            async move {
                let started = Instant::now();
                let pass = AssertUnwindSafe(reconciler.reconcile(key.clone())).catch_unwind();
                let result = match mark {
                    Some(mark) => watchdog::within(mark, pass).await,
                    None => pass.await,
                }
                .map_err(|_| ());
                (key, result, started.elapsed())
            }
            .instrument(span),
        );
    }

    fn finished(&mut self, key: R::Key, result: PassResult<R>, elapsed: Duration) {
        let name = self.reconciler.name();
        self.running -= 1;
        let now = Instant::now();
        let result = result.map_err(|()| {
            tracing::error!(controller = name, key = ?key, "Reconcile pass panicked.");
        });
        let failure = match &result {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(self.reconciler.error_reason(e)),
            Err(()) => Some("panic"),
        };
        self.observer.pass(name, failure, elapsed);
        let backoff = self.config.backoff;
        let delay = failure.is_some().then(|| {
            let failures = self.keys.get(&key).map_or(0, |s| s.failures) + 1;
            backoff.delay(failures, &mut self.rng)
        });
        let state = self.keys.entry(key.clone()).or_default();
        state.running = false;
        match result {
            Ok(Ok(requeue)) => {
                if state.failures > 0 {
                    tracing::info!(controller = name, key = ?key, failures = state.failures,
                        "Reconcile succeeded after failing.");
                }
                state.failures = 0;
                state.last_error = None;
                state.backoff_until = None;
                state.due = requeue.map(|d| now + d);
            }
            failed => {
                state.failures += 1;
                let delay = delay.unwrap_or_default();
                if let Ok(Err(error)) = failed {
                    // Logged once per change of the error, not per attempt: a key that fails
                    // the same way for hours logs one line (its attempts are in the metrics).
                    let text = error.to_string();
                    if state.last_error.as_ref() != Some(&text) {
                        tracing::warn!(controller = name, key = ?key, failures = state.failures,
                            retry_in_ms = delay.as_millis() as u64, error = %text, "Reconcile failed.");
                        state.last_error = Some(text);
                    } else {
                        tracing::debug!(controller = name, key = ?key, failures = state.failures,
                            retry_in_ms = delay.as_millis() as u64, error = %text, "Reconcile failed again.");
                    }
                }
                state.backoff_until = Some(now + delay);
                state.due = state.backoff_until;
            }
        }
        let pending = std::mem::take(&mut state.pending);
        if pending {
            self.want(key, true);
        }
        while self.running < self.config.max_concurrent.max(1) {
            let Some(next) = self.waiting.pop_front() else {
                break;
            };
            self.start(next);
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.keys
            .values()
            .filter(|s| !s.running)
            .filter_map(|s| s.due)
            .min()
    }

    fn report(&self) {
        let backing_off = self
            .keys
            .values()
            .filter(|s| !s.running && s.backoff_until.is_some())
            .count();
        let waiting = self.waiting.len() + self.keys.values().filter(|s| s.pending).count();
        self.observer
            .queue(self.reconciler.name(), self.running, waiting, backing_off);
    }
}

#[cfg(test)]
mod tests;
