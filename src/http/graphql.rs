//! `/v1/graphql` and `/v1/graphiql`: verwalter 0.13's GraphQL API (docs/http-api.md, "GraphQL").
//!
//! - `POST /v1/graphql` `{query, operationName?, variables?}` answers `{data, errors?}`: 200 when
//!   there is data, 400 when there is none (the query did not parse or validate, e.g. too deep
//!   or too complex: [`MAX_DEPTH`], [`MAX_COMPLEXITY`]). The body is JSON of at most
//!   [`BODY_LIMIT`] bytes, as for the other POST routes.
//! - `GET /v1/graphql` with a WebSocket upgrade speaks `graphql-ws` (subscriptions-transport-ws,
//!   what 0.13's clients speak) and `graphql-transport-ws` (the graphql-ws library's protocol);
//!   `subscription { status { ... } }` sends the status now and again whenever it changes.
//! - `GET /v1/graphiql`: a small query page from the binary, no resources from elsewhere.
//!
//! Every field is read from one snapshot of the store made into the `/v1/status` view
//! ([`status::view`]), so a query and `/v1/status` agree. Subscriptions wake on the same store
//! fields as `/v1/events` ([`Sources::triggers`]) and share its limits: a socket takes one of the
//! `http.max-event-streams` slots, holds at most [`MAX_SUBSCRIPTIONS`] subscriptions, makes a
//! result only when the client is ready for it (a slow reader gets the latest status, never a
//! backlog), and is closed when a message has waited `http.stream-stall-timeout-ms` to be written.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_graphql::futures_util::stream::BoxStream;
use async_graphql::http::{WebSocket as GraphqlSocket, WebSocketProtocols, WsMessage};
use async_graphql::{
    Context, Enum, Executor, Json as GqlJson, Object, Schema, ServerError, SimpleObject,
    Subscription,
};
use axum::Json;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, Stream, StreamExt};
use serde_json::{Value, json};
use verwalter_controllers::access;
use verwalter_controllers::state::{BlockedState, Peer as StatePeer};
use verwalter_controllers::status::{self, NodeInfo, Snapshot, Sources};
use verwalter_controllers::store::Store;
use verwalter_controllers::subscriptions::LastSent;
use verwalter_controllers::vars;

use super::AppState;
use crate::logs::{IndexEntry, LogDir};
use crate::metrics::Metrics;

/// Largest `POST /v1/graphql` body and WebSocket message accepted (as `/v1/action`).
pub const BODY_LIMIT: usize = super::actions::BODY_LIMIT;
/// Deepest selection accepted: this schema's deepest field is at depth 4
/// (`status { roles { list { name } } }`); the standard introspection query needs 13.
pub const MAX_DEPTH: usize = 15;
/// Most costly query accepted: every field costs 1, `status` 10, `schedule.data` (the whole
/// schedule, copied into the answer) 100 and `deployments` (a read of the deployment log) 50;
/// the standard introspection query costs about 200.
pub const MAX_COMPLEXITY: usize = 1000;
/// Subscriptions one WebSocket may hold at once; a `start` past them gets an error.
pub const MAX_SUBSCRIPTIONS: usize = 16;
/// Most deployment log entries `deployments(last:)` returns.
pub const MAX_DEPLOYMENT_ENTRIES: i32 = 200;
/// Changes closer together than this make one subscription result (as `/v1/events`).
const COALESCE: Duration = Duration::from_millis(50);

pub type VerwalterSchema = Schema<Query, Mutation, SubscriptionRoot>;

/// The schema of an app, built at first use (in [`super::HttpState`]).
#[derive(Default)]
pub struct SchemaCell(std::sync::OnceLock<VerwalterSchema>);

impl std::fmt::Debug for SchemaCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SchemaCell")
    }
}

/// What the resolvers read.
#[derive(Clone)]
pub struct Source {
    store: Store,
    node: Arc<NodeInfo>,
    metrics: Arc<Metrics>,
    logs: Option<Arc<LogDir>>,
}

