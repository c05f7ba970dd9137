//! Leader election: the sans-IO [`machine`] and the controller that drives it on this node.
//!
//! Without a peer transport (a single node, no peer source configured) the controller only
//! feeds the machine time and the peer count; the cluster transport plugs into the same loop.

pub mod machine;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ports::Clock;
use crate::state::{NodeId, Peers};
use crate::store::{Field, Reader};
use machine::{Machine, State};

/// This node's election state in verwalter 0.13's shape (`/v1/election`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ElectionState {
    pub is_leader: bool,
    pub is_stable: bool,
    pub leader: Option<NodeId>,
    pub promoting: Option<NodeId>,
    pub num_votes_for_me: Option<usize>,
    pub needed_votes: Option<usize>,
    pub epoch: u64,
    /// Wall-clock ms of the machine's next deadline.
    pub deadline: u64,
    /// Wall-clock ms since when the node has been a stable leader or follower.
    pub last_stable_timestamp: Option<u64>,
}

/// Converts the machine's state to the published view. `now`/`now_ms` map monotonic instants to
/// wall-clock milliseconds.
pub fn view(machine: &Machine, now: Instant, now_ms: u64) -> ElectionState {
    let wall = |at: Instant| -> u64 {
        if at >= now {
            now_ms + (at - now).as_millis() as u64
        } else {
            now_ms.saturating_sub((now - at).as_millis() as u64)
        }
    };
    let mut view = ElectionState {
        epoch: machine.epoch(),
        deadline: wall(machine.deadline()),
        last_stable_timestamp: machine.stable_since().map(wall),
        ..ElectionState::default()
    };
    match machine.state() {
        State::Starting { .. } => {}
        State::Electing { votes, needed, .. } => {
            view.promoting = Some(machine.id().clone());
            view.num_votes_for_me = Some(votes.len());
            view.needed_votes = Some(*needed);
        }
        State::Voted { peer, .. } => view.promoting = Some(peer.clone()),
        State::Leader { .. } => {
            view.is_leader = true;
            view.is_stable = true;
            view.leader = Some(machine.id().clone());
        }
        State::Follower { leader, .. } => {
            view.is_stable = true;
            view.leader = Some(leader.clone());
        }
    }
    view
}

/// Stores a new view unless only the deadline moved: heartbeats move it twice a second and
/// would otherwise wake every reader of the election state for nothing.
pub fn publish(out: &Field<ElectionState>, new: ElectionState) {
    let current = out.get();
    if (ElectionState {
        deadline: current.deadline,
        ..new.clone()
    }) == *current
    {
        return;
    }
    if current.is_leader != new.is_leader || current.leader != new.leader {
        tracing::info!(epoch = new.epoch, leader = ?new.leader, is_leader = new.is_leader, "Leadership changed.");
    }
    out.set(new);
}

/// Peer info older than this makes the node stop trusting its view of the cluster
/// (verwalter 0.13: 1.5 × the 1 s peer refresh).
pub const HOSTS_FRESH: Duration = Duration::from_millis(1500);

/// Runs the election for a node without a peer transport: the machine sees the peer count from
/// the store and its own timers. Publishes every state change into `out`.
pub async fn run_local(
    mut machine: Machine,
    mut peers: Reader<Peers>,
    out: Field<ElectionState>,
    clock: Arc<dyn Clock>,
    peer_source: bool,
    shutdown: CancellationToken,
) {
    loop {
        let now = Instant::now();
        let snapshot = peers.get();
        let now_ms = clock.now_ms();
        // Without a peer source there is nothing to go stale.
        let fresh = !peer_source
            || snapshot
                .timestamp
                .is_some_and(|t| now_ms.saturating_sub(t) <= HOSTS_FRESH.as_millis() as u64);
        let actions = machine.time_passed(now, snapshot.peers.len(), fresh);
        if !actions.is_empty() {
            tracing::debug!(
                ?actions,
                "Election actions without a transport are dropped."
            );
        }
        publish(&out, view(&machine, now, now_ms));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(machine.deadline()) => {}
            _ = peers.changed() => {}
        }
    }
}
