//! The shared store: typed fields, cheap `Arc` snapshots for readers, one writer per field.
//!
//! Every field is a `tokio::sync::watch` channel holding an `Arc<T>`. A [`Field`] is the only
//! writer of its value and is not `Clone`; [`Reader`]s are cloned freely. A write that leaves the
//! value equal to what it was wakes no one, so controllers that wake on changes never spin on
//! no-op updates, and a changed `Arc` pointer always means changed content.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::election::ElectionState;
use crate::scheduler_metrics::SchedulerMetrics;
use crate::state::{
    Actions, Inputs, Peers, Prefetched, Reports, RolesStatus, Schedule, SchedulerStatus, Templates,
};

/// The single writer of one store field.
#[derive(Debug)]
pub struct Field<T> {
    tx: watch::Sender<Arc<T>>,
}

/// A reader of one store field: snapshots and change notifications.
#[derive(Debug)]
pub struct Reader<T> {
    rx: watch::Receiver<Arc<T>>,
}

impl<T> Clone for Reader<T> {
    fn clone(&self) -> Self {
        Reader {
            rx: self.rx.clone(),
        }
    }
}

impl<T: PartialEq + Send + Sync + 'static> Field<T> {
    pub fn new(initial: T) -> Field<T> {
        let (tx, _rx) = watch::channel(Arc::new(initial));
        Field { tx }
    }

    /// Replaces the value; returns whether it changed (and so whether readers were woken).
    pub fn set(&self, value: T) -> bool {
        self.tx.send_if_modified(|current| {
            if **current == value {
                false
            } else {
                *current = Arc::new(value);
                true
            }
        })
    }

    /// Edits a copy of the value and stores it if it differs. The read, edit and store happen
    /// under the channel's lock, so concurrent updates never overwrite each other's edits (a
    /// read-then-set would let two writers both start from the same old value). `edit` must
    /// not read this field's readers: it runs under the channel's lock.
    pub fn update(&self, edit: impl FnOnce(&mut T)) -> bool
    where
        T: Clone,
    {
        self.tx.send_if_modified(|current| {
            let mut value = T::clone(current);
            edit(&mut value);
            if **current == value {
                false
            } else {
                *current = Arc::new(value);
                true
            }
        })
    }

    pub fn get(&self) -> Arc<T> {
        self.tx.borrow().clone()
    }

    pub fn reader(&self) -> Reader<T> {
        Reader {
            rx: self.tx.subscribe(),
        }
    }
}

impl<T: Send + Sync + 'static> Reader<T> {
    /// The current snapshot; marks it as seen for [`Reader::changed`].
    pub fn get(&mut self) -> Arc<T> {
        self.rx.borrow_and_update().clone()
    }

    /// The current snapshot without touching the seen mark (for shared readers).
    pub fn peek(&self) -> Arc<T> {
        self.rx.borrow().clone()
    }

    /// Waits until the value changes after the last [`Reader::get`]. Never returns once the
    /// writer is gone (the daemon is shutting down; the shutdown signal wakes controllers).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// A boxed wake source for the controller [`Driver`](crate::machinery::driver::Driver).
    pub fn trigger(&self) -> Box<dyn Trigger> {
        Box::new(self.clone())
    }
}

/// Something a controller wakes on: resolves when a watched value changed.
pub trait Trigger: Send {
    fn changed(&mut self) -> BoxFuture<'_, ()>;
    /// Forgets changes made so far (the driver looks at everything when it starts).
    fn mark_seen(&mut self);
}

impl<T: Send + Sync + 'static> Trigger for Reader<T> {
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            Reader::changed(self).await;
            // Mark the new value seen so the next call waits for the next change.
            self.rx.borrow_and_update();
        })
    }

    fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }
}

