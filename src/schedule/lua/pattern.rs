//! Lua 5.4 patterns in Rust, for `string.find`, `match`, `gmatch` and `gsub`, bounded by the
//! run's deadline (with `string.rep` and `table.move`, the other C loops that need no memory).
//!
//! Lua's own matcher is C code that backtracks without ever running a Lua instruction, so the
//! watchdog's hook cannot stop it: `string.find(string.rep("a", 40), string.rep("a*", 40) .. "b")`
//! takes longer than the age of the universe, and a scheduler thread stuck in it could only be
//! abandoned. This matcher follows the semantics of the Lua manual (§6.4.1) but counts its
//! steps and reads the clock every [`CLOCK_EVERY`] steps; past the deadline it fails with the
//! time-budget error, which `pcall` cannot swallow (see `sandbox.rs`).
//!
//! The Rust functions never raise (mlua would turn the error into a userdata): they return
//! `false, message, level`, and a small C function around each ([`checked`]) raises the message
//! as a string located at the calling line, as Lua's own functions do. Being a C function, the
//! wrapper also keeps the caller's frame on a tail call, so `return s:match(p)` still names the
//! line.

#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use std::ffi::c_int;

use mlua::{Function, Lua, MultiValue, Table, Value, ffi};

use super::watchdog::TIMEOUT_MARK;

/// Captures per pattern, as in Lua (`LUA_MAXCAPTURES`).
const MAX_CAPTURES: usize = 32;

/// Nesting of the matcher's recursion, as in Lua (`MAXCCALLS`): a pattern needing more is
/// "too complex". 200 frames of `do_match` take a few tens of KiB of stack.
const MAX_DEPTH: usize = 200;

/// Matching steps between two looks at the clock: a step is a few nanoseconds, so the clock
/// (~25 ns to read) is read about every 50 µs, and a run stops within that of its deadline.
const CLOCK_EVERY: usize = 10_000;

/// The characters that make a pattern more than plain text.
const SPECIALS: &[u8] = b"^$*+?.([%-";

/// Why a match could not be completed.
enum Fail {
    /// A malformed pattern or bad argument; raised as a Lua error with this message.
    Error(String),
    /// The run's deadline passed.
    Timeout,
    /// An error raised by a replacement function (its message, already located).
    Raised(String),
}

type Outcome<T> = Result<T, Fail>;

fn error<T>(message: impl Into<String>) -> Outcome<T> {
    Err(Fail::Error(message.into()))
}

/// What a capture holds while the match runs.
#[derive(Clone, Copy)]
enum Capture {
    /// Opened with `(`, not closed yet.
    Open,
    /// `()`: the position.
    Position,
    /// A closed capture of this many bytes.
    Len(usize),
}

/// The match state of one pattern against one subject.
struct Matcher<'a> {
    src: &'a [u8],
    pat: &'a [u8],
    level: usize,
    captures: [(usize, Capture); MAX_CAPTURES],
    depth_left: usize,
    until_clock: usize,
    deadline: Instant,
}

/// A result value of a capture.
enum Captured<'a> {
    Text(&'a [u8]),
    Position(usize),
}

