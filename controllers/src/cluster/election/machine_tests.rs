//! verwalter 0.13's nine election unit tests (reference §4.7), on this machine.

use super::*;

const ME: &str = "e0beef0000000000000000000000000a";
const PEER: &str = "e0beef0000000000000000000000000b";

/// 0.13's rules: a timeout starts the election at the next epoch, without a pre-vote.
fn machine(now: Instant) -> Machine {
    Machine::new(ME.into(), now, Timings::v0_13(), 1).pre_vote(false)
}

/// A new machine and the time it was made.
fn fresh() -> (Machine, Instant) {
    let t0 = Instant::now();
    (machine(t0), t0)
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
    let (mut m, t0) = fresh();
    assert!(m.time_passed(t0 + ms(100), 0, true).is_empty());
    assert!(matches!(m.state(), State::Starting { .. }));
    assert_eq!(
        m.time_passed(t0 + ms(10_000), 0, true),
        vec![Effect::PingAll]
    );
    assert!(matches!(m.state(), State::Leader { epoch: 1, .. }));
}

#[test]
fn test_start_vote() {
    let (mut m, t0) = fresh();
    assert_eq!(m.time_passed(t0 + ms(10_000), 1, true), vec![Effect::Vote]);
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
    let (mut m, t0) = fresh();
    m.time_passed(t0 + ms(10_000), 1, true);
    let actions = m.message(
        t0 + ms(10_010),
        &PEER.into(),
        1,
        Message::Vote(ME.into()),
        1,
    );
    assert_eq!(actions, vec![Effect::PingAll]);
    assert!(matches!(m.state(), State::Leader { epoch: 1, .. }));
}

#[test]
fn test_election_expired() {
    let (mut m, t0) = fresh();
    m.time_passed(t0 + ms(10_000), 1, true);
    assert_eq!(m.time_passed(t0 + ms(13_000), 1, true), vec![Effect::Vote]);
    assert!(matches!(m.state(), State::Electing { epoch: 2, .. }));
}

#[test]
fn test_voted_timeout() {
    let (mut m, t0) = fresh();
    let actions = m.message(t0 + ms(100), &PEER.into(), 1, Message::Vote(PEER.into()), 1);
    assert_eq!(actions, vec![Effect::ConfirmVote(PEER.into())]);
    assert!(matches!(m.state(), State::Voted { epoch: 1, .. }));
    assert_eq!(m.time_passed(t0 + ms(4_100), 1, true), vec![Effect::Vote]);
    assert!(matches!(m.state(), State::Electing { epoch: 2, .. }));
}

#[test]
fn test_leader_timeout() {
    let (mut m, t0) = fresh();
    m.time_passed(t0 + ms(10_000), 0, true);
    assert_eq!(
        m.time_passed(t0 + ms(13_000), 0, true),
        vec![Effect::PingAll]
    );
    assert!(matches!(m.state(), State::Leader { epoch: 1, .. }));
}

#[test]
fn test_follower_timeout() {
    let (mut m, t0) = fresh();
    let actions = m.message(t0 + ms(100), &PEER.into(), 1, Message::Ping, 1);
    assert_eq!(actions, vec![Effect::Pong(PEER.into())]);
    assert!(matches!(m.state(), State::Follower { epoch: 1, .. }));
    assert_eq!(m.time_passed(t0 + ms(4_100), 1, true), vec![Effect::Vote]);
    assert!(matches!(m.state(), State::Electing { epoch: 2, .. }));
}

#[test]
fn test_voted_ping() {
    let (mut m, t0) = fresh();
    m.message(t0 + ms(100), &PEER.into(), 1, Message::Vote(PEER.into()), 1);
    let actions = m.message(t0 + ms(200), &PEER.into(), 1, Message::Ping, 1);
    assert_eq!(actions, vec![Effect::Pong(PEER.into())]);
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
    let (mut m, t0) = fresh();
    m.time_passed(t0 + ms(10_000), 0, true);
    assert!(m.time_passed(t0 + ms(10_600), 0, false).is_empty());
    assert!(matches!(m.state(), State::Starting { .. }));
}

// Rules added after 0.13 (issue 10): checked epochs and a leader that steps down without a
// majority.

const C: &str = "e0beef0000000000000000000000000c";
const D: &str = "e0beef0000000000000000000000000d";
const E: &str = "e0beef0000000000000000000000000e";

