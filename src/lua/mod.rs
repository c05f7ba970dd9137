//! The Lua scheduler: a sandboxed Lua 5.4 state on its own thread, implementing the
//! controllers' [`Scheduler`] port.
//!
//! The state lives on a dedicated OS thread (`scheduler`), so a long run never blocks the async
//! runtime and the HTTP API stays responsive. The code is reloaded when the content hash of
//! `scheduler/v1` changes, and after a run that hit the time or memory limit (its state may be
//! half-built).

pub mod convert;
mod pattern;
pub mod sandbox;
mod watchdog;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use verwalter_controllers::ports::{Scheduler, SchedulerError, SchedulerFailure};
use verwalter_controllers::state::{SchedulerInput, SchedulerOutput};

pub use sandbox::{Limits, Sandbox};

use crate::inputs::SCHEDULER_DIR;

type Reply = oneshot::Sender<Result<SchedulerOutput, SchedulerError>>;

struct Job {
    code_version: String,
    input: Arc<SchedulerInput>,
    reply: Reply,
}

/// The scheduler port backed by a Lua sandbox thread.
pub struct LuaScheduler {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    limits: Limits,
    jobs: Mutex<mpsc::Sender<Job>>,
}

/// Extra wait past the time budget before the thread is given up on. The budget stops every
/// script we know of; this is the last line of defence should one still hang the thread.
const WATCHDOG_GRACE: Duration = Duration::from_secs(3);

impl std::fmt::Debug for LuaScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LuaScheduler")
    }
}

impl LuaScheduler {
    /// Starts the scheduler thread for the config dir `config_dir`.
    pub fn start(config_dir: PathBuf, limits: Limits) -> std::io::Result<LuaScheduler> {
        let dir = config_dir.join(SCHEDULER_DIR);
        let jobs = spawn_worker(dir.clone(), limits)?;
        Ok(LuaScheduler {
            inner: Arc::new(Inner {
                dir,
                limits,
                jobs: Mutex::new(jobs),
            }),
        })
    }
}

fn spawn_worker(dir: PathBuf, limits: Limits) -> std::io::Result<mpsc::Sender<Job>> {
    let (jobs, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("scheduler".into())
        .spawn(move || worker(dir, limits, rx))?;
    Ok(jobs)
}

fn internal(message: &str) -> SchedulerError {
    SchedulerError {
        kind: SchedulerFailure::Internal,
        message: message.into(),
        log: String::new(),
    }
}

fn worker(dir: PathBuf, limits: Limits, jobs: mpsc::Receiver<Job>) {
    let mut loaded: Option<(String, Sandbox)> = None;
    while let Ok(job) = jobs.recv() {
        if loaded
            .as_ref()
            .is_none_or(|(version, _)| *version != job.code_version)
        {
            loaded = None;
            match Sandbox::load(&dir, SCHEDULER_DIR, limits) {
                Ok(sandbox) => {
                    tracing::info!(version = %job.code_version, "Loaded the scheduler.");
                    loaded = Some((job.code_version.clone(), sandbox));
                }
                Err(error) => {
                    let _ = job.reply.send(Err(error));
                    continue;
                }
            }
        }
        let Some((_, sandbox)) = &loaded else {
            continue;
        };
        let result = sandbox.run(&job.input);
        let poisoned = matches!(&result, Err(e) if matches!(e.kind, SchedulerFailure::Timeout | SchedulerFailure::Memory));
        let _ = job.reply.send(result);
        if poisoned {
            loaded = None;
        } else {
            sandbox.after_run();
        }
    }
}

impl Scheduler for LuaScheduler {
    fn run(
        &self,
        code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        let (reply, result) = oneshot::channel();
        let job = Job {
            code_version: code_version.to_string(),
            input,
            reply,
        };
        let sent = self
            .inner
            .jobs
            .lock()
            .expect("scheduler sender lock")
            .send(job);
        let inner = self.inner.clone();
        Box::pin(async move {
            if sent.is_err() {
                return Err(internal("the scheduler thread is gone"));
            }
            match tokio::time::timeout(inner.limits.time + WATCHDOG_GRACE, result).await {
                Ok(reply) => {
                    reply.unwrap_or_else(|_| Err(internal("the scheduler thread dropped the run")))
                }
                Err(_) => {
                    // The thread is stuck past its budget: abandon it and start a fresh one.
                    tracing::error!("The scheduler thread did not return; starting a new one.");
                    if let Ok(fresh) = spawn_worker(inner.dir.clone(), inner.limits) {
                        *inner.jobs.lock().expect("scheduler sender lock") = fresh;
                    }
                    Err(SchedulerError {
                        kind: SchedulerFailure::Timeout,
                        message: format!(
                            "scheduler did not return within {:?}",
                            inner.limits.time + WATCHDOG_GRACE
                        ),
                        log: String::new(),
                    })
                }
            }
        })
    }
}

#[cfg(test)]
mod tests;
