//! The watchdog rule, alone and on a real driver under paused tokio time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::machinery::driver::{Driver, DriverConfig, Reconciler, Requeue};

const CHECK: Duration = Duration::from_secs(1);
const STEP_LIMIT: Duration = Duration::from_secs(60);

fn record(turned: Instant, passes: &[(&str, Instant)]) -> DriverRecord {
    DriverRecord {
        controller: "render",
        step_limit: STEP_LIMIT,
        turns: true,
        turned,
        passes: passes
            .iter()
            .enumerate()
            .map(|(i, (key, moved))| (i as u64, (key.to_string(), *moved)))
            .collect(),
        next_pass: passes.len() as u64,
    }
}

#[test]
fn a_loop_that_stopped_turning_is_a_stall() {
    let t0 = Instant::now();
    let limit = Duration::from_millis(500);
    let drivers = [record(t0, &[])];
    assert_eq!(decide(&drivers, t0 + limit, limit), Verdict::Alive);
    let Verdict::Stalled(stall) = decide(&drivers, t0 + limit * 3, limit) else {
        panic!("a loop silent for three limits is stuck");
    };
    assert_eq!((stall.controller, stall.key.as_deref()), ("render", None));
    assert_eq!(stall.idle, limit * 3);
    assert_eq!(
        stall.to_string(),
        "render loop not turning for 1500ms (limit 500ms)"
    );
}

#[test]
fn a_pass_past_its_step_limit_is_a_stall_and_the_longest_stuck_is_named() {
    let t0 = Instant::now();
    let now = t0 + Duration::from_secs(200);
    let turn = Duration::from_millis(500);
    let fine = [record(now, &[("web", now - STEP_LIMIT)])];
    assert_eq!(decide(&fine, now, turn), Verdict::Alive, "at the limit");
    let stuck = [record(
        now,
        &[
            ("web", now - STEP_LIMIT - Duration::from_secs(1)),
            ("db", t0),
            ("cache", now),
        ],
    )];
    let Verdict::Stalled(stall) = decide(&stuck, now, turn) else {
        panic!("passes past the limit");
    };
    assert_eq!(stall.key.as_deref(), Some("db"));
    assert_eq!(
        stall.to_string(),
        "render pass db stuck for 200s (limit 60s)"
    );
    assert_eq!(stall.what(), "render pass db past its limit of 60s");
}

#[test]
fn a_worker_need_not_turn_but_its_runs_have_a_limit() {
    let progress = Progress::watched(CHECK);
    let worker = progress.worker("scheduler", STEP_LIMIT);
    let t0 = Instant::now();
    let later = t0 + STEP_LIMIT * 10;
    assert_eq!(progress.verdict(later), Verdict::Alive, "idle for long");
    let run = worker.pass("run".into(), later);
    assert_eq!(progress.verdict(later + STEP_LIMIT), Verdict::Alive);
    let Verdict::Stalled(stall) = progress.verdict(later + STEP_LIMIT * 2) else {
        panic!("a run past its limit");
    };
    assert_eq!(stall.key.as_deref(), Some("run"));
    drop(run);
    assert_eq!(progress.verdict(later + STEP_LIMIT * 2), Verdict::Alive);
}

#[test]
fn nobody_watching_is_always_alive() {
    let progress = Progress::default();
    let t0 = Instant::now();
    let beat = progress.driver("render", STEP_LIMIT, t0);
    let _pass = beat.pass("web".into(), t0);
    assert_eq!(beat.turn_every(), None, "no idle turns without a watchdog");
    assert_eq!(
        progress.verdict(t0 + Duration::from_secs(3600)),
        Verdict::Alive
    );
}

/// Passes that wait for a permit of `gate`; with `step` set they mark a step each time they get
/// one and need `step` permits in all.
struct Hanging {
    gate: Arc<Semaphore>,
    steps: u32,
}

