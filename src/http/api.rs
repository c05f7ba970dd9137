//! Handlers of the `/v1/` routes, `/metrics` and the index page.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use verwalter_controllers::cluster::election::ElectionState;
use verwalter_controllers::cluster::election::transport;
use verwalter_controllers::machinery::clock::rfc3339;
use verwalter_controllers::machinery::clock::{Clock, SystemClock};
use verwalter_controllers::render::deployment_id;
use verwalter_controllers::render::vars;
use verwalter_controllers::status::{self, Snapshot, Status};

use super::{ApiError, AppState};
use crate::cluster::coding::Coding;

/// The version string peers and tools see, `v` + the package version as in 0.13.
pub fn version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

/// This node's status now (see [`status::view`]).
pub(crate) fn build_status(state: &AppState) -> Status {
    let snapshot = Snapshot::take(&state.store);
    status::view(&state.node, &snapshot, state.metrics.scheduler_runs())
}

/// `/v1/status`: the status, with the election backend (`election_backend`: `builtin` or
/// `etcd`, and with etcd its view under `etcd`).
pub(crate) async fn status(State(state): State<AppState>) -> Json<Value> {
    let mut status = serde_json::to_value(build_status(&state)).unwrap_or_default();
    with_backend(&state, &mut status);
    Json(status)
}

/// Adds `election_backend` (and with etcd, `etcd`) to the object `value`.
fn with_backend(state: &AppState, value: &mut Value) {
    let etcd = state.http.election_backend.lock().unwrap().clone();
    if let Value::Object(map) = value {
        let name = if etcd.is_some() { "etcd" } else { "builtin" };
        map.insert("election_backend".into(), Value::from(name));
        if let Some(etcd) = etcd {
            map.insert("etcd".into(), etcd);
        }
    }
}

pub(crate) async fn schedule(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let schedule = state.store.schedule.peek();
    if schedule.is_none() {
        return Err(ApiError::not_found("no schedule yet"));
    }
    Ok(schedule_body(&state, schedule, &headers).await)
}

/// The schedule in force as a response shared with other responses (see `SharedJson`),
/// compressed for a client that takes it (peers of this version do, see
/// [`crate::cluster::coding`]; 0.13 peers and most tools get plain JSON). Counted in
/// `verwalter_schedule_served_bytes_total`. The body of a new schedule is made on a blocking
/// thread: a megabyte takes milliseconds to serialize and compress, which the runtime's other
/// tasks (the election's among them) must not wait.
async fn schedule_body(
    state: &AppState,
    schedule: std::sync::Arc<Option<verwalter_controllers::state::Schedule>>,
    headers: &HeaderMap,
) -> Response {
    let coding = Coding::for_request(headers);
    let http = state.http.clone();
    let made = tokio::task::spawn_blocking(move || http.schedule_json.encoded(&schedule, coding));
    let Ok(body) = made.await else {
        return ApiError::internal("the schedule body could not be made").into_response();
    };
    coded_schedule(state, coding, body)
}

/// A schedule body in `coding`, counted as served.
fn coded_schedule(state: &AppState, coding: Coding, body: axum::body::Bytes) -> Response {
    state.metrics.schedule_served(coding, body.len());
    let mut response = (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::VARY, HeaderValue::from_static("accept-encoding")),
        ],
        body,
    )
        .into_response();
    if let Some(value) = coding.header() {
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, value);
    }
    response
}

/// The longest a `/v1/schedule/<hash>?wait_ms=` request waits for the schedule to arrive.
pub(crate) const RELAY_WAIT_MAX: Duration = Duration::from_secs(2);
/// A relay waits this long at most for a schedule its own leader has not announced (yet): the
/// leader's ping reaches the asking follower and this node a moment apart, but a relay cut off
/// from the leader must send the follower to the leader soon.
pub(crate) const RELAY_UNANNOUNCED_WAIT: Duration = Duration::from_millis(250);

#[derive(Debug, serde::Deserialize)]
pub(crate) struct ScheduleWait {
    /// Wait up to this many ms (at most [`RELAY_WAIT_MAX`]) for the schedule to arrive.
    wait_ms: Option<u64>,
}

