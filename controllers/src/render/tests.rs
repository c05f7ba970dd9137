use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::node::StoreWriter;
use crate::state::{BlockedState, RoleBlocked};
use crate::testing::{
    FakeApplier, FakeClock, MemoryAppliedStore, RecordingDeploymentLog, templates,
};

const HOST: &str = "alpha";

struct Rig {
    schedule: Field<Option<Schedule>>,
    templates: Field<Templates>,
    force: Field<u64>,
    store: Store,
    controller: Arc<RenderController>,
    applier: Arc<FakeApplier>,
    applied: Arc<MemoryAppliedStore>,
    log: Arc<RecordingDeploymentLog>,
    clock: Arc<FakeClock>,
}

fn schedule(roles: Value) -> Option<Schedule> {
    Some(Schedule::new(
        json!({"vars": {"template": "app/v1"}, "nodes": {HOST: {"roles": roles}}}),
        1_500_000_000_000,
        "0123456789abcdef0123456789abcdef".into(),
    ))
}

fn rig_with(applied: Arc<MemoryAppliedStore>, policy: ErrorPolicy) -> Rig {
    rig_with_source(applied, policy, Arc::new(CompatRoles))
}

fn rig_with_source(
    applied: Arc<MemoryAppliedStore>,
    policy: ErrorPolicy,
    source: Arc<dyn RoleSource>,
) -> Rig {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    let StoreWriter {
        schedule,
        templates: templates_field,
        force_render,
        roles,
        ..
    } = writer;
    templates_field.set(templates(&[
        ("app/v1/a.hbs", "h1"),
        ("other/v1/b.tera", "h2"),
    ]));
    let applier = Arc::new(FakeApplier::default());
    let log = Arc::new(RecordingDeploymentLog::default());
    let clock = FakeClock::at(1_600_000_000_000);
    let controller = Arc::new(
        RenderController::new(
            store.clone(),
            HOST.into(),
            roles,
            applier.clone(),
            applied.clone(),
            log.clone(),
            clock.clone(),
        )
        .error_policy(policy)
        .role_source(source),
    );
    Rig {
        schedule,
        templates: templates_field,
        force: force_render,
        store,
        controller,
        applier,
        applied,
        log,
        clock,
    }
}

fn rig() -> Rig {
    rig_with(
        Arc::new(MemoryAppliedStore::default()),
        ErrorPolicy::default(),
    )
}

impl Rig {
    /// One reconcile of every role, as the driver's scan would do.
    async fn pass_all(&self) -> Vec<(String, Result<Requeue, RenderError>)> {
        let mut out = Vec::new();
        for role in self.controller.keys() {
            let r = self.controller.clone().reconcile(role.clone()).await;
            out.push((role, r));
        }
        out
    }
    fn failed(&self) -> Vec<String> {
        self.store.roles.peek().failed.keys().cloned().collect()
    }
}

#[tokio::test]
async fn renders_each_role_once_under_one_deployment_id() {
    let rig = rig();
    rig.schedule
        .set(schedule(json!({"web": {"v": 1}, "db": {"v": 1}})));
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["db", "web"]);
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    assert_eq!(jobs[0].deployment_id, jobs[1].deployment_id);
    assert_eq!(jobs[0].deployment_id.len(), DEPLOYMENT_ID_LEN);
    assert!(
        jobs[0]
            .deployment_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric())
    );
    assert_eq!(jobs[0].template, "app/v1");
    assert_eq!(jobs[1].vars["v"], json!(1));
    assert_eq!(jobs[1].vars["deployment_id"], json!(jobs[1].deployment_id));
    assert_eq!(jobs[1].vars["timestamp"], json!("2020-09-13T12:26:40Z"));
    let started = rig.log.started.lock().unwrap().clone();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].1, vec!["db", "web"]);
    let finished = rig.log.finished.lock().unwrap().clone();
    assert_eq!(finished, vec![(jobs[0].deployment_id.clone(), vec![])]);
    let last = rig.store.roles.peek().last_deployment.clone().unwrap();
    assert_eq!(last.roles, vec!["db", "web"]);
    assert!(last.finished.is_some());

    // Nothing changed: nothing rendered, no new pass.
    rig.pass_all().await;
    assert_eq!(rig.applier.roles().len(), 2);
    assert_eq!(rig.log.started.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn each_schedules_changes_are_logged_once() {
    let rig = rig();
    let s = schedule(json!({"web": {"v": 1}})).unwrap();
    let mut data = (**s.data.tree()).clone();
    data["changes"] = json!(["web: v0 -> v1", {"odd": true}]);
    let s = Schedule::new(data, s.timestamp, s.origin);
    rig.schedule.set(Some(s));
    rig.applier.fail("web", "boom");
    rig.pass_all().await;
    rig.pass_all().await; // a retry: same schedule, no second copy of its changes
    assert_eq!(
        *rig.log.changes.lock().unwrap(),
        vec!["web: v0 -> v1".to_string(), "{\"odd\":true}".to_string()]
    );
    assert_eq!(rig.log.started.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_change_rerenders_only_the_changed_role() {
    let rig = rig();
    rig.schedule
        .set(schedule(json!({"web": {"v": 1}, "db": {"v": 1}})));
    rig.pass_all().await;
    rig.schedule
        .set(schedule(json!({"web": {"v": 2}, "db": {"v": 1}})));
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["db", "web", "web"]);
    let started = rig.log.started.lock().unwrap().clone();
    assert_eq!(started.len(), 2);
    assert_eq!(started[1].1, vec!["web"]);
}

#[tokio::test]
async fn a_new_timestamp_alone_renders_nothing() {
    let rig = rig();
    rig.schedule.set(schedule(json!({"web": {}})));
    rig.pass_all().await;
    let mut later = schedule(json!({"web": {}})).unwrap();
    later.timestamp += 10_000;
    rig.schedule.set(Some(later));
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["web"]);
}

#[tokio::test]
async fn a_template_change_rerenders_the_roles_using_it() {
    let rig = rig();
    rig.schedule
        .set(schedule(json!({"web": {}, "db": {"template": "other/v1"}})));
    rig.pass_all().await;
    rig.templates.set(templates(&[
        ("app/v1/a.hbs", "h1"),
        ("other/v1/b.tera", "CHANGED"),
    ]));
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["db", "web", "db"]);
}

