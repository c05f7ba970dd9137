//! The text written straight from Lua against the tree's way (`lua_to_json`, then the canonical
//! writer of `ScheduleData::from_value`): seeded random tables, the same text and hash when the
//! tree's way succeeds, a refusal when it refuses, the same memory budget to the byte.

use std::time::{Duration, Instant};

use mlua::{Lua, Table, Value as LuaValue};
use verwalter_controllers::schedule::hash::{hash_canonical, schedule_hash};
use verwalter_controllers::state::ScheduleData;

use super::super::{Budget, ConvertError, lua_to_json};
use super::{Declined, lua_to_canonical, write_str};

/// SplitMix64: a seeded generator, so a failure replays.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

const CHARS: &[&str] = &[
    "a", "b", "z", "A", "0", "9", "-", "_", ".", " ", "/", "\"", "\\", "\n", "\t", "\r", "\u{8}",
    "\u{c}", "\u{0}", "\u{1}", "\u{1f}", "\u{7f}", "é", "ß", "€", "\u{2028}", "😀", "日本",
];

const INTEGERS: &[i64] = &[
    0,
    1,
    -1,
    7,
    42,
    -1000,
    i64::MAX,
    i64::MIN,
    i64::MAX - 1,
    i64::MIN + 1,
];

const FLOATS: &[f64] = &[
    1e300,
    -1e300,
    -0.0,
    0.0,
    0.1,
    0.5,
    1.5,
    3.0,
    -2.0,
    1e-7,
    5e-324,
    f64::MAX,
    f64::MIN,
    f64::MIN_POSITIVE,
    1e21,
    1e16,
    123_456.789,
    9_007_199_254_740_993.0,
];

fn string(g: &mut Gen) -> String {
    let len = g.below(8);
    (0..len).map(|_| g.pick(CHARS)).collect()
}

fn scalar(g: &mut Gen, lua: &Lua) -> LuaValue {
    match g.below(6) {
        0 => LuaValue::Integer(g.pick(INTEGERS)),
        1 => LuaValue::Integer(g.next() as i64 >> g.below(64)),
        2 => LuaValue::Number(g.pick(FLOATS)),
        3 => {
            // Any finite float, from its bits.
            let f = f64::from_bits(g.next());
            LuaValue::Number(if f.is_finite() { f } else { 0.25 })
        }
        4 => LuaValue::Boolean(g.below(2) == 0),
        _ => LuaValue::String(lua.create_string(string(g)).unwrap()),
    }
}

/// Something JSON cannot hold, or a table the conversion refuses.
fn bad_value(g: &mut Gen, lua: &Lua) -> LuaValue {
    match g.below(6) {
        0 => LuaValue::Function(lua.create_function(|_, ()| Ok(())).unwrap()),
        1 => LuaValue::Number(g.pick(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY])),
        2 => LuaValue::String(lua.create_string(b"ok \xff not utf-8").unwrap()),
        3 => {
            // A table that contains itself: nested too deep.
            let t = lua.create_table().unwrap();
            t.set("self", &t).unwrap();
            LuaValue::Table(t)
        }
        4 => {
            let t = lua.create_table().unwrap();
            t.raw_set(lua.create_table().unwrap(), 1).unwrap();
            LuaValue::Table(t)
        }
        _ => LuaValue::Thread(
            lua.create_thread(lua.create_function(|_, ()| Ok(())).unwrap())
                .unwrap(),
        ),
    }
}

/// A key of a table that is not an array.
fn key(g: &mut Gen, lua: &Lua) -> LuaValue {
    match g.below(10) {
        0 => LuaValue::Integer(g.pick(INTEGERS)),
        1 => LuaValue::Number(g.pick(&[1.5, -0.25, 1e300, 1e-300, f64::INFINITY, 2.5e15])),
        2 => LuaValue::Boolean(g.below(2) == 0),
        _ => LuaValue::String(lua.create_string(string(g)).unwrap()),
    }
}

fn table(g: &mut Gen, lua: &Lua, depth: u32, bad: bool) -> Table {
    let t = lua.create_table().unwrap();
    let big = g.below(8) == 0;
    let n = if big { 16 + g.below(40) } else { g.below(6) };
    match g.below(4) {
        // An array (or, with a hole, a sparse table written as an object).
        0 => {
            for i in 1..=n as i64 {
                t.raw_set(i, value(g, lua, depth + 1, bad)).unwrap();
            }
            if n > 2 && g.below(4) == 0 {
                t.raw_set(2, LuaValue::Nil).unwrap();
            }
        }
        _ => {
            for _ in 0..n {
                t.raw_set(key(g, lua), value(g, lua, depth + 1, bad))
                    .unwrap();
            }
        }
    }
    if bad && g.below(30) == 0 {
        // Two keys that are one in JSON.
        let (a, b): (LuaValue, LuaValue) = match g.below(3) {
            0 => (
                LuaValue::Integer(1),
                LuaValue::String(lua.create_string("1").unwrap()),
            ),
            1 => (
                LuaValue::Boolean(true),
                LuaValue::String(lua.create_string("true").unwrap()),
            ),
            _ => (
                LuaValue::Number(1.5),
                LuaValue::String(lua.create_string("1.5").unwrap()),
            ),
        };
        t.raw_set(a, 1).unwrap();
        t.raw_set(b, 2).unwrap();
        t.raw_set("pad", 3).unwrap(); // not a sequence
    }
    if bad && g.below(40) == 0 {
        t.raw_set(lua.create_string(b"k\xfe").unwrap(), 1).unwrap();
    }
    t
}