/// The schema of `state`'s app, built once.
pub fn schema(state: &AppState) -> VerwalterSchema {
    state
        .http
        .graphql
        .0
        .get_or_init(|| {
            let source = Source {
                store: state.store.clone(),
                node: state.node.clone(),
                metrics: state.metrics.clone(),
                logs: state.logs.clone(),
            };
            Schema::build(Query, Mutation, SubscriptionRoot)
                .data(source)
                .limit_depth(MAX_DEPTH)
                .limit_complexity(MAX_COMPLEXITY)
                .limit_recursive_depth(32)
                .limit_directives(16)
                .finish()
        })
        .clone()
}

/// The whole schema in GraphQL's schema language without its descriptions, indented by two
/// spaces (docs/http-api.md lists it; a test compares; introspection has the descriptions).
#[cfg(test)]
pub fn sdl(state: &AppState) -> String {
    let mut out = String::new();
    let mut in_description = false;
    for line in schema(state).sdl().lines() {
        let trimmed = line.trim();
        if trimmed == "\"\"\"" {
            in_description = !in_description;
            continue;
        }
        if in_description || (trimmed.starts_with("\"\"\"") && trimmed.len() > 6) {
            continue;
        }
        out.push_str(&line.replace('\t', "  "));
        out.push('\n');
    }
    out
}

// ---- The schema -------------------------------------------------------------------------------

pub struct Query;

#[Object]
impl Query {
    /// This node's status (`/v1/status`).
    #[graphql(complexity = "10 + child_complexity")]
    async fn status(&self, ctx: &Context<'_>) -> StatusView {
        StatusView::now(ctx.data_unchecked::<Source>())
    }
}

pub struct Mutation;

#[Object]
impl Mutation {
    /// Does nothing (0.13 had it because a GraphQL schema needs a mutation type).
    async fn noop(&self) -> Okay {
        Okay { ok: true }
    }
}

#[derive(SimpleObject)]
pub struct Okay {
    ok: bool,
}

pub struct SubscriptionRoot;

#[Subscription(name = "Subscription")]
impl SubscriptionRoot {
    /// The status now, then again on every change (changes within 50 ms make one result).
    #[graphql(complexity = "10 + child_complexity")]
    async fn status(&self, ctx: &Context<'_>) -> impl Stream<Item = StatusView> + use<> {
        status_changes(ctx.data_unchecked::<Source>().clone())
    }
}

/// A status made when the consumer asks for the next one: the stream holds no queue.
fn status_changes(source: Source) -> impl Stream<Item = StatusView> {
    let triggers = Sources::new(&source.store).triggers();
    futures::stream::unfold(
        (source, triggers, true),
        |(source, mut triggers, first)| async move {
            if !first {
                futures::future::select_all(triggers.iter_mut().map(|t| t.changed())).await;
                tokio::time::sleep(COALESCE).await;
            }
            let view = StatusView::now(&source);
            Some((view, (source, triggers, false)))
        },
    )
}

/// One snapshot of the store with the `/v1/status` view made from it.
pub struct StatusView {
    node: Arc<NodeInfo>,
    snap: Snapshot,
    status: status::Status,
    logs: Option<Arc<LogDir>>,
}

impl StatusView {
    fn now(source: &Source) -> StatusView {
        let snap = Snapshot::take(&source.store);
        let status = status::view(&source.node, &snap, source.metrics.scheduler_runs());
        StatusView {
            node: source.node.clone(),
            snap,
            status,
            logs: source.logs.clone(),
        }
    }
}

/// Milliseconds as GraphQL floats (0.13's timestamps).
fn ms(value: u64) -> f64 {
    value as f64
}

