//! The schedule controller under paused time with a fake scheduler.

use std::sync::atomic::Ordering;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::cluster::election::ElectionState;
use crate::machinery::backoff::Backoff;
use crate::machinery::driver::DriverConfig;
use crate::node::StoreWriter;
use crate::schedule::persist::{PERSIST_RETRY, Persister};
use crate::testing::{CountingObserver, FakeClock, FakeScheduler, MemoryScheduleStore, inputs};

struct Rig {
    inputs: Field<Inputs>,
    metrics: Field<SchedulerMetrics>,
    election: Field<ElectionState>,
    store: Store,
    scheduler: Arc<FakeScheduler>,
    saved: Arc<MemoryScheduleStore>,
    /// What a follower's fetcher saves through.
    persister: Arc<Persister>,
    /// The schedule field the fetcher would write (shared with the controller).
    schedule: Arc<Field<Option<Schedule>>>,
    observer: Arc<CountingObserver>,
    clock: Arc<FakeClock>,
    peers: Field<Peers>,
    reports: Field<crate::state::Reports>,
    /// The parents a cluster leader gathers (read only by a controller `with_prefetch`).
    prefetched: Field<crate::state::Prefetched>,
    /// What the schedule controller reruns on for the other DCs (the daemon's `DcNode` sets it).
    datacenters: Field<Option<View>>,
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
    persist_handle: tokio::task::JoinHandle<()>,
}

impl Rig {
    async fn stop(self) {
        self.stop.cancel();
        self.handle.await.unwrap();
        self.persist_handle.await.unwrap();
    }
}

fn rig(leader: bool) -> Rig {
    rig_with(leader, Arc::default(), Duration::from_secs(10))
}

fn rig_with(leader: bool, saved: Arc<MemoryScheduleStore>, period: Duration) -> Rig {
    rig_from(None, leader, saved, period, false)
}

/// With `prefetch`, as in a cluster: each leadership's first run waits for its parents.
fn rig_of(leader: bool, saved: Arc<MemoryScheduleStore>, period: Duration, prefetch: bool) -> Rig {
    rig_from(None, leader, saved, period, prefetch)
}

/// A rig whose node starts holding `stored` (the schedule loaded from the storage dir).
fn rig_from(
    stored: Option<Schedule>,
    leader: bool,
    saved: Arc<MemoryScheduleStore>,
    period: Duration,
    prefetch: bool,
) -> Rig {
    rig_full(stored, leader, saved, period, prefetch, None)
}

