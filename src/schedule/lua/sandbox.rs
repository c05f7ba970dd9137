//! One loaded scheduler in a sandboxed Lua 5.4 state.
//!
//! The state has only `base` (without `dofile` and `loadfile`; `load` accepts text chunks
//! only), `table`, `string` (without `dump`), `math`, `utf8`, `debug.traceback` and verwalter's
//! `placement` (placement.rs); no `io`, `os`, `package`, `coroutine` or C modules. `require` loads `<scheduler dir>/<name>.lua` (the name's
//! own extension replaced, as verwalter 0.13 did); a symlink on the way to `main.lua` or a module
//! must not lead out of the config dir, the rule of the runtime tree and templates. A memory cap
//! and a time budget stop a runaway script; the budget cannot be caught with `pcall`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use mlua::{ChunkMode, Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LuaValue};
use verwalter_controllers::defaults;
use verwalter_controllers::machinery::ports::SchedulerError;
use verwalter_controllers::state::{
    NodeId, Peer, ScheduleData, SchedulerFailure, SchedulerInput, SchedulerOutput, json_kind,
};

use crate::machinery::paths::{Boundary, Escape};

use super::convert::{
    Budget, ConvertError, Declined, ParseError, input_to_lua, json_to_lua, lua_to_canonical,
    lua_to_json, parse_json_text, peers_as_seen, peers_to_lua, with_article,
};
use super::watchdog::{TIMEOUT_MARK, Watchdog};

/// Resource limits of one scheduler run (and of loading the code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory the Lua state may hold, code and data together.
    pub memory: usize,
    /// Wall-clock time one run (or the load of `main.lua`) may take.
    pub(crate) time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: (defaults::SCHEDULER_MEMORY_MIB as usize) << 20,
            time: defaults::SCHEDULER_TIME_LIMIT,
        }
    }
}

/// The most `print` output one run (or load) keeps. The log lives outside the Lua state, so the
/// memory cap does not bound it; 2 MiB is thousands of lines, more than anyone reads at
/// `/v1/scheduler_debug_info`, and small next to the memory cap.
pub(crate) const PRINT_LIMIT: usize = 2 << 20;

/// Ends the `print` output of a run that wrote more than [`PRINT_LIMIT`].
pub(crate) const PRINT_TRUNCATED: &str =
    "[print output truncated: the scheduler log keeps 2 MiB]\n";

/// A scheduler loaded from a directory, ready to run.
pub struct Sandbox {
    lua: Lua,
    scheduler: Function,
    limits: Limits,
    deadline: Rc<Cell<Instant>>,
    log: Rc<RefCell<String>>,
    watchdog: Watchdog,
    /// The last `state.peers` table and what it was built from. Building 1,000 peer tables costs
    /// more than a millisecond and the peer list rarely changes, so the table is reused while the
    /// peers are the same and [`Sandbox::after_run`] found it unmodified by the script.
    peers_cache: RefCell<Option<TableCache<BTreeMap<NodeId, Peer>>>>,
    /// The same for `state.runtime`: the runtime tree changes only when its files do.
    runtime_cache: RefCell<Option<TableCache<Shared>>>,
    /// Bytes of the last schedule text written from a table: the next one's buffer is sized
    /// from it.
    last_text: Cell<usize>,
}

/// The runtime tree, compared by pointer first (the inputs snapshot is shared while unchanged).
#[derive(Clone)]
struct Shared(std::sync::Arc<serde_json::Value>);

impl PartialEq for Shared {
    fn eq(&self, other: &Shared) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

/// A Lua table built from `source`, reused while the source is the same.
struct TableCache<T> {
    source: T,
    table: Table,
    /// Checked unmodified since its last use; only a checked table is used again.
    clean: bool,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("limits", &self.limits)
            .finish()
    }
}

fn load_error(message: impl Into<String>) -> SchedulerError {
    SchedulerError {
        kind: SchedulerFailure::Load,
        message: message.into(),
        log: String::new(),
    }
}

/// Where the sandbox reads its code: the scheduler dir, and the dir its symlinks must stay in.
#[derive(Clone)]
struct Place {
    dir: PathBuf,
    /// How messages name `dir` (`scheduler/v1`).
    display_dir: String,
    /// The config dir: symlinks must stay inside it; messages name other files relative to it.
    boundary: Boundary,
}