#[Object(name = "Status")]
impl StatusView {
    async fn version(&self) -> &str {
        &self.status.version
    }
    async fn id(&self) -> &str {
        &self.status.id
    }
    async fn name(&self) -> &str {
        &self.status.name
    }
    async fn hostname(&self) -> &str {
        &self.status.hostname
    }
    async fn default_frontend(&self) -> &str {
        &self.status.default_frontend
    }
    async fn roles(&self) -> Roles<'_> {
        Roles { view: self }
    }
    async fn peers(&self) -> PeersView<'_> {
        PeersView { view: self }
    }
    async fn election(&self) -> Election<'_> {
        Election {
            state: &self.status.election_state,
        }
    }
    /// The schedule in force on this node, if any.
    async fn schedule(&self) -> Option<ScheduleView<'_>> {
        self.snap
            .schedule
            .as_ref()
            .as_ref()
            .map(|schedule| ScheduleView { schedule })
    }
    async fn fetch(&self) -> Fetch {
        let state = &self.status.fetch_state;
        let text = |key: &str| state.get(key).and_then(Value::as_str).map(str::to_string);
        Fetch {
            state: match state.get("state").and_then(Value::as_str) {
                Some("StableLeader") => FetchState::StableLeader,
                Some("Prefetching") => FetchState::Prefetching,
                Some("Replicating") => FetchState::Replicating,
                _ => FetchState::Unstable,
            },
            leader: text("leader"),
            schedule: text("schedule"),
        }
    }
    async fn num_errors(&self) -> usize {
        self.status.num_errors
    }
    /// Problems by domain, as `/v1/status` `errors` (new).
    async fn errors(&self) -> GqlJson<&std::collections::BTreeMap<String, String>> {
        GqlJson(&self.status.errors)
    }
    /// The leader as this node knows it (itself while it leads).
    async fn leader(&self) -> Option<Leader<'_>> {
        self.status.leader.as_ref().map(|info| Leader {
            info,
            debug_forced: self.status.election_state.is_leader && self.node.debug_force_leader,
        })
    }
    /// 0.13's self-meter report: verwalter has no self-meter, always null.
    async fn self_report(&self) -> Option<GqlJson<Value>> {
        None
    }
    /// 0.13's per-thread self-meter report: always null, as `selfReport`.
    async fn threads_report(&self) -> Option<GqlJson<Value>> {
        None
    }
    /// `ok`, `fetching`, `waiting` or `unstable`.
    async fn schedule_status(&self) -> &str {
        self.status.schedule_status
    }
    /// `/v1/status` `metrics` (new).
    async fn metrics(&self) -> GqlJson<&std::collections::BTreeMap<&'static str, u64>> {
        GqlJson(&self.status.metrics)
    }
    /// The latest render pass of this node (new).
    async fn last_deployment(&self) -> Option<Deployment<'_>> {
        self.snap
            .roles
            .last_deployment
            .as_ref()
            .map(|deployment| Deployment { deployment })
    }
    /// The newest `last` entries of today's deployment log index (new), newest first; empty
    /// when the node keeps no deployment log.
    #[graphql(complexity = "50 + child_complexity")]
    async fn deployments(
        &self,
        #[graphql(default = 20)] last: i32,
    ) -> async_graphql::Result<Vec<LogEntry>> {
        if !(0..=MAX_DEPLOYMENT_ENTRIES).contains(&last) {
            return Err(format!("last must be 0 to {MAX_DEPLOYMENT_ENTRIES}").into());
        }
        let Some(logs) = self.logs.clone() else {
            return Ok(Vec::new());
        };
        let entries = tokio::task::spawn_blocking(move || logs.recent_index(last as usize))
            .await
            .map_err(|e| format!("reading the deployment log: {e}"))?
            .map_err(|e| format!("reading the deployment log: {e}"))?;
        Ok(entries.into_iter().map(LogEntry).collect())
    }
}

pub struct Roles<'a> {
    view: &'a StatusView,
}

#[Object]
impl Roles<'_> {
    /// Roles in the schedule (all nodes).
    async fn number(&self) -> usize {
        self.view.status.roles
    }
    /// Roles failing on this node.
    async fn failed(&self) -> &[String] {
        &self.view.status.failed_roles
    }
    /// This node's roles (from the schedule, and any still failing or held back), by name (new).
    async fn list(&self) -> Vec<Role<'_>> {
        let snap = &self.view.snap;
        let mut names: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        let mine = snap
            .schedule
            .as_ref()
            .as_ref()
            .map(|s| vars::node_roles(&s.data, &self.view.node.hostname))
            .unwrap_or_default();
        names.extend(mine.iter().map(String::as_str));
        names.extend(snap.roles.failed.keys().map(String::as_str));
        names.extend(snap.roles.blocked.keys().map(String::as_str));
        names
            .into_iter()
            .map(|name| Role {
                name: name.to_string(),
                view: self.view,
            })
            .collect()
    }
}

/// What a role of this node is doing.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum RoleState {
    /// Neither failing nor held back.
    Ok,
    /// Its last attempt failed.
    Failed,
    /// Needs work but waits for a role it depends on.
    Waiting,
    /// Needs work but a role it depends on failed (or the pass halted).
    Blocked,
}