/// [`rig_from`] with this node's exchange with other DCs.
fn rig_full(
    stored: Option<Schedule>,
    leader: bool,
    saved: Arc<MemoryScheduleStore>,
    period: Duration,
    prefetch: bool,
    port: Option<Arc<dyn DatacentersPort>>,
) -> Rig {
    let writer = StoreWriter::new(stored);
    let store = writer.store();
    let StoreWriter {
        inputs: inputs_field,
        election,
        schedule,
        scheduler: status,
        parents,
        persist_error,
        scheduler_metrics,
        peers: peers_field,
        reports,
        prefetched,
        datacenters,
        ..
    } = writer;
    election.set(ElectionState {
        is_leader: leader,
        epoch: 1,
        ..Default::default()
    });
    inputs_field.set(inputs(json!({"app": {"v1": {}}})));
    let scheduler = Arc::new(FakeScheduler::default());
    let observer = Arc::new(CountingObserver::default());
    let persister = Arc::new(Persister::new(saved.clone(), persist_error));
    let schedule = Arc::new(schedule);
    let clock = FakeClock::at(1_000);
    let controller = ScheduleController::new(
        store.clone(),
        ScheduleOutputs {
            schedule: schedule.clone(),
            status,
            parents,
        },
        ScheduleDeps {
            scheduler: scheduler.clone(),
            persist: persister.clone(),
            clock: clock.clone(),
            observer: observer.clone(),
            identity: Identity {
                id: "aa".repeat(16),
                hostname: "alpha".into(),
            },
            period,
            datacenters: port,
        },
    );
    let controller = Arc::new(if prefetch {
        controller.with_prefetch()
    } else {
        controller
    });
    let config = DriverConfig {
        resync: Duration::from_secs(3600),
        backoff: Backoff {
            jitter: 0.0,
            ..Backoff::default()
        },
        seed: 1,
        ..DriverConfig::default()
    };
    let driver = controller.driver(config.clone());
    let stop = CancellationToken::new();
    let handle = tokio::spawn(driver.run(stop.clone()));
    let persist_handle = tokio::spawn(persister.clone().driver(config).run(stop.clone()));
    Rig {
        inputs: inputs_field,
        metrics: scheduler_metrics,
        election,
        store,
        scheduler,
        saved,
        persister,
        schedule,
        observer,
        clock,
        peers: peers_field,
        reports,
        prefetched,
        datacenters,
        stop,
        handle,
        persist_handle,
    }
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

#[tokio::test(start_paused = true)]
async fn leader_runs_the_scheduler_and_publishes_and_persists() {
    let rig = rig(true);
    settle().await;
    assert_eq!(rig.scheduler.runs(), 1);
    let schedule = rig.store.schedule.peek();
    let schedule = schedule.as_ref().as_ref().expect("a schedule");
    assert_eq!(**schedule.data.tree(), json!({"echo": {"app": {"v1": {}}}}));
    assert_eq!(schedule.origin, "aa".repeat(16));
    schedule.verify().unwrap();
    assert_eq!(rig.saved.saved.lock().unwrap().len(), 1);
    let input = rig.scheduler.inputs.lock().unwrap()[0].clone();
    assert_eq!(input.current_host, "alpha");
    assert!(input.parents.is_empty(), "a brand-new node has no parents");
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn input_change_reruns_and_same_output_changes_nothing() {
    let rig = rig(true);
    settle().await;
    let first = rig.store.schedule.peek();
    // The period passes: a rerun with the same output keeps the same schedule snapshot.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rig.scheduler.runs(), 2);
    assert!(
        Arc::ptr_eq(&first, &rig.store.schedule.peek()),
        "same hash keeps the schedule"
    );
    assert_eq!(rig.saved.saved.lock().unwrap().len(), 1);
    // The second run got the first schedule as its parent.
    assert_eq!(rig.scheduler.inputs.lock().unwrap()[1].parents.len(), 1);
    rig.inputs.set(inputs(json!({"app": {"v2": {}}})));
    settle().await;
    assert_eq!(rig.scheduler.runs(), 3);
    let schedule = rig.store.schedule.peek();
    assert_eq!(
        schedule.as_ref().as_ref().unwrap().data.tree()["echo"]["app"]["v2"],
        json!({})
    );
    // No rerun before the period without a change.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(rig.scheduler.runs(), 3);
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failure_keeps_the_last_good_schedule_and_retries() {
    let rig = rig(true);
    settle().await;
    let good = rig.store.schedule.peek();
    rig.scheduler.fail_next("main.lua:3: boom");
    rig.inputs.set(inputs(json!({"app": {"v3": {}}})));
    settle().await;
    assert_eq!(rig.scheduler.runs(), 2);
    assert!(
        Arc::ptr_eq(&good, &rig.store.schedule.peek()),
        "old schedule kept"
    );
    let status = rig.store.scheduler.peek();
    assert_eq!(status.error.as_deref(), Some("main.lua:3: boom"));
    assert!(status.last_input.is_some());
    assert_eq!(rig.observer.failures.load(Ordering::SeqCst), 1);
    // Backoff retry after 1 s succeeds and clears the error.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(rig.scheduler.runs(), 3);
    assert!(rig.store.scheduler.peek().error.is_none());
    let schedule = rig.store.schedule.peek();
    assert_eq!(
        schedule.as_ref().as_ref().unwrap().data.tree()["echo"]["app"]["v3"],
        json!({})
    );
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn follower_does_not_schedule_until_it_leads() {
    let rig = rig(false);
    settle().await;
    assert_eq!(rig.scheduler.runs(), 0);
    rig.election.set(ElectionState {
        is_leader: true,
        epoch: 2,
        ..Default::default()
    });
    settle().await;
    assert_eq!(rig.scheduler.runs(), 1);
    rig.stop().await;
}

/// A schedule that cannot be written (disk full) is in force at once, its write is retried
/// without any new input until it succeeds, and the failure shows in the status until then
/// (it used to be logged once and never written: a restart rolled back to the older file).
#[tokio::test(start_paused = true)]
async fn a_schedule_that_failed_to_persist_is_written_when_the_disk_recovers() {
    let saved = Arc::new(MemoryScheduleStore::default());
    *saved.fail.lock().unwrap() = Some(crate::testing::disk_full());
    let period = Duration::from_secs(60);
    let rig = rig_with(true, saved.clone(), period);
    settle().await;
    let in_force = rig.store.schedule.peek();
    let in_force = in_force
        .as_ref()
        .as_ref()
        .expect("in force although unsaved");
    assert_eq!(saved.failed.load(Ordering::SeqCst), 1);
    assert_eq!(
        rig.store.persist_error.peek().as_deref(),
        Some("schedule.json: No space left on device")
    );
    tokio::time::sleep(PERSIST_RETRY).await;
    assert_eq!(saved.failed.load(Ordering::SeqCst), 2, "retried");
    assert!(rig.store.persist_error.peek().is_some());
    *saved.fail.lock().unwrap() = None;
    tokio::time::sleep(PERSIST_RETRY).await;
    assert!(PERSIST_RETRY * 2 < period, "before the period's rerun");
    assert_eq!(rig.scheduler.runs(), 1, "the schedule was not recomputed");
    let written = saved.saved.lock().unwrap().clone();
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].hash, in_force.hash);
    assert_eq!(*rig.store.persist_error.peek(), None);
    // Written: no more writes until the schedule changes.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(saved.saved.lock().unwrap().len(), 1);
    assert_eq!(saved.failed.load(Ordering::SeqCst), 2);
    rig.stop().await;
}

/// The schedule this node holds after a failed write (issue 10).
async fn a_leader_with_an_unsaved_schedule() -> (Rig, Schedule) {
    let saved = Arc::new(MemoryScheduleStore::default());
    *saved.fail.lock().unwrap() = Some(crate::testing::disk_full());
    let rig = rig_with(true, saved, Duration::from_secs(60));
    settle().await;
    let in_force = rig
        .store
        .schedule
        .peek()
        .as_ref()
        .clone()
        .expect("in force");
    assert!(rig.store.persist_error.peek().is_some());
    (rig, in_force)
}

/// A leader that stops leading before its schedule is written still holds that schedule in
/// force, so the write goes on and the error clears once it succeeds (it used to stay in the
/// status forever: only the leader's controller retried).
#[tokio::test(start_paused = true)]
async fn a_leader_that_steps_down_keeps_writing_its_unsaved_schedule() {
    let (rig, in_force) = a_leader_with_an_unsaved_schedule().await;
    rig.election.set(ElectionState {
        is_leader: false,
        epoch: 2,
        ..Default::default()
    });
    tokio::time::sleep(PERSIST_RETRY).await;
    assert_eq!(
        rig.saved.failed.load(Ordering::SeqCst),
        2,
        "retried as follower"
    );
    assert!(rig.store.persist_error.peek().is_some());
    *rig.saved.fail.lock().unwrap() = None;
    tokio::time::sleep(PERSIST_RETRY).await;
    let written = rig.saved.saved.lock().unwrap().clone();
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].hash, in_force.hash);
    assert_eq!(*rig.store.persist_error.peek(), None);
    rig.stop().await;
}

