//! The Prometheus registry and every metric family, created once and passed in context: the
//! drivers' and the schedule controller's families here, the others' beside their subsystem
//! (`cluster/metrics.rs`, `render/metrics.rs`, `inputs/metrics.rs`, `http/metrics.rs`,
//! `placement/scheduler_metrics.rs`), each a struct registered by its `register`.
//!
//! Names are `verwalter_<what>_<unit>[_total]`; labels are bounded (controller names and failure
//! reasons are fixed sets).

use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use verwalter_controllers::machinery::driver::DriverObserver;
use verwalter_controllers::schedule::ScheduleObserver;
use verwalter_controllers::state::SchedulerFailure;
use verwalter_controllers::status::{SCHEDULE_PERSIST, SchedulerRuns, Snapshot, Status};

use crate::cluster::metrics::ClusterMetrics;
use crate::http::metrics::HttpMetrics;
pub(crate) use crate::http::metrics::{ConnectionMetrics, HttpClose};
use crate::inputs::metrics::InputMetrics;
use crate::render::metrics::RenderMetrics;
use crate::schedule::scheduler_metrics::RefreshMetrics;
use crate::schedule::shadow::metrics::ShadowMetrics;

/// Buckets for pass and scheduler durations: 1 ms to 10 s.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Every family of the daemon, each subsystem's declared beside it.
pub struct Metrics {
    registry: Registry,
    driver: DriverMetrics,
    schedule: ScheduleMetrics,
    inputs: InputMetrics,
    cluster: ClusterMetrics,
    render: RenderMetrics,
    http: HttpMetrics,
    scheduler_metrics: RefreshMetrics,
    shadow: ShadowMetrics,
}

/// At most this many roles get a `verwalter_role_failed_attempts` series (labels stay bounded).
pub(crate) const MAX_ROLE_SERIES: usize = 100;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// Creates metric families and registers them on one registry; a name registered twice is a
/// bug (it panics).
pub(crate) struct Families<'a>(pub(crate) &'a Registry);

impl Families<'_> {
    pub(crate) fn register<C: Collector + Clone + 'static>(&self, c: C) -> C {
        self.0
            .register(Box::new(c.clone()))
            .expect("metric names are unique");
        c
    }

    pub(crate) fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).expect("valid metric"))
    }

    pub(crate) fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    pub(crate) fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("valid metric"))
    }

    pub(crate) fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }
}

/// The controllers' drivers: passes and queues, by controller.
pub(crate) struct DriverMetrics {
    passes: IntCounterVec,
    failures: IntCounterVec,
    pass_duration: HistogramVec,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    backing_off: IntGaugeVec,
}

impl DriverMetrics {
    /// Creates the families and registers them on `registry`.
    pub(crate) fn register(registry: &Registry) -> DriverMetrics {
        let f = Families(registry);
        DriverMetrics {
            passes: f.counter_vec(
                "verwalter_controller_passes_total",
                "Reconcile passes finished, by controller.",
                &["controller"],
            ),
            failures: f.counter_vec(
                "verwalter_controller_failures_total",
                "Reconcile passes that failed, by controller and reason.",
                &["controller", "reason"],
            ),
            pass_duration: f.register(
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
            running: f.gauge_vec(
                "verwalter_controller_running",
                "Reconcile passes running now.",
                &["controller"],
            ),
            waiting: f.gauge_vec(
                "verwalter_controller_waiting",
                "Keys waiting for a pass (pending behind a running pass or for a free slot).",
                &["controller"],
            ),
            backing_off: f.gauge_vec(
                "verwalter_controller_backing_off",
                "Keys waiting out a backoff after a failure.",
                &["controller"],
            ),
        }
    }
}

/// The schedule controller: scheduler runs, and the schedule in force.
pub(crate) struct ScheduleMetrics {
    runs: IntCounter,
    failures: IntCounterVec,
    duration: Histogram,
    last_success: IntGauge,
    timestamp: IntGauge,
    persist_failing: IntGauge,
}

impl ScheduleMetrics {
    /// Creates the families, with a series for every failure reason, and registers them on
    /// `registry`.
    pub(crate) fn register(registry: &Registry) -> ScheduleMetrics {
        let f = Families(registry);
        let m = ScheduleMetrics {
            runs: f.counter(
                "verwalter_scheduler_runs_total",
                "Scheduler runs, successful or not.",
            ),
            failures: f.counter_vec(
                "verwalter_scheduler_failures_total",
                &format!(
                    "Failed scheduler runs by reason ({}).",
                    SchedulerFailure::ALL
                        .map(SchedulerFailure::label)
                        .join(", ")
                ),
                &["reason"],
            ),
            duration: f.register(
                Histogram::with_opts(
                    HistogramOpts::new(
                        "verwalter_scheduler_duration_seconds",
                        "Duration of scheduler runs.",
                    )
                    .buckets(DURATION_BUCKETS.to_vec()),
                )
                .expect("valid metric"),
            ),
            last_success: f.gauge(
                "verwalter_scheduler_last_success_timestamp_seconds",
                "Unix time of the last successful scheduler run (0: none yet).",
            ),
            timestamp: f.gauge(
                "verwalter_schedule_timestamp_seconds",
                "Unix time the schedule in force was produced (0: none).",
            ),
            persist_failing: f.gauge(
                "verwalter_schedule_persist_failing",
                "1 while the schedule in force could not be written to the storage dir.",
            ),
        };
        // Every failure reason is a series from the start, so rate() and alerts see zeros.
        for kind in SchedulerFailure::ALL {
            m.failures.with_label_values(&[kind.label()]);
        }
        m
    }

