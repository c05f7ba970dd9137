//! The leader's queue of operator actions: who may register one, the caps, the ids, how the
//! journal is kept, and what a waiter learns.
//!
//! Actions get ids as verwalter 0.13 gave them (`unix_seconds * 1000 + n`, at most 1,000 a
//! second), go to the scheduler as `state.actions`, and are consumed by the first successful
//! scheduler run whose input held them. A waiter (`/v1/wait_action`) gets the scheduler's reply
//! (`actions[id]` in the schedule), or learns there is none. Pending actions are kept in a
//! journal through the [`ActionJournal`] port: an action is acknowledged only once it is on
//! disk, so a restart (or a crash) of the leader does not lose it; when the node stops leading
//! they are dropped, as in 0.13. At most [`ActionLimits`] actions and bytes are pending: the
//! scheduler gets all of them in each run, so an unbounded queue would stall it.
//!
//! The journal is one record per line: `{"add":<id>,"action":<json>}` makes an action pending,
//! `{"remove":[<id>,...]}` ends some, `{"last":<id>}` is the highest id ever given. One writer
//! task appends each batch of requests with one sync (group commit). The journal is rewritten
//! with one `add` per pending action at start, after any failed write, and once it has grown well
//! past what is still pending; a rewrite begins with `last` when no pending action carries the
//! highest id, so ids never repeat across a restart, even once every action was consumed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::machinery::clock::Clock;
use crate::machinery::ports::{ActionJournal, JournalError};
use crate::machinery::store::Field;
use crate::node::Store;
use crate::state::Actions;

/// How long a waiter waits for a schedule that consumes its action: a healthy scheduler runs
/// within seconds of an input change, so a minute means it is failing, and the client learns
/// that the action stays pending.
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Ids a second: ids are `unix_seconds * 1000 + n`, as in verwalter 0.13.
pub(crate) const IDS_PER_SECOND: u64 = 1000;

/// Below this size the journal is never rewritten to shrink it: rewriting a small file saves
/// nothing.
pub(crate) const REWRITE_MIN_BYTES: u64 = 256 << 10;

/// How an action ended, for its waiters.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The scheduler answered it (`actions[id]` in its schedule).
    Reply(Value),
    /// A schedule consumed it without an answer.
    NoReply,
    /// This node stopped leading before a schedule consumed it (or the queue stopped).
    LeadershipLost,
    /// No schedule consumed it within [`WAIT_LIMIT`]; it stays pending.
    TimedOut,
}

#[derive(Debug, Clone, thiserror::Error)]
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
    Store(#[source] JournalError),
    /// The daemon is shutting down.
    #[error("the action queue has stopped")]
    Stopped,
}

/// Caps on pending actions; an action past either is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionLimits {
    pub max_count: usize,
    /// Sum of the actions' sizes as compact JSON.
    pub max_bytes: usize,
}

impl Default for ActionLimits {
    /// [`crate::defaults::ACTIONS_MAX_PENDING`] and [`crate::defaults::ACTIONS_MAX_PENDING_KIB`].
    fn default() -> Self {
        ActionLimits {
            max_count: crate::defaults::ACTIONS_MAX_PENDING as usize,
            max_bytes: (crate::defaults::ACTIONS_MAX_PENDING_KIB as usize) << 10,
        }
    }
}

/// A registered action: its id, and with `wait` the way to its outcome.
#[derive(Debug)]
pub struct Registered {
    pub id: u64,
    pub answer: Option<Answer>,
}

/// The outcome of one action, once it ends.
#[derive(Debug)]
pub struct Answer(oneshot::Receiver<Outcome>);

impl Answer {
    /// Waits at most [`WAIT_LIMIT`] for the action to end.
    pub async fn wait(self) -> Outcome {
        match tokio::time::timeout(WAIT_LIMIT, self.0).await {
            Ok(Ok(outcome)) => outcome,
            // The queue is gone with the daemon's shutdown: this node leads no more.
            Ok(Err(_)) => Outcome::LeadershipLost,
            Err(_) => Outcome::TimedOut,
        }
    }
}

#[derive(Debug, Default)]
struct Counter {
    second: u64,
    used: u64,
    /// The highest id given or loaded: ids stay unique across a quick restart.
    last: u64,
}

impl Counter {
    /// The id for an action at wall-clock `now_ms`.
    fn next(&mut self, now_ms: u64) -> Result<u64, RegisterError> {
        let second = now_ms / 1000;
        if self.second != second {
            self.second = second;
            self.used = 0;
        }
        let id = if self.last >= (second + 1) * IDS_PER_SECOND {
            // The clock went back (or loaded ids are from a clock that was ahead): ids stay
            // increasing and unique rather than refusing actions until it catches up. (A
            // journal naming the largest id leaves none: refused, never wrapped round.)
            self.last.checked_add(1).ok_or(RegisterError::TooMany)?
        } else {
            // After a restart within the same second, continue past the loaded ids.
            let floor = (self.last + 1).saturating_sub(second * IDS_PER_SECOND);
            self.used = self.used.max(floor);
            if self.used >= IDS_PER_SECOND {
                return Err(RegisterError::TooMany);
            }
            self.used += 1;
            second * IDS_PER_SECOND + self.used - 1
        };
        self.last = self.last.max(id);
        Ok(id)
    }
}