#[tokio::test]
async fn full_schedule_users_follow_every_schedule_change() {
    let rig = rig();
    let mut files = templates(&[("app/v1/a.hbs", "h1")]);
    Arc::make_mut(&mut files.files)
        .get_mut("app/v1/a.hbs")
        .unwrap()
        .mentions_full_schedule = true;
    rig.templates.set(files);
    rig.schedule.set(schedule(json!({"web": {}})));
    rig.pass_all().await;
    rig.schedule
        .set(schedule(json!({"web": {}, "x": {"template": "none/v1"}})));
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["web", "web"]);
}

#[tokio::test]
async fn applied_hashes_survive_a_restart() {
    let applied = Arc::new(MemoryAppliedStore::default());
    let first = rig_with(applied.clone(), ErrorPolicy::default());
    first.schedule.set(schedule(json!({"web": {}})));
    first.pass_all().await;
    assert_eq!(applied.0.lock().unwrap().len(), 1);
    let second = rig_with(applied, ErrorPolicy::default());
    second.schedule.set(schedule(json!({"web": {}})));
    second.pass_all().await;
    assert!(
        second.applier.roles().is_empty(),
        "already applied before the restart"
    );
}

#[tokio::test]
async fn a_failing_role_is_reported_and_others_go_on() {
    let rig = rig();
    rig.applier
        .fail("db", "command 1 (!Cmd) exited with status 3");
    rig.schedule.set(schedule(json!({"web": {}, "db": {}})));
    let results = rig.pass_all().await;
    assert!(
        matches!(&results[0].1, Err(RenderError::Apply(m)) if m.to_string().contains("status 3"))
    );
    assert!(results[1].1.is_ok());
    assert_eq!(rig.failed(), vec!["db"]);
    let failure = rig.store.roles.peek().failed["db"].clone();
    assert_eq!(failure.attempts, 1);
    assert!(failure.deployment_id.is_some());
    assert!(rig.applied.0.lock().unwrap().get("db").is_none());
    let finished = rig.log.finished.lock().unwrap().clone();
    assert_eq!(finished[0].1, vec!["db"]);

    // Retried without a new schedule; fixed, it recovers and the failure is gone.
    rig.pass_all().await;
    assert_eq!(rig.store.roles.peek().failed["db"].attempts, 2);
    rig.applier.heal("db");
    rig.pass_all().await;
    assert!(rig.failed().is_empty());
    assert_eq!(rig.applier.roles(), vec!["db", "web", "db", "db"]);
}

#[tokio::test]
async fn bad_vars_fail_that_role_only_with_a_clear_message() {
    let rig = rig();
    rig.schedule.set(schedule(
        json!({"web": {}, "../evil": {}, "nodir": {"template": "missing/v9"}}),
    ));
    let results = rig.pass_all().await;
    let by_role: HashMap<_, _> = results.into_iter().collect();
    assert!(matches!(&by_role["../evil"], Err(RenderError::Vars(m)) if m.contains("role name")));
    assert!(
        matches!(&by_role["nodir"], Err(RenderError::Templates(m)) if m.contains("templates/missing/v9"))
    );
    assert!(by_role["web"].is_ok());
    assert_eq!(rig.applier.roles(), vec!["web"]);
    assert_eq!(rig.failed(), vec!["../evil", "nodir"]);
}