fn value(g: &mut Gen, lua: &Lua, depth: u32, bad: bool) -> LuaValue {
    if bad && g.below(60) == 0 {
        return bad_value(g, lua);
    }
    if depth < 4 && g.below(3) == 0 {
        LuaValue::Table(table(g, lua, depth, bad))
    } else {
        scalar(g, lua)
    }
}

fn ample() -> Budget {
    budget(usize::MAX)
}

fn budget(bytes: usize) -> Budget {
    Budget {
        bytes,
        deadline: Instant::now() + Duration::from_secs(3600),
    }
}

/// The tree's way: the value, then its canonical text and hash.
fn by_tree(lua: &Lua, t: &Table, budget: Budget) -> Result<(String, String), ConvertError> {
    let value = lua_to_json(lua, &LuaValue::Table(t.clone()), budget)?;
    let hash = schedule_hash(&value);
    Ok((
        ScheduleData::from_value(value).canonical().to_string(),
        hash,
    ))
}

#[test]
fn random_tables_write_the_trees_canonical_text_and_hash() {
    let lua = Lua::new();
    let mut g = Gen(0x5eed_0032);
    let (mut ok, mut refused) = (0, 0);
    for case in 0..3000 {
        let bad = case % 2 == 1;
        let t = table(&mut g, &lua, 0, bad);
        let new = lua_to_canonical(&lua, &t, ample(), Vec::new());
        match by_tree(&lua, &t, ample()) {
            Ok((text, hash)) => {
                let got = new
                    .unwrap_or_else(|e| panic!("case {case}: declined ({e:?}), expected {text}"));
                assert_eq!(got, text, "case {case}");
                assert_eq!(hash_canonical(got.as_bytes()), hash, "case {case}");
                ok += 1;
            }
            Err(e) => {
                assert_eq!(
                    new,
                    Err(Declined::Refused),
                    "case {case}: the tree's way said {e}"
                );
                refused += 1;
            }
        }
    }
    // Both kinds are well represented (the generator is not broken).
    assert!(
        ok > 1500 && refused > 100,
        "{ok} written, {refused} refused"
    );
}

#[test]
fn the_memory_budget_runs_out_at_the_same_byte() {
    let lua = Lua::new();
    let mut g = Gen(0xb0d6e7);
    for case in 0..300 {
        let t = table(&mut g, &lua, 0, false);
        // The smallest budget the tree's way fits in.
        let (mut low, mut high) = (0usize, 1usize << 24);
        if by_tree(&lua, &t, budget(high)).is_err() {
            // A rare big one (up to 55 entries on four levels): the searches need not take it.
            assert_eq!(
                lua_to_canonical(&lua, &t, budget(high), Vec::new()),
                Err(Declined::Refused)
            );
            continue;
        }
        while low < high {
            let mid = (low + high) / 2;
            match by_tree(&lua, &t, budget(mid)) {
                Ok(_) => high = mid,
                Err(ConvertError::TooLarge { .. }) => low = mid + 1,
                Err(e) => panic!("case {case}: {e}"),
            }
        }
        assert!(
            lua_to_canonical(&lua, &t, budget(high), Vec::new()).is_ok(),
            "case {case}"
        );
        if high > 0 {
            assert_eq!(
                lua_to_canonical(&lua, &t, budget(high - 1), Vec::new()),
                Err(Declined::Refused),
                "case {case}: fits in {} bytes the tree's way, not one less",
                high
            );
        }
    }
}

#[test]
fn a_passed_deadline_stops_the_writing() {
    let lua = Lua::new();
    let t = lua.create_table().unwrap();
    for i in 0..20_000 {
        t.raw_set(format!("k{i}"), i).unwrap();
    }
    let passed = Budget {
        bytes: usize::MAX,
        deadline: Instant::now(),
    };
    std::thread::sleep(Duration::from_millis(2));
    assert_eq!(
        lua_to_canonical(&lua, &t, passed, Vec::new()),
        Err(Declined::Timeout)
    );
    assert!(lua_to_canonical(&lua, &t, ample(), Vec::new()).is_ok());
}

#[test]
fn strings_are_escaped_as_serde_json_escapes_them() {
    for c in (0u32..0x800).chain([0x2028, 0xfeff, 0x1f600]) {
        let s = format!("a{}b", char::from_u32(c).unwrap());
        let mut out = Vec::new();
        write_str(&mut out, s.as_bytes());
        assert_eq!(out, serde_json::to_vec(&s).unwrap(), "U+{c:04X}");
    }
}
