//! Files from log dirs and backups are sent as types no browser runs on this origin (issue 28).

use super::*;

/// Whether `response` is a file a browser shows inert: `content_type`, `nosniff`, a sandbox.
fn assert_inert(response: &axum::response::Response, content_type: &str, what: &str) {
    let headers = response.headers();
    if response.status().is_success() {
        assert_eq!(headers["content-type"], content_type, "{what}");
    }
    assert_eq!(headers["x-content-type-options"], "nosniff", "{what}");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.split(';').any(|d| d.trim() == "sandbox"),
        "{what}: {csp}"
    );
}

#[tokio::test]
async fn log_files_are_plain_text_whatever_their_name_with_range_and_dates_kept() {
    let external = tempfile::tempdir().unwrap();
    let script = "<html><script>fetch('/v1/status')</script></html>";
    std::fs::write(external.path().join("report.html"), script).unwrap();
    std::fs::write(
        external.path().join("chart.svg"),
        "<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>",
    )
    .unwrap();
    std::fs::write(external.path().join("app.log"), "0123456789").unwrap();
    let log_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(log_dir.path().join("web")).unwrap();
    std::fs::write(log_dir.path().join("web/latest.html"), script).unwrap();
    std::fs::create_dir_all(log_dir.path().join(".global")).unwrap();
    std::fs::write(log_dir.path().join(".global/x.svg"), script).unwrap();

    let writer = StoreWriter::new(None);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.log_dirs = Arc::new([("app".to_string(), external.path().to_path_buf())].into());
    state.logs = Some(crate::storage::logs::LogDir::open(
        log_dir.path(),
        Default::default(),
    ));
    let app = router(state);

    let text = "text/plain; charset=utf-8";
    for path in [
        "/v1/log/external/app/report.html",
        "/v1/log/external/app/chart.svg",
        "/v1/log/external/app/app.log",
        "/v1/log/role/web/latest.html",
        "/v1/log/global/x.svg",
        // No index yet: an empty 200, inert too.
        "/v1/log/index/latest",
    ] {
        let response = get_with(&app, path, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_inert(&response, text, path);
    }
    let response = get_with(&app, "/v1/log/external/app/report.html", &[]).await;
    assert_eq!(body_text(response).await, script, "sent as it is");

    // Range and If-Modified-Since work as before.
    let response = get_with(
        &app,
        "/v1/log/external/app/app.log",
        &[("range", "bytes=-3")],
    )
    .await;
    assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT);
    assert_inert(&response, text, "a range");
    assert_eq!(body_text(response).await, "789");
    let response = get_with(&app, "/v1/log/external/app/app.log", &[]).await;
    let modified = response.headers()["last-modified"]
        .to_str()
        .unwrap()
        .to_string();
    let response = get_with(
        &app,
        "/v1/log/external/app/app.log",
        &[("if-modified-since", &modified)],
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    assert_inert(&response, text, "not modified");
}

#[tokio::test]
async fn backups_stay_gzipped_json_and_inert() {
    let backups = tempfile::tempdir().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, b"{\"data\": {}}").unwrap();
    std::fs::write(backups.path().join("daily-20261122"), gz.finish().unwrap()).unwrap();
    let writer = StoreWriter::new(None);
    let no_frontends = std::env::temp_dir().join("verwalter-http-tests-no-frontends");
    let mut state = app_state(&writer, no_frontends, "common");
    state.backups_dir = backups.path().to_path_buf();
    let app = router(state);
    let response = get_with(&app, "/v1/backup/daily-20261122", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-encoding"], "gzip");
    assert_inert(&response, "application/json", "a backup");
}

/// The headers every response carries (issue 28: the frontend could be framed by another site
/// and its buttons clickjacked).
fn assert_guarded(response: &axum::response::Response, what: &str) -> String {
    let headers = response.headers();
    assert_eq!(headers["x-frame-options"], "DENY", "{what}");
    assert_eq!(headers["x-content-type-options"], "nosniff", "{what}");
    assert_eq!(headers["referrer-policy"], "same-origin", "{what}");
    let csp = headers["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("frame-ancestors 'none'"), "{what}: {csp}");
    csp
}

#[tokio::test]
async fn every_response_forbids_framing_and_sniffing_and_pages_load_only_their_own() {
    let (_tmp, frontends) = ops_frontend(&[("index.html", "<p>ops</p>"), ("js/x.js", "1")]);
    let log_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(log_dir.path().join("web")).unwrap();
    std::fs::write(log_dir.path().join("web/latest"), "applied\n").unwrap();
    let writer = leading(1);
    let mut state = app_state(&writer, frontends, "common");
    state.logs = Some(crate::storage::logs::LogDir::open(
        log_dir.path(),
        Default::default(),
    ));
    let app = router(state);

    // The built-in frontend and the API: the page policy.
    for path in [
        "/",
        "/roles/web",
        "/~common/logs",
        "/common/app.js",
        "/common/app.css",
        "/v1/status",
        "/v1/status.pretty",
        "/v1/schedule",
        "/v1/peers.json",
        "/metrics",
        "/v1/nope",
    ] {
        let response = get_with(&app, path, &[]).await;
        let csp = assert_guarded(&response, path);
        assert_eq!(csp, PAGE_POLICY, "{path}");
        for directive in ["default-src 'self'", "object-src 'none'", "base-uri 'none'"] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
    }
    // Refusals too.
    let response = get_with(&app, "/v1/status", &[("host", "evil.example.net")]).await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_guarded(&response, "a foreign Host");
    // Log files keep their sandbox, an alternative frontend only the frame rule; the query
    // page is the frontend's and has its policy.
    let response = get_with(&app, "/v1/log/role/web/latest", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(assert_guarded(&response, "a log").starts_with("sandbox"));
    let response = get_with(&app, "/v1/graphiql", &[]).await;
    let csp = assert_guarded(&response, "/v1/graphiql");
    assert_eq!(csp, PAGE_POLICY);
    for path in ["/~ops/", "/~ops/js/x.js"] {
        let response = get_with(&app, path, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(assert_guarded(&response, path), FRAME_POLICY, "{path}");
    }
}
