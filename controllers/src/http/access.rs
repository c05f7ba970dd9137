//! Which HTTP requests a browser could be tricked into sending are refused:
//!
//! - DNS rebinding: a page of `evil.example` whose name is made to resolve to the node reads the
//!   API as same-origin, but its requests carry `Host: evil.example`. So the `Host` must be an IP
//!   address, a name without a dot (`localhost`, `verwalter`, a short host name: no outside
//!   party controls how those resolve), a `*.localhost` name, this node's name or host name, or
//!   one of `http.allowed-hosts` (`*` lets any through).
//! - Cross-site requests that change state: a page elsewhere can POST a form or a `text/plain`
//!   body without asking the node first. Other than GET, HEAD and OPTIONS, a request whose
//!   `Origin` (or, without one, `Referer`) names another host and port than its `Host` (one
//!   without a port matches 80 and 443, for a proxy that terminates TLS) is refused, and so is
//!   one with a body type a form can send (`text/plain`, `application/x-www-form-urlencoded`,
//!   `multipart/form-data`).
//!
//! Clients that are not browsers (curl, scripts, other nodes) send no `Origin` and usually an IP
//! address or the node's name as `Host`, and are not affected. The HTTP layer
//! (`src/http/guard.rs`) reads the headers and turns a [`Refusal`] into a response.
//!
//! Requests that hold their connection long are limited to a share of the connections
//! ([`event_stream_cap`], [`long_poll_cap`]), so that they never starve the rest of the API;
//! the connections themselves to [`connection_cap`], and when all are taken [`evict`] picks
//! the one that makes room (`src/http/serve.rs` counts and closes).
//!
//! An operator may also require a bearer token (`http.token-file`): [`needs_token`] says which
//! requests must carry it (every one that can change something; reads too with
//! `http.token-for-reads`, apart from the frontend's own files), [`check_token`] whether the
//! `Authorization` header of one does, comparing in constant time. A browser cannot send that
//! header on a WebSocket, so a GraphQL WebSocket upgrade without it may give the token in its
//! `connection_init` message instead ([`token_at_connection_init`], [`check_init_token`],
//! [`refuse_init`]).

use std::net::IpAddr;

/// The names this node answers to.
#[derive(Debug, Clone, Copy)]
pub struct Names<'a> {
    /// The node's name (`--name`).
    pub name: &'a str,
    /// The node's host name.
    pub hostname: &'a str,
    /// `http.allowed-hosts`.
    pub allowed: &'a [String],
}

/// What of a request the policy looks at, each header as text (an unreadable one as `""`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked<'a> {
    /// The method, `GET`, `POST`, ...
    pub method: &'a str,
    /// `Host`, if sent.
    pub host: Option<&'a str>,
    /// `Origin`, or without one `Referer`, if either was sent.
    pub source: Option<&'a str>,
    /// `Content-Type`, if sent and readable.
    pub content_type: Option<&'a str>,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The `Host` (lowercase) is not a name of this node.
    UnknownHost(String),
    /// A state-changing request from a page of another origin (the `Origin` or `Referer`).
    CrossSite(String),
    /// A state-changing request with a body type a form can send.
    FormBody,
}

/// `max-event-streams`, but at most a quarter of the connections: streams last as long as their
/// readers and never make room for a new connection, so they must leave most of them to the
/// rest of the API (and to followers fetching schedules). At least one.
pub fn event_stream_cap(max_event_streams: usize, max_connections: usize) -> usize {
    max_event_streams.min(max_connections / 4).max(1)
}

/// A quarter of the connections (at least one): a long poll holds its connection busy with no
/// IO, so it is neither evicted nor timed out, and together with event streams (another quarter)
/// they must leave half the connections to the rest of the API.
pub fn long_poll_cap(max_connections: usize) -> usize {
    (max_connections / 4).max(1)
}

/// The connection cap in force: the setting, but at most half the descriptor limit (`nofile`,
/// when known), leaving the rest to files, sockets and commands. At least one.
pub fn connection_cap(configured: usize, nofile: Option<u64>) -> usize {
    let by_descriptors = nofile.map_or(usize::MAX, |n| (n / 2) as usize);
    configured.min(by_descriptors).max(1)
}

/// What an open connection is doing, as [`evict`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InUse {
    /// A request is in progress (counting its response until sent).
    pub busy: bool,
    /// A response write waits for the client to read it.
    pub blocked: bool,
    /// The request's body has not all come yet (its handler waits for the client).
    pub receiving: bool,
}