impl<'a> Matcher<'a> {
    fn new(src: &'a [u8], pat: &'a [u8], deadline: Instant) -> Matcher<'a> {
        Matcher {
            src,
            pat,
            level: 0,
            captures: [(0, Capture::Open); MAX_CAPTURES],
            depth_left: MAX_DEPTH,
            until_clock: CLOCK_EVERY,
            deadline,
        }
    }

    /// Resets the captures before a match is tried at a new position.
    fn reset(&mut self) {
        self.level = 0;
        self.depth_left = MAX_DEPTH;
    }

    /// Counts `cost` steps; looks at the clock when enough have passed.
    fn step(&mut self, cost: usize) -> Outcome<()> {
        if self.until_clock > cost {
            self.until_clock -= cost;
            return Ok(());
        }
        self.until_clock = CLOCK_EVERY;
        if Instant::now() > self.deadline {
            return Err(Fail::Timeout);
        }
        Ok(())
    }

    /// Tries to match the pattern from `p` at subject position `s`; the end of the match.
    fn do_match(&mut self, s: usize, p: usize) -> Outcome<Option<usize>> {
        if self.depth_left == 0 {
            return error("pattern too complex");
        }
        self.depth_left -= 1;
        let result = self.match_here(s, p);
        self.depth_left += 1;
        result
    }

    fn match_here(&mut self, mut s: usize, mut p: usize) -> Outcome<Option<usize>> {
        let pat = self.pat;
        loop {
            self.step(1)?;
            let Some(&c) = pat.get(p) else {
                return Ok(Some(s));
            };
            match c {
                b'(' => {
                    return if pat.get(p + 1) == Some(&b')') {
                        self.start_capture(s, p + 2, Capture::Position)
                    } else {
                        self.start_capture(s, p + 1, Capture::Open)
                    };
                }
                b')' => return self.end_capture(s, p + 1),
                b'$' if p + 1 == pat.len() => {
                    return Ok((s == self.src.len()).then_some(s));
                }
                b'%' if pat.get(p + 1) == Some(&b'b') => match self.match_balance(s, p + 2)? {
                    Some(end) => {
                        s = end;
                        p += 4;
                        continue;
                    }
                    None => return Ok(None),
                },
                b'%' if pat.get(p + 1) == Some(&b'f') => {
                    p += 2;
                    if pat.get(p) != Some(&b'[') {
                        return error("missing '[' after '%f' in pattern");
                    }
                    let end = self.class_end(p)?;
                    let previous = if s == 0 { 0 } else { self.src[s - 1] };
                    let current = self.src.get(s).copied().unwrap_or(0);
                    if !self.match_bracket(previous, p, end - 1)
                        && self.match_bracket(current, p, end - 1)
                    {
                        p = end;
                        continue;
                    }
                    return Ok(None);
                }
                b'%' if pat.get(p + 1).is_some_and(u8::is_ascii_digit) => {
                    match self.match_capture(s, pat[p + 1])? {
                        Some(end) => {
                            s = end;
                            p += 2;
                            continue;
                        }
                        None => return Ok(None),
                    }
                }
                _ => {}
            }
            // A single character class, maybe with a repetition suffix.
            let end = self.class_end(p)?;
            let matches = s < self.src.len() && self.single(self.src[s], p, end);
            let suffix = pat.get(end).copied();
            if !matches {
                if matches!(suffix, Some(b'*' | b'?' | b'-')) {
                    // Zero repetitions are fine.
                    p = end + 1;
                    continue;
                }
                return Ok(None);
            }
            match suffix {
                Some(b'?') => {
                    if let Some(found) = self.do_match(s + 1, end + 1)? {
                        return Ok(Some(found));
                    }
                    p = end + 1;
                }
                Some(b'+') => return self.max_expand(s + 1, p, end),
                Some(b'*') => return self.max_expand(s, p, end),
                Some(b'-') => return self.min_expand(s, p, end),
                _ => {
                    s += 1;
                    p = end;
                }
            }
        }
    }

    /// The index just past the single character class starting at `p`.
    fn class_end(&self, p: usize) -> Outcome<usize> {
        let pat = self.pat;
        let mut p = p;
        let c = pat[p];
        p += 1;
        if c == b'%' {
            if p >= pat.len() {
                return error("malformed pattern (ends with '%')");
            }
            return Ok(p + 1);
        }
        if c == b'[' {
            if pat.get(p) == Some(&b'^') {
                p += 1;
            }
            // The first character is part of the set even if it is `]`.
            loop {
                if p >= pat.len() {
                    return error("malformed pattern (missing ']')");
                }
                let cc = pat[p];
                p += 1;
                if cc == b'%' && p < pat.len() {
                    p += 1;
                }
                if pat.get(p) == Some(&b']') {
                    return Ok(p + 1);
                }
            }
        }
        Ok(p)
    }

    /// Whether byte `c` matches the class `pat[p..end]`.
    fn single(&self, c: u8, p: usize, end: usize) -> bool {
        match self.pat[p] {
            b'.' => true,
            b'%' => class_matches(c, self.pat[p + 1]),
            b'[' => self.match_bracket(c, p, end - 1),
            literal => literal == c,
        }
    }

    /// Whether `c` is in the set `[...]` that starts at `p` and whose `]` is at `close`.
    fn match_bracket(&self, c: u8, p: usize, close: usize) -> bool {
        let pat = self.pat;
        let mut p = p + 1;
        let mut inside = true;
        if pat[p] == b'^' {
            inside = false;
            p += 1;
        }
        while p < close {
            if pat[p] == b'%' {
                p += 1;
                if class_matches(c, pat[p]) {
                    return inside;
                }
            } else if pat.get(p + 1) == Some(&b'-') && p + 2 < close {
                if pat[p] <= c && c <= pat[p + 2] {
                    return inside;
                }
                p += 2;
            } else if pat[p] == c {
                return inside;
            }
            p += 1;
        }
        !inside
    }

    /// As many repetitions as possible, then fewer until the rest matches.
    fn max_expand(&mut self, s: usize, p: usize, end: usize) -> Outcome<Option<usize>> {
        let mut count = 0;
        while s + count < self.src.len() && self.single(self.src[s + count], p, end) {
            self.step(1)?;
            count += 1;
        }
        loop {
            if let Some(found) = self.do_match(s + count, end + 1)? {
                return Ok(Some(found));
            }
            if count == 0 {
                return Ok(None);
            }
            count -= 1;
        }
    }

    /// As few repetitions as possible, then more until the rest matches.
    fn min_expand(&mut self, mut s: usize, p: usize, end: usize) -> Outcome<Option<usize>> {
        loop {
            if let Some(found) = self.do_match(s, end + 1)? {
                return Ok(Some(found));
            }
            if s < self.src.len() && self.single(self.src[s], p, end) {
                s += 1;
            } else {
                return Ok(None);
            }
        }
    }

    fn start_capture(&mut self, s: usize, p: usize, what: Capture) -> Outcome<Option<usize>> {
        if self.level >= MAX_CAPTURES {
            return error("too many captures");
        }
        self.captures[self.level] = (s, what);
        self.level += 1;
        let found = self.do_match(s, p)?;
        if found.is_none() {
            self.level -= 1;
        }
        Ok(found)
    }

    fn end_capture(&mut self, s: usize, p: usize) -> Outcome<Option<usize>> {
        let Some(open) = (0..self.level)
            .rev()
            .find(|&i| matches!(self.captures[i].1, Capture::Open))
        else {
            return error("invalid pattern capture");
        };
        self.captures[open].1 = Capture::Len(s - self.captures[open].0);
        let found = self.do_match(s, p)?;
        if found.is_none() {
            self.captures[open].1 = Capture::Open;
        }
        Ok(found)
    }

    /// `%bxy` at `p` (pointing at `x`).
    fn match_balance(&mut self, s: usize, p: usize) -> Outcome<Option<usize>> {
        let (Some(&open), Some(&close)) = (self.pat.get(p), self.pat.get(p + 1)) else {
            return error("malformed pattern (missing arguments to '%b')");
        };
        if self.src.get(s) != Some(&open) {
            return Ok(None);
        }
        let mut nesting = 1;
        for i in s + 1..self.src.len() {
            self.step(1)?;
            let c = self.src[i];
            if c == close {
                nesting -= 1;
                if nesting == 0 {
                    return Ok(Some(i + 1));
                }
            } else if c == open {
                nesting += 1;
            }
        }
        Ok(None)
    }

    /// `%1`..`%9`: the same text as a closed capture.
    fn match_capture(&mut self, s: usize, digit: u8) -> Outcome<Option<usize>> {
        let index = (digit as usize).wrapping_sub(b'1' as usize);
        let capture = self.captures[..self.level].get(index).copied();
        let (start, len) = match capture {
            Some((start, Capture::Len(len))) => (start, len),
            // A position capture never matches text.
            Some((_, Capture::Position)) => return Ok(None),
            _ => {
                return error(format!("invalid capture index %{}", (digit as char)));
            }
        };
        self.step(1 + len / 64)?;
        let fits = self.src.len() - s >= len;
        Ok((fits && self.src[start..start + len] == self.src[s..s + len]).then_some(s + len))
    }

    /// Capture `i` of a match `s..e` (the whole match if the pattern has no captures).
    fn capture(&self, i: usize, s: usize, e: usize) -> Outcome<Captured<'a>> {
        if i >= self.level {
            if i == 0 {
                return Ok(Captured::Text(&self.src[s..e]));
            }
            return error(format!("invalid capture index %{}", i + 1));
        }
        let (start, what) = self.captures[i];
        match what {
            Capture::Open => error("unfinished capture"),
            Capture::Position => Ok(Captured::Position(start + 1)),
            Capture::Len(len) => Ok(Captured::Text(&self.src[start..start + len])),
        }
    }

    /// The values of all captures of a match `s..e` (or the whole match, if `whole` and the
    /// pattern has none).
    fn captures(&self, lua: &Lua, s: usize, e: usize, whole: bool) -> Outcome<Vec<Value>> {
        let count = if self.level == 0 && whole {
            1
        } else {
            self.level
        };
        (0..count)
            .map(|i| to_value(lua, self.capture(i, s, e)?))
            .collect()
    }
}

