//! The extender's router without a socket, the algorithm choice, and HTTPS on a real socket.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::Request;
use tower::ServiceExt;
use verwalter_placement::{Dim, Kind, Snapshot};

use super::*;

fn extender() -> Arc<Extender> {
    let algorithm = Algorithm::new(Kind::Fit {
        cpu_scale_factor: 1.0,
    });
    Arc::new(Extender::new(
        "fit".into(),
        algorithm,
        wire::default_namespaces(),
        SnapshotStore::new(),
    ))
}

fn snapshot() -> Snapshot {
    let mut s = Snapshot::default();
    s.node_capacities.insert(
        "n1".into(),
        BTreeMap::from([(Dim::Cpu, 4.0), (Dim::Mem, 16.0)]),
    );
    s.apps_spec
        .insert("web".into(), BTreeMap::from([(Dim::Cpu, 1.0)]));
    s
}

async fn call(state: &Arc<Extender>, method: &str, path: &str, body: &str) -> (u16, String) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = router(state.clone()).oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

const WEB: &str = r#"{"Pod": {"metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}}}, "NodeNames": ["n1"]}"#;

#[tokio::test]
async fn a_bad_body_is_a_400_naming_the_field() {
    let state = extender();
    let (code, body) = call(
        &state,
        "POST",
        "/filter",
        r#"{"Pod": {"metadata": {"namespace": 3}}}"#,
    )
    .await;
    assert_eq!(code, 400);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["field"], "Pod.metadata.namespace");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("Pod.metadata.namespace: invalid type: integer `3`"),
        "{body}"
    );
    let (code, _) = call(&state, "POST", "/prioritize", "not json").await;
    assert_eq!(code, 400);
    let metrics = state.metrics.render(&state.store);
    assert!(
        metrics
            .contains(r#"verwalter_extender_requests_total{result="bad_request",verb="filter"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn status_and_metrics_follow_the_store() {
    let state = extender();
    let (code, body) = call(&state, "GET", "/status", "").await;
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["loaded"], false);
    assert_eq!(status["algorithm"], "fit");
    assert_eq!(status["namespaces"], serde_json::json!(["default"]));
    let (_, body) = call(&state, "POST", "/filter", WEB).await;
    assert!(body.contains(wire::NOT_LOADED), "{body}");

    state.store.publish("test", snapshot());
    state.store.report_error("other", "timeout".into());
    let (_, body) = call(&state, "GET", "/status", "").await;
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["loaded"], true);
    assert_eq!(
        (status["nodes"].as_u64(), status["apps"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(status["generation"], 1);
    assert_eq!(status["errors"]["other"]["message"], "timeout");
    let (_, body) = call(&state, "POST", "/filter", WEB).await;
    assert_eq!(
        body,
        r#"{"Nodes":null,"NodeNames":["n1"],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}"#
    );

    let (code, text) = call(&state, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    for line in [
        r#"verwalter_extender_requests_total{result="decided",verb="filter"} 1"#,
        r#"verwalter_extender_requests_total{result="not_loaded",verb="filter"} 1"#,
        r#"verwalter_extender_request_duration_seconds_count{verb="filter"} 2"#,
        r#"verwalter_placement_node_capacity{node="n1",resource="cpu"} 4"#,
        r#"verwalter_placement_node_free{node="n1",resource="mem"} 16"#,
        r#"verwalter_placement_app_requested{app="web",resource="cpu"} 1"#,
        r#"verwalter_placement_source_failing{source="other"} 1"#,
        "verwalter_placement_snapshot_loaded 1",
        "verwalter_placement_snapshot_generation 1",
    ] {
        assert!(text.contains(line), "{line} missing in:\n{text}");
    }
    // A new snapshot replaces the per-node series: a node that left has none.
    let mut next = snapshot();
    next.node_capacities.clear();
    state.store.publish("test", next);
    let text = state.metrics.render(&state.store);
    assert!(!text.contains(r#"node="n1""#), "{text}");
}

#[test]
fn the_algorithm_is_the_one_named_by_name_or_alias_or_the_only_one() {
    let algorithms = verwalter_placement::config::load(
        "algorithms:\n  a: !Fit\n  b: !BAR {alias: balanced}\n",
        |_| None,
    )
    .unwrap();
    assert_eq!(choose(&algorithms, Some("a")).unwrap().0, "a");
    assert_eq!(choose(&algorithms, Some("balanced")).unwrap().0, "b");
    assert_eq!(
        choose(&algorithms, None).unwrap_err(),
        "the config has several algorithms (a, b); pick one with --algorithm"
    );
    assert_eq!(
        choose(&algorithms, Some("c")).unwrap_err(),
        "no algorithm \"c\" (the config has: a, b)"
    );
    let one = verwalter_placement::config::load("algorithms:\n  only: !Fit\n", |_| None).unwrap();
    assert_eq!(choose(&one, None).unwrap().0, "only");
}

#[tokio::test]
async fn https_serves_the_routes_with_the_given_certificate() {
    use rustls::pki_types::ServerName;
    let tmp = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert_path, key_path) = (tmp.path().join("tls.crt"), tmp.path().join("tls.key"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    let acceptor = tls_acceptor(&cert_path, &key_path).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(
        listener,
        extender(),
        Some(acceptor),
        shutdown.clone(),
    ));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tls.write_all(b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tls.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.contains(r#""loaded":false"#), "{response}");

    // Plain HTTP on the TLS port gets no answer.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got).await;
    assert!(!String::from_utf8_lossy(&got).contains("200 OK"));

    shutdown.cancel();
    server.await.unwrap();
}

#[test]
fn bad_tls_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let err = tls_acceptor(&empty, &empty).err().unwrap().to_string();
    assert!(err.contains("empty.pem: no certificate in it"), "{err}");
    let err = tls_acceptor(&tmp.path().join("missing.pem"), &empty)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("missing.pem"), "{err}");
}

/// docs/openapi-extender.yaml describes exactly the routes the router answers.
#[tokio::test]
async fn every_route_is_in_the_openapi_description() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi-extender.yaml"),
    )
    .unwrap();
    let doc: serde_json::Value = serde_norway::from_str(&text).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    let documented: Vec<(&str, &str)> = paths
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (path.as_str(), m.as_str()))
        })
        .collect();
    let served: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(method, path, _)| (path.to_string(), method.to_lowercase()))
        .collect();
    let mut sorted_doc: Vec<(String, String)> = documented
        .iter()
        .map(|(p, m)| (p.to_string(), m.to_string()))
        .collect();
    sorted_doc.sort();
    let mut sorted_served = served.clone();
    sorted_served.sort();
    assert_eq!(sorted_doc, sorted_served);
    let state = extender();
    state.store.publish("test", snapshot());
    for (path, method) in &served {
        let (code, _) = call(&state, &method.to_uppercase(), path, WEB).await;
        assert_eq!(code, 200, "{method} {path}");
    }
    // `GET /` names every route.
    let (_, index) = call(&state, "GET", "/", "").await;
    let index: serde_json::Value = serde_json::from_str(&index).unwrap();
    let listed: Vec<(String, String)> = index["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_owned(),
                r["method"].as_str().unwrap().to_lowercase(),
            )
        })
        .collect();
    assert_eq!(listed, served);
    let (code, _) = call(&state, "GET", "/v1/status", "").await;
    assert_eq!(code, 404, "nothing else is served");
}

