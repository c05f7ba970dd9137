//! One WebAssembly module in the wasmi interpreter, called with verwalter 0.13's JSON protocol.
//!
//! The protocol (reference §3.7): the module exports `memory`, `alloc(len) -> ptr` and
//! `dealloc(ptr)`; a call serializes its argument to JSON, copies it into memory got from
//! `alloc`, calls the entry point with `(ptr, len)`, frees the argument, reads the **first JSON
//! value** at the returned pointer (no length: it ends where the value ends) and frees that too.
//! The only imports are `env.log_panic` and the libm shims LLVM emits calls to.
//!
//! Limits: the memory cap is a `StoreLimits` on the store (`memory.grow` past it traps); the
//! time budget is metered with fuel given out in slices: after each slice the wall clock is
//! checked, so a runaway loop stops within one slice of the budget, and a fast module pays
//! nothing but the fuel counter. Any failed call drops the instance; the next call starts from a
//! fresh one (0.13 did the same after a trap).

use std::time::{Duration, Instant};

use serde_json::Value;
use verwalter_controllers::ports::SchedulerFailure;
use wasmi::{
    Caller, CompilationMode, Config, Engine, Extern, Instance, Linker, Memory, Module, Store,
    StoreLimits, StoreLimitsBuilder, TrapCode, TypedFunc, TypedResumableCall,
};

/// Fuel handed out per slice; the clock is read between slices. A release build runs some
/// hundreds of millions of instructions a second, so a slice is a few ms (a debug build's
/// interpreter is much slower, a slice still well under a second).
pub const FUEL_SLICE: u64 = 1_000_000;

/// The imports a module may have, all from module `env`.
pub const IMPORTS: [&str; 9] = [
    "log_panic",
    "pow",
    "fmod",
    "exp2",
    "exp2f",
    "ldexp",
    "ldexpf",
    "log10",
    "log10f",
];

/// What a module may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WasmLimits {
    /// The most linear memory the module may have, in bytes.
    pub memory: usize,
    /// Wall-clock time one call may take (instantiation included).
    pub time: Duration,
}

impl From<crate::lua::Limits> for WasmLimits {
    fn from(limits: crate::lua::Limits) -> WasmLimits {
        WasmLimits {
            memory: limits.memory,
            time: limits.time,
        }
    }
}

/// Why a call failed, with the failure kind the scheduler port reports.
#[derive(Debug, Clone, PartialEq)]
pub struct CallError {
    pub kind: SchedulerFailure,
    pub message: String,
}

impl CallError {
    fn new(kind: SchedulerFailure, message: impl Into<String>) -> CallError {
        CallError {
            kind,
            message: message.into(),
        }
    }
}

/// What the host functions keep between calls.
struct Host {
    limits: StoreLimits,
    /// The first `log_panic` message of this call.
    panic: Option<String>,
}

/// A compiled module, ready to be instantiated.
pub struct WasmModule {
    /// How messages name the module (`scheduler/v1/scheduler.wasm`).
    name: String,
    engine: Engine,
    module: Module,
    linker: Linker<Host>,
    limits: WasmLimits,
    /// The entry points the module must export besides `alloc` and `dealloc`.
    entries: Vec<&'static str>,
    live: Option<Live>,
}

/// An instance with its store.
struct Live {
    store: Store<Host>,
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    dealloc: TypedFunc<i32, ()>,
    entries: Vec<(&'static str, EntryFunc)>,
}

/// An entry point: `(ptr, len) -> result ptr`.
type EntryFunc = TypedFunc<(i32, i32), i32>;

impl std::fmt::Debug for WasmModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WasmModule({})", self.name)
    }
}

