//! `POST /v1/query/<path>`: answered by `scheduler/v1/query.wasm`'s `query` (verwalter 0.13.0),
//! on the instance `init`ed with the schedule in force (shared with rendering, [`QueryHook`](crate::schedule::wasm::query::QueryHook)). Without a `query.wasm` (the compat derivation) the
//! answer is a 500 saying so, as in 0.13.

use axum::extract::{Path as UrlPath, State};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::body::{BodyRules, JsonBody, JsonRoute};
use super::{ApiError, AppState};

/// The largest query body read (0.13 took at most 64 KiB of JSON).
const BODY_LIMIT: usize = 64 << 10;

/// The body of `POST /v1/query/<path>`: any JSON, handed to the module.
pub(crate) struct QueryBody;

impl JsonRoute for QueryBody {
    type Body = Value;
    const RULES: BodyRules = BodyRules::json(
        BODY_LIMIT,
        "send the query as Content-Type: application/json",
        |limit| format!("a query body is at most {limit} bytes of JSON"),
    );
}

pub(crate) async fn query(
    State(state): State<AppState>,
    UrlPath(path): UrlPath<String>,
    body: JsonBody<QueryBody>,
) -> Result<Response, ApiError> {
    let body = body.into_inner();
    if !state.query.present() {
        return Err(ApiError::internal(
            "no query interface: the config dir has no scheduler/v1/query.wasm, and the default \
             (compat) role derivation answers no queries",
        ));
    }
    let schedule = state.store.schedule.peek();
    let Some(schedule) = schedule.as_ref().clone() else {
        return Err(ApiError::internal("no schedule yet"));
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
        Ok(Ok(value)) => Ok(axum::Json(value).into_response()),
        Ok(Err(e)) => Err(ApiError::internal(e.message)),
        Err(e) => Err(ApiError::internal(format!("the query did not finish: {e}"))),
    }
}
