//! Every replication decision, with a fake clock: the machine is fed a world the test edits and
//! the results of the fetches it asked for; its actions are carried out on that world the way
//! `src/cluster/replication.rs` carries them out on the store.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::*;
use crate::testing::ReplicaWorld;

const ME: &str = "77985419c732412ea38b94db00000001";
const A: &str = "77985419c732412ea38b94db00000002";
const B: &str = "77985419c732412ea38b94db00000003";
const C: &str = "77985419c732412ea38b94db00000004";

const WINDOW: Duration = Duration::from_secs(2);
const RECENT: Duration = Duration::from_millis(500);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A schedule made by `origin`, distinct per `n`.
fn made_by(origin: &str, n: u64) -> Schedule {
    Schedule::new(json!({"made_by": origin, "n": n}), 1_000 + n, origin.into())
}

/// One node: the machine, the election state and clock it sees, and what it holds and hears.
struct Node {
    machine: Replication,
    /// The fake clock: monotonic and wall time move together.
    now: Instant,
    now_ms: u64,
    election: ElectionState,
    replica: ReplicaWorld,
    /// Every action so far.
    log: Vec<Effect>,
}

impl Node {
    fn new() -> Node {
        Node {
            machine: Replication::new(ReplicationConfig {
                id: ME.into(),
                window: WINDOW,
                recent: RECENT,
                relay_fanout: crate::defaults::RELAY_FANOUT,
            }),
            now: Instant::now(),
            now_ms: 1_700_000_000_000,
            election: ElectionState::default(),
            replica: ReplicaWorld::default(),
            log: Vec::new(),
        }
    }

    fn holding(mut self, held: &Schedule) -> Node {
        self.replica.held = Some(held.clone());
        self
    }

    fn following(leader: &str, epoch: u64) -> Node {
        let mut node = Node::new();
        node.follow(leader, epoch);
        node
    }

    /// A stable election of `leader` at `epoch` (this node leads if it is `ME`).
    fn follow(&mut self, leader: &str, epoch: u64) {
        self.election = ElectionState {
            is_leader: leader == ME,
            is_stable: true,
            leader: Some(leader.into()),
            epoch,
            ..ElectionState::default()
        };
    }

    fn lead(&mut self, epoch: u64) {
        self.follow(ME, epoch);
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.now_ms += by.as_millis() as u64;
    }

    /// An election packet from `peer` in `epoch` holding `held` arrives now.
    fn packet(&mut self, peer: &str, epoch: u64, held: Option<&Schedule>) {
        let stamp = held.map(Schedule::stamp);
        self.replica
            .note_packet(ME, &peer.into(), epoch, stamp, self.now_ms);
    }

    fn apply(&mut self, actions: &[Effect]) {
        actions.iter().for_each(|action| self.replica.keep(action));
        self.log.extend_from_slice(actions);
    }

    /// The machine looks at the world (and its actions are carried out).
    fn step(&mut self) -> Vec<Effect> {
        let world = self.replica.view(&self.election, self.now_ms);
        let actions = self.machine.step(self.now, &world);
        self.apply(&actions);
        actions
    }

    /// The fetch in flight ends with `result`; then the machine looks again, as the adapter
    /// does. Returns every action of both.
    fn answer(&mut self, result: Result<Schedule, String>) -> Vec<Effect> {
        let fetch = self.in_flight();
        self.answer_to(fetch, result)
    }

    fn answer_to(&mut self, fetch: Fetch, result: Result<Schedule, String>) -> Vec<Effect> {
        let world = self.replica.view(&self.election, self.now_ms);
        let mut actions = self.machine.fetched(self.now, &world, fetch, result);
        self.apply(&actions);
        actions.extend(self.step());
        actions
    }

    /// Answers every fetch from `served` (by hash) until none is in flight; a hash not there
    /// fails. Returns the fetches in the order asked.
    fn serve_all(&mut self, served: &[&Schedule]) -> Vec<Fetch> {
        let mut asked = Vec::new();
        while let Some(fetch) = self.machine.in_flight().cloned() {
            let result = served
                .iter()
                .find(|s| s.hash == fetch.stamp.hash)
                .map(|s| (*s).clone())
                .ok_or_else(|| "connection refused".to_string());
            asked.push(fetch.clone());
            self.answer_to(fetch, result);
        }
        asked
    }

    fn in_flight(&self) -> Fetch {
        self.machine
            .in_flight()
            .cloned()
            .expect("a fetch in flight")
    }

    /// How long after now the first action, a failure, has the fetch tried again.
    fn retry_wait(&self, actions: &[Effect]) -> Option<Duration> {
        match actions.first() {
            Some(Effect::Failed { retry_at, .. }) => retry_at.map(|at| at - self.now),
            _ => None,
        }
    }

    /// The parents published are `expected` (in any order).
    #[track_caller]
    fn assert_parents(&self, expected: &[&Schedule]) {
        assert_eq!(hashes(&self.replica.prefetched.schedules), sorted(expected));
    }

    fn wake_at(&self) -> Option<Instant> {
        self.machine.wake_at(self.now)
    }

