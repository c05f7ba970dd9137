//! The election over UDP: the sans-IO machine fed with packets from peers and with time, its
//! actions sent as verwalter 0.13's CBOR packets on the HTTP port. What is taken, counted and
//! sent where is decided in [`verwalter_controllers::cluster::election::transport`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::cluster::election::machine::{Effect, Machine, State};
use verwalter_controllers::cluster::election::transport::{self, Cause, To};
use verwalter_controllers::cluster::election::wire::{
    AuthKey, Kind, MAX_PACKET, Packet, WireError,
};
use verwalter_controllers::cluster::election::{self, ElectionState, StableWall};
use verwalter_controllers::machinery::clock::Clock;
use verwalter_controllers::machinery::store::Field;
use verwalter_controllers::node::Store;
use verwalter_controllers::state::{Reports, Schedule, ScheduleStamp};

use super::coding::Coding;
use super::peers::Liveness;
use super::replication::SharedSightings;
use super::vouch::{self, Announced};
use crate::http::SharedJson;
use crate::metrics::Metrics;

/// Sources of dropped packets warned about (the first packet of each); later ones, and sources
/// past this many, only at debug level, so that a flood of forged packets cannot flood the log.
const WARNED_SOURCES: usize = 64;

/// What the election task reads, writes and talks through (the wiring; no state of its own).
pub(crate) struct ElectionWiring {
    pub(crate) socket: Arc<UdpSocket>,
    pub(crate) store: Store,
    pub(crate) out: Field<ElectionState>,
    pub(crate) reports: Field<Reports>,
    pub(crate) live: Liveness,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
    /// Where the schedules of other nodes that peers report are noted for the fetcher.
    pub(crate) sightings: SharedSightings,
    /// Where the body hashes leaders announce are noted for the fetcher.
    pub(crate) announced: Arc<Announced>,
    /// The bodies this node serves its schedule in: a leader's pings announce the hash of the
    /// LZ4 one.
    pub(crate) schedule_json: Arc<SharedJson<Option<Schedule>>>,
}

/// The UDP transport around the election machine.
pub(crate) struct ElectionTask {
    machine: Machine,
    io: ElectionWiring,
    /// `allow-minority-cluster`: peers not heard from directly for this long do not count.
    /// The machine keeps leading without a majority exactly when this is set.
    minority_window: Option<Duration>,
    /// `election.key-file`: packets are tagged, and only tagged ones taken.
    key: Option<AuthKey>,
    /// The stamp of this node's own schedule, and the SHA-1 of its LZ4 body, which its pings
    /// announce (see [`crate::cluster::vouch`]). Keyed by the whole stamp: a restamped schedule
    /// (same hash, new timestamp) is served in another body.
    lz4_sha1: Option<(ScheduleStamp, [u8; 20])>,
}

impl ElectionTask {
    /// The task for `machine`; with `minority_window` (allow-minority-cluster) the machine keeps
    /// leading without a majority, and only peers heard from within the window count.
    pub(crate) fn new(
        machine: Machine,
        io: ElectionWiring,
        minority_window: Option<Duration>,
        key: Option<AuthKey>,
    ) -> ElectionTask {
        ElectionTask {
            machine: machine.keep_leading_without_majority(minority_window.is_some()),
            io,
            minority_window,
            key,
            lz4_sha1: None,
        }
    }

