//! The router, called without a socket.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;
use verwalter_controllers::cluster::election::ElectionState;
use verwalter_controllers::node::StoreWriter;
use verwalter_controllers::state::SchedulerFailure;
use verwalter_controllers::state::{InputError, Schedule, SchedulerStatus};
use verwalter_controllers::testing::{STATUS_KEYS, inputs};

use super::*;

/// `/v1/wasm/*` and `/v1/query/*`.
mod wasm_routes;

/// What files are served as, and the headers every response carries.
mod headers;

fn app(writer: &StoreWriter) -> Router {
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    app_serving(writer, no_frontends, "common")
}

/// The app with alternative frontends from `frontend_dir` and `default_frontend` at `/`.
fn app_serving(
    writer: &StoreWriter,
    frontend_dir: std::path::PathBuf,
    default_frontend: &str,
) -> Router {
    router(app_state(writer, frontend_dir, default_frontend))
}

pub(super) fn app_state(
    writer: &StoreWriter,
    frontend_dir: std::path::PathBuf,
    default_frontend: &str,
) -> AppState {
    AppState {
        store: writer.store(),
        force_render: Arc::new(verwalter_controllers::machinery::store::Field::new(0)),
        // Not run: these tests register no action (no node leads).
        actions: verwalter_controllers::actions::ActionQueue::open(
            verwalter_controllers::machinery::store::Field::new(Default::default()),
            writer.store(),
            Arc::new(verwalter_controllers::testing::MemoryJournal::default()),
            Arc::new(verwalter_controllers::machinery::clock::SystemClock),
            Default::default(),
        )
        .unwrap(),
        logs: None,
        log_dirs: Default::default(),
        backups_dir: std::env::temp_dir().join("verwalter-http-tests-no-backups"),
        metrics: Arc::new(Metrics::new()),
        node: Arc::new(NodeInfo {
            id: "77985419c732412ea38b94db00000001".into(),
            name: "alpha.example.com".into(),
            hostname: "alpha".into(),
            addr: "127.0.0.1:8379".into(),
            port: 8379,
            debug_force_leader: false,
            default_frontend: default_frontend.into(),
            version: version(),
        }),
        frontend_dir,
        scheduler_dir: std::env::temp_dir().join("verwalter-http-tests-no-scheduler"),
        query: crate::schedule::wasm::query::QueryHook::new(
            std::env::temp_dir().join("verwalter-http-tests-no-scheduler"),
            crate::schedule::lua::Limits::default().into(),
        ),
        http: Default::default(),
        liveness: Default::default(),
        alive_window: std::time::Duration::from_secs(75),
        datacenters: None,
    }
}

/// A store of a node that leads `epoch`, stably.
pub(super) fn leading(epoch: u64) -> StoreWriter {
    let writer = StoreWriter::new(None);
    writer.election.set(ElectionState {
        is_leader: true,
        is_stable: true,
        epoch,
        ..Default::default()
    });
    writer
}

pub(super) async fn get(app: &Router, path: &str) -> (StatusCode, String, String) {
    let response = send(app, "GET", path, &[]).await;
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, content_type, body_text(response).await)
}

/// The body of `path`, which must answer 200 with a content type starting `content_type`.
pub(super) async fn get_ok(app: &Router, path: &str, content_type: &str) -> String {
    let (status, got, body) = get(app, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    assert!(got.starts_with(content_type), "{path}: {got}");
    body
}

pub(super) async fn get_json(app: &Router, path: &str) -> Value {
    serde_json::from_str(&get_ok(app, path, "").await).unwrap()
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
    let pretty = get_ok(&app, "/v1/schedule.pretty", "application/json").await;
    assert!(pretty.contains("\n  \"data\": {"), "{pretty}");
    assert_eq!(serde_json::from_str::<Value>(&pretty).unwrap(), served);
}

#[tokio::test]
async fn status_has_the_verwalter_shape_and_shows_errors() {
    let writer = leading(1);
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
    for key in STATUS_KEYS {
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
    // The built-in election, named as the backend (with etcd: docs/etcd.md, tests/etcd.rs).
    assert_eq!(status["election_backend"], json!("builtin"));
    assert_eq!(
        get_json(&app, "/v1/election").await["election_backend"],
        json!("builtin")
    );
    assert_eq!(get_json(&app, "/v1/peers").await, json!([]));

    // A node that stepped down no longer reports its last scheduler failure (only a leader
    // runs the scheduler); the input error stays.
    writer.election.update(|e| e.is_leader = false);
    let status = get_json(&app, "/v1/status").await;
    assert_eq!(status["num_errors"], json!(1), "{status}");
    assert_eq!(status["errors"].get("scheduler"), None, "{status}");
}

/// A schedule that could not be written shows in `/v1/status` and as a metric until written.
#[tokio::test]
async fn a_failed_schedule_write_shows_in_status_and_metrics() {
    let writer = StoreWriter::new(None);
    writer
        .persist_error
        .set(Some("schedule.json: No space left on device".into()));
    let app = app(&writer);
    let status = get_json(&app, "/v1/status").await;
    assert_eq!(
        status["errors"]["schedule_persist"],
        json!("schedule.json: No space left on device")
    );
    assert_eq!(status["num_errors"], json!(1));
    let (_, _, metrics) = get(&app, "/metrics").await;
    assert!(
        metrics.contains("verwalter_schedule_persist_failing 1"),
        "{metrics}"
    );
    writer.persist_error.set(None);
    let status = get_json(&app, "/v1/status").await;
    assert_eq!(status["num_errors"], json!(0), "{status}");
    let (_, _, metrics) = get(&app, "/metrics").await;
    assert!(
        metrics.contains("verwalter_schedule_persist_failing 0"),
        "{metrics}"
    );
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
    let body = get_ok(&app, "/v1/scheduler_debug_info", "text/plain").await;
    assert_eq!(body, "placed 3 roles\n");

    let body = get_ok(&app, "/metrics", "text/plain; version=0.0.4").await;
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
    let body = get_ok(&app, "/", "text/html").await;
    assert!(body.contains("/common/app.js"), "{body}");
}

async fn get_with(app: &Router, path: &str, headers: &[(&str, &str)]) -> axum::response::Response {
    send(app, "GET", path, headers).await
}

#[tokio::test]
async fn the_built_in_frontend_is_served_for_every_page_path_with_cache_validation() {
    let writer = StoreWriter::new(None);
    let app = app(&writer);
    let (_, _, index) = get(&app, "/").await;
    // The page routes itself: deep links and reloads get the same page.
    for page in [
        "/roles/web",
        "/logs",
        "/tail/role/web/latest",
        "/~common/roles",
    ] {
        let body = get_ok(&app, page, "text/html").await;
        assert_eq!(body, index, "{page}");
    }
    let script = get_ok(&app, "/common/app.js", "text/javascript").await;
    assert!(script.contains("./js/stream.js"), "{script}");
    // The modules it imports, in folders under /common/ too.
    let module = get_ok(&app, "/common/js/stream.js", "text/javascript").await;
    assert!(module.contains("/v1/events"));
    let (status, _, _) = get(&app, "/common/js/pages/roles.js").await;
    assert_eq!(status, StatusCode::OK);

    let zipped = get_with(&app, "/common/app.js", &[("accept-encoding", "br, gzip")]).await;
    assert_eq!(zipped.headers()["content-encoding"], "gzip");
    let etag = zipped.headers()["etag"].to_str().unwrap().to_string();
    let body = axum::body::to_bytes(zipped.into_body(), usize::MAX)
        .await
        .unwrap();
    let mut unzipped = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&body[..]), &mut unzipped)
        .unwrap();
    assert_eq!(unzipped, script);
    let refused = get_with(&app, "/common/app.js", &[("accept-encoding", "gzip;q=0")]).await;
    assert!(refused.headers().get("content-encoding").is_none());

    for tags in [
        etag.clone(),
        format!("\"other\", W/{etag}"),
        "*".to_string(),
    ] {
        let again = get_with(
            &app,
            "/common/app.js",
            &[("if-none-match", &tags), ("accept-encoding", "gzip")],
        )
        .await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{tags}");
    }
    // The plain body is another representation, with another tag.
    let plain = get_with(&app, "/common/app.js", &[("if-none-match", &etag)]).await;
    assert_eq!(plain.status(), StatusCode::OK);
    assert_ne!(plain.headers()["etag"], etag.as_str());
    let (status, _, _) = get(&app, "/common/nothing.js").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = get(&app, "/common/index.html").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the page is at /, not under /common/"
    );
}

