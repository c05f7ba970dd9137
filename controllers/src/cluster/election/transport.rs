//! What the election transport decides, without the socket: whether the peer list is fresh,
//! how many peers count for the vote, which packets are taken, what each of the machine's
//! actions sends to whom, what a packet says about its sender, and why an election started (for
//! the metric). `src/cluster/election.rs` decodes, sends and counts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::machine::{Effect, MAX_EPOCH, Message, State};
use super::wire::{Kind, Packet};
use crate::state::{NodeId, Peers, Report, ScheduleStamp};

/// Peer info older than this makes the node stop trusting its view of the cluster
/// (verwalter 0.13: 1.5 × the 1 s peer refresh).
pub(crate) const HOSTS_FRESH: Duration = Duration::from_millis(1500);

/// Whether the peer list, last refreshed at `last_refresh_ms` (`None`: never), is fresh enough
/// to elect on at `now_ms`.
pub fn hosts_fresh(last_refresh_ms: Option<u64>, now_ms: u64) -> bool {
    last_refresh_ms.is_some_and(|t| now_ms.saturating_sub(t) <= HOSTS_FRESH.as_millis() as u64)
}

/// How many peers count for the vote: all listed ones, or with `minority_window` (minority mode)
/// only those heard from directly (`heard`: wall-clock ms by id) within it.
pub fn voters(
    peers: &Peers,
    minority_window: Option<Duration>,
    now_ms: u64,
    heard: &BTreeMap<NodeId, u64>,
) -> usize {
    let Some(window) = minority_window else {
        return peers.peers.len();
    };
    peers
        .peers
        .keys()
        .filter(|id| heard_lately(heard.get(*id).copied(), window, now_ms))
        .count()
}

/// Whether a peer last heard from directly at `heard_ms` (wall-clock ms; `None`: never) was
/// heard within `window` of `now_ms`: how the node judges a peer alive (for the vote in minority
/// mode, and on `/v1/peers` as `alive`).
pub fn heard_lately(heard_ms: Option<u64>, window: Duration, now_ms: u64) -> bool {
    let since = now_ms.saturating_sub(window.as_millis() as u64);
    heard_ms.is_some_and(|at| at >= since)
}

/// Why a packet is not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// This node's own packet (its broadcast came back): ignored, not counted.
    Own,
    /// Not from a listed peer at that peer's address: anyone else could move leadership with
    /// one forged packet, and an answer would let them aim our (larger) pongs at a spoofed
    /// source.
    UnknownPeer,
    /// An epoch no real election reaches.
    BadEpoch,
}

impl Dropped {
    /// The `reason` label of the dropped-messages metric; `None` for those not counted.
    pub fn label(self) -> Option<&'static str> {
        match self {
            Dropped::Own => None,
            Dropped::UnknownPeer => Some("unknown_peer"),
            Dropped::BadEpoch => Some("bad_epoch"),
        }
    }
}

/// Whether a decoded packet from `from` is taken by node `own`.
pub fn admit(own: &str, packet: &Packet, from: SocketAddr, peers: &Peers) -> Result<(), Dropped> {
    if packet.from == own {
        return Err(Dropped::Own);
    }
    if !is_peer(peers, &packet.from, from) {
        return Err(Dropped::UnknownPeer);
    }
    if packet.epoch > MAX_EPOCH {
        return Err(Dropped::BadEpoch);
    }
    Ok(())
}

/// Whether `id` is in the peer list with an address of the IP a packet came from (the port is
/// not compared: it is the peer's, but a NAT may change it). A peer without an address cannot
/// be checked, so it is not trusted either.
pub(crate) fn is_peer(peers: &Peers, id: &str, from: SocketAddr) -> bool {
    peers
        .peers
        .get(id)
        .and_then(|p| p.addr.as_deref()?.parse::<SocketAddr>().ok())
        .is_some_and(|addr| addr.ip().to_canonical() == from.ip().to_canonical())
}

/// What a taken packet says about its sender: its schedule and epoch, and its error count (a
/// pong's, or else the one it reported last).
pub fn report(packet: &Packet, previous: Option<&Report>) -> Report {
    let errors = match packet.kind {
        Kind::Pong { errors } => errors,
        _ => previous.map_or(0, |r| r.errors),
    };
    Report {
        schedule: packet.schedule.clone(),
        errors,
        epoch: packet.epoch,
    }
}

/// The schedule of another node a packet reports (noted for the fetcher), if any.
pub fn sighting<'p>(own: &str, packet: &'p Packet) -> Option<&'p ScheduleStamp> {
    packet.schedule.as_ref().filter(|s| s.origin != own)
}