#[tokio::test]
async fn force_render_all_renders_every_role_again_once() {
    let rig = rig();
    rig.schedule.set(schedule(json!({"web": {}, "db": {}})));
    rig.pass_all().await;
    rig.force.set(1);
    rig.pass_all().await;
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["db", "web", "db", "web"]);
    assert_eq!(rig.log.started.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn retain_roles_forgets_roles_gone_from_the_schedule() {
    let rig = rig();
    rig.applier.fail("db", "boom");
    rig.schedule.set(schedule(json!({"web": {}, "db": {}})));
    rig.pass_all().await;
    rig.schedule.set(schedule(json!({"web": {}})));
    let gone = rig
        .controller
        .retain_roles(&["web".to_string()].into_iter().collect());
    assert!(gone.is_empty(), "db was never applied");
    assert!(rig.failed().is_empty());
    let gone = rig.controller.retain_roles(&BTreeSet::new());
    assert_eq!(gone, vec!["web"]);
    assert!(rig.applied.0.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_driver_retries_a_failing_role_with_backoff_until_it_recovers() {
    let rig = rig();
    rig.applier.fail("db", "boom");
    rig.schedule.set(schedule(json!({"web": {}, "db": {}})));
    let shutdown = CancellationToken::new();
    let driver = rig.controller.clone().driver(DriverConfig {
        seed: 7,
        ..DriverConfig::default()
    });
    let task = tokio::spawn(driver.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(rig.applier.roles().iter().filter(|r| *r == "db").count(), 1);
    // First retry within a second, then further apart.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(rig.applier.roles().iter().filter(|r| *r == "db").count(), 2);
    rig.applier.heal("db");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(rig.failed().is_empty());
    let db_runs = rig.applier.roles().iter().filter(|r| *r == "db").count();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        rig.applier.roles().iter().filter(|r| *r == "db").count(),
        db_runs,
        "no more attempts once it succeeded"
    );
    assert_eq!(
        rig.applier.roles().iter().filter(|r| *r == "web").count(),
        1,
        "{:?}",
        rig.applier
            .jobs
            .lock()
            .unwrap()
            .iter()
            .map(|j| (j.role.clone(), j.deployment_id.clone()))
            .collect::<Vec<_>>()
    );
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_new_schedule_at_a_freed_schedules_address_is_rendered() {
    // Each schedule is dropped once the next replaces it, so the allocator hands its address
    // to a later one; a cache keyed by address alone took that one for the old and rendered
    // nothing. Every schedule here changes `web`, so every one must render it.
    let rig = rig();
    for i in 0..200 {
        rig.schedule.set(schedule(json!({"web": {"v": i}})));
        rig.pass_all().await;
        // An unrendered schedule in between: its snapshot is freed before the next pass.
        rig.schedule
            .set(schedule(json!({"web": {"v": i, "between": true}})));
        rig.schedule.set(schedule(json!({"web": {"v": i + 1000}})));
        rig.pass_all().await;
        let jobs = rig.applier.jobs.lock().unwrap();
        assert_eq!(jobs.len(), 2 * i + 2, "schedule {i} was not rendered");
        assert_eq!(jobs.last().unwrap().vars["v"], json!(i + 1000));
    }
}

/// A deployment log that checks, at each write, that the controller's state is not locked.
#[derive(Default)]
struct LockCheckingLog {
    controller: std::sync::OnceLock<std::sync::Weak<RenderController>>,
    writes_under_lock: Mutex<Vec<&'static str>>,
    writes: Mutex<usize>,
}

impl LockCheckingLog {
    fn check(&self, what: &'static str) {
        *self.writes.lock().unwrap() += 1;
        let controller = self.controller.get().and_then(|c| c.upgrade()).unwrap();
        if controller.state.try_lock().is_err() {
            self.writes_under_lock.lock().unwrap().push(what);
        }
    }
}

impl DeploymentLog for LockCheckingLog {
    fn deployment_start(&self, _: &str, _: &str, _: &[String], _: &[String]) {
        self.check("start");
    }
    fn deployment_finish(&self, _: &str, _: &[String], _: &[(String, String)]) {
        self.check("finish");
    }
    fn problem(&self) -> Option<String> {
        None
    }
}

#[tokio::test]
async fn the_deployment_log_is_written_outside_the_state_lock() {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    writer.templates.set(templates(&[("app/v1/a.hbs", "h1")]));
    let log = Arc::new(LockCheckingLog::default());
    let controller = Arc::new(RenderController::new(
        store.clone(),
        HOST.into(),
        writer.roles,
        Arc::new(FakeApplier::default()),
        Arc::new(MemoryAppliedStore::default()),
        log.clone(),
        FakeClock::at(1_600_000_000_000),
    ));
    log.controller
        .set(Arc::downgrade(&controller))
        .unwrap_or_else(|_| unreachable!());
    writer.schedule.set(schedule(json!({"web": {}, "db": {}})));
    for role in controller.keys() {
        controller.clone().reconcile(role).await.unwrap();
    }
    assert_eq!(*log.writes.lock().unwrap(), 2, "a start and a finish");
    assert!(
        log.writes_under_lock.lock().unwrap().is_empty(),
        "{:?}",
        log.writes_under_lock.lock().unwrap()
    );
}

#[tokio::test]
async fn a_log_that_cannot_be_written_is_reported_and_roles_still_apply() {
    let rig = rig();
    *rig.log.problem.lock().unwrap() = Some("log/web: cannot write: Read-only file system".into());
    rig.schedule.set(schedule(json!({"web": {}, "db": {}})));
    let results = rig.pass_all().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    assert_eq!(rig.applier.roles(), vec!["db", "web"]);
    assert_eq!(rig.applied.0.lock().unwrap().len(), 2);
    assert!(rig.failed().is_empty());
    assert_eq!(
        rig.store.roles.peek().deployment_log.as_deref(),
        Some("log/web: cannot write: Read-only file system")
    );

    // Writable again: the next look clears the report, even with nothing to render.
    *rig.log.problem.lock().unwrap() = None;
    rig.pass_all().await;
    assert_eq!(rig.store.roles.peek().deployment_log, None);
    assert_eq!(rig.applier.roles().len(), 2);
}

/// Roles `a` (depends on `b`), `b` (depends on `c`), `c`, and `d` on its own.
fn chain() -> Value {
    json!({
        "a": {"depends_on": ["b"]},
        "b": {"depends_on": "c"},
        "c": {},
        "d": {},
    })
}

fn driven(rig: &Rig) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let shutdown = CancellationToken::new();
    let driver = rig.controller.clone().driver(DriverConfig {
        seed: 7,
        // Long enough that no resync happens in these tests: only wake-ups move the chain.
        resync: Duration::from_secs(3600),
        ..DriverConfig::default()
    });
    (shutdown.clone(), tokio::spawn(driver.run(shutdown)))
}

impl Rig {
    fn blocked(&self) -> BTreeMap<String, RoleBlocked> {
        self.store.roles.peek().blocked.clone()
    }
}

#[tokio::test(start_paused = true)]
async fn a_chain_applies_in_dependency_order_woken_by_each_apply() {
    let rig = rig();
    rig.schedule.set(schedule(chain()));
    let (shutdown, task) = driven(&rig);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let order = rig.applier.roles();
    assert_eq!(order.len(), 4, "{order:?}");
    let pos = |r: &str| order.iter().position(|x| x == r).unwrap();
    assert!(pos("c") < pos("b") && pos("b") < pos("a"), "{order:?}");
    assert!(rig.blocked().is_empty());
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    assert!(
        jobs.iter()
            .all(|j| j.deployment_id == jobs[0].deployment_id),
        "one pass"
    );
    let last = rig.store.roles.peek().last_deployment.clone().unwrap();
    assert!(last.finished.is_some());
    assert!(last.blocked.is_empty());
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_role_waits_for_its_dependency_and_says_so() {
    let rig = rig();
    rig.schedule
        .set(schedule(json!({"app": {"depends_on": ["db"]}, "db": {}})));
    // Without a driver nothing wakes `app`: one pass in key order shows the waiting state.
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["db"]);
    let blocked = rig.blocked();
    assert_eq!(blocked["app"].state, BlockedState::Waiting);
    assert_eq!(blocked["app"].on, vec!["db"]);
    assert_eq!(blocked["app"].reason, "waits for db to apply");
    assert!(
        rig.store
            .roles
            .peek()
            .last_deployment
            .clone()
            .unwrap()
            .finished
            .is_none(),
        "app is still pending in the pass"
    );
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["db", "app"]);
    assert!(rig.blocked().is_empty());
    assert!(
        rig.store
            .roles
            .peek()
            .last_deployment
            .clone()
            .unwrap()
            .finished
            .is_some()
    );
}

/// Issue 29: a role's page named only the direct dependency of a blocked role. Each held-back
/// role now carries where its chain ends: the role that failed, through any number of blocked
/// roles; for a waiting role, the role not applied yet that waits for nothing.
#[tokio::test(start_paused = true)]
async fn a_held_back_role_names_the_root_cause_at_the_end_of_its_chain() {
    let rig = rig();
    rig.applier.fail("c", "boom");
    rig.schedule.set(schedule(chain()));
    let (shutdown, task) = driven(&rig);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let blocked = rig.blocked();
    assert_eq!(blocked["b"].on, ["c"]);
    assert_eq!(blocked["b"].root_cause, ["c"]);
    assert_eq!(blocked["a"].on, ["b"]);
    assert_eq!(blocked["a"].root_cause, ["c"], "{blocked:?}");
    shutdown.cancel();
    task.await.unwrap();

    // Waiting: b waits for c, a for b; the chain ends at c.
    let rig = rig_with(Arc::default(), ErrorPolicy::default());
    rig.schedule.set(schedule(chain()));
    for role in ["b", "a"] {
        rig.controller.clone().reconcile(role.into()).await.unwrap();
    }
    let waiting = rig.blocked();
    assert_eq!(waiting["a"].state, BlockedState::Waiting);
    assert_eq!(waiting["a"].on, ["b"]);
    assert_eq!(waiting["a"].root_cause, ["c"]);
    assert_eq!(waiting["b"].root_cause, ["c"]);
}

#[tokio::test(start_paused = true)]
async fn a_failing_middle_role_blocks_its_dependents_only_and_its_fix_resumes_the_chain() {
    let rig = rig();
    rig.applier.fail("b", "exit status 1");
    rig.schedule.set(schedule(chain()));
    let (shutdown, task) = driven(&rig);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut applied = rig.applier.roles();
    applied.sort();
    assert_eq!(applied, vec!["b", "c", "d"], "a never started");
    assert_eq!(rig.failed(), vec!["b"]);
    let blocked = rig.blocked();
    assert_eq!(blocked["a"].state, BlockedState::Blocked);
    assert_eq!(blocked["a"].on, vec!["b"]);
    assert_eq!(
        blocked["a"].reason,
        "depends on b, which failed or is blocked"
    );
    let last = rig.store.roles.peek().last_deployment.clone().unwrap();
    assert!(
        last.finished.is_some(),
        "the pass ends: a is blocked, not pending"
    );
    assert_eq!(
        (last.failed, last.blocked),
        (vec!["b".into()], vec!["a".into()])
    );
    let logged = rig.log.blocked.lock().unwrap().clone();
    assert_eq!(
        logged.last().unwrap().1,
        vec![(
            "a".to_string(),
            "depends on b, which failed or is blocked".to_string()
        )]
    );

    // The fix: b's command works now. Its backoff retry applies it, which wakes a; no new
    // schedule is needed.
    rig.applier.heal("b");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rig.applier.roles().last().map(String::as_str), Some("a"));
    assert!(rig.failed().is_empty());
    assert!(rig.blocked().is_empty());
    shutdown.cancel();
    task.await.unwrap();
}

/// Issue 29: `role.applied` events came all at the end of the pass, in name order, without a
/// time. Each role's outcome now goes to the log as the role finishes, with the time, and the
/// pass's finish after the last.
#[tokio::test]
async fn each_roles_outcome_is_given_as_it_finishes_with_its_time() {
    let rig = rig();
    rig.applier.fail("b", "boom");
    rig.schedule.set(schedule(
        json!({"c": {}, "b": {}, "a": {"depends_on": ["b"]}}),
    ));
    let entries = || rig.log.entries.lock().unwrap().clone();
    let t0 = 1_600_000_000_000u64;
    let id = |entries: &[String]| entries[0].strip_prefix("start ").unwrap().to_string();
    rig.controller.clone().reconcile("c".into()).await.unwrap();
    let after_c = entries();
    let d = id(&after_c);
    assert_eq!(
        after_c,
        [format!("start {d}"), format!("applied c {d} at {t0}")]
    );
    rig.clock.advance(Duration::from_secs(1));
    rig.controller
        .clone()
        .reconcile("b".into())
        .await
        .unwrap_err();
    rig.clock.advance(Duration::from_secs(1));
    rig.controller.clone().reconcile("a".into()).await.unwrap();
    assert_eq!(
        entries(),
        [
            format!("start {d}"),
            format!("applied c {d} at {t0}"),
            format!("failed b {d} at {}", t0 + 1000),
            format!("blocked a {d} at {}", t0 + 2000),
            format!("finish {d}"),
        ]
    );
}

/// A role with a dependency error (here a cycle) that another role's pass took in leaves it
/// failed: the pass ends, and says so.
#[tokio::test]
async fn a_pass_holding_a_role_of_a_cycle_ends_with_it_failed() {
    let rig = rig();
    rig.schedule.set(schedule(json!({
        "d": {},
        "x": {"depends_on": ["y"]},
        "y": {"depends_on": ["x"]},
    })));
    rig.pass_all().await;
    let last = rig.store.roles.peek().last_deployment.clone().unwrap();
    assert_eq!(last.roles, ["d", "x", "y"]);
    assert!(last.finished.is_some(), "{last:?}");
    assert_eq!(last.failed, ["x", "y"]);
    let entries = rig.log.entries.lock().unwrap().clone();
    assert_eq!(entries.last().unwrap(), &format!("finish {}", last.id));
    assert!(entries[2].starts_with("failed x "), "{entries:?}");
}

#[tokio::test]
async fn a_cycle_fails_the_roles_on_it_naming_it_and_everything_else_applies() {
    let rig = rig();
    rig.schedule.set(schedule(json!({
        "a": {"depends_on": ["b"]},
        "b": {"depends_on": ["a"]},
        "c": {"depends_on": ["a"]},
        "d": {},
        "e": {"depends_on": ["ghost"]},
    })));
    rig.pass_all().await;
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["d"]);
    let failed = rig.store.roles.peek().failed.clone();
    assert_eq!(
        failed["a"].message,
        "role \"a\" is in a dependency cycle: a -> b -> a"
    );
    assert_eq!(
        failed["b"].message,
        "role \"b\" is in a dependency cycle: a -> b -> a"
    );
    assert_eq!(
        failed["e"].message,
        "role \"e\" depends on \"ghost\", which is not a role of this node"
    );
    assert_eq!(rig.blocked()["c"].state, BlockedState::Blocked);
    assert_eq!(rig.blocked()["c"].on, vec!["a"]);
}

