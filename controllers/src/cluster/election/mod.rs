//! Leader election: the sans-IO [`machine`] and the controller that drives it on this node;
//! [`wire`] is the packet format and [`transport`] what the UDP transport decides.
//!
//! Without a peer transport (a single node, no peer source configured) the controller only
//! feeds the machine time and the peer count; the cluster transport plugs into the same loop.

pub mod machine;
#[cfg(test)]
mod matrix_tests;
#[cfg(test)]
mod sim;
pub mod transport;
pub mod wire;

use std::sync::Arc;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::machinery::clock::Clock;
use crate::machinery::store::{Field, Reader};
use crate::state::{NodeId, Peers};
#[cfg(test)]
use machine::Timings;
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

/// Remembers the wall-clock time of the machine's `stable_since` instant, so that the published
/// `last_stable_timestamp` does not move by a rounding millisecond on every conversion (which
/// would rewrite the election state, and wake its readers, on every heartbeat).
#[derive(Debug, Default)]
pub struct StableWall {
    mapped: Option<(Instant, u64)>,
}

/// Converts the machine's state to the published view. `now`/`now_ms` map monotonic instants to
/// wall-clock milliseconds.
pub fn view(
    machine: &Machine,
    now: Instant,
    now_ms: u64,
    stable: &mut StableWall,
) -> ElectionState {
    let wall = |at: Instant| -> u64 {
        if at >= now {
            now_ms + (at - now).as_millis() as u64
        } else {
            now_ms.saturating_sub((now - at).as_millis() as u64)
        }
    };
    let last_stable_timestamp = machine.stable_since().map(|since| match stable.mapped {
        Some((at, ms)) if at == since => ms,
        _ => {
            let ms = wall(since);
            stable.mapped = Some((since, ms));
            ms
        }
    });
    let mut view = ElectionState {
        epoch: machine.epoch(),
        deadline: wall(machine.deadline()),
        last_stable_timestamp,
        ..ElectionState::default()
    };
    match machine.state() {
        State::Starting { .. } => {}
        State::Electing { votes, needed, .. } => {
            view.promoting = Some(machine.id().clone());
            view.num_votes_for_me = Some(votes.len());
            view.needed_votes = Some(*needed);
        }
        // Shown as an election: the yeses so far against the votes it will need.
        State::PreVoting { grants, needed, .. } => {
            view.promoting = Some(machine.id().clone());
            view.num_votes_for_me = Some(grants.len());
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
    let mut stable = StableWall::default();
    loop {
        let now = Instant::now();
        let snapshot = peers.get();
        let now_ms = clock.now_ms();
        // Without a peer source there is nothing to go stale.
        let fresh = !peer_source || transport::hosts_fresh(snapshot.timestamp, now_ms);
        let actions = machine.time_passed(now, snapshot.peers.len(), fresh);
        if !actions.is_empty() {
            tracing::debug!(
                ?actions,
                "Election actions without a transport are dropped."
            );
        }
        publish(&out, view(&machine, now, now_ms, &mut stable));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(machine.deadline()) => {}
            _ = peers.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::testing::FakeClock;

    #[tokio::test(start_paused = true)]
    async fn a_lone_node_leads_and_heartbeats_do_not_rewrite_the_state() {
        let peers = Field::new(Peers::default());
        let out = Field::new(ElectionState::default());
        let mut reader = out.reader();
        reader.get();
        let now = Instant::now();
        let machine = Machine::new("ab".repeat(16), now, Timings::default(), 1).start_now(now);
        let stop = CancellationToken::new();
        let clock = FakeClock::at(1_000_000);
        let task = tokio::spawn(run_local(
            machine,
            peers.reader(),
            out,
            clock,
            false,
            stop.clone(),
        ));
        reader.changed().await;
        let state = reader.get();
        assert!(state.is_leader && state.is_stable);
        assert_eq!(state.epoch, 1);
        assert_eq!(state.leader.as_deref(), Some("ab".repeat(16).as_str()));
        // Twenty heartbeats later nothing was rewritten.
        let woke = tokio::time::timeout(Duration::from_secs(10), reader.changed()).await;
        assert!(
            woke.is_err(),
            "heartbeats rewrote the election state: {:?}",
            reader.get()
        );
        stop.cancel();
        task.await.unwrap();
    }
}
