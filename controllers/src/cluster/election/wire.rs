//! The election's UDP packets, byte-compatible with verwalter 0.13 (reference §4.4).
//!
//! 0.13 sends serde_cbor 0.8.2's encoding of an internally tagged enum (`#[serde(tag = "type")]`):
//! a definite-length CBOR map with text keys, `"type"` first, then the variant's fields in
//! declaration order; ids are 16-byte byte strings. We encode the same serde shape with
//! ciborium, whose serializer turns the same serde calls into the same bytes (definite map
//! lengths from `serialize_struct`, shortest-form integers and lengths, `0xF6` for `None`); the
//! byte-for-byte tests in `wire/tests.rs` pin that down.
//!
//! Decoding goes through a generic CBOR value instead of serde derive, so that field order is
//! free, unknown fields and tags are ignored (as serde_cbor 0.8 did), ids may also be hex text
//! (0.13 accepted both) and every error names the field that is wrong.

use ciborium::Value;
use serde::Serialize;
use serde_bytes::ByteArray;

use crate::cluster::election::machine::Message;
use crate::state::{NodeId, ScheduleStamp};

/// 0.13 receives into a buffer of this size: anything longer would arrive truncated, so
/// nothing longer is sent or accepted.
pub const MAX_PACKET: usize = 512;

/// One election packet: who sent it, at which epoch, the schedule stamp it carries and what
/// it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub from: NodeId,
    pub epoch: u64,
    /// A Ping carries the leader's own schedule, Pong and Vote the sender's last known one.
    pub schedule: Option<ScheduleStamp>,
    pub kind: Kind,
    /// Only in a Ping that carries the leader's own schedule, and only from this version: the
    /// SHA-1 of that schedule's body as it serves it in the `x-verwalter-lz4` coding. A follower
    /// that receives exactly these bytes takes the data without hashing the whole of it (the
    /// body's hash vouches for the data as the schedule hash does). 0.13 ignores the field, as
    /// it ignores any field it does not know.
    pub lz4_sha1: Option<[u8; 20]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Ping,
    /// `errors`: the follower's error domains plus failed roles (shown to the leader).
    Pong {
        errors: u64,
    },
    Vote {
        target: NodeId,
    },
    /// A pre-vote (see `machine.rs`): a `Vote` packet with `pre_vote: true`, from this version
    /// only. verwalter 0.13 ignores the field and takes it as a vote.
    PreVote {
        target: NodeId,
    },
}

/// A packet that cannot be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("too big: {size} bytes (at most {MAX_PACKET})")]
    TooBig { size: usize },
    #[error("not CBOR: {}", describe_cbor_error(.0))]
    NotCbor(#[source] ciborium::de::Error<std::io::Error>),
    #[error("{0} bytes after the end of the packet")]
    TrailingBytes(usize),
    #[error("not a map: got {0}")]
    NotAMap(String),
    #[error("unknown packet type {0:?}")]
    UnknownType(String),
    #[error("missing field {0:?}")]
    MissingField(String),
    #[error("duplicate field {0:?}")]
    DuplicateField(String),
    #[error("{field}: expected {expected}, got {got}")]
    WrongType {
        field: String,
        expected: &'static str,
        got: String,
    },
    #[error("{field}: expected 16 bytes, got {got}")]
    IdLength { field: String, got: usize },
    #[error("{field}: expected 32 hex characters, got {text:?}")]
    IdText { field: String, text: String },
    #[error("cannot encode: {0}")]
    Encode(#[source] ciborium::ser::Error<std::io::Error>),
    #[error("no valid authentication tag for the shared key")]
    BadTag,
}

impl WireError {
    /// A bounded metric label for the error.
    pub fn label(&self) -> &'static str {
        match self {
            WireError::TooBig { .. } => "too_big",
            WireError::NotCbor(_) => "not_cbor",
            WireError::TrailingBytes(_) => "trailing_bytes",
            WireError::NotAMap(_) => "not_a_map",
            WireError::UnknownType(_) => "unknown_type",
            WireError::MissingField(_) => "missing_field",
            WireError::DuplicateField(_) => "duplicate_field",
            WireError::WrongType { .. } => "wrong_type",
            WireError::IdLength { .. } | WireError::IdText { .. } => "bad_id",
            WireError::Encode(_) => "encode",
            WireError::BadTag => "bad_auth",
        }
    }
}

