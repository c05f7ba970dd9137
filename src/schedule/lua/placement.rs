//! The `placement` table of the scheduler sandbox: wca-scheduler's algorithms
//! (`verwalter-placement`) as pure functions over tables the script passes in.
//!
//! - `placement.filter{...}`: which nodes may take one more instance of `app`, and why the others
//!   may not: `{nodes = {"n1", ...}, failed = {n2 = "reason"}}`.
//! - `placement.prioritize{...}`: each candidate's integer score: `{n1 = 7, n2 = 10}`.
//! - `placement.place{...}`: places `count` instances of `app` (or each entry of `instances`) one
//!   after another, each counted before the next: `{placed, chosen, unplaced, failed}`.
//!
//! The argument table is converted with the metered `lua_to_json` (memory cap, deadline) and then
//! read with errors naming the argument's path (`nodes["n1"].cpu: expected a number, got
//! string`). The placement itself runs in [`Placer`], which asks the deadline every 1,024 steps:
//! a Rust function holds the thread where the watchdog's hook cannot reach, so it must stop
//! itself. Errors are raised as strings located at the calling line, through the same C wrapper
//! as the pattern functions; the time budget error cannot be caught with `pcall`.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

use mlua::{Lua, MultiValue, Table, Value as LuaValue};
use serde::Deserialize;
use serde::de::{self, IntoDeserializer, Visitor};
use serde_json::{Map, Value};
use verwalter_placement::algorithms::Kind;
use verwalter_placement::config;
use verwalter_placement::placer::{PlaceError, Placed};
use verwalter_placement::snapshot::{Assigned, Dim, NodeFacts, NodeType, Snapshot};
use verwalter_placement::{Algorithm, PlacementError, Placer};

use super::convert::{Budget, ConvertError, json_to_lua, lua_to_json};
use super::watchdog::TIMEOUT_MARK;

/// What a placement is counted as against the memory cap while it runs: its entry in `chosen`
/// and in `placed` once it is a Lua table.
const PLACEMENT_COST: usize = 48;

/// What one refusal reason is counted as besides its text and the node's name.
const REASON_COST: usize = 64;

/// Why a call failed.
enum Fail {
    /// A bad argument: raised located at the calling line.
    Error(String),
    /// The run's deadline passed.
    Timeout,
    /// The result would not fit under the memory cap.
    Memory,
    /// An error from Lua itself (building the result ran out of memory).
    Lua(mlua::Error),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Function {
    Filter,
    Prioritize,
    Place,
}

impl Function {
    fn name(self) -> &'static str {
        match self {
            Function::Filter => "placement.filter",
            Function::Prioritize => "placement.prioritize",
            Function::Place => "placement.place",
        }
    }

    fn keys(self) -> &'static [&'static str] {
        match self {
            Function::Filter | Function::Prioritize => &[
                "algorithm",
                "nodes",
                "apps",
                "running",
                "profiles",
                "candidates",
                "app",
            ],
            Function::Place => &[
                "algorithm",
                "nodes",
                "apps",
                "running",
                "profiles",
                "candidates",
                "app",
                "count",
                "instances",
                "max_per_node",
            ],
        }
    }
}

/// The `placement` table, its functions bound to the run's deadline and the memory cap.
pub(crate) fn register(
    lua: &Lua,
    deadline: &Rc<Cell<Instant>>,
    memory_limit: usize,
) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    for (key, function) in [
        ("filter", Function::Filter),
        ("prioritize", Function::Prioritize),
        ("place", Function::Place),
    ] {
        let deadline = deadline.clone();
        let f = lua.create_function(move |lua, args: MultiValue| {
            let outcome = call(lua, function, args, deadline.get(), memory_limit);
            let (message, level) = match outcome {
                Ok(table) => return Ok(MultiValue::from_vec(vec![LuaValue::Table(table)])),
                Err(Fail::Error(message)) => (format!("{}: {message}", function.name()), 2),
                Err(Fail::Timeout) => (TIMEOUT_MARK.to_string(), 0),
                Err(Fail::Memory) => (
                    format!(
                        "not enough memory: the result of {} would not fit in the scheduler's memory limit",
                        function.name()
                    ),
                    0,
                ),
                Err(Fail::Lua(e)) => return Err(e),
            };
            Ok(MultiValue::from_vec(vec![
                LuaValue::Boolean(false),
                LuaValue::String(lua.create_string(message)?),
                LuaValue::Integer(level),
            ]))
        })?;
        table.raw_set(key, super::pattern::checked(lua, f)?)?;
    }
    Ok(table)
}

