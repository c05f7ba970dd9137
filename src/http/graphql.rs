//! `/v1/graphql` and `/v1/graphiql`: verwalter 0.13's GraphQL API (docs/http-api.md, "GraphQL").
//!
//! - `POST /v1/graphql` `{query, operationName?, variables?}` answers `{data, errors?}`: 200 when
//!   there is data, 400 when there is none (the query did not parse or validate, e.g. too deep
//!   or too complex: [`MAX_EXPANDED_SELECTIONS`], [`MAX_DEPTH`], [`MAX_COMPLEXITY`],
//!   [`MAX_COSTLY_FIELDS`]). Every query runs on a runtime thread of its own. The body is JSON
//!   of at most [`BODY_LIMIT`] bytes, as for the other POST routes.
//! - `GET /v1/graphql` with a WebSocket upgrade speaks `graphql-ws` (subscriptions-transport-ws,
//!   what 0.13's clients speak) and `graphql-transport-ws` (the graphql-ws library's protocol);
//!   `subscription { status { ... } }` sends the status now and again whenever it changes.
//! - `GET /v1/graphiql`: the built-in frontend's GraphQL page (explorer, completion), from the
//!   binary, no resources from elsewhere.
//!
//! Every field is read from one snapshot of the store made into the `/v1/status` view
//! ([`status::view`]) and from that into one JSON tree ([`tree`]), so a query and `/v1/status`
//! agree. Subscriptions wake on the same store
//! fields as `/v1/events` ([`Fields::triggers`]) and share its limits: a socket takes one of the
//! `http.max-event-streams` slots, holds at most [`MAX_SUBSCRIPTIONS`] subscriptions, makes a
//! result only when the client is ready for it (a slow reader gets the latest status, never a
//! backlog), and is closed when a message has waited `http.stream-stall-timeout-ms` to be written.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_graphql::dynamic::{
    Enum, Field, FieldFuture, FieldValue, InputValue, Object, ResolverContext, Scalar, Schema,
    Subscription, SubscriptionField, SubscriptionFieldFuture, TypeRef,
};
use async_graphql::futures_util::stream::BoxStream;
use async_graphql::http::{WebSocket as GraphqlSocket, WebSocketProtocols, WsMessage};
use async_graphql::parser::types::{ExecutableDocument, OperationType, Selection, SelectionSet};
use async_graphql::{Executor, Name, ServerError, Value as GqlValue};
use axum::Json;
use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, Stream, StreamExt};
use serde_json::{Value, json};
use verwalter_controllers::http::access;
use verwalter_controllers::http::graphql_cost;
use verwalter_controllers::http::subscriptions::LastSent;
use verwalter_controllers::node::Store;
use verwalter_controllers::render::vars;
use verwalter_controllers::state::BlockedState;
use verwalter_controllers::status::{self, Fields, NodeInfo, Snapshot};

use super::body::{BodyRules, JsonBody, JsonRoute};
use super::{ApiError, AppState};
use crate::metrics::Metrics;
use crate::storage::logs::LogDir;

/// Largest `POST /v1/graphql` body and WebSocket message accepted (as `/v1/action`).
pub(crate) const BODY_LIMIT: usize = super::actions::BODY_LIMIT;
/// Deepest selection accepted: this schema's deepest field is at depth 4
/// (`status { roles { list { name } } }`); the standard introspection query needs 13.
pub(crate) const MAX_DEPTH: usize = 15;
/// Most fields one query may select (aliases and fragments counted out; every field costs 1);
/// the standard introspection query selects about 200.
pub(crate) const MAX_COMPLEXITY: usize = 500;
/// How often one result may hold `schedule.data` (the whole schedule, copied into the answer)
/// and `deployments` (a read of the deployment log), however aliases repeat them.
pub(crate) const MAX_COSTLY_FIELDS: usize = 2;
/// Most selections a document may stand for once every fragment spread is expanded (its
/// operations and fragment definitions together; fields, spreads and inline fragments count 1
/// each), counted before anything else looks at it ([`graphql_cost`]). Fragments spreading the
/// next one twice stand for 2ⁿ selections in a document of n lines: without this, the
/// executor's own depth check and validation walk every one of them before they refuse
/// anything. The standard introspection query stands for about 430.
pub const MAX_EXPANDED_SELECTIONS: u64 = 10_000;
/// How long a `POST` query or mutation may run on the GraphQL thread before its client gets a
/// 503 and its task is cancelled (at its next await: work within the limits above is short).
const TIME_BUDGET: Duration = Duration::from_secs(10);
/// Subscriptions one WebSocket may hold at once; a `start` past them gets an error.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 16;
/// Most deployment log entries `deployments(last:)` returns.
pub(crate) const MAX_DEPLOYMENT_ENTRIES: i64 = 200;
/// Changes closer together than this make one subscription result (as `/v1/events`).
const COALESCE: Duration = Duration::from_millis(50);

pub(crate) type VerwalterSchema = Schema;

/// The schema of an app, built at first use (in [`super::HttpState`]).
#[derive(Default)]
pub(crate) struct SchemaCell(OnceLock<VerwalterSchema>);

impl std::fmt::Debug for SchemaCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SchemaCell")
    }
}

/// What the resolvers read.
#[derive(Clone)]
pub(crate) struct Source {
    store: Store,
    node: Arc<NodeInfo>,
    metrics: Arc<Metrics>,
    logs: Option<Arc<LogDir>>,
    /// The leader's shadow schedulers (`Query.shadows`).
    shadows: Option<crate::schedule::shadow::Shadows>,
    /// This node's side of the exchange between DCs (`Query.datacenters`).
    datacenters: Option<Arc<crate::cluster::datacenters::DcNode>>,
    /// The election backend's view (`election.backend`, `election.etcd`).
    backend: super::BackendView,
}

/// The schema of `state`'s app, built once.
pub(crate) fn schema(state: &AppState) -> VerwalterSchema {
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
                shadows: state.http.shadows.clone(),
                datacenters: state.datacenters.clone(),
                backend: state.http.election_backend.clone(),
            };
            build_schema(source)
        })
        .clone()
}

