//! The election state machine of verwalter 0.13, sans IO: time and messages in, state and
//! actions out. States, transitions and the minimum-votes rule follow the reference (§4.1–§4.3);
//! the randomised timeouts come from a seeded generator so simulations replay exactly.
//!
//! One addition, on by default ([`Machine::pre_vote`]): a node whose timer fires does not raise
//! its epoch at once. It first asks every peer whether it could win an election at the next
//! epoch (a *pre-vote*, as etcd's raft does), and starts the real election only once enough
//! peers said yes. A peer says yes only while it is not following a leader it heard from within
//! the shortest leader timeout, and changes nothing when it answers. So a node that cannot
//! reach a majority (cut off, or in the window before minority mode lets its side elect) keeps
//! its epoch, and on a heal it follows the majority's leader instead of deposing it with an
//! epoch burnt in elections it could not win. On the wire a pre-vote is a `Vote` packet with a
//! `pre_vote` field (`wire.rs`); verwalter 0.13 ignores the field and takes it as a real vote,
//! which the candidate then counts as one.

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
pub(crate) const MAX_EPOCH: u64 = (1 << 53) - 1;

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
    /// Asking whether it could win at `epoch + 1`, still at `epoch` (see the module docs).
    PreVoting {
        epoch: u64,
        /// Peers that said yes, and this node.
        grants: BTreeSet<NodeId>,
        /// Of those, peers that answered with a real vote for `epoch + 1` (verwalter 0.13
        /// nodes, which take a pre-vote for a vote): they count in the real election too.
        votes: BTreeSet<NodeId>,
        needed: usize,
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
    /// A pre-vote for the candidate: from the candidate itself, a question (could it win at
    /// this epoch?); from another node, a yes.
    PreVote(NodeId),
}

/// What the machine asks its transport to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Ping every peer (leader heartbeat).
    PingAll,
    /// Broadcast a vote for this node.
    Vote,
    /// Send a `Vote(candidate)` back to the candidate only.
    ConfirmVote(NodeId),
    /// Answer a leader's ping.
    Pong(NodeId),
    /// Broadcast a pre-vote for this node at `epoch` (the machine's epoch + 1).
    PreVote { epoch: u64 },
    /// Say yes to a candidate's pre-vote at `epoch`, to the candidate only.
    GrantPreVote { candidate: NodeId, epoch: u64 },
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
    /// Ask peers before raising the epoch (see the module docs); off: verwalter 0.13's rules.
    pre_vote: bool,
    /// While following: when the leader's last ping came.
    leader_heard: Option<Instant>,
}

