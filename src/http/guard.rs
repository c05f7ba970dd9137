//! The guard in front of every route: reads the headers the policy of
//! [`verwalter_controllers::http::access`] looks at and answers a refused request. First the
//! Host/Origin checks (DNS rebinding, cross-site requests that change state: 403 or 415), then
//! the bearer token of `http.token-file` when one is set (401 with `WWW-Authenticate: Bearer`).
//!
//! The `Authorization` header is read here and nowhere else, and never logged: no span or log
//! line of the HTTP layer records request headers. A GraphQL WebSocket upgrade without it that
//! `access::token_at_connection_init` lets through is marked with [`TokenAtInit`]: the socket
//! then asks the token of its `connection_init` (`graphql.rs`); one whose header carries the
//! token is marked with [`MayWrite`] (it may run mutations).

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use verwalter_controllers::http::access::{self, Asked, Names, Refusal, TokenRefusal, TokenScope};

use super::{ApiError, AppState};

/// Marks a GraphQL WebSocket upgrade let through without the token it needs: its
/// `connection_init` must carry it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenAtInit;

/// Marks a GraphQL WebSocket upgrade that may run mutations ([`access::socket_may_write`]):
/// no token is configured, or its `Authorization` header carries it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MayWrite;

pub(crate) async fn same_site(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(response) = refusal(&state, request.method(), request.headers()) {
        return response;
    }
    match unauthorized(&state, &request) {
        TokenGate::Pass => {}
        TokenGate::AtConnectionInit => {
            request.extensions_mut().insert(TokenAtInit);
        }
        TokenGate::Refused(response) => return response,
    }
    if request.uri().path() == access::GRAPHQL_PATH
        && access::socket_may_write(
            state.http.settings.token.as_ref(),
            request
                .headers()
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes),
            None,
        )
    {
        request.extensions_mut().insert(MayWrite);
    }
    next.run(request).await
}

/// What the token check makes of a request.
enum TokenGate {
    /// It has the token it needs, or needs none.
    Pass,
    /// A GraphQL WebSocket upgrade without the header: its `connection_init` must carry it.
    AtConnectionInit,
    /// The 401.
    Refused(Response),
}

fn unauthorized(state: &AppState, request: &Request) -> TokenGate {
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
    let Err(refusal) =
        access::check_token(settings.token.as_ref(), scope, method, path, authorization)
    else {
        return TokenGate::Pass;
    };
    let websocket = request
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if access::token_at_connection_init(refusal, method, path, websocket) {
        return TokenGate::AtConnectionInit;
    }
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
    TokenGate::Refused(
        ApiError::new(StatusCode::UNAUTHORIZED, error)
            .header(header::WWW_AUTHENTICATE, challenge)
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
        Refusal::UnknownHost(host) => ApiError::forbidden(format!(
            "Host {host:?} is not a name of this node; add it to http.allowed-hosts in the \
             settings file to use it"
        ))
        .into_response(),
        Refusal::CrossSite(source) => ApiError::forbidden(format!(
            "cross-site request from {source:?} refused: {method} must come from a page of \
             this node"
        ))
        .into_response(),
        Refusal::FormBody => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send application/json (or no body): a form's body type is refused on requests \
             that change state",
        )
        .into_response(),
    };
    Some(response)
}