impl Reconciler for Hanging {
    type Key = &'static str;
    type Error = String;
    fn name(&self) -> &'static str {
        "render"
    }
    fn keys(&self) -> Vec<&'static str> {
        vec!["web"]
    }
    fn error_reason(&self, _: &String) -> &'static str {
        "test"
    }
    async fn reconcile(self: Arc<Self>, _key: &'static str) -> Result<Requeue, String> {
        for _ in 0..self.steps.max(1) {
            self.gate.acquire().await.unwrap().forget();
            mark_step();
        }
        Ok(None)
    }
}

fn config() -> DriverConfig {
    DriverConfig {
        resync: Duration::from_secs(3600),
        seed: 1,
        ..DriverConfig::default()
    }
}

/// A driver of `Hanging` watched by a fresh `Progress`; its gate; the stop token.
fn watched(steps: u32) -> (Progress, Arc<Semaphore>, CancellationToken) {
    let progress = Progress::watched(CHECK);
    let gate = Arc::new(Semaphore::new(0));
    let hanging = Arc::new(Hanging {
        gate: gate.clone(),
        steps,
    });
    let stop = CancellationToken::new();
    let driver = Driver::new(hanging, config()).progress(&progress, STEP_LIMIT);
    tokio::spawn(driver.run(stop.clone()));
    (progress, gate, stop)
}

async fn advance(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_driver_keeps_turning_and_a_finished_pass_is_forgotten() {
    let (progress, gate, stop) = watched(1);
    gate.add_permits(1);
    for _ in 0..600 {
        advance(CHECK).await;
        assert_eq!(progress.verdict(Instant::now()), Verdict::Alive);
    }
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_pass_that_hangs_past_its_limit_stops_the_verdict_until_it_ends() {
    let (progress, gate, stop) = watched(1);
    advance(STEP_LIMIT).await;
    assert_eq!(
        progress.verdict(Instant::now()),
        Verdict::Alive,
        "a long pass within its limit is fine"
    );
    advance(CHECK).await;
    let Verdict::Stalled(stall) = progress.verdict(Instant::now()) else {
        panic!("past the step limit");
    };
    assert_eq!(stall.key.as_deref(), Some("\"web\""));
    gate.add_permits(1);
    advance(Duration::from_millis(10)).await;
    assert_eq!(progress.verdict(Instant::now()), Verdict::Alive, "it ended");
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn steps_restart_the_limit_and_a_pass_aborted_at_shutdown_is_forgotten() {
    let (progress, gate, stop) = watched(10);
    // Five steps, each taking most of the limit: five limits long in all, never stuck.
    for _ in 0..5 {
        advance(STEP_LIMIT - CHECK).await;
        assert_eq!(progress.verdict(Instant::now()), Verdict::Alive);
        gate.add_permits(1);
    }
    advance(STEP_LIMIT + CHECK).await;
    assert!(matches!(
        progress.verdict(Instant::now()),
        Verdict::Stalled(_)
    ));
    stop.cancel();
    // The driver aborts the pass after its shutdown grace (5 s).
    advance(Duration::from_secs(6)).await;
    let records = lock(&progress.records);
    assert!(records.drivers[0].passes.is_empty(), "{records:?}");
}

#[test]
fn the_watchdog_is_ours_unless_watchdog_pid_names_another_process() {
    let two_s = Some(Duration::from_secs(2));
    // libsystemd's sd_watchdog_enabled: an unset WATCHDOG_PID means any process.
    assert_eq!(enabled(Some("2000000"), None, 42), two_s);
    assert_eq!(enabled(Some("2000000"), Some("42"), 42), two_s);
    assert_eq!(enabled(Some("2000000"), Some("43"), 42), None);
    assert_eq!(enabled(Some("2000000"), Some("0"), 42), None, "not a pid");
    assert_eq!(enabled(Some("2000000"), Some("x"), 42), None, "not a pid");
    assert_eq!(enabled(None, None, 42), None, "no interval: not watched");
    assert_eq!(enabled(Some("0"), None, 42), None);
    assert_eq!(enabled(Some("-1"), None, 42), None);
    assert_eq!(enabled(Some("soon"), Some("42"), 42), None);
    assert_eq!(
        enabled(Some(&u64::MAX.to_string()), None, 42),
        None,
        "infinity"
    );
}
