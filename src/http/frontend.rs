//! The web frontends: the built-in one (`frontend/` in the source tree, embedded in the binary)
//! and alternative ones from `<config-dir>/frontend/<name>/`, routed as verwalter 0.13 did:
//!
//! - `/common/<file>`: a file of the built-in frontend;
//! - `/~<name>/{js,css,fonts,img,files}/<path>`: a file of frontend `<name>`; any other
//!   `/~<name>/...`: its `index.html` (the page routes itself);
//! - `/` and every other path outside `/v1/` and `/metrics`: the `index.html` of the default
//!   frontend (`--default-frontend`, `common` unless set).
//!
//! The built-in frontend runs under the router's Content-Security-Policy (`PAGE_POLICY` in
//! `mod.rs`: its own scripts and styles only, nothing inline); an alternative frontend's files
//! under `FRAME_POLICY` only (the operator's files may load what they like, but no other site
//! may frame them).
//!
//! Built-in files are sent with an `ETag` (a hash of their content) and `Cache-Control: no-cache`,
//! so a browser revalidates with one cheap request and never runs a stale page after an upgrade;
//! gzipped when the client takes it (compressed once, at first use).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha1::{Digest, Sha1};
use tower::ServiceExt;
use tower_http::services::ServeFile;

use super::files::inside;
use super::{ApiError, AppState};
use crate::config::{BUILTIN_FRONTEND, is_frontend_name};

/// One file of the built-in frontend.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
    gzip: Vec<u8>,
    /// Tags of the plain and the gzipped body: two representations, two tags.
    etag: String,
    etag_gzip: String,
}

macro_rules! embed {
    ($name:literal, $type:expr) => {
        (
            $name,
            $type,
            include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/frontend/", $name)).as_slice(),
        )
    };
}

/// Every file of `frontend/`; `index.html` is the page, the rest are under `/common/` (a module
/// in `frontend/js/pages/x.js` at `/common/js/pages/x.js`). Modules must be sent as JavaScript:
/// browsers refuse to run a module of another type. `tests/frontend.rs` follows every import of
/// the page and fails on one missing here.
const FILES: &[(&str, &str, &[u8])] = &[
    embed!("index.html", "text/html; charset=utf-8"),
    embed!("app.css", "text/css; charset=utf-8"),
    embed!("favicon.svg", "image/svg+xml"),
    embed!("app.js", JS),
    embed!("js/actions.js", JS),
    embed!("js/boot.js", JS),
    embed!("js/api.js", JS),
    embed!("js/dom.js", JS),
    embed!("js/header.js", JS),
    embed!("js/logindex.js", JS),
    embed!("js/notices.js", JS),
    embed!("js/parts.js", JS),
    embed!("js/router.js", JS),
    embed!("js/state.js", JS),
    embed!("js/stream.js", JS),
    embed!("js/token.js", JS),
    embed!("js/pages/api-links.js", JS),
    embed!("js/pages/backups.js", JS),
    embed!("js/pages/datacenters.js", JS),
    embed!("js/pages/graphql.js", JS),
    embed!("js/pages/logs.js", JS),
    embed!("js/pages/nodes.js", JS),
    embed!("js/pages/overview.js", JS),
    embed!("js/pages/roles.js", JS),
    embed!("js/pages/schedule.js", JS),
    embed!("js/pages/scheduler.js", JS),
    embed!("js/pages/shadow.js", JS),
    embed!("js/pages/tail.js", JS),
];

const JS: &str = "text/javascript; charset=utf-8";

static ASSETS: LazyLock<Vec<Asset>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|&(name, content_type, bytes)| {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            encoder.write_all(bytes).expect("gzip into memory");
            let gzip = encoder.finish().expect("gzip into memory");
            let digest = hex::encode(&Sha1::digest(bytes)[..10]);
            Asset {
                name,
                content_type,
                bytes,
                gzip,
                etag: format!("\"{digest}\""),
                etag_gzip: format!("\"{digest}-gz\""),
            }
        })
        .collect()
});