/// `/readyz` is 503 with the reason (and each failing source's error) until a snapshot is
/// loaded, then 200, and stays 200 when a source fails later (the last good snapshot is in
/// force); `/healthz` is 200 throughout.
#[tokio::test]
async fn readyz_waits_for_the_first_snapshot_and_healthz_answers_throughout() {
    let state = extender();
    let (code, body) = call(&state, "GET", "/readyz", "").await;
    assert_eq!(code, 503);
    assert_eq!(
        body,
        "not ready: the placement data is not loaded yet (no snapshot from the data sources so \
         far)\n"
    );
    assert_eq!(
        call(&state, "GET", "/healthz", "").await,
        (200, "ok\n".into())
    );
    state
        .store
        .report_error("prometheus", "connection refused".into());
    let (code, body) = call(&state, "GET", "/readyz", "").await;
    assert_eq!(code, 503);
    assert!(
        body.ends_with("\nprometheus: connection refused\n"),
        "{body}"
    );
    state.store.publish("prometheus", snapshot());
    assert_eq!(
        call(&state, "GET", "/readyz", "").await,
        (200, "ok\n".into())
    );
    state.store.report_error("prometheus", "timeout".into());
    assert_eq!(
        call(&state, "GET", "/readyz", "").await,
        (200, "ok\n".into())
    );
    assert_eq!(
        call(&state, "GET", "/healthz", "").await,
        (200, "ok\n".into())
    );
}

