//! `/v1/graphql` and `/v1/graphiql`: queries through the router, subscriptions over a real
//! socket (the server of `serve.rs`, so its upgrade path is the one the daemon runs).

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use verwalter_controllers::machinery::ports::DeploymentLog;
use verwalter_controllers::node::StoreWriter;
use verwalter_controllers::state::{
    BlockedState, Deployment, Peer, Peers, Report, RoleBlocked, RoleFailure, RolesStatus, Schedule,
    ScheduleData, ScheduleStamp,
};

use super::graphql::*;
use super::tests::{app_state, body_text, get, get_json, leading, post_json};
use super::*;

const BETA: &str = "77985419c732412ea38b94db00000002";
const GAMMA: &str = "77985419c732412ea38b94db00000003";

/// Every field of the schema (`docs/http-api.md` lists the same).
const ALL_FIELDS: &str = r#"{
  status {
    version id name hostname defaultFrontend
    roles {
      number failed
      list { name state lastError attempts since blockedOn blockedRootCause blockedReason deploymentId }
    }
    peers {
      number timestamp
      errorneous { id name hostname errors }
      list { id name hostname addr knownSince lastReportDirect errors schedule isLeader }
    }
    election {
      isLeader isStable promoting numVotesForMe neededVotes epoch deadline
      lastStableTimestamp leader backend etcd
    }
    schedule { timestamp hash data origin }
    fetch { state leader schedule }
    numErrors errors
    leader { id name hostname addr schedule debugForced }
    selfReport threadsReport scheduleStatus metrics
    lastDeployment { id schedule started finished roles failed blocked }
    deployments(last: 5) { time deploymentId marker action role }
  }
  shadows {
    name configured busyWith
    latest { run time inputHash realHash result pathsDiffering error durationMs memoryBytes realError codeVersion log diff output }
    history { run result }
  }
  datacenters {
    name exchange leading leader addr
    dcs {
      name addresses leader link rttMs contactAgeMs summary summaryAgeMs summaryBehind
      summaryDeferred bytesSent bytesReceived
      requests { id data expiresInMs }
      answers { request data expiresInMs }
      lent { request outstandingMs }
      lastError lastErrorAgeMs
    }
  }
}"#;

fn app_with(writer: &StoreWriter) -> (AppState, Router) {
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let state = app_state(writer, no_frontends, "common");
    (state.clone(), router(state))
}

fn peer(id: &str, name: &str, errors: u64) -> Peer {
    Peer {
        id: id.into(),
        addr: Some("127.0.0.2:8379".into()),
        name: format!("{name}.example.com"),
        hostname: name.into(),
        schedule: None,
        known_since: 1_533_912_700_000,
        last_report_direct: Some(1_533_912_710_000),
        errors,
    }
}

/// A leader with a schedule, two peers (one reporting errors), a failing and a blocked role, a
/// render pass and a deployment log.
fn busy_node() -> (StoreWriter, tempfile::TempDir, Schedule) {
    let writer = leading(3);
    writer.election.update(|e| {
        e.deadline = 1_533_912_712_500;
        e.last_stable_timestamp = Some(1_533_912_709_990);
        e.num_votes_for_me = Some(2);
        e.needed_votes = Some(2);
    });
    let schedule = Schedule::test()
        .with_role("web", "v2")
        .with_node_role("alpha", "web", json!({"port": 80}))
        .with_node_role("alpha", "db", json!({"x": 1}))
        .build();
    writer.schedule.set(Some(schedule.clone()));
    writer.peers.set(Peers {
        peers: [
            (BETA.to_string(), peer(BETA, "beta", 0)),
            (GAMMA.to_string(), peer(GAMMA, "gamma", 0)),
        ]
        .into(),
        timestamp: Some(1_533_912_710_001),
    });
    writer.reports.set(
        [(
            GAMMA.to_string(),
            Report {
                schedule: Some(ScheduleStamp {
                    timestamp: schedule.timestamp,
                    hash: schedule.hash.clone(),
                    origin: schedule.origin.clone(),
                }),
                errors: 2,
                epoch: 3,
            },
        )]
        .into(),
    );
    writer
        .prefetched
        .set(verwalter_controllers::state::Prefetched {
            epoch: 3,
            schedules: Vec::new(),
            awaiting: None,
        });
    writer.roles.set(RolesStatus {
        failed: [(
            "db".to_string(),
            RoleFailure {
                message: "db.render.yaml: command exited with 1".into(),
                since: 1_533_912_711_000,
                attempts: 3,
                deployment_id: Some("dep-2".into()),
            },
        )]
        .into(),
        blocked: [(
            "web".to_string(),
            RoleBlocked {
                state: BlockedState::Blocked,
                on: vec!["db".into()],
                root_cause: vec!["db".into()],
                reason: "db failed".into(),
                since: 1_533_912_711_500,
                deployment_id: Some("dep-2".into()),
            },
        )]
        .into(),
        last_deployment: Some(Deployment {
            id: "dep-2".into(),
            schedule: schedule.hash.clone(),
            started: 1_533_912_711_000,
            finished: Some(1_533_912_711_600),
            roles: vec!["db".into(), "web".into()],
            failed: vec!["db".into()],
            blocked: vec!["web".into()],
        }),
        deployment_log: None,
    });
    let logs = tempfile::tempdir().unwrap();
    (writer, logs, schedule)
}

async fn query(app: &Router, query: &str) -> (StatusCode, Value) {
    let body = json!({ "query": query }).to_string();
    let response = post_json(app, "/v1/graphql", &body, &[]).await;
    let status = response.status();
    (
        status,
        serde_json::from_str(&body_text(response).await).unwrap(),
    )
}