    /// Runs the clock to the machine's next wake-up and steps there.
    fn wake(&mut self) -> Vec<Effect> {
        let at = self.wake_at().expect("a wake-up is due");
        self.advance(at - self.now);
        self.step()
    }
}

fn fetches(actions: &[Effect]) -> Vec<&Fetch> {
    actions
        .iter()
        .filter_map(|a| match a {
            Effect::Fetch(f) => Some(f),
            _ => None,
        })
        .collect()
}

fn hashes(schedules: &[Schedule]) -> Vec<&str> {
    let mut hashes: Vec<&str> = schedules.iter().map(|s| s.hash.as_str()).collect();
    hashes.sort();
    hashes
}

fn sorted<'a>(schedules: &[&'a Schedule]) -> Vec<&'a str> {
    let mut hashes: Vec<&str> = schedules.iter().map(|s| s.hash.as_str()).collect();
    hashes.sort();
    hashes
}

// --- A follower ---

/// A follower of A (epoch 3) fetching `theirs`, which A's packet just announced.
fn fetching_from_a(theirs: &Schedule) -> Node {
    let mut node = Node::following(A, 3);
    node.packet(A, 3, Some(theirs));
    node.step();
    node
}

#[test]
fn a_follower_fetches_the_leaders_schedule_when_its_stamp_changes() {
    let mut node = Node::following(A, 3);
    let first = made_by(A, 1);
    node.packet(A, 3, Some(&first));
    let asked = node.step();
    assert_eq!(
        asked,
        vec![Effect::Fetch(Fetch {
            peer: A.into(),
            stamp: first.stamp(),
            purpose: Purpose::Follow { leader: A.into() },
        })]
    );
    node.answer(Ok(first.clone()));
    assert_eq!(node.replica.held.as_ref(), Some(&first), "put in force");

    // The leader's next schedule: fetched as soon as its ping says so.
    let second = made_by(A, 2);
    node.packet(A, 3, Some(&second));
    let asked = node.step();
    assert_eq!(fetches(&asked)[0].stamp, second.stamp());
    node.answer(Ok(second.clone()));
    assert_eq!(node.replica.held.as_ref(), Some(&second));
    assert!(
        node.replica.replaced.is_empty(),
        "the same leader's schedules are not kept"
    );
}

#[test]
fn a_follower_does_not_fetch_the_schedule_it_holds() {
    let held = made_by(A, 1);
    let mut node = Node::following(A, 3).holding(&held);
    node.packet(A, 3, Some(&held));
    assert_eq!(node.step(), vec![]);
    // Nor while a fetch is in flight, however often it looks.
    let newer = made_by(A, 2);
    node.packet(A, 3, Some(&newer));
    assert_eq!(fetches(&node.step()).len(), 1);
    assert_eq!(node.step(), vec![]);
    node.answer(Ok(newer.clone()));
    assert_eq!(node.step(), vec![], "taken: nothing more to fetch");
    assert_eq!(node.wake_at(), None, "nothing to wake up for");
}

/// Issue 28: a leader restamps its unchanged schedule at each new leadership (and for a lagging
/// 0.13 follower): a follower of this version holding that hash fetches nothing, in the same
/// epoch or a new one.
#[test]
fn a_restamped_schedule_of_the_same_hash_is_not_fetched_again() {
    let held = made_by(A, 1);
    let mut node = Node::following(A, 3).holding(&held);
    let restamped = Schedule {
        timestamp: held.timestamp + 60_000,
        ..held.clone()
    };
    node.packet(A, 3, Some(&restamped));
    assert_eq!(node.step(), vec![]);
    node.follow(A, 4);
    node.packet(A, 4, Some(&restamped));
    assert_eq!(node.step(), vec![]);
    assert_eq!(node.replica.held.as_ref(), Some(&held), "kept as it was");
}

#[test]
fn a_follower_without_a_stable_leader_fetches_nothing() {
    let mut node = Node::following(A, 3);
    node.election.is_stable = false;
    node.packet(A, 3, Some(&made_by(A, 1)));
    assert_eq!(node.step(), vec![]);
}

#[test]
fn a_follower_backs_off_after_failures_and_resets_on_success() {
    let theirs = made_by(A, 1);
    let mut node = fetching_from_a(&theirs);
    let mut waits = Vec::new();
    for _ in 0..8 {
        let actions = node.answer(Err("connection refused".into()));
        let Some(Effect::Failed {
            retry_at: Some(at), ..
        }) = actions.first()
        else {
            panic!("not a failure with a retry: {actions:?}");
        };
        waits.push(*at - node.now);
        assert!(fetches(&actions).is_empty(), "no retry before the wait");
        // A change in the world does not cut the wait short.
        node.packet(A, 3, Some(&theirs));
        assert!(fetches(&node.step()).is_empty());
        node.advance(*at - node.now - ms(1));
        assert!(fetches(&node.step()).is_empty(), "1 ms early");
        assert_eq!(fetches(&node.wake()).len(), 1, "tried again when due");
    }
    assert_eq!(
        waits,
        [100, 200, 400, 800, 1600, 3200, 5000, 5000].map(ms),
        "100 ms doubling, at most 5 s"
    );
    node.answer(Ok(theirs.clone()));
    assert_eq!(node.replica.held.as_ref(), Some(&theirs));
    // Reset: the next failure waits the shortest time again.
    node.packet(A, 3, Some(&made_by(A, 2)));
    node.step();
    let actions = node.answer(Err("timeout".into()));
    assert_eq!(node.retry_wait(&actions), Some(ms(100)), "{actions:?}");
}