pub struct Role<'a> {
    name: String,
    view: &'a StatusView,
}

#[Object]
impl Role<'_> {
    async fn name(&self) -> &str {
        &self.name
    }
    async fn state(&self) -> RoleState {
        let roles = &self.view.snap.roles;
        if roles.failed.contains_key(&self.name) {
            return RoleState::Failed;
        }
        match roles.blocked.get(&self.name).map(|b| b.state) {
            Some(BlockedState::Waiting) => RoleState::Waiting,
            Some(BlockedState::Blocked) => RoleState::Blocked,
            None => RoleState::Ok,
        }
    }
    /// Why its last attempt failed, while it fails.
    async fn last_error(&self) -> Option<&str> {
        let failure = self.view.snap.roles.failed.get(&self.name)?;
        Some(&failure.message)
    }
    /// Failed attempts in a row (0 when not failing).
    async fn attempts(&self) -> u32 {
        self.view
            .snap
            .roles
            .failed
            .get(&self.name)
            .map_or(0, |f| f.attempts)
    }
    /// Since when it fails, waits or is blocked (ms).
    async fn since(&self) -> Option<f64> {
        let roles = &self.view.snap.roles;
        let failed = roles.failed.get(&self.name).map(|f| f.since);
        failed
            .or_else(|| roles.blocked.get(&self.name).map(|b| b.since))
            .map(ms)
    }
    /// The roles it waits for, or that blocked it.
    async fn blocked_on(&self) -> Vec<String> {
        self.view
            .snap
            .roles
            .blocked
            .get(&self.name)
            .map(|b| b.on.clone())
            .unwrap_or_default()
    }
    /// Why it is held back.
    async fn blocked_reason(&self) -> Option<&str> {
        let blocked = self.view.snap.roles.blocked.get(&self.name)?;
        Some(&blocked.reason)
    }
    /// The deployment of its failed attempt or of the pass it is held back in.
    async fn deployment_id(&self) -> Option<&str> {
        let roles = &self.view.snap.roles;
        match roles.failed.get(&self.name) {
            Some(failure) => failure.deployment_id.as_deref(),
            None => roles.blocked.get(&self.name)?.deployment_id.as_deref(),
        }
    }
}

pub struct PeersView<'a> {
    view: &'a StatusView,
}

#[Object(name = "Peers")]
impl PeersView<'_> {
    /// Other nodes in the peer list.
    async fn number(&self) -> usize {
        self.view.status.peers
    }
    /// Peers whose last report counted errors (0.13's spelling).
    async fn errorneous(&self) -> Vec<ErroneousPeer<'_>> {
        self.view
            .status
            .failing_nodes
            .iter()
            .map(|node| ErroneousPeer { node })
            .collect()
    }
    /// When the peer list was last refreshed (ms).
    async fn timestamp(&self) -> Option<f64> {
        self.view.status.peers_timestamp.map(ms)
    }
    /// Every peer (new), by id.
    async fn list(&self) -> Vec<PeerView<'_>> {
        self.view
            .snap
            .peers
            .peers
            .values()
            .map(|peer| PeerView {
                peer,
                view: self.view,
            })
            .collect()
    }
}

pub struct ErroneousPeer<'a> {
    node: &'a status::FailingNode,
}

#[Object]
impl ErroneousPeer<'_> {
    async fn id(&self) -> &str {
        &self.node.id
    }
    async fn name(&self) -> &str {
        &self.node.name
    }
    async fn hostname(&self) -> &str {
        &self.node.hostname
    }
    /// Errors it reported (new).
    async fn errors(&self) -> u64 {
        self.node.errors
    }
}

pub struct PeerView<'a> {
    peer: &'a StatePeer,
    view: &'a StatusView,
}

