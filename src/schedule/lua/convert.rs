//! Conversions between JSON and Lua values, with verwalter 0.13's mapping: `null` becomes `nil`
//! (the key disappears), action ids become integer keys; on the way back a table with keys
//! `1..n` is an array, any other table an object, and an empty table `{}`.
//!
//! Both directions use the Lua C API directly. Going through mlua's safe API cost about 5 ms each
//! way for 1,000 peers (a registry reference per value), as much as a whole placement scheduler;
//! the raw API brings that under a millisecond.
//!
//! Safety rules kept here: building tables can raise a Lua memory error, which unwinds with
//! `longjmp` to the protected call `exec_raw` makes, so the building functions own nothing that
//! needs dropping (they only borrow). Reading never raises (`lua_next` on a table we traverse
//! ourselves, `lua_tolstring` only on strings), so it may build Rust values freely.
//!
//! Reading is metered ([`Budget`]): a table may reference one big table many times, so its JSON
//! form can be far larger than the Lua state (20,000 references to a 100,000-element table are
//! two billion JSON values). The output is counted against the scheduler's memory limit and the
//! run's deadline while it is built, and a conversion over either stops with an error instead of
//! allocating until the process aborts. JSON text a scheduler returns is parsed under the same
//! meter ([`parse_json_text`]).

#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int};
use std::time::Instant;

use mlua::{Lua, Table, ffi};
use serde_json::{Map, Number, Value};
use std::collections::BTreeMap;

use verwalter_controllers::state::{NodeId, Peer, SchedulerInput};

mod canonical;
pub(crate) use canonical::{Declined, lua_to_canonical};

/// Tables nested deeper than this are refused on the way back: a table that contains itself,
/// or a schedule nested deeper than followers can read (serde_json parses at most 128 levels,
/// one of them the envelope's; a schedule past that would be made here and refused by every
/// follower).
const MAX_DEPTH: usize = 100;

/// What one JSON value is counted as: the size of a `serde_json::Value`, the slot every value
/// takes whatever it holds. String bytes and object keys are counted on top.
const VALUE_COST: usize = std::mem::size_of::<Value>();

/// What an object entry costs besides its key bytes and value: the map node and key `String`.
const ENTRY_COST: usize = 2 * std::mem::size_of::<String>();

/// The clock is read once per this many values: often enough to stop within a millisecond or
/// two, rarely enough that reading it costs nothing measurable.
const CLOCK_EVERY: u32 = 4096;

/// Entries of a table inserted into its map one by one; those after are sorted together.
const INSERT_AT_ONCE: usize = 16;

/// Limits of one Lua-to-JSON conversion: the scheduler's memory limit and the run's deadline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Estimated bytes the JSON value may take.
    pub(crate) bytes: usize,
    /// When the conversion must have finished.
    pub(crate) deadline: Instant,
}

/// Why a Lua value could not be converted to JSON.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ConvertError {
    /// A value JSON cannot represent; the message names its path (`roles.web[2] is a function`).
    #[error("{0}")]
    BadValue(String),
    /// The JSON form would be larger than the memory limit.
    #[error("the returned table converts to more than {} MiB of JSON", .limit >> 20)]
    TooLarge { limit: usize },
    /// The conversion ran past the deadline.
    #[error("converting the returned table ran past the deadline")]
    Timeout,
}

/// Why the JSON text a scheduler returned did not become a value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParseError {
    /// Not JSON (serde_json's message, with line and column).
    #[error("{0}")]
    Invalid(serde_json::Error),
    /// The parsed value would be larger than the memory limit.
    #[error("the returned JSON text parses to more than {} MiB of JSON values", .limit >> 20)]
    TooLarge { limit: usize },
    /// Parsing ran past the deadline.
    #[error("parsing the returned JSON text ran past the deadline")]
    Timeout,
}

/// Counts what a conversion has built so far against its [`Budget`].
struct Meter {
    budget: Budget,
    left: usize,
    until_clock: u32,
}

impl Meter {
    fn new(budget: Budget) -> Meter {
        Meter {
            budget,
            left: budget.bytes,
            until_clock: CLOCK_EVERY,
        }
    }