/// A leader of epoch 1 in a five-node cluster, elected by PEER and C at `t0 + 1 s`, with the
/// daemon's timings (leader timeout 750–1250 ms, heartbeat 250 ms).
fn leader_of_five(t0: Instant, keep: bool) -> Machine {
    let mut m =
        Machine::new(ME.into(), t0, Timings::default(), 1).keep_leading_without_majority(keep);
    m.time_passed(t0 + ms(10_000), 4, true);
    for peer in [PEER, C] {
        m.message(
            t0 + ms(10_001),
            &peer.into(),
            1,
            Message::Vote(ME.into()),
            4,
        );
    }
    assert!(matches!(m.state(), State::Leader { epoch: 1, .. }));
    m
}

/// Heartbeats from `from` to `to` (ms after t0), with pongs from `answering` after each.
fn lead(m: &mut Machine, t0: Instant, from: u64, to: u64, answering: &[&str]) {
    let mut at = from;
    while at <= to {
        let now = t0 + ms(at);
        if now >= m.deadline() {
            m.time_passed(now, 4, true);
        }
        if matches!(m.state(), State::Leader { .. }) {
            for peer in answering {
                m.message(now, &(*peer).into(), 1, Message::Pong, 4);
            }
        }
        at += 50;
    }
}

#[test]
fn a_leader_that_hears_a_majority_keeps_leading() {
    let t0 = Instant::now();
    let mut m = leader_of_five(t0, false);
    // Two of four answer: with the leader, three of five.
    lead(&mut m, t0, 10_001, 20_000, &[PEER, D]);
    assert!(
        matches!(m.state(), State::Leader { epoch: 1, .. }),
        "{:?}",
        m.state()
    );
}

#[test]
fn a_leader_cut_off_into_a_minority_steps_down_within_a_leader_timeout() {
    let t0 = Instant::now();
    let mut m = leader_of_five(t0, false);
    lead(&mut m, t0, 10_001, 12_000, &[PEER, C]);
    // Split at 12 s: only PEER still answers (two of five).
    lead(&mut m, t0, 12_001, 12_700, &[PEER]);
    assert!(
        matches!(m.state(), State::Leader { .. }),
        "not before the leader timeout"
    );
    let mut stepped_down = None;
    for at in (12_701..=13_100).step_by(10) {
        let now = t0 + ms(at);
        if now >= m.deadline() {
            let actions = m.time_passed(now, 4, true);
            if !matches!(m.state(), State::Leader { .. }) {
                assert_eq!(actions, vec![Effect::PreVote { epoch: 2 }]);
                stepped_down = Some(at);
                break;
            }
        }
        m.message(now, &PEER.into(), 1, Message::Pong, 4);
    }
    let at = stepped_down.expect("still leading a second after losing the majority");
    // Within the leader timeout (750 ms) and a heartbeat of the last pong from C (at ~12 s).
    assert!(at <= 12_000 + 750 + 250, "stepped down at {at} ms");
    // It is an ordinary leaderless node now: no leader, asking whether it could win at the next
    // epoch (a pre-vote), still at its own.
    assert!(
        matches!(m.state(), State::PreVoting { epoch: 1, .. }),
        "{:?}",
        m.state()
    );
    assert_eq!(m.stable_since(), None);
}

#[test]
fn a_new_leader_gets_a_leader_timeout_before_its_first_pongs_count() {
    let t0 = Instant::now();
    let mut m = leader_of_five(t0, false);
    // Nobody answers: it leads for a leader timeout counting its voters as heard, then steps down.
    lead(&mut m, t0, 10_001, 10_700, &[]);
    assert!(matches!(m.state(), State::Leader { .. }));
    lead(&mut m, t0, 10_701, 11_100, &[]);
    assert!(
        !matches!(m.state(), State::Leader { .. }),
        "{:?}",
        m.state()
    );
}

#[test]
fn in_minority_mode_and_when_forced_a_leader_keeps_leading_alone() {
    let t0 = Instant::now();
    let mut m = leader_of_five(t0, true);
    lead(&mut m, t0, 10_001, 20_000, &[]);
    assert!(matches!(m.state(), State::Leader { epoch: 1, .. }));

    let mut forced = Machine::new(ME.into(), t0, Timings::default(), 1).force_leader(true);
    forced.time_passed(t0 + ms(10_000), 4, true);
    assert!(matches!(forced.state(), State::Leader { epoch: 1, .. }));
    lead(&mut forced, t0, 10_001, 20_000, &[]);
    assert!(matches!(forced.state(), State::Leader { epoch: 1, .. }));
}

