//! Operator actions on the leader: registered with ids as verwalter 0.13 gave them
//! (`unix_seconds * 1000 + n`, at most 1,000 a second), handed to the scheduler as
//! `state.actions`, and consumed by the first successful scheduler run whose input held them.
//! A waiter (`/v1/wait_action`) gets the scheduler's reply (`actions[id]` in the schedule), or
//! learns there is none. Pending actions are kept in `<storage>/actions.json` so a restart of the
//! leader does not lose them; when the node stops leading they are dropped, as in 0.13.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::state::Actions;
use verwalter_controllers::store::{Field, Store};

use crate::state_dir::write_atomic;

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
}

#[derive(Debug, Default)]
struct Counter {
    second: u64,
    used: u64,
}

/// The leader's queue of pending actions.
#[derive(Debug)]
pub struct ActionQueue {
    out: Field<Actions>,
    store: Store,
    path: PathBuf,
    counter: Mutex<Counter>,
    waiters: Mutex<HashMap<u64, Vec<oneshot::Sender<Outcome>>>>,
}

impl ActionQueue {
    /// The queue, with the actions a previous run of this node left in `path`.
    pub fn new(out: Field<Actions>, store: Store, path: PathBuf) -> Arc<ActionQueue> {
        let saved: Actions = std::fs::read(&path)
            .ok()
            .and_then(|bytes| match serde_json::from_slice(&bytes) {
                Ok(actions) => Some(actions),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "Ignoring unreadable pending actions.");
                    None
                }
            })
            .unwrap_or_default();
        if !saved.is_empty() {
            tracing::info!(pending = saved.len(), "Loaded pending actions.");
        }
        out.set(saved);
        Arc::new(ActionQueue {
            out,
            store,
            path,
            counter: Mutex::default(),
            waiters: Mutex::default(),
        })
    }

    /// Registers `action` at wall-clock `now_ms`; returns its id, and with `wait` a receiver that
    /// resolves when it ended (see [`Outcome`]). The waiter is in place before the action is
    /// pending: a scheduler run on another thread may consume it at once, and its answer must
    /// not be lost.
    pub fn register(
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
                *counter = Counter { second, used: 0 };
            }
            if counter.used >= 1000 {
                return Err(RegisterError::TooMany);
            }
            let id = second * 1000 + counter.used;
            counter.used += 1;
            id
        };
        let receiver = wait.then(|| {
            let (tx, rx) = oneshot::channel();
            self.waiters.lock().unwrap().entry(id).or_default().push(tx);
            rx
        });
        self.out.update(|actions| {
            actions.insert(id, action);
        });
        self.save();
        Ok((id, receiver))
    }

    fn save(&self) {
        let actions = self.store.actions.peek();
        let result = if actions.is_empty() {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            let bytes = serde_json::to_vec(&*actions).expect("actions serialize");
            write_atomic(&self.path, &bytes)
        };
        if let Err(e) = result {
            tracing::error!(path = %self.path.display(), error = %e, "Cannot save the pending actions.");
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
        self.save();
        let mut waiters = self.waiters.lock().unwrap();
        for id in ids {
            for tx in waiters.remove(id).unwrap_or_default() {
                let _ = tx.send(outcome(*id));
            }
        }
    }

    /// Consumes actions as scheduler runs succeed; drops them when leadership is lost.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut status = self.store.scheduler.clone();
        let mut election = self.store.election.clone();
        let mut seen_success = status.get().last_success;
        let mut was_leader = election.get().is_leader;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = status.changed() => {}
                _ = election.changed() => {}
            }
            let leader = election.get().is_leader;
            if was_leader && !leader {
                let ids: Vec<u64> = self.store.actions.peek().keys().copied().collect();
                if !ids.is_empty() {
                    tracing::warn!(
                        dropped = ids.len(),
                        "Not the leader any more: pending actions dropped."
                    );
                }
                self.finish(&ids, |_| Outcome::LeadershipLost);
            }
            was_leader = leader;
            let current = status.get();
            if current.error.is_some() || current.last_success == seen_success {
                continue;
            }
            seen_success = current.last_success;
            let Some(input) = &current.last_input else {
                continue;
            };
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use verwalter_controllers::election::ElectionState;
    use verwalter_controllers::state::{Schedule, SchedulerInput, SchedulerStatus};
    use verwalter_controllers::store::StoreWriter;

    use super::*;

    /// A scheduler run on another thread may take an action before its HTTP handler gets to
    /// wait for it; the waiter still gets the answer.
    #[tokio::test]
    async fn an_action_taken_at_once_still_gets_its_answer() {
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
        let queue = ActionQueue::new(actions, store.clone(), tmp.path().join("actions.json"));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(queue.clone().run(shutdown.clone()));
        tokio::task::yield_now().await; // the queue notes the status it starts from

        let (id, receiver) = queue
            .register(1_000_000, json!({"button": {}}), true)
            .unwrap();
        // The run that takes it, as the schedule controller publishes one.
        let mut data = json!({"actions": {}});
        data["actions"][id.to_string()] = json!("done");
        schedule.set(Some(Schedule::encode(data, 1, "leader".into()).0));
        scheduler.set(SchedulerStatus {
            last_input: Some(Arc::new(SchedulerInput {
                now: 1,
                current_host: "alpha".into(),
                current_id: "leader".into(),
                parents: vec![],
                actions: store.actions.peek().as_ref().clone(),
                runtime: Arc::new(json!({})),
                peers: Default::default(),
                metrics: json!({}),
            })),
            last_success: Some(1),
            ..Default::default()
        });
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), receiver.unwrap())
            .await
            .expect("an outcome")
            .unwrap();
        assert!(
            matches!(outcome, Outcome::Reply(ref v) if v == "done"),
            "{outcome:?}"
        );
        assert!(store.actions.peek().is_empty());
        shutdown.cancel();
        task.await.unwrap();
    }
}