impl InUse {
    /// The client holds the request up: it does not take its response, or has not sent all of
    /// its body.
    pub(crate) fn held_by_client(&self) -> bool {
        self.blocked || self.receiving
    }
}

/// The connection to close to take a new one when all are taken, from the open ones oldest
/// first: the oldest with no request in progress, else the oldest whose client holds its request
/// up (does not take its response, or has not sent all of its body: a slow client may be cut
/// off, but only when every connection is taken); `None` when every one is at work, and the new
/// connection is refused instead.
pub fn evict<K>(open: impl IntoIterator<Item = (K, InUse)> + Clone) -> Option<K> {
    let idle = open.clone().into_iter().find(|(_, c)| !c.busy);
    idle.or_else(|| open.into_iter().find(|(_, c)| c.held_by_client()))
        .map(|(key, _)| key)
}

/// Why a request body was refused before its handler looked at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRefusal {
    /// Longer than the cap (its `Content-Length`, or the bytes that came): 413.
    TooLarge,
    /// Not all of it came within the whole-body timeout: 408.
    Timeout,
    /// The bytes of all the bodies held at once reached their budget, and none came free within
    /// the short wait: 503, to be retried.
    NoBudget,
    /// The connection failed while the body came: 400 (if the client is still there to read it).
    Broken,
}

impl BodyRefusal {
    pub fn status(self) -> u16 {
        match self {
            BodyRefusal::TooLarge => 413,
            BodyRefusal::Timeout => 408,
            BodyRefusal::NoBudget => 503,
            BodyRefusal::Broken => 400,
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            BodyRefusal::TooLarge => "too_large",
            BodyRefusal::Timeout => "timeout",
            BodyRefusal::NoBudget => "budget",
            BodyRefusal::Broken => "broken",
        }
    }

    /// The error message of the answer.
    pub fn message(self, max_body: u64) -> String {
        match self {
            BodyRefusal::TooLarge => format!("the request body is over {max_body} bytes"),
            BodyRefusal::Timeout => "the request body did not all come in time".into(),
            BodyRefusal::NoBudget => "too many request bodies are being read; retry later".into(),
            BodyRefusal::Broken => "the request body could not be read".into(),
        }
    }
}

/// Whether a body of `length` bytes (declared up front by `Content-Length`, or counted as it
/// comes) is over `max_body`: refused at once, before any more of it is read.
pub fn body_over_cap(length: u64, max_body: u64) -> Option<BodyRefusal> {
    (length > max_body).then_some(BodyRefusal::TooLarge)
}

/// Whether `asked` is refused, and why; `None` lets it through.
pub fn judge(names: Names<'_>, asked: Asked<'_>) -> Option<Refusal> {
    let host = asked.host.map(str::to_ascii_lowercase);
    if let Some(host) = host.as_deref().filter(|h| !host_allowed(names, h)) {
        return Some(Refusal::UnknownHost(host.to_string()));
    }
    if matches!(asked.method, "GET" | "HEAD" | "OPTIONS") {
        return None;
    }
    if let Some(source) = asked.source {
        let same = host
            .as_deref()
            .is_some_and(|host| same_origin(source, host));
        if !same {
            return Some(Refusal::CrossSite(source.to_string()));
        }
    }
    if asked.content_type.is_some_and(form_body_type) {
        return Some(Refusal::FormBody);
    }
    None
}

/// Whether a WebSocket upgrade may go on: browsers apply no same-origin rule to WebSockets, so
/// one opened by a page (it sends `Origin`) must come from a page of this node (the same host
/// and port as `Host`). A client that is not a browser sends no `Origin` and is let through, as
/// any `GET`. (The `Host` itself is judged by [`judge`] first.)
pub fn websocket_allowed(host: Option<&str>, origin: Option<&str>) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    host.is_some_and(|host| same_origin(origin, &host.to_ascii_lowercase()))
}

/// Whether a `Content-Type` is one a form can send without asking the server first.
fn form_body_type(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        media.as_str(),
        "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data"
    )
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

