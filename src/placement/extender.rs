//! The Kubernetes scheduler extender over HTTP(S): `POST /filter`, `POST /prioritize`,
//! `GET /metrics`, `GET /status`, the probes `GET /readyz` and `GET /healthz`, and `GET /` (the
//! routes, [`ROUTES`]) on an address of its own, so that kube-scheduler reaches only these
//! routes.
//!
//! Every request reads the snapshot in force from the [`SnapshotStore`] (a pointer copy) and
//! decides with `verwalter_placement::extender`; nothing is queried on the request path. The
//! data sources that fill the store are started by [`super::start::start_sources`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::http::access::BodyRefusal;
use verwalter_placement::Algorithm;
use verwalter_placement::config::{DataProvider, LoadedAlgorithm};
use verwalter_placement::extender::{self as wire, ExtenderArgs, Verdict};
use verwalter_placement::loggers::DECISIONS_TARGET;
use verwalter_placement::snapshot;

use super::metrics::SourceMetrics;
use super::refresh::RefreshSettings;
use super::start::{SourcePlan, SourcesError, start_sources};
use super::store::{SnapshotStore, View};
use crate::http::{ApiError, ServeLimits};
use crate::metrics::{ConnectionMetrics, HttpClose};

/// The port wca-scheduler listens on (its policy's `URLPrefix` is `https://…:30180`).
pub(crate) const DEFAULT_PORT: u16 = 30180;
/// A full `Nodes` list of 5,000 nodes is tens of MB; `NodeNames` requests are far smaller.
pub(crate) const DEFAULT_MAX_BODY_BYTES: u64 = 64 << 20;
/// Two bodies of the largest size at once: kube-scheduler sends one call at a time per pod.
pub(crate) const DEFAULT_BODY_BUDGET_BYTES: u64 = 128 << 20;
/// A connection without a complete request head for this long is closed (kube-scheduler keeps
/// its connections busy or closes them; its own timeout per call is 5 s).
pub(crate) const DEFAULT_IDLE_TIMEOUT_MS: u64 = 30_000;
/// A request body must all come within this (kube-scheduler gives up on a call after 5 s).
pub(crate) const DEFAULT_BODY_TIMEOUT_MS: u64 = 10_000;
/// Connections at most; kube-scheduler uses a handful.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// A reply the client takes nothing of for this long closes its connection: kube-scheduler
/// reads its replies at once, and gives up on a call after 5 s.
const STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Buckets of the request latency: 50 µs to 5 s (kube-scheduler's timeout).
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
];

/// `verwalter extender`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ExtenderFlags {
    /// wca-scheduler's config.yaml: the algorithm (and its data provider)
    #[arg(long, value_name = "FILE")]
    pub(crate) config: PathBuf,
    /// Address the extender listens on; its own, so kube-scheduler reaches only the extender
    #[arg(long, value_name = "IP:PORT", default_value_t = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))]
    pub(crate) listen: SocketAddr,
    /// Placement data from this JSON or YAML file (a Snapshot); re-read when it changes
    #[arg(long, value_name = "FILE")]
    pub(crate) snapshot: Option<PathBuf>,
    /// Schedule pods of this namespace (repeat for more) [default: default]
    #[arg(long = "namespace", value_name = "NS")]
    pub(crate) namespaces: Vec<String>,
    /// The algorithm to use (its name or alias), when the config has several
    #[arg(long, value_name = "NAME")]
    pub(crate) algorithm: Option<String>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Open connections at most; past it the oldest idle one (else one whose client holds its
    /// request up) is closed to make room
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub(crate) max_connections: usize,
    /// A connection that sends no complete request head for this long is closed
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_IDLE_TIMEOUT_MS)]
    pub(crate) idle_timeout_ms: u64,
    /// A request body must all come within this long after its head (else 408)
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_BODY_TIMEOUT_MS)]
    pub(crate) body_timeout_ms: u64,
    /// Bytes in one request body at most; a longer Content-Length is refused at once (413)
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub(crate) max_body_bytes: u64,
    /// Bytes of all request bodies (and their replies) held at once; a request that cannot get
    /// its share within 1 s gets 503
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_BODY_BUDGET_BYTES)]
    pub(crate) body_budget_bytes: u64,
}