/// A temporary config dir whose `frontend/ops/` holds an `index.html` and `files` (paths under
/// it, contents). Returns the dir (removed when dropped) and the `frontend` dir.
fn ops_frontend(files: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("frontend");
    for (path, text) in [("index.html", "<title>ops</title>")].iter().chain(files) {
        let path = dir.join("ops").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    (tmp, dir)
}

#[tokio::test]
async fn alternative_frontends_are_served_from_the_config_dir_and_cannot_reach_out() {
    let (tmp, dir) = ops_frontend(&[("js/main.js", "let ops = 1;")]);
    std::fs::write(tmp.path().join("secret"), "no").unwrap();
    std::os::unix::fs::symlink(tmp.path().join("secret"), dir.join("ops/js/out.js")).unwrap();
    let writer = StoreWriter::new(None);

    let app = app_serving(&writer, dir.clone(), "common");
    let (status, _, body) = get(&app, "/~ops/js/main.js").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "let ops = 1;"));
    for page in ["/~ops/", "/~ops", "/~ops/servers/alpha"] {
        let (status, _, body) = get(&app, page).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "<title>ops</title>"),
            "{page}"
        );
    }
    let (status, _, body) = get(&app, "/~nope/").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        body.contains("frontend/nope/index.html is missing"),
        "{body}"
    );
    let (status, _, _) = get(&app, "/~ops/js/out.js").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a symlink out of the frontend dir"
    );
    // A precompressed `.gz` beside a file is used, unless it leads out of the dir.
    let gzip = |text: &str| {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut encoder, text.as_bytes()).unwrap();
        encoder.finish().unwrap()
    };
    std::fs::write(dir.join("ops/js/main.js.gz"), gzip("let ops = 1;")).unwrap();
    let zipped = get_with(&app, "/~ops/js/main.js", &[("accept-encoding", "gzip")]).await;
    assert_eq!(zipped.headers()["content-encoding"], "gzip");
    std::fs::write(dir.join("ops/js/other.js"), "let other = 1;").unwrap();
    std::fs::write(tmp.path().join("leak.gz"), gzip("leaked")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("leak.gz"), dir.join("ops/js/other.js.gz")).unwrap();
    let plain = get_with(&app, "/~ops/js/other.js", &[("accept-encoding", "gzip")]).await;
    assert!(plain.headers().get("content-encoding").is_none());
    let body = axum::body::to_bytes(plain.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(&body[..], b"let other = 1;");
    for path in [
        "/~ops/js/../../../secret",
        "/~ops/js/%2e%2e/%2e%2e/%2e%2e/secret",
        "/~..%2f/js/x",
    ] {
        let (status, _, body) = get(&app, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }

    // --default-frontend ops: `/` and page paths are its page; the built-in one stays at /~common/.
    let app = app_serving(&writer, dir, "ops");
    let (_, _, body) = get(&app, "/").await;
    assert_eq!(body, "<title>ops</title>");
    let (_, _, body) = get(&app, "/roles").await;
    assert_eq!(body, "<title>ops</title>");
    let (_, _, body) = get(&app, "/~common/").await;
    assert!(body.contains("/common/app.js"));
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

/// `/v1/peers` says when each peer was last heard from directly, read at the request (the
/// stored list changes only when its membership does), and `alive` when that was within the
/// window the node judges peers by.
#[tokio::test]
async fn peers_are_alive_while_heard_within_the_window() {
    use verwalter_controllers::machinery::clock::{Clock, SystemClock};
    use verwalter_controllers::state::{Peer, Peers};
    let writer = StoreWriter::new(None);
    let peer = |n: u32| Peer {
        id: format!("77985419c732412ea38b94db{n:08}"),
        addr: None,
        name: format!("n{n}.example.com"),
        hostname: format!("n{n}"),
        schedule: None,
        known_since: 1,
        last_report_direct: Some(1),
        errors: 0,
    };
    writer.peers.set(Peers {
        peers: [peer(2), peer(3), peer(4)]
            .into_iter()
            .map(|p| (p.id.clone(), p))
            .collect(),
        timestamp: Some(1),
    });
    let mut state = app_state(
        &writer,
        std::env::temp_dir().join("verwalter-http-tests-no-frontends"),
        "common",
    );
    state.alive_window = std::time::Duration::from_secs(75);
    let now = SystemClock.now_ms();
    state.liveness.heard(&peer(2).id, now - 1_000);
    state.liveness.heard(&peer(3).id, now - 120_000);
    let app = router(state);
    let list = get_json(&app, "/v1/peers").await;
    let by_host = |h: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|p| p["hostname"] == h)
            .unwrap()
            .clone()
    };
    assert_eq!(by_host("n2")["last_heard"], json!(now - 1_000));
    assert_eq!(by_host("n2")["alive"], json!(true));
    assert_eq!(by_host("n3")["last_heard"], json!(now - 120_000));
    assert_eq!(by_host("n3")["alive"], json!(false));
    assert_eq!(by_host("n4")["last_heard"], Value::Null);
    assert_eq!(by_host("n4")["alive"], json!(false));
}

