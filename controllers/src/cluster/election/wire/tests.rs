//! Wire format tests: exact bytes (written out from RFC 8949, as serde_cbor 0.8.2 produced them
//! for verwalter 0.13), tolerant decoding, errors, size limit and a seeded round-trip loop.

use ciborium::Value;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

const FROM: &str = "00112233445566778899aabbccddeeff";
const TARGET: &str = "ffeeddccbbaa99887766554433221100";
const ORIGIN: &str = "0123456789abcdef0123456789abcdef";
const HASH: &str = "5d41402abc4b2a76b9719d911017c592";

const FROM_BYTES: [u8; 16] = [
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff,
];
const TARGET_BYTES: [u8; 16] = [
    0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00,
];
const ORIGIN_BYTES: [u8; 16] = [
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
];

fn stamp() -> ScheduleStamp {
    ScheduleStamp {
        timestamp: 1_700_000_000_000,
        hash: HASH.into(),
        origin: ORIGIN.into(),
    }
}

fn packet(epoch: u64, schedule: Option<ScheduleStamp>, kind: Kind) -> Packet {
    Packet {
        from: FROM.into(),
        epoch,
        schedule,
        kind,
        lz4_sha1: None,
    }
}

/// A Vote from `FROM` for `TARGET`.
fn vote(epoch: u64, schedule: Option<ScheduleStamp>) -> Packet {
    packet(
        epoch,
        schedule,
        Kind::Vote {
            target: TARGET.into(),
        },
    )
}

/// A CBOR text string shorter than 24 bytes: major type 3 with the length in the initial byte.
fn cbor_text(s: &str) -> Vec<u8> {
    assert!(s.len() < 24);
    [&[0x60 + s.len() as u8][..], s.as_bytes()].concat()
}

/// A node id: CBOR bytes of 16 (major type 2, the length in the initial byte).
fn id(bytes: &[u8; 16]) -> Vec<u8> {
    [&[0x50][..], bytes].concat()
}

/// The first entries every packet starts with, as CBOR: a map of `entries`, then the type
/// `kind` (all three are four letters long), the sender `FROM` and the epoch (`epoch`, encoded).
fn head(entries: u8, kind: &str, epoch: &[u8]) -> Vec<u8> {
    assert!(entries < 24 && kind.len() == 4);
    [
        &[0xA0 + entries][..], // map of `entries`
        &cbor_text("type"),
        &cbor_text(kind),
        &cbor_text("id"),
        &id(&FROM_BYTES),
        &cbor_text("epoch"),
        epoch,
    ]
    .concat()
}

/// The stamp of [`stamp()`] as CBOR.
fn stamp_bytes() -> Vec<u8> {
    [
        &[0xA3][..], // map of 3
        &cbor_text("timestamp"),
        &[0x1B], // uint, 8 bytes follow (1_700_000_000_000 does not fit in 4)
        &[0x00, 0x00, 0x01, 0x8B, 0xCF, 0xE5, 0x68, 0x00],
        &cbor_text("hash"),
        &[0x78, 0x20], // text, 1-byte length follows: 32
        HASH.as_bytes(),
        &cbor_text("origin"),
        &id(&ORIGIN_BYTES),
    ]
    .concat()
}

/// Encodes, compares with the hand-written bytes and decodes them back.
fn check_bytes(packet: &Packet, expected: &[u8]) {
    let bytes = packet.encode().unwrap();
    assert_eq!(
        hex::encode(&bytes),
        hex::encode(expected),
        "encoding of {packet:?}"
    );
    assert_eq!(&Packet::decode(expected).unwrap(), packet);
}

#[test]
fn ping_without_schedule_bytes() {
    let expected: Vec<u8> = [
        &head(4, "Ping", &[0x07])[..], // uint 7, in the initial byte
        &cbor_text("schedule"),
        &[0xF6], // null
    ]
    .concat();
    check_bytes(&packet(7, None, Kind::Ping), &expected);
}

#[test]
fn ping_with_schedule_bytes() {
    let expected: Vec<u8> = [
        &head(4, "Ping", &[0x19, 0x03, 0xE8])[..], // uint, 2 bytes follow: 1000
        &cbor_text("schedule"),
        &stamp_bytes(), // the stamp map
    ]
    .concat();
    check_bytes(&packet(1000, Some(stamp()), Kind::Ping), &expected);
}

