//! The table a scheduler returns, written straight to the schedule's canonical JSON text
//! (compact, object keys in byte order: what [`verwalter_controllers::schedule::hash`] writes from a
//! tree and the hash covers), with no `serde_json::Value` tree in between.
//!
//! Building the tree, writing it out and freeing it was most of a round's time outside the Lua
//! call for a fleet's schedule. Here a table's entries are gathered with their values left on
//! the Lua stack, sorted by key once, and written in that order; arrays are written as they
//! are read.
//!
//! It is metered exactly as [`super::lua_to_json`] (the same charge per value, key and string
//! byte, the same deadline checks), so it runs out of the budget on the same tables. It refuses
//! whatever that function refuses, but only says *that* it declines ([`Declined`]): the caller
//! then converts with [`super::lua_to_json`], whose error (the bad value's path, the two keys
//! that clash) is the one reported, word for word as before. A table beyond the Lua stack's
//! room (a million entries in one table) is declined as well and converted that way.

use std::ffi::c_int;
use std::io::Write as _;

use mlua::{Lua, Table, ffi};

use super::{Budget, ENTRY_COST, MAX_DEPTH, Meter, Stop, VALUE_COST, is_sequence, string_at};

/// Why the text was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Declined {
    /// The run's deadline passed while writing.
    Timeout,
    /// A value JSON cannot represent, two keys that are one in JSON, more than the memory
    /// budget, or a table too big for the stack: [`super::lua_to_json`] says which.
    Refused,
}

/// The canonical JSON text of `table` within `budget`, written into `buffer` (empty): byte for
/// byte what `write_canonical(lua_to_json(table))` writes, when that succeeds.
pub(crate) fn lua_to_canonical(
    lua: &Lua,
    table: &Table,
    budget: Budget,
    buffer: Vec<u8>,
) -> Result<String, Declined> {
    let mut writer = Writer {
        out: buffer,
        meter: Meter::new(budget),
        keys: Vec::new(),
        made: Vec::new(),
    };
    let mut result = Err(Declined::Refused);
    // SAFETY: the table is pushed as the only argument (index 1); nothing here raises: reading
    // a table we traverse ourselves, moving values on a stack made room for first.
    let called: mlua::Result<()> = unsafe {
        lua.exec_raw(table.clone(), |state| {
            result = writer.value(state, 1, 0).map_err(|stop| match stop {
                Stop::Timeout => Declined::Timeout,
                Stop::Bad(_) | Stop::TooLarge => Declined::Refused,
            });
            ffi::lua_settop(state, 0);
        })
    };
    called.map_err(|_| Declined::Refused)?;
    result?;
    // SAFETY: the text is ASCII punctuation and digits around the bytes of Lua strings that
    // were checked to be UTF-8, whole (escaping only replaces ASCII bytes).
    debug_assert!(std::str::from_utf8(&writer.out).is_ok());
    Ok(unsafe { String::from_utf8_unchecked(writer.out) })
}

/// One entry of an object being written: its key and the stack slot of its value.
#[derive(Clone, Copy)]
struct Entry {
    key: Key,
    slot: c_int,
}

/// A key's bytes: inside a Lua string the table holds (alive and unmoved while the table is
/// not changed, which it is not while it is written), or in [`Writer::made`] (a number or
/// boolean key written as text).
#[derive(Clone, Copy)]
enum Key {
    Lua(*const u8, usize),
    Made(usize, usize),
}

impl Key {
    fn bytes<'a>(&self, made: &'a [u8]) -> &'a [u8] {
        match *self {
            // SAFETY: see the type's docs.
            Key::Lua(ptr, len) => unsafe { std::slice::from_raw_parts(ptr, len) },
            Key::Made(at, len) => &made[at..at + len],
        }
    }
}

struct Writer {
    out: Vec<u8>,
    meter: Meter,
    /// The entries of the objects being written, innermost last; each object uses the part
    /// past what was there when it started and gives it back when done.
    keys: Vec<Entry>,
    /// The text of number and boolean keys, used the same way.
    made: Vec<u8>,
}

impl Writer {
    /// Writes the value at absolute stack `index`.
    unsafe fn value(
        &mut self,
        state: *mut ffi::lua_State,
        index: c_int,
        depth: usize,
    ) -> Result<(), Stop> {
        self.meter.charge(VALUE_COST)?;
        unsafe {
            match ffi::lua_type(state, index) {
                ffi::LUA_TNIL => self.out.extend_from_slice(b"null"),
                ffi::LUA_TBOOLEAN => {
                    let text: &[u8] = match ffi::lua_toboolean(state, index) != 0 {
                        true => b"true",
                        false => b"false",
                    };
                    self.out.extend_from_slice(text);
                }
                ffi::LUA_TNUMBER if ffi::lua_isinteger(state, index) != 0 => {
                    write_int(
                        &mut self.out,
                        ffi::lua_tointegerx(state, index, std::ptr::null_mut()),
                    );
                }
                ffi::LUA_TNUMBER => {
                    let f = ffi::lua_tonumberx(state, index, std::ptr::null_mut());
                    if !f.is_finite() {
                        return Err(Stop::bad(String::new()));
                    }
                    // serde_json's own float form (ryu), as the tree's writer uses.
                    serde_json::to_writer(&mut self.out, &f).expect("a finite float serializes");
                }
                ffi::LUA_TSTRING => {
                    let bytes = string_at(state, index);
                    self.meter.charge(bytes.len())?;
                    if std::str::from_utf8(bytes).is_err() {
                        return Err(Stop::bad(String::new()));
                    }
                    write_str(&mut self.out, bytes);
                }
                ffi::LUA_TTABLE => self.table(state, index, depth)?,
                _ => return Err(Stop::bad(String::new())),
            }
        }
        Ok(())
    }

