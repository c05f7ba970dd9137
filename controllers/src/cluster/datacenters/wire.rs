//! The envelope DC leaders exchange across data centers: its JSON, the HMAC-SHA-256 tag made
//! with the election's shared key, and the size cap (docs/datacenters.md, "On the wire").

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::state::NodeId;

/// The envelope format this version speaks.
pub const VERSION: u32 = 1;

/// The HTTP header carrying an envelope's tag (hex).
pub const TAG_HEADER: &str = "x-verwalter-dc-tag";

/// The default largest body sent or taken: 256 KiB, room for a summary of a few thousand roles,
/// and little for a hostile sender to make this node hash and parse.
pub const MAX_BODY: usize = crate::defaults::DC_MAX_BODY_BYTES;

/// Goes into every tag, so that an election packet's tag (made with the same key) does not
/// fit an envelope, nor the other way round.
const TAG_CONTEXT: &[u8] = b"verwalter dc exchange v1\0";

/// The shared key (the election's `key-file`), as the exchange uses it.
#[derive(Clone)]
pub struct DcKey(Vec<u8>);

impl std::fmt::Debug for DcKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DcKey(..)") // never the secret
    }
}

/// Why a body is not an envelope this node takes.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("body of {size} bytes, at most {max} taken")]
    TooBig { size: usize, max: usize },
    #[error("no valid tag for the shared key")]
    BadTag,
    #[error("not an envelope: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("envelope version {0}, this node speaks {VERSION}")]
    Version(u32),
}

impl WireError {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            WireError::TooBig { .. } => "too_big",
            WireError::BadTag => "bad_tag",
            WireError::Decode(_) | WireError::Version(_) => "decode",
        }
    }
}

impl DcKey {
    /// A key of at least the election's shortest key; `None` for a shorter one.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Option<DcKey> {
        let bytes = bytes.into();
        (bytes.len() >= crate::cluster::election::wire::MIN_KEY_LEN).then_some(DcKey(bytes))
    }

    /// The election's shared key, used in this exchange's own context.
    pub fn from_election(key: &crate::cluster::election::wire::AuthKey) -> DcKey {
        DcKey(key.bytes().to_vec())
    }

    fn mac(&self, body: &[u8]) -> hmac::Hmac<sha2::Sha256> {
        crate::cluster::election::wire::keyed_mac(&self.0, TAG_CONTEXT, body)
    }

    /// An envelope's body and its tag (hex), or [`WireError::TooBig`] past `max` bytes.
    pub fn seal(&self, envelope: &Envelope, max: usize) -> Result<(Vec<u8>, String), WireError> {
        use hmac::Mac;
        let body = envelope.to_json();
        if body.len() > max {
            return Err(WireError::TooBig {
                size: body.len(),
                max,
            });
        }
        let tag = hex::encode(self.mac(&body).finalize().into_bytes());
        Ok((body, tag))
    }

    /// The envelope in a (decompressed) body, checked in this order, each before anything
    /// later is looked at: its size, its tag (in constant time), its JSON, its version.
    pub fn open(&self, body: &[u8], tag: Option<&str>, max: usize) -> Result<Envelope, WireError> {
        use hmac::Mac;
        if body.len() > max {
            return Err(WireError::TooBig {
                size: body.len(),
                max,
            });
        }
        let tag = tag
            .and_then(|t| hex::decode(t.trim()).ok())
            .ok_or(WireError::BadTag)?;
        self.mac(body)
            .verify_slice(&tag)
            .map_err(|_| WireError::BadTag)?;
        let envelope: Envelope = serde_json::from_slice(body).map_err(WireError::Decode)?;
        if envelope.v != VERSION {
            return Err(WireError::Version(envelope.v));
        }
        Ok(envelope)
    }
}

/// One DC leader's word to another DC: who it is, its summary (or only its hash), what it has of
/// the other DC's summary, and every request and answer it has open towards that DC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub v: u32,
    pub dc: String,
    pub node: NodeId,
    /// Where other DCs reach the sender (its API address).
    pub addr: String,
    /// The sender's election epoch in its own DC.
    pub epoch: u64,
    /// Grows with every envelope the sender sends while leading.
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_hash: Option<String>,
    /// The summary itself, only when the receiver lacks it and the traffic cap allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Value>,
    /// The hash of the receiver's summary the sender holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub have_summary: Option<String>,
    #[serde(default)]
    pub requests: Vec<Request>,
    #[serde(default)]
    pub answers: Vec<Answer>,
}

/// A request of one DC to another ("lend me 20 workers of role X"); what `data` means is the
/// schedulers' business.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: String,
    pub data: Value,
    pub lease_ms: u64,
}

/// An answer to another DC's request (a grant, a refusal: the schedulers' business).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub request: String,
    pub data: Value,
    pub lease_ms: u64,
}

/// The hash a summary is known by: SHA-256 (hex) of its canonical JSON (keys sorted, no
/// whitespace: serde_json's output for a `Value`).
pub fn summary_hash(summary: &Value) -> String {
    use sha2::{Digest, Sha256};
    let text = serde_json::to_vec(summary).expect("a JSON value serializes");
    hex::encode(Sha256::digest(&text))
}

