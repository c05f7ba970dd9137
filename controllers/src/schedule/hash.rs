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
    hash_canonical(&canonical_json(data))
}

/// The canonical form of `data` (compact, keys sorted): what the hash covers, and what the
/// storage dir writes, so a schedule is serialised once.
pub(crate) fn canonical_json(data: &Value) -> Vec<u8> {
    let mut buf = Vec::with_capacity(4096);
    write_canonical(data, &mut buf);
    buf
}

/// SHA-1 hex of bytes produced by [`canonical_json`].
pub fn hash_canonical(canonical: &[u8]) -> String {
    hex::encode(Sha1::digest(canonical))
}

/// Compact JSON with object keys in byte order, as serde_json wrote it for verwalter 0.13.
pub(crate) fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            out.push(b'{');
            // serde_json's default map iterates in key order; only a build with
            // `preserve_order` needs the sort (and the allocation it takes).
            if map.keys().is_sorted() {
                write_entries(map.iter(), out);
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                write_entries(entries.into_iter(), out);
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

/// A JSON object of `entries` (which must come in key order, as a serde_json map iterates), in
/// the form of [`write_canonical`].
pub(crate) fn write_canonical_object<'a>(
    entries: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut Vec<u8>,
) {
    out.push(b'{');
    write_entries(entries, out);
    out.push(b'}');
}

fn write_entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    for (i, (key, item)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key.as_str()).expect("a string serializes");
        out.push(b':');
        write_canonical(item, out);
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
    fn an_envelope_written_by_verwalter_0_13_verifies() {
        // The envelope as 0.13 stores and serves it: `data` pretty or not, keys in any order;
        // the hash is SHA-1 of the compact key-sorted `data`:
        // `printf '%s' '{"nodes":{"alpha":{"roles":{"web":{"instances":2}}}},"roles":{"web":{"version":"v2"}},"vars":{"cluster":"demo","ratio":0.5}}' | sha1sum`
        let text = r#"{"timestamp": 1533912709990,
            "hash": "cf2dc3c5348b61831c976747fcb351362d2bdae8",
            "data": {"vars": {"ratio": 0.5, "cluster": "demo"},
                     "roles": {"web": {"version": "v2"}},
                     "nodes": {"alpha": {"roles": {"web": {"instances": 2}}}}},
            "origin": "77985419c732412ea38b94db00000001"}"#;
        let schedule: crate::state::Schedule = serde_json::from_str(text).unwrap();
        schedule.verify().unwrap();
        let mut changed = (**schedule.data.tree()).clone();
        changed["vars"]["ratio"] = json!(0.25);
        let tampered = crate::state::Schedule {
            data: crate::state::ScheduleData::from_value(changed),
            ..schedule.clone()
        };
        assert!(
            tampered.verify().is_err(),
            "a changed value no longer verifies"
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