#[test]
fn a_ping_announcing_its_body_hash_is_0_13s_ping_and_one_entry_more() {
    let body = [0xA5u8; 20];
    let announcing = Packet {
        lz4_sha1: Some(body),
        ..packet(1000, Some(stamp()), Kind::Ping)
    };
    let expected: Vec<u8> = [
        &head(5, "Ping", &[0x19, 0x03, 0xE8])[..], // a map of 5 entries now
        &cbor_text("schedule"),
        &stamp_bytes(),
        &cbor_text("lz4_sha1"),
        &[0x54], // bytes of 20 (major type 2, the length in the initial byte)
        &body,
    ]
    .concat();
    check_bytes(&announcing, &expected);
    // With the longest hash a schedule has (40 hex digits) and the key's tag it still fits
    // 0.13's receive buffer, with room to spare.
    let long = Packet {
        schedule: Some(ScheduleStamp {
            hash: "f".repeat(40),
            ..stamp()
        }),
        ..announcing.clone()
    };
    let sealed = long.encode_with(Some(&key(1))).unwrap();
    assert!(sealed.len() <= MAX_PACKET / 2, "{} bytes", sealed.len());
    assert_eq!(Packet::decode_with(&sealed, Some(&key(1))).unwrap(), long);
    // Without a schedule there is nothing to vouch for: not sent, not taken.
    let bare = Packet {
        schedule: None,
        ..announcing.clone()
    };
    assert_eq!(
        Packet::decode(&bare.encode().unwrap()).unwrap().lz4_sha1,
        None
    );
}

#[test]
fn a_body_hash_of_the_wrong_size_is_refused_by_name() {
    let ping = |hash: Value| {
        cbor(&map(vec![
            ("type", text("Ping")),
            ("id", Value::Bytes(FROM_BYTES.to_vec())),
            ("epoch", uint(5)),
            (
                "schedule",
                schedule_map(uint(1_700_000_000_000), ORIGIN_BYTES.to_vec()),
            ),
            ("lz4_sha1", hash),
        ]))
    };
    let error = Packet::decode(&ping(Value::Bytes(vec![1; 19]))).unwrap_err();
    assert_eq!(
        error.to_string(),
        "lz4_sha1: expected 20 bytes, got 19 bytes"
    );
    let error = Packet::decode(&ping(text("abc"))).unwrap_err();
    assert_eq!(
        error.to_string(),
        "lz4_sha1: expected 20 bytes, got text \"abc\""
    );
    assert_eq!(Packet::decode(&ping(Value::Null)).unwrap().lz4_sha1, None);
}

#[test]
fn pong_bytes() {
    let head = |epoch: &[u8]| -> Vec<u8> {
        [&head(5, "Pong", epoch)[..], &cbor_text("schedule")].concat()
    };
    let errors_0: Vec<u8> = [
        &head(&[0x17])[..], // uint 23, the largest in the initial byte
        &[0xF6],            // null
        &cbor_text("errors"),
        &[0x00], // uint 0
    ]
    .concat();
    check_bytes(&packet(23, None, Kind::Pong { errors: 0 }), &errors_0);
    let errors_300: Vec<u8> = [
        &head(&[0x18, 0x18])[..], // uint, 1 byte follows: 24
        &stamp_bytes(),           // the stamp map
        &cbor_text("errors"),
        &[0x19, 0x01, 0x2C], // uint, 2 bytes follow: 300
    ]
    .concat();
    check_bytes(
        &packet(24, Some(stamp()), Kind::Pong { errors: 300 }),
        &errors_300,
    );
}

#[test]
fn vote_bytes() {
    let expected: Vec<u8> = [
        &head(5, "Vote", &[0x1A, 0x00, 0x01, 0x00, 0x00])[..], // uint, 4 bytes follow: 65536
        &cbor_text("target"),
        &id(&TARGET_BYTES),
        &cbor_text("schedule"),
        &[0xF6], // null
    ]
    .concat();
    check_bytes(&vote(65536, None), &expected);
}

#[test]
fn message_for_the_machine() {
    assert_eq!(packet(1, None, Kind::Ping).message(), Message::Ping);
    assert_eq!(
        packet(1, None, Kind::Pong { errors: 3 }).message(),
        Message::Pong
    );
    assert_eq!(vote(1, None).message(), Message::Vote(TARGET.into()));
}

