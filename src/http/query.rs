//! `POST /v1/query/<path>`: answered by `scheduler/v1/query.wasm`'s `query` (verwalter 0.13.0),
//! on the instance `init`ed with the schedule in force (shared with rendering, [`QueryHook`](crate::schedule::wasm::query::QueryHook)). Without a `query.wasm` (the compat derivation) the
//! answer is a 500 saying so, as in 0.13.

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;

/// The largest query body read (0.13 took at most 64 KiB of JSON).
const BODY_LIMIT: usize = 64 << 10;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

pub async fn query(
    State(state): State<AppState>,
    UrlPath(path): UrlPath<String>,
    request: Request,
) -> Response {
    let json_type = super::sends_json(request.headers());
    if !json_type {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the query as Content-Type: application/json",
        );
    }
    let bytes = match axum::body::to_bytes(request.into_body(), BODY_LIMIT).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a query body is at most {BODY_LIMIT} bytes of JSON"),
            );
        }
    };
    let body: Value = match serde_json::from_slice(&bytes) {
        Ok(body) => body,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            );
        }
    };
    if !state.query.present() {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no query interface: the config dir has no scheduler/v1/query.wasm, and the default \
             (compat) role derivation answers no queries",
        );
    }
    let schedule = state.store.schedule.peek();
    let Some(schedule) = schedule.as_ref().clone() else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no schedule yet");
    };
    let hostname = state.node.hostname.clone();
    let hook = state.query.clone();
    // The module runs off the async runtime; its time budget bounds the call. It is the
    // render controller's instance, `init`ed once per schedule.
    let answer = tokio::task::spawn_blocking(move || {
        hook.with_module(&schedule, &hostname, |module| module.query(&path, &body))
    })
    .await;
    match answer {
        Ok(Ok(value)) => axum::Json(value).into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.message),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the query did not finish: {e}"),
        ),
    }
}
