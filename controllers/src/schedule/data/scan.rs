//! One pass over a schedule's JSON text that checks it as strictly as serde_json's parse into a
//! [`serde_json::Value`] and finds where a node's view lies in it, building nothing but the
//! tapes of a role's big own values ([`Cut::tapes`]).
//!
//! A follower runs this over every schedule it takes (a megabyte on a large fleet), so it is a
//! plain byte loop: strings, the bulk of a schedule, are skipped eight bytes at a time. What it
//! takes and refuses is serde_json's, to the byte (the `schedule_text` fuzz target compares
//! them): whitespace is space, tab, CR and LF; strings hold no control characters and only the
//! escapes JSON has, `\u` escapes pairing surrogates; numbers have JSON's grammar and a finite
//! value; containers nest at most [`MAX_DEPTH`] deep; after the value only whitespace.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use crate::render::vars::json_text::{Tape, TapeWriter};

/// How deep serde_json nests containers before it refuses the text (its recursion limit, 128,
/// counted the way it counts).
pub(crate) const MAX_DEPTH: usize = 127;

/// Where the parts of a node's view are in a schedule's data: the value of each of
/// [`super::VIEW_KEYS`] at the top (the last one when a key is given twice, as a parse keeps),
/// and of the node's entry in the last `nodes` when that is an object holding it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Cut {
    pub(crate) keys: [Option<Range<usize>>; 3],
    pub(crate) node: Option<Range<usize>>,
    /// When `roles` (the one in `keys`) is an object: each of its entries, the range of the key
    /// string (quotes included) and of the value.
    pub roles: Vec<(Range<usize>, Range<usize>)>,
    /// For each entry of `roles`, in the same order: when its value is an object, its entries
    /// (the range of the key string, quotes included, and of the value); empty otherwise.
    pub(crate) role_entries: Vec<Vec<(Range<usize>, Range<usize>)>>,
    /// The [`Tape`] of each value in `role_entries` of [`super::UNPARSED_MIN`] bytes or more, by
    /// where it starts: written in the same pass, for the role log's comparison of values kept
    /// as text.
    pub(crate) tapes: BTreeMap<usize, Arc<OnceLock<Tape>>>,
}

/// What [`Scan::value_recorded`] tells of the values it passes (see [`TapeWriter`]).
trait Record {
    fn open(&mut self);
    fn close(&mut self, end: usize);
    fn leaf(&mut self, end: usize);
}

/// Nothing recorded.
impl Record for () {
    #[inline(always)]
    fn open(&mut self) {}
    #[inline(always)]
    fn close(&mut self, _: usize) {}
    #[inline(always)]
    fn leaf(&mut self, _: usize) {}
}

impl Record for TapeWriter {
    #[inline(always)]
    fn open(&mut self) {
        TapeWriter::open(self);
    }
    #[inline(always)]
    fn close(&mut self, end: usize) {
        TapeWriter::close(self, end);
    }
    #[inline(always)]
    fn leaf(&mut self, end: usize) {
        TapeWriter::leaf(self, end);
    }
}

/// Checks `text` and cuts `host`'s view from it; `None` when serde_json would refuse the text
/// or it is not an object at the top.
pub(crate) fn cut(text: &str, host: &str) -> Option<Cut> {
    let mut scan = Scan {
        text,
        b: text.as_bytes(),
        i: 0,
    };
    let cut = scan.top(host)?;
    scan.ws();
    (scan.i == scan.b.len()).then_some(cut)
}

struct Scan<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
}

/// Which bytes of a word are a quote, a backslash or a control character: the lowest flagged
/// byte is exact (higher flags may be false, after a borrow), which is all the scan uses.
fn special(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let quote = zero(word ^ (ONES * b'"' as u64));
    let backslash = zero(word ^ (ONES * b'\\' as u64));
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGH;
    quote | backslash | control
}

