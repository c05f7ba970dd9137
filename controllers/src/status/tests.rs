//! The status view from store snapshots: each test asserts what an operator reads in
//! `/v1/status`.

use futures::FutureExt;
use serde_json::json;

use super::*;
use crate::node::StoreWriter;
use crate::state::{BlockedState, InputError, Peer, Report, RoleFailure, ScheduleStamp};
use crate::testing::{STATUS_KEYS, inputs};

const ME: &str = "77985419c732412ea38b94db00000001";
const BETA: &str = "77985419c732412ea38b94db00000002";
const GAMMA: &str = "77985419c732412ea38b94db00000003";

fn node() -> NodeInfo {
    NodeInfo {
        id: ME.into(),
        name: "alpha.example.com".into(),
        hostname: "alpha".into(),
        addr: "10.0.0.1:8400".into(),
        port: 8400,
        debug_force_leader: false,
        default_frontend: "common".into(),
        version: "v9.9.9".into(),
    }
}

fn status(writer: &StoreWriter) -> Status {
    view(
        &node(),
        &Snapshot::take(&writer.store()),
        SchedulerRuns::default(),
    )
}

fn peer(id: &str, name: &str, addr: Option<&str>) -> Peer {
    Peer {
        id: id.into(),
        addr: addr.map(Into::into),
        name: format!("{name}.example.com"),
        hostname: name.into(),
        schedule: None,
        known_since: 1,
        last_report_direct: None,
        errors: 0,
    }
}

fn with_peers(writer: &StoreWriter, peers: Vec<Peer>) {
    writer.peers.set(Peers {
        peers: peers.into_iter().map(|p| (p.id.clone(), p)).collect(),
        timestamp: Some(500),
    });
}

/// BETA (listening on port 9000) leads; GAMMA, known without an address, is the other peer.
fn following_beta_with_gamma(writer: &StoreWriter) {
    let peers = vec![
        peer(BETA, "beta", Some("10.0.0.2:9000")),
        peer(GAMMA, "gamma", None),
    ];
    with_peers(writer, peers);
    writer.election.set(following(BETA));
}

fn leading(epoch: u64) -> ElectionState {
    ElectionState {
        is_leader: true,
        is_stable: true,
        leader: Some(ME.into()),
        epoch,
        last_stable_timestamp: Some(1000),
        ..Default::default()
    }
}

fn following(leader: &str) -> ElectionState {
    ElectionState {
        is_stable: true,
        leader: Some(leader.into()),
        epoch: 4,
        ..Default::default()
    }
}

fn stamp(hash: &str) -> ScheduleStamp {
    ScheduleStamp {
        timestamp: 1,
        hash: hash.into(),
        origin: BETA.into(),
    }
}

fn report(schedule: Option<ScheduleStamp>, errors: u64) -> Report {
    Report {
        schedule,
        errors,
        epoch: 4,
    }
}

#[test]
fn a_single_node_leads_itself_at_its_listen_address() {
    let schedule = Schedule::test()
        .with_role("web", "v2")
        .with_node_role("alpha", "db", json!({}))
        .build();
    let writer = StoreWriter::new(Some(schedule.clone()));
    writer.election.set(leading(1));
    let status = status(&writer);
    assert_eq!(
        status.leader,
        Some(LeaderInfo {
            id: ME.into(),
            name: "alpha.example.com".into(),
            hostname: "alpha".into(),
            addr: Some("10.0.0.1:8400".into()),
            schedule: Some(schedule.hash.clone()),
        })
    );
    assert_eq!(status.fetch_state, json!({"state": "StableLeader"}));
    assert_eq!(status.schedule_status, "ok");
    assert_eq!(status.schedule_id, Some(schedule.hash));
    assert_eq!(status.roles, 2, "web and db");
    assert_eq!(status.peers, 0);
    assert_eq!(status.peers_timestamp, None);
    assert_eq!(status.last_stable_timestamp, Some(1000));
    assert_eq!(status.num_errors, 0);
    assert!(status.errors.is_empty());
    assert_eq!(status.version, "v9.9.9");
    assert!(status.election_state.is_leader);
}

#[test]
fn a_leader_without_a_schedule_yet_is_waiting() {
    let writer = StoreWriter::new(None);
    writer.election.set(leading(1));
    let status = status(&writer);
    assert_eq!(status.schedule_status, "waiting");
    assert_eq!(status.fetch_state, json!({"state": "StableLeader"}));
    assert_eq!(status.schedule_id, None);
    assert_eq!(status.roles, 0);
    assert_eq!(status.leader.unwrap().schedule, None);
    assert!(status.last_deployment.is_none());
}