/// Why a code file was not read.
enum Refused {
    /// It cannot be read (missing, no permission): the message names it and the OS error.
    Unreadable(String),
    /// A symlink on the way leads out of the config dir: the message names the link and where
    /// it leads.
    Outside(String),
}

impl Place {
    /// How messages name `path`: under the scheduler dir by its display name, else relative to
    /// the config dir.
    fn show(&self, path: &Path) -> String {
        match path.strip_prefix(&self.dir) {
            Ok(rel) if rel.as_os_str().is_empty() => self.display_dir.clone(),
            Ok(rel) => format!("{}/{}", self.display_dir, rel.display()),
            Err(_) => match path.strip_prefix(self.boundary.given()) {
                Ok(rel) => rel.display().to_string(),
                Err(_) => path.display().to_string(),
            },
        }
    }

    /// The real path of `path` (a file under the scheduler dir), if it leads (every symlink
    /// resolved) to a place inside the config dir, as `inputs::walk` requires of the runtime
    /// tree and the scheduler's own hash: a module linked to a file elsewhere on the machine
    /// would otherwise run it as scheduler code.
    fn contained(&self, path: &Path) -> Result<PathBuf, Refused> {
        let target = match self.boundary.resolve(path) {
            Ok(real) => return Ok(real),
            Err(Escape::Unresolved(e)) => {
                return Err(Refused::Unreadable(format!("{}: {e}", self.show(path))));
            }
            Err(Escape::Outside(real)) => real,
        };
        // Name the symlink on the way that leads out (`scheduler/v1` itself, a dir of modules,
        // or the file).
        let (link, target) = self
            .boundary
            .first_exit(path)
            .unwrap_or_else(|| (path.to_path_buf(), target));
        Err(Refused::Outside(format!(
            "{}: symlink to {}, outside {}; links may not leave it",
            self.show(&link),
            target.display(),
            self.boundary.real().display()
        )))
    }
}

impl Sandbox {
    /// Loads `main.lua` from `dir` (the `scheduler/v1` directory). `display_dir` is how error
    /// messages name that directory (e.g. `scheduler/v1`). Symlinks must stay inside `dir`
    /// itself; the daemon and the offline commands use [`Sandbox::load_within`].
    pub fn load(dir: &Path, display_dir: &str, limits: Limits) -> Result<Sandbox, SchedulerError> {
        Sandbox::load_within(dir, display_dir, dir, limits)
    }

    /// Loads `main.lua` from `dir` like [`Sandbox::load`], where `main.lua` and the modules
    /// may be reached through symlinks as long as they stay inside `boundary` (the config dir).
    pub(crate) fn load_within(
        dir: &Path,
        display_dir: &str,
        boundary: &Path,
        limits: Limits,
    ) -> Result<Sandbox, SchedulerError> {
        // A missing config dir shows as `main.lua` that cannot be read, below.
        let place = Place {
            dir: dir.to_path_buf(),
            display_dir: display_dir.to_string(),
            boundary: Boundary::new_or_given(boundary),
        };
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::UTF8,
            LuaOptions::default(),
        )
        .map_err(|e| load_error(format!("cannot create the Lua state: {e}")))?;
        let deadline = Rc::new(Cell::new(Instant::now() + limits.time));
        let log = Rc::new(RefCell::new(String::new()));
        setup(&lua, &place, &deadline, &log, limits.memory)
            .map_err(|e| load_error(format!("cannot set up the sandbox: {e}")))?;
        lua.set_memory_limit(limits.memory)
            .map_err(|e| load_error(format!("cannot set the memory limit: {e}")))?;
        let watchdog = Watchdog::start()
            .map_err(|e| load_error(format!("cannot start the watchdog thread: {e}")))?;

