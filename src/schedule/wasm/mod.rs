//! WebAssembly schedulers (`scheduler/v1/scheduler.wasm`), as verwalter 0.13 ran them, in the
//! wasmi interpreter ([`runtime`]), behind the controllers' [`Scheduler`] port.
//!
//! [`WasmScheduler`] keeps the module on its own thread (`wasm-scheduler`, a
//! [`SchedulerThread`]), so a run never blocks the async runtime; it reloads the module when the
//! content hash of `scheduler/v1` changes and instantiates it anew after a failed call. The
//! daemon runs it through [`crate::schedule::ConfigDirScheduler`].

pub mod query;
pub(crate) mod runtime;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use verwalter_controllers::machinery::ports::{Scheduler, SchedulerError};
use verwalter_controllers::machinery::watchdog::Progress;
use verwalter_controllers::state::{SchedulerFailure, SchedulerInput, SchedulerOutput, json_kind};

use crate::inputs::SCHEDULER_DIR;
use crate::schedule::thread::{BeforeRun, Engine, GRACE, Names, SchedulerThread};
pub use runtime::{CallError, WasmLimits, WasmModule};

/// The scheduler module's file name inside `scheduler/v1`.
pub(crate) const SCHEDULER_WASM: &str = "scheduler.wasm";
/// The role-derivation module's file name inside `scheduler/v1`.
pub(crate) const QUERY_WASM: &str = "query.wasm";
/// The largest module read (the scheduler's memory cap bounds what it can do anyway).
pub(crate) const MAX_MODULE_BYTES: u64 = 64 << 20;

/// Whether the config dir's scheduler is a wasm module (it then takes the place of `main.lua`).
pub fn has_wasm_scheduler(config_dir: &Path) -> bool {
    config_dir
        .join(SCHEDULER_DIR)
        .join(SCHEDULER_WASM)
        .is_file()
}

/// Reads a module file, at most [`MAX_MODULE_BYTES`].
pub(crate) fn read_module(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_MODULE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_MODULE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_MODULE_BYTES >> 20
        )));
    }
    Ok(bytes)
}

fn error(kind: SchedulerFailure, message: String) -> SchedulerError {
    SchedulerError {
        kind,
        message,
        log: String::new(),
    }
}

/// A loaded scheduler module, called on the thread that owns it.
pub struct WasmRun {
    module: WasmModule,
}

impl std::fmt::Debug for WasmRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WasmRun")
    }
}

impl WasmRun {
    /// Loads `scheduler/v1/scheduler.wasm` of `config_dir`.
    pub fn load(config_dir: &Path, limits: WasmLimits) -> Result<WasmRun, SchedulerError> {
        let display = format!("{SCHEDULER_DIR}/{SCHEDULER_WASM}");
        let path = config_dir.join(SCHEDULER_DIR).join(SCHEDULER_WASM);
        let bytes = read_module(&path).map_err(|e| {
            error(
                SchedulerFailure::Load,
                format!("{display}: cannot read: {e}"),
            )
        })?;
        Self::from_bytes(&display, &bytes, limits)
    }

    /// Compiles a scheduler module; `name` is how messages call it.
    pub fn from_bytes(
        name: &str,
        bytes: &[u8],
        limits: WasmLimits,
    ) -> Result<WasmRun, SchedulerError> {
        let module = WasmModule::load(name, bytes, &["scheduler"], limits)
            .map_err(|e| error(e.kind, e.message))?;
        Ok(WasmRun { module })
    }

    /// Runs the scheduler once on `input`.
    pub fn run(&mut self, input: &SchedulerInput) -> Result<SchedulerOutput, SchedulerError> {
        let result = self
            .module
            .call_json("scheduler", input)
            .map_err(|e| error(e.kind, e.message))?;
        output_of(result)
    }
}