/// Issue 29: roles `x` and `y` depending on each other failed about 977,000 times in 35 s,
/// each failure waking the other past its backoff. Now a role wakes its dependents only when its
/// own state changes, and a cycle fails under the backoff like any failure. The clock is moved
/// by hand (a spinning driver would never let paused time advance on its own), and the bound is
/// checked at every step, so a spin fails the test instead of hanging it.
#[tokio::test(start_paused = true)]
async fn a_cycle_fails_under_backoff_without_waking_itself() {
    cycle_under_backoff(rig()).await;
}

/// With `halt`, a failure wakes every held-back role, not only its dependents: the same bound.
#[tokio::test(start_paused = true)]
async fn a_cycle_fails_under_backoff_with_halt_too() {
    cycle_under_backoff(rig_with(Arc::default(), ErrorPolicy::Halt)).await;
}

async fn cycle_under_backoff(rig: Rig) {
    rig.schedule.set(schedule(json!({
        "x": {"depends_on": ["y"]},
        "y": {"depends_on": ["x"]},
        "z": {"depends_on": ["x"]},
        "w": {},
    })));
    let (shutdown, task) = driven(&rig);
    let attempts = |role: &str| {
        rig.store
            .roles
            .peek()
            .failed
            .get(role)
            .map_or(0, |f| f.attempts)
    };
    // Backoff from 1 s doubling (less up to a quarter of jitter): retries at about 1, 3 and 7 s
    // after the first failure, one more in the worst jitter. At most a wake-up of each on top.
    const BOUND: u32 = 7;
    for _ in 0..10_000 {
        tokio::time::advance(Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
        assert!(
            attempts("x") <= BOUND && attempts("y") <= BOUND,
            "the cycle spins: x {} and y {} attempts by {:?}",
            attempts("x"),
            attempts("y"),
            rig.store.roles.peek().failed
        );
    }
    assert!(attempts("x") >= 3 && attempts("y") >= 3, "it is retried");
    // With `halt`, w may have applied before the first failure, or be held back by it.
    assert!(rig.applier.roles().iter().all(|r| r == "w"));
    assert_eq!(rig.blocked()["z"].state, BlockedState::Blocked);
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_bad_depends_on_is_an_error_of_that_role() {
    let rig = rig();
    rig.schedule
        .set(schedule(json!({"a": {"depends_on": {"b": 1}}, "b": {}})));
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["b"]);
    assert_eq!(
        rig.store.roles.peek().failed["a"].message,
        "role \"a\": depends_on must be a list of role names, got {\"b\":1}"
    );
}

/// Issue 29: a Lua scheduler writes "no dependencies" as an empty table, which comes out as
/// `{}` (Lua cannot tell `{}` from `[]`). An empty object or array is an empty list, wherever a
/// higher-precedence source sets it (it replaces a list from a lower one); a non-empty object
/// is still an error.
#[tokio::test]
async fn an_empty_table_as_depends_on_is_no_dependencies() {
    let rig = rig();
    let data = json!({
        "vars": {"template": "app/v1"},
        "roles": {"c": {"depends_on": ["a"]}},
        "nodes": {HOST: {"roles": {
            "a": {"depends_on": {}},
            "b": {"depends_on": []},
            "c": {"depends_on": {}},
        }}},
    });
    rig.schedule.set(Some(Schedule::new(
        data.clone(),
        1_500_000_000_000,
        "0123456789abcdef0123456789abcdef".into(),
    )));
    rig.pass_all().await;
    assert!(
        rig.failed().is_empty(),
        "{:?}",
        rig.store.roles.peek().failed
    );
    assert!(rig.blocked().is_empty(), "{:?}", rig.blocked());
    assert_eq!(rig.applier.roles(), vec!["a", "b", "c"]);
    let check = check_schedule(&data, HOST);
    assert!(check.dependency_problems.is_empty(), "{check:?}");
}

/// Issue 29: `verwalter check` and `verwalter render` take what they report from
/// `check_schedule`: each role fails there with the message a pass fails it with (a cycle, a role
/// not on the node, a bad `depends_on`, a reference that finds nothing; a reference error before
/// a dependency error, as a pass checks them), and the others get the variables a pass renders.
#[tokio::test]
async fn the_schedule_check_fails_each_role_as_a_pass_does() {
    let rig = rig();
    let sched = schedule(json!({
        "a": {"depends_on": ["b"]},
        "b": {"depends_on": ["a"]},
        "c": {"depends_on": ["a"]},
        "e": {"depends_on": ["ghost"]},
        "f": {"depends_on": {"x": 1}},
        "db": {"host": "10.0.0.5", "port": 5432},
        "app": {"depends_on": ["db"], "db_url": "pg://$(db.host):$(db.port)/app"},
        "lost": {"url": "$(db.nothing)"},
        "both": {"depends_on": ["ghost"], "url": "$(db.nothing)"},
    }));
    let data = sched.as_ref().unwrap().data.tree().as_ref().clone();
    rig.schedule.set(sched);
    rig.pass_all().await;
    rig.pass_all().await;
    let failed = rig.store.roles.peek().failed.clone();
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    let check = check_schedule(&data, HOST);
    for role in vars::node_roles(&data, HOST) {
        match check.role(&role).unwrap() {
            Err(problem) => assert_eq!(failed[&role].message, problem, "{role}"),
            Ok(vars) => {
                assert!(!failed.contains_key(&role), "{role}");
                if role == "c" {
                    continue; // blocked by a: not failed, not applied
                }
                let job = jobs.iter().find(|j| j.role == role).unwrap();
                let mut rendered = job.vars.as_ref().clone();
                for per_pass in ["deployment_id", "timestamp", "verwalter_version"] {
                    rendered.remove(per_pass);
                }
                assert_eq!(rendered, vars, "{role}");
            }
        }
    }
    assert_eq!(check.problems().len(), 6, "{:?}", check.problems());
    assert_eq!(failed.len(), 6, "{failed:?}");
    assert_eq!(
        check.role("app").unwrap().unwrap()["db_url"],
        "pg://10.0.0.5:5432/app"
    );
    assert_eq!(
        check.role("both").unwrap().unwrap_err(),
        "role \"both\": variable url: $(db.nothing) finds nothing"
    );
    assert!(check.role("ghost").is_none());
}

#[tokio::test]
async fn halt_holds_back_every_role_after_a_failure_until_it_clears() {
    let rig = rig_with(Arc::default(), ErrorPolicy::Halt);
    rig.applier.fail("a", "boom");
    rig.schedule
        .set(schedule(json!({"a": {}, "b": {}, "c": {}})));
    rig.pass_all().await;
    assert_eq!(
        rig.applier.roles(),
        vec!["a"],
        "nothing new starts after a fails"
    );
    let last = rig.store.roles.peek().last_deployment.clone().unwrap();
    assert!(last.finished.is_some());
    assert_eq!(last.failed, vec!["a"]);
    assert_eq!(last.blocked, vec!["b", "c"]);
    assert_eq!(
        rig.blocked()["b"].reason,
        "the deployment halted: a failed (render.dependency-failure: halt)"
    );
    rig.applier.heal("a");
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["a", "a", "b", "c"]);
    assert!(rig.blocked().is_empty());
}

