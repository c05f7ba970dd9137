//! Driver behaviour under paused tokio time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::Semaphore;

use super::*;
use crate::machinery::store::Field;

/// Records every pass; fails while `failures_left > 0`; waits for a permit when `gate` is set.
struct Probe {
    passes: Mutex<Vec<(u32, Instant)>>,
    failures_left: AtomicU32,
    requeue: Option<Duration>,
    gate: Option<Arc<Semaphore>>,
    keys: Mutex<Vec<u32>>,
}

impl Probe {
    fn new() -> Probe {
        Probe {
            passes: Mutex::new(Vec::new()),
            failures_left: AtomicU32::new(0),
            requeue: None,
            gate: None,
            keys: Mutex::new(vec![1]),
        }
    }
    fn count(&self) -> usize {
        self.passes.lock().unwrap().len()
    }
    fn times(&self) -> Vec<Instant> {
        self.passes.lock().unwrap().iter().map(|p| p.1).collect()
    }
}

impl Reconciler for Probe {
    type Key = u32;
    type Error = String;
    fn name(&self) -> &'static str {
        "probe"
    }
    fn keys(&self) -> Vec<u32> {
        self.keys.lock().unwrap().clone()
    }
    fn error_reason(&self, _: &String) -> &'static str {
        "test"
    }
    async fn reconcile(self: Arc<Self>, key: u32) -> Result<Requeue, String> {
        self.passes.lock().unwrap().push((key, Instant::now()));
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        if self.failures_left.load(Ordering::SeqCst) > 0 {
            self.failures_left.fetch_sub(1, Ordering::SeqCst);
            return Err("boom".into());
        }
        Ok(self.requeue)
    }
}

fn config() -> DriverConfig {
    DriverConfig {
        resync: Duration::from_secs(3600),
        backoff: Backoff {
            jitter: 0.0,
            ..Backoff::default()
        },
        max_concurrent: 4,
        shutdown_grace: Duration::from_secs(5),
        seed: 7,
    }
}

/// A probe whose passes each wait for a permit of the returned semaphore.
fn gated_probe() -> (Arc<Probe>, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    let probe = Arc::new(Probe {
        gate: Some(gate.clone()),
        ..Probe::new()
    });
    (probe, gate)
}

