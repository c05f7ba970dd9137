//! The schedule hash: SHA-1 hex of the compact JSON of `data` with object keys sorted.
//!
//! verwalter 0.13 hashed `serde_json::to_string(data)` with serde_json's default `BTreeMap`
//! maps, so keys came out sorted and there was no whitespace. Nodes of both versions compare
//! these hashes, so this function writes the sorted form itself instead of relying on which map
//! type serde_json was compiled with (a dependency enabling `preserve_order` would silently break
//! the cluster).

use serde_json::Value;
use sha1::{Digest, Sha1};

/// SHA-1 hex (40 lowercase characters) of the canonical form of `data`.
pub fn schedule_hash(data: &Value) -> String {
    let mut buf = Vec::with_capacity(4096);
    write_canonical(data, &mut buf);
    hex::encode(Sha1::digest(&buf))
}

/// Compact JSON with object keys in byte order, as serde_json wrote it for verwalter 0.13.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            out.push(b'{');
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            // Already sorted unless serde_json keeps insertion order; sorting a sorted list is cheap.
            if !entries.is_sorted_by(|a, b| a.0 <= b.0) {
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            }
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // Writing a scalar into a Vec cannot fail.
    serde_json::to_writer(&mut *out, value).expect("scalar serializes");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn known_hash_of_a_fixed_schedule() {
        // `printf '%s' '{"nodes":{"alpha":{"roles":{"web":{"instances":2}}}},"roles":{"web":{"version":"v1"}},"vars":{"x":1.5}}' | sha1sum`
        let data = json!({
            "vars": {"x": 1.5},
            "roles": {"web": {"version": "v1"}},
            "nodes": {"alpha": {"roles": {"web": {"instances": 2}}}},
        });
        let mut buf = Vec::new();
        write_canonical(&data, &mut buf);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            r#"{"nodes":{"alpha":{"roles":{"web":{"instances":2}}}},"roles":{"web":{"version":"v1"}},"vars":{"x":1.5}}"#
        );
        assert_eq!(
            schedule_hash(&data),
            "c7d419ede24a39f7c0e9f0c9d892c2983064c80d"
        );
    }

    #[test]
    fn empty_schedule_hash() {
        // SHA-1 of the two bytes `{}`.
        assert_eq!(
            schedule_hash(&json!({})),
            "bf21a9e8fbc5a3846fb05b4fa0859e0917b2202f"
        );
    }

    #[test]
    fn strings_are_escaped_like_serde_json() {
        let data = json!({"a\"b": "line\nbreak \u{1} é"});
        let mut buf = Vec::new();
        write_canonical(&data, &mut buf);
        assert_eq!(buf, serde_json::to_vec(&data).unwrap());
    }
}
