//! Log files and schedule backups over HTTP (verwalter 0.13's routes):
//!
//! - `/v1/log/index/<file>`, `/v1/log/global/<file>`, `/v1/log/changes/<file>`,
//!   `/v1/log/role/<role>/<file>`: the deployment log under `--log-dir`;
//! - `/v1/log/external/<name>/<path>`: a `log-dirs` entry of `sandbox/*.yaml` (403 for an unknown
//!   name);
//! - `/v1/backups` (the names) and `/v1/backup/<name>` (a gzip file, sent with
//!   `Content-Encoding: gzip` and `Content-Type: application/json`, as 0.13 did);
//! - `/v1/wasm/scheduler.wasm`, `/v1/wasm/query.wasm`: the config dir's modules, as
//!   `application/wasm` with no `Content-Encoding` (0.13 sent the backups' gzip and JSON
//!   headers with these raw modules, which made clients fail to decode them).
//!
//! Files are served with `Range`, `If-Modified-Since` and `Last-Modified`, as a type no browser
//! runs (log files as plain text whatever their name), with `nosniff` and a sandboxing CSP
//! ([`inert`]). A path is made of
//! plain components only, and once symlinks are resolved it must still be inside its dir: no way
//! out with `..`, an absolute path or a symlink.

use std::path::{Path, PathBuf};

use axum::Json;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;
use tower_http::services::ServeFile;

use super::{ApiError, AppState};
use crate::machinery::paths::{Boundary, Escape};

/// `rel` joined to `base`, checked: plain components, and inside `base` after symlinks.
pub(super) fn inside(base: &Path, rel: &str) -> Result<PathBuf, ApiError> {
    let boundary = Boundary::new(base)
        .map_err(|_| ApiError::not_found(format!("{} does not exist", base.display())))?;
    let real = match boundary.join_plain(rel) {
        None => {
            return Err(ApiError::not_found(format!(
                "{rel:?} is not a plain relative path"
            )));
        }
        Some(Err(Escape::Unresolved(_))) => {
            return Err(ApiError::not_found(format!("no file {rel}")));
        }
        Some(Err(Escape::Outside(_))) => {
            return Err(ApiError::forbidden(format!("{rel} leads out of its dir")));
        }
        Some(Ok(real)) => real,
    };
    if !real.is_file() {
        return Err(ApiError::not_found(format!("{rel} is not a file")));
    }
    Ok(real)
}

/// What log files are sent as, whatever their name: text a browser shows and never runs.
const LOG_TYPE: &str = "text/plain; charset=utf-8";

/// The file at `path` as `content_type` ([`inert`]).
async fn serve(path: PathBuf, mut request: Request, content_type: &'static str) -> Response {
    if let Ok(meta) = std::fs::metadata(&path) {
        normalize_range(&mut request, meta.len());
    }
    let mut response = match ServeFile::new(path).oneshot(request).await {
        Ok(response) => response.into_response(),
        Err(e) => return ApiError::internal(e.to_string()).into_response(),
    };
    inert(&mut response, content_type);
    response
}

