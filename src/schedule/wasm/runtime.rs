//! One WebAssembly module in the wasmi interpreter, called with verwalter 0.13's JSON protocol.
//!
//! The protocol (reference §3.7): the module exports `memory`, `alloc(len) -> ptr` and
//! `dealloc(ptr)`; a call serializes its argument to JSON, copies it into memory got from
//! `alloc`, calls the entry point with `(ptr, len)`, frees the argument, reads the **first JSON
//! value** at the returned pointer (no length: it ends where the value ends) and frees that too.
//! The only imports are `env.log_panic` and the libm shims LLVM emits calls to.
//!
//! Limits: the memory cap is a [`Budget`], the store's resource limiter: the linear memory and
//! every table element together stay under it (a `memory.grow` or `table.grow` past it traps, an
//! initial memory or table over it is refused), with one instance, one memory and a few tables.
//! The time budget is metered with fuel given out in slices: after each slice the wall clock is
//! checked, so a runaway loop stops within one slice of the budget, and a fast module pays
//! nothing but the fuel counter. A grow costs fuel in proportion to what it adds; a slice is
//! widened to what a grow within the memory cap needs. Any failed call drops the instance; the
//! next call starts from a fresh one (0.13 did the same after a trap).

use std::time::{Duration, Instant};

use serde_json::Value;
use verwalter_controllers::state::SchedulerFailure;
use wasmi::errors::{MemoryError, TableError};
use wasmi::{
    Caller, CompilationMode, Config, CustomFuelCosts, Engine, Extern, Instance, Linker, Memory,
    Module, ResourceLimiter, Store, TrapCode, TypedFunc, TypedResumableCall,
};
use wasmi_core::LimiterError;

/// Fuel handed out per slice; the clock is read between slices. A release build runs some
/// hundreds of millions of instructions a second, so a slice is a few ms (a debug build's
/// interpreter is much slower, a slice still well under a second).
pub(crate) const FUEL_SLICE: u64 = 1_000_000;

/// The fuel a start function gets besides what growing to the memory cap costs. It runs in one
/// piece (wasmi cannot pause it), so it has a fixed budget of instructions, not the time budget.
pub(crate) const START_FUEL: u64 = 64 * FUEL_SLICE;

/// Bytes copied, filled or grown per unit of fuel (wasmi's default): a `memory.grow` of 64 MiB
/// costs a million, about what a million instructions take.
const BYTES_PER_FUEL: u32 = 64;

/// The bytes wasmi keeps for a table element (and charges fuel for when a table grows).
const WASMI_TABLE_ELEMENT: usize = 4;

/// What one table element counts against the memory cap: wasmi keeps 4 bytes an element in a
/// vector that may reserve up to twice what it holds.
pub(crate) const TABLE_ELEMENT_BYTES: usize = 2 * WASMI_TABLE_ELEMENT;

/// How many tables a module may have (a compiled module has one; each table's elements count
/// against the memory cap besides).
pub(crate) const MAX_TABLES: usize = 8;