#[test]
fn a_new_leader_with_peers_prefetches_until_it_gathered_this_epochs_schedules() {
    let writer = StoreWriter::new(Some(Schedule::test().build()));
    with_peers(&writer, vec![peer(BETA, "beta", Some("10.0.0.2:8400"))]);
    writer.election.set(leading(5));
    writer.prefetched.set(Prefetched {
        epoch: 4,
        schedules: Vec::new(),
        awaiting: None,
    });
    let status = status(&writer);
    assert_eq!(
        status.fetch_state,
        json!({"state": "Prefetching", "Fetching": null})
    );
    assert_eq!(status.schedule_status, "waiting");

    writer.prefetched.set(Prefetched {
        epoch: 5,
        schedules: Vec::new(),
        awaiting: None,
    });
    let status = self::status(&writer);
    assert_eq!(status.fetch_state, json!({"state": "StableLeader"}));
    assert_eq!(status.schedule_status, "ok");

    // After a heal, waiting for another leader's schedule before the next run (issue 28).
    writer.prefetched.set(Prefetched {
        epoch: 5,
        schedules: Vec::new(),
        awaiting: Some(stamp("other-side")),
    });
    let status = self::status(&writer);
    assert_eq!(
        status.fetch_state,
        json!({"state": "Prefetching", "Fetching": "other-side"})
    );
    assert_eq!(status.schedule_status, "waiting");
}

#[test]
fn a_follower_shows_the_leader_from_the_peer_list_and_whether_it_holds_its_schedule() {
    let held = Schedule::test().with_role("web", "v1").build();
    let writer = StoreWriter::new(Some(held.clone()));
    following_beta_with_gamma(&writer);
    writer
        .reports
        .set([(BETA.to_string(), report(Some(stamp("newer")), 0))].into());
    let status = status(&writer);
    assert_eq!(
        status.leader,
        Some(LeaderInfo {
            id: BETA.into(),
            name: "beta.example.com".into(),
            hostname: "beta".into(),
            addr: Some("10.0.0.2:9000".into()),
            schedule: Some("newer".into()),
        })
    );
    assert_eq!(status.peers, 2);
    assert_eq!(status.peers_timestamp, Some(500));
    // It holds another schedule than the one the leader announced: fetching that one.
    assert_eq!(
        status.fetch_state,
        json!({"state": "Replicating", "leader": BETA, "schedule": "newer"})
    );
    assert_eq!(status.schedule_status, "fetching");
    assert_eq!(status.schedule_id, Some(held.hash.clone()));

    // Holding the announced one.
    writer
        .reports
        .set([(BETA.to_string(), report(Some(held.stamp()), 0))].into());
    let status = self::status(&writer);
    assert_eq!(
        status.fetch_state,
        json!({"state": "Replicating", "leader": BETA, "schedule": null})
    );
    assert_eq!(status.schedule_status, "ok");

    // A new leader that announces nothing yet: holding a schedule is ok.
    writer
        .reports
        .set([(BETA.to_string(), report(None, 0))].into());
    assert_eq!(self::status(&writer).schedule_status, "ok");

    // Holding nothing: fetching, whatever the leader announces.
    writer.schedule.set(None);
    let status = self::status(&writer);
    assert_eq!(status.schedule_status, "fetching");
    assert_eq!(status.leader.unwrap().schedule, None);
}

#[test]
fn a_leader_missing_from_the_peer_list_is_not_shown() {
    let writer = StoreWriter::new(None);
    with_peers(&writer, vec![peer(BETA, "beta", None)]);
    writer.election.set(following(GAMMA));
    let status = status(&writer);
    assert_eq!(status.leader, None);
    assert_eq!(status.election_state.leader.as_deref(), Some(GAMMA));
}

#[test]
fn an_unstable_node_shows_no_leader_and_unstable() {
    let writer = StoreWriter::new(Some(Schedule::test().build()));
    writer.election.set(ElectionState {
        epoch: 3,
        ..Default::default()
    });
    let status = status(&writer);
    assert_eq!(status.leader, None);
    assert_eq!(status.fetch_state, json!({"state": "Unstable"}));
    assert_eq!(status.schedule_status, "unstable");
    assert_eq!(status.last_stable_timestamp, None);
}

#[test]
fn the_redirect_port_is_the_leaders_own_where_known_else_this_nodes() {
    let writer = StoreWriter::new(None);
    writer.election.set(leading(1));
    let me = status(&writer).leader.unwrap();
    assert_eq!(me.port(1), 8400, "this node's listen address");

    following_beta_with_gamma(&writer);
    assert_eq!(status(&writer).leader.unwrap().port(8400), 9000);
    writer.election.set(following(GAMMA));
    assert_eq!(
        status(&writer).leader.unwrap().port(8400),
        8400,
        "no address in the list: nodes share a port"
    );
}