fn call(
    lua: &Lua,
    function: Function,
    args: MultiValue,
    deadline: Instant,
    memory_limit: usize,
) -> Result<Table, Fail> {
    let arg = table_arg(function, args)?;
    let budget = Budget {
        bytes: memory_limit,
        deadline,
    };
    let value = lua_to_json(lua, &LuaValue::Table(arg), budget).map_err(|e| match e {
        ConvertError::BadValue(message) => Fail::Error(message),
        ConvertError::TooLarge { .. } => Fail::Memory,
        ConvertError::Timeout => Fail::Timeout,
    })?;
    let args = read_args(function, &value).map_err(Fail::Error)?;
    // What the result may take: the memory cap less what the state holds now.
    let room = memory_limit.saturating_sub(lua.used_memory());
    let stopped = Cell::new(None);
    let held = Cell::new(0usize);
    let mut check = |progress: Placed| {
        if Instant::now() > deadline {
            stopped.set(Some(Fail::Timeout));
            return false;
        }
        let bytes = (progress.placed as usize)
            .saturating_mul(PLACEMENT_COST)
            .saturating_add(held.get());
        if bytes > room {
            stopped.set(Some(Fail::Memory));
            return false;
        }
        true
    };
    let Args {
        algorithm,
        snapshot,
        candidates,
        app,
        instances,
        max_per_node,
    } = args;
    let failure = |e: PlaceError| match e {
        PlaceError::Placement(PlacementError::UnknownApp { app }) => Fail::Error(format!(
            "apps{} is missing: {} needs the app's request",
            key(&app),
            config::tag_of(&algorithm.kind)
        )),
        PlaceError::Stopped => stopped.take().unwrap_or(Fail::Timeout),
    };
    let mut placer = Placer::new(&algorithm, snapshot, &candidates);
    let result = match function {
        Function::Filter => {
            let app = app.expect("read_args requires app");
            let filtered = placer.filter(&app, &mut check).map_err(failure)?;
            serde_json::json!({"nodes": filtered.nodes, "failed": filtered.failed})
        }
        Function::Prioritize => {
            let app = app.expect("read_args requires app");
            let scores = placer.prioritize(&app, &mut check).map_err(failure)?;
            Value::Object(
                scores
                    .into_iter()
                    .map(|(node, score)| (node, Value::from(score)))
                    .collect(),
            )
        }
        Function::Place => {
            let mut chosen: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            let mut unplaced: BTreeMap<String, u64> = BTreeMap::new();
            let mut failed: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
            for (app, count) in &instances {
                let placement = placer
                    .place(app, *count, max_per_node, &mut check)
                    .map_err(failure)?;
                chosen
                    .entry(app.clone())
                    .or_default()
                    .extend(placement.chosen);
                if placement.unplaced > 0 {
                    *unplaced.entry(app.clone()).or_default() += placement.unplaced;
                }
                // Only an app's last reasons are kept; they count against the cap meanwhile.
                let size = |reasons: &BTreeMap<String, String>| {
                    reasons
                        .iter()
                        .map(|(n, r)| n.len() + r.len() + REASON_COST)
                        .sum::<usize>()
                };
                let new = size(&placement.failed);
                let old = failed
                    .insert(app.clone(), placement.failed)
                    .map_or(0, |r| size(&r));
                held.set(held.get() + new - old);
                if !check(Placed {
                    placed: chosen.values().map(|c| c.len() as u64).sum(),
                }) {
                    return Err(stopped.take().unwrap_or(Fail::Timeout));
                }
            }
            place_result(placer.nodes(), &chosen, &unplaced, failed)
        }
    };
    json_to_lua(lua, &result).map_err(Fail::Lua)
}

/// A `placement.*` call's one argument, which is a table.
fn table_arg(function: Function, args: MultiValue) -> Result<Table, Fail> {
    match args.into_iter().next() {
        Some(LuaValue::Table(t)) => Ok(t),
        other => {
            let got = other.as_ref().map_or("no value", |v| v.type_name());
            Err(Fail::Error(format!(
                "expected a table argument (placement.{}{{...}}), got {got}",
                function.name().trim_start_matches("placement.")
            )))
        }
    }
}

