//! The cleanup controller: removes what no longer belongs. On every new schedule and at the
//! resync period (hourly by default): roles gone from this node's schedule lose their failure
//! state and applied hash; then the [`Sweeper`] port deletes logs and schedule backups past
//! retention (and takes this period's schedule backup). The sweep reads directories, so while
//! schedules keep coming with the same roles for this node it runs at most once every
//! [`SWEEP_GAP`] (the pass is requeued for the end of the gap, so the last state is swept);
//! a change of this node's roles is swept at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::machinery::clock::Clock;
use crate::machinery::driver::{Driver, DriverConfig, Reconciler, Requeue};
use crate::machinery::ports::StorageError;
use crate::node::Store;
use crate::render::RenderController;

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

/// Sweeps with the same roles for this node are at least this far apart.
pub(crate) const SWEEP_GAP: Duration = Duration::from_secs(10);

pub struct CleanupController {
    store: Store,
    render: Arc<RenderController>,
    sweeper: Arc<dyn Sweeper>,
    clock: Arc<dyn Clock>,
    /// When the last sweep that succeeded began (wall-clock ms), and the roles it kept.
    last: Mutex<Option<(u64, Option<BTreeSet<String>>)>>,
}

impl CleanupController {
    pub fn new(
        store: Store,
        render: Arc<RenderController>,
        sweeper: Arc<dyn Sweeper>,
        clock: Arc<dyn Clock>,
    ) -> CleanupController {
        CleanupController {
            store,
            render,
            sweeper,
            clock,
            last: Mutex::new(None),
        }
    }

    /// How long until a sweep keeping `roles` is due (zero: now).
    fn sweep_due_in(&self, roles: &Option<BTreeSet<String>>, now_ms: u64) -> Duration {
        match &*self.last.lock().unwrap() {
            Some((at, kept)) if kept == roles => {
                SWEEP_GAP.saturating_sub(Duration::from_millis(now_ms.saturating_sub(*at)))
            }
            _ => Duration::ZERO,
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
        let now_ms = self.clock.now_ms();
        let wait = self.sweep_due_in(&roles, now_ms);
        if !wait.is_zero() {
            return Ok(Some(wait));
        }
        self.sweeper.sweep(roles.clone()).await?;
        *self.last.lock().unwrap() = Some((now_ms, roles));
        Ok(Requeue::None)
    }

    fn error_reason(&self, _error: &SweepError) -> &'static str {
        "sweep"
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;
    use crate::node::StoreWriter;
    use crate::state::Schedule;
    use crate::testing::{
        FakeApplier, FakeClock, MemoryAppliedStore, RecordingDeploymentLog, templates,
    };

    /// Counts sweeps and the roles each kept; fails while `fail` is set.
    #[derive(Default)]
    struct Counting {
        kept: Mutex<Vec<Option<BTreeSet<String>>>>,
        fail: std::sync::atomic::AtomicBool,
        calls: AtomicUsize,
    }

    impl Sweeper for Counting {
        fn sweep(
            &self,
            roles: Option<BTreeSet<String>>,
        ) -> BoxFuture<'static, Result<(), SweepError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let failed = self.fail.load(Ordering::SeqCst);
            if !failed {
                self.kept.lock().unwrap().push(roles);
            }
            Box::pin(async move {
                match failed {
                    true => Err(SweepError::Interrupted("disk gone".into())),
                    false => Ok(()),
                }
            })
        }
    }

    fn schedule(roles: serde_json::Value, at: u64) -> Option<Schedule> {
        Some(Schedule::new(
            json!({"vars": {"template": "app/v1"}, "nodes": {"alpha": {"roles": roles}}}),
            at,
            "0123456789abcdef0123456789abcdef".into(),
        ))
    }

    #[tokio::test]
    async fn schedules_with_the_same_roles_are_swept_once_a_gap_and_new_roles_at_once() {
        let writer = StoreWriter::new(None);
        let store = writer.store();
        writer.templates.set(templates(&[("app/v1/a.hbs", "h1")]));
        let clock = FakeClock::at(1_600_000_000_000);
        let render = Arc::new(RenderController::new(
            store.clone(),
            "alpha".into(),
            writer.roles,
            Arc::new(FakeApplier::default()),
            Arc::new(MemoryAppliedStore::default()),
            Arc::new(RecordingDeploymentLog::default()),
            clock.clone(),
        ));
        let sweeper = Arc::new(Counting::default());
        let cleanup = Arc::new(CleanupController::new(
            store,
            render,
            sweeper.clone(),
            clock.clone(),
        ));
        let pass = || cleanup.clone().reconcile(());
        let web: BTreeSet<String> = ["web".to_string()].into();

        writer.schedule.set(schedule(json!({"web": {}}), 1));
        assert_eq!(pass().await.unwrap(), None);
        assert_eq!(*sweeper.kept.lock().unwrap(), vec![Some(web.clone())]);

        // Another schedule a second later, the same roles: not swept now, but at the gap's end.
        clock.advance(Duration::from_secs(1));
        writer.schedule.set(schedule(json!({"web": {"v": 2}}), 2));
        assert_eq!(pass().await.unwrap(), Some(Duration::from_secs(9)));
        assert_eq!(sweeper.calls.load(Ordering::SeqCst), 1);
        clock.advance(Duration::from_secs(9));
        assert_eq!(pass().await.unwrap(), None);
        assert_eq!(sweeper.calls.load(Ordering::SeqCst), 2);

        // This node's roles change: swept at once, whatever the gap.
        clock.advance(Duration::from_millis(100));
        writer
            .schedule
            .set(schedule(json!({"web": {}, "db": {}}), 3));
        assert_eq!(pass().await.unwrap(), None);
        let both: BTreeSet<String> = ["db".to_string(), "web".to_string()].into();
        assert_eq!(
            sweeper.kept.lock().unwrap().last(),
            Some(&Some(both.clone()))
        );

        // A sweep that fails does not count: the next pass sweeps again, gap or not.
        clock.advance(SWEEP_GAP);
        writer
            .schedule
            .set(schedule(json!({"web": {"v": 3}, "db": {}}), 4));
        sweeper.fail.store(true, Ordering::SeqCst);
        assert!(pass().await.is_err());
        sweeper.fail.store(false, Ordering::SeqCst);
        clock.advance(Duration::from_millis(100));
        assert_eq!(pass().await.unwrap(), None);
        assert_eq!(sweeper.calls.load(Ordering::SeqCst), 5);
        assert_eq!(sweeper.kept.lock().unwrap().len(), 4);
    }
}
