//! Leadership on etcd (docs/etcd.md): the adapter around the pure machine
//! [`verwalter_controllers::cluster::etcd::Machine`]. It carries out the machine's effects with
//! the `etcd-client` crate (a lease and its keep-alive stream, the campaign, publish and resign
//! transactions, a read of both keys, a watch on the prefix), feeds the answers back with the
//! times they were sent, and puts the outcome where the built-in election's goes: the store's
//! election state (the leader runs the scheduler; its fence deadline ends that) and, for a
//! published schedule the machine accepts, the leader's report, from which the fetcher takes
//! it as it does today. It also listens on the built-in election's UDP port, without ever
//! sending: a built-in leader's ping takes precedence while a cluster moves between the
//! backends (docs/etcd.md, "Moving between backends").

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, KeyValue, PutOptions, TlsOptions, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::cluster::election::transport;
use verwalter_controllers::cluster::election::wire::{AuthKey, Kind, Packet, WireError};
use verwalter_controllers::cluster::election::{self, ElectionState};
use verwalter_controllers::cluster::etcd::builtin;
use verwalter_controllers::cluster::etcd::wire::{LeaderValue, MAX_INLINE_BYTES, ScheduleValue};
use verwalter_controllers::cluster::etcd::{
    Change, Config as MachineConfig, Effect, Input, LeaderKey, Machine, Made, Millis, Published,
    Refused, ScheduleKey, StepDown, View,
};
use verwalter_controllers::machinery::clock::Clock;
use verwalter_controllers::machinery::store::Field;
use verwalter_controllers::node::Store;
use verwalter_controllers::state::{Report, Reports, Schedule, ScheduleStamp};

use crate::cluster::coding::Coding;
use crate::cluster::replication::InlineBodies;
use crate::config::EtcdSettings;
use crate::metrics::Metrics;

/// One request may take this long before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A watch that ended is opened again after this (a down etcd is not asked in a tight loop).
const REWATCH_PAUSE: Duration = Duration::from_millis(200);

/// The etcd backend's part of `/v1/status` and `/v1/election` (`etcd`): the machine's view,
/// the prefix and endpoints, and the last publish this node made.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct EtcdView {
    #[serde(flatten)]
    pub(crate) machine: View,
    pub(crate) prefix: String,
    pub(crate) endpoints: Vec<String>,
    /// The last publish this node made.
    pub(crate) published: Option<Publish>,
    /// The built-in election leader this node defers to, while one is heard.
    pub(crate) deferring: Option<Deferring>,
}

/// A built-in leader deferred to: its node and epoch, and since when (wall ms).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Deferring {
    pub(crate) node: String,
    pub(crate) epoch: u64,
    pub(crate) since: u64,
}

/// The built-in election's port, listened on without ever sending (docs/etcd.md, "Moving
/// between backends"): packets are decoded with the cluster's key and admitted from listed
/// peers at their addresses exactly as the built-in election does, and a leader's ping goes
/// to the machine.
pub(crate) struct BuiltinEars {
    pub(crate) socket: UdpSocket,
    /// `election.key-file`: only tagged packets are taken.
    pub(crate) key: Option<AuthKey>,
    /// `leader-timeout-min-ms`: a built-in leader heard within it takes precedence.
    pub(crate) timeout: Duration,
}

/// A schedule this node published, under which leadership revision.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Publish {
    pub(crate) leader_rev: i64,
    pub(crate) hash: String,
    /// Whether the schedule went inline in the value (`data`).
    pub(crate) inline: bool,
}

/// What the task reads, writes and talks through.
pub(crate) struct EtcdWiring {
    pub(crate) store: Store,
    pub(crate) out: Field<ElectionState>,
    pub(crate) reports: Field<Reports>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) view: crate::http::BackendView,
    /// This node's id and the address of its HTTP API (the value of `P/leader`).
    pub(crate) node: String,
    pub(crate) addr: String,
    pub(crate) builtin: BuiltinEars,
    /// `/v1/schedule`'s bodies: the leader puts the LZ4 one inline when it is small enough.
    pub(crate) schedule_json: Arc<crate::http::SharedJson<Option<Schedule>>>,
    /// Where a follower puts a schedule that came inline, for the fetcher.
    pub(crate) inline: Arc<InlineBodies>,
}