/// A driver running in its own task.
struct Running {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

fn spawn_driver(driver: Driver<Probe>) -> Running {
    let stop = CancellationToken::new();
    let handle = tokio::spawn(driver.run(stop.clone()));
    Running { stop, handle }
}

impl Running {
    /// Shuts the driver down and waits for it to end.
    async fn stop(self) {
        self.stop.cancel();
        self.handle.await.unwrap();
    }
}

/// Lets spawned tasks and timers run up to `d` of virtual time.
async fn advance(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test(start_paused = true)]
async fn runs_at_start_and_on_change_but_not_on_equal_writes() {
    let probe = Arc::new(Probe::new());
    let field = Field::new(0u32);
    let running =
        spawn_driver(Driver::new(probe.clone(), config()).trigger(field.reader().trigger()));
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 1, "first pass at start");
    field.set(0);
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 1, "an equal write wakes no one");
    field.set(1);
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 2, "a change runs a pass");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn one_running_plus_one_pending_per_key() {
    let (probe, gate) = gated_probe();
    let field = Field::new(0u32);
    let running =
        spawn_driver(Driver::new(probe.clone(), config()).trigger(field.reader().trigger()));
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 1);
    for i in 1..=5 {
        field.set(i);
        advance(Duration::from_millis(10)).await;
    }
    assert_eq!(probe.count(), 1, "no second pass while the first runs");
    gate.add_permits(1);
    advance(Duration::from_millis(10)).await;
    assert_eq!(
        probe.count(),
        2,
        "five changes while running give exactly one more pass"
    );
    gate.add_permits(10);
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 2);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_and_success_resets() {
    let probe = Arc::new(Probe::new());
    probe.failures_left.store(3, Ordering::SeqCst);
    let start = Instant::now();
    let running = spawn_driver(Driver::new(probe.clone(), config()));
    advance(Duration::from_secs(20)).await;
    let offsets: Vec<u64> = probe
        .times()
        .iter()
        .map(|t| (*t - start).as_millis() as u64)
        .collect();
    // Fail at 0, retry after 1 s, fail, retry after 2 s, fail, retry after 4 s, succeed.
    assert_eq!(offsets, vec![0, 1000, 3000, 7000]);
    // After the success the key is quiet until something happens.
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn backoff_is_capped_and_jittered_within_bounds() {
    let backoff = Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(300),
        factor: 2.0,
        jitter: 0.25,
    };
    let mut rng = SmallRng::seed_from_u64(1);
    for failures in 1..40 {
        let d = backoff.delay(failures, &mut rng);
        let full = (1u64 << (failures - 1).min(20)).min(300) as f64;
        assert!(d.as_secs_f64() <= full + 1e-9, "{failures}: {d:?}");
        assert!(d.as_secs_f64() >= full * 0.75 - 1e-9, "{failures}: {d:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_retries_at_once_during_backoff() {
    let probe = Arc::new(Probe::new());
    probe.failures_left.store(5, Ordering::SeqCst);
    let field = Field::new(0u32);
    let running =
        spawn_driver(Driver::new(probe.clone(), config()).trigger(field.reader().trigger()));
    // Passes at 0, 1 s, 3 s; next backoff is 4 s (until 7 s).
    advance(Duration::from_millis(3500)).await;
    assert_eq!(probe.count(), 3);
    field.set(1);
    advance(Duration::from_millis(10)).await;
    assert_eq!(
        probe.count(),
        4,
        "the change is tried without waiting for the backoff"
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn requeue_and_resync_wake_the_key() {
    let probe = Arc::new(Probe {
        requeue: Some(Duration::from_secs(10)),
        ..Probe::new()
    });
    let running = spawn_driver(Driver::new(probe.clone(), config()));
    advance(Duration::from_secs(35)).await;
    assert_eq!(probe.count(), 4, "passes at 0, 10, 20, 30 s");
    running.stop().await;

    let probe = Arc::new(Probe::new());
    let cfg = DriverConfig {
        resync: Duration::from_secs(60),
        ..config()
    };
    let running = spawn_driver(Driver::new(probe.clone(), cfg));
    advance(Duration::from_secs(150)).await;
    assert_eq!(
        probe.count(),
        3,
        "passes at 0, 60, 120 s from the resync alone"
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn keys_run_concurrently_up_to_the_limit() {
    let (probe, gate) = gated_probe();
    *probe.keys.lock().unwrap() = (1..=6).collect();
    let cfg = DriverConfig {
        max_concurrent: 2,
        ..config()
    };
    let running = spawn_driver(Driver::new(probe.clone(), cfg));
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 2);
    gate.add_permits(1);
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 3);
    gate.add_permits(10);
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 6);
    let mut keys: Vec<u32> = probe.passes.lock().unwrap().iter().map(|p| p.0).collect();
    keys.sort();
    assert_eq!(keys, vec![1, 2, 3, 4, 5, 6]);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_a_running_pass() {
    let (probe, gate) = gated_probe();
    let running = spawn_driver(Driver::new(probe.clone(), config()));
    advance(Duration::from_millis(10)).await;
    running.stop.cancel();
    advance(Duration::from_millis(100)).await;
    assert!(!running.handle.is_finished(), "shutdown waits for the pass");
    gate.add_permits(1);
    advance(Duration::from_millis(10)).await;
    assert!(running.handle.is_finished());
    // A pass that never ends is aborted after the grace period.
    let (probe, _gate) = gated_probe();
    let running = spawn_driver(Driver::new(probe, config()));
    advance(Duration::from_millis(10)).await;
    running.stop.cancel();
    advance(Duration::from_secs(6)).await;
    assert!(running.handle.is_finished());
}

#[tokio::test(start_paused = true)]
async fn a_wake_for_a_key_learned_since_the_scan_rescans_and_others_are_ignored() {
    let probe = Arc::new(Probe::new());
    let (wake, wakes) = tokio::sync::mpsc::unbounded_channel();
    let running = spawn_driver(Driver::new(probe.clone(), config()).wake_keys(wakes));
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 1, "key 1 at start");
    // Key 2 is not a key (yet): its wake is ignored.
    wake.send(2).unwrap();
    advance(Duration::from_millis(10)).await;
    assert_eq!(probe.count(), 1);
    // Now the reconciler lists 2 and 3: waking 2 scans, so both run.
    *probe.keys.lock().unwrap() = vec![1, 2, 3];
    wake.send(2).unwrap();
    advance(Duration::from_millis(10)).await;
    let mut keys: Vec<u32> = probe.passes.lock().unwrap().iter().map(|p| p.0).collect();
    keys.sort();
    assert_eq!(keys, vec![1, 1, 2, 3]);
    running.stop().await;
}