/// Makes a served file inert in a browser: sent as `content_type` (not the type its name
/// suggests: a `report.html` or `.svg` in a log dir would otherwise run its script on this
/// node's origin, where it could read the API and post actions as the frontend does), with
/// `X-Content-Type-Options: nosniff` (no guessing another type from the bytes) and
/// `Content-Security-Policy: sandbox` (opened as a page anyway, it runs no script, has an
/// origin of its own and loads nothing).
fn inert(response: &mut Response, content_type: &'static str) {
    let success = response.status().is_success();
    let headers = response.headers_mut();
    if success {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    // The responses served here come from `ServeFile`, which sets no policy of its own.
    super::no_sniffing(
        headers,
        "sandbox; default-src 'none'; frame-ancestors 'none'",
    );
}

/// Makes `Range` something tower-http answers as RFC 9110 says (14.2):
///
/// - another unit than `bytes`, several ranges, or a ranges-specifier that does not parse: the
///   header is ignored and the whole file sent (tower-http answered 416);
/// - `bytes=-N` asks for the last N bytes; when the file is shorter that is the whole file
///   (14.1.2), but tower-http answers 416. 0.13's log page asks for the last MiB of a usually
///   smaller index, so such a range becomes the whole file.
///
/// A single range that starts past the end is still 416, as it should be. An empty file has no
/// byte to range over: the header is ignored and the (empty) file sent with 200, where
/// tower-http answered `bytes=0-` with a 206 claiming the impossible `bytes 0-0/0`.
pub(super) fn normalize_range(request: &mut Request, len: u64) {
    if len == 0 {
        request.headers_mut().remove(header::RANGE);
        return;
    }
    let Some(value) = request.headers().get(header::RANGE) else {
        return;
    };
    let spec = value.to_str().ok().and_then(|v| {
        let (unit, spec) = v.trim().split_once('=')?;
        unit.trim()
            .eq_ignore_ascii_case("bytes")
            .then(|| spec.trim())
    });
    let number = |s: &str| {
        let s = s.trim();
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let single = spec.filter(|s| !s.contains(',')).and_then(|s| {
        let (first, last) = s.split_once('-')?;
        match (first.trim().is_empty(), last.trim().is_empty()) {
            (true, false) => Some((None, number(last)?)),
            (false, true) => Some((Some(number(first)?), u64::MAX)),
            (false, false) => {
                let (first, last) = (number(first)?, number(last)?);
                (first <= last).then_some((Some(first), last))
            }
            (true, true) => None,
        }
    });
    let rewritten = match single {
        None => None,
        Some((None, suffix)) if suffix >= len || len == 0 => {
            (len > 0).then(|| "bytes=0-".to_string())
        }
        Some((None, suffix)) => Some(format!("bytes=-{suffix}")),
        Some((Some(first), u64::MAX)) => Some(format!("bytes={first}-")),
        Some((Some(first), last)) => Some(format!("bytes={first}-{last}")),
    };
    match rewritten.and_then(|v| HeaderValue::from_str(&v).ok()) {
        Some(value) => {
            request.headers_mut().insert(header::RANGE, value);
        }
        None => {
            request.headers_mut().remove(header::RANGE);
        }
    }
}

fn log_dir(state: &AppState) -> Result<&Path, ApiError> {
    state
        .logs
        .as_ref()
        .map(|l| l.path())
        .ok_or_else(|| ApiError::not_found("no deployment log here"))
}

/// `/v1/log/{index|global|changes}/<file>`.
pub(crate) async fn log_stream(
    State(state): State<AppState>,
    UrlPath((stream, file)): UrlPath<(String, String)>,
    request: Request,
) -> Response {
    let dir = match stream.as_str() {
        "index" => ".index",
        "global" => ".global",
        "changes" => ".changes",
        other => return ApiError::not_found(format!("no log {other:?}")).into_response(),
    };
    let root = match log_dir(&state) {
        Ok(root) => root,
        Err(e) => return e.into_response(),
    };
    // Before the first deployment there is no index: that is an empty one, not a missing file.
    if stream == "index" && file == "latest" && !root.join(".index/latest").exists() {
        let mut response = axum::http::StatusCode::OK.into_response();
        inert(&mut response, LOG_TYPE);
        return response;
    }
    match inside(&root.join(dir), &file) {
        Ok(path) => serve(path, request, LOG_TYPE).await,
        Err(e) => e.into_response(),
    }
}

/// `/v1/log/role/<role>/<file>`.
pub(crate) async fn log_role(
    State(state): State<AppState>,
    UrlPath((role, file)): UrlPath<(String, String)>,
    request: Request,
) -> Response {
    if let Some(why) = verwalter_controllers::render::vars::unsafe_role_name(&role) {
        return ApiError::not_found(format!("role {role:?}: {why}")).into_response();
    }
    match log_dir(&state).and_then(|root| inside(&root.join(&role), &file)) {
        Ok(path) => serve(path, request, LOG_TYPE).await,
        Err(e) => e.into_response(),
    }
}

/// `/v1/log/external/<name>/<path>`.
pub(crate) async fn log_external(
    State(state): State<AppState>,
    UrlPath((name, rel)): UrlPath<(String, String)>,
    request: Request,
) -> Response {
    let Some(base) = state.log_dirs.get(&name) else {
        return ApiError::forbidden(format!("no log dir {name:?} in sandbox/*.yaml"))
            .into_response();
    };
    match inside(base, &rel) {
        Ok(path) => serve(path, request, LOG_TYPE).await,
        Err(e) => e.into_response(),
    }
}

/// `/v1/backups`: backup names, oldest first.
pub(crate) async fn backups(State(state): State<AppState>) -> Result<Json<Vec<String>>, ApiError> {
    crate::storage::backups::list(&state.backups_dir)
        .map(Json)
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// `/v1/backup/<name>`.
pub(crate) async fn backup(
    State(state): State<AppState>,
    UrlPath(name): UrlPath<String>,
    request: Request,
) -> Response {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return ApiError::not_found(format!("{name:?} is not a backup name")).into_response();
    }
    match inside(&state.backups_dir, &name) {
        Ok(path) => {
            let mut response = serve(path, request, "application/json").await;
            response
                .headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            response
        }
        Err(e) => e.into_response(),
    }
}

/// `/v1/wasm/<name>`: `scheduler.wasm` or `query.wasm` of `scheduler/v1`, raw; 404 without it.
pub(crate) async fn wasm_module(
    State(state): State<AppState>,
    UrlPath(name): UrlPath<String>,
    request: Request,
) -> Response {
    if name != crate::schedule::wasm::SCHEDULER_WASM && name != crate::schedule::wasm::QUERY_WASM {
        return ApiError::not_found(format!(
            "no module {name:?}: only {} and {} are served",
            crate::schedule::wasm::SCHEDULER_WASM,
            crate::schedule::wasm::QUERY_WASM
        ))
        .into_response();
    }
    match inside(&state.scheduler_dir, &name) {
        Ok(path) => {
            let mut response = serve(path, request, "application/wasm").await;
            response.headers_mut().remove(header::CONTENT_ENCODING);
            response
        }
        Err(e) if e.status() == axum::http::StatusCode::NOT_FOUND => {
            ApiError::not_found(format!("the config dir has no scheduler/v1/{name}"))
                .into_response()
        }
        Err(e) => e.into_response(),
    }
}