#[tokio::test]
async fn a_role_takes_values_from_another_roles_variables() {
    let rig = rig();
    let with_port = |port: u16| {
        schedule(json!({
            "app": {"db_url": "pg://$(db.host):$(db.port)/app", "pool": "$(db.limits)"},
            "db": {"host": "10.0.0.5", "port": port, "limits": {"max": 10}},
        }))
    };
    rig.schedule.set(with_port(5432));
    rig.pass_all().await;
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    let app = jobs.iter().find(|j| j.role == "app").unwrap();
    assert_eq!(app.vars["db_url"], json!("pg://10.0.0.5:5432/app"));
    assert_eq!(app.vars["pool"], json!({"max": 10}));
    // Only db's variables change, yet app's resolved value does: app renders again.
    rig.schedule.set(with_port(6432));
    rig.pass_all().await;
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    let apps: Vec<_> = jobs.iter().filter(|j| j.role == "app").collect();
    assert_eq!(apps.len(), 2);
    assert_eq!(apps[1].vars["db_url"], json!("pg://10.0.0.5:6432/app"));
}

#[tokio::test]
async fn a_reference_cycle_fails_the_role_naming_the_chain() {
    let rig = rig();
    rig.schedule.set(schedule(json!({
        "a": {"x": "$(b.y)"},
        "b": {"y": "$(a.x)"},
        "c": {"shell": "echo $(date)"},
    })));
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["c"]);
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    assert_eq!(
        jobs[0].vars["shell"],
        json!("echo $(date)"),
        "not a role: left alone"
    );
    assert_eq!(
        rig.store.roles.peek().failed["a"].message,
        "role \"a\": variable reference cycle: $(b.y) -> $(a.x) -> $(b.y)"
    );
}