        let main_path = dir.join("main.lua");
        let cannot_read =
            |e: std::io::Error| load_error(format!("{display_dir}/main.lua: cannot read: {e}"));
        let main_real = match place.contained(&main_path) {
            Ok(real) => real,
            // The OS error of the read itself, as before.
            Err(Refused::Unreadable(_)) => main_path.clone(),
            Err(Refused::Outside(message)) => return Err(load_error(message)),
        };
        let source = std::fs::read(&main_real).map_err(cannot_read)?;
        deadline.set(Instant::now() + limits.time);
        watchdog.arm(&lua, deadline.get());
        let returned = lua
            .load(source)
            .set_name(format!("@{display_dir}/main.lua"))
            .set_mode(ChunkMode::Text)
            .call::<LuaValue>(());
        let fired = watchdog.disarm();
        let returned = returned.map_err(|e| {
            let (kind, message) = classify(&e, fired, limits);
            SchedulerError {
                kind: if kind == SchedulerFailure::Runtime {
                    SchedulerFailure::Load
                } else {
                    kind
                },
                message,
                log: log.take(),
            }
        })?;
        let scheduler = match returned {
            LuaValue::Table(t) => match t.get::<LuaValue>("scheduler") {
                Ok(LuaValue::Function(f)) => f,
                _ => {
                    return Err(load_error(format!(
                        "{display_dir}/main.lua: the returned table has no `scheduler` function"
                    )));
                }
            },
            other => {
                return Err(load_error(format!(
                    "{display_dir}/main.lua: must return a table with a `scheduler` function, returned {}",
                    other.type_name()
                )));
            }
        };
        log.borrow_mut().clear();
        Ok(Sandbox {
            lua,
            scheduler,
            limits,
            deadline,
            log,
            watchdog,
            peers_cache: RefCell::new(None),
            runtime_cache: RefCell::new(None),
            last_text: Cell::new(0),
        })
    }

    /// Builds the `state` table for `input`.
    pub fn input_table(&self, input: &SchedulerInput) -> Result<Table, SchedulerError> {
        // Everything built here stays reachable, so collector steps during the build would be
        // wasted work; the collector runs again for the scheduler itself.
        self.lua.gc_stop();
        let table = self.build_input(input);
        self.lua.gc_restart();
        table.map_err(|e| SchedulerError {
            kind: if matches!(e, mlua::Error::MemoryError(_)) {
                SchedulerFailure::Memory
            } else {
                SchedulerFailure::Internal
            },
            message: format!("cannot build the scheduler input: {e}"),
            log: String::new(),
        })
    }

    fn build_input(&self, input: &SchedulerInput) -> mlua::Result<Table> {
        let mut peers = self.peers_cache.borrow_mut();
        let peers = reuse(&mut peers, &input.peers, |p| peers_to_lua(&self.lua, p))?;
        let mut runtime = self.runtime_cache.borrow_mut();
        let source = Shared(input.runtime.clone());
        let runtime = reuse(&mut runtime, &source, |r| json_to_lua(&self.lua, &r.0))?;
        input_to_lua(&self.lua, input, &peers, &runtime)
    }

    /// The Lua state's memory in use, garbage included (after a run, before [`Sandbox::after_run`]
    /// frees it: close to the run's peak).
    pub(crate) fn memory_in_use(&self) -> usize {
        self.lua.used_memory()
    }

    /// Work between runs, off the critical path: checks that the script left the reused peers
    /// table as it was built (else it is rebuilt next time), and frees the run's garbage.
    pub fn after_run(&self) {
        let budget = Budget {
            bytes: self.limits.memory,
            deadline: Instant::now() + self.limits.time,
        };
        if let Some(cache) = &mut *self.peers_cache.borrow_mut() {
            let seen = lua_to_json(&self.lua, &LuaValue::Table(cache.table.clone()), budget);
            cache.clean = seen.ok() == Some(peers_as_seen(&cache.source))
                && cache.table.metatable().is_none();
        }
        if let Some(cache) = &mut *self.runtime_cache.borrow_mut() {
            let seen = lua_to_json(&self.lua, &LuaValue::Table(cache.table.clone()), budget);
            // A tree with nulls or empty arrays never reads back the same: it is rebuilt.
            cache.clean =
                seen.ok().as_ref() == Some(&*cache.source.0) && cache.table.metatable().is_none();
        }
        let _ = self.lua.gc_collect();
    }

    /// Calls `scheduler(state)` and returns its raw results (benchmarks time this alone).
    pub fn call(&self, state: Table) -> Result<MultiValue, SchedulerError> {
        self.log.borrow_mut().clear();
        self.deadline.set(Instant::now() + self.limits.time);
        self.watchdog.arm(&self.lua, self.deadline.get());
        let result = self.scheduler.call::<MultiValue>(state);
        let fired = self.watchdog.disarm();
        result.map_err(|e| {
            let (kind, message) = classify(&e, fired, self.limits);
            SchedulerError {
                kind,
                message,
                log: self.log.take(),
            }
        })
    }

    /// Turns the raw results into a schedule and log.
    pub fn output(&self, results: MultiValue) -> Result<SchedulerOutput, SchedulerError> {
        let printed = self.log.take();
        let bad = |message: String, log: &str| SchedulerError {
            kind: SchedulerFailure::BadOutput,
            message,
            log: log.to_string(),
        };
        let mut values = results.into_iter();
        let first = values.next().unwrap_or(LuaValue::Nil);
        let second = values.next().unwrap_or(LuaValue::Nil);
        let mut log = match &second {
            LuaValue::Nil => String::new(),
            LuaValue::String(s) => s.to_string_lossy(),
            other => {
                return Err(bad(
                    format!(
                        "the scheduler's second return value (the log) must be a string, got {}",
                        other.type_name()
                    ),
                    &printed,
                ));
            }
        };
        if !printed.is_empty() {
            // `print` output comes first: it was written while the scheduler ran.
            log = if log.is_empty() {
                printed
            } else {
                format!("{printed}{log}")
            };
        }
        // Parsing or converting what the scheduler returned shares the run's limits: its output
        // counts against the memory limit (tiny values take many times their text) and it must
        // end by the run's deadline.
        let budget = Budget {
            bytes: self.limits.memory,
            deadline: self.deadline.get(),
        };
        let out_of_memory = |e: &dyn std::fmt::Display| SchedulerError {
            kind: SchedulerFailure::Memory,
            message: format!("scheduler ran out of its memory limit: {e}"),
            log: log.clone(),
        };
        let timed_out = |doing: &str| SchedulerError {
            kind: SchedulerFailure::Timeout,
            message: format!("{TIMEOUT_MARK} of {:?} (while {doing})", self.limits.time),
            log: log.clone(),
        };
        let tree = match &first {
            LuaValue::String(s) => {
                let text = s.to_str().map_err(|_| {
                    bad(
                        "the scheduler returned a string that is not valid UTF-8".into(),
                        &log,
                    )
                })?;
                parse_json_text(&text, budget).map_err(|e| match &e {
                    ParseError::Invalid(invalid) => bad(
                        format!("the scheduler returned invalid JSON: {invalid}"),
                        &log,
                    ),
                    ParseError::TooLarge { .. } => out_of_memory(&e),
                    ParseError::Timeout => timed_out("parsing the returned JSON text"),
                })?
            }
            LuaValue::Table(table) => {
                // Straight to the canonical text; a table that writer declines is converted
                // the tree's way, which names what is wrong with it.
                match lua_to_canonical(&self.lua, table, budget, self.text_buffer()) {
                    Ok(text) if text.starts_with('{') => {
                        self.last_text.set(text.len());
                        let data = ScheduleData::from_canonical(text);
                        return Ok(SchedulerOutput { data, log });
                    }
                    Err(Declined::Timeout) => {
                        return Err(timed_out("converting the returned table"));
                    }
                    Ok(_) | Err(Declined::Refused) => {}
                }
                lua_to_json(&self.lua, &first, budget).map_err(|e| match e {
                    ConvertError::BadValue(message) => bad(
                        format!("cannot convert the returned table: {message}"),
                        &log,
                    ),
                    ConvertError::TooLarge { .. } => out_of_memory(&e),
                    ConvertError::Timeout => timed_out("converting the returned table"),
                })?
            }
            LuaValue::Nil => {
                return Err(bad(
                    "the scheduler returned nil (an error inside a wrapper that swallowed it?)"
                        .into(),
                    &log,
                ));
            }
            other => {
                return Err(bad(
                    format!(
                        "the scheduler returned {}, expected a JSON string or a table",
                        with_article(other.type_name())
                    ),
                    &log,
                ));
            }
        };
        if !tree.is_object() {
            return Err(bad(
                format!(
                    "the schedule must be a JSON object, got {}",
                    json_kind(&tree)
                ),
                &log,
            ));
        }
        let data = ScheduleData::from_value(tree);
        Ok(SchedulerOutput { data, log })
    }

    /// A buffer for the next schedule text: room for the last one and a little more, the
    /// buffer of a dropped schedule when one is big enough (pages already in memory).
    fn text_buffer(&self) -> Vec<u8> {
        let last = self.last_text.get();
        verwalter_controllers::schedule::data::text_buffer(last + last / 8)
    }

    /// One full run: input table, call, output.
    pub fn run(&self, input: &SchedulerInput) -> Result<SchedulerOutput, SchedulerError> {
        let state = self.input_table(input)?;
        let results = self.call(state)?;
        self.output(results)
    }
}

