//! The node's fields: every piece of observed and desired state this node holds, one
//! [`Field`] each. The one place naming every subsystem's field; the daemon's wiring hands each
//! writer to the one task that owns it.

use crate::cluster::datacenters::View;
use crate::cluster::election::ElectionState;
use crate::machinery::store::{Field, Reader};
use crate::schedule::scheduler_metrics::SchedulerMetrics;
use crate::state::{
    Actions, Inputs, Peers, Prefetched, Reports, RolesStatus, Schedule, SchedulerStatus, Templates,
};

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
    /// written by the [`Persister`](crate::schedule::persist::Persister) for both roles.
    pub persist_error: Reader<Option<String>>,
    /// Observed: the Lua scheduler's declared Prometheus queries and their last answers
    /// (`state.metrics`), written by the metrics refresh on the leader.
    pub scheduler_metrics: Reader<SchedulerMetrics>,
    /// Observed: the other data centers as this DC leader's exchange sees them, replaced only
    /// when what the scheduler sees changed ([`View::same_for_scheduler`]); `None` while the
    /// node runs no exchange.
    pub datacenters: Reader<Option<View>>,
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
    pub datacenters: Field<Option<View>>,
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
            datacenters: Field::new(None),
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
            datacenters: self.datacenters.reader(),
        }
    }
}