/// The task: one machine, one client.
pub(crate) struct EtcdTask {
    settings: EtcdSettings,
    io: EtcdWiring,
    machine: Machine,
    start: Instant,
    client: Client,
    answers: mpsc::UnboundedSender<Input>,
    /// The keep-alive stream of the lease held (its asks).
    keeper: Option<(i64, mpsc::UnboundedSender<Millis>)>,
    /// The watch running, stopped when another is asked for.
    watch: Option<CancellationToken>,
    /// The leadership revision this node acted as leader in, as last published to the store.
    acting: Option<i64>,
    /// When the known leader last changed (wall ms), for `last_stable_timestamp`.
    stable_since: Option<(Option<String>, u64)>,
    /// The schedule last handed to the machine, and its LZ4 body in base64 when that may fit
    /// in `P/schedule` (docs/etcd.md, "Keys").
    made: Option<(String, Option<String>)>,
    published: Option<Publish>,
    /// Whether the last request reached etcd.
    reachable: bool,
    metrics: Arc<EtcdMetrics>,
    /// The TTL etcd granted the lease held.
    granted_ms: Millis,
}

/// A request to etcd, answered as the machine's input.
type Ask = std::pin::Pin<Box<dyn Future<Output = Result<Input, etcd_client::Error>> + Send>>;

/// The transaction that deletes `P/leader` if it is still the leadership `leader_rev` created.
fn resign(prefix: &str, leader_rev: i64) -> Txn {
    let leader = key(prefix, "leader");
    Txn::new()
        .when([Compare::create_revision(
            leader.clone(),
            CompareOp::Equal,
            leader_rev,
        )])
        .and_then([TxnOp::delete(leader, None)])
}

fn key(prefix: &str, name: &str) -> String {
    format!("{prefix}/{name}")
}

/// Whole seconds for etcd's TTL, rounded up.
fn ttl_secs(ttl: Duration) -> i64 {
    ttl.as_millis().div_ceil(1000).max(1) as i64
}