/// `/v1/routes` is the route table, and the table's methods are the ones the router takes: a
/// route refuses (405) exactly the methods the table leaves out. `/v1/openapi.yaml` is
/// docs/openapi.yaml, as text.
#[tokio::test]
async fn the_route_table_is_served_with_the_methods_each_route_takes() {
    // A leader is known, so the leader redirects answer at once.
    let writer = leading(2);
    let app = app(&writer);
    let listed = get_json(&app, "/v1/routes").await;
    assert_eq!(listed, serde_json::to_value(route_table()).unwrap());
    let paths: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    for wanted in [
        "/v1/graphql",
        "/v1/graphiql",
        "/v1/wait_action",
        "/v1/log/role/{role}/{file}",
        "/v1/log/{stream}/{file}",
        "/v1/log/external/{name}/{*path}",
        "/v1/routes",
        "/v1/openapi.yaml",
    ] {
        assert!(paths.contains(&wanted), "{wanted} not in {paths:?}");
    }
    for route in route_table() {
        let mut path = String::new();
        for (i, part) in route.path.split('{').enumerate() {
            match part.split_once('}') {
                Some((_, rest)) if i > 0 => path += &format!("x{rest}"),
                _ => path += part,
            }
        }
        for method in ["GET", "POST"] {
            let refused =
                send(&app, method, &path, &[]).await.status() == StatusCode::METHOD_NOT_ALLOWED;
            let takes = route.methods.contains(&method);
            assert_eq!(
                refused, !takes,
                "{method} {path}: table says {:?}",
                route.methods
            );
        }
    }
    let text = get_ok(&app, "/v1/openapi.yaml", "text/plain").await;
    let on_disk = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.yaml"),
    )
    .unwrap();
    assert_eq!(text, on_disk);
}

/// docs/openapi.yaml marks every operation that is not a read as needing the bearer token.
#[test]
fn every_write_operation_in_the_openapi_description_names_the_token() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.yaml");
    let doc: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let mut writes = 0;
    for (route, operations) in doc["paths"].as_mapping().unwrap() {
        for (method, operation) in operations.as_mapping().unwrap() {
            let method = method.as_str().unwrap();
            if matches!(method, "get" | "head" | "options" | "parameters") {
                continue;
            }
            if route.as_str() == Some(verwalter_controllers::http::access::DC_EXCHANGE_PATH) {
                // Signed with the election key instead of the API token.
                assert_eq!(
                    serde_json::to_string(&operation["security"]).unwrap(),
                    "[{}]"
                );
                continue;
            }
            writes += 1;
            let security = serde_json::to_string(&operation["security"]).unwrap();
            assert!(
                security.contains("bearer"),
                "{method} {route:?}: {security}"
            );
            let unauthorized = &operation["responses"]["401"];
            assert!(!unauthorized.is_null(), "{method} {route:?} lacks its 401");
        }
    }
    assert_eq!(
        writes, 6,
        "force_render_all, action, wait_action, query, graphql, shadow/render"
    );
}

