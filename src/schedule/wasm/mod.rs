//! WebAssembly schedulers (`scheduler/v1/scheduler.wasm`), as verwalter 0.13 ran them, in the
//! wasmi interpreter ([`runtime`]), behind the controllers' [`Scheduler`] port.
//!
//! [`WasmScheduler`] keeps the module on its own thread (`wasm-scheduler`), so a run never
//! blocks the async runtime; it reloads the module when the content hash of `scheduler/v1`
//! changes and instantiates it anew after a failed call. [`ConfigDirScheduler`] is what the
//! daemon runs: the wasm module when `scheduler.wasm` exists, else the Lua scheduler.

pub mod query;
pub mod runtime;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::oneshot;
use verwalter_controllers::machinery::ports::{Scheduler, SchedulerError};
use verwalter_controllers::machinery::watchdog::{
    self as progress, DriverBeat, PassMark, Progress,
};
use verwalter_controllers::state::SchedulerFailure;
use verwalter_controllers::state::{SchedulerInput, SchedulerOutput};

use crate::inputs::SCHEDULER_DIR;
use crate::schedule::lua::LuaScheduler;
pub use runtime::{CallError, WasmLimits, WasmModule};

/// The scheduler module's file name inside `scheduler/v1`.
pub const SCHEDULER_WASM: &str = "scheduler.wasm";
/// The role-derivation module's file name inside `scheduler/v1`.
pub const QUERY_WASM: &str = "query.wasm";
/// The largest module read (the scheduler's memory cap bounds what it can do anyway).
pub const MAX_MODULE_BYTES: u64 = 64 << 20;

/// Whether the config dir's scheduler is a wasm module (it then takes the place of `main.lua`).
pub fn has_wasm_scheduler(config_dir: &Path) -> bool {
    config_dir
        .join(SCHEDULER_DIR)
        .join(SCHEDULER_WASM)
        .is_file()
}

/// Reads a module file, at most [`MAX_MODULE_BYTES`].
pub fn read_module(path: &Path) -> std::io::Result<Vec<u8>> {
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
pub fn output_of(result: Value) -> Result<SchedulerOutput, SchedulerError> {
    let bad = |m: String| {
        error(
            SchedulerFailure::BadOutput,
            format!("{SCHEDULER_DIR}/{SCHEDULER_WASM}: {m}"),
        )
    };
    let Value::Object(mut result) = result else {
        return Err(bad(format!(
            "scheduler returned {}, not an object {{\"schedule\": {{..}}, \"log\": \"..\", \"actions\": {{..}}}}",
            kind_of(&result)
        )));
    };
    let log = match result.remove("log") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(log)) => log,
        Some(other) => {
            return Err(bad(format!(
                "the result's `log` is {}, not a string",
                kind_of(&other)
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
                kind_of(&other)
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
                kind_of(&other)
            ))));
        }
    }
    Ok(SchedulerOutput {
        data: Value::Object(data),
        log,
    })
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

type Reply = oneshot::Sender<Result<SchedulerOutput, SchedulerError>>;

struct Job {
    code_version: String,
    input: Arc<SchedulerInput>,
    reply: Reply,
    /// The run in the watchdog's records, until the thread is done with it.
    mark: Option<PassMark>,
}

/// The scheduler port backed by a wasm module on its own thread.
pub struct WasmScheduler {
    jobs: Mutex<mpsc::Sender<Job>>,
    limits: WasmLimits,
    /// How long past the budget a run may take before the port gives up on it.
    grace: Duration,
    /// Where each run is recorded for the watchdog.
    beat: Option<DriverBeat>,
}

/// Runs on the thread before each run; tests use it to hold the thread the way a host call the
/// fuel slices cannot stop would.
type BeforeRun = Arc<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for WasmScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WasmScheduler")
    }
}

impl WasmScheduler {
    /// Starts the module's thread for the config dir `config_dir`.
    pub fn start(config_dir: PathBuf, limits: WasmLimits) -> std::io::Result<WasmScheduler> {
        Self::start_with(config_dir, limits, WASM_GRACE, None)
    }