/// The client for `settings`: endpoints, TLS, authentication.
async fn connect(settings: &EtcdSettings) -> Result<Client, etcd_client::Error> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_secs(1), REQUEST_TIMEOUT);
    let tls = settings.tls_ca.is_some() || settings.tls_identity.is_some();
    if tls {
        let mut config = TlsOptions::new();
        if let Some(ca) = &settings.tls_ca {
            config = config.ca_certificate(etcd_client::Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &settings.tls_identity {
            config = config.identity(etcd_client::Identity::from_pem(cert, key));
        }
        options = options.with_tls(config);
    }
    if let Some((user, password)) = &settings.auth {
        options = options.with_user(user.clone(), password.clone());
    }
    let endpoints: Vec<String> = settings
        .endpoints
        .iter()
        .map(|e| {
            if e.contains("://") {
                e.clone()
            } else if tls {
                format!("https://{e}")
            } else {
                format!("http://{e}")
            }
        })
        .collect();
    // Connects lazily: a member that is down now is tried again on every request.
    Client::connect(endpoints, Some(options)).await
}

/// `P/leader` from a key-value as etcd gives it (the lease and create revision are etcd's).
fn leader_of(kv: &KeyValue, prefix: &str) -> Option<LeaderKey> {
    match LeaderValue::decode(
        &key(prefix, "leader"),
        kv.value(),
        kv.lease(),
        kv.create_revision(),
    ) {
        Ok((_, leader)) => Some(leader),
        Err(e) => {
            tracing::warn!(error = %e, "Ignored a value of the leader key.");
            None
        }
    }
}

fn schedule_of(kv: &KeyValue, prefix: &str) -> Option<ScheduleKey> {
    match ScheduleValue::decode(&key(prefix, "schedule"), kv.value(), kv.mod_revision()) {
        Ok(schedule) => Some(schedule),
        Err(e) => {
            tracing::warn!(error = %e, "Ignored a value of the schedule key.");
            None
        }
    }
}

impl EtcdTask {
    /// Connects (lazily) and starts the machine.
    pub(crate) async fn start(
        settings: EtcdSettings,
        io: EtcdWiring,
    ) -> Result<(EtcdTask, mpsc::UnboundedReceiver<Input>), String> {
        let client = connect(&settings)
            .await
            .map_err(|e| format!("election.etcd: cannot set up the etcd client: {e}"))?;
        let start = Instant::now();
        let config = MachineConfig {
            node: io.node.clone(),
            ttl_ms: settings.lease_ttl.as_millis() as Millis,
            margin_ms: settings.fence_margin.map(|m| m.as_millis() as Millis),
            builtin_timeout_ms: Some(io.builtin.timeout.as_millis() as Millis),
        };
        let (machine, first) = Machine::new(config, 0);
        let (answers, rx) = mpsc::unbounded_channel();
        let metrics = Arc::new(EtcdMetrics::register(io.metrics.registry()));
        let mut task = EtcdTask {
            settings,
            io,
            machine,
            start,
            client,
            answers,
            keeper: None,
            watch: None,
            acting: None,
            stable_since: None,
            made: None,
            published: None,
            reachable: true,
            metrics,
            granted_ms: 0,
        };
        task.act(first);
        Ok((task, rx))
    }

    fn now(&self) -> Millis {
        self.start.elapsed().as_millis() as Millis
    }

    /// Runs until shutdown; then resigns and revokes the lease (within a second).
    pub(crate) async fn run(
        mut self,
        mut answers: mpsc::UnboundedReceiver<Input>,
        shutdown: CancellationToken,
    ) {
        let mut schedule = self.io.store.schedule.clone();
        self.schedule_made(&schedule.get());
        self.publish_state();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let wake = self.machine.next_wakeup();
            let at = self.start + Duration::from_millis(wake.min(self.now() + 60_000));
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(input) = answers.recv() => {
                    self.reachable = !matches!(
                        input,
                        Input::LeaseGrantFailed | Input::CampaignFailed | Input::ReadFailed | Input::PublishFailed
                    );
                    if let Input::LeaseGranted { ttl_ms, .. } = &input {
                        self.granted_ms = *ttl_ms;
                    }
                    self.handle(input);
                }
                _ = schedule.changed() => {
                    let held = schedule.get();
                    self.schedule_made(&held);
                }
                got = self.io.builtin.socket.recv_from(&mut buf) => {
                    match got {
                        Ok((n, from)) => self.builtin_packet(&buf[..n], from),
                        Err(e) => tracing::debug!(error = %e, "UDP receive failed."),
                    }
                }
                _ = tokio::time::sleep_until(at) => self.handle(Input::Tick),
            }
            self.publish_state();
        }
        let now = self.now();
        let last = self.machine.shutdown(now);
        self.publish_state();
        let _ = tokio::time::timeout(Duration::from_secs(1), self.finish(last)).await;
    }

    /// A packet on the built-in election's port: decoded, admitted and counted as the built-in
    /// election does; a leader's ping goes to the machine. Nothing is ever answered.
    fn builtin_packet(&mut self, bytes: &[u8], from: std::net::SocketAddr) {
        let metrics = &self.io.metrics;
        let packet = match Packet::decode_with(bytes, self.io.builtin.key.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                let reason = match e {
                    WireError::BadTag => "bad_auth",
                    _ => "decode",
                };
                metrics.message_dropped(reason);
                tracing::debug!(%from, error = %e, "Dropped a bad election packet.");
                return;
            }
        };
        let peers = self.io.store.peers.peek();
        if let Err(dropped) = transport::admit(&self.io.node, &packet, from, &peers) {
            if let Some(label) = dropped.label() {
                metrics.message_dropped(label);
            }
            tracing::debug!(%from, id = %packet.from, ?dropped, "Dropped an election packet.");
            return;
        }
        metrics.message_received(match packet.kind {
            Kind::Ping => "ping",
            Kind::Pong { .. } => "pong",
            Kind::Vote { .. } => "vote",
            Kind::PreVote { .. } => "pre_vote",
        });
        if let Some(input) = builtin::heard(&packet) {
            self.handle(input);
        }
    }

    fn handle(&mut self, input: Input) {
        let now = self.now();
        let effects = self.machine.handle(now, input);
        self.act(effects);
    }

    /// A schedule this node made is handed to the machine, which publishes it while leading.
    fn schedule_made(&mut self, held: &Arc<Option<Schedule>>) {
        let Some(s) = held.as_ref().as_ref().filter(|s| s.origin == self.io.node) else {
            return;
        };
        if self.made.as_ref().is_some_and(|(made, _)| *made == s.hash) {
            return;
        }
        // The body `/v1/schedule` serves (made once per schedule, shared with the HTTP API);
        // base64 makes four bytes of three: a body past the cap that way cannot fit.
        let body = self.io.schedule_json.encoded(held, Coding::Lz4);
        let data = (body.len().div_ceil(3) * 4 <= MAX_INLINE_BYTES).then(|| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(&body)
        });
        self.made = Some((s.hash.clone(), data));
        let size = serde_json::to_vec(&s.data).map_or(0, |b| b.len() as u64);
        self.handle(Input::ScheduleMade(Made {
            hash: s.hash.clone(),
            origin: s.origin.clone(),
            size,
        }));
    }

    /// The store's election state and the status view, from the machine now.
    fn publish_state(&mut self) {
        let now = self.now();
        let acting = self.machine.acting_leader(now);
        let known = self.machine.leader().cloned();
        let wall = self.io.clock.now_ms();
        let deferring = self.machine.deferring(now).map(|d| Deferring {
            node: d.node.clone(),
            epoch: d.epoch,
            since: wall.saturating_sub(now.saturating_sub(d.since)),
        });
        // A built-in leader heard takes precedence: it is the leader this node follows.
        let leader = match (&acting, &deferring, &known) {
            (Some(_), _, _) => Some(self.io.node.clone()),
            (None, Some(d), _) => Some(d.node.clone()),
            (None, None, Some(k)) if k.node != self.io.node => Some(k.node.clone()),
            _ => None,
        };
        if self.stable_since.as_ref().is_none_or(|(l, _)| *l != leader) {
            self.stable_since = Some((leader.clone(), wall));
        }
        let wake = self.machine.next_wakeup().min(now + 60_000);
        let state = ElectionState {
            is_leader: acting.is_some(),
            is_stable: leader.is_some(),
            leader: leader.clone(),
            epoch: match (&acting, &deferring) {
                (None, Some(d)) => d.epoch,
                _ => known.as_ref().map_or(0, |k| k.create_rev.max(0) as u64),
            },
            deadline: wall + wake.saturating_sub(now),
            last_stable_timestamp: leader
                .as_ref()
                .and(self.stable_since.as_ref().map(|(_, at)| *at)),
            ..ElectionState::default()
        };
        election::publish(&self.io.out, state);
        self.acting = acting;
        let mut machine = self.machine.view(now);
        machine.connected = self.reachable;
        let left = machine.lease_left_ms.unwrap_or(0);
        self.metrics.lease_left.set(left as f64 / 1000.0);
        let view = EtcdView {
            machine,
            prefix: self.settings.prefix.clone(),
            endpoints: self.settings.endpoints.clone(),
            published: self.published.clone(),
            deferring,
        };
        *self.io.view.lock().unwrap() = serde_json::to_value(view).ok();
    }

    fn act(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            self.effect(effect);
        }
    }

    /// Starts the request `effect` asks for; its answer comes back on the channel.
    fn effect(&mut self, effect: Effect) {
        let prefix = self.settings.prefix.clone();
        let mut client = self.client.clone();
        let sent_at = self.now();
        match effect {
            Effect::GrantLease { ttl_ms } => {
                let ttl = ttl_secs(Duration::from_millis(ttl_ms));
                let ask = async move {
                    let answer = client.lease_grant(ttl, None).await?;
                    Ok(Input::LeaseGranted {
                        lease: answer.id(),
                        ttl_ms: answer.ttl().max(0) as Millis * 1000,
                        sent_at,
                    })
                };
                self.send(Box::pin(ask), Input::LeaseGrantFailed);
            }
            Effect::KeepAlive { lease } => self.keep_alive(lease, sent_at),
            Effect::RevokeLease { lease } => {
                if self.keeper.as_ref().is_some_and(|(id, _)| *id == lease) {
                    self.keeper = None;
                }
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, client.lease_revoke(lease)).await;
                });
            }
            Effect::Campaign { lease } => self.campaign(lease),
            Effect::Read => self.read(),
            Effect::Watch { from_rev } => self.watch(from_rev),
            Effect::Publish { value } => self.publish(value),
            Effect::Resign { leader_rev } => {
                tokio::spawn(async move {
                    let txn = resign(&prefix, leader_rev);
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, client.txn(txn)).await;
                });
            }
            Effect::BecameLeader { leader_rev } => {
                tracing::info!(leader_rev, "Leading on etcd.");
            }
            Effect::SteppedDown { leader_rev, reason } => {
                tracing::warn!(leader_rev, ?reason, "Stepped down as leader on etcd.");
                self.metrics
                    .step_downs
                    .with_label_values(&[step_down_label(reason)])
                    .inc();
            }
            Effect::Fetch {
                hash,
                origin,
                from,
                inline,
            } => self.fetch(hash, origin, from, inline),
            Effect::Ignored { reason } => {
                tracing::warn!(?reason, key = %key(&prefix, "schedule"), "Ignored a value on etcd.");
                self.metrics
                    .ignored
                    .with_label_values(&[ignored_label(reason)])
                    .inc();
            }
            Effect::Deferring { node, epoch } => {
                tracing::info!(leader = %node, epoch, "A built-in election leader is heard; deferring to it.");
                self.metrics.deferrals.inc();
            }
            Effect::DeferralEnded { node } => {
                tracing::info!(leader = %node, "The built-in election leader is no longer heard; electing on etcd.");
            }
            Effect::WatchRestarted { compacted } => {
                let reason = if compacted { "compacted" } else { "error" };
                self.metrics
                    .watch_restarts
                    .with_label_values(&[reason])
                    .inc();
            }
        }
    }

    /// Publishes `value` in a transaction guarded by this node's leadership, with the schedule
    /// inline when it fits.
    fn publish(&mut self, value: Published) {
        let prefix = self.settings.prefix.clone();
        let mut client = self.client.clone();
        let rev = value.leader_rev;
        let data = match &self.made {
            Some((hash, data)) if *hash == value.hash => data.clone(),
            _ => None,
        };
        let (bytes, inline) = ScheduleValue::encode(&value, data);
        self.published = Some(Publish {
            leader_rev: rev,
            hash: value.hash.clone(),
            inline,
        });
        let ask = async move {
            let leader = key(&prefix, "leader");
            let txn = Txn::new()
                .when([Compare::create_revision(leader, CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key(&prefix, "schedule"), bytes, None)]);
            let answer = client.txn(txn).await?;
            Ok(Input::PublishAnswered {
                ok: answer.succeeded(),
            })
        };
        self.send(Box::pin(ask), Input::PublishFailed);
    }

    /// A schedule the machine took: inline, offered to the fetcher; the leader's report, from
    /// which the fetcher takes it (or fetches it).
    fn fetch(&mut self, hash: String, origin: String, from: String, inline: Option<String>) {
        if let Some(text) = inline {
            self.offer_inline(&hash, &text);
        }
        let builtin = self.machine.deferring(self.now()).is_some();
        let what = if builtin {
            "The built-in election leader announced a schedule."
        } else {
            "The leader published a schedule on etcd."
        };
        tracing::info!(%hash, %origin, leader = %from, "{what}");
        let now = self.now();
        let epoch = match self.machine.deferring(now) {
            Some(d) if d.node == from => d.epoch,
            _ => self
                .machine
                .leader()
                .map_or(0, |k| k.create_rev.max(0) as u64),
        };
        self.io.reports.update(|all| {
            all.insert(
                from,
                Report {
                    schedule: Some(ScheduleStamp {
                        timestamp: 0,
                        hash,
                        origin,
                    }),
                    errors: 0,
                    epoch,
                },
            );
        });
    }

    /// The schedule `hash` inline in an accepted `P/schedule` (base64 of its LZ4 body), for the
    /// fetcher to take before it asks the leader; text that is not base64 is refused here.
    fn offer_inline(&self, hash: &str, text: &str) {
        use base64::Engine;
        match base64::engine::general_purpose::STANDARD.decode(text) {
            Ok(body) => self.io.inline.offer(hash, body.into()),
            Err(e) => {
                self.io.inline.refused();
                tracing::warn!(%hash, error = %e, "Refused the schedule inline on etcd (not base64); fetching it from the leader.");
            }
        }
    }

    /// Runs `ask` within [`REQUEST_TIMEOUT`]; its answer, or `failed`, goes back to the task.
    fn send(&self, ask: Ask, failed: Input) {
        let answers = self.answers.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let began = std::time::Instant::now();
            let input = match tokio::time::timeout(REQUEST_TIMEOUT, ask).await {
                Ok(Ok(input)) => {
                    metrics.rtt.observe(began.elapsed().as_secs_f64());
                    input
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "An etcd request failed.");
                    failed
                }
                Err(_) => failed,
            };
            let _ = answers.send(input);
        });
    }

    /// A linearizable read of both keys in one transaction (one revision).
    fn read(&self) {
        let prefix = self.settings.prefix.clone();
        let mut client = self.client.clone();
        let ask = async move {
            let txn = Txn::new().and_then([
                TxnOp::get(key(&prefix, "leader"), None),
                TxnOp::get(key(&prefix, "schedule"), None),
            ]);
            let answer = client.txn(txn).await?;
            let revision = answer.header().map_or(0, |h| h.revision());
            let ops = answer.op_responses();
            let first = |i: usize| match ops.get(i) {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
                _ => None,
            };
            Ok(Input::Read {
                revision,
                leader: first(0).and_then(|kv| leader_of(&kv, &prefix)),
                schedule: first(1).and_then(|kv| schedule_of(&kv, &prefix)),
            })
        };
        self.send(Box::pin(ask), Input::ReadFailed);
    }

    /// `txn(if create_revision(P/leader) == 0 then put(P/leader, me, lease) else get(P/leader))`.
    fn campaign(&self, lease: i64) {
        let prefix = self.settings.prefix.clone();
        let mut client = self.client.clone();
        let leader = key(&prefix, "leader");
        let value = LeaderValue::new(&self.io.node, &self.io.addr, &rfc3339_now()).encode();
        let node = self.io.node.clone();
        let ask = async move {
            let put = Some(PutOptions::new().with_lease(lease));
            let txn = Txn::new()
                .when([Compare::create_revision(
                    leader.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([TxnOp::put(leader.clone(), value, put)])
                .or_else([TxnOp::get(leader, None)]);
            let answer = client.txn(txn).await?;
            let revision = answer.header().map_or(0, |h| h.revision());
            let holder = if answer.succeeded() {
                Some(LeaderKey {
                    node,
                    lease,
                    create_rev: revision,
                })
            } else {
                answer.op_responses().iter().find_map(|op| match op {
                    TxnOpResponse::Get(get) => {
                        get.kvs().first().and_then(|kv| leader_of(kv, &prefix))
                    }
                    _ => None,
                })
            };
            Ok(match holder {
                Some(holder) => Input::Campaigned { holder, revision },
                None => Input::CampaignFailed,
            })
        };
        self.send(Box::pin(ask), Input::CampaignFailed);
    }

    /// Sends a keep-alive on the lease's stream, opening it first when needed.
    fn keep_alive(&mut self, lease: i64, sent_at: Millis) {
        if let Some((id, asks)) = &self.keeper
            && *id == lease
            && asks.send(sent_at).is_ok()
        {
            return;
        }
        let (asks, rx) = mpsc::unbounded_channel();
        self.keeper = Some((lease, asks));
        let stream = KeepAliveStream {
            client: self.client.clone(),
            lease,
            granted_ms: self.granted_ms,
            answers: self.answers.clone(),
            metrics: self.metrics.clone(),
        };
        tokio::spawn(stream.run(sent_at, rx));
    }

    /// Watches the prefix from `from_rev`, replacing the watch running.
    fn watch(&mut self, from_rev: i64) {
        if let Some(old) = self.watch.take() {
            old.cancel();
        }
        let stop = CancellationToken::new();
        self.watch = Some(stop.clone());
        tokio::spawn(watch_prefix(
            self.client.clone(),
            self.settings.prefix.clone(),
            from_rev,
            self.answers.clone(),
            stop,
        ));
    }

    /// The last effects (resign, revoke) carried out and awaited.
    async fn finish(&mut self, effects: Vec<Effect>) {
        let prefix = &self.settings.prefix;
        for effect in effects {
            match effect {
                Effect::Resign { leader_rev } => {
                    let _ = self.client.txn(resign(prefix, leader_rev)).await;
                }
                Effect::RevokeLease { lease } => {
                    let _ = self.client.lease_revoke(lease).await;
                }
                _ => {}
            }
        }
    }
}

fn ignored_label(reason: Refused) -> &'static str {
    match reason {
        Refused::NoLeader => "no_leader",
        Refused::WrongLeadership => "wrong_leadership",
        Refused::WrongLease => "wrong_lease",
        Refused::BeforeLeadership => "before_leadership",
        Refused::RevisionWentBack => "revision_went_back",
    }
}

fn step_down_label(reason: StepDown) -> &'static str {
    match reason {
        StepDown::Fence => "fence",
        StepDown::LeaseLost => "lease_lost",
        StepDown::PublishRefused => "publish_refused",
        StepDown::KeyLost => "key_lost",
        StepDown::Shutdown => "shutdown",
        StepDown::Deferred => "deferred",
    }
}

