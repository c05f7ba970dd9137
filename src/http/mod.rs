//! The HTTP API (verwalter 0.13's routes and shapes), `/metrics` and the web frontends.
//!
//! [`router`] builds the whole app from its state, apart from serving, so tests call it without
//! a socket. Every `/v1/<name>` route also answers as `/v1/<name>.json` (the same) and
//! `/v1/<name>.pretty` (indented JSON).

mod actions;
mod api;
pub(crate) use api::RELAY_WAIT_MAX;
mod body;
mod datacenters;
mod error;
mod events;
mod files;
mod frontend;
mod graphql;
mod guard;
pub(crate) mod metrics;
mod query;
mod serve;
mod shadow;
mod shadow_render;
pub(crate) use shadow_render::ShadowDirs;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use verwalter_controllers::http::access;

use crate::cluster::coding::Coding;
use verwalter_controllers::machinery::store::Field;
use verwalter_controllers::node::Store;

pub use api::version;
pub(crate) use error::ApiError;
pub use graphql::{MAX_EXPANDED_SELECTIONS, query_cost};
#[cfg(test)]
use serve::ConnectionHandle;
pub(crate) use serve::Holding;
pub(crate) use serve::{
    HttpSettings, ServeLimits, connection_cap, raise_nofile_limit, serve, serve_on,
};
/// Who this node is, for `/v1/status` and friends.
pub(crate) use verwalter_controllers::status::NodeInfo;

use crate::metrics::Metrics;

/// What every handler gets.
#[derive(Debug, Clone)]
pub struct AppState {
    pub store: Store,
    /// The leader's pending operator actions.
    pub actions: Arc<verwalter_controllers::actions::ActionQueue>,
    /// The deployment log: served under `/v1/log/`, and the audit line of each action (absent in
    /// some tests).
    pub logs: Option<Arc<crate::storage::logs::LogDir>>,
    /// `sandbox/*.yaml` `log-dirs`, served under `/v1/log/external/`.
    pub log_dirs: Arc<std::collections::BTreeMap<String, std::path::PathBuf>>,
    /// `<storage>/backups`.
    pub backups_dir: std::path::PathBuf,
    /// `POST /v1/force_render_all` bumps it.
    pub force_render: Arc<Field<u64>>,
    pub metrics: Arc<Metrics>,
    pub node: Arc<NodeInfo>,
    /// `<config-dir>/frontend`: alternative frontends, served under `/~<name>/`.
    pub frontend_dir: std::path::PathBuf,
    /// `<config-dir>/scheduler/v1`: its `scheduler.wasm` and `query.wasm` are served under
    /// `/v1/wasm/`.
    pub scheduler_dir: std::path::PathBuf,
    /// `scheduler/v1/query.wasm`, shared with the render controller (`/v1/query`).
    pub query: crate::schedule::wasm::query::QueryHook,
    pub http: Arc<HttpState>,
    /// When each peer was last heard from directly (empty without peers), and how recently it
    /// must have been for `/v1/peers` to call it `alive` (`election.minority-window-ms`).
    pub liveness: crate::cluster::peers::Liveness,
    pub alive_window: std::time::Duration,
    /// This node's side of the exchange between data centers (`POST /v1/dc/exchange`); `None`
    /// when the node is in no DC.
    pub datacenters: Option<Arc<crate::cluster::datacenters::DcNode>>,
}

/// The HTTP server's limits, and the `/v1/events` streams open under them.
#[derive(Debug)]
pub struct HttpState {
    pub(crate) settings: HttpSettings,
    /// Event streams allowed at once: see [`event_stream_cap`].
    max_streams: usize,
    streams: Arc<tokio::sync::Semaphore>,
    /// Long polls allowed at once: see [`long_poll_cap`].
    max_long_polls: usize,
    long_polls: Arc<tokio::sync::Semaphore>,
    /// `/v1/schedule`'s body, serialized once per schedule and shared by every response.
    pub(crate) schedule_json: Arc<SharedJson<Option<verwalter_controllers::state::Schedule>>>,
    /// The leader's schedule this node is taking, as it came, for the followers that fetch
    /// through this node (written by the fetcher).
    pub(crate) relay: Arc<RelayBody>,
    /// `/v1/graphql`'s schema, built at first use.
    graphql: graphql::SchemaCell,
    /// The leader's shadow schedulers (`/v1/shadow`); none in tests that do not ask.
    pub(crate) shadows: Option<crate::schedule::shadow::Shadows>,
    /// `POST /v1/shadow/render/<role>`'s dirs (none: the route answers 500).
    pub(crate) shadow_render: Option<Arc<ShadowDirs>>,
    /// The etcd backend's status view (docs/etcd.md#status-and-metrics), written by its task;
    /// `None` with the built-in election.
    pub(crate) election_backend: BackendView,
}