#[test]
fn failing_roles_are_listed_counted_and_explained() {
    let writer = StoreWriter::new(None);
    let failure = |message: &str| RoleFailure {
        message: message.into(),
        since: 1,
        attempts: 3,
        deployment_id: None,
    };
    writer.roles.set(RolesStatus {
        failed: [
            ("web".to_string(), failure("command 2 exited with 1")),
            ("db".to_string(), failure("templates/db/x: line 1")),
        ]
        .into(),
        last_deployment: Some(Deployment {
            id: "d1".into(),
            schedule: "abc".into(),
            started: 10,
            finished: Some(20),
            roles: vec!["db".into(), "web".into()],
            failed: vec!["db".into(), "web".into()],
            blocked: vec!["app".into()],
        }),
        blocked: [(
            "app".to_string(),
            RoleBlocked {
                state: BlockedState::Blocked,
                on: vec!["db".into()],
                root_cause: vec!["db".into()],
                reason: "depends on db, which failed or is blocked".into(),
                since: 15,
                deployment_id: Some("d1".into()),
            },
        )]
        .into(),
        deployment_log: Some("log dir: permission denied".into()),
    });
    let status = status(&writer);
    assert_eq!(status.failed_roles, ["db", "web"]);
    assert_eq!(status.blocked_roles["app"].on, ["db"]);
    assert_eq!(status.last_deployment.as_ref().unwrap().blocked, ["app"]);
    assert_eq!(status.errors["role web"], "command 2 exited with 1");
    assert_eq!(status.errors["role db"], "templates/db/x: line 1");
    assert_eq!(
        status.errors["deployment_log"],
        "log dir: permission denied"
    );
    assert_eq!(status.num_errors, 3);
    assert_eq!(status.last_deployment.unwrap().id, "d1");
}

#[test]
fn scheduler_runs_count_every_failure_kind() {
    let writer = StoreWriter::new(None);
    // An exhaustive match: a new kind fails to compile here until it has a count, and is
    // missed by the sum unless it is in `SchedulerFailure::ALL`.
    let runs = SchedulerRuns::count(30, |kind| match kind {
        SchedulerFailure::Load => 1,
        SchedulerFailure::Runtime => 2,
        SchedulerFailure::Timeout => 3,
        SchedulerFailure::Memory => 4,
        SchedulerFailure::BadOutput => 5,
        SchedulerFailure::Internal => 6,
    });
    let status = view(&node(), &Snapshot::take(&writer.store()), runs);
    assert_eq!(status.metrics["scheduler_failed"], 21);
    assert_eq!(status.metrics["scheduler_succeeded"], 9);
    let labels: std::collections::BTreeSet<_> =
        SchedulerFailure::ALL.iter().map(|k| k.label()).collect();
    assert_eq!(labels.len(), SchedulerFailure::ALL.len(), "labels differ");
}

#[test]
fn unused_entries_of_the_datacenters_output_show_while_leading() {
    let writer = StoreWriter::new(None);
    writer.election.set(leading(1));
    writer.scheduler.set(SchedulerStatus {
        datacenters_errors: vec![
            "datacenters.requests.lon[0]: \"lon\" is not a known data center".into(),
            "datacenters.answers.fra[1]: a lease of 0 ms".into(),
        ],
        ..Default::default()
    });
    let status = status(&writer);
    assert_eq!(
        status.errors["scheduler_datacenters"],
        "datacenters.requests.lon[0]: \"lon\" is not a known data center; \
         datacenters.answers.fra[1]: a lease of 0 ms"
    );
    assert_eq!(status.num_errors, 1);
    writer.election.set(following(BETA));
    let status = self::status(&writer);
    assert!(status.errors.is_empty(), "{:?}", status.errors);
    assert_eq!(status.num_errors, 0);
}

#[test]
fn a_failed_scheduler_run_shows_while_leading_under_its_domain() {
    let writer = StoreWriter::new(None);
    writer.election.set(leading(1));
    writer.scheduler.set(SchedulerStatus {
        error: Some("scheduler/v1/main.lua:7: boom".into()),
        failure: Some(SchedulerFailure::Runtime),
        ..Default::default()
    });
    let status = status(&writer);
    assert_eq!(status.errors["scheduler"], "scheduler/v1/main.lua:7: boom");
    assert_eq!(status.num_errors, 1);

    writer.scheduler.update(|s| {
        s.error = Some("main.lua:1: unexpected symbol".into());
        s.failure = Some(SchedulerFailure::Load);
    });
    let status = self::status(&writer);
    assert_eq!(
        status.errors["scheduler_load"],
        "main.lua:1: unexpected symbol"
    );
    assert!(!status.errors.contains_key("scheduler"));

    // A node that stepped down no longer counts its last run.
    writer.election.set(following(BETA));
    let status = self::status(&writer);
    assert!(status.errors.is_empty(), "{:?}", status.errors);
    assert_eq!(status.num_errors, 0);
}