/// RFC 3339 of now (UTC, seconds).
fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    verwalter_controllers::machinery::clock::rfc3339(secs * 1000)
}

/// One lease's keep-alive stream: each ask sends a keep-alive, each answer goes back with the
/// time its request was sent (answers come in order). Ends when the stream fails; the next ask
/// opens another.
struct KeepAliveStream {
    client: Client,
    lease: i64,
    /// The lease's TTL as granted: the answer to the keep-alive that opens the stream is not
    /// handed out by the client crate, only whether the lease lives.
    granted_ms: Millis,
    answers: mpsc::UnboundedSender<Input>,
    metrics: Arc<EtcdMetrics>,
}

impl KeepAliveStream {
    async fn run(mut self, first_sent: Millis, mut asks: mpsc::UnboundedReceiver<Millis>) {
        let lease = self.lease;
        let began = std::time::Instant::now();
        // Opening the stream sends the first keep-alive and waits for its answer.
        let opened =
            tokio::time::timeout(REQUEST_TIMEOUT, self.client.lease_keep_alive(lease)).await;
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                let _ = self.answers.send(Input::KeptAlive {
                    lease,
                    ttl_ms: 0,
                    sent_at: first_sent,
                });
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(lease, error = %e, "Cannot keep the etcd lease alive.");
                return;
            }
            Err(_) => {
                tracing::warn!(lease, "Keeping the etcd lease alive timed out.");
                return;
            }
        };
        self.metrics.rtt.observe(began.elapsed().as_secs_f64());
        let _ = self.answers.send(Input::KeptAlive {
            lease,
            ttl_ms: self.granted_ms,
            sent_at: first_sent,
        });
        let mut sent: VecDeque<(Millis, std::time::Instant)> = VecDeque::new();
        loop {
            tokio::select! {
                ask = asks.recv() => {
                    let Some(at) = ask else { return };
                    if let Err(e) = keeper.keep_alive().await {
                        tracing::warn!(lease, error = %e, "The etcd keep-alive stream ended.");
                        return;
                    }
                    sent.push_back((at, std::time::Instant::now()));
                }
                answer = stream.message() => {
                    let answer = match answer {
                        Ok(Some(answer)) => answer,
                        Ok(None) => {
                            tracing::warn!(lease, "The etcd keep-alive stream ended.");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(lease, error = %e, "The etcd keep-alive stream ended.");
                            return;
                        }
                    };
                    let Some((sent_at, when)) = sent.pop_front() else { continue };
                    self.metrics.rtt.observe(when.elapsed().as_secs_f64());
                    let ttl_ms = answer.ttl().max(0) as Millis * 1000;
                    let _ = self.answers.send(Input::KeptAlive { lease, ttl_ms, sent_at });
                }
            }
        }
    }
}

