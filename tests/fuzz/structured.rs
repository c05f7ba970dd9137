//! Structure-aware mutations: an input that parses as JSON, YAML or CBOR is changed as a tree
//! (a leaf replaced by an interesting number, a dictionary token or another type; a list item
//! or map entry repeated, dropped or nested deeper; a key renamed) and written back. Byte-level
//! changes mostly break such inputs at the first token; these reach the checks behind the parse.

use super::engine::{INTERESTING_NUMBERS, Rng};

/// The language an input is written in, for [`mutate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Bytes,
    Json,
    Yaml,
    Cbor,
}

/// A structured mutation of `input`, `None` when it does not parse as `shape`.
pub fn mutate(shape: Shape, input: &[u8], rng: &mut Rng, dict: &[&str]) -> Option<Vec<u8>> {
    match shape {
        Shape::Bytes => None,
        Shape::Json => {
            let mut value: serde_json::Value = serde_json::from_slice(input).ok()?;
            for _ in 0..1 + rng.below(3) {
                json_node(&mut value, rng, dict);
            }
            serde_json::to_vec(&value).ok()
        }
        Shape::Yaml => {
            let text = std::str::from_utf8(input).ok()?;
            let mut value: serde_norway::Value = serde_norway::from_str(text).ok()?;
            for _ in 0..1 + rng.below(3) {
                yaml_node(&mut value, rng, dict);
            }
            serde_norway::to_string(&value).ok().map(String::into_bytes)
        }
        Shape::Cbor => {
            let mut value: ciborium::Value = ciborium::from_reader(input).ok()?;
            for _ in 0..1 + rng.below(3) {
                cbor_node(&mut value, rng, dict);
            }
            let mut out = Vec::new();
            ciborium::into_writer(&value, &mut out).ok()?;
            Some(out)
        }
    }
}

fn token(rng: &mut Rng, dict: &[&str]) -> String {
    match rng.below(4) {
        0 if !dict.is_empty() => dict[rng.below(dict.len())].trim().to_string(),
        1 => INTERESTING_NUMBERS[rng.below(INTERESTING_NUMBERS.len())].to_string(),
        2 => String::new(),
        _ => "x".repeat(1 + rng.below(300)),
    }
}

fn json_node(root: &mut serde_json::Value, rng: &mut Rng, dict: &[&str]) {
    use serde_json::Value;
    let node = descend_json(root, rng);
    match rng.below(9) {
        0 | 1 => {
            let n = INTERESTING_NUMBERS[rng.below(INTERESTING_NUMBERS.len())];
            if let Ok(v) = serde_json::from_str::<Value>(n) {
                *node = v;
            }
        }
        2 => *node = Value::String(token(rng, dict)),
        3 => {
            *node = match rng.below(6) {
                0 => Value::Null,
                1 => Value::Bool(rng.chance(2)),
                2 => Value::Array(Vec::new()),
                3 => Value::Object(Default::default()),
                4 => Value::Array(vec![node.take()]),
                _ => {
                    let inner = node.take();
                    let mut map = serde_json::Map::new();
                    map.insert(token(rng, dict), inner);
                    Value::Object(map)
                }
            }
        }
        4 | 5 => match node {
            Value::Array(items) if !items.is_empty() => {
                let i = rng.below(items.len());
                if rng.chance(2) {
                    let copy = items[i].clone();
                    let most = if rng.chance(8) { 100 } else { 2 };
                    for _ in 0..1 + rng.below(most) {
                        items.push(copy.clone());
                    }
                } else {
                    items.remove(i);
                }
            }
            Value::Object(map) if !map.is_empty() => {
                let key = map.keys().nth(rng.below(map.len())).cloned().unwrap();
                let value = map.remove(&key).unwrap();
                match rng.below(3) {
                    0 => {}
                    1 => {
                        map.insert(token(rng, dict), value);
                    }
                    _ => {
                        map.insert(key.clone(), value.clone());
                        map.insert(format!("{key}{}", token(rng, dict)), value);
                    }
                }
            }
            _ => {}
        },
        6 => {
            if let Value::Object(map) = node {
                map.insert(token(rng, dict), Value::String(token(rng, dict)));
            }
        }
        7 => {
            if let Value::String(s) = node {
                let at = rng.below(s.len() + 1);
                if s.is_char_boundary(at) {
                    s.insert_str(at, &token(rng, dict));
                }
            }
        }
        _ => {
            // A copy of another node of the tree in place of this one is left to splices;
            // here: a number nudged.
            if let Some(n) = node.as_i64() {
                *node = Value::from(n.wrapping_add(rng.below(3) as i64 - 1));
            }
        }
    }
}

