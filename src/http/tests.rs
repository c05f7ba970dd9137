//! The router, called without a socket.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;
use verwalter_controllers::election::ElectionState;
use verwalter_controllers::ports::SchedulerFailure;
use verwalter_controllers::state::{InputError, Schedule, SchedulerStatus};
use verwalter_controllers::store::StoreWriter;
use verwalter_controllers::testing::inputs;

use super::*;

fn app(writer: &StoreWriter) -> Router {
    router(AppState {
        store: writer.store(),
        force_render: Arc::new(verwalter_controllers::store::Field::new(0)),
        actions: crate::actions::ActionQueue::new(
            verwalter_controllers::store::Field::new(Default::default()),
            writer.store(),
            std::env::temp_dir().join("verwalter-http-tests-actions.json"),
        ),
        logs: None,
        log_dirs: Default::default(),
        backups_dir: std::env::temp_dir().join("verwalter-http-tests-no-backups"),
        metrics: Arc::new(Metrics::new()),
        node: Arc::new(NodeInfo {
            id: "77985419c732412ea38b94db00000001".into(),
            name: "alpha.example.com".into(),
            hostname: "alpha".into(),
            addr: "127.0.0.1:8379".into(),
            debug_force_leader: false,
            default_frontend: "common".into(),
        }),
    })
}

async fn get(app: &Router, path: &str) -> (StatusCode, String, String) {
    let response = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

async fn get_json(app: &Router, path: &str) -> Value {
    let (status, _, body) = get(app, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test]
async fn schedule_is_404_until_there_is_one_then_the_envelope() {
    let writer = StoreWriter::new(None);
    let app = app(&writer);
    let (status, _, body) = get(&app, "/v1/schedule").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"error": "no schedule yet"})
    );

    let schedule = Schedule::test().with_role("web", "v2").build();
    writer.schedule.set(Some(schedule.clone()));
    let served = get_json(&app, "/v1/schedule").await;
    assert_eq!(served["hash"], json!(schedule.hash));
    assert_eq!(served["data"]["roles"]["web"]["version"], json!("v2"));
    assert_eq!(served["origin"], json!(schedule.origin));
    assert_eq!(served["timestamp"], json!(schedule.timestamp));
    let parsed: Schedule = serde_json::from_value(served.clone()).unwrap();
    parsed.verify().unwrap();
    // `.json` is the same, `.pretty` is indented but the same value.
    assert_eq!(get_json(&app, "/v1/schedule.json").await, served);
    let (status, content_type, pretty) = get(&app, "/v1/schedule.pretty").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("application/json"));
    assert!(pretty.contains("\n  \"data\": {"), "{pretty}");
    assert_eq!(serde_json::from_str::<Value>(&pretty).unwrap(), served);
}

#[tokio::test]
async fn status_has_the_verwalter_shape_and_shows_errors() {
    let writer = StoreWriter::new(None);
    writer.election.set(ElectionState {
        is_leader: true,
        is_stable: true,
        epoch: 1,
        ..Default::default()
    });
    let schedule = Schedule::test()
        .with_role("web", "v2")
        .with_node_role("alpha", "db", json!({"x": 1}))
        .build();
    writer.schedule.set(Some(schedule.clone()));
    let mut bad = inputs(json!({}));
    bad.errors.push(InputError {
        path: "runtime/bad.yaml".into(),
        line: Some(3),
        message: "did not find expected ','".into(),
    });
    writer.inputs.set(bad);
    writer.scheduler.set(SchedulerStatus {
        error: Some("scheduler/v1/main.lua:7: boom".into()),
        failure: Some(SchedulerFailure::Runtime),
        ..Default::default()
    });
    let app = app(&writer);
    let status = get_json(&app, "/v1/status").await;
    for key in [
        "version",
        "id",
        "name",
        "hostname",
        "peers",
        "peers_timestamp",
        "leader",
        "roles",
        "last_stable_timestamp",
        "num_errors",
        "errors",
        "failed_roles",
        "debug_force_leader",
        "metrics",
        "fetch_state",
        "election_state",
        "schedule_id",
        "schedule_status",
        "default_frontend",
    ] {
        assert!(status.get(key).is_some(), "status lacks {key}: {status}");
    }
    assert_eq!(
        status["version"],
        json!(format!("v{}", env!("CARGO_PKG_VERSION")))
    );
    assert_eq!(status["leader"]["hostname"], json!("alpha"));
    assert_eq!(status["leader"]["addr"], json!("127.0.0.1:8379"));
    assert_eq!(status["leader"]["schedule"], json!(schedule.hash));
    assert_eq!(status["schedule_id"], json!(schedule.hash));
    assert_eq!(status["schedule_status"], json!("ok"));
    assert_eq!(status["fetch_state"], json!({"state": "StableLeader"}));
    assert_eq!(status["roles"], json!(2));
    assert_eq!(status["peers"], json!(0));
    assert_eq!(status["num_errors"], json!(2));
    assert_eq!(
        status["errors"]["runtime/bad.yaml"],
        json!("line 3: did not find expected ','")
    );
    assert_eq!(
        status["errors"]["scheduler"],
        json!("scheduler/v1/main.lua:7: boom")
    );
    assert_eq!(status["election_state"]["is_leader"], json!(true));
    assert_eq!(get_json(&app, "/v1/election.json").await["epoch"], json!(1));
    assert_eq!(get_json(&app, "/v1/peers").await, json!([]));
}

#[tokio::test]
async fn scheduler_debug_routes_and_metrics() {
    let writer = StoreWriter::new(None);
    let app = app(&writer);
    assert_eq!(
        get(&app, "/v1/scheduler_input").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&app, "/v1/scheduler_debug_info").await.0,
        StatusCode::NOT_FOUND
    );
    writer.scheduler.set(SchedulerStatus {
        debug_info: Some("placed 3 roles\n".into()),
        ..Default::default()
    });
    let (status, content_type, body) = get(&app, "/v1/scheduler_debug_info").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/plain"));
    assert_eq!(body, "placed 3 roles\n");

    let (status, content_type, body) = get(&app, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/plain; version=0.0.4"));
    for family in [
        "verwalter_scheduler_runs_total",
        "verwalter_leader",
        "verwalter_input_errors",
        "verwalter_schedule_timestamp_seconds",
    ] {
        assert!(body.contains(family), "metrics lack {family}:\n{body}");
    }
    let (status, _, body) = get(&app, "/v1/nonexistent").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("no API route /v1/nonexistent"));
    let (status, content_type, body) = get(&app, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/html"));
    assert!(body.contains("/v1/status"));
}

#[test]
fn every_route_is_in_the_openapi_description_and_nothing_else() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let documented: std::collections::BTreeSet<String> = doc["paths"]
        .as_mapping()
        .expect("paths")
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    // axum writes a catch-all segment as `{*name}`, OpenAPI as `{name}`.
    let served: std::collections::BTreeSet<String> = crate::http::route_paths()
        .into_iter()
        .map(|p| p.replace("{*", "{"))
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "routes not in docs/openapi.yaml: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "docs/openapi.yaml paths the router lacks: {stale:?}"
    );
}