/// `placement.place`'s result: the instances `chosen` per app (indexes into `nodes`), counted
/// per node as `placed`, with what stayed `unplaced` and the apps' last reasons (`failed`, the
/// empty ones left out).
fn place_result(
    nodes: &[String],
    chosen: &BTreeMap<String, Vec<usize>>,
    unplaced: &BTreeMap<String, u64>,
    mut failed: BTreeMap<String, BTreeMap<String, String>>,
) -> Value {
    let mut placed: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for (app, on) in chosen {
        for i in on {
            *placed
                .entry(nodes[*i].as_str())
                .or_default()
                .entry(app.as_str())
                .or_default() += 1;
        }
    }
    let chosen: BTreeMap<&String, Vec<&str>> = chosen
        .iter()
        .map(|(app, on)| (app, on.iter().map(|i| nodes[*i].as_str()).collect()))
        .collect();
    failed.retain(|_, reasons| !reasons.is_empty());
    serde_json::json!({
        "placed": placed,
        "chosen": chosen,
        "unplaced": unplaced,
        "failed": failed,
    })
}

/// A `placement.*` call's argument, read.
struct Args {
    algorithm: Algorithm,
    snapshot: Snapshot,
    candidates: Vec<String>,
    /// `app` of filter and prioritize.
    app: Option<String>,
    /// place: the apps to place, with their counts, in order.
    instances: Vec<(String, u64)>,
    max_per_node: Option<u64>,
}

/// The Lua type a JSON value came from, for messages.
fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "nil",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) | Value::Object(_) => "table",
    }
}

/// `["n1"]`: a name as a path segment.
fn key(name: &str) -> String {
    format!("[{name:?}]")
}

fn expected(path: &str, what: &str, got: &Value) -> String {
    format!("{path}: expected {what}, got {}", type_of(got))
}

fn number(path: &str, value: &Value) -> Result<f64, String> {
    value
        .as_f64()
        .ok_or_else(|| expected(path, "a number", value))
}

/// A whole number ≥ 0 (`3` or `3.0`, as Lua's own functions take it).
fn count(path: &str, value: &Value) -> Result<u64, String> {
    if let Some(n) = value.as_u64() {
        return Ok(n);
    }
    match value.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64 => Ok(f as u64),
        Some(f) => Err(format!(
            "{path}: expected a whole number of 0 or more, got {f}"
        )),
        None => Err(expected(path, "a whole number", value)),
    }
}

fn string<'v>(path: &str, value: &'v Value) -> Result<&'v str, String> {
    value
        .as_str()
        .ok_or_else(|| expected(path, "a string", value))
}

/// A table keyed by names (an empty Lua table is one too).
fn keyed<'v>(
    path: &str,
    value: &'v Value,
    keyed_by: &str,
) -> Result<&'v Map<String, Value>, String> {
    match value {
        Value::Object(map) => Ok(map),
        Value::Array(_) => Err(format!(
            "{path}: expected a table keyed by {keyed_by}, got a list"
        )),
        other => Err(expected(
            path,
            &format!("a table keyed by {keyed_by}"),
            other,
        )),
    }
}

/// A list (an empty Lua table is one too).
fn list<'v>(path: &str, value: &'v Value) -> Result<&'v [Value], String> {
    match value {
        Value::Array(items) => Ok(items),
        Value::Object(map) if map.is_empty() => Ok(&[]),
        Value::Object(_) => Err(format!(
            "{path}: expected a list, got a table with other keys than 1..n"
        )),
        other => Err(expected(path, "a list", other)),
    }
}

const DIMS: [Dim; 6] = [
    Dim::Cpu,
    Dim::Mem,
    Dim::MembwRead,
    Dim::MembwWrite,
    Dim::MembwFlat,
    Dim::Wss,
];

fn dim(name: &str) -> Option<Dim> {
    DIMS.into_iter().find(|d| d.name() == name)
}

fn dim_names() -> String {
    DIMS.map(|d| d.name()).join(", ")
}