    /// Charges `bytes` of output; also looks at the clock now and then.
    fn charge(&mut self, bytes: usize) -> Result<(), Stop> {
        self.left = self.left.checked_sub(bytes).ok_or(Stop::TooLarge)?;
        self.until_clock -= 1;
        if self.until_clock == 0 {
            self.until_clock = CLOCK_EVERY;
            if Instant::now() > self.budget.deadline {
                return Err(Stop::Timeout);
            }
        }
        Ok(())
    }

    /// Whether `bytes` more would still fit, without charging them (to size a `Vec` up front).
    fn fits(&self, bytes: usize) -> Result<(), Stop> {
        if bytes <= self.left {
            Ok(())
        } else {
            Err(Stop::TooLarge)
        }
    }
}

/// Parses the JSON text a scheduler returned, counting the values it builds against `budget`
/// like [`lua_to_json`] does: a text of tiny values (`[[],[],...]`, 3 bytes each) takes more
/// than ten times its size as `serde_json::Value`s, so a text that fits in the Lua state could
/// otherwise parse into many times the memory limit.
pub(crate) fn parse_json_text(text: &str, budget: Budget) -> Result<Value, ParseError> {
    let mut meter = TextMeter {
        meter: Meter::new(budget),
        stopped: None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = serde::de::DeserializeSeed::deserialize(Metered(&mut meter), &mut de)
        .and_then(|value| de.end().map(|()| value));
    parsed.map_err(|e| match meter.stopped {
        Some(Stop::TooLarge) => ParseError::TooLarge {
            limit: budget.bytes,
        },
        Some(Stop::Timeout) => ParseError::Timeout,
        _ => ParseError::Invalid(e),
    })
}

/// A [`Meter`] for parsing, which remembers why it stopped the parser (serde only carries a
/// message back).
struct TextMeter {
    meter: Meter,
    stopped: Option<Stop>,
}

impl TextMeter {
    fn charge<E: serde::de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        self.meter.charge(bytes).map_err(|stop| {
            self.stopped = Some(stop);
            E::custom("stopped by the scheduler's limits")
        })
    }
}

/// Builds one JSON value (and everything inside it) while charging it to the meter.
struct Metered<'m>(&'m mut TextMeter);