#[test]
fn leading_resets_a_followers_backoff() {
    let mut node = fetching_from_a(&made_by(A, 1));
    for _ in 0..5 {
        node.answer(Err("refused".into()));
        node.wake();
    }
    node.lead(4);
    node.step();
    // Following again later: the first failure waits the shortest time.
    node.follow(B, 5);
    node.packet(B, 5, Some(&made_by(B, 1)));
    let asked = node.step();
    assert_eq!(
        fetches(&asked).len(),
        1,
        "no wait left from before: {asked:?}"
    );
    let actions = node.answer(Err("refused".into()));
    assert_eq!(node.retry_wait(&actions), Some(ms(100)), "{actions:?}");
}

#[test]
fn a_follower_refuses_a_schedule_not_made_by_its_leader() {
    let claimed = made_by(A, 1);
    let mut node = fetching_from_a(&claimed);
    // Same data, other origin: the hash matches but the leader did not make it.
    let mut forged = claimed.clone();
    forged.origin = B.into();
    let actions = node.answer(Ok(forged));
    assert!(
        matches!(&actions[0], Effect::Failed { error, retry_at: Some(_), .. } if error.contains(B)),
        "{actions:?}"
    );
    assert_eq!(node.replica.held, None, "nothing put in force");
}

#[test]
fn a_follower_refuses_a_schedule_other_than_the_one_asked_for() {
    let asked = made_by(A, 1);
    let mut node = fetching_from_a(&asked);
    let actions = node.answer(Ok(made_by(A, 2)));
    assert!(
        matches!(&actions[0], Effect::Failed { error, .. } if error.contains("wanted")),
        "{actions:?}"
    );
    assert_eq!(node.replica.held, None);
}

#[test]
fn a_follower_keeps_the_last_four_schedules_of_other_leaders_it_replaced() {
    let mut node = Node::new();
    let mut replaced_order = Vec::new();
    // Six leaders one after another (heals, failovers); each new one's schedule replaces the
    // last one's.
    let leaders: Vec<String> = (0..6)
        .map(|i| format!("77985419c732412ea38b94db0000010{i}"))
        .collect();
    for (i, leader) in leaders.iter().enumerate() {
        let epoch = i as u64 + 1;
        node.follow(leader, epoch);
        let theirs = made_by(leader, epoch);
        node.packet(leader, epoch, Some(&theirs));
        node.step();
        if let Some(old) = &node.replica.held {
            replaced_order.insert(0, old.clone());
        }
        node.answer(Ok(theirs));
    }
    replaced_order.truncate(REPLACED_KEPT);
    assert_eq!(node.replica.replaced.len(), 4);
    assert_eq!(
        node.replica.replaced, replaced_order,
        "newest first, the oldest dropped"
    );
}

#[test]
fn a_replaced_schedule_is_kept_before_the_new_one_is_put_in_force() {
    let old = made_by(B, 1);
    let mut node = Node::following(A, 3).holding(&old);
    let theirs = made_by(A, 1);
    node.packet(A, 3, Some(&theirs));
    node.step();
    let actions = node.answer(Ok(theirs.clone()));
    assert_eq!(
        &actions[..2],
        &[Effect::Replaced(vec![old]), Effect::Accept(theirs)],
        "never served by neither list"
    );
}

#[test]
fn a_result_for_a_leader_no_longer_followed_is_ignored() {
    let old_leaders = made_by(A, 1);
    let mut node = fetching_from_a(&old_leaders);
    let stale = node.in_flight();
    // B took over (epoch 4) while the fetch from A ran: B's schedule is fetched at once.
    node.follow(B, 4);
    let new_leaders = made_by(B, 1);
    node.packet(B, 4, Some(&new_leaders));
    let asked = node.step();
    assert_eq!(fetches(&asked)[0].peer, B);
    // A's answer arrives late: neither taken nor counted as a failure.
    let actions = node.answer_to(stale, Ok(old_leaders));
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(node.replica.held, None);
    node.answer(Ok(new_leaders.clone()));
    assert_eq!(node.replica.held, Some(new_leaders));
}

// --- A new leader's gathering ---