/// The extender's limits on connections and request bodies (flags, or the `placement-extender:`
/// keys of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExtenderLimits {
    pub(crate) max_connections: usize,
    pub(crate) idle_timeout: Duration,
    pub(crate) body_timeout: Duration,
    pub(crate) max_body: u64,
    pub(crate) body_budget: u64,
}

impl Default for ExtenderLimits {
    fn default() -> Self {
        ExtenderLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            body_timeout: Duration::from_millis(DEFAULT_BODY_TIMEOUT_MS),
            max_body: DEFAULT_MAX_BODY_BYTES,
            body_budget: DEFAULT_BODY_BUDGET_BYTES,
        }
    }
}

impl ExtenderLimits {
    /// From the flags' values; every problem names its flag or key (`prefix` and the name:
    /// `--` for flags, `placement-extender.` for settings).
    pub(crate) fn from_flags(
        flags: &ExtenderFlags,
        prefix: &str,
    ) -> Result<ExtenderLimits, String> {
        let mut problems = Vec::new();
        for (name, value) in [
            ("max-connections", flags.max_connections as u64),
            ("idle-timeout-ms", flags.idle_timeout_ms),
            ("body-timeout-ms", flags.body_timeout_ms),
            ("max-body-bytes", flags.max_body_bytes),
            ("body-budget-bytes", flags.body_budget_bytes),
        ] {
            if value == 0 {
                problems.push(format!("{prefix}{name}: must be above 0"));
            }
        }
        if flags.body_budget_bytes < flags.max_body_bytes {
            problems.push(format!(
                "{prefix}body-budget-bytes: {} is below {prefix}max-body-bytes ({}): a body of the \
                 largest size could never be read",
                flags.body_budget_bytes, flags.max_body_bytes
            ));
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(ExtenderLimits {
            max_connections: flags.max_connections,
            idle_timeout: Duration::from_millis(flags.idle_timeout_ms),
            body_timeout: Duration::from_millis(flags.body_timeout_ms),
            max_body: flags.max_body_bytes,
            body_budget: flags.body_budget_bytes,
        })
    }
}

/// An extender ready to start: the algorithm chosen from a loaded config, and where to serve.
#[derive(Debug, Clone)]
pub struct ExtenderSetup {
    pub(crate) listen: SocketAddr,
    /// The config file the algorithm came from (for the log and `/status`).
    pub(crate) config: PathBuf,
    /// Its name in the config.
    pub(crate) algorithm_name: String,
    pub(crate) algorithm: Algorithm,
    pub(crate) data_provider: Option<DataProvider>,
    pub(crate) snapshot: Option<PathBuf>,
    pub(crate) namespaces: Vec<String>,
    /// Certificate chain and key (PEM) to serve HTTPS with.
    pub(crate) tls: Option<(PathBuf, PathBuf)>,
    /// Connections and request bodies (`max_connections` as given: the caller caps it by the
    /// descriptor limit).
    pub(crate) limits: ExtenderLimits,
    /// The config's `loggers:` (wca's), for the log filter ([`verwalter_placement::loggers`]).
    pub loggers: BTreeMap<String, String>,
}

impl ExtenderSetup {
    /// Reads the placement config at `flags.config` and picks the algorithm; every problem is a
    /// message naming the file.
    pub fn from_flags(flags: &ExtenderFlags) -> Result<ExtenderSetup, String> {
        ExtenderSetup::from_flags_named(flags, "--")
    }

