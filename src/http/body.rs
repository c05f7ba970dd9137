//! The one reader of JSON request bodies (`POST /v1/action`, `/v1/wait_action`, `/v1/graphql`,
//! `/v1/query/<path>`), with the limits every such route keeps:
//!
//! - not `Content-Type: application/json` (any parameters): 415;
//! - a `Content-Length` over the route's limit: 413 at once, before any of the body is read;
//! - a body that grows over the limit: 413;
//! - a body that stalls for the idle timeout (the server's `RequestBodyTimeoutLayer`, see
//!   `serve.rs`): 408;
//! - a body that is not the JSON the route takes: 400 with serde's message.
//!
//! A route names its limit and texts in a [`BodyRules`] and takes the body with the extractor
//! [`JsonBody`], whose rejection is the [`ApiError`] answered. (The scheduler extender reads its
//! bodies under a byte budget shared by all requests: `placement/extender/body.rs`.)

use std::marker::PhantomData;

use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use super::ApiError;

/// A route's limit and the texts of its refusals.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyRules {
    /// The most bytes read.
    pub(crate) limit: usize,
    /// The 415's message.
    pub(crate) wrong_type: &'static str,
    /// The 413's message, given the limit.
    pub(crate) too_large: fn(usize) -> String,
    /// What the 400's message says the body is not (`": <serde's message>"` follows).
    pub(crate) not_parsed: &'static str,
    /// Whether refusals are in GraphQL's shape (`{"errors": [{"message"}]}`).
    pub(crate) graphql: bool,
}

impl BodyRules {
    /// Rules for any JSON (`"the body is not JSON: ..."`), refused in the plain shape.
    pub(crate) const fn json(
        limit: usize,
        wrong_type: &'static str,
        too_large: fn(usize) -> String,
    ) -> BodyRules {
        BodyRules {
            limit,
            wrong_type,
            too_large,
            not_parsed: "the body is not JSON",
            graphql: false,
        }
    }
}

/// The message of a body that stalled.
pub(crate) const STALLED: &str =
    "the request body stalled for the idle timeout (http.idle-timeout-ms)";

/// What a route reads: the type of its body, and its [`BodyRules`].
pub(crate) trait JsonRoute {
    type Body: DeserializeOwned + Send;
    const RULES: BodyRules;
}

/// The body of a request to the route `R`, read and parsed under `R`'s rules.
pub(crate) struct JsonBody<R: JsonRoute>(pub(crate) R::Body, PhantomData<R>);

impl<R: JsonRoute> JsonBody<R> {
    pub(crate) fn into_inner(self) -> R::Body {
        self.0
    }
}

impl<S: Send + Sync, R: JsonRoute> FromRequest<S> for JsonBody<R> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _: &S) -> Result<Self, ApiError> {
        let body = read_json(request, &R::RULES).await?;
        Ok(JsonBody(body, PhantomData))
    }
}

/// Reads and parses the JSON body of `request` under `rules`.
pub(crate) async fn read_json<T: DeserializeOwned>(
    request: Request,
    rules: &BodyRules,
) -> Result<T, ApiError> {
    let refuse = |status, message: String| {
        let error = ApiError::new(status, message);
        if rules.graphql {
            error.graphql()
        } else {
            error
        }
    };
    if !super::sends_json(request.headers()) {
        return Err(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            rules.wrong_type.to_string(),
        ));
    }
    let too_large = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            (rules.too_large)(rules.limit),
        )
    };
    // A body announced over the limit is refused at once, not after reading up to the limit
    // (or waiting out the idle timeout for bytes that may never come).
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|length| length > rules.limit as u64) {
        return Err(too_large());
    }
    let bytes = match axum::body::to_bytes(request.into_body(), rules.limit).await {
        Ok(bytes) => bytes,
        Err(e) if body_timed_out(&e) => {
            return Err(refuse(StatusCode::REQUEST_TIMEOUT, STALLED.to_string()));
        }
        Err(_) => return Err(too_large()),
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        refuse(
            StatusCode::BAD_REQUEST,
            format!("{}: {e}", rules.not_parsed),
        )
    })
}

/// Whether reading a body failed because the client stopped sending it (the server's
/// `RequestBodyTimeoutLayer`, see `serve.rs`); the error is wrapped by the body adapters.
fn body_timed_out(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::{Body, Bytes};
    use serde_json::{Value, json};

    use super::*;

    const RULES: BodyRules = BodyRules::json(16, "send it as JSON", |limit| {
        format!("at most {limit} bytes")
    });

    fn request(content_type: &str, length: Option<&str>, body: Body) -> Request {
        let mut builder = axum::http::Request::post("/").header("content-type", content_type);
        if let Some(length) = length {
            builder = builder.header("content-length", length);
        }
        builder.body(body).unwrap()
    }

    /// A body that never sends a byte, nor ends.
    fn never() -> Body {
        Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>())
    }

    async fn refused(request: Request, rules: &BodyRules) -> (StatusCode, Value) {
        let error = read_json::<Value>(request, rules).await.unwrap_err();
        (error.status(), error.body())
    }

    #[tokio::test]
    async fn json_within_the_limit_is_read() {
        let asked = request(
            "application/json; charset=utf-8",
            None,
            Body::from("[1, 2]"),
        );
        assert_eq!(
            read_json::<Value>(asked, &RULES).await.unwrap(),
            json!([1, 2])
        );
    }

    #[tokio::test]
    async fn another_type_is_refused_415() {
        let asked = request("text/plain", None, Body::from("{}"));
        let answer = refused(asked, &RULES).await;
        assert_eq!(
            answer,
            (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                json!({"error": "send it as JSON"})
            )
        );
    }

    #[tokio::test]
    async fn a_length_over_the_limit_is_refused_413_before_any_byte() {
        let asked = request("application/json", Some("17"), never());
        let answer = tokio::time::timeout(Duration::from_secs(10), refused(asked, &RULES)).await;
        assert_eq!(
            answer.expect("answered at once"),
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": "at most 16 bytes"})
            )
        );
    }

    #[tokio::test]
    async fn a_body_growing_over_the_limit_is_refused_413() {
        let asked = request(
            "application/json",
            None,
            Body::from(format!("\"{}\"", "x".repeat(20))),
        );
        assert_eq!(
            refused(asked, &RULES).await.0,
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[tokio::test]
    async fn a_stalled_body_is_refused_408() {
        // As the server's `RequestBodyTimeoutLayer` wraps every request body.
        let stalling = tower_http::timeout::TimeoutBody::new(Duration::from_millis(20), never());
        let asked = request("application/json", Some("10"), Body::new(stalling));
        assert_eq!(
            refused(asked, &RULES).await,
            (StatusCode::REQUEST_TIMEOUT, json!({"error": STALLED}))
        );
    }

    #[tokio::test]
    async fn bad_json_is_refused_400_with_serdes_message() {
        let asked = request("application/json", None, Body::from("{"));
        let (status, body) = refused(asked, &RULES).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            json!({"error": "the body is not JSON: EOF while parsing an object at line 1 column 1"})
        );
    }

    #[tokio::test]
    async fn graphql_rules_answer_in_graphqls_shape() {
        let rules = BodyRules {
            graphql: true,
            ..RULES
        };
        let asked = request("application/json", None, Body::from("nope"));
        let (status, body) = refused(asked, &rules).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            body["errors"][0]["message"]
                .as_str()
                .unwrap()
                .starts_with("the body is not JSON: "),
            "{body}"
        );
    }
}
