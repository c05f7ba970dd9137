//! The Host/Origin guard in front of every route: reads the headers the policy of
//! [`verwalter_controllers::access`] looks at (DNS rebinding, cross-site requests that change
//! state) and answers a refused request with 403 or 415.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use verwalter_controllers::access::{self, Asked, Names, Refusal};

use super::{ApiError, AppState};

pub async fn same_site(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match refusal(&state, request.method(), request.headers()) {
        None => next.run(request).await,
        Some(response) => response,
    }
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