fn describe_cbor_error(error: &ciborium::de::Error<std::io::Error>) -> String {
    use ciborium::de::Error;
    match error {
        Error::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => "ends early".into(),
        Error::Io(e) => e.to_string(),
        Error::Syntax(offset) => format!("invalid at byte {offset}"),
        Error::Semantic(Some(offset), message) => format!("{message} at byte {offset}"),
        Error::Semantic(None, message) => message.clone(),
        Error::RecursionLimitExceeded => "nested too deeply".into(),
    }
}

/// 0.13's packet in serde's data model. Field names, order and types are the wire format:
/// do not reorder.
#[derive(Serialize)]
#[serde(tag = "type")]
enum Wire<'a> {
    Ping {
        id: ByteArray<16>,
        epoch: u64,
        schedule: Option<WireStamp<'a>>,
        /// Left out when absent, so that such a Ping is byte for byte 0.13's.
        #[serde(skip_serializing_if = "Option::is_none")]
        lz4_sha1: Option<ByteArray<20>>,
    },
    Pong {
        id: ByteArray<16>,
        epoch: u64,
        schedule: Option<WireStamp<'a>>,
        errors: u64,
    },
    Vote {
        id: ByteArray<16>,
        epoch: u64,
        target: ByteArray<16>,
        schedule: Option<WireStamp<'a>>,
        /// Left out unless set, so that a vote is byte for byte 0.13's.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        pre_vote: bool,
    },
}

#[derive(Serialize)]
struct WireStamp<'a> {
    timestamp: u64,
    hash: &'a str,
    origin: ByteArray<16>,
}

/// The 16 raw bytes of a hex id (either case; decoding gives lowercase).
fn id_bytes(field: &str, id: &str) -> Result<ByteArray<16>, WireError> {
    let mut bytes = [0u8; 16];
    match hex::decode_to_slice(id, &mut bytes) {
        Ok(()) => Ok(ByteArray::new(bytes)),
        Err(_) => Err(WireError::IdText {
            field: field.into(),
            text: id.into(),
        }),
    }
}

/// A key shared by the nodes of a cluster (settings: `election.key-file`). With it, every packet
/// ends in an HMAC-SHA-256 tag of the CBOR before it, and packets without a valid tag are
/// refused. A packet with a tag is not 0.13's any more (0.13 refuses the trailing bytes), so a
/// cluster uses a key on every node or on none.
#[derive(Clone)]
pub struct AuthKey(Vec<u8>);

/// Bytes of the tag after the CBOR of an authenticated packet.
pub(crate) const TAG_LEN: usize = 32;
/// The shortest key taken: 128 bits.
pub const MIN_KEY_LEN: usize = 16;
/// Goes into every tag, so that a tag made with the same key for something else does not fit.
const TAG_CONTEXT: &[u8] = b"verwalter election packet v1\0";

impl std::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthKey(..)") // never the secret
    }
}

impl AuthKey {
    /// A key of at least [`MIN_KEY_LEN`] bytes; `None` for a shorter one.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Option<AuthKey> {
        let bytes = bytes.into();
        (bytes.len() >= MIN_KEY_LEN).then_some(AuthKey(bytes))
    }

    /// The key's bytes, for the exchange between data centers, which signs with the same key
    /// in its own context.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, body: &[u8]) -> hmac::Hmac<sha2::Sha256> {
        keyed_mac(&self.0, TAG_CONTEXT, body)
    }
}

/// HMAC-SHA-256 of `body` under `key`, with `context` first so that a tag made for one use
/// (election packets, the exchange between data centers) never passes for another's.
pub(crate) fn keyed_mac(key: &[u8], context: &[u8], body: &[u8]) -> hmac::Hmac<sha2::Sha256> {
    use hmac::Mac;
    let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
        .expect("HMAC takes keys of any length");
    mac.update(context);
    mac.update(body);
    mac
}

impl Packet {
    /// [`Packet::encode`], followed by the tag when `key` is set.
    pub fn encode_with(&self, key: Option<&AuthKey>) -> Result<Vec<u8>, WireError> {
        use hmac::Mac;
        let mut bytes = self.encode()?;
        if let Some(key) = key {
            bytes.extend_from_slice(&key.mac(&bytes).finalize().into_bytes());
            if bytes.len() > MAX_PACKET {
                return Err(WireError::TooBig { size: bytes.len() });
            }
        }
        Ok(bytes)
    }

    /// [`Packet::decode`]; when `key` is set, only a packet with a valid tag (checked in
    /// constant time) before anything else is looked at.
    pub fn decode_with(bytes: &[u8], key: Option<&AuthKey>) -> Result<Packet, WireError> {
        use hmac::Mac;
        let Some(key) = key else {
            return Packet::decode(bytes);
        };
        if bytes.len() > MAX_PACKET {
            return Err(WireError::TooBig { size: bytes.len() });
        }
        let Some(split) = bytes.len().checked_sub(TAG_LEN) else {
            return Err(WireError::BadTag);
        };
        let (body, tag) = bytes.split_at(split);
        key.mac(body)
            .verify_slice(tag)
            .map_err(|_| WireError::BadTag)?;
        Packet::decode(body)
    }