/// Sizes of the pending actions (and of those being written), for the caps.
#[derive(Debug, Default)]
struct Pending {
    sizes: HashMap<u64, usize>,
    bytes: usize,
}

/// A request to the journal's writer.
enum Change {
    /// Write the action, then make it pending and report the write's result.
    Add {
        id: u64,
        action: Value,
        done: oneshot::Sender<Result<(), JournalError>>,
    },
    /// These actions ended.
    Remove(Vec<u64>),
}

/// One line of the journal.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Record {
    Add {
        add: u64,
        action: Value,
    },
    Remove {
        remove: Vec<u64>,
    },
    /// The highest id given so far (the high-water mark); written by rewrites.
    Last {
        last: u64,
    },
}

fn encode(record: &Record) -> Vec<u8> {
    let mut line = serde_json::to_vec(record).expect("a record serializes");
    line.push(b'\n');
    line
}

fn add_record(id: u64, action: &Value) -> Vec<u8> {
    encode(&Record::Add {
        add: id,
        action: action.clone(),
    })
}

/// What a journal held: the pending actions, the length of its whole lines, and the highest id
/// it names (of an `add` or a `last` record, whether the action is still pending or not).
#[derive(Debug, Default)]
struct Replayed {
    actions: Actions,
    len: u64,
    last: u64,
}

/// Replays journal bytes. A last line without its newline (a write cut short by a crash) is
/// ignored and everything before it kept; a line that is not a record is skipped.
fn replay(bytes: &[u8]) -> Replayed {
    let mut actions = Actions::new();
    let mut last = 0;
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if whole < bytes.len() {
        tracing::warn!(
            bytes = bytes.len() - whole,
            "Ignoring a torn last record of the action journal (a crash cut it short)."
        );
    }
    for (n, line) in bytes[..whole].split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Record>(line) {
            Ok(Record::Add { add, action }) => {
                last = last.max(add);
                actions.insert(add, action);
            }
            Ok(Record::Last { last: mark }) => last = last.max(mark),
            Ok(Record::Remove { remove }) => {
                for id in remove {
                    actions.remove(&id);
                }
            }
            Err(e) => {
                tracing::warn!(line = n + 1, error = %e, "Ignoring a bad record of the action journal.");
            }
        }
    }
    Replayed {
        actions,
        len: whole as u64,
        last,
    }
}

/// What the journal holds, and when it must be rewritten; owned by the writer task.
struct JournalState {
    /// The pending actions that are on disk, as their `add` records.
    live: BTreeMap<u64, Vec<u8>>,
    /// Length of the journal's whole records.
    len: u64,
    /// The next write rewrites the journal from `live` first: at start, after a failed append
    /// (part of it may have landed, and its removes are not in the file) and after a failed
    /// rewrite (the storage may have unlinked the file it appends to). Appends wait for it.
    needs_rewrite: bool,
    /// The older versions' file is still there; removed after the first rewrite.
    legacy: bool,
    /// The highest id ever written to the journal (or read from it at start).
    last: u64,
}

impl JournalState {
    fn live_bytes(&self) -> u64 {
        self.live.values().map(|line| line.len() as u64).sum()
    }

    /// Rewrites the journal with one `add` per pending action, after the `last` record when
    /// none of them has the highest id given.
    async fn rewrite(&mut self, port: &dyn ActionJournal) -> Result<(), JournalError> {
        self.needs_rewrite = true;
        let highest_pending = self.live.keys().next_back().copied().unwrap_or(0);
        let mut bytes = Vec::new();
        if self.last > highest_pending {
            bytes.extend(encode(&Record::Last { last: self.last }));
        }
        bytes.extend(self.live.values().flatten().copied());
        let len = bytes.len() as u64;
        port.rewrite(bytes).await?;
        self.len = len;
        self.needs_rewrite = false;
        if self.legacy {
            self.legacy = false;
            if let Err(e) = port.remove_legacy().await {
                tracing::warn!(error = %e, "Cannot remove the pending actions file of an older version; its actions may come back at the next start.");
            }
        }
        Ok(())
    }

