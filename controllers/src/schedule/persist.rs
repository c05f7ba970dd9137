//! Writing the schedule in force to the storage dir, for both roles.
//!
//! Whoever puts a schedule in force (the leader's schedule controller, a follower's fetcher)
//! saves it through the one [`Persister`] first. A schedule that could not be written is still
//! in force; the persister writes it again every [`PERSIST_RETRY`] until it succeeds or a later
//! schedule is saved, whatever the node's role meanwhile (a leader that steps down still holds
//! its unsaved schedule). The failure is the store's `persist_error` until then: one field, one
//! writer, the same report whichever path failed.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::machinery::driver::{Driver, DriverConfig, Reconciler, Requeue};
use crate::machinery::ports::{ScheduleStore, StorageError};
use crate::machinery::store::Field;
use crate::state::Schedule;

/// How soon a schedule that could not be written is written again. A full or read-only disk is
/// fixed by an operator in minutes, so a few seconds lose nothing, and a failing write of a large
/// schedule is not repeated in a tight loop.
pub(crate) const PERSIST_RETRY: Duration = Duration::from_secs(5);

/// The schedule in force that the storage dir has not taken yet.
struct Unsaved {
    schedule: Schedule,
    /// When the last write failed: the next one is due [`PERSIST_RETRY`] after it.
    failed_at: Instant,
}

pub struct Persister {
    store: Arc<dyn ScheduleStore>,
    /// The store's `persist_error`; written only here.
    error: Field<Option<String>>,
    /// Held across every write, so that a retry of an older schedule never lands on disk after a
    /// newer one.
    unsaved: Mutex<Option<Unsaved>>,
}

impl Persister {
    pub fn new(store: Arc<dyn ScheduleStore>, error: Field<Option<String>>) -> Persister {
        Persister {
            store,
            error,
            unsaved: Mutex::new(None),
        }
    }

    /// Writes `schedule`, which the caller puts in force next whatever the outcome. On failure
    /// it is kept and written again later; it replaces any older schedule still waiting to be
    /// written.
    pub fn save(&self, schedule: &Schedule) -> Result<(), StorageError> {
        let mut unsaved = self.unsaved.lock().unwrap();
        let result = self.store.save(schedule);
        *unsaved = result.as_ref().err().map(|_| Unsaved {
            schedule: schedule.clone(),
            failed_at: Instant::now(),
        });
        self.report(result.as_ref().err().map(ToString::to_string));
        result
    }

    /// Writes the waiting schedule again if the retry is due. Returns when to look again, `None`
    /// when nothing is left unwritten.
    fn retry(&self) -> Option<Duration> {
        let mut unsaved = self.unsaved.lock().unwrap();
        let pending = unsaved.as_mut()?;
        let due = pending.failed_at + PERSIST_RETRY;
        let now = Instant::now();
        if now < due {
            return Some(due - now);
        }
        let result = self.store.save(&pending.schedule);
        let retry = match &result {
            Ok(()) => {
                *unsaved = None;
                None
            }
            Err(_) => {
                pending.failed_at = Instant::now();
                Some(PERSIST_RETRY)
            }
        };
        self.report(result.err().map(|e| e.to_string()));
        retry
    }

    /// Records the outcome of a write; logs when the failure starts, changes or ends.
    fn report(&self, error: Option<String>) {
        let changed = self.error.set(error.clone());
        match (&error, changed) {
            (Some(error), true) => {
                tracing::error!(%error, retry_in_ms = PERSIST_RETRY.as_millis() as u64, "Cannot persist the schedule; it is in force but will not survive a restart until written.");
            }
            (None, true) => tracing::info!("Persisted the schedule in force."),
            _ => {}
        }
    }

    /// A driver that retries failed writes; woken when a write fails.
    pub fn driver(self: Arc<Self>, config: DriverConfig) -> Driver<Persister> {
        let wake = self.error.reader().trigger();
        Driver::new(
            self,
            DriverConfig {
                max_concurrent: 1,
                ..config
            },
        )
        .trigger(wake)
    }
}

impl Reconciler for Persister {
    type Key = ();
    type Error = Infallible;

    fn name(&self) -> &'static str {
        "persist"
    }

    fn keys(&self) -> Vec<()> {
        vec![()]
    }

    async fn reconcile(self: Arc<Self>, _key: ()) -> Result<Requeue, Infallible> {
        Ok(self.retry())
    }

    fn error_reason(&self, error: &Infallible) -> &'static str {
        match *error {}
    }
}

#[cfg(test)]
mod tests;
