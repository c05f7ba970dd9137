//! The status view: what `/v1/status` and `/v1/events` show and the metrics mirror, derived by
//! one pure function from one snapshot of the store.
//!
//! [`Fields`] lists the store fields the status depends on, once (one macro declares it, the
//! [`Snapshot`] and the methods): [`Fields::snapshot`] reads them and [`Fields::triggers`]
//! wakes on them, so a field added to the view cannot be forgotten by the event stream. [`view`] then sees only the
//! [`Snapshot`], the node's fixed facts and the scheduler run counts.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use crate::cluster::election::ElectionState;
use crate::machinery::store::{Reader, Trigger};
use crate::node::Store;
use crate::state::SchedulerFailure;
use crate::state::{
    Deployment, Inputs, Peers, Prefetched, Reports, RoleBlocked, RolesStatus, Schedule,
    SchedulerStatus,
};

/// The `errors` key of a schedule that could not be written to the storage dir.
pub const SCHEDULE_PERSIST: &str = "schedule_persist";

/// Who this node is: facts fixed at start.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub name: String,
    pub hostname: String,
    /// `host:port` the API listens on (the leader's `addr` while this node leads).
    pub addr: String,
    /// The port the API listens on (nodes of a cluster normally share it).
    pub port: u16,
    pub debug_force_leader: bool,
    pub default_frontend: String,
    /// `"v"` + the daemon's version, as in verwalter 0.13.
    pub version: String,
}

/// Scheduler runs since start: all of them, and those that failed (of any kind).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerRuns {
    pub(crate) total: u64,
    pub failed: u64,
}

impl SchedulerRuns {
    /// `total` runs, of which `failed(kind)` failed with each kind in [`SchedulerFailure::ALL`].
    pub fn count(total: u64, failed: impl Fn(SchedulerFailure) -> u64) -> SchedulerRuns {
        SchedulerRuns {
            total,
            failed: SchedulerFailure::ALL.into_iter().map(failed).sum(),
        }
    }
}

/// Declares [`Fields`] and [`Snapshot`] from one list of store fields, with the methods that go
/// through every field: reading them all and waking on them all cannot list different fields.
macro_rules! fields {
    ($($field:ident: $ty:ty,)*) => {
        /// Readers of every store field the status depends on, and nothing else.
        #[derive(Debug, Clone)]
        pub struct Fields {
            $(pub $field: Reader<$ty>,)*
        }

        /// One snapshot of the [`Fields`].
        #[derive(Debug, Clone, Default)]
        pub struct Snapshot {
            $(pub $field: Arc<$ty>,)*
        }

        impl Fields {
            pub fn new(store: &Store) -> Fields {
                Fields {
                    $($field: store.$field.clone(),)*
                }
            }

            /// The current value of every field.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot {
                    $($field: self.$field.peek(),)*
                }
            }

            /// A wake source per field, each marked seen: whatever changes one of them may
            /// change the status.
            pub fn triggers(&self) -> Vec<Box<dyn Trigger>> {
                let mut triggers = vec![$(self.$field.trigger(),)*];
                for trigger in &mut triggers {
                    trigger.mark_seen();
                }
                triggers
            }
        }
    };
}

fields! {
    inputs: Inputs,
    election: ElectionState,
    peers: Peers,
    reports: Reports,
    prefetched: Prefetched,
    schedule: Option<Schedule>,
    scheduler: SchedulerStatus,
    roles: RolesStatus,
    persist_error: Option<String>,
}

impl Snapshot {
    pub fn take(store: &Store) -> Snapshot {
        Fields::new(store).snapshot()
    }

    /// The last scheduler run's error and kind, while this node leads: only a leader runs the
    /// scheduler, so a node that stepped down does not keep reporting its last failure (as in
    /// verwalter 0.13; the run stays readable in `/v1/scheduler_debug_info`).
    pub(crate) fn scheduler_error(&self) -> Option<(&str, Option<SchedulerFailure>)> {
        let error = self.scheduler.error.as_deref()?;
        self.election
            .is_leader
            .then_some((error, self.scheduler.failure))
    }

    /// The entries of the last run's `datacenters` output that were not used, while this node
    /// leads, as one message (`None`: all were used).
    pub(crate) fn datacenters_errors(&self) -> Option<String> {
        let errors = &self.scheduler.datacenters_errors;
        (self.election.is_leader && !errors.is_empty()).then(|| errors.join("; "))
    }

