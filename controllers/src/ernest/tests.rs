use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::*;
use crate::graph::ErrorPolicy;

const TIMEOUT: Duration = Duration::from_secs(60);

fn settings(policy: ErrorPolicy) -> RunSettings {
    RunSettings {
        policy,
        component_timeout: TIMEOUT,
        templating: Templating::Extended,
    }
}

fn change(id: &str, action: &str) -> Value {
    let (kind, name) = id.split_once("::").unwrap();
    json!({"_component_id": id, "_component": kind, "_action": action, "_provider": "fake",
           "_state": "waiting", "name": name, "service": ""})
}

/// An ernest-style service: network -> firewall -> two instances -> load balancer, the firewall
/// and the load balancer filled from other components' fields.
fn service() -> Build {
    let mut firewall = change("firewall::web", "create");
    firewall["network_id"] =
        json!("$(components.#[_component_id=\"network::web\"].network_aws_id)");
    let mut lb = change("elb::web", "create");
    lb["instance_ips"] = json!([
        "$(components.#[_component_id=\"instance::web-1\"].ip)",
        "$(components.#[_component_id=\"instance::web-2\"].ip)"
    ]);
    lb["name_tag"] = json!("lb for $(name)");
    serde_json::from_value(json!({
        "id": "svc-1", "name": "shop", "user_id": 7, "username": "ann", "action": "create",
        "options": {}, "datacenters": {"items": [{"region": "eu"}]},
        "components": [],
        "changes": [change("network::web", "create"), firewall,
                    change("instance::web-1", "create"), change("instance::web-2", "create"), lb],
        "edges": [
            {"source": "start", "destination": "network::web", "length": 1},
            {"source": "network::web", "destination": "firewall::web", "length": 1},
            {"source": "firewall::web", "destination": "instance::web-1", "length": 1},
            {"source": "firewall::web", "destination": "instance::web-2", "length": 1},
            {"source": "instance::web-1", "destination": "elb::web", "length": 1},
            {"source": "instance::web-2", "destination": "elb::web", "length": 1},
            {"source": "elb::web", "destination": "end", "length": 1}
        ]
    }))
    .unwrap()
}

fn payload(o: &Outgoing) -> Component {
    serde_json::from_slice(&o.payload).unwrap()
}

fn subjects(out: &[Outgoing]) -> Vec<&str> {
    out.iter().map(|o| o.subject.as_str()).collect()
}

/// The worker's answer to a dispatch: its payload with extra fields.
fn done(dispatch: &Outgoing, extra: Value) -> Component {
    let mut p = payload(dispatch);
    for (k, v) in extra.as_object().unwrap() {
        p.insert(k.clone(), v.clone());
    }
    p
}

#[test]
fn subjects_are_read_as_ernest_reads_them() {
    assert_eq!(Subject::parse("build.create"), Subject::Build("create"));
    assert_eq!(Subject::parse("build.sync"), Subject::Build("sync"));
    assert_eq!(Subject::parse("build.frobnicate"), Subject::Other);
    assert_eq!(
        Subject::parse("instance.create.aws.done"),
        Subject::Answer { errored: false }
    );
    assert_eq!(
        Subject::parse("instance.create.aws.error"),
        Subject::Answer { errored: true }
    );
    // Our own results and dispatches are not answers.
    assert_eq!(Subject::parse("build.create.done"), Subject::Other);
    assert_eq!(Subject::parse("instance.create.aws"), Subject::Other);
}

#[test]
fn a_service_builds_in_dependency_order_with_references_resolved() {
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 1000);
    let out = run.pump(1000);
    assert_eq!(subjects(&out), ["network.create.fake"]);
    let net = payload(&out[0]);
    assert_eq!(net["_state"], "running");
    assert_eq!(net["service"], "svc-1");
    assert_eq!(run.pump(1000), vec![], "nothing new without an answer");

    let answer = done(&out[0], json!({"network_aws_id": "net-42"}));
    assert!(matches!(
        run.answer(answer, false, 1500),
        Answered::Applied {
            latency_ms: 500,
            errored: false
        }
    ));
    let out = run.pump(1500);
    assert_eq!(subjects(&out), ["firewall.create.fake"]);
    assert_eq!(payload(&out[0])["network_id"], "net-42");
    // The stored change keeps its reference (a later step resolves it again).
    let stored = &run.build.changes[1];
    assert_eq!(stored["_state"], "running");
    assert!(stored["network_id"].as_str().unwrap().starts_with("$("));

    run.answer(done(&out[0], json!({})), false, 1600);
    let out = run.pump(1600);
    assert_eq!(
        subjects(&out),
        ["instance.create.fake", "instance.create.fake"]
    );
    assert_eq!(run.in_flight(), 2);
    run.answer(done(&out[1], json!({"ip": "10.0.0.2"})), false, 1700);
    assert_eq!(run.pump(1700), vec![], "the balancer waits for both");
    run.answer(done(&out[0], json!({"ip": "10.0.0.1"})), false, 1800);
    let out = run.pump(1800);
    assert_eq!(subjects(&out), ["elb.create.fake"]);
    let lb = payload(&out[0]);
    assert_eq!(lb["instance_ips"], json!(["10.0.0.1", "10.0.0.2"]));
    assert_eq!(lb["name_tag"], "lb for shop");

    run.answer(done(&out[0], json!({"dns": "lb.example"})), false, 1900);
    let out = run.pump(1900);
    assert_eq!(subjects(&out), ["build.create.done"]);
    assert!(out[0].terminal);
    let result: Build = serde_json::from_slice(&out[0].payload).unwrap();
    assert!(result.changes.iter().all(|c| c["_state"] == "completed"));
    let ids: Vec<&str> = result.components.iter().filter_map(component_id).collect();
    assert_eq!(
        ids,
        [
            "network::web",
            "firewall::web",
            "instance::web-2",
            "instance::web-1",
            "elb::web"
        ],
        "components in the order they completed"
    );
    assert_eq!(result.extra["datacenters"]["items"][0]["region"], "eu");
    assert_eq!(result.user_id, Some(json!(7)));
    assert_eq!(run.result.as_ref().unwrap().kind, ResultKind::Done);
    assert_eq!(run.pump(2000), vec![], "one terminal message only");
}