    /// [`ExtenderSetup::from_flags`] with the limits' problems named with `prefix`.
    pub(crate) fn from_flags_named(
        flags: &ExtenderFlags,
        prefix: &str,
    ) -> Result<ExtenderSetup, String> {
        let limits = ExtenderLimits::from_flags(flags, prefix)?;
        let text = super::input::read_text_capped(&flags.config, super::input::MAX_CONFIG_BYTES)
            .map_err(|e| format!("{}: cannot read: {e}", flags.config.display()))?;
        let config = verwalter_placement::config::load_config(&text, |n| std::env::var(n).ok())
            .map_err(|e| format!("{}: {e}", flags.config.display()))?;
        let (name, loaded) = choose(&config.algorithms, flags.algorithm.as_deref())
            .map_err(|e| format!("{}: {e}", flags.config.display()))?;
        Ok(ExtenderSetup {
            listen: flags.listen,
            config: flags.config.clone(),
            algorithm_name: name.clone(),
            algorithm: loaded.algorithm.clone(),
            data_provider: loaded.data_provider.clone(),
            snapshot: flags.snapshot.clone(),
            namespaces: if flags.namespaces.is_empty() {
                wire::default_namespaces()
            } else {
                flags.namespaces.clone()
            },
            tls: flags.tls_cert.clone().zip(flags.tls_key.clone()),
            limits,
            loggers: config.loggers.clone(),
        })
    }
}

/// The algorithm to serve: the one named (by its name or its alias), or the only one.
pub(crate) fn choose<'a>(
    algorithms: &'a BTreeMap<String, LoadedAlgorithm>,
    wanted: Option<&str>,
) -> Result<(&'a String, &'a LoadedAlgorithm), String> {
    let names = || algorithms.keys().cloned().collect::<Vec<_>>().join(", ");
    match wanted {
        Some(wanted) => algorithms
            .iter()
            .find(|(name, _)| *name == wanted)
            .or_else(|| {
                algorithms
                    .iter()
                    .find(|(_, a)| a.alias.as_deref() == Some(wanted))
            })
            .ok_or_else(|| format!("no algorithm {wanted:?} (the config has: {})", names())),
        None if algorithms.len() == 1 => Ok(algorithms.iter().next().expect("one algorithm")),
        None if algorithms.is_empty() => Err("the config has no algorithm".into()),
        None => Err(format!(
            "the config has several algorithms ({}); pick one with --algorithm",
            names()
        )),
    }
}

/// Why the extender could not start.
#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    #[error("extender: cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("extender: {0}")]
    Tls(String),
    #[error("extender: {0}")]
    Sources(#[from] SourcesError),
}

/// What the handlers share.
pub(crate) struct Extender {
    pub(crate) algorithm: Algorithm,
    pub(crate) algorithm_name: String,
    pub(crate) namespaces: Vec<String>,
    pub(crate) store: SnapshotStore,
    pub(crate) metrics: ExtenderMetrics,
    pub(crate) limits: ExtenderLimits,
    /// The bytes of request bodies and replies held at once.
    pub(crate) budget: body::BodyBudget,
}

impl std::fmt::Debug for Extender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extender")
            .field("algorithm", &self.algorithm_name)
            .finish()
    }
}

impl Extender {
    #[cfg(test)]
    pub(crate) fn new(
        algorithm_name: String,
        algorithm: Algorithm,
        namespaces: Vec<String>,
        store: SnapshotStore,
    ) -> Extender {
        Extender::with_metrics(
            algorithm_name,
            algorithm,
            namespaces,
            store,
            ExtenderMetrics::new(),
        )
    }

    /// With `metrics` made beforehand (their registry may hold the data sources' families too).
    pub(crate) fn with_metrics(
        algorithm_name: String,
        algorithm: Algorithm,
        namespaces: Vec<String>,
        store: SnapshotStore,
        metrics: ExtenderMetrics,
    ) -> Extender {
        let limits = ExtenderLimits::default();
        Extender {
            algorithm,
            algorithm_name,
            namespaces,
            store,
            metrics,
            budget: body::BodyBudget::new(limits.body_budget),
            limits,
        }
    }

    /// With `limits` instead of the defaults.
    pub(crate) fn with_limits(mut self, limits: ExtenderLimits) -> Extender {
        self.budget = body::BodyBudget::new(limits.body_budget);
        self.limits = limits;
        self
    }
}

/// Every route the extender serves: (method, path, what it answers); `GET /` lists them.
pub const ROUTES: &[(&str, &str, &str)] = &[
    (
        "POST",
        "/filter",
        "kube-scheduler's filter verb: the candidate nodes the pod may go to",
    ),
    (
        "POST",
        "/prioritize",
        "kube-scheduler's prioritize verb: a score from 0 to 10 per candidate",
    ),
    (
        "GET",
        "/status",
        "whether the placement data is loaded, how fresh, the sources' errors",
    ),
    (
        "GET",
        "/metrics",
        "the extender's metrics, Prometheus text format",
    ),
    (
        "GET",
        "/readyz",
        "200 once the first snapshot is loaded, 503 with the reason before",
    ),
    ("GET", "/healthz", "200 while the process serves"),
    ("GET", "/", "this list"),
];

/// The extender's routes, apart from serving (tests call it without a socket).
pub(crate) fn router(state: Arc<Extender>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/readyz", get(readyz))
        .route("/healthz", get(healthz))
        .route("/", get(index))
        .with_state(state)
}