#[test]
fn a_new_leader_waits_for_its_live_peers_and_ends_once_all_answered() {
    let own = made_by(ME, 1);
    let mut node = Node::new().holding(&own);
    let a_holds = made_by(B, 7);
    let b_holds = made_by(ME, 0);
    // A and B were heard from lately (in the old epoch); C long ago (dead).
    node.packet(C, 1, None);
    node.advance(Duration::from_secs(10));
    node.packet(A, 1, Some(&a_holds));
    node.packet(B, 1, Some(&b_holds));
    node.lead(2);
    assert_eq!(node.step(), vec![], "waits for A and B");
    assert_eq!(
        node.wake_at(),
        Some(node.now + WINDOW),
        "at most the window"
    );
    node.advance(ms(30));
    node.packet(A, 2, Some(&a_holds));
    assert_eq!(node.step(), vec![], "still waits for B");
    node.advance(ms(30));
    node.packet(B, 2, Some(&b_holds));
    let asked = node.step();
    assert_eq!(fetches(&asked).len(), 1, "B answered: fetching at once");
    let asked = node.serve_all(&[&a_holds, &b_holds]);
    let mut got: Vec<&str> = asked.iter().map(|f| f.stamp.hash.as_str()).collect();
    got.sort();
    assert_eq!(
        got,
        sorted(&[&a_holds, &b_holds]),
        "every distinct schedule the peers hold"
    );
    assert!(
        asked
            .iter()
            .all(|f| f.purpose == Purpose::Gather { epoch: 2 })
    );
    assert_eq!(node.replica.prefetched.epoch, 2);
    node.assert_parents(&[&own, &a_holds, &b_holds]);
    let took = node.log.iter().find_map(|a| match a {
        Effect::Gathered { took, .. } => Some(*took),
        _ => None,
    });
    assert_eq!(
        took,
        Some(ms(60)),
        "not the window: the dead peer C held nothing up"
    );
}

#[test]
fn a_new_leader_gathers_at_the_end_of_the_window_without_the_silent_peers() {
    let own = made_by(ME, 1);
    let mut node = Node::new().holding(&own);
    let a_holds = made_by(B, 7);
    node.packet(A, 1, Some(&a_holds));
    node.packet(B, 1, None);
    node.lead(2);
    node.step();
    node.advance(ms(100));
    node.packet(A, 2, Some(&a_holds));
    assert_eq!(node.step(), vec![], "B has not answered");
    node.advance(WINDOW - ms(101));
    node.packet(A, 2, Some(&a_holds));
    assert_eq!(node.step(), vec![], "1 ms before the window ends");
    let asked = node.wake();
    assert_eq!(
        node.now,
        node.machine.lead.as_ref().unwrap().started + WINDOW
    );
    assert_eq!(fetches(&asked)[0].stamp, a_holds.stamp());
    node.serve_all(&[&a_holds]);
    assert_eq!(node.replica.prefetched.epoch, 2);
    node.assert_parents(&[&own, &a_holds]);
}

#[test]
fn a_parent_that_cannot_be_fetched_is_left_out_of_the_gathering() {
    let mut node = Node::new();
    let gone = made_by(B, 1);
    let here = made_by(C, 1);
    node.packet(A, 1, Some(&gone));
    node.packet(B, 1, Some(&here));
    node.lead(2);
    node.packet(A, 2, Some(&gone));
    node.packet(B, 2, Some(&here));
    node.step();
    let asked = node.serve_all(&[&here]);
    let gathered: Vec<&Fetch> = asked
        .iter()
        .filter(|f| f.purpose == Purpose::Gather { epoch: 2 })
        .collect();
    assert_eq!(gathered.len(), 2, "each tried once in the gathering");
    assert!(node.log.iter().any(|a| matches!(a, Effect::Failed { fetch, retry_at: None, .. } if fetch.stamp.hash == gone.hash)));
    assert_eq!(
        node.replica.prefetched.epoch, 2,
        "the gathering ended anyway"
    );
    node.assert_parents(&[&here]);
    // Another node's schedule left out is then tried as a late parent, with its retries.
    assert_eq!(asked.len(), 3);
    assert_eq!(asked[2].stamp, gone.stamp());
    assert_eq!(asked[2].purpose, Purpose::LateParent { epoch: 2 });
    assert!(node.wake_at().is_some(), "tried again later");
}

#[test]
fn a_gathering_includes_another_leaders_schedule_a_peer_reported_only_briefly() {
    // Issue 10: after a heal a peer reports the other side's schedule only until it fetched this
    // node's; what the transport noted still counts.
    let own = made_by(ME, 1);
    let mut node = Node::new().holding(&own);
    let other_side = made_by(B, 1);
    node.packet(A, 4, Some(&other_side));
    node.advance(ms(100));
    node.packet(A, 4, Some(&own));
    node.lead(5);
    node.packet(A, 5, Some(&own));
    node.step();
    node.serve_all(&[&other_side]);
    node.assert_parents(&[&own, &other_side]);
}

/// A new leader (epoch 2) fetching `theirs`, which A reported before and after the election.
/// Returns the node and that fetch.
fn gathering_from_a(theirs: &Schedule) -> (Node, Fetch) {
    let mut node = Node::new();
    node.packet(A, 1, Some(theirs));
    node.lead(2);
    node.packet(A, 2, Some(theirs));
    node.step();
    let fetch = node.in_flight();
    (node, fetch)
}

