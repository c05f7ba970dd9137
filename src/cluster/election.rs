//! The election over UDP: the sans-IO machine fed with packets from peers and with time, its
//! actions sent as verwalter 0.13's CBOR packets on the HTTP port. What is taken, counted and
//! sent where is decided in [`verwalter_controllers::election::transport`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::election::machine::{Action, Machine, State};
use verwalter_controllers::election::transport::{self, Cause, To};
use verwalter_controllers::election::wire::{AuthKey, Kind, MAX_PACKET, Packet, WireError};
use verwalter_controllers::election::{self, ElectionState, StableWall};
use verwalter_controllers::ports::Clock;
use verwalter_controllers::state::{Reports, ScheduleStamp};
use verwalter_controllers::store::{Field, Store};

use super::fetch::SharedSightings;
use super::peers::Liveness;
use crate::metrics::Metrics;

/// Sources of dropped packets warned about (the first packet of each); later ones, and sources
/// past this many, only at debug level, so that a flood of forged packets cannot flood the log.
const WARNED_SOURCES: usize = 64;

/// Everything the election task needs.
pub struct ElectionTask {
    pub machine: Machine,
    pub socket: Arc<UdpSocket>,
    pub store: Store,
    pub out: Field<ElectionState>,
    pub reports: Field<Reports>,
    pub live: Liveness,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub allow_minority: bool,
    /// With `allow_minority`, peers not heard from directly for this long do not count.
    pub minority_window: Duration,
    /// Where the schedules of other nodes that peers report are noted for the fetcher.
    pub sightings: SharedSightings,
    /// `election.key-file`: packets are tagged, and only tagged ones taken.
    pub key: Option<AuthKey>,
}