/// Whether `host` (a lowercase `Host` header) names this node.
fn host_allowed(names: Names<'_>, host: &str) -> bool {
    let name = host_name(host).trim_end_matches('.');
    name.parse::<IpAddr>().is_ok()
        || !name.contains('.')
        || name.ends_with(".localhost")
        || name.eq_ignore_ascii_case(names.name.trim_end_matches('.'))
        || name.eq_ignore_ascii_case(names.hostname)
        || names.allowed.iter().any(|a| a == "*" || a == name)
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

/// The shortest token accepted: 16 bytes, as the election key.
pub(crate) const MIN_TOKEN_LEN: usize = 16;

/// The bearer token of `http.token-file`. Its `Debug` never shows it, so no settings dump or
/// log line can.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Box<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(hidden)")
    }
}

/// Why a token file's text is not a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenProblem {
    #[error("the token is {0} bytes, at least {MIN_TOKEN_LEN} are needed")]
    TooShort(usize),
    #[error(
        "the token may hold only visible ASCII characters (no spaces inside): it is sent in an \
         HTTP header and typed into a form"
    )]
    NotVisibleAscii,
}

impl Token {
    /// The token in a file's bytes: surrounding whitespace dropped, at least [`MIN_TOKEN_LEN`]
    /// bytes left, each a visible ASCII character.
    pub fn from_file_bytes(bytes: &[u8]) -> Result<Token, TokenProblem> {
        let token = bytes.trim_ascii();
        if !token.iter().all(|b| b.is_ascii_graphic()) {
            return Err(TokenProblem::NotVisibleAscii);
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(TokenProblem::TooShort(token.len()));
        }
        Ok(Token(token.into()))
    }

    /// The token itself, to send it (a follower's schedule fetches with `http.token-for-reads`);
    /// never to log or compare.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether `presented` is this token, in a time that depends on the length of `presented`
    /// only, never on how much of it matches.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let mut differ = u8::from(presented.len() != self.0.len());
        for (i, byte) in presented.iter().enumerate() {
            differ |= byte ^ self.0[i % self.0.len()];
        }
        std::hint::black_box(differ) == 0
    }
}

/// Which requests need the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenScope {
    /// `http.token-for-reads`: reads of the API and `/metrics` need it too.
    pub reads: bool,
}

/// Whether a request of `method` on `path` must carry the token: every method but GET, HEAD and
/// OPTIONS, on any path (whatever route is added later, and unknown paths: nothing that is
/// not a read gets past without it); with `scope.reads`, also reads of `/v1` and below and of
/// `/metrics`. The frontend's own files and pages (`/`, `/common/`, `/~<name>/`, the page for
/// any other path) stay open, so the page can load and ask for the token; so does the GraphQL
/// query page (`/v1/graphiql`: a page from the binary, no data), while `/v1/graphql` is closed
/// like the rest of the API.
pub(crate) fn needs_token(scope: TokenScope, method: &str, path: &str) -> bool {
    if method == "POST" && path == DC_EXCHANGE_PATH {
        // Other DCs' leaders do not have this node's API token: an exchange carries its own
        // tag, made with the election's shared key, checked before anything else.
        return false;
    }
    if !matches!(method, "GET" | "HEAD" | "OPTIONS") {
        return true;
    }
    scope.reads && method != "OPTIONS" && is_api_path(path) && path != "/v1/graphiql"
}

/// `/v1`, anything under it, and `/metrics`.
fn is_api_path(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/") || path == "/metrics"
}

/// Why a request was refused for its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// No `Authorization: Bearer ...` header.
    Missing,
    /// A bearer token that is not the one configured.
    Wrong,
}

/// Whether a request passes the token check: `token` is the configured one (`None`: no check),
/// `authorization` the request's `Authorization` header, if sent. `Bearer` is matched without
/// regard to case, as RFC 9110 says of auth schemes.
pub fn check_token(
    token: Option<&Token>,
    scope: TokenScope,
    method: &str,
    path: &str,
    authorization: Option<&[u8]>,
) -> Result<(), TokenRefusal> {
    let Some(token) = token else { return Ok(()) };
    if !needs_token(scope, method, path) {
        return Ok(());
    }
    let presented = authorization
        .and_then(bearer)
        .ok_or(TokenRefusal::Missing)?;
    if token.matches(presented) {
        Ok(())
    } else {
        Err(TokenRefusal::Wrong)
    }
}

/// Where other data centers' leaders send their envelopes (docs/datacenters.md).
pub const DC_EXCHANGE_PATH: &str = "/v1/dc/exchange";

/// The GraphQL endpoint, whose WebSocket may carry the token in `connection_init`.
pub const GRAPHQL_PATH: &str = "/v1/graphql";