/// The whole schema in GraphQL's schema language without its descriptions, indented by two
/// spaces (docs/http-api.md lists it; a test compares).
#[cfg(test)]
pub(crate) fn sdl(state: &AppState) -> String {
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
//
// A dynamic schema from a table rather than derived types: every object is a node of one JSON
// tree made per status ([`View`]) and one resolver reads every field of it, so the schema costs
// one copy of the resolver machinery instead of one per type and field (docs/benchmarks.md).

/// The object types and their fields, `name: type` in GraphQL's notation. `Schedule.data`,
/// `Status.deployments` and `Mutation.noop` have resolvers of their own.
const OBJECTS: &[(&str, &[(&str, &str)])] = &[
    (
        "Status",
        &[
            ("version", "String!"),
            ("id", "String!"),
            ("name", "String!"),
            ("hostname", "String!"),
            ("defaultFrontend", "String!"),
            ("roles", "Roles!"),
            ("peers", "Peers!"),
            ("election", "Election!"),
            ("schedule", "Schedule"),
            ("fetch", "Fetch!"),
            ("numErrors", "Int!"),
            ("errors", "JSON!"),
            ("leader", "Leader"),
            ("selfReport", "JSON"),
            ("threadsReport", "JSON"),
            ("scheduleStatus", "String!"),
            ("metrics", "JSON!"),
            ("lastDeployment", "Deployment"),
        ],
    ),
    (
        "Roles",
        &[
            ("number", "Int!"),
            ("failed", "[String!]!"),
            ("list", "[Role!]!"),
        ],
    ),
    (
        "Role",
        &[
            ("name", "String!"),
            ("state", "RoleState!"),
            ("lastError", "String"),
            ("attempts", "Int!"),
            ("since", "Float"),
            ("blockedOn", "[String!]!"),
            ("blockedRootCause", "[String!]!"),
            ("blockedReason", "String"),
            ("deploymentId", "String"),
        ],
    ),
    (
        "Peers",
        &[
            ("number", "Int!"),
            ("errorneous", "[ErroneousPeer!]!"),
            ("timestamp", "Float"),
            ("list", "[Peer!]!"),
        ],
    ),
    (
        "ErroneousPeer",
        &[
            ("id", "String!"),
            ("name", "String!"),
            ("hostname", "String!"),
            ("errors", "Int!"),
        ],
    ),
    (
        "Peer",
        &[
            ("id", "String!"),
            ("name", "String!"),
            ("hostname", "String!"),
            ("addr", "String"),
            ("knownSince", "Float!"),
            ("lastReportDirect", "Float"),
            ("errors", "Int!"),
            ("schedule", "String"),
            ("isLeader", "Boolean!"),
        ],
    ),
    (
        "Election",
        &[
            ("isLeader", "Boolean!"),
            ("isStable", "Boolean!"),
            ("promoting", "String"),
            ("numVotesForMe", "Int"),
            ("neededVotes", "Int"),
            ("epoch", "Float!"),
            ("deadline", "Float!"),
            ("lastStableTimestamp", "Float"),
            ("leader", "String"),
            ("backend", "String!"),
            ("etcd", "JSON"),
        ],
    ),
    (
        "Schedule",
        &[
            ("timestamp", "Float!"),
            ("hash", "String!"),
            ("origin", "String!"),
        ],
    ),
    (
        "Fetch",
        &[
            ("state", "FetchState!"),
            ("leader", "String"),
            ("schedule", "String"),
        ],
    ),
    (
        "Leader",
        &[
            ("id", "String!"),
            ("name", "String!"),
            ("hostname", "String!"),
            ("addr", "String"),
            ("schedule", "String"),
            ("debugForced", "Boolean!"),
        ],
    ),
    (
        "Deployment",
        &[
            ("id", "String!"),
            ("schedule", "String!"),
            ("started", "Float!"),
            ("finished", "Float"),
            ("roles", "[String!]!"),
            ("failed", "[String!]!"),
            ("blocked", "[String!]!"),
        ],
    ),
    (
        "LogEntry",
        &[
            ("time", "String!"),
            ("deploymentId", "String!"),
            ("marker", "String!"),
            ("action", "String"),
            ("role", "String"),
        ],
    ),
    ("Okay", &[("ok", "Boolean!")]),
    (
        "Shadow",
        &[
            ("name", "String!"),
            ("configured", "Boolean!"),
            ("busyWith", "Float"),
            ("latest", "ShadowRun"),
            ("history", "[ShadowRun!]!"),
        ],
    ),
    (
        "ShadowRun",
        &[
            ("run", "Float!"),
            ("time", "Float!"),
            ("inputHash", "String!"),
            ("realHash", "String"),
            ("result", "String!"),
            ("pathsDiffering", "Int"),
            ("error", "String"),
            ("durationMs", "Float"),
            ("memoryBytes", "Float"),
            ("realError", "String"),
            ("codeVersion", "String"),
            ("log", "String"),
            ("diff", "JSON"),
            ("output", "JSON"),
        ],
    ),
    (
        "Datacenters",
        &[
            ("name", "String!"),
            ("exchange", "String!"),
            ("leading", "Boolean!"),
            ("leader", "String"),
            ("addr", "String!"),
            ("dcs", "[RemoteDc!]!"),
        ],
    ),
    (
        "RemoteDc",
        &[
            ("name", "String!"),
            ("addresses", "[String!]!"),
            ("leader", "String"),
            ("link", "String!"),
            ("rttMs", "Float"),
            ("contactAgeMs", "Float"),
            ("summary", "JSON"),
            ("summaryAgeMs", "Float"),
            ("summaryBehind", "Boolean!"),
            ("summaryDeferred", "Boolean!"),
            ("bytesSent", "Float!"),
            ("bytesReceived", "Float!"),
            ("requests", "[DcRequest!]!"),
            ("answers", "[DcAnswer!]!"),
            ("lent", "[DcLent!]!"),
            ("lastError", "String"),
            ("lastErrorAgeMs", "Float"),
        ],
    ),
    (
        "DcRequest",
        &[
            ("id", "String!"),
            ("data", "JSON"),
            ("expiresInMs", "Float!"),
        ],
    ),
    (
        "DcAnswer",
        &[
            ("request", "String!"),
            ("data", "JSON"),
            ("expiresInMs", "Float!"),
        ],
    ),
    (
        "DcLent",
        &[("request", "String!"), ("outstandingMs", "Float!")],
    ),
];

const ENUMS: &[(&str, &[&str])] = &[
    (
        "FetchState",
        &["UNSTABLE", "STABLE_LEADER", "PREFETCHING", "REPLICATING"],
    ),
    ("RoleState", &["OK", "FAILED", "WAITING", "BLOCKED"]),
];

/// A type in GraphQL's notation (`String!`, `[Role!]!`, `Float`).
fn type_ref(text: &str) -> TypeRef {
    let (inner, non_null) = match text.strip_suffix('!') {
        Some(inner) => (inner, true),
        None => (text, false),
    };
    let ty = match inner.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        Some(item) => TypeRef::List(Box::new(type_ref(item))),
        None => TypeRef::Named(inner.to_string().into()),
    };
    if non_null {
        TypeRef::NonNull(Box::new(ty))
    } else {
        ty
    }
}