// Decoding hand-built maps.

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

fn uint(n: u64) -> Value {
    Value::Integer(n.into())
}

fn cbor(value: &Value) -> Vec<u8> {
    let mut bytes = Vec::new();
    ciborium::into_writer(value, &mut bytes).unwrap();
    bytes
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (text(k), v)).collect())
}

/// A schedule stamp's map with the hash `HASH`.
fn schedule_map(timestamp: Value, origin: impl Into<Value>) -> Value {
    map(vec![
        ("timestamp", timestamp),
        ("hash", text(HASH)),
        ("origin", origin.into()),
    ])
}

/// A Vote as a list of entries, to be reordered, extended or cut by the tests.
fn vote_entries() -> Vec<(&'static str, Value)> {
    vec![
        ("type", text("Vote")),
        ("id", Value::Bytes(FROM_BYTES.to_vec())),
        ("epoch", uint(5)),
        ("target", Value::Bytes(TARGET_BYTES.to_vec())),
        (
            "schedule",
            schedule_map(uint(1_700_000_000_000), ORIGIN_BYTES.to_vec()),
        ),
    ]
}

fn expected_vote() -> Packet {
    vote(5, Some(stamp()))
}

fn decode_entries(entries: Vec<(&str, Value)>) -> Result<Packet, WireError> {
    Packet::decode(&cbor(&map(entries)))
}

fn error_of(entries: Vec<(&str, Value)>) -> String {
    decode_entries(entries).unwrap_err().to_string()
}

/// `vote_entries()` with `field` replaced by `value`.
fn vote_with(field: &str, value: Value) -> Vec<(&'static str, Value)> {
    let mut entries = vote_entries();
    entries.iter_mut().find(|(k, _)| *k == field).unwrap().1 = value;
    entries
}

/// `vote_entries()` without `field`.
fn vote_without(field: &str) -> Vec<(&'static str, Value)> {
    let mut entries = vote_entries();
    entries.retain(|(k, _)| *k != field);
    entries
}

#[test]
fn decodes_the_reference_entries() {
    assert_eq!(decode_entries(vote_entries()).unwrap(), expected_vote());
}

#[test]
fn decodes_ids_given_as_hex_text() {
    let mut entries = vote_with("id", text(FROM));
    entries.iter_mut().find(|(k, _)| *k == "target").unwrap().1 = text(&TARGET.to_uppercase());
    entries
        .iter_mut()
        .find(|(k, _)| *k == "schedule")
        .unwrap()
        .1 = schedule_map(uint(1_700_000_000_000), text(ORIGIN));
    // Upper-case hex comes out as our lower-case NodeId.
    assert_eq!(decode_entries(entries).unwrap(), expected_vote());
}

#[test]
fn decodes_fields_in_another_order() {
    let mut entries = vote_entries();
    entries.reverse();
    assert_eq!(decode_entries(entries).unwrap(), expected_vote());
}

#[test]
fn ignores_unknown_fields_non_text_keys_and_tags() {
    let mut entries = vote_entries();
    entries.insert(2, ("weight", uint(3)));
    entries.push(("extra", map(vec![("nested", Value::Array(vec![]))])));
    let mut value = map(entries);
    if let Value::Map(m) = &mut value {
        m.push((uint(7), text("integer key")));
        // A tagged epoch: serde_cbor 0.8 skipped tags.
        let epoch = m.iter_mut().find(|(k, _)| *k == text("epoch")).unwrap();
        epoch.1 = Value::Tag(1, Box::new(uint(5)));
    }
    assert_eq!(Packet::decode(&cbor(&value)).unwrap(), expected_vote());
}

#[test]
fn missing_or_null_schedule_is_none() {
    let none = Packet {
        schedule: None,
        ..expected_vote()
    };
    assert_eq!(decode_entries(vote_without("schedule")).unwrap(), none);
    assert_eq!(
        decode_entries(vote_with("schedule", Value::Null)).unwrap(),
        none
    );
}

#[test]
fn not_cbor() {
    for bytes in [&[][..], &[0x1C], &[0xA4, 0x64, b't']] {
        let error = Packet::decode(bytes).unwrap_err();
        assert!(matches!(error, WireError::NotCbor(_)), "{bytes:?}: {error}");
        assert!(error.to_string().starts_with("not CBOR: "), "{error}");
    }
    assert_eq!(
        Packet::decode(&[0xA4, 0x64, b't']).unwrap_err().to_string(),
        "not CBOR: ends early"
    );
}

