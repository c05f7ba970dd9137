//! Body hashes that leaders announce, so that a follower can take a schedule without hashing
//! all of its data.
//!
//! A follower checks a fetched schedule by hashing its data (SHA-1 of a megabyte: half a
//! millisecond, a sixth of what taking a schedule costs it). A leader of this version also
//! announces, in the pings that carry its schedule's stamp, the SHA-1 of the body it serves
//! that schedule in under the `x-verwalter-lz4` coding (`lz4_sha1`, see
//! `verwalter_controllers::election::wire::Packet`): about a fifth of the bytes. A body that
//! arrives in that coding with that hash, through the leader or a relay (relays pass the bytes on
//! as they came), is what the leader made for the schedule, so its data is taken without being
//! hashed ([`Schedule::from_vouched_peer`]); any other body is checked against the schedule hash
//! as before. The ping is as trusted as the schedule hash it carries: with `election.key-file`
//! both are authenticated, without it neither is.

use std::collections::VecDeque;
use std::sync::Mutex;

use sha1::{Digest, Sha1};
use verwalter_controllers::state::Schedule;

use crate::cluster::coding::Coding;

/// Announcements kept: a new leader's and its predecessors' recent ones.
const KEPT: usize = 8;

/// The body hashes announced for schedules, newest last (shared by the election task, which
/// notes them, and the fetcher, which checks bodies against them).
#[derive(Debug, Default)]
pub struct Announced(Mutex<VecDeque<(String, [u8; 20])>>);

impl Announced {
    /// Notes that the maker of schedule `hash` serves it as an LZ4 body with SHA-1 `body`.
    pub fn note(&self, hash: &str, body: [u8; 20]) {
        let mut kept = self.0.lock().unwrap();
        if kept.iter().any(|(h, b)| h == hash && *b == body) {
            return;
        }
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back((hash.to_string(), body));
    }

    /// Whether `body`, which arrived in `coding`, is one announced for schedule `hash`.
    pub fn vouches_for(&self, hash: &str, coding: Coding, body: &[u8]) -> bool {
        if coding != Coding::Lz4 {
            return false;
        }
        let announced: Vec<[u8; 20]> = {
            let kept = self.0.lock().unwrap();
            kept.iter()
                .filter(|(h, _)| h == hash)
                .map(|(_, b)| *b)
                .collect()
        };
        !announced.is_empty() && announced.contains(&body_sha1(body))
    }
}

/// The SHA-1 of a body, as announced.
pub fn body_sha1(body: &[u8]) -> [u8; 20] {
    Sha1::digest(body).into()
}

/// Reads a schedule that arrived as `coded` (in `coding`) and inflated to `plain`: without
/// hashing its data when `announced` vouches for the body as schedule `hash`.
pub fn read(
    announced: &Announced,
    hash: &str,
    coding: Coding,
    coded: &[u8],
    plain: Vec<u8>,
    host: &str,
) -> Result<(Schedule, bool), verwalter_controllers::state::ReadError> {
    if announced.vouches_for(hash, coding, coded) {
        Schedule::from_vouched_peer(plain, host, hash).map(|s| (s, true))
    } else {
        Schedule::from_peer(plain, host).map(|s| (s, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_lz4_body_with_an_announced_hash_for_that_schedule_is_vouched_for() {
        let announced = Announced::default();
        let body = b"some lz4 bytes".as_slice();
        assert!(!announced.vouches_for("h1", Coding::Lz4, body));
        announced.note("h1", body_sha1(body));
        assert!(announced.vouches_for("h1", Coding::Lz4, body));
        assert!(
            !announced.vouches_for("h2", Coding::Lz4, body),
            "another schedule"
        );
        assert!(
            !announced.vouches_for("h1", Coding::Gzip, body),
            "another coding"
        );
        assert!(!announced.vouches_for("h1", Coding::Lz4, b"other bytes"));
        // Two makers of one schedule (say, of two versions) may announce two bodies.
        announced.note("h1", body_sha1(b"other bytes"));
        assert!(announced.vouches_for("h1", Coding::Lz4, b"other bytes"));
        assert!(announced.vouches_for("h1", Coding::Lz4, body));
        // Bounded: the oldest announcements go.
        for n in 0..KEPT {
            announced.note(&format!("later{n}"), [n as u8; 20]);
        }
        assert!(!announced.vouches_for("h1", Coding::Lz4, body));
        assert_eq!(announced.0.lock().unwrap().len(), KEPT);
        // Noting one again does not push another out.
        announced.note("later0", [0; 20]);
        assert_eq!(announced.0.lock().unwrap().front().unwrap().0, "later0");
    }
}