/// Sorts an mlua error into a failure kind and a message that keeps Lua's `file:line:`. An error
/// in a call whose deadline passed is a timeout, whatever the script made of it.
fn classify(
    error: &mlua::Error,
    deadline_passed: bool,
    limits: Limits,
) -> (SchedulerFailure, String) {
    let (kind, message) = classify_error(error);
    // The watchdog's hook and the metered C-function replacements both stop a run at the
    // deadline; whichever noticed first, the message is the same.
    if deadline_passed || kind == SchedulerFailure::Timeout {
        return (
            SchedulerFailure::Timeout,
            format!("{TIMEOUT_MARK} of {:?}", limits.time),
        );
    }
    (kind, message)
}

fn classify_error(error: &mlua::Error) -> (SchedulerFailure, String) {
    match error {
        mlua::Error::MemoryError(_) => (
            SchedulerFailure::Memory,
            "scheduler ran out of its memory limit".into(),
        ),
        mlua::Error::CallbackError { cause, .. } => classify_error(cause),
        mlua::Error::WithContext { cause, .. } => classify_error(cause),
        mlua::Error::SyntaxError { message, .. } => (SchedulerFailure::Load, message.clone()),
        mlua::Error::RuntimeError(message) => {
            if message.contains(TIMEOUT_MARK) {
                (
                    SchedulerFailure::Timeout,
                    first_line_with(message, TIMEOUT_MARK),
                )
            } else if message.contains("not enough memory") {
                (
                    SchedulerFailure::Memory,
                    "scheduler ran out of its memory limit".into(),
                )
            } else {
                (SchedulerFailure::Runtime, message.clone())
            }
        }
        other => {
            let text = other.to_string();
            if text.contains(TIMEOUT_MARK) {
                (
                    SchedulerFailure::Timeout,
                    first_line_with(&text, TIMEOUT_MARK),
                )
            } else if text.contains("not enough memory") {
                (
                    SchedulerFailure::Memory,
                    "scheduler ran out of its memory limit".into(),
                )
            } else {
                (SchedulerFailure::Runtime, text)
            }
        }
    }
}

