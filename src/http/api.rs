//! Handlers of the `/v1/` routes, `/metrics` and the index page.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};
use verwalter_controllers::election::ElectionState;
use verwalter_controllers::ports::SchedulerFailure;
use verwalter_controllers::render::deployment_id;
use verwalter_controllers::vars;
use verwalter_controllers::wallclock::rfc3339;

use super::{ApiError, AppState};

/// `/v1/status`, verwalter 0.13's shape.
#[derive(Debug, Serialize)]
pub struct Status {
    pub version: String,
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub peers: usize,
    pub peers_timestamp: Option<u64>,
    pub leader: Option<LeaderInfo>,
    pub roles: usize,
    pub last_stable_timestamp: Option<u64>,
    pub num_errors: usize,
    pub errors: BTreeMap<String, String>,
    pub failed_roles: Vec<String>,
    pub debug_force_leader: bool,
    pub metrics: BTreeMap<&'static str, u64>,
    pub fetch_state: Value,
    pub election_state: ElectionState,
    pub schedule_id: Option<String>,
    pub schedule_status: &'static str,
    pub default_frontend: String,
    /// Peers whose last report counted errors (new; 0.13's GraphQL had `peers.errorneous`).
    /// Only a leader hears every peer's reports.
    pub failing_nodes: Vec<FailingNode>,
    /// The latest render pass of this node (new; as in `/v1/roles_data`).
    pub last_deployment: Option<verwalter_controllers::state::Deployment>,
}

#[derive(Debug, Serialize)]
pub struct FailingNode {
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub addr: Option<String>,
    pub errors: u64,
}

#[derive(Debug, Serialize)]
pub struct LeaderInfo {
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub addr: Option<String>,
    pub schedule: Option<String>,
}

/// The version string peers and tools see, `v` + the package version as in 0.13.
pub fn version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