/// The election backend's part of `/v1/status` and `/v1/election`, as JSON: `None` for the
/// built-in election.
pub(crate) type BackendView = Arc<std::sync::Mutex<Option<serde_json::Value>>>;

/// The compressed body of the leader's schedule that this follower received, by its hash, kept
/// from the moment it arrived: the followers fetching through this node (its relay children)
/// get these very bytes without waiting for this node to check, store and take the schedule,
/// and without it serializing and compressing the schedule again. Passing bytes on unchecked
/// is safe because every follower checks the hash itself; a body that fails this node's check
/// is withdrawn.
#[derive(Debug)]
pub(crate) struct RelayBody {
    body: tokio::sync::watch::Sender<Option<Relayed>>,
}

/// A body held for relay children: the schedule's hash, the body's coding, the body.
pub(crate) type Relayed = (String, Coding, axum::body::Bytes);

impl Default for RelayBody {
    fn default() -> Self {
        RelayBody {
            body: tokio::sync::watch::Sender::new(None),
        }
    }
}

impl RelayBody {
    /// The body of schedule `hash`, in `coding`, has arrived.
    pub(crate) fn offer(&self, hash: &str, coding: Coding, body: axum::body::Bytes) {
        self.body
            .send_replace(Some((hash.to_string(), coding, body)));
    }

    /// The body of `hash` turned out bad: it is no longer passed on.
    pub(crate) fn withdraw(&self, hash: &str) {
        self.body.send_if_modified(|body| {
            let bad = body.as_ref().is_some_and(|(h, _, _)| h == hash);
            if bad {
                *body = None;
            }
            bad
        });
    }

    /// The body of `hash` and its coding, if it is the one here.
    pub(crate) fn get(&self, hash: &str) -> Option<(Coding, axum::body::Bytes)> {
        let body = self.body.borrow();
        let (held, coding, bytes) = body.as_ref()?;
        (held == hash).then(|| (*coding, bytes.clone()))
    }

    /// Wakes when a body is offered or withdrawn.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<Option<Relayed>> {
        self.body.subscribe()
    }
}

/// Whether a request body is declared JSON (`Content-Type: application/json`, any parameters):
/// the POST routes that read one refuse anything else with 415.
pub(crate) fn sends_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let media = v.split(';').next().unwrap_or("").trim();
            media.eq_ignore_ascii_case("application/json")
        })
}

/// A JSON body serialized once per store snapshot and shared by every response: `Bytes` is
/// reference-counted, so a client that does not read its answer holds a reference to the one
/// buffer, not a copy (512 stalled clients of a 1 MB schedule hold 1 MB, not 512). Its
/// compressed forms are made the first time a client asks for one, once per snapshot as well.
#[derive(Debug)]
pub(crate) struct SharedJson<T> {
    /// The snapshot the body was made from, held so that its address cannot be reused by a
    /// new snapshot while it is compared by pointer.
    slot: std::sync::Mutex<Option<Shared<T>>>,
    /// Writes a snapshot's JSON (serde_json's, unless the type writes its own faster).
    write: fn(&T) -> Vec<u8>,
}

#[derive(Debug)]
struct Shared<T> {
    snapshot: Arc<T>,
    json: axum::body::Bytes,
    /// The gzip and the LZ4 body, once made.
    gzip: Option<axum::body::Bytes>,
    lz4: Option<axum::body::Bytes>,
}

impl<T: serde::Serialize> Default for SharedJson<T> {
    fn default() -> Self {
        SharedJson {
            slot: std::sync::Mutex::new(None),
            write: |snapshot| serde_json::to_vec(snapshot).expect("store values serialize to JSON"),
        }
    }
}

impl SharedJson<Option<verwalter_controllers::state::Schedule>> {
    /// The schedule in force: its data's canonical text is copied into the envelope as it is
    /// (`Schedule::write_json`), not parsed again.
    pub(crate) fn schedule() -> Self {
        SharedJson {
            slot: std::sync::Mutex::new(None),
            write: |snapshot| match snapshot {
                Some(schedule) => {
                    let mut out = Vec::new();
                    schedule.write_json(&mut out);
                    out
                }
                None => b"null".to_vec(),
            },
        }
    }
}