/// Whether a packet is a ping from the leader this node follows (the leader-contact time).
pub fn from_my_leader(state: &State, packet: &Packet) -> bool {
    matches!(packet.kind, Kind::Ping)
        && matches!(state, State::Follower { leader, .. } if *leader == packet.from)
}

/// Where a packet goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum To {
    /// Every listed peer with an address.
    All,
    /// One peer (if it has an address).
    Peer(NodeId),
}

/// The packet an action of the machine sends, and to whom. `errors`: this node's error count
/// (a follower's pong reports it); `stamp`: the schedule in force. A leader's ping carries only a
/// schedule it produced itself: that is what its followers fetch (its copy of an older leader's
/// schedule is not theirs to take). `lz4_sha1`: a schedule hash and the SHA-1 of that
/// schedule's `x-verwalter-lz4` body, which a ping carrying that schedule announces.
pub fn outgoing(
    action: Effect,
    own: &NodeId,
    epoch: u64,
    errors: u64,
    stamp: Option<&ScheduleStamp>,
    lz4_sha1: Option<(&str, [u8; 20])>,
) -> (Packet, To) {
    let action_epoch = match &action {
        Effect::PreVote { epoch } | Effect::GrantPreVote { epoch, .. } => Some(*epoch),
        _ => None,
    };
    let (kind, to) = match action {
        Effect::PingAll => (Kind::Ping, To::All),
        Effect::Vote => (
            Kind::Vote {
                target: own.clone(),
            },
            To::All,
        ),
        Effect::ConfirmVote(candidate) => (
            Kind::Vote {
                target: candidate.clone(),
            },
            To::Peer(candidate),
        ),
        Effect::Pong(leader) => (Kind::Pong { errors }, To::Peer(leader)),
        Effect::PreVote { .. } => (
            Kind::PreVote {
                target: own.clone(),
            },
            To::All,
        ),
        Effect::GrantPreVote { candidate, .. } => (
            Kind::PreVote {
                target: candidate.clone(),
            },
            To::Peer(candidate),
        ),
    };
    // A pre-vote is about the epoch the election would have, not the node's own.
    let epoch = match &action_epoch {
        Some(epoch) => *epoch,
        None => epoch,
    };
    let schedule = match kind {
        Kind::Ping => stamp.filter(|s| s.origin == *own).cloned(),
        _ => stamp.cloned(),
    };
    // Only for the very schedule the ping carries.
    let lz4_sha1 = match (&kind, &schedule, lz4_sha1) {
        (Kind::Ping, Some(stamp), Some((hash, body))) if stamp.hash == hash => Some(body),
        _ => None,
    };
    let packet = Packet {
        from: own.clone(),
        epoch,
        schedule,
        kind,
        lz4_sha1,
    };
    (packet, to)
}

/// What woke the machine, for the election-started metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Its deadline passed.
    Timeout,
    /// A packet with this message arrived while it was in the state before.
    Message,
    Pong,
    /// A ping while it was the leader itself.
    TwoLeaders,
}

impl Cause {
    /// The cause of a packet's `message` arriving in state `before`.
    pub fn of_message(before: &State, message: &Message) -> Cause {
        match (before, message) {
            (State::Leader { .. }, Message::Ping) => Cause::TwoLeaders,
            (_, Message::Pong) => Cause::Pong,
            _ => Cause::Message,
        }
    }
}

/// The `reason` label of an election this node started going from `before` to `after`, or
/// `None` if it did not start one (not electing, or still in the same election). A pre-vote
/// starts an election, and so does each new round of it; the real election a won pre-vote
/// leads to is the same one.
pub fn election_started(before: &State, after: &State, cause: Cause) -> Option<&'static str> {
    let timeout = cause == Cause::Timeout;
    match (before, after) {
        (State::PreVoting { .. }, State::PreVoting { .. }) if !timeout => return None,
        (State::PreVoting { .. }, State::Electing { .. }) if !timeout => return None,
        (State::Electing { epoch: e, .. }, State::Electing { epoch, .. }) if e == epoch => {
            return None;
        }
        (_, State::PreVoting { .. } | State::Electing { .. }) => {}
        _ => return None,
    }
    Some(match before {
        State::Starting { .. } => "start",
        State::Follower { .. } if timeout => "leader_timeout",
        State::Electing { .. } | State::PreVoting { .. } if timeout => "election_timeout",
        State::Voted { .. } if timeout => "vote_timeout",
        State::Leader { .. } if timeout => "lost_majority",
        _ => match cause {
            Cause::Timeout => "timeout",
            Cause::Message => "message",
            Cause::Pong => "pong",
            Cause::TwoLeaders => "two_leaders",
        },
    })
}

#[cfg(test)]
mod tests;