#[tokio::test]
async fn status_shows_what_scores_reschedule_would_move() {
    use verwalter_placement::{Assigned, NodeFacts, NodeType};
    let state = Arc::new(Extender::new(
        "score".into(),
        Algorithm::new(Kind::Score {
            cpu_scale_factor: 1.0,
            threshold: 0.97,
            score_target: None,
            strict_mode_placement: false,
        }),
        wire::default_namespaces(),
        SnapshotStore::new(),
    ));
    let (_, body) = call(&state, "GET", "/status", "").await;
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["reschedule"], serde_json::json!([]), "{body}");

    // Three app profiles: `a` (the lowest) belongs on PMEM, but runs on the DRAM node.
    let mut snap = Snapshot::default();
    for (node, kind) in [("p1", NodeType::Pmem), ("d1", NodeType::Dram)] {
        snap.node_capacities.insert(
            node.into(),
            BTreeMap::from([(Dim::Cpu, 10.0), (Dim::Mem, 10.0)]),
        );
        snap.nodes.insert(
            node.into(),
            NodeFacts {
                platform_dram_hit_ratio: Some(0.99),
                node_type: Some(kind),
            },
        );
    }
    for (app, profile) in [("a", 1.0), ("b", 5.0), ("c", 9.0)] {
        snap.app_profiles.insert(app.into(), profile);
        snap.apps_spec.insert(
            app.into(),
            BTreeMap::from([(Dim::Cpu, 1.0), (Dim::Mem, 1.0)]),
        );
    }
    snap.assigned_apps.insert(
        "d1".into(),
        BTreeMap::from([("a".into(), Assigned::Count(1))]),
    );
    state.store.publish("test", snap);
    let (_, body) = call(&state, "GET", "/status", "").await;
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let moves = status["reschedule"].as_array().unwrap();
    assert_eq!(moves.len(), 1, "{body}");
    assert_eq!(moves[0]["app"], "a");
    assert_eq!(moves[0]["node"], "d1");

    let (_, body) = call(&extender(), "GET", "/status", "").await;
    assert!(
        !body.contains("reschedule"),
        "only Score has the hook: {body}"
    );
}

#[test]
fn limits_come_from_the_flags_and_each_bad_one_is_named() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ExtenderFlags,
    }
    let parse = |args: &[&str]| {
        let mut all = vec!["verwalter", "--config", "c.yaml"];
        all.extend_from_slice(args);
        Cli::parse_from(all).flags
    };
    assert_eq!(
        ExtenderLimits::from_flags(&parse(&[]), "--"),
        Ok(ExtenderLimits::default())
    );
    let limits = ExtenderLimits::from_flags(
        &parse(&["--max-body-bytes", "10", "--body-timeout-ms", "5"]),
        "--",
    )
    .unwrap();
    assert_eq!(limits.max_body, 10);
    assert_eq!(limits.body_timeout, Duration::from_millis(5));
    let problems = ExtenderLimits::from_flags(
        &parse(&[
            "--max-connections",
            "0",
            "--body-budget-bytes",
            "100",
            "--max-body-bytes",
            "200",
        ]),
        "placement-extender.",
    )
    .unwrap_err();
    assert!(
        problems.contains("placement-extender.max-connections: must be above 0"),
        "{problems}"
    );
    assert!(
        problems.contains("placement-extender.body-budget-bytes: 100 is below placement-extender.max-body-bytes (200)"),
        "{problems}"
    );
}