#[tokio::test]
async fn every_documented_field_resolves_and_agrees_with_v1_status() {
    let (writer, logs_dir, schedule) = busy_node();
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    let logs = crate::storage::logs::LogDir::open(logs_dir.path(), Default::default());
    logs.deployment_start("dep-2", &schedule.hash, &["db".into()], &[]);
    let mut role = logs.role("db", "dep-2");
    role.action_start("db.render.yaml");
    state.logs = Some(logs);
    let app = router(state);

    let (code, answer) = query(&app, ALL_FIELDS).await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    assert_eq!(answer.get("errors"), None, "{answer}");
    let gql = &answer["data"]["status"];
    let rest = get_json(&app, "/v1/status").await;

    for (field, key) in [
        ("version", "version"),
        ("id", "id"),
        ("name", "name"),
        ("hostname", "hostname"),
        ("defaultFrontend", "default_frontend"),
        ("numErrors", "num_errors"),
        ("errors", "errors"),
        ("scheduleStatus", "schedule_status"),
        ("metrics", "metrics"),
    ] {
        assert_eq!(gql[field], rest[key], "{field}");
    }
    assert_eq!(gql["roles"]["number"], rest["roles"]);
    assert_eq!(gql["roles"]["failed"], rest["failed_roles"]);
    assert_eq!(gql["roles"]["failed"], json!(["db"]));
    assert_eq!(
        gql["roles"]["list"],
        json!([
            {"name": "db", "state": "FAILED", "lastError": "db.render.yaml: command exited with 1",
             "attempts": 3, "since": 1_533_912_711_000.0, "blockedOn": [],
             "blockedRootCause": [], "blockedReason": null, "deploymentId": "dep-2"},
            {"name": "web", "state": "BLOCKED", "lastError": null, "attempts": 0,
             "since": 1_533_912_711_500.0, "blockedOn": ["db"], "blockedRootCause": ["db"],
             "blockedReason": "db failed", "deploymentId": "dep-2"},
        ])
    );

    let peers = &gql["peers"];
    assert_eq!(peers["number"], rest["peers"]);
    assert_eq!(peers["timestamp"], json!(1_533_912_710_001.0));
    assert_eq!(
        peers["errorneous"],
        json!([{"id": GAMMA, "name": "gamma.example.com", "hostname": "gamma", "errors": 2}])
    );
    assert_eq!(rest["failing_nodes"][0]["id"], json!(GAMMA));
    assert_eq!(peers["list"].as_array().unwrap().len(), 2);
    assert_eq!(
        peers["list"][1],
        json!({"id": GAMMA, "name": "gamma.example.com", "hostname": "gamma",
               "addr": "127.0.0.2:8379", "knownSince": 1_533_912_700_000.0,
               "lastReportDirect": 1_533_912_710_000.0, "errors": 2,
               "schedule": schedule.hash, "isLeader": false})
    );
    assert_eq!(peers["list"][0]["schedule"], Value::Null);

    let election = &gql["election"];
    let rest_election = &rest["election_state"];
    assert_eq!(election["isLeader"], rest_election["is_leader"]);
    assert_eq!(election["isStable"], rest_election["is_stable"]);
    assert_eq!(election["promoting"], rest_election["promoting"]);
    assert_eq!(election["numVotesForMe"], json!(2));
    assert_eq!(election["neededVotes"], json!(2));
    // Timestamps and the epoch are floats, as 0.13's.
    assert_eq!(election["epoch"], json!(3.0));
    assert_eq!(election["deadline"], json!(1_533_912_712_500.0));
    assert_eq!(election["lastStableTimestamp"], json!(1_533_912_709_990.0));
    assert_eq!(election["leader"], rest_election["leader"]);
    // The built-in election; with etcd the same view as `/v1/status` `etcd` (tests/etcd.rs).
    assert_eq!(election["backend"], rest["election_backend"]);
    assert_eq!(election["backend"], json!("builtin"));
    assert_eq!(election["etcd"], Value::Null);

    assert_eq!(gql["schedule"]["hash"], rest["schedule_id"]);
    assert_eq!(gql["schedule"]["data"], **schedule.data.tree());
    assert_eq!(gql["schedule"]["origin"], json!(schedule.origin));
    assert_eq!(
        gql["schedule"]["timestamp"],
        json!(schedule.timestamp as f64)
    );
    assert_eq!(gql["fetch"]["state"], json!("STABLE_LEADER"));
    assert_eq!(rest["fetch_state"]["state"], json!("StableLeader"));
    assert_eq!(
        gql["leader"],
        json!({"id": rest["leader"]["id"], "name": "alpha.example.com", "hostname": "alpha",
               "addr": "127.0.0.1:8379", "schedule": schedule.hash, "debugForced": false})
    );
    assert_eq!(gql["selfReport"], Value::Null);
    assert_eq!(gql["threadsReport"], Value::Null);
    assert_eq!(
        gql["lastDeployment"],
        json!({"id": "dep-2", "schedule": schedule.hash, "started": 1_533_912_711_000.0,
               "finished": 1_533_912_711_600.0, "roles": ["db", "web"], "failed": ["db"],
               "blocked": ["web"]})
    );
    let deployments = gql["deployments"].as_array().unwrap();
    assert_eq!(deployments[0]["marker"], json!("ActionStart"));
    assert_eq!(deployments[0]["action"], json!("db.render.yaml"));
    assert_eq!(deployments[0]["role"], json!("db"));
    assert_eq!(
        deployments.last().unwrap()["marker"],
        json!("DeploymentStart")
    );
    assert!(
        deployments
            .iter()
            .all(|d| d["deploymentId"] == "dep-2" && d["time"].as_str().unwrap().ends_with('Z'))
    );

    // A follower that has no stable leader: the other fetch states and empty fields.
    let writer = StoreWriter::new(None);
    let (_, app) = app_with(&writer);
    let (_, answer) = query(
        &app,
        "{ status { fetch { state } leader { id } schedule { hash } deployments { time } } }",
    )
    .await;
    assert_eq!(
        answer,
        json!({"data": {"status": {"fetch": {"state": "UNSTABLE"}, "leader": null,
                                   "schedule": null, "deployments": []}}})
    );
}

#[tokio::test]
async fn the_mutation_is_noop_and_variables_and_operation_names_work() {
    let writer = leading(1);
    let (_, app) = app_with(&writer);
    let (code, answer) = query(&app, "mutation { noop { ok } }").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(answer, json!({"data": {"noop": {"ok": true}}}));

    let body = json!({
        "query": "query A { status { id } } query B($n: Int!) { status { deployments(last: $n) { time } } }",
        "operationName": "B",
        "variables": {"n": 1000},
    });
    let response = post_json(&app, "/v1/graphql", &body.to_string(), &[]).await;
    let answer: Value = serde_json::from_str(&body_text(response).await).unwrap();
    assert_eq!(
        answer["errors"][0]["message"],
        json!("last must be 0 to 200"),
        "{answer}"
    );
}