#[test]
fn trailing_bytes() {
    let mut bytes = packet(1, None, Kind::Ping).encode().unwrap();
    bytes.extend([0x00, 0x00]);
    assert_eq!(
        Packet::decode(&bytes).unwrap_err().to_string(),
        "2 bytes after the end of the packet"
    );
}

#[test]
fn not_a_map() {
    assert_eq!(
        Packet::decode(&[0x01]).unwrap_err().to_string(),
        "not a map: got 1"
    );
    assert_eq!(
        Packet::decode(&cbor(&Value::Array(vec![text("Ping")])))
            .unwrap_err()
            .to_string(),
        "not a map: got an array"
    );
}

#[test]
fn unknown_or_bad_type() {
    assert_eq!(
        error_of(vote_with("type", text("Pung"))),
        "unknown packet type \"Pung\""
    );
    // The type is checked before the other fields.
    assert_eq!(
        error_of(vec![("type", text("Hello"))]),
        "unknown packet type \"Hello\""
    );
    assert_eq!(
        error_of(vote_with("type", uint(1))),
        "type: expected text, got 1"
    );
}

#[test]
fn missing_fields_are_named() {
    for (field, message) in [
        ("type", "missing field \"type\""),
        ("id", "missing field \"id\""),
        ("epoch", "missing field \"epoch\""),
        ("target", "missing field \"target\""),
    ] {
        assert_eq!(error_of(vote_without(field)), message);
    }
    let pong = vec![
        ("type", text("Pong")),
        ("id", Value::Bytes(FROM_BYTES.to_vec())),
        ("epoch", uint(5)),
        ("schedule", Value::Null),
    ];
    assert_eq!(error_of(pong), "missing field \"errors\"");
    let no_hash = vote_with(
        "schedule",
        map(vec![
            ("timestamp", uint(1)),
            ("origin", Value::Bytes(ORIGIN_BYTES.to_vec())),
        ]),
    );
    assert_eq!(error_of(no_hash), "missing field \"schedule.hash\"");
}

#[test]
fn duplicate_field() {
    let mut entries = vote_entries();
    entries.push(("epoch", uint(6)));
    assert_eq!(error_of(entries), "duplicate field \"epoch\"");
}

#[test]
fn ids_of_wrong_length_or_kind() {
    assert_eq!(
        error_of(vote_with("id", Value::Bytes(vec![1, 2, 3]))),
        "id: expected 16 bytes, got 3"
    );
    assert_eq!(
        error_of(vote_with("target", Value::Bytes(vec![0; 17]))),
        "target: expected 16 bytes, got 17"
    );
    assert_eq!(
        error_of(vote_with("id", text("abc"))),
        "id: expected 32 hex characters, got \"abc\""
    );
    let not_hex = "zz".repeat(16);
    assert_eq!(
        error_of(vote_with("id", text(&not_hex))),
        format!("id: expected 32 hex characters, got \"{not_hex}\"")
    );
    assert_eq!(
        error_of(vote_with("id", uint(7))),
        "id: expected an id (16 bytes or 32 hex characters), got 7"
    );
    let short_origin = vote_with("schedule", schedule_map(uint(1), vec![0u8; 4]));
    assert_eq!(
        error_of(short_origin),
        "schedule.origin: expected 16 bytes, got 4"
    );
}

#[test]
fn epoch_must_be_an_unsigned_integer() {
    assert_eq!(
        error_of(vote_with("epoch", Value::Integer((-1i64).into()))),
        "epoch: expected an unsigned integer, got -1"
    );
    assert_eq!(
        error_of(vote_with("epoch", text("7"))),
        "epoch: expected an unsigned integer, got text \"7\""
    );
    assert_eq!(
        error_of(vote_with("epoch", Value::Float(1.5))),
        "epoch: expected an unsigned integer, got float 1.5"
    );
    assert_eq!(
        error_of(vote_with("epoch", Value::Null)),
        "epoch: expected an unsigned integer, got null"
    );
}

