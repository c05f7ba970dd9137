//! The leader's schedule controller: when the inputs, peers, actions or parents change (or the
//! period passes), run the scheduler and make its output the schedule in force.
//!
//! A metrics refresh (`state.metrics`, [`crate::schedule::scheduler_metrics`]) wakes it too, but re-runs
//! the scheduler only when a sample or an error changed: a refresh that confirms the same
//! values waits for the period, whose run sees the new age.
//!
//! A failed run keeps the last good schedule and records the error; the driver retries with
//! backoff, and any input change retries at once. A new schedule is saved through the
//! [`Persister`] before it is put in force; one that could not be written is still in force, and
//! the persister writes it again until it is (see [`crate::schedule::persist`]).
//!
//! A run whose data is what this node made before keeps the schedule in force, except on the
//! first run of a leadership and while a follower lags behind, when the same data goes in force
//! again under a fresh timestamp ([`decide`]): a verwalter 0.13 follower fetches only when the
//! stamp changes.

pub mod data;
pub mod diff;
pub mod hash;
pub mod persist;
pub mod scheduler_metrics;
pub mod shadow;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::datacenters::{self, DatacentersPort, View};
use crate::machinery::clock::Clock;
use crate::machinery::driver::{Driver, DriverConfig, Reconciler, Requeue};
use crate::machinery::ports::{Scheduler, SchedulerError};
use crate::machinery::store::Field;
use crate::node::Store;
use crate::schedule::persist::Persister;
use crate::schedule::scheduler_metrics::SchedulerMetrics;
use crate::schedule::shadow::{RealRound, ShadowHook};
use crate::state::SchedulerFailure;
use crate::state::{
    Actions, Inputs, NodeId, Peers, Reports, Schedule, SchedulerInput, SchedulerStatus,
};

/// What a successful scheduler run does with the schedule it made.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Take {
    /// Other data, or the same data made by another leader: the run's schedule goes in force.
    New(Schedule),
    /// The same data this node made before, under a new timestamp (hash, data and origin
    /// unchanged): what a verwalter 0.13 follower needs to see before it fetches.
    Restamp(Schedule),
    /// The schedule in force stays as it is.
    Keep,
}

/// What a run that made `made` (this node's, stamped with the run's time) does, with `current`
/// the schedule in force.
///
/// A verwalter 0.13 follower fetches only when the stamp its leader reports *changes* after it
/// started following (it compares the whole stamp, timestamp included, and ignores reports that
/// reach it before it follows), and a 0.13 leader stamps every run afresh. Nodes of this version
/// fetch when the hash differs from what they hold, so a new timestamp on the same hash costs
/// them nothing. So the same data this node made before is restamped:
///
/// - on the first run of each leadership (`fresh_leadership`): a restart or a re-election with
///   unchanged data would otherwise announce the stamp of an earlier leadership, which a 0.13
///   follower saw before it followed this node, and it would never fetch;
/// - on a later run while a peer of this leadership reports another schedule or none
///   (`lagging`, see [`follower_lags`]), at most once per `period` (by the stamps' wall-clock
///   times): a 0.13 node that started following mid-leadership (restarted, or missed the
///   leadership's first ping) sees a change and fetches. A peer that stays behind for good (dead
///   after a lagging report) costs one restamp per period, not one per run.
///
/// Otherwise an unchanged run keeps the schedule, so that the schedule, its file, backups,
/// caches and streams do not churn every period as 0.13's did. A restamp's timestamp is later
/// than the current one even if the clock went back.
pub(crate) fn decide(
    current: Option<&Schedule>,
    made: Schedule,
    fresh_leadership: bool,
    lagging: bool,
    period: Duration,
) -> Take {
    let Some(current) = current.filter(|c| c.hash == made.hash && c.origin == made.origin) else {
        return Take::New(made);
    };
    let period_ms = period.as_millis() as u64;
    let due = lagging && made.timestamp >= current.timestamp.saturating_add(period_ms);
    if !fresh_leadership && !due {
        return Take::Keep;
    }
    Take::Restamp(Schedule {
        timestamp: made.timestamp.max(current.timestamp.saturating_add(1)),
        ..current.clone()
    })
}

/// Whether a peer whose last election packet was of `epoch` (this leadership) reports a schedule
/// other than `hash`, or none: a follower that has not taken this leader's schedule. Nodes of
/// this version catch up by themselves within a fetch; a 0.13 follower may wait for a new stamp.
pub(crate) fn follower_lags(reports: &Reports, epoch: u64, hash: &str) -> bool {
    reports
        .values()
        .filter(|r| r.epoch == epoch)
        .any(|r| r.schedule.as_ref().is_none_or(|s| s.hash != hash))
}

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
    /// Replaced only when what the scheduler sees of the other DCs changed.
    datacenters: Arc<Option<View>>,
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
            && Arc::ptr_eq(&self.datacenters, &other.datacenters)
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
    /// This node's exchange with other data centers, when it is in one: `state.datacenters`,
    /// and where the scheduler's `datacenters` output goes.
    pub datacenters: Option<Arc<dyn DatacentersPort>>,
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
    /// The election epoch in which this controller last put a schedule in force (new or
    /// restamped): the first run of any other epoch is the first of a leadership.
    stamped_in: Mutex<Option<u64>>,
    /// Shadow schedulers: handed each real round once it is published.
    shadows: Option<Arc<dyn ShadowHook>>,
}

impl ScheduleController {
    /// Waits for [`crate::state::Prefetched`] of each new leadership before the first run (cluster mode).
    pub fn with_prefetch(mut self) -> ScheduleController {
        self.prefetch = true;
        self
    }

