//! Canonical JSON text taken apart without building a tree: its [`Tape`] (where each value
//! ends), then the entries of an object and the items of an array, each as its own text. The
//! role log compares a big value of a role's variables kept as text
//! ([`crate::schedule::data::TextPart`]) this way.
//!
//! The text must be canonical JSON that has been checked (no whitespace, keys sorted, the
//! escapes serde_json writes): a schedule's text a node took. In that form two values are equal
//! when their texts are, except numbers written as floats (`0.0` and `-0.0`).

use std::borrow::Cow;

/// Which bytes of a word are a quote or a backslash: the lowest flagged byte is exact (higher
/// flags may be false, after a borrow), which is all [`string_end`] uses.
fn quote_or_backslash(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    zero(word ^ (ONES * b'"' as u64)) | zero(word ^ (ONES * b'\\' as u64))
}

/// The end of the string whose opening quote is at `i - 1`: the index after its closing quote.
fn string_end(b: &[u8], mut i: usize) -> usize {
    loop {
        while let Some(chunk) = b.get(i..i + 8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let flags = quote_or_backslash(word);
            if flags != 0 {
                i += flags.trailing_zeros() as usize / 8;
                break;
            }
            i += 8;
        }
        match b[i] {
            b'"' => return i + 1,
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// The structure of a canonical JSON text, made in one pass: every value in document order (an
/// object's keys are values too, each just before its value), each with where it ends and where
/// the values after its own (its subtree) begin. Walking a value's entries or items then reads
/// no text; a node that keeps a big value as text keeps its tape for the next comparison.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Tape(Vec<Node>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Node {
    /// Where the value's text ends.
    end: u32,
    /// The index of the first node after the value's subtree.
    next: u32,
}

/// The tape of `text`.
pub(crate) fn tape(text: &str) -> Tape {
    let b = text.as_bytes();
    let mut nodes = Vec::with_capacity(b.len() / 16);
    let mut open = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' | b'[' => {
                open.push(nodes.len());
                nodes.push(Node { end: 0, next: 0 });
                i += 1;
            }
            b'}' | b']' => {
                i += 1;
                let at = open.pop().expect("balanced JSON");
                nodes[at] = Node {
                    end: i as u32,
                    next: nodes.len() as u32,
                };
            }
            b',' | b':' => i += 1,
            first => {
                let end = match first {
                    b'"' => string_end(b, i + 1),
                    _ => {
                        let mut j = i;
                        while j < b.len() && !matches!(b[j], b',' | b':' | b'}' | b']') {
                            j += 1;
                        }
                        j
                    }
                };
                let next = nodes.len() as u32 + 1;
                nodes.push(Node {
                    end: end as u32,
                    next,
                });
                i = end;
            }
        }
    }
    Tape(nodes)
}

/// A [`Tape`] written by a pass that reads the text anyway (the arrival check,
/// [`crate::schedule::data`]'s scan), told of each value it passes in document order: a
/// container when it opens and where it closes, a key or any other value where it ends. The
/// positions are the text's in which the value starts at `base`.
pub(crate) struct TapeWriter {
    nodes: Vec<Node>,
    open: Vec<usize>,
    base: usize,
}

impl TapeWriter {
    pub(crate) fn new() -> TapeWriter {
        TapeWriter {
            nodes: Vec::new(),
            open: Vec::new(),
            base: 0,
        }
    }

    /// Starts over for a value beginning at `base`.
    pub(crate) fn start(&mut self, base: usize) {
        self.nodes.clear();
        self.open.clear();
        self.base = base;
    }

    #[inline(always)]
    pub(crate) fn open(&mut self) {
        self.open.push(self.nodes.len());
        self.nodes.push(Node { end: 0, next: 0 });
    }

    #[inline(always)]
    pub(crate) fn close(&mut self, end: usize) {
        let at = self.open.pop().expect("a container was opened");
        self.nodes[at] = Node {
            end: (end - self.base) as u32,
            next: self.nodes.len() as u32,
        };
    }

    #[inline(always)]
    pub(crate) fn leaf(&mut self, end: usize) {
        let next = self.nodes.len() as u32 + 1;
        self.nodes.push(Node {
            end: (end - self.base) as u32,
            next,
        });
    }

    /// The tape written since [`TapeWriter::start`] (the writer is left empty).
    pub(crate) fn take(&mut self) -> Tape {
        Tape(std::mem::take(&mut self.nodes))
    }
}

/// A value inside a text with its tape: node `node`, whose text begins at `start`.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub(crate) text: &'a str,
    pub(crate) tape: &'a Tape,
    node: usize,
    start: usize,
}

impl<'a> At<'a> {
    /// The whole of `text`, whose tape is `tape`.
    pub(crate) fn root(text: &'a str, tape: &'a Tape) -> At<'a> {
        At {
            text,
            tape,
            node: 0,
            start: 0,
        }
    }

    /// The value's text.
    #[inline]
    pub(crate) fn get(&self) -> &'a str {
        &self.text[self.start..self.tape.0[self.node].end as usize]
    }

    /// The values right under this one, each with the key before it for an object.
    pub(crate) fn children(&self) -> Children<'a> {
        Children {
            parent: *self,
            next: self.node + 1,
            last: self.tape.0[self.node].next as usize,
            pos: self.start + 1,
            object: self.text.as_bytes()[self.start] == b'{',
        }
    }
}

