//! The HTTP server's metric families: connections and event streams (docs/metrics.md), and the
//! connection metrics `serve_on` counts in.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

use crate::metrics::Families;

pub(crate) struct HttpMetrics {
    pub(crate) connections: IntGauge,
    pub(crate) closed: IntCounterVec,
    pub(crate) event_streams: IntGauge,
}

impl HttpMetrics {
    /// Creates the families and registers them on `registry`.
    pub(crate) fn register(registry: &Registry) -> HttpMetrics {
        let f = Families(registry);
        HttpMetrics {
            connections: f.gauge("verwalter_http_connections", "HTTP connections open now."),
            closed: f.counter_vec(
                "verwalter_http_connections_closed_total",
                "HTTP connections the server closed to stay within its limits, by reason (evicted: idle, to make room; refused: over the cap with none idle; stalled_stream: an events client that stopped reading; stalled_write: a client that took no response data).",
                &["reason"],
            ),
            event_streams: f.gauge(
                "verwalter_event_streams",
                "/v1/events streams and /v1/graphql WebSockets open now.",
            ),
        }
    }
}

/// Why the server closed or refused a connection (`verwalter_http_connections_closed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpClose {
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
    pub(crate) fn label(self) -> &'static str {
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
pub(crate) struct ConnectionMetrics {
    open: IntGauge,
    closed: IntCounterVec,
}

impl ConnectionMetrics {
    /// From a gauge and a counter vector with one label, the reason ([`HttpClose::label`]).
    pub(crate) fn new(open: IntGauge, closed: IntCounterVec) -> ConnectionMetrics {
        ConnectionMetrics { open, closed }
    }

    pub(crate) fn opened(&self) {
        self.open.inc();
    }

    pub(crate) fn closed_one(&self) {
        self.open.dec();
    }

    /// The counter of connections closed (or refused) for `reason`.
    pub(crate) fn closed(&self, reason: HttpClose) -> IntCounter {
        self.closed.with_label_values(&[reason.label()])
    }
}