/// Votes needed to lead when `peers` other nodes count (reference §4.3): everyone for one or
/// two nodes, a strict majority from three on.
pub(crate) fn minimum_votes(peers: usize) -> usize {
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
            pre_vote: true,
            leader_heard: None,
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

    /// Whether a timeout starts with a pre-vote (the default) or, as in verwalter 0.13, with an
    /// election at the next epoch.
    pub fn pre_vote(mut self, on: bool) -> Machine {
        self.pre_vote = on;
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

    pub(crate) fn stable_since(&self) -> Option<Instant> {
        self.stable_since
    }

    pub fn epoch(&self) -> u64 {
        match &self.state {
            State::Starting { .. } => 0,
            State::PreVoting { epoch, .. }
            | State::Electing { epoch, .. }
            | State::Voted { epoch, .. }
            | State::Leader { epoch, .. }
            | State::Follower { epoch, .. } => *epoch,
        }
    }

    /// When the machine next wants [`Machine::time_passed`].
    pub fn deadline(&self) -> Instant {
        match &self.state {
            State::Starting { deadline }
            | State::PreVoting { deadline, .. }
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
    pub fn time_passed(&mut self, now: Instant, peers: usize, hosts_fresh: bool) -> Vec<Effect> {
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
                    self.time_to_elect(now, 0, peers)
                }
            }
            State::PreVoting { epoch, .. }
            | State::Electing { epoch, .. }
            | State::Voted { epoch, .. }
            | State::Follower { epoch, .. } => {
                let epoch = *epoch;
                self.time_to_elect(now, epoch, peers)
            }
            State::Leader { epoch, .. } => {
                let epoch = *epoch;
                if self.lost_majority(now, peers) {
                    // Cut off into a minority: the majority elects its own leader (its
                    // followers time out after the same leader timeout), so leading on would
                    // make two leaders. An election is what a leaderless minority node does.
                    return self.time_to_elect(now, epoch, peers);
                }
                self.state = State::Leader {
                    epoch,
                    next_ping: now + self.timings.heartbeat,
                };
                vec![Effect::PingAll]
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
    ) -> Vec<Effect> {
        if from == &self.id {
            return Vec::new();
        }
        if let Message::PreVote(candidate) = message {
            return self.pre_vote_message(now, from, epoch, candidate, peers);
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
                vec![Effect::Pong(from.clone())]
            }
            Message::Pong => {
                if !newer && matches!(self.state, State::Leader { .. }) {
                    Vec::new()
                } else {
                    self.start_election(now, next_epoch(epoch), peers)
                }
            }
            Message::PreVote(_) => unreachable!("handled above"),
            Message::Vote(candidate) => {
                if let State::PreVoting { epoch: e, .. } = self.state
                    && candidate == self.id
                    && epoch == next_epoch(e)
                    && epoch > e
                {
                    // A verwalter 0.13 node took this node's pre-vote for a vote: a yes, and a
                    // vote for the election that follows.
                    return self.granted(now, from, true, peers);
                }
                if newer || matches!(self.state, State::Starting { .. }) {
                    let deadline = now + self.message_timeout();
                    self.state = State::Voted {
                        epoch,
                        peer: candidate.clone(),
                        deadline,
                    };
                    return vec![Effect::ConfirmVote(candidate)];
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
                    self.become_leader_voted(now, epoch, voters)
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// A timer says it is time to elect, at `epoch` now: a pre-vote, or (pre-votes off) the
    /// election at the next epoch.
    fn time_to_elect(&mut self, now: Instant, epoch: u64, peers: usize) -> Vec<Effect> {
        if !self.pre_vote || minimum_votes(peers) <= 1 || next_epoch(epoch) == epoch {
            // Alone (nothing to ask), or at the epoch limit (nothing to protect).
            return self.start_election(now, next_epoch(epoch).max(1), peers);
        }
        self.stable_since = None;
        self.leader_heard = None;
        self.state = State::PreVoting {
            epoch,
            grants: BTreeSet::from([self.id.clone()]),
            votes: BTreeSet::new(),
            needed: minimum_votes(peers),
            deadline: self.round_deadline(now),
        };
        vec![Effect::PreVote {
            epoch: next_epoch(epoch),
        }]
    }

    /// A pre-vote from `from` for `candidate` at `epoch`: a question when the candidate sent
    /// it, else an answer. Neither changes this node's epoch or whom it follows.
    fn pre_vote_message(
        &mut self,
        now: Instant,
        from: &NodeId,
        epoch: u64,
        candidate: NodeId,
        peers: usize,
    ) -> Vec<Effect> {
        if epoch > MAX_EPOCH {
            return Vec::new();
        }
        if candidate == *from {
            // A question. Yes only if a real election at that epoch would get this node's vote
            // (a newer epoch) and this node has no leader it heard from lately: a leader, or a
            // follower its leader pinged within the shortest leader timeout, would be deposed
            // by an election the candidate only wants because it cannot hear that leader.
            let live_leader = match &self.state {
                State::Leader { .. } => true,
                State::Follower { .. } => self
                    .leader_heard
                    .is_some_and(|at| now < at + self.timings.message_timeout_min),
                _ => false,
            };
            if epoch > self.epoch() && !live_leader {
                return vec![Effect::GrantPreVote { candidate, epoch }];
            }
            if let State::Leader { epoch: own, .. } = self.state
                && epoch > next_epoch(own)
            {
                // The candidate is ahead of this leader (a real election it started reached a
                // higher epoch): it ignores this leader's pings and its pre-votes get no yes
                // while the followers hear their leader. Elect anew at the candidate's epoch,
                // which it and the followers vote in: this leader most likely stays leader, and
                // the candidate follows it.
                return self.start_election(now, epoch, peers);
            }
            return Vec::new();
        }
        match &self.state {
            State::PreVoting { epoch: e, .. }
                if candidate == self.id && epoch == next_epoch(*e) && epoch > *e =>
            {
                self.granted(now, from, false, peers)
            }
            _ => Vec::new(), // a late or stray answer
        }
    }

    /// `from` said yes to this node's pre-vote (`vote`: with a real vote, see
    /// [`State::PreVoting`]). With enough yeses the real election starts.
    fn granted(&mut self, now: Instant, from: &NodeId, vote: bool, peers: usize) -> Vec<Effect> {
        let State::PreVoting {
            epoch,
            grants,
            votes,
            needed,
            ..
        } = &mut self.state
        else {
            return Vec::new();
        };
        grants.insert(from.clone());
        if vote {
            votes.insert(from.clone());
        }
        if grants.len() < minimum_votes(peers).max(*needed) {
            return Vec::new();
        }
        let (epoch, votes) = (next_epoch(*epoch), std::mem::take(votes));
        let mut actions = self.start_election(now, epoch, peers);
        if let State::Electing {
            votes: mine,
            needed,
            ..
        } = &mut self.state
        {
            mine.extend(votes);
            if mine.len() >= *needed {
                let voters = std::mem::take(mine);
                actions = self.become_leader_voted(now, epoch, voters);
            }
        }
        actions
    }

    /// The end of an election round: one to two heartbeats, at random. With rounds of a fixed
    /// length, two candidates that started within one message delay of each other stay in
    /// lockstep and, when only a bare majority is alive, split its votes forever (the
    /// simulation in `sim.rs` found this; verwalter 0.13 has it too).
    fn round_deadline(&mut self, now: Instant) -> Instant {
        let jitter = self
            .rng
            .random_range(Duration::ZERO..self.timings.heartbeat);
        now + self.timings.heartbeat + jitter
    }

    fn start_election(&mut self, now: Instant, epoch: u64, peers: usize) -> Vec<Effect> {
        let votes = BTreeSet::from([self.id.clone()]);
        let needed = minimum_votes(peers);
        self.stable_since = None;
        self.leader_heard = None;
        if votes.len() >= needed {
            return self.become_leader(now, epoch);
        }
        let deadline = self.round_deadline(now);
        self.state = State::Electing {
            epoch,
            votes,
            needed,
            deadline,
        };
        vec![Effect::Vote]
    }

    fn become_leader(&mut self, now: Instant, epoch: u64) -> Vec<Effect> {
        self.state = State::Leader {
            epoch,
            next_ping: now + self.timings.heartbeat,
        };
        self.stable_since = Some(now);
        self.answered.clear();
        self.leading_since = Some(now);
        self.leader_heard = None;
        vec![Effect::PingAll]
    }

    /// [`Machine::become_leader`] after an election won with `voters`: they answered just now,
    /// so they count as heard.
    fn become_leader_voted(
        &mut self,
        now: Instant,
        epoch: u64,
        voters: BTreeSet<NodeId>,
    ) -> Vec<Effect> {
        let actions = self.become_leader(now, epoch);
        self.answered = voters
            .into_iter()
            .filter(|v| *v != self.id)
            .map(|v| (v, now))
            .collect();
        actions
    }

    fn become_follower(&mut self, now: Instant, leader: NodeId, epoch: u64) {
        let same_leader = matches!(&self.state,
            State::Follower { leader: l, epoch: e, .. } if *l == leader && *e == epoch);
        if !same_leader {
            self.stable_since = Some(now);
        }
        let deadline = now + self.message_timeout();
        self.leader_heard = Some(now);
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