/// A schedule that replaced the unsaved one (the new leader's, taken as a follower) and was
/// written clears the error, and the older one is not written after it.
#[tokio::test(start_paused = true)]
async fn a_later_schedule_written_clears_the_error_and_the_older_one_stays_unwritten() {
    let (rig, _) = a_leader_with_an_unsaved_schedule().await;
    rig.election.set(ElectionState {
        is_leader: false,
        epoch: 2,
        ..Default::default()
    });
    *rig.saved.fail.lock().unwrap() = None;
    // What the fetcher does with the new leader's schedule.
    let theirs = Schedule::new(json!({"from": "leader"}), 2_000, "bb".repeat(16));
    rig.persister.save(&theirs).unwrap();
    rig.schedule.set(Some(theirs.clone()));
    assert_eq!(*rig.store.persist_error.peek(), None);
    tokio::time::sleep(PERSIST_RETRY * 3).await;
    let written = rig.saved.saved.lock().unwrap().clone();
    assert_eq!(written.len(), 1, "only the newer schedule is written");
    assert_eq!(written[0].hash, theirs.hash);
    assert_eq!(rig.saved.failed.load(Ordering::SeqCst), 1);
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn new_metric_values_rerun_the_scheduler_a_mere_refresh_waits_for_the_period() {
    use crate::schedule::scheduler_metrics::{MetricSample, MetricsDeclaration};
    let rig = rig(true);
    settle().await;
    assert_eq!(rig.scheduler.runs(), 1);
    let last_metrics = || {
        rig.scheduler
            .inputs
            .lock()
            .unwrap()
            .last()
            .unwrap()
            .metrics
            .clone()
    };
    assert_eq!(last_metrics(), json!({}), "no metrics.yaml");

    let decl = MetricsDeclaration {
        url: "http://prom:9090".into(),
        ca_file: None,
        time: None,
        interval: Duration::from_secs(15),
        timeout: Duration::from_secs(5),
        queries: [("load".to_string(), "node_load1".to_string())].into(),
    };
    let mut m = SchedulerMetrics::default().declared(Some(&decl));
    let sample = MetricSample {
        labels: [("instance".to_string(), "n1".to_string())].into(),
        value: 0.5,
    };
    m.record("load", Ok(vec![sample.clone()]), 400);
    rig.metrics.set(m.clone());
    settle().await;
    assert_eq!(rig.scheduler.runs(), 2, "new samples: a run at once");
    assert_eq!(
        last_metrics()["load"],
        json!({"samples": [{"labels": {"instance": "n1"}, "value": 0.5}],
               "age": 0.6, "updated": 400, "error": null}),
        "the fake clock says 1000 ms"
    );

    m.record("load", Ok(vec![sample.clone()]), 900);
    rig.metrics.set(m.clone());
    settle().await;
    assert_eq!(rig.scheduler.runs(), 2, "the same values confirmed: no run");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rig.scheduler.runs(), 3, "the period's run");
    assert_eq!(last_metrics()["load"]["updated"], json!(900));

    m.record("load", Err("prom: HTTP 503".into()), 950);
    rig.metrics.set(m);
    settle().await;
    assert_eq!(rig.scheduler.runs(), 4, "a new error: a run at once");
    assert_eq!(last_metrics()["load"]["error"], json!("prom: HTTP 503"));
    assert_eq!(last_metrics()["load"]["samples"][0]["value"], json!(0.5));
    rig.stop().await;
}