fn to_value(lua: &Lua, captured: Captured<'_>) -> Outcome<Value> {
    match captured {
        Captured::Text(bytes) => lua.create_string(bytes).map(Value::String).map_err(raised),
        Captured::Position(at) => Ok(Value::Integer(at as mlua::Integer)),
    }
}

/// Whether `c` is in the class `%<class>` (C-locale classes, as Lua uses them).
fn class_matches(c: u8, class: u8) -> bool {
    let found = match class.to_ascii_lowercase() {
        b'a' => c.is_ascii_alphabetic(),
        b'c' => c.is_ascii_control(),
        b'd' => c.is_ascii_digit(),
        b'g' => c.is_ascii_graphic(),
        b'l' => c.is_ascii_lowercase(),
        b'p' => c.is_ascii_punctuation(),
        // C's isspace includes the vertical tab, which Rust's is_ascii_whitespace does not.
        b's' => c == b' ' || (b'\t'..=b'\r').contains(&c),
        b'u' => c.is_ascii_uppercase(),
        b'w' => c.is_ascii_alphanumeric(),
        b'x' => c.is_ascii_hexdigit(),
        // Deprecated since Lua 5.2 but still understood by 5.4.
        b'z' => c == 0,
        _ => return class == c,
    };
    if class.is_ascii_uppercase() {
        !found
    } else {
        found
    }
}

