//! The scheduler thread: the one adapter between the controllers' [`Scheduler`](verwalter_controllers::machinery::ports::Scheduler) port and a
//! scheduler that runs on an OS thread of its own (the Lua state, the wasm module), so that a
//! long run never blocks the async runtime.
//!
//! A run is a job sent to the thread; the port waits for its result at most the time budget
//! plus [`GRACE`]. A run that does not return by then is reported stuck, and no new run is sent
//! until the thread is free again: the thread is never replaced, so a run stuck where its
//! budget cannot stop it (a C function, a host call, a copy) holds at most this one thread,
//! never piles up more. Each run is on the watchdog's records until the thread is done with
//! it, so a stuck run becomes a stall of systemd's watchdog.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use verwalter_controllers::machinery::ports::SchedulerError;
use verwalter_controllers::machinery::watchdog::{
    self as progress, DriverBeat, PassMark, Progress,
};
use verwalter_controllers::state::SchedulerFailure;
use verwalter_controllers::state::{SchedulerInput, SchedulerOutput};

/// Extra wait past the time budget before a run is reported stuck. The budget stops every
/// script we know of (the Lua pattern functions watch the clock themselves, the wasm fuel
/// slices stop a module within a slice); this is the last line of defence should a call still
/// hold the thread. The daemon's step limit for a scheduler run counts on it.
pub(crate) const GRACE: Duration = Duration::from_secs(3);

/// What runs on the thread: one kind of scheduler, with the code it loaded.
pub(crate) trait Engine {
    /// Runs the scheduler once, loading its code first when `code_version` is new.
    fn run(
        &mut self,
        code_version: &str,
        input: &SchedulerInput,
    ) -> Result<SchedulerOutput, SchedulerError>;

    /// Work after the result is out, off the caller's wait (freeing the run's garbage).
    fn after_run(&mut self) {}
}

/// Runs on the thread before each run; tests use it to hold the thread the way a call the
/// budget cannot stop would.
pub(crate) type BeforeRun = Arc<dyn Fn() + Send + Sync>;

/// How a scheduler thread is named in its messages, logs and the watchdog's records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names {
    /// The OS thread's name (`scheduler`).
    pub(crate) thread: &'static str,
    /// What runs on it, inside a sentence (`scheduler`, `wasm scheduler`).
    pub(crate) noun: &'static str,
    /// How its errors begin (`scheduler`, `the wasm scheduler`).
    pub(crate) subject: &'static str,
    /// Its name in the watchdog's records (`scheduler thread`).
    pub(crate) watched: &'static str,
}

struct Job {
    code_version: String,
    input: Arc<SchedulerInput>,
    reply: oneshot::Sender<Result<SchedulerOutput, SchedulerError>>,
    /// The run in the watchdog's records, until the thread is done with it.
    mark: Option<PassMark>,
}

/// The thread of one scheduler and the port's side of it.
pub(crate) struct SchedulerThread {
    shared: Arc<Shared>,
    /// The time budget of a run.
    time: Duration,
    /// How long past the budget a run may take before it is reported stuck.
    grace: Duration,
    /// Where each run is recorded for the watchdog.
    beat: Option<DriverBeat>,
}

/// What a run's wait shares with the port.
struct Shared {
    names: Names,
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Set by the thread while it runs a job.
    busy: Arc<AtomicBool>,
    /// When the run that did not return in time was started; cleared once the thread is free.
    stuck_since: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for SchedulerThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerThread")
            .field("names", &self.shared.names)
            .finish()
    }
}

impl SchedulerThread {
    /// Starts the thread; `engine` is made on it (a Lua state stays on the thread that made
    /// it).
    pub(crate) fn start<E: Engine, F: FnOnce() -> E + Send + 'static>(
        names: Names,
        time: Duration,
        grace: Duration,
        engine: F,
        before_run: Option<BeforeRun>,
    ) -> std::io::Result<SchedulerThread> {
        let busy = Arc::new(AtomicBool::new(false));
        let (jobs, rx) = mpsc::channel::<Job>();
        let thread_busy = busy.clone();
        std::thread::Builder::new()
            .name(names.thread.into())
            .spawn(move || serve(engine(), rx, &thread_busy, before_run.as_deref()))?;
        Ok(SchedulerThread {
            shared: Arc::new(Shared {
                names,
                jobs: Mutex::new(jobs),
                busy,
                stuck_since: Mutex::new(None),
            }),
            time,
            grace,
            beat: None,
        })
    }

    /// Records every run in `progress` until the thread is done with it: a run held past its
    /// budget, grace and [`progress::MARGIN`] is then a stall of the watchdog, and systemd
    /// restarts the daemon with a fresh thread.
    pub(crate) fn watched(mut self, progress: &Progress) -> SchedulerThread {
        let limit = self.time + self.grace + progress::MARGIN;
        self.beat = Some(progress.worker(self.shared.names.watched, limit));
        self
    }

    /// The same thread waited for `grace` past the budget from now on.
    #[cfg(test)]
    pub(crate) fn with_grace(mut self, grace: Duration) -> SchedulerThread {
        self.grace = grace;
        self
    }

    /// Sends one run to the thread and waits for its result, at most the budget plus the
    /// grace; refused at once while an earlier run is stuck.
    pub(crate) fn run(
        &self,
        code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        if let Some(error) = self.shared.still_stuck() {
            return Box::pin(async move { Err(error) });
        }
        let (reply, result) = oneshot::channel();
        let job = Job {
            code_version: code_version.to_string(),
            input,
            reply,
            mark: self
                .beat
                .as_ref()
                .map(|beat| beat.pass("run".into(), tokio::time::Instant::now())),
        };
        let started = Instant::now();
        let shared = self.shared.clone();
        let sent = shared.jobs.lock().expect("scheduler sender lock").send(job);
        let wait = self.time + self.grace;
        Box::pin(async move {
            let Names { noun, subject, .. } = shared.names;
            if sent.is_err() {
                return Err(internal(format!("the {noun} thread is gone")));
            }
            match tokio::time::timeout(wait, result).await {
                Ok(reply) => reply.unwrap_or_else(|_| {
                    Err(internal(format!("the {noun} thread dropped the run")))
                }),
                Err(_) => {
                    // No second thread is started: it could get stuck the same way, and the
                    // stuck one cannot be stopped. Runs are refused until this one returns.
                    *shared.stuck_since.lock().expect("stuck lock") = Some(started);
                    tracing::error!(
                        waited_ms = wait.as_millis() as u64,
                        "The {noun} did not return; no new run starts until it does."
                    );
                    Err(SchedulerError {
                        kind: SchedulerFailure::Timeout,
                        message: format!(
                            "{subject} did not return within {wait:?}; its thread is stuck in a call the time budget cannot stop, and no new run starts until it returns"
                        ),
                        log: String::new(),
                    })
                }
            }
        })
    }
}