#[test]
fn schedule_must_be_null_or_a_map() {
    assert_eq!(
        error_of(vote_with("schedule", Value::Bool(true))),
        "schedule: expected null or a map, got true"
    );
    let bad_timestamp = vote_with(
        "schedule",
        schedule_map(Value::Integer((-5i64).into()), ORIGIN_BYTES.to_vec()),
    );
    assert_eq!(
        error_of(bad_timestamp),
        "schedule.timestamp: expected an unsigned integer, got -5"
    );
}

#[test]
fn decode_refuses_more_than_max_packet() {
    let error = Packet::decode(&[0u8; 600]).unwrap_err();
    assert_eq!(error.to_string(), "too big: 600 bytes (at most 512)");
    assert_eq!(error.label(), "too_big");
}

#[test]
fn encode_refuses_bad_ids() {
    let bad = packet(1, None, Kind::Ping);
    let bad = Packet {
        from: "xyz".into(),
        ..bad
    };
    assert_eq!(
        bad.encode().unwrap_err().to_string(),
        "id: expected 32 hex characters, got \"xyz\""
    );
    let vote = packet(
        1,
        None,
        Kind::Vote {
            target: "g".repeat(32),
        },
    );
    assert_eq!(vote.encode().unwrap_err().label(), "bad_id");
    let stamp = ScheduleStamp {
        origin: "abcd".into(),
        ..stamp()
    };
    assert_eq!(
        packet(1, Some(stamp), Kind::Ping)
            .encode()
            .unwrap_err()
            .to_string(),
        "schedule.origin: expected 32 hex characters, got \"abcd\""
    );
}

#[test]
fn encode_refuses_a_packet_over_max_packet() {
    let with_hash = |len: usize| {
        packet(
            u64::MAX,
            Some(ScheduleStamp {
                hash: "h".repeat(len),
                ..stamp()
            }),
            Kind::Vote {
                target: TARGET.into(),
            },
        )
    };
    let error = with_hash(600).encode().unwrap_err();
    assert!(
        matches!(error, WireError::TooBig { size } if size > MAX_PACKET),
        "{error}"
    );
    // The limit is exact: the longest hash that fits gives 512 bytes, one more is refused.
    let fits = (0..MAX_PACKET)
        .take_while(|&len| with_hash(len).encode().is_ok())
        .last()
        .unwrap();
    assert_eq!(with_hash(fits).encode().unwrap().len(), MAX_PACKET);
    assert_eq!(
        with_hash(fits + 1).encode().unwrap_err().to_string(),
        "too big: 513 bytes (at most 512)"
    );
}

// Round trips of generated packets.

fn random_id(rng: &mut SmallRng) -> NodeId {
    hex::encode(rng.random::<[u8; 16]>())
}

/// Any width of integer, from the initial byte to eight bytes.
fn random_uint(rng: &mut SmallRng) -> u64 {
    rng.random::<u64>() >> rng.random_range(0..64)
}

fn random_packet(rng: &mut SmallRng) -> Packet {
    const CHARS: &[char] = &['0', '9', 'a', 'f', 'Z', '-', ' ', 'ä', '✓', '"'];
    let schedule = rng.random_bool(0.6).then(|| ScheduleStamp {
        timestamp: random_uint(rng),
        hash: (0..rng.random_range(0..80))
            .map(|_| CHARS[rng.random_range(0..CHARS.len())])
            .collect(),
        origin: random_id(rng),
    });
    let kind = match rng.random_range(0..3) {
        0 => Kind::Ping,
        1 => Kind::Pong {
            errors: random_uint(rng),
        },
        _ => Kind::Vote {
            target: random_id(rng),
        },
    };
    let lz4_sha1 = (kind == Kind::Ping && schedule.is_some() && rng.random_bool(0.5))
        .then(|| rng.random::<[u8; 20]>());
    Packet {
        from: random_id(rng),
        epoch: random_uint(rng),
        schedule,
        kind,
        lz4_sha1,
    }
}

#[test]
fn generated_packets_round_trip() {
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    for _ in 0..500 {
        let packet = random_packet(&mut rng);
        let bytes = packet.encode().unwrap();
        assert!(bytes.len() <= MAX_PACKET);
        let decoded = Packet::decode(&bytes).unwrap();
        assert_eq!(decoded, packet);
        assert_eq!(decoded.encode().unwrap(), bytes);
    }
}

// Shared-key authentication (issue 10, optional for sites that want more than the peer list).

fn key(byte: u8) -> AuthKey {
    AuthKey::new(vec![byte; 32]).unwrap()
}