#[tokio::test]
async fn bad_requests_are_refused_with_a_clear_error() {
    let writer = leading(1);
    let (_, app) = app_with(&writer);

    // A parse error has no data: 400, as in 0.13.
    let (code, answer) = query(&app, "{ status { id ").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(answer["data"], Value::Null, "{answer}");
    assert!(answer["errors"][0]["message"].is_string(), "{answer}");
    // So does a field that does not exist.
    let (code, answer) = query(&app, "{ status { nope } }").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(
        answer["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nope"),
        "{answer}"
    );

    // Too deep: only introspection nests this far.
    let mut deep = String::from("name");
    for _ in 0..20 {
        deep = format!("ofType {{ {deep} }}");
    }
    let (code, answer) = query(
        &app,
        &format!("{{ __type(name: \"Status\") {{ {deep} }} }}"),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(
        answer["errors"][0]["message"],
        json!("Query is nested too deep."),
        "{answer}"
    );
    // Too costly: many fields, however they are spread over aliases.
    let aliases: String = (0..300)
        .map(|i| format!("s{i}: status {{ id }} "))
        .collect();
    let (code, answer) = query(&app, &format!("{{ {aliases} }}")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(
        answer["errors"][0]["message"],
        json!("Query is too complex."),
        "{answer}"
    );
    // The schedule is copied into an answer at most twice, however aliases repeat it.
    writer
        .schedule
        .set(Some(Schedule::test().with_role("web", "v2").build()));
    let two = "{ a: status { schedule { data } } b: status { schedule { data } } }";
    let (code, answer) = query(&app, two).await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["data"]["b"]["schedule"]["data"]["roles"]["web"]["version"],
        "v2"
    );
    let aliases: String = (0..3)
        .map(|i| format!("s{i}: status {{ schedule {{ data }} }} "))
        .collect();
    let (code, answer) = query(&app, &format!("{{ {aliases} }}")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(
        answer["errors"][0]["message"],
        json!("schedule.data and deployments may be selected 2 times in all per result"),
        "{answer}"
    );
    // The standard introspection query fits the limits (tools use it).
    let introspection = "query { __schema { types { name fields { name type { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } } } } } } }";
    let (code, answer) = query(&app, introspection).await;
    assert_eq!(code, StatusCode::OK, "{answer}");

    // Not JSON, not a GraphQL request, not JSON's type, too big.
    for body in ["{", r#"{"nope": 1}"#] {
        let response = post_json(&app, "/v1/graphql", body, &[]).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
    }
    let response = super::tests::send_body(&app, "/v1/graphql", "application/graphql", "{}").await;
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let big = json!({"query": format!("{{ status {{ id }} }} #{}", "x".repeat(70_000))});
    let response = post_json(&app, "/v1/graphql", &big.to_string(), &[]).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // A GET that is no WebSocket is told what the route is.
    let (code, _, body) = get(&app, "/v1/graphql").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(body.contains("WebSocket"), "{body}");
}

#[tokio::test]
async fn the_query_page_is_the_built_in_frontends_page_under_its_policy() {
    let writer = StoreWriter::new(None);
    let (_, app) = app_with(&writer);
    let response = super::tests::send_get(&app, "/v1/graphiql").await;
    assert_eq!(response.status(), StatusCode::OK);
    let policy = response.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(policy, super::PAGE_POLICY);
    let page = body_text(response).await;
    // The frontend's page: its header, its module (which draws the GraphQL page, in
    // frontend/js/pages/graphql.js), nothing from another host.
    assert!(page.contains("<header id=\"bar\">"), "{page}");
    assert!(page.contains("src=\"/common/app.js\""), "{page}");
    for external in ["http://", "https://", "//cdn", "<script>"] {
        assert!(!page.contains(external), "the page has {external:?}");
    }
}

/// The daemon's server on a free port with `state`'s app, until the returned token is cancelled.
async fn serving(state: AppState) -> (std::net::SocketAddr, tokio_util::sync::CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let settings = state.http.settings.clone();
    let metrics = state.metrics.clone();
    let stop = shutdown.clone();
    let app = router(state);
    tokio::spawn(async move { serve(listener, app, &settings, metrics, stop).await });
    (addr, shutdown)
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn open_socket(
    addr: std::net::SocketAddr,
    protocol: &str,
    origin: Option<&str>,
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    let origin: Vec<(&'static str, &str)> = origin.map(|o| ("origin", o)).into_iter().collect();
    open_socket_with(addr, protocol, &origin).await
}

/// [`open_socket`] with any extra request headers.
async fn open_socket_with(
    addr: std::net::SocketAddr,
    protocol: &str,
    headers: &[(&'static str, &str)],
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    let mut request = format!("ws://{addr}/v1/graphql")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol.parse().unwrap());
    for (name, value) in headers {
        request.headers_mut().insert(*name, value.parse().unwrap());
    }
    let (socket, response) = tokio_tungstenite::connect_async(request).await?;
    assert_eq!(response.headers()["sec-websocket-protocol"], protocol);
    Ok(socket)
}

async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::Text(message.to_string().into()))
        .await
        .unwrap();
}

/// The next text message, as JSON (10 s at most).
async fn receive(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a message within 10 s")
            .expect("the socket is open")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

#[tokio::test]
async fn a_subscription_gets_the_status_then_each_change_in_both_protocols() {
    let writer = leading(1);
    let (state, _) = app_with(&writer);
    let (addr, shutdown) = serving(state).await;
    let query = "subscription { status { election { epoch } numErrors } }";

    // 0.13's clients: subscriptions-transport-ws.
    let mut socket = open_socket(addr, "graphql-ws", None).await.unwrap();
    send(
        &mut socket,
        json!({"type": "connection_init", "payload": {}}),
    )
    .await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"type": "connection_ack"})
    );
    send(
        &mut socket,
        json!({"type": "start", "id": "1", "payload": {"query": query}}),
    )
    .await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"type": "data", "id": "1",
               "payload": {"data": {"status": {"election": {"epoch": 1.0}, "numErrors": 0}}}})
    );
    writer.election.update(|e| e.epoch = 2);
    let update = receive(&mut socket).await;
    assert_eq!(
        update["payload"]["data"]["status"]["election"]["epoch"],
        json!(2.0),
        "{update}"
    );
    // A change the selection does not show sends nothing; the next one that does is next.
    writer.peers.update(|p| p.timestamp = Some(5));
    writer.election.update(|e| e.epoch = 3);
    let update = receive(&mut socket).await;
    assert_eq!(
        update["payload"]["data"]["status"]["election"]["epoch"],
        json!(3.0),
        "{update}"
    );
    send(&mut socket, json!({"type": "stop", "id": "1"})).await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"type": "complete", "id": "1"})
    );

    // The graphql-ws library's protocol.
    let mut socket = open_socket(addr, "graphql-transport-ws", None)
        .await
        .unwrap();
    send(&mut socket, json!({"type": "connection_init"})).await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"type": "connection_ack"})
    );
    send(
        &mut socket,
        json!({"type": "subscribe", "id": "a", "payload": {"query": query}}),
    )
    .await;
    let first = receive(&mut socket).await;
    assert_eq!(first["type"], json!("next"));
    assert_eq!(
        first["payload"]["data"]["status"]["election"]["epoch"],
        json!(3.0)
    );
    writer.roles.update(|r| {
        r.failed.insert(
            "web".into(),
            RoleFailure {
                message: "boom".into(),
                since: 1,
                attempts: 1,
                deployment_id: None,
            },
        );
    });
    let update = receive(&mut socket).await;
    assert_eq!(
        update,
        json!({"type": "next", "id": "a",
               "payload": {"data": {"status": {"election": {"epoch": 3.0}, "numErrors": 1}}}})
    );
    send(&mut socket, json!({"type": "ping"})).await;
    assert_eq!(receive(&mut socket).await, json!({"type": "pong"}));

    // Past the cap of subscriptions per socket, a subscription gets an error.
    for id in 0..MAX_SUBSCRIPTIONS {
        send(
            &mut socket,
            json!({"type": "subscribe", "id": format!("s{id}"), "payload": {"query": query}}),
        )
        .await;
    }
    let refused = loop {
        let message = receive(&mut socket).await;
        if message["payload"]["errors"].is_array() {
            break message;
        }
    };
    assert_eq!(
        refused["payload"]["errors"][0]["message"],
        json!(format!(
            "at most {MAX_SUBSCRIPTIONS} subscriptions per WebSocket"
        )),
        "{refused}"
    );
    shutdown.cancel();
}