/// `GET /readyz`: `200 ok` once a snapshot is loaded (a source failing later keeps the last good
/// one in force, so it stays ready); before, `503` with why, naming each failing source's error.
async fn readyz(State(state): State<Arc<Extender>>) -> Response {
    let view = state.store.view();
    if view.snapshot.is_some() {
        return (StatusCode::OK, "ok\n").into_response();
    }
    let mut reason = String::from(
        "not ready: the placement data is not loaded yet (no snapshot from the data sources so \
         far)\n",
    );
    for (source, error) in &view.errors {
        reason.push_str(&format!("{source}: {}\n", error.message));
    }
    (StatusCode::SERVICE_UNAVAILABLE, reason).into_response()
}

/// `GET /healthz`: `200 ok` while the process serves requests.
async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

/// `GET /`: the routes, as JSON (`{"service", "algorithm", "routes": [{method, path, what}]}`).
async fn index(State(state): State<Arc<Extender>>) -> Response {
    let routes: Vec<_> = ROUTES
        .iter()
        .map(|(method, path, what)| serde_json::json!({"method": method, "path": path, "what": what}))
        .collect();
    json_response(&serde_json::json!({
        "service": "verwalter scheduler extender",
        "algorithm": state.algorithm_name,
        "routes": routes,
    }))
}

/// The answer to a request that is not an extender request: 400 with
/// `{"error": "...", "field": "..."}`.
fn bad_request(error: wire::WireError) -> ApiError {
    ApiError::bad_request(error.to_string()).with("field", error.path)
}

fn json_response<T: Serialize>(value: &T) -> Response {
    let body = serde_json::to_vec(value).expect("replies serialize");
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

#[derive(Clone, Copy)]
enum Verb {
    Filter,
    Prioritize,
}

impl Verb {
    fn label(self) -> &'static str {
        match self {
            Verb::Filter => "filter",
            Verb::Prioritize => "prioritize",
        }
    }
}

/// Parses, decides, counts and logs one request; `decide` makes the reply.
fn handle(
    state: &Extender,
    verb: Verb,
    body: &[u8],
    decide: impl FnOnce(&Extender, &View, &ExtenderArgs) -> (Response, Verdict),
) -> Response {
    let started = Instant::now();
    let (response, result) = match ExtenderArgs::from_json(body) {
        Ok(args) => {
            let view = state.store.view();
            let (response, verdict) = decide(state, &view, &args);
            let (pod, namespace, app) = (args.pod.name(), args.pod.namespace(), args.pod.app());
            match verdict {
                Verdict::UnknownApp => tracing::info!(
                    verb = verb.label(),
                    pod,
                    namespace,
                    app,
                    "The snapshot has no request for this app; passing the pod through."
                ),
                Verdict::NotLoaded => tracing::warn!(
                    verb = verb.label(),
                    pod,
                    namespace,
                    "No placement data loaded yet; kube-scheduler is told so."
                ),
                _ => tracing::debug!(
                    verb = verb.label(),
                    pod,
                    namespace,
                    app,
                    result = verdict.label(),
                    nodes = args.candidates().len(),
                    "Answered."
                ),
            }
            (response, verdict.label())
        }
        Err(error) => {
            tracing::info!(verb = verb.label(), %error, "Bad extender request.");
            (bad_request(error).into_response(), "bad_request")
        }
    };
    state.metrics.request(verb, result, started.elapsed());
    response
}

/// Reads the body within the limits and the budget, then [`handle`]s it; the reply keeps the
/// request's share of the budget until it is sent.
async fn within_limits(
    state: &Extender,
    verb: Verb,
    request: axum::extract::Request,
    decide: impl FnOnce(&Extender, &View, &ExtenderArgs) -> (Response, Verdict),
) -> Response {
    let limits = &state.limits;
    let refused = |refusal: BodyRefusal| {
        tracing::info!(
            verb = verb.label(),
            reason = refusal.label(),
            "Extender request body refused."
        );
        state.metrics.body_refused(refusal);
        body::refusal_response(refusal, limits.max_body)
    };
    tracing::debug!(
        verb = verb.label(),
        length = ?request.headers().get(axum::http::header::CONTENT_LENGTH),
        "Reading a request body."
    );
    let read = match body::read(request, limits.max_body, limits.body_timeout, &state.budget).await
    {
        Ok(read) => read,
        Err(refusal) => return refused(refusal),
    };
    let response = handle(state, verb, &read.bytes, decide);
    drop(read.bytes);
    match body::charge_reply(response, read.share, &state.budget).await {
        Ok(response) => response,
        Err(refusal) => refused(refusal),
    }
}

