//! The graph executor's metric families, registered on the registry it is given (the daemon's,
//! or its own for `verwalter graph --metrics-listen`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use futures::future::BoxFuture;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use tokio_util::sync::CancellationToken;
use verwalter_controllers::ernest::ResultKind;
use verwalter_controllers::ernest::executor_loop::GraphObserver;

use super::ExecutorError;

/// Dispatch-to-answer buckets: 1 ms (an instant worker) to 10 minutes (twice the default
/// component timeout).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

pub(crate) struct GraphMetrics {
    builds: IntCounterVec,
    in_flight: IntGauge,
    latency: HistogramVec,
    reconnects: IntCounter,
}

impl GraphMetrics {
    pub(crate) fn register(registry: &Registry) -> GraphMetrics {
        fn reg<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
            r.register(Box::new(c.clone()))
                .expect("graph metric names are unique");
            c
        }
        let builds = reg(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "verwalter_graph_builds_total",
                    "Builds the graph executor finished, by result (done, error).",
                ),
                &["result"],
            )
            .expect("valid metric"),
        );
        for result in ["done", "error"] {
            builds.with_label_values(&[result]);
        }
        let latency = reg(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "verwalter_graph_component_duration_seconds",
                    "From a component's dispatch to its answer (a timeout counts as error).",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["result"],
            )
            .expect("valid metric"),
        );
        GraphMetrics {
            builds,
            in_flight: reg(
                registry,
                IntGauge::new(
                    "verwalter_graph_components_in_flight",
                    "Components dispatched and not answered, over every build.",
                )
                .expect("valid metric"),
            ),
            latency,
            reconnects: reg(
                registry,
                IntCounter::new(
                    "verwalter_graph_nats_reconnects_total",
                    "Times the executor's NATS connection came back after a loss.",
                )
                .expect("valid metric"),
            ),
        }
    }

    pub(crate) fn reconnected(&self) {
        self.reconnects.inc();
    }
}

impl GraphObserver for GraphMetrics {
    fn answered(&self, errored: bool, latency: Duration) {
        let label = if errored { "error" } else { "done" };
        self.latency
            .with_label_values(&[label])
            .observe(latency.as_secs_f64());
    }

    fn finished(&self, result: ResultKind) {
        self.builds.with_label_values(&[result.label()]).inc();
    }

    fn in_flight(&self, components: usize) {
        self.in_flight.set(components as i64);
    }
}

/// `verwalter graph --metrics-listen`: `GET /metrics` on `addr` until `shutdown`.
pub(crate) async fn serve(
    addr: SocketAddr,
    registry: Registry,
    shutdown: CancellationToken,
) -> Result<BoxFuture<'static, ()>, ExecutorError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ExecutorError::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %bound, "Graph executor metrics at http://{bound}/metrics");
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move {
                let mut text = Vec::new();
                let _ = TextEncoder::new().encode(&registry.gather(), &mut text);
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
            }
        }),
    );
    Ok(Box::pin(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
    }))
}
