//! The cleanup controller: removes what no longer belongs. On every new schedule and at the
//! resync period (hourly by default): roles gone from this node's schedule lose their failure
//! state and applied hash; then the [`Sweeper`] port deletes logs and schedule backups past
//! retention (and takes this period's schedule backup).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::driver::{Driver, DriverConfig, Reconciler, Requeue};
use crate::ports::StorageError;
use crate::render::RenderController;
use crate::store::Store;

/// Housekeeping with IO: log retention, schedule backups, stale staging files.
pub trait Sweeper: Send + Sync + 'static {
    /// `roles`: the roles of this node now, or `None` before the first schedule.
    fn sweep(&self, roles: Option<BTreeSet<String>>) -> BoxFuture<'static, Result<(), SweepError>>;
}

/// Why a sweep stopped; the next sweep tries again (the driver's backoff).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// Deployment log files past retention could not be listed or deleted.
    #[error("log retention: {0}")]
    Logs(StorageError),
    /// A schedule backup could not be written, or an old one deleted.
    #[error("schedule backups: {0}")]
    Backups(StorageError),
    /// The sweep could not run to its end (its thread panicked or was cancelled).
    #[error("sweep: {0}")]
    Interrupted(String),
}

pub struct CleanupController {
    store: Store,
    render: Arc<RenderController>,
    sweeper: Arc<dyn Sweeper>,
}

impl CleanupController {
    pub fn new(
        store: Store,
        render: Arc<RenderController>,
        sweeper: Arc<dyn Sweeper>,
    ) -> CleanupController {
        CleanupController {
            store,
            render,
            sweeper,
        }
    }

    /// A driver that wakes on a new schedule and every `period`.
    pub fn driver(self: Arc<Self>, config: DriverConfig, period: Duration) -> Driver<Self> {
        let store = self.store.clone();
        Driver::new(
            self,
            DriverConfig {
                resync: period,
                max_concurrent: 1,
                ..config
            },
        )
        .trigger(store.schedule.trigger())
    }
}

impl Reconciler for CleanupController {
    type Key = ();
    type Error = SweepError;

    fn name(&self) -> &'static str {
        "cleanup"
    }

    fn keys(&self) -> Vec<()> {
        vec![()]
    }

    async fn reconcile(self: Arc<Self>, _key: ()) -> Result<Requeue, SweepError> {
        // Without a schedule, or while its roles are not known, nothing is known to be gone.
        let roles = self.render.node_roles();
        if let Some(keep) = &roles {
            let gone = self.render.retain_roles(keep);
            if !gone.is_empty() {
                tracing::info!(roles = ?gone, "Forgot roles no longer assigned to this node.");
            }
        }
        self.sweeper.sweep(roles).await?;
        Ok(Requeue::None)
    }

    fn error_reason(&self, _error: &SweepError) -> &'static str {
        "sweep"
    }
}