async fn filter(State(state): State<Arc<Extender>>, request: axum::extract::Request) -> Response {
    within_limits(&state, Verb::Filter, request, |state, view, args| {
        let (snapshot, usage) = (view.snapshot.as_deref(), view.usage.as_deref());
        let d = wire::filter(&state.algorithm, snapshot, usage, args, &state.namespaces);
        if d.verdict == Verdict::Decided {
            tracing::debug!(
                target: DECISIONS_TARGET,
                pod = args.pod.name(),
                app = args.pod.app(),
                kept = ?d.reply.node_names,
                failed = ?d.reply.failed_nodes,
                "Filter decided."
            );
        }
        (json_response(&d.reply), d.verdict)
    })
    .await
}

async fn prioritize(
    State(state): State<Arc<Extender>>,
    request: axum::extract::Request,
) -> Response {
    within_limits(&state, Verb::Prioritize, request, |state, view, args| {
        let (snapshot, usage) = (view.snapshot.as_deref(), view.usage.as_deref());
        let d = wire::prioritize(&state.algorithm, snapshot, usage, args, &state.namespaces);
        if d.verdict == Verdict::Decided {
            tracing::debug!(
                target: DECISIONS_TARGET,
                pod = args.pod.name(),
                app = args.pod.app(),
                scores = ?d.reply.iter().map(|p| (&p.host, p.score)).collect::<Vec<_>>(),
                "Prioritize decided."
            );
        }
        (json_response(&d.reply), d.verdict)
    })
    .await
}

async fn metrics(State(state): State<Arc<Extender>>) -> Response {
    state.metrics.body_bytes.set(state.budget.held() as i64);
    let text = state.metrics.render(&state.store);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// `GET /status`: is the data loaded, how old, from which sources, with which errors.
#[derive(Debug, Serialize)]
struct Status<'a> {
    loaded: bool,
    generation: u64,
    /// When the snapshot last changed (RFC 3339), `null` before the first load.
    updated: Option<String>,
    age_seconds: Option<f64>,
    algorithm: &'a str,
    namespaces: &'a [String],
    nodes: usize,
    apps: usize,
    /// The last error of each source whose latest attempt failed.
    errors: BTreeMap<&'a str, SourceErrorView>,
    /// Score only: the running instances its reschedule hook would move, on the snapshot in
    /// force (wca deleted those pods every `reschedule_interval`; here they are shown, not moved).
    #[serde(skip_serializing_if = "Option::is_none")]
    reschedule: Option<Vec<verwalter_placement::reschedule::Move>>,
}

#[derive(Debug, Serialize)]
struct SourceErrorView {
    message: String,
    at: String,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn status(State(state): State<Arc<Extender>>) -> Response {
    let view = state.store.view();
    let snapshot = view.snapshot.as_deref();
    let status = Status {
        loaded: snapshot.is_some(),
        generation: view.generation,
        updated: view
            .updated
            .map(|t| verwalter_controllers::machinery::clock::rfc3339(unix_ms(t))),
        age_seconds: view
            .updated
            .map(|t| t.elapsed().map_or(0.0, |d| d.as_secs_f64())),
        algorithm: &state.algorithm_name,
        namespaces: &state.namespaces,
        nodes: snapshot.map_or(0, |s| s.node_capacities.len()),
        apps: snapshot.map_or(0, |s| s.apps_spec.len()),
        errors: view
            .errors
            .iter()
            .map(|(source, e)| {
                (
                    source.as_str(),
                    SourceErrorView {
                        message: e.message.clone(),
                        at: verwalter_controllers::machinery::clock::rfc3339(unix_ms(e.at)),
                    },
                )
            })
            .collect(),
        reschedule: state.algorithm.kind.spec().reschedules.then(|| {
            snapshot.map_or_else(Vec::new, |snap| {
                verwalter_placement::reschedule(&state.algorithm, snap)
            })
        }),
    };
    json_response(&status)
}

/// Registers `collector` in `registry` and gives it back.
fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> C {
    registry
        .register(Box::new(collector.clone()))
        .expect("metric names are unique");
    collector
}

/// The extender's metric families, in a registry of their own (served on the extender's
/// `/metrics`).
pub(crate) struct ExtenderMetrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    loaded: prometheus::IntGauge,
    generation: prometheus::IntGauge,
    age: prometheus::Gauge,
    source_failing: prometheus::IntGaugeVec,
    node_capacity: GaugeVec,
    node_used: GaugeVec,
    node_free: GaugeVec,
    app_requested: GaugeVec,
    connections: prometheus::IntGauge,
    connections_closed: IntCounterVec,
    bodies_refused: IntCounterVec,
    body_bytes: prometheus::IntGauge,
    /// The snapshot generation the per-node and per-app gauges show (refilled on change).
    shown: Mutex<Option<u64>>,
}