impl WasmModule {
    /// Compiles `bytes` and checks its imports and exports. `entries` are the functions called
    /// with the JSON protocol (`scheduler`; `init`, `render_roles`, `query`).
    pub fn load(
        name: &str,
        bytes: &[u8],
        entries: &[&'static str],
        limits: WasmLimits,
    ) -> Result<WasmModule, CallError> {
        let load_error = |m: String| CallError::new(SchedulerFailure::Load, format!("{name}: {m}"));
        let mut config = Config::default();
        config.consume_fuel(true);
        // Translated whole at load: lazy translation charges a function's translation to the
        // fuel of the call that first reaches it, and a function bigger than what is left of a
        // slice would fail the run as out of fuel, where no slice can be added.
        config.compilation_mode(CompilationMode::Eager);
        let engine = Engine::new(&config);
        let module = Module::new(&engine, bytes)
            .map_err(|e| load_error(format!("not a valid WebAssembly module: {e}")))?;
        for import in module.imports() {
            if import.module() != "env" || !IMPORTS.contains(&import.name()) {
                return Err(load_error(format!(
                    "imports `{}.{}`, which verwalter does not provide (a module may import only env.{})",
                    import.module(),
                    import.name(),
                    IMPORTS.join(", env.")
                )));
            }
        }
        let mut required = vec!["memory", "alloc", "dealloc"];
        required.extend_from_slice(entries);
        let exports: Vec<&str> = module.exports().map(|e| e.name()).collect();
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|r| !exports.contains(r))
            .collect();
        if !missing.is_empty() {
            return Err(load_error(format!(
                "does not export {} (a module must export {})",
                quote_list(&missing),
                quote_list(&required)
            )));
        }
        let linker = linker(&engine).map_err(|e| load_error(e.to_string()))?;
        Ok(WasmModule {
            name: name.to_string(),
            engine,
            module,
            linker,
            limits,
            entries: entries.to_vec(),
            live: None,
        })
    }

    /// Calls `entry` with `input` as JSON and returns the first JSON value it wrote. A module
    /// whose last call failed is instantiated anew first.
    pub fn call(&mut self, entry: &str, input: &[u8]) -> Result<Value, CallError> {
        let deadline = Instant::now() + self.limits.time;
        let result = self.call_by(entry, input, deadline);
        if result.is_err() {
            // A trap or a stop may have left the instance half-updated.
            self.live = None;
        }
        result
    }

    /// Serializes `input` and calls `entry` with it.
    pub fn call_json<T: serde::Serialize>(
        &mut self,
        entry: &str,
        input: &T,
    ) -> Result<Value, CallError> {
        let bytes = serde_json::to_vec(input).map_err(|e| {
            CallError::new(
                SchedulerFailure::Internal,
                format!("cannot serialize the input of {entry}: {e}"),
            )
        })?;
        self.call(entry, &bytes)
    }

