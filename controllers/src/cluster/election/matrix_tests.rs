//! The election machine's whole transition matrix (reference §4.3), one table row per
//! state × event × message-epoch cell, plus the minimum-votes rule and stale peer info.
//!
//! Every start state is reached by feeding a fresh machine real inputs (timeouts, votes, pings),
//! so the table also checks that the states it starts from are reachable the documented way.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use super::machine::{Effect, MAX_EPOCH, Machine, Message, State, Timings, minimum_votes};
use crate::state::NodeId;

/// Other nodes in the cluster the rows run in: five nodes, so a candidate needs three votes
/// (its own and two more), which leaves room for a counted vote that does not yet elect.
const PEERS: usize = 4;
/// The epoch of every start state but `Starting` (which is at epoch 0).
const E: u64 = 3;
const OLDER: u64 = E - 1;
/// Two ahead rather than one, so "message epoch + 1" and "own epoch + 1" differ in the table.
const NEWER: u64 = E + 2;

/// The nodes a row talks about: this machine and three of its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Me,
    B,
    C,
    D,
}

use Node::{B, C, D, Me};

fn id(node: Node) -> NodeId {
    let last = match node {
        Me => 'a',
        B => 'b',
        C => 'c',
        D => 'd',
    };
    format!("e0beef000000000000000000000000{last}{last}")
}

/// The state a row starts from, each built by [`build`] from real inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// A fresh machine.
    Starting,
    /// A fresh machine with `--debug-force-leader`.
    StartingForced,
    /// Electing at `E`, only its own vote so far.
    Electing,
    /// Electing at `E` with D's vote: one more vote makes it leader.
    ElectingOneShort,
    /// Voted for C at `E`.
    Voted,
    /// Leader at `E` (elected by B and D).
    Leader,
    /// Follower of B at `E`.
    Follower,
}

/// What happens to the machine in a row.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// `time_passed` at the machine's deadline.
    Timeout,
    /// `time_passed` a millisecond before the deadline.
    Early,
    Ping(Node),
    Pong(Node),
    /// `Vote { from, target }`: `from` votes for `target`.
    Vote(Node, Node),
}

/// The expected state after the event.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Exactly the state before, deadline and votes included ("—" in the matrix).
    Unchanged,
    Electing {
        epoch: u64,
        votes: &'static [Node],
        needed: usize,
    },
    Voted {
        epoch: u64,
        peer: Node,
    },
    Leader {
        epoch: u64,
    },
    Follower {
        epoch: u64,
        leader: Node,
    },
}

/// An expected action, naming nodes instead of ids so that rows stay constant.
#[derive(Debug, Clone, Copy)]
enum Act {
    PingAll,
    Vote,
    Confirm(Node),
    Pong(Node),
}

fn action(act: Act) -> Effect {
    match act {
        Act::PingAll => Effect::PingAll,
        Act::Vote => Effect::Vote,
        Act::Confirm(node) => Effect::ConfirmVote(id(node)),
        Act::Pong(node) => Effect::Pong(id(node)),
    }
}

struct Row {
    start: Start,
    event: Event,
    /// The message's epoch (ignored for timeouts).
    epoch: u64,
    /// The peer count the event is fed with.
    peers: usize,
    expect: Expect,
    actions: &'static [Act],
}

fn row(start: Start, event: Event, epoch: u64, expect: Expect, actions: &'static [Act]) -> Row {
    Row {
        start,
        event,
        epoch,
        peers: PEERS,
        expect,
        actions,
    }
}

