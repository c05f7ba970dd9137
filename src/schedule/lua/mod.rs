//! The Lua scheduler: a sandboxed Lua 5.4 state on its own thread, implementing the
//! controllers' [`Scheduler`] port.
//!
//! The state lives on a dedicated OS thread (`scheduler`), so a long run never blocks the async
//! runtime and the HTTP API stays responsive. The code is reloaded when the content hash of
//! `scheduler/v1` changes, and after a run that hit the time or memory limit (its state may be
//! half-built).

pub mod allocator;
pub mod convert;
mod pattern;
mod placement;
pub mod sandbox;
mod watchdog;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use verwalter_controllers::machinery::ports::{Scheduler, SchedulerError};
use verwalter_controllers::machinery::watchdog::{
    self as progress, DriverBeat, PassMark, Progress,
};
use verwalter_controllers::state::SchedulerFailure;
use verwalter_controllers::state::{SchedulerInput, SchedulerOutput};

pub use sandbox::{Limits, Sandbox};

use crate::inputs::SCHEDULER_DIR;

type Reply = oneshot::Sender<Result<SchedulerOutput, SchedulerError>>;

struct Job {
    code_version: String,
    input: Arc<SchedulerInput>,
    reply: Reply,
    /// The run in the watchdog's records, until the worker is done with it.
    _mark: Option<PassMark>,
}

/// The scheduler port backed by a Lua sandbox thread.
pub struct LuaScheduler {
    inner: Arc<Inner>,
    /// Where each run is recorded for the watchdog.
    beat: Option<DriverBeat>,
}

struct Inner {
    limits: Limits,
    /// How long past the budget a run may take before it is reported stuck.
    grace: Duration,
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Set by the worker while it runs a job.
    busy: Arc<AtomicBool>,
    /// When the run that did not return in time was started; cleared once the worker is free.
    stuck_since: Mutex<Option<Instant>>,
}

/// Extra wait past the time budget before a run is reported stuck. The budget stops every
/// script we know of (the pattern functions watch the clock themselves); this is the last line
/// of defence should a C function still hold the thread.
pub const WATCHDOG_GRACE: Duration = Duration::from_secs(3);

/// Runs on the worker thread before each run; tests use it to hold the thread the way a C
/// function the budget cannot stop would.
type BeforeRun = Arc<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for LuaScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LuaScheduler")
    }
}

impl LuaScheduler {
    /// Starts the scheduler thread for the config dir `config_dir`.
    pub fn start(config_dir: PathBuf, limits: Limits) -> std::io::Result<LuaScheduler> {
        Self::start_with(config_dir, limits, WATCHDOG_GRACE, None)
    }

    fn start_with(
        config_dir: PathBuf,
        limits: Limits,
        grace: Duration,
        before_run: Option<BeforeRun>,
    ) -> std::io::Result<LuaScheduler> {
        let busy = Arc::new(AtomicBool::new(false));
        let (jobs, rx) = mpsc::channel::<Job>();
        let worker_busy = busy.clone();
        // The one scheduler thread: it is never replaced, so a run stuck in C code can hold
        // at most this thread, never pile up spinning ones.
        std::thread::Builder::new()
            .name("scheduler".into())
            .spawn(move || worker(config_dir, limits, rx, worker_busy, before_run))?;
        Ok(LuaScheduler {
            beat: None,
            inner: Arc::new(Inner {
                limits,
                grace,
                jobs: Mutex::new(jobs),
                busy,
                stuck_since: Mutex::new(None),
            }),
        })
    }
}

impl LuaScheduler {
    /// Records every run in `progress` until the thread is done with it: a run stuck in a call
    /// the budget cannot stop (which makes the port refuse every later run) is then a stall of
    /// the watchdog, and systemd restarts the daemon with a fresh thread.
    pub fn watched(mut self, progress: &Progress) -> LuaScheduler {
        let limit = self.inner.limits.time + self.inner.grace + progress::MARGIN;
        self.beat = Some(progress.worker("scheduler thread", limit));
        self
    }
}

fn internal(message: &str) -> SchedulerError {
    SchedulerError {
        kind: SchedulerFailure::Internal,
        message: message.into(),
        log: String::new(),
    }
}

fn worker(
    config_dir: PathBuf,
    limits: Limits,
    jobs: mpsc::Receiver<Job>,
    busy: Arc<AtomicBool>,
    before_run: Option<BeforeRun>,
) {
    let mut loaded: Option<(String, Sandbox)> = None;
    while let Ok(job) = jobs.recv() {
        busy.store(true, Ordering::SeqCst);
        if let Some(hook) = &before_run {
            hook();
        }
        run_job(&config_dir, limits, &mut loaded, job);
        busy.store(false, Ordering::SeqCst);
    }
}