    fn call_by(
        &mut self,
        entry: &str,
        input: &[u8],
        deadline: Instant,
    ) -> Result<Value, CallError> {
        if self.live.is_none() {
            self.live = Some(self.instantiate(deadline)?);
        }
        let name = self.name.clone();
        let time = self.limits.time;
        let live = self.live.as_mut().expect("instantiated above");
        live.store.data_mut().panic = None;
        let func = live
            .entries
            .iter()
            .find(|(n, _)| *n == entry)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                CallError::new(
                    SchedulerFailure::Internal,
                    format!("{name}: {entry} is not an entry point"),
                )
            })?;
        let len = i32::try_from(input.len()).map_err(|_| {
            CallError::new(
                SchedulerFailure::Internal,
                format!("{name}: the input of {entry} is larger than 2 GiB"),
            )
        })?;
        let at = |what: &str, e: CallError| CallError {
            kind: e.kind,
            message: format!("{name}: {what}: {}", e.message),
        };
        let ptr = metered(&mut live.store, deadline, time, |s| {
            live.alloc.call_resumable(s, len)
        })
        .map_err(|e| at(&format!("alloc({len}) failed"), e))?;
        let start = usize::try_from(ptr as u32).unwrap_or(usize::MAX);
        live.memory
            .write(&mut live.store, start, input)
            .map_err(|_| {
                CallError::new(
                    SchedulerFailure::BadOutput,
                    format!("{name}: alloc({len}) returned {ptr}, outside the module's memory"),
                )
            })?;
        let result = metered(&mut live.store, deadline, time, |s| {
            func.call_resumable(s, (ptr, len))
        })
        .map_err(|e| at(&format!("{entry} failed"), e))?;
        metered(&mut live.store, deadline, time, |s| {
            live.dealloc.call_resumable(s, ptr)
        })
        .map_err(|e| at("dealloc of the input failed", e))?;
        let value = {
            let memory = live.memory.data(&live.store);
            let start = result as u32 as usize;
            let tail = memory.get(start..).ok_or_else(|| {
                CallError::new(
                    SchedulerFailure::BadOutput,
                    format!("{name}: {entry} returned {result}, outside the module's memory"),
                )
            })?;
            first_json_value(tail).map_err(|e| {
                CallError::new(
                    SchedulerFailure::BadOutput,
                    format!("{name}: {entry} did not return JSON at {result}: {e}"),
                )
            })?
        };
        metered(&mut live.store, deadline, time, |s| {
            live.dealloc.call_resumable(s, result)
        })
        .map_err(|e| at("dealloc of the result failed", e))?;
        Ok(value)
    }

    fn instantiate(&self, deadline: Instant) -> Result<Live, CallError> {
        let name = &self.name;
        let host = Host {
            limits: StoreLimitsBuilder::new()
                .memory_size(self.limits.memory)
                .trap_on_grow_failure(true)
                .build(),
            panic: None,
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|host| &mut host.limits);
        // A start function is metered like a call.
        store
            .set_fuel(FUEL_SLICE.saturating_mul(64))
            .map_err(|e| CallError::new(SchedulerFailure::Internal, e.to_string()))?;
        let instance = self
            .linker
            .instantiate_and_start(&mut store, &self.module)
            .map_err(|e| {
                let (kind, text) = classify(&e, &store, self.limits.time);
                let kind = match kind {
                    SchedulerFailure::Memory => SchedulerFailure::Memory,
                    SchedulerFailure::Timeout => SchedulerFailure::Timeout,
                    _ => SchedulerFailure::Load,
                };
                let text = if kind == SchedulerFailure::Memory {
                    format!(
                        "{text} (its initial memory is over the limit of {} MiB)",
                        self.limits.memory >> 20
                    )
                } else {
                    text
                };
                CallError::new(kind, format!("{name}: cannot instantiate: {text}"))
            })?;
        if Instant::now() > deadline {
            return Err(CallError::new(
                SchedulerFailure::Timeout,
                format!("{name}: instantiation took longer than the time budget"),
            ));
        }
        let bad_export = |what: &str, want: &str| {
            CallError::new(
                SchedulerFailure::Load,
                format!("{name}: export `{what}` must be {want}"),
            )
        };
        let memory = instance
            .get_memory(&store, "memory")
            .ok_or_else(|| bad_export("memory", "a memory"))?;
        let alloc = typed::<i32, i32>(&instance, &store, "alloc")
            .ok_or_else(|| bad_export("alloc", "a function (i32) -> i32"))?;
        let dealloc = typed::<i32, ()>(&instance, &store, "dealloc")
            .ok_or_else(|| bad_export("dealloc", "a function (i32)"))?;
        let mut entries = Vec::new();
        for entry in &self.entries {
            let func: EntryFunc = typed(&instance, &store, entry)
                .ok_or_else(|| bad_export(entry, "a function (i32, i32) -> i32"))?;
            entries.push((*entry, func));
        }
        Ok(Live {
            store,
            memory,
            alloc,
            dealloc,
            entries,
        })
    }
}

fn typed<P: wasmi::WasmParams, R: wasmi::WasmResults>(
    instance: &Instance,
    store: &Store<Host>,
    name: &str,
) -> Option<TypedFunc<P, R>> {
    instance.get_typed_func::<P, R>(store, name).ok()
}

fn quote_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs a resumable call in fuel slices until it finishes, fails or passes `deadline`.
fn metered<R>(
    store: &mut Store<Host>,
    deadline: Instant,
    budget: Duration,
    start: impl FnOnce(&mut Store<Host>) -> Result<TypedResumableCall<R>, wasmi::Error>,
) -> Result<R, CallError>
where
    R: wasmi::WasmResults,
{
    let refuel = |store: &mut Store<Host>| {
        store
            .set_fuel(FUEL_SLICE)
            .map_err(|e| CallError::new(SchedulerFailure::Internal, e.to_string()))
    };
    refuel(store)?;
    let mut call = start(store).map_err(|e| error_of(&e, store, budget))?;
    loop {
        match call {
            TypedResumableCall::Finished(result) => return Ok(result),
            TypedResumableCall::OutOfFuel(paused) => {
                if Instant::now() >= deadline {
                    return Err(CallError::new(
                        SchedulerFailure::Timeout,
                        format!("exceeded its time budget of {budget:?} (stopped)"),
                    ));
                }
                refuel(store)?;
                call = paused
                    .resume(&mut *store)
                    .map_err(|e| error_of(&e, store, budget))?;
            }
            TypedResumableCall::HostTrap(trap) => {
                return Err(CallError::new(
                    SchedulerFailure::Runtime,
                    format!("a host function failed: {}", trap.host_error()),
                ));
            }
        }
    }
}

fn error_of(error: &wasmi::Error, store: &Store<Host>, budget: Duration) -> CallError {
    let (kind, message) = classify(error, store, budget);
    CallError::new(kind, message)
}