/// [`At::children`]: the node and text position of the next one.
#[derive(Clone)]
pub(crate) struct Children<'a> {
    parent: At<'a>,
    next: usize,
    last: usize,
    pos: usize,
    object: bool,
}

impl<'a> Iterator for Children<'a> {
    type Item = (Option<At<'a>>, At<'a>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.last {
            return None;
        }
        let nodes = &self.parent.tape.0;
        let mut take = || {
            let at = At {
                node: self.next,
                start: self.pos,
                ..self.parent
            };
            self.pos = nodes[self.next].end as usize + 1;
            self.next = nodes[self.next].next as usize;
            at
        };
        let key = self.object.then(&mut take);
        Some((key, take()))
    }
}

/// What kind of value `text` is, as JSON tells it by its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Object,
    Array,
    String,
    /// A number, `true`, `false` or `null`.
    Other,
}

pub(crate) fn kind(text: &str) -> Kind {
    match text.as_bytes().first() {
        Some(b'{') => Kind::Object,
        Some(b'[') => Kind::Array,
        Some(b'"') => Kind::String,
        _ => Kind::Other,
    }
}

/// Whether two values whose texts differ may still be equal: numbers written as floats (the
/// texts of `0.0` and `-0.0` differ), and objects or arrays that may hold such numbers.
pub(crate) fn may_equal(a: &str, b: &str) -> bool {
    let float = |t: &str| t.bytes().any(|c| matches!(c, b'.' | b'e' | b'E'));
    match (kind(a), kind(b)) {
        (Kind::Object, Kind::Object) | (Kind::Array, Kind::Array) => float(a) && float(b),
        (Kind::Other, Kind::Other) => float(a) && float(b),
        _ => false,
    }
}

/// The entries of the object at `at`, in key order, a key given twice keeping its last value
/// (as a parse does): each key decoded, and its value.
pub(crate) fn entries<'a>(at: &At<'a>) -> Vec<(Cow<'a, str>, At<'a>)> {
    let mut out: Vec<(Cow<'a, str>, At<'a>)> = at
        .children()
        .map(|(key, value)| {
            let key = key.expect("an object's entries have keys").get();
            let key = match key.contains('\\') {
                false => Cow::Borrowed(&key[1..key.len() - 1]),
                true => Cow::Owned(serde_json::from_str(key).expect("a checked JSON string")),
            };
            (key, value)
        })
        .collect();
    if !out.is_sorted_by(|a, b| a.0 < b.0) {
        // Stable: of keys given twice, the last stays last.
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(Cow<'a, str>, At<'a>)> = Vec::with_capacity(out.len());
        for entry in out {
            match kept.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => kept.push(entry),
            }
        }
        out = kept;
    }
    out
}

/// The items of the array at `at`.
pub(crate) fn items<'a>(at: &At<'a>) -> Vec<At<'a>> {
    at.children().map(|(_, item)| item).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::schedule::hash::canonical_json;

    fn canonical(value: &Value) -> String {
        String::from_utf8(canonical_json(value)).unwrap()
    }

    #[test]
    fn entries_and_items_are_those_of_the_parsed_value() {
        let value = json!({
            "a\"b": {"x": [1, 2.5, -3, "s\\\"q\u{1}é"], "y": null},
            "arr": [[], {}, [[1]], {"k": {"l": true}}, "]}\"", false],
            "empty": {}, "n": 1e300, "s": "0123456789abcdefghij\"\\x",
            "\u{2603}": "snow", "z": -0.0
        });
        let text = canonical(&value);
        let tape = tape(&text);
        let root = At::root(&text, &tape);
        assert_eq!(root.get(), text);
        let got = entries(&root);
        let want = value.as_object().unwrap();
        assert_eq!(got.len(), want.len());
        for ((key, part), (want_key, want_value)) in got.iter().zip(want) {
            assert_eq!(key, want_key);
            assert_eq!(part.get(), canonical(want_value));
        }
        let arr = &got.iter().find(|(k, _)| k == "arr").unwrap().1;
        let parts: Vec<&str> = items(arr).iter().map(At::get).collect();
        let want: Vec<String> = value["arr"]
            .as_array()
            .unwrap()
            .iter()
            .map(canonical)
            .collect();
        assert_eq!(parts, want);
        let inner = &entries(&items(arr)[3])[0].1;
        assert_eq!(inner.get(), r#"{"l":true}"#);
        assert_eq!(entries(&entries(inner)[0].1).len(), 0);
        for empty in ["{}", "[]"] {
            let tape = super::tape(empty);
            assert_eq!(At::root(empty, &tape).children().count(), 0);
        }
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value_as_a_parse_does() {
        let text = r#"{"b":1,"a":2,"b":3}"#;
        let parsed: Value = serde_json::from_str(text).unwrap();
        let tape = tape(text);
        let got: Vec<(String, &str)> = entries(&At::root(text, &tape))
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.get()))
            .collect();
        assert_eq!(got, [("a".to_string(), "2"), ("b".to_string(), "3")]);
        assert_eq!(parsed, json!({"a": 2, "b": 3}));
    }

    #[test]
    fn only_floats_may_be_equal_with_other_text() {
        assert!(may_equal("0.0", "-0.0"));
        assert!(may_equal("[0.0]", "[-0.0]"));
        assert!(!may_equal("1", "2"));
        assert!(!may_equal("\"a.b\"", "\"a.c\""));
        assert!(!may_equal("[1]", "{}"));
        assert_eq!(kind("{}"), Kind::Object);
        assert_eq!(kind("null"), Kind::Other);
    }
}