/// A role source that answers what it is told, and records what it was asked.
#[derive(Default)]
struct GivenRoles {
    answer: Mutex<Option<Result<crate::machinery::ports::NodeRoles, String>>>,
    asked: Mutex<Vec<RolesRequest>>,
    version: Mutex<Option<String>>,
}

impl GivenRoles {
    fn answer(&self, answer: Result<Value, &str>) {
        *self.answer.lock().unwrap() = Some(
            answer
                .map(|v| v.as_object().unwrap().clone())
                .map_err(String::from),
        );
    }
}

impl RoleSource for GivenRoles {
    fn name(&self) -> &str {
        "scheduler/v1/query.wasm"
    }

    fn version(&self) -> Option<String> {
        self.version.lock().unwrap().clone()
    }

    fn roles(
        &self,
        request: RolesRequest,
    ) -> Option<
        futures::future::BoxFuture<
            'static,
            Result<crate::machinery::ports::NodeRoles, crate::machinery::ports::RolesError>,
        >,
    > {
        let answer = self.answer.lock().unwrap().clone()?;
        if !request.deployment_id.is_empty() {
            self.asked.lock().unwrap().push(request);
        }
        Some(Box::pin(async move {
            answer.map_err(crate::machinery::ports::RolesError)
        }))
    }
}

fn rig_with_given() -> (Rig, Arc<GivenRoles>) {
    let source = Arc::new(GivenRoles::default());
    let rig = rig_with_source(
        Arc::new(MemoryAppliedStore::default()),
        ErrorPolicy::default(),
        source.clone(),
    );
    (rig, source)
}

#[tokio::test]
async fn roles_from_a_role_source_are_rendered_instead_of_the_schedules() {
    let (rig, source) = rig_with_given();
    source.answer(Ok(json!({
        "api": {"template": "other/v1", "port": 8080},
        "worker": {"template": "app/v1", "depends_on": "api", "upstream": "$(api.port)"},
    })));
    rig.schedule.set(schedule(json!({"web": {"v": 1}})));
    // The first scan asks the source (once per schedule), the next renders what it gave.
    let first = rig.pass_all().await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].0, "scheduler/v1/query.wasm");
    assert!(rig.applier.roles().is_empty());
    rig.pass_all().await;
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["api", "worker"]);
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    assert_eq!(jobs[0].template, "other/v1");
    assert_eq!(jobs[0].vars["port"], json!(8080));
    assert_eq!(jobs[0].vars["role"], json!("api"));
    assert_eq!(jobs[0].vars["node"], json!(HOST));
    assert_eq!(jobs[1].vars["upstream"], json!(8080));
    let asked = source.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].host, HOST);
    assert!(asked[0].previous.is_none());
    // The deployment id the source was given names the pass it started.
    assert_eq!(jobs[0].deployment_id, asked[0].deployment_id);
    assert_eq!(
        rig.controller.node_roles(),
        Some(["api".to_string(), "worker".to_string()].into())
    );

    // A new schedule: the source is asked again, with the previous one.
    let mut next = schedule(json!({"web": {"v": 2}})).unwrap();
    next.hash = "other".into();
    rig.schedule.set(Some(next));
    rig.pass_all().await;
    let asked = source.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2);
    assert_eq!(
        asked[1].previous.as_ref().map(|s| &s.data),
        Some(&asked[0].schedule.data)
    );
}