/// `{dim = number}`.
fn dim_map(path: &str, value: &Value) -> Result<BTreeMap<Dim, f64>, String> {
    let mut out = BTreeMap::new();
    for (name, v) in keyed(path, value, "dimension names")? {
        let at = format!("{path}.{name}");
        let d = dim(name)
            .ok_or_else(|| format!("{at}: unknown dimension (dimensions: {})", dim_names()))?;
        out.insert(d, number(&at, v)?);
    }
    Ok(out)
}

fn read_args(function: Function, value: &Value) -> Result<Args, String> {
    let top = keyed("argument", value, "argument names")?;
    let known = function.keys();
    for name in top.keys() {
        if !known.contains(&name.as_str()) {
            return Err(format!(
                "unknown argument `{name}` (arguments: {})",
                known.join(", ")
            ));
        }
    }
    let field = |name: &str| top.get(name);
    let algorithm = match field("algorithm") {
        Some(v) => read_algorithm(v)?,
        None => return Err("argument `algorithm` is missing".into()),
    };
    let mut snapshot = Snapshot::default();
    let Some(nodes) = field("nodes") else {
        return Err("argument `nodes` is missing".into());
    };
    for (node, spec) in keyed("nodes", nodes, "node names")? {
        let path = format!("nodes{}", key(node));
        let (capacity, facts) = read_node(&path, spec)?;
        snapshot.node_capacities.insert(node.clone(), capacity);
        if facts != NodeFacts::default() {
            snapshot.nodes.insert(node.clone(), facts);
        }
    }
    if let Some(apps) = field("apps") {
        for (app, spec) in keyed("apps", apps, "app names")? {
            let path = format!("apps{}", key(app));
            snapshot
                .apps_spec
                .insert(app.clone(), dim_map(&path, spec)?);
        }
    }
    if let Some(running) = field("running") {
        for (node, apps) in keyed("running", running, "node names")? {
            let path = format!("running{}", key(node));
            let on = read_running_on(&path, apps)?;
            snapshot.assigned_apps.insert(node.clone(), on);
        }
    }
    if let Some(profiles) = field("profiles") {
        for (app, p) in keyed("profiles", profiles, "app names")? {
            let at = format!("profiles{}", key(app));
            snapshot.app_profiles.insert(app.clone(), number(&at, p)?);
        }
    }
    let candidates = match field("candidates") {
        Some(v) => list("candidates", v)?
            .iter()
            .enumerate()
            .map(|(i, n)| string(&format!("candidates[{}]", i + 1), n).map(String::from))
            .collect::<Result<_, _>>()?,
        None => snapshot.node_capacities.keys().cloned().collect(),
    };
    let app = field("app")
        .map(|v| string("app", v).map(String::from))
        .transpose()?;
    let mut instances = Vec::new();
    let mut max_per_node = None;
    if function == Function::Place {
        match (&app, field("instances")) {
            (Some(_), Some(_)) => {
                return Err("give either `app` (with `count`) or `instances`, not both".into());
            }
            (Some(app), None) => {
                let n = field("count").map(|v| count("count", v)).transpose()?;
                instances.push((app.clone(), n.unwrap_or(1)));
            }
            (None, Some(list_value)) => {
                if field("count").is_some() {
                    return Err(
                        "`count` goes with `app`; with `instances`, each entry has its own".into(),
                    );
                }
                instances = read_instances(list_value)?;
            }
            (None, None) => {
                return Err("give `app` (with `count`) or `instances`".into());
            }
        }
        max_per_node = field("max_per_node")
            .map(|v| count("max_per_node", v))
            .transpose()?;
    } else if app.is_none() {
        return Err("argument `app` is missing".into());
    }
    Ok(Args {
        algorithm,
        snapshot,
        candidates,
        app,
        instances,
        max_per_node,
    })
}