impl<T> SharedJson<T> {
    /// The body for `snapshot`: the shared one if it was made from this very snapshot.
    #[cfg(test)]
    pub(crate) fn body(&self, snapshot: &Arc<T>) -> axum::body::Bytes {
        let mut slot = self.slot.lock().unwrap();
        self.fill(&mut slot, snapshot).json.clone()
    }

    /// The body for `snapshot` in `coding` (see [`crate::cluster::coding`]; a 1 MiB schedule
    /// of service definitions shrinks about fivefold in about a millisecond, once).
    pub(crate) fn encoded(&self, snapshot: &Arc<T>, coding: Coding) -> axum::body::Bytes {
        let mut slot = self.slot.lock().unwrap();
        let shared = self.fill(&mut slot, snapshot);
        let held = match coding {
            Coding::Identity => return shared.json.clone(),
            Coding::Gzip => &mut shared.gzip,
            Coding::Lz4 => &mut shared.lz4,
        };
        held.get_or_insert_with(|| coding.encode(&shared.json).into())
            .clone()
    }

    fn fill<'a>(&self, slot: &'a mut Option<Shared<T>>, snapshot: &Arc<T>) -> &'a mut Shared<T> {
        if !slot
            .as_ref()
            .is_some_and(|held| Arc::ptr_eq(&held.snapshot, snapshot))
        {
            *slot = Some(Shared {
                snapshot: snapshot.clone(),
                json: axum::body::Bytes::from((self.write)(snapshot)),
                gzip: None,
                lz4: None,
            });
        }
        slot.as_mut().expect("set above")
    }
}

impl HttpState {
    /// `settings.max_connections` is the cap in force (see [`connection_cap`]).
    pub(crate) fn new(settings: HttpSettings) -> HttpState {
        let max_streams = event_stream_cap(&settings);
        let max_long_polls = long_poll_cap(&settings);
        HttpState {
            max_streams,
            streams: Arc::new(tokio::sync::Semaphore::new(max_streams)),
            max_long_polls,
            long_polls: Arc::new(tokio::sync::Semaphore::new(max_long_polls)),
            schedule_json: Arc::new(SharedJson::schedule()),
            relay: Arc::default(),
            graphql: graphql::SchemaCell::default(),
            shadows: None,
            shadow_render: None,
            election_backend: BackendView::default(),
            settings,
        }
    }

    /// The same, showing the election backend's view written in `view`.
    pub(crate) fn with_election_backend(mut self, view: BackendView) -> HttpState {
        self.election_backend = view;
        self
    }

    /// The same, doing shadow renders in `dirs`.
    pub(crate) fn with_shadow_render(mut self, dirs: ShadowDirs) -> HttpState {
        self.shadow_render = Some(Arc::new(dirs));
        self
    }

    /// The same, serving the schedule from `bodies` (shared with the election task, which
    /// announces the hash of the LZ4 body, see [`crate::cluster::vouch`]).
    pub(crate) fn with_schedule_json(
        mut self,
        bodies: Arc<SharedJson<Option<verwalter_controllers::state::Schedule>>>,
    ) -> HttpState {
        self.schedule_json = bodies;
        self
    }

    /// The same, showing `shadows` under `/v1/shadow`.
    pub(crate) fn with_shadows(mut self, shadows: crate::schedule::shadow::Shadows) -> HttpState {
        self.shadows = Some(shadows);
        self
    }

    /// The same, passing on the bodies the fetcher offers to `relay`.
    pub(crate) fn with_relay(mut self, relay: Arc<RelayBody>) -> HttpState {
        self.relay = relay;
        self
    }
}

/// Event streams allowed at once ([`access::event_stream_cap`]).
pub(crate) fn event_stream_cap(settings: &HttpSettings) -> usize {
    access::event_stream_cap(settings.max_event_streams, settings.max_connections)
}

impl Default for HttpState {
    fn default() -> Self {
        HttpState::new(HttpSettings::default())
    }
}

/// Long polls allowed at once ([`access::long_poll_cap`]).
pub(crate) fn long_poll_cap(settings: &HttpSettings) -> usize {
    access::long_poll_cap(settings.max_connections)
}

/// Routes that may wait long for something to happen before they answer.
const LONG_POLLS: [&str; 3] = [
    "wait_action",
    "/v1/leader-redirect-by-node-name",
    "/v1/leader-redirect-by-node-name/{*tail}",
];