/// The imports a module may have, all from module `env`.
pub(crate) const IMPORTS: [&str; 9] = [
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

impl From<crate::schedule::lua::Limits> for WasmLimits {
    fn from(limits: crate::schedule::lua::Limits) -> WasmLimits {
        WasmLimits {
            memory: limits.memory,
            time: limits.time,
        }
    }
}

/// Why a call failed, with the failure kind the scheduler port reports.
#[derive(Debug, Clone, PartialEq)]
pub struct CallError {
    pub(crate) kind: SchedulerFailure,
    pub(crate) message: String,
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
    limits: Budget,
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
    /// The instructions a start function may run ([`START_FUEL`]; tests set less).
    start_fuel: u64,
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
    pub(crate) fn load(
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
        // The default costs, stated: the start function's fuel and the slices count on them.
        config.fuel_cost(CustomFuelCosts {
            bytes_copied_per_fuel: BYTES_PER_FUEL,
            fuel_per_bytes_translated: 7,
            fuel_per_bytes_validated: 2,
        });
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
            start_fuel: START_FUEL,
            live: None,
        })
    }

    /// Sets the instructions a start function may run (tests: a debug build's interpreter takes
    /// half a minute for [`START_FUEL`]).
    #[cfg(test)]
    pub(crate) fn set_start_fuel(&mut self, instructions: u64) {
        self.start_fuel = instructions;
        self.live = None;
    }

    /// Calls `entry` with `input` as JSON and returns the first JSON value it wrote. A module
    /// whose last call failed is instantiated anew first.
    pub(crate) fn call(&mut self, entry: &str, input: &[u8]) -> Result<Value, CallError> {
        let deadline = Instant::now() + self.limits.time;
        let result = self.call_by(entry, input, deadline);
        if result.is_err() {
            // A trap or a stop may have left the instance half-updated.
            self.live = None;
        }
        result
    }

    /// Serializes `input` and calls `entry` with it.
    pub(crate) fn call_json<T: serde::Serialize>(
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
            limits: Budget::new(self.limits.memory),
            panic: None,
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|host| &mut host.limits);
        // A start function cannot be paused between slices: it gets a fixed budget of
        // instructions, and the fuel to grow its memory (or tables) up to the cap.
        let start_fuel = start_fuel(self.start_fuel, self.limits.memory);
        store
            .set_fuel(start_fuel)
            .map_err(|e| CallError::new(SchedulerFailure::Internal, e.to_string()))?;
        let instance = self
            .linker
            .instantiate_and_start(&mut store, &self.module)
            .map_err(|e| {
                if e.as_trap_code() == Some(TrapCode::OutOfFuel) {
                    return CallError::new(
                        SchedulerFailure::Timeout,
                        format!(
                            "{name}: cannot instantiate: its start function ran out of its fuel \
                             budget of {start_fuel} units ({} instructions and the growing of \
                             its memory to the limit; a start function runs in one piece, so \
                             this budget stands for the time budget)",
                            self.start_fuel
                        ),
                    );
                }
                let (kind, text) = classify(&e, &store, self.limits.time);
                let kind = match kind {
                    SchedulerFailure::Memory => SchedulerFailure::Memory,
                    _ => SchedulerFailure::Load,
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
    // A slice is widened to what the paused instruction needs: a `memory.grow` or `table.grow`
    // the budget allowed costs fuel in proportion to what it adds (at most the cap's fuel).
    let refuel = |store: &mut Store<Host>, required: u64| {
        store
            .set_fuel(FUEL_SLICE.max(required))
            .map_err(|e| CallError::new(SchedulerFailure::Internal, e.to_string()))
    };
    refuel(store, 0)?;
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
                refuel(store, paused.required_fuel())?;
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
            store
                .data()
                .limits
                .refused
                .clone()
                .unwrap_or_else(|| "tried to grow its memory past the limit".to_string()),
        ),
        Some(code) => {
            let text = match panic {
                Some(p) => format!("panicked at {p} (then trapped: {code})"),
                None => format!("trapped: {code}"),
            };
            (SchedulerFailure::Runtime, text)
        }
        None => {
            use wasmi::errors::{ErrorKind, InstantiationError};
            let refused = store.data().limits.refused.clone();
            let over = |what: &str| {
                let text = refused
                    .clone()
                    .unwrap_or_else(|| format!("{what} is over the limit ({error})"));
                (SchedulerFailure::Memory, text)
            };
            match error.kind() {
                ErrorKind::Memory(_)
                | ErrorKind::Instantiation(InstantiationError::FailedToInstantiateMemory(_)) => {
                    over("its memory")
                }
                ErrorKind::Table(_)
                | ErrorKind::Instantiation(InstantiationError::FailedToInstantiateTable(_)) => {
                    over("a table")
                }
                ErrorKind::Instantiation(InstantiationError::TooManyTables) => (
                    SchedulerFailure::Memory,
                    format!("has more tables than the {MAX_TABLES} a module may have"),
                ),
                ErrorKind::Instantiation(InstantiationError::TooManyMemories) => (
                    SchedulerFailure::Memory,
                    "has more than the one memory a module may have".to_string(),
                ),
                ErrorKind::Instantiation(InstantiationError::TooManyInstances) => (
                    SchedulerFailure::Memory,
                    "instantiates more than one instance".to_string(),
                ),
                _ => (SchedulerFailure::Runtime, error.to_string()),
            }
        }
    }
}

/// The fuel a start function gets: `instructions` and what growing to `memory` bytes costs.
fn start_fuel(instructions: u64, memory: usize) -> u64 {
    instructions.saturating_add(memory as u64 / u64::from(BYTES_PER_FUEL))
}

/// Which resource a growth is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Memory,
    Tables,
}

