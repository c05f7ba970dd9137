//! The election state machine of verwalter 0.13, sans IO: time and messages in, state and
//! actions out. States, transitions and the minimum-votes rule follow the reference (§4.1–§4.3);
//! the randomised timeouts come from a seeded generator so simulations replay exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::state::NodeId;

/// Election timings. The defaults are the daemon's (docs/clustering.md says why); verwalter 0.13
/// used a 500 ms heartbeat, 1.6–4 s message timeouts and a 5 s start timeout ([`Timings::v0_13`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Timings {
    /// Fixed part of the wait before a starting node nominates itself.
    pub start_timeout: Duration,
    /// Random follower/voter timeout range (also added to the start timeout), so that nodes
    /// rarely time out together.
    pub message_timeout_min: Duration,
    pub message_timeout_max: Duration,
    /// Leader ping period and the length of one election round.
    pub heartbeat: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            start_timeout: crate::defaults::START_TIMEOUT,
            message_timeout_min: crate::defaults::LEADER_TIMEOUT_MIN,
            message_timeout_max: crate::defaults::LEADER_TIMEOUT_MAX,
            heartbeat: crate::defaults::HEARTBEAT,
        }
    }
}

impl Timings {
    /// verwalter 0.13's timings.
    pub fn v0_13() -> Timings {
        Timings {
            start_timeout: Duration::from_millis(5000),
            message_timeout_min: Duration::from_millis(1600),
            message_timeout_max: Duration::from_millis(4000),
            heartbeat: Duration::from_millis(500),
        }
    }
}

/// The highest epoch the machine takes from a message or reaches itself. A message of a higher
/// epoch is ignored: no cluster gets there by elections (2^53 of them; at ten a second that takes
/// 28 million years), so such an epoch is garbage or an attack; it keeps `epoch + 1` from ever
/// wrapping to 0, and epochs stay exact for JSON readers (`/v1/election`), which read numbers
/// as doubles.
pub const MAX_EPOCH: u64 = (1 << 53) - 1;

/// The epoch after `epoch`, never above [`MAX_EPOCH`] (reached only by a cluster that was sent
/// `MAX_EPOCH` itself; it then elects within that epoch).
fn next_epoch(epoch: u64) -> u64 {
    epoch.saturating_add(1).min(MAX_EPOCH)
}

/// The machine's state (reference §4.1). `Starting` has epoch 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Starting {
        deadline: Instant,
    },
    Electing {
        epoch: u64,
        votes: BTreeSet<NodeId>,
        needed: usize,
        deadline: Instant,
    },
    Voted {
        epoch: u64,
        peer: NodeId,
        deadline: Instant,
    },
    Leader {
        epoch: u64,
        next_ping: Instant,
    },
    Follower {
        leader: NodeId,
        epoch: u64,
        deadline: Instant,
    },
}

/// What a peer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Ping,
    Pong,
    Vote(NodeId),
}

/// What the machine asks its transport to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ping every peer (leader heartbeat).
    PingAll,
    /// Broadcast a vote for this node.
    Vote,
    /// Send a `Vote(candidate)` back to the candidate only.
    ConfirmVote(NodeId),
    /// Answer a leader's ping.
    Pong(NodeId),
}

/// The election state machine of one node.
#[derive(Debug)]
pub struct Machine {
    id: NodeId,
    state: State,
    timings: Timings,
    force_leader: bool,
    rng: SmallRng,
    /// When the node last became leader or follower.
    stable_since: Option<Instant>,
    /// `--allow-minority-cluster`: a leader keeps leading whoever it still reaches.
    keep_leading_without_majority: bool,
    /// While leading: when each peer last sent a message of the leader's epoch (its pongs, the
    /// votes that elected it), to notice a lost majority.
    answered: BTreeMap<NodeId, Instant>,
    /// While leading: since when.
    leading_since: Option<Instant>,
}

/// Votes needed to lead when `peers` other nodes count (reference §4.3): everyone for one or
/// two nodes, a strict majority from three on.
pub fn minimum_votes(peers: usize) -> usize {
    match peers + 1 {
        0 | 1 => 1,
        2 => 2,
        n => n / 2 + 1,
    }
}

