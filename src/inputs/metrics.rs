//! The inputs watcher's metric families: reads of the config dir (docs/metrics.md).

use prometheus::{IntCounter, IntGauge, Registry};

use crate::metrics::Families;

pub(crate) struct InputMetrics {
    pub(crate) reads: IntCounter,
    pub(crate) errors: IntGauge,
    pub(crate) read_failures: IntCounter,
}

impl InputMetrics {
    /// Creates the families and registers them on `registry`.
    pub(crate) fn register(registry: &Registry) -> InputMetrics {
        let f = Families(registry);
        InputMetrics {
            reads: f.counter("verwalter_input_reads_total", "Reads of the config dir."),
            errors: f.gauge(
                "verwalter_input_errors",
                "Input files that could not be read or parsed.",
            ),
            read_failures: f.counter(
                "verwalter_input_read_failures_total",
                "Reads of the config dir that could not read a file or dir that exists; the last good inputs were kept.",
            ),
        }
    }
}