#[Object(name = "Peer")]
impl PeerView<'_> {
    async fn id(&self) -> &str {
        &self.peer.id
    }
    async fn name(&self) -> &str {
        &self.peer.name
    }
    async fn hostname(&self) -> &str {
        &self.peer.hostname
    }
    /// `ip:port` of its verwalter, when known.
    async fn addr(&self) -> Option<&str> {
        self.peer.addr.as_deref()
    }
    async fn known_since(&self) -> f64 {
        ms(self.peer.known_since)
    }
    async fn last_report_direct(&self) -> Option<f64> {
        self.peer.last_report_direct.map(ms)
    }
    /// Failing roles and error domains it reported.
    async fn errors(&self) -> u64 {
        let report = self.view.snap.reports.get(&self.peer.id);
        report.map_or(self.peer.errors, |r| r.errors)
    }
    /// Hash of the schedule it reported holding.
    async fn schedule(&self) -> Option<&str> {
        let report = self.view.snap.reports.get(&self.peer.id);
        report
            .and_then(|r| r.schedule.as_ref())
            .or(self.peer.schedule.as_ref())
            .map(|s| s.hash.as_str())
    }
    /// Whether this node sees it as the leader.
    async fn is_leader(&self) -> bool {
        self.view.snap.election.leader.as_ref() == Some(&self.peer.id)
    }
}

pub struct Election<'a> {
    state: &'a verwalter_controllers::election::ElectionState,
}

#[Object]
impl Election<'_> {
    async fn is_leader(&self) -> bool {
        self.state.is_leader
    }
    async fn is_stable(&self) -> bool {
        self.state.is_stable
    }
    /// The node this one votes for while an election runs.
    async fn promoting(&self) -> Option<&str> {
        self.state.promoting.as_deref()
    }
    async fn num_votes_for_me(&self) -> Option<usize> {
        self.state.num_votes_for_me
    }
    async fn needed_votes(&self) -> Option<usize> {
        self.state.needed_votes
    }
    async fn epoch(&self) -> f64 {
        self.state.epoch as f64
    }
    /// When the election machine acts next (ms).
    async fn deadline(&self) -> f64 {
        ms(self.state.deadline)
    }
    async fn last_stable_timestamp(&self) -> Option<f64> {
        self.state.last_stable_timestamp.map(ms)
    }
    /// The elected leader's id (new).
    async fn leader(&self) -> Option<&str> {
        self.state.leader.as_deref()
    }
}

pub struct ScheduleView<'a> {
    schedule: &'a verwalter_controllers::state::Schedule,
}

#[Object(name = "Schedule")]
impl ScheduleView<'_> {
    async fn timestamp(&self) -> f64 {
        ms(self.schedule.timestamp)
    }
    async fn hash(&self) -> &str {
        &self.schedule.hash
    }
    /// The scheduler's output.
    #[graphql(complexity = 100)]
    async fn data(&self) -> GqlJson<&Value> {
        GqlJson(&*self.schedule.data)
    }
    /// The id of the leader that made it.
    async fn origin(&self) -> &str {
        &self.schedule.origin
    }
}

/// 0.13's fetch states.
#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum FetchState {
    /// No stable leader.
    Unstable,
    /// This node leads and has gathered its peers' schedules.
    StableLeader,
    /// This node leads and still gathers its peers' schedules.
    Prefetching,
    /// This node follows the leader's schedule.
    Replicating,
}

#[derive(SimpleObject)]
pub struct Fetch {
    state: FetchState,
    /// The leader followed, while replicating (new).
    leader: Option<String>,
    /// The leader's schedule this node does not hold yet, while fetching it (new).
    schedule: Option<String>,
}

pub struct Leader<'a> {
    info: &'a status::LeaderInfo,
    debug_forced: bool,
}

#[Object]
impl Leader<'_> {
    async fn id(&self) -> &str {
        &self.info.id
    }
    async fn name(&self) -> &str {
        &self.info.name
    }
    async fn hostname(&self) -> &str {
        &self.info.hostname
    }
    async fn addr(&self) -> Option<&str> {
        self.info.addr.as_deref()
    }
    /// Hash of the leader's schedule, as this node last heard it.
    async fn schedule(&self) -> Option<&str> {
        self.info.schedule.as_deref()
    }
    /// Leads because of `--debug-force-leader` (known for this node only; false for others).
    async fn debug_forced(&self) -> bool {
        self.debug_forced
    }
}

pub struct Deployment<'a> {
    deployment: &'a verwalter_controllers::state::Deployment,
}

