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
use axum::extract::{ConnectInfo, Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use verwalter_controllers::actions::{Outcome, RegisterError, Registered, WAIT_LIMIT};

use super::api::build_status;
use super::body::{BodyRules, JsonBody, JsonRoute};
use super::{ApiError, AppState};

/// Largest action body accepted.
pub(crate) const BODY_LIMIT: usize = 64 << 10;

/// The body of `POST /v1/action` and `/v1/wait_action`: any JSON.
pub(crate) struct ActionBody;

impl JsonRoute for ActionBody {
    type Body = Value;
    const RULES: BodyRules = BodyRules::json(
        BODY_LIMIT,
        "send the action as Content-Type: application/json",
        |limit| format!("an action body is at most {limit} bytes"),
    );
}

/// Where a request came from, for the audit line.
type Source = Option<Extension<ConnectInfo<SocketAddr>>>;

/// Registers `action`, from `source`; with `wait`, also a waiter for its outcome.
async fn register(
    state: &AppState,
    source: Source,
    action: Value,
    wait: bool,
) -> Result<Registered, ApiError> {
    let source = source.map_or_else(|| "unknown".to_string(), |c| c.0.0.to_string());
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
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                    .with("leader", status.leader)
            }
            RegisterError::TooMany => ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
            RegisterError::TooManyPending { .. }
            | RegisterError::PendingTooLarge { .. }
            | RegisterError::Store(_)
            | RegisterError::Stopped => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        })?;
    let id = registered.id;
    if let Some(logs) = &state.logs {
        logs.audit(&format!("action {id} from {source}: {logged}"));
    }
    tracing::info!(id, %source, "Action registered.");
    Ok(registered)
}

pub(crate) async fn action(
    State(state): State<AppState>,
    source: Source,
    body: JsonBody<ActionBody>,
) -> Result<Json<Value>, ApiError> {
    let registered = register(&state, source, body.into_inner(), false).await?;
    Ok(Json(json!({"registered": registered.id})))
}

pub(crate) async fn wait_action(
    State(state): State<AppState>,
    source: Source,
    body: JsonBody<ActionBody>,
) -> Result<Response, ApiError> {
    let Registered { id, answer } = register(&state, source, body.into_inner(), true).await?;
    let answer = answer.expect("registered with a waiter");
    match answer.wait().await {
        Outcome::Reply(value) => Ok(Json(value).into_response()),
        Outcome::NoReply => Ok(StatusCode::NO_CONTENT.into_response()),
        Outcome::LeadershipLost => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("action {id}: this node stopped leading before a schedule took it"),
        )),
        Outcome::TimedOut => Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "action {id}: no schedule took it within {} s (it stays pending)",
                WAIT_LIMIT.as_secs()
            ),
        )),
    }
}

pub(crate) async fn pending_actions(State(state): State<AppState>) -> Json<Value> {
    let actions = state.store.actions.peek();
    Json(Value::Object(
        actions
            .iter()
            .map(|(id, a)| (id.to_string(), a.clone()))
            .collect(),
    ))
}

pub(crate) async fn action_is_pending(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Response {
    match id.parse::<u64>() {
        Ok(id) => {
            Json(json!({"pending": state.store.actions.peek().contains_key(&id)})).into_response()
        }
        Err(_) => ApiError::bad_request(format!("{id:?} is not an action id")).into_response(),
    }
}
