//! The Prometheus registry and every metric family, created once and passed in context.
//!
//! Names are `verwalter_<what>_<unit>[_total]`; labels are bounded (controller names and failure
//! reasons are fixed sets).

use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use verwalter_controllers::machinery::driver::DriverObserver;
use verwalter_controllers::schedule::ScheduleObserver;
use verwalter_controllers::state::BlockedState;
use verwalter_controllers::state::SchedulerFailure;
use verwalter_controllers::status::{SCHEDULE_PERSIST, SchedulerRuns, Snapshot, Status};

/// Buckets for pass and scheduler durations: 1 ms to 10 s.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

pub struct Metrics {
    registry: Registry,
    controller_passes: IntCounterVec,
    controller_failures: IntCounterVec,
    controller_pass_duration: HistogramVec,
    controller_running: IntGaugeVec,
    controller_waiting: IntGaugeVec,
    controller_backing_off: IntGaugeVec,
    scheduler_runs: IntCounter,
    scheduler_failures: IntCounterVec,
    scheduler_duration: prometheus::Histogram,
    scheduler_last_success: IntGauge,
    input_reads: IntCounter,
    input_errors: IntGauge,
    input_read_failures: IntCounter,
    leader: IntGauge,
    election_epoch: IntGauge,
    schedule_timestamp: IntGauge,
    peers: IntGauge,
    peer_refreshes: IntCounterVec,
    messages_sent: IntCounterVec,
    messages_received: IntCounterVec,
    messages_dropped: IntCounterVec,
    elections_started: IntCounterVec,
    schedule_fetches: IntCounterVec,
    schedules_checked: IntCounterVec,
    schedule_served_bytes: IntCounterVec,
    schedules_served: IntCounterVec,
    /// Wall-clock ms of the last packet from the leader (0: none), for the age gauge.
    leader_contact_ms: std::sync::atomic::AtomicU64,
    leader_contact_age: prometheus::Gauge,
    roles_failing: IntGauge,
    roles_held: IntGaugeVec,
    schedule_persist_failing: IntGauge,
    role_failed_attempts: IntGaugeVec,
    last_deployment: IntGauge,
    deployment_log_write_errors: IntCounter,
    http_connections: IntGauge,
    http_closed: IntCounterVec,
    event_streams: IntGauge,
    scheduler_metrics_queries: IntCounterVec,
    scheduler_metrics_failing: IntGauge,
    /// Roles with a `role_failed_attempts` series now (to drop series of recovered roles).
    failing_series: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// Why the server closed or refused a connection (`verwalter_http_connections_closed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpClose {
    /// Over the connection cap: refused at once.
    Refused,
    /// Closed to make room for a new connection.
    Evicted,
    /// An events client stopped reading its stream.
    StalledStream,
    /// The client took no response data for the stall timeout.
    StalledWrite,
}

impl HttpClose {
    pub fn label(self) -> &'static str {
        match self {
            HttpClose::Refused => "refused",
            HttpClose::Evicted => "evicted",
            HttpClose::StalledStream => "stalled_stream",
            HttpClose::StalledWrite => "stalled_write",
        }
    }
}

/// A server's connection gauge and its counter of connections closed to stay within limits
/// (`http::serve_on` counts in them): the daemon's API has its own, the extender its own.
#[derive(Clone)]
pub struct ConnectionMetrics {
    open: IntGauge,
    closed: IntCounterVec,
}

impl ConnectionMetrics {
    /// From a gauge and a counter vector with one label, the reason ([`HttpClose::label`]).
    pub fn new(open: IntGauge, closed: IntCounterVec) -> ConnectionMetrics {
        ConnectionMetrics { open, closed }
    }

    pub fn opened(&self) {
        self.open.inc();
    }

    pub fn closed_one(&self) {
        self.open.dec();
    }

    /// Connections open now.
    pub fn open(&self) -> i64 {
        self.open.get()
    }

    /// The counter of connections closed (or refused) for `reason`.
    pub fn closed(&self, reason: HttpClose) -> IntCounter {
        self.closed.with_label_values(&[reason.label()])
    }
}