/// Watches everything under `prefix/` from `from_rev` and hands the two keys' events over;
/// tells when the watch ended (and whether its start was compacted).
async fn watch_prefix(
    mut client: Client,
    prefix: String,
    from_rev: i64,
    answers: mpsc::UnboundedSender<Input>,
    stop: CancellationToken,
) {
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(from_rev);
    let began = Instant::now();
    let opened = tokio::select! {
        _ = stop.cancelled() => return,
        opened = tokio::time::timeout(REQUEST_TIMEOUT, client.watch(format!("{prefix}/"), Some(options))) => opened,
    };
    let mut compacted = None;
    if let Ok(Ok(mut stream)) = opened {
        loop {
            let message = tokio::select! {
                _ = stop.cancelled() => return,
                m = stream.message() => m,
            };
            let Ok(Some(answer)) = message else { break };
            if answer.canceled() {
                if answer.compact_revision() > 0 {
                    compacted = Some(answer.compact_revision());
                }
                break;
            }
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                let revision = kv.mod_revision();
                let name = kv
                    .key()
                    .strip_prefix(format!("{prefix}/").as_bytes())
                    .unwrap_or_default();
                let put = event.event_type() == EventType::Put;
                let change = match (name, put) {
                    (b"leader", true) => leader_of(kv, &prefix).map(Change::LeaderPut),
                    (b"leader", false) => Some(Change::LeaderDeleted),
                    (b"schedule", true) => schedule_of(kv, &prefix).map(Change::SchedulePut),
                    (b"schedule", false) => Some(Change::ScheduleDeleted),
                    _ => None,
                };
                if let Some(change) = change {
                    let _ = answers.send(Input::Watched { revision, change });
                }
            }
        }
    }
    if began.elapsed() < REWATCH_PAUSE {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(REWATCH_PAUSE) => {}
        }
    }
    let _ = answers.send(Input::WatchEnded { compacted });
}