/// Turns 0.13's wasm result `{"schedule": {..}, "log": "..", "actions": {"<id>": ..}}` into the
/// port's output. The `actions` answers (what `/v1/wait_action` returns) go into the schedule's
/// `actions`, where the Lua schedulers put theirs, unless the schedule has that key already.
pub(crate) fn output_of(result: Value) -> Result<SchedulerOutput, SchedulerError> {
    let bad = |m: String| {
        error(
            SchedulerFailure::BadOutput,
            format!("{SCHEDULER_DIR}/{SCHEDULER_WASM}: {m}"),
        )
    };
    let Value::Object(mut result) = result else {
        return Err(bad(format!(
            "scheduler returned {}, not an object {{\"schedule\": {{..}}, \"log\": \"..\", \"actions\": {{..}}}}",
            json_kind(&result)
        )));
    };
    let log = match result.remove("log") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(log)) => log,
        Some(other) => {
            return Err(bad(format!(
                "the result's `log` is {}, not a string",
                json_kind(&other)
            )));
        }
    };
    let with_log = |mut e: SchedulerError| {
        e.log = log.clone();
        e
    };
    let mut data = match result.remove("schedule") {
        Some(Value::Object(data)) => data,
        Some(other) => {
            return Err(with_log(bad(format!(
                "the result's `schedule` is {}, not an object",
                json_kind(&other)
            ))));
        }
        None => {
            return Err(with_log(bad(
                "the result has no `schedule` (0.13's wasm schedulers return {\"schedule\", \"log\", \"actions\"})".into(),
            )));
        }
    };
    match result.remove("actions") {
        None | Some(Value::Null) => {}
        Some(Value::Object(answers)) => {
            if !answers.is_empty() && !data.contains_key("actions") {
                data.insert("actions".into(), Value::Object(answers));
            }
        }
        Some(other) => {
            return Err(with_log(bad(format!(
                "the result's `actions` is {}, not an object of answers by action id",
                json_kind(&other)
            ))));
        }
    }
    Ok(SchedulerOutput {
        data: verwalter_controllers::state::ScheduleData::from_value(Value::Object(data)),
        log,
    })
}

/// The scheduler port backed by a wasm module on its own thread.
pub(crate) struct WasmScheduler {
    thread: SchedulerThread,
}

const NAMES: Names = Names {
    thread: "wasm-scheduler",
    noun: "wasm scheduler",
    subject: "the wasm scheduler",
    watched: "wasm scheduler thread",
};

impl std::fmt::Debug for WasmScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WasmScheduler")
    }
}

impl WasmScheduler {
    /// Starts the module's thread for the config dir `config_dir`.
    pub(crate) fn start(config_dir: PathBuf, limits: WasmLimits) -> std::io::Result<WasmScheduler> {
        Self::start_with(config_dir, limits, GRACE, None)
    }

    fn start_with(
        config_dir: PathBuf,
        limits: WasmLimits,
        grace: Duration,
        before_run: Option<BeforeRun>,
    ) -> std::io::Result<WasmScheduler> {
        let engine = move || WasmEngine {
            config_dir,
            limits,
            loaded: None,
        };
        let thread = SchedulerThread::start(NAMES, limits.time, grace, engine, before_run)?;
        Ok(WasmScheduler { thread })
    }

    /// Records every run in `progress` until the thread is done with it, as the Lua
    /// scheduler's are: a run held past its budget, grace and the watchdog's margin (a host
    /// call or a copy the fuel slices do not cover) is then a stall of the watchdog, and
    /// systemd restarts the daemon.
    pub(crate) fn watched(self, progress: &Progress) -> WasmScheduler {
        WasmScheduler {
            thread: self.thread.watched(progress),
        }
    }
}

/// The module on the scheduler thread, with the code version it was loaded for.
struct WasmEngine {
    config_dir: PathBuf,
    limits: WasmLimits,
    loaded: Option<(String, WasmRun)>,
}

impl Engine for WasmEngine {
    fn run(
        &mut self,
        code_version: &str,
        input: &SchedulerInput,
    ) -> Result<SchedulerOutput, SchedulerError> {
        // A panic in the runtime (a bug of the interpreter, not of the module) fails this run
        // and drops the module; the thread goes on serving runs.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_job(
                &self.config_dir,
                self.limits,
                &mut self.loaded,
                code_version,
                input,
            )
        }));
        run.unwrap_or_else(|_| {
            self.loaded = None;
            Err(error(
                SchedulerFailure::Internal,
                "the wasm runtime panicked running the scheduler (see the daemon's log)".into(),
            ))
        })
    }
}

/// Loads the module if its version changed (or the last run panicked), then runs it.
fn run_job(
    config_dir: &Path,
    limits: WasmLimits,
    loaded: &mut Option<(String, WasmRun)>,
    code_version: &str,
    input: &SchedulerInput,
) -> Result<SchedulerOutput, SchedulerError> {
    if loaded
        .as_ref()
        .is_none_or(|(version, _)| version != code_version)
    {
        *loaded = None;
        let run = WasmRun::load(config_dir, limits)?;
        tracing::info!(version = %code_version, "Loaded the wasm scheduler.");
        *loaded = Some((code_version.to_string(), run));
    }
    let (_, run) = loaded.as_mut().expect("loaded above");
    run.run(input)
}

impl Scheduler for WasmScheduler {
    fn run(
        &self,
        code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        self.thread.run(code_version, input)
    }
}

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod query_example_tests;