impl<'de> serde::de::DeserializeSeed<'de> for Metered<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Metered<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Value, E> {
        self.0.charge(VALUE_COST)?;
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<Value, E> {
        self.0.charge(VALUE_COST)?;
        Ok(Value::Number(i.into()))
    }

    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Value, E> {
        self.0.charge(VALUE_COST)?;
        Ok(Value::Number(u.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Value, E> {
        self.0.charge(VALUE_COST)?;
        // JSON text has no NaN or infinity; serde_json turns an overflowing literal into an error.
        Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Value, E> {
        self.0.charge(VALUE_COST + s.len())?;
        Ok(Value::String(s.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Value, E> {
        self.0.charge(VALUE_COST + s.len())?;
        Ok(Value::String(s))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.0.charge(VALUE_COST)?;
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.charge(VALUE_COST)?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Metered(&mut *self.0))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.charge(VALUE_COST)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.0.charge(ENTRY_COST + key.len())?;
            let value = map.next_value_seed(Metered(&mut *self.0))?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// Pushes `value`; `nil` for `null`.
///
/// # Safety
/// `state` is a valid Lua state inside a protected call.
unsafe fn push_json(state: *mut ffi::lua_State, value: &Value) {
    unsafe {
        ffi::luaL_checkstack(state, 4, c"JSON value nested too deep".as_ptr());
        match value {
            Value::Null => ffi::lua_pushnil(state),
            Value::Bool(b) => ffi::lua_pushboolean(state, c_int::from(*b)),
            Value::Number(n) => match n.as_i64() {
                Some(i) => ffi::lua_pushinteger(state, i),
                None => ffi::lua_pushnumber(state, n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => push_str(state, s),
            Value::Array(items) => {
                ffi::lua_createtable(state, items.len().min(c_int::MAX as usize) as c_int, 0);
                for (i, item) in items.iter().enumerate() {
                    if !item.is_null() {
                        push_json(state, item);
                        ffi::lua_rawseti(state, -2, i as ffi::lua_Integer + 1);
                    }
                }
            }
            Value::Object(map) => {
                ffi::lua_createtable(state, 0, map.len().min(c_int::MAX as usize) as c_int);
                for (key, item) in map {
                    if !item.is_null() {
                        push_str(state, key);
                        push_json(state, item);
                        ffi::lua_rawset(state, -3);
                    }
                }
            }
        }
    }
}

unsafe fn push_str(state: *mut ffi::lua_State, s: &str) {
    unsafe { ffi::lua_pushlstring(state, s.as_ptr() as *const c_char, s.len()) };
}

/// Sets `t[name] = <top of stack>` on the table just below the top.
unsafe fn set(state: *mut ffi::lua_State, name: &CStr) {
    unsafe { ffi::lua_setfield(state, -2, name.as_ptr()) };
}

/// Sets `t[name] = s` on the table at the top of the stack.
unsafe fn set_str(state: *mut ffi::lua_State, name: &CStr, s: &str) {
    unsafe {
        push_str(state, s);
        set(state, name);
    }
}

/// Sets `t[name] = n` on the table at the top of the stack.
unsafe fn set_int(state: *mut ffi::lua_State, name: &CStr, n: ffi::lua_Integer) {
    unsafe {
        ffi::lua_pushinteger(state, n);
        set(state, name);
    }
}

unsafe fn push_peer(state: *mut ffi::lua_State, peer: &Peer) {
    unsafe {
        ffi::luaL_checkstack(state, 4, c"peer".as_ptr());
        ffi::lua_createtable(state, 0, 8);
        set_str(state, c"id", &peer.id);
        if let Some(addr) = &peer.addr {
            set_str(state, c"addr", addr);
        }
        set_str(state, c"name", &peer.name);
        set_str(state, c"hostname", &peer.hostname);
        if let Some(stamp) = &peer.schedule {
            ffi::lua_createtable(state, 0, 3);
            set_int(state, c"timestamp", stamp.timestamp as ffi::lua_Integer);
            set_str(state, c"hash", &stamp.hash);
            set_str(state, c"origin", &stamp.origin);
            set(state, c"schedule");
        }
        set_int(state, c"known_since", peer.known_since as ffi::lua_Integer);
        if let Some(last) = peer.last_report_direct {
            set_int(state, c"last_report_direct", last as ffi::lua_Integer);
        }
        set_int(state, c"errors", peer.errors as ffi::lua_Integer);
    }
}

/// Pushes the `state` table of `input`.
unsafe fn push_input(state: *mut ffi::lua_State, input: &SchedulerInput) {
    unsafe {
        ffi::luaL_checkstack(state, 6, c"scheduler input".as_ptr());
        ffi::lua_createtable(state, 0, 8);
        set_int(state, c"now", input.now as ffi::lua_Integer);
        set_str(state, c"current_host", &input.current_host);
        set_str(state, c"current_id", &input.current_id);
        ffi::lua_createtable(state, input.parents.len() as c_int, 0);
        for (i, parent) in input.parents.iter().enumerate() {
            push_json(state, parent);
            ffi::lua_rawseti(state, -2, i as ffi::lua_Integer + 1);
        }
        set(state, c"parents");
        ffi::lua_createtable(state, 0, input.actions.len() as c_int);
        for (id, action) in &input.actions {
            ffi::lua_pushinteger(state, *id as ffi::lua_Integer);
            push_json(state, action);
            ffi::lua_rawset(state, -3);
        }
        set(state, c"actions");
        // The runtime and peers tables were built (or reused) by the caller: arguments 2 and 1.
        ffi::lua_pushvalue(state, 2);
        set(state, c"runtime");
        ffi::lua_pushvalue(state, 1);
        set(state, c"peers");
        push_json(state, &input.metrics);
        set(state, c"metrics");
        if let Some(datacenters) = &input.datacenters {
            push_json(state, datacenters);
            set(state, c"datacenters");
        }
    }
}

/// The `state` table the scheduler function gets; `peers` is the table from [`peers_to_lua`],
/// `runtime` the one from [`json_to_lua`] of `input.runtime`.
pub(crate) fn input_to_lua(
    lua: &Lua,
    input: &SchedulerInput,
    peers: &Table,
    runtime: &Table,
) -> mlua::Result<Table> {
    // SAFETY: `exec_raw` runs the closure in a protected call on a valid state, with `peers` and
    // `runtime` as arguments 1 and 2; `push_input` leaves the state table above them: the
    // results are (peers, runtime, state).
    let (_, _, state): (Table, Table, Table) = unsafe {
        lua.exec_raw((peers.clone(), runtime.clone()), |state| {
            push_input(state, input)
        })?
    };
    Ok(state)
}

/// A Lua table of a JSON object (a non-object gives an empty table).
pub(crate) fn json_to_lua(lua: &Lua, value: &Value) -> mlua::Result<Table> {
    // SAFETY: as in `input_to_lua`; the closure leaves exactly one new table on the stack.
    unsafe {
        lua.exec_raw((), |state| {
            ffi::luaL_checkstack(state, 2, c"runtime".as_ptr());
            if value.is_object() {
                push_json(state, value);
            } else {
                ffi::lua_createtable(state, 0, 0);
            }
        })
    }
}

/// The `state.peers` table: peer id -> peer.
pub(crate) fn peers_to_lua(lua: &Lua, peers: &BTreeMap<NodeId, Peer>) -> mlua::Result<Table> {
    // SAFETY: as in `input_to_lua`; the closure leaves exactly the new table on the stack.
    unsafe {
        lua.exec_raw((), |state| {
            ffi::luaL_checkstack(state, 4, c"peers".as_ptr());
            ffi::lua_createtable(state, 0, peers.len().min(c_int::MAX as usize) as c_int);
            for (id, peer) in peers {
                push_str(state, id);
                push_peer(state, peer);
                ffi::lua_rawset(state, -3);
            }
        })
    }
}

/// The JSON form of `peers` as the scheduler sees it (no `null` fields), to check a reused
/// peers table against.
pub(crate) fn peers_as_seen(peers: &BTreeMap<NodeId, Peer>) -> Value {
    let mut out = Map::new();
    for (id, peer) in peers {
        let mut value = serde_json::to_value(peer).expect("a peer serializes");
        if let Value::Object(fields) = &mut value {
            fields.retain(|_, v| !v.is_null());
        }
        out.insert(id.clone(), value);
    }
    Value::Object(out)
}

/// Converts a Lua value to JSON within `budget`; a bad value's error names its path
/// (`roles.web[2]`).
pub(crate) fn lua_to_json(
    lua: &Lua,
    value: &mlua::Value,
    budget: Budget,
) -> Result<Value, ConvertError> {
    if !value.is_table() {
        return scalar_to_json(value).map_err(ConvertError::BadValue);
    }
    let mut result = Err(ConvertError::BadValue(String::new()));
    let mut meter = Meter::new(budget);
    // SAFETY: the table is pushed as the only argument (index 1); reading never raises.
    let pushed: mlua::Result<()> = unsafe {
        lua.exec_raw(value.clone(), |state| {
            result = read(state, 1, 0, &mut meter).map_err(|stop| match stop {
                Stop::Bad(bad) => ConvertError::BadValue(bad.message()),
                Stop::TooLarge => ConvertError::TooLarge {
                    limit: budget.bytes,
                },
                Stop::Timeout => ConvertError::Timeout,
            });
            ffi::lua_settop(state, 0);
        })
    };
    pushed.map_err(|e| ConvertError::BadValue(e.to_string()))?;
    result
}

fn scalar_to_json(value: &mlua::Value) -> Result<Value, String> {
    Ok(match value {
        mlua::Value::Nil => Value::Null,
        mlua::Value::Boolean(b) => Value::Bool(*b),
        mlua::Value::Integer(i) => Value::Number((*i).into()),
        mlua::Value::Number(f) => Value::Number(
            Number::from_f64(*f)
                .ok_or_else(|| format!("the returned value is {f}, which JSON cannot represent"))?,
        ),
        mlua::Value::String(s) => Value::String(
            s.to_str()
                .map_err(|_| "the returned value is a string that is not valid UTF-8".to_string())?
                .to_string(),
        ),
        other => {
            return Err(format!(
                "the returned value is {}, which JSON cannot represent",
                with_article(other.type_name())
            ));
        }
    })
}

/// A conversion error; the path of the bad value is collected while unwinding, so the common
/// case of no error builds no paths.
struct BadValue {
    /// Path segments, innermost first (`.web`, `[2]`).
    rev_path: Vec<String>,
    /// The problem, to follow the path (`is a function, which JSON cannot represent`).
    problem: String,
}

/// Why reading stopped: a bad value (with its path), or the budget.
enum Stop {
    Bad(BadValue),
    TooLarge,
    Timeout,
}

impl Stop {
    fn bad(problem: String) -> Stop {
        Stop::Bad(BadValue {
            rev_path: Vec::new(),
            problem,
        })
    }

    /// Adds a path segment while unwinding; the budget errors have no path.
    fn within(self, segment: String) -> Stop {
        match self {
            Stop::Bad(mut bad) => {
                bad.rev_path.push(segment);
                Stop::Bad(bad)
            }
            other => other,
        }
    }
}

impl BadValue {
    fn message(self) -> String {
        if self.rev_path.is_empty() {
            return format!("the returned value {}", self.problem);
        }
        let mut path = String::new();
        for (i, segment) in self.rev_path.iter().rev().enumerate() {
            if i == 0 {
                path.push_str(segment.trim_start_matches('.'));
            } else {
                path.push_str(segment);
            }
        }
        format!("{path} {}", self.problem)
    }
}

/// The string at `index` (which must be a string).
unsafe fn string_at<'a>(state: *mut ffi::lua_State, index: c_int) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: the value is a string, so `lua_tolstring` does not convert or allocate; the bytes
    // live as long as the value stays on the stack, which outlives every use here.
    unsafe {
        let ptr = ffi::lua_tolstring(state, index, &mut len);
        std::slice::from_raw_parts(ptr as *const u8, len)
    }
}

unsafe fn type_name_at(state: *mut ffi::lua_State, index: c_int) -> &'static str {
    match unsafe { ffi::lua_type(state, index) } {
        ffi::LUA_TNIL => "nil",
        ffi::LUA_TBOOLEAN => "boolean",
        ffi::LUA_TLIGHTUSERDATA | ffi::LUA_TUSERDATA => "userdata",
        ffi::LUA_TNUMBER => "number",
        ffi::LUA_TSTRING => "string",
        ffi::LUA_TTABLE => "table",
        ffi::LUA_TFUNCTION => "function",
        ffi::LUA_TTHREAD => "thread",
        _ => "value",
    }
}

/// Reads the value at absolute stack `index` into JSON, charging it to `meter`.
unsafe fn read(
    state: *mut ffi::lua_State,
    index: c_int,
    depth: usize,
    meter: &mut Meter,
) -> Result<Value, Stop> {
    meter.charge(VALUE_COST)?;
    unsafe {
        Ok(match ffi::lua_type(state, index) {
            ffi::LUA_TNIL => Value::Null,
            ffi::LUA_TBOOLEAN => Value::Bool(ffi::lua_toboolean(state, index) != 0),
            ffi::LUA_TNUMBER => {
                if ffi::lua_isinteger(state, index) != 0 {
                    Value::Number(ffi::lua_tointegerx(state, index, std::ptr::null_mut()).into())
                } else {
                    let f = ffi::lua_tonumberx(state, index, std::ptr::null_mut());
                    match Number::from_f64(f) {
                        Some(n) => Value::Number(n),
                        None => {
                            return Err(Stop::bad(format!("is {f}, which JSON cannot represent")));
                        }
                    }
                }
            }
            ffi::LUA_TSTRING => {
                let bytes = string_at(state, index);
                meter.charge(bytes.len())?;
                match std::str::from_utf8(bytes) {
                    Ok(s) => Value::String(s.to_string()),
                    Err(_) => return Err(Stop::bad("is a string that is not valid UTF-8".into())),
                }
            }
            ffi::LUA_TTABLE => read_table(state, index, depth, meter)?,
            _ => {
                let name = type_name_at(state, index);
                return Err(Stop::bad(format!(
                    "is {}, which JSON cannot represent",
                    with_article(name)
                )));
            }
        })
    }
}

unsafe fn read_table(
    state: *mut ffi::lua_State,
    index: c_int,
    depth: usize,
    meter: &mut Meter,
) -> Result<Value, Stop> {
    if depth > MAX_DEPTH {
        return Err(Stop::bad(format!(
            "is nested too deep (more than {MAX_DEPTH} tables; a table that contains itself?)"
        )));
    }
    unsafe {
        if ffi::lua_checkstack(state, 4) == 0 {
            return Err(Stop::bad("is nested too deep".into()));
        }
        let len = ffi::lua_rawlen(state, index);
        if len > 0 && is_sequence(state, index, len) {
            meter.fits(len.saturating_mul(VALUE_COST))?;
            let mut items = Vec::with_capacity(len);
            for i in 1..=len {
                ffi::lua_rawgeti(state, index, i as ffi::lua_Integer);
                let item = read(state, ffi::lua_gettop(state), depth + 1, meter);
                ffi::lua_pop(state, 1);
                items.push(item.map_err(|e| e.within(format!("[{i}]")))?);
            }
            return Ok(Value::Array(items));
        }
        // The first entries go into the map as they come; the rest of a large table is
        // gathered, sorted once and merged: inserting a thousand keys in the table's own order
        // one by one was a third of the conversion of a fleet's schedule.
        let mut map = Map::new();
        let mut more: Vec<(String, Value)> = Vec::new();
        ffi::lua_pushnil(state);
        while ffi::lua_next(state, index) != 0 {
            let top = ffi::lua_gettop(state);
            let key = match ffi::lua_type(state, top - 1) {
                ffi::LUA_TSTRING => match std::str::from_utf8(string_at(state, top - 1)) {
                    Ok(s) => s.to_string(),
                    Err(_) => {
                        ffi::lua_pop(state, 2);
                        return Err(Stop::bad("has a key that is not valid UTF-8".into()));
                    }
                },
                ffi::LUA_TNUMBER if ffi::lua_isinteger(state, top - 1) != 0 => {
                    ffi::lua_tointegerx(state, top - 1, std::ptr::null_mut()).to_string()
                }
                ffi::LUA_TNUMBER => {
                    ffi::lua_tonumberx(state, top - 1, std::ptr::null_mut()).to_string()
                }
                ffi::LUA_TBOOLEAN => (ffi::lua_toboolean(state, top - 1) != 0).to_string(),
                _ => {
                    let name = type_name_at(state, top - 1);
                    ffi::lua_pop(state, 2);
                    return Err(Stop::bad(format!(
                        "has {} key, which JSON cannot represent",
                        with_article(name)
                    )));
                }
            };
            let item = meter
                .charge(ENTRY_COST + key.len())
                .and_then(|()| read(state, top, depth + 1, meter));
            match item {
                Ok(item) if map.len() >= INSERT_AT_ONCE => more.push((key, item)),
                Ok(item) => match map.entry(key) {
                    serde_json::map::Entry::Vacant(slot) => {
                        slot.insert(item);
                    }
                    serde_json::map::Entry::Occupied(taken) => {
                        // `1` and `"1"` (or `true` and `"true"`) are two keys in Lua but one
                        // in JSON: keeping either would silently lose the other's value.
                        ffi::lua_pop(state, 2);
                        return Err(Stop::bad(two_keys(taken.key())));
                    }
                },
                Err(e) => {
                    ffi::lua_pop(state, 2);
                    return Err(e.within(format!(".{key}")));
                }
            }
            ffi::lua_pop(state, 1); // the value; the key stays for lua_next
        }
        if !more.is_empty() {
            more.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            let mut all: Vec<(String, Value)> = std::mem::take(&mut map).into_iter().collect();
            all.append(&mut more);
            // Two sorted runs: the stable sort merges them.
            all.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(pair) = all.windows(2).find(|pair| pair[0].0 == pair[1].0) {
                return Err(Stop::bad(two_keys(&pair[0].0)));
            }
            map = all.into_iter().collect();
        }
        Ok(Value::Object(map))
    }
}

/// The problem of a table with two keys that are one in JSON.
fn two_keys(key: &str) -> String {
    format!(
        "has two keys that both become {key:?} in JSON (a number or boolean key and a string key)"
    )
}

/// Whether the table at `index` has exactly the keys `1..=len`.
unsafe fn is_sequence(state: *mut ffi::lua_State, index: c_int, len: usize) -> bool {
    unsafe {
        let mut count = 0usize;
        ffi::lua_pushnil(state);
        while ffi::lua_next(state, index) != 0 {
            count += 1;
            let top = ffi::lua_gettop(state);
            let in_range = ffi::lua_isinteger(state, top - 1) != 0 && {
                let k = ffi::lua_tointegerx(state, top - 1, std::ptr::null_mut());
                k >= 1 && (k as u64) <= len as u64
            };
            ffi::lua_pop(state, 1);
            if !in_range || count > len {
                ffi::lua_pop(state, 1); // the key: stop the traversal
                return false;
            }
        }
        count == len
    }
}

/// `an integer`, `a function`: a Lua type name with its article, for messages.
pub(crate) fn with_article(type_name: &str) -> String {
    let article = if type_name.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {type_name}")
}