    /// Writes one batch: the rewrite first when it is due, then every record in one append.
    /// Removed actions leave `live` whatever happens (a failed write is made good by the
    /// rewrite it forces); added ones join it once written.
    async fn write(
        &mut self,
        port: &dyn ActionJournal,
        adds: Vec<(u64, Vec<u8>)>,
        removes: Vec<u64>,
    ) -> Result<(), JournalError> {
        for id in &removes {
            self.live.remove(id);
        }
        let mut bytes: Vec<u8> = adds.iter().flat_map(|(_, line)| line).copied().collect();
        if !removes.is_empty() {
            bytes.extend(encode(&Record::Remove { remove: removes }));
        }
        if self.needs_rewrite {
            self.rewrite(port).await?;
        }
        let len = bytes.len() as u64;
        if let Err(e) = port.append(bytes).await {
            self.needs_rewrite = true;
            return Err(e);
        }
        self.len += len;
        if let Some(highest) = adds.iter().map(|(id, _)| *id).max() {
            self.last = self.last.max(highest);
        }
        self.live.extend(adds);
        Ok(())
    }

    /// After a batch: rewrites the journal if a write failed or it has grown to twice what is
    /// pending.
    async fn tidy(&mut self, port: &dyn ActionJournal) {
        let grown = self.len >= REWRITE_MIN_BYTES && self.len >= 2 * self.live_bytes();
        if (self.needs_rewrite || grown)
            && let Err(e) = self.rewrite(port).await
        {
            tracing::error!(error = %e, "Cannot rewrite the action journal; actions are refused until it can be.");
        }
    }
}

/// The leader's queue of pending actions.
pub struct ActionQueue {
    out: Field<Actions>,
    store: Store,
    journal: Arc<dyn ActionJournal>,
    clock: Arc<dyn Clock>,
    limits: ActionLimits,
    counter: Mutex<Counter>,
    pending: Mutex<Pending>,
    waiters: Mutex<HashMap<u64, Vec<oneshot::Sender<Outcome>>>>,
    changes: mpsc::UnboundedSender<Change>,
    /// The writer's inbox and state until [`ActionQueue::run`] takes them.
    writer: Mutex<Option<(mpsc::UnboundedReceiver<Change>, JournalState)>>,
}

