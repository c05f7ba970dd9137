//! verwalter 0.13's nine election unit tests (reference §4.7), on this machine.

use super::*;

const ME: &str = "e0beef0000000000000000000000000a";
const PEER: &str = "e0beef0000000000000000000000000b";

fn machine(now: Instant) -> Machine {
    Machine::new(ME.into(), now, Timings::v0_13(), 1)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn test_starting() {
    let m = machine(Instant::now());
    assert!(matches!(m.state(), State::Starting { .. }));
    assert_eq!(m.epoch(), 0);
}

#[test]
fn test_alone() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    assert!(m.time_passed(t0 + ms(100), 0, true).is_empty());
    assert!(matches!(m.state(), State::Starting { .. }));
    assert_eq!(
        m.time_passed(t0 + ms(10_000), 0, true),
        vec![Action::PingAll]
    );
    assert!(matches!(m.state(), State::Leader { epoch: 1, .. }));
}

#[test]
fn test_start_vote() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    assert_eq!(m.time_passed(t0 + ms(10_000), 1, true), vec![Action::Vote]);
    assert!(matches!(
        m.state(),
        State::Electing {
            epoch: 1,
            needed: 2,
            ..
        }
    ));
}

#[test]
fn test_vote_approved() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    m.time_passed(t0 + ms(10_000), 1, true);
    let actions = m.message(
        t0 + ms(10_010),
        &PEER.into(),
        1,
        Message::Vote(ME.into()),
        1,
    );
    assert_eq!(actions, vec![Action::PingAll]);
    assert!(matches!(m.state(), State::Leader { epoch: 1, .. }));
}

#[test]
fn test_election_expired() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    m.time_passed(t0 + ms(10_000), 1, true);
    assert_eq!(m.time_passed(t0 + ms(13_000), 1, true), vec![Action::Vote]);
    assert!(matches!(m.state(), State::Electing { epoch: 2, .. }));
}

#[test]
fn test_voted_timeout() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    let actions = m.message(t0 + ms(100), &PEER.into(), 1, Message::Vote(PEER.into()), 1);
    assert_eq!(actions, vec![Action::ConfirmVote(PEER.into())]);
    assert!(matches!(m.state(), State::Voted { epoch: 1, .. }));
    assert_eq!(m.time_passed(t0 + ms(4_100), 1, true), vec![Action::Vote]);
    assert!(matches!(m.state(), State::Electing { epoch: 2, .. }));
}

#[test]
fn test_leader_timeout() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    m.time_passed(t0 + ms(10_000), 0, true);
    assert_eq!(
        m.time_passed(t0 + ms(13_000), 0, true),
        vec![Action::PingAll]
    );
    assert!(matches!(m.state(), State::Leader { epoch: 1, .. }));
}

#[test]
fn test_follower_timeout() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    let actions = m.message(t0 + ms(100), &PEER.into(), 1, Message::Ping, 1);
    assert_eq!(actions, vec![Action::Pong(PEER.into())]);
    assert!(matches!(m.state(), State::Follower { epoch: 1, .. }));
    assert_eq!(m.time_passed(t0 + ms(4_100), 1, true), vec![Action::Vote]);
    assert!(matches!(m.state(), State::Electing { epoch: 2, .. }));
}

#[test]
fn test_voted_ping() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    m.message(t0 + ms(100), &PEER.into(), 1, Message::Vote(PEER.into()), 1);
    let actions = m.message(t0 + ms(200), &PEER.into(), 1, Message::Ping, 1);
    assert_eq!(actions, vec![Action::Pong(PEER.into())]);
    assert!(matches!(m.state(), State::Follower { epoch: 1, .. }));
}

#[test]
fn minimum_votes_rule() {
    assert_eq!(
        (0..7).map(minimum_votes).collect::<Vec<_>>(),
        vec![1, 2, 2, 3, 3, 4, 4]
    );
}

#[test]
fn stale_hosts_demote_to_starting() {
    let t0 = Instant::now();
    let mut m = machine(t0);
    m.time_passed(t0 + ms(10_000), 0, true);
    assert!(m.time_passed(t0 + ms(10_600), 0, false).is_empty());
    assert!(matches!(m.state(), State::Starting { .. }));
}