/// At most this many roles get a `verwalter_role_failed_attempts` series (labels stay bounded).
pub const MAX_ROLE_SERIES: usize = 100;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        fn reg<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
            r.register(Box::new(c.clone()))
                .expect("metric names are unique");
            c
        }
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &registry,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &registry,
                IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        let gauge = |name: &str, help: &str| {
            reg(&registry, IntGauge::new(name, help).expect("valid metric"))
        };
        let counter = |name: &str, help: &str| {
            reg(
                &registry,
                IntCounter::new(name, help).expect("valid metric"),
            )
        };
        let metrics = Metrics {
            controller_passes: counter_vec(
                "verwalter_controller_passes_total",
                "Reconcile passes finished, by controller.",
                &["controller"],
            ),
            controller_failures: counter_vec(
                "verwalter_controller_failures_total",
                "Reconcile passes that failed, by controller and reason.",
                &["controller", "reason"],
            ),
            controller_pass_duration: reg(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "verwalter_controller_pass_duration_seconds",
                        "Duration of reconcile passes.",
                    )
                    .buckets(DURATION_BUCKETS.to_vec()),
                    &["controller"],
                )
                .expect("valid metric"),
            ),
            controller_running: gauge_vec(
                "verwalter_controller_running",
                "Reconcile passes running now.",
                &["controller"],
            ),
            controller_waiting: gauge_vec(
                "verwalter_controller_waiting",
                "Keys waiting for a pass (pending behind a running pass or for a free slot).",
                &["controller"],
            ),
            controller_backing_off: gauge_vec(
                "verwalter_controller_backing_off",
                "Keys waiting out a backoff after a failure.",
                &["controller"],
            ),
            scheduler_runs: counter(
                "verwalter_scheduler_runs_total",
                "Scheduler runs, successful or not.",
            ),
            scheduler_failures: counter_vec(
                "verwalter_scheduler_failures_total",
                &format!(
                    "Failed scheduler runs by reason ({}).",
                    SchedulerFailure::ALL
                        .map(SchedulerFailure::label)
                        .join(", ")
                ),
                &["reason"],
            ),
            scheduler_duration: reg(
                &registry,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "verwalter_scheduler_duration_seconds",
                        "Duration of scheduler runs.",
                    )
                    .buckets(DURATION_BUCKETS.to_vec()),
                )
                .expect("valid metric"),
            ),
            scheduler_last_success: gauge(
                "verwalter_scheduler_last_success_timestamp_seconds",
                "Unix time of the last successful scheduler run (0: none yet).",
            ),
            input_reads: counter("verwalter_input_reads_total", "Reads of the config dir."),
            input_errors: gauge(
                "verwalter_input_errors",
                "Input files that could not be read or parsed.",
            ),
            input_read_failures: counter(
                "verwalter_input_read_failures_total",
                "Reads of the config dir that could not read a file or dir that exists; the last good inputs were kept.",
            ),
            leader: gauge("verwalter_leader", "1 when this node is the leader."),
            election_epoch: gauge("verwalter_election_epoch", "Current election epoch."),
            schedule_timestamp: gauge(
                "verwalter_schedule_timestamp_seconds",
                "Unix time the schedule in force was produced (0: none).",
            ),
            peers: gauge("verwalter_peers", "Other nodes known."),
            peer_refreshes: counter_vec(
                "verwalter_peer_refreshes_total",
                "Peer list refreshes from cantal, by result (ok, error).",
                &["result"],
            ),
            messages_sent: counter_vec(
                "verwalter_election_messages_sent_total",
                "Election packets sent, by type (ping, pong, vote).",
                &["type"],
            ),
            messages_received: counter_vec(
                "verwalter_election_messages_received_total",
                "Election packets received, by type (ping, pong, vote).",
                &["type"],
            ),
            messages_dropped: counter_vec(
                "verwalter_election_messages_dropped_total",
                "Election packets dropped, by reason (decode, bad_auth, unknown_peer, bad_epoch, send_error).",
                &["reason"],
            ),
            elections_started: counter_vec(
                "verwalter_elections_started_total",
                "Elections this node started, by reason (start, leader_timeout, election_timeout, vote_timeout, two_leaders, pong, lost_majority).",
                &["reason"],
            ),
            schedule_fetches: counter_vec(
                "verwalter_schedule_fetches_total",
                "Schedules fetched from other nodes, by result (ok, error).",
                &["result"],
            ),
            schedules_checked: counter_vec(
                "verwalter_schedules_checked_total",
                "Schedules fetched from other nodes and taken as sound, by what vouched for them: data_hash (the SHA-1 of the data is the schedule hash) or body_hash (the SHA-1 of the x-verwalter-lz4 body is the one the leader announced in its ping).",
                &["by"],
            ),
            schedule_served_bytes: counter_vec(
                "verwalter_schedule_served_bytes_total",
                "Bytes of schedule bodies this node served (/v1/schedule, /v1/schedule/<hash>), by encoding (identity, gzip, x-verwalter-lz4).",
                &["encoding"],
            ),
            schedules_served: counter_vec(
                "verwalter_schedules_served_total",
                "Schedules this node served to peers and clients, by encoding (identity, gzip, x-verwalter-lz4).",
                &["encoding"],
            ),
            leader_contact_ms: Default::default(),
            leader_contact_age: reg(
                &registry,
                prometheus::Gauge::new(
                    "verwalter_leader_contact_age_seconds",
                    "Seconds since the last packet from the leader (0 on the leader; -1: never).",
                )
                .expect("valid metric"),
            ),
            schedule_persist_failing: gauge(
                "verwalter_schedule_persist_failing",
                "1 while the schedule in force could not be written to the storage dir.",
            ),
            roles_failing: gauge(
                "verwalter_roles_failing",
                "Roles of this node whose last render or apply failed.",
            ),
            roles_held: gauge_vec(
                "verwalter_roles_held",
                "Roles of this node held back by depends_on: waiting for a dependency to apply, or blocked by its failure (or a halt).",
                &["state"],
            ),
            role_failed_attempts: gauge_vec(
                "verwalter_role_failed_attempts",
                "Failed attempts in a row of each failing role (first 100 roles by name).",
                &["role"],
            ),
            last_deployment: gauge(
                "verwalter_last_deployment_timestamp_seconds",
                "Unix time the latest render pass started (0: none since start).",
            ),
            deployment_log_write_errors: counter(
                "verwalter_deployment_log_write_errors_total",
                "Writes to the deployment log that failed (deployments go on without them).",
            ),
            http_connections: gauge("verwalter_http_connections", "HTTP connections open now."),
            http_closed: counter_vec(
                "verwalter_http_connections_closed_total",
                "HTTP connections the server closed to stay within its limits, by reason (evicted: idle, to make room; refused: over the cap with none idle; stalled_stream: an events client that stopped reading; stalled_write: a client that took no response data).",
                &["reason"],
            ),
            event_streams: gauge(
                "verwalter_event_streams",
                "/v1/events streams and /v1/graphql WebSockets open now.",
            ),
            scheduler_metrics_queries: counter_vec(
                "verwalter_scheduler_metrics_queries_total",
                "Prometheus queries of the scheduler's metrics.yaml run on this node (the leader), by result (ok or the error kind).",
                &["result"],
            ),
            scheduler_metrics_failing: gauge(
                "verwalter_scheduler_metrics_failing",
                "Queries of the scheduler's metrics.yaml whose last refresh failed (their last answer is kept).",
            ),
            failing_series: Default::default(),
            registry,
        };
        for t in ["ping", "pong", "vote", "pre_vote"] {
            metrics.messages_sent.with_label_values(&[t]);
            metrics.messages_received.with_label_values(&[t]);
        }
        for r in ["ok", "error"] {
            metrics.schedule_fetches.with_label_values(&[r]);
        }
        for by in ["data_hash", "body_hash"] {
            metrics.schedules_checked.with_label_values(&[by]);
        }
        for e in ["identity", "gzip", crate::cluster::coding::LZ4] {
            metrics.schedule_served_bytes.with_label_values(&[e]);
            metrics.schedules_served.with_label_values(&[e]);
        }
        metrics.scheduler_metrics_queries.with_label_values(&["ok"]);
        // Every failure reason is a series from the start, so rate() and alerts see zeros.
        for kind in SchedulerFailure::ALL {
            metrics
                .scheduler_failures
                .with_label_values(&[kind.label()]);
        }
        metrics
    }

    /// Scheduler runs since start, and how many failed (of every kind).
    /// The config dir was read, with `errors` problems in what it holds.
    pub fn input_read(&self, errors: usize) {
        self.input_reads.inc();
        self.input_errors.set(errors as i64);
    }

    /// A read of the config dir could not see everything (the last good inputs stay).
    pub fn input_read_failed(&self) {
        self.input_read_failures.inc();
    }

    /// A query of the scheduler's `metrics.yaml` answered (`ok`) or failed (the error kind).
    pub fn scheduler_metrics_query(&self, result: &'static str) {
        self.scheduler_metrics_queries
            .with_label_values(&[result])
            .inc();
    }

    /// After a round: how many of the scheduler's metrics queries failed in it.
    pub fn scheduler_metrics_failing(&self, queries: usize) {
        self.scheduler_metrics_failing.set(queries as i64);
    }

    /// A peer list refresh (cantal) succeeded or failed.
    pub fn peer_refresh(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.peer_refreshes.with_label_values(&[result]).inc();
    }

    /// An election packet of `kind` was sent. Labels are static strings, so the number of
    /// series stays bounded whatever arrives.
    pub fn message_sent(&self, kind: &'static str) {
        self.messages_sent.with_label_values(&[kind]).inc();
    }

    /// An election packet of `kind` was taken.
    pub fn message_received(&self, kind: &'static str) {
        self.messages_received.with_label_values(&[kind]).inc();
    }

    /// An election packet was dropped, or could not be sent, for `reason`.
    pub fn message_dropped(&self, reason: &'static str) {
        self.messages_dropped.with_label_values(&[reason]).inc();
    }

    /// This node started an election, for `reason`.
    pub fn election_started(&self, reason: &'static str) {
        self.elections_started.with_label_values(&[reason]).inc();
    }

    /// A follower heard its leader at wall-clock `now_ms` (for the contact age gauge).
    pub fn leader_contact(&self, now_ms: u64) {
        self.leader_contact_ms
            .store(now_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// A schedule fetch from a peer ended.
    pub fn schedule_fetch(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.schedule_fetches.with_label_values(&[result]).inc();
    }

    /// A fetched schedule checked out: by the hash of its data or (`vouched`) of its body.
    pub fn schedule_checked(&self, vouched: bool) {
        let by = if vouched { "body_hash" } else { "data_hash" };
        self.schedules_checked.with_label_values(&[by]).inc();
    }

    /// Fetched schedules checked so far by the body's (`vouched`) or the data's hash (tests).
    #[cfg(test)]
    pub(crate) fn schedules_checked(&self, vouched: bool) -> u64 {
        let by = if vouched { "body_hash" } else { "data_hash" };
        self.schedules_checked.with_label_values(&[by]).get()
    }

    /// A schedule body of `bytes` went out, gzip-compressed or not.
    pub fn schedule_served(&self, coding: crate::cluster::coding::Coding, bytes: usize) {
        let encoding = coding.token();
        self.schedules_served.with_label_values(&[encoding]).inc();
        self.schedule_served_bytes
            .with_label_values(&[encoding])
            .inc_by(bytes as u64);
    }

    /// The registry, for families registered elsewhere (the graph executor's).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The counter the deployment log counts its failed writes in.
    pub fn deployment_log_write_errors(&self) -> IntCounter {
        self.deployment_log_write_errors.clone()
    }

    /// The API server's connection metrics.
    pub fn connection_metrics(&self) -> ConnectionMetrics {
        ConnectionMetrics::new(self.http_connections.clone(), self.http_closed.clone())
    }

    /// An HTTP connection was opened / closed.
    pub fn http_connection_opened(&self) {
        self.http_connections.inc();
    }
    pub fn http_connection_closed(&self) {
        self.http_connections.dec();
    }

    /// HTTP connections open now.
    pub fn http_connections_open(&self) -> i64 {
        self.http_connections.get()
    }

    /// The counter of connections closed (or refused) by the server for `reason`.
    pub fn http_closed(&self, reason: HttpClose) -> IntCounter {
        self.http_closed.with_label_values(&[reason.label()])
    }

    /// A `/v1/events` stream or a `/v1/graphql` WebSocket was opened / closed.
    pub fn event_stream_opened(&self) {
        self.event_streams.inc();
    }
    pub fn event_stream_closed(&self) {
        self.event_streams.dec();
    }

    /// What the input gauges and counters say now (for tests of the watcher).
    pub fn input_figures(&self) -> (u64, i64) {
        (self.input_read_failures.get(), self.input_errors.get())
    }

    pub fn scheduler_runs(&self) -> SchedulerRuns {
        SchedulerRuns::count(self.scheduler_runs.get(), |kind| {
            self.scheduler_failures
                .with_label_values(&[kind.label()])
                .get()
        })
    }

    /// Prometheus text format, with the store-derived gauges refreshed first: those that repeat
    /// a fact of the status from its view, the rest from the snapshot it was made from.
    pub fn render(&self, status: &Status, snapshot: &Snapshot) -> String {
        let election = &status.election_state;
        self.leader.set(i64::from(election.is_leader));
        self.election_epoch.set(election.epoch as i64);
        self.schedule_timestamp.set(
            snapshot
                .schedule
                .as_ref()
                .as_ref()
                .map_or(0, |s| (s.timestamp / 1000) as i64),
        );
        self.peers.set(status.peers as i64);
        self.schedule_persist_failing
            .set(i64::from(status.errors.contains_key(SCHEDULE_PERSIST)));
        if let Some(ms) = snapshot.scheduler.last_success {
            self.scheduler_last_success.set((ms / 1000) as i64);
        }
        let contact = self
            .leader_contact_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        self.leader_contact_age.set(if election.is_leader {
            0.0
        } else if contact == 0 {
            -1.0
        } else {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            now.saturating_sub(contact) as f64 / 1000.0
        });
        self.roles_failing.set(status.failed_roles.len() as i64);
        for state in [BlockedState::Waiting, BlockedState::Blocked] {
            let count = status
                .blocked_roles
                .values()
                .filter(|b| b.state == state)
                .count();
            let label = match state {
                BlockedState::Waiting => "waiting",
                BlockedState::Blocked => "blocked",
            };
            self.roles_held
                .with_label_values(&[label])
                .set(count as i64);
        }
        if let Some(d) = &status.last_deployment {
            self.last_deployment.set((d.started / 1000) as i64);
        }
        let roles = &snapshot.roles;
        {
            let mut series = self.failing_series.lock().unwrap();
            for role in series.iter() {
                if !roles.failed.contains_key(role) {
                    let _ = self.role_failed_attempts.remove_label_values(&[role]);
                }
            }
            series.clear();
            for (role, failure) in roles.failed.iter().take(MAX_ROLE_SERIES) {
                self.role_failed_attempts
                    .with_label_values(&[role])
                    .set(i64::from(failure.attempts));
                series.insert(role.clone());
            }
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding of metrics");
        String::from_utf8(out).expect("metrics text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl DriverObserver for Metrics {
    fn pass(&self, controller: &'static str, failure: Option<&'static str>, duration: Duration) {
        self.controller_passes
            .with_label_values(&[controller])
            .inc();
        if let Some(reason) = failure {
            self.controller_failures
                .with_label_values(&[controller, reason])
                .inc();
        }
        self.controller_pass_duration
            .with_label_values(&[controller])
            .observe(duration.as_secs_f64());
    }

    fn queue(&self, controller: &'static str, running: usize, waiting: usize, backing_off: usize) {
        self.controller_running
            .with_label_values(&[controller])
            .set(running as i64);
        self.controller_waiting
            .with_label_values(&[controller])
            .set(waiting as i64);
        self.controller_backing_off
            .with_label_values(&[controller])
            .set(backing_off as i64);
    }
}

impl ScheduleObserver for Metrics {
    fn run(&self, failure: Option<SchedulerFailure>, duration: Duration) {
        self.scheduler_runs.inc();
        if let Some(kind) = failure {
            self.scheduler_failures
                .with_label_values(&[kind.label()])
                .inc();
        }
        self.scheduler_duration.observe(duration.as_secs_f64());
    }
}
