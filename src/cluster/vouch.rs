//! Body hashes that leaders announce, so that a follower can take a schedule without hashing
//! all of its data.
//!
//! A follower checks a fetched schedule by hashing its data (SHA-1 of a megabyte: half a
//! millisecond, a sixth of what taking a schedule costs it). A leader of this version also
//! announces, in the pings that carry its schedule's stamp, the SHA-1 of the body it serves
//! that schedule in under the `x-verwalter-lz4` coding (`lz4_sha1`, see
//! `verwalter_controllers::cluster::election::wire::Packet`): about a fifth of the bytes. A body that
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

/// One announcement: node `maker` serves its schedule `hash` as an LZ4 body with SHA-1 `body`.
#[derive(Debug, PartialEq, Eq)]
struct Announcement {
    hash: String,
    maker: String,
    body: [u8; 20],
}

/// The body hashes announced for schedules, newest last (shared by the election task, which
/// notes them, and the fetcher, which checks bodies against them).
#[derive(Debug, Default)]
pub struct Announced(Mutex<VecDeque<Announcement>>);

impl Announced {
    /// Notes that node `maker` serves its own schedule `hash` as an LZ4 body with SHA-1 `body`
    /// (the caller checked that the ping came from `maker` and names it as the origin).
    pub fn note(&self, hash: &str, maker: &str, body: [u8; 20]) {
        let announcement = Announcement {
            hash: hash.to_string(),
            maker: maker.to_string(),
            body,
        };
        let mut kept = self.0.lock().unwrap();
        if kept.contains(&announcement) {
            return;
        }
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(announcement);
    }

    /// The nodes that announced `body`, which arrived in `coding`, as their schedule `hash`
    /// (none: nothing vouches for it). A node vouches only for schedules it made, so a peer
    /// cannot vouch for bytes under another node's schedule.
    pub(crate) fn makers_of(&self, hash: &str, coding: Coding, body: &[u8]) -> Vec<String> {
        if coding != Coding::Lz4 {
            return Vec::new();
        }
        let announced: Vec<(String, [u8; 20])> = {
            let kept = self.0.lock().unwrap();
            kept.iter()
                .filter(|a| a.hash == hash)
                .map(|a| (a.maker.clone(), a.body))
                .collect()
        };
        if announced.is_empty() {
            return Vec::new();
        }
        let sha1 = body_sha1(body);
        announced
            .into_iter()
            .filter(|(_, b)| *b == sha1)
            .map(|(maker, _)| maker)
            .collect()
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
    let makers = announced.makers_of(hash, coding, coded);
    if makers.is_empty() {
        return Schedule::from_peer(plain, host).map(|s| (s, false));
    }
    let schedule = Schedule::from_vouched_peer(plain, host, hash, &makers)?;
    // Taken on the body's hash only if it is one of those makers' schedule (else its data was
    // hashed as any other's).
    let vouched = makers.contains(&schedule.origin);
    Ok((schedule, vouched))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_lz4_body_with_an_announced_hash_for_that_schedule_is_vouched_for() {
        let announced = Announced::default();
        let body = b"some lz4 bytes".as_slice();
        let makers = |hash, coding, body| announced.makers_of(hash, coding, body);
        assert!(makers("h1", Coding::Lz4, body).is_empty());
        announced.note("h1", "leader", body_sha1(body));
        assert_eq!(makers("h1", Coding::Lz4, body), ["leader"]);
        assert!(
            makers("h2", Coding::Lz4, body).is_empty(),
            "another schedule"
        );
        assert!(
            makers("h1", Coding::Gzip, body).is_empty(),
            "another coding"
        );
        assert!(makers("h1", Coding::Lz4, b"other bytes").is_empty());
        // Another node may announce other bytes under the same hash: they vouch only as its own.
        announced.note("h1", "peer", body_sha1(b"other bytes"));
        assert_eq!(makers("h1", Coding::Lz4, b"other bytes"), ["peer"]);
        assert_eq!(makers("h1", Coding::Lz4, body), ["leader"]);
        // Bounded: the oldest announcements go.
        for n in 0..KEPT {
            announced.note(&format!("later{n}"), "leader", [n as u8; 20]);
        }
        assert!(makers("h1", Coding::Lz4, body).is_empty());
        assert_eq!(announced.0.lock().unwrap().len(), KEPT);
        // Noting one again does not push another out.
        announced.note("later0", "leader", [0; 20]);
        assert_eq!(announced.0.lock().unwrap().front().unwrap().hash, "later0");
    }
}