#[test]
fn halt_waits_for_in_flight_components_then_errors_once() {
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    let net = run.pump(0);
    run.answer(done(&net[0], json!({"network_aws_id": "n1"})), false, 1);
    let fw = run.pump(1);
    run.answer(done(&fw[0], json!({})), false, 2);
    let inst = run.pump(2);
    assert_eq!(inst.len(), 2);

    let failed = done(&inst[0], json!({"error_message": "quota exceeded"}));
    assert!(matches!(
        run.answer(failed, true, 3),
        Answered::Applied { errored: true, .. }
    ));
    assert_eq!(run.pump(3), vec![], "web-2 still runs: no result yet");
    assert!(!run.finished());

    run.answer(done(&inst[1], json!({})), false, 4);
    let out = run.pump(4);
    assert_eq!(subjects(&out), ["build.create.error"]);
    let result = payload(&out[0]);
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("instance::web-1 (quota exceeded)"),
        "{error}"
    );
    assert!(error.contains("1 not started"), "{error}");
    let lb = &run.build.changes[4];
    assert_eq!(lb["_state"], "waiting", "the balancer never started");
    assert_eq!(run.build.changes[3]["_state"], "completed");
    // A late answer changes nothing and publishes nothing.
    assert_eq!(
        run.answer(done(&inst[1], json!({})), false, 5),
        Answered::Duplicate
    );
    assert_eq!(run.pump(5), vec![]);
}

#[test]
fn block_dependents_lets_independent_work_finish() {
    let mut build = service();
    build
        .changes
        .push(change("dns::extra", "create").as_object().unwrap().clone());
    let mut run = BuildRun::new(
        "build.create",
        build,
        settings(ErrorPolicy::BlockDependents),
        0,
    );
    let out = run.pump(0);
    assert_eq!(subjects(&out), ["network.create.fake", "dns.create.fake"]);
    run.answer(done(&out[0], json!({})), true, 1);
    assert_eq!(run.pump(1), vec![], "dns still runs");
    run.answer(done(&out[1], json!({})), false, 2);
    let end = run.pump(2);
    assert_eq!(subjects(&end), ["build.create.error"]);
    assert_eq!(run.build.components.len(), 1, "dns was created");
}

#[test]
fn a_lost_answer_times_out_into_one_error() {
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    assert_eq!(run.next_deadline(), Some(60_000));
    assert_eq!(run.expire(59_999), Vec::<String>::new());
    assert_eq!(run.expire(60_000), ["network::web"]);
    let end = run.pump(60_000);
    assert_eq!(subjects(&end), ["build.create.error"]);
    let change = &run.build.changes[0];
    assert_eq!(change["_state"], "errored");
    assert_eq!(change["error_code"], "timeout");
    assert!(
        change["error_message"]
            .as_str()
            .unwrap()
            .contains("timed out")
    );
    assert!(
        payload(&end[0])["error"]
            .as_str()
            .unwrap()
            .contains("timed out")
    );
    assert_eq!(run.next_deadline(), None);
    // The answer that comes after all is a late one.
    assert_eq!(
        run.answer(done(&out[0], json!({})), false, 70_000),
        Answered::Duplicate
    );
}