#[test]
fn a_gathering_stops_when_the_leadership_is_lost() {
    let theirs = made_by(B, 1);
    let (mut node, stale) = gathering_from_a(&theirs);
    // Deposed mid-gathering: A leads epoch 3 and this node follows at once.
    node.follow(A, 3);
    let leaders = made_by(A, 2);
    node.packet(A, 3, Some(&leaders));
    let asked = node.step();
    assert_eq!(
        fetches(&asked)[0].purpose,
        Purpose::Follow { leader: A.into() }
    );
    assert!(
        node.answer_to(stale, Ok(theirs)).is_empty(),
        "the gathering's answer is ignored"
    );
    assert_eq!(
        node.replica.prefetched,
        Prefetched::default(),
        "no parents published"
    );
    assert_eq!(node.wake_at(), None, "no window left to wait for");
    node.answer(Ok(leaders.clone()));
    assert_eq!(node.replica.held, Some(leaders));
}

#[test]
fn a_result_from_an_earlier_epoch_is_ignored() {
    let theirs = made_by(B, 1);
    let (mut node, stale) = gathering_from_a(&theirs);
    // Re-elected at epoch 3 while the fetch ran: a new gathering for epoch 3.
    node.lead(3);
    node.packet(A, 3, Some(&theirs));
    let asked = node.step();
    assert_eq!(fetches(&asked)[0].purpose, Purpose::Gather { epoch: 3 });
    assert!(node.answer_to(stale, Ok(theirs.clone())).is_empty());
    assert_eq!(
        node.replica.prefetched,
        Prefetched::default(),
        "epoch 2's never published"
    );
    node.serve_all(&[&theirs]);
    assert_eq!(node.replica.prefetched.epoch, 3);
    node.assert_parents(&[&theirs]);
}

// --- Late parents (a healed partition) ---

/// A node leading epoch 5 with its parents gathered (its own schedule only).
fn settled_leader() -> (Node, Schedule) {
    let own = made_by(ME, 1);
    let mut node = Node::new().holding(&own);
    node.packet(A, 5, Some(&own));
    node.lead(5);
    node.step();
    assert_eq!(node.replica.prefetched.epoch, 5);
    (node, own)
}

/// [`settled_leader`], fetching a schedule of B's that B reported just now. Returns the node, its
/// own schedule and B's.
fn late_parent_fetching() -> (Node, Schedule, Schedule) {
    let (mut node, own) = settled_leader();
    let other_side = made_by(B, 9);
    node.packet(B, 5, Some(&other_side));
    node.step();
    (node, own, other_side)
}

#[test]
fn two_leaders_schedules_after_a_heal_both_become_parents() {
    let (mut node, own) = settled_leader();
    // The heal: B led the other side; it follows this node without an election and its
    // followers report its schedule until they took this node's.
    let other_side = made_by(B, 9);
    node.advance(Duration::from_secs(30));
    node.packet(B, 5, Some(&other_side));
    node.packet(C, 5, Some(&other_side));
    let asked = node.step();
    assert_eq!(fetches(&asked)[0].purpose, Purpose::LateParent { epoch: 5 });
    node.serve_all(&[&other_side]);
    node.assert_parents(&[&own, &other_side]);
    assert!(
        matches!(node.log.last(), Some(Effect::AddedParent { added, .. }) if *added == other_side.stamp())
    );
    // Fetched once, however often it is reported.
    node.packet(C, 5, Some(&other_side));
    assert_eq!(node.step(), vec![]);
}

#[test]
fn a_late_parent_reported_only_briefly_is_fetched() {
    let (mut node, own) = settled_leader();
    let other_side = made_by(B, 9);
    node.packet(A, 5, Some(&other_side));
    node.advance(ms(5));
    // A moved on before the machine looked.
    node.packet(A, 5, Some(&own));
    node.step();
    node.serve_all(&[&other_side]);
    node.assert_parents(&[&own, &other_side]);
}

#[test]
fn a_late_parent_is_tried_up_to_four_times_then_given_up() {
    let (mut node, _own, other_side) = late_parent_fetching();
    let mut tries_at = vec![node.now];
    let mut retries = Vec::new();
    loop {
        let actions = node.answer(Err("connection refused".into()));
        let Some(Effect::Failed { retry_at, .. }) = actions.first() else {
            panic!("{actions:?}");
        };
        retries.push(*retry_at);
        let Some(at) = retry_at else { break };
        assert!(fetches(&actions).is_empty(), "not before the wait");
        assert_eq!(node.wake_at(), Some(*at));
        // B keeps answering pings meanwhile (UDP works, TCP does not yet).
        node.advance(*at - node.now);
        node.packet(B, 5, Some(&other_side));
        assert_eq!(fetches(&node.step()).len(), 1);
        tries_at.push(node.now);
    }
    assert_eq!(tries_at.len() as u32, PARENT_TRIES);
    let waits: Vec<Duration> = tries_at.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        waits,
        [500, 1000, 2000].map(ms),
        "doubling from PARENT_RETRY"
    );
    assert_eq!(retries.last(), Some(&None), "given up");
    // Still reported: never tried again while leading, and nothing to wake up for.
    node.advance(Duration::from_secs(60));
    node.packet(B, 5, Some(&other_side));
    assert_eq!(node.step(), vec![]);
    assert_eq!(node.wake_at(), None);
}

