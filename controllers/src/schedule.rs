//! The leader's schedule controller: when the inputs, peers, actions or parents change (or the
//! period passes), run the scheduler and make its output the schedule in force.
//!
//! A metrics refresh (`state.metrics`, [`crate::scheduler_metrics`]) wakes it too, but re-runs
//! the scheduler only when a sample or an error changed: a refresh that confirms the same
//! values waits for the period, whose run sees the new age.
//!
//! A failed run keeps the last good schedule and records the error; the driver retries with
//! backoff, and any input change retries at once. A new schedule is saved through the
//! [`Persister`] before it is put in force; one that could not be written is still in force, and
//! the persister writes it again until it is (see [`crate::persist`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::driver::{Driver, DriverConfig, Reconciler, Requeue};
use crate::persist::Persister;
use crate::ports::{Clock, Scheduler, SchedulerError, SchedulerFailure};
use crate::scheduler_metrics::SchedulerMetrics;
use crate::state::{Actions, Inputs, NodeId, Peers, Schedule, SchedulerInput, SchedulerStatus};
use crate::store::{Field, Store};

/// Scheduler outcomes for metrics.
pub trait ScheduleObserver: Send + Sync + 'static {
    fn run(&self, failure: Option<SchedulerFailure>, duration: Duration);
}

/// Who this node is, as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub id: NodeId,
    pub hostname: String,
}

/// The snapshots a run used; a run is due when any of them is replaced (the store only replaces
/// a snapshot when its content changed, so pointer identity is content identity), or when the
/// metrics' samples or errors changed (their refresh times alone do not count).
struct LastRun {
    inputs: Arc<Inputs>,
    peers: Arc<Peers>,
    actions: Arc<Actions>,
    parents: Arc<Vec<Schedule>>,
    metrics: Arc<SchedulerMetrics>,
    epoch: u64,
    at: Instant,
    /// A failed run is retried even when nothing changed.
    ok: bool,
}

impl LastRun {
    fn same_inputs(&self, other: &LastRun) -> bool {
        Arc::ptr_eq(&self.inputs, &other.inputs)
            && Arc::ptr_eq(&self.peers, &other.peers)
            && Arc::ptr_eq(&self.actions, &other.actions)
            && Arc::ptr_eq(&self.parents, &other.parents)
            && self.metrics.same_data(&other.metrics)
            && self.epoch == other.epoch
    }
}

/// Writers the schedule controller owns.
pub struct ScheduleOutputs {
    /// Shared with the follower's fetcher; the two never write at the same time (one writes
    /// while this node leads, the other while it follows).
    pub schedule: Arc<Field<Option<Schedule>>>,
    pub status: Field<SchedulerStatus>,
    pub parents: Field<Vec<Schedule>>,
}

/// What a scheduler run uses besides the store: the ports and this node's settings.
pub struct ScheduleDeps {
    pub scheduler: Arc<dyn Scheduler>,
    pub persist: Arc<Persister>,
    pub clock: Arc<dyn Clock>,
    pub observer: Arc<dyn ScheduleObserver>,
    pub identity: Identity,
    /// How often the scheduler runs again on unchanged inputs.
    pub period: Duration,
}

pub struct ScheduleController {
    store: Store,
    out: ScheduleOutputs,
    deps: ScheduleDeps,
    last: Mutex<Option<LastRun>>,
    /// In a cluster a new leader first gathers its peers' schedules ([`crate::state::Prefetched`]) and runs
    /// the scheduler only when they are in, with all of them as `parents`.
    prefetch: bool,
    /// The prefetched snapshot that went into `parents` last (a leader adds schedules it learns
    /// of later, e.g. the other side's after a partition heals).
    parents_from: Mutex<Option<Arc<crate::state::Prefetched>>>,
}

impl ScheduleController {
    /// Waits for [`crate::state::Prefetched`] of each new leadership before the first run (cluster mode).
    pub fn with_prefetch(mut self) -> ScheduleController {
        self.prefetch = true;
        self
    }

    pub fn new(store: Store, out: ScheduleOutputs, deps: ScheduleDeps) -> ScheduleController {
        ScheduleController {
            store,
            out,
            deps,
            last: Mutex::new(None),
            prefetch: false,
            parents_from: Mutex::new(None),
        }
    }

    /// A driver for this controller, woken by every store field a scheduler run reads.
    pub fn driver(self: Arc<Self>, config: DriverConfig) -> Driver<ScheduleController> {
        let store = self.store.clone();
        Driver::new(
            self,
            DriverConfig {
                max_concurrent: 1,
                ..config
            },
        )
        .trigger(store.inputs.trigger())
        .trigger(store.election.trigger())
        .trigger(store.peers.trigger())
        .trigger(store.actions.trigger())
        .trigger(store.parents.trigger())
        .trigger(store.prefetched.trigger())
        .trigger(store.scheduler_metrics.trigger())
    }

    fn snapshot(&self) -> LastRun {
        LastRun {
            inputs: self.store.inputs.peek(),
            peers: self.store.peers.peek(),
            actions: self.store.actions.peek(),
            parents: self.store.parents.peek(),
            metrics: self.store.scheduler_metrics.peek(),
            epoch: self.store.election.peek().epoch,
            at: Instant::now(),
            ok: false,
        }
    }