/// An error from Lua code (a replacement function) or from creating a Lua value.
fn raised(e: mlua::Error) -> Fail {
    Fail::Raised(lua_error_text(&e))
}

/// The text of an error as Lua code would see it: a memory error is Lua's own message (so the
/// run is classified as out of memory), anything else its message.
fn lua_error_text(e: &mlua::Error) -> String {
    match e {
        mlua::Error::MemoryError(_) => "not enough memory".into(),
        // mlua appends a traceback to an error from Lua code it called; Lua's gsub does not.
        mlua::Error::RuntimeError(message) => message
            .split_once("\nstack traceback:")
            .map_or(message.as_str(), |(first, _)| first)
            .to_string(),
        mlua::Error::CallbackError { cause, .. } => lua_error_text(cause),
        mlua::Error::WithContext { cause, .. } => lua_error_text(cause),
        other => other.to_string(),
    }
}

/// A 1-based, possibly negative start position turned into a 0-based index (Lua's `posrelatI`).
fn start_index(pos: i64, len: usize) -> usize {
    if pos > 0 {
        (pos as u64).min(usize::MAX as u64) as usize - 1
    } else if pos == 0 || pos.unsigned_abs() > len as u64 {
        0
    } else {
        len - pos.unsigned_abs() as usize
    }
}

/// The arguments of one call, read as Lua's C functions read theirs.
struct Args<'l> {
    lua: &'l Lua,
    name: &'static str,
    values: Vec<Value>,
}

