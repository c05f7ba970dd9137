//! `state.metrics` for the Lua scheduler: runs the instant queries of `scheduler/v1/metrics.yaml`
//! against Prometheus in the background and writes their answers to the store, never per
//! scheduler run.
//!
//! Only the leader (the node that runs the scheduler) queries: a follower's task waits until it
//! leads, then queries at once. A round runs every declared query side by side, each within the
//! declared timeout, every `interval`; a new declaration (an edit of `metrics.yaml`) starts a
//! round at once. What is kept when a query fails, and what a run sees, is decided in
//! `verwalter_controllers::schedule::scheduler_metrics`. [`query_once`] is the offline commands' single
//! round (`verwalter schedule`, `verwalter check`).

pub mod file;

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::cluster::election::ElectionState;
use verwalter_controllers::machinery::clock::Clock;
use verwalter_controllers::machinery::store::{Field, Reader};
use verwalter_controllers::schedule::scheduler_metrics::{
    MetricSample, MetricsDeclaration, SchedulerMetrics,
};
use verwalter_controllers::state::Inputs;
use verwalter_placement::sources::SourceError;

use crate::machinery::http_client::HttpClient;
use crate::metrics::Metrics;
use crate::placement::prometheus::instant_query;
use crate::placement::request;

/// What the refresh reads and writes.
pub(crate) struct MetricsRefresh {
    pub(crate) inputs: Reader<Inputs>,
    pub(crate) election: Reader<ElectionState>,
    pub(crate) out: Field<SchedulerMetrics>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
}

/// One query's answer, or its error with the error's kind (the metric label).
type Answer = Result<Vec<MetricSample>, (String, &'static str)>;

/// The client for a declaration: plain, or trusting its CA file for HTTPS.
fn client_for(decl: &MetricsDeclaration) -> Result<HttpClient, String> {
    match &decl.ca_file {
        None => Ok(request::plain_client()),
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("CA file {path}: {e}"))?;
            request::client_with_ca(&pem).map_err(|e| e.to_string())
        }
    }
}

/// One round: every query of `decl`, side by side, each answer or error by name.
async fn round(
    client: &Result<HttpClient, String>,
    decl: &MetricsDeclaration,
) -> Vec<(String, Answer)> {
    let client = match client {
        Ok(client) => client,
        Err(e) => {
            return decl
                .queries
                .keys()
                .map(|name| (name.clone(), Err((e.clone(), "setup"))))
                .collect();
        }
    };
    let answers = futures::future::join_all(
        decl.queries
            .values()
            .map(|q| instant_query(client, &decl.url, q, decl.time.as_deref(), decl.timeout)),
    )
    .await;
    decl.queries
        .keys()
        .zip(answers)
        .map(|(name, answer)| (name.clone(), answer.map(samples).map_err(described)))
        .collect()
}

fn samples(answer: Vec<verwalter_placement::sources::Sample>) -> Vec<MetricSample> {
    answer
        .into_iter()
        .map(|s| MetricSample {
            labels: s.metric,
            value: s.value,
        })
        .collect()
}

fn described(e: SourceError) -> (String, &'static str) {
    (e.to_string(), e.kind())
}

/// Runs the declared queries once (the offline commands): every query of `decl` with its
/// answer or error, as a scheduler run at `now_ms` would see them.
pub(crate) async fn query_once(decl: &MetricsDeclaration, now_ms: u64) -> SchedulerMetrics {
    let client = client_for(decl);
    let mut state = SchedulerMetrics::default().declared(Some(decl));
    for (name, answer) in round(&client, decl).await {
        state.record(&name, answer.map_err(|(e, _)| e), now_ms);
    }
    state
}