    /// The gauges of the schedule in force and of the scheduler's last success.
    fn refresh(&self, status: &Status, snapshot: &Snapshot) {
        self.timestamp.set(
            snapshot
                .schedule
                .as_ref()
                .as_ref()
                .map_or(0, |s| (s.timestamp / 1000) as i64),
        );
        self.persist_failing
            .set(i64::from(status.errors.contains_key(SCHEDULE_PERSIST)));
        if let Some(ms) = snapshot.scheduler.last_success {
            self.last_success.set((ms / 1000) as i64);
        }
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        Metrics {
            driver: DriverMetrics::register(&registry),
            schedule: ScheduleMetrics::register(&registry),
            inputs: InputMetrics::register(&registry),
            cluster: ClusterMetrics::register(&registry),
            render: RenderMetrics::register(&registry),
            http: HttpMetrics::register(&registry),
            scheduler_metrics: RefreshMetrics::register(&registry),
            shadow: ShadowMetrics::register(&registry),
            registry,
        }
    }

    /// The shadow schedulers' families.
    pub(crate) fn shadow(&self) -> &ShadowMetrics {
        &self.shadow
    }

    /// Scheduler runs since start, and how many failed (of every kind).
    /// The config dir was read, with `errors` problems in what it holds.
    pub(crate) fn input_read(&self, errors: usize) {
        self.inputs.reads.inc();
        self.inputs.errors.set(errors as i64);
    }

    /// A read of the config dir could not see everything (the last good inputs stay).
    pub(crate) fn input_read_failed(&self) {
        self.inputs.read_failures.inc();
    }

    /// A query of the scheduler's `metrics.yaml` answered (`ok`) or failed (the error kind).
    pub(crate) fn scheduler_metrics_query(&self, result: &'static str) {
        self.scheduler_metrics
            .queries
            .with_label_values(&[result])
            .inc();
    }

    /// After a round: how many of the scheduler's metrics queries failed in it.
    pub(crate) fn scheduler_metrics_failing(&self, queries: usize) {
        self.scheduler_metrics.failing.set(queries as i64);
    }

    /// A peer list refresh (cantal) succeeded or failed.
    pub(crate) fn peer_refresh(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.cluster
            .peer_refreshes
            .with_label_values(&[result])
            .inc();
    }

    /// An election packet of `kind` was sent. Labels are static strings, so the number of
    /// series stays bounded whatever arrives.
    pub(crate) fn message_sent(&self, kind: &'static str) {
        self.cluster.messages_sent.with_label_values(&[kind]).inc();
    }

    /// An election packet of `kind` was taken.
    pub(crate) fn message_received(&self, kind: &'static str) {
        self.cluster
            .messages_received
            .with_label_values(&[kind])
            .inc();
    }

    /// An election packet was dropped, or could not be sent, for `reason`.
    pub(crate) fn message_dropped(&self, reason: &'static str) {
        self.cluster
            .messages_dropped
            .with_label_values(&[reason])
            .inc();
    }

    /// This node started an election, for `reason`.
    pub(crate) fn election_started(&self, reason: &'static str) {
        self.cluster
            .elections_started
            .with_label_values(&[reason])
            .inc();
    }