    /// Runs until shutdown.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut stable = StableWall::default();
        let mut warned = std::collections::BTreeSet::new();
        let mut schedule = self.io.store.schedule.clone();
        schedule.get();
        loop {
            let deadline = self.machine.deadline();
            let is_leader = matches!(self.machine.state(), State::Leader { .. });
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = self.io.socket.recv_from(&mut buf) => {
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
                    self.act(vec![Effect::PingAll]).await;
                }
            }
            let view = election::view(
                &self.machine,
                Instant::now(),
                self.io.clock.now_ms(),
                &mut stable,
            );
            election::publish(&self.io.out, view);
        }
    }

    /// Peers that count for the vote.
    fn peer_count(&self) -> usize {
        let window = self.minority_window;
        let peers = self.io.store.peers.peek();
        let now_ms = self.io.clock.now_ms();
        self.io
            .live
            .with_heard(|heard| transport::voters(&peers, window, now_ms, heard))
    }

    fn hosts_fresh(&self) -> bool {
        let last = Some(self.io.live.last_refresh()).filter(|t| *t != 0);
        transport::hosts_fresh(last, self.io.clock.now_ms())
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
                self.io.metrics.message_dropped(reason);
                tracing::debug!(from = %from_addr, error = %e, "Dropped a bad election packet.");
                return;
            }
        };
        let admitted = transport::admit(
            self.machine.id(),
            &packet,
            from_addr,
            &self.io.store.peers.peek(),
        );
        if let Err(dropped) = admitted {
            if let Some(label) = dropped.label() {
                self.io.metrics.message_dropped(label);
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
            Kind::PreVote { .. } => "pre_vote",
        };
        self.io.metrics.message_received(kind);
        let now_ms = self.io.clock.now_ms();
        self.io.live.packet(&packet.from, now_ms);
        if let (Some(body), Some(stamp)) = (packet.lz4_sha1, &packet.schedule)
            && stamp.origin == packet.from
        {
            self.io.announced.note(&stamp.hash, &packet.from, body);
        }
        if let Some(stamp) = transport::sighting(self.machine.id(), &packet) {
            self.io
                .sightings
                .lock()
                .unwrap()
                .saw(&packet.from, stamp, now_ms);
        }
        if transport::from_my_leader(self.machine.state(), &packet) {
            self.io.metrics.leader_contact(now_ms);
        }
        let report = transport::report(&packet, self.io.store.reports.peek().get(&packet.from));
        if self.io.store.reports.peek().get(&packet.from) != Some(&report) {
            self.io.reports.update(|all| {
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

    /// Makes the hash of the LZ4 body of this node's own schedule `stamp` (once per schedule),
    /// for its pings to announce. The body is the one `/v1/schedule` serves (made here on a
    /// blocking thread, a megabyte takes milliseconds, before the followers ask for it).
    async fn make_lz4_sha1(&mut self, stamp: Option<&ScheduleStamp>, own: &str) {
        let Some(stamp) = stamp.filter(|s| s.origin == own) else {
            return;
        };
        if self
            .lz4_sha1
            .as_ref()
            .is_some_and(|(made, _)| made == stamp)
        {
            return;
        }
        let snapshot = self.io.store.schedule.peek();
        if snapshot.as_ref().as_ref().map(Schedule::stamp).as_ref() != Some(stamp) {
            return;
        }
        let bodies = self.io.schedule_json.clone();
        let made = tokio::task::spawn_blocking(move || {
            vouch::body_sha1(&bodies.encoded(&snapshot, Coding::Lz4))
        });
        match made.await {
            Ok(body) => self.lz4_sha1 = Some((stamp.clone(), body)),
            Err(e) => tracing::warn!(error = %e, "Could not make the schedule's LZ4 body."),
        }
    }

    /// Counts an election this node started, by why.
    fn count_election(&self, before: &State, cause: Cause) {
        if let Some(reason) = transport::election_started(before, self.machine.state(), cause) {
            self.io.metrics.election_started(reason);
        }
    }

    async fn act(&mut self, actions: Vec<Effect>) {
        if actions.is_empty() {
            return;
        }
        let epoch = self.machine.epoch();
        let id = self.machine.id().clone();
        let stamp = self
            .io
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
        if actions.contains(&Effect::PingAll) {
            self.make_lz4_sha1(stamp.as_ref(), &id).await;
        }
        // Only the body of the very stamp announced (an older one's body differs).
        let lz4_sha1 = self
            .lz4_sha1
            .as_ref()
            .filter(|(made, _)| Some(made) == stamp.as_ref())
            .map(|(made, body)| (made.hash.as_str(), *body));
        let addrs: BTreeMap<String, SocketAddr> = self
            .io
            .store
            .peers
            .peek()
            .peers
            .iter()
            .filter_map(|(pid, p)| Some((pid.clone(), p.addr.as_ref()?.parse().ok()?)))
            .collect();
        // Only a follower's pong reports the error count.
        let errors = if actions.iter().any(|a| matches!(a, Effect::Pong(_))) {
            self.errors()
        } else {
            0
        };
        for action in actions {
            let (packet, to) =
                transport::outgoing(action, &id, epoch, errors, stamp.as_ref(), lz4_sha1);
            let targets: Vec<SocketAddr> = match to {
                To::All => addrs.values().copied().collect(),
                To::Peer(peer) => addrs.get(&peer).copied().into_iter().collect(),
            };
            let label = match packet.kind {
                Kind::Ping => "ping",
                Kind::Pong { .. } => "pong",
                Kind::Vote { .. } => "vote",
                Kind::PreVote { .. } => "pre_vote",
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
                match self.io.socket.send_to(&bytes, to).await {
                    Ok(_) => self.io.metrics.message_sent(label),
                    Err(e) => {
                        self.io.metrics.message_dropped("send_error");
                        tracing::debug!(%to, error = %e, "Cannot send an election packet.");
                    }
                }
            }
        }
    }

    /// What a follower reports in its pongs: the `num_errors` of its `/v1/status`.
    fn errors(&self) -> u64 {
        verwalter_controllers::status::error_count(&self.io.store) as u64
    }
}