#[Object]
impl Deployment<'_> {
    async fn id(&self) -> &str {
        &self.deployment.id
    }
    /// Hash of the schedule it rendered.
    async fn schedule(&self) -> &str {
        &self.deployment.schedule
    }
    async fn started(&self) -> f64 {
        ms(self.deployment.started)
    }
    async fn finished(&self) -> Option<f64> {
        self.deployment.finished.map(ms)
    }
    async fn roles(&self) -> &[String] {
        &self.deployment.roles
    }
    async fn failed(&self) -> &[String] {
        &self.deployment.failed
    }
    async fn blocked(&self) -> &[String] {
        &self.deployment.blocked
    }
}

/// One line of the deployment log index.
pub struct LogEntry(IndexEntry);

#[Object]
impl LogEntry {
    /// RFC 3339 UTC time.
    async fn time(&self) -> &str {
        &self.0.time
    }
    async fn deployment_id(&self) -> &str {
        &self.0.deployment_id
    }
    /// `DeploymentStart`, `RoleStart`, `ActionStart`, `RoleFinish`, `DeploymentFinish`, ...
    async fn marker(&self) -> &str {
        &self.0.marker
    }
    /// The action of `ActionStart`/`ActionFinish`.
    async fn action(&self) -> Option<&str> {
        self.0.action.as_deref()
    }
    /// The role whose log the entry points into.
    async fn role(&self) -> Option<&str> {
        self.0.role.as_deref()
    }
}

// ---- HTTP -------------------------------------------------------------------------------------

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"errors": [{"message": message.into()}]})),
    )
        .into_response()
}

/// `POST /v1/graphql`.
pub async fn post(State(state): State<AppState>, request: Request) -> Response {
    let json_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let media = v.split(';').next().unwrap_or("").trim();
            media.eq_ignore_ascii_case("application/json")
        });
    if !json_type {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the query as Content-Type: application/json",
        );
    }
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a GraphQL request body is at most {BODY_LIMIT} bytes"),
        )
    };
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|length| length > BODY_LIMIT as u64) {
        return too_large();
    }
    let bytes = match axum::body::to_bytes(request.into_body(), BODY_LIMIT).await {
        Ok(bytes) => bytes,
        Err(e) if super::actions::body_timed_out(&e) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "the request body stalled for the idle timeout (http.idle-timeout-ms)",
            );
        }
        Err(_) => return too_large(),
    };
    let request: async_graphql::Request = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "the body is not a GraphQL request ({{query, operationName?, variables?}}): {e}"
                ),
            );
        }
    };
    let response = schema(&state).execute(request).await;
    let code = if response.data == async_graphql::Value::Null {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    (code, Json(response)).into_response()
}

/// `GET /v1/graphql`: a WebSocket for subscriptions (queries and mutations work there too).
pub async fn socket(
    State(state): State<AppState>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "GET /v1/graphql is a WebSocket (subprotocol graphql-ws or graphql-transport-ws); \
                 send queries with POST",
            );
        }
    };
    // Browsers apply no same-origin rule to WebSockets: a page of another site could read the
    // status over one. Its `Origin` must be this node's, as for requests that change state.
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if !access::websocket_allowed(text(header::HOST), text(header::ORIGIN)) {
        return super::ApiError::Forbidden(format!(
            "cross-site WebSocket from {:?} refused: open it from a page of this node",
            text(header::ORIGIN).unwrap_or("")
        ))
        .into_response();
    }
    let Ok(permit) = state.http.streams.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            Json(json!({
                "error": format!(
                    "{} event streams and GraphQL sockets are open, the most this node serves \
                     (http.max-event-streams, at most a quarter of the connection cap)",
                    state.http.max_streams
                )
            })),
        )
            .into_response();
    };
    let upgrade = upgrade
        .protocols(async_graphql::http::ALL_WEBSOCKET_PROTOCOLS)
        .max_message_size(BODY_LIMIT)
        .max_frame_size(BODY_LIMIT)
        .write_buffer_size(super::serve::BUFFER)
        .max_write_buffer_size(4 * super::serve::BUFFER);
    // A client that names no subprotocol gets 0.13's.
    let protocol = upgrade
        .selected_protocol()
        .and_then(|p| p.to_str().ok())
        .and_then(|p| p.parse().ok())
        .unwrap_or(WebSocketProtocols::SubscriptionsTransportWS);
    state.metrics.event_stream_opened();
    let slot = super::events::Slot::new(permit, state.metrics.clone());
    let executor = Capped {
        schema: schema(&state),
        open: Arc::new(AtomicUsize::new(0)),
    };
    let stall = state.http.settings.stream_stall_timeout;
    upgrade.on_upgrade(move |socket| run(socket, executor, protocol, stall, slot))
}