    /// Builds the scheduler input from a snapshot.
    fn input(&self, snap: &LastRun) -> SchedulerInput {
        let now = self.deps.clock.now_ms();
        SchedulerInput {
            now,
            current_host: self.deps.identity.hostname.clone(),
            current_id: self.deps.identity.id.clone(),
            parents: snap.parents.iter().map(|s| s.data.tree().clone()).collect(),
            actions: (*snap.actions).clone(),
            runtime: snap.inputs.runtime.clone(),
            peers: snap.peers.peers.clone(),
            metrics: snap.metrics.view(now),
        }
    }

    async fn pass(&self) -> Result<Requeue, SchedulerError> {
        if self.prefetch {
            let epoch = self.store.election.peek().epoch;
            let prefetched = self.store.prefetched.peek();
            if prefetched.epoch != epoch {
                return Ok(None); // the prefetch wakes us
            }
            if prefetched.awaiting.is_some() {
                // Another leader's schedule is on its way (a heal): the next run must have it
                // among its parents. Its arrival, or giving up on it, wakes us.
                return Ok(None);
            }
            let mut done = self.parents_from.lock().unwrap();
            if !done.as_ref().is_some_and(|d| Arc::ptr_eq(d, &prefetched)) {
                let mut parents = prefetched.schedules.clone();
                // A later addition keeps this leader's own latest schedule among the parents.
                if let Some(own) = self.store.schedule.peek().as_ref()
                    && own.origin == self.deps.identity.id
                    && !parents.iter().any(|p| p.hash == own.hash)
                    && done.as_ref().is_some_and(|d| d.epoch == epoch)
                {
                    parents.push(own.clone());
                }
                *done = Some(prefetched.clone());
                self.out.parents.set(parents);
            }
        }
        let mut snap = self.snapshot();
        if snap.inputs.hash.is_empty() {
            return Ok(None); // inputs not read yet; their first write wakes us
        }
        if let Some(last) = &*self.last.lock().unwrap() {
            let elapsed = snap.at.saturating_duration_since(last.at);
            if last.ok && last.same_inputs(&snap) && elapsed < self.deps.period {
                return Ok(Some(self.deps.period - elapsed));
            }
        }
        let input = Arc::new(self.input(&snap));
        let started = Instant::now();
        let result = self
            .deps
            .scheduler
            .run(&snap.inputs.scheduler_hash, input.clone())
            .await;
        self.deps
            .observer
            .run(result.as_ref().err().map(|e| e.kind), started.elapsed());
        match result {
            Ok(output) => {
                let schedule = Schedule::new(output.data, input.now, self.deps.identity.id.clone());
                let current = self.out.schedule.get();
                // Same data from another leader's run is taken anew as well: the envelope must
                // name this node as origin, or its followers would not fetch it from it.
                let same = current
                    .as_ref()
                    .as_ref()
                    .is_some_and(|c| c.hash == schedule.hash && c.origin == schedule.origin);
                if !same {
                    // A failure is the persister's to report and retry; the schedule is in
                    // force either way.
                    let _ = self.deps.persist.save(&schedule);
                    tracing::info!(hash = %schedule.hash, "New schedule.");
                    self.out.parents.set(vec![schedule.clone()]);
                    self.out.schedule.set(Some(schedule));
                    // Our own parents update must not count as a new input.
                    snap.parents = self.store.parents.peek();
                }
                // After the schedule, never before: the action queue reads the answers of the
                // actions a run consumed from the schedule in force when the status says that
                // run succeeded (`actions::ActionQueue`).
                self.out.status.set(SchedulerStatus {
                    last_input: Some(input.clone()),
                    debug_info: Some(output.log),
                    error: None,
                    failure: None,
                    last_success: Some(input.now),
                    last_success_input: Some(input.clone()),
                });
                snap.ok = true;
                *self.last.lock().unwrap() = Some(snap);
                Ok(Some(self.deps.period))
            }
            Err(error) => {
                let previous = self.out.status.get();
                self.out.status.set(SchedulerStatus {
                    last_input: Some(input),
                    debug_info: Some(format!(
                        "{}\n\n--- scheduler log ---\n{}",
                        error.message, error.log
                    )),
                    error: Some(error.message.clone()),
                    failure: Some(error.kind),
                    last_success: previous.last_success,
                    last_success_input: previous.last_success_input.clone(),
                });
                *self.last.lock().unwrap() = Some(snap);
                Err(error)
            }
        }
    }
}

impl Reconciler for ScheduleController {
    type Key = ();
    type Error = SchedulerError;

    fn name(&self) -> &'static str {
        "schedule"
    }

    fn keys(&self) -> Vec<()> {
        if self.store.election.peek().is_leader {
            vec![()]
        } else {
            Vec::new()
        }
    }

    async fn reconcile(self: Arc<Self>, _key: ()) -> Result<Requeue, SchedulerError> {
        self.pass().await
    }

    fn error_reason(&self, error: &SchedulerError) -> &'static str {
        error.kind.label()
    }
}

#[cfg(test)]
mod tests;