impl ExtenderMetrics {
    /// The registry `/metrics` serves.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(crate) fn new() -> ExtenderMetrics {
        let registry = Registry::new();
        let results: Vec<&str> = Verdict::ALL
            .iter()
            .map(|v| v.label())
            .chain(["bad_request"])
            .collect();
        let (requests, duration) = Self::request_families(&registry, &results);
        let (loaded, generation, age, source_failing) = Self::snapshot_families(&registry);
        let [node_capacity, node_used, node_free, app_requested] =
            Self::resource_families(&registry);
        let (connections, connections_closed, bodies_refused, body_bytes) =
            Self::connection_families(&registry);
        let metrics = ExtenderMetrics {
            requests,
            duration,
            loaded,
            generation,
            age,
            source_failing,
            node_capacity,
            node_used,
            node_free,
            app_requested,
            connections,
            connections_closed,
            bodies_refused,
            body_bytes,
            shown: Mutex::new(None),
            registry,
        };
        metrics.show_labels(&results);
        metrics
    }

    /// The requests by verb and `results`, and how long they took.
    fn request_families(registry: &Registry, results: &[&str]) -> (IntCounterVec, HistogramVec) {
        let requests = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "verwalter_extender_requests_total",
                    format!(
                        "Extender requests by verb (filter, prioritize) and result ({}).",
                        results.join(", ")
                    ),
                ),
                &["verb", "result"],
            )
            .expect("valid metric"),
        );
        let duration = register(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "verwalter_extender_request_duration_seconds",
                    "Time from a parsed-or-not request body to its reply, by verb.",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["verb"],
            )
            .expect("valid metric"),
        );
        (requests, duration)
    }

    /// The snapshot: loaded, its generation and age, and the sources failing.
    fn snapshot_families(
        registry: &Registry,
    ) -> (
        prometheus::IntGauge,
        prometheus::IntGauge,
        prometheus::Gauge,
        prometheus::IntGaugeVec,
    ) {
        let loaded = register(
            registry,
            prometheus::IntGauge::new(
                "verwalter_placement_snapshot_loaded",
                "1 once a placement snapshot is loaded, 0 before.",
            )
            .expect("valid metric"),
        );
        let generation = register(
            registry,
            prometheus::IntGauge::new(
                "verwalter_placement_snapshot_generation",
                "Changes of the placement snapshot since the start.",
            )
            .expect("valid metric"),
        );
        let age = register(
            registry,
            prometheus::Gauge::new(
                "verwalter_placement_snapshot_age_seconds",
                "Seconds since the placement snapshot last changed (-1: none loaded).",
            )
            .expect("valid metric"),
        );
        let source_failing = register(
            registry,
            prometheus::IntGaugeVec::new(
                Opts::new(
                    "verwalter_placement_source_failing",
                    "1 while a data source's latest attempt failed (the last good snapshot stays).",
                ),
                &["source"],
            )
            .expect("valid metric"),
        );
        (loaded, generation, age, source_failing)
    }

    /// The snapshot's per-resource gauges: node capacity, used and free, app requested.
    fn resource_families(registry: &Registry) -> [GaugeVec; 4] {
        let resource_gauge = |name: &str, help: &str, key: &str| {
            register(
                registry,
                GaugeVec::new(Opts::new(name, help), &[key, "resource"]).expect("valid metric"),
            )
        };
        [
            resource_gauge(
                "verwalter_placement_node_capacity",
                "Capacity of each node per resource, from the snapshot.",
                "node",
            ),
            resource_gauge(
                "verwalter_placement_node_used",
                "What the apps on each node request together, per resource.",
                "node",
            ),
            resource_gauge(
                "verwalter_placement_node_free",
                "Capacity minus used per node and resource (read and write bandwidth share one bus).",
                "node",
            ),
            resource_gauge(
                "verwalter_placement_app_requested",
                "One instance's request of each app per resource.",
                "app",
            ),
        ]
    }

    /// The server's limits: connections open and closed, bodies refused and held.
    fn connection_families(
        registry: &Registry,
    ) -> (
        prometheus::IntGauge,
        IntCounterVec,
        IntCounterVec,
        prometheus::IntGauge,
    ) {
        let connections = register(
            registry,
            prometheus::IntGauge::new(
                "verwalter_extender_connections",
                "Connections to the extender open now.",
            )
            .expect("valid metric"),
        );
        let connections_closed = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "verwalter_extender_connections_closed_total",
                    "Connections the extender closed to stay within its limits, by reason (evicted: idle or holding its request up, to make room; refused: over the cap with none to close; stalled_write: a client that took no reply data).",
                ),
                &["reason"],
            )
            .expect("valid metric"),
        );
        let bodies_refused = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "verwalter_extender_bodies_refused_total",
                    "Request bodies refused before a decision, by reason (too_large: 413; timeout: not all in within the body timeout, 408; budget: no share of the body budget, 503; broken: the connection failed).",
                ),
                &["reason"],
            )
            .expect("valid metric"),
        );
        let body_bytes = register(
            registry,
            prometheus::IntGauge::new(
                "verwalter_extender_body_bytes",
                "Bytes of request bodies and replies held now, of the body budget.",
            )
            .expect("valid metric"),
        );
        (connections, connections_closed, bodies_refused, body_bytes)
    }

    /// Every labelled series that is known up front, shown at 0 from the start.
    fn show_labels(&self, results: &[&str]) {
        for reason in [
            HttpClose::Evicted,
            HttpClose::Refused,
            HttpClose::StalledWrite,
        ] {
            self.connections_closed.with_label_values(&[reason.label()]);
        }
        for refusal in [
            BodyRefusal::TooLarge,
            BodyRefusal::Timeout,
            BodyRefusal::NoBudget,
            BodyRefusal::Broken,
        ] {
            self.bodies_refused.with_label_values(&[refusal.label()]);
        }
        for verb in [Verb::Filter, Verb::Prioritize] {
            for result in results {
                self.requests.with_label_values(&[verb.label(), result]);
            }
            self.duration.with_label_values(&[verb.label()]);
        }
    }

    /// What the server counts its connections in.
    pub(crate) fn connection_metrics(&self) -> ConnectionMetrics {
        ConnectionMetrics::new(self.connections.clone(), self.connections_closed.clone())
    }

    fn body_refused(&self, refusal: BodyRefusal) {
        self.bodies_refused
            .with_label_values(&[refusal.label()])
            .inc();
    }

    fn request(&self, verb: Verb, result: &str, took: Duration) {
        self.requests
            .with_label_values(&[verb.label(), result])
            .inc();
        self.duration
            .with_label_values(&[verb.label()])
            .observe(took.as_secs_f64());
    }

    /// Prometheus text, with the snapshot gauges brought up to date with `store` first.
    pub(crate) fn render(&self, store: &SnapshotStore) -> String {
        let view = store.view();
        self.loaded.set(i64::from(view.snapshot.is_some()));
        self.generation.set(view.generation as i64);
        self.age.set(
            view.updated
                .map_or(-1.0, |t| t.elapsed().map_or(0.0, |d| d.as_secs_f64())),
        );
        self.source_failing.reset();
        for source in view.errors.keys() {
            self.source_failing.with_label_values(&[source]).set(1);
        }
        {
            let mut shown = self.shown.lock().unwrap();
            if *shown != Some(view.generation) {
                self.show(view.snapshot.as_deref());
                *shown = Some(view.generation);
            }
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding of metrics");
        String::from_utf8(out).expect("metrics text is UTF-8")
    }

    /// Refills the per-node and per-app gauges from `snapshot`.
    fn show(&self, snapshot: Option<&verwalter_placement::Snapshot>) {
        for family in [
            &self.node_capacity,
            &self.node_used,
            &self.node_free,
            &self.app_requested,
        ] {
            family.reset();
        }
        let Some(s) = snapshot else { return };
        for (node, cap) in &s.node_capacities {
            let used = s.used(node);
            let dims: Vec<_> = cap.keys().copied().collect();
            for (dim, value) in cap {
                self.node_capacity
                    .with_label_values(&[node, dim.name()])
                    .set(*value);
            }
            for (dim, value) in &used {
                self.node_used
                    .with_label_values(&[node, dim.name()])
                    .set(*value);
            }
            for (dim, free) in snapshot::free(cap, &used, &dims) {
                if let Some(free) = free {
                    self.node_free
                        .with_label_values(&[node, dim.name()])
                        .set(free);
                }
            }
        }
        for (app, spec) in &s.apps_spec {
            for (dim, value) in spec {
                self.app_requested
                    .with_label_values(&[app, dim.name()])
                    .set(*value);
            }
        }
    }
}

