//! The action API: `POST /v1/action`, `POST /v1/wait_action`, `GET /v1/pending_actions`,
//! `GET /v1/action_is_pending/<id>` (verwalter 0.13's routes and shapes). Reads requests and
//! turns the queue's results into responses; the rules are the queue's
//! (`verwalter_controllers::actions`).
//!
//! Requests must be `Content-Type: application/json` (a `charset` parameter is fine) with a body
//! of at most 64 KiB; errors are JSON. On a follower, actions are refused with 503 and the
//! leader's address in the body, so a script can retry there (or use
//! `/v1/leader-redirect-by-node-name/v1/action`).

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use verwalter_controllers::actions::{Outcome, RegisterError, Registered, WAIT_LIMIT};

use super::AppState;
use super::api::build_status;

/// Largest action body accepted.
pub const BODY_LIMIT: usize = 64 << 10;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

/// Whether reading a body failed because the client stopped sending it (the server's
/// `RequestBodyTimeoutLayer`, see `serve.rs`); the error is wrapped by the body adapters.
pub(super) fn body_timed_out(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Reads the action of `request` and registers it; with `wait`, also a waiter for its outcome.
async fn read_action(
    state: &AppState,
    request: Request,
    wait: bool,
) -> Result<Registered, Response> {
    let json_type = super::sends_json(request.headers());
    if !json_type {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the action as Content-Type: application/json",
        ));
    }
    // A body announced over the limit is refused at once, not after reading up to the limit
    // (or waiting out the idle timeout for bytes that may never come).
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|length| length > BODY_LIMIT as u64) {
        return Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("an action body is at most {BODY_LIMIT} bytes"),
        ));
    }
    let source = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_string(), |c| c.0.to_string());
    let bytes = axum::body::to_bytes(request.into_body(), BODY_LIMIT)
        .await
        .map_err(|e| {
            if body_timed_out(&e) {
                error(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body stalled for the idle timeout (http.idle-timeout-ms)",
                )
            } else {
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("an action body is at most {BODY_LIMIT} bytes"),
                )
            }
        })?;
    let action: Value = serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
    })?;
    // A client hanging up while the action is written cannot leave it on disk but not
    // pending: the queue's writer makes it pending, whether this call is still there or not.
    let logged = action.clone();
    let registered = state
        .actions
        .register(action, wait)
        .await
        .map_err(|e| match e {
            RegisterError::NotLeader => {
                let status = build_status(state);
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"error": e.to_string(), "leader": status.leader})),
                )
                    .into_response()
            }
            RegisterError::TooMany => error(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
            RegisterError::TooManyPending { .. }
            | RegisterError::PendingTooLarge { .. }
            | RegisterError::Store(_)
            | RegisterError::Stopped => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        })?;
    let id = registered.id;
    if let Some(logs) = &state.logs {
        logs.audit(&format!("action {id} from {source}: {logged}"));
    }
    tracing::info!(id, %source, "Action registered.");
    Ok(registered)
}

pub async fn action(State(state): State<AppState>, request: Request) -> Response {
    match read_action(&state, request, false).await {
        Ok(registered) => Json(json!({"registered": registered.id})).into_response(),
        Err(response) => response,
    }
}

pub async fn wait_action(State(state): State<AppState>, request: Request) -> Response {
    let (id, answer) = match read_action(&state, request, true).await {
        Ok(Registered { id, answer }) => (id, answer.expect("registered with a waiter")),
        Err(response) => return response,
    };
    match answer.wait().await {
        Outcome::Reply(value) => Json(value).into_response(),
        Outcome::NoReply => StatusCode::NO_CONTENT.into_response(),
        Outcome::LeadershipLost => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("action {id}: this node stopped leading before a schedule took it"),
        ),
        Outcome::TimedOut => error(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "action {id}: no schedule took it within {} s (it stays pending)",
                WAIT_LIMIT.as_secs()
            ),
        ),
    }
}

pub async fn pending_actions(State(state): State<AppState>) -> Json<Value> {
    let actions = state.store.actions.peek();
    Json(Value::Object(
        actions
            .iter()
            .map(|(id, a)| (id.to_string(), a.clone()))
            .collect(),
    ))
}

pub async fn action_is_pending(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match id.parse::<u64>() {
        Ok(id) => {
            Json(json!({"pending": state.store.actions.peek().contains_key(&id)})).into_response()
        }
        Err(_) => error(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not an action id"),
        ),
    }
}