/// How the generic resolver hands on a field's JSON.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A scalar or a list of scalars.
    Leaf,
    /// An enum value (a string in the tree).
    Enum,
    /// An object, or a list of objects.
    Object,
}

fn kind_of(ty: &str) -> Kind {
    let name = ty.trim_matches(|c| matches!(c, '[' | ']' | '!'));
    if ENUMS.iter().any(|(e, _)| *e == name) {
        Kind::Enum
    } else if OBJECTS.iter().any(|(o, _)| *o == name) {
        Kind::Object
    } else {
        Kind::Leaf
    }
}

/// An object of a result: the node at `path` (a JSON pointer) of `root`.
struct Node {
    view: Option<Arc<View>>,
    root: Arc<Value>,
    path: String,
}

impl Node {
    fn child<'a>(&self, path: String) -> FieldValue<'a> {
        FieldValue::owned_any(Node {
            view: self.view.clone(),
            root: self.root.clone(),
            path,
        })
    }
}

/// JSON as a GraphQL value (enum values from strings where the schema says so).
fn to_graphql(value: &Value, kind: Kind) -> GqlValue {
    match (value, kind) {
        (Value::String(name), Kind::Enum) => GqlValue::Enum(Name::new(name)),
        (Value::Array(items), Kind::Enum) => {
            GqlValue::List(items.iter().map(|v| to_graphql(v, kind)).collect())
        }
        _ => GqlValue::from_json(value.clone()).unwrap_or(GqlValue::Null),
    }
}

/// The resolver of every table field: field `name` of the parent's node.
fn json_field(
    name: &'static str,
    kind: Kind,
) -> impl for<'a> Fn(ResolverContext<'a>) -> FieldFuture<'a> + Send + Sync + 'static {
    move |ctx| {
        let Some(node) = ctx.parent_value.downcast_ref::<Node>() else {
            return FieldFuture::Value(None);
        };
        let path = format!("{}/{name}", node.path);
        let value = match node.root.pointer(&path) {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) if kind == Kind::Object => Some(FieldValue::list(
                (0..items.len()).map(|i| node.child(format!("{path}/{i}"))),
            )),
            Some(_) if kind == Kind::Object => Some(node.child(path)),
            Some(value) => Some(FieldValue::value(to_graphql(value, kind))),
        };
        FieldFuture::Value(value)
    }
}