/// `state.metrics` for an offline run at `now_ms`: the declared queries run once on a runtime
/// of their own (`{}` without a declaration), and a warning line per query that failed.
pub fn offline_view(
    decl: Option<&MetricsDeclaration>,
    now_ms: u64,
) -> (serde_json::Value, Vec<String>) {
    let Some(decl) = decl else {
        return (serde_json::json!({}), Vec::new());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    let state = runtime.block_on(query_once(decl, now_ms));
    let warnings = state
        .queries
        .iter()
        .filter_map(|(name, r)| {
            let e = r.error.as_ref()?;
            Some(format!("metrics query {name:?}: {e}"))
        })
        .collect();
    (state.view(now_ms), warnings)
}

impl MetricsRefresh {
    /// Refreshes until shutdown.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut current: Option<Arc<MetricsDeclaration>> = None;
        let mut client: Result<HttpClient, String> = Err(String::new());
        // When the next round is due (`None`: now).
        let mut next: Option<Instant> = None;
        let mut was_leading = false;
        loop {
            let decl = self.inputs.get().metrics.clone();
            let leading = self.election.get().is_leader;
            if decl != current {
                match &decl {
                    Some(d) => tracing::info!(
                        url = %d.url, queries = d.queries.len(),
                        interval = ?d.interval, timeout = ?d.timeout,
                        "Scheduler metrics declared."
                    ),
                    None if current.is_some() => {
                        tracing::info!("Scheduler metrics no longer declared.");
                        self.metrics.scheduler_metrics_failing(0);
                    }
                    None => {}
                }
                self.out.update(|m| *m = m.declared(decl.as_deref()));
                client = decl.as_deref().map_or(Err(String::new()), client_for);
                current = decl;
                next = None;
            }
            if leading && !was_leading {
                next = None;
            }
            was_leading = leading;
            let active = current.clone().filter(|_| leading);
            if let Some(decl) = &active
                && next.is_none_or(|at| at <= Instant::now())
            {
                let started = Instant::now();
                let answers = tokio::select! {
                    a = round(&client, decl) => a,
                    _ = shutdown.cancelled() => return,
                };
                self.record(answers);
                next = Some(started + decl.interval);
                continue; // the inputs may have changed meanwhile
            }
            let sleep = async {
                match (&active, next) {
                    (Some(_), Some(at)) => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.inputs.changed() => {}
                _ = self.election.changed() => {}
                _ = sleep => {}
            }
        }
    }

    /// Stores a round's answers; logs each query's error when it changes, and its recovery.
    fn record(&self, answers: Vec<(String, Answer)>) {
        let now = self.clock.now_ms();
        let before = self.out.get();
        let mut failing = 0;
        for (name, answer) in &answers {
            let old_error = before.queries.get(name).and_then(|q| q.error.as_deref());
            match answer {
                Ok(_) => {
                    self.metrics.scheduler_metrics_query("ok");
                    if old_error.is_some_and(|e| {
                        e != verwalter_controllers::schedule::scheduler_metrics::NOT_YET
                    }) {
                        tracing::info!(query = %name, "Scheduler metrics query answers again.");
                    }
                }
                Err((error, kind)) => {
                    failing += 1;
                    self.metrics.scheduler_metrics_query(kind);
                    if old_error != Some(error.as_str()) {
                        tracing::warn!(query = %name, %error,
                            "Scheduler metrics query failed; keeping its last answer.");
                    }
                }
            }
        }
        self.metrics.scheduler_metrics_failing(failing);
        self.out.update(|m| {
            for (name, answer) in answers {
                m.record(&name, answer.map_err(|(e, _)| e), now);
            }
        });
    }
}

/// The refresh's metric families: the queries run and the queries failing (docs/metrics.md).
pub(crate) struct RefreshMetrics {
    pub(crate) queries: prometheus::IntCounterVec,
    pub(crate) failing: prometheus::IntGauge,
}

impl RefreshMetrics {
    /// Creates the families, with the `ok` series, and registers them on `registry`.
    pub(crate) fn register(registry: &prometheus::Registry) -> RefreshMetrics {
        let f = crate::metrics::Families(registry);
        let m = RefreshMetrics {
            queries: f.counter_vec(
                "verwalter_scheduler_metrics_queries_total",
                "Prometheus queries of the scheduler's metrics.yaml run on this node (the leader), by result (ok or the error kind).",
                &["result"],
            ),
            failing: f.gauge(
                "verwalter_scheduler_metrics_failing",
                "Queries of the scheduler's metrics.yaml whose last refresh failed (their last answer is kept).",
            ),
        };
        m.queries.with_label_values(&["ok"]);
        m
    }
}