#[test]
fn pongs_of_another_epoch_do_not_count_for_the_majority() {
    let t0 = Instant::now();
    let mut m = leader_of_five(t0, false);
    let mut at = 10_001;
    while matches!(m.state(), State::Leader { .. }) && at < 12_000 {
        let now = t0 + ms(at);
        if now >= m.deadline() {
            m.time_passed(now, 4, true);
        }
        // Older epoch: ignored (a newer one would start an election anyway).
        for peer in [PEER, C, D, E] {
            m.message(now, &peer.into(), 0, Message::Pong, 4);
        }
        at += 50;
    }
    assert!(!matches!(m.state(), State::Leader { .. }));
}

#[test]
fn an_epoch_beyond_the_limit_is_ignored_and_epochs_never_wrap() {
    let t0 = Instant::now();
    for message in [Message::Ping, Message::Pong, Message::Vote(PEER.into())] {
        let mut m = leader_of_five(t0, false);
        let before = m.state().clone();
        for epoch in [u64::MAX, MAX_EPOCH + 1] {
            let actions = m.message(t0 + ms(10_002), &D.into(), epoch, message.clone(), 4);
            assert!(actions.is_empty(), "{message:?} at {epoch}: {actions:?}");
            assert_eq!(*m.state(), before, "{message:?} at {epoch}");
        }
    }
    // The highest accepted epoch is followed; the next election stays at it instead of wrapping.
    let mut m = leader_of_five(t0, false);
    assert_eq!(
        m.message(t0 + ms(10_002), &D.into(), MAX_EPOCH, Message::Ping, 4),
        vec![Effect::Pong(D.into())]
    );
    assert_eq!(m.epoch(), MAX_EPOCH);
    let deadline = m.deadline();
    assert_eq!(m.time_passed(deadline, 4, true), vec![Effect::Vote]);
    assert_eq!(m.epoch(), MAX_EPOCH);
    // A pong of the limit to a non-leader starts an election at the limit, not at 0.
    let mut m = leader_of_five(t0, false);
    m.message(t0 + ms(10_002), &D.into(), MAX_EPOCH, Message::Pong, 4);
    assert_eq!(m.epoch(), MAX_EPOCH);
}

// Pre-votes (issue 28): a node asks before it raises its epoch.

/// A follower of PEER at epoch 3 in a five-node cluster (daemon timings), pinged at `t0`.
fn follower_of_five(t0: Instant) -> Machine {
    let mut m = Machine::new(ME.into(), t0, Timings::default(), 1);
    assert_eq!(
        m.message(t0, &PEER.into(), 3, Message::Ping, 4),
        vec![Effect::Pong(PEER.into())]
    );
    m
}

#[test]
fn a_timeout_asks_first_and_a_round_without_enough_yeses_keeps_the_epoch() {
    let t0 = Instant::now();
    let mut m = follower_of_five(t0);
    let mut now = m.deadline();
    assert_eq!(
        m.time_passed(now, 4, true),
        vec![Effect::PreVote { epoch: 4 }]
    );
    assert!(
        matches!(m.state(), State::PreVoting { epoch: 3, .. }),
        "{:?}",
        m.state()
    );
    assert_eq!(m.epoch(), 3);
    assert_eq!(m.stable_since(), None);
    // One yes of the two more it needs: the round ends, another starts, the epoch stays (a
    // hundred rounds of a cut-off node).
    m.message(now, &C.into(), 4, Message::PreVote(ME.into()), 4);
    for _ in 0..100 {
        now = m.deadline();
        assert_eq!(
            m.time_passed(now, 4, true),
            vec![Effect::PreVote { epoch: 4 }]
        );
        assert_eq!(m.epoch(), 3);
    }
    // Yeses that are not answers to this round's question change nothing: for another
    // candidate, or for another epoch.
    for (candidate, epoch) in [(C, 4), (ME, 5), (ME, 3)] {
        let before = m.state().clone();
        assert!(
            m.message(now, &D.into(), epoch, Message::PreVote(candidate.into()), 4)
                .is_empty()
        );
        assert_eq!(*m.state(), before);
    }
    // Two yeses: the real election at the next epoch.
    assert!(
        m.message(now, &C.into(), 4, Message::PreVote(ME.into()), 4)
            .is_empty()
    );
    assert_eq!(
        m.message(now, &D.into(), 4, Message::PreVote(ME.into()), 4),
        vec![Effect::Vote]
    );
    assert!(matches!(m.state(), State::Electing { epoch: 4, .. }));
    // Its real votes elect it.
    m.message(now, &C.into(), 4, Message::Vote(ME.into()), 4);
    assert_eq!(
        m.message(now, &D.into(), 4, Message::Vote(ME.into()), 4),
        vec![Effect::PingAll]
    );
    assert!(matches!(m.state(), State::Leader { epoch: 4, .. }));
}