impl ElectionTask {
    /// Runs until shutdown.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut stable = StableWall::default();
        let mut warned = std::collections::BTreeSet::new();
        let mut schedule = self.store.schedule.clone();
        schedule.get();
        loop {
            let deadline = self.machine.deadline();
            let is_leader = matches!(self.machine.state(), State::Leader { .. });
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = self.socket.recv_from(&mut buf) => {
                    match got {
                        Ok((n, from)) => self.packet(&buf[..n], from, &mut warned).await,
                        Err(e) => tracing::debug!(error = %e, "UDP receive failed."),
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let now = Instant::now();
                    let before = self.machine.state().clone();
                    let actions = self.machine.time_passed(now, self.peer_count(), self.hosts_fresh());
                    self.count_election(&before, Cause::Timeout);
                    self.act(actions).await;
                }
                // A leader tells its followers about a new schedule at once, not at the next
                // heartbeat: that is what starts their fetch.
                _ = schedule.changed(), if is_leader => {
                    schedule.get();
                    self.act(vec![Action::PingAll]).await;
                }
            }
            let view = election::view(
                &self.machine,
                Instant::now(),
                self.clock.now_ms(),
                &mut stable,
            );
            election::publish(&self.out, view);
        }
    }

    /// Peers that count for the vote.
    fn peer_count(&self) -> usize {
        let window = self.allow_minority.then_some(self.minority_window);
        let peers = self.store.peers.peek();
        let now_ms = self.clock.now_ms();
        self.live
            .with_heard(|heard| transport::voters(&peers, window, now_ms, heard))
    }

    fn hosts_fresh(&self) -> bool {
        let last = Some(self.live.last_refresh()).filter(|t| *t != 0);
        transport::hosts_fresh(last, self.clock.now_ms())
    }

    async fn packet(
        &mut self,
        bytes: &[u8],
        from_addr: SocketAddr,
        warned: &mut std::collections::BTreeSet<std::net::IpAddr>,
    ) {
        let packet = match Packet::decode_with(bytes, self.key.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                let reason = match e {
                    WireError::BadTag => "bad_auth",
                    _ => "decode",
                };
                self.metrics
                    .messages_dropped
                    .with_label_values(&[reason])
                    .inc();
                tracing::debug!(from = %from_addr, error = %e, "Dropped a bad election packet.");
                return;
            }
        };
        let admitted = transport::admit(
            self.machine.id(),
            &packet,
            from_addr,
            &self.store.peers.peek(),
        );
        if let Err(dropped) = admitted {
            if let Some(label) = dropped.label() {
                self.metrics
                    .messages_dropped
                    .with_label_values(&[label])
                    .inc();
            }
            match dropped {
                transport::Dropped::Own => {}
                transport::Dropped::UnknownPeer => {
                    let ip = from_addr.ip().to_canonical();
                    if warned.len() < WARNED_SOURCES && warned.insert(ip) {
                        tracing::warn!(from = %from_addr, id = %packet.from, "Dropped an election packet from a node that is not a listed peer at that address (only the first from this address is logged).");
                    } else {
                        tracing::debug!(from = %from_addr, id = %packet.from, "Dropped an election packet from a node that is not a listed peer at that address.");
                    }
                }
                transport::Dropped::BadEpoch => {
                    tracing::debug!(from = %from_addr, epoch = packet.epoch, "Dropped an election packet with an impossible epoch.");
                }
            }
            return;
        }
        let kind = match packet.kind {
            Kind::Ping => "ping",
            Kind::Pong { .. } => "pong",
            Kind::Vote { .. } => "vote",
        };
        self.metrics
            .messages_received
            .with_label_values(&[kind])
            .inc();
        let now_ms = self.clock.now_ms();
        self.live.packet(&packet.from, now_ms);
        if let Some(stamp) = transport::sighting(self.machine.id(), &packet) {
            self.sightings
                .lock()
                .unwrap()
                .saw(&packet.from, stamp, now_ms);
        }
        if transport::from_my_leader(self.machine.state(), &packet) {
            self.metrics
                .leader_contact_ms
                .store(now_ms, Ordering::Relaxed);
        }
        let report = transport::report(&packet, self.store.reports.peek().get(&packet.from));
        if self.store.reports.peek().get(&packet.from) != Some(&report) {
            self.reports.update(|all| {
                all.insert(packet.from.clone(), report);
            });
        }
        let before = self.machine.state().clone();
        let message = packet.message();
        let actions = self.machine.message(
            Instant::now(),
            &packet.from,
            packet.epoch,
            message.clone(),
            self.peer_count(),
        );
        self.count_election(&before, Cause::of_message(&before, &message));
        self.act(actions).await;
    }

    /// Counts an election this node started, by why.
    fn count_election(&self, before: &State, cause: Cause) {
        if let Some(reason) = transport::election_started(before, self.machine.state(), cause) {
            self.metrics
                .elections_started
                .with_label_values(&[reason])
                .inc();
        }
    }

    async fn act(&mut self, actions: Vec<Action>) {
        if actions.is_empty() {
            return;
        }
        let epoch = self.machine.epoch();
        let id = self.machine.id().clone();
        let stamp = self
            .store
            .schedule
            .peek()
            .as_ref()
            .as_ref()
            .map(|s| ScheduleStamp {
                timestamp: s.timestamp,
                hash: s.hash.clone(),
                origin: s.origin.clone(),
            });
        let addrs: BTreeMap<String, SocketAddr> = self
            .store
            .peers
            .peek()
            .peers
            .iter()
            .filter_map(|(pid, p)| Some((pid.clone(), p.addr.as_ref()?.parse().ok()?)))
            .collect();
        // Only a follower's pong reports the error count.
        let errors = if actions.iter().any(|a| matches!(a, Action::Pong(_))) {
            self.errors()
        } else {
            0
        };
        for action in actions {
            let (packet, to) = transport::outgoing(action, &id, epoch, errors, stamp.as_ref());
            let targets: Vec<SocketAddr> = match to {
                To::All => addrs.values().copied().collect(),
                To::Peer(peer) => addrs.get(&peer).copied().into_iter().collect(),
            };
            let label = match packet.kind {
                Kind::Ping => "ping",
                Kind::Pong { .. } => "pong",
                Kind::Vote { .. } => "vote",
            };
            let bytes = match packet.encode_with(self.key.as_ref()) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(error = %e, "Cannot encode an election packet.");
                    continue;
                }
            };
            debug_assert!(bytes.len() <= MAX_PACKET);
            for to in targets {
                match self.socket.send_to(&bytes, to).await {
                    Ok(_) => self.metrics.messages_sent.with_label_values(&[label]).inc(),
                    Err(e) => {
                        self.metrics
                            .messages_dropped
                            .with_label_values(&["send_error"])
                            .inc();
                        tracing::debug!(%to, error = %e, "Cannot send an election packet.");
                    }
                }
            }
        }
    }

    /// What a follower reports in its pongs: the `num_errors` of its `/v1/status`.
    fn errors(&self) -> u64 {
        self.store.error_count() as u64
    }
}