impl Scan<'_> {
    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn ws(&mut self) {
        // Canonical text has none: one comparison decides that.
        if self.peek().is_none_or(|b| b > b' ') {
            return;
        }
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    #[inline(always)]
    fn eat(&mut self, byte: u8) -> Option<()> {
        self.ws();
        (self.peek()? == byte).then(|| self.i += 1)
    }

    /// The top-level object: each key's value checked, the view's parts noted.
    fn top(&mut self, host: &str) -> Option<Cut> {
        let mut cut = Cut::default();
        self.ws();
        if self.peek()? != b'{' {
            return None;
        }
        self.object(|scan, key| {
            let start = scan.i;
            if let Some(k) = super::VIEW_KEYS.iter().position(|v| scan.is(&key, v)) {
                if super::VIEW_KEYS[k] == "roles" {
                    cut.roles.clear();
                    cut.role_entries.clear();
                    cut.tapes.clear();
                    scan.roles(&mut cut)?;
                } else {
                    scan.value(1)?;
                }
                cut.keys[k] = Some(start..scan.i);
            } else if scan.is(&key, "nodes") {
                cut.node = None;
                scan.entries(|scan, name, value| {
                    if scan.is(&name, host) {
                        cut.node = Some(value);
                    }
                })?;
            } else {
                scan.value(1)?;
            }
            Some(())
        })?;
        Some(cut)
    }

    /// A top-level key's value (depth 1): an object's entries are each checked at depth 2 and
    /// given to `entry` with the range of their value; any other value is only checked.
    fn entries(&mut self, mut entry: impl FnMut(&Self, Range<usize>, Range<usize>)) -> Option<()> {
        if self.peek()? != b'{' {
            return self.value(1);
        }
        self.object(|scan, name| {
            let start = scan.i;
            scan.value(2)?;
            entry(scan, name, start..scan.i);
            Some(())
        })
    }

    /// The value of `roles` (depth 1): each entry noted in `cut` with, when its value is an
    /// object, that object's entries (checked at depth 3); any other value only checked.
    fn roles(&mut self, cut: &mut Cut) -> Option<()> {
        if self.peek()? != b'{' {
            return self.value(1);
        }
        let mut writer = TapeWriter::new();
        self.object(|scan, name| {
            let start = scan.i;
            let mut entries = Vec::new();
            if scan.peek()? == b'{' {
                scan.object(|scan, key| {
                    let at = scan.i;
                    writer.start(at);
                    scan.value_recorded(3, &mut writer)?;
                    if scan.i - at >= super::UNPARSED_MIN {
                        cut.tapes
                            .insert(at, Arc::new(OnceLock::from(writer.take())));
                    }
                    entries.push((key, at..scan.i));
                    Some(())
                })?;
            } else {
                scan.value(2)?;
            }
            cut.roles.push((name, start..scan.i));
            cut.role_entries.push(entries);
            Some(())
        })
    }

    /// An object from its `{`: `entry` reads each value (the scan at its first byte), given the
    /// range of its key.
    fn object(
        &mut self,
        mut entry: impl FnMut(&mut Self, Range<usize>) -> Option<()>,
    ) -> Option<()> {
        self.i += 1;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.key()?;
            self.eat(b':')?;
            self.ws();
            entry(self, key)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A key: the range of its string, quotes included.
    #[inline(always)]
    fn key(&mut self) -> Option<Range<usize>> {
        self.ws();
        let start = self.i;
        if self.peek()? != b'"' {
            return None;
        }
        self.string()?;
        Some(start..self.i)
    }

    /// Whether the key string at `key` says `name`: compared as written, or decoded when it
    /// has escapes.
    fn is(&self, key: &Range<usize>, name: &str) -> bool {
        let written = &self.b[key.start + 1..key.end - 1];
        if !written.contains(&b'\\') {
            return written == name.as_bytes();
        }
        serde_json::from_str::<String>(&self.text[key.clone()]).is_ok_and(|k| k == name)
    }

    /// One value inside `open` containers, checked; the scan stops right after it.
    fn value(&mut self, open: usize) -> Option<()> {
        self.value_recorded(open, &mut ())
    }

    /// [`Scan::value`], telling `record` of each value inside it (itself included).
    fn value_recorded(&mut self, open: usize, record: &mut impl Record) -> Option<()> {
        // Containers opened here, innermost in bit 0: 1 an object, 0 an array (at most
        // MAX_DEPTH, so they fit).
        let mut stack: u128 = 0;
        let mut depth = 0usize;
        'value: loop {
            self.ws();
            match self.peek()? {
                open_at @ (b'{' | b'[') => {
                    if open + depth + 1 > MAX_DEPTH {
                        return None;
                    }
                    self.i += 1;
                    record.open();
                    self.ws();
                    let object = open_at == b'{';
                    let close = if object { b'}' } else { b']' };
                    if self.peek()? == close {
                        self.i += 1;
                        record.close(self.i);
                    } else {
                        stack = stack << 1 | object as u128;
                        depth += 1;
                        if object {
                            self.key()?;
                            record.leaf(self.i);
                            self.eat(b':')?;
                        }
                        continue 'value;
                    }
                }
                first => {
                    match first {
                        b'"' => self.string()?,
                        b'-' | b'0'..=b'9' => self.number()?,
                        b't' => self.literal(b"true")?,
                        b'f' => self.literal(b"false")?,
                        b'n' => self.literal(b"null")?,
                        _ => return None,
                    }
                    record.leaf(self.i);
                }
            }
            // After a value: close what ends here, then the next element or key.
            loop {
                if depth == 0 {
                    return Some(());
                }
                let object = stack & 1 == 1;
                self.ws();
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        if object {
                            self.key()?;
                            record.leaf(self.i);
                            self.eat(b':')?;
                        }
                        continue 'value;
                    }
                    b'}' if object => {}
                    b']' if !object => {}
                    _ => return None,
                }
                self.i += 1;
                record.close(self.i);
                stack >>= 1;
                depth -= 1;
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A string from its opening quote.
    #[inline(always)]
    fn string(&mut self) -> Option<()> {
        self.i += 1;
        loop {
            while let Some(chunk) = self.b.get(self.i..self.i + 8) {
                let flags = special(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
                if flags != 0 {
                    self.i += flags.trailing_zeros() as usize / 8;
                    if self.b[self.i] == b'"' {
                        self.i += 1;
                        return Some(());
                    }
                    break;
                }
                self.i += 8;
            }
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => self.escape()?,
                0..0x20 => return None,
                _ => self.i += 1,
            }
        }
    }

    /// An escape from its backslash; a leading surrogate must be followed by a trailing one.
    fn escape(&mut self) -> Option<()> {
        self.i += 1;
        match self.peek()? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                self.i += 1;
                Some(())
            }
            b'u' => match self.hex()? {
                0xD800..=0xDBFF => {
                    if self.b.get(self.i..self.i + 2)? != b"\\u" {
                        return None;
                    }
                    self.i += 1;
                    matches!(self.hex()?, 0xDC00..=0xDFFF).then_some(())
                }
                0xDC00..=0xDFFF => None,
                _ => Some(()),
            },
            _ => None,
        }
    }

    /// Four hex digits after the `u` at the scan's position.
    fn hex(&mut self) -> Option<u16> {
        let digits = self.b.get(self.i + 1..self.i + 5)?;
        let mut n = 0u16;
        for d in digits {
            n = n << 4 | (*d as char).to_digit(16)? as u16;
        }
        self.i += 5;
        Some(n)
    }

    /// A number in JSON's grammar. One that may not fit a finite float (an exponent, or more
    /// than 300 integer digits) is handed to serde_json, which decides.
    fn number(&mut self) -> Option<()> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let mut rare = self.i - start > 300;
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.first_digit()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.first_digit()?;
            rare = true;
        }
        if rare {
            serde_json::from_str::<serde_json::Value>(&self.text[start..self.i]).ok()?;
        }
        Some(())
    }

    fn first_digit(&mut self) -> Option<()> {
        if !self.peek()?.is_ascii_digit() {
            return None;
        }
        self.digits();
        Some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|d| d.is_ascii_digit()) {
            self.i += 1;
        }
    }
}