fn descend_json<'a>(node: &'a mut serde_json::Value, rng: &mut Rng) -> &'a mut serde_json::Value {
    use serde_json::Value;
    let kids = match node {
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        _ => 0,
    };
    if kids == 0 || rng.chance(4) {
        return node;
    }
    let i = rng.below(kids);
    match node {
        Value::Array(a) => descend_json(&mut a[i], rng),
        Value::Object(o) => descend_json(o.values_mut().nth(i).unwrap(), rng),
        other => other,
    }
}

fn yaml_node(root: &mut serde_norway::Value, rng: &mut Rng, dict: &[&str]) {
    use serde_norway::Value;
    let node = descend_yaml(root, rng);
    match rng.below(8) {
        0 | 1 => {
            let n = INTERESTING_NUMBERS[rng.below(INTERESTING_NUMBERS.len())];
            if let Ok(v) = serde_norway::from_str::<Value>(n) {
                *node = v;
            }
        }
        2 => *node = Value::String(token(rng, dict)),
        3 => {
            let inner = std::mem::take(node);
            *node = match rng.below(6) {
                0 => Value::Null,
                1 => Value::Bool(rng.chance(2)),
                2 => Value::Sequence(vec![inner]),
                3 => {
                    let mut map = serde_norway::Mapping::new();
                    map.insert(Value::String(token(rng, dict)), inner);
                    Value::Mapping(map)
                }
                4 => {
                    let tag = token(rng, dict);
                    let tag = tag.trim_start_matches('!');
                    Value::Tagged(Box::new(serde_norway::value::TaggedValue {
                        tag: serde_norway::value::Tag::new(if tag.is_empty() { "X" } else { tag }),
                        value: inner,
                    }))
                }
                _ => Value::Mapping(Default::default()),
            }
        }
        4 | 5 => match node {
            Value::Sequence(items) if !items.is_empty() => {
                let i = rng.below(items.len());
                if rng.chance(2) {
                    let copy = items[i].clone();
                    items.push(copy);
                } else {
                    items.remove(i);
                }
            }
            Value::Mapping(map) if !map.is_empty() => {
                let key = map.keys().nth(rng.below(map.len())).cloned().unwrap();
                let value = map.remove(&key).unwrap();
                if rng.chance(2) {
                    map.insert(Value::String(token(rng, dict)), value);
                }
            }
            _ => {}
        },
        6 => {
            if let Value::Mapping(map) = node {
                map.insert(
                    Value::String(token(rng, dict)),
                    Value::String(token(rng, dict)),
                );
            }
        }
        _ => {
            if let Value::Tagged(tagged) = node {
                // Another tag on the same value (`!Cmd` as `!Copy`).
                let tag = token(rng, dict);
                let tag = tag.trim_start_matches('!');
                if !tag.is_empty() {
                    tagged.tag = serde_norway::value::Tag::new(tag);
                }
            }
        }
    }
}