/// Whether a request refused for `refusal` goes through to give the token in its first message
/// instead: a WebSocket upgrade (`GET` with `Upgrade: websocket`) of [`GRAPHQL_PATH`] that sent
/// no `Authorization` header, as browsers cannot. One that sent a wrong token is refused.
pub fn token_at_connection_init(
    refusal: TokenRefusal,
    method: &str,
    path: &str,
    websocket_upgrade: bool,
) -> bool {
    refusal == TokenRefusal::Missing && websocket_upgrade && method == "GET" && path == GRAPHQL_PATH
}

/// Whether the payload of a GraphQL WebSocket's `connection_init` carries `token`, as
/// GraphQL-over-WebSocket clients send it: `{"Authorization": "Bearer <token>"}` (the key in
/// any case, the scheme as in the header) or `{"token": "<token>"}`.
pub fn check_init_token(token: &Token, payload: &serde_json::Value) -> Result<(), TokenRefusal> {
    let serde_json::Value::Object(fields) = payload else {
        return Err(TokenRefusal::Missing);
    };
    let header = fields
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case("authorization"))
        .and_then(|(_, value)| value.as_str());
    let presented = match header {
        Some(header) => bearer(header.as_bytes()),
        None => fields
            .get("token")
            .and_then(|value| value.as_str())
            .map(str::as_bytes)
            .filter(|t| !t.is_empty()),
    }
    .ok_or(TokenRefusal::Missing)?;
    if token.matches(presented) {
        Ok(())
    } else {
        Err(TokenRefusal::Wrong)
    }
}

/// Whether a GraphQL WebSocket may run mutations (a write, as a `POST` is): always without a
/// token; with one, only once the socket has shown it, in the upgrade's `Authorization`
/// header or in its `connection_init` payload (as [`check_init_token`] reads it). Reads over
/// the socket follow `http.token-for-reads` as before; a mutation asks for the token whatever
/// that says.
pub fn socket_may_write(
    token: Option<&Token>,
    authorization: Option<&[u8]>,
    init_payload: Option<&serde_json::Value>,
) -> bool {
    let Some(token) = token else { return true };
    let by_header = authorization
        .and_then(bearer)
        .is_some_and(|presented| token.matches(presented));
    by_header || init_payload.is_some_and(|payload| check_init_token(token, payload).is_ok())
}

/// The error a mutation gets over a GraphQL WebSocket that has not shown the token
/// ([`socket_may_write`]).
pub const SOCKET_MUTATION_REFUSED: &str = "a mutation needs the token of this node's \
     http.token-file: send Authorization: Bearer <token> with the WebSocket upgrade, or \
     {\"Authorization\": \"Bearer <token>\"} as the connection_init payload";

/// The two GraphQL WebSocket subprotocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphqlProtocol {
    /// `graphql-ws` (subscriptions-transport-ws, verwalter 0.13's).
    GraphqlWs,
    /// `graphql-transport-ws` (the graphql-ws library's).
    GraphqlTransportWs,
}

/// How a GraphQL WebSocket whose `connection_init` lacks the token is answered before it is
/// closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitRefused {
    /// `graphql-ws`: a `connection_error` with `message`, then the socket closes.
    ConnectionError { message: String },
    /// `graphql-transport-ws`: a close frame, 4403 `Forbidden` as that protocol says.
    Close { code: u16, reason: &'static str },
}

/// The answer to a `connection_init` refused for `refusal`.
pub fn refuse_init(protocol: GraphqlProtocol, refusal: TokenRefusal) -> InitRefused {
    match protocol {
        GraphqlProtocol::GraphqlWs => InitRefused::ConnectionError {
            message: match refusal {
                TokenRefusal::Missing => concat!(
                    "this node needs the token of its http.token-file: send ",
                    r#"{"Authorization": "Bearer <token>"} as the connection_init payload"#
                )
                .into(),
                TokenRefusal::Wrong => {
                    "the token in connection_init is not this node's (http.token-file)".into()
                }
            },
        },
        GraphqlProtocol::GraphqlTransportWs => InitRefused::Close {
            code: 4403,
            reason: "Forbidden",
        },
    }
}