/// The backend's metric families (docs/metrics.md), on the daemon's registry.
pub(crate) struct EtcdMetrics {
    lease_left: prometheus::Gauge,
    rtt: prometheus::Histogram,
    watch_restarts: prometheus::IntCounterVec,
    ignored: prometheus::IntCounterVec,
    step_downs: prometheus::IntCounterVec,
    deferrals: prometheus::IntCounter,
}

impl EtcdMetrics {
    pub(crate) fn register(registry: &prometheus::Registry) -> EtcdMetrics {
        let f = crate::metrics::Families(registry);
        EtcdMetrics {
            lease_left: f.register(
                prometheus::Gauge::new(
                    "verwalter_etcd_lease_seconds_left",
                    "Time until this leader's fence deadline on etcd (0 when not leading).",
                )
                .expect("valid metric"),
            ),
            rtt: f.register(
                prometheus::Histogram::with_opts(
                    prometheus::HistogramOpts::new(
                        "verwalter_etcd_rtt_seconds",
                        "Round-trip time of the requests to etcd that were answered.",
                    )
                    .buckets(vec![
                        0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            watch_restarts: f.counter_vec(
                "verwalter_etcd_watch_restarts_total",
                "Watches on etcd opened again, by reason (error, compacted).",
                &["reason"],
            ),
            ignored: f.counter_vec(
                "verwalter_etcd_ignored_total",
                "Values and answers from etcd not taken, by reason.",
                &["reason"],
            ),
            step_downs: f.counter_vec(
                "verwalter_etcd_step_downs_total",
                "Times this node stopped leading on etcd, by reason.",
                &["reason"],
            ),
            deferrals: f.counter(
                "verwalter_etcd_deferrals_total",
                "Times this node began to defer to a built-in election leader it heard.",
            ),
        }
    }
}
