//! Conversions between JSON and Lua values, with verwalter 0.13's mapping: `null` becomes `nil`
//! (the key disappears), action ids become integer keys; on the way back a table with keys
//! `1..n` is an array, any other table an object, and an empty table `{}`.

use mlua::{Lua, Table, Value as LuaValue};
use serde_json::{Map, Number, Value};
use verwalter_controllers::state::{Peer, SchedulerInput};

/// Nesting deeper than this is refused on the way back (self-referencing tables).
const MAX_DEPTH: usize = 200;

pub fn json_to_lua(lua: &Lua, value: &Value) -> mlua::Result<LuaValue> {
    Ok(match value {
        Value::Null => LuaValue::Nil,
        Value::Bool(b) => LuaValue::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => LuaValue::Integer(i),
            None => LuaValue::Number(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => LuaValue::String(lua.create_string(s)?),
        Value::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                if !item.is_null() {
                    table.raw_set(i + 1, json_to_lua(lua, item)?)?;
                }
            }
            LuaValue::Table(table)
        }
        Value::Object(map) => {
            let table = lua.create_table_with_capacity(0, map.len())?;
            for (key, item) in map {
                if !item.is_null() {
                    table.raw_set(key.as_str(), json_to_lua(lua, item)?)?;
                }
            }
            LuaValue::Table(table)
        }
    })
}

fn peer_to_lua(lua: &Lua, peer: &Peer) -> mlua::Result<Table> {
    let t = lua.create_table_with_capacity(0, 8)?;
    t.raw_set("id", peer.id.as_str())?;
    if let Some(addr) = &peer.addr {
        t.raw_set("addr", addr.as_str())?;
    }
    t.raw_set("name", peer.name.as_str())?;
    t.raw_set("hostname", peer.hostname.as_str())?;
    if let Some(stamp) = &peer.schedule {
        let s = lua.create_table_with_capacity(0, 3)?;
        s.raw_set("timestamp", stamp.timestamp as i64)?;
        s.raw_set("hash", stamp.hash.as_str())?;
        s.raw_set("origin", stamp.origin.as_str())?;
        t.raw_set("schedule", s)?;
    }
    t.raw_set("known_since", peer.known_since as i64)?;
    if let Some(last) = peer.last_report_direct {
        t.raw_set("last_report_direct", last as i64)?;
    }
    t.raw_set("errors", peer.errors as i64)?;
    Ok(t)
}

/// The `state` table the scheduler function gets.
pub fn input_to_lua(lua: &Lua, input: &SchedulerInput) -> mlua::Result<Table> {
    let state = lua.create_table_with_capacity(0, 8)?;
    state.raw_set("now", input.now as i64)?;
    state.raw_set("current_host", input.current_host.as_str())?;
    state.raw_set("current_id", input.current_id.as_str())?;
    let parents = lua.create_table_with_capacity(input.parents.len(), 0)?;
    for (i, parent) in input.parents.iter().enumerate() {
        parents.raw_set(i + 1, json_to_lua(lua, parent)?)?;
    }
    state.raw_set("parents", parents)?;
    let actions = lua.create_table_with_capacity(0, input.actions.len())?;
    for (id, action) in &input.actions {
        actions.raw_set(*id as i64, json_to_lua(lua, action)?)?;
    }
    state.raw_set("actions", actions)?;
    state.raw_set("runtime", json_to_lua(lua, &input.runtime)?)?;
    let peers = lua.create_table_with_capacity(0, input.peers.len())?;
    for (id, peer) in &input.peers {
        peers.raw_set(id.as_str(), peer_to_lua(lua, peer)?)?;
    }
    state.raw_set("peers", peers)?;
    state.raw_set("metrics", json_to_lua(lua, &input.metrics)?)?;
    Ok(state)
}

/// Converts a Lua value to JSON; the error names the path of the bad value (`roles.web[2]`).
pub fn lua_to_json(value: &LuaValue) -> Result<Value, String> {
    let mut path = Vec::new();
    convert(value, &mut path, 0)
}

fn describe_path(path: &[String]) -> String {
    if path.is_empty() {
        "the returned value".into()
    } else {
        path.concat()
    }
}

fn convert(value: &LuaValue, path: &mut Vec<String>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "{} is nested too deep (a table that contains itself?)",
            describe_path(path)
        ));
    }
    Ok(match value {
        LuaValue::Nil => Value::Null,
        LuaValue::Boolean(b) => Value::Bool(*b),
        LuaValue::Integer(i) => Value::Number((*i).into()),
        LuaValue::Number(f) => match Number::from_f64(*f) {
            Some(n) => Value::Number(n),
            None => {
                return Err(format!(
                    "{} is {f}, which JSON cannot represent",
                    describe_path(path)
                ));
            }
        },
        LuaValue::String(s) => match s.to_str() {
            Ok(s) => Value::String(s.to_string()),
            Err(_) => {
                return Err(format!(
                    "{} is a string that is not valid UTF-8",
                    describe_path(path)
                ));
            }
        },
        LuaValue::Table(table) => {
            let len = table.raw_len();
            let mut count = 0usize;
            let mut array_like = true;
            for pair in table.pairs::<LuaValue, LuaValue>() {
                let (key, _) = pair.map_err(|e| e.to_string())?;
                count += 1;
                match key {
                    LuaValue::Integer(i) if i >= 1 && (i as usize) <= len => {}
                    _ => array_like = false,
                }
            }
            if array_like && count == len && len > 0 {
                let mut items = Vec::with_capacity(len);
                for i in 1..=len {
                    let item: LuaValue = table.raw_get(i).map_err(|e| e.to_string())?;
                    path.push(format!("[{i}]"));
                    items.push(convert(&item, path, depth + 1)?);
                    path.pop();
                }
                Value::Array(items)
            } else {
                let mut map = Map::new();
                for pair in table.pairs::<LuaValue, LuaValue>() {
                    let (key, item) = pair.map_err(|e| e.to_string())?;
                    let key = match &key {
                        LuaValue::String(s) => s
                            .to_str()
                            .map_err(|_| {
                                format!("{} has a key that is not valid UTF-8", describe_path(path))
                            })?
                            .to_string(),
                        LuaValue::Integer(i) => i.to_string(),
                        LuaValue::Number(f) => f.to_string(),
                        LuaValue::Boolean(b) => b.to_string(),
                        other => {
                            return Err(format!(
                                "{} has a {} key, which JSON cannot represent",
                                describe_path(path),
                                other.type_name()
                            ));
                        }
                    };
                    path.push(if path.is_empty() {
                        key.clone()
                    } else {
                        format!(".{key}")
                    });
                    let converted = convert(&item, path, depth + 1)?;
                    path.pop();
                    map.insert(key, converted);
                }
                Value::Object(map)
            }
        }
        other => {
            return Err(format!(
                "{} is a {}, which JSON cannot represent",
                describe_path(path),
                other.type_name()
            ));
        }
    })
}