#[tokio::test]
async fn a_failing_role_source_renders_nothing_and_says_why() {
    let (rig, source) = rig_with_given();
    source.answer(Ok(json!({"api": {"template": "other/v1"}})));
    rig.schedule.set(schedule(json!({})));
    rig.pass_all().await;
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["api"]);

    source.answer(Err("InitError: no such cluster"));
    let mut next = schedule(json!({})).unwrap();
    next.hash = "other".into();
    rig.schedule.set(Some(next));
    let results = rig.pass_all().await;
    assert_eq!(results.len(), 1);
    let Err(error) = &results[0].1 else {
        panic!("the source's failure must fail its key: {results:?}");
    };
    assert_eq!(error.reason(), "roles");
    assert!(
        error.to_string().contains("InitError: no such cluster"),
        "{error}"
    );
    assert_eq!(rig.failed(), vec!["scheduler/v1/query.wasm"]);
    let failure = rig.store.roles.peek().failed["scheduler/v1/query.wasm"].clone();
    assert!(
        failure.message.contains("not rendered"),
        "{}",
        failure.message
    );
    // Nothing rendered, nothing forgotten: the applied role stays.
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["api"]);
    assert_eq!(rig.controller.node_roles(), None);
    assert!(rig.applied.load().contains_key("api"));

    // The source recovers (the driver's retry): the failure clears.
    source.answer(Ok(json!({"api": {"template": "other/v1"}})));
    rig.pass_all().await;
    assert!(rig.failed().is_empty());
}

#[tokio::test]
async fn a_new_version_of_the_role_source_derives_the_roles_again_for_the_same_schedule() {
    let (rig, source) = rig_with_given();
    source.answer(Ok(json!({"api": {"template": "other/v1", "v": 1}})));
    rig.schedule.set(schedule(json!({})));
    rig.pass_all().await;
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["api"]);
    rig.pass_all().await;
    assert_eq!(
        source.asked.lock().unwrap().len(),
        1,
        "asked once per schedule"
    );

    // The module changed: the next scan asks again and renders what it says now.
    source.answer(Ok(json!({"api": {"template": "other/v1", "v": 2}})));
    *source.version.lock().unwrap() = Some("2".into());
    assert_eq!(rig.controller.keys(), vec!["scheduler/v1/query.wasm"]);
    rig.pass_all().await;
    rig.pass_all().await;
    assert_eq!(rig.applier.roles(), vec!["api", "api"]);
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    assert_eq!(jobs[1].vars["v"], json!(2));
    assert_eq!(source.asked.lock().unwrap().len(), 2);
}

/// Roles end a pass in whatever order their attempts finish; the pass's `failed` (in
/// `last_deployment` and the log's `DeploymentFinish`) lists them in name order all the same,
/// as `roles` is, so two runs of one schedule report the same list.
#[tokio::test]
async fn a_pass_lists_its_failed_roles_in_name_order_whatever_order_they_failed_in() {
    let rig = rig();
    rig.applier.fail("cache", "exit status 1");
    rig.applier.fail("web", "exit status 1");
    rig.schedule.set(schedule(json!({"cache": {}, "web": {}})));
    let mut keys = rig.controller.keys();
    keys.reverse();
    assert_eq!(keys, ["web", "cache"]);
    for role in keys {
        assert!(rig.controller.clone().reconcile(role).await.is_err());
    }
    let last = rig.store.roles.peek().last_deployment.clone().unwrap();
    assert_eq!(last.failed, ["cache", "web"]);
    assert!(last.finished.is_some());
}

/// `value` as a follower takes it from the leader: text its maker vouched for.
fn vouched(value: &Value) -> Option<Schedule> {
    let text = String::from_utf8(crate::schedule::hash::canonical_json(value)).unwrap();
    let data = ScheduleData::received_vouched(text.clone(), 0..text.len(), HOST).unwrap();
    Some(Schedule {
        data,
        ..Schedule::new(
            value.clone(),
            1_500_000_000_000,
            "0123456789abcdef0123456789abcdef".into(),
        )
    })
}

/// What a pass of `schedule` hands the applier for `web`, and the desired hash it saves.
async fn web_job(schedule: Option<Schedule>) -> (RoleJob, String) {
    let rig = rig();
    rig.schedule.set(schedule);
    rig.pass_all().await;
    let jobs = rig.applier.jobs.lock().unwrap().clone();
    let job = jobs
        .iter()
        .find(|j| j.role == "web")
        .expect("web applied")
        .clone();
    let hash = rig.applied.0.lock().unwrap()["web"].clone();
    (job, hash)
}