    /// The packet as 0.13 would send it. Fails if an id is not 32 hex characters or the
    /// packet (with a long schedule hash) would not fit into [`MAX_PACKET`].
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let id = id_bytes("id", &self.from)?;
        let epoch = self.epoch;
        let schedule = match &self.schedule {
            None => None,
            Some(stamp) => Some(WireStamp {
                timestamp: stamp.timestamp,
                hash: &stamp.hash,
                origin: id_bytes("schedule.origin", &stamp.origin)?,
            }),
        };
        let wire = match &self.kind {
            Kind::Ping => Wire::Ping {
                id,
                epoch,
                lz4_sha1: self
                    .lz4_sha1
                    .filter(|_| schedule.is_some())
                    .map(ByteArray::new),
                schedule,
            },
            Kind::Pong { errors } => Wire::Pong {
                id,
                epoch,
                schedule,
                errors: *errors,
            },
            Kind::Vote { target } => Wire::Vote {
                id,
                epoch,
                target: id_bytes("target", target)?,
                schedule,
                pre_vote: false,
            },
            Kind::PreVote { target } => Wire::Vote {
                id,
                epoch,
                target: id_bytes("target", target)?,
                schedule,
                pre_vote: true,
            },
        };
        let mut bytes = Vec::with_capacity(128);
        ciborium::into_writer(&wire, &mut bytes).map_err(WireError::Encode)?;
        if bytes.len() > MAX_PACKET {
            return Err(WireError::TooBig { size: bytes.len() });
        }
        Ok(bytes)
    }

    /// Reads a packet from a peer (0.13 or ours).
    pub fn decode(bytes: &[u8]) -> Result<Packet, WireError> {
        if bytes.len() > MAX_PACKET {
            return Err(WireError::TooBig { size: bytes.len() });
        }
        let mut rest = bytes;
        let value: Value = ciborium::from_reader(&mut rest).map_err(WireError::NotCbor)?;
        if !rest.is_empty() {
            return Err(WireError::TrailingBytes(rest.len()));
        }
        let mut fields = Fields::new(value, "")?;
        // The type first: for an unknown type, missing fields are beside the point.
        let kind = fields.text("type")?;
        if !matches!(kind.as_str(), "Ping" | "Pong" | "Vote") {
            return Err(WireError::UnknownType(kind));
        }
        let from = fields.id("id")?;
        let epoch = fields.uint("epoch")?;
        let schedule = fields.stamp()?;
        let mut lz4_sha1 = None;
        let kind = match kind.as_str() {
            "Ping" => {
                lz4_sha1 = fields.sha1("lz4_sha1")?.filter(|_| schedule.is_some());
                Kind::Ping
            }
            "Pong" => Kind::Pong {
                errors: fields.uint("errors")?,
            },
            _ => {
                let target = fields.id("target")?;
                if fields.flag("pre_vote")? {
                    Kind::PreVote { target }
                } else {
                    Kind::Vote { target }
                }
            }
        };
        Ok(Packet {
            from,
            epoch,
            schedule,
            kind,
            lz4_sha1,
        })
    }

    /// What the packet means to the election machine.
    pub fn message(&self) -> Message {
        match &self.kind {
            Kind::Ping => Message::Ping,
            Kind::Pong { .. } => Message::Pong,
            Kind::Vote { target } => Message::Vote(target.clone()),
            Kind::PreVote { target } => Message::PreVote(target.clone()),
        }
    }
}

/// serde_cbor 0.8 skipped tags when deserialising; so do we.
fn untag(mut value: Value) -> Value {
    while let Value::Tag(_, inner) = value {
        value = *inner;
    }
    value
}

/// A short description of a value for error messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Integer(i) => i128::from(*i).to_string(),
        Value::Bytes(b) => format!("{} bytes", b.len()),
        Value::Float(f) => format!("float {f:?}"),
        Value::Text(t) => {
            const SHOWN: usize = 40;
            if t.chars().count() > SHOWN {
                let head: String = t.chars().take(SHOWN).collect();
                format!("text {head:?}...")
            } else {
                format!("text {t:?}")
            }
        }
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".into(),
        Value::Tag(_, inner) => describe(inner),
        Value::Array(_) => "an array".into(),
        Value::Map(_) => "a map".into(),
        _ => "an unsupported CBOR value".into(),
    }
}