#[test]
fn a_node_with_a_live_leader_says_no_and_nobody_changes_state_by_answering() {
    let t0 = Instant::now();
    let mut m = follower_of_five(t0);
    let ask = |m: &mut Machine, at: u64, epoch: u64| {
        m.message(t0 + ms(at), &C.into(), epoch, Message::PreVote(C.into()), 4)
    };
    // Pinged 100 ms ago: no (a real vote at that epoch would depose its leader).
    assert!(ask(&mut m, 100, 4).is_empty());
    assert!(matches!(m.state(), State::Follower { epoch: 3, .. }));
    // Pinged again at 700 ms; at 1500 ms that ping is older than the shortest leader timeout
    // (750 ms): yes, and it still follows its leader at its epoch. Not for its own epoch.
    assert_eq!(
        m.message(t0 + ms(700), &PEER.into(), 3, Message::Ping, 4),
        vec![Effect::Pong(PEER.into())]
    );
    assert!(ask(&mut m, 1449, 4).is_empty());
    assert!(ask(&mut m, 1500, 3).is_empty());
    let before = m.state().clone();
    assert_eq!(
        ask(&mut m, 1500, 4),
        vec![Effect::GrantPreVote {
            candidate: C.into(),
            epoch: 4
        }]
    );
    assert_eq!(*m.state(), before);

    // A starting node says yes (a new cluster), and a leader no.
    let mut starting = Machine::new(ME.into(), t0, Timings::default(), 1);
    assert_eq!(
        starting.message(t0, &C.into(), 1, Message::PreVote(C.into()), 4),
        vec![Effect::GrantPreVote {
            candidate: C.into(),
            epoch: 1
        }]
    );
    assert!(matches!(starting.state(), State::Starting { .. }));
    let mut leader = leader_of_five(t0, false);
    assert!(
        leader
            .message(t0 + ms(10_002), &C.into(), 2, Message::PreVote(C.into()), 4)
            .is_empty()
    );
    assert!(matches!(leader.state(), State::Leader { epoch: 1, .. }));
}

#[test]
fn a_pre_voting_node_follows_the_leader_of_its_epoch_when_it_hears_it_again() {
    let t0 = Instant::now();
    let mut m = follower_of_five(t0);
    let now = m.deadline();
    m.time_passed(now, 4, true);
    assert!(matches!(m.state(), State::PreVoting { epoch: 3, .. }));
    // The heal: the leader's ping at the epoch the node kept.
    assert_eq!(
        m.message(now + ms(10), &PEER.into(), 3, Message::Ping, 4),
        vec![Effect::Pong(PEER.into())]
    );
    assert!(matches!(m.state(), State::Follower { epoch: 3, .. }));
}

#[test]
fn a_0_13_node_that_votes_for_a_pre_vote_counts_as_a_yes_and_a_vote() {
    let t0 = Instant::now();
    let mut m = follower_of_five(t0);
    let now = m.deadline();
    m.time_passed(now, 4, true);
    // 0.13 nodes C and D take the pre-vote for a vote and vote at epoch 4: that is a majority
    // with this node, so it leads at once.
    assert!(
        m.message(now, &C.into(), 4, Message::Vote(ME.into()), 4)
            .is_empty()
    );
    assert_eq!(
        m.message(now, &D.into(), 4, Message::Vote(ME.into()), 4),
        vec![Effect::PingAll]
    );
    assert!(matches!(m.state(), State::Leader { epoch: 4, .. }));
}

#[test]
fn a_leader_behind_a_pre_voting_node_elects_anew_at_its_epoch() {
    let t0 = Instant::now();
    let mut m = leader_of_five(t0, false);
    // C asks at 3: it is at 2, ahead of this leader of 1, and ignores its pings.
    assert_eq!(
        m.message(t0 + ms(10_002), &C.into(), 3, Message::PreVote(C.into()), 4),
        vec![Effect::Vote]
    );
    assert!(matches!(m.state(), State::Electing { epoch: 3, .. }));
}

#[test]
fn without_pre_votes_a_timeout_elects_at_the_next_epoch_as_0_13_did() {
    let t0 = Instant::now();
    let mut m = follower_of_five(t0).pre_vote(false);
    let now = m.deadline();
    assert_eq!(m.time_passed(now, 4, true), vec![Effect::Vote]);
    assert!(matches!(m.state(), State::Electing { epoch: 4, .. }));
}