    /// How many problems this node has: one per input error, a failed scheduler run, unused
    /// entries of its `datacenters` output, a schedule not written to the storage dir, a failing
    /// role, a deployment log that cannot be written.
    pub fn error_count(&self) -> usize {
        self.inputs.errors.len()
            + usize::from(self.scheduler_error().is_some())
            + usize::from(self.datacenters_errors().is_some())
            + usize::from(self.persist_error.is_some())
            + self.roles.failed.len()
            + usize::from(self.roles.deployment_log.is_some())
    }
}

/// How many problems this node has: one per input error, a failed scheduler run (while
/// leading), a schedule not written to the storage dir, a failing role, a deployment log that
/// cannot be written. The `num_errors` of `/v1/status` (counted by [`Snapshot::error_count`]),
/// and what a follower reports to its leader in pongs.
pub fn error_count(store: &Store) -> usize {
    Snapshot::take(store).error_count()
}

/// `/v1/status`, verwalter 0.13's shape.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub version: String,
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub peers: usize,
    pub peers_timestamp: Option<u64>,
    pub leader: Option<LeaderInfo>,
    pub roles: usize,
    pub last_stable_timestamp: Option<u64>,
    pub num_errors: usize,
    pub errors: BTreeMap<String, String>,
    pub failed_roles: Vec<String>,
    /// Roles held back by `depends_on` (waiting for a dependency, or blocked by its failure).
    pub blocked_roles: BTreeMap<String, RoleBlocked>,
    pub debug_force_leader: bool,
    pub metrics: BTreeMap<&'static str, u64>,
    pub fetch_state: Value,
    pub election_state: ElectionState,
    pub(crate) schedule_id: Option<String>,
    pub schedule_status: &'static str,
    pub default_frontend: String,
    /// Peers whose last report counted errors (new; 0.13's GraphQL had `peers.errorneous`).
    /// Only a leader hears every peer's reports.
    pub failing_nodes: Vec<FailingNode>,
    /// The latest render pass of this node (new; as in `/v1/roles_data`).
    pub last_deployment: Option<Deployment>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailingNode {
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub addr: Option<String>,
    pub errors: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaderInfo {
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub addr: Option<String>,
    pub schedule: Option<String>,
}

impl LeaderInfo {
    /// The leader's HTTP port: the one of its address where that is known (the peer list, or
    /// this node's own listen address on the leader), else `own`, this node's port.
    pub fn port(&self, own: u16) -> u16 {
        self.addr
            .as_deref()
            .and_then(|addr| addr.parse::<std::net::SocketAddr>().ok())
            .map_or(own, |addr| addr.port())
    }
}

/// The leader as this node knows it: itself while it leads, else the elected leader's entry in
/// the peer list (`None` when no leader is known or it is not in the list).
pub fn leader(node: &NodeInfo, snap: &Snapshot) -> Option<LeaderInfo> {
    let schedule = snap.schedule.as_ref().as_ref();
    if snap.election.is_leader {
        return Some(LeaderInfo {
            id: node.id.clone(),
            name: node.name.clone(),
            hostname: node.hostname.clone(),
            addr: Some(node.addr.clone()),
            schedule: schedule.map(|s| s.hash.clone()),
        });
    }
    let peer = snap.peers.peers.get(snap.election.leader.as_ref()?)?;
    Some(LeaderInfo {
        id: peer.id.clone(),
        name: peer.name.clone(),
        hostname: peer.hostname.clone(),
        addr: peer.addr.clone(),
        schedule: snap
            .reports
            .get(&peer.id)
            .and_then(|r| r.schedule.as_ref())
            .map(|s| s.hash.clone()),
    })
}

/// The status of this node.
pub fn view(node: &NodeInfo, snap: &Snapshot, runs: SchedulerRuns) -> Status {
    let election = &snap.election;
    let peers = &snap.peers;
    let schedule = snap.schedule.as_ref().as_ref();
    let roles = &snap.roles;

    let mut errors = BTreeMap::new();
    for error in &snap.inputs.errors {
        let message = match error.line {
            Some(line) => format!("line {line}: {}", error.message),
            None => error.message.clone(),
        };
        // Several problems in one file share its entry.
        errors
            .entry(error.path.clone())
            .and_modify(|all: &mut String| {
                all.push_str("; ");
                all.push_str(&message);
            })
            .or_insert(message);
    }
    if let Some((message, failure)) = snap.scheduler_error() {
        let domain = if failure == Some(SchedulerFailure::Load) {
            "scheduler_load"
        } else {
            "scheduler"
        };
        errors.insert(domain.into(), message.to_string());
    }
    if let Some(message) = snap.datacenters_errors() {
        errors.insert("scheduler_datacenters".into(), message);
    }
    if let Some(message) = snap.persist_error.as_ref() {
        errors.insert(SCHEDULE_PERSIST.into(), message.clone());
    }
    for (role, failure) in &roles.failed {
        errors.insert(format!("role {role}"), failure.message.clone());
    }
    if let Some(problem) = &roles.deployment_log {
        errors.insert("deployment_log".into(), problem.clone());
    }

    let (fetch_state, schedule_status) = fetch_state(snap);
    let failing_nodes = peers
        .peers
        .values()
        .filter_map(|p| {
            let errors = snap.reports.get(&p.id).map_or(p.errors, |r| r.errors);
            (errors > 0).then(|| FailingNode {
                id: p.id.clone(),
                name: p.name.clone(),
                hostname: p.hostname.clone(),
                addr: p.addr.clone(),
                errors,
            })
        })
        .collect();
    let metrics = BTreeMap::from([
        (
            "scheduler_succeeded",
            runs.total.saturating_sub(runs.failed),
        ),
        ("scheduler_failed", runs.failed),
        ("input_errors", snap.inputs.errors.len() as u64),
    ]);
    Status {
        version: node.version.clone(),
        id: node.id.clone(),
        name: node.name.clone(),
        hostname: node.hostname.clone(),
        peers: peers.peers.len(),
        peers_timestamp: peers.timestamp,
        leader: leader(node, snap),
        roles: schedule.map_or(0, |s| s.data.all_roles().len()),
        last_stable_timestamp: election.last_stable_timestamp,
        num_errors: snap.error_count(),
        errors,
        failed_roles: roles.failed.keys().cloned().collect(),
        blocked_roles: roles.blocked.clone(),
        debug_force_leader: node.debug_force_leader,
        metrics,
        fetch_state,
        election_state: ElectionState::clone(election),
        schedule_id: schedule.map(|s| s.hash.clone()),
        schedule_status,
        default_frontend: node.default_frontend.clone(),
        failing_nodes,
        last_deployment: roles.last_deployment.clone(),
    }
}

/// 0.13's fetch states: a new leader gathers its peers' schedules before scheduling
/// (Prefetching); a follower holds the leader's schedule (ok) or is getting it (fetching).
fn fetch_state(snap: &Snapshot) -> (Value, &'static str) {
    let election = &snap.election;
    let held = snap.schedule.as_ref().as_ref();
    if election.is_leader {
        let prefetching = !snap.peers.peers.is_empty() && snap.prefetched.epoch != election.epoch;
        // After a heal the scheduler waits for the other side's schedule: the hash fetched.
        let awaiting = snap
            .prefetched
            .awaiting
            .as_ref()
            .filter(|_| snap.prefetched.epoch == election.epoch);
        return if prefetching {
            (json!({"state": "Prefetching", "Fetching": null}), "waiting")
        } else if let Some(stamp) = awaiting {
            (
                json!({"state": "Prefetching", "Fetching": stamp.hash}),
                "waiting",
            )
        } else if held.is_some() {
            (json!({"state": "StableLeader"}), "ok")
        } else {
            (json!({"state": "StableLeader"}), "waiting")
        };
    }
    if !election.is_stable {
        return (json!({"state": "Unstable"}), "unstable");
    }
    let target = election
        .leader
        .as_ref()
        .and_then(|id| snap.reports.get(id)?.schedule.as_ref())
        .map(|stamp| stamp.hash.clone());
    let current = match (held, &target) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(held), Some(target)) => &held.hash == target,
    };
    (
        json!({"state": "Replicating", "leader": election.leader,
               "schedule": if current { None } else { target }}),
        if current { "ok" } else { "fetching" },
    )
}

impl Status {
    /// One short line for a service manager (systemd's `STATUS=`): whom this node follows,
    /// the schedule in force and how many roles fail, e.g. `follower of beta.example.com (epoch
    /// 3); schedule 4d4b15fb; 2 failing roles`.
    pub fn line(&self) -> String {
        let epoch = self.election_state.epoch;
        let role = match &self.leader {
            _ if self.election_state.is_leader => format!("leader (epoch {epoch})"),
            Some(leader) => format!("follower of {} (epoch {epoch})", leader.name),
            None => format!("no leader (epoch {epoch})"),
        };
        let schedule = match &self.schedule_id {
            Some(hash) => format!("schedule {}", hash.get(..8).unwrap_or(hash)),
            None => "no schedule".to_string(),
        };
        let failing = match self.failed_roles.len() {
            1 => "1 failing role".to_string(),
            n => format!("{n} failing roles"),
        };
        format!("{role}; {schedule}; {failing}")
    }
}

#[cfg(test)]
mod tests;