/// Read access to every field of the store; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    /// Observed: the config dir (runtime tree, scheduler sources).
    pub inputs: Reader<Inputs>,
    /// Observed: other nodes.
    pub peers: Reader<Peers>,
    /// Observed: this node's election state.
    pub election: Reader<ElectionState>,
    /// Desired: operator actions waiting for a scheduler run.
    pub actions: Reader<Actions>,
    /// Observed: schedules the next scheduler run gets as `parents`.
    pub parents: Reader<Vec<Schedule>>,
    /// Desired: the schedule in force on this node.
    pub schedule: Reader<Option<Schedule>>,
    /// Observed: the scheduler's last input, log and error.
    pub scheduler: Reader<SchedulerStatus>,
    /// Observed: the files under `templates/`.
    pub templates: Reader<Templates>,
    /// Desired: bumped by `force_render_all`; every role renders again once per bump.
    pub force_render: Reader<u64>,
    /// Observed: failing roles and the latest render pass.
    pub roles: Reader<RolesStatus>,
    /// Observed: what peers said in election packets (schedule stamps, errors).
    pub reports: Reader<Reports>,
    /// Observed: the schedules a new leader gathered for its first run.
    pub prefetched: Reader<Prefetched>,
    /// Observed: schedules of other leaders this node held before it took a new leader's
    /// (newest first, a few), still served so that a leader can gather them as parents.
    pub replaced: Reader<Vec<Schedule>>,
    /// Observed: why the schedule in force is not in the storage dir yet (`None` once written);
    /// written by the [`Persister`](crate::persist::Persister) for both roles.
    pub persist_error: Reader<Option<String>>,
    /// Observed: the Lua scheduler's declared Prometheus queries and their last answers
    /// (`state.metrics`), written by the metrics refresh on the leader.
    pub scheduler_metrics: Reader<SchedulerMetrics>,
}

impl Store {
    /// How many problems this node has: one per input error, a failed scheduler run (while
    /// leading), a schedule not written to the storage dir, a failing role, a deployment log
    /// that cannot be written. The `num_errors` of `/v1/status` (counted by
    /// [`Snapshot::error_count`](crate::status::Snapshot::error_count)), and what a follower
    /// reports to its leader in pongs.
    pub fn error_count(&self) -> usize {
        crate::status::Snapshot::take(self).error_count()
    }
}

/// The writers of every field; the daemon's wiring hands each to the one task that owns it.
#[derive(Debug)]
pub struct StoreWriter {
    pub inputs: Field<Inputs>,
    pub peers: Field<Peers>,
    pub election: Field<ElectionState>,
    pub actions: Field<Actions>,
    pub parents: Field<Vec<Schedule>>,
    pub schedule: Field<Option<Schedule>>,
    pub scheduler: Field<SchedulerStatus>,
    pub templates: Field<Templates>,
    pub force_render: Field<u64>,
    pub roles: Field<RolesStatus>,
    pub reports: Field<Reports>,
    pub prefetched: Field<Prefetched>,
    pub replaced: Field<Vec<Schedule>>,
    pub persist_error: Field<Option<String>>,
    pub scheduler_metrics: Field<SchedulerMetrics>,
}

impl StoreWriter {
    /// A store with empty defaults, except the schedule loaded from disk (if any).
    pub fn new(schedule: Option<Schedule>) -> StoreWriter {
        StoreWriter {
            inputs: Field::new(Inputs::default()),
            peers: Field::new(Peers::default()),
            election: Field::new(ElectionState::default()),
            actions: Field::new(Actions::new()),
            parents: Field::new(schedule.iter().cloned().collect()),
            schedule: Field::new(schedule),
            scheduler: Field::new(SchedulerStatus::default()),
            templates: Field::new(Templates::default()),
            force_render: Field::new(0),
            roles: Field::new(RolesStatus::default()),
            reports: Field::new(Reports::default()),
            prefetched: Field::new(Prefetched::default()),
            replaced: Field::new(Vec::new()),
            persist_error: Field::new(None),
            scheduler_metrics: Field::new(SchedulerMetrics::default()),
        }
    }