/// `nodes[name] = {dim = number, ..., node_type = "pmem" | "dram", platform_dram_hit_ratio =
/// number}` at `path`: the node's capacity and its facts.
fn read_node(path: &str, spec: &Value) -> Result<(BTreeMap<Dim, f64>, NodeFacts), String> {
    let mut capacity = BTreeMap::new();
    let mut facts = NodeFacts::default();
    for (name, v) in keyed(path, spec, "dimension names")? {
        let at = format!("{path}.{name}");
        match name.as_str() {
            "platform_dram_hit_ratio" => facts.platform_dram_hit_ratio = Some(number(&at, v)?),
            "node_type" => {
                facts.node_type = Some(match string(&at, v)? {
                    "pmem" => NodeType::Pmem,
                    "dram" => NodeType::Dram,
                    other => {
                        return Err(format!(
                            "{at}: expected \"pmem\" or \"dram\", got {other:?}"
                        ));
                    }
                })
            }
            _ => {
                let d = dim(name).ok_or_else(|| {
                    format!(
                        "{at}: unknown key (dimensions: {}; facts: node_type, platform_dram_hit_ratio)",
                        dim_names()
                    )
                })?;
                capacity.insert(d, number(&at, v)?);
            }
        }
    }
    Ok((capacity, facts))
}

/// `running[node] = {app = count or {task name, ...}}` at `path`: what runs on one node.
fn read_running_on(path: &str, apps: &Value) -> Result<BTreeMap<String, Assigned>, String> {
    let mut on = BTreeMap::new();
    for (app, n) in keyed(path, apps, "app names")? {
        let at = format!("{path}{}", key(app));
        let assigned = match n {
            Value::Array(_) | Value::Object(_) => {
                let tasks = list(&at, n)?
                    .iter()
                    .enumerate()
                    .map(|(i, t)| string(&format!("{at}[{}]", i + 1), t).map(String::from))
                    .collect::<Result<_, _>>()?;
                Assigned::Tasks(tasks)
            }
            _ => Assigned::Count(
                count(&at, n).map_err(|_| expected(&at, "a count or a list of task names", n))?,
            ),
        };
        on.insert(app.clone(), assigned);
    }
    Ok(on)
}

/// place's `instances = {{app = "a", count = n}, ...}`: the apps with their counts (1 when
/// left out), in order.
fn read_instances(list_value: &Value) -> Result<Vec<(String, u64)>, String> {
    let mut instances = Vec::new();
    for (i, entry) in list("instances", list_value)?.iter().enumerate() {
        let path = format!("instances[{}]", i + 1);
        let entry = keyed(&path, entry, "`app` and `count`")?;
        for name in entry.keys() {
            if name != "app" && name != "count" {
                return Err(format!(
                    "{path}.{name}: unknown key (an entry has `app` and `count`)"
                ));
            }
        }
        let app = match entry.get("app") {
            Some(v) => string(&format!("{path}.app"), v)?.to_string(),
            None => return Err(format!("{path}.app is missing")),
        };
        let n = entry
            .get("count")
            .map(|v| count(&format!("{path}.count"), v))
            .transpose()?;
        instances.push((app, n.unwrap_or(1)));
    }
    Ok(instances)
}

/// `algorithm = "Fit"` or `algorithm = {kind = "Fit", ...}`, with wca's tags and parameter names,
/// read through [`Algorithm`]'s serde definition (its names, defaults and required fields); the
/// errors name the bad field's path (`algorithm.bar_weights.disk`) in Lua's words.
fn read_algorithm(value: &Value) -> Result<Algorithm, String> {
    let empty = Map::new();
    let (tag, params) = match value {
        Value::String(tag) => (tag.as_str(), &empty),
        Value::Object(map) => match map.get("kind") {
            Some(tag) => (string("algorithm.kind", tag)?, map),
            None => return Err("algorithm.kind is missing".into()),
        },
        other => {
            return Err(expected(
                "algorithm",
                "an algorithm name or a table with `kind`",
                other,
            ));
        }
    };
    // Only the tags themselves: the YAML config's older names (`FitGeneric`) are not taken here.
    let Some(variant) = config::kind_variant_of(tag) else {
        let at = if value.is_string() {
            "algorithm"
        } else {
            "algorithm.kind"
        };
        return Err(format!(
            "{at}: unknown algorithm {tag:?} (algorithms: {})",
            config::algorithm_tags().join(", ")
        ));
    };
    let common = Algorithm::common_parameters();
    let own = Kind::parameters(variant);
    for name in params.keys() {
        if name != "kind" && !common.contains(&name.as_str()) && !own.contains(&name.as_str()) {
            let all: Vec<&str> = common.iter().chain(own).copied().collect();
            return Err(format!(
                "algorithm.{name}: {tag} has no such parameter (parameters: {})",
                all.join(", ")
            ));
        }
    }
    // The shape serde reads: the common parameters beside `kind`, the algorithm's own inside it
    // under its variant's name (`{dimensions = ..., kind = {Bar = {bar_weights = ...}}}`).
    let mut outer = Map::new();
    let mut inner = Map::new();
    for (name, v) in params {
        if common.contains(&name.as_str()) {
            outer.insert(name.clone(), v.clone());
        } else if name != "kind" {
            inner.insert(name.clone(), v.clone());
        }
    }
    outer.insert(
        "kind".into(),
        Value::Object(Map::from_iter([(
            variant.to_string(),
            Value::Object(inner),
        )])),
    );
    let outer = Value::Object(outer);
    Algorithm::deserialize(Read::new(&outer, "algorithm")).map_err(|e| match e {
        ReadError::Missing { at } => format!("{at} is missing ({tag} needs it)"),
        other => other.located("algorithm"),
    })
}

