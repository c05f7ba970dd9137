//! The election over UDP: the sans-IO machine fed with packets from peers and with time, its
//! actions sent as verwalter 0.13's CBOR packets on the HTTP port.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::election::machine::{Action, MAX_EPOCH, Machine, Message, State};
use verwalter_controllers::election::wire::{AuthKey, Kind, MAX_PACKET, Packet, WireError};
use verwalter_controllers::election::{self, ElectionState, StableWall};
use verwalter_controllers::ports::Clock;
use verwalter_controllers::state::{Report, Reports, ScheduleStamp};
use verwalter_controllers::store::{Field, Store};

use super::fetch::SharedSightings;
use super::peers::Liveness;
use crate::metrics::Metrics;

/// Sources of dropped packets warned about (the first packet of each); later ones, and sources
/// past this many, only at debug level, so that a flood of forged packets cannot flood the log.
const WARNED_SOURCES: usize = 64;

/// The peer list counts as stale (and elections stop) when not refreshed for this long.
const HOSTS_FRESH: Duration = Duration::from_millis(1500);

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
                    self.count_election(&before, "timeout");
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
        let peers = self.store.peers.peek();
        if self.allow_minority {
            let since = self
                .clock
                .now_ms()
                .saturating_sub(self.minority_window.as_millis() as u64);
            self.live.heard_since(peers.peers.keys(), since)
        } else {
            peers.peers.len()
        }
    }

    fn hosts_fresh(&self) -> bool {
        let last = self.live.last_refresh();
        last != 0 && self.clock.now_ms().saturating_sub(last) <= HOSTS_FRESH.as_millis() as u64
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
        if packet.from == *self.machine.id() {
            return;
        }
        // Only listed peers, from their own address, take part: anyone else could move
        // leadership with one forged packet, and an answer to them would let them aim our
        // (larger) pongs at a spoofed source.
        if !self.is_peer(&packet.from, from_addr) {
            self.metrics
                .messages_dropped
                .with_label_values(&["unknown_peer"])
                .inc();
            let ip = from_addr.ip().to_canonical();
            if warned.len() < WARNED_SOURCES && warned.insert(ip) {
                tracing::warn!(from = %from_addr, id = %packet.from, "Dropped an election packet from a node that is not a listed peer at that address (only the first from this address is logged).");
            } else {
                tracing::debug!(from = %from_addr, id = %packet.from, "Dropped an election packet from a node that is not a listed peer at that address.");
            }
            return;
        }
        if packet.epoch > MAX_EPOCH {
            self.metrics
                .messages_dropped
                .with_label_values(&["bad_epoch"])
                .inc();
            tracing::debug!(from = %from_addr, epoch = packet.epoch, "Dropped an election packet with an impossible epoch.");
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
        if let Some(stamp) = &packet.schedule
            && stamp.origin != *self.machine.id()
        {
            self.sightings
                .lock()
                .unwrap()
                .saw(&packet.from, stamp, now_ms);
        }
        let from_leader = matches!(self.machine.state(), State::Follower { leader, .. } if *leader == packet.from);
        if matches!(packet.kind, Kind::Ping) && from_leader {
            self.metrics
                .leader_contact_ms
                .store(now_ms, Ordering::Relaxed);
        }
        let errors = match packet.kind {
            Kind::Pong { errors } => errors,
            _ => self
                .store
                .reports
                .peek()
                .get(&packet.from)
                .map_or(0, |r| r.errors),
        };
        let report = Report {
            schedule: packet.schedule.clone(),
            errors,
            epoch: packet.epoch,
        };
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
        let reason = match (&before, &message) {
            (State::Leader { .. }, Message::Ping) => "two_leaders",
            (_, Message::Pong) => "pong",
            _ => "message",
        };
        self.count_election(&before, reason);
        self.act(actions).await;
    }

    /// Whether `id` is in the peer list with an address of the IP the packet came from (the port
    /// is not compared: it is the peer's, but a NAT may change it). A peer without an address
    /// cannot be checked, so it is not trusted either.
    fn is_peer(&self, id: &str, from: SocketAddr) -> bool {
        let peers = self.store.peers.peek();
        peers
            .peers
            .get(id)
            .and_then(|p| p.addr.as_deref()?.parse::<SocketAddr>().ok())
            .is_some_and(|addr| addr.ip().to_canonical() == from.ip().to_canonical())
    }

    /// Counts an election this node started, by why.
    fn count_election(&self, before: &State, reason: &'static str) {
        let State::Electing { epoch, .. } = self.machine.state() else {
            return;
        };
        let was = match before {
            State::Electing { epoch: e, .. } if e == epoch => return, // still the same one
            State::Starting { .. } => "start",
            State::Follower { .. } if reason == "timeout" => "leader_timeout",
            State::Electing { .. } if reason == "timeout" => "election_timeout",
            State::Voted { .. } if reason == "timeout" => "vote_timeout",
            State::Leader { .. } if reason == "timeout" => "lost_majority",
            _ => reason,
        };
        self.metrics
            .elections_started
            .with_label_values(&[was])
            .inc();
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
        let addr_of = |peer: &String| addrs.get(peer).copied();
        for action in actions {
            let (kind, targets): (Kind, Vec<SocketAddr>) = match action {
                Action::PingAll => (Kind::Ping, addrs.values().copied().collect()),
                Action::Vote => (
                    Kind::Vote { target: id.clone() },
                    addrs.values().copied().collect(),
                ),
                Action::ConfirmVote(candidate) => {
                    let to = addr_of(&candidate).into_iter().collect();
                    (Kind::Vote { target: candidate }, to)
                }
                Action::Pong(leader) => {
                    let to = addr_of(&leader).into_iter().collect();
                    (
                        Kind::Pong {
                            errors: self.errors(),
                        },
                        to,
                    )
                }
            };
            let label = match kind {
                Kind::Ping => "ping",
                Kind::Pong { .. } => "pong",
                Kind::Vote { .. } => "vote",
            };
            // A leader's ping carries only a schedule it produced itself: that is what its
            // followers fetch (its copy of an older leader's schedule is not theirs to take).
            let schedule = match kind {
                Kind::Ping => stamp.clone().filter(|s| s.origin == id),
                _ => stamp.clone(),
            };
            let packet = Packet {
                from: id.clone(),
                epoch,
                schedule,
                kind,
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