#[test]
fn without_a_key_packets_are_exactly_0_13s() {
    let p = packet(7, Some(stamp()), Kind::Pong { errors: 2 });
    assert_eq!(p.encode_with(None).unwrap(), p.encode().unwrap());
    assert_eq!(Packet::decode_with(&p.encode().unwrap(), None).unwrap(), p);
}

#[test]
fn with_a_key_packets_carry_a_tag_that_is_checked() {
    let k = key(1);
    for p in [
        packet(7, Some(stamp()), Kind::Ping),
        packet(7, None, Kind::Pong { errors: 2 }),
        vote(8, Some(stamp())),
    ] {
        let plain = p.encode().unwrap();
        let sealed = p.encode_with(Some(&k)).unwrap();
        assert_eq!(sealed.len(), plain.len() + TAG_LEN);
        assert_eq!(&sealed[..plain.len()], &plain[..], "the CBOR is unchanged");
        assert_eq!(Packet::decode_with(&sealed, Some(&k)).unwrap(), p);
        // Another key, a plain (0.13) packet, a flipped bit anywhere, a cut tag: refused.
        let refused = |bytes: &[u8], key: &AuthKey| {
            matches!(
                Packet::decode_with(bytes, Some(key)),
                Err(WireError::BadTag)
            )
        };
        assert!(refused(&sealed, &key(2)));
        assert!(refused(&plain, &k));
        for i in [0, plain.len() / 2, plain.len(), sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(refused(&bad, &k), "bit flipped at {i}");
        }
        assert!(refused(&sealed[..sealed.len() - 1], &k));
        assert!(refused(&sealed[..TAG_LEN - 1], &k));
        // A node without the key cannot read a tagged packet: it is not 0.13's any more.
        assert!(matches!(
            Packet::decode_with(&sealed, None),
            Err(WireError::TrailingBytes(TAG_LEN))
        ));
    }
    assert_eq!(WireError::BadTag.label(), "bad_auth");
}

#[test]
fn keys_are_at_least_16_bytes_and_never_printed() {
    assert!(AuthKey::new(vec![0u8; MIN_KEY_LEN - 1]).is_none());
    let k = AuthKey::new(b"0123456789abcdef-secret".to_vec()).unwrap();
    assert!(!format!("{k:?}").contains("secret"));
}

/// A pre-vote is 0.13's Vote and one entry more, `pre_vote: true` (0.13 ignores it and takes
/// the packet as a vote); a vote without the entry, or with it false or null, is a vote.
#[test]
fn a_pre_vote_is_0_13s_vote_and_one_entry_more() {
    let pre = packet(
        65536,
        None,
        Kind::PreVote {
            target: TARGET.into(),
        },
    );
    let expected: Vec<u8> = [
        &head(6, "Vote", &[0x1A, 0x00, 0x01, 0x00, 0x00])[..], // a map of 6 entries now
        &cbor_text("target"),
        &id(&TARGET_BYTES),
        &cbor_text("schedule"),
        &[0xF6],
        &cbor_text("pre_vote"),
        &[0xF5], // true
    ]
    .concat();
    check_bytes(&pre, &expected);
    assert_eq!(pre.message(), Message::PreVote(TARGET.into()));
    // With a stamp and the key's tag it fits with room to spare.
    let long = Packet {
        schedule: Some(ScheduleStamp {
            hash: "f".repeat(40),
            ..stamp()
        }),
        ..pre.clone()
    };
    let sealed = long.encode_with(Some(&key(1))).unwrap();
    assert!(sealed.len() <= MAX_PACKET / 2, "{} bytes", sealed.len());
    assert_eq!(Packet::decode_with(&sealed, Some(&key(1))).unwrap(), long);
    let with = |flag: Value| {
        let mut entries = vote_entries();
        entries.push(("pre_vote", flag));
        entries
    };
    for flag in [Value::Bool(false), Value::Null] {
        assert_eq!(decode_entries(with(flag)).unwrap(), expected_vote());
    }
    assert_eq!(
        decode_entries(with(Value::Bool(true))).unwrap().kind,
        Kind::PreVote {
            target: match expected_vote().kind {
                Kind::Vote { target } => target,
                other => panic!("{other:?}"),
            }
        }
    );
    assert_eq!(
        error_of(with(uint(1))),
        "pre_vote: expected a boolean, got 1"
    );
}
