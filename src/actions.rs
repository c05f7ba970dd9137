//! Operator actions on the leader: registered with ids as verwalter 0.13 gave them
//! (`unix_seconds * 1000 + n`, at most 1,000 a second), handed to the scheduler as
//! `state.actions`, and consumed by the first successful scheduler run whose input held them.
//! A waiter (`/v1/wait_action`) gets the scheduler's reply (`actions[id]` in the schedule), or
//! learns there is none. Pending actions are kept in `<storage>/actions.journal`
//! ([`journal`]): an action is acknowledged only once it is on disk, so a restart (or a crash) of
//! the leader does not lose it; when the node stops leading they are dropped, as in 0.13. At
//! most [`ActionLimits`] actions and bytes are pending: the scheduler gets all of them in each
//! run, so an unbounded queue would stall it.

pub mod journal;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::state::Actions;
use verwalter_controllers::store::{Field, Store};

use self::journal::Journal;

/// How an action ended, for its waiters.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The scheduler answered it (`actions[id]` in its schedule).
    Reply(Value),
    /// A schedule consumed it without an answer.
    NoReply,
    /// This node stopped leading before a schedule consumed it.
    LeadershipLost,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error("this node is not the leader")]
    NotLeader,
    #[error("too many actions this second (at most 1000)")]
    TooMany,
    #[error(
        "{pending} actions are pending, at most {max} may be; retry once the scheduler has taken some"
    )]
    TooManyPending { pending: usize, max: usize },
    #[error(
        "pending actions hold {pending} bytes and this one {size}, at most {max} may be pending; retry once the scheduler has taken some"
    )]
    PendingTooLarge {
        pending: usize,
        size: usize,
        max: usize,
    },
    #[error("cannot store the action: {0}")]
    Store(String),
}

/// Caps on pending actions; an action past either is refused (HTTP 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionLimits {
    pub max_count: usize,
    /// Sum of the actions' sizes as compact JSON.
    pub max_bytes: usize,
}

impl Default for ActionLimits {
    /// Actions are button clicks, a few hundred bytes each, consumed by the next scheduler
    /// run: a thousand pending means the scheduler is failing, and 4 MiB of actions is a large
    /// part of what one Lua run may hold (256 MiB by default, several copies per run).
    fn default() -> Self {
        ActionLimits {
            max_count: 1000,
            max_bytes: 4 << 20,
        }
    }
}

/// Where the queue keeps its actions, and how many.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// `<storage>/actions.journal`.
    pub journal: PathBuf,
    /// `<storage>/actions.json` of older versions, read once and removed.
    pub legacy: Option<PathBuf>,
    pub limits: ActionLimits,
}

#[derive(Debug, Default)]
struct Counter {
    second: u64,
    used: u64,
    /// The highest id given or loaded: ids stay unique across a quick restart.
    last: u64,
}

/// Sizes of the pending actions (and of those being written), for the caps.
#[derive(Debug, Default)]
struct Pending {
    sizes: HashMap<u64, usize>,
    bytes: usize,
}

/// The leader's queue of pending actions.
#[derive(Debug)]
pub struct ActionQueue {
    out: Field<Actions>,
    store: Store,
    journal: Journal,
    limits: ActionLimits,
    counter: Mutex<Counter>,
    pending: Mutex<Pending>,
    waiters: Mutex<HashMap<u64, Vec<oneshot::Sender<Outcome>>>>,
}

impl ActionQueue {
    /// The queue, with the actions a previous run of this node left in its journal.
    pub fn new(
        out: Field<Actions>,
        store: Store,
        config: QueueConfig,
    ) -> std::io::Result<Arc<ActionQueue>> {
        let (journal, saved) = Journal::open(config.journal, config.legacy.as_deref())?;
        if !saved.is_empty() {
            tracing::info!(pending = saved.len(), "Loaded pending actions.");
        }
        let mut pending = Pending::default();
        for (id, action) in &saved {
            let size = json_size(action);
            pending.sizes.insert(*id, size);
            pending.bytes += size;
        }
        let counter = Counter {
            last: saved.keys().next_back().copied().unwrap_or(0),
            ..Counter::default()
        };
        out.set(saved);
        Ok(Arc::new(ActionQueue {
            out,
            store,
            journal,
            limits: config.limits,
            counter: Mutex::new(counter),
            pending: Mutex::new(pending),
            waiters: Mutex::default(),
        }))
    }