#[test]
fn a_schedule_not_written_to_disk_is_an_error_until_written() {
    let writer = StoreWriter::new(None);
    writer
        .persist_error
        .set(Some("schedule.json: No space left on device".into()));
    let status = status(&writer);
    assert_eq!(
        status.errors[SCHEDULE_PERSIST],
        "schedule.json: No space left on device"
    );
    assert_eq!(status.num_errors, 1);
    writer.persist_error.set(None);
    assert_eq!(self::status(&writer).num_errors, 0);
}

#[test]
fn input_errors_share_their_files_entry_and_each_counts() {
    let writer = StoreWriter::new(None);
    let mut bad = inputs(json!({}));
    for (path, line, message) in [
        ("runtime/a.yaml", Some(3), "did not find expected ','"),
        ("runtime/a.yaml", None, "duplicate key"),
        ("templates/web/x.hbs", None, "permission denied"),
    ] {
        bad.errors.push(InputError {
            path: path.into(),
            line,
            message: message.into(),
        });
    }
    writer.inputs.set(bad);
    let status = status(&writer);
    assert_eq!(
        status.errors["runtime/a.yaml"],
        "line 3: did not find expected ','; duplicate key"
    );
    assert_eq!(status.errors["templates/web/x.hbs"], "permission denied");
    assert_eq!(status.num_errors, 3);
    assert_eq!(status.metrics["input_errors"], 3);
}

#[test]
fn peers_whose_last_report_counted_errors_are_failing_nodes() {
    let writer = StoreWriter::new(None);
    writer.election.set(leading(4));
    let mut listed_failing = peer(GAMMA, "gamma", None);
    listed_failing.errors = 2;
    let delta = "77985419c732412ea38b94db00000004";
    let mut recovered = peer(delta, "delta", Some("10.0.0.4:8400"));
    recovered.errors = 7;
    with_peers(
        &writer,
        vec![
            peer(BETA, "beta", Some("10.0.0.2:8400")),
            listed_failing,
            recovered,
        ],
    );
    writer.reports.set(
        [
            (BETA.to_string(), report(None, 5)),
            (delta.to_string(), report(None, 0)),
        ]
        .into(),
    );
    let status = status(&writer);
    assert_eq!(
        status.failing_nodes,
        [
            FailingNode {
                id: BETA.into(),
                name: "beta.example.com".into(),
                hostname: "beta".into(),
                addr: Some("10.0.0.2:8400".into()),
                errors: 5,
            },
            FailingNode {
                id: GAMMA.into(),
                name: "gamma.example.com".into(),
                hostname: "gamma".into(),
                addr: None,
                errors: 2,
            },
        ],
        "a report overrides the list's count; delta's last report had none"
    );
    assert_eq!(
        status.num_errors, 0,
        "other nodes' errors are not this node's"
    );
}

#[test]
fn the_json_keeps_verwalter_013s_keys_in_order() {
    let writer = StoreWriter::new(None);
    writer.election.set(leading(1));
    let json = serde_json::to_value(status(&writer)).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = STATUS_KEYS.to_vec();
    // serde_json's map is sorted unless its `preserve_order` is on; either way every key is there.
    if keys != expected {
        expected.sort_unstable();
    }
    assert_eq!(keys, expected);
}

/// Whether any trigger has a change to report, without waiting.
#[test]
fn the_service_status_line_names_the_leader_schedule_and_failing_roles() {
    let writer = StoreWriter::new(None);
    assert_eq!(
        status(&writer).line(),
        "no leader (epoch 0); no schedule; 0 failing roles"
    );
    let schedule = Schedule::test().with_role("web", "v2").build();
    let hash = schedule.hash.clone();
    writer.schedule.set(Some(schedule));
    writer.election.set(leading(3));
    assert_eq!(
        status(&writer).line(),
        format!("leader (epoch 3); schedule {}; 0 failing roles", &hash[..8])
    );
    following_beta_with_gamma(&writer);
    let failure = RoleFailure {
        message: "exited with 1".into(),
        since: 1,
        attempts: 1,
        deployment_id: None,
    };
    writer.roles.set(RolesStatus {
        failed: [("web".to_string(), failure)].into(),
        ..Default::default()
    });
    assert_eq!(
        status(&writer).line(),
        format!(
            "follower of beta.example.com (epoch 4); schedule {}; 1 failing role",
            &hash[..8]
        )
    );
}