/// What the fake scheduler makes from the rig's inputs, as this node's schedule made at `at`.
fn own_unchanged(at: u64) -> Schedule {
    Schedule::new(json!({"echo": {"app": {"v1": {}}}}), at, "aa".repeat(16))
}

fn in_force(rig: &Rig) -> Schedule {
    rig.store
        .schedule
        .peek()
        .as_ref()
        .clone()
        .expect("a schedule")
}

/// Issue 28: a node that leads again (here: after a restart, holding the schedule it stored in
/// an earlier leadership) with unchanged data puts that schedule in force under a fresh
/// timestamp, saved and among the parents, so that a verwalter 0.13 follower, which fetches only
/// when the leader's stamp changes, takes it. Later unchanged runs of the same leadership keep
/// it. (It used to keep the stored stamp for the whole leadership.)
#[tokio::test(start_paused = true)]
async fn the_first_schedule_of_a_leadership_is_restamped_when_its_data_is_unchanged() {
    let stored = own_unchanged(400);
    let rig = rig_from(
        Some(stored.clone()),
        true,
        Arc::default(),
        Duration::from_secs(10),
        false,
    );
    settle().await;
    assert_eq!(rig.scheduler.runs(), 1);
    let first = in_force(&rig);
    assert_eq!(first.hash, stored.hash);
    assert_eq!(first.origin, stored.origin);
    assert_eq!(first.data.canonical(), stored.data.canonical());
    assert_eq!(first.timestamp, 1_000, "the run's time, not the stored 400");
    first.verify().unwrap();
    let saved = rig.saved.saved.lock().unwrap().clone();
    assert_eq!(
        saved,
        vec![first.clone()],
        "the file holds the stamp in force"
    );
    assert_eq!(*rig.store.parents.peek(), vec![first.clone()]);

    // The same leadership: an unchanged run keeps it, stamp and snapshot.
    let before = rig.store.schedule.peek();
    rig.clock.advance(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rig.scheduler.runs(), 2);
    assert!(Arc::ptr_eq(&before, &rig.store.schedule.peek()));
    assert_eq!(rig.saved.saved.lock().unwrap().len(), 1);

    // A re-election (a new epoch, still this node): restamped again.
    rig.clock.advance(Duration::from_secs(1));
    rig.election.set(ElectionState {
        is_leader: true,
        epoch: 2,
        ..Default::default()
    });
    settle().await;
    assert_eq!(rig.scheduler.runs(), 3);
    let second = in_force(&rig);
    assert_eq!(second.hash, first.hash);
    assert_eq!(second.timestamp, 12_000);
    assert_eq!(rig.saved.saved.lock().unwrap().len(), 2);
    rig.stop().await;
}