/// Serves one GraphQL WebSocket until either side closes it or the client stops reading.
async fn run(
    socket: WebSocket,
    executor: Capped,
    protocol: WebSocketProtocols,
    stall: Duration,
    _slot: super::events::Slot,
) {
    let (mut sink, incoming) = socket.split();
    let incoming = incoming
        .take_while(|message| {
            futures::future::ready(!matches!(message, Err(_) | Ok(Message::Close(_))))
        })
        .filter_map(|message| {
            futures::future::ready(match message {
                Ok(Message::Text(text)) => Some(axum::body::Bytes::from(text)),
                Ok(Message::Binary(_)) => {
                    tracing::debug!("Ignored a binary message on a GraphQL WebSocket.");
                    None
                }
                _ => None,
            })
        });
    let mut outgoing = GraphqlSocket::new(executor, incoming, protocol);
    // The last payload sent per subscription: an unchanged result is not sent again.
    let mut last = LastSent::default();
    // `next` makes the next message only now: nothing waits in a queue for a slow client.
    while let Some(message) = outgoing.next().await {
        let message = match message {
            WsMessage::Text(text) => {
                if !fresh(&mut last, &text) {
                    continue;
                }
                Message::Text(text.into())
            }
            WsMessage::Close(code, reason) => Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })),
        };
        let closing = matches!(message, Message::Close(_));
        match tokio::time::timeout(stall, sink.send(message)).await {
            Ok(Ok(())) if !closing => {}
            Ok(Ok(())) | Ok(Err(_)) => return,
            Err(_) => {
                tracing::info!(
                    stall_ms = stall.as_millis() as u64,
                    "Dropped a GraphQL WebSocket client that stopped reading."
                );
                return;
            }
        }
    }
    let _ = tokio::time::timeout(stall, sink.close()).await;
}

/// Whether a server message is worth sending ([`LastSent`]): not a subscription result equal to
/// the last one sent for the same subscription. A `complete` forgets the subscription.
pub(super) fn fresh(last: &mut LastSent, text: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        id: Option<String>,
        payload: Option<&'a serde_json::value::RawValue>,
    }
    let Ok(envelope) = serde_json::from_str::<Envelope<'_>>(text) else {
        return true;
    };
    match (envelope.kind, envelope.id, envelope.payload) {
        ("data" | "next", Some(id), Some(payload)) => last.fresh(&id, payload.get()),
        ("complete", Some(id), _) => {
            last.forget(&id);
            true
        }
        _ => true,
    }
}

/// The schema, holding at most [`MAX_SUBSCRIPTIONS`] subscriptions of one socket at once.
#[derive(Clone)]
struct Capped {
    schema: VerwalterSchema,
    open: Arc<AtomicUsize>,
}

/// One open subscription of a socket, counted until its stream is dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Executor for Capped {
    async fn execute(&self, request: async_graphql::Request) -> async_graphql::Response {
        self.schema.execute(request).await
    }

    fn execute_stream(
        &self,
        request: async_graphql::Request,
        session_data: Option<Arc<async_graphql::Data>>,
    ) -> BoxStream<'static, async_graphql::Response> {
        if self.open.fetch_add(1, Ordering::SeqCst) >= MAX_SUBSCRIPTIONS {
            self.open.fetch_sub(1, Ordering::SeqCst);
            let refused = async_graphql::Response::from_errors(vec![ServerError::new(
                format!("at most {MAX_SUBSCRIPTIONS} subscriptions per WebSocket"),
                None,
            )]);
            return futures::stream::once(futures::future::ready(refused)).boxed();
        }
        let counted = Counted(self.open.clone());
        Executor::execute_stream(&self.schema, request, session_data)
            .map(move |response| {
                let _held = &counted;
                response
            })
            .boxed()
    }
}

/// The query page: plain HTML and script from the binary, nothing from other hosts.
const GRAPHIQL: &str = include_str!("graphiql.html");

/// `GET /v1/graphiql`.
pub async fn graphiql() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; frame-ancestors 'none'",
            ),
        ],
        GRAPHIQL,
    )
        .into_response()
}
