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
use serde_json::{Map, Value};
use verwalter_placement::algorithms::Kind;
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
pub fn register(
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
    let arg = match args.into_iter().next() {
        Some(LuaValue::Table(t)) => t,
        other => {
            let got = other.as_ref().map_or("no value", |v| v.type_name());
            return Err(Fail::Error(format!(
                "expected a table argument (placement.{}{{...}}), got {got}",
                function.name().trim_start_matches("placement.")
            )));
        }
    };
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
            verwalter_placement::config::tag_of(&algorithm.kind)
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
            let nodes = placer.nodes();
            let mut placed: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
            for (app, on) in &chosen {
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
    };
    json_to_lua(lua, &result).map_err(Fail::Lua)
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

fn dim_of(path: &str, value: &Value) -> Result<Dim, String> {
    let name = string(path, value)?;
    dim(name).ok_or_else(|| {
        format!(
            "{path}: unknown dimension {name:?} (dimensions: {})",
            dim_names()
        )
    })
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
        let mut capacity = BTreeMap::new();
        let mut facts = NodeFacts::default();
        for (name, v) in keyed(&path, spec, "dimension names")? {
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
            let mut on = BTreeMap::new();
            for (app, n) in keyed(&path, apps, "app names")? {
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
                        count(&at, n)
                            .map_err(|_| expected(&at, "a count or a list of task names", n))?,
                    ),
                };
                on.insert(app.clone(), assigned);
            }
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

/// The algorithm names, as wca's config tags spell them.
const ALGORITHMS: [&str; 9] = [
    "NOPAlgorithm",
    "Fit",
    "BAR",
    "LeastUsed",
    "LeastUsedBAR",
    "HierBAR",
    "StaticAssigner",
    "DramHitRatioProvision",
    "Score",
];

/// The name `algorithm` takes for `kind`.
/// The parameters each algorithm takes besides `dimensions` and `max_node_score`.
fn parameters(kind: &str) -> &'static [&'static str] {
    match kind {
        "Fit" => &["cpu_scale_factor"],
        "BAR" => &["cpu_scale_factor", "bar_weights"],
        "LeastUsed" => &["cpu_scale_factor", "least_used_weights"],
        "LeastUsedBAR" => &[
            "cpu_scale_factor",
            "bar_weights",
            "least_used_weights",
            "least_used_weight",
        ],
        "HierBAR" => &[
            "cpu_scale_factor",
            "bar_weights",
            "least_used_weights",
            "least_used_weight",
            "merge_threshold",
        ],
        "StaticAssigner" => &["targeted_assigned_apps_counts"],
        "DramHitRatioProvision" => &["threshold"],
        "Score" => &[
            "cpu_scale_factor",
            "threshold",
            "score_target",
            "strict_mode_placement",
        ],
        _ => &[],
    }
}

/// `algorithm = "Fit"` or `algorithm = {kind = "Fit", ...}`, with wca's parameter names and the
/// config loader's defaults.
fn read_algorithm(value: &Value) -> Result<Algorithm, String> {
    let empty = Map::new();
    let (kind, params, path) = match value {
        Value::String(kind) => (kind.as_str(), &empty, "algorithm"),
        Value::Object(map) => match map.get("kind") {
            Some(kind) => (string("algorithm.kind", kind)?, map, "algorithm"),
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
    if !ALGORITHMS.contains(&kind) {
        let at = if value.is_string() {
            path.to_string()
        } else {
            format!("{path}.kind")
        };
        return Err(format!(
            "{at}: unknown algorithm {kind:?} (algorithms: {})",
            ALGORITHMS.join(", ")
        ));
    }
    let own = parameters(kind);
    for name in params.keys() {
        if name != "kind"
            && name != "dimensions"
            && name != "max_node_score"
            && !own.contains(&name.as_str())
        {
            let mut all = vec!["dimensions", "max_node_score"];
            all.extend(own);
            return Err(format!(
                "algorithm.{name}: {kind} has no such parameter (parameters: {})",
                all.join(", ")
            ));
        }
    }
    let get = |name: &str| params.get(name);
    let at = |name: &str| format!("algorithm.{name}");
    let float_or = |name: &str, default: f64| -> Result<f64, String> {
        get(name).map_or(Ok(default), |v| number(&at(name), v))
    };
    let weights = |name: &str| -> Result<BTreeMap<Dim, f64>, String> {
        get(name).map_or(Ok(BTreeMap::new()), |v| dim_map(&at(name), v))
    };
    let optional = |name: &str| -> Result<Option<f64>, String> {
        get(name).map(|v| number(&at(name), v)).transpose()
    };
    let cpu_scale_factor = float_or("cpu_scale_factor", 1.0)?;
    let threshold = float_or("threshold", 0.97)?;
    let least_used_weight = float_or("least_used_weight", 1.0)?;
    let kind = match kind {
        "NOPAlgorithm" => Kind::Nop,
        "Fit" => Kind::Fit { cpu_scale_factor },
        "BAR" => Kind::Bar {
            cpu_scale_factor,
            bar_weights: weights("bar_weights")?,
        },
        "LeastUsed" => Kind::LeastUsed {
            cpu_scale_factor,
            least_used_weights: weights("least_used_weights")?,
        },
        "LeastUsedBAR" => Kind::LeastUsedBar {
            cpu_scale_factor,
            bar_weights: weights("bar_weights")?,
            least_used_weights: weights("least_used_weights")?,
            least_used_weight,
        },
        "HierBAR" => Kind::HierBar {
            cpu_scale_factor,
            bar_weights: weights("bar_weights")?,
            least_used_weights: weights("least_used_weights")?,
            least_used_weight,
            merge_threshold: optional("merge_threshold")?,
        },
        "StaticAssigner" => {
            let name = "targeted_assigned_apps_counts";
            let Some(targets) = get(name) else {
                return Err(format!(
                    "algorithm.{name} is missing (StaticAssigner needs it)"
                ));
            };
            let mut out = BTreeMap::new();
            for (node, apps) in keyed(&at(name), targets, "node names")? {
                let path = format!("{}{}", at(name), key(node));
                let mut counts = BTreeMap::new();
                for (app, n) in keyed(&path, apps, "app names")? {
                    counts.insert(app.clone(), count(&format!("{path}{}", key(app)), n)?);
                }
                out.insert(node.clone(), counts);
            }
            Kind::StaticAssigner {
                targeted_assigned_apps_counts: out,
            }
        }
        "DramHitRatioProvision" => Kind::DramHitRatioProvision { threshold },
        "Score" => Kind::Score {
            cpu_scale_factor,
            threshold,
            score_target: optional("score_target")?,
            strict_mode_placement: match get("strict_mode_placement") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(expected(&at("strict_mode_placement"), "a boolean", other));
                }
            },
        },
        _ => unreachable!("checked against ALGORITHMS"),
    };
    let mut algorithm = Algorithm::new(kind);
    if let Some(dims) = get("dimensions") {
        algorithm.dimensions = list(&at("dimensions"), dims)?
            .iter()
            .enumerate()
            .map(|(i, d)| dim_of(&format!("algorithm.dimensions[{}]", i + 1), d))
            .collect::<Result<_, _>>()?;
    }
    if let Some(score) = get("max_node_score") {
        algorithm.max_node_score = number(&at("max_node_score"), score)?;
    }
    Ok(algorithm)
}

#[cfg(test)]
mod tests;