/// A leadership that starts while the wall clock is behind the stored stamp (it was set back)
/// still gets a stamp that differs: one millisecond after the stored one.
#[tokio::test(start_paused = true)]
async fn a_restamp_is_later_than_the_stamp_it_replaces_even_when_the_clock_went_back() {
    let rig = rig_from(
        Some(own_unchanged(50_000)),
        true,
        Arc::default(),
        Duration::from_secs(10),
        false,
    );
    settle().await;
    assert_eq!(in_force(&rig).timestamp, 50_001);
    rig.stop().await;
}

/// While a peer of this leadership reports another schedule (or none), an unchanged run
/// restamps once the schedule in force is a period old, and not sooner; once every follower
/// holds it, runs keep it.
#[tokio::test(start_paused = true)]
async fn a_lagging_follower_gets_a_restamp_once_a_period() {
    use crate::state::{Peer, Report, ScheduleStamp};
    let rig = rig(true);
    settle().await;
    let first = in_force(&rig);
    assert_eq!(first.timestamp, 1_000);
    let peer = "bb".repeat(16);
    let report = |schedule: Option<ScheduleStamp>, epoch: u64| Report {
        schedule,
        errors: 0,
        epoch,
    };
    // A 0.13 follower that holds nothing of this leader's.
    rig.reports.set([(peer.clone(), report(None, 1))].into());
    // A run before the period is up (a peer list change wakes it): kept.
    rig.clock.advance(Duration::from_secs(3));
    let mut peers = Peers::default();
    peers.peers.insert(
        peer.clone(),
        Peer {
            id: peer.clone(),
            addr: None,
            name: "beta".into(),
            hostname: "beta".into(),
            schedule: None,
            known_since: 0,
            last_report_direct: None,
            errors: 0,
        },
    );
    rig.peers.set(peers);
    settle().await;
    assert_eq!(rig.scheduler.runs(), 2);
    assert_eq!(in_force(&rig), first);
    // The period's run: restamped.
    rig.clock.advance(Duration::from_secs(7));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rig.scheduler.runs(), 3);
    let restamped = in_force(&rig);
    assert_eq!(restamped.hash, first.hash);
    assert_eq!(restamped.timestamp, 11_000);
    assert_eq!(rig.saved.saved.lock().unwrap().len(), 2);
    // It fetched (any stamp of the same hash will do): the next period keeps the schedule.
    rig.reports
        .set([(peer.clone(), report(Some(first.stamp()), 1))].into());
    rig.clock.advance(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rig.scheduler.runs(), 4);
    assert_eq!(in_force(&rig), restamped);
    rig.stop().await;
}