#[test]
fn a_schedule_only_silent_peers_report_waits_until_one_is_heard_again() {
    // Minority mode: this node leads its side of a partition; B, cut off on the other side,
    // last reported its own leader's schedule before the cut.
    let own = made_by(ME, 1);
    let mut node = Node::new().holding(&own);
    let other_side = made_by(C, 1);
    node.packet(B, 1, Some(&other_side));
    node.advance(Duration::from_secs(60));
    node.packet(A, 7, Some(&own));
    node.lead(7);
    node.packet(A, 7, Some(&own));
    let actions = node.step();
    assert!(
        fetches(&actions).is_empty(),
        "no fetch to wait out: {actions:?}"
    );
    assert_eq!(
        node.replica.prefetched.epoch, 7,
        "gathered without waiting for B"
    );
    node.assert_parents(&[&own]);
    // While the cut lasts: no fetch, so no try used up; a look every `recent`.
    for _ in 0..100 {
        assert_eq!(node.wake_at(), Some(node.now + RECENT));
        assert!(fetches(&node.wake()).is_empty());
    }
    // The heal: B is heard again (it follows this node now) and still holds that schedule.
    node.packet(B, 7, Some(&other_side));
    let asked = node.step();
    assert_eq!(fetches(&asked)[0].stamp, other_side.stamp());
    node.answer(Ok(other_side.clone()));
    node.assert_parents(&[&own, &other_side]);
    assert_eq!(node.wake_at(), None);
}

#[test]
fn a_late_parent_is_fetched_from_a_peer_heard_lately() {
    let (mut node, own) = settled_leader();
    let other_side = made_by(C, 1);
    // B reported it long ago and went silent; A reports it now.
    node.packet(B, 5, Some(&other_side));
    node.advance(Duration::from_secs(10));
    node.packet(A, 5, Some(&other_side));
    let asked = node.step();
    assert_eq!(fetches(&asked)[0].peer, A);
    node.answer(Ok(other_side.clone()));
    node.assert_parents(&[&own, &other_side]);
}

#[test]
fn a_late_parent_that_fails_once_is_merged_on_the_next_try() {
    let (mut node, own, other_side) = late_parent_fetching();
    node.answer(Err("connection refused".into()));
    node.wake();
    node.answer(Ok(other_side.clone()));
    node.assert_parents(&[&own, &other_side]);
    assert_eq!(node.wake_at(), None);
}

#[test]
fn a_late_parent_result_after_the_leadership_ended_is_ignored() {
    let (mut node, _own, other_side) = late_parent_fetching();
    let stale = node.in_flight();
    node.follow(B, 6);
    node.step();
    let before = node.replica.prefetched.clone();
    assert!(node.answer_to(stale, Ok(other_side)).is_empty());
    assert_eq!(node.replica.prefetched, before);
}

#[test]
fn a_leader_does_not_fetch_its_own_schedules_as_late_parents() {
    let (mut node, _own) = settled_leader();
    // A peer still holds an older schedule of this node.
    node.packet(A, 5, Some(&made_by(ME, 0)));
    assert_eq!(node.step(), vec![]);
}

#[test]
fn old_sightings_from_before_the_leadership_do_not_count() {
    let mut node = Node::new();
    let long_ago = made_by(B, 1);
    node.packet(A, 1, Some(&long_ago));
    node.advance(Duration::from_secs(60));
    node.packet(A, 1, None);
    node.lead(2);
    node.packet(A, 2, None);
    assert_eq!(
        node.step(),
        vec![Effect::Gathered {
            parents: Prefetched {
                epoch: 2,
                schedules: vec![],
                awaiting: None,
            },
            took: Duration::ZERO,
        }]
    );
}

// --- Sightings ---

#[test]
fn sightings_keep_the_64_most_recently_reported_schedules() {
    let mut sightings = Sightings::default();
    let stamps: Vec<ScheduleStamp> = (0..SIGHTINGS_KEPT as u64 + 3)
        .map(|n| made_by(B, n).stamp())
        .collect();
    for (i, stamp) in stamps.iter().enumerate() {
        sightings.saw(&A.into(), stamp, 1_000 + i as u64);
        // The first one is reported again and again: it stays.
        sightings.saw(&C.into(), &stamps[0], 1_000 + i as u64);
    }
    assert_eq!(sightings.len(), SIGHTINGS_KEPT);
    let kept: Vec<&str> = sightings.since(0).map(|s| s.stamp.hash.as_str()).collect();
    assert!(kept.contains(&stamps[0].hash.as_str()), "reported lately");
    for evicted in &stamps[1..4] {
        assert!(
            !kept.contains(&evicted.hash.as_str()),
            "the oldest go first"
        );
    }
    assert!(kept.contains(&stamps[4].hash.as_str()));
    let first = sightings.since(0).find(|s| s.stamp == stamps[0]).unwrap();
    assert_eq!(first.peer, C, "the last peer that reported it");
    assert_eq!(
        sightings.since(1_000 + SIGHTINGS_KEPT as u64 + 2).count(),
        2
    );
}

// --- The relay tree ---

/// The id of the `n`th of a fleet's nodes (sorted as their number).
fn node_id(n: usize) -> NodeId {
    format!("77985419c732412ea38b94db1{n:07}")
}