fn error_field<'a>(message: String) -> FieldFuture<'a> {
    FieldFuture::new(async move { Err::<Option<FieldValue<'a>>, _>(message.into()) })
}

fn build_schema(source: Source) -> VerwalterSchema {
    let mut builder = Schema::build("Query", Some("Mutation"), Some("Subscription"));
    for (name, fields) in OBJECTS {
        let mut object = Object::new(*name);
        for (field, ty) in *fields {
            object = object.field(Field::new(
                *field,
                type_ref(ty),
                json_field(field, kind_of(ty)),
            ));
        }
        match *name {
            "Status" => object = object.field(deployments_field()),
            "Schedule" => object = object.field(schedule_data_field()),
            _ => {}
        }
        builder = builder.register(object);
    }
    for (name, items) in ENUMS {
        builder = builder.register(Enum::new(*name).items(items.iter().copied()));
    }
    let query = Object::new("Query")
        .field(Field::new("status", TypeRef::named_nn("Status"), |ctx| {
            let source = match ctx.data::<Source>() {
                Ok(source) => source,
                Err(e) => return error_field(e.message),
            };
            let view = match ctx.data_opt::<RequestView>() {
                // Aliases of `status` in one request read one snapshot.
                Some(cached) => cached.0.get_or_init(|| View::now(source)).clone(),
                None => View::now(source),
            };
            FieldFuture::Value(Some(View::root(view)))
        }))
        .field(shadows_field())
        .field(datacenters_field());
    let mutation =
        Object::new("Mutation").field(Field::new("noop", TypeRef::named_nn("Okay"), |_| {
            FieldFuture::Value(Some(FieldValue::owned_any(Node {
                view: None,
                root: Arc::new(json!({"ok": true})),
                path: String::new(),
            })))
        }));
    let subscription = Subscription::new("Subscription").field(SubscriptionField::new(
        "status",
        TypeRef::named_nn("Status"),
        |ctx| {
            SubscriptionFieldFuture::new(async move {
                let source = ctx.data::<Source>()?.clone();
                Ok(status_changes(source).map(|view| Ok(View::root(view))))
            })
        },
    ));
    builder
        .register(Scalar::new("JSON"))
        .register(query)
        .register(mutation)
        .register(subscription)
        .data(source)
        .limit_depth(MAX_DEPTH)
        .limit_complexity(MAX_COMPLEXITY)
        .limit_recursive_depth(32)
        .limit_directives(16)
        .finish()
        .expect("the schema table is consistent")
}

/// `Query.shadows`: the leader's shadow schedulers, each with its latest run (with its log and
/// diff) and its history (summaries).
fn shadows_field() -> Field {
    Field::new("shadows", TypeRef::named_nn_list_nn("Shadow"), |ctx| {
        let source = match ctx.data::<Source>() {
            Ok(source) => source,
            Err(e) => return error_field(e.message),
        };
        let root = Arc::new(super::shadow::graphql_tree(source.shadows.as_ref()));
        let items = (0..root.as_array().map_or(0, Vec::len))
            .map(|i| {
                FieldValue::owned_any(Node {
                    view: None,
                    root: root.clone(),
                    path: format!("/{i}"),
                })
            })
            .collect::<Vec<_>>();
        FieldFuture::Value(Some(FieldValue::list(items)))
    })
}

/// `Query.datacenters`: this node's DC and the others, as `GET /v1/datacenters` shows them;
/// `null` on a node in no DC.
fn datacenters_field() -> Field {
    Field::new("datacenters", TypeRef::named("Datacenters"), |ctx| {
        let source = match ctx.data::<Source>() {
            Ok(source) => source,
            Err(e) => return error_field(e.message),
        };
        let root = super::datacenters::graphql_tree(source.datacenters.as_deref());
        if root.is_null() {
            return FieldFuture::Value(None);
        }
        FieldFuture::Value(Some(FieldValue::owned_any(Node {
            view: None,
            root: Arc::new(root),
            path: String::new(),
        })))
    })
}

/// The view of the snapshot the parent node was read from (`None` for a node without one).
fn parent_view(ctx: &ResolverContext<'_>) -> Option<Arc<View>> {
    ctx.parent_value
        .downcast_ref::<Node>()
        .and_then(|n| n.view.clone())
}

/// `Schedule.data`: the scheduler's output, from the snapshot (not copied into the tree).
fn schedule_data_field() -> Field {
    Field::new("data", TypeRef::named_nn("JSON"), |ctx| {
        let Some(view) = parent_view(&ctx) else {
            return FieldFuture::Value(None);
        };
        if let Err(message) = view.spend() {
            return error_field(message);
        }
        let data = view
            .snap
            .schedule
            .as_ref()
            .as_ref()
            .map(|s| s.data.tree().clone());
        FieldFuture::Value(data.map(|d| FieldValue::value(to_graphql(&d, Kind::Leaf))))
    })
}

/// `Status.deployments(last: Int! = 20)`: the newest entries of the deployment log index.
fn deployments_field() -> Field {
    Field::new(
        "deployments",
        TypeRef::named_nn_list_nn("LogEntry"),
        |ctx| {
            let Some(view) = parent_view(&ctx) else {
                return FieldFuture::Value(None);
            };
            let last = ctx
                .args
                .get("last")
                .and_then(|v| v.i64().ok())
                .unwrap_or(20);
            if !(0..=MAX_DEPLOYMENT_ENTRIES).contains(&last) {
                return error_field(format!("last must be 0 to {MAX_DEPLOYMENT_ENTRIES}"));
            }
            if let Err(message) = view.spend() {
                return error_field(message);
            }
            FieldFuture::new(async move {
                let entries = match view.logs.clone() {
                    None => Vec::new(),
                    Some(logs) => {
                        tokio::task::spawn_blocking(move || logs.recent_index(last as usize))
                            .await
                            .map_err(|e| format!("reading the deployment log: {e}"))?
                            .map_err(|e| format!("reading the deployment log: {e}"))?
                    }
                };
                let root = Arc::new(Value::Array(
                    entries
                        .into_iter()
                        .map(|e| {
                            json!({"time": e.time, "deploymentId": e.deployment_id,
                               "marker": e.marker, "action": e.action, "role": e.role})
                        })
                        .collect(),
                ));
                let items = (0..root.as_array().map_or(0, Vec::len))
                    .map(|i| {
                        FieldValue::owned_any(Node {
                            view: Some(view.clone()),
                            root: root.clone(),
                            path: format!("/{i}"),
                        })
                    })
                    .collect::<Vec<_>>();
                Ok(Some(FieldValue::list(items)))
            })
        },
    )
    .argument(InputValue::new("last", TypeRef::named_nn("Int")).default_value(20))
}

/// The view of one request: made by the first `status` field, shared by its aliases.
#[derive(Default)]
pub(crate) struct RequestView(OnceLock<Arc<View>>);

/// A status made when the consumer asks for the next one: the stream holds no queue.
fn status_changes(source: Source) -> impl Stream<Item = Arc<View>> {
    let triggers = Fields::new(&source.store).triggers();
    futures::stream::unfold(
        (source, triggers, true),
        |(source, mut triggers, first)| async move {
            if !first {
                futures::future::select_all(triggers.iter_mut().map(|t| t.changed())).await;
                tokio::time::sleep(COALESCE).await;
            }
            let view = View::now(&source);
            Some((view, (source, triggers, false)))
        },
    )
}

/// One snapshot of the store, the `/v1/status` view made from it and the GraphQL tree of both.
pub(crate) struct View {
    snap: Snapshot,
    logs: Option<Arc<LogDir>>,
    tree: Arc<Value>,
    /// `schedule.data` and `deployments` resolved so far ([`MAX_COSTLY_FIELDS`]).
    costly: AtomicUsize,
}

/// Milliseconds as GraphQL floats (0.13's timestamps).
fn ms(value: u64) -> f64 {
    value as f64
}

impl View {
    fn now(source: &Source) -> Arc<View> {
        let snap = Snapshot::take(&source.store);
        let status = status::view(&source.node, &snap, source.metrics.scheduler_runs());
        let mut tree = tree(&source.node, &snap, &status);
        let etcd = source.backend.lock().unwrap().clone();
        tree["election"]["backend"] = Value::from(if etcd.is_some() { "etcd" } else { "builtin" });
        tree["election"]["etcd"] = etcd.unwrap_or(Value::Null);
        let tree = Arc::new(tree);
        Arc::new(View {
            snap,
            logs: source.logs.clone(),
            tree,
            costly: AtomicUsize::new(0),
        })
    }

    fn root<'a>(view: Arc<View>) -> FieldValue<'a> {
        FieldValue::owned_any(Node {
            root: view.tree.clone(),
            view: Some(view),
            path: String::new(),
        })
    }

    /// Counts one costly field; an error past [`MAX_COSTLY_FIELDS`].
    fn spend(&self) -> Result<(), String> {
        if self.costly.fetch_add(1, Ordering::SeqCst) >= MAX_COSTLY_FIELDS {
            return Err(format!(
                "schedule.data and deployments may be selected {MAX_COSTLY_FIELDS} times in all \
                 per result"
            ));
        }
        Ok(())
    }
}

/// The GraphQL tree of a status (all but `schedule.data` and `deployments`), field names as in
/// the schema.
fn tree(node: &NodeInfo, snap: &Snapshot, status: &status::Status) -> Value {
    let roles = &snap.roles;
    let mut names: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    let mine = snap
        .schedule
        .as_ref()
        .as_ref()
        .map(|s| vars::node_roles(s.data.tree(), &node.hostname))
        .unwrap_or_default();
    names.extend(mine.iter().map(String::as_str));
    names.extend(roles.failed.keys().map(String::as_str));
    names.extend(roles.blocked.keys().map(String::as_str));
    let role_list: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let failed = roles.failed.get(name);
            let blocked = roles.blocked.get(name);
            let state = match (failed, blocked.map(|b| b.state)) {
                (Some(_), _) => "FAILED",
                (None, Some(BlockedState::Waiting)) => "WAITING",
                (None, Some(BlockedState::Blocked)) => "BLOCKED",
                (None, None) => "OK",
            };
            json!({
                "name": name,
                "state": state,
                "lastError": failed.map(|f| &f.message),
                "attempts": failed.map_or(0, |f| f.attempts),
                "since": failed.map(|f| f.since).or(blocked.map(|b| b.since)).map(ms),
                "blockedOn": blocked.map(|b| b.on.clone()).unwrap_or_default(),
                "blockedRootCause": blocked.map(|b| b.root_cause.clone()).unwrap_or_default(),
                "blockedReason": blocked.map(|b| &b.reason),
                "deploymentId": match failed {
                    Some(f) => f.deployment_id.as_ref(),
                    None => blocked.and_then(|b| b.deployment_id.as_ref()),
                },
            })
        })
        .collect();
    let peers: Vec<Value> = snap
        .peers
        .peers
        .values()
        .map(|peer| {
            let report = snap.reports.get(&peer.id);
            json!({
                "id": peer.id,
                "name": peer.name,
                "hostname": peer.hostname,
                "addr": peer.addr,
                "knownSince": ms(peer.known_since),
                "lastReportDirect": peer.last_report_direct.map(ms),
                "errors": report.map_or(peer.errors, |r| r.errors),
                "schedule": report
                    .and_then(|r| r.schedule.as_ref())
                    .or(peer.schedule.as_ref())
                    .map(|s| &s.hash),
                "isLeader": snap.election.leader.as_ref() == Some(&peer.id),
            })
        })
        .collect();
    let election = &status.election_state;
    let fetch = &status.fetch_state;
    let fetch_state = match fetch.get("state").and_then(Value::as_str) {
        Some("StableLeader") => "STABLE_LEADER",
        Some("Prefetching") => "PREFETCHING",
        Some("Replicating") => "REPLICATING",
        _ => "UNSTABLE",
    };
    json!({
        "version": status.version,
        "id": status.id,
        "name": status.name,
        "hostname": status.hostname,
        "defaultFrontend": status.default_frontend,
        "roles": {"number": status.roles, "failed": status.failed_roles, "list": role_list},
        "peers": {
            "number": status.peers,
            "errorneous": status.failing_nodes.iter().map(|n| json!({
                "id": n.id, "name": n.name, "hostname": n.hostname, "errors": n.errors,
            })).collect::<Vec<_>>(),
            "timestamp": status.peers_timestamp.map(ms),
            "list": peers,
        },
        "election": {
            "isLeader": election.is_leader,
            "isStable": election.is_stable,
            "promoting": election.promoting,
            "numVotesForMe": election.num_votes_for_me,
            "neededVotes": election.needed_votes,
            "epoch": election.epoch as f64,
            "deadline": ms(election.deadline),
            "lastStableTimestamp": election.last_stable_timestamp.map(ms),
            "leader": election.leader,
        },
        "schedule": snap.schedule.as_ref().as_ref().map(|s| json!({
            "timestamp": ms(s.timestamp), "hash": s.hash, "origin": s.origin,
        })),
        "fetch": {
            "state": fetch_state,
            "leader": fetch.get("leader"),
            "schedule": fetch.get("schedule"),
        },
        "numErrors": status.num_errors,
        "errors": status.errors,
        "leader": status.leader.as_ref().map(|l| json!({
            "id": l.id, "name": l.name, "hostname": l.hostname, "addr": l.addr,
            "schedule": l.schedule,
            // Known for this node only: a remote leader's flag is not reported.
            "debugForced": election.is_leader && node.debug_force_leader,
        })),
        // 0.13's self-meter reports: no counterpart.
        "selfReport": null,
        "threadsReport": null,
        "scheduleStatus": status.schedule_status,
        "metrics": status.metrics,
        "lastDeployment": roles.last_deployment.as_ref().map(|d| json!({
            "id": d.id, "schedule": d.schedule, "started": ms(d.started),
            "finished": d.finished.map(ms), "roles": d.roles, "failed": d.failed,
            "blocked": d.blocked,
        })),
    })
}

