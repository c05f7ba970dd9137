//! The guard in front of every route: reads the headers the policy of
//! [`verwalter_controllers::access`] looks at and answers a refused request. First the
//! Host/Origin checks (DNS rebinding, cross-site requests that change state: 403 or 415), then
//! the bearer token of `http.token-file` when one is set (401 with `WWW-Authenticate: Bearer`).
//!
//! The `Authorization` header is read here and nowhere else, and never logged: no span or log
//! line of the HTTP layer records request headers.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use verwalter_controllers::access::{self, Asked, Names, Refusal, TokenRefusal, TokenScope};

use super::{ApiError, AppState};

pub async fn same_site(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let refused = refusal(&state, request.method(), request.headers())
        .or_else(|| unauthorized(&state, &request));
    match refused {
        None => next.run(request).await,
        Some(response) => response,
    }
}

/// The 401 of a request without the token it needs; `None` lets it through.
fn unauthorized(state: &AppState, request: &Request) -> Option<Response> {
    let settings = &state.http.settings;
    let scope = TokenScope {
        reads: settings.token_for_reads,
    };
    let method = request.method().as_str();
    let path = request.uri().path();
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let refusal =
        access::check_token(settings.token.as_ref(), scope, method, path, authorization).err()?;
    let (challenge, error) = match refusal {
        TokenRefusal::Missing => (
            "Bearer",
            format!(
                "{method} {path} needs the token of this node's http.token-file: send \
                 Authorization: Bearer <token>"
            ),
        ),
        TokenRefusal::Wrong => (
            "Bearer error=\"invalid_token\"",
            format!("{method} {path}: the token sent is not this node's (http.token-file)"),
        ),
    };
    Some(
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
            axum::Json(serde_json::json!({ "error": error })),
        )
            .into_response(),
    )
}

/// The answer to a request refused here; `None` lets it through.
fn refusal(state: &AppState, method: &Method, headers: &HeaderMap) -> Option<Response> {
    let text = |name| headers.get(name).map(|v| v.to_str().unwrap_or(""));
    let names = Names {
        name: &state.node.name,
        hostname: &state.node.hostname,
        allowed: &state.http.settings.allowed_hosts,
    };
    let asked = Asked {
        method: method.as_str(),
        host: text(header::HOST),
        source: text(header::ORIGIN).or_else(|| text(header::REFERER)),
        content_type: headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    };
    let response = match access::judge(names, asked)? {
        Refusal::UnknownHost(host) => ApiError::Forbidden(format!(
            "Host {host:?} is not a name of this node; add it to http.allowed-hosts in the \
             settings file to use it"
        ))
        .into_response(),
        Refusal::CrossSite(source) => ApiError::Forbidden(format!(
            "cross-site request from {source:?} refused: {method} must come from a page of \
             this node"
        ))
        .into_response(),
        Refusal::FormBody => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            axum::Json(serde_json::json!({
                "error": "send application/json (or no body): a form's body type is refused on requests that change state"
            })),
        )
            .into_response(),
    };
    Some(response)
}