/// The text-keyed entries of a CBOR map, taken out by name. Other keys are ignored.
struct Fields {
    /// Prefix for field names in errors (`"schedule."` inside the stamp).
    prefix: &'static str,
    entries: Vec<(String, Value)>,
}

impl Fields {
    fn new(value: Value, prefix: &'static str) -> Result<Fields, WireError> {
        let map = match untag(value) {
            Value::Map(map) => map,
            other => return Err(WireError::NotAMap(describe(&other))),
        };
        let entries = map
            .into_iter()
            .filter_map(|(key, value)| match untag(key) {
                Value::Text(key) => Some((key, value)),
                _ => None,
            })
            .collect();
        Ok(Fields { prefix, entries })
    }

    fn name(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    /// The field's value, `None` if absent.
    fn take(&mut self, field: &str) -> Result<Option<Value>, WireError> {
        let Some(at) = self.entries.iter().position(|(key, _)| key == field) else {
            return Ok(None);
        };
        let (_, value) = self.entries.swap_remove(at);
        if self.entries.iter().any(|(key, _)| key == field) {
            return Err(WireError::DuplicateField(self.name(field)));
        }
        Ok(Some(untag(value)))
    }

    fn required(&mut self, field: &str) -> Result<Value, WireError> {
        self.take(field)?
            .ok_or_else(|| WireError::MissingField(self.name(field)))
    }

    fn wrong(&self, field: &str, expected: &'static str, got: &Value) -> WireError {
        WireError::WrongType {
            field: self.name(field),
            expected,
            got: describe(got),
        }
    }

    fn uint(&mut self, field: &str) -> Result<u64, WireError> {
        match self.required(field)? {
            Value::Integer(i) => u64::try_from(i)
                .map_err(|_| self.wrong(field, "an unsigned integer", &Value::Integer(i))),
            other => Err(self.wrong(field, "an unsigned integer", &other)),
        }
    }

    fn text(&mut self, field: &str) -> Result<String, WireError> {
        match self.required(field)? {
            Value::Text(text) => Ok(text),
            other => Err(self.wrong(field, "text", &other)),
        }
    }

    /// An id as 16 raw bytes (what 0.13 sends) or 32 hex characters (what it also accepted).
    fn id(&mut self, field: &str) -> Result<NodeId, WireError> {
        match self.required(field)? {
            Value::Bytes(bytes) if bytes.len() == 16 => Ok(hex::encode(bytes)),
            Value::Bytes(bytes) => Err(WireError::IdLength {
                field: self.name(field),
                got: bytes.len(),
            }),
            Value::Text(text) => {
                let mut bytes = [0u8; 16];
                match hex::decode_to_slice(&text, &mut bytes) {
                    Ok(()) => Ok(hex::encode(bytes)),
                    Err(_) => Err(WireError::IdText {
                        field: self.name(field),
                        text,
                    }),
                }
            }
            other => Err(self.wrong(field, "an id (16 bytes or 32 hex characters)", &other)),
        }
    }

    /// An optional flag: absent or null is false.
    fn flag(&mut self, field: &str) -> Result<bool, WireError> {
        match self.take(field)? {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(b),
            Some(other) => Err(self.wrong(field, "a boolean", &other)),
        }
    }

    /// An optional SHA-1: 20 bytes, or absent or null.
    fn sha1(&mut self, field: &str) -> Result<Option<[u8; 20]>, WireError> {
        match self.take(field)? {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bytes(bytes)) => match <[u8; 20]>::try_from(bytes.as_slice()) {
                Ok(hash) => Ok(Some(hash)),
                Err(_) => Err(self.wrong(field, "20 bytes", &Value::Bytes(bytes))),
            },
            Some(other) => Err(self.wrong(field, "20 bytes", &other)),
        }
    }

    /// The `schedule` stamp; absent counts as null, as serde treats a missing `Option` field.
    fn stamp(&mut self) -> Result<Option<ScheduleStamp>, WireError> {
        let field = "schedule";
        match self.take(field)? {
            None | Some(Value::Null) => Ok(None),
            Some(value @ Value::Map(_)) => {
                let mut stamp = Fields::new(value, "schedule.")?;
                Ok(Some(ScheduleStamp {
                    timestamp: stamp.uint("timestamp")?,
                    hash: stamp.text("hash")?,
                    origin: stamp.id("origin")?,
                }))
            }
            Some(other) => Err(self.wrong(field, "null or a map", &other)),
        }
    }
}

#[cfg(test)]
mod tests;