fn first_line_with(text: &str, needle: &str) -> String {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or(needle)
        .trim()
        .to_string()
}

/// Resolves a module name to a file inside `dir`, as verwalter 0.13 did: the name is a relative
/// path whose extension is replaced by `.lua`; `..`, absolute paths and empty names are refused.
pub(crate) fn module_path(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let rel = Path::new(name);
    if name.is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!(
            "module name {name:?} must be a relative path inside the scheduler directory"
        ));
    }
    let mut path = dir.join(rel);
    path.set_extension("lua");
    Ok(path)
}

/// `file:line: ` of the Lua code that called the running Rust function, for error messages.
fn caller(lua: &Lua) -> String {
    lua.inspect_stack(1, |debug| {
        let source = debug
            .source()
            .short_src
            .map(|s| s.into_owned())
            .unwrap_or_default();
        match debug.current_line() {
            Some(line) => format!("{source}:{line}: "),
            None => String::new(),
        }
    })
    .unwrap_or_default()
}

fn setup(
    lua: &Lua,
    place: &Place,
    deadline: &Rc<Cell<Instant>>,
    log: &Rc<RefCell<String>>,
    memory_limit: usize,
) -> mlua::Result<()> {
    let globals = lua.globals();
    for name in ["dofile", "loadfile"] {
        globals.raw_set(name, LuaValue::Nil)?;
    }
    let string: Table = globals.get("string")?;
    string.raw_set("dump", LuaValue::Nil)?;

    // debug.traceback only.
    globals.raw_set("debug", debug_table(lua)?)?;

    // print goes to the scheduler log, up to PRINT_LIMIT.
    globals.raw_set("print", print_to(lua, log)?)?;

    // require: modules from the scheduler dir only, called with their name as `...`. As with
    // Lua's own `require` (which 0.13 kept), the libraries the state has are already loaded:
    // `local string = require "string"` gives the (sandboxed) string library.
    let loaded = lua.create_table()?;
    loaded.raw_set("_G", globals.clone())?;
    for name in ["string", "table", "math", "utf8", "debug"] {
        loaded.raw_set(name, globals.raw_get::<Table>(name)?)?;
    }
    // wca-scheduler's placement algorithms (placement.rs). A global only, not in `loaded`: a
    // 0.13 scheduler with its own `placement.lua` module must still get it from `require`.
    let placement = super::placement::register(lua, deadline, memory_limit)?;
    globals.raw_set("placement", placement)?;
    globals.raw_set("require", require_from(lua, place, loaded)?)?;

    // C functions run no Lua instructions, so the time budget cannot stop them: the pattern
    // functions, `string.rep` and `table.move` are replaced by ones that watch the deadline or
    // cannot loop without allocating (pattern.rs).
    let table: Table = globals.get("table")?;
    super::pattern::register(lua, &string, &table, deadline, memory_limit)?;

    let expired_deadline = deadline.clone();
    globals.raw_set(
        "__verwalter_expired",
        lua.create_function(move |_, ()| Ok(Instant::now() > expired_deadline.get()))?,
    )?;
    // Text-only `load`, and `pcall`/`xpcall` that cannot swallow an expired budget.
    lua.load(
        r#"
        local raw_load, raw_pcall, raw_xpcall = load, pcall, xpcall
        local expired, pack, unpack, select, error = __verwalter_expired, table.pack, table.unpack, select, error
        __verwalter_expired = nil
        load = function(chunk, name, mode, ...)
            if select('#', ...) > 0 then return raw_load(chunk, name, "t", (...)) end
            return raw_load(chunk, name, "t")
        end
        local function rethrow(r)
            if not r[1] and expired() then error(r[2], 0) end
            return unpack(r, 1, r.n)
        end
        pcall = function(...) return rethrow(pack(raw_pcall(...))) end
        -- A message handler runs with hooks off when the budget error came from the hook, so
        -- it is skipped once the budget is spent.
        xpcall = function(f, handler, ...)
            local guarded = function(m) if expired() then return m end return handler(m) end
            return rethrow(pack(raw_xpcall(f, guarded, ...)))
        end
        -- Finalizers also run with hooks off: an endless `__gc` could not be stopped.
        local raw_setmetatable, rawget, type = setmetatable, rawget, type
        setmetatable = function(t, mt)
            if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
                error("__gc metamethods are not allowed in the scheduler sandbox", 2)
            end
            return raw_setmetatable(t, mt)
        end
        "#,
    )
    .set_name("=sandbox")
    .exec()?;
    Ok(())
}