/// The failure kind and message of a wasmi error, with the module's panic message when it
/// reported one before trapping.
fn classify(
    error: &wasmi::Error,
    store: &Store<Host>,
    budget: Duration,
) -> (SchedulerFailure, String) {
    let panic = store.data().panic.clone();
    match error.as_trap_code() {
        Some(TrapCode::OutOfFuel) => (
            SchedulerFailure::Timeout,
            format!("exceeded its time budget of {budget:?} (stopped)"),
        ),
        Some(TrapCode::GrowthOperationLimited) => (
            SchedulerFailure::Memory,
            "tried to grow its memory past the limit".to_string(),
        ),
        Some(code) => {
            let text = match panic {
                Some(p) => format!("panicked at {p} (then trapped: {code})"),
                None => format!("trapped: {code}"),
            };
            (SchedulerFailure::Runtime, text)
        }
        None => {
            let text = error.to_string();
            use wasmi::errors::{ErrorKind, InstantiationError, MemoryError};
            let denied = |e: &MemoryError| {
                matches!(
                    e,
                    MemoryError::ResourceLimiterDeniedAllocation | MemoryError::OutOfBoundsGrowth
                )
            };
            let memory = match error.kind() {
                ErrorKind::Memory(e) => denied(e),
                ErrorKind::Instantiation(InstantiationError::FailedToInstantiateMemory(e)) => {
                    denied(e)
                }
                _ => false,
            };
            if memory {
                (SchedulerFailure::Memory, text)
            } else {
                (SchedulerFailure::Runtime, text)
            }
        }
    }
}

/// Reads the first JSON value of `bytes`; what follows it (the rest of the memory) is ignored,
/// as 0.13's streaming parser did.
pub fn first_json_value(bytes: &[u8]) -> Result<Value, String> {
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    match values.next() {
        Some(Ok(value)) => Ok(value),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("nothing but white space".into()),
    }
}

/// The `env` functions: `log_panic` and the libm shims.
fn linker(engine: &Engine) -> Result<Linker<Host>, wasmi::Error> {
    let mut linker = Linker::<Host>::new(engine);
    linker.func_wrap(
        "env",
        "log_panic",
        |mut caller: Caller<'_, Host>,
         payload_ptr: i32,
         payload_len: i32,
         file_ptr: i32,
         file_len: i32,
         line: i32| {
            // Only the two strings are read (at most 4 KiB each), and only the first report of a
            // call is kept and logged: a module calling this in a loop costs little.
            if caller.data().panic.is_some() {
                return;
            }
            let message = {
                let memory = caller.get_export("memory").and_then(Extern::into_memory);
                let bytes = memory.as_ref().map_or(&[][..], |m| m.data(&caller));
                let text = |ptr: i32, len: i32| {
                    let start = (ptr as u32 as usize).min(bytes.len());
                    let end = start
                        .saturating_add((len as u32 as usize).min(4096))
                        .min(bytes.len());
                    String::from_utf8_lossy(&bytes[start..end]).into_owned()
                };
                format!(
                    "{}:{}: {}",
                    text(file_ptr, file_len),
                    line,
                    text(payload_ptr, payload_len)
                )
            };
            tracing::warn!("Scheduler panicked at {message}");
            caller.data_mut().panic = Some(message);
        },
    )?;
    linker.func_wrap("env", "pow", |a: f64, b: f64| a.powf(b))?;
    linker.func_wrap("env", "fmod", |a: f64, b: f64| a % b)?;
    linker.func_wrap("env", "exp2", |a: f64| a.exp2())?;
    linker.func_wrap("env", "exp2f", |a: f32| a.exp2())?;
    linker.func_wrap("env", "ldexp", ldexp)?;
    linker.func_wrap("env", "ldexpf", |a: f32, e: i32| {
        ldexp(f64::from(a), e.clamp(-400, 400)) as f32
    })?;
    linker.func_wrap("env", "log10", |a: f64| a.log10())?;
    linker.func_wrap("env", "log10f", |a: f32| a.log10())?;
    Ok(linker)
}

/// `x * 2^e` without overflowing the power on the way (`ldexp(1e-300, 1100)` is finite).
pub(crate) fn ldexp(mut x: f64, mut e: i32) -> f64 {
    let step = 2f64.powi(1000);
    while e > 1000 && x.is_finite() && x != 0.0 {
        x *= step;
        e -= 1000;
    }
    while e < -1000 && x.is_finite() && x != 0.0 {
        x /= step;
        e += 1000;
    }
    x * 2f64.powi(e.clamp(-1100, 1100))
}