// ---------------------------------------------------------------------------------------------
// A Lua table (as JSON) read by serde's derived code, with Lua's words in the errors.

/// Why a table could not be read.
#[derive(Debug)]
enum ReadError {
    /// The whole message, its path included.
    Done(String),
    /// A required field is absent: its path.
    Missing { at: String },
    /// Raised by derived code for a required field; the table being read adds its path.
    MissingField(&'static str),
    /// Raised by derived code for a name that is not one of `names` (a dimension).
    UnknownName {
        name: String,
        names: &'static [&'static str],
    },
    /// A key type told what a table is keyed by (see [`NotKeyed`]).
    KeyedBy(&'static str),
    /// Raised by derived code otherwise; the value being read adds its path.
    Other(String),
}

impl ReadError {
    /// The message, with `path` where the error does not have one yet.
    fn located(self, path: &str) -> String {
        match self {
            ReadError::Done(message) => message,
            ReadError::Missing { at } => format!("{at} is missing"),
            ReadError::MissingField(field) => format!("{path}.{field} is missing"),
            ReadError::UnknownName { name, names } => {
                format!(
                    "{path}: unknown dimension {name:?} (dimensions: {})",
                    names.join(", ")
                )
            }
            ReadError::KeyedBy(what) => format!("{path}: expected a table keyed by {what}"),
            ReadError::Other(message) => format!("{path}: {message}"),
        }
    }