#[test]
fn only_peers_of_this_leadership_that_hold_another_schedule_lag() {
    use crate::state::{Report, ScheduleStamp};
    let stamp = |hash: &str| ScheduleStamp {
        timestamp: 1,
        hash: hash.into(),
        origin: "aa".repeat(16),
    };
    let report = |schedule: Option<ScheduleStamp>, epoch: u64| Report {
        schedule,
        errors: 0,
        epoch,
    };
    let reports = |list: Vec<Report>| -> crate::state::Reports {
        list.into_iter()
            .enumerate()
            .map(|(i, r)| (format!("{i:032}"), r))
            .collect()
    };
    assert!(!follower_lags(&reports(vec![]), 3, "h"));
    assert!(!follower_lags(
        &reports(vec![report(Some(stamp("h")), 3)]),
        3,
        "h"
    ));
    assert!(follower_lags(
        &reports(vec![report(Some(stamp("h")), 3), report(None, 3)]),
        3,
        "h"
    ));
    assert!(follower_lags(
        &reports(vec![report(Some(stamp("old")), 3)]),
        3,
        "h"
    ));
    // Reports of an earlier epoch are of peers not heard in this leadership.
    assert!(!follower_lags(
        &reports(vec![report(Some(stamp("old")), 2)]),
        3,
        "h"
    ));
}

#[test]
fn other_data_or_another_origin_is_a_new_schedule_never_a_restamp() {
    let period = Duration::from_secs(10);
    let current = own_unchanged(1_000);
    let other_data = Schedule::new(json!({"x": 1}), 2_000, "aa".repeat(16));
    assert_eq!(
        decide(Some(&current), other_data.clone(), false, false, period),
        Take::New(other_data)
    );
    // The same data another leader made: taken anew, with this node as origin.
    let theirs = Schedule {
        origin: "bb".repeat(16),
        ..current.clone()
    };
    let mine = own_unchanged(2_000);
    assert_eq!(
        decide(Some(&theirs), mine.clone(), false, false, period),
        Take::New(mine.clone())
    );
    assert_eq!(
        decide(None, mine.clone(), true, true, period),
        Take::New(mine)
    );
    // Unchanged, same leadership, nobody lagging: kept.
    assert_eq!(
        decide(Some(&current), own_unchanged(99_000), false, false, period),
        Take::Keep
    );
    // Lagging, due after one period exactly.
    assert_eq!(
        decide(Some(&current), own_unchanged(10_999), false, true, period),
        Take::Keep
    );
    let Take::Restamp(restamped) =
        decide(Some(&current), own_unchanged(11_000), false, true, period)
    else {
        panic!("a period old with a lagging follower: restamped");
    };
    assert_eq!(restamped.timestamp, 11_000);
    assert_eq!(restamped.hash, current.hash);
}