#[test]
fn a_cycle_fails_the_build_at_once_naming_it() {
    let mut build = service();
    build.edges.push(Edge {
        source: "elb::web".into(),
        destination: "firewall::web".into(),
        length: None,
        extra: Default::default(),
    });
    let mut run = BuildRun::new("build.create", build, settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    assert_eq!(subjects(&out), ["build.create.error"]);
    let error = payload(&out[0])["error"].as_str().unwrap().to_string();
    assert!(error.contains("cycle"), "{error}");
    for name in ["firewall::web", "instance::web-1", "elb::web"] {
        assert!(error.contains(name), "{error}");
    }
    assert_eq!(run.pump(1), vec![]);
}

#[test]
fn an_edge_to_a_missing_component_fails_the_build() {
    let mut build = service();
    build.edges.push(Edge {
        source: "vpc::gone".into(),
        destination: "network::web".into(),
        length: None,
        extra: Default::default(),
    });
    let mut run = BuildRun::new("build.delete", build, settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    assert_eq!(subjects(&out), ["build.delete.error"]);
    let error = payload(&out[0])["error"].as_str().unwrap().to_string();
    assert!(error.contains("vpc::gone"), "{error}");
}

#[test]
fn an_edge_to_a_component_that_does_not_change_does_not_wait() {
    let mut build = service();
    build
        .components
        .push(change("vpc::main", "none").as_object().unwrap().clone());
    build.edges.push(Edge {
        source: "vpc::main".into(),
        destination: "network::web".into(),
        length: None,
        extra: Default::default(),
    });
    let mut run = BuildRun::new("build.create", build, settings(ErrorPolicy::Halt), 0);
    assert_eq!(subjects(&run.pump(0)), ["network.create.fake"]);
}

#[test]
fn a_change_without_edges_starts_at_once_and_start_end_are_not_dispatched() {
    let build: Build = serde_json::from_value(json!({
        "id": "b", "changes": [change("a::x", "create")]
    }))
    .unwrap();
    let mut run = BuildRun::new("build.import", build, settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    assert_eq!(subjects(&out), ["a.create.fake"]);
    run.answer(done(&out[0], json!({})), false, 1);
    assert_eq!(subjects(&run.pump(1)), ["build.import.done"]);
}

#[test]
fn an_empty_build_is_done_at_once() {
    let build: Build = serde_json::from_value(json!({"id": "empty"})).unwrap();
    let mut run = BuildRun::new("build.sync", build, settings(ErrorPolicy::Halt), 0);
    assert_eq!(subjects(&run.pump(0)), ["build.sync.done"]);
}

#[test]
fn an_unresolvable_reference_errors_the_component() {
    let mut build = service();
    build.changes[0].insert(
        "bad".into(),
        json!("$(components.#[_component_id=\"nope\"].x)"),
    );
    let mut run = BuildRun::new("build.create", build, settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    assert_eq!(
        subjects(&out),
        ["build.create.error"],
        "{:?}",
        run.build.changes[0]
    );
    assert_eq!(run.build.changes[0]["error_code"], "reference");
}

#[test]
fn a_change_without_a_provider_fails_the_build_at_once_naming_it() {
    let mut build = service();
    build.changes[0].remove("_provider");
    build.changes[2].insert("_provider".into(), json!(""));
    let mut run = BuildRun::new("build.create", build, settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    // Nothing goes out on `network.create.` (which no worker answers): one error, at once.
    assert_eq!(subjects(&out), ["build.create.error"]);
    assert_eq!(
        payload(&out[0])["error"],
        "no _provider (missing, empty or not text) in network::web, instance::web-1: a change \
         is dispatched on <_component>.<_action>.<_provider>"
    );
    assert_eq!(run.pump(1), vec![]);
    assert_eq!(run.in_flight(), 0);

    // Each field of the subject, each named once.
    let mut build = service();
    build.changes[3].insert("_provider".into(), Value::Null);
    build.changes[4].remove("_action");
    let mut run = BuildRun::new("build.create", build, settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    assert_eq!(subjects(&out), ["build.create.error"]);
    let error = payload(&out[0])["error"].as_str().unwrap().to_string();
    assert!(
        error.starts_with(
            "no _action (missing, empty or not text) in elb::web; \
             no _provider (missing, empty or not text) in instance::web-2:"
        ),
        "{error}"
    );
}

#[test]
fn a_build_with_many_changes_without_a_provider_names_the_first_ten() {
    let changes: Vec<Value> = (0..25)
        .map(|i| {
            let mut c = change(&format!("c::{i:02}"), "create");
            c.as_object_mut().unwrap().remove("_provider");
            c
        })
        .collect();
    let build: Build = serde_json::from_value(json!({"id": "b", "changes": changes})).unwrap();
    let mut run = BuildRun::new("build.create", build, settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    let error = payload(&out[0])["error"].as_str().unwrap().to_string();
    assert!(
        error.contains(
            "c::00, c::01, c::02, c::03, c::04, c::05, c::06, c::07, c::08, c::09 \
                        and 15 more:"
        ),
        "{error}"
    );
}

/// `_provider` of the network as given, and of the credentials it names.
fn provider_run(network: Value, credentials: Value, settings: RunSettings) -> BuildRun {
    let mut build = provider_build();
    build.changes[0].insert("_provider".into(), network);
    build.components[0].insert("_provider".into(), credentials);
    BuildRun::new("build.create", build, settings, 0)
}

#[test]
fn a_provider_that_cannot_be_a_subject_token_errors_the_component_at_dispatch() {
    let reference = json!("$(components.#[_component_id=\"credentials::aws\"]._provider)");
    let cases = [
        // (the network's _provider, the credentials', templating, why)
        (
            json!("us east"),
            json!("aws"),
            ernest_settings(),
            "contains whitespace",
        ),
        (
            reference.clone(),
            json!("aws\teast"),
            ernest_settings(),
            "contains whitespace",
        ),
        (
            json!("*"),
            json!("aws"),
            ernest_settings(),
            "contains a NATS wildcard (* or >)",
        ),
        (
            reference.clone(),
            json!("a>"),
            ernest_settings(),
            "contains a NATS wildcard (* or >)",
        ),
        (
            reference.clone(),
            json!(""),
            settings(ErrorPolicy::Halt),
            "is empty",
        ),
        (
            reference.clone(),
            json!(5),
            settings(ErrorPolicy::Halt),
            "is missing or not text",
        ),
    ];
    for (network, credentials, settings, why) in cases {
        let case = format!("{network} / {credentials} / {:?}", settings.templating);
        let mut run = provider_run(network, credentials.clone(), settings);
        let out = run.pump(0);
        // Not sent and left to time out: errored now, and the build ends.
        assert_eq!(subjects(&out), ["build.create.error"], "{case}");
        let net = &run.build.changes[0];
        assert_eq!(net["_state"], "errored", "{case}");
        assert_eq!(net["error_code"], "subject", "{case}");
        let message = net["error_message"].as_str().unwrap();
        assert!(message.starts_with("_provider "), "{case}: {message}");
        assert!(
            message.ends_with(&format!(
                "cannot be a token of the dispatch subject: it {why}"
            )),
            "{case}: {message}"
        );
        let error = payload(&out[0])["error"].as_str().unwrap().to_string();
        assert!(
            error.starts_with("failed: network::web (_provider "),
            "{case}: {error}"
        );
        assert_eq!(run.in_flight(), 0, "{case}");
    }
    // What is text and has none of those is sent: a number as ernest's text, a dot as ernest
    // sends it (the subject then has more tokens).
    for (credentials, subject) in [
        (json!(5), "network.create.5"),
        (json!("a.b"), "network.create.a.b"),
    ] {
        let mut run = provider_run(reference.clone(), credentials, ernest_settings());
        assert_eq!(subjects(&run.pump(0)), [subject]);
    }
}

#[test]
fn completion_rules_follow_ernest() {
    let mut components: Vec<Component> = vec![
        json!({"_component_id": "a::1", "v": 1})
            .as_object()
            .unwrap()
            .clone(),
        json!({"_component_id": "b::1", "v": 1})
            .as_object()
            .unwrap()
            .clone(),
    ];
    let c = |v: Value| v.as_object().unwrap().clone();
    apply_completion(
        &mut components,
        "create",
        &c(json!({"_component_id": "c::1"})),
    );
    apply_completion(
        &mut components,
        "update",
        &c(json!({"_component_id": "a::1", "v": 2})),
    );
    apply_completion(
        &mut components,
        "get",
        &c(json!({"_component_id": "b::1", "v": 3})),
    );
    apply_completion(
        &mut components,
        "delete",
        &c(json!({"_component_id": "c::1"})),
    );
    apply_completion(
        &mut components,
        "find",
        &c(json!({"_component_id": "q::1", "components": [
            {"_component_id": "f::1"}, {"_component_id": "f::2"}]})),
    );
    apply_completion(
        &mut components,
        "none",
        &c(json!({"_component_id": "z::1"})),
    );
    // As in ernest: a find that found nothing (no `components` list) and an update or get of
    // a component that does not exist change nothing.
    for action in ["find", "update", "get"] {
        let ops = apply_completion(
            &mut components,
            action,
            &c(json!({"_component_id": "y::1"})),
        );
        assert_eq!(ops, vec![], "{action}");
    }
    let view: Vec<(String, Value)> = components
        .iter()
        .map(|c| {
            let v = c.get("v").cloned().unwrap_or(Value::Null);
            (component_id(c).unwrap().to_string(), v)
        })
        .collect();
    assert_eq!(
        view,
        [
            ("a::1".to_string(), json!(2)),
            ("b::1".to_string(), json!(3)),
            ("f::1".to_string(), Value::Null),
            ("f::2".to_string(), Value::Null),
        ]
    );
}

#[test]
fn a_delete_follows_the_reversed_edges_of_ernests_mapping() {
    // ernest's builder reverses the edges of deletes: instances go before their network.
    let build: Build = serde_json::from_value(json!({
        "id": "svc-1",
        "components": [
            {"_component_id": "network::web", "_component": "network"},
            {"_component_id": "instance::web-1", "_component": "instance"}
        ],
        "changes": [change("network::web", "delete"), change("instance::web-1", "delete")],
        "edges": [
            {"source": "start", "destination": "instance::web-1"},
            {"source": "instance::web-1", "destination": "network::web"},
            {"source": "network::web", "destination": "end"}
        ]
    }))
    .unwrap();
    let mut run = BuildRun::new("build.delete", build, settings(ErrorPolicy::Halt), 0);
    let out = run.pump(0);
    assert_eq!(subjects(&out), ["instance.delete.fake"]);
    run.answer(done(&out[0], json!({})), false, 1);
    let out = run.pump(1);
    assert_eq!(subjects(&out), ["network.delete.fake"]);
    run.answer(done(&out[0], json!({})), false, 2);
    assert_eq!(subjects(&run.pump(2)), ["build.delete.done"]);
    assert!(run.build.components.is_empty(), "both deleted");
}

#[test]
fn a_restored_run_goes_on_without_dispatching_completed_components() {
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    let net = run.pump(0);
    run.answer(done(&net[0], json!({"network_aws_id": "n1"})), false, 10);
    let fw = run.pump(10);
    run.answer(done(&fw[0], json!({})), false, 20);
    let inst = run.pump(20);
    run.answer(done(&inst[0], json!({"ip": "10.0.0.1"})), false, 30);
    assert_eq!(run.pump(30), vec![]);
    let stored = serde_json::to_vec(&run).unwrap();

    let mut back = BuildRun::restore(&stored).unwrap();
    assert_eq!(back.pump(40), vec![], "nothing is dispatched again");
    assert_eq!(back.running.len(), 1);
    assert_eq!(
        back.next_deadline(),
        Some(20 + 60_000),
        "web-2 keeps its deadline"
    );
    // web-2's answer, sent before the stop, is taken.
    back.answer(done(&inst[1], json!({"ip": "10.0.0.2"})), false, 50);
    let out = back.pump(50);
    assert_eq!(subjects(&out), ["elb.create.fake"]);
    assert_eq!(
        payload(&out[0])["instance_ips"],
        json!(["10.0.0.1", "10.0.0.2"])
    );
}

#[test]
fn a_restored_failed_run_under_halt_still_waits_for_its_running_component() {
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    let net = run.pump(0);
    run.answer(done(&net[0], json!({"network_aws_id": "n1"})), false, 1);
    let fw = run.pump(1);
    run.answer(done(&fw[0], json!({})), false, 2);
    let inst = run.pump(2);
    run.answer(done(&inst[0], json!({})), true, 3);
    assert_eq!(run.pump(3), vec![]);
    let mut back = BuildRun::restore(&serde_json::to_vec(&run).unwrap()).unwrap();
    assert_eq!(back.pump(4), vec![], "web-2 still runs");
    back.answer(done(&inst[1], json!({})), false, 5);
    assert_eq!(subjects(&back.pump(5)), ["build.create.error"]);
}

fn executor() -> Executor {
    Executor::new(settings(ErrorPolicy::Halt))
}

fn bytes(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

#[test]
fn the_executor_routes_answers_by_service_and_ignores_strangers() {
    let mut ex = executor();
    let step = ex.message("build.create", &bytes(&service()), 0);
    assert_eq!(step.save, ["svc-1"]);
    assert_eq!(step.publish.len(), 1);
    let (_, net) = &step.publish[0];
    assert_eq!(ex.in_flight(), 1);

    // An answer for another build, one for no component, and one not on an answer subject.
    let mut other = payload(net);
    other.insert("service".into(), json!("svc-2"));
    assert!(
        ex.message("network.create.fake.done", &bytes(&other), 1)
            .save
            .is_empty()
    );
    let mut stranger = payload(net);
    stranger.insert("_component_id".into(), json!("network::other"));
    assert!(
        ex.message("network.create.fake.done", &bytes(&stranger), 1)
            .save
            .is_empty()
    );
    assert!(
        ex.message("network.create.fake", &net.payload, 1)
            .save
            .is_empty()
    );
    // The same build again while it runs is ignored.
    assert!(
        ex.message("build.create", &bytes(&service()), 1)
            .save
            .is_empty()
    );

    let mut answer = payload(net);
    answer.insert("network_aws_id".into(), json!("n1"));
    let step = ex.message("network.create.fake.done", &bytes(&answer), 5);
    assert_eq!(step.answered, [(false, 5)]);
    assert_eq!(step.publish[0].1.subject, "firewall.create.fake");
    // The duplicate of that answer does nothing.
    let dup = ex.message("network.create.fake.done", &bytes(&answer), 6);
    assert!(dup.save.is_empty() && dup.publish.is_empty());
}

#[test]
fn the_executor_times_out_and_reports_one_result() {
    let mut ex = executor();
    ex.message("build.create", &bytes(&service()), 0);
    assert_eq!(ex.next_deadline(), Some(60_000));
    assert!(ex.tick(59_000).publish.is_empty());
    let step = ex.tick(60_000);
    assert_eq!(step.finished, [("svc-1".to_string(), ResultKind::Error)]);
    let terminals: Vec<_> = step.publish.iter().filter(|(_, o)| o.terminal).collect();
    assert_eq!(terminals.len(), 1);
    assert_eq!(terminals[0].1.subject, "build.create.error");
    assert_eq!(ex.in_flight(), 0);
    assert!(ex.tick(120_000).publish.is_empty());
    ex.mark_sent("svc-1");
    assert_eq!(
        ex.run("svc-1").unwrap().result.as_ref().unwrap().sent,
        Sent::Sent
    );
}

#[test]
fn a_result_stored_as_sending_is_published_again_and_a_sent_one_is_not() {
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    run.pump(0);
    run.expire(60_000);
    let out = run.pump(60_000);
    assert_eq!(out.len(), 1);
    // Killed after the result was stored as `sending`: it may not have reached the server.
    let sending = bytes(&run);
    let mut ex = executor();
    let step = ex.resume(BuildRun::restore(&sending).unwrap(), 70_000);
    assert_eq!(step.publish.len(), 1, "{:?}", step.publish);
    let (id, again) = &step.publish[0];
    assert_eq!(id, "svc-1");
    assert_eq!(again, &out[0], "the same result, whole");
    assert!(step.save.is_empty() && step.finished.is_empty());
    assert_eq!(ex.sending(), ["svc-1"]);
    assert_eq!(ex.unfinished(), 0);
    // Once flushed it is `sent`, and the run is forgotten.
    ex.mark_sent("svc-1");
    ex.forget_finished();
    assert!(ex.run("svc-1").is_none());
    // A result stored as `sent` reached the server: a restart publishes nothing.
    run.mark_sent();
    let sent = bytes(&run);
    let mut ex = executor();
    let step = ex.resume(BuildRun::restore(&sent).unwrap(), 70_000);
    assert!(step.publish.is_empty() && step.save.is_empty());
    assert!(ex.run("svc-1").is_none());
}

#[test]
fn a_resumed_run_dispatches_what_became_ready_before_the_stop() {
    // Stopped after an answer was applied and stored, before the next dispatch went out.
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    let net = run.pump(0);
    run.answer(done(&net[0], json!({"network_aws_id": "n1"})), false, 1);
    let stored = bytes(&run);
    let mut ex = executor();
    let step = ex.resume(BuildRun::restore(&stored).unwrap(), 2);
    let subjects: Vec<&str> = step
        .publish
        .iter()
        .map(|(_, o)| o.subject.as_str())
        .collect();
    assert_eq!(subjects, ["firewall.create.fake"]);
    assert_eq!(step.save, ["svc-1"]);
}

/// A run's snapshot and journal as the executor's loop writes them.
#[derive(Default)]
struct Disk {
    snapshot: Vec<u8>,
    journal: Vec<u8>,
}

impl Disk {
    fn snapshot(&mut self, run: &mut BuildRun) {
        run.clear_delta();
        self.snapshot = bytes(run);
        self.journal.clear();
    }

    /// Appends what changed; `false` when nothing did.
    fn append(&mut self, run: &mut BuildRun) -> bool {
        let Some(delta) = run.take_delta() else {
            return false;
        };
        self.journal.extend(bytes(&delta));
        self.journal.push(b'\n');
        true
    }

    fn restore(&self) -> BuildRun {
        BuildRun::restore_with(&self.snapshot, BuildRun::journal_records(&self.journal)).unwrap()
    }
}

fn json_of(run: &BuildRun) -> Value {
    serde_json::to_value(run).unwrap()
}

/// A random build: `n` changes on a random DAG (edges from earlier to later changes), each a
/// create, update, get, find or delete, some referring to an earlier change's output; the
/// components updated or deleted exist already.
fn random_build(rng: &mut SmallRng) -> Build {
    let n = rng.random_range(1..12);
    let actions = ["create", "update", "get", "find", "delete"];
    let mut changes = Vec::new();
    let mut components = Vec::new();
    let mut edges = Vec::new();
    for i in 0..n {
        let id = format!("c::{i}");
        let action = actions[rng.random_range(0..actions.len())];
        let mut c = change(&id, action);
        if i > 0 && rng.random_bool(0.2) {
            let j = rng.random_range(0..i);
            c["input"] = json!(format!("$(components.#[_component_id=\"c::{j}\"].out)"));
        }
        if matches!(action, "update" | "delete") || rng.random_bool(0.2) {
            components.push(json!({"_component_id": id, "out": "old"}));
        }
        changes.push(c);
        for j in 0..i {
            if rng.random_bool(0.3) {
                edges.push(json!({"source": format!("c::{j}"), "destination": id}));
            }
        }
    }
    serde_json::from_value(json!({
        "id": "b", "changes": changes, "components": components, "edges": edges
    }))
    .unwrap()
}

/// Runs random builds with answers in a random order, errors, timeouts, snapshots at random
/// (some leaving stale records behind, as a stop between the snapshot and emptying the
/// journal does) and restarts from the files: after every write, the snapshot with the
/// journal replayed is exactly the live run.
#[test]
fn a_snapshot_with_its_journal_replayed_is_the_live_run() {
    for seed in 0..300 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let policy = if rng.random_bool(0.5) {
            ErrorPolicy::Halt
        } else {
            ErrorPolicy::BlockDependents
        };
        let mut now = 0;
        let mut run = BuildRun::new(
            "build.create",
            random_build(&mut rng),
            settings(policy),
            now,
        );
        run.pump(now);
        let mut disk = Disk::default();
        disk.snapshot(&mut run);
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 200, "seed {seed}: the build does not end");
            if run.finished() {
                run.mark_sent();
            } else if !run.running.is_empty() && rng.random_bool(0.95) {
                let ids: Vec<String> = run.running.keys().cloned().collect();
                let id = &ids[rng.random_range(0..ids.len())];
                let mut answer = run
                    .build
                    .changes
                    .iter()
                    .find(|c| component_id(c) == Some(id))
                    .unwrap()
                    .clone();
                answer.insert("out".into(), json!(format!("{id} at {now}")));
                if field(&answer, "_action") == "find" {
                    let found: Vec<Value> = (0..rng.random_range(0..3))
                        .map(|k| json!({"_component_id": format!("f::{k}"), "out": now}))
                        .collect();
                    answer.insert("components".into(), json!(found));
                }
                now += rng.random_range(1..100);
                let errored = rng.random_bool(0.1);
                assert!(matches!(
                    run.answer(answer, errored, now),
                    Answered::Applied { .. }
                ));
                run.pump(now);
            } else {
                now += TIMEOUT.as_millis() as u64;
                run.expire(now);
                run.pump(now);
            }
            // Some steps are not written on their own: their changes go with the next write.
            if !run.finished() && rng.random_bool(0.2) {
                continue;
            }
            if rng.random_bool(0.2) {
                let stale = std::mem::take(&mut disk.journal);
                disk.snapshot(&mut run);
                if rng.random_bool(0.5) {
                    disk.journal = stale;
                }
            } else {
                disk.append(&mut run);
            }
            let back = disk.restore();
            assert_eq!(json_of(&back), json_of(&run), "seed {seed}, step {steps}");
            if rng.random_bool(0.1) {
                // A restart: the restored run goes on, and dispatches nothing again.
                run = back;
                assert_eq!(run.pump(now), vec![], "seed {seed}, step {steps}");
            }
            if run.result.as_ref().is_some_and(|r| r.sent == Sent::Sent) {
                break;
            }
        }
    }
}

#[test]
fn journal_records_not_newer_than_the_snapshot_are_skipped() {
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    let net = run.pump(0);
    let mut disk = Disk::default();
    disk.snapshot(&mut run);
    run.answer(done(&net[0], json!({"network_aws_id": "n1"})), false, 10);
    let fw = run.pump(10);
    assert!(disk.append(&mut run));
    run.answer(done(&fw[0], json!({})), false, 20);
    run.pump(20);
    assert!(disk.append(&mut run));
    assert!(!disk.append(&mut run), "nothing changed since");
    // A snapshot whose journal was not emptied (a stop in between): the old records are
    // older than the snapshot and change nothing.
    let old = disk.journal.clone();
    disk.snapshot(&mut run);
    disk.journal = old;
    let back = disk.restore();
    assert_eq!(json_of(&back), json_of(&run));
    assert_eq!(back.running.len(), 2, "both instances run");
    // Records written after the snapshot follow the stale ones and are applied.
    let inst: Vec<String> = back.running.keys().cloned().collect();
    let answer = run
        .build
        .changes
        .iter()
        .find(|c| component_id(c) == Some(&inst[0]))
        .unwrap()
        .clone();
    run.answer(answer, false, 30);
    run.pump(30);
    assert!(disk.append(&mut run));
    let back = disk.restore();
    assert_eq!(json_of(&back), json_of(&run));
    assert_eq!(back.running.len(), 1);
}

#[test]
fn replay_stops_at_a_torn_record_or_a_missing_one() {
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    let net = run.pump(0);
    let mut disk = Disk::default();
    disk.snapshot(&mut run);
    run.answer(done(&net[0], json!({"network_aws_id": "n1"})), false, 10);
    let fw = run.pump(10);
    disk.append(&mut run);
    let before = json_of(&run);
    let whole = disk.journal.len();
    run.answer(done(&fw[0], json!({})), false, 20);
    run.pump(20);
    disk.append(&mut run);
    // A kill in the middle of the second append.
    let cut = whole + (disk.journal.len() - whole) / 2;
    let torn = Disk {
        snapshot: disk.snapshot.clone(),
        journal: disk.journal[..cut].to_vec(),
    };
    let mut back = torn.restore();
    assert_eq!(
        json_of(&back),
        before,
        "the first record applies, the torn one not"
    );
    assert_eq!(
        subjects(&back.pump(30)),
        Vec::<&str>::new(),
        "the firewall still runs and is not dispatched again"
    );
    // The first record lost: the second does not follow the snapshot and is not applied.
    let gap = Disk {
        snapshot: disk.snapshot.clone(),
        journal: disk.journal[whole..].to_vec(),
    };
    let back = gap.restore();
    assert_eq!(back.seq, run.seq - 2);
    assert_eq!(back.build.changes[0]["_state"], "running");
}

#[test]
fn records_of_an_earlier_build_with_the_same_id_are_skipped() {
    // The first build finished; a stop came after its last snapshot's rename, before the
    // journal was emptied. The same id is then built again.
    let mut old = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 0);
    let net = old.pump(0);
    let mut disk = Disk::default();
    disk.snapshot(&mut old);
    old.answer(done(&net[0], json!({"network_aws_id": "n1"})), false, 10);
    old.pump(10);
    assert!(disk.append(&mut old));
    let stale = disk.journal.clone();
    let mut run = BuildRun::new("build.create", service(), settings(ErrorPolicy::Halt), 500);
    run.pump(500);
    disk.snapshot(&mut run);
    disk.journal = stale;
    assert_eq!(
        run.seq,
        old.seq - 1,
        "the old record would follow the new snapshot"
    );
    let back = disk.restore();
    assert_eq!(json_of(&back), json_of(&run));
    assert_eq!(back.build.changes[0]["_state"], "running");
}

#[test]
fn a_result_that_fits_is_sent_whole_and_one_that_does_not_is_summarised() {
    let whole = serde_json::to_vec(&json!({"id": "b", "changes": [], "components": []})).unwrap();
    assert_eq!(fit_result(whole.clone(), 1 << 20, None), whole);

    // A done build of 2,000 components: about 190 KB.
    let components: Vec<Value> = (0..2000)
        .map(|i| json!({"_component_id": format!("c::{i}"), "_state": "completed", "ip": "10.0.0.1"}))
        .collect();
    let build = json!({"id": "big", "name": "shop", "datacenters": {"items": ["x".repeat(5000)]},
        "components": components, "changes": components, "edges": []});
    let bytes = serde_json::to_vec(&build).unwrap();
    let max = 4096;
    let fitted = fit_result(bytes.clone(), max, Some("/var/lib/graph/b-big.json"));
    assert!(fitted.len() <= max, "{}", fitted.len());
    let summary: Value = serde_json::from_slice(&fitted).unwrap();
    assert_eq!(summary["id"], "big");
    assert_eq!(summary["name"], "shop", "small fields are kept");
    assert!(summary.get("datacenters").is_none(), "the largest go first");
    let note = &summary[SUMMARY_KEY];
    assert_eq!(note["bytes"], bytes.len());
    assert_eq!(note["max_payload"], max);
    assert_eq!(note["components"], 2000);
    assert_eq!(note["changes"], 2000);
    assert_eq!(note["stored_at"], "/var/lib/graph/b-big.json");
    assert!(
        note["reason"]
            .as_str()
            .unwrap()
            .contains("over the 4096 bytes"),
        "{note}"
    );

    // An error naming a long cycle is shortened to fit, and says how much was cut.
    let cycle: Vec<String> = (0..20_000).map(|i| format!("c::{i}")).collect();
    let error = format!("dependency cycle: {}", cycle.join(" -> "));
    let build = json!({"id": "loop", "changes": [], "error": error});
    let fitted = fit_result(serde_json::to_vec(&build).unwrap(), max, None);
    assert!(fitted.len() <= max, "{}", fitted.len());
    let summary: Value = serde_json::from_slice(&fitted).unwrap();
    let said = summary["error"].as_str().unwrap();
    assert!(
        said.starts_with("dependency cycle: c::0 -> c::1 -> "),
        "{said}"
    );
    assert!(said.ends_with("bytes cut)"), "{said}");

    // Whatever the payload and however small the limit (escapes, multi-byte text, a huge id),
    // the summary is JSON within it.
    let mut rng = SmallRng::seed_from_u64(28);
    for _ in 0..200 {
        let max = rng.random_range(512..6000);
        let len = rng.random_range(0..20_000);
        let text: String = (0..len)
            .map(|_| ['a', '"', '\\', 'é', '\n', '\u{1F600}'][rng.random_range(0..6)])
            .collect();
        let build = json!({"id": text.clone(), "error": text.clone(), "other": text,
            "changes": [{"x": 1}]});
        let fitted = fit_result(serde_json::to_vec(&build).unwrap(), max, Some("/p"));
        assert!(fitted.len() <= max, "{} > {max}", fitted.len());
        let _: Value = serde_json::from_slice(&fitted).unwrap();
    }
}

fn ernest_settings() -> RunSettings {
    RunSettings {
        templating: Templating::Ernest,
        ..settings(ErrorPolicy::Halt)
    }
}

/// A build whose network's `_provider` names the credentials' provider, as ernest's builder
/// writes it.
fn provider_build() -> Build {
    let mut net = change("network::web", "create");
    net["_provider"] = json!("$(components.#[_component_id=\"credentials::aws\"]._provider)");
    serde_json::from_value(json!({
        "id": "p-1", "action": "create",
        "components": [{"_component_id": "credentials::aws", "_component": "credentials",
                        "_provider": "aws", "aws_access_key_id": "k"}],
        "changes": [net],
        "edges": [{"source": "start", "destination": "network::web"}]
    }))
    .unwrap()
}

#[test]
fn the_dispatch_subject_is_built_from_the_templated_change() {
    for settings in [ernest_settings(), settings(ErrorPolicy::Halt)] {
        let mut run = BuildRun::new("build.create", provider_build(), settings, 0);
        let out = run.pump(0);
        assert_eq!(subjects(&out), ["network.create.aws"], "{settings:?}");
        assert_eq!(payload(&out[0])["_provider"], "aws");
        // The stored change keeps the reference.
        assert!(field(&run.build.changes[0], "_provider").starts_with("$("));
    }
}

#[test]
fn the_result_has_the_builds_subject_as_action_and_ernests_fields() {
    let mut run = BuildRun::new("build.create", provider_build(), ernest_settings(), 0);
    let out = run.pump(0);
    run.answer(done(&out[0], json!({})), false, 1);
    let out = run.pump(1);
    assert_eq!(subjects(&out), ["build.create.done"]);
    let result: Value = serde_json::from_slice(&out[0].payload).unwrap();
    assert_eq!(
        result["action"], "build.create",
        "the client's `create` is replaced"
    );
    assert_eq!(result["name"], "");
    assert_eq!(result["username"], "");
    assert_eq!(result["options"], Value::Null);
    assert!(result.as_object().unwrap().contains_key("options"));

    // Given values are kept.
    let mut build = provider_build();
    build.name = Some(json!("shop"));
    build.username = Some(json!("ann"));
    build.options = Some(json!({"dry": true}));
    let mut run = BuildRun::new("build.delete", build, ernest_settings(), 0);
    let out = run.pump(0);
    run.answer(done(&out[0], json!({})), true, 1);
    let out = run.pump(1);
    let result: Value = serde_json::from_slice(&out[0].payload).unwrap();
    assert_eq!(out[0].subject, "build.delete.error");
    assert_eq!(result["action"], "build.delete");
    assert_eq!(
        (&result["name"], &result["username"], &result["options"]),
        (&json!("shop"), &json!("ann"), &json!({"dry": true}))
    );
}

const IMPORT_GRAPH: &str = include_str!("../../../tests/data/ernest/fixtures/import-graph.json");

#[test]
fn ernests_import_fixture_dispatches_its_finds_with_references_left_as_text() {
    let build: Build = serde_json::from_str(IMPORT_GRAPH).unwrap();
    let mut run = BuildRun::new("build.import", build.clone(), ernest_settings(), 0);
    let out = run.pump(0);
    assert_eq!(out.len(), 11, "{:?}", subjects(&out));
    assert!(out.iter().all(|o| !o.terminal));
    let vpc = out
        .iter()
        .map(payload)
        .find(|p| component_id(p) == Some("vpc::query"))
        .unwrap();
    assert_eq!(vpc["aws_access_key_id"], "test");
    assert_eq!(
        vpc["datacenter_region"],
        "$(components.#[_component_id=\"credentials::aws\"].region)"
    );
    assert!(subjects(&out).contains(&"vpc.find.$(datacenters.items.0.type)"));

    // Extended templating refuses the reference that finds nothing: the build errors.
    let mut run = BuildRun::new("build.import", build, settings(ErrorPolicy::Halt), 0);
    assert_eq!(subjects(&run.pump(0)), ["build.import.error"]);
}

#[test]
fn under_ernests_templating_a_value_is_text_and_an_embedded_reference_stays() {
    let mut run = BuildRun::new("build.create", service(), ernest_settings(), 0);
    let net = run.pump(0);
    run.answer(done(&net[0], json!({"network_aws_id": 42})), false, 1);
    let fw = run.pump(1);
    assert_eq!(payload(&fw[0])["network_id"], "42");
    run.answer(done(&fw[0], json!({})), false, 2);
    let inst = run.pump(2);
    run.answer(done(&inst[0], json!({"ip": "10.0.0.1"})), false, 3);
    run.answer(done(&inst[1], json!({})), false, 3);
    let lb = payload(&run.pump(3)[0]);
    // web-2 has no ip: its reference stays; the one in a longer string is text.
    assert_eq!(
        lb["instance_ips"],
        json!([
            "10.0.0.1",
            "$(components.#[_component_id=\"instance::web-2\"].ip)"
        ])
    );
    assert_eq!(lb["name_tag"], "lb for $(name)");
}

/// ernest's scheduler (scheduler.go and subscriber.go of ernestio/scheduler v3.16.0) as a
/// model: states in `changes`, readiness by scanning the edges, halting on any errored
/// change, and its two ways to publish `.error`.
struct ErnestModel {
    changes: Vec<Component>,
    components: Vec<Component>,
    edges: Vec<(String, String)>,
    done_sent: usize,
    errors_sent: usize,
}

impl ErnestModel {
    fn new(build: &Build) -> ErnestModel {
        ErnestModel {
            changes: build.changes.clone(),
            components: build.components.clone(),
            edges: build
                .edges
                .iter()
                .map(|e| (e.source.clone(), e.destination.clone()))
                .collect(),
            done_sent: 0,
            errors_sent: 0,
        }
    }

    fn state(&self, id: &str) -> &str {
        self.changes
            .iter()
            .find(|c| component_id(c) == Some(id))
            .map_or("", |c| field(c, "_state"))
    }

    fn any(&self, state: &str) -> bool {
        self.changes.iter().any(|c| field(c, "_state") == state)
    }

    /// `Receive` and what the subscriber does after it; returns the ids dispatched.
    fn receive(&mut self, c: Option<Component>) -> Vec<String> {
        let id = c
            .as_ref()
            .map_or(START.to_string(), |c| component_id(c).unwrap().to_string());
        if let Some(c) = &c {
            let state = field(c, "_state").to_string();
            if state == COMPLETED {
                let action = self.state_action(&id);
                let exists = |cs: &Vec<Component>, id: Option<&str>| {
                    cs.iter().any(|x| component_id(x) == id)
                };
                match action.as_str() {
                    "create" => {
                        assert!(
                            !exists(&self.components, Some(&id)),
                            "kept out of the model"
                        );
                        self.components.push(c.clone());
                    }
                    "update" | "get" => {
                        if let Some(slot) = self
                            .components
                            .iter_mut()
                            .find(|x| component_id(x) == Some(&id))
                        {
                            *slot = c.clone();
                        }
                    }
                    "delete" => self.components.retain(|x| component_id(x) != Some(&id)),
                    "find" => {
                        for f in c["components"].as_array().into_iter().flatten() {
                            let f = f.as_object().unwrap().clone();
                            assert!(!exists(&self.components, component_id(&f)));
                            self.components.push(f);
                        }
                    }
                    _ => {}
                }
            }
            let slot = self
                .changes
                .iter_mut()
                .find(|x| component_id(x) == Some(&id))
                .unwrap();
            *slot = c.clone();
            if state == ERRORED && !self.any(RUNNING) {
                self.errors_sent += 1;
            }
        }
        let mut next = Vec::new();
        if !self.any(ERRORED) {
            for (s, d) in self.edges.clone() {
                if s != id || next.contains(&d) || !self.changes_has(&d) {
                    continue;
                }
                let ready = self
                    .edges
                    .iter()
                    .filter(|(_, dd)| *dd == d)
                    .filter(|(o, _)| self.changes_has(o))
                    .all(|(o, _)| self.state(o) == COMPLETED);
                if ready {
                    next.push(d);
                }
            }
        }
        for n in &next {
            let slot = self
                .changes
                .iter_mut()
                .find(|x| component_id(x) == Some(n))
                .unwrap();
            slot.insert("_state".into(), Value::from(RUNNING));
        }
        if self.changes.iter().all(|c| field(c, "_state") == COMPLETED) {
            self.done_sent += 1;
        }
        if self.any(ERRORED) && !self.any(RUNNING) {
            self.errors_sent += 1;
        }
        next
    }

    fn changes_has(&self, id: &str) -> bool {
        self.changes.iter().any(|c| component_id(c) == Some(id))
    }

    fn state_action(&self, id: &str) -> String {
        self.changes
            .iter()
            .find(|c| component_id(c) == Some(id))
            .map_or(String::new(), |c| field(c, "_action").to_string())
    }
}

/// A random DAG inside ernest's rules: every change has an edge into it (from `start` when
/// none from another change), creates and finds add what does not exist yet, updates, gets
/// and deletes touch what exists.
fn random_ernest_build(rng: &mut SmallRng) -> Build {
    let n = rng.random_range(1..14);
    let actions = ["create", "update", "get", "find", "delete"];
    let mut changes = Vec::new();
    let mut components = Vec::new();
    let mut edges = Vec::new();
    for i in 0..n {
        let id = format!("c::{i}");
        let action = actions[rng.random_range(0..actions.len())];
        changes.push(change(&id, action));
        if matches!(action, "update" | "get" | "delete") {
            components.push(json!({"_component_id": id, "out": "old"}));
        }
        let mut incoming = false;
        for j in 0..i {
            if rng.random_bool(0.3) {
                edges.push(json!({"source": format!("c::{j}"), "destination": id}));
                incoming = true;
            }
        }
        if !incoming || rng.random_bool(0.1) {
            edges.push(json!({"source": "start", "destination": id}));
        }
        if rng.random_bool(0.3) {
            edges.push(json!({"source": id, "destination": "end"}));
        }
    }
    serde_json::from_value(json!({
        "id": "b", "changes": changes, "components": components, "edges": edges
    }))
    .unwrap()
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

/// 300 seeded random DAGs with injected errors, answered in a random order: each step
/// dispatches what ernest's scheduler dispatches, the build ends when ernest's ends and as
/// ernest's ends (`.done` or `.error`; ernest may send `.error` twice, this executor once), with
/// the same `components` and change states.
#[test]
fn random_builds_with_errors_run_as_ernests_scheduler_runs_them() {
    let mut errored_builds = 0;
    for seed in 0..300 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let build = random_ernest_build(&mut rng);
        let mut model = ErnestModel::new(&build);
        let mut run = BuildRun::new("build.create", build, ernest_settings(), 0);
        let out = run.pump(0);
        let mut sent: HashMap<String, Component> = HashMap::new();
        let ids = |out: &[Outgoing], sent: &mut HashMap<String, Component>| {
            let mut ids = Vec::new();
            for o in out.iter().filter(|o| !o.terminal) {
                let p = payload(o);
                let id = component_id(&p).unwrap().to_string();
                sent.insert(id.clone(), p);
                ids.push(id);
            }
            sorted(ids)
        };
        assert_eq!(
            ids(&out, &mut sent),
            sorted(model.receive(None)),
            "seed {seed}: the first wave"
        );
        let mut terminals: Vec<Outgoing> = out.into_iter().filter(|o| o.terminal).collect();
        let mut now = 0;
        while terminals.is_empty() {
            let running: Vec<String> = run.running.keys().cloned().collect();
            assert!(!running.is_empty(), "seed {seed}: stuck");
            let id = running[rng.random_range(0..running.len())].clone();
            let errored = rng.random_bool(0.08);
            let mut answer = sent[&id].clone();
            answer.insert("out".into(), json!(format!("{id} at {now}")));
            answer.insert(
                "_state".into(),
                json!(if errored { ERRORED } else { COMPLETED }),
            );
            if field(&answer, "_action") == "find" {
                let found: Vec<Value> = (0..rng.random_range(0..3))
                    .map(|k| json!({"_component_id": format!("f::{id}::{k}")}))
                    .collect();
                answer.insert("components".into(), json!(found));
            }
            now += 1;
            run.answer(answer.clone(), errored, now);
            let out = run.pump(now);
            assert_eq!(
                ids(&out, &mut sent),
                sorted(model.receive(Some(answer))),
                "seed {seed}: after {id} (errored: {errored})"
            );
            terminals.extend(out.into_iter().filter(|o| o.terminal));
        }
        assert_eq!(terminals.len(), 1, "seed {seed}: one result");
        let ernest = match (model.done_sent, model.errors_sent) {
            (1, 0) => "build.create.done",
            (0, 1 | 2) => "build.create.error",
            other => panic!("seed {seed}: ernest sent (done, error) = {other:?}"),
        };
        assert_eq!(terminals[0].subject, ernest, "seed {seed}");
        if ernest.ends_with("error") {
            errored_builds += 1;
        }
        assert_eq!(
            serde_json::to_value(&run.build.components).unwrap(),
            serde_json::to_value(&model.components).unwrap(),
            "seed {seed}: components"
        );
        let states = |cs: &[Component]| -> Vec<(String, String)> {
            cs.iter()
                .map(|c| (component_id(c).unwrap().into(), field(c, "_state").into()))
                .collect()
        };
        assert_eq!(
            states(&run.build.changes),
            states(&model.changes),
            "seed {seed}"
        );
    }
    assert!(
        (60..240).contains(&errored_builds),
        "{errored_builds} of 300 errored"
    );
}

#[test]
fn a_run_stored_before_the_templating_setting_goes_on_with_what_it_started_with() {
    let run = BuildRun::new("build.create", service(), ernest_settings(), 0);
    let mut stored = json_of(&run);
    assert_eq!(stored["templating"], "ernest");
    let back = BuildRun::restore(&bytes(&stored)).unwrap();
    assert_eq!(back.templating, Templating::Ernest);
    stored.as_object_mut().unwrap().remove("templating");
    let back = BuildRun::restore(&bytes(&stored)).unwrap();
    assert_eq!(back.templating, Templating::Extended);
}