/// Runs one job on the worker thread, loading the code first if its version changed (or the
/// last run poisoned the state).
fn run_job(config_dir: &Path, limits: Limits, loaded: &mut Option<(String, Sandbox)>, job: Job) {
    if loaded
        .as_ref()
        .is_none_or(|(version, _)| *version != job.code_version)
    {
        *loaded = None;
        let dir = config_dir.join(SCHEDULER_DIR);
        match Sandbox::load_within(&dir, SCHEDULER_DIR, config_dir, limits) {
            Ok(sandbox) => {
                tracing::info!(version = %job.code_version, "Loaded the scheduler.");
                *loaded = Some((job.code_version.clone(), sandbox));
            }
            Err(error) => {
                let _ = job.reply.send(Err(error));
                return;
            }
        }
    }
    let Some((_, sandbox)) = &loaded else {
        return;
    };
    let result = sandbox.run(&job.input);
    let poisoned = matches!(&result, Err(e) if matches!(e.kind, SchedulerFailure::Timeout | SchedulerFailure::Memory));
    let _ = job.reply.send(result);
    if poisoned {
        *loaded = None;
    } else {
        sandbox.after_run();
    }
}

impl Scheduler for LuaScheduler {
    fn run(
        &self,
        code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        let inner = self.inner.clone();
        if let Some(error) = inner.still_stuck() {
            return Box::pin(async move { Err(error) });
        }
        let (reply, result) = oneshot::channel();
        let job = Job {
            code_version: code_version.to_string(),
            input,
            reply,
            _mark: self
                .beat
                .as_ref()
                .map(|beat| beat.pass("run".into(), tokio::time::Instant::now())),
        };
        let started = Instant::now();
        let sent = inner.jobs.lock().expect("scheduler sender lock").send(job);
        Box::pin(async move {
            if sent.is_err() {
                return Err(internal("the scheduler thread is gone"));
            }
            let wait = inner.limits.time + inner.grace;
            match tokio::time::timeout(wait, result).await {
                Ok(reply) => {
                    reply.unwrap_or_else(|_| Err(internal("the scheduler thread dropped the run")))
                }
                Err(_) => {
                    // No second thread is started: it could get stuck the same way, and the
                    // stuck one cannot be stopped. Runs are refused until this one returns.
                    *inner.stuck_since.lock().expect("stuck lock") = Some(started);
                    tracing::error!(
                        waited_ms = wait.as_millis() as u64,
                        "The scheduler did not return; no new run starts until it does."
                    );
                    Err(SchedulerError {
                        kind: SchedulerFailure::Timeout,
                        message: format!(
                            "scheduler did not return within {wait:?}; its thread is stuck in a call the time budget cannot stop, and no new run starts until it returns"
                        ),
                        log: String::new(),
                    })
                }
            }
        })
    }
}

impl Inner {
    /// The error for a run asked for while an earlier run is still stuck; `None` once the
    /// thread is free again.
    fn still_stuck(&self) -> Option<SchedulerError> {
        let mut stuck = self.stuck_since.lock().expect("stuck lock");
        let since = (*stuck)?;
        if !self.busy.load(Ordering::SeqCst) {
            tracing::info!("The stuck scheduler run returned; running again.");
            *stuck = None;
            return None;
        }
        Some(SchedulerError {
            kind: SchedulerFailure::Timeout,
            message: format!(
                "scheduler is stuck: a run started {}s ago has not returned (a call the time budget cannot stop); no new run starts until it returns",
                since.elapsed().as_secs()
            ),
            log: String::new(),
        })
    }
}

/// Loads the scheduler in `dir` and runs it once on its own thread, for the offline commands:
/// a run stuck past its budget (plus [`WATCHDOG_GRACE`]) is given up on with an error, and the
/// process, which is about to exit, takes the thread with it. Symlinks to the code must stay
/// inside `config_dir`.
pub fn run_once(
    dir: &Path,
    display_dir: &str,
    config_dir: &Path,
    input: SchedulerInput,
    limits: Limits,
) -> Result<SchedulerOutput, SchedulerError> {
    let (tx, rx) = mpsc::channel();
    let (dir, display_dir, config_dir) = (
        dir.to_path_buf(),
        display_dir.to_string(),
        config_dir.to_path_buf(),
    );
    std::thread::Builder::new()
        .name("scheduler".into())
        .spawn(move || {
            let result = Sandbox::load_within(&dir, &display_dir, &config_dir, limits)
                .and_then(|s| s.run(&input));
            let _ = tx.send(result);
        })
        .map_err(|e| internal(&format!("cannot start the scheduler thread: {e}")))?;
    // Loading and running have a budget each.
    let wait = limits.time * 2 + WATCHDOG_GRACE;
    rx.recv_timeout(wait).unwrap_or_else(|_| {
        Err(SchedulerError {
            kind: SchedulerFailure::Timeout,
            message: format!(
                "scheduler did not return within {wait:?} (stuck in a call the time budget cannot stop)"
            ),
            log: String::new(),
        })
    })
}

#[cfg(test)]
mod tests;