impl Shared {
    /// The error for a run asked for while an earlier run is still stuck; `None` once the
    /// thread is free again.
    fn still_stuck(&self) -> Option<SchedulerError> {
        let mut stuck = self.stuck_since.lock().expect("stuck lock");
        let since = (*stuck)?;
        let Names { noun, subject, .. } = self.names;
        if !self.busy.load(Ordering::SeqCst) {
            tracing::info!("The stuck {noun} run returned; running again.");
            *stuck = None;
            return None;
        }
        Some(SchedulerError {
            kind: SchedulerFailure::Timeout,
            message: format!(
                "{subject} is stuck: a run started {}s ago has not returned (a call the time budget cannot stop); no new run starts until it returns",
                since.elapsed().as_secs()
            ),
            log: String::new(),
        })
    }
}

fn internal(message: String) -> SchedulerError {
    SchedulerError {
        kind: SchedulerFailure::Internal,
        message,
        log: String::new(),
    }
}

/// The thread's loop: one job at a time, for as long as the port is there.
fn serve<E: Engine>(
    mut engine: E,
    jobs: mpsc::Receiver<Job>,
    busy: &AtomicBool,
    before_run: Option<&(dyn Fn() + Send + Sync)>,
) {
    while let Ok(job) = jobs.recv() {
        busy.store(true, Ordering::SeqCst);
        if let Some(hook) = before_run {
            hook();
        }
        let result = engine.run(&job.code_version, &job.input);
        // The run is over before its result is out: whoever gets the result finds no record
        // of it left.
        drop(job.mark);
        let _ = job.reply.send(result);
        engine.after_run();
        busy.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use verwalter_controllers::state::ScheduleData;

    const NAMES: Names = Names {
        thread: "test-scheduler",
        noun: "test scheduler",
        subject: "the test scheduler",
        watched: "test scheduler thread",
    };

    /// Answers each run with the code version it was asked for.
    struct Echo;

    impl Engine for Echo {
        fn run(
            &mut self,
            version: &str,
            _: &SchedulerInput,
        ) -> Result<SchedulerOutput, SchedulerError> {
            Ok(SchedulerOutput {
                data: ScheduleData::from_value(json!({ "version": version })),
                log: String::new(),
            })
        }
    }

    fn input() -> Arc<SchedulerInput> {
        Arc::new(SchedulerInput {
            now: 1,
            current_host: "alpha".into(),
            current_id: "77985419c732412ea38b94db00000001".into(),
            parents: Vec::new(),
            actions: BTreeMap::new(),
            runtime: Arc::new(json!({})),
            peers: BTreeMap::new(),
            metrics: json!({}),
            datacenters: None,
        })
    }

    #[tokio::test]
    async fn a_stuck_run_refuses_the_next_runs_until_the_thread_is_free() {
        let (release, held) = mpsc::channel::<()>();
        let held = Mutex::new(held);
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = runs.clone();
        let hook: BeforeRun = Arc::new(move || {
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                held.lock().unwrap().recv().unwrap();
            }
        });
        let ms = Duration::from_millis;
        let thread = SchedulerThread::start(NAMES, ms(20), ms(20), || Echo, Some(hook)).unwrap();
        let e = thread.run("v1", input()).await.unwrap_err();
        assert_eq!(e.kind, SchedulerFailure::Timeout);
        assert_eq!(
            e.message,
            "the test scheduler did not return within 40ms; its thread is stuck in a call the time budget cannot stop, and no new run starts until it returns"
        );
        let e = thread.run("v2", input()).await.unwrap_err();
        assert_eq!(e.kind, SchedulerFailure::Timeout);
        assert!(
            e.message
                .starts_with("the test scheduler is stuck: a run started 0s ago"),
            "{}",
            e.message
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the refused run never reached the thread"
        );
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let out = loop {
            match thread.run("v3", input()).await {
                Ok(out) => break out,
                Err(e) if e.message.contains("is stuck") => {
                    assert!(Instant::now() < deadline, "never freed");
                    tokio::time::sleep(ms(5)).await;
                }
                Err(e) => panic!("{}", e.message),
            }
        };
        assert_eq!(out.data, json!({"version": "v3"}));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
