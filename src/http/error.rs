//! The one error type of the HTTP edge, and the response it is: a status code, headers if the
//! answer needs some (`Retry-After`, `WWW-Authenticate`, `Connection: close`), and a JSON body,
//! `{"error": "..."}` (with fields of its own next to `error` where a route adds them, like the
//! leader of a refused action or the field of a bad extender request), or GraphQL's
//! `{"errors": [{"message": "..."}]}` on the GraphQL route.
//!
//! Every route and extractor of [`crate::http`] and of the scheduler extender answers its errors
//! with it (see [`super::body`] for the JSON body extractor's).

use axum::Json;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// An error answer; see the module's documentation.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    /// Fields of the body beside `error` (plain shape only).
    extra: Vec<(&'static str, Value)>,
    headers: Vec<(HeaderName, HeaderValue)>,
    shape: Shape,
}

/// How the body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `{"error": message, ...extra}`.
    Plain,
    /// `{"errors": [{"message": message}]}`.
    GraphQl,
}

impl ApiError {
    /// `status` with `message`, in the plain shape.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            extra: Vec::new(),
            headers: Vec::new(),
            shape: Shape::Plain,
        }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 503 with `Retry-After: <seconds>`: a limit of this node is reached for now.
    pub(crate) fn unavailable(message: impl Into<String>, retry_after: &'static str) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
            .header(axum::http::header::RETRY_AFTER, retry_after)
    }

    /// The body gets the field `name` beside `error` (the plain shape only).
    pub(crate) fn with(mut self, name: &'static str, value: impl serde::Serialize) -> ApiError {
        let value = serde_json::to_value(value).expect("an error field serializes");
        self.extra.push((name, value));
        self
    }

    /// The answer carries the header `name: value`.
    pub(crate) fn header(mut self, name: HeaderName, value: impl TryInto<HeaderValue>) -> ApiError {
        let Ok(value) = value.try_into() else {
            panic!("the header {name} of an error answer is a valid value");
        };
        self.headers.push((name, value));
        self
    }

    /// The body in GraphQL's shape, `{"errors": [{"message": ...}]}`.
    pub(crate) fn graphql(mut self) -> ApiError {
        self.shape = Shape::GraphQl;
        self
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// The JSON body of the answer.
    pub(crate) fn body(&self) -> Value {
        match self.shape {
            Shape::GraphQl => json!({"errors": [{"message": self.message}]}),
            Shape::Plain => {
                let mut body = Map::new();
                body.insert("error".into(), Value::String(self.message.clone()));
                for (name, value) in &self.extra {
                    body.insert((*name).into(), value.clone());
                }
                Value::Object(body)
            }
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(error: ApiError) -> (StatusCode, axum::http::HeaderMap, String) {
        let response = error.into_response();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        (
            parts.status,
            parts.headers,
            String::from_utf8(bytes.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn the_plain_shape_carries_its_fields_beside_the_message() {
        let (status, headers, body) = answer(ApiError::not_found("no file x")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(body, r#"{"error":"no file x"}"#);

        let refused = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not the leader")
            .with("leader", json!({"name": "n1"}));
        let (status, _, body) = answer(refused).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, r#"{"error":"not the leader","leader":{"name":"n1"}}"#);
        let (_, _, body) = answer(ApiError::bad_request("bad").with("field", "")).await;
        assert_eq!(body, r#"{"error":"bad","field":""}"#);
    }

    #[tokio::test]
    async fn the_graphql_shape_and_headers() {
        let (status, _, body) = answer(ApiError::bad_request("no").graphql()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body, r#"{"errors":[{"message":"no"}]}"#);
        let (status, headers, body) = answer(ApiError::unavailable("busy", "5")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers["retry-after"], "5");
        assert_eq!(body, r#"{"error":"busy"}"#);
    }
}
