//! The action queue with an in-memory journal, a fake clock and paused time.

use std::sync::atomic::Ordering;

use serde_json::json;

use super::*;
use crate::cluster::election::ElectionState;
use crate::machinery::store::Reader;
use crate::node::StoreWriter;
use crate::state::{Schedule, SchedulerInput, SchedulerStatus};
use crate::testing::{FakeClock, JournalCall, MemoryJournal};

/// 2001-09-09T01:46:40Z: ids of this second are `1_000_000_000_000 + n`.
const NOW: u64 = 1_000_000_000_000;

struct Rig {
    queue: Arc<ActionQueue>,
    journal: Arc<MemoryJournal>,
    clock: Arc<FakeClock>,
    actions: Reader<Actions>,
    election: Field<ElectionState>,
    schedule: Field<Option<Schedule>>,
    scheduler: Field<SchedulerStatus>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Rig {
    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
    }

    async fn register(&self, action: Value) -> Result<u64, RegisterError> {
        self.queue.register(action, false).await.map(|r| r.id)
    }

    /// Registers `action` for a caller that waits for its answer.
    async fn register_waiting(&self, action: Value) -> Registered {
        self.queue.register(action, true).await.unwrap()
    }

    /// Registers `action` for a waiting caller, then publishes a run that answers it with
    /// `answer`.
    async fn answered(&self, action: Value, answer: Value) -> Registered {
        let registered = self.register_waiting(action).await;
        self.succeed(1, &[(registered.id, answer)]);
        registered
    }

    fn lead(&self, leader: bool) {
        self.election.set(ElectionState {
            is_leader: leader,
            ..Default::default()
        });
    }

    /// Publishes a successful scheduler run that took every pending action, answering those in
    /// `answers` (`actions[id]` in its schedule).
    fn succeed(&self, at: u64, answers: &[(u64, Value)]) {
        let mut data = json!({"actions": {}});
        for (id, answer) in answers {
            data["actions"][id.to_string()] = answer.clone();
        }
        self.schedule
            .set(Some(Schedule::new(data, at, "leader".into())));
        let input = input(self.actions.peek().as_ref().clone());
        self.scheduler.set(SchedulerStatus {
            last_input: Some(input.clone()),
            last_success_input: Some(input),
            last_success: Some(at),
            ..Default::default()
        });
    }

    /// Waits until no action is pending.
    async fn drained(&self) {
        let mut actions = self.actions.clone();
        while !actions.get().is_empty() {
            actions.changed().await;
        }
    }

    fn pending(&self) -> Vec<u64> {
        self.actions.peek().keys().copied().collect()
    }
}

fn input(actions: Actions) -> Arc<SchedulerInput> {
    Arc::new(SchedulerInput {
        now: 1,
        current_host: "alpha".into(),
        current_id: "leader".into(),
        parents: vec![],
        actions,
        runtime: Arc::new(json!({})),
        peers: Default::default(),
        metrics: json!({}),
        datacenters: None,
    })
}

/// A leading node's queue over `journal`, running.
async fn rig_on(journal: Arc<MemoryJournal>, limits: ActionLimits, leader: bool) -> Rig {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    let StoreWriter {
        actions,
        election,
        schedule,
        scheduler,
        ..
    } = writer;
    election.set(ElectionState {
        is_leader: leader,
        ..Default::default()
    });
    let clock = FakeClock::at(NOW);
    let queue = ActionQueue::open(
        actions,
        store.clone(),
        journal.clone(),
        clock.clone(),
        limits,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(queue.clone().run(shutdown.clone()));
    tokio::task::yield_now().await; // the queue notes the status it starts from
    Rig {
        queue,
        journal,
        clock,
        actions: store.actions,
        election,
        schedule,
        scheduler,
        shutdown,
        task,
    }
}

async fn rig(limits: ActionLimits) -> Rig {
    rig_on(Arc::default(), limits, true).await
}

async fn capped(max_count: usize, max_bytes: usize) -> Rig {
    rig(ActionLimits {
        max_count,
        max_bytes,
    })
    .await
}

/// What the journal holds, replayed as the next start would.
fn on_disk(journal: &MemoryJournal) -> Actions {
    replay(journal.text().as_bytes()).actions
}

/// The journal's calls, by kind.
fn call_kinds(journal: &MemoryJournal) -> Vec<&'static str> {
    let kind = |call: &JournalCall| match call {
        JournalCall::Append(_) => "append",
        JournalCall::Rewrite(_) => "rewrite",
        JournalCall::RemoveLegacy => "remove legacy",
    };
    journal.calls().iter().map(kind).collect()
}