impl Args<'_> {
    fn get(&self, i: usize) -> Value {
        self.values.get(i).cloned().unwrap_or(Value::Nil)
    }

    /// The type of argument `i` for messages: `no value` when the call had fewer arguments.
    fn type_name(&self, i: usize) -> &'static str {
        match self.values.get(i) {
            None => "no value",
            Some(Value::Integer(_) | Value::Number(_)) => "number",
            Some(other) => other.type_name(),
        }
    }

    fn bad(&self, i: usize, problem: impl std::fmt::Display) -> Fail {
        Fail::Error(format!(
            "bad argument #{} to '{}' ({problem})",
            i + 1,
            self.name
        ))
    }

    /// A string argument (a number is converted, as Lua does).
    fn string(&self, i: usize) -> Outcome<mlua::String> {
        let value = self.get(i);
        match value {
            Value::String(s) => Ok(s),
            Value::Integer(_) | Value::Number(_) => self
                .lua
                .coerce_string(value)
                .map_err(raised)?
                .ok_or_else(|| self.bad(i, "string expected")),
            _ => Err(self.bad(i, format!("string expected, got {}", self.type_name(i)))),
        }
    }

    /// An optional integer argument.
    fn integer_or(&self, i: usize, default: i64) -> Outcome<i64> {
        if self.get(i).is_nil() {
            return Ok(default);
        }
        self.integer(i)
    }

    /// An integer argument (a float with an integer value, or a numeric string, is converted).
    fn integer(&self, i: usize) -> Outcome<i64> {
        let value = self.get(i);
        match value {
            Value::Integer(n) => Ok(n),
            Value::Number(_) | Value::String(_) => {
                if let Some(n) = self.lua.coerce_integer(value.clone()).map_err(raised)? {
                    return Ok(n);
                }
                if self.lua.coerce_number(value).map_err(raised)?.is_some() {
                    Err(self.bad(i, "number has no integer representation"))
                } else {
                    Err(self.bad(i, "number expected, got string"))
                }
            }
            _ => Err(self.bad(i, format!("number expected, got {}", self.type_name(i)))),
        }
    }

    /// An optional string argument; `""` when absent.
    fn string_or_empty(&self, i: usize) -> Outcome<Vec<u8>> {
        if self.get(i).is_nil() {
            return Ok(Vec::new());
        }
        Ok(self.string(i)?.as_bytes().to_vec())
    }

    /// A table argument.
    fn table(&self, i: usize) -> Outcome<Table> {
        match self.get(i) {
            Value::Table(t) => Ok(t),
            _ => Err(self.bad(i, format!("table expected, got {}", self.type_name(i)))),
        }
    }
}

/// The normal results, or `false, message, level` for the Lua wrapper to raise with
/// `error(message, level)`: level 2 names the line that called the string function, as Lua's
/// own errors do; 0 keeps a message that is already located (or must stay as it is).
fn finish(lua: &Lua, outcome: Outcome<Vec<Value>>) -> mlua::Result<MultiValue> {
    match outcome {
        Ok(values) => Ok(MultiValue::from_vec(values)),
        Err(fail) => {
            let (message, level) = match fail {
                Fail::Error(message) => (message, 2),
                Fail::Raised(message) => (message, 0),
                Fail::Timeout => (TIMEOUT_MARK.to_string(), 0),
            };
            Ok(MultiValue::from_vec(vec![
                Value::Boolean(false),
                Value::String(lua.create_string(message)?),
                Value::Integer(level),
            ]))
        }
    }
}

/// `string.find` (`find == true`) and `string.match`.
fn find_or_match(args: &Args, find: bool, deadline: Instant) -> Outcome<Vec<Value>> {
    let lua = args.lua;
    let subject = args.string(0)?;
    let pattern = args.string(1)?;
    let (src, pat) = (subject.as_bytes(), pattern.as_bytes());
    let (src, pat): (&[u8], &[u8]) = (&src, &pat);
    let init = start_index(args.integer_or(2, 1)?, src.len());
    if init > src.len() {
        return Ok(vec![Value::Nil]);
    }
    let plain = find && !matches!(args.get(3), Value::Nil | Value::Boolean(false));
    if find && (plain || !pat.iter().any(|b| SPECIALS.contains(b))) {
        return Ok(match memchr::memmem::find(&src[init..], pat) {
            Some(at) => vec![
                Value::Integer((init + at + 1) as mlua::Integer),
                Value::Integer((init + at + pat.len()) as mlua::Integer),
            ],
            None => vec![Value::Nil],
        });
    }
    let (anchored, pat) = match pat.strip_prefix(b"^") {
        Some(rest) => (true, rest),
        None => (false, pat),
    };
    let mut m = Matcher::new(src, pat, deadline);
    let mut s = init;
    loop {
        m.reset();
        if let Some(e) = m.do_match(s, 0)? {
            return if find {
                let mut out = vec![
                    Value::Integer((s + 1) as mlua::Integer),
                    Value::Integer(e as mlua::Integer),
                ];
                out.extend(m.captures(lua, s, e, false)?);
                Ok(out)
            } else {
                m.captures(lua, s, e, true)
            };
        }
        s += 1;
        if anchored || s > src.len() {
            return Ok(vec![Value::Nil]);
        }
    }
}

