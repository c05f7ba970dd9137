//! The JSON values of `P/leader` and `P/schedule` (docs/etcd.md#keys), versioned: a reader
//! refuses a value of a higher `v`, naming the key, and takes unknown fields of its own
//! version (added later without a version change).

use serde::{Deserialize, Serialize};

use super::{LeaderKey, Published, ScheduleKey};

/// The format version this node writes and reads.
pub const VERSION: u32 = 1;

/// The largest `P/schedule` value written with the schedule inline: far under etcd's request
/// limit (`--max-request-bytes`, 1.5 MiB by default), and cheap to keep in etcd's history.
pub const MAX_INLINE_BYTES: usize = 256 * 1024;

/// `P/leader`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderValue {
    pub v: u32,
    pub node: String,
    /// Host and port of the leader's HTTP API.
    pub addr: String,
    /// When this leadership began (RFC 3339).
    pub started: String,
}

/// `P/schedule`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleValue {
    pub v: u32,
    pub hash: String,
    pub origin: String,
    pub size: u64,
    pub leader_rev: i64,
    pub lease: i64,
    /// The schedule, LZ4-compressed and base64-encoded by the adapter, when small enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("{key}: format version {found}, this node reads up to {VERSION}")]
    Version { key: String, found: u32 },
    #[error("{key}: not a verwalter value: {message}")]
    Malformed { key: String, message: String },
}

/// Only the version, read first so that a newer value is refused as such.
#[derive(Deserialize)]
struct Versioned {
    v: u32,
}

fn decode<T: for<'de> Deserialize<'de>>(key: &str, bytes: &[u8]) -> Result<T, WireError> {
    let malformed = |e: serde_json::Error| WireError::Malformed {
        key: key.into(),
        message: e.to_string(),
    };
    let Versioned { v } = serde_json::from_slice(bytes).map_err(malformed)?;
    if v > VERSION {
        return Err(WireError::Version {
            key: key.into(),
            found: v,
        });
    }
    serde_json::from_slice(bytes).map_err(malformed)
}

impl LeaderValue {
    pub fn new(node: &str, addr: &str, started: &str) -> LeaderValue {
        LeaderValue {
            v: VERSION,
            node: node.into(),
            addr: addr.into(),
            started: started.into(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a leader value serializes")
    }

    /// Reads `key`'s value; its lease and create revision come from etcd's key metadata.
    pub fn decode(
        key: &str,
        bytes: &[u8],
        lease: i64,
        create_rev: i64,
    ) -> Result<(LeaderValue, LeaderKey), WireError> {
        let value: LeaderValue = decode(key, bytes)?;
        let leader = LeaderKey {
            node: value.node.clone(),
            lease,
            create_rev,
        };
        Ok((value, leader))
    }
}

impl ScheduleValue {
    /// The value to publish, and whether `data` (already compressed and encoded) is in it: it
    /// is left out when the whole value would pass [`MAX_INLINE_BYTES`].
    pub fn encode(published: &Published, data: Option<String>) -> (Vec<u8>, bool) {
        let mut value = ScheduleValue {
            v: VERSION,
            hash: published.hash.clone(),
            origin: published.origin.clone(),
            size: published.size,
            leader_rev: published.leader_rev,
            lease: published.lease,
            data,
        };
        let bytes = serde_json::to_vec(&value).expect("a schedule value serializes");
        if bytes.len() <= MAX_INLINE_BYTES {
            return (bytes, value.data.is_some());
        }
        value.data = None;
        let bytes = serde_json::to_vec(&value).expect("a schedule value serializes");
        (bytes, false)
    }

    /// Reads `key`'s value written at `mod_rev`: the machine's view, with the inline data.
    pub fn decode(key: &str, bytes: &[u8], mod_rev: i64) -> Result<ScheduleKey, WireError> {
        let value: ScheduleValue = decode(key, bytes)?;
        let published = Published {
            hash: value.hash,
            origin: value.origin,
            size: value.size,
            leader_rev: value.leader_rev,
            lease: value.lease,
        };
        Ok(ScheduleKey {
            value: published,
            mod_rev,
            data: value.data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published() -> Published {
        Published {
            hash: "abc".into(),
            origin: "n1".into(),
            size: 1234,
            leader_rev: 17,
            lease: 0x7f01,
        }
    }

    #[test]
    fn a_schedule_value_round_trips_with_its_inline_data() {
        let (bytes, inline) = ScheduleValue::encode(&published(), Some("BASE64".into()));
        assert!(inline);
        let key = ScheduleValue::decode("/v/c/schedule", &bytes, 20).unwrap();
        assert_eq!(key.value, published());
        assert_eq!(key.mod_rev, 20);
        assert_eq!(key.data.as_deref(), Some("BASE64"));
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with(r#"{"v":1,"hash":"abc""#), "{text}");
    }

    #[test]
    fn inline_data_is_left_out_when_the_value_would_pass_the_cap() {
        let fits = "x".repeat(MAX_INLINE_BYTES - 200);
        let (bytes, inline) = ScheduleValue::encode(&published(), Some(fits.clone()));
        assert!(inline && bytes.len() <= MAX_INLINE_BYTES);
        let key = ScheduleValue::decode("k", &bytes, 20).unwrap();
        assert_eq!(key.data, Some(fits));
        let big = "x".repeat(MAX_INLINE_BYTES);
        let (bytes, inline) = ScheduleValue::encode(&published(), Some(big));
        assert!(!inline && bytes.len() < 1024);
        let key = ScheduleValue::decode("k", &bytes, 20).unwrap();
        assert_eq!((key.value, key.data), (published(), None));
    }

    #[test]
    fn a_newer_version_is_refused_naming_the_key_and_the_version() {
        let newer = br#"{"v":2,"node":"n1","something":"else"}"#;
        let err = LeaderValue::decode("/v/c/leader", newer, 1, 5).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/v/c/leader: format version 2, this node reads up to 1"
        );
    }

    #[test]
    fn unknown_fields_of_this_version_are_taken_and_missing_ones_named() {
        let later = br#"{"v":1,"node":"n1","addr":"10.0.0.1:8379","started":"2026-11-27T23:00:00Z","zone":"b"}"#;
        let (value, key) = LeaderValue::decode("/v/c/leader", later, 0x55, 9).unwrap();
        assert_eq!(value.addr, "10.0.0.1:8379");
        assert_eq!(
            key,
            LeaderKey {
                node: "n1".into(),
                lease: 0x55,
                create_rev: 9
            }
        );
        let err = ScheduleValue::decode("/v/c/schedule", br#"{"v":1,"hash":"h"}"#, 3).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/v/c/schedule: not a verwalter value: missing field `origin`"),
            "{err}"
        );
        let err = LeaderValue::decode("/v/c/leader", b"hello", 1, 2).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/v/c/leader: not a verwalter value"),
            "{err}"
        );
    }

    #[test]
    fn a_leader_value_round_trips() {
        let value = LeaderValue::new("n2", "127.0.0.1:8379", "2026-11-27T23:00:00Z");
        let (back, key) = LeaderValue::decode("k", &value.encode(), 3, 4).unwrap();
        assert_eq!(back, value);
        assert_eq!(key.node, "n2");
    }
}