impl Envelope {
    /// The envelope's JSON: what the traffic cap counts, and what is signed.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope serializes")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn envelope() -> Envelope {
        Envelope {
            v: VERSION,
            dc: "fra".into(),
            node: "e0beef00000000000000000000000002".into(),
            addr: "10.1.0.1:8379".into(),
            epoch: 3,
            seq: 17,
            summary_hash: Some(summary_hash(&json!({"spare": 4}))),
            summary: Some(json!({"spare": 4})),
            have_summary: None,
            requests: vec![Request {
                id: "burst".into(),
                data: json!({"workers": 20}),
                lease_ms: 600_000,
            }],
            answers: vec![],
        }
    }

    #[test]
    fn a_sealed_envelope_opens_with_the_key_and_not_with_another_or_none() {
        let key = DcKey::new(KEY).unwrap();
        let (body, tag) = key.seal(&envelope(), MAX_BODY).unwrap();
        assert_eq!(key.open(&body, Some(&tag), MAX_BODY).unwrap(), envelope());
        let other = DcKey::new(b"another key, long enough".to_vec()).unwrap();
        assert!(matches!(
            other.open(&body, Some(&tag), MAX_BODY),
            Err(WireError::BadTag)
        ));
        assert!(matches!(
            key.open(&body, None, MAX_BODY),
            Err(WireError::BadTag)
        ));
        assert!(matches!(
            key.open(&body, Some("not hex"), MAX_BODY),
            Err(WireError::BadTag)
        ));
        assert!(DcKey::new(b"short".to_vec()).is_none());
        assert_eq!(format!("{key:?}"), "DcKey(..)");
    }

    #[test]
    fn a_forged_or_altered_envelope_is_dropped_before_it_is_read() {
        let key = DcKey::new(KEY).unwrap();
        // From outside the DC list: whoever lacks the key cannot make a tag that fits.
        let mut forged = envelope();
        forged.dc = "evil".into();
        let body = forged.to_json();
        let guess = hex::encode([0u8; 32]);
        let err = key.open(&body, Some(&guess), MAX_BODY).unwrap_err();
        assert_eq!(err.label(), "bad_tag");
        // A tagged body changed on the way (a lease stretched).
        let (body, tag) = key.seal(&envelope(), MAX_BODY).unwrap();
        let text = String::from_utf8(body).unwrap().replace("600000", "900000");
        let err = key.open(text.as_bytes(), Some(&tag), MAX_BODY).unwrap_err();
        assert_eq!(err.label(), "bad_tag");
        // Not JSON, or another version, even with a valid tag.
        let junk = b"{\"v\": 1, \"dc\": ".to_vec();
        let tag = hex::encode(hmac::Mac::finalize(key.mac(&junk)).into_bytes());
        assert_eq!(
            key.open(&junk, Some(&tag), MAX_BODY).unwrap_err().label(),
            "decode"
        );
        let mut v2 = envelope();
        v2.v = 2;
        let (body, tag) = key.seal(&v2, MAX_BODY).unwrap();
        assert!(matches!(
            key.open(&body, Some(&tag), MAX_BODY),
            Err(WireError::Version(2))
        ));
    }

    #[test]
    fn an_election_tag_does_not_fit_an_envelope() {
        use hmac::Mac;
        let key = DcKey::new(KEY).unwrap();
        let body = envelope().to_json();
        let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(KEY).unwrap();
        mac.update(b"verwalter election packet v1\0");
        mac.update(&body);
        let tag = hex::encode(mac.finalize().into_bytes());
        assert!(matches!(
            key.open(&body, Some(&tag), MAX_BODY),
            Err(WireError::BadTag)
        ));
    }

    #[test]
    fn an_oversized_envelope_is_refused_both_ways_before_its_tag_is_checked() {
        let key = DcKey::new(KEY).unwrap();
        let mut big = envelope();
        big.summary = Some(json!({"blob": "x".repeat(MAX_BODY)}));
        let err = key.seal(&big, MAX_BODY).unwrap_err();
        assert!(
            matches!(err, WireError::TooBig { max: MAX_BODY, .. }),
            "{err}"
        );
        let body = vec![b' '; MAX_BODY + 1];
        let err = key.open(&body, None, MAX_BODY).unwrap_err();
        assert_eq!(
            err.label(),
            "too_big",
            "not bad_tag: the size is looked at first"
        );
        let (body, tag) = key.seal(&envelope(), MAX_BODY).unwrap();
        let err = key.open(&body, Some(&tag), body.len() - 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "body of {} bytes, at most {} taken",
                body.len(),
                body.len() - 1
            )
        );
    }

    /// The envelope in docs/datacenters.md ("On the wire") is one, exactly as written: every
    /// field known, its summary hash that of its summary.
    #[test]
    fn the_documented_envelope_decodes_as_written() {
        let doc = include_str!("../../../../docs/datacenters.md");
        let section = doc.split("## On the wire").nth(1).expect("the section");
        let block = section.split("```json\n").nth(1).expect("a json block");
        let text = block.split("```").next().unwrap();
        let envelope: Envelope = serde_json::from_str(text).expect("an envelope");
        let written: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            serde_json::to_value(&envelope).unwrap(),
            written,
            "no field unknown"
        );
        assert_eq!(
            envelope.summary_hash.as_deref(),
            envelope.summary.as_ref().map(summary_hash).as_deref()
        );
        let key = DcKey::new(KEY).unwrap();
        let (body, tag) = key.seal(&envelope, MAX_BODY).unwrap();
        assert_eq!(key.open(&body, Some(&tag), MAX_BODY).unwrap(), envelope);
    }
}