    pub fn store(&self) -> Store {
        Store {
            inputs: self.inputs.reader(),
            peers: self.peers.reader(),
            election: self.election.reader(),
            actions: self.actions.reader(),
            parents: self.parents.reader(),
            schedule: self.schedule.reader(),
            scheduler: self.scheduler.reader(),
            templates: self.templates.reader(),
            force_render: self.force_render.reader(),
            roles: self.roles.reader(),
            reports: self.reports.reader(),
            prefetched: self.prefetched.reader(),
            replaced: self.replaced.reader(),
            persist_error: self.persist_error.reader(),
            scheduler_metrics: self.scheduler_metrics.reader(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_that_changes_nothing_wakes_no_one() {
        let field = Field::new(1u32);
        let mut reader = field.reader();
        assert_eq!(*reader.get(), 1);
        assert!(!field.set(1));
        let woke =
            tokio::time::timeout(std::time::Duration::from_millis(20), reader.changed()).await;
        assert!(woke.is_err(), "an equal write must not wake readers");
        assert!(field.set(2));
        reader.changed().await;
        assert_eq!(*reader.get(), 2);
    }

    #[tokio::test]
    async fn update_edits_a_copy_and_keeps_old_snapshots_intact() {
        let field = Field::new(vec![1, 2]);
        let before = field.reader().get();
        assert!(field.update(|v| v.push(3)));
        assert_eq!(*before, vec![1, 2]);
        assert_eq!(*field.get(), vec![1, 2, 3]);
        assert!(!field.update(|_| {}));
    }

    /// Writers on several threads each add their own entries; none is lost (a read-clone-set
    /// update lost some in most runs).
    #[test]
    fn concurrent_updates_lose_nothing() {
        const THREADS: u64 = 4;
        const UPDATES: u64 = 500;
        let field = Arc::new(Field::new(std::collections::BTreeSet::<u64>::new()));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let field = field.clone();
                std::thread::spawn(move || {
                    for n in 0..UPDATES {
                        assert!(field.update(|set| {
                            set.insert(t * UPDATES + n);
                        }));
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        assert_eq!(field.get().len() as u64, THREADS * UPDATES);
    }

    /// The count a follower sends its leader in pongs includes a deployment log that cannot be
    /// written and a schedule that could not be persisted (issue 10: only failing roles and input
    /// errors counted, so the leader's failing_nodes missed such a node).
    #[test]
    fn the_error_count_has_every_problem_of_the_status() {
        use crate::state::{InputError, RoleFailure};
        let writer = StoreWriter::new(None);
        let store = writer.store();
        assert_eq!(store.error_count(), 0);
        writer.roles.update(|r| {
            r.deployment_log = Some("/var/log/verwalter: read-only file system".into());
        });
        assert_eq!(store.error_count(), 1);
        writer
            .persist_error
            .set(Some("schedule.json: No space left on device".into()));
        assert_eq!(store.error_count(), 2);
        writer.roles.update(|r| {
            r.failed.insert(
                "web".into(),
                RoleFailure {
                    message: "command failed".into(),
                    since: 1,
                    attempts: 1,
                    deployment_id: None,
                },
            );
        });
        writer.inputs.update(|i| {
            i.errors.push(InputError {
                path: "runtime/a.yaml".into(),
                line: Some(3),
                message: "bad".into(),
            });
        });
        writer
            .scheduler
            .update(|s| s.error = Some("main.lua:1: boom".into()));
        // The scheduler's failure counts only while this node leads (only a leader runs it).
        assert_eq!(store.error_count(), 4);
        writer.election.update(|e| e.is_leader = true);
        assert_eq!(store.error_count(), 5);
        writer.persist_error.set(None);
        writer.roles.update(|r| r.deployment_log = None);
        assert_eq!(store.error_count(), 3);
    }
}