/// Role names a schedule mentions: keys of `roles` and of every node's `roles`.
pub fn build_status(state: &AppState) -> Status {
    let store = &state.store;
    let node = &state.node;
    let election = store.election.peek();
    let peers = store.peers.peek();
    let schedule = store.schedule.peek();
    let schedule = schedule.as_ref().as_ref();
    let scheduler = store.scheduler.peek();
    let inputs = store.inputs.peek();

    let mut errors = BTreeMap::new();
    for error in &inputs.errors {
        let message = match error.line {
            Some(line) => format!("line {line}: {}", error.message),
            None => error.message.clone(),
        };
        // Several problems in one file share its entry.
        errors
            .entry(error.path.clone())
            .and_modify(|all: &mut String| {
                all.push_str("; ");
                all.push_str(&message);
            })
            .or_insert(message);
    }
    if let Some(message) = store.scheduler_error().and(scheduler.error.as_ref()) {
        let domain = if scheduler.failure == Some(SchedulerFailure::Load) {
            "scheduler_load"
        } else {
            "scheduler"
        };
        errors.insert(domain.into(), message.clone());
    }
    if let Some(message) = store.persist_error.peek().as_ref() {
        errors.insert("schedule_persist".into(), message.clone());
    }
    let leader = if election.is_leader {
        Some(LeaderInfo {
            id: node.id.clone(),
            name: node.name.clone(),
            hostname: node.hostname.clone(),
            addr: Some(node.addr.clone()),
            schedule: schedule.map(|s| s.hash.clone()),
        })
    } else {
        election
            .leader
            .as_ref()
            .and_then(|id| peers.peers.get(id))
            .map(|peer| LeaderInfo {
                id: peer.id.clone(),
                name: peer.name.clone(),
                hostname: peer.hostname.clone(),
                addr: peer.addr.clone(),
                schedule: store
                    .reports
                    .peek()
                    .get(&peer.id)
                    .and_then(|r| r.schedule.as_ref())
                    .map(|s| s.hash.clone()),
            })
    };
    // 0.13's fetch states: a new leader gathers its peers' schedules before scheduling
    // (Prefetching); a follower holds the leader's schedule (ok) or is getting it (fetching).
    let prefetching = election.is_leader
        && !peers.peers.is_empty()
        && store.prefetched.peek().epoch != election.epoch;
    let leader_stamp = election
        .leader
        .as_ref()
        .and_then(|id| store.reports.peek().get(id)?.schedule.clone());
    let (fetch_state, schedule_status) = match (election.is_leader, election.is_stable, schedule) {
        (true, _, _) if prefetching => {
            (json!({"state": "Prefetching", "Fetching": null}), "waiting")
        }
        (true, _, Some(_)) => (json!({"state": "StableLeader"}), "ok"),
        (true, _, None) => (json!({"state": "StableLeader"}), "waiting"),
        (false, true, held) => {
            let target = leader_stamp.as_ref().map(|s| s.hash.clone());
            let current = held.is_some()
                && target
                    .as_ref()
                    .is_none_or(|t| held.is_some_and(|h| &h.hash == t));
            (
                json!({"state": "Replicating", "leader": election.leader,
                       "schedule": if current { None } else { target }}),
                if current { "ok" } else { "fetching" },
            )
        }
        (false, false, _) => (json!({"state": "Unstable"}), "unstable"),
    };
    let roles = store.roles.peek();
    for (role, failure) in &roles.failed {
        errors.insert(format!("role {role}"), failure.message.clone());
    }
    let failed_roles: Vec<String> = roles.failed.keys().cloned().collect();
    if let Some(problem) = &roles.deployment_log {
        errors.insert("deployment_log".into(), problem.clone());
    }
    let reports = store.reports.peek();
    let failing_nodes = peers
        .peers
        .values()
        .filter_map(|p| {
            let errors = reports.get(&p.id).map_or(p.errors, |r| r.errors);
            (errors > 0).then(|| FailingNode {
                id: p.id.clone(),
                name: p.name.clone(),
                hostname: p.hostname.clone(),
                addr: p.addr.clone(),
                errors,
            })
        })
        .collect();
    let metrics = BTreeMap::from([
        (
            "scheduler_succeeded",
            state
                .metrics
                .scheduler_runs
                .get()
                .saturating_sub(failures(state)),
        ),
        ("scheduler_failed", failures(state)),
        ("input_errors", inputs.errors.len() as u64),
    ]);
    Status {
        version: version(),
        id: node.id.clone(),
        name: node.name.clone(),
        hostname: node.hostname.clone(),
        peers: peers.peers.len(),
        peers_timestamp: peers.timestamp,
        leader,
        roles: schedule.map_or(0, |s| vars::all_roles(&s.data).len()),
        last_stable_timestamp: election.last_stable_timestamp,
        num_errors: store.error_count(),
        errors,
        failed_roles,
        debug_force_leader: node.debug_force_leader,
        metrics,
        fetch_state,
        election_state: (*election).clone(),
        schedule_id: schedule.map(|s| s.hash.clone()),
        schedule_status,
        default_frontend: node.default_frontend.clone(),
        failing_nodes,
        last_deployment: roles.last_deployment.clone(),
    }
}

fn failures(state: &AppState) -> u64 {
    let family = &state.metrics.scheduler_failures;
    [
        "load",
        "runtime",
        "timeout",
        "memory",
        "bad_output",
        "internal",
    ]
    .iter()
    .map(|reason| family.with_label_values(&[*reason]).get())
    .sum()
}

pub async fn status(State(state): State<AppState>) -> Json<Status> {
    Json(build_status(&state))
}