// ---- HTTP -------------------------------------------------------------------------------------

/// The body of `POST /v1/graphql`: a GraphQL request.
pub(crate) struct GraphqlBody;

impl JsonRoute for GraphqlBody {
    type Body = async_graphql::Request;
    const RULES: BodyRules = BodyRules {
        not_parsed: "the body is not a GraphQL request ({query, operationName?, variables?})",
        graphql: true,
        ..BodyRules::json(
            BODY_LIMIT,
            "send the query as Content-Type: application/json",
            |limit| format!("a GraphQL request body is at most {limit} bytes"),
        )
    };
}

/// `POST /v1/graphql`.
pub(crate) async fn post(
    State(state): State<AppState>,
    body: JsonBody<GraphqlBody>,
) -> Result<Response, ApiError> {
    let request = body.into_inner();
    let schema = schema(&state);
    let work = off_runtime(async move {
        let mut request = request;
        if let Err(refused) = check_cost(&mut request) {
            return async_graphql::Response::from_errors(vec![refused]);
        }
        schema.execute(request.data(RequestView::default())).await
    });
    let response = match tokio::time::timeout(TIME_BUDGET, work).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the query failed: {e}"),
            )
            .graphql());
        }
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the query ran past its time budget of {} s and was stopped",
                    TIME_BUDGET.as_secs()
                ),
            )
            .graphql());
        }
    };
    let code = if response.data == async_graphql::Value::Null {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    Ok((code, Json(response)).into_response())
}