#[tokio::test]
async fn sockets_share_the_event_stream_cap_and_refuse_other_sites() {
    let writer = leading(1);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.http = Arc::new(HttpState::new(HttpSettings {
        max_event_streams: 1,
        ..HttpSettings::default()
    }));
    let (addr, shutdown) = serving(state).await;

    let refused = open_socket(addr, "graphql-ws", Some("http://evil.example.net"))
        .await
        .unwrap_err();
    match refused {
        tokio_tungstenite::tungstenite::Error::Http(response) => {
            assert_eq!(response.status(), StatusCode::FORBIDDEN);
        }
        other => panic!("{other}"),
    }
    let origin = format!("http://{addr}");
    let mut socket = open_socket(addr, "graphql-transport-ws", Some(&origin))
        .await
        .unwrap();
    send(&mut socket, json!({"type": "connection_init"})).await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"type": "connection_ack"})
    );
    // The one slot is taken.
    match open_socket(addr, "graphql-ws", None).await.unwrap_err() {
        tokio_tungstenite::tungstenite::Error::Http(response) => {
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        other => panic!("{other}"),
    }
    // It comes back when the socket closes.
    socket.close(None).await.unwrap();
    drop(socket);
    let reopened = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(socket) = open_socket(addr, "graphql-ws", None).await {
                return socket;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(reopened.is_ok(), "the slot is given back");
    shutdown.cancel();
}

#[test]
fn an_unchanged_result_is_not_sent_again_in_either_protocol() {
    let mut last = verwalter_controllers::http::subscriptions::LastSent::default();
    let data = |id: &str, epoch: u64| {
        json!({"type": "data", "id": id, "payload": {"data": {"epoch": epoch}}}).to_string()
    };
    assert!(fresh(&mut last, &data("1", 1)));
    assert!(!fresh(&mut last, &data("1", 1)), "the same result again");
    assert!(fresh(&mut last, &data("2", 1)), "another subscription");
    assert!(fresh(&mut last, &data("1", 2)), "a new result");
    assert!(fresh(&mut last, r#"{"type":"connection_ack"}"#));
    // `next` (graphql-transport-ws) likewise; a completed id starts over.
    let next = json!({"type": "next", "id": "1", "payload": {"data": {"epoch": 2}}}).to_string();
    assert!(!fresh(&mut last, &next));
    assert!(fresh(&mut last, r#"{"type":"complete","id":"1"}"#));
    assert!(fresh(&mut last, &next));
    assert_eq!(last.len(), 2);
}

/// docs/http-api.md shows the schema the daemon serves (after "```graphql" in the GraphQL
/// section). On a difference the served one is written to target/graphql-schema.graphql.
#[test]
fn the_schema_in_the_docs_is_the_served_one() {
    let writer = StoreWriter::new(None);
    let (state, _) = app_with(&writer);
    let served = super::graphql::sdl(&state);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/http-api.md")).unwrap();
    let documented = doc
        .split_once("```graphql\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .unwrap_or("");
    if documented.trim() != served.trim() {
        std::fs::write(root.join("target/graphql-schema.graphql"), &served).unwrap();
        panic!(
            "docs/http-api.md's schema differs; the served one is in target/graphql-schema.graphql"
        );
    }
}

#[tokio::test]
async fn a_socket_that_stops_reading_is_closed_after_the_stall_timeout() {
    let writer = leading(1);
    // A result far larger than the socket buffers hold: it cannot be written while the client
    // does not read. (No hash check on this path: the envelope is made by hand.)
    let blob = "x".repeat(16 << 20);
    writer.schedule.set(Some(Schedule {
        timestamp: 1,
        hash: "big".into(),
        data: ScheduleData::from_value(json!({ "blob": blob })),
        origin: "77985419c732412ea38b94db00000001".into(),
    }));
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.http = Arc::new(HttpState::new(HttpSettings {
        max_event_streams: 1,
        stream_stall_timeout: Duration::from_millis(300),
        ..HttpSettings::default()
    }));
    let (addr, shutdown) = serving(state).await;
    let mut stalled = open_socket(addr, "graphql-ws", None).await.unwrap();
    send(&mut stalled, json!({"type": "connection_init"})).await;
    assert_eq!(
        receive(&mut stalled).await,
        json!({"type": "connection_ack"})
    );
    send(
        &mut stalled,
        json!({"type": "start", "id": "1",
               "payload": {"query": "subscription { status { schedule { data } } }"}}),
    )
    .await;
    // `stalled` is never read again (nor dropped until the end). Its slot, the only one, comes
    // back once the server has given up on it.
    let reopened = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(socket) = open_socket(addr, "graphql-ws", None).await {
                return socket;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(reopened.is_ok(), "the stalled socket was closed");
    drop(stalled);
    shutdown.cancel();
}

#[tokio::test]
async fn a_result_larger_than_the_write_buffer_reaches_a_client_that_reads() {
    // A result is written whole: one over the write buffer's size closed the socket at once.
    let writer = leading(1);
    let blob = "x".repeat(1 << 20);
    writer.schedule.set(Some(Schedule {
        timestamp: 1,
        hash: "big".into(),
        data: ScheduleData::from_value(json!({ "blob": blob })),
        origin: "77985419c732412ea38b94db00000001".into(),
    }));
    let (state, _) = app_with(&writer);
    let (addr, shutdown) = serving(state).await;
    let mut socket = open_socket(addr, "graphql-transport-ws", None)
        .await
        .unwrap();
    send(&mut socket, json!({"type": "connection_init"})).await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"type": "connection_ack"})
    );
    send(
        &mut socket,
        json!({"type": "subscribe", "id": "1", "payload": {"query":
            "subscription { status { a: schedule { data } b: schedule { data } } }"}}),
    )
    .await;
    let result = receive(&mut socket).await;
    let status = &result["payload"]["data"]["status"];
    for alias in ["a", "b"] {
        assert_eq!(
            status[alias]["data"]["blob"].as_str().map(str::len),
            Some(1 << 20),
            "{alias}"
        );
    }
    shutdown.cancel();
}

const TOKEN: &str = "op3rator-t0ken-for-tests";

/// A leading node that asks for [`TOKEN`], on reads too with `reads`, served on a free port.
async fn serving_with_token(
    reads: bool,
) -> (
    StoreWriter,
    std::net::SocketAddr,
    tokio_util::sync::CancellationToken,
) {
    let writer = leading(1);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.http = Arc::new(HttpState::new(HttpSettings {
        token: Some(
            verwalter_controllers::http::access::Token::from_file_bytes(TOKEN.as_bytes()).unwrap(),
        ),
        token_for_reads: reads,
        ..HttpSettings::default()
    }));
    let (addr, shutdown) = serving(state).await;
    (writer, addr, shutdown)
}

/// What the server says until it closes the socket: its text messages and the close frame's
/// code and reason (`None` when it closed without one).
async fn until_closed(socket: &mut Socket) -> (Vec<Value>, Option<(u16, String)>) {
    let mut texts = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("closed within 10 s");
        match message {
            Some(Ok(Message::Text(text))) => texts.push(serde_json::from_str(&text).unwrap()),
            Some(Ok(Message::Close(frame))) => {
                return (
                    texts,
                    frame.map(|f| (u16::from(f.code), f.reason.to_string())),
                );
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return (texts, None),
        }
    }
}

#[tokio::test]
async fn under_token_for_reads_a_socket_gives_the_token_in_connection_init() {
    let (_writer, addr, shutdown) = serving_with_token(true).await;
    let query = "subscription { status { election { epoch } } }";
    let bearer = format!("Bearer {TOKEN}");

    // The upgrade goes through without the header; the token comes in connection_init, in
    // any of the forms clients send it.
    for (protocol, payload, start) in [
        (
            "graphql-transport-ws",
            json!({"Authorization": bearer}),
            "subscribe",
        ),
        ("graphql-ws", json!({"authorization": bearer}), "start"),
        ("graphql-ws", json!({"token": TOKEN}), "start"),
    ] {
        let mut socket = open_socket(addr, protocol, None).await.unwrap();
        send(
            &mut socket,
            json!({"type": "connection_init", "payload": payload}),
        )
        .await;
        assert_eq!(
            receive(&mut socket).await,
            json!({"type": "connection_ack"}),
            "{protocol}"
        );
        send(
            &mut socket,
            json!({"type": start, "id": "1", "payload": {"query": query}}),
        )
        .await;
        let result = receive(&mut socket).await;
        assert_eq!(
            result["payload"]["data"]["status"]["election"]["epoch"],
            json!(1.0),
            "{protocol}: {result}"
        );
    }

    // graphql-transport-ws: no token or another one closes with 4403; a subscription sent
    // along runs not.
    for payload in [
        json!({}),
        json!({"Authorization": "Bearer wrong-t0ken-for-tests"}),
    ] {
        let mut socket = open_socket(addr, "graphql-transport-ws", None)
            .await
            .unwrap();
        send(
            &mut socket,
            json!({"type": "connection_init", "payload": payload}),
        )
        .await;
        send(
            &mut socket,
            json!({"type": "subscribe", "id": "1", "payload": {"query": query}}),
        )
        .await;
        let (texts, close) = until_closed(&mut socket).await;
        assert_eq!(texts, Vec::<Value>::new(), "{payload}");
        assert_eq!(close, Some((4403, "Forbidden".into())), "{payload}");
    }
    // A subscription before any connection_init runs not either.
    let mut socket = open_socket(addr, "graphql-transport-ws", None)
        .await
        .unwrap();
    send(
        &mut socket,
        json!({"type": "subscribe", "id": "1", "payload": {"query": query}}),
    )
    .await;
    let (texts, close) = until_closed(&mut socket).await;
    assert_eq!(texts, Vec::<Value>::new());
    assert!(close.is_some());

    // graphql-ws: a connection_error saying what is missing, then the socket closes.
    for (payload, says) in [
        (json!(null), "\"Authorization\": \"Bearer <token>\""),
        (json!({"token": "wrong-t0ken-for-tests"}), "not this node's"),
    ] {
        let mut socket = open_socket(addr, "graphql-ws", None).await.unwrap();
        send(
            &mut socket,
            json!({"type": "connection_init", "payload": payload}),
        )
        .await;
        send(
            &mut socket,
            json!({"type": "start", "id": "1", "payload": {"query": query}}),
        )
        .await;
        let (texts, _) = until_closed(&mut socket).await;
        assert_eq!(texts.len(), 1, "{texts:?}");
        assert_eq!(texts[0]["type"], "connection_error", "{texts:?}");
        let message = texts[0]["payload"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }

    // With the header on the upgrade, as before: connection_init needs nothing.
    let mut socket = open_socket_with(addr, "graphql-ws", &[("authorization", &bearer)])
        .await
        .unwrap();
    send(&mut socket, json!({"type": "connection_init"})).await;
    assert_eq!(
        receive(&mut socket).await,
        json!({"type": "connection_ack"})
    );
    // A wrong header is refused at the upgrade; so is a page of another site, token or not;
    // and a plain GET without the header.
    let refused = |error| match error {
        tokio_tungstenite::tungstenite::Error::Http(response) => response.status(),
        other => panic!("{other}"),
    };
    let wrong = open_socket_with(
        addr,
        "graphql-ws",
        &[("authorization", "Bearer wrong-t0ken-for-tests")],
    )
    .await
    .unwrap_err();
    assert_eq!(refused(wrong), StatusCode::UNAUTHORIZED);
    let cross_site = open_socket(addr, "graphql-ws", Some("http://evil.example.net"))
        .await
        .unwrap_err();
    assert_eq!(refused(cross_site), StatusCode::FORBIDDEN);
    let plain = plain_get(addr, "/v1/graphql").await;
    assert_eq!(plain, 401);
    shutdown.cancel();
}

#[tokio::test]
async fn without_token_for_reads_connection_init_needs_no_token() {
    let (_writer, addr, shutdown) = serving_with_token(false).await;
    for protocol in ["graphql-ws", "graphql-transport-ws"] {
        let mut socket = open_socket(addr, protocol, None).await.unwrap();
        send(&mut socket, json!({"type": "connection_init"})).await;
        assert_eq!(
            receive(&mut socket).await,
            json!({"type": "connection_ack"}),
            "{protocol}"
        );
    }
    shutdown.cancel();
}

/// The status code of a plain `GET` of `path` (no upgrade, no token).
async fn plain_get(addr: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: verwalter\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

/// [`open_socket`], tried again while the server answers 503 (all `http.max-event-streams`
/// slots taken) until one that was let go of is given back as its socket's task ends.
async fn open_when_free(addr: std::net::SocketAddr, protocol: &str) -> Socket {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match open_socket(addr, protocol, None).await {
            Ok(socket) => return socket,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("503"), "{e}");
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("the slot was not given back: {e}"),
        }
    }
}

/// A socket that sends no `connection_init` within `http.idle-timeout-ms` is closed with 4408
/// and gives its `http.max-event-streams` slot back; one that sent it stays open past that.
#[tokio::test]
async fn a_socket_without_connection_init_is_closed_after_the_idle_timeout() {
    let writer = leading(1);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.http = Arc::new(HttpState::new(HttpSettings {
        idle_timeout: Duration::from_millis(300),
        max_event_streams: 2,
        ..HttpSettings::default()
    }));
    let (addr, shutdown) = serving(state).await;
    let query = "subscription { status { election { epoch } } }";

    let mut talking = open_socket(addr, "graphql-transport-ws", None)
        .await
        .unwrap();
    send(&mut talking, json!({"type": "connection_init"})).await;
    assert_eq!(
        receive(&mut talking).await,
        json!({"type": "connection_ack"})
    );

    // Opened later, so its deadline comes after the first socket's.
    for protocol in ["graphql-ws", "graphql-transport-ws"] {
        // The slot of the socket closed in the round before is given back as its task ends.
        let mut silent = open_when_free(addr, protocol).await;
        let (texts, close) = until_closed(&mut silent).await;
        assert_eq!(texts, Vec::<Value>::new(), "{protocol}");
        assert_eq!(
            close,
            Some((4408, "Connection initialisation timeout".to_string())),
            "{protocol}"
        );
        // Its slot is free again: with the first socket holding the other one, a new socket
        // gets in (the server lets go of the slot as the socket's task ends).
        let mut next = open_when_free(addr, protocol).await;
        send(&mut next, json!({"type": "connection_init"})).await;
        assert_eq!(receive(&mut next).await["type"], "connection_ack");
        next.close(None).await.unwrap();
        let _ = until_closed(&mut next).await;
    }

    // The socket that sent connection_init is still served.
    send(
        &mut talking,
        json!({"type": "subscribe", "id": "1", "payload": {"query": query}}),
    )
    .await;
    let result = receive(&mut talking).await;
    assert_eq!(
        result["payload"]["data"]["status"]["election"]["epoch"],
        json!(1.0),
        "{result}"
    );
    shutdown.cancel();
}

/// `fragment F0 on Status { ...F1 ...F1 __typename }` ... `fragment F<levels> on Status {
/// __typename }` under `{ status { ...F0 } }` (or `subscription`): 2^levels selections in a
/// document of `levels` lines.
pub(crate) fn doubling_fragments(levels: usize, operation: &str) -> String {
    let mut query = format!("{operation} {{ status {{ ...F0 }} }}\n");
    for i in 0..levels {
        let next = i + 1;
        query.push_str(&format!(
            "fragment F{i} on Status {{ ...F{next} ...F{next} __typename }}\n"
        ));
    }
    query.push_str(&format!("fragment F{levels} on Status {{ __typename }}\n"));
    query
}

/// The message that names the limit ([`MAX_EXPANDED_SELECTIONS`]).
fn names_the_cap(message: &Value) -> bool {
    message
        .as_str()
        .is_some_and(|m| m.contains("more than 10000 fields once its fragments are expanded"))
}

#[tokio::test]
async fn fragments_that_double_are_refused_before_they_run() {
    let writer = leading(1);
    let (_, app) = app_with(&writer);
    // A few levels run as usual.
    let (code, answer) = query(&app, &doubling_fragments(4, "query")).await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    assert_eq!(answer["data"]["status"]["__typename"], "Status", "{answer}");
    // 23 levels took 6-11 s in async-graphql's checks, 30 levels hours: refused at once, 400,
    // the limit named. Without the count this test does not finish.
    for levels in [23, 30, 60] {
        let (code, answer) = query(&app, &doubling_fragments(levels, "query")).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{levels}: {answer}");
        assert_eq!(answer["data"], Value::Null);
        assert!(names_the_cap(&answer["errors"][0]["message"]), "{answer}");
    }
    // Fragment definitions count whether the operation spreads them or not.
    let unused = doubling_fragments(30, "query").replacen("...F0", "id", 1);
    let (code, answer) = query(&app, &unused).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{answer}");
    assert!(names_the_cap(&answer["errors"][0]["message"]), "{answer}");
    // A fragment cycle is refused by name, before anything expands it.
    let (code, answer) = query(
        &app,
        "{ status { ...A } } fragment A on Status { ...B id } fragment B on Status { ...A }",
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{answer}");
    let message = answer["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("spreads itself"), "{message}");

    // graphql-js's standard introspection query (fragments and all) fits.
    let (code, answer) = query(&app, INTROSPECTION).await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    assert!(
        answer["data"]["__schema"]["types"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "Status"),
        "{answer}"
    );
}

/// graphql-js's `getIntrospectionQuery()`, what GraphiQL and other tools send.
const INTROSPECTION: &str = r#"
query IntrospectionQuery {
  __schema {
    queryType { name }
    mutationType { name }
    subscriptionType { name }
    types { ...FullType }
    directives { name description locations args { ...InputValue } }
  }
}
fragment FullType on __Type {
  kind name description
  fields(includeDeprecated: true) {
    name description args { ...InputValue } type { ...TypeRef } isDeprecated deprecationReason
  }
  inputFields { ...InputValue }
  interfaces { ...TypeRef }
  enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason }
  possibleTypes { ...TypeRef }
}
fragment InputValue on __InputValue { name description type { ...TypeRef } defaultValue }
fragment TypeRef on __Type {
  kind name
  ofType { kind name ofType { kind name ofType { kind name ofType { kind name
    ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } } }
}
"#;

#[tokio::test]
async fn over_the_socket_costly_documents_and_unauthorised_mutations_are_refused() {
    // Without a token: the doubling fragments are refused (as a subscription and as a query),
    // a mutation runs.
    let writer = leading(1);
    let (state, _) = app_with(&writer);
    let (addr, shutdown) = serving(state).await;
    for (protocol, start, data) in [
        ("graphql-ws", "start", "data"),
        ("graphql-transport-ws", "subscribe", "next"),
    ] {
        let mut socket = open_socket(addr, protocol, None).await.unwrap();
        send(&mut socket, json!({"type": "connection_init"})).await;
        assert_eq!(receive(&mut socket).await["type"], "connection_ack");
        for (id, operation) in [("1", "subscription"), ("2", "query")] {
            send(
                &mut socket,
                json!({"type": start, "id": id, "payload":
                    {"query": doubling_fragments(30, operation)}}),
            )
            .await;
            let answer = receive(&mut socket).await;
            assert_eq!(answer["type"], data, "{protocol}: {answer}");
            assert_eq!(answer["id"], id);
            assert!(
                names_the_cap(&answer["payload"]["errors"][0]["message"]),
                "{protocol}: {answer}"
            );
            assert_eq!(
                receive(&mut socket).await,
                json!({"type": "complete", "id": id})
            );
        }
        send(
            &mut socket,
            json!({"type": start, "id": "3", "payload": {"query": "mutation { noop { ok } }"}}),
        )
        .await;
        let answer = receive(&mut socket).await;
        assert_eq!(
            answer["payload"],
            json!({"data": {"noop": {"ok": true}}}),
            "{answer}"
        );
    }
    shutdown.cancel();

    // With a token (reads open): a mutation needs it, on the upgrade or in connection_init,
    // as a POST does; queries and subscriptions do not.
    let (_writer, addr, shutdown) = serving_with_token(false).await;
    let bearer = format!("Bearer {TOKEN}");
    let mutation = |start: &str| json!({"type": start, "id": "m", "payload": {"query": "mutation { noop { ok } }"}});
    for (protocol, start) in [
        ("graphql-ws", "start"),
        ("graphql-transport-ws", "subscribe"),
    ] {
        for (headers, payload, allowed) in [
            (vec![], json!({}), false),
            (vec![], json!({"token": "wrong-t0ken-for-tests"}), false),
            (vec![], json!({"Authorization": bearer}), true),
            (vec![("authorization", bearer.as_str())], json!({}), true),
        ] {
            let mut socket = open_socket_with(addr, protocol, &headers).await.unwrap();
            send(
                &mut socket,
                json!({"type": "connection_init", "payload": payload}),
            )
            .await;
            assert_eq!(receive(&mut socket).await["type"], "connection_ack");
            send(&mut socket, mutation(start)).await;
            let answer = receive(&mut socket).await;
            if allowed {
                assert_eq!(
                    answer["payload"],
                    json!({"data": {"noop": {"ok": true}}}),
                    "{protocol} {payload}: {answer}"
                );
            } else {
                assert_eq!(answer["payload"]["data"], Value::Null, "{answer}");
                assert_eq!(
                    answer["payload"]["errors"][0]["message"],
                    verwalter_controllers::http::access::SOCKET_MUTATION_REFUSED,
                    "{protocol} {payload}: {answer}"
                );
                // Reads still work on that socket.
                send(
                    &mut socket,
                    json!({"type": start, "id": "q", "payload":
                        {"query": "{ status { election { epoch } } }"}}),
                )
                .await;
                let mut read = receive(&mut socket).await;
                if read["type"] == "complete" {
                    read = receive(&mut socket).await;
                }
                assert_eq!(
                    read["payload"]["data"]["status"]["election"]["epoch"],
                    json!(1.0),
                    "{read}"
                );
            }
        }
    }
    shutdown.cancel();
}

/// GraphQL work runs on its own runtime thread: a query that blocked its thread would not stop
/// the caller's runtime (here a single thread, which the blocked work would otherwise hold).
#[tokio::test]
async fn graphql_work_runs_off_the_callers_runtime() {
    let (release, released) = std::sync::mpsc::channel::<u32>();
    let work = graphql_offload_for_tests(async move {
        let thread = std::thread::current().name().map(str::to_string);
        // Blocks its thread until the caller's runtime sends: that runtime must run meanwhile.
        (thread, released.recv().unwrap())
    });
    tokio::spawn(async move { release.send(7).unwrap() });
    let (thread, value) = work.await.unwrap();
    assert_eq!(thread.as_deref(), Some("graphql"));
    assert_eq!(value, 7);
}

/// `Query.datacenters` is what `GET /v1/datacenters` shows: `null` in no DC; on a leader of
/// `ams` that took an envelope of `fra` (a summary, a request), each DC with it, and `lon`, an
/// entry point never heard from, with its addresses only.
#[tokio::test]
async fn datacenters_are_what_v1_datacenters_shows() {
    use verwalter_controllers::cluster::datacenters::wire::{self, DcKey, Envelope, Request};
    let writer = leading(2);
    let (_, app) = app_with(&writer);
    let (code, answer) = query(&app, "{ datacenters { name } }").await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    assert_eq!(answer, json!({"data": {"datacenters": null}}));

    let key = DcKey::new(b"the key of this test's site".to_vec()).unwrap();
    let settings = crate::config::DcSettings {
        own: "ams".into(),
        entry_points: [
            ("fra".to_string(), vec!["10.2.0.1:8379".to_string()]),
            ("lon".to_string(), vec!["10.3.0.1:8379".to_string()]),
        ]
        .into(),
        exchange: Default::default(),
        max_body: 1 << 16,
        peer_dcs: Default::default(),
        advertise: None,
    };
    let dc = crate::cluster::datacenters::DcNode::new(
        &settings,
        Some(key.clone()),
        "77985419c732412ea38b94db00000001".into(),
        "10.1.0.1:8379".into(),
        &prometheus::Registry::new(),
        verwalter_controllers::machinery::store::Field::new(None),
    );
    dc.follow(Some(2), None, tokio::time::Instant::now());
    let summary = json!({"spare": {"web": 12}});
    let envelope = Envelope {
        v: 1,
        dc: "fra".into(),
        node: BETA.into(),
        addr: "10.2.0.1:8379".into(),
        epoch: 5,
        seq: 1,
        summary_hash: Some(wire::summary_hash(&summary)),
        summary: Some(summary.clone()),
        have_summary: None,
        requests: vec![Request {
            id: "web-burst".into(),
            data: json!({"role": "web", "workers": 20}),
            lease_ms: 600_000,
        }],
        answers: Vec::new(),
    };
    let (body, tag) = key.seal(&envelope, 1 << 16).unwrap();
    let taken = dc.receive(&body, Some(&tag), tokio::time::Instant::now());
    assert!(
        matches!(taken, crate::cluster::datacenters::Reply::Envelope(..)),
        "{taken:?}"
    );
    let mut state = app_state(&writer, std::env::temp_dir(), "common");
    state.datacenters = Some(Arc::new(dc));
    let app = router(state);

    let (code, answer) = query(&app, ALL_FIELDS).await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    assert_eq!(answer.get("errors"), None, "{answer}");
    let gql = &answer["data"]["datacenters"];
    let rest = get_json(&app, "/v1/datacenters").await;
    assert_eq!(
        (
            &gql["name"],
            &gql["exchange"],
            &gql["leading"],
            &gql["addr"]
        ),
        (
            &json!("ams"),
            &json!("on"),
            &json!(true),
            &json!("10.1.0.1:8379")
        )
    );
    assert_eq!(gql["leader"], rest["leader"]);
    let names: Vec<&Value> = gql["dcs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["name"])
        .collect();
    assert_eq!(names, [&json!("fra"), &json!("lon")]);
    let (fra, rest_fra) = (&gql["dcs"][0], &rest["dcs"]["fra"]);
    assert_eq!(fra["addresses"], json!(["10.2.0.1:8379"]));
    assert_eq!(fra["leader"], json!(BETA));
    assert_eq!(fra["link"], json!("up"));
    assert_eq!(fra["summary"], summary);
    assert_eq!(fra["summaryBehind"], json!(false));
    assert_eq!(fra["rttMs"], Value::Null, "this node made no call");
    assert!(fra["contactAgeMs"].as_f64().is_some(), "{fra}");
    assert!(fra["summaryAgeMs"].as_f64().is_some(), "{fra}");
    assert_eq!(
        fra["bytesReceived"].as_f64(),
        rest_fra["bytes_received"].as_f64()
    );
    assert!(fra["bytesReceived"].as_f64() > Some(0.0), "{fra}");
    assert_eq!(fra["bytesSent"].as_f64(), rest_fra["bytes_sent"].as_f64());
    assert_eq!(fra["requests"][0]["id"], json!("web-burst"));
    assert_eq!(
        fra["requests"][0]["data"],
        json!({"role": "web", "workers": 20})
    );
    let left = fra["requests"][0]["expiresInMs"].as_f64().unwrap();
    assert!(left > 0.0 && left <= 600_000.0, "{fra}");
    assert_eq!((&fra["answers"], &fra["lent"]), (&json!([]), &json!([])));
    let lon = &gql["dcs"][1];
    assert_eq!(lon["addresses"], json!(["10.3.0.1:8379"]));
    assert_eq!(
        (&lon["link"], &lon["leader"]),
        (&json!("unknown"), &Value::Null)
    );
    assert_eq!(lon["lastError"], Value::Null, "no exchange was made");
}