impl Machine {
    pub fn new(id: NodeId, now: Instant, timings: Timings, seed: u64) -> Machine {
        let mut machine = Machine {
            id,
            state: State::Starting { deadline: now },
            timings,
            force_leader: false,
            rng: SmallRng::seed_from_u64(seed),
            stable_since: None,
            keep_leading_without_majority: false,
            answered: BTreeMap::new(),
            leading_since: None,
        };
        let deadline = now + machine.timings.start_timeout + machine.message_timeout();
        machine.state = State::Starting { deadline };
        machine
    }

    /// `--debug-force-leader`: lead on the first timeout without votes.
    pub fn force_leader(mut self, force: bool) -> Machine {
        self.force_leader = force;
        self
    }

    /// `--allow-minority-cluster`: a leader does not step down when it stops hearing from a
    /// majority (each side of a partition is meant to lead itself).
    pub fn keep_leading_without_majority(mut self, keep: bool) -> Machine {
        self.keep_leading_without_majority = keep;
        self
    }

    /// Start immediately instead of waiting for the start timeout (a node that cannot have peers).
    pub fn start_now(mut self, now: Instant) -> Machine {
        self.state = State::Starting { deadline: now };
        self
    }

    pub fn id(&self) -> &NodeId {
        &self.id
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn stable_since(&self) -> Option<Instant> {
        self.stable_since
    }

    pub fn epoch(&self) -> u64 {
        match &self.state {
            State::Starting { .. } => 0,
            State::Electing { epoch, .. }
            | State::Voted { epoch, .. }
            | State::Leader { epoch, .. }
            | State::Follower { epoch, .. } => *epoch,
        }
    }

    /// When the machine next wants [`Machine::time_passed`].
    pub fn deadline(&self) -> Instant {
        match &self.state {
            State::Starting { deadline }
            | State::Electing { deadline, .. }
            | State::Voted { deadline, .. }
            | State::Follower { deadline, .. } => *deadline,
            State::Leader { next_ping, .. } => *next_ping,
        }
    }

    fn message_timeout(&mut self) -> Duration {
        let min = self.timings.message_timeout_min;
        let max = self.timings.message_timeout_max.max(min);
        if max == min {
            min
        } else {
            self.rng.random_range(min..max)
        }
    }

    /// Time moved on. `peers` is how many other nodes count for the vote; `hosts_fresh` is false
    /// when the peer list is stale, which sends the node back to `Starting` (reference §4.3).
    pub fn time_passed(&mut self, now: Instant, peers: usize, hosts_fresh: bool) -> Vec<Action> {
        if now < self.deadline() {
            return Vec::new();
        }
        if !hosts_fresh {
            let deadline = now + self.timings.start_timeout + self.message_timeout();
            self.state = State::Starting { deadline };
            self.stable_since = None;
            return Vec::new();
        }
        match &self.state {
            State::Starting { .. } => {
                if peers == 0 || self.force_leader {
                    self.become_leader(now, 1)
                } else {
                    self.start_election(now, 1, peers)
                }
            }
            State::Electing { epoch, .. }
            | State::Voted { epoch, .. }
            | State::Follower { epoch, .. } => {
                let next = next_epoch(*epoch);
                self.start_election(now, next, peers)
            }
            State::Leader { epoch, .. } => {
                let epoch = *epoch;
                if self.lost_majority(now, peers) {
                    // Cut off into a minority: the majority elects its own leader (its
                    // followers time out after the same leader timeout), so leading on would
                    // make two leaders. An election is what a leaderless minority node does.
                    return self.start_election(now, next_epoch(epoch), peers);
                }
                self.state = State::Leader {
                    epoch,
                    next_ping: now + self.timings.heartbeat,
                };
                vec![Action::PingAll]
            }
        }
    }

    /// Whether a leader has not heard from a majority (itself included) within the shortest
    /// leader timeout: the time its followers give it before they elect another. A new leader
    /// counts its voters as heard when it won. Off in minority mode and for a forced leader.
    fn lost_majority(&self, now: Instant, peers: usize) -> bool {
        if self.keep_leading_without_majority || self.force_leader {
            return false;
        }
        let window = self.timings.message_timeout_min;
        if self.leading_since.is_none_or(|since| now < since + window) {
            return false;
        }
        let heard = self
            .answered
            .values()
            .filter(|at| **at + window > now)
            .count();
        heard + 1 < minimum_votes(peers)
    }

    /// A message from `from` at `epoch` arrived. Messages of an epoch above [`MAX_EPOCH`] are
    /// ignored.
    pub fn message(
        &mut self,
        now: Instant,
        from: &NodeId,
        epoch: u64,
        message: Message,
        peers: usize,
    ) -> Vec<Action> {
        if from == &self.id {
            return Vec::new();
        }
        let own = self.epoch();
        if epoch < own || epoch > MAX_EPOCH {
            return Vec::new();
        }
        let newer = epoch > own;
        if !newer && matches!(self.state, State::Leader { .. }) && message != Message::Ping {
            self.answered.insert(from.clone(), now);
        }
        match message {
            Message::Ping => {
                if !newer && matches!(self.state, State::Leader { .. }) {
                    // Two leaders of one epoch: partitions joined. Elect anew.
                    return self.start_election(now, next_epoch(own), peers);
                }
                self.become_follower(now, from.clone(), epoch);
                vec![Action::Pong(from.clone())]
            }
            Message::Pong => {
                if !newer && matches!(self.state, State::Leader { .. }) {
                    Vec::new()
                } else {
                    self.start_election(now, next_epoch(epoch), peers)
                }
            }
            Message::Vote(candidate) => {
                if newer || matches!(self.state, State::Starting { .. }) {
                    let deadline = now + self.message_timeout();
                    self.state = State::Voted {
                        epoch,
                        peer: candidate.clone(),
                        deadline,
                    };
                    return vec![Action::ConfirmVote(candidate)];
                }
                let State::Electing { votes, needed, .. } = &mut self.state else {
                    return Vec::new(); // a late vote
                };
                if candidate != self.id {
                    return Vec::new();
                }
                votes.insert(from.clone());
                if votes.len() >= minimum_votes(peers).max(*needed) {
                    let voters = std::mem::take(votes);
                    let actions = self.become_leader(now, epoch);
                    // The voters answered just now: they count as heard.
                    self.answered = voters
                        .into_iter()
                        .filter(|v| *v != self.id)
                        .map(|v| (v, now))
                        .collect();
                    actions
                } else {
                    Vec::new()
                }
            }
        }
    }

    fn start_election(&mut self, now: Instant, epoch: u64, peers: usize) -> Vec<Action> {
        let votes = BTreeSet::from([self.id.clone()]);
        let needed = minimum_votes(peers);
        self.stable_since = None;
        if votes.len() >= needed {
            return self.become_leader(now, epoch);
        }
        // A round lasts one to two heartbeats, at random: with rounds of a fixed length, two
        // candidates that started within one message delay of each other stay in lockstep and,
        // when only a bare majority is alive, split its votes forever (the simulation in
        // `sim.rs` found this; verwalter 0.13 has it too).
        let jitter = self
            .rng
            .random_range(Duration::ZERO..self.timings.heartbeat);
        let deadline = now + self.timings.heartbeat + jitter;
        self.state = State::Electing {
            epoch,
            votes,
            needed,
            deadline,
        };
        vec![Action::Vote]
    }

    fn become_leader(&mut self, now: Instant, epoch: u64) -> Vec<Action> {
        self.state = State::Leader {
            epoch,
            next_ping: now + self.timings.heartbeat,
        };
        self.stable_since = Some(now);
        self.answered.clear();
        self.leading_since = Some(now);
        vec![Action::PingAll]
    }

    fn become_follower(&mut self, now: Instant, leader: NodeId, epoch: u64) {
        let same_leader = matches!(&self.state,
            State::Follower { leader: l, epoch: e, .. } if *l == leader && *e == epoch);
        if !same_leader {
            self.stable_since = Some(now);
        }
        let deadline = now + self.message_timeout();
        self.state = State::Follower {
            leader,
            epoch,
            deadline,
        };
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