    /// Hands every real round to `hook` once it is published ([`shadow`]).
    pub fn with_shadows(mut self, hook: Arc<dyn ShadowHook>) -> ScheduleController {
        self.shadows = Some(hook);
        self
    }

    /// Tells the shadows about a published round (nothing without shadows).
    fn shadow_round(
        &self,
        input: &Arc<SchedulerInput>,
        code_version: &str,
        outcome: Result<(String, crate::schedule::data::ScheduleData), String>,
    ) {
        if let Some(hook) = &self.shadows {
            hook.published(RealRound {
                input: input.clone(),
                code_version: code_version.to_string(),
                outcome,
            });
        }
    }

    pub fn new(store: Store, out: ScheduleOutputs, deps: ScheduleDeps) -> ScheduleController {
        ScheduleController {
            store,
            out,
            deps,
            last: Mutex::new(None),
            prefetch: false,
            parents_from: Mutex::new(None),
            stamped_in: Mutex::new(None),
            shadows: None,
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
        .trigger(store.datacenters.trigger())
    }

    fn snapshot(&self) -> LastRun {
        LastRun {
            inputs: self.store.inputs.peek(),
            peers: self.store.peers.peek(),
            actions: self.store.actions.peek(),
            parents: self.store.parents.peek(),
            metrics: self.store.scheduler_metrics.peek(),
            datacenters: self.store.datacenters.peek(),
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
            datacenters: (self.deps.datacenters.as_ref())
                .and_then(|port| port.view())
                .map(|view| serde_json::to_value(view).expect("the view serializes")),
        }
    }

    /// Hands the `datacenters` key of a run's output to the exchange (nothing when the node is
    /// in no DC); the entries not used, each named (docs/datacenters.md).
    fn datacenters_output(&self, data: &crate::schedule::data::ScheduleData) -> Vec<String> {
        let Some(port) = &self.deps.datacenters else {
            return Vec::new();
        };
        /// The one key read; the rest of the schedule is skipped, not built.
        #[derive(serde::Deserialize)]
        struct Top {
            #[serde(default)]
            datacenters: serde_json::Value,
        }
        let value = match serde_json::from_str::<Top>(data.canonical()) {
            Ok(top) => top.datacenters,
            Err(_) => serde_json::Value::Null, // not an object: no `datacenters`
        };
        let (output, read) = datacenters::Output::from_value(&value);
        let refused = port.set_output(output);
        let errors: Vec<String> = (read.iter().map(ToString::to_string))
            .chain(refused.iter().map(ToString::to_string))
            .collect();
        for error in &errors {
            tracing::warn!(%error, "An entry of the scheduler's datacenters output is not used.");
        }
        errors
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
                let datacenters_errors = self.datacenters_output(&output.data);
                let made =
                    Schedule::from_data(output.data, input.now, self.deps.identity.id.clone());
                let real = (made.hash.clone(), made.data.clone());
                let current = self.out.schedule.get();
                let mut stamped = self.stamped_in.lock().unwrap();
                let fresh_leadership = *stamped != Some(snap.epoch);
                let lagging = follower_lags(&self.store.reports.peek(), snap.epoch, &made.hash);
                let take = decide(
                    current.as_ref().as_ref(),
                    made,
                    fresh_leadership,
                    lagging,
                    self.deps.period,
                );
                let put = match take {
                    Take::New(schedule) => {
                        tracing::info!(hash = %schedule.hash, "New schedule.");
                        Some(schedule)
                    }
                    Take::Restamp(schedule) => {
                        tracing::info!(
                            hash = %schedule.hash,
                            timestamp = schedule.timestamp,
                            why = if fresh_leadership { "new leadership" } else { "a follower lags" },
                            "Restamped the schedule."
                        );
                        Some(schedule)
                    }
                    Take::Keep => None,
                };
                if let Some(schedule) = put {
                    // A failure is the persister's to report and retry; the schedule is in
                    // force either way.
                    let _ = self.deps.persist.save(&schedule);
                    self.out.parents.set(vec![schedule.clone()]);
                    self.out.schedule.set(Some(schedule));
                    *stamped = Some(snap.epoch);
                    // Our own parents update must not count as a new input.
                    snap.parents = self.store.parents.peek();
                }
                drop(stamped);
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
                    datacenters_errors,
                });
                snap.ok = true;
                let code_version = snap.inputs.scheduler_hash.clone();
                *self.last.lock().unwrap() = Some(snap);
                // Published: only now may a shadow start on this round.
                self.shadow_round(&input, &code_version, Ok(real));
                Ok(Some(self.deps.period))
            }
            Err(error) => Err(self.failed(input, snap, error)),
        }
    }

    /// Records a failed run (the last good schedule stays in force) and hands the round to the
    /// shadows.
    fn failed(
        &self,
        input: Arc<SchedulerInput>,
        snap: LastRun,
        error: SchedulerError,
    ) -> SchedulerError {
        let previous = self.out.status.get();
        self.out.status.set(SchedulerStatus {
            last_input: Some(input.clone()),
            debug_info: Some(format!(
                "{}\n\n--- scheduler log ---\n{}",
                error.message, error.log
            )),
            error: Some(error.message.clone()),
            failure: Some(error.kind),
            last_success: previous.last_success,
            last_success_input: previous.last_success_input.clone(),
            datacenters_errors: previous.datacenters_errors.clone(),
        });
        let code_version = snap.inputs.scheduler_hash.clone();
        *self.last.lock().unwrap() = Some(snap);
        self.shadow_round(&input, &code_version, Err(error.message.clone()));
        error
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
