//! The Lua scheduler: a sandboxed Lua 5.4 state on its own thread, implementing the
//! controllers' [`Scheduler`] port.
//!
//! The state lives on a dedicated OS thread (`scheduler`), so a long run never blocks the async
//! runtime and the HTTP API stays responsive. The code is reloaded when the content hash of
//! `scheduler/v1` changes, and after a run that hit the time or memory limit (its state may be
//! half-built).

pub mod allocator;
pub(crate) mod convert;
mod pattern;
mod placement;
pub(crate) mod sandbox;
mod watchdog;

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use futures::future::BoxFuture;
use verwalter_controllers::machinery::ports::{Scheduler, SchedulerError};
use verwalter_controllers::machinery::watchdog::Progress;
use verwalter_controllers::state::{
    ScheduleData, SchedulerFailure, SchedulerInput, SchedulerOutput,
};

pub use sandbox::{Limits, Sandbox};

use crate::inputs::SCHEDULER_DIR;
use crate::schedule::thread::{BeforeRun, Engine, GRACE, Names, SchedulerThread};

/// The scheduler port backed by a Lua sandbox thread.
pub(crate) struct LuaScheduler {
    thread: SchedulerThread,
}

const NAMES: Names = Names {
    thread: "scheduler",
    noun: "scheduler",
    subject: "scheduler",
    watched: "scheduler thread",
};

impl std::fmt::Debug for LuaScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LuaScheduler")
    }
}

impl LuaScheduler {
    /// Starts the scheduler thread for the config dir `config_dir`.
    pub(crate) fn start(config_dir: PathBuf, limits: Limits) -> std::io::Result<LuaScheduler> {
        Self::start_with(config_dir, limits, GRACE, None)
    }

    fn start_with(
        config_dir: PathBuf,
        limits: Limits,
        grace: Duration,
        before_run: Option<BeforeRun>,
    ) -> std::io::Result<LuaScheduler> {
        let engine = move || LuaEngine {
            config_dir,
            limits,
            loaded: None,
            made: None,
            parsed: None,
        };
        let thread = SchedulerThread::start(NAMES, limits.time, grace, engine, before_run)?;
        Ok(LuaScheduler { thread })
    }

    /// Records every run in `progress` until the thread is done with it: a run stuck in a call
    /// the budget cannot stop (which makes the port refuse every later run) is then a stall of
    /// the watchdog, and systemd restarts the daemon with a fresh thread.
    pub(crate) fn watched(self, progress: &Progress) -> LuaScheduler {
        LuaScheduler {
            thread: self.thread.watched(progress),
        }
    }
}

fn internal(message: &str) -> SchedulerError {
    SchedulerError {
        kind: SchedulerFailure::Internal,
        message: message.into(),
        log: String::new(),
    }
}

/// The Lua state on the scheduler thread, with the code version it loaded.
struct LuaEngine {
    config_dir: PathBuf,
    limits: Limits,
    loaded: Option<(String, Sandbox)>,
    /// The data of the last run's schedule, whose tree [`Engine::after_run`] parses.
    made: Option<ScheduleData>,
    /// The last data whose tree `after_run` parsed: a run that returns the same text (a rerun
    /// with nothing changed, the common case) is not parsed again. Its schedule is not put in
    /// force (the controller keeps, or restamps, the one in force, whose tree this is); should
    /// it be (the same data from another origin), its tree is parsed on first use.
    parsed: Option<ScheduleData>,
}

impl Engine for LuaEngine {
    /// Loads the code first if its version changed (or the last run poisoned the state).
    fn run(
        &mut self,
        code_version: &str,
        input: &SchedulerInput,
    ) -> Result<SchedulerOutput, SchedulerError> {
        if self
            .loaded
            .as_ref()
            .is_none_or(|(version, _)| version != code_version)
        {
            self.loaded = None;
            let dir = self.config_dir.join(SCHEDULER_DIR);
            let sandbox = Sandbox::load_within(&dir, SCHEDULER_DIR, &self.config_dir, self.limits)?;
            tracing::info!(version = %code_version, "Loaded the scheduler.");
            self.loaded = Some((code_version.to_string(), sandbox));
        }
        let (_, sandbox) = self.loaded.as_ref().expect("loaded above");
        let result = sandbox.run(input);
        self.made = result.as_ref().ok().map(|output| output.data.clone());
        // A run stopped by its time or memory limit may have left the state half-built.
        if matches!(&result, Err(e) if matches!(e.kind, SchedulerFailure::Timeout | SchedulerFailure::Memory))
        {
            self.loaded = None;
        }
        result
    }

    fn after_run(&mut self) {
        if let Some((_, sandbox)) = &self.loaded {
            sandbox.after_run();
        }
        // A table's schedule comes as text alone; the leader's next run reads it back as its
        // `parents` (and the API as a tree), so its tree is made here, off the run's wait,
        // while the controller hashes and stores the text.
        if let Some(data) = self.made.take() {
            let same = self
                .parsed
                .as_ref()
                .is_some_and(|last| last.canonical() == data.canonical());
            if !same {
                data.tree();
                self.parsed = Some(data);
            }
        }
    }
}

impl Scheduler for LuaScheduler {
    fn run(
        &self,
        code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        self.thread.run(code_version, input)
    }
}

/// Loads the scheduler in `dir` and runs it once on its own thread, for the offline commands:
/// a run stuck past its budget (plus [`GRACE`]) is given up on with an error, and the
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
    let wait = limits.time * 2 + GRACE;
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