/// `debug` with `traceback` only.
fn debug_table(lua: &Lua) -> mlua::Result<Table> {
    let debug = lua.create_table()?;
    debug.raw_set(
        "traceback",
        lua.create_function(|lua, (msg, level): (LuaValue, Option<usize>)| {
            let level = level.unwrap_or(1);
            match msg {
                LuaValue::Nil => Ok(LuaValue::String(lua.traceback(None, level)?)),
                LuaValue::String(s) => {
                    let text = s.to_string_lossy();
                    Ok(LuaValue::String(lua.traceback(Some(&text), level)?))
                }
                other => Ok(other),
            }
        })?,
    )?;
    Ok(debug)
}

/// `print`: to the scheduler log, up to [`PRINT_LIMIT`].
fn print_to(lua: &Lua, log: &Rc<RefCell<String>>) -> mlua::Result<Function> {
    let sink = log.clone();
    lua.create_function(move |lua, args: MultiValue| {
        if sink.borrow().len() >= PRINT_LIMIT {
            return Ok(());
        }
        let tostring: Function = lua.globals().get("tostring")?;
        let mut line = String::new();
        for (i, arg) in args.into_iter().enumerate() {
            if i > 0 {
                line.push('\t');
            }
            line.push_str(&tostring.call::<mlua::String>(arg)?.to_string_lossy());
            if line.len() >= PRINT_LIMIT {
                break;
            }
        }
        line.push('\n');
        append_capped(&mut sink.borrow_mut(), &line);
        Ok(())
    })
}