/// `GET /v1/graphql`: a WebSocket for subscriptions (queries and mutations work there too).
pub(crate) async fn socket(
    State(state): State<AppState>,
    headers: HeaderMap,
    token_at_init: Option<axum::Extension<super::guard::TokenAtInit>>,
    may_write: Option<axum::Extension<super::guard::MayWrite>>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(_) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "GET /v1/graphql is a WebSocket (subprotocol graphql-ws or graphql-transport-ws); \
                 send queries with POST",
            )
            .graphql()
            .into_response();
        }
    };
    // Browsers apply no same-origin rule to WebSockets: a page of another site could read the
    // status over one. Its `Origin` must be this node's, as for requests that change state.
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if !access::websocket_allowed(text(header::HOST), text(header::ORIGIN)) {
        return ApiError::forbidden(format!(
            "cross-site WebSocket from {:?} refused: open it from a page of this node",
            text(header::ORIGIN).unwrap_or("")
        ))
        .into_response();
    }
    let Ok(permit) = state.http.streams.clone().try_acquire_owned() else {
        return ApiError::unavailable(
            format!(
                "{} event streams and GraphQL sockets are open, the most this node serves \
                 (http.max-event-streams, at most a quarter of the connection cap)",
                state.http.max_streams
            ),
            "5",
        )
        .into_response();
    };
    // The write buffer takes one whole message: tungstenite refuses a message larger than
    // `max_write_buffer_size` with an error (a result holding a schedule of a few hundred KiB
    // closed the socket at once, even for a client that reads). `run` sends one message at a
    // time and waits until it is written, so the buffer never holds more than that one (whose
    // text is in memory anyway); a client that does not take it meets the stall timeout.
    let upgrade = upgrade
        .protocols(async_graphql::http::ALL_WEBSOCKET_PROTOCOLS)
        .max_message_size(BODY_LIMIT)
        .max_frame_size(BODY_LIMIT)
        .write_buffer_size(super::serve::BUFFER)
        .max_write_buffer_size(usize::MAX);
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
        may_write: Arc::new(AtomicBool::new(may_write.is_some())),
    };
    let token = state.http.settings.token.clone();
    let stall = state.http.settings.stream_stall_timeout;
    // The upgrade came without the token reads need (a browser cannot send the header): its
    // `connection_init` must carry it.
    let init_token = token_at_init.and(state.http.settings.token.clone());
    let timers = Timers {
        stall,
        init: state.http.settings.idle_timeout,
    };
    upgrade.on_upgrade(move |socket| async move {
        // The whole socket runs on the GraphQL runtime: the protocol's loop makes each result
        // inside its poll, one at a time, there and not on the daemon's runtime. The socket's
        // reads and writes are still driven by the daemon's runtime, which owns the connection.
        let tokens = Tokens {
            init: init_token,
            write: token,
        };
        let _ = off_runtime(run(socket, executor, protocol, tokens, timers, slot)).await;
    })
}

/// The tokens a GraphQL WebSocket's `connection_init` is checked against.
struct Tokens {
    /// The token the upgrade lacked and reads need: nothing runs before a `connection_init`
    /// that carries it.
    init: Option<access::Token>,
    /// The node's token: a `connection_init` that carries it lets the socket run mutations.
    write: Option<access::Token>,
}

/// How long a GraphQL WebSocket may wait.
#[derive(Debug, Clone, Copy)]
struct Timers {
    /// For a message to be written (`http.stream-stall-timeout-ms`).
    stall: Duration,
    /// For the client's `connection_init` (`http.idle-timeout-ms`).
    init: Duration,
}