    fn start_with(
        config_dir: PathBuf,
        limits: WasmLimits,
        grace: Duration,
        before_run: Option<BeforeRun>,
    ) -> std::io::Result<WasmScheduler> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("wasm-scheduler".into())
            .spawn(move || worker(config_dir, limits, rx, before_run))?;
        Ok(WasmScheduler {
            jobs: Mutex::new(jobs),
            limits,
            grace,
            beat: None,
        })
    }

    /// Records every run in `progress` until the thread is done with it, as the Lua
    /// scheduler's are: a run held past its budget, grace and [`progress::MARGIN`] (a host call
    /// or a copy the fuel slices do not cover) is then a stall of the watchdog, and systemd
    /// restarts the daemon.
    pub fn watched(mut self, progress: &Progress) -> WasmScheduler {
        let limit = self.limits.time + self.grace + progress::MARGIN;
        self.beat = Some(progress.worker("wasm scheduler thread", limit));
        self
    }
}

fn worker(
    config_dir: PathBuf,
    limits: WasmLimits,
    jobs: mpsc::Receiver<Job>,
    before_run: Option<BeforeRun>,
) {
    let mut loaded: Option<(String, WasmRun)> = None;
    while let Ok(job) = jobs.recv() {
        if let Some(hook) = &before_run {
            hook();
        }
        // A panic in the runtime (a bug of the interpreter, not of the module) fails this run
        // and drops the module; the thread goes on serving runs.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_job(
                &config_dir,
                limits,
                &mut loaded,
                &job.code_version,
                &job.input,
            )
        }));
        let result = run.unwrap_or_else(|_| {
            loaded = None;
            Err(error(
                SchedulerFailure::Internal,
                "the wasm runtime panicked running the scheduler (see the daemon's log)".into(),
            ))
        });
        // The run is over before its result is out: whoever gets the result finds no record
        // of it left.
        drop(job.mark);
        let _ = job.reply.send(result);
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

/// How long past the budget the port waits for the thread before it reports the run lost: the
/// Lua scheduler's grace, which the daemon's step limit for a scheduler run counts on. The fuel
/// slices stop the module within a slice of its budget; compiling the module and the JSON
/// copies are what can add to it.
pub const WASM_GRACE: Duration = crate::schedule::lua::WATCHDOG_GRACE;

impl Scheduler for WasmScheduler {
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
            mark: self
                .beat
                .as_ref()
                .map(|beat| beat.pass("run".into(), tokio::time::Instant::now())),
        };
        let sent = self.jobs.lock().expect("wasm scheduler lock").send(job);
        let wait = self.limits.time + self.grace;
        Box::pin(async move {
            if sent.is_err() {
                return Err(error(
                    SchedulerFailure::Internal,
                    "the wasm scheduler thread is gone".into(),
                ));
            }
            match tokio::time::timeout(wait, result).await {
                Ok(reply) => reply.unwrap_or_else(|_| {
                    Err(error(
                        SchedulerFailure::Internal,
                        "the wasm scheduler thread dropped the run".into(),
                    ))
                }),
                Err(_) => Err(error(
                    SchedulerFailure::Timeout,
                    format!("the wasm scheduler did not return within {wait:?}"),
                )),
            }
        })
    }
}

/// The daemon's scheduler: `scheduler/v1/scheduler.wasm` when it exists, else `main.lua`. The
/// choice is made per run, so replacing one by the other takes effect like any code change.
pub struct ConfigDirScheduler {
    config_dir: PathBuf,
    lua: LuaScheduler,
    wasm: WasmScheduler,
}

impl std::fmt::Debug for ConfigDirScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigDirScheduler")
    }
}

impl ConfigDirScheduler {
    pub fn new(config_dir: PathBuf, lua: LuaScheduler, wasm: WasmScheduler) -> ConfigDirScheduler {
        ConfigDirScheduler {
            config_dir,
            lua,
            wasm,
        }
    }
}

impl Scheduler for ConfigDirScheduler {
    fn run(
        &self,
        code_version: &str,
        input: Arc<SchedulerInput>,
    ) -> BoxFuture<'static, Result<SchedulerOutput, SchedulerError>> {
        if has_wasm_scheduler(&self.config_dir) {
            self.wasm.run(code_version, input)
        } else {
            self.lua.run(code_version, input)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod query_example_tests;