/// `require`: modules of the scheduler dir (`place`) only, each called with its name as `...`;
/// `loaded` has the modules loaded (and the ones loading, to refuse a circular require).
fn require_from(lua: &Lua, place: &Place, loaded: Table) -> mlua::Result<Function> {
    let place = place.clone();
    lua.create_function(move |lua, name: String| {
        match loaded.raw_get::<LuaValue>(name.as_str())? {
            LuaValue::Nil => {}
            LuaValue::LightUserData(_) => {
                return Err(mlua::Error::runtime(format!(
                    "circular require of module {name:?}"
                )));
            }
            value => return Ok(value),
        }
        let at = caller(lua);
        let path =
            module_path(&place.dir, &name).map_err(|e| mlua::Error::runtime(format!("{at}{e}")))?;
        let shown = place.show(&path);
        let not_found = |message: String| {
            mlua::Error::runtime(format!("{at}module {name:?} not found: {message}"))
        };
        let real = place.contained(&path).map_err(|refused| match refused {
            Refused::Unreadable(message) => not_found(message),
            Refused::Outside(message) => {
                mlua::Error::runtime(format!("{at}module {name:?} refused: {message}"))
            }
        })?;
        let source = std::fs::read(&real).map_err(|e| not_found(format!("{shown}: {e}")))?;
        loaded.raw_set(
            name.as_str(),
            LuaValue::LightUserData(mlua::LightUserData(std::ptr::null_mut())),
        )?;
        let chunk = lua
            .load(source)
            .set_name(format!("@{shown}"))
            .set_mode(ChunkMode::Text)
            .into_function();
        let result = chunk.and_then(|f| f.call::<LuaValue>(name.as_str()));
        let value = match result {
            Ok(LuaValue::Nil) => LuaValue::Boolean(true),
            Ok(value) => value,
            Err(e) => {
                loaded.raw_set(name.as_str(), LuaValue::Nil)?;
                return Err(e);
            }
        };
        loaded.raw_set(name.as_str(), value.clone())?;
        Ok(value)
    })
}

/// Appends `text` to the print log while it is under [`PRINT_LIMIT`]; the text that does not fit
/// is replaced by [`PRINT_TRUNCATED`], once.
fn append_capped(log: &mut String, text: &str) {
    let room = PRINT_LIMIT.saturating_sub(log.len());
    if text.len() <= room {
        log.push_str(text);
        return;
    }
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    log.push_str(&text[..end]);
    if !log.ends_with('\n') {
        log.push('\n');
    }
    log.push_str(PRINT_TRUNCATED);
}

/// The cached table if it was built from an equal `source` and found unmodified since, else a
/// new one; either way marked unchecked (the script may change it; `after_run` checks).
fn reuse<T: PartialEq + Clone>(
    cache: &mut Option<TableCache<T>>,
    source: &T,
    build: impl FnOnce(&T) -> mlua::Result<Table>,
) -> mlua::Result<Table> {
    let reusable = cache
        .as_ref()
        .is_some_and(|c| c.clean && c.source == *source);
    if !reusable {
        *cache = Some(TableCache {
            source: source.clone(),
            table: build(source)?,
            clean: false,
        });
    }
    let cache = cache.as_mut().expect("filled above");
    cache.clean = false;
    Ok(cache.table.clone())
}