/// Serves one GraphQL WebSocket until either side closes it or the client stops reading. With
/// `init_token`, nothing runs before a `connection_init` that carries it; one that does not is
/// answered as `access::refuse_init` says and the socket closes. A socket without a
/// `connection_init` within `timers.init` is closed as `access::INIT_TIMEOUT_CLOSE` says.
async fn run(
    socket: WebSocket,
    executor: Capped,
    protocol: WebSocketProtocols,
    tokens: Tokens,
    timers: Timers,
    _slot: super::events::Slot,
) {
    let Tokens {
        init: init_token,
        write: write_token,
    } = tokens;
    let may_write = executor.may_write.clone();
    let stall = timers.stall;
    let (mut sink, incoming) = socket.split();
    let incoming = text_frames(incoming);
    let protocol_name = protocol_name(protocol);
    // Set when `connection_init` was refused, so that the close the crate then makes is ours.
    let refused = Arc::new(OnceLock::new());
    let init_refused = refused.clone();
    let initialised = Arc::new(AtomicBool::new(false));
    let init_seen = initialised.clone();
    let mut outgoing =
        GraphqlSocket::new(executor, incoming, protocol).on_connection_init(move |payload| {
            init_seen.store(true, Ordering::Relaxed);
            if access::socket_may_write(write_token.as_ref(), None, Some(&payload)) {
                may_write.store(true, Ordering::SeqCst);
            }
            let verdict = match &init_token {
                None => Ok(()),
                Some(token) => access::check_init_token(token, &payload),
            };
            async move {
                let refusal = match verdict {
                    Ok(()) => return Ok(async_graphql::Data::default()),
                    Err(refusal) => refusal,
                };
                let _ = init_refused.set(refusal);
                // graphql-ws sends this as its `connection_error`.
                Err(async_graphql::Error::new(
                    match access::refuse_init(protocol_name, refusal) {
                        access::InitRefused::ConnectionError { message } => message,
                        access::InitRefused::Close { reason, .. } => reason.into(),
                    },
                ))
            }
        });
    // The last payload sent per subscription: an unchanged result is not sent again.
    let mut last = LastSent::default();
    let init_deadline = tokio::time::Instant::now() + timers.init;
    loop {
        // `next` makes the next message only now: nothing waits in a queue for a slow client.
        let next = if initialised.load(Ordering::Relaxed) {
            outgoing.next().await
        } else {
            tokio::select! {
                next = outgoing.next() => next,
                () = tokio::time::sleep_until(init_deadline) => {
                    if initialised.load(Ordering::Relaxed) {
                        continue;
                    }
                    close_uninitialised(&mut sink, timers).await;
                    return;
                }
            }
        };
        let Some(message) = next else {
            break;
        };
        let message = match message {
            WsMessage::Text(text) => {
                if !fresh(&mut last, &text) {
                    continue;
                }
                Message::Text(text.into())
            }
            WsMessage::Close(code, reason) => {
                close_frame(code, reason, refused.get().copied(), protocol_name)
            }
        };
        if send_within(&mut sink, message, stall).await.is_break() {
            return;
        }
    }
    let _ = tokio::time::timeout(stall, sink.close()).await;
}

/// A GraphQL WebSocket's incoming text frames, up to the first close or error; binary frames
/// are ignored.
fn text_frames(
    incoming: SplitStream<WebSocket>,
) -> impl Stream<Item = axum::body::Bytes> + Send + Unpin + 'static {
    incoming
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
        })
}

/// The protocol a `connection_init` refusal is answered in.
fn protocol_name(protocol: WebSocketProtocols) -> access::GraphqlProtocol {
    match protocol {
        WebSocketProtocols::SubscriptionsTransportWS => access::GraphqlProtocol::GraphqlWs,
        WebSocketProtocols::GraphQLWS => access::GraphqlProtocol::GraphqlTransportWs,
    }
}

/// Closes a GraphQL WebSocket that sent no `connection_init` in time, as
/// `access::INIT_TIMEOUT_CLOSE` says.
async fn close_uninitialised(sink: &mut SplitSink<WebSocket, Message>, timers: Timers) {
    let (code, reason) = access::INIT_TIMEOUT_CLOSE;
    tracing::info!(
        idle_timeout_ms = timers.init.as_millis() as u64,
        "Closed a GraphQL WebSocket that sent no connection_init."
    );
    let close = Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }));
    let _ = tokio::time::timeout(timers.stall, sink.send(close)).await;
}

/// The close frame for the crate's close `(code, reason)`: ours when `connection_init` was
/// `refused` with a close.
fn close_frame(
    code: u16,
    reason: String,
    refused: Option<access::TokenRefusal>,
    protocol_name: access::GraphqlProtocol,
) -> Message {
    let (code, reason) = match refused.map(|refusal| access::refuse_init(protocol_name, refusal)) {
        Some(access::InitRefused::Close { code, reason }) => (code, reason.into()),
        _ => (code, reason),
    };
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// Writes one message within `stall`; breaks when the socket is done: the message was a close,
/// or the client stopped reading, or the write failed.
async fn send_within(
    sink: &mut SplitSink<WebSocket, Message>,
    message: Message,
    stall: Duration,
) -> ControlFlow<()> {
    let closing = matches!(message, Message::Close(_));
    let dropped = || {
        tracing::info!(
            stall_ms = stall.as_millis() as u64,
            "Dropped a GraphQL WebSocket client that stopped reading."
        );
    };
    match tokio::time::timeout(stall, sink.send(message)).await {
        Ok(Ok(())) if !closing => ControlFlow::Continue(()),
        Ok(Ok(())) => ControlFlow::Break(()),
        // The connection's socket fails a write waiting as long (`serve.rs`); whichever
        // of the two timers is polled first ends the socket.
        Ok(Err(e)) => {
            if stalled_write(&e) {
                dropped();
            }
            ControlFlow::Break(())
        }
        Err(_) => {
            dropped();
            ControlFlow::Break(())
        }
    }
}

/// Whether a failed send is the connection's stall timeout (`serve.rs` fails a write waiting
/// for it with `TimedOut`).
fn stalled_write(error: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::TimedOut;
        }
        cause = e.source();
    }
    false
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

/// The schema as one socket's executor: at most [`MAX_SUBSCRIPTIONS`] subscriptions at once,
/// mutations only once the socket has shown the token ([`access::socket_may_write`]), and
/// every document counted ([`check_cost`]) before the schema sees it. It runs where the
/// socket does, on the GraphQL runtime ([`off_runtime`]).
#[derive(Clone)]
struct Capped {
    schema: VerwalterSchema,
    open: Arc<AtomicUsize>,
    /// Set from the upgrade's header, or by a `connection_init` that carries the token.
    may_write: Arc<AtomicBool>,
}

/// One open subscription of a socket, counted until its stream is dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Capped {
    /// Whether the socket may run `request`: its cost, and a mutation's token.
    fn admit(&self, request: &mut async_graphql::Request) -> Result<(), ServerError> {
        check_cost(request)?;
        if !self.may_write.load(Ordering::SeqCst) && holds_mutation(request) {
            return Err(ServerError::new(access::SOCKET_MUTATION_REFUSED, None));
        }
        Ok(())
    }
}