/// Issue 28: while the parents await another leader's schedule (a heal), no run, whatever
/// else changes; once it is added, the next run has it among its parents.
#[tokio::test(start_paused = true)]
async fn a_leader_does_not_schedule_while_its_parents_await_another_leaders_schedule() {
    let rig = rig_of(true, Arc::default(), Duration::from_secs(10), true);
    settle().await;
    assert_eq!(rig.scheduler.runs(), 0, "waits for its parents");
    rig.prefetched.set(crate::state::Prefetched {
        epoch: 1,
        schedules: Vec::new(),
        awaiting: None,
    });
    settle().await;
    assert_eq!(rig.scheduler.runs(), 1);
    let own = rig
        .store
        .schedule
        .peek()
        .as_ref()
        .clone()
        .expect("a schedule");
    let other = Schedule::new(json!({"other": "side"}), 5, "bb".repeat(16));
    rig.prefetched.set(crate::state::Prefetched {
        epoch: 1,
        schedules: Vec::new(),
        awaiting: Some(other.stamp()),
    });
    rig.inputs.set(inputs(json!({"app": {"v2": {}}})));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        rig.scheduler.runs(),
        1,
        "no run while awaiting, not even the period's"
    );
    rig.prefetched.set(crate::state::Prefetched {
        epoch: 1,
        schedules: vec![other.clone()],
        awaiting: None,
    });
    settle().await;
    assert_eq!(rig.scheduler.runs(), 2);
    let input = rig.scheduler.inputs.lock().unwrap()[1].clone();
    let parents: Vec<&serde_json::Value> = input.parents.iter().map(|p| &**p).collect();
    assert!(parents.contains(&&**other.data.tree()), "{parents:?}");
    assert!(parents.contains(&&**own.data.tree()), "{parents:?}");
    rig.stop().await;
}

/// This node's exchange with other DCs as the schedule controller sees it: a settable view, and
/// the outputs handed over (each answered with `refuse`).
#[derive(Default)]
struct FakeDcs {
    view: Mutex<Option<View>>,
    outputs: Mutex<Vec<datacenters::Output>>,
    refuse: Mutex<Vec<datacenters::OutputError>>,
}

impl DatacentersPort for FakeDcs {
    fn view(&self) -> Option<View> {
        self.view.lock().unwrap().clone()
    }

    fn set_output(&self, output: datacenters::Output) -> Vec<datacenters::OutputError> {
        self.outputs.lock().unwrap().push(output);
        self.refuse.lock().unwrap().clone()
    }
}

/// `fra` as a leader in `ams` sees it: link up, with `summary` and `rtt_ms`.
fn fra(summary: serde_json::Value, rtt_ms: u64) -> View {
    let dc = datacenters::DcView {
        leader: Some("bb".repeat(16)),
        link: datacenters::Link::Up,
        rtt_ms: Some(rtt_ms),
        contact_age_ms: Some(100),
        summary: Some(summary),
        summary_age_ms: Some(rtt_ms * 10),
        summary_behind: false,
        requests: Vec::new(),
        answers: Vec::new(),
        lent: Vec::new(),
        summary_deferred: false,
        bytes_sent: rtt_ms,
        bytes_received: rtt_ms,
    };
    View {
        self_dc: "ams".into(),
        dcs: [("fra".to_string(), dc)].into(),
    }
}

/// The exchange's view changes: the port shows it, and the field the controller reruns on is
/// set when the scheduler would see a difference (as the daemon's `DcNode` does).
fn show(rig: &Rig, dcs: &FakeDcs, view: View) -> bool {
    *dcs.view.lock().unwrap() = Some(view.clone());
    datacenters::publish_view(&rig.datacenters, Some(view))
}

