//! Canonical JSON text taken apart without building a tree: the entries of an object and the
//! items of an array, each as its own text. The role log compares a big value of a role's
//! variables kept as text ([`crate::schedule::data::TextPart`]) this way.
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

/// The end of the value that starts at `i`.
fn value_end(b: &[u8], i: usize) -> usize {
    match b[i] {
        b'"' => string_end(b, i + 1),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b[j] {
                    b'"' => j = string_end(b, j + 1),
                    b'{' | b'[' => {
                        depth += 1;
                        j += 1;
                    }
                    b'}' | b']' => {
                        depth -= 1;
                        j += 1;
                        if depth == 0 {
                            return j;
                        }
                    }
                    _ => j += 1,
                }
            }
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']') {
                j += 1;
            }
            j
        }
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

/// The entries of the object `text`, in key order, a key given twice keeping its last value
/// (as a parse does): each key decoded and its value's text.
pub(crate) fn entries(text: &str) -> Vec<(Cow<'_, str>, &str)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 1;
    if b.get(i) == Some(&b'}') {
        return out;
    }
    loop {
        let key_end = string_end(b, i + 1);
        let key = &text[i..key_end];
        let key = match key.contains('\\') {
            false => Cow::Borrowed(&key[1..key.len() - 1]),
            true => Cow::Owned(serde_json::from_str(key).expect("a checked JSON string")),
        };
        let start = key_end + 1;
        let end = value_end(b, start);
        out.push((key, &text[start..end]));
        if b[end] == b'}' {
            break;
        }
        i = end + 1;
    }
    if !out.is_sorted_by(|a, b| a.0 < b.0) {
        // Stable: of keys given twice, the last stays last.
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(Cow<'_, str>, &str)> = Vec::with_capacity(out.len());
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

/// The items of the array `text`, each as its text.
pub(crate) fn items(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 1;
    if b.get(i) == Some(&b']') {
        return out;
    }
    loop {
        let end = value_end(b, i);
        out.push(&text[i..end]);
        if b[end] == b']' {
            break;
        }
        i = end + 1;
    }
    out
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
        let got = entries(&text);
        let want = value.as_object().unwrap();
        assert_eq!(got.len(), want.len());
        for ((key, part), (want_key, want_value)) in got.iter().zip(want) {
            assert_eq!(key, want_key);
            assert_eq!(*part, canonical(want_value));
        }
        let arr = canonical(&value["arr"]);
        let parts = items(&arr);
        let want: Vec<String> = value["arr"]
            .as_array()
            .unwrap()
            .iter()
            .map(canonical)
            .collect();
        assert_eq!(parts, want);
        assert!(entries("{}").is_empty() && items("[]").is_empty());
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value_as_a_parse_does() {
        let text = r#"{"b":1,"a":2,"b":3}"#;
        let parsed: Value = serde_json::from_str(text).unwrap();
        let got: Vec<(String, &str)> = entries(text)
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v))
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