fn woke(triggers: &mut [Box<dyn Trigger>]) -> bool {
    futures::future::select_all(triggers.iter_mut().map(|t| t.changed()))
        .now_or_never()
        .is_some()
}

#[test]
fn every_field_the_status_shows_wakes_its_triggers_and_no_other_does() {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    let sources = Fields::new(&store);
    let mut triggers = sources.triggers();
    assert!(!woke(&mut triggers), "changes before are seen");
    let json = || {
        serde_json::to_string(&view(
            &node(),
            &sources.snapshot(),
            SchedulerRuns::default(),
        ))
        .unwrap()
    };
    type Change<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let changes: Vec<Change> = vec![
        (
            "inputs",
            Box::new(|| {
                let mut bad = inputs(json!({}));
                bad.errors.push(InputError {
                    path: "runtime/x.yaml".into(),
                    line: None,
                    message: "bad".into(),
                });
                writer.inputs.set(bad);
            }),
        ),
        ("election", Box::new(|| _ = writer.election.set(leading(2)))),
        (
            "peers",
            Box::new(|| with_peers(&writer, vec![peer(BETA, "beta", None)])),
        ),
        (
            "reports",
            Box::new(|| {
                _ = writer
                    .reports
                    .set([(BETA.to_string(), report(None, 1))].into())
            }),
        ),
        (
            "prefetched",
            Box::new(|| {
                _ = writer.prefetched.set(Prefetched {
                    epoch: 2,
                    schedules: Vec::new(),
                    awaiting: None,
                })
            }),
        ),
        (
            "schedule",
            Box::new(|| _ = writer.schedule.set(Some(Schedule::test().build()))),
        ),
        (
            "scheduler",
            Box::new(|| {
                _ = writer.scheduler.set(SchedulerStatus {
                    error: Some("boom".into()),
                    ..Default::default()
                })
            }),
        ),
        (
            "roles",
            Box::new(|| {
                _ = writer.roles.set(RolesStatus {
                    deployment_log: Some("full".into()),
                    ..Default::default()
                })
            }),
        ),
        (
            "persist_error",
            Box::new(|| _ = writer.persist_error.set(Some("disk full".into()))),
        ),
    ];
    for (field, change) in changes {
        let before = json();
        change();
        assert_ne!(json(), before, "a change of {field} shows in the status");
        assert!(woke(&mut triggers), "a change of {field} wakes the status");
        assert!(!woke(&mut triggers), "{field}: one change, one wake");
    }

    // Fields the status does not show wake nothing.
    writer.actions.set([(1, json!({"button": "x"}))].into());
    writer.force_render.set(3);
    writer
        .templates
        .set(crate::testing::templates(&[("web/a", "x")]));
    writer.replaced.set(vec![Schedule::test().build()]);
    writer.parents.set(vec![Schedule::test().build()]);
    assert!(!woke(&mut triggers));
}

/// The count a follower sends its leader in pongs includes a deployment log that cannot be
/// written and a schedule that could not be persisted (issue 10: only failing roles and input
/// errors counted, so the leader's failing_nodes missed such a node).
#[test]
fn the_error_count_has_every_problem_of_the_status() {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    assert_eq!(error_count(&store), 0);
    writer.roles.update(|r| {
        r.deployment_log = Some("/var/log/verwalter: read-only file system".into());
    });
    assert_eq!(error_count(&store), 1);
    writer
        .persist_error
        .set(Some("schedule.json: No space left on device".into()));
    assert_eq!(error_count(&store), 2);
    writer.roles.update(|r| {
        r.failed.insert(
            "web".into(),
            RoleFailure {
                message: "command failed".into(),
                since: 1,
                attempts: 1,
                deployment_id: None,
            },
        );
    });
    writer.inputs.update(|i| {
        i.errors.push(InputError {
            path: "runtime/a.yaml".into(),
            line: Some(3),
            message: "bad".into(),
        });
    });
    writer
        .scheduler
        .update(|s| s.error = Some("main.lua:1: boom".into()));
    // The scheduler's failure counts only while this node leads (only a leader runs it).
    assert_eq!(error_count(&store), 4);
    writer.election.update(|e| e.is_leader = true);
    assert_eq!(error_count(&store), 5);
    writer.persist_error.set(None);
    writer.roles.update(|r| r.deployment_log = None);
    assert_eq!(error_count(&store), 3);
}