/// `string.gmatch`: an iterator over the matches.
fn gmatch(args: &Args, deadline: Rc<Cell<Instant>>) -> Outcome<Vec<Value>> {
    let lua = args.lua;
    let subject = args.string(0)?;
    let pattern = args.string(1)?;
    let len = subject.as_bytes().len();
    let init = start_index(args.integer_or(2, 1)?, len).min(len + 1);
    // Where the next match is tried, and where the last one ended (an empty match right
    // there would repeat it).
    let state = RefCell::new((init, None::<usize>));
    let iterator = lua
        .create_function(move |lua, ()| {
            let outcome = (|| {
                let (src, pat) = (subject.as_bytes(), pattern.as_bytes());
                let mut m = Matcher::new(&src, &pat, deadline.get());
                let (mut s, last) = *state.borrow();
                while s <= src.len() {
                    m.reset();
                    if let Some(e) = m.do_match(s, 0)?
                        && Some(e) != last
                    {
                        *state.borrow_mut() = (e, Some(e));
                        return m.captures(lua, s, e, true);
                    }
                    s += 1;
                }
                *state.borrow_mut() = (s, last);
                Ok(Vec::new())
            })();
            finish(lua, outcome)
        })
        .map_err(raised)?;
    Ok(vec![Value::Function(
        checked(lua, iterator).map_err(raised)?,
    )])
}

/// What `gsub` replaces a match with.
enum Replacement {
    Text(Vec<u8>),
    Table(Table),
    Function(Function),
}

/// `string.gsub`. `memory_limit` bounds the result being built, which lives outside the Lua
/// state until it is complete.
fn gsub(args: &Args, deadline: Instant, memory_limit: usize) -> Outcome<Vec<Value>> {
    let lua = args.lua;
    let subject = args.string(0)?;
    let pattern = args.string(1)?;
    let (src, pat) = (subject.as_bytes(), pattern.as_bytes());
    let (src, pat): (&[u8], &[u8]) = (&src, &pat);
    let replacement = match args.get(2) {
        Value::Table(t) => Replacement::Table(t),
        Value::Function(f) => Replacement::Function(f),
        Value::String(_) | Value::Integer(_) | Value::Number(_) => {
            Replacement::Text(args.string(2)?.as_bytes().to_vec())
        }
        _ => {
            return Err(args.bad(
                2,
                format!("string/function/table expected, got {}", args.type_name(2)),
            ));
        }
    };
    let max = args.integer_or(3, src.len() as i64 + 1)?;
    let room = memory_limit.saturating_sub(lua.used_memory());
    let (anchored, pat) = match pat.strip_prefix(b"^") {
        Some(rest) => (true, rest),
        None => (false, pat),
    };
    let mut m = Matcher::new(src, pat, deadline);
    let mut out: Vec<u8> = Vec::new();
    let mut s = 0;
    let mut last = None;
    let mut count: i64 = 0;
    while count < max {
        m.reset();
        match m.do_match(s, 0)? {
            Some(e) if Some(e) != last => {
                count += 1;
                replace(lua, &m, &replacement, s, e, &mut out)?;
                s = e;
                last = Some(e);
            }
            _ if s < src.len() => {
                out.push(src[s]);
                s += 1;
            }
            _ => break,
        }
        if out.len() > room {
            return Err(Fail::Raised("not enough memory".into()));
        }
        if anchored {
            break;
        }
    }
    if count == 0 {
        return Ok(vec![Value::String(subject.clone()), Value::Integer(0)]);
    }
    out.extend_from_slice(&src[s..]);
    if out.len() > room {
        return Err(Fail::Raised("not enough memory".into()));
    }
    let result = lua.create_string(&out).map_err(raised)?;
    Ok(vec![Value::String(result), Value::Integer(count)])
}