#[tokio::test(start_paused = true)]
async fn the_scheduler_sees_the_other_dcs_and_reruns_when_what_it_sees_changes() {
    let dcs = Arc::new(FakeDcs::default());
    let period = Duration::from_secs(10);
    let rig = rig_full(None, true, Arc::default(), period, false, Some(dcs.clone()));
    settle().await;
    assert_eq!(rig.scheduler.runs(), 1);
    assert_eq!(rig.scheduler.inputs.lock().unwrap()[0].datacenters, None);
    assert!(show(&rig, &dcs, fra(json!({"spare": 3}), 40)));
    settle().await;
    assert_eq!(rig.scheduler.runs(), 2, "the view came: a rerun");
    let input = rig.scheduler.inputs.lock().unwrap()[1].clone();
    let seen = input.datacenters.clone().expect("state.datacenters");
    assert_eq!(seen["self"], "ams");
    assert_eq!(seen["dcs"]["fra"]["summary"], json!({"spare": 3}));
    assert_eq!(seen["dcs"]["fra"]["link"], "up");
    // Ages, RTTs and byte counts moving on are no reason to run; the period's run sees them.
    assert!(!show(&rig, &dcs, fra(json!({"spare": 3}), 90)));
    settle().await;
    assert_eq!(rig.scheduler.runs(), 2);
    tokio::time::sleep(period).await;
    assert_eq!(rig.scheduler.runs(), 3);
    let input = rig.scheduler.inputs.lock().unwrap()[2].clone();
    assert_eq!(
        input.datacenters.clone().unwrap()["dcs"]["fra"]["rtt_ms"],
        90
    );
    // A new summary is.
    assert!(show(&rig, &dcs, fra(json!({"spare": 4}), 90)));
    settle().await;
    assert_eq!(rig.scheduler.runs(), 4);
    let input = rig.scheduler.inputs.lock().unwrap()[3].clone();
    assert_eq!(
        input.datacenters.clone().unwrap()["dcs"]["fra"]["summary"]["spare"],
        4
    );
    rig.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_datacenters_output_goes_to_the_exchange_and_unused_entries_are_named() {
    let dcs = Arc::new(FakeDcs::default());
    *dcs.refuse.lock().unwrap() = vec![datacenters::OutputError::UnknownDc {
        kind: "requests",
        dc: "lon".into(),
        index: 0,
    }];
    let rig = rig_full(
        None,
        true,
        Arc::default(),
        Duration::from_secs(10),
        false,
        Some(dcs.clone()),
    );
    rig.scheduler.results.lock().unwrap().push_back(Ok(json!({
        "roles": {"web": {}},
        "datacenters": {
            "summary": {"spare": {"web": 2}},
            "requests": {
                "fra": [{"id": "burst", "data": {"workers": 2}, "lease_ms": 60000}, {"id": "x"}],
                "lon": [{"id": "y", "data": 1, "lease_ms": 5}],
            },
        },
    })));
    settle().await;
    assert_eq!(rig.scheduler.runs(), 1);
    let output = dcs.outputs.lock().unwrap()[0].clone();
    assert_eq!(output.summary, Some(json!({"spare": {"web": 2}})));
    let ids: Vec<&str> = output.requests["fra"]
        .iter()
        .map(|r| r.id.as_str())
        .collect();
    assert_eq!(ids, ["burst"], "the entry that reads is used");
    let status = rig.store.scheduler.peek();
    assert_eq!(status.error, None, "the run did not fail");
    assert_eq!(
        status.datacenters_errors.len(),
        2,
        "{:?}",
        status.datacenters_errors
    );
    assert!(
        status.datacenters_errors[0].starts_with("datacenters.requests.fra[1]: missing field"),
        "{:?}",
        status.datacenters_errors
    );
    assert_eq!(
        status.datacenters_errors[1],
        "datacenters.requests.lon[0]: \"lon\" is not a known data center"
    );
    assert!(
        rig.store.schedule.peek().is_some(),
        "the schedule is in force"
    );
    // A run without the key hands over nothing for the other DCs (withdrawing what was there).
    *dcs.refuse.lock().unwrap() = Vec::new();
    rig.inputs.set(inputs(json!({"app": {"v2": {}}})));
    settle().await;
    assert_eq!(rig.scheduler.runs(), 2);
    assert_eq!(
        dcs.outputs.lock().unwrap()[1],
        datacenters::Output::default()
    );
    assert!(rig.store.scheduler.peek().datacenters_errors.is_empty());
    rig.stop().await;
}