impl Row {
    fn with_peers(self, peers: usize) -> Row {
        Row { peers, ..self }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Builds `start` from a fresh machine, returning the machine and the time of its last input.
fn build(start: Start) -> (Machine, Instant) {
    let t0 = Instant::now();
    // The transitions of 0.13's rules; pre-votes have their own tests (`machine_tests.rs`).
    let mut m = Machine::new(id(Me), t0, Timings::default(), 7).pre_vote(false);
    let mut now = t0;
    // Electing at 1, then two lost rounds take it to `E`.
    fn elect(m: &mut Machine, now: &mut Instant) {
        while m.epoch() < E {
            *now = m.deadline();
            assert_eq!(m.time_passed(*now, PEERS, true), vec![Effect::Vote]);
        }
        assert!(matches!(m.state(), State::Electing { epoch: E, .. }));
    }
    match start {
        Start::Starting => {}
        Start::StartingForced => m = m.force_leader(true),
        Start::Electing => elect(&mut m, &mut now),
        Start::ElectingOneShort | Start::Leader => {
            elect(&mut m, &mut now);
            now += ms(5);
            assert!(
                m.message(now, &id(D), E, Message::Vote(id(Me)), PEERS)
                    .is_empty()
            );
            if start == Start::Leader {
                now += ms(5);
                assert_eq!(
                    m.message(now, &id(B), E, Message::Vote(id(Me)), PEERS),
                    vec![Effect::PingAll]
                );
                assert!(matches!(m.state(), State::Leader { epoch: E, .. }));
            }
        }
        Start::Voted => {
            now += ms(100);
            assert_eq!(
                m.message(now, &id(C), E, Message::Vote(id(C)), PEERS),
                vec![Effect::ConfirmVote(id(C))]
            );
        }
        Start::Follower => {
            now += ms(100);
            assert_eq!(
                m.message(now, &id(B), E, Message::Ping, PEERS),
                vec![Effect::Pong(id(B))]
            );
        }
    }
    (m, now)
}

fn follower(epoch: u64, leader: Node) -> Expect {
    Expect::Follower { epoch, leader }
}

fn voted(epoch: u64, peer: Node) -> Expect {
    Expect::Voted { epoch, peer }
}

fn matrix() -> Vec<Row> {
    use Act::{Confirm, PingAll, Pong};
    use Event::{Early, Ping, Timeout, Vote};
    use Expect::{Electing, Leader, Unchanged};
    use Start as S;
    let elect = |epoch| Electing {
        epoch,
        votes: &[Me],
        needed: minimum_votes(PEERS),
    };
    let mut rows = vec![
        // Starting (epoch 0: every real message is newer; "= e" means an epoch-0 message).
        row(S::Starting, Early, 0, Unchanged, &[]),
        row(S::Starting, Timeout, 0, Leader { epoch: 1 }, &[PingAll]).with_peers(0),
        row(S::Starting, Timeout, 0, elect(1), &[Act::Vote]),
        row(
            S::StartingForced,
            Timeout,
            0,
            Leader { epoch: 1 },
            &[PingAll],
        ),
    ];
    for epoch in [0, NEWER] {
        rows.extend([
            row(S::Starting, Ping(B), epoch, follower(epoch, B), &[Pong(B)]),
            row(
                S::Starting,
                Event::Pong(B),
                epoch,
                elect(epoch + 1),
                &[Act::Vote],
            ),
            row(
                S::Starting,
                Vote(C, C),
                epoch,
                voted(epoch, C),
                &[Confirm(C)],
            ),
            // A vote for this node that it never asked for (only a leftover from before a
            // restart can be one): the matrix treats it like any vote, so the node "votes for
            // itself".
            row(
                S::Starting,
                Vote(B, Me),
                epoch,
                voted(epoch, Me),
                &[Confirm(Me)],
            ),
        ]);
    }
    // The columns every state past Starting shares: no deadline yet changes nothing, a message
    // of an older epoch changes nothing, a message of a newer epoch wins whatever the state.
    for start in [S::Electing, S::Voted, S::Leader, S::Follower] {
        // A vote for a node other than this one (in `Voted`, other than the one it voted for).
        let (other, confirm): (Node, &'static [Act]) = if start == S::Voted {
            (B, &[Confirm(B)])
        } else {
            (C, &[Confirm(C)])
        };
        rows.extend([
            row(start, Early, 0, Unchanged, &[]),
            row(start, Ping(B), OLDER, Unchanged, &[]),
            row(start, Event::Pong(B), OLDER, Unchanged, &[]),
            row(start, Vote(B, Me), OLDER, Unchanged, &[]),
            row(start, Vote(other, other), OLDER, Unchanged, &[]),
            row(start, Vote(other, other), E, Unchanged, &[]),
            row(start, Ping(B), NEWER, follower(NEWER, B), &[Pong(B)]),
            row(start, Event::Pong(B), NEWER, elect(NEWER + 1), &[Act::Vote]),
            row(start, Vote(B, Me), NEWER, voted(NEWER, Me), &[Confirm(Me)]),
            row(
                start,
                Vote(other, other),
                NEWER,
                voted(NEWER, other),
                confirm,
            ),
        ]);
    }
    // The rest of each state's own epoch, and its timeout.
    let one_more_vote = Electing {
        epoch: E,
        votes: &[Me, B],
        needed: 3,
    };
    rows.extend([
        // Electing(E), only its own vote.
        row(S::Electing, Timeout, 0, elect(E + 1), &[Act::Vote]),
        row(S::Electing, Ping(B), E, follower(E, B), &[Pong(B)]),
        row(S::Electing, Event::Pong(B), E, elect(E + 1), &[Act::Vote]),
        row(S::Electing, Vote(B, Me), E, one_more_vote, &[]),
        // Electing(E) one vote short of a majority.
        row(
            S::ElectingOneShort,
            Vote(B, Me),
            E,
            Leader { epoch: E },
            &[PingAll],
        ),
        // The same voter twice is one vote.
        row(S::ElectingOneShort, Vote(D, Me), E, Unchanged, &[]),
        row(S::ElectingOneShort, Vote(B, Me), OLDER, Unchanged, &[]),
        // Late votes do not carry over into the next round.
        row(S::ElectingOneShort, Timeout, 0, elect(E + 1), &[Act::Vote]),
        // The peer count shrank since the election started: the votes needed then still count.
        row(S::Electing, Vote(B, Me), E, one_more_vote, &[]).with_peers(1),
        // It grew: the larger minimum of now counts.
        row(
            S::ElectingOneShort,
            Vote(B, Me),
            E,
            Electing {
                epoch: E,
                votes: &[Me, B, D],
                needed: 3,
            },
            &[],
        )
        .with_peers(8),
        // Voted(E) for C.
        row(S::Voted, Timeout, 0, elect(E + 1), &[Act::Vote]),
        row(S::Voted, Ping(C), E, follower(E, C), &[Pong(C)]),
        row(S::Voted, Ping(B), E, follower(E, B), &[Pong(B)]),
        row(S::Voted, Event::Pong(B), E, elect(E + 1), &[Act::Vote]),
        row(S::Voted, Vote(B, Me), E, Unchanged, &[]),
        // Leader(E).
        row(S::Leader, Timeout, 0, Leader { epoch: E }, &[PingAll]),
        // Two leaders of one epoch: the partitions joined.
        row(S::Leader, Ping(B), E, elect(E + 1), &[Act::Vote]),
        row(S::Leader, Event::Pong(B), E, Unchanged, &[]),
        row(S::Leader, Vote(C, Me), E, Unchanged, &[]),
        // Follower(E) of B.
        row(S::Follower, Timeout, 0, elect(E + 1), &[Act::Vote]),
        row(S::Follower, Ping(B), E, follower(E, B), &[Pong(B)]),
        row(S::Follower, Ping(C), E, follower(E, C), &[Pong(C)]),
        row(S::Follower, Ping(C), NEWER, follower(NEWER, C), &[Pong(C)]),
        row(S::Follower, Event::Pong(B), E, elect(E + 1), &[Act::Vote]),
        row(S::Follower, Vote(B, Me), E, Unchanged, &[]),
    ]);
    // A message from the node itself is ignored in every state and at every epoch.
    for start in STARTS {
        for epoch in [0, OLDER, E, NEWER] {
            for message in [Ping(Me), Event::Pong(Me), Vote(Me, Me)] {
                rows.push(row(start, message, epoch, Unchanged, &[]));
            }
        }
    }
    rows
}

const STARTS: [Start; 7] = [
    Start::Starting,
    Start::StartingForced,
    Start::Electing,
    Start::ElectingOneShort,
    Start::Voted,
    Start::Leader,
    Start::Follower,
];

/// Runs one row; returns a description of what went wrong, if anything.
fn check(row: &Row) -> Result<(), String> {
    let (mut m, built) = build(row.start);
    let before = m.state().clone();
    let now = match row.event {
        Event::Timeout => m.deadline(),
        Event::Early => m.deadline() - ms(1),
        _ => built + ms(10),
    };
    let actions = match row.event {
        Event::Timeout | Event::Early => m.time_passed(now, row.peers, true),
        Event::Ping(from) => m.message(now, &id(from), row.epoch, Message::Ping, row.peers),
        Event::Pong(from) => m.message(now, &id(from), row.epoch, Message::Pong, row.peers),
        Event::Vote(from, target) => m.message(
            now,
            &id(from),
            row.epoch,
            Message::Vote(id(target)),
            row.peers,
        ),
    };
    let want: Vec<Effect> = row.actions.iter().copied().map(action).collect();
    if actions != want {
        return Err(format!("actions {actions:?}, want {want:?}"));
    }
    let after = m.state();
    let t = Timings::default();
    let in_message_timeout =
        |d: Instant| d >= now + t.message_timeout_min && d < now + t.message_timeout_max;
    let ok = match (row.expect, after) {
        (Expect::Unchanged, state) => *state == before,
        (
            Expect::Electing {
                epoch,
                votes,
                needed,
            },
            State::Electing {
                epoch: e,
                votes: v,
                needed: n,
                deadline,
            },
        ) => {
            // A vote counted in a running round keeps its deadline; a new round lasts one to
            // two heartbeats (randomised, so that candidates do not stay in lockstep).
            let same_round = matches!(before, State::Electing { epoch, .. } if epoch == *e);
            let deadline_ok = if same_round {
                *deadline == before_deadline(&before)
            } else {
                *deadline >= now + t.heartbeat && *deadline < now + t.heartbeat * 2
            };
            *e == epoch
                && *v == votes.iter().copied().map(id).collect::<BTreeSet<_>>()
                && *n == needed
                && deadline_ok
        }
        (
            Expect::Voted { epoch, peer },
            State::Voted {
                epoch: e,
                peer: p,
                deadline,
            },
        ) => *e == epoch && *p == id(peer) && in_message_timeout(*deadline),
        (
            Expect::Leader { epoch },
            State::Leader {
                epoch: e,
                next_ping,
            },
        ) => *e == epoch && *next_ping == now + t.heartbeat,
        (
            Expect::Follower { epoch, leader },
            State::Follower {
                epoch: e,
                leader: l,
                deadline,
            },
        ) => *e == epoch && *l == id(leader) && in_message_timeout(*deadline),
        _ => false,
    };
    if !ok {
        return Err(format!(
            "state {after:?} (was {before:?}), want {:?}",
            row.expect
        ));
    }
    if m.epoch() != epoch_of(after) {
        return Err(format!("epoch() {} disagrees with {after:?}", m.epoch()));
    }
    Ok(())
}

fn before_deadline(state: &State) -> Instant {
    match state {
        State::Starting { deadline }
        | State::PreVoting { deadline, .. }
        | State::Electing { deadline, .. }
        | State::Voted { deadline, .. }
        | State::Follower { deadline, .. } => *deadline,
        State::Leader { next_ping, .. } => *next_ping,
    }
}

fn epoch_of(state: &State) -> u64 {
    match state {
        State::Starting { .. } => 0,
        State::PreVoting { epoch, .. }
        | State::Electing { epoch, .. }
        | State::Voted { epoch, .. }
        | State::Leader { epoch, .. }
        | State::Follower { epoch, .. } => *epoch,
    }
}

#[test]
fn every_cell_of_the_transition_matrix() {
    let rows = matrix();
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|row| {
            check(row).err().map(|why| {
                format!(
                    "{:?} + {:?} at epoch {} (peers {}): {why}",
                    row.start, row.event, row.epoch, row.peers
                )
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

/// The table has a row for every state × event × epoch relation the reference names.
#[test]
fn the_matrix_covers_every_cell() {
    let rows = matrix();
    let relation = |start: Start, epoch: u64| match (start, epoch) {
        (Start::Starting | Start::StartingForced, 0) => "=",
        (Start::Starting | Start::StartingForced, _) => ">",
        (_, e) if e < E => "<",
        (_, E) => "=",
        _ => ">",
    };
    let event = |event: Event| match event {
        Event::Timeout => "timeout",
        Event::Early => "early",
        Event::Ping(_) => "ping",
        Event::Pong(_) => "pong",
        Event::Vote(_, Me) => "vote me",
        Event::Vote(..) => "vote other",
    };
    let mut have = BTreeSet::new();
    for row in &rows {
        let from_me = matches!(
            row.event,
            Event::Ping(Me) | Event::Pong(Me) | Event::Vote(Me, _)
        );
        if !from_me {
            have.insert((
                format!("{:?}", row.start),
                event(row.event),
                relation(row.start, row.epoch),
            ));
        }
    }
    let mut missing = Vec::new();
    for start in [
        Start::Starting,
        Start::Electing,
        Start::Voted,
        Start::Leader,
        Start::Follower,
    ] {
        let epochs: &[u64] = if start == Start::Starting {
            &[0, NEWER]
        } else {
            &[OLDER, E, NEWER]
        };
        for name in ["timeout", "early"] {
            if !have.contains(&(format!("{start:?}"), name, relation(start, 0))) {
                missing.push(format!("{start:?} {name}"));
            }
        }
        for name in ["ping", "pong", "vote me", "vote other"] {
            for &epoch in epochs {
                let cell = (format!("{start:?}"), name, relation(start, epoch));
                if !have.contains(&cell) {
                    missing.push(format!("{cell:?}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "cells without a row: {missing:?}");
}

#[test]
fn minimum_votes_for_one_to_ten_nodes() {
    let want = [1, 2, 2, 3, 3, 4, 4, 5, 5, 6];
    for (n, want) in (1..=10).zip(want) {
        assert_eq!(minimum_votes(n - 1), want, "{n} nodes");
    }
}

/// Stale peer info sends every state back to `Starting` once its deadline passes (and not
/// before); the next start is a fresh one, at epoch 0 with a new start timeout.
#[test]
fn stale_peer_info_demotes_every_state_to_starting() {
    let t = Timings::default();
    for start in STARTS {
        let (mut m, _) = build(start);
        let before = m.state().clone();
        let deadline = m.deadline();
        assert!(
            m.time_passed(deadline - ms(1), PEERS, false).is_empty(),
            "{start:?}"
        );
        assert_eq!(*m.state(), before, "{start:?}: stale before the deadline");
        assert!(
            m.time_passed(deadline, PEERS, false).is_empty(),
            "{start:?}"
        );
        let State::Starting { deadline: next } = *m.state() else {
            panic!("{start:?}: stale peers left {:?}", m.state());
        };
        assert_eq!(m.epoch(), 0, "{start:?}");
        assert!(m.stable_since().is_none(), "{start:?}");
        let earliest = deadline + t.start_timeout + t.message_timeout_min;
        let latest = deadline + t.start_timeout + t.message_timeout_max;
        assert!(
            next >= earliest && next < latest,
            "{start:?}: new start deadline {:?} after the old one",
            next - deadline
        );
        // Fresh info again: the node starts over at epoch 1.
        let actions = m.time_passed(next, PEERS, true);
        let restarted = if start == Start::StartingForced {
            actions == [Effect::PingAll] && matches!(m.state(), State::Leader { epoch: 1, .. })
        } else {
            actions == [Effect::Vote] && matches!(m.state(), State::Electing { epoch: 1, .. })
        };
        assert!(restarted, "{start:?}: {actions:?}, {:?}", m.state());
    }
}

/// Stale peer info is only looked at when a deadline passes: messages still move the machine.
#[test]
fn stale_peer_info_does_not_stop_messages() {
    let (mut m, now) = build(Start::Starting);
    assert!(m.time_passed(now + ms(1), PEERS, false).is_empty());
    assert_eq!(
        m.message(now + ms(2), &id(B), 1, Message::Ping, PEERS),
        vec![Effect::Pong(id(B))]
    );
    assert!(matches!(m.state(), State::Follower { epoch: 1, .. }));
}

/// A message of an epoch above [`MAX_EPOCH`] (garbage or an attack: `epoch + 1` would wrap) is
/// ignored in every state, whatever it says.
#[test]
fn an_epoch_beyond_the_limit_changes_nothing_in_any_state() {
    for start in STARTS {
        for epoch in [MAX_EPOCH + 1, u64::MAX] {
            for message in [
                Message::Ping,
                Message::Pong,
                Message::Vote(id(C)),
                Message::Vote(id(Me)),
            ] {
                let (mut m, now) = build(start);
                let before = m.state().clone();
                let actions = m.message(now + ms(10), &id(C), epoch, message.clone(), PEERS);
                assert!(
                    actions.is_empty(),
                    "{start:?} + {message:?} at {epoch}: {actions:?}"
                );
                assert_eq!(*m.state(), before, "{start:?} + {message:?} at {epoch}");
            }
        }
    }
}

/// The leader row of the timeout column, continued: a leader whose pongs stop (it was cut off
/// into a minority) leads on through the shortest leader timeout, then steps down at its next
/// heartbeat into an election of the next epoch; pongs of its epoch from a majority keep it.
#[test]
fn a_leader_steps_down_at_the_first_heartbeat_past_a_leader_timeout_without_a_majority() {
    let t = Timings::default();
    for answering in [&[][..], &[B][..], &[B, C][..]] {
        let (mut m, elected) = build(Start::Leader);
        let mut stepped = None;
        while stepped.is_none() {
            let now = m.deadline();
            if now > elected + t.message_timeout_min * 4 {
                break;
            }
            let actions = m.time_passed(now, PEERS, true);
            match m.state() {
                State::Leader { epoch: E, .. } => {
                    assert_eq!(actions, vec![Effect::PingAll]);
                    for node in answering {
                        m.message(now + ms(1), &id(*node), E, Message::Pong, PEERS);
                    }
                }
                State::Electing { epoch, .. } if *epoch == E + 1 => {
                    assert_eq!(actions, vec![Effect::Vote]);
                    stepped = Some(now - elected);
                }
                other => panic!("{answering:?}: {other:?}"),
            }
        }
        if answering.len() + 1 >= minimum_votes(PEERS) {
            assert_eq!(stepped, None, "{answering:?}: stepped down with a majority");
        } else {
            let after = stepped.unwrap_or_else(|| panic!("{answering:?}: kept leading"));
            assert!(
                after >= t.message_timeout_min && after < t.message_timeout_min + t.heartbeat,
                "{answering:?}: stepped down {after:?} after its election"
            );
        }
    }
}
