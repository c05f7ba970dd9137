//! The shadow gate alone, and the schedule controller handing it published rounds (paused
//! time, fake scheduler, fake clock).

use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::cluster::election::ElectionState;
use crate::machinery::clock::Clock;
use crate::machinery::driver::DriverConfig;
use crate::node::{Store, StoreWriter};
use crate::schedule::persist::Persister;
use crate::schedule::{Identity, ScheduleController, ScheduleDeps, ScheduleOutputs};
use crate::testing::{CountingObserver, FakeClock, FakeScheduler, MemoryScheduleStore, inputs};

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn start(shadow: &str, run: RunId) -> Decision {
    Decision::Start {
        shadow: shadow.into(),
        run,
    }
}

#[test]
fn each_free_shadow_starts_on_a_published_round_with_its_own_run_number() {
    let clock = FakeClock::at(5_000);
    let mut gate = ShadowGate::new(7);
    assert_eq!(
        gate.published(&names(&["v2", "v3", "v2"]), clock.now_ms()),
        vec![start("v2", 7), start("v3", 8)],
        "a shadow named twice runs once"
    );
    assert_eq!(gate.busy_with("v2"), Some(7));
    gate.finished("v2", 7);
    gate.finished("v3", 8);
    assert_eq!(gate.busy_with("v2"), None);
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        gate.published(&names(&["v2"]), clock.now_ms()),
        vec![start("v2", 9)]
    );
}

#[test]
fn a_busy_shadow_is_skipped_never_queued_and_takes_the_round_after_it_finishes() {
    let clock = FakeClock::at(1_000);
    let mut gate = ShadowGate::new(1);
    assert_eq!(
        gate.published(&names(&["slow", "fast"]), clock.now_ms()),
        vec![start("slow", 1), start("fast", 2)]
    );
    gate.finished("fast", 2);
    clock.advance(Duration::from_secs(10));
    let skip = |run| Decision::Skip {
        shadow: "slow".into(),
        run,
        busy_with: 1,
        busy_since_ms: 1_000,
    };
    // Two rounds while `slow` is stuck: each is a skip, the free shadow runs every time.
    assert_eq!(
        gate.published(&names(&["slow", "fast"]), clock.now_ms()),
        vec![skip(3), start("fast", 4)]
    );
    gate.finished("fast", 4);
    assert_eq!(
        gate.published(&names(&["slow", "fast"]), clock.now_ms()),
        vec![skip(5), start("fast", 6)]
    );
    // The end of a skipped run or of another shadow's run frees nothing.
    gate.finished("slow", 3);
    gate.finished("fast", 1);
    assert_eq!(gate.busy_with("slow"), Some(1));
    // Its run returns: nothing queued runs now, the next round is its.
    gate.finished("slow", 1);
    assert_eq!(gate.busy_with("slow"), None);
    assert_eq!(
        gate.published(&names(&["slow"]), clock.now_ms()),
        vec![start("slow", 7)]
    );
}

#[test]
fn run_numbers_start_at_one_and_never_repeat_across_shadows() {
    let mut gate = ShadowGate::new(0);
    let first = gate.published(&names(&["a"]), 0);
    let second = gate.published(&names(&["a", "b"]), 0);
    let runs: Vec<RunId> = first.iter().chain(&second).map(Decision::run).collect();
    assert_eq!(runs, vec![1, 2, 3]);
}

/// What the hook saw of each published round, and the gate's decisions for it.
struct Seen {
    /// The schedule in force when the hook was called.
    in_force: Option<String>,
    /// Whether the scheduler status already named this round's input.
    status_has_input: bool,
    outcome: Result<String, String>,
    decisions: Vec<Decision>,
}

/// A leader's hook: one shadow, `stuck`, whose runs never end (nothing ever calls `finished`).
struct StuckShadow {
    store: Store,
    clock: Arc<FakeClock>,
    gate: Mutex<ShadowGate>,
    seen: Mutex<Vec<Seen>>,
}

impl ShadowHook for StuckShadow {
    fn published(&self, round: RealRound) {
        let in_force = self
            .store
            .schedule
            .peek()
            .as_ref()
            .as_ref()
            .map(|s| s.hash.clone());
        let status = self.store.scheduler.peek();
        let status_has_input = status
            .last_input
            .as_ref()
            .is_some_and(|i| Arc::ptr_eq(i, &round.input));
        let decisions = self
            .gate
            .lock()
            .unwrap()
            .published(&names(&["stuck"]), self.clock.now_ms());
        self.seen.lock().unwrap().push(Seen {
            in_force,
            status_has_input,
            outcome: round.outcome.map(|(hash, _)| hash),
            decisions,
        });
    }
}

#[tokio::test(start_paused = true)]
async fn rounds_reach_the_shadows_only_published_and_a_stuck_shadow_holds_back_no_real_round() {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    let StoreWriter {
        inputs: inputs_field,
        election,
        schedule,
        scheduler: status,
        parents,
        persist_error,
        ..
    } = writer;
    election.set(ElectionState {
        is_leader: true,
        epoch: 1,
        ..Default::default()
    });
    inputs_field.set(inputs(json!({"app": {"v1": {}}})));
    let scheduler = Arc::new(FakeScheduler::default());
    let clock = FakeClock::at(1_000);
    let hook = Arc::new(StuckShadow {
        store: store.clone(),
        clock: clock.clone(),
        gate: Mutex::new(ShadowGate::new(1)),
        seen: Mutex::new(Vec::new()),
    });
    let period = Duration::from_secs(10);
    let controller = ScheduleController::new(
        store.clone(),
        ScheduleOutputs {
            schedule: Arc::new(schedule),
            status,
            parents,
        },
        ScheduleDeps {
            scheduler: scheduler.clone(),
            persist: Arc::new(Persister::new(
                Arc::new(MemoryScheduleStore::default()),
                persist_error,
            )),
            clock: clock.clone(),
            observer: Arc::new(CountingObserver::default()),
            identity: Identity {
                id: "aa".repeat(16),
                hostname: "alpha".into(),
            },
            period,
            datacenters: None,
        },
    )
    .with_shadows(hook.clone());
    let stop = CancellationToken::new();
    let handle = tokio::spawn(
        Arc::new(controller)
            .driver(DriverConfig::default())
            .run(stop.clone()),
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(scheduler.runs(), 1);
    // The next round fails: the shadows get it too, with the real error.
    scheduler.fail_next("boom");
    clock.advance(period);
    tokio::time::sleep(period).await;
    assert_eq!(
        scheduler.runs(),
        2,
        "the stuck shadow held back no real round"
    );
    stop.cancel();
    handle.await.unwrap();
    let seen = hook.seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "one hand-over per real round");
    let real = store
        .schedule
        .peek()
        .as_ref()
        .as_ref()
        .unwrap()
        .hash
        .clone();
    assert_eq!(
        seen[0].in_force.as_deref(),
        Some(real.as_str()),
        "published first"
    );
    assert!(seen[0].status_has_input && seen[1].status_has_input);
    assert_eq!(seen[0].outcome, Ok(real));
    assert_eq!(seen[1].outcome, Err("boom".to_string()));
    assert_eq!(seen[0].decisions, vec![start("stuck", 1)]);
    assert_eq!(
        seen[1].decisions,
        vec![Decision::Skip {
            shadow: "stuck".into(),
            run: 2,
            busy_with: 1,
            busy_since_ms: 1_000,
        }]
    );
}