#[test]
fn followers_form_a_tree_of_the_fanout_under_the_leader() {
    let nodes: Vec<NodeId> = (0..30).map(node_id).collect();
    let leader = node_id(7);
    let fanout = 3;
    let relay_of = |n: usize| relay(&node_id(n), &leader, &nodes, fanout);
    // The followers sorted: 0..=6, 8..=29; the first three hang under the leader.
    for n in 0..3 {
        assert_eq!(relay_of(n), None, "node {n} asks the leader");
    }
    // The next three under the first follower, then the second...
    assert_eq!(relay_of(3), Some(node_id(0)));
    assert_eq!(relay_of(5), Some(node_id(0)));
    assert_eq!(relay_of(6), Some(node_id(1)));
    // The leader takes no place: node 8 is the 8th follower, under the 2nd (node 1).
    assert_eq!(relay_of(8), Some(node_id(1)));
    assert_eq!(relay(&leader, &leader, &nodes, fanout), None);

    // Every follower reaches the leader in a few hops, no relay serves more than the fan-out
    // and none is its own ancestor.
    let mut served: BTreeMap<NodeId, usize> = BTreeMap::new();
    for n in (0..30).filter(|n| *n != 7) {
        let mut at = node_id(n);
        let mut hops = 0;
        while let Some(up) = relay(&at, &leader, &nodes, fanout) {
            assert_ne!(up, node_id(n), "a cycle through {n}");
            at = up;
            hops += 1;
        }
        assert!(hops <= 3, "node {n} is {hops} relays away from the leader");
        if let Some(up) = relay_of(n) {
            *served.entry(up).or_default() += 1;
        }
    }
    assert!(served.values().all(|n| *n <= fanout), "{served:?}");
    assert!(!served.contains_key(&leader));
}

#[test]
fn a_fanout_of_zero_or_a_small_cluster_fetches_from_the_leader() {
    let nodes: Vec<NodeId> = (0..30).map(node_id).collect();
    assert_eq!(
        relay(&node_id(20), &node_id(0), &nodes, 0),
        None,
        "0.13's way"
    );
    let few: Vec<NodeId> = (0..9).map(node_id).collect();
    for n in 1..9 {
        assert_eq!(relay(&node_id(n), &node_id(0), &few, RELAY_FANOUT), None);
    }
    // A node missing from its own list (a peer list without itself) still finds its place.
    let others: Vec<NodeId> = (0..29).map(node_id).collect();
    assert_eq!(
        relay(&node_id(29), &node_id(0), &others, 3),
        relay(&node_id(29), &node_id(0), &nodes, 3)
    );
}

/// A follower of `leader` with a fan-out of 1 whose relay is B: the followers sorted are A, B
/// and this node (whose id is made to sort last), so the leader serves A, A serves B and B
/// serves this node.
fn relayed_follower() -> (Node, NodeId, Schedule) {
    let leader: NodeId = "77985419c732412ea38b94db00000000".into();
    let mut node = Node::following(&leader, 3);
    node.machine.config.relay_fanout = 1;
    node.machine.config.id = "77985419c732412ea38b94db00000005".into();
    node.replica.nodes = vec![leader.clone(), A.into(), B.into()];
    let theirs = made_by(&leader, 1);
    node.packet(&leader, 3, Some(&theirs));
    (node, leader, theirs)
}

#[test]
fn a_follower_fetches_through_its_relay_and_checks_the_origin() {
    let (mut node, leader, theirs) = relayed_follower();
    let asked = node.step();
    let fetch = fetches(&asked)[0].clone();
    assert_eq!(fetch.peer, B, "the relay of the last follower, fan-out 1");
    assert!(fetch.relayed());
    assert_eq!(
        fetch.purpose,
        Purpose::Follow {
            leader: leader.clone()
        }
    );
    // A relay that serves something else than the leader's schedule is refused as the
    // leader's own answer would be.
    let forged = made_by(B, 1);
    node.answer(Ok(forged));
    assert_ne!(
        node.replica.held.as_ref().map(|s| &s.hash),
        Some(&theirs.hash)
    );
    assert!(node.replica.held.is_none());
}

#[test]
fn a_relay_that_fails_sends_the_follower_to_its_leader_at_once_and_is_paused() {
    let (mut node, leader, theirs) = relayed_follower();
    node.step();
    assert_eq!(node.in_flight().peer, B);
    let actions = node.answer(Err("connection refused".into()));
    assert_eq!(
        node.retry_wait(&actions),
        Some(Duration::ZERO),
        "no backoff"
    );
    let to_leader = fetches(&actions);
    assert_eq!(to_leader.len(), 1, "{actions:?}");
    assert_eq!(to_leader[0].peer, leader, "the leader, in the same turn");
    assert!(!to_leader[0].relayed());
    node.answer(Ok(theirs.clone()));
    assert_eq!(node.replica.held.as_ref(), Some(&theirs));

    // The leader's next schedule within the pause: still from the leader.
    let second = made_by(&leader, 2);
    node.advance(RELAY_PAUSE - ms(1));
    node.packet(&leader, 3, Some(&second));
    assert_eq!(fetches(&node.step())[0].peer, leader);
    node.answer(Ok(second));
    // After the pause the relay is asked again.
    let third = made_by(&leader, 3);
    node.advance(ms(1));
    node.packet(&leader, 3, Some(&third));
    assert_eq!(fetches(&node.step())[0].peer, B);
}