/// Appends the replacement of the match `s..e` to `out`.
fn replace(
    lua: &Lua,
    m: &Matcher,
    replacement: &Replacement,
    s: usize,
    e: usize,
    out: &mut Vec<u8>,
) -> Outcome<()> {
    let lua_value = match replacement {
        Replacement::Text(text) => {
            let mut bytes = text.iter();
            while let Some(&c) = bytes.next() {
                if c != b'%' {
                    out.push(c);
                    continue;
                }
                match bytes.next() {
                    Some(b'%') => out.push(b'%'),
                    Some(b'0') => out.extend_from_slice(&m.src[s..e]),
                    Some(&d) if d.is_ascii_digit() => {
                        match m.capture((d - b'1') as usize, s, e)? {
                            Captured::Text(text) => out.extend_from_slice(text),
                            Captured::Position(at) => {
                                out.extend_from_slice(at.to_string().as_bytes())
                            }
                        }
                    }
                    _ => return error("invalid use of '%' in replacement string"),
                }
            }
            return Ok(());
        }
        Replacement::Table(table) => {
            let key = to_value(lua, m.capture(0, s, e)?)?;
            table.get::<Value>(key).map_err(raised)?
        }
        Replacement::Function(f) => {
            let captures = m.captures(lua, s, e, true)?;
            f.call::<Value>(MultiValue::from_vec(captures))
                .map_err(raised)?
        }
    };
    match lua_value {
        Value::Nil | Value::Boolean(false) => out.extend_from_slice(&m.src[s..e]),
        Value::String(text) => out.extend_from_slice(&text.as_bytes()),
        value @ (Value::Integer(_) | Value::Number(_)) => {
            let text = lua.coerce_string(value).map_err(raised)?;
            out.extend_from_slice(&text.expect("a number converts").as_bytes());
        }
        other => {
            return error(format!(
                "invalid replacement value (a {})",
                other.type_name()
            ));
        }
    }
    Ok(())
}

/// `string.rep`. Lua's loops `n` times even when there is nothing to copy (`string.rep("",
/// 1e15)`); this one returns `""` at once. The result is built outside the Lua state, so it is
/// checked against the room left under `memory_limit` first.
fn rep(args: &Args, memory_limit: usize) -> Outcome<Vec<Value>> {
    let lua = args.lua;
    let s = args.string(0)?;
    let n = args.integer(1)?;
    let sep = args.string_or_empty(2)?;
    let s = s.as_bytes();
    let unit = s.len() + sep.len();
    if n <= 0 || unit == 0 {
        return Ok(vec![Value::String(lua.create_string("").map_err(raised)?)]);
    }
    let n = n as u64;
    // Lua's own limit on the size of a string `rep` builds.
    if unit as u64 > i32::MAX as u64 / n {
        return error("resulting string too large");
    }
    let total = (n * s.len() as u64 + (n - 1) * sep.len() as u64) as usize;
    if total > memory_limit.saturating_sub(lua.used_memory()) {
        return Err(Fail::Raised("not enough memory".into()));
    }
    let mut out = Vec::with_capacity(total);
    for i in 0..n {
        if i > 0 {
            out.extend_from_slice(&sep);
        }
        out.extend_from_slice(&s);
    }
    Ok(vec![Value::String(
        lua.create_string(&out).map_err(raised)?,
    )])
}

/// `table.move`. Moving nils allocates nothing, so Lua's loop over `table.move({}, 1, 1e12, 2)`
/// could only be stopped by the clock, which this one looks at.
fn move_items(args: &Args, deadline: Instant) -> Outcome<Vec<Value>> {
    let f = args.integer(1)?;
    let e = args.integer(2)?;
    let t = args.integer(3)?;
    let source = args.table(0)?;
    let target = if args.get(4).is_nil() {
        source.clone()
    } else {
        args.table(4)?
    };
    if e >= f {
        if !(f > 0 || e < i64::MAX + f) {
            return Err(args.bad(2, "too many elements to move"));
        }
        let n = e - f + 1;
        if t > i64::MAX - n + 1 {
            return Err(args.bad(3, "destination wrap around"));
        }
        let same = source.equals(&target).map_err(raised)?;
        let forward = t > e || t <= f || !same;
        let mut until_clock = CLOCK_EVERY;
        for step in 0..n {
            let i = if forward { step } else { n - 1 - step };
            let value: Value = source.get(f + i).map_err(raised)?;
            target.set(t + i, value).map_err(raised)?;
            until_clock -= 1;
            if until_clock == 0 {
                until_clock = CLOCK_EVERY;
                if Instant::now() > deadline {
                    return Err(Fail::Timeout);
                }
            }
        }
    }
    Ok(vec![Value::Table(target)])
}