    /// A follower heard its leader at wall-clock `now_ms` (for the contact age gauge).
    pub(crate) fn leader_contact(&self, now_ms: u64) {
        self.cluster
            .leader_contact_ms
            .store(now_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// A schedule fetch from a peer ended.
    pub(crate) fn schedule_fetch(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.cluster
            .schedule_fetches
            .with_label_values(&[result])
            .inc();
    }

    /// A fetched schedule checked out: by the hash of its data or (`vouched`) of its body.
    pub(crate) fn schedule_checked(&self, vouched: bool) {
        let by = if vouched { "body_hash" } else { "data_hash" };
        self.cluster
            .schedules_checked
            .with_label_values(&[by])
            .inc();
    }

    /// Fetched schedules checked so far by the body's (`vouched`) or the data's hash (tests).
    #[cfg(test)]
    pub(crate) fn schedules_checked(&self, vouched: bool) -> u64 {
        let by = if vouched { "body_hash" } else { "data_hash" };
        self.cluster
            .schedules_checked
            .with_label_values(&[by])
            .get()
    }

    /// A schedule body of `bytes` went out, gzip-compressed or not.
    pub(crate) fn schedule_served(&self, coding: crate::cluster::coding::Coding, bytes: usize) {
        let encoding = coding.token();
        self.cluster
            .schedules_served
            .with_label_values(&[encoding])
            .inc();
        self.cluster
            .schedule_served_bytes
            .with_label_values(&[encoding])
            .inc_by(bytes as u64);
    }

    /// The registry, for families registered elsewhere (the graph executor's).
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The counter the deployment log counts its failed writes in.
    pub(crate) fn deployment_log_write_errors(&self) -> IntCounter {
        self.render.deployment_log_write_errors.clone()
    }

    /// The API server's connection metrics.
    pub(crate) fn connection_metrics(&self) -> ConnectionMetrics {
        ConnectionMetrics::new(self.http.connections.clone(), self.http.closed.clone())
    }

    /// HTTP connections open now.
    #[cfg(test)]
    pub(crate) fn http_connections_open(&self) -> i64 {
        self.http.connections.get()
    }

    /// The counter of connections closed (or refused) by the server for `reason`.
    pub(crate) fn http_closed(&self, reason: HttpClose) -> IntCounter {
        self.http.closed.with_label_values(&[reason.label()])
    }

    /// A `/v1/events` stream or a `/v1/graphql` WebSocket was opened / closed.
    pub(crate) fn event_stream_opened(&self) {
        self.http.event_streams.inc();
    }
    pub(crate) fn event_stream_closed(&self) {
        self.http.event_streams.dec();
    }

    /// What the input gauges and counters say now (for tests of the watcher).
    #[cfg(test)]
    pub(crate) fn input_figures(&self) -> (u64, i64) {
        (self.inputs.read_failures.get(), self.inputs.errors.get())
    }

    pub(crate) fn scheduler_runs(&self) -> SchedulerRuns {
        SchedulerRuns::count(self.schedule.runs.get(), |kind| {
            self.schedule
                .failures
                .with_label_values(&[kind.label()])
                .get()
        })
    }

    /// Prometheus text format, with the store-derived gauges refreshed first: those that repeat
    /// a fact of the status from its view, the rest from the snapshot it was made from.
    pub(crate) fn render(&self, status: &Status, snapshot: &Snapshot) -> String {
        self.cluster.refresh(status);
        self.schedule.refresh(status, snapshot);
        self.render.refresh(status, snapshot);
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
        self.driver.passes.with_label_values(&[controller]).inc();
        if let Some(reason) = failure {
            self.driver
                .failures
                .with_label_values(&[controller, reason])
                .inc();
        }
        self.driver
            .pass_duration
            .with_label_values(&[controller])
            .observe(duration.as_secs_f64());
    }

    fn queue(&self, controller: &'static str, running: usize, waiting: usize, backing_off: usize) {
        self.driver
            .running
            .with_label_values(&[controller])
            .set(running as i64);
        self.driver
            .waiting
            .with_label_values(&[controller])
            .set(waiting as i64);
        self.driver
            .backing_off
            .with_label_values(&[controller])
            .set(backing_off as i64);
    }
}

impl ScheduleObserver for Metrics {
    fn run(&self, failure: Option<SchedulerFailure>, duration: Duration) {
        self.schedule.runs.inc();
        if let Some(kind) = failure {
            self.schedule
                .failures
                .with_label_values(&[kind.label()])
                .inc();
        }
        self.schedule.duration.observe(duration.as_secs_f64());
    }
}