/// Runs a long poll if one of [`long_poll_cap`] slots is free, else answers 503.
async fn long_poll_slot(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_slot) = state.http.long_polls.clone().try_acquire_owned() else {
        return ApiError::unavailable(
            format!(
                "{} requests that wait (wait_action, leader redirects) are in progress, the \
                 most this node serves; retry later",
                state.http.max_long_polls
            ),
            "5",
        )
        .into_response();
    };
    next.run(request).await
}

/// Largest body the `.pretty` formatter re-reads; far above any schedule we serve.
const PRETTY_LIMIT: usize = 256 << 20;

/// Routes of the `/v1/<name>` form that also answer as `<name>.json` and `<name>.pretty`, with
/// their methods (shown by `/v1/routes` and the frontend's API page).
fn formatted_routes() -> Vec<(&'static str, &'static str, MethodRouter<AppState>)> {
    vec![
        ("status", "GET", get(api::status)),
        ("schedule", "GET", get(api::schedule)),
        ("scheduler_input", "GET", get(api::scheduler_input)),
        (
            "scheduler_debug_info",
            "GET",
            get(api::scheduler_debug_info),
        ),
        ("election", "GET", get(api::election)),
        ("peers", "GET", get(api::peers)),
        ("datacenters", "GET", get(datacenters::list)),
        ("roles_data", "GET", get(api::roles_data)),
        // POST only: 0.13 took any method, but a GET that re-renders everything is one
        // prefetching browser away from an accident.
        ("force_render_all", "POST", post(api::force_render_all)),
        ("action", "POST", post(actions::action)),
        ("wait_action", "POST", post(actions::wait_action)),
        ("pending_actions", "GET", get(actions::pending_actions)),
        ("backups", "GET", get(files::backups)),
        ("routes", "GET", get(routes)),
        ("shadow", "GET", get(shadow::shadows)),
    ]
}

/// The other routes, by path, with their methods.
fn plain_routes() -> Vec<(&'static str, &'static str, MethodRouter<AppState>)> {
    vec![
        ("/", "GET", get(frontend::index)),
        ("/common/{*file}", "GET", get(frontend::asset)),
        ("/metrics", "GET", get(api::metrics)),
        ("/v1/openapi.yaml", "GET", get(openapi)),
        ("/v1/schedule/{hash}", "GET", get(api::schedule_by_hash)),
        ("/v1/events", "GET", get(events::events)),
        (
            "/v1/graphql",
            "GET POST",
            get(graphql::socket).post(graphql::post),
        ),
        ("/v1/graphiql", "GET", get(graphql::graphiql)),
        ("/v1/log/role/{role}/{file}", "GET", get(files::log_role)),
        (
            "/v1/log/external/{name}/{*path}",
            "GET",
            get(files::log_external),
        ),
        ("/v1/log/{stream}/{file}", "GET", get(files::log_stream)),
        ("/v1/backup/{name}", "GET", get(files::backup)),
        ("/v1/shadow/{name}/runs", "GET", get(shadow::runs)),
        ("/v1/shadow/{name}/runs/{id}", "GET", get(shadow::run)),
        ("/v1/wasm/{name}", "GET", get(files::wasm_module)),
        ("/v1/query/{*path}", "POST", post(query::query)),
        // Issue 34, shadow renders.
        (
            "/v1/shadow/render/{role}",
            "POST",
            post(shadow_render::shadow_render),
        ),
        (
            verwalter_controllers::http::access::DC_EXCHANGE_PATH,
            "POST",
            post(datacenters::exchange),
        ),
        (
            "/v1/action_is_pending/{id}",
            "GET",
            get(actions::action_is_pending),
        ),
        (
            "/v1/leader-redirect-by-node-name",
            "GET",
            get(api::leader_redirect),
        ),
        (
            "/v1/leader-redirect-by-node-name/{*tail}",
            "GET",
            get(api::leader_redirect_tail),
        ),
    ]
}

/// Every route path the router serves (`docs/openapi.yaml` must describe each; a test checks).
#[cfg(test)]
pub(crate) fn route_paths() -> Vec<String> {
    route_table().into_iter().map(|r| r.path).collect()
}

/// One row of the route table, as `/v1/routes` lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct RouteInfo {
    /// As axum writes it: `/v1/log/role/{role}/{file}`, `/common/{*file}`.
    pub(crate) path: String,
    pub(crate) methods: Vec<&'static str>,
    /// Whether `<path>.json` and `<path>.pretty` answer too.
    pub(crate) formats: bool,
}