/// Calls its upvalue (a Rust function of this module) with its arguments and returns the
/// results, or raises the error the results describe (`false, message, level`).
unsafe extern "C-unwind" fn call_checked(state: *mut ffi::lua_State) -> c_int {
    // SAFETY: called by Lua as a C function with one upvalue. Nothing here owns anything to
    // drop, so an error raised by the call or by `lua_error` may unwind (longjmp) through it.
    unsafe {
        let nargs = ffi::lua_gettop(state);
        ffi::luaL_checkstack(state, 3, c"pattern function".as_ptr());
        ffi::lua_pushvalue(state, ffi::lua_upvalueindex(1));
        ffi::lua_insert(state, 1);
        ffi::lua_call(state, nargs, ffi::LUA_MULTRET);
        let nresults = ffi::lua_gettop(state);
        if nresults >= 3
            && ffi::lua_type(state, 1) == ffi::LUA_TBOOLEAN
            && ffi::lua_toboolean(state, 1) == 0
        {
            let level = ffi::lua_tointegerx(state, 3, std::ptr::null_mut());
            ffi::lua_settop(state, 2);
            if level > 0 {
                // `file:line: ` of the function that called this one, then the message.
                ffi::luaL_where(state, 1);
                ffi::lua_insert(state, 2);
                ffi::lua_concat(state, 2);
            }
            ffi::lua_error(state);
        }
        nresults
    }
}

/// `f` (returning `false, message, level` on failure) as a C function that raises instead.
pub(super) fn checked(lua: &Lua, f: Function) -> mlua::Result<Function> {
    // SAFETY: `exec_raw` runs the closure in a protected call with `f` as its only stack slot;
    // `lua_pushcclosure` pops it as the upvalue and leaves the new closure, the one result.
    unsafe {
        lua.exec_raw(f, |state| {
            ffi::lua_pushcclosure(state, call_checked, 1);
        })
    }
}

/// Replaces `find`, `match`, `gmatch`, `gsub` and `rep` in the `string` table, and `move` in
/// `table`, with the functions of this module.
pub(crate) fn register(
    lua: &Lua,
    into: &Table,
    table: &Table,
    deadline: &Rc<Cell<Instant>>,
    memory_limit: usize,
) -> mlua::Result<()> {
    set_function(lua, into, "rep", move |args| rep(args, memory_limit))?;
    let move_deadline = deadline.clone();
    set_function(lua, table, "move", move |args| {
        move_items(args, move_deadline.get())
    })?;
    for (name, find) in [("find", true), ("match", false)] {
        let deadline = deadline.clone();
        set_function(lua, into, name, move |args| {
            find_or_match(args, find, deadline.get())
        })?;
    }
    let gmatch_deadline = deadline.clone();
    set_function(lua, into, "gmatch", move |args| {
        gmatch(args, gmatch_deadline.clone())
    })?;
    let gsub_deadline = deadline.clone();
    set_function(lua, into, "gsub", move |args| {
        gsub(args, gsub_deadline.get(), memory_limit)
    })
}

/// Sets `table[name]` to a [`checked`] function that runs `body` on its arguments (`name` is
/// what its error messages call it).
fn set_function(
    lua: &Lua,
    table: &Table,
    name: &'static str,
    body: impl Fn(&Args) -> Outcome<Vec<Value>> + 'static,
) -> mlua::Result<()> {
    let f = lua.create_function(move |lua, values: MultiValue| {
        let args = Args {
            lua,
            name,
            values: values.into_vec(),
        };
        finish(lua, body(&args))
    })?;
    table.raw_set(name, checked(lua, f)?)
}
