//! Metrics of the placement data sources, registered on a registry the caller owns
//! ([`SourceMetrics::register`]); documented in `docs/metrics.md`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// Buckets for a refresh: 1 ms to 30 s (a list of a big cluster, a slow query).
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Cheap to clone (the families are shared).
#[derive(Clone)]
pub struct SourceMetrics {
    refreshes: IntCounterVec,
    duration: HistogramVec,
    last_success: GaugeVec,
    watch_events: IntCounterVec,
}

impl std::fmt::Debug for SourceMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SourceMetrics")
    }
}

impl SourceMetrics {
    /// Creates the families and registers them on `registry` (fails only on a name clash).
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<SourceMetrics> {
        let m = SourceMetrics {
            refreshes: IntCounterVec::new(
                Opts::new(
                    "verwalter_placement_source_refreshes_total",
                    "Refreshes of a placement data source, by source and result \
                     (ok or the error kind).",
                ),
                &["source", "result"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "verwalter_placement_source_refresh_duration_seconds",
                    "Duration of placement data-source refreshes (successful or not).",
                )
                .buckets(BUCKETS.to_vec()),
                &["source"],
            )?,
            last_success: GaugeVec::new(
                Opts::new(
                    "verwalter_placement_source_last_success_timestamp_seconds",
                    "Unix time of the last successful refresh of a placement data source.",
                ),
                &["source"],
            )?,
            watch_events: IntCounterVec::new(
                Opts::new(
                    "verwalter_placement_pod_watch_events_total",
                    "Pod watch events applied to the placement snapshot, by type \
                     (upsert: added or modified, deleted, bookmark).",
                ),
                &["type"],
            )?,
        };
        registry.register(Box::new(m.refreshes.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        registry.register(Box::new(m.last_success.clone()))?;
        registry.register(Box::new(m.watch_events.clone()))?;
        Ok(m)
    }

    /// One refresh of `source` that took `took`; `result` is `ok` or an error kind.
    pub(crate) fn refresh(&self, source: &str, result: &str, took: Duration) {
        self.refreshes.with_label_values(&[source, result]).inc();
        self.duration
            .with_label_values(&[source])
            .observe(took.as_secs_f64());
        if result == "ok" {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            self.last_success.with_label_values(&[source]).set(now);
        }
    }

    pub(crate) fn watch_event(&self, kind: &str) {
        self.watch_events.with_label_values(&[kind]).inc();
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, TextEncoder};

    use super::*;

    #[test]
    fn refreshes_are_counted_by_source_and_result() {
        let registry = Registry::new();
        let m = SourceMetrics::register(&registry).unwrap();
        m.refresh("kubernetes", "ok", Duration::from_millis(3));
        m.refresh("prometheus", "timeout", Duration::from_secs(1));
        m.watch_event("upsert");
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        for line in [
            "verwalter_placement_source_refreshes_total{result=\"ok\",source=\"kubernetes\"} 1",
            "verwalter_placement_source_refreshes_total{result=\"timeout\",source=\"prometheus\"} 1",
            "verwalter_placement_source_refresh_duration_seconds_count{source=\"prometheus\"} 1",
            "verwalter_placement_pod_watch_events_total{type=\"upsert\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert!(text.contains(
            "verwalter_placement_source_last_success_timestamp_seconds{source=\"kubernetes\"}"
        ));
        assert!(!text.contains(
            "verwalter_placement_source_last_success_timestamp_seconds{source=\"prometheus\"}"
        ));
        assert!(
            SourceMetrics::register(&registry).is_err(),
            "registered once"
        );
    }
}