/// `/v1/schedule/<hash>`: the schedule in force if it has that hash, or one of other leaders
/// this node replaced lately (so a new leader can still gather it as a parent); else 404.
/// With `?wait_ms=N` (a follower fetching through this node as its relay) a schedule this node
/// is about to take is waited for: up to N ms (at most [`RELAY_WAIT_MAX`]) while this node's
/// leader announces that hash, up to [`RELAY_UNANNOUNCED_WAIT`] while it does not.
pub(crate) async fn schedule_by_hash(
    State(state): State<AppState>,
    axum::extract::Path(hash): axum::extract::Path<String>,
    axum::extract::Query(wait): axum::extract::Query<ScheduleWait>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if let Some(found) = held_schedule(&state, &hash, &headers).await {
        return Ok(found);
    }
    let missing = || ApiError::not_found(format!("no schedule {hash} here"));
    let Some(wait_ms) = wait.wait_ms.filter(|w| *w > 0) else {
        return Err(missing());
    };
    // A waiting request takes one of the long-poll slots; with none free it is told at once,
    // and the follower goes to its leader.
    let Ok(_slot) = state.http.long_polls.clone().try_acquire_owned() else {
        return Err(missing());
    };
    let started = tokio::time::Instant::now();
    let until = started + Duration::from_millis(wait_ms).min(RELAY_WAIT_MAX);
    let unannounced_until = until.min(started + RELAY_UNANNOUNCED_WAIT);
    let mut schedule = state.store.schedule.clone();
    let mut reports = state.store.reports.clone();
    let mut election = state.store.election.clone();
    let mut relay = state.http.relay.subscribe();
    loop {
        schedule.get();
        relay.borrow_and_update();
        let reports_now = reports.get();
        let election_now = election.get();
        if let Some(found) = held_schedule(&state, &hash, &headers).await {
            return Ok(found);
        }
        let announced = election_now.leader.as_ref().is_some_and(|leader| {
            reports_now
                .get(leader)
                .and_then(|r| r.schedule.as_ref())
                .is_some_and(|s| s.hash == hash)
        });
        let deadline = if announced { until } else { unannounced_until };
        if tokio::time::Instant::now() >= deadline {
            return Err(missing());
        }
        tokio::select! {
            _ = schedule.changed() => {}
            _ = reports.changed() => {}
            _ = election.changed() => {}
            _ = relay.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// A JSON response whose body is shared with other responses (see `SharedJson`).
fn shared_json(body: axum::body::Bytes) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// The response for schedule `hash` if this node holds it (in force, or replaced lately), or,
/// for a client that takes its coding, has just received it from its leader or relay.
async fn held_schedule(state: &AppState, hash: &str, headers: &HeaderMap) -> Option<Response> {
    // The body as it came from the leader, when there is one: arrived a moment ago and maybe
    // not taken yet, or taken (see `RelayBody`); this node need not compress it again.
    if let Some((coding, body)) = state.http.relay.get(hash)
        && coding.taken_by(headers)
    {
        return Some(coded_schedule(state, coding, body));
    }
    let current = state.store.schedule.peek();
    if current.as_ref().as_ref().is_some_and(|s| s.hash == hash) {
        return Some(schedule_body(state, current, headers).await);
    }
    let replaced = state.store.replaced.peek();
    let schedule = replaced.iter().find(|s| s.hash == hash)?;
    let mut body = Vec::new();
    schedule.write_json(&mut body);
    state.metrics.schedule_served(Coding::Identity, body.len());
    Some(shared_json(axum::body::Bytes::from(body)))
}

pub(crate) async fn scheduler_input(State(state): State<AppState>) -> Result<Response, ApiError> {
    let status = state.store.scheduler.peek();
    match &status.last_input {
        Some(input) => Ok(Json(&**input).into_response()),
        None => Err(ApiError::not_found(
            "the scheduler has not run on this node",
        )),
    }
}

pub(crate) async fn scheduler_debug_info(
    State(state): State<AppState>,
) -> Result<Response, ApiError> {
    let status = state.store.scheduler.peek();
    match &status.debug_info {
        Some(text) => Ok((
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            text.clone(),
        )
            .into_response()),
        None => Err(ApiError::not_found(
            "the scheduler has not run on this node",
        )),
    }
}

pub(crate) async fn election(State(state): State<AppState>) -> Json<Value> {
    let election: &ElectionState = &state.store.election.peek();
    let mut value = serde_json::to_value(election).unwrap_or_default();
    with_backend(&state, &mut value);
    Json(value)
}

pub(crate) async fn peers(State(state): State<AppState>) -> Json<Value> {
    let peers = state.store.peers.peek();
    let reports = state.store.reports.peek();
    let now_ms = SystemClock.now_ms();
    let heard = state.liveness.with_heard(|heard| heard.clone());
    let list: Vec<Value> = peers
        .peers
        .values()
        .map(|p| {
            let report = reports.get(&p.id);
            // Read now, not from the stored list, which is published only when it changes.
            let last_heard = heard.get(&p.id).copied();
            json!({
                "id": p.id, "primary_addr": p.addr, "name": p.name, "hostname": p.hostname,
                "known_since": p.known_since, "last_report_direct": p.last_report_direct,
                "last_heard": last_heard,
                "alive": transport::heard_lately(last_heard, state.alive_window, now_ms),
                "errors": report.map_or(p.errors, |r| r.errors),
                "schedule": report.and_then(|r| r.schedule.clone()),
            })
        })
        .collect();
    Json(Value::Array(list))
}

pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let snapshot = Snapshot::take(&state.store);
    let status = status::view(&state.node, &snapshot, state.metrics.scheduler_runs());
    let text = state.metrics.render(&status, &snapshot);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub(crate) async fn unknown_api(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no API route {}", uri.path()))
}

/// `{to_render: {role: vars}, all_roles: [...]}`: what this node would render now, each role's
/// variables as its templates would see them (a fresh deployment id; `full_schedule` left out).
/// A role that cannot be rendered shows `{"error": "..."}` instead.
pub(crate) async fn roles_data(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let schedule = state.store.schedule.peek();
    let Some(schedule) = schedule.as_ref() else {
        return Err(ApiError::internal("no schedule yet"));
    };
    let id = deployment_id();
    let now = rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    );
    let host = &state.node.hostname;
    // With a `query.wasm` the roles are its `render_roles` answer (as rendering takes them, and
    // as 0.13 answered this route through its query thread); else the compat derivation.
    let view = if state.query.present() {
        let hook = state.query.clone();
        let (for_module, host_for_module, id_for_module) =
            (schedule.clone(), host.clone(), id.clone());
        let answer = tokio::task::spawn_blocking(move || {
            hook.with_module(&for_module, &host_for_module, |module| {
                module.render_roles(&id_for_module, None)
            })
        })
        .await
        .map_err(|e| ApiError::internal(format!("the query.wasm call did not finish: {e}")))?;
        let roles = answer.map_err(|e| ApiError::internal(e.message))?;
        vars::roles_view(&schedule.data.node_view(host), host, roles)
    } else {
        schedule.data.node_view(host)
    };
    let mut to_render = serde_json::Map::new();
    for role in vars::node_roles(&view, host) {
        let value = match vars::role_vars(&view, host, &role) {
            Ok(v) => Value::Object(vars::with_pass(v, &id, &now, None)),
            Err(e) => json!({"error": e.message}),
        };
        to_render.insert(role, value);
    }
    Ok(Json(json!({
        "to_render": to_render,
        "all_roles": schedule.data.all_roles(),
        "failed": state.store.roles.peek().failed,
        "last_deployment": state.store.roles.peek().last_deployment,
    })))
}

/// Renders every role of this node again under a new deployment id.
pub(crate) async fn force_render_all(State(state): State<AppState>) -> Json<&'static str> {
    state.force_render.update(|generation| *generation += 1);
    tracing::info!("Re-rendering all roles (force_render_all).");
    Json("ok")
}

/// How long `/v1/leader-redirect-by-node-name` waits for a leader to be known (as 0.13).
const REDIRECT_WAIT: std::time::Duration = std::time::Duration::from_secs(65);

pub(crate) async fn leader_redirect(State(state): State<AppState>) -> Response {
    redirect_to_leader(state, String::new()).await
}

/// The tail is taken from the request's path as sent, still percent-encoded (with the query), so
/// that an encoded CR or LF stays encoded in `Location` instead of making the header invalid.
pub(crate) async fn leader_redirect_tail(State(state): State<AppState>, uri: Uri) -> Response {
    let tail = uri
        .path()
        .strip_prefix("/v1/leader-redirect-by-node-name/")
        .unwrap_or("");
    let tail = match uri.query() {
        Some(query) => format!("{tail}?{query}"),
        None => tail.to_string(),
    };
    redirect_to_leader(state, tail).await
}

/// `308` to the same path tail on the leader, by its node name and its port (from its address
/// in the peer list, else this node's: nodes of a cluster share the port); waits up to 65 s for
/// a leader, then `404`.
async fn redirect_to_leader(state: AppState, tail: String) -> Response {
    let deadline = tokio::time::Instant::now() + REDIRECT_WAIT;
    let mut election = state.store.election.clone();
    loop {
        if let Some(leader) = status::leader(&state.node, &Snapshot::take(&state.store)) {
            let port = leader.port(state.node.port);
            let location = format!("http://{}:{port}/{tail}", leader.name);
            // A leader name from the peer list is not checked to be a valid header value.
            let Ok(location) = HeaderValue::try_from(location) else {
                return ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "the leader's name {:?} cannot be used in a redirect",
                        leader.name
                    ),
                )
                .into_response();
            };
            return (
                StatusCode::PERMANENT_REDIRECT,
                [
                    (header::LOCATION, location),
                    (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                ],
            )
                .into_response();
        }
        tokio::select! {
            _ = election.changed() => {}
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            _ = tokio::time::sleep_until(deadline) => {
                return ApiError::not_found("No leader found in 65 seconds").into_response();
            }
        }
    }
}
