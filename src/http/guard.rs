//! Requests a browser could be tricked into sending are refused:
//!
//! - DNS rebinding: a page of `evil.example` whose name is made to resolve to the node reads the
//!   API as same-origin, but its requests carry `Host: evil.example`. So the `Host` must be an IP
//!   address, a name without a dot (`localhost`, `verwalter`, a short host name: no outside
//!   party controls how those resolve), a `*.localhost` name, this node's name or host name, or
//!   one of `http.allowed-hosts` (`*` lets any through). Otherwise 403.
//! - Cross-site requests that change state: a page elsewhere can POST a form or a `text/plain`
//!   body without asking the node first. Other than GET, HEAD and OPTIONS, a request whose
//!   `Origin` (or, without one, `Referer`) names another host and port than its `Host` (one
//!   without a port matches 80 and 443, for a proxy that terminates TLS) is refused (403), and so is one with a body type a form can send (`text/plain`,
//!   `application/x-www-form-urlencoded`, `multipart/form-data`: 415).
//!
//! Clients that are not browsers (curl, scripts, other nodes) send no `Origin` and usually an IP
//! address or the node's name as `Host`, and are not affected.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};

pub async fn same_site(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match refusal(&state, request.method(), request.headers()) {
        None => next.run(request).await,
        Some(response) => response,
    }
}

/// The answer to a request refused here; `None` lets it through.
fn refusal(state: &AppState, method: &Method, headers: &HeaderMap) -> Option<Response> {
    let host = headers
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("").to_ascii_lowercase());
    if let Some(host) = host.as_deref().filter(|h| !host_allowed(state, h)) {
        return Some(
            ApiError::Forbidden(format!(
                "Host {host:?} is not a name of this node; add it to http.allowed-hosts in the \
             settings file to use it"
            ))
            .into_response(),
        );
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let source = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .map(|v| v.to_str().unwrap_or(""));
    if let Some(source) = source {
        let same = host
            .as_deref()
            .is_some_and(|host| same_origin(source, host));
        if !same {
            return Some(
                ApiError::Forbidden(format!(
                    "cross-site request from {source:?} refused: {method} must come from a page of \
                 this node"
                ))
                .into_response(),
            );
        }
    }
    let form_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|media| {
            matches!(
                media.as_str(),
                "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data"
            )
        });
    if form_type {
        return Some((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            axum::Json(serde_json::json!({
                "error": "send application/json (or no body): a form's body type is refused on requests that change state"
            })),
        )
            .into_response());
    }
    None
}

/// `host[:port]` without the port.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn host_allowed(state: &AppState, host: &str) -> bool {
    let name = host_name(host).trim_end_matches('.');
    let node = &state.node;
    let allowed = &state.http.settings.allowed_hosts;
    name.parse::<IpAddr>().is_ok()
        || !name.contains('.')
        || name.ends_with(".localhost")
        || name.eq_ignore_ascii_case(node.name.trim_end_matches('.'))
        || name.eq_ignore_ascii_case(&node.hostname)
        || allowed.iter().any(|a| a == "*" || a == name)
}

/// Whether an `Origin` or `Referer` URL names the host and port of `Host` (lowercase). A `Host`
/// without a port matches either scheme's default port: behind a proxy that terminates TLS the
/// page is `https://name` (443) while the request reaches the node as `Host: name`.
fn same_origin(source: &str, host: &str) -> bool {
    let Some(authority) = origin_authority(source) else {
        return false;
    };
    let explicit = with_port(host);
    let port_given = explicit != format!("{host}:80");
    authority == explicit || (!port_given && authority == format!("{host}:443"))
}

/// `host:port` with the port made explicit (80 when absent, as a `Host` of plain HTTP).
fn with_port(host: &str) -> String {
    let name = host_name(host);
    if name.len() == host.len() || (host.starts_with('[') && host.ends_with(']')) {
        format!("{host}:80")
    } else {
        host.to_string()
    }
}

/// The `host:port` of an `Origin` or `Referer` URL, the port made explicit; `None` for `null`
/// and anything that is not an http(s) URL.
fn origin_authority(url: &str) -> Option<String> {
    let url = url.to_ascii_lowercase();
    let (default_port, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (80, rest.to_string())
    } else if let Some(rest) = url.strip_prefix("https://") {
        (443, rest.to_string())
    } else {
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    if authority.is_empty() {
        return None;
    }
    let name = host_name(authority);
    if name.len() == authority.len() || (authority.starts_with('[') && authority.ends_with(']')) {
        Some(format!("{authority}:{default_port}"))
    } else {
        Some(authority.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_hosts_compare_with_explicit_ports() {
        assert_eq!(
            origin_authority("http://127.0.0.1:8379").as_deref(),
            Some("127.0.0.1:8379")
        );
        assert_eq!(
            origin_authority("http://Node.Example/roles/web?x").as_deref(),
            Some("node.example:80")
        );
        assert_eq!(
            origin_authority("https://[::1]/").as_deref(),
            Some("[::1]:443")
        );
        assert_eq!(origin_authority("null"), None);
        assert_eq!(with_port("node.example"), "node.example:80");
        assert_eq!(with_port("[::1]"), "[::1]:80");
        assert_eq!(with_port("[::1]:8379"), "[::1]:8379");
        assert_eq!(host_name("[::1]:8379"), "::1");
        assert_eq!(host_name("alpha:8379"), "alpha");
    }

    #[test]
    fn a_host_without_port_is_the_same_origin_as_either_default_port() {
        // The node's own frontend behind a proxy that terminates TLS.
        assert!(same_origin("https://ops.example", "ops.example"));
        assert!(same_origin("https://ops.example:443/roles", "ops.example"));
        assert!(same_origin("http://ops.example/", "ops.example"));
        assert!(same_origin("https://[::1]/", "[::1]"));
        // An explicit port must match.
        assert!(!same_origin("https://ops.example", "ops.example:80"));
        assert!(!same_origin("https://ops.example", "ops.example:8379"));
        assert!(same_origin("http://ops.example:8379", "ops.example:8379"));
        // Other hosts and ports stay refused.
        assert!(!same_origin("https://evil.example", "ops.example"));
        assert!(!same_origin("https://ops.example:8443", "ops.example"));
        assert!(!same_origin("null", "ops.example"));
    }
}
