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

/// `Query.datacenters` in GraphQL: what [`list`] gives, as one tree of the schema's names
/// (docs/http-api.md, "GraphQL"); `null` on a node in no DC. Each other DC is listed once,
/// whether the exchange sees it (while leading) or only the members name it.
pub(crate) fn graphql_tree(dc: Option<&crate::cluster::datacenters::DcNode>) -> serde_json::Value {
    match dc {
        Some(dc) => tree_of(&dc.listing()),
        None => serde_json::Value::Null,
    }
}

/// [`graphql_tree`] of a listing of `GET /v1/datacenters`.
fn tree_of(listing: &serde_json::Value) -> serde_json::Value {
    let empty = serde_json::Map::new();
    let members = listing["members"].as_object().unwrap_or(&empty);
    let views = listing["dcs"].as_object().unwrap_or(&empty);
    let errors = listing["errors"].as_object().unwrap_or(&empty);
    let mut names: Vec<&String> = members
        .keys()
        .chain(views.keys())
        .chain(errors.keys())
        .collect();
    names.sort();
    names.dedup();
    let dcs: Vec<serde_json::Value> = names
        .into_iter()
        .map(|name| {
            let view = views.get(name).unwrap_or(&serde_json::Value::Null);
            let held = |key: &str, id: &str| {
                view[key].as_array().map_or_else(Vec::new, |items| {
                    items
                        .iter()
                        .map(|i| json!({id: i[id], "data": i["data"], "expiresInMs": i["expires_in_ms"]}))
                        .collect()
                })
            };
            let lent: Vec<serde_json::Value> = view["lent"].as_array().map_or_else(Vec::new, |items| {
                items
                    .iter()
                    .map(|l| json!({"request": l["request"], "outstandingMs": l["outstanding_ms"]}))
                    .collect()
            });
            json!({
                "name": name,
                "addresses": members.get(name).cloned().unwrap_or_else(|| json!([])),
                "leader": view["leader"],
                "link": view["link"].as_str().unwrap_or("unknown"),
                "rttMs": view["rtt_ms"],
                "contactAgeMs": view["contact_age_ms"],
                "summary": view["summary"],
                "summaryAgeMs": view["summary_age_ms"],
                "summaryBehind": view["summary_behind"].as_bool().unwrap_or(false),
                "summaryDeferred": view["summary_deferred"].as_bool().unwrap_or(false),
                "bytesSent": view["bytes_sent"].as_u64().unwrap_or(0),
                "bytesReceived": view["bytes_received"].as_u64().unwrap_or(0),
                "requests": held("requests", "id"),
                "answers": held("answers", "request"),
                "lent": lent,
                "lastError": errors.get(name).map(|e| e["error"].clone()),
                "lastErrorAgeMs": errors.get(name).map(|e| e["age_ms"].clone()),
            })
        })
        .collect();
    json!({
        "name": listing["self"],
        "exchange": listing["exchange"],
        "leading": listing["leading"],
        "leader": listing["leader"],
        "addr": listing["addr"],
        "dcs": dcs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grants both ways and a failure, as the listing names them, in GraphQL's names.
    #[test]
    fn the_graphql_tree_names_grants_borrowed_and_lent_and_the_last_failure() {
        let listing = json!({
            "self": "ams", "exchange": "on", "leading": true, "leader": null, "addr": "a:1",
            "members": {"fra": ["f:1"]},
            "dcs": {"fra": {
                "leader": "n2", "link": "down", "rtt_ms": 41, "contact_age_ms": 9000,
                "summary": {"spare": 1}, "summary_age_ms": 12000, "summary_behind": true,
                "requests": [{"id": "r1", "data": 1, "expires_in_ms": 50}],
                "answers": [{"request": "mine", "data": {"workers": 8}, "expires_in_ms": 4000}],
                "lent": [{"request": "theirs", "outstanding_ms": 7000}],
                "summary_deferred": true, "bytes_sent": 10, "bytes_received": 20,
            }},
            "errors": {"fra": {"error": "f:1: refused", "age_ms": 300}},
        });
        let tree = tree_of(&listing);
        assert_eq!(tree["name"], "ams");
        assert_eq!(
            tree["dcs"],
            json!([{
                "name": "fra", "addresses": ["f:1"], "leader": "n2", "link": "down",
                "rttMs": 41, "contactAgeMs": 9000, "summary": {"spare": 1},
                "summaryAgeMs": 12000, "summaryBehind": true, "summaryDeferred": true,
                "bytesSent": 10, "bytesReceived": 20,
                "requests": [{"id": "r1", "data": 1, "expiresInMs": 50}],
                "answers": [{"request": "mine", "data": {"workers": 8}, "expiresInMs": 4000}],
                "lent": [{"request": "theirs", "outstandingMs": 7000}],
                "lastError": "f:1: refused", "lastErrorAgeMs": 300,
            }])
        );
    }
}