    unsafe fn table(
        &mut self,
        state: *mut ffi::lua_State,
        index: c_int,
        depth: usize,
    ) -> Result<(), Stop> {
        if depth > MAX_DEPTH {
            return Err(Stop::bad(String::new()));
        }
        unsafe {
            if ffi::lua_checkstack(state, 4) == 0 {
                return Err(Stop::bad(String::new()));
            }
            let len = ffi::lua_rawlen(state, index);
            if len > 0 && is_sequence(state, index, len) {
                self.meter.fits(len.saturating_mul(VALUE_COST))?;
                self.out.push(b'[');
                for i in 1..=len {
                    if i > 1 {
                        self.out.push(b',');
                    }
                    ffi::lua_rawgeti(state, index, i as ffi::lua_Integer);
                    let item = self.value(state, ffi::lua_gettop(state), depth + 1);
                    ffi::lua_pop(state, 1);
                    item?;
                }
                self.out.push(b']');
                return Ok(());
            }
            let base = ffi::lua_gettop(state);
            let (first, made) = (self.keys.len(), self.made.len());
            let result = self.object(state, index, depth, base, first);
            ffi::lua_settop(state, base);
            self.keys.truncate(first);
            self.made.truncate(made);
            result
        }
    }

    /// Gathers the entries of the object at `index` (their values onto the stack above `base`,
    /// their keys into `self.keys` from `first` on), then writes them in key order.
    unsafe fn object(
        &mut self,
        state: *mut ffi::lua_State,
        index: c_int,
        depth: usize,
        base: c_int,
        first: usize,
    ) -> Result<(), Stop> {
        unsafe {
            ffi::lua_pushnil(state);
            while ffi::lua_next(state, index) != 0 {
                // Stack: ..., values so far, key, value. The value moves below the key, which
                // stays on top for `lua_next`.
                let top = ffi::lua_gettop(state);
                let key = self.key(state, top - 1)?;
                let len = key.bytes(&self.made).len();
                self.meter.charge(ENTRY_COST + len)?;
                if ffi::lua_checkstack(state, 3) == 0 {
                    return Err(Stop::bad(String::new()));
                }
                ffi::lua_rotate(state, -2, 1);
                self.keys.push(Entry { key, slot: top - 1 });
            }
            debug_assert_eq!(
                ffi::lua_gettop(state),
                base + (self.keys.len() - first) as c_int
            );
            let made = &self.made;
            let entries = &mut self.keys[first..];
            entries.sort_unstable_by(|a, b| a.key.bytes(made).cmp(b.key.bytes(made)));
            // `1` and `"1"` (or `true` and `"true"`) are two keys in Lua but one in JSON.
            if entries
                .windows(2)
                .any(|pair| pair[0].key.bytes(made) == pair[1].key.bytes(made))
            {
                return Err(Stop::bad(String::new()));
            }
            self.out.push(b'{');
            for i in first..self.keys.len() {
                if i > first {
                    self.out.push(b',');
                }
                let entry = self.keys[i];
                write_str(&mut self.out, entry.key.bytes(&self.made));
                self.out.push(b':');
                self.value(state, entry.slot, depth + 1)?;
            }
            self.out.push(b'}');
            Ok(())
        }
    }

    /// The key at `index` as JSON names it: a string as it is, a number or boolean as
    /// [`super::lua_to_json`] writes it.
    unsafe fn key(&mut self, state: *mut ffi::lua_State, index: c_int) -> Result<Key, Stop> {
        unsafe {
            let at = self.made.len();
            match ffi::lua_type(state, index) {
                ffi::LUA_TSTRING => {
                    let bytes = string_at(state, index);
                    if std::str::from_utf8(bytes).is_err() {
                        return Err(Stop::bad(String::new()));
                    }
                    return Ok(Key::Lua(bytes.as_ptr(), bytes.len()));
                }
                ffi::LUA_TNUMBER if ffi::lua_isinteger(state, index) != 0 => {
                    let i = ffi::lua_tointegerx(state, index, std::ptr::null_mut());
                    write_int(&mut self.made, i);
                }
                ffi::LUA_TNUMBER => {
                    let f = ffi::lua_tonumberx(state, index, std::ptr::null_mut());
                    write!(self.made, "{f}").expect("writing to a Vec");
                }
                ffi::LUA_TBOOLEAN => {
                    let b = ffi::lua_toboolean(state, index) != 0;
                    write!(self.made, "{b}").expect("writing to a Vec");
                }
                _ => return Err(Stop::bad(String::new())),
            }
            Ok(Key::Made(at, self.made.len() - at))
        }
    }
}

/// An integer in decimal, as serde_json writes one.
fn write_int(out: &mut Vec<u8>, i: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = i.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if i < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// A JSON string of the UTF-8 `bytes`, escaped as serde_json escapes: `"` and `\` with a
/// backslash, control characters as `\b \t \n \f \r` or `\u00xx`, nothing else.
pub(crate) fn write_str(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut from = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[from..i]);
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            _ => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ],
        };
        out.extend_from_slice(escaped);
        from = i + 1;
    }
    out.extend_from_slice(&bytes[from..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests;