fn builtin(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

fn send(asset: &Asset, headers: &HeaderMap) -> Response {
    let gzip = accepts_gzip(headers);
    let etag = if gzip { &asset.etag_gzip } else { &asset.etag };
    let mut response = if none_match(headers, etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else if gzip {
        let mut response = Body::from(asset.gzip.clone()).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        response
    } else {
        Body::from(asset.bytes).into_response()
    };
    let out = response.headers_mut();
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    out.insert(
        header::ETAG,
        HeaderValue::from_str(etag).expect("hex is a valid header"),
    );
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    out.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    response
}

/// Whether `If-None-Match` lists `etag` (weakly compared, as RFC 9110 asks for this header) or
/// is `*`.
fn none_match(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim())
        .any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag)
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

/// `/`: the default frontend's page.
pub(crate) async fn index(State(state): State<AppState>, request: Request) -> Response {
    let name = state.node.default_frontend.clone();
    page(&state, &name, request).await
}

/// The built-in frontend's `index.html`, whichever frontend is the default (`/v1/graphiql`).
pub(super) fn builtin_page(headers: &HeaderMap) -> Response {
    send(
        builtin("index.html").expect("index.html is embedded"),
        headers,
    )
}

/// `/common/<file>`: a file of the built-in frontend.
pub(crate) async fn asset(UrlPath(file): UrlPath<String>, headers: HeaderMap) -> Response {
    match builtin(&file).filter(|a| a.name != "index.html") {
        Some(asset) => send(asset, &headers),
        None => not_found(&format!("/common/{file}")),
    }
}

/// Everything no route took: `/~<name>/...` and the default frontend's page.
pub(crate) async fn fallback(State(state): State<AppState>, request: Request) -> Response {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return not_found(request.uri().path());
    }
    let path = request.uri().path().to_string();
    let Some(tail) = path.strip_prefix("/~") else {
        let name = state.node.default_frontend.clone();
        return page(&state, &name, request).await;
    };
    let (name, rest) = tail.split_once('/').unwrap_or((tail, ""));
    if !is_frontend_name(name) {
        return not_found(&path);
    }
    let static_dir = rest
        .split('/')
        .next()
        .is_some_and(|first| matches!(first, "js" | "css" | "fonts" | "img" | "files"));
    if name == BUILTIN_FRONTEND || !static_dir {
        return page(&state, name, request).await;
    }
    // Percent-decoding is left to no one: a name with `%` simply does not exist on disk.
    let dir = state.frontend_dir.join(name);
    match inside(&dir, rest) {
        Ok(file) => serve_file(&dir, file, request).await,
        Err(e) => e.into_response(),
    }
}

/// The `index.html` of frontend `name`.
async fn page(state: &AppState, name: &str, request: Request) -> Response {
    if name == BUILTIN_FRONTEND {
        let asset = builtin("index.html").expect("index.html is embedded");
        return send(asset, request.headers());
    }
    let dir = state.frontend_dir.join(name);
    match inside(&dir, "index.html") {
        Ok(file) => serve_file(&dir, file, request).await,
        Err(_) => ApiError::not_found(format!(
            "no frontend {name:?}: {} is missing",
            state.frontend_dir.join(name).join("index.html").display()
        ))
        .into_response(),
    }
}

/// A file of an alternative frontend (resolved inside `dir`), with `Last-Modified` and `Range`;
/// a `.gz` beside it is sent instead when the client takes gzip (as 0.13 did), if that too stays
/// inside `dir` once symlinks are resolved.
async fn serve_file(dir: &Path, file: PathBuf, mut request: Request) -> Response {
    if let Ok(meta) = std::fs::metadata(&file) {
        super::files::normalize_range(&mut request, meta.len());
    }
    let mut gz = file.clone().into_os_string();
    gz.push(".gz");
    let gz_inside = crate::machinery::paths::Boundary::new(dir)
        .is_ok_and(|b| b.resolve(Path::new(&gz)).is_ok());
    let service = if gz_inside {
        ServeFile::new(file).precompressed_gzip()
    } else {
        ServeFile::new(file)
    };
    match service.oneshot(request).await {
        Ok(response) => {
            let mut response = response.into_response();
            response.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(super::FRAME_POLICY),
            );
            response
        }
        Err(e) => ApiError::internal(e.to_string()).into_response(),
    }
}

fn not_found(path: &str) -> Response {
    (StatusCode::NOT_FOUND, format!("404 Not Found: {path}\n")).into_response()
}
