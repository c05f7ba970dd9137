//! The shadow schedulers' metric families (docs/metrics.md#shadow-schedulers).

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::records::Outcome;
use crate::metrics::Families;

pub(crate) struct ShadowMetrics {
    runs: IntCounterVec,
    duration: HistogramVec,
    paths_differing: IntGaugeVec,
    config_problems: IntGauge,
    write_errors: IntCounterVec,
}

/// Run durations up to the longest budget the settings allow.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

impl ShadowMetrics {
    /// Creates the families and registers them on `registry`.
    pub(crate) fn register(registry: &Registry) -> ShadowMetrics {
        let f = Families(registry);
        ShadowMetrics {
            runs: f.counter_vec(
                "verwalter_shadow_runs_total",
                "Shadow scheduler runs, by shadow and result (identical, differs, real_failed, failed, skipped).",
                &["shadow", "result"],
            ),
            duration: f.register(
                HistogramVec::new(
                    HistogramOpts::new(
                        "verwalter_shadow_run_duration_seconds",
                        "Duration of shadow scheduler runs (skipped ones not counted).",
                    )
                    .buckets(BUCKETS.to_vec()),
                    &["shadow"],
                )
                .expect("valid metric"),
            ),
            paths_differing: f.gauge_vec(
                "verwalter_shadow_paths_differing",
                "JSON paths in which the shadow's last schedule differs from the real one (0: identical).",
                &["shadow"],
            ),
            write_errors: f.counter_vec(
                "verwalter_shadow_write_errors_total",
                "Shadow runs that could not be written to the storage dir (kept in memory only).",
                &["shadow"],
            ),
            config_problems: f.gauge(
                "verwalter_shadow_config_problems",
                "Problems in scheduler/shadow.yaml as the last real round read it.",
            ),
        }
    }

    /// A run of `shadow` was written to the storage dir, or could not be (`failed`).
    pub(crate) fn write(&self, shadow: &str, failed: bool) {
        let counter = self.write_errors.with_label_values(&[shadow]);
        if failed {
            counter.inc();
        }
    }

    /// A run of `shadow` ended with `result`, after `duration` when it ran, `paths` differing
    /// when it was compared.
    pub(crate) fn run(
        &self,
        shadow: &str,
        result: Outcome,
        duration: Option<Duration>,
        paths: Option<usize>,
    ) {
        for known in Outcome::ALL {
            // Every result of a shadow shows, at 0 until it happens.
            let _ = self.runs.with_label_values(&[shadow, known.label()]);
        }
        self.runs.with_label_values(&[shadow, result.label()]).inc();
        if let Some(duration) = duration {
            self.duration
                .with_label_values(&[shadow])
                .observe(duration.as_secs_f64());
        }
        if let Some(paths) = paths {
            self.paths_differing
                .with_label_values(&[shadow])
                .set(paths as i64);
        }
    }

    pub(crate) fn config_problems(&self, problems: usize) {
        self.config_problems.set(problems as i64);
    }
}