impl Default for ExtenderMetrics {
    fn default() -> Self {
        ExtenderMetrics::new()
    }
}

/// A TLS acceptor for a PEM certificate chain and key, with the ring provider (TLS 1.2, 1.3).
pub(crate) fn tls_acceptor(
    cert: &Path,
    key: &Path,
) -> Result<tokio_rustls::TlsAcceptor, ExtenderError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ExtenderError::Tls(format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(ExtenderError::Tls(format!(
            "{}: no certificate in it",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| ExtenderError::Tls(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ExtenderError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ExtenderError::Tls(format!("{}: {e}", cert.display())))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serves the extender's routes on `listener` (over TLS with `tls`) until `shutdown`, with the
/// daemon's connection policy (`crate::http::serve_on`) within `state`'s limits.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<Extender>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) {
    let limits = ServeLimits {
        max_connections: state.limits.max_connections,
        idle_timeout: state.limits.idle_timeout,
        stall_timeout: STALL_TIMEOUT,
    };
    let metrics = state.metrics.connection_metrics();
    crate::http::serve_on(listener, router(state), &limits, metrics, tls, shutdown).await
}

/// Binds, starts the data sources and returns the extender's tasks (server and sources) to run
/// until `shutdown`. Every start problem is returned before anything runs.
pub(crate) async fn start(
    setup: &ExtenderSetup,
    store: SnapshotStore,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, Vec<futures::future::BoxFuture<'static, ()>>), ExtenderError> {
    let tls = match &setup.tls {
        Some((cert, key)) => Some(tls_acceptor(cert, key)?),
        None => None,
    };
    let metrics = ExtenderMetrics::new();
    let plan = SourcePlan {
        snapshot_file: setup.snapshot.clone(),
        data_provider: setup.data_provider.clone(),
        dimensions: setup.algorithm.dimensions.clone(),
        refresh: RefreshSettings {
            metrics: SourceMetrics::register(metrics.registry()).ok(),
            ..RefreshSettings::default()
        },
    };
    let listener = TcpListener::bind(setup.listen)
        .await
        .map_err(|source| ExtenderError::Bind {
            addr: setup.listen,
            source,
        })?;
    let addr = listener.local_addr().unwrap_or(setup.listen);
    let mut tasks = start_sources(&plan, &store, shutdown.clone()).await?;
    let state = Arc::new(
        Extender::with_metrics(
            setup.algorithm_name.clone(),
            setup.algorithm.clone(),
            setup.namespaces.clone(),
            store,
            metrics,
        )
        .with_limits(setup.limits.clone()),
    );
    // Tests and scripts started with port 0 read the port from this line.
    tracing::info!(
        %addr,
        https = tls.is_some(),
        algorithm = %setup.algorithm_name,
        config = %setup.config.display(),
        namespaces = ?setup.namespaces,
        max_connections = setup.limits.max_connections,
        max_body_bytes = setup.limits.max_body,
        body_budget_bytes = setup.limits.body_budget,
        "Extender listening."
    );
    tasks.push(Box::pin(serve(listener, state, tls, shutdown)));
    Ok((addr, tasks))
}

/// `verwalter extender`: runs until `shutdown`.
pub async fn run(
    mut setup: ExtenderSetup,
    shutdown: CancellationToken,
) -> Result<(), ExtenderError> {
    let nofile = crate::http::raise_nofile_limit();
    setup.limits.max_connections =
        crate::http::connection_cap(setup.limits.max_connections, nofile);
    let (_, tasks) = start(&setup, SnapshotStore::new(), shutdown).await?;
    futures::future::join_all(tasks).await;
    Ok(())
}

mod body;
#[cfg(test)]
mod tests;
