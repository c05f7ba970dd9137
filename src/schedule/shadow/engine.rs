//! A shadow scheduler on its own [`SchedulerThread`]: the Lua sandbox or the wasm module of
//! `scheduler/<name>`, loaded and run exactly as `scheduler/v1`'s are, with the same limits,
//! budget and grace; its output checked the same way.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use verwalter_controllers::machinery::ports::SchedulerError;
use verwalter_controllers::state::{SchedulerFailure, SchedulerInput, SchedulerOutput};

use crate::schedule::lua::{Limits, Sandbox};
use crate::schedule::thread::{Engine, GRACE, Names, SchedulerThread};
use crate::schedule::wasm::{SCHEDULER_WASM, WasmRun, read_module};

const NAMES: Names = Names {
    thread: "shadow-scheduler",
    noun: "shadow scheduler",
    subject: "the shadow scheduler",
    watched: "shadow scheduler thread",
};

/// No memory figure (a wasm module, or a run that never reached the Lua state).
const UNKNOWN: usize = usize::MAX;

/// One shadow's thread. It is not on the watchdog's records: a shadow stuck in a call its
/// budget cannot stop holds its own thread only, and must not restart the daemon.
pub(crate) struct ShadowThread {
    thread: SchedulerThread,
    /// The Lua state's memory when the last run ended.
    memory: Arc<AtomicUsize>,
}

impl ShadowThread {
    /// Starts the thread of `scheduler/<name>` in `config_dir`.
    pub(crate) fn start(
        config_dir: PathBuf,
        name: &str,
        limits: Limits,
    ) -> std::io::Result<ShadowThread> {
        let memory = Arc::new(AtomicUsize::new(UNKNOWN));
        let engine_memory = memory.clone();
        let rel = format!("scheduler/{name}");
        let engine = move || ShadowEngine {
            config_dir,
            rel,
            limits,
            loaded: None,
            memory: engine_memory,
        };
        let thread = SchedulerThread::start(NAMES, limits.time, GRACE, engine, None)?;
        Ok(ShadowThread { thread, memory })
    }

    /// Runs the shadow once on `input` (code `version`), at most its budget plus the grace.
    pub(crate) fn run(
        &self,
        version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        self.memory.store(UNKNOWN, Ordering::SeqCst);
        self.thread.run(version, input)
    }

    /// The Lua state's memory when the last run ended (garbage included), if known.
    pub(crate) fn memory(&self) -> Option<u64> {
        let bytes = self.memory.load(Ordering::SeqCst);
        (bytes != UNKNOWN).then_some(bytes as u64)
    }
}

/// What a shadow's dir holds, loaded.
enum Loaded {
    Lua(Sandbox),
    Wasm(Box<WasmRun>),
}

struct ShadowEngine {
    config_dir: PathBuf,
    /// `scheduler/<name>`.
    rel: String,
    limits: Limits,
    loaded: Option<(String, Loaded)>,
    memory: Arc<AtomicUsize>,
}

impl ShadowEngine {
    fn load(&self) -> Result<Loaded, SchedulerError> {
        let dir = self.config_dir.join(&self.rel);
        let wasm = dir.join(SCHEDULER_WASM);
        if !wasm.is_file() {
            let sandbox = Sandbox::load_within(&dir, &self.rel, &self.config_dir, self.limits)?;
            return Ok(Loaded::Lua(sandbox));
        }
        let name = format!("{}/{SCHEDULER_WASM}", self.rel);
        let bytes = read_module(&wasm).map_err(|e| SchedulerError {
            kind: SchedulerFailure::Load,
            message: format!("{name}: cannot read: {e}"),
            log: String::new(),
        })?;
        Ok(Loaded::Wasm(Box::new(WasmRun::from_bytes(
            &name,
            &bytes,
            self.limits.into(),
        )?)))
    }
}

impl Engine for ShadowEngine {
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
            let loaded = self.load()?;
            tracing::info!(shadow = %self.rel, version = %code_version, "Loaded a shadow scheduler.");
            self.loaded = Some((code_version.to_string(), loaded));
        }
        let (_, loaded) = self.loaded.as_mut().expect("loaded above");
        let result = match loaded {
            Loaded::Lua(sandbox) => {
                let result = sandbox.run(input);
                self.memory.store(sandbox.memory_in_use(), Ordering::SeqCst);
                result
            }
            Loaded::Wasm(module) => {
                let run =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| module.run(input)));
                run.unwrap_or_else(|_| {
                    Err(SchedulerError {
                        kind: SchedulerFailure::Internal,
                        message: "the wasm runtime panicked running the shadow scheduler".into(),
                        log: String::new(),
                    })
                })
                .map_err(|e| renamed(e, &self.rel))
            }
        };
        // A Lua run stopped by its limits may have left the state half-built, and a panic
        // the module: the next run loads the code afresh, as the real scheduler's does.
        if let Err(e) = &result
            && matches!(
                e.kind,
                SchedulerFailure::Timeout | SchedulerFailure::Memory | SchedulerFailure::Internal
            )
        {
            self.loaded = None;
        }
        result
    }

    fn after_run(&mut self) {
        if let Some((_, Loaded::Lua(sandbox))) = &self.loaded {
            sandbox.after_run();
        }
    }
}

/// The wasm result check names `scheduler/v1/scheduler.wasm`; a shadow's errors name its own.
fn renamed(mut error: SchedulerError, rel: &str) -> SchedulerError {
    let real = format!("{}/{SCHEDULER_WASM}", crate::inputs::SCHEDULER_DIR);
    if let Some(rest) = error.message.strip_prefix(&real) {
        error.message = format!("{rel}/{SCHEDULER_WASM}{rest}");
    }
    error
}
