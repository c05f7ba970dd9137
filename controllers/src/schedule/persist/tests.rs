//! The persister under paused time with an in-memory store that can fail.

use std::sync::atomic::Ordering;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::machinery::store::Reader;
use crate::testing::{MemoryScheduleStore, disk_full};

struct Rig {
    saved: Arc<MemoryScheduleStore>,
    persister: Arc<Persister>,
    error: Reader<Option<String>>,
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

fn rig() -> Rig {
    let saved = Arc::new(MemoryScheduleStore::default());
    let field = Field::new(None);
    let error = field.reader();
    let persister = Arc::new(Persister::new(saved.clone(), field));
    let stop = CancellationToken::new();
    let config = DriverConfig {
        resync: Duration::from_secs(3600),
        seed: 1,
        ..DriverConfig::default()
    };
    let handle = tokio::spawn(persister.clone().driver(config).run(stop.clone()));
    Rig {
        saved,
        persister,
        error,
        stop,
        handle,
    }
}

fn schedule(n: u64) -> Schedule {
    Schedule::new(json!({"n": n}), 1_000 + n, "bb".repeat(16))
}

const FULL: &str = "schedule.json: No space left on device";

/// A follower's save of the leader's schedule that fails is reported and written again every
/// [`PERSIST_RETRY`] until it succeeds, then the report clears and nothing more is written.
#[tokio::test(start_paused = true)]
async fn a_failed_save_is_reported_and_retried_until_written() {
    let rig = rig();
    *rig.saved.fail.lock().unwrap() = Some(disk_full());
    let first = schedule(1);
    assert!(rig.persister.save(&first).is_err());
    assert_eq!(rig.error.peek().as_deref(), Some(FULL));
    tokio::time::sleep(PERSIST_RETRY + Duration::from_millis(1)).await;
    assert_eq!(rig.saved.failed.load(Ordering::SeqCst), 2, "retried");
    assert_eq!(rig.error.peek().as_deref(), Some(FULL));
    *rig.saved.fail.lock().unwrap() = None;
    tokio::time::sleep(PERSIST_RETRY).await;
    let written = rig.saved.saved.lock().unwrap().clone();
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].hash, first.hash);
    assert_eq!(*rig.error.peek(), None);
    tokio::time::sleep(PERSIST_RETRY * 4).await;
    assert_eq!(rig.saved.saved.lock().unwrap().len(), 1, "written once");
    assert_eq!(rig.saved.failed.load(Ordering::SeqCst), 2);
    rig.stop.cancel();
    rig.handle.await.unwrap();
}

/// A newer schedule that fails too replaces the older one: the retry writes the newer one, and
/// never the older after it.
#[tokio::test(start_paused = true)]
async fn a_retry_writes_the_latest_schedule_only() {
    let rig = rig();
    *rig.saved.fail.lock().unwrap() = Some(disk_full());
    let first = schedule(1);
    assert!(rig.persister.save(&first).is_err());
    tokio::time::sleep(PERSIST_RETRY / 2).await;
    let second = schedule(2);
    assert!(rig.persister.save(&second).is_err());
    *rig.saved.fail.lock().unwrap() = None;
    tokio::time::sleep(PERSIST_RETRY * 3).await;
    assert_eq!(rig.saved.hashes(), vec![second.hash.clone()]);
    assert_eq!(*rig.error.peek(), None);
    rig.stop.cancel();
    rig.handle.await.unwrap();
}