    /// Registers `action` at wall-clock `now_ms`; returns its id once it is on disk, and with
    /// `wait` a receiver that resolves when it ended (see [`Outcome`]). The waiter is in place
    /// before the action is pending: a scheduler run on another thread may consume it at once,
    /// and its answer must not be lost.
    ///
    /// Run it to the end (spawn it): dropped halfway, the action may be on disk but not pending
    /// until the next start.
    pub async fn register(
        &self,
        now_ms: u64,
        action: Value,
        wait: bool,
    ) -> Result<(u64, Option<oneshot::Receiver<Outcome>>), RegisterError> {
        if !self.store.election.peek().is_leader {
            return Err(RegisterError::NotLeader);
        }
        let id = {
            let mut counter = self.counter.lock().unwrap();
            let second = now_ms / 1000;
            if counter.second != second {
                counter.second = second;
                counter.used = 0;
            }
            let id = if counter.last >= (second + 1) * 1000 {
                // The clock went back (or loaded ids are from a clock that was ahead): ids
                // stay increasing and unique rather than refusing actions until it catches up.
                counter.last + 1
            } else {
                // After a restart within the same second, continue past the loaded ids.
                let floor = (counter.last + 1).saturating_sub(second * 1000);
                counter.used = counter.used.max(floor);
                if counter.used >= 1000 {
                    return Err(RegisterError::TooMany);
                }
                counter.used += 1;
                second * 1000 + counter.used - 1
            };
            counter.last = counter.last.max(id);
            id
        };
        let size = json_size(&action);
        {
            let mut pending = self.pending.lock().unwrap();
            if pending.sizes.len() >= self.limits.max_count {
                return Err(RegisterError::TooManyPending {
                    pending: pending.sizes.len(),
                    max: self.limits.max_count,
                });
            }
            if pending.bytes + size > self.limits.max_bytes {
                return Err(RegisterError::PendingTooLarge {
                    pending: pending.bytes,
                    size,
                    max: self.limits.max_bytes,
                });
            }
            pending.sizes.insert(id, size);
            pending.bytes += size;
        }
        if let Err(e) = self.journal.add(id, &action).await {
            self.release(&[id]);
            return Err(RegisterError::Store(e.to_string()));
        }
        let receiver = wait.then(|| {
            let (tx, rx) = oneshot::channel();
            self.waiters.lock().unwrap().entry(id).or_default().push(tx);
            rx
        });
        self.out.update(|actions| {
            actions.insert(id, action);
        });
        // Leadership may have gone while the action was written; the drop then missed it.
        if !self.store.election.peek().is_leader {
            self.finish(&[id], |_| Outcome::LeadershipLost);
        }
        Ok((id, receiver))
    }

    /// Forgets the sizes of `ids` for the caps.
    fn release(&self, ids: &[u64]) {
        let mut pending = self.pending.lock().unwrap();
        for id in ids {
            if let Some(size) = pending.sizes.remove(id) {
                pending.bytes -= size;
            }
        }
    }

    /// Removes `ids` and tells their waiters how they ended.
    fn finish(&self, ids: &[u64], outcome: impl Fn(u64) -> Outcome) {
        if ids.is_empty() {
            return;
        }
        self.out.update(|actions| {
            for id in ids {
                actions.remove(id);
            }
        });
        self.journal.remove(ids);
        self.release(ids);
        let mut waiters = self.waiters.lock().unwrap();
        for id in ids {
            for tx in waiters.remove(id).unwrap_or_default() {
                let _ = tx.send(outcome(*id));
            }
        }
    }

    /// Consumes actions as scheduler runs succeed; drops them when leadership is lost.
    ///
    /// Each successful run is looked at through `last_success_input`, not `last_input`: a run
    /// that fails right after a success replaces `last_input` before this task wakes, and the
    /// success's actions would stay pending, their waiters never answered.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut status = self.store.scheduler.clone();
        let mut election = self.store.election.clone();
        let mut seen_success = None;
        let mut was_leader = election.get().is_leader;
        // Actions loaded from the journal of an earlier run: kept while this node may still
        // become the leader, dropped once another node leads (they were for this node's
        // leadership; run months later they would surprise the operator).
        let mut restored = !self.store.actions.peek().is_empty();
        loop {
            let state = election.get();
            let leader = state.is_leader;
            let other_leads = !leader && state.leader.is_some();
            if (was_leader && !leader) || (restored && other_leads) {
                let ids: Vec<u64> = self.store.actions.peek().keys().copied().collect();
                if !ids.is_empty() {
                    tracing::warn!(
                        dropped = ids.len(),
                        "Not the leader any more: pending actions dropped."
                    );
                }
                self.finish(&ids, |_| Outcome::LeadershipLost);
            }
            restored &= !(leader || other_leads);
            was_leader = leader;
            let current = status.get();
            if current.last_success != seen_success {
                seen_success = current.last_success;
                if let Some(input) = &current.last_success_input {
                    let consumed: Vec<u64> = input.actions.keys().copied().collect();
                    let schedule = self.store.schedule.peek();
                    let replies = schedule
                        .as_ref()
                        .as_ref()
                        .and_then(|s| s.data.get("actions").cloned());
                    self.finish(&consumed, |id| {
                        match replies.as_ref().and_then(|r| r.get(id.to_string())) {
                            Some(value) => Outcome::Reply(value.clone()),
                            None => Outcome::NoReply,
                        }
                    });
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = status.changed() => {}
                _ = election.changed() => {}
            }
        }
    }
}