fn appends(journal: &MemoryJournal) -> usize {
    call_kinds(journal)
        .iter()
        .filter(|&&c| c == "append")
        .count()
}

fn rewrites(journal: &MemoryJournal) -> usize {
    call_kinds(journal)
        .iter()
        .filter(|&&c| c == "rewrite")
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_follower_refuses_actions() {
    let rig = rig_on(Arc::default(), ActionLimits::default(), false).await;
    let err = rig.register(json!(1)).await.unwrap_err();
    assert!(matches!(err, RegisterError::NotLeader), "{err:?}");
    assert!(rig.pending().is_empty());
    assert_eq!(appends(&rig.journal), 0, "nothing written");
    rig.stop().await;
}

/// Past the count cap an action is refused with a message saying why; once the scheduler takes
/// the pending ones, actions are taken again.
#[tokio::test(start_paused = true)]
async fn the_count_cap_refuses_actions_until_the_scheduler_takes_some() {
    let rig = capped(3, 1000).await;
    for n in 0..3 {
        rig.register(json!(n)).await.unwrap();
    }
    let err = rig.register(json!(3)).await.unwrap_err();
    assert!(
        matches!(err, RegisterError::TooManyPending { pending: 3, max: 3 }),
        "{err:?}"
    );
    assert!(err.to_string().contains("at most 3 may be"), "{err}");
    assert_eq!(rig.pending().len(), 3);
    rig.succeed(1, &[]);
    rig.drained().await;
    rig.register(json!(3)).await.unwrap();
    assert_eq!(rig.pending().len(), 1);
    rig.stop().await;
}

/// The byte cap counts the pending actions as compact JSON; an action that would pass it is
/// refused, a smaller one still fits.
#[tokio::test(start_paused = true)]
async fn the_byte_cap_refuses_an_action_that_would_pass_it() {
    let rig = capped(100, 100).await;
    rig.register(json!("x".repeat(88))).await.unwrap(); // 90 bytes
    let err = rig.register(json!("x".repeat(9))).await.unwrap_err();
    assert!(
        matches!(
            err,
            RegisterError::PendingTooLarge {
                pending: 90,
                size: 11,
                max: 100
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("hold 90 bytes and this one 11, at most 100"),
        "{err}"
    );
    rig.register(json!("x".repeat(8))).await.unwrap(); // 10 bytes: exactly at the cap
    assert_eq!(rig.pending().len(), 2);
    rig.stop().await;
}

#[test]
fn the_default_limits_are_a_thousand_actions_and_4_mib() {
    assert_eq!(
        ActionLimits::default(),
        ActionLimits {
            max_count: 1000,
            max_bytes: 4 << 20
        }
    );
}

/// At most 1,000 ids a second (`unix_seconds * 1000 + n`); the next second has 1,000 more.
#[tokio::test(start_paused = true)]
async fn a_thousand_actions_a_second_and_no_more() {
    let rig = capped(5000, 1 << 20).await;
    let first = rig.register(json!(0)).await.unwrap();
    assert_eq!(first, NOW);
    for n in 1..1000 {
        assert_eq!(rig.register(json!(n)).await.unwrap(), NOW + n);
    }
    let err = rig.register(json!("one more")).await.unwrap_err();
    assert!(matches!(err, RegisterError::TooMany), "{err:?}");
    assert!(err.to_string().contains("at most 1000"), "{err}");
    rig.clock.advance(Duration::from_millis(999));
    assert!(matches!(
        rig.register(json!("same second")).await,
        Err(RegisterError::TooMany)
    ));
    rig.clock.advance(Duration::from_millis(1));
    assert_eq!(rig.register(json!("next")).await.unwrap(), NOW + 1000);
    assert_eq!(rig.pending().len(), 1001);
    rig.stop().await;
}

/// A clock stepped back does not refuse actions: ids go on increasing, also past the second
/// the clock shows.
#[tokio::test(start_paused = true)]
async fn ids_keep_increasing_when_the_clock_goes_back() {
    let rig = rig(ActionLimits::default()).await;
    let first = rig.register(json!(1)).await.unwrap();
    rig.clock.0.store(NOW - 3_600_000, Ordering::SeqCst);
    let second = rig.register(json!(2)).await.unwrap();
    let third = rig.register(json!(3)).await.unwrap();
    assert_eq!((second, third), (first + 1, first + 2));
    rig.stop().await;
}

/// Acknowledged actions are in the journal: a queue started on it has them, and its ids do not
/// repeat theirs within the same second.
#[tokio::test(start_paused = true)]
async fn acknowledged_actions_survive_a_restart_with_fresh_ids() {
    let rig = rig(ActionLimits::default()).await;
    let first = rig.register(json!({"a": 1})).await.unwrap();
    let journal = rig.journal.clone();
    rig.stop().await;
    let rig = rig_on(journal, ActionLimits::default(), true).await;
    assert_eq!(
        *rig.actions.peek(),
        Actions::from([(first, json!({"a": 1}))])
    );
    let second = rig.register(json!(2)).await.unwrap();
    assert_eq!(second, first + 1);
    rig.stop().await;
}

/// The issue's case: actions taken by the scheduler (so none is pending), then a restart within
/// the same second: the new ids go on past the consumed ones (they used to start again at the
/// second's first id, repeating them). The high-water mark survives the rewrite at start, and a
/// further restart, in the `last` record.
#[tokio::test(start_paused = true)]
async fn ids_of_consumed_actions_are_not_given_again_after_a_restart_in_the_same_second() {
    let rig = rig(ActionLimits::default()).await;
    let mut first = Vec::new();
    for n in 0..3 {
        first.push(rig.register(json!(n)).await.unwrap());
    }
    rig.succeed(1, &[]);
    rig.drained().await;
    while !rig.journal.text().contains("remove") {
        tokio::task::yield_now().await;
    }
    let journal = rig.journal.clone();
    rig.stop().await;
    assert!(on_disk(&journal).is_empty(), "all consumed");

    // Twice: once from the journal of adds and removes, once from the one the start rewrote.
    let mut seen = first.clone();
    for restart in 0..2 {
        let rig = rig_on(journal.clone(), ActionLimits::default(), true).await;
        assert!(rig.pending().is_empty());
        assert_eq!(rig.clock.now_ms() / 1000, NOW / 1000, "the same second");
        for n in 0..3 {
            let id = rig.register(json!(n)).await.unwrap();
            assert!(
                id > *seen.iter().max().unwrap(),
                "restart {restart}: id {id} after {seen:?}"
            );
            seen.push(id);
        }
        rig.succeed(2 + restart, &[]);
        rig.drained().await;
        while !on_disk(&journal).is_empty() {
            tokio::task::yield_now().await;
        }
        rig.stop().await;
    }
    // The start rewrote the journal to the mark alone (nothing was pending).
    let rewrites: Vec<_> = journal
        .calls()
        .into_iter()
        .filter_map(|call| match call {
            JournalCall::Rewrite(bytes) => Some(String::from_utf8(bytes).unwrap()),
            _ => None,
        })
        .collect();
    assert_eq!(
        rewrites,
        [
            String::new(),
            format!("{{\"last\":{}}}\n", first[2]),
            format!("{{\"last\":{}}}\n", seen[5]),
        ]
    );
}

/// A journal whose high-water mark is the largest id (a hostile or broken file) leaves no id
/// to give: actions are refused, never given a wrapped-round id (it used to overflow).
#[tokio::test(start_paused = true)]
async fn a_journal_naming_the_largest_id_refuses_actions_instead_of_wrapping() {
    let journal = MemoryJournal::holding(format!("{{\"last\":{}}}\n", u64::MAX).as_bytes());
    let rig = rig_on(journal, ActionLimits::default(), true).await;
    let err = rig.register(json!(1)).await.unwrap_err();
    assert!(matches!(err, RegisterError::TooMany), "{err:?}");
    rig.stop().await;
}

/// Every start rewrites the journal (a torn last record and removed actions are gone); each
/// action is then one append of its `add` record, acknowledged once written.
#[tokio::test(start_paused = true)]
async fn the_journal_is_rewritten_at_start_then_appended_to() {
    let journal = MemoryJournal::holding(
        b"{\"add\":1,\"action\":{\"a\":1}}\n{\"add\":2,\"action\":\"b\"}\n{\"remove\":[1]}\n{\"add\":3,\"act",
    );
    let rig = rig_on(journal.clone(), ActionLimits::default(), true).await;
    assert_eq!(*rig.actions.peek(), Actions::from([(2, json!("b"))]));
    let id = rig.register(json!({"c": 3})).await.unwrap();
    assert_eq!(
        journal.calls(),
        vec![
            JournalCall::Rewrite(b"{\"add\":2,\"action\":\"b\"}\n".to_vec()),
            JournalCall::Append(format!("{{\"add\":{id},\"action\":{{\"c\":3}}}}\n").into_bytes()),
        ]
    );
    assert_eq!(
        on_disk(&journal),
        Actions::from([(2, json!("b")), (id, json!({"c": 3}))])
    );
    rig.stop().await;
}

/// Requests that arrive while a write is due share one append (group commit).
#[tokio::test(start_paused = true)]
async fn concurrent_actions_share_one_append() {
    let rig = rig(ActionLimits::default()).await;
    let ids: Vec<u64> =
        futures::future::join_all((0..20).map(|n| rig.queue.register(json!(n), false)))
            .await
            .into_iter()
            .map(|r| r.unwrap().id)
            .collect();
    assert_eq!(appends(&rig.journal), 1, "{:?}", rig.journal.calls());
    assert_eq!(on_disk(&rig.journal).len(), 20);
    assert_eq!(rig.pending(), ids);
    rig.stop().await;
}

/// A failed append refuses the action (not pending, its place under the caps freed) and
/// forces a rewrite: part of it may have landed, and the removes in it are not on disk. While
/// rewrites fail nothing is appended; the next write rewrites first.
#[tokio::test(start_paused = true)]
async fn a_failed_append_refuses_the_action_and_forces_a_rewrite() {
    let rig = rig(ActionLimits::default()).await;
    let kept = rig.register(json!("kept")).await.unwrap();
    rig.journal.fail_appends.store(true, Ordering::SeqCst);
    let err = rig.register(json!("lost")).await.unwrap_err();
    assert!(matches!(err, RegisterError::Store(_)), "{err:?}");
    assert!(
        err.to_string().starts_with(
            "cannot store the action: memory/actions.journal: cannot write: No space left"
        ),
        "{err}"
    );
    assert_eq!(rig.pending(), vec![kept], "a refused action is not pending");
    assert_eq!(
        rig.queue.pending.lock().unwrap().sizes.len(),
        1,
        "nor counted"
    );
    let calls = call_kinds(&rig.journal);
    assert_eq!(
        calls[calls.len() - 2..],
        ["append", "rewrite"],
        "rewritten right after the failure"
    );
    assert_eq!(
        rig.journal.text(),
        format!("{{\"add\":{kept},\"action\":\"kept\"}}\n"),
        "the torn append is gone"
    );

    // The remove of `kept` fails to append, and so does the rewrite after it.
    rig.journal.fail_rewrites.store(true, Ordering::SeqCst);
    rig.succeed(1, &[]);
    rig.drained().await;
    rig.journal.fail_appends.store(false, Ordering::SeqCst);
    let appended = appends(&rig.journal);
    rig.register(json!("while rewrites fail"))
        .await
        .expect_err("refused while the rewrite fails");
    assert_eq!(appends(&rig.journal), appended, "nothing appended");
    rig.journal.fail_rewrites.store(false, Ordering::SeqCst);
    let id = rig.register(json!("next")).await.unwrap();
    let calls = call_kinds(&rig.journal);
    assert_eq!(calls[calls.len() - 2..], ["rewrite", "append"]);
    // `kept` is gone although its remove record never made it.
    assert_eq!(on_disk(&rig.journal), Actions::from([(id, json!("next"))]));
    rig.stop().await;
}

/// A journal that could not be rewritten at start refuses actions and is never appended to,
/// until a rewrite works.
#[tokio::test(start_paused = true)]
async fn after_a_failed_rewrite_nothing_is_appended() {
    let journal = MemoryJournal::holding(b"{\"add\":1,\"action\":1}\n");
    journal.fail_rewrites.store(true, Ordering::SeqCst);
    let rig = rig_on(journal.clone(), ActionLimits::default(), true).await;
    let err = rig.register(json!(2)).await.unwrap_err();
    assert!(matches!(err, RegisterError::Store(_)), "{err:?}");
    assert_eq!(appends(&journal), 0);
    assert_eq!(journal.text(), "{\"add\":1,\"action\":1}\n", "untouched");
    journal.fail_rewrites.store(false, Ordering::SeqCst);
    let id = rig.register(json!(3)).await.unwrap();
    assert_eq!(
        on_disk(&journal),
        Actions::from([(1, json!(1)), (id, json!(3))])
    );
    rig.stop().await;
}

/// Once the journal holds twice what is pending (and at least [`REWRITE_MIN_BYTES`]), it is
/// rewritten to the pending actions; a small journal is left to grow.
#[tokio::test(start_paused = true)]
async fn a_grown_journal_is_rewritten() {
    let rig = capped(10, 1 << 20).await;
    let big = |c: &str| json!(c.repeat(200_000));
    rig.register(json!("small")).await.unwrap();
    rig.succeed(1, &[]);
    rig.drained().await;
    rig.register(big("a")).await.unwrap();
    assert_eq!(rewrites(&rig.journal), 1, "only the one at start");
    rig.succeed(2, &[]);
    rig.drained().await;
    let last = rig.register(big("b")).await.unwrap();
    // Two big adds and their removes: past 256 KiB and twice the one pending.
    assert_eq!(
        rewrites(&rig.journal),
        2,
        "{} bytes",
        rig.journal.text().len()
    );
    assert_eq!(
        rig.journal.text(),
        format!(
            "{{\"add\":{last},\"action\":\"{}\"}}\n",
            "b".repeat(200_000)
        )
    );
    rig.stop().await;
}

/// A scheduler run on another thread may take an action before its caller waits for it; the
/// waiter still gets the answer.
#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_schedulers_answer() {
    let rig = rig(ActionLimits::default()).await;
    let registered = rig.answered(json!({"button": {}}), json!("done")).await;
    rig.drained().await;
    let outcome = registered.answer.unwrap().wait().await;
    assert_eq!(outcome, Outcome::Reply(json!("done")));
    assert!(
        !on_disk(&rig.journal).contains_key(&registered.id),
        "the consumed action is removed from the journal too"
    );
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_learns_a_schedule_took_it_without_an_answer() {
    let rig = rig(ActionLimits::default()).await;
    let answered = rig.register_waiting(json!(1)).await;
    let silent = rig.register_waiting(json!(2)).await;
    rig.succeed(1, &[(answered.id, json!("yes"))]);
    assert_eq!(
        silent.answer.unwrap().wait().await,
        Outcome::NoReply,
        "answers are per action"
    );
    assert_eq!(
        answered.answer.unwrap().wait().await,
        Outcome::Reply(json!("yes"))
    );
    rig.stop().await;
}

/// A run that consumed an action and answered it, followed at once by a failing run: the
/// queue wakes only after the failure, and still hands out the answer.
#[tokio::test(start_paused = true)]
async fn an_answer_followed_at_once_by_a_failed_run_is_not_lost() {
    let rig = rig(ActionLimits::default()).await;
    // No await between the answering run and the failed one (`answered` returns right after
    // publishing): the queue's task sees only the failed run's status.
    let registered = rig.answered(json!({"button": {}}), json!("done")).await;
    rig.scheduler.update(|status| {
        status.last_input = Some(input(Actions::new()));
        status.error = Some("main.lua:1: boom".into());
    });
    let outcome = registered.answer.unwrap().wait().await;
    assert_eq!(outcome, Outcome::Reply(json!("done")));
    assert!(rig.pending().is_empty());
    rig.stop().await;
}

/// Losing leadership drops every pending action and tells its waiters.
#[tokio::test(start_paused = true)]
async fn a_waiter_learns_leadership_was_lost() {
    let rig = rig(ActionLimits::default()).await;
    let registered = rig.register_waiting(json!(1)).await;
    rig.lead(false);
    assert_eq!(
        registered.answer.unwrap().wait().await,
        Outcome::LeadershipLost
    );
    assert!(rig.pending().is_empty());
    assert!(on_disk(&rig.journal).is_empty(), "dropped from the journal");
    rig.stop().await;
}

/// Leadership lost while an action is being written: the drop did not see it, so it is dropped
/// as soon as it is written, and its waiter told.
#[tokio::test(start_paused = true)]
async fn an_action_written_as_leadership_is_lost_is_dropped() {
    let rig = rig(ActionLimits::default()).await;
    let gate = rig.journal.hold_appends();
    let queue = rig.queue.clone();
    let registering = tokio::spawn(async move { queue.register(json!(1), true).await });
    while appends(&rig.journal) == 0 {
        tokio::task::yield_now().await;
    }
    rig.lead(false);
    tokio::task::yield_now().await; // the queue drops what is pending: nothing yet
    gate.add_permits(2); // this append, and the remove after it
    let registered = registering.await.unwrap().unwrap();
    assert_eq!(
        registered.answer.unwrap().wait().await,
        Outcome::LeadershipLost
    );
    assert!(rig.pending().is_empty());
    while appends(&rig.journal) < 2 {
        tokio::task::yield_now().await;
    }
    assert!(on_disk(&rig.journal).is_empty(), "{}", rig.journal.text());
    rig.stop().await;
}

/// Requests that arrive while a sync runs wait for it and share the next append.
#[tokio::test(start_paused = true)]
async fn requests_during_a_sync_share_the_next_append() {
    let rig = rig(ActionLimits::default()).await;
    let gate = rig.journal.hold_appends();
    let first = {
        let queue = rig.queue.clone();
        tokio::spawn(async move { queue.register(json!(0), false).await })
    };
    while appends(&rig.journal) == 0 {
        tokio::task::yield_now().await;
    }
    let rest: Vec<_> = (1..10)
        .map(|n| {
            let queue = rig.queue.clone();
            tokio::spawn(async move { queue.register(json!(n), false).await })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(rig.pending().is_empty(), "not acknowledged before the sync");
    gate.add_permits(2);
    first.await.unwrap().unwrap();
    for task in rest {
        task.await.unwrap().unwrap();
    }
    assert_eq!(appends(&rig.journal), 2, "{:?}", rig.journal.calls());
    assert_eq!(rig.pending().len(), 10);
    rig.stop().await;
}

/// Without a schedule that takes it, a waiter gives up after [`WAIT_LIMIT`]; the action stays
/// pending and a later schedule still consumes it.
#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_and_the_action_stays_pending() {
    let rig = rig(ActionLimits::default()).await;
    let registered = rig.register_waiting(json!(1)).await;
    let started = tokio::time::Instant::now();
    assert_eq!(registered.answer.unwrap().wait().await, Outcome::TimedOut);
    assert_eq!(started.elapsed(), WAIT_LIMIT);
    assert_eq!(rig.pending(), vec![registered.id]);
    rig.succeed(1, &[]);
    rig.drained().await;
    rig.stop().await;
}

/// Actions loaded at start wait while this node may still lead, and are dropped (and removed
/// from the journal) once another node leads: they must not run at some later leadership.
#[tokio::test(start_paused = true)]
async fn restored_actions_are_dropped_once_another_node_leads() {
    let journal = MemoryJournal::holding(b"{\"add\":5,\"action\":{\"old\":1}}\n");
    let rig = rig_on(journal.clone(), ActionLimits::default(), false).await;
    // Starting, no leader yet: kept.
    rig.election.set(ElectionState {
        epoch: 1,
        ..Default::default()
    });
    tokio::task::yield_now().await;
    assert_eq!(rig.pending(), vec![5]);
    rig.election.set(ElectionState {
        leader: Some("77985419c732412ea38b94db00000002".into()),
        epoch: 2,
        ..Default::default()
    });
    rig.drained().await;
    rig.stop().await;
    assert!(
        journal.text().ends_with("{\"remove\":[5]}\n"),
        "{}",
        journal.text()
    );
    assert!(on_disk(&journal).is_empty());
}

/// Restored actions are kept when this node becomes the leader again.
#[tokio::test(start_paused = true)]
async fn restored_actions_stay_when_this_node_leads_again() {
    let journal = MemoryJournal::holding(b"{\"add\":5,\"action\":{\"old\":1}}\n");
    let rig = rig_on(journal.clone(), ActionLimits::default(), false).await;
    rig.lead(true);
    tokio::task::yield_now().await;
    let id = rig.register(json!(6)).await.unwrap();
    assert!(id > 5);
    assert_eq!(rig.pending(), vec![5, id]);
    rig.stop().await;
}

/// The `actions.json` of older versions is taken over and removed once its actions are in
/// the journal.
#[tokio::test(start_paused = true)]
async fn the_actions_json_of_older_versions_is_taken_over() {
    let journal = Arc::new(MemoryJournal::default());
    *journal.legacy.lock().unwrap() = Some(br#"{"7":{"old":true}}"#.to_vec());
    let rig = rig_on(journal.clone(), ActionLimits::default(), true).await;
    assert_eq!(
        *rig.actions.peek(),
        Actions::from([(7, json!({"old": true}))])
    );
    rig.register(json!(8)).await.unwrap();
    assert!(journal.legacy.lock().unwrap().is_none(), "removed");
    assert_eq!(
        journal.calls()[..2],
        [
            JournalCall::Rewrite(b"{\"add\":7,\"action\":{\"old\":true}}\n".to_vec()),
            JournalCall::RemoveLegacy
        ]
    );
    rig.stop().await;
}

/// A journal that exists but cannot be read stops the start: taking it for "no actions" would
/// rewrite it empty.
#[test]
fn a_journal_that_cannot_be_read_is_an_error_not_an_empty_queue() {
    let journal = MemoryJournal::holding(b"{\"add\":1,\"action\":1}\n");
    journal.unreadable.store(true, Ordering::SeqCst);
    let writer = StoreWriter::new(None);
    let store = writer.store();
    let err = ActionQueue::open(
        writer.actions,
        store,
        journal.clone(),
        FakeClock::at(NOW),
        ActionLimits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, JournalError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("cannot read the action journal"));
    assert!(journal.calls().is_empty(), "nothing was rewritten");
}