pub(super) async fn body_text(response: axum::response::Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn range_headers_other_than_one_byte_range_are_ignored_not_refused() {
    let (_tmp, dir) = ops_frontend(&[("files/data.txt", "0123456789")]);
    let writer = StoreWriter::new(None);
    let app = app_serving(&writer, dir, "common");
    let whole = [
        "bytes=0-1,4-5",
        "items=0-3",
        "bytes=5-2",
        "bytes=x-3",
        "bytes=-",
    ];
    for range in whole {
        let response = get_with(&app, "/~ops/files/data.txt", &[("range", range)]).await;
        assert_eq!(response.status(), StatusCode::OK, "{range}");
        assert_eq!(body_text(response).await, "0123456789", "{range}");
    }
    for (range, part) in [
        ("bytes=2-4", "234"),
        ("Bytes = 7-", "789"),
        ("bytes=-2", "89"),
        // A suffix longer than the file is all of it (RFC 9110, 14.1.2).
        ("bytes=-100", "0123456789"),
    ] {
        let response = get_with(&app, "/~ops/files/data.txt", &[("range", range)]).await;
        assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(body_text(response).await, part, "{range}");
    }
    // One range past the end is still unsatisfiable.
    let response = get_with(&app, "/~ops/files/data.txt", &[("range", "bytes=20-")]).await;
    assert_eq!(response.status(), StatusCode::RANGE_NOT_SATISFIABLE);
}

#[tokio::test]
async fn a_range_on_an_empty_file_is_ignored() {
    let (_tmp, dir) = ops_frontend(&[("files/empty.log", "")]);
    let writer = StoreWriter::new(None);
    let app = app_serving(&writer, dir, "common");
    for range in ["bytes=0-", "bytes=-100", "bytes=0-0", "bytes=5-"] {
        let response = get_with(&app, "/~ops/files/empty.log", &[("range", range)]).await;
        assert_eq!(response.status(), StatusCode::OK, "{range}");
        assert!(response.headers().get("content-range").is_none(), "{range}");
        assert_eq!(body_text(response).await, "", "{range}");
    }
}

#[tokio::test]
async fn leader_redirect_keeps_an_encoded_crlf_encoded() {
    let writer = leading(1);
    let app = app(&writer);
    let response = get_with(
        &app,
        "/v1/leader-redirect-by-node-name/v1/status%0D%0ASet-Cookie:%20x=1?pretty=1",
        &[],
    )
    .await;
    assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(
        response.headers()["location"],
        "http://alpha.example.com:8379/v1/status%0D%0ASet-Cookie:%20x=1?pretty=1"
    );
    assert!(response.headers().get("set-cookie").is_none());
}

/// `POST path` with a JSON `body`.
pub(super) async fn post_json(
    app: &Router,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> axum::response::Response {
    let mut request = Request::post(path).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    app.clone()
        .oneshot(request.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap()
}

/// `POST path` with `body` sent as `content_type`.
pub(super) async fn send_body(
    app: &Router,
    path: &str,
    content_type: &str,
    body: &str,
) -> axum::response::Response {
    let request = Request::post(path)
        .header("content-type", content_type)
        .body(Body::from(body.to_string()))
        .unwrap();
    app.clone().oneshot(request).await.unwrap()
}

/// `GET path`, the whole response.
pub(super) async fn send_get(app: &Router, path: &str) -> axum::response::Response {
    send(app, "GET", path, &[]).await
}

async fn send(
    app: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> axum::response::Response {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    app.clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn foreign_host_names_and_cross_site_posts_are_refused() {
    let writer = StoreWriter::new(None);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let state = app_state(&writer, no_frontends, "common");
    let force_render = state.force_render.clone();
    let app = router(state);
    // DNS rebinding: a name of someone else's domain pointing here.
    for host in [
        "evil.example.net",
        "evil.example.net:8379",
        "alpha.evil.example.net",
    ] {
        let response = send(&app, "GET", "/v1/status", &[("host", host)]).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{host}");
        assert!(body_text(response).await.contains("http.allowed-hosts"));
    }
    // Addresses, names without a dot, the node's own names.
    for host in [
        "127.0.0.1:8379",
        "[::1]:8379",
        "10.1.2.3",
        "localhost:8379",
        "verwalter",
        "alpha:8379",
        "ALPHA.example.com.:8379",
        "web.localhost",
    ] {
        let response = send(&app, "GET", "/v1/status", &[("host", host)]).await;
        assert_eq!(response.status(), StatusCode::OK, "{host}");
    }
    // No Host at all (HTTP/1.0).
    assert_eq!(
        send(&app, "GET", "/v1/status", &[]).await.status(),
        StatusCode::OK
    );

    let host = ("host", "127.0.0.1:8379");
    let refused = [
        vec![host, ("origin", "http://evil.example.net")],
        vec![host, ("origin", "http://127.0.0.1:9999")],
        vec![host, ("origin", "null")],
        vec![host, ("referer", "http://evil.example.net/page")],
    ];
    for headers in &refused {
        let response = send(&app, "POST", "/v1/force_render_all", headers).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{headers:?}");
    }
    let response = send(
        &app,
        "POST",
        "/v1/force_render_all",
        &[host, ("content-type", "text/plain")],
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(*force_render.get(), 0, "nothing re-rendered");
    // The node's own pages, and curl (no Origin).
    for headers in [
        vec![host, ("origin", "http://127.0.0.1:8379")],
        vec![host, ("referer", "http://127.0.0.1:8379/roles/web")],
        vec![host],
    ] {
        let response = send(&app, "POST", "/v1/force_render_all", &headers).await;
        assert_eq!(response.status(), StatusCode::OK, "{headers:?}");
    }
    assert_eq!(*force_render.get(), 3, "re-rendered by each of the three");
}

#[tokio::test]
async fn allowed_hosts_add_names_and_star_allows_any() {
    let writer = StoreWriter::new(None);
    let with = |allowed: &[&str]| {
        let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
        let mut state = app_state(&writer, no_frontends, "common");
        state.http = Arc::new(HttpState::new(HttpSettings {
            allowed_hosts: allowed.iter().map(|s| s.to_string()).collect(),
            ..HttpSettings::default()
        }));
        router(state)
    };
    let app = with(&["ops.example.org"]);
    let ok = send(&app, "GET", "/v1/status", &[("host", "ops.example.org:80")]).await;
    assert_eq!(ok.status(), StatusCode::OK);
    let other = send(&app, "GET", "/v1/status", &[("host", "db.example.org")]).await;
    assert_eq!(other.status(), StatusCode::FORBIDDEN);
    let app = with(&["*"]);
    let any = send(&app, "GET", "/v1/status", &[("host", "db.example.org")]).await;
    assert_eq!(any.status(), StatusCode::OK);
}

#[tokio::test]
async fn event_streams_are_capped_and_a_reader_that_stops_is_dropped() {
    use http_body_util::BodyExt;
    const STALL: std::time::Duration = std::time::Duration::from_millis(300);
    let writer = StoreWriter::new(None);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.http = Arc::new(HttpState::new(HttpSettings {
        max_event_streams: 1,
        stream_stall_timeout: STALL,
        ..HttpSettings::default()
    }));
    let app = router(state);
    let open = |connection: ConnectionHandle| {
        let mut request = Request::get("/v1/events").body(Body::empty()).unwrap();
        request.extensions_mut().insert(connection);
        app.clone().oneshot(request)
    };
    let connection = ConnectionHandle::detached();
    let response = open(connection.clone()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"event: status"));

    // The one slot is taken.
    let second = open(ConnectionHandle::detached()).await.unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(second.headers()["retry-after"], "5");

    // A reader that keeps reading is kept: each change is one event (watch semantics).
    for epoch in 1..=3 {
        writer.election.set(ElectionState {
            epoch,
            ..Default::default()
        });
        let event = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(String::from_utf8_lossy(&event).contains(&format!("\"epoch\":{epoch}")));
    }
    // The body was asked for the next event right after the last one; a while later it still
    // has not been, as with a client that stopped reading.
    let pending = tokio::time::timeout(STALL * 2, body.frame()).await;
    assert!(pending.is_err(), "no change, no event");
    assert!(!connection.is_closed());
    // Now an event is handed out and never taken past it: the connection is dropped.
    writer.election.set(ElectionState {
        epoch: 9,
        ..Default::default()
    });
    let event = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(String::from_utf8_lossy(&event).contains("\"epoch\":9"));
    let closed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !connection.is_closed() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    });
    assert!(closed.await.is_ok(), "a stalled reader is dropped");

    // Its slot comes back when the stream goes.
    drop(body);
    let again = open(ConnectionHandle::detached()).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_action_body_that_stalls_gets_408_and_frees_its_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let writer = StoreWriter::new(None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let settings = HttpSettings {
        idle_timeout: std::time::Duration::from_millis(300),
        ..HttpSettings::default()
    };
    let (app, m, s) = (app(&writer), metrics.clone(), shutdown.clone());
    let server = tokio::spawn(async move { serve(listener, app, &settings, m, s).await });
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The head promises a body that never comes.
    stream
        .write_all(
            b"POST /v1/action HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        stream.read_to_end(&mut answer),
    )
    .await;
    assert!(read.is_ok(), "the request is ended, not left waiting");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("http.idle-timeout-ms"), "{answer}");
    shutdown.cancel();
    server.await.unwrap();
}

/// `/v1/query` reads its body as the other JSON routes do (it used to read up to the limit
/// whatever the head announced, and answer a stalled body 413): a `Content-Length` over the
/// limit is refused 413 before any byte comes, and a body that stalls is 408.
#[tokio::test]
async fn a_query_body_announced_too_large_gets_413_at_once_and_a_stalled_one_408() {
    use std::time::Duration;
    let writer = StoreWriter::new(None);
    let app = app(&writer);
    // A body that never sends a byte; `stall` wraps it as the server's
    // `RequestBodyTimeoutLayer` does every body (with a shorter idle timeout). The answer's
    // status and body.
    let ask = async |length: u64, stall: Option<Duration>| {
        let pending = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
        let body = Body::from_stream(pending);
        let body = match stall {
            Some(stall) => Body::new(tower_http::timeout::TimeoutBody::new(stall, body)),
            None => body,
        };
        let request = Request::post("/v1/query/anything")
            .header("content-type", "application/json")
            .header("content-length", length.to_string())
            .body(body)
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), app.clone().oneshot(request));
        let response = answer.await.expect("answered").unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await;
        (status, String::from_utf8(body.unwrap().to_vec()).unwrap())
    };
    assert_eq!(
        ask(1 << 20, None).await,
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            r#"{"error":"a query body is at most 65536 bytes of JSON"}"#.into()
        )
    );
    assert_eq!(
        ask(100, Some(Duration::from_millis(50))).await,
        (
            StatusCode::REQUEST_TIMEOUT,
            r#"{"error":"the request body stalled for the idle timeout (http.idle-timeout-ms)"}"#
                .into()
        )
    );
}