// Issue 28: the scheduler waits for a late parent, so that the next schedule after a heal has
// the other side's last schedule among its parents.

#[test]
fn the_parents_await_a_late_parent_until_it_is_added() {
    let (mut node, own) = settled_leader();
    assert_eq!(
        node.replica.prefetched.awaiting, None,
        "nothing to wait for"
    );
    let other_side = made_by(B, 9);
    node.packet(B, 5, Some(&other_side));
    let asked = node.step();
    // Published before the fetch is asked for: no run in between.
    assert!(
        matches!(&asked[..], [Effect::Awaiting { parents }, Effect::Fetch(_)]
            if parents.awaiting == Some(other_side.stamp())),
        "{asked:?}"
    );
    assert_eq!(node.replica.prefetched.awaiting, Some(other_side.stamp()));
    node.answer(Ok(other_side.clone()));
    node.assert_parents(&[&own, &other_side]);
    assert_eq!(node.replica.prefetched.awaiting, None);
}

#[test]
fn two_late_parents_are_awaited_one_after_the_other_without_a_gap() {
    let (mut node, own) = settled_leader();
    let (b, c) = (made_by(B, 9), made_by(C, 9));
    node.packet(B, 5, Some(&b));
    node.packet(C, 5, Some(&c));
    node.step();
    let first = node.in_flight().stamp;
    let actions = node.answer(Ok(if first == b.stamp() {
        b.clone()
    } else {
        c.clone()
    }));
    // The parents published with the first one already await the second.
    let Some(Effect::AddedParent { parents, .. }) = actions.first() else {
        panic!("{actions:?}");
    };
    assert!(
        parents.awaiting.as_ref().is_some_and(|s| *s != first),
        "{parents:?}"
    );
    node.serve_all(&[&b, &c]);
    node.assert_parents(&[&own, &b, &c]);
    assert_eq!(node.replica.prefetched.awaiting, None);
}

#[test]
fn a_late_parent_is_awaited_through_its_retries_and_no_longer_once_given_up() {
    let (mut node, _own, other_side) = late_parent_fetching();
    assert_eq!(node.replica.prefetched.awaiting, Some(other_side.stamp()));
    loop {
        let actions = node.answer(Err("connection refused".into()));
        let Some(Effect::Failed { retry_at, .. }) = actions.first() else {
            panic!("{actions:?}");
        };
        let Some(at) = *retry_at else { break };
        assert_eq!(
            node.replica.prefetched.awaiting,
            Some(other_side.stamp()),
            "still awaited until the next try"
        );
        node.advance(at - node.now);
        node.packet(B, 5, Some(&other_side));
        node.step();
    }
    assert_eq!(node.replica.prefetched.awaiting, None, "given up");
}

#[test]
fn a_schedule_only_silent_peers_report_is_not_awaited() {
    // A partition that lasts must not stop this side's scheduling.
    let (mut node, _own) = settled_leader();
    let other_side = made_by(C, 1);
    node.packet(B, 5, Some(&other_side));
    node.advance(Duration::from_secs(10));
    node.packet(A, 5, None);
    assert!(fetches(&node.step()).is_empty());
    assert_eq!(node.replica.prefetched.awaiting, None);
}

#[test]
fn a_new_leaders_first_run_awaits_what_was_reported_after_its_gathering() {
    let own = made_by(ME, 1);
    let mut node = Node::new().holding(&own);
    node.packet(A, 5, Some(&own));
    node.lead(5);
    // B's report arrives once A answered, before the machine ends the gathering.
    let other_side = made_by(B, 9);
    node.packet(B, 5, Some(&other_side));
    let actions = node.step();
    let gathered = actions.iter().find_map(|a| match a {
        Effect::Gathered { parents, .. } => Some(parents),
        _ => None,
    });
    // Whether it was gathered or comes as a late parent, the first run waits for it.
    if let Some(parents) = gathered {
        assert!(
            parents.schedules.iter().any(|s| s.hash == other_side.hash)
                || parents.awaiting == Some(other_side.stamp()),
            "{parents:?}"
        );
    }
    node.serve_all(&[&other_side]);
    node.assert_parents(&[&own, &other_side]);
    assert_eq!(node.replica.prefetched.awaiting, None);
}

#[test]
fn late_parents_that_keep_failing_hold_the_scheduler_for_ten_seconds_at_most() {
    // Peers report schedule after schedule of other nodes that no one can serve (broken, or
    // hostile): the scheduler runs again once the parents awaited them for AWAIT_LIMIT.
    let (mut node, _own) = settled_leader();
    let started = node.now;
    let mut n = 100;
    while node.now < started + AWAIT_LIMIT + Duration::from_secs(5) {
        n += 1;
        node.packet(B, 5, Some(&made_by(C, n)));
        node.step();
        if node.machine.in_flight().is_some() {
            node.answer(Err("connection refused".into()));
        }
        let waited = node.now - started;
        assert_eq!(
            node.replica.prefetched.awaiting.is_some(),
            waited < AWAIT_LIMIT,
            "after {waited:?}"
        );
        node.advance(ms(250));
    }
}