/// Size of an action as compact JSON, what the caps count.
fn json_size(action: &Value) -> usize {
    serde_json::to_vec(action).map_or(0, |v| v.len())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;
    use verwalter_controllers::election::ElectionState;
    use verwalter_controllers::state::{Schedule, SchedulerInput, SchedulerStatus};
    use verwalter_controllers::store::StoreWriter;

    use super::*;

    /// Real time: the journal's writer thread does real I/O.
    const SOON: Duration = Duration::from_secs(10);

    struct Rig {
        _tmp: tempfile::TempDir,
        queue: Arc<ActionQueue>,
        store: Store,
        schedule: Field<Option<Schedule>>,
        scheduler: Field<SchedulerStatus>,
        _election: Field<verwalter_controllers::election::ElectionState>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    async fn rig(limits: ActionLimits) -> Rig {
        let tmp = tempfile::tempdir().unwrap();
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
            is_leader: true,
            ..Default::default()
        });
        let queue = ActionQueue::new(
            actions,
            store.clone(),
            QueueConfig {
                journal: tmp.path().join("actions.journal"),
                legacy: None,
                limits,
            },
        )
        .unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(queue.clone().run(shutdown.clone()));
        tokio::task::yield_now().await; // the queue notes the status it starts from
        Rig {
            _tmp: tmp,
            queue,
            store,
            schedule,
            scheduler,
            _election: election,
            shutdown,
            task,
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
        })
    }

    /// Publishes what a successful run that consumed the pending actions and answered `id`.
    fn succeed(rig: &Rig, id: u64, at: u64) {
        let mut data = json!({"actions": {}});
        data["actions"][id.to_string()] = json!("done");
        rig.schedule
            .set(Some(Schedule::encode(data, at, "leader".into()).0));
        let input = input(rig.store.actions.peek().as_ref().clone());
        rig.scheduler.set(SchedulerStatus {
            last_input: Some(input.clone()),
            last_success_input: Some(input),
            last_success: Some(at),
            ..Default::default()
        });
    }

    /// A scheduler run on another thread may take an action before its HTTP handler gets to
    /// wait for it; the waiter still gets the answer.
    #[tokio::test]
    async fn an_action_taken_at_once_still_gets_its_answer() {
        let rig = rig(ActionLimits::default()).await;
        let (id, receiver) = rig
            .queue
            .register(1_000_000, json!({"button": {}}), true)
            .await
            .unwrap();
        succeed(&rig, id, 1);
        let outcome = tokio::time::timeout(SOON, receiver.unwrap())
            .await
            .expect("an outcome")
            .unwrap();
        assert!(
            matches!(outcome, Outcome::Reply(ref v) if v == "done"),
            "{outcome:?}"
        );
        assert!(rig.store.actions.peek().is_empty());
        rig.shutdown.cancel();
        rig.task.await.unwrap();
    }

    /// A run that consumed an action and answered it, followed at once by a failing run: the
    /// queue wakes only after the failure, and must still hand out the answer (it used to look
    /// at the failed run only, and the waiter hung for 60 s).
    #[tokio::test]
    async fn an_answer_followed_at_once_by_a_failed_run_is_not_lost() {
        let rig = rig(ActionLimits::default()).await;
        let (id, receiver) = rig
            .queue
            .register(1_000_000, json!({"button": {}}), true)
            .await
            .unwrap();
        // No await between the two: the queue's task sees only the failed run's status.
        succeed(&rig, id, 1);
        rig.scheduler.update(|status| {
            status.last_input = Some(input(Actions::new()));
            status.error = Some("main.lua:1: boom".into());
        });
        let outcome = tokio::time::timeout(SOON, receiver.unwrap())
            .await
            .expect("the answer, not a hang")
            .unwrap();
        assert_eq!(outcome, Outcome::Reply(json!("done")));
        assert!(rig.store.actions.peek().is_empty());
        rig.shutdown.cancel();
        rig.task.await.unwrap();
    }

    /// Past the count or byte cap an action is refused with a message saying why; once the
    /// scheduler takes the pending ones, actions are taken again.
    #[tokio::test]
    async fn pending_actions_are_capped_by_count_and_bytes() {
        let rig = rig(ActionLimits {
            max_count: 3,
            max_bytes: 100,
        })
        .await;
        for n in 0..3 {
            rig.queue
                .register(1_000_000, json!(n), false)
                .await
                .unwrap();
        }
        let err = rig
            .queue
            .register(1_000_000, json!(3), false)
            .await
            .unwrap_err();
        assert_eq!(err, RegisterError::TooManyPending { pending: 3, max: 3 });
        assert!(err.to_string().contains("at most 3"), "{err}");
        assert_eq!(rig.store.actions.peek().len(), 3);
        succeed(&rig, 0, 1);
        tokio::time::timeout(SOON, async {
            let mut actions = rig.store.actions.clone();
            while !actions.get().is_empty() {
                actions.changed().await;
            }
        })
        .await
        .expect("consumed");
        let big = json!("x".repeat(90));
        rig.queue
            .register(1_000_000, big.clone(), false)
            .await
            .unwrap();
        let err = rig.queue.register(1_000_000, big, false).await.unwrap_err();
        assert!(
            matches!(err, RegisterError::PendingTooLarge { max: 100, .. }),
            "{err:?}"
        );
        rig.shutdown.cancel();
        rig.task.await.unwrap();
    }

    /// Actions loaded at start wait while this node may still lead, and are dropped (answered
    /// `LeadershipLost`) once another node leads: they must not run at some later leadership.
    #[tokio::test]
    async fn restored_actions_are_dropped_once_another_node_leads() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("actions.journal");
        std::fs::write(&journal, "{\"add\":5,\"action\":{\"old\":1}}\n").unwrap();
        let writer = StoreWriter::new(None);
        let store = writer.store();
        let queue = ActionQueue::new(
            writer.actions,
            store.clone(),
            QueueConfig {
                journal: journal.clone(),
                legacy: None,
                limits: ActionLimits::default(),
            },
        )
        .unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(queue.clone().run(shutdown.clone()));
        // Starting, no leader yet: kept.
        writer.election.set(ElectionState {
            epoch: 1,
            ..Default::default()
        });
        tokio::task::yield_now().await;
        assert_eq!(store.actions.peek().len(), 1);
        writer.election.set(ElectionState {
            leader: Some("77985419c732412ea38b94db00000002".into()),
            epoch: 2,
            ..Default::default()
        });
        let mut actions = store.actions.clone();
        tokio::time::timeout(SOON, async {
            while !actions.get().is_empty() {
                actions.changed().await;
            }
        })
        .await
        .expect("restored actions dropped");
        shutdown.cancel();
        task.await.unwrap();
        // The remove record is written by the journal's thread, without a waiter.
        tokio::time::timeout(SOON, async {
            while !std::fs::read_to_string(&journal)
                .unwrap()
                .contains(r#"{"remove":[5]}"#)
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the drop is in the journal");
        drop(queue);
        let (_journal, loaded) = Journal::open(journal, None).unwrap();
        assert!(
            loaded.is_empty(),
            "dropped from the journal too: {loaded:?}"
        );
    }

    /// A clock stepped back (or ids loaded from a clock that was ahead) does not refuse actions:
    /// ids go on increasing.
    #[tokio::test]
    async fn ids_keep_increasing_when_the_clock_goes_back() {
        let rig = rig(ActionLimits::default()).await;
        let (first, _) = rig
            .queue
            .register(5_000_000, json!(1), false)
            .await
            .unwrap();
        let (second, _) = rig.queue.register(1_000, json!(2), false).await.unwrap();
        assert!(second > first, "{second} after {first}");
        rig.shutdown.cancel();
        rig.task.await.unwrap();
    }

    /// Acknowledged actions are in the journal: a new queue on the same storage has them, and
    /// its ids do not repeat theirs within the same second.
    #[tokio::test]
    async fn acknowledged_actions_survive_a_restart_with_fresh_ids() {
        let rig = rig(ActionLimits::default()).await;
        let (first, _) = rig
            .queue
            .register(1_000_000, json!({"a": 1}), false)
            .await
            .unwrap();
        let writer = StoreWriter::new(None);
        let store = writer.store();
        writer.election.set(ElectionState {
            is_leader: true,
            ..Default::default()
        });
        let queue = ActionQueue::new(
            writer.actions,
            store.clone(),
            QueueConfig {
                journal: rig._tmp.path().join("actions.journal"),
                legacy: None,
                limits: ActionLimits::default(),
            },
        )
        .unwrap();
        assert_eq!(
            *store.actions.peek(),
            Actions::from([(first, json!({"a": 1}))])
        );
        let (second, _) = queue.register(1_000_000, json!(2), false).await.unwrap();
        assert!(second > first, "{second} after {first}");
        rig.shutdown.cancel();
        rig.task.await.unwrap();
    }
}