fn descend_yaml<'a>(
    node: &'a mut serde_norway::Value,
    rng: &mut Rng,
) -> &'a mut serde_norway::Value {
    use serde_norway::Value;
    let kids = match node {
        Value::Sequence(a) => a.len(),
        Value::Mapping(m) => m.len(),
        Value::Tagged(_) => 1,
        _ => 0,
    };
    if kids == 0 || rng.chance(4) {
        return node;
    }
    let i = rng.below(kids);
    match node {
        Value::Sequence(a) => descend_yaml(&mut a[i], rng),
        Value::Mapping(m) => descend_yaml(m.values_mut().nth(i).unwrap(), rng),
        Value::Tagged(t) => descend_yaml(&mut t.value, rng),
        other => other,
    }
}

const CBOR_INTEGERS: &[i128] = &[
    0,
    1,
    -1,
    23,
    24,
    255,
    256,
    65_535,
    65_536,
    4_294_967_295,
    4_294_967_296,
    1 << 40,
    i64::MAX as i128,
    i64::MIN as i128,
    u64::MAX as i128,
    -(u64::MAX as i128) - 1,
];

fn cbor_node(root: &mut ciborium::Value, rng: &mut Rng, dict: &[&str]) {
    use ciborium::Value;
    let node = descend_cbor(root, rng);
    match rng.below(8) {
        0 | 1 => {
            let n = CBOR_INTEGERS[rng.below(CBOR_INTEGERS.len())];
            if let Ok(i) = ciborium::value::Integer::try_from(n) {
                *node = Value::Integer(i);
            }
        }
        2 => {
            *node = match rng.below(4) {
                0 => Value::Text(token(rng, dict)),
                1 => Value::Bytes(vec![0xab; rng.below(40)]),
                2 => Value::Float(f64::NAN),
                _ => Value::Text(
                    ["Ping", "Pong", "Vote", "type", "id", "epoch"][rng.below(6)].into(),
                ),
            }
        }
        3 => {
            let inner = std::mem::replace(node, Value::Null);
            *node = match rng.below(5) {
                0 => Value::Null,
                1 => Value::Bool(rng.chance(2)),
                2 => Value::Array(vec![inner]),
                3 => Value::Tag(rng.next_u64() % 300, Box::new(inner)),
                _ => Value::Map(vec![(Value::Text(token(rng, dict)), inner)]),
            }
        }
        4 | 5 => match node {
            Value::Array(items) if !items.is_empty() => {
                let i = rng.below(items.len());
                if rng.chance(2) {
                    let copy = items[i].clone();
                    items.push(copy);
                } else {
                    items.remove(i);
                }
            }
            Value::Map(entries) if !entries.is_empty() => {
                let i = rng.below(entries.len());
                match rng.below(3) {
                    0 => {
                        entries.remove(i);
                    }
                    1 => {
                        let copy = entries[i].clone();
                        entries.push(copy);
                    }
                    _ => {
                        let j = rng.below(entries.len());
                        let value = entries[j].1.clone();
                        entries[i].1 = value;
                    }
                }
            }
            _ => {}
        },
        6 => {
            if let Value::Bytes(bytes) = node {
                if rng.chance(2) {
                    bytes.push(rng.next_u64() as u8);
                } else {
                    bytes.pop();
                }
            }
        }
        _ => {
            if let Value::Map(entries) = node {
                entries.push((Value::Text(token(rng, dict)), Value::Integer(7.into())));
            }
        }
    }
}

fn descend_cbor<'a>(node: &'a mut ciborium::Value, rng: &mut Rng) -> &'a mut ciborium::Value {
    use ciborium::Value;
    let kids = match node {
        Value::Array(a) => a.len(),
        Value::Map(m) => m.len(),
        Value::Tag(_, _) => 1,
        _ => 0,
    };
    if kids == 0 || rng.chance(4) {
        return node;
    }
    let i = rng.below(kids);
    match node {
        Value::Array(a) => descend_cbor(&mut a[i], rng),
        Value::Map(m) => {
            let entry = &mut m[i];
            if rng.chance(4) {
                descend_cbor(&mut entry.0, rng)
            } else {
                descend_cbor(&mut entry.1, rng)
            }
        }
        Value::Tag(_, inner) => descend_cbor(inner, rng),
        other => other,
    }
}