#[tokio::test]
async fn a_roles_big_own_values_reach_the_applier_as_text_with_the_same_hash() {
    let services: Value = (0..500)
        .map(|i| {
            (
                format!("s{i:03}"),
                json!({"image": format!("img:{i}"), "n": i}),
            )
        })
        .collect::<serde_json::Map<String, Value>>()
        .into();
    let with = |web: Value, node_vars: Value| {
        json!({"vars": {"template": "app/v1"}, "roles": {"web": web},
               "nodes": {HOST: {"vars": node_vars, "roles": {"web": {"v": 2}}}}})
    };
    // Kept as text: left out of the variables, handed on beside them; hashed the same.
    let value = with(json!({"services": services, "v": 1, "w": 3}), json!({}));
    let (job, hash) = web_job(vouched(&value)).await;
    let (tree_job, tree_hash) = web_job(read_back(&value)).await;
    assert_eq!(hash, tree_hash);
    assert!(!job.vars.contains_key("services"));
    assert_eq!((&job.vars["v"], &job.vars["w"]), (&json!(2), &json!(3)));
    let keys: Vec<&str> = job.unparsed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["services"]);
    assert_eq!(job.unparsed[0].1.parse(), services);
    assert_eq!(tree_job.vars["services"], services);
    assert!(tree_job.unparsed.is_empty());
    let mut whole = job.vars.as_ref().clone();
    whole.insert("services".into(), job.unparsed[0].1.parse());
    assert_eq!(
        but_the_pass(whole),
        but_the_pass(tree_job.vars.as_ref().clone())
    );
    // A key another source also sets is merged from the tree; a role variable the hash leaves
    // out (`timestamp`) has the role's variables hashed from the tree.
    for value in [
        with(
            json!({"services": services, "v": 1}),
            json!({"services": {"x": 1}}),
        ),
        with(json!({"services": services, "timestamp": "t"}), json!({})),
    ] {
        let (job, hash) = web_job(vouched(&value)).await;
        let (tree_job, tree_hash) = web_job(read_back(&value)).await;
        assert_eq!(hash, tree_hash, "{}", value["nodes"]);
        let kept_as_text = job.unparsed.iter().map(|(k, p)| (k.clone(), p.parse()));
        let mut whole = job.vars.as_ref().clone();
        whole.extend(kept_as_text);
        assert_eq!(
            but_the_pass(whole),
            but_the_pass(tree_job.vars.as_ref().clone())
        );
    }
}

/// Sources of [`DIGESTED_MIN`] bytes or more enter the desired hash as their digest: the same
/// hash whether the role's text was received or written from the tree, and another one for any
/// change deep inside, in the role's own variables or in the shared `vars`.
#[tokio::test]
async fn big_sources_are_hashed_by_their_digest_and_every_change_in_them_counts() {
    let services = |changed: usize| -> Value {
        (0..3000)
            .map(|i| {
                let image = format!("registry.example.com/img-{i}:{}", u8::from(i == changed));
                (format!("s{i:04}"), json!({"image": image, "n": i}))
            })
            .collect::<serde_json::Map<String, Value>>()
            .into()
    };
    let size = serde_json::to_vec(&services(0)).unwrap().len();
    assert!(size > DIGESTED_MIN, "{size}");
    let role_big = |changed| {
        json!({"vars": {"template": "app/v1"}, "roles": {"web": {"services": services(changed)}},
               "nodes": {HOST: {"roles": {"web": {}}}}})
    };
    let shared_big = |changed| {
        json!({"vars": {"template": "app/v1", "services": services(changed)},
               "nodes": {HOST: {"roles": {"web": {}}}}})
    };
    let mut hashes = BTreeMap::new();
    for (shape, schedule) in [
        ("role", &role_big as &dyn Fn(usize) -> Value),
        ("shared", &shared_big),
    ] {
        for changed in [5000, 0, 2999] {
            let value = schedule(changed);
            let (_, hash) = web_job(vouched(&value)).await;
            let (_, tree_hash) = web_job(read_back(&value)).await;
            let (_, own_hash) = web_job(schedule_of(&value)).await;
            assert_eq!(hash, tree_hash, "{shape}, {changed}");
            assert_eq!(hash, own_hash, "{shape}, {changed}");
            assert!(
                hashes.insert(hash, (shape, changed)).is_none(),
                "{shape}, {changed}"
            );
        }
    }
    assert_eq!(hashes.len(), 6);
}

/// `value` as a node reads it from the disk (data it did not write: its view projected from
/// the tree, nothing kept as text).
fn read_back(value: &Value) -> Option<Schedule> {
    let text = String::from_utf8(crate::schedule::hash::canonical_json(value)).unwrap();
    let hash = crate::schedule::hash::hash_canonical(text.as_bytes());
    Some(Schedule {
        data: ScheduleData::from_text(&text, &hash).unwrap(),
        ..schedule_of(value).unwrap()
    })
}

fn schedule_of(value: &Value) -> Option<Schedule> {
    Some(Schedule::new(
        value.clone(),
        1_500_000_000_000,
        "0123456789abcdef0123456789abcdef".into(),
    ))
}

/// Variables without the pass's random `deployment_id`.
fn but_the_pass(mut vars: serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    vars.remove("deployment_id");
    vars
}

/// Another role's retry starts a pass that takes over a role whose attempt is still running in
/// the older pass; that attempt applies it. The newer pass then ends as well, and the status's
/// last deployment is finished, rather than waiting for an attempt with nothing left to do
/// (seen once in a process test under load: `last_deployment.finished` stayed null).
#[tokio::test]
async fn a_pass_that_took_over_a_running_role_ends_when_that_attempt_applies_it() {
    let rig = rig();
    rig.schedule.set(schedule(json!({"db": {}, "web": {}})));
    rig.applier.fail("web", "boom");
    let gate = rig.applier.gate("db");
    // db's attempt starts the first pass and waits at the gate.
    let db = tokio::spawn(rig.controller.clone().reconcile("db".into()));
    while !rig.applier.roles().contains(&"db".to_string()) {
        tokio::task::yield_now().await;
    }
    // web fails in that pass; healed, its retry starts a second pass, which takes db over.
    assert!(
        rig.controller
            .clone()
            .reconcile("web".into())
            .await
            .is_err()
    );
    rig.applier.heal("web");
    assert!(rig.controller.clone().reconcile("web".into()).await.is_ok());
    let open = |rig: &Rig| rig.controller.state.lock().unwrap().passes.len();
    assert_eq!(open(&rig), 1, "the second pass waits for db");
    gate.notify_one();
    assert_eq!(
        db.await.unwrap().unwrap(),
        Some(Duration::ZERO),
        "db is asked again at once"
    );
    assert_eq!(
        rig.controller.clone().reconcile("db".into()).await.unwrap(),
        None
    );
    assert_eq!(open(&rig), 0, "every pass ended");
    let last = rig.store.roles.peek().last_deployment.clone().unwrap();
    assert!(last.finished.is_some(), "{last:?}");
    assert_eq!(last.roles, ["db", "web"]);
    assert!(last.failed.is_empty(), "{last:?}");
    let db_runs = rig.applier.roles().iter().filter(|r| *r == "db").count();
    assert_eq!(db_runs, 1, "applied once, not again for the second pass");
}