/// The module's memory cap as wasmi's resource limiter: its linear memory and its tables'
/// elements ([`TABLE_ELEMENT_BYTES`] each) together stay within `limit` bytes. wasmi asks before
/// it creates a memory or table (at instantiation) and before each `memory.grow` and
/// `table.grow`; a refusal traps (or fails the instantiation) with [`Budget::refused`] saying
/// what was asked. A growth the module's own maximum forbids, or the system cannot give,
/// returns -1 to the module as the spec says.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    limit: usize,
    /// Bytes of linear memory held.
    memory: usize,
    /// Bytes counted for table elements held.
    tables: usize,
    /// The growth allowed last: undone when wasmi fails it after asking (out of fuel: the
    /// instruction runs again after a refuel and asks again).
    pending: Option<(Resource, usize)>,
    /// What the last refusal was, for the error.
    pub(crate) refused: Option<String>,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Budget {
        Budget {
            limit,
            memory: 0,
            tables: 0,
            pending: None,
            refused: None,
        }
    }

    /// Decides a growth of `resource` by `added` bytes; `Err` (a trap) when it would take the
    /// memory and tables past the limit.
    fn grow(
        &mut self,
        resource: Resource,
        added: usize,
        describe: impl FnOnce(&Budget, usize) -> String,
    ) -> Result<bool, LimiterError> {
        self.pending = None;
        let total = self
            .memory
            .saturating_add(self.tables)
            .saturating_add(added);
        if total > self.limit {
            self.refused = Some(describe(self, total));
            return Err(LimiterError::ResourceLimiterDeniedAllocation);
        }
        match resource {
            Resource::Memory => self.memory += added,
            Resource::Tables => self.tables += added,
        }
        self.pending = Some((resource, added));
        Ok(true)
    }

    /// Undoes the growth allowed last: wasmi failed it.
    fn undo(&mut self, resource: Resource) {
        if let Some((pending, added)) = self.pending.take()
            && pending == resource
        {
            match resource {
                Resource::Memory => self.memory -= added,
                Resource::Tables => self.tables -= added,
            }
        }
    }

    fn limit_text(&self) -> String {
        format!("the limit of {} (memory-limit-mib)", bytes_text(self.limit))
    }

    /// A growth to `desired` past the memory's or table's own `maximum`: refused (not a trap),
    /// with nothing left pending.
    fn past_maximum(&mut self, desired: usize, maximum: Option<usize>) -> bool {
        let past = maximum.is_some_and(|max| desired > max);
        if past {
            self.pending = None;
        }
        past
    }
}

impl ResourceLimiter for Budget {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> Result<bool, LimiterError> {
        if self.past_maximum(desired, maximum) {
            return Ok(false);
        }
        self.grow(
            Resource::Memory,
            desired.saturating_sub(current),
            |budget, _| {
                format!(
                    "tried to grow its memory past {}: to {} with {} of table elements",
                    budget.limit_text(),
                    bytes_text(desired),
                    bytes_text(budget.tables)
                )
            },
        )
    }

    fn memory_grow_failed(&mut self, _error: &MemoryError) -> Result<(), LimiterError> {
        self.undo(Resource::Memory);
        Ok(())
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> Result<bool, LimiterError> {
        if self.past_maximum(desired, maximum) {
            return Ok(false);
        }
        let added = desired
            .saturating_sub(current)
            .saturating_mul(TABLE_ELEMENT_BYTES);
        self.grow(Resource::Tables, added, |budget, total| {
            format!(
                "tried to grow a table past {}: to {desired} elements ({TABLE_ELEMENT_BYTES} bytes \
                 each), {} with its memory and other tables",
                budget.limit_text(),
                bytes_text(total)
            )
        })
    }

    fn table_grow_failed(&mut self, error: &TableError) -> Result<(), LimiterError> {
        self.undo(Resource::Tables);
        // wasmi 2.0 pauses a `table.grow` short of fuel without keeping its place (unlike
        // `memory.grow`): resumed, the function would run again from an earlier instruction.
        // So it traps instead, saying why.
        if let TableError::OutOfFuel { required_fuel } = error {
            self.refused = Some(format!(
                "a table.grow needing {required_fuel} fuel ran out of the fuel left in its slice \
                 (wasmi cannot resume a table.grow; grow tables by fewer than {} elements at a \
                 time, which costs none)",
                BYTES_PER_FUEL as usize / WASMI_TABLE_ELEMENT
            ));
            return Err(LimiterError::ResourceLimiterDeniedAllocation);
        }
        Ok(())
    }

    fn instances(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        1
    }
}

/// `bytes` as people read it: `64 MiB`, `1.5 MiB`, `4096 bytes`.
fn bytes_text(bytes: usize) -> String {
    const MIB: usize = 1 << 20;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// Reads the first JSON value of `bytes`; what follows it (the rest of the memory) is ignored,
/// as 0.13's streaming parser did.
pub(crate) fn first_json_value(bytes: &[u8]) -> Result<Value, String> {
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