/// The route table: every route the router serves, in its order.
pub(crate) fn route_table() -> Vec<RouteInfo> {
    let info = |path: String, methods: &'static str, formats| RouteInfo {
        path,
        methods: methods.split(' ').collect(),
        formats,
    };
    let mut table: Vec<RouteInfo> = formatted_routes()
        .into_iter()
        .map(|(name, methods, _)| info(format!("/v1/{name}"), methods, true))
        .collect();
    table.extend(
        plain_routes()
            .into_iter()
            .map(|(path, methods, _)| info(path.to_string(), methods, false)),
    );
    table
}

/// `GET /v1/routes`: the route table.
async fn routes() -> axum::Json<Vec<RouteInfo>> {
    axum::Json(route_table())
}

/// `docs/openapi.yaml`, built into the binary.
const OPENAPI: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml"));

/// `GET /v1/openapi.yaml`: the OpenAPI description of these routes, as text a browser shows.
async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        OPENAPI,
    )
        .into_response()
}

/// The whole HTTP app.
pub fn router(state: AppState) -> Router {
    let long_poll = |name: &str, route: MethodRouter<AppState>| {
        if LONG_POLLS.contains(&name) {
            route.route_layer(middleware::from_fn_with_state(
                state.clone(),
                long_poll_slot,
            ))
        } else {
            route
        }
    };
    let mut app = Router::new();
    for (name, _, route) in formatted_routes() {
        app = with_formats(app, name, long_poll(name, route));
    }
    for (path, _, route) in plain_routes() {
        app = app.route(path, long_poll(path, route));
    }
    app.route("/v1/{*rest}", axum::routing::any(api::unknown_api))
        .fallback(frontend::fallback)
        .layer(middleware::from_fn(pretty))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::same_site,
        ))
        .layer(middleware::from_fn(security_headers))
        .with_state(state)
}

/// The Content-Security-Policy of every response that brings none of its own (the built-in
/// frontend, the API, errors): scripts, styles, images and connections (fetches, WebSockets)
/// from this node only, no inline script or style, no plugins, no `<base>`, forms posting only
/// here, and no page of another site may frame it (`frame-ancestors 'none'`: clickjacking).
/// Log files send their own (`sandbox`), and alternative frontends only [`FRAME_POLICY`].
pub(crate) const PAGE_POLICY: &str = "default-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// The policy of alternative frontends (`/~<name>/`): their files are the operator's, who knows
/// what they load; no other site may frame them.
pub(crate) const FRAME_POLICY: &str = "frame-ancestors 'none'";

/// Headers of every response, whatever route or refusal made it: [`PAGE_POLICY`] unless it
/// has a policy of its own, `X-Frame-Options: DENY` (browsers without `frame-ancestors`),
/// `X-Content-Type-Options: nosniff` (a body is only ever the type it is sent as) and
/// `Referrer-Policy: same-origin` (the node's addresses and paths are not sent to other sites
/// a page links to; its own requests keep theirs).
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    no_sniffing(headers, PAGE_POLICY);
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// `X-Content-Type-Options: nosniff` (no guessing another type from the bytes), and `policy` as
/// the `Content-Security-Policy` unless the response has one of its own: every response gets
/// these (`security_headers`), and a served file its own, stricter policy first
/// (`files::inert`).
pub(super) fn no_sniffing(headers: &mut axum::http::HeaderMap, policy: &'static str) {
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(policy),
        );
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

fn with_formats(
    app: Router<AppState>,
    name: &str,
    route: MethodRouter<AppState>,
) -> Router<AppState> {
    app.route(&format!("/v1/{name}"), route.clone())
        .route(&format!("/v1/{name}.json"), route.clone())
        .route(&format!("/v1/{name}.pretty"), route)
}

/// Re-indents JSON responses of `.pretty` routes.
async fn pretty(request: Request, next: Next) -> Response {
    let wants_pretty = request.uri().path().ends_with(".pretty");
    let response = next.run(request).await;
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !wants_pretty || !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, PRETTY_LIMIT).await else {
        return ApiError::internal("response too large to indent").into_response();
    };
    let body = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(value) => {
            let mut text = serde_json::to_vec_pretty(&value).expect("a JSON value serializes");
            text.push(b'\n');
            text
        }
        Err(_) => bytes.to_vec(),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_graphql;