pub async fn schedule(State(state): State<AppState>) -> Result<Response, ApiError> {
    let schedule = state.store.schedule.peek();
    if schedule.is_none() {
        return Err(ApiError::NotFound("no schedule yet".into()));
    }
    Ok(shared_json(state.http.schedule_json.body(&schedule)))
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

/// `/v1/schedule/<hash>`: the schedule in force if it has that hash, or one of other leaders
/// this node replaced lately (so a new leader can still gather it as a parent); else 404.
pub async fn schedule_by_hash(
    State(state): State<AppState>,
    axum::extract::Path(hash): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let current = state.store.schedule.peek();
    if current.as_ref().as_ref().is_some_and(|s| s.hash == hash) {
        return Ok(shared_json(state.http.schedule_json.body(&current)));
    }
    let replaced = state.store.replaced.peek();
    match replaced.iter().find(|s| s.hash == hash) {
        Some(schedule) => Ok(Json(schedule).into_response()),
        None => Err(ApiError::NotFound(format!("no schedule {hash} here"))),
    }
}

pub async fn scheduler_input(State(state): State<AppState>) -> Result<Response, ApiError> {
    let status = state.store.scheduler.peek();
    match &status.last_input {
        Some(input) => Ok(Json(&**input).into_response()),
        None => Err(ApiError::NotFound(
            "the scheduler has not run on this node".into(),
        )),
    }
}

pub async fn scheduler_debug_info(State(state): State<AppState>) -> Result<Response, ApiError> {
    let status = state.store.scheduler.peek();
    match &status.debug_info {
        Some(text) => Ok((
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            text.clone(),
        )
            .into_response()),
        None => Err(ApiError::NotFound(
            "the scheduler has not run on this node".into(),
        )),
    }
}

pub async fn election(State(state): State<AppState>) -> Json<ElectionState> {
    Json((*state.store.election.peek()).clone())
}

pub async fn peers(State(state): State<AppState>) -> Json<Value> {
    let peers = state.store.peers.peek();
    let reports = state.store.reports.peek();
    let list: Vec<Value> = peers
        .peers
        .values()
        .map(|p| {
            let report = reports.get(&p.id);
            json!({
                "id": p.id, "primary_addr": p.addr, "name": p.name, "hostname": p.hostname,
                "known_since": p.known_since, "last_report_direct": p.last_report_direct,
                "errors": report.map_or(p.errors, |r| r.errors),
                "schedule": report.and_then(|r| r.schedule.clone()),
            })
        })
        .collect();
    Json(Value::Array(list))
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics.render(&state.store);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn unknown_api(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no API route {}", uri.path()))
}

/// `{to_render: {role: vars}, all_roles: [...]}`: what this node would render now, each role's
/// variables as its templates would see them (a fresh deployment id; `full_schedule` left out).
/// A role that cannot be rendered shows `{"error": "..."}` instead.
pub async fn roles_data(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let schedule = state.store.schedule.peek();
    let Some(schedule) = schedule.as_ref() else {
        return Err(ApiError::Internal("no schedule yet".into()));
    };
    let id = deployment_id();
    let now = rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    );
    let mut to_render = serde_json::Map::new();
    for role in vars::node_roles(&schedule.data, &state.node.hostname) {
        let value = match vars::role_vars(&schedule.data, &state.node.hostname, &role) {
            Ok(v) => Value::Object(vars::with_pass(v, &id, &now, None)),
            Err(e) => json!({"error": e.message}),
        };
        to_render.insert(role, value);
    }
    Ok(Json(json!({
        "to_render": to_render,
        "all_roles": vars::all_roles(&schedule.data),
        "failed": state.store.roles.peek().failed,
        "last_deployment": state.store.roles.peek().last_deployment,
    })))
}

/// Renders every role of this node again under a new deployment id.
pub async fn force_render_all(State(state): State<AppState>) -> Json<&'static str> {
    state.force_render.update(|generation| *generation += 1);
    tracing::info!("Re-rendering all roles (force_render_all).");
    Json("ok")
}

/// How long `/v1/leader-redirect-by-node-name` waits for a leader to be known (as 0.13).
const REDIRECT_WAIT: std::time::Duration = std::time::Duration::from_secs(65);

pub async fn leader_redirect(State(state): State<AppState>) -> Response {
    redirect_to_leader(state, String::new()).await
}

/// The tail is taken from the request's path as sent, still percent-encoded (with the query), so
/// that an encoded CR or LF stays encoded in `Location` instead of making the header invalid.
pub async fn leader_redirect_tail(State(state): State<AppState>, uri: Uri) -> Response {
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

/// `308` to the same path tail on the leader, by its node name and this node's port (nodes of a
/// cluster share the port); waits up to 65 s for a leader, then `404`.
async fn redirect_to_leader(state: AppState, tail: String) -> Response {
    let deadline = tokio::time::Instant::now() + REDIRECT_WAIT;
    let mut election = state.store.election.clone();
    loop {
        let status = build_status(&state);
        if let Some(leader) = &status.leader {
            let port = state.node.addr.rsplit(':').next().unwrap_or("8379");
            let location = format!("http://{}:{port}/{tail}", leader.name);
            // A leader name from the peer list is not checked to be a valid header value.
            let Ok(location) = HeaderValue::try_from(location) else {
                return (
                    StatusCode::BAD_GATEWAY,
                    Json(json!({"error": format!(
                        "the leader's name {:?} cannot be used in a redirect", leader.name
                    )})),
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
                return ApiError::NotFound("No leader found in 65 seconds".into()).into_response();
            }
        }
    }
}
