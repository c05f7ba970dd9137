//! The render controller's metric families: failing and held roles, the latest deployment and
//! the deployment log (docs/metrics.md).

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Registry};
use verwalter_controllers::state::BlockedState;
use verwalter_controllers::status::{Snapshot, Status};

use crate::metrics::{Families, MAX_ROLE_SERIES};

pub(crate) struct RenderMetrics {
    pub(crate) roles_failing: IntGauge,
    pub(crate) roles_held: IntGaugeVec,
    pub(crate) role_failed_attempts: IntGaugeVec,
    pub(crate) last_deployment: IntGauge,
    pub(crate) deployment_log_write_errors: IntCounter,
    /// Roles with a `role_failed_attempts` series now (to drop series of recovered roles).
    failing_series: Mutex<BTreeSet<String>>,
}

impl RenderMetrics {
    /// Creates the families and registers them on `registry`.
    pub(crate) fn register(registry: &Registry) -> RenderMetrics {
        let f = Families(registry);
        RenderMetrics {
            roles_failing: f.gauge(
                "verwalter_roles_failing",
                "Roles of this node whose last render or apply failed.",
            ),
            roles_held: f.gauge_vec(
                "verwalter_roles_held",
                "Roles of this node held back by depends_on: waiting for a dependency to apply, or blocked by its failure (or a halt).",
                &["state"],
            ),
            role_failed_attempts: f.gauge_vec(
                "verwalter_role_failed_attempts",
                "Failed attempts in a row of each failing role (first 100 roles by name).",
                &["role"],
            ),
            last_deployment: f.gauge(
                "verwalter_last_deployment_timestamp_seconds",
                "Unix time the latest render pass started (0: none since start).",
            ),
            deployment_log_write_errors: f.counter(
                "verwalter_deployment_log_write_errors_total",
                "Writes to the deployment log that failed (deployments go on without them).",
            ),
            failing_series: Mutex::default(),
        }
    }

    /// The gauges of the roles: from `status`, and each failing role's attempts from the
    /// snapshot's roles.
    pub(crate) fn refresh(&self, status: &Status, snapshot: &Snapshot) {
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
}