    /// The error with `path` fixed in it (a missing field stays apart for its caller's words).
    fn at(self, path: &str) -> ReadError {
        match self {
            ReadError::Missing { .. } => self,
            ReadError::MissingField(field) => ReadError::Missing {
                at: format!("{path}.{field}"),
            },
            other => ReadError::Done(other.located(path)),
        }
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for ReadError {}

impl de::Error for ReadError {
    fn custom<T: std::fmt::Display>(message: T) -> ReadError {
        ReadError::Other(message.to_string())
    }
    fn missing_field(field: &'static str) -> ReadError {
        ReadError::MissingField(field)
    }
    fn unknown_variant(name: &str, names: &'static [&'static str]) -> ReadError {
        ReadError::UnknownName {
            name: name.to_string(),
            names,
        }
    }
}

/// One value of the table at `path`.
struct Read<'v> {
    value: &'v Value,
    path: String,
    /// Where `path` ended before its last segment: a tagged table's parameters sit beside its
    /// tag in Lua (`{kind = "Fit", cpu_scale_factor = 2}`), so they are named from there.
    parent: usize,
    /// How many tables keyed by names (not dimensions) are around it: node names, then app
    /// names (`targeted_assigned_apps_counts`).
    by_names: usize,
}

impl<'v> Read<'v> {
    fn new(value: &'v Value, path: &str) -> Read<'v> {
        Read {
            value,
            path: path.to_string(),
            parent: path.len(),
            by_names: 0,
        }
    }

    /// A value inside this one, at `path`.
    fn child(&self, value: &'v Value, path: String, by_names: usize) -> Read<'v> {
        Read {
            value,
            path,
            parent: self.path.len(),
            by_names,
        }
    }

    fn done<T>(&self, result: Result<T, String>) -> Result<T, ReadError> {
        result.map_err(ReadError::Done)
    }

    /// An error of this value's visitor, with this value's path.
    fn locate<T>(&self, result: Result<T, ReadError>) -> Result<T, ReadError> {
        result.map_err(|e| e.at(&self.path))
    }
}

macro_rules! numbers {
    ($($method:ident => $visit:ident($read:ident)),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
            let n = self.done($read(&self.path, self.value))?;
            self.locate(visitor.$visit(n))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Read<'_> {
    type Error = ReadError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        let result = match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => visitor.visit_u64(u),
                (None, Some(i)) => visitor.visit_i64(i),
                (None, None) => visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => visitor.visit_str(s),
            Value::Array(_) => return self.deserialize_seq(visitor),
            Value::Object(_) => return self.deserialize_map(visitor),
        };
        self.locate(result)
    }

    numbers! {
        deserialize_f64 => visit_f64(number),
        deserialize_f32 => visit_f64(number),
        deserialize_u64 => visit_u64(count),
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        match self.value {
            Value::Bool(b) => self.locate(visitor.visit_bool(*b)),
            other => Err(ReadError::Done(expected(&self.path, "a boolean", other))),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        let s = self.done(string(&self.path, self.value))?;
        self.locate(visitor.visit_str(s))
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_str(visitor)
    }

    // A Lua table holds no nil: a value that is there is `Some`.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_some(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        let items = self.done(list(&self.path, self.value))?;
        self.locate(visitor.visit_seq(SeqRead {
            items: items.iter(),
            at: 0,
            of: &self,
        }))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        let result = match self.value {
            Value::Object(map) => visitor.visit_map(MapRead::new(&self, map.iter().collect())),
            // What the table should be keyed by, the map's key type tells: ask it.
            _ => visitor.visit_map(NotKeyed { of: &self }),
        };
        self.locate(result)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        let Value::Object(map) = self.value else {
            return Err(ReadError::Done(expected(&self.path, "a table", self.value)));
        };
        // In the order the fields are declared: the first bad one is named.
        let entries = fields
            .iter()
            .filter_map(|f| map.get_key_value(*f))
            .collect();
        self.locate(visitor.visit_map(MapRead::new(&self, entries)))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        let result = match self.value {
            Value::String(name) => visitor.visit_enum(
                IntoDeserializer::<ReadError>::into_deserializer(name.as_str()),
            ),
            // `{Variant = {parameters}}`, built by `read_algorithm`.
            Value::Object(map) if map.len() == 1 => {
                let (variant, params) = map.iter().next().expect("one entry");
                let parent = &self.path[..self.parent];
                visitor.visit_enum(VariantRead {
                    variant,
                    params: Read {
                        value: params,
                        path: parent.to_string(),
                        parent: parent.len(),
                        by_names: self.by_names,
                    },
                })
            }
            other => Err(ReadError::Done(expected(&self.path, "a string", other))),
        };
        self.locate(result)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u128 char bytes byte_buf unit unit_struct
        newtype_struct tuple tuple_struct identifier ignored_any
    }
}

/// The items of a list: `path[1]`, `path[2]`, ...
struct SeqRead<'v, 'o> {
    items: std::slice::Iter<'v, Value>,
    at: usize,
    of: &'o Read<'v>,
}

impl<'de> de::SeqAccess<'de> for SeqRead<'_, '_> {
    type Error = ReadError;

    fn next_element_seed<S: de::DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, ReadError> {
        let Some(item) = self.items.next() else {
            return Ok(None);
        };
        self.at += 1;
        let path = format!("{}[{}]", self.of.path, self.at);
        // Each value locates its own errors.
        seed.deserialize(self.of.child(item, path, self.of.by_names))
            .map(Some)
    }
}

/// How a key reads: a field or a dimension (`path.key`), or a name (`path["key"]`).
#[derive(Clone, Copy, PartialEq)]
enum KeyRead {
    Field,
    Dimension,
    Name,
}

/// The entries of a table, keys read through [`Key`].
struct MapRead<'v, 'o> {
    entries: std::vec::IntoIter<(&'v String, &'v Value)>,
    value: Option<&'v Value>,
    key: &'v str,
    read: KeyRead,
    of: &'o Read<'v>,
}

impl<'v, 'o> MapRead<'v, 'o> {
    fn new(of: &'o Read<'v>, entries: Vec<(&'v String, &'v Value)>) -> MapRead<'v, 'o> {
        MapRead {
            entries: entries.into_iter(),
            value: None,
            key: "",
            read: KeyRead::Field,
            of,
        }
    }
}

impl<'de> de::MapAccess<'de> for MapRead<'_, '_> {
    type Error = ReadError;