#[tokio::test]
async fn event_streams_take_at_most_a_quarter_of_the_connections() {
    let settings = |max_connections, max_event_streams| HttpSettings {
        max_connections,
        max_event_streams,
        ..HttpSettings::default()
    };
    assert_eq!(event_stream_cap(&settings(512, 128)), 128);
    assert_eq!(event_stream_cap(&settings(512, 500)), 128);
    assert_eq!(event_stream_cap(&settings(100, 128)), 25);
    assert_eq!(
        event_stream_cap(&settings(2, 128)),
        1,
        "one stream still works"
    );

    // The cap in force is what the route refuses above.
    let writer = StoreWriter::new(None);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.http = Arc::new(HttpState::new(settings(8, 128)));
    let app = router(state);
    let mut open = Vec::new();
    for _ in 0..2 {
        let response = get_with(&app, "/v1/events", &[]).await;
        assert_eq!(response.status(), StatusCode::OK);
        open.push(response);
    }
    let third = get_with(&app, "/v1/events", &[]).await;
    assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
    let text = body_text(third).await;
    assert!(text.contains("2 event streams are open"), "{text}");
}

#[tokio::test]
async fn long_polls_take_at_most_a_quarter_of_the_connections() {
    let writer = StoreWriter::new(None);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.http = Arc::new(HttpState::new(HttpSettings {
        max_connections: 4,
        ..HttpSettings::default()
    }));
    let app = router(state);
    // No leader: the redirect waits for one, holding the single long-poll slot.
    let mut waiting = Box::pin(get_with(&app, "/v1/leader-redirect-by-node-name", &[]));
    tokio::select! {
        biased;
        _ = &mut waiting => panic!("answered without a leader"),
        () = std::future::ready(()) => {}
    }
    for path in [
        "/v1/leader-redirect-by-node-name/v1/status",
        "/v1/wait_action",
    ] {
        let method = if path == "/v1/wait_action" {
            "POST"
        } else {
            "GET"
        };
        let response = send(&app, method, path, &[("content-type", "application/json")]).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert_eq!(response.headers()["retry-after"], "5");
        let text = body_text(response).await;
        assert!(text.contains("1 requests that wait"), "{text}");
    }
    // Other routes are not limited.
    let response = get_with(&app, "/v1/status", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    // The slot comes back when the long poll ends.
    drop(waiting);
    let response = send(
        &app,
        "POST",
        "/v1/wait_action",
        &[("content-type", "application/json")],
    )
    .await;
    assert_ne!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// `/v1/schedule` is serialized once per schedule and shared by every response (a client that
/// does not read holds a reference, not a copy); a new schedule gets a new body at once.
#[tokio::test]
async fn the_schedule_body_is_shared_per_schedule_and_follows_a_new_one() {
    let writer = StoreWriter::new(None);
    let app = app(&writer);
    let first = Schedule::test().with_role("web", "v1").build();
    writer.schedule.set(Some(first.clone()));
    assert_eq!(
        get_json(&app, "/v1/schedule").await,
        serde_json::to_value(&first).unwrap()
    );
    let by_hash = format!("/v1/schedule/{}", first.hash);
    assert_eq!(get_json(&app, &by_hash).await["hash"], json!(first.hash));
    let second = Schedule::test().with_role("web", "v2").build();
    writer.schedule.set(Some(second.clone()));
    assert_eq!(
        get_json(&app, "/v1/schedule").await,
        serde_json::to_value(&second).unwrap()
    );

    let shared = SharedJson::default();
    let snapshot = writer.store().schedule.peek();
    let a = shared.body(&snapshot);
    let b = shared.body(&snapshot);
    assert_eq!(a.as_ptr(), b.as_ptr(), "one buffer for one snapshot");
    writer.schedule.set(Some(first));
    let c = shared.body(&writer.store().schedule.peek());
    assert_ne!(c, a, "a new snapshot is serialized anew");
}

/// `/v1/events` used to miss two fields the status shows: a schedule that could not be written
/// (`errors.schedule_persist`) and a new leader's prefetch finishing (`fetch_state`).
#[tokio::test]
async fn events_follow_a_failed_schedule_write_and_the_end_of_a_prefetch() {
    use http_body_util::BodyExt;
    use verwalter_controllers::state::{Peer, Peers, Prefetched};
    let writer = leading(2);
    let beta = "77985419c732412ea38b94db00000002";
    writer.peers.set(Peers {
        peers: [(
            beta.to_string(),
            Peer {
                id: beta.into(),
                addr: None,
                name: "beta".into(),
                hostname: "beta".into(),
                schedule: None,
                known_since: 1,
                last_report_direct: None,
                errors: 0,
            },
        )]
        .into(),
        timestamp: Some(1),
    });
    let app = app(&writer);
    let response = app
        .oneshot(Request::get("/v1/events").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let mut body = response.into_body();
    let mut next = async || {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .unwrap();
        let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
        let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        serde_json::from_str::<Value>(data).unwrap()
    };
    let first = next().await;
    assert_eq!(
        first["fetch_state"]["state"],
        json!("Prefetching"),
        "{first}"
    );
    assert_eq!(first["errors"], json!({}));

    writer
        .persist_error
        .set(Some("schedule.json: No space left on device".into()));
    let event = next().await;
    assert_eq!(
        event["errors"]["schedule_persist"],
        json!("schedule.json: No space left on device"),
        "{event}"
    );
    assert_eq!(event["num_errors"], json!(1));

    writer.prefetched.set(Prefetched {
        epoch: 2,
        schedules: Vec::new(),
        awaiting: None,
    });
    let event = next().await;
    assert_eq!(
        event["fetch_state"],
        json!({"state": "StableLeader"}),
        "{event}"
    );
}

/// The redirect goes to the leader's port as the peer list gives it (a static list may give
/// each node its own), and to this node's port when the list gives no address.
#[tokio::test]
async fn the_leader_redirect_uses_the_leaders_port_from_the_peer_list() {
    use verwalter_controllers::state::{Peer, Peers};
    let writer = StoreWriter::new(None);
    let peer = |n: u32, addr: Option<&str>| Peer {
        id: format!("77985419c732412ea38b94db{n:08}"),
        addr: addr.map(Into::into),
        name: format!("n{n}.example.com"),
        hostname: format!("n{n}"),
        schedule: None,
        known_since: 1,
        last_report_direct: None,
        errors: 0,
    };
    writer.peers.set(Peers {
        peers: [peer(2, Some("10.0.0.2:9000")), peer(3, None)]
            .into_iter()
            .map(|p| (p.id.clone(), p))
            .collect(),
        timestamp: Some(1),
    });
    let app = app(&writer);
    for (leader, location) in [
        (2, "http://n2.example.com:9000/v1/status"),
        (3, "http://n3.example.com:8379/v1/status"),
    ] {
        writer.election.set(ElectionState {
            is_stable: true,
            leader: Some(format!("77985419c732412ea38b94db{leader:08}")),
            epoch: 1,
            ..Default::default()
        });
        let response = get_with(&app, "/v1/leader-redirect-by-node-name/v1/status", &[]).await;
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(response.headers()["location"], location);
    }
}

const TOKEN: &str = "op3rator-t0ken-for-tests";

/// The app of a node that asks for [`TOKEN`] (and on reads too with `reads`), and its
/// `force_render` generation.
fn with_token(writer: &StoreWriter, reads: bool) -> (Router, Arc<Field<u64>>) {
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(writer, no_frontends, "common");
    let force_render = state.force_render.clone();
    state.http = Arc::new(HttpState::new(HttpSettings {
        token: Some(
            verwalter_controllers::http::access::Token::from_file_bytes(TOKEN.as_bytes()).unwrap(),
        ),
        token_for_reads: reads,
        ..HttpSettings::default()
    }));
    (router(state), force_render)
}

/// Every path the router serves, its `{placeholders}` filled in, with the `.json` and `.pretty`
/// forms of the `/v1/<name>` routes.
fn every_served_path() -> Vec<String> {
    let mut paths = Vec::new();
    for route in route_paths() {
        let mut path = String::new();
        for (i, part) in route.split('{').enumerate() {
            match part.split_once('}') {
                Some((_, rest)) if i > 0 => path += &format!("x{rest}"),
                _ => path += part,
            }
        }
        if path.starts_with("/v1/") && path.matches('/').count() == 2 {
            paths.push(format!("{path}.json"));
            paths.push(format!("{path}.pretty"));
        }
        paths.push(path);
    }
    paths.push("/v1/not-a-route".into());
    paths
}

async fn assert_401(response: axum::response::Response, what: &str) -> String {
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
    let challenge = response.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Bearer"), "{what}: {challenge}");
    if what.starts_with("HEAD") {
        return String::new();
    }
    let body: Value = serde_json::from_str(&body_text(response).await).unwrap();
    let error = body["error"].as_str().expect("a JSON error").to_string();
    assert!(!error.contains(TOKEN), "{what}: {error}");
    error
}

/// Walks the router: every route, and any other, refuses every method but GET, HEAD and
/// OPTIONS without the token, so a write route added later is covered without a line here.
#[tokio::test]
async fn with_a_token_file_nothing_but_a_read_passes_without_the_token() {
    let writer = StoreWriter::new(None);
    let (app, force_render) = with_token(&writer, false);
    let wrong = ("authorization", "Bearer not-the-0perator-token");
    for path in every_served_path() {
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            if method == "POST" && path == verwalter_controllers::http::access::DC_EXCHANGE_PATH {
                continue; // signed with the election key instead (below)
            }
            let what = format!("{method} {path}");
            let json = ("content-type", "application/json");
            let error = assert_401(send(&app, method, &path, &[json]).await, &what).await;
            assert!(error.contains("Authorization: Bearer"), "{what}: {error}");
            let error = assert_401(send(&app, method, &path, &[json, wrong]).await, &what).await;
            assert!(error.contains("not this node's"), "{what}: {error}");
        }
    }
    assert_eq!(*force_render.get(), 0, "nothing re-rendered");
    // Other DCs' leaders do not have the token: the exchange answers for itself (here: this
    // node is in no DC).
    let exchange = verwalter_controllers::http::access::DC_EXCHANGE_PATH;
    let json = ("content-type", "application/json");
    let response = send(&app, "POST", exchange, &[json]).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // With the token, the write routes answer for themselves.
    let bearer = format!("Bearer {TOKEN}");
    let auth = ("authorization", bearer.as_str());
    let response = send(&app, "POST", "/v1/force_render_all", &[auth]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(*force_render.get(), 1, "re-rendered");
    let json = ("content-type", "application/json");
    for path in ["/v1/action", "/v1/wait_action"] {
        let response = send(&app, "POST", path, &[auth, json]).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
        let body = body_text(response).await;
        assert!(body.contains("not JSON"), "{path}: past the token: {body}");
    }
    // The Host/Origin checks still come first.
    let cross = ("origin", "http://evil.example.net");
    let response = send(
        &app,
        "POST",
        "/v1/force_render_all",
        &[auth, cross, ("host", "alpha")],
    )
    .await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);

    // Reads stay open by default, the frontend's files always.
    for path in [
        "/v1/status",
        "/v1/peers",
        "/metrics",
        "/",
        "/common/app.js",
        "/roles/web",
    ] {
        let (status, _, body) = get(&app, path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
}

#[tokio::test]
async fn token_for_reads_closes_the_api_and_metrics_but_not_the_page() {
    let writer = StoreWriter::new(None);
    let (app, _) = with_token(&writer, true);
    let bearer = format!("Bearer {TOKEN}");
    let auth = ("authorization", bearer.as_str());
    for path in [
        "/v1/status",
        "/v1/status.pretty",
        "/v1/events",
        "/v1/peers",
        "/metrics",
    ] {
        assert_401(send(&app, "GET", path, &[]).await, path).await;
        assert_401(send(&app, "HEAD", path, &[]).await, &format!("HEAD {path}")).await;
        let wrong = ("authorization", "Bearer op3rator-t0ken-for-test");
        assert_401(send(&app, "GET", path, &[wrong]).await, path).await;
    }
    for path in ["/v1/status", "/v1/peers", "/metrics"] {
        let response = send(&app, "GET", path, &[auth]).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    for path in [
        "/",
        "/common/app.js",
        "/common/js/api.js",
        "/roles/web",
        "/v1/graphiql",
    ] {
        let (status, _, body) = get(&app, path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let query = r#"{"query": "{ status { id } }"}"#;
    let response = post_json(&app, "/v1/graphql", query, &[]).await;
    assert_401(response, "POST /v1/graphql").await;
    let response = post_json(&app, "/v1/graphql", query, &[auth]).await;
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn without_a_token_file_no_token_is_asked() {
    let writer = StoreWriter::new(None);
    let app = app(&writer);
    let response = send(&app, "POST", "/v1/force_render_all", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let stray = ("authorization", "Bearer anything-at-all-here");
    let response = send(&app, "POST", "/v1/force_render_all", &[stray]).await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "a token sent anyway is ignored"
    );
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Peers of this version take the schedule LZ4-compressed, a client that takes gzip gets gzip;
/// a client that asks for neither (verwalter 0.13, curl) gets the same plain JSON as before.
/// All are counted by encoding.
#[tokio::test]
async fn the_schedule_is_compressed_for_a_client_that_takes_it() {
    let writer = StoreWriter::new(None);
    let app = app(&writer);
    let services: serde_json::Map<String, Value> = (0..200)
        .map(|i| {
            (
                format!("service-{i}"),
                json!({"version": "v1", "instances": 3}),
            )
        })
        .collect();
    let schedule = Schedule::new(json!({"services": services}), 1, "leader".into());
    writer.schedule.set(Some(schedule.clone()));
    let plain = serde_json::to_vec(&schedule).unwrap();

    for path in [
        "/v1/schedule".to_string(),
        format!("/v1/schedule/{}", schedule.hash),
    ] {
        for accept in ["gzip", "deflate, gzip;q=0.5", "*"] {
            let response = get_with(&app, &path, &[("accept-encoding", accept)]).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()["content-encoding"], "gzip", "{accept}");
            assert_eq!(response.headers()["vary"], "accept-encoding");
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            assert!(
                body.len() * 4 < plain.len(),
                "{} of {}",
                body.len(),
                plain.len()
            );
            assert_eq!(gunzip(&body), plain, "{path} {accept}");
        }
        for accept in ["x-verwalter-lz4, gzip", "gzip;q=0.5, X-Verwalter-LZ4"] {
            let response = get_with(&app, &path, &[("accept-encoding", accept)]).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()["content-encoding"], "x-verwalter-lz4");
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            assert!(body.len() * 4 < plain.len(), "{}", body.len());
            let decoded = crate::cluster::coding::Coding::Lz4
                .decode(body, 1 << 20)
                .unwrap();
            assert_eq!(decoded, plain, "{path} {accept}");
        }
        for accept in [None, Some("identity"), Some("gzip;q=0"), Some("br")] {
            let headers: Vec<(&str, &str)> =
                accept.iter().map(|a| ("accept-encoding", *a)).collect();
            let response = get_with(&app, &path, &headers).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert!(
                response.headers().get("content-encoding").is_none(),
                "{accept:?}"
            );
            assert_eq!(body_text(response).await.as_bytes(), plain, "{accept:?}");
        }
    }
    let (_, _, text) = get(&app, "/metrics").await;
    assert!(
        text.contains("verwalter_schedules_served_total{encoding=\"gzip\"} 6"),
        "{text}"
    );
    assert!(
        text.contains("verwalter_schedules_served_total{encoding=\"identity\"} 8"),
        "{text}"
    );
    assert!(
        text.contains("verwalter_schedules_served_total{encoding=\"x-verwalter-lz4\"} 4"),
        "{text}"
    );
    let identity_bytes = format!(
        "verwalter_schedule_served_bytes_total{{encoding=\"identity\"}} {}",
        plain.len() * 8
    );
    assert!(text.contains(&identity_bytes), "{text}");
}

/// A store whose node follows `leader`, which announces `announced` (if any) in its pings.
fn following_announcing(leader: &str, announced: Option<&Schedule>) -> StoreWriter {
    let writer = StoreWriter::new(None);
    writer.election.set(ElectionState {
        is_stable: true,
        leader: Some(leader.into()),
        epoch: 3,
        ..Default::default()
    });
    let mut reports = verwalter_controllers::state::Reports::new();
    reports.insert(
        leader.into(),
        verwalter_controllers::state::Report {
            schedule: announced.map(Schedule::stamp),
            errors: 0,
            epoch: 3,
        },
    );
    writer.reports.set(reports);
    writer
}

const LEADER: &str = "77985419c732412ea38b94db000000aa";

/// A follower asking this node (its relay) for the leader's newest schedule waits for it to
/// arrive here instead of being told 404 a moment too early.
#[tokio::test(start_paused = true)]
async fn a_relay_holds_the_request_until_the_announced_schedule_arrives() {
    let next = Schedule::new(json!({"n": 2}), 2, LEADER.into());
    let writer = following_announcing(LEADER, Some(&next));
    let app = app(&writer);
    let path = format!("/v1/schedule/{}?wait_ms=2000", next.hash);
    let started = tokio::time::Instant::now();
    let waiting = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "GET", &path, &[]).await }
    });
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished(), "answered before the schedule came");
    writer.schedule.set(Some(next.clone()));
    let response = waiting.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let served: Schedule = serde_json::from_str(&body_text(response).await).unwrap();
    assert_eq!(served.hash, next.hash);
    assert!(started.elapsed() < RELAY_WAIT_MAX);

    // Without `wait_ms` (verwalter 0.13's request) a missing hash is 404 at once.
    let other = Schedule::new(json!({"n": 3}), 3, LEADER.into());
    let (status, _, _) = get(&app, &format!("/v1/schedule/{}", other.hash)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A relay waits the whole `wait_ms` (capped) for a schedule its leader announces, but only
/// a short while for one it does not know of: cut off from the leader, it must send the
/// follower to the leader soon.
#[tokio::test(start_paused = true)]
async fn a_relay_gives_up_soon_on_a_schedule_its_leader_does_not_announce() {
    let next = Schedule::new(json!({"n": 2}), 2, LEADER.into());
    for (announced, waited) in [
        (Some(&next), RELAY_WAIT_MAX),
        (None, api::RELAY_UNANNOUNCED_WAIT),
    ] {
        let writer = following_announcing(LEADER, announced);
        let app = app(&writer);
        let started = tokio::time::Instant::now();
        let path = format!("/v1/schedule/{}?wait_ms=60000", next.hash);
        let (status, _, body) = get(&app, &path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(
            started.elapsed(),
            waited,
            "announced: {}",
            announced.is_some()
        );
    }
}

/// A follower passes the leader's schedule on to the followers fetching through it as soon as
/// it has arrived (`RelayBody`), compressed as it came, before taking it itself.
#[tokio::test(start_paused = true)]
async fn a_relay_passes_on_the_body_it_received_before_taking_it() {
    let next = Schedule::new(json!({"n": 2}), 2, LEADER.into());
    let writer = following_announcing(LEADER, Some(&next));
    let relay = Arc::new(RelayBody::default());
    let mut state = app_state(
        &writer,
        std::env::temp_dir().join("verwalter-http-tests-no-frontends"),
        "common",
    );
    state.http = Arc::new(HttpState::default().with_relay(relay.clone()));
    let app = router(state);
    let path = format!("/v1/schedule/{}?wait_ms=2000", next.hash);
    let waiting = tokio::spawn({
        let app = app.clone();
        let path = path.clone();
        async move { get_with(&app, &path, &[("accept-encoding", "gzip")]).await }
    });
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished());
    let wire: axum::body::Bytes = b"the gzip bytes as they came".to_vec().into();
    relay.offer(&next.hash, Coding::Gzip, wire.clone());
    let response = waiting.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-encoding"], "gzip");
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(body, wire, "the very bytes, not re-encoded");
    // A body that came LZ4-compressed goes to peers that take that, as it came; a client that
    // takes gzip only waits for the schedule to be taken here.
    let wire: axum::body::Bytes = b"the lz4 bytes as they came".to_vec().into();
    relay.offer(&next.hash, Coding::Lz4, wire.clone());
    let accepted = [("accept-encoding", crate::cluster::coding::ACCEPTED)];
    let response = get_with(&app, &path, &accepted).await;
    assert_eq!(response.headers()["content-encoding"], "x-verwalter-lz4");
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(body, wire);
    let gzip_only = get_with(&app, &path, &[("accept-encoding", "gzip")]).await;
    assert_eq!(gzip_only.status(), StatusCode::NOT_FOUND);
    // So does a client that takes no compression.
    let (status, _, _) = get(&app, &path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
