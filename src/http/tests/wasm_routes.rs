//! `/v1/wasm/<module>` and `/v1/query/<path>`.

use super::*;

fn app_with_scheduler_dir(writer: &StoreWriter, dir: &std::path::Path) -> Router {
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(writer, no_frontends, "common");
    state.scheduler_dir = dir.to_path_buf();
    state.query = crate::schedule::wasm::query::QueryHook::new(
        dir.to_path_buf(),
        crate::schedule::lua::Limits::default().into(),
    );
    router(state)
}

async fn post_json(app: &Router, path: &str, body: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let text = body_text(response).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn modules_are_served_raw_as_application_wasm_and_404_when_absent() {
    let dir = tempfile::tempdir().unwrap();
    let module = b"\0asm\x01\0\0\0 any bytes, served as they are";
    std::fs::write(dir.path().join("scheduler.wasm"), module).unwrap();
    std::fs::write(dir.path().join("main.lua"), "return {}").unwrap();
    let writer = StoreWriter::new(None);
    let app = app_with_scheduler_dir(&writer, dir.path());

    let response = send(&app, "GET", "/v1/wasm/scheduler.wasm", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/wasm");
    // 0.13 claimed gzip here, and clients failed to decode the raw module.
    assert!(response.headers().get("content-encoding").is_none());
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(&body[..], &module[..]);

    let (status, _, body) = get(&app, "/v1/wasm/query.wasm").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("no scheduler/v1/query.wasm"), "{body}");
    // Only the two modules: not the Lua sources beside them, not a way out of the dir.
    for path in ["/v1/wasm/main.lua", "/v1/wasm/..%2F..%2Fetc%2Fpasswd"] {
        let (status, _, _) = get(&app, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn query_without_query_wasm_is_a_500_that_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let writer = StoreWriter::new(None);
    writer
        .schedule
        .set(Some(Schedule::test().with_role("web", "v2").build()));
    let app = app_with_scheduler_dir(&writer, dir.path());
    let (status, body) = post_json(&app, "/v1/query/roles", "{}").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no query interface"),
        "{body}"
    );
}

/// A query.wasm answering every `query` with `{"Ok": {"answer": 42}}`, and `init` with
/// `init_result`.
fn query_wasm(init_result: &str) -> Vec<u8> {
    crate::schedule::wasm::tests::query_module(
        init_result,
        init_result,
        r#"{\"Ok\": {\"answer\": 42}}"#,
    )
}

#[tokio::test]
async fn query_is_answered_by_query_wasm_after_init() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("query.wasm"),
        query_wasm(r#"{\"Ok\": null}"#),
    )
    .unwrap();
    let writer = StoreWriter::new(None);
    let app = app_with_scheduler_dir(&writer, dir.path());
    let (status, body) = post_json(&app, "/v1/query/a/b", r#"{"q": 1}"#).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["error"], "no schedule yet");

    writer
        .schedule
        .set(Some(Schedule::test().with_role("web", "v2").build()));
    let (status, body) = post_json(&app, "/v1/query/a/b", r#"{"q": 1}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"answer": 42}));

    let (status, body) = post_json(&app, "/v1/query/a", "not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // A module whose init fails: its error, as a 500.
    std::fs::write(
        dir.path().join("query.wasm"),
        query_wasm(r#"{\"Err\": {\"kind\": \"Internal\", \"message\": \"no roles\"}}"#),
    )
    .unwrap();
    let (status, body) = post_json(&app, "/v1/query/a", "{}").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body["error"],
        "scheduler/v1/query.wasm: init: Internal: no roles"
    );
}