    fn next_key_seed<S: de::DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, ReadError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        self.key = key;
        let read = std::cell::Cell::new(KeyRead::Field);
        let k = seed
            .deserialize(Key { key, read: &read })
            .map_err(|e| match e {
                ReadError::UnknownName { names, .. } => ReadError::Done(format!(
                    "{}.{key}: unknown dimension (dimensions: {})",
                    self.of.path,
                    names.join(", ")
                )),
                other => other,
            })?;
        self.read = read.get();
        Ok(Some(k))
    }

    fn next_value_seed<S: de::DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, ReadError> {
        let value = self.value.take().expect("a key before its value");
        let of = self.of;
        let (path, by_names) = match self.read {
            KeyRead::Field | KeyRead::Dimension => {
                (format!("{}.{}", of.path, self.key), of.by_names)
            }
            KeyRead::Name => (format!("{}{}", of.path, key(self.key)), of.by_names + 1),
        };
        seed.deserialize(of.child(value, path, by_names))
    }
}

/// A key of a table: tells [`MapRead`] how the key type read it.
struct Key<'k> {
    key: &'k str,
    read: &'k std::cell::Cell<KeyRead>,
}

impl<'de> de::Deserializer<'de> for Key<'_> {
    type Error = ReadError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.read.set(KeyRead::Name);
        visitor.visit_str(self.key)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.read.set(KeyRead::Field);
        visitor.visit_str(self.key)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        self.read.set(KeyRead::Dimension);
        visitor.visit_enum(IntoDeserializer::<ReadError>::into_deserializer(self.key))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct ignored_any
    }
}

/// A value read as a table keyed by names that is not one: its key type is asked what the names
/// are, for the message (dimension names; node names, then app names).
struct NotKeyed<'o, 'v> {
    of: &'o Read<'v>,
}

impl<'de> de::MapAccess<'de> for NotKeyed<'_, '_> {
    type Error = ReadError;

    fn next_key_seed<S: de::DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, ReadError> {
        let names = ["node names", "app names"];
        let what = match seed.deserialize(KeyType) {
            Err(ReadError::KeyedBy(what)) if !what.is_empty() => what,
            _ => names[self.of.by_names.min(names.len() - 1)],
        };
        // Only a value that is not a table keyed by names comes here: `keyed` refuses it.
        let message = keyed(&self.of.path, self.of.value, what)
            .err()
            .unwrap_or_else(|| format!("{}: expected a table keyed by {what}", self.of.path));
        Err(ReadError::Done(message))
    }

    fn next_value_seed<S: de::DeserializeSeed<'de>>(
        &mut self,
        _: S,
    ) -> Result<S::Value, ReadError> {
        Err(ReadError::Other("no value".into()))
    }
}

/// Tells what a key type reads: a dimension, or (`""`) a name.
struct KeyType;

impl<'de> de::Deserializer<'de> for KeyType {
    type Error = ReadError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ReadError> {
        Err(ReadError::KeyedBy(""))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, ReadError> {
        Err(ReadError::KeyedBy("dimension names"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}

/// A variant with its parameters: `{Variant = {parameters}}`.
struct VariantRead<'v> {
    variant: &'v str,
    params: Read<'v>,
}

impl<'de, 'v> de::EnumAccess<'de> for VariantRead<'v> {
    type Error = ReadError;
    type Variant = Read<'v>;

    fn variant_seed<S: de::DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Read<'v>), ReadError> {
        let variant = seed.deserialize(IntoDeserializer::<ReadError>::into_deserializer(
            self.variant,
        ))?;
        Ok((variant, self.params))
    }
}

impl<'de> de::VariantAccess<'de> for Read<'_> {
    type Error = ReadError;

    fn unit_variant(self) -> Result<(), ReadError> {
        // `read_algorithm` refused every parameter a unit variant does not take.
        Ok(())
    }

    fn newtype_variant_seed<S: de::DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<S::Value, ReadError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, ReadError> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

#[cfg(test)]
mod tests;
