//! `POST /v1/dc/exchange`: an envelope from another data center's leader (docs/datacenters.md,
//! "The exchange"). The body is read within `datacenters.max-body-bytes` (a `Content-Length`
//! over it is refused before reading), decompressed within it too, then checked by
//! [`DcNode::receive`]; the answer is this node's envelope, compressed as the caller accepts.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Limited};
use serde_json::json;
use verwalter_controllers::cluster::datacenters::wire::TAG_HEADER;

use super::AppState;
use crate::cluster::coding::Coding;
use crate::cluster::datacenters::Reply;

fn refused(status: u16, body: serde_json::Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(body)).into_response()
}

/// `GET /v1/datacenters` (docs/http-api.md).
pub(crate) async fn list(State(state): State<AppState>) -> Response {
    match &state.datacenters {
        Some(dc) => axum::Json(dc.listing()).into_response(),
        None => refused(
            404,
            json!({"error": "this node is in no data center (datacenter: in its settings)"}),
        ),
    }
}

pub(crate) async fn exchange(State(state): State<AppState>, request: Request) -> Response {
    let Some(dc) = state.datacenters.clone() else {
        return refused(
            404,
            json!({"error": "this node is in no data center (datacenter: in its settings)"}),
        );
    };
    let limit = dc.max_body();
    let too_big = || {
        dc.count_dropped("too_big");
        tracing::info!(
            reason = "too_big",
            "Refused an exchange from another data center."
        );
        refused(
            413,
            json!({"error": format!("the body is over {limit} bytes (datacenters.max-body-bytes)")}),
        )
    };
    let headers = request.headers().clone();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_big();
    }
    let Ok(body) = Limited::new(request.into_body(), limit).collect().await else {
        return too_big();
    };
    let Some(coding) = Coding::of_response(&headers) else {
        dc.count_dropped("decode");
        return refused(415, json!({"error": "an unknown Content-Encoding"}));
    };
    let body = match coding.decode(body.to_bytes(), limit) {
        Ok(body) => body,
        Err(error) if error.contains("the limit") => return too_big(),
        Err(error) => {
            dc.count_dropped("decode");
            return refused(400, json!({ "error": error }));
        }
    };
    let tag = headers.get(TAG_HEADER).and_then(|v| v.to_str().ok());
    match dc.receive(&body, tag, tokio::time::Instant::now()) {
        Reply::Envelope(body, tag) => {
            let coding = Coding::for_request(&headers);
            let mut response = Response::new(Body::from(coding.encode(&body)));
            let out = response.headers_mut();
            out.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if let Some(value) = coding.header() {
                out.insert(header::CONTENT_ENCODING, value);
            }
            if let Ok(tag) = HeaderValue::from_str(&tag) {
                out.insert(TAG_HEADER, tag);
            }
            response
        }
        Reply::Refused {
            status,
            body,
            reason,
        } => {
            if reason != "not_leader" {
                tracing::info!(reason, %body, "Refused an exchange from another data center.");
            }
            refused(status, body)
        }
    }
}