/// A result with `error` and no data, as one message of the socket's protocol.
fn refused(error: ServerError) -> BoxStream<'static, async_graphql::Response> {
    let response = async_graphql::Response::from_errors(vec![error]);
    futures::stream::once(futures::future::ready(response)).boxed()
}

impl Executor for Capped {
    async fn execute(&self, mut request: async_graphql::Request) -> async_graphql::Response {
        if let Err(error) = self.admit(&mut request) {
            return async_graphql::Response::from_errors(vec![error]);
        }
        self.schema
            .execute(request.data(RequestView::default()))
            .await
    }

    /// Every `start`/`subscribe` of the socket (queries and mutations too) comes here.
    fn execute_stream(
        &self,
        mut request: async_graphql::Request,
        session_data: Option<Arc<async_graphql::Data>>,
    ) -> BoxStream<'static, async_graphql::Response> {
        if let Err(error) = self.admit(&mut request) {
            return refused(error);
        }
        if self.open.fetch_add(1, Ordering::SeqCst) >= MAX_SUBSCRIPTIONS {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return refused(ServerError::new(
                format!("at most {MAX_SUBSCRIPTIONS} subscriptions per WebSocket"),
                None,
            ));
        }
        let counted = Counted(self.open.clone());
        let request = request.data(RequestView::default());
        Executor::execute_stream(&self.schema, request, session_data)
            .map(move |response| {
                let _held = &counted;
                response
            })
            .boxed()
    }
}

// ---- The cost of a document, and the runtime GraphQL runs on ---------------------------------

/// Parses `request`'s query (kept in the request: the schema does not parse it again) and
/// refuses it when it stands for more than [`MAX_EXPANDED_SELECTIONS`] selections with its
/// fragments expanded, or when a fragment spreads itself. Linear in the query's size. A query
/// that does not parse is let through: the schema answers with the parser's error.
fn check_cost(request: &mut async_graphql::Request) -> Result<(), ServerError> {
    let Ok(doc) = request.parsed_query() else {
        return Ok(());
    };
    graphql_cost::expanded_selections(&flatten(doc), MAX_EXPANDED_SELECTIONS)
        .map(drop)
        .map_err(|refusal| ServerError::new(refusal.to_string(), None))
}

/// What `/v1/graphql` decides about `query` before anything runs it: parsed, then counted with
/// its fragments expanded (`Ok` for a query that does not parse: the schema answers with the
/// parser's error). The fuzz target `graphql_query` calls it.
pub fn query_cost(query: &str) -> Result<(), String> {
    let mut request = async_graphql::Request::new(query);
    check_cost(&mut request).map_err(|error| error.message)
}

/// Whether a parsed `request` holds a mutation.
fn holds_mutation(request: &mut async_graphql::Request) -> bool {
    request.parsed_query().is_ok_and(|doc| {
        doc.operations
            .iter()
            .any(|(_, operation)| operation.node.ty == OperationType::Mutation)
    })
}

/// `doc` as [`graphql_cost`] counts it: each operation and fragment with the fields and inline
/// fragments of its own text and the fragments it spreads. The walk's depth is bounded by the
/// parser's nesting limit.
fn flatten(doc: &ExecutableDocument) -> graphql_cost::Document<'_> {
    fn walk<'a>(set: &'a SelectionSet, unit: &mut graphql_cost::Unit<'a>) {
        for item in &set.items {
            match &item.node {
                Selection::Field(field) => {
                    unit.selections += 1;
                    walk(&field.node.selection_set.node, unit);
                }
                Selection::InlineFragment(inline) => {
                    unit.selections += 1;
                    walk(&inline.node.selection_set.node, unit);
                }
                Selection::FragmentSpread(spread) => {
                    unit.spreads.push(spread.node.fragment_name.node.as_str());
                }
            }
        }
    }
    fn unit_of(set: &SelectionSet) -> graphql_cost::Unit<'_> {
        let mut unit = graphql_cost::Unit::default();
        walk(set, &mut unit);
        unit
    }
    graphql_cost::Document {
        operations: doc
            .operations
            .iter()
            .map(|(_, operation)| unit_of(&operation.node.selection_set.node))
            .collect(),
        fragments: doc
            .fragments
            .iter()
            .map(|(name, fragment)| (name.as_str(), unit_of(&fragment.node.selection_set.node)))
            .collect(),
    }
}

/// The runtime every query, mutation and subscription result is made on: one worker thread
/// of its own ("graphql"), so that however long GraphQL work takes, the daemon's runtime (the
/// election, `/v1/status`, the controllers) is not the one that waits. One per process, never
/// dropped.
static RUNTIME: std::sync::LazyLock<tokio::runtime::Runtime> = std::sync::LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(4)
        .thread_name("graphql")
        .enable_all()
        .build()
        .expect("starting the GraphQL runtime's thread")
});

/// A task on the GraphQL runtime whose result the caller awaits; dropping it (a client gone,
/// a time budget past) aborts the task.
struct OffTask<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for OffTask<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for OffTask<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

/// Runs `work` on the GraphQL runtime.
fn off_runtime<F>(work: F) -> OffTask<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    OffTask(RUNTIME.spawn(work))
}

/// [`off_runtime`] for the tests.
#[cfg(test)]
pub(super) async fn graphql_offload_for_tests<F>(
    work: F,
) -> Result<F::Output, tokio::task::JoinError>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    off_runtime(work).await
}

/// `GET /v1/graphiql`: the built-in frontend's page, whichever frontend is the default; its
/// router shows the GraphQL page there (frontend/js/pages/graphql.js: the frontend's header, a
/// query editor completing field names from the schema, a schema explorer, Subscribe over the
/// WebSocket), under the frontend's Content-Security-Policy.
pub(crate) async fn graphiql(headers: HeaderMap) -> Response {
    super::frontend::builtin_page(&headers)
}
