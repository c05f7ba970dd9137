//! The envelope DC leaders exchange across data centers, as JSON (docs/datacenters.md, "On the
//! wire").

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::state::NodeId;

/// The envelope format this version speaks.
pub const VERSION: u32 = 1;

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