impl std::fmt::Debug for ActionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionQueue")
            .field("limits", &self.limits)
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl ActionQueue {
    /// The queue, with the actions a previous run of this node left in its journal (and in the
    /// file of older versions, taken over). A journal that exists but cannot be read is an
    /// error: the daemon must not start and rewrite it empty.
    ///
    /// Registering needs [`ActionQueue::run`] running: it writes the journal.
    pub fn open(
        out: Field<Actions>,
        store: Store,
        journal: Arc<dyn ActionJournal>,
        clock: Arc<dyn Clock>,
        limits: ActionLimits,
    ) -> Result<Arc<ActionQueue>, JournalError> {
        let saved = journal.load()?;
        let Replayed {
            mut actions,
            len,
            last,
        } = saved.journal.as_deref().map(replay).unwrap_or_default();
        let legacy = saved.legacy.is_some();
        match saved.legacy {
            Some(Ok(bytes)) => match serde_json::from_slice::<Actions>(&bytes) {
                Ok(old) => {
                    for (id, action) in old {
                        actions.entry(id).or_insert(action);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Ignoring the unreadable pending actions of an older version.");
                }
            },
            Some(Err(e)) => {
                tracing::warn!(error = %e, "Cannot read the pending actions of an older version.");
            }
            None => {}
        }
        if !actions.is_empty() {
            tracing::info!(pending = actions.len(), "Loaded pending actions.");
        }
        let mut pending = Pending::default();
        for (id, action) in &actions {
            let size = json_size(action);
            pending.sizes.insert(*id, size);
            pending.bytes += size;
        }
        // Ids go on past every id the journal names, consumed ones too: an id is never given to
        // two actions, whenever the restart comes.
        let last = last.max(actions.keys().next_back().copied().unwrap_or(0));
        let counter = Counter {
            last,
            ..Counter::default()
        };
        let state = JournalState {
            live: actions
                .iter()
                .map(|(id, action)| (*id, add_record(*id, action)))
                .collect(),
            len,
            needs_rewrite: true,
            legacy,
            last,
        };
        out.set(actions);
        let (changes, inbox) = mpsc::unbounded_channel();
        Ok(Arc::new(ActionQueue {
            out,
            store,
            journal,
            clock,
            limits,
            counter: Mutex::new(counter),
            pending: Mutex::new(pending),
            waiters: Mutex::default(),
            changes,
            writer: Mutex::new(Some((inbox, state))),
        }))
    }

    /// Registers `action`; returns its id once it is on disk and pending, and with `wait` an
    /// [`Answer`]. The waiter is in place before the action is pending: a scheduler run on
    /// another thread may consume it at once, and its answer must not be lost. Dropping the
    /// call halfway does not matter: the writer makes a written action pending all the same.
    pub async fn register(&self, action: Value, wait: bool) -> Result<Registered, RegisterError> {
        if !self.store.election.peek().is_leader {
            return Err(RegisterError::NotLeader);
        }
        let id = self.counter.lock().unwrap().next(self.clock.now_ms())?;
        self.reserve(id, json_size(&action))?;
        let answer = wait.then(|| {
            let (tx, rx) = oneshot::channel();
            self.waiters.lock().unwrap().entry(id).or_default().push(tx);
            Answer(rx)
        });
        let (done, written) = oneshot::channel();
        // Should the writer be gone, the change and its `done` are dropped, and so reported.
        let _ = self.changes.send(Change::Add { id, action, done });
        match written.await {
            Ok(Ok(())) => Ok(Registered { id, answer }),
            Ok(Err(e)) => Err(RegisterError::Store(e)),
            Err(_) => {
                // The writer stopped (shutdown) before it took the action.
                self.forget(id);
                Err(RegisterError::Stopped)
            }
        }
    }

    /// Counts an action of `size` bytes against the caps, or refuses it.
    fn reserve(&self, id: u64, size: usize) -> Result<(), RegisterError> {
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
        Ok(())
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

    /// Forgets an action that never became pending: its size and its waiters.
    fn forget(&self, id: u64) {
        self.release(&[id]);
        self.waiters.lock().unwrap().remove(&id);
    }

    /// Removes `ids` and tells their waiters how they ended. The journal's `remove` record is
    /// not waited for: if a crash loses it, the actions are pending again after the restart and
    /// the scheduler sees them once more.
    fn finish(&self, ids: &[u64], outcome: impl Fn(u64) -> Outcome) {
        if ids.is_empty() {
            return;
        }
        self.out.update(|actions| {
            for id in ids {
                actions.remove(id);
            }
        });
        let _ = self.changes.send(Change::Remove(ids.to_vec()));
        self.release(ids);
        let mut waiters = self.waiters.lock().unwrap();
        for id in ids {
            for tx in waiters.remove(id).unwrap_or_default() {
                let _ = tx.send(outcome(*id));
            }
        }
    }

    /// Makes a written action pending.
    fn publish(&self, id: u64, action: Value) {
        self.out.update(|actions| {
            actions.insert(id, action);
        });
        // Leadership may have gone while the action was written; the drop then missed it.
        if !self.store.election.peek().is_leader {
            self.finish(&[id], |_| Outcome::LeadershipLost);
        }
    }

    /// Writes the journal, consumes actions as scheduler runs succeed, drops them when
    /// leadership is lost; until `shutdown`. Call it once.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let (inbox, state) = self
            .writer
            .lock()
            .unwrap()
            .take()
            .expect("the action queue runs once");
        tokio::join!(self.follow(&shutdown), self.write(inbox, state, &shutdown));
    }

    /// The journal's writer: everything queued while the last write ran goes into the next
    /// one, so concurrent requests share a sync. Stops between batches at shutdown, so an
    /// acknowledged action is never cut short.
    async fn write(
        &self,
        mut inbox: mpsc::UnboundedReceiver<Change>,
        mut state: JournalState,
        shutdown: &CancellationToken,
    ) {
        // Every start rewrites the journal: a torn record is gone and the file is small.
        if let Err(e) = state.rewrite(&*self.journal).await {
            tracing::error!(error = %e, "Cannot rewrite the action journal; actions are refused until it can be.");
        }
        loop {
            let first = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                change = inbox.recv() => match change {
                    Some(change) => change,
                    None => return,
                },
            };
            let mut batch = vec![first];
            while let Ok(change) = inbox.try_recv() {
                batch.push(change);
            }
            let mut adds = Vec::new();
            let mut lines = Vec::new();
            let mut removes = Vec::new();
            for change in batch {
                match change {
                    Change::Add { id, action, done } => {
                        lines.push((id, add_record(id, &action)));
                        adds.push((id, action, done));
                    }
                    Change::Remove(ids) => removes.extend(ids),
                }
            }
            let result = state.write(&*self.journal, lines, removes).await;
            if let Err(e) = &result {
                tracing::error!(error = %e, "Cannot write the action journal.");
            }
            for (id, action, done) in adds {
                match &result {
                    Ok(()) => self.publish(id, action),
                    Err(_) => self.forget(id),
                }
                let _ = done.send(result.clone());
            }
            state.tidy(&*self.journal).await;
        }
    }

    /// Consumes actions as scheduler runs succeed; drops them when leadership is lost.
    ///
    /// Each successful run is looked at through `last_success_input`, not `last_input`: a run
    /// that fails right after a success replaces `last_input` before this task wakes, and the
    /// success's actions would stay pending, their waiters never answered.
    async fn follow(&self, shutdown: &CancellationToken) {
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
                        .and_then(|s| s.data.tree().get("actions").cloned());
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
mod tests;