/// How a GraphQL WebSocket that sent no `connection_init` within `http.idle-timeout-ms` is
/// closed (either protocol): 4408, as graphql-transport-ws says. It held one of the
/// `http.max-event-streams` slots without asking for anything.
pub const INIT_TIMEOUT_CLOSE: (u16, &str) = (4408, "Connection initialisation timeout");

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(header: &[u8]) -> Option<&[u8]> {
    let header = header.trim_ascii();
    let (scheme, rest) = header.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.first()?.is_ascii_whitespace() {
        return None;
    }
    Some(rest.trim_ascii())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_websocket_from_a_page_of_another_site_is_refused() {
        use super::websocket_allowed;
        // Not a browser: no Origin.
        assert!(websocket_allowed(Some("alpha:8379"), None));
        assert!(websocket_allowed(
            Some("alpha:8379"),
            Some("http://alpha:8379")
        ));
        assert!(websocket_allowed(
            Some("Alpha.Example.com"),
            Some("https://alpha.example.com")
        ));
        assert!(!websocket_allowed(
            Some("alpha:8379"),
            Some("http://evil.example.net")
        ));
        assert!(!websocket_allowed(
            Some("alpha:8379"),
            Some("http://alpha:9000")
        ));
        assert!(!websocket_allowed(None, Some("http://alpha:8379")));
        assert!(!websocket_allowed(Some("alpha:8379"), Some("null")));
    }

    use super::*;

    #[test]
    fn long_requests_leave_at_least_half_the_connections_to_the_rest() {
        assert_eq!(event_stream_cap(128, 512), 128, "the setting when it fits");
        assert_eq!(event_stream_cap(500, 512), 128, "a quarter at most");
        assert_eq!(long_poll_cap(512), 128);
        assert_eq!(long_poll_cap(100), 25);
        for connections in [4, 8, 100, 513] {
            assert!(
                event_stream_cap(usize::MAX, connections) + long_poll_cap(connections)
                    <= connections / 2
            );
        }
        // A tiny server still serves one of each.
        assert_eq!((event_stream_cap(128, 2), long_poll_cap(2)), (1, 1));
    }

    #[test]
    fn a_body_over_its_cap_is_refused_with_413() {
        assert_eq!(body_over_cap(100, 100), None);
        assert_eq!(
            body_over_cap(100_000_000_000, 64 << 20),
            Some(BodyRefusal::TooLarge)
        );
        assert_eq!(BodyRefusal::TooLarge.status(), 413);
        assert_eq!(BodyRefusal::Timeout.status(), 408);
        assert_eq!(BodyRefusal::NoBudget.status(), 503);
        assert!(BodyRefusal::TooLarge.message(10).contains("over 10 bytes"));
    }

    #[test]
    fn connections_are_capped_by_half_the_descriptors() {
        assert_eq!(connection_cap(512, None), 512);
        assert_eq!(connection_cap(512, Some(1024)), 512);
        assert_eq!(connection_cap(512, Some(256)), 128);
        assert_eq!(connection_cap(512, Some(1)), 1, "at least one");
        assert_eq!(connection_cap(0, None), 1);
    }

    #[test]
    fn the_oldest_idle_connection_goes_then_the_oldest_not_reading() {
        let (idle, busy, stuck) = (
            InUse::default(),
            InUse {
                busy: true,
                ..InUse::default()
            },
            InUse {
                busy: true,
                blocked: true,
                ..InUse::default()
            },
        );
        let slow_body = InUse {
            busy: true,
            receiving: true,
            ..InUse::default()
        };
        assert_eq!(evict([(1, busy), (2, slow_body), (3, idle)]), Some(3));
        assert_eq!(
            evict([(1, busy), (2, slow_body), (3, stuck)]),
            Some(2),
            "a body that has not all come holds its connection no better than a reader that stopped"
        );
        assert_eq!(evict([(1, busy), (2, idle), (3, idle)]), Some(2));
        assert_eq!(evict([(1, busy), (2, stuck), (3, stuck)]), Some(2));
        assert_eq!(
            evict([(1, stuck), (2, busy), (3, idle)]),
            Some(3),
            "an idle one before any client that is not reading"
        );
        assert_eq!(evict([(1, busy), (2, busy)]), None, "all at work");
        assert_eq!(evict(Vec::<(u64, InUse)>::new()), None);
    }

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
        assert_eq!(
            origin_authority("https://user@ops.example:8443/x").as_deref(),
            Some("ops.example:8443")
        );
        assert_eq!(origin_authority("null"), None);
        assert_eq!(origin_authority("http:///path"), None);
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

    const NAMES: Names<'static> = Names {
        name: "alpha.example.com.",
        hostname: "alpha",
        allowed: &[],
    };

    fn get(host: &str) -> Asked<'_> {
        Asked {
            method: "GET",
            host: Some(host),
            ..Asked::default()
        }
    }

    #[test]
    fn only_names_of_this_node_pass_as_host() {
        for host in [
            "127.0.0.1:8379",
            "[::1]:8379",
            "localhost",
            "verwalter:8379",
            "web.localhost",
            "ALPHA.example.com",
            "alpha.example.com.:8379",
        ] {
            assert_eq!(judge(NAMES, get(host)), None, "{host}");
        }
        assert_eq!(
            judge(NAMES, get("Evil.Example:8379")),
            Some(Refusal::UnknownHost("evil.example:8379".into())),
            "a rebinding name, reported lowercase"
        );
        let allowed = ["ops.example".to_string()];
        let listed = Names {
            allowed: &allowed,
            ..NAMES
        };
        assert_eq!(judge(listed, get("ops.example")), None);
        assert!(judge(listed, get("other.example")).is_some());
        let any = ["*".to_string()];
        let open = Names {
            allowed: &any,
            ..NAMES
        };
        assert_eq!(judge(open, get("other.example")), None);
        // No Host at all (HTTP/1.0 clients) is not refused for it.
        assert_eq!(judge(NAMES, Asked::default()), None);
    }

    #[test]
    fn requests_that_change_state_must_come_from_this_origin_without_a_form_body() {
        let post = |source, content_type| Asked {
            method: "POST",
            host: Some("alpha:8379"),
            source,
            content_type,
        };
        assert_eq!(judge(NAMES, post(None, Some("application/json"))), None);
        assert_eq!(
            judge(NAMES, post(Some("http://alpha:8379/roles/web"), None)),
            None
        );
        assert_eq!(
            judge(NAMES, post(Some("http://evil.example"), None)),
            Some(Refusal::CrossSite("http://evil.example".into()))
        );
        assert_eq!(
            judge(NAMES, post(Some("null"), None)),
            Some(Refusal::CrossSite("null".into()))
        );
        for form in [
            "text/plain",
            "Text/Plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            assert_eq!(
                judge(NAMES, post(None, Some(form))),
                Some(Refusal::FormBody),
                "{form}"
            );
        }
        // Reading is never refused for its origin or body type.
        let read = Asked {
            method: "GET",
            ..post(Some("http://evil.example"), Some("text/plain"))
        };
        assert_eq!(judge(NAMES, read), None);
        // A cross-site request without a Host cannot be the same origin.
        let hostless = Asked {
            host: None,
            ..post(Some("http://alpha:8379"), None)
        };
        assert!(matches!(
            judge(NAMES, hostless),
            Some(Refusal::CrossSite(_))
        ));
    }

    const SECRET: &[u8] = b"s3cret-token-0123456789";

    #[test]
    fn a_token_file_holds_sixteen_visible_ascii_bytes_or_more() {
        let token = Token::from_file_bytes(b"  s3cret-token-0123456789\n").unwrap();
        assert!(token.matches(SECRET), "surrounding whitespace is dropped");
        assert_eq!(format!("{token:?}"), "Token(hidden)");
        assert_eq!(
            Token::from_file_bytes(b"short\n"),
            Err(TokenProblem::TooShort(5))
        );
        assert_eq!(Token::from_file_bytes(b""), Err(TokenProblem::TooShort(0)));
        assert_eq!(
            Token::from_file_bytes(b"sixteen bytes or more"),
            Err(TokenProblem::NotVisibleAscii)
        );
        assert_eq!(
            Token::from_file_bytes("s3cret-töken-0123456789".as_bytes()),
            Err(TokenProblem::NotVisibleAscii)
        );
    }

    #[test]
    fn only_the_token_itself_matches() {
        let token = Token::from_file_bytes(SECRET).unwrap();
        assert!(token.matches(SECRET));
        assert!(!token.matches(b""));
        assert!(!token.matches(&SECRET[..SECRET.len() - 1]), "a prefix");
        assert!(
            !token.matches(b"s3cret-token-0123456789s3cret-token-0123456789"),
            "repeated"
        );
        assert!(!token.matches(b"S3cret-token-0123456789"), "case counts");
        assert!(!token.matches(b"s3cret-token-0123456780"));
    }

    #[test]
    fn everything_but_reads_needs_the_token_and_reads_of_the_api_when_asked() {
        let writes = TokenScope { reads: false };
        let reads = TokenScope { reads: true };
        for method in ["POST", "PUT", "DELETE", "PATCH", "FOO"] {
            for path in [
                "/v1/action",
                "/v1/force_render_all",
                "/v1/status",
                "/",
                "/nope",
            ] {
                assert!(needs_token(writes, method, path), "{method} {path}");
            }
        }
        for path in [
            "/v1/status",
            "/v1/events",
            "/metrics",
            "/",
            "/common/app.js",
        ] {
            assert!(!needs_token(writes, "GET", path), "{path}");
            assert!(!needs_token(writes, "HEAD", path), "{path}");
        }
        for path in [
            "/v1",
            "/v1/status",
            "/v1/log/global/latest",
            "/v1/events",
            "/v1/graphql",
            "/metrics",
        ] {
            assert!(needs_token(reads, "GET", path), "{path}");
            assert!(needs_token(reads, "HEAD", path), "{path}");
            assert!(!needs_token(reads, "OPTIONS", path), "{path}");
        }
        // The frontend's files and pages load without it, so the page can ask for it.
        for path in [
            "/",
            "/common/app.js",
            "/~ops/index.html",
            "/roles/web",
            "/v1x",
            "/v1/graphiql",
        ] {
            assert!(!needs_token(reads, "GET", path), "{path}");
        }
        assert!(needs_token(reads, "GET", "/v1/graphql"));
        assert!(needs_token(writes, "POST", "/v1/graphql"));
        // The exchange between DCs is signed with the election's key instead.
        assert!(!needs_token(reads, "POST", DC_EXCHANGE_PATH));
        assert!(needs_token(writes, "PUT", DC_EXCHANGE_PATH));
        assert!(needs_token(reads, "GET", DC_EXCHANGE_PATH));
    }

    #[test]
    fn the_bearer_header_is_checked_when_a_token_is_set() {
        let token = Token::from_file_bytes(SECRET).unwrap();
        let writes = TokenScope::default();
        let post = |authorization: Option<&[u8]>| {
            check_token(Some(&token), writes, "POST", "/v1/action", authorization)
        };
        assert_eq!(post(Some(b"Bearer s3cret-token-0123456789")), Ok(()));
        assert_eq!(post(Some(b"bearer   s3cret-token-0123456789 ")), Ok(()));
        assert_eq!(post(None), Err(TokenRefusal::Missing));
        assert_eq!(post(Some(b"Basic czNjcmV0")), Err(TokenRefusal::Missing));
        assert_eq!(post(Some(b"Bearer")), Err(TokenRefusal::Missing));
        assert_eq!(
            post(Some(b"Bearers3cret-token-0123456789")),
            Err(TokenRefusal::Missing)
        );
        assert_eq!(
            post(Some(b"Bearer wrong-token-0123456789")),
            Err(TokenRefusal::Wrong)
        );
        assert_eq!(post(Some(b"Bearer ")), Err(TokenRefusal::Missing));
        // Reads pass without it by default; with no token set, nothing is checked.
        assert_eq!(
            check_token(Some(&token), writes, "GET", "/v1/status", None),
            Ok(())
        );
        assert_eq!(
            check_token(None, writes, "POST", "/v1/action", None),
            Ok(())
        );
        assert_eq!(
            check_token(
                Some(&token),
                TokenScope { reads: true },
                "GET",
                "/v1/status",
                None
            ),
            Err(TokenRefusal::Missing)
        );
    }

    #[test]
    fn only_a_graphql_websocket_without_a_header_may_give_the_token_in_connection_init() {
        use TokenRefusal::{Missing, Wrong};
        assert!(token_at_connection_init(
            Missing,
            "GET",
            "/v1/graphql",
            true
        ));
        // A wrong header is refused at the upgrade; so is anything but the upgrade of
        // /v1/graphql.
        assert!(!token_at_connection_init(Wrong, "GET", "/v1/graphql", true));
        assert!(!token_at_connection_init(
            Missing,
            "GET",
            "/v1/graphql",
            false
        ));
        assert!(!token_at_connection_init(
            Missing,
            "POST",
            "/v1/graphql",
            true
        ));
        assert!(!token_at_connection_init(
            Missing,
            "GET",
            "/v1/events",
            true
        ));
        assert!(!token_at_connection_init(
            Missing,
            "GET",
            "/v1/graphql.json",
            true
        ));
    }

    #[test]
    fn a_connection_init_payload_carries_the_token_as_clients_send_it() {
        use serde_json::json;
        let token = Token::from_file_bytes(SECRET).unwrap();
        let check = |payload| check_init_token(&token, &payload);
        for good in [
            json!({"Authorization": "Bearer s3cret-token-0123456789"}),
            json!({"authorization": "Bearer s3cret-token-0123456789"}),
            json!({"AUTHORIZATION": "bearer  s3cret-token-0123456789"}),
            json!({"token": "s3cret-token-0123456789"}),
            json!({"token": "s3cret-token-0123456789", "other": 1}),
        ] {
            assert_eq!(check(good.clone()), Ok(()), "{good}");
        }
        for missing in [
            json!(null),
            json!({}),
            json!("Bearer s3cret-token-0123456789"),
            json!({"Authorization": "s3cret-token-0123456789"}),
            json!({"Authorization": 5}),
            json!({"token": ""}),
            json!({"token": ["s3cret-token-0123456789"]}),
            json!({"headers": {"Authorization": "Bearer s3cret-token-0123456789"}}),
        ] {
            assert_eq!(
                check(missing.clone()),
                Err(TokenRefusal::Missing),
                "{missing}"
            );
        }
        for wrong in [
            json!({"Authorization": "Bearer wrong-token-0123456789"}),
            json!({"token": "s3cret-token-012345678"}),
            // The header form is taken first, as the browser page sends it.
            json!({"Authorization": "Bearer wrong-token-0123456789",
                   "token": "s3cret-token-0123456789"}),
        ] {
            assert_eq!(check(wrong.clone()), Err(TokenRefusal::Wrong), "{wrong}");
        }
    }

    #[test]
    fn a_socket_runs_mutations_only_once_it_has_shown_the_token() {
        use serde_json::json;
        let token = Token::from_file_bytes(SECRET).unwrap();
        let header = b"Bearer s3cret-token-0123456789".as_slice();
        let init = json!({"Authorization": "Bearer s3cret-token-0123456789"});
        // No token configured: every socket may.
        assert!(socket_may_write(None, None, None));
        // The token on the upgrade or in connection_init.
        assert!(socket_may_write(Some(&token), Some(header), None));
        assert!(socket_may_write(Some(&token), None, Some(&init)));
        assert!(socket_may_write(
            Some(&token),
            None,
            Some(&json!({"token": "s3cret-token-0123456789"}))
        ));
        // Not shown, or another one.
        assert!(!socket_may_write(Some(&token), None, None));
        assert!(!socket_may_write(Some(&token), None, Some(&json!({}))));
        assert!(!socket_may_write(
            Some(&token),
            Some(b"Bearer wrong-token-0123456789"),
            Some(&json!({"token": "wrong-token-0123456789"}))
        ));
        assert!(!socket_may_write(
            Some(&token),
            Some(b"s3cret-token-0123456789"),
            None
        ));
    }

    #[test]
    fn a_refused_connection_init_is_answered_as_each_protocol_says() {
        assert_eq!(
            refuse_init(GraphqlProtocol::GraphqlTransportWs, TokenRefusal::Missing),
            InitRefused::Close {
                code: 4403,
                reason: "Forbidden"
            }
        );
        assert_eq!(
            refuse_init(GraphqlProtocol::GraphqlTransportWs, TokenRefusal::Wrong),
            InitRefused::Close {
                code: 4403,
                reason: "Forbidden"
            }
        );
        let InitRefused::ConnectionError { message } =
            refuse_init(GraphqlProtocol::GraphqlWs, TokenRefusal::Missing)
        else {
            panic!("graphql-ws answers with connection_error");
        };
        // The whole sentence, as one line (a `\` continuation once left a run of spaces in it).
        assert_eq!(
            message,
            "this node needs the token of its http.token-file: send \
             {\"Authorization\": \"Bearer <token>\"} as the connection_init payload"
        );
        let InitRefused::ConnectionError { message } =
            refuse_init(GraphqlProtocol::GraphqlWs, TokenRefusal::Wrong)
        else {
            panic!("graphql-ws answers with connection_error");
        };
        assert!(message.contains("not this node's"), "{message}");
    }
}
