//! The background refresh of a data provider (`!ClusterDataProvider`,
//! `!ClusterScoreDataProvider`) into a [`SnapshotStore`], never on the request path.
//!
//! Two tasks per provider:
//! - `kubernetes`: lists nodes and the pods of each monitored namespace every
//!   [`RefreshSettings::interval`], and between lists keeps a pod watch open per namespace
//!   (resuming from the last resource version; a 410 Gone lists again at once), so that a pod
//!   kube-scheduler binds is counted on its node as soon as the API server says so;
//! - `prometheus`: runs the provider's instant queries every interval, each within the
//!   provider's `timeout`, at its `time` when given.
//!
//! Each keeps its last good part; whenever one changes, both parts are combined
//! ([`verwalter_placement::sources::combine`]) and published under the source's name. Nothing
//! is published before every configured source has loaded once. Every failure (connection
//! refused, timeout, a non-200 status, a bad body) is recorded in the store
//! ([`SnapshotStore::report_error`]), logged, and counted; the snapshot in force stays.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::machinery::backoff::Backoff;
use verwalter_placement::Dim;
use verwalter_placement::config::{DataProvider, Kubeapi, SERVICE_CA_PATH, SERVICE_TOKEN_PATH};
use verwalter_placement::sources::{
    KubeData, PlannedQuery, PodIndex, PromData, SourceError, WatchEvent, combine, plan_queries,
};

use super::kube::{KubeApi, WatchEnd};
use super::metrics::SourceMetrics;
use super::prometheus::{base_url, instant_query};
use super::request;
use super::store::SnapshotStore;
use crate::machinery::http_client::HttpClient;

/// The source name of the Kubernetes API part in the store and in metrics.
pub(crate) const KUBERNETES: &str = "kubernetes";
/// The source name of the Prometheus part.
pub(crate) const PROMETHEUS: &str = "prometheus";

/// How often the sources refresh by default: wca asked on every request; a list every 15 s
/// plus the pod watch keeps counts current, and Prometheus data changes at its scrape interval.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

/// How the sources refresh.
#[derive(Debug, Clone)]
pub struct RefreshSettings {
    /// Time between two lists of the Kubernetes API and between two rounds of queries
    /// (default [`DEFAULT_INTERVAL`]).
    pub interval: Duration,
    /// Keep a pod watch open between lists (default on).
    pub watch: bool,
    /// Wait after a failed watch before opening it again (default 1 s), doubled after each
    /// further failure in a row up to `interval`.
    pub watch_retry: Duration,
    /// Where refreshes are counted; `None` counts nothing.
    pub metrics: Option<SourceMetrics>,
}

impl Default for RefreshSettings {
    fn default() -> Self {
        RefreshSettings {
            interval: DEFAULT_INTERVAL,
            watch: true,
            watch_retry: Duration::from_secs(1),
            metrics: None,
        }
    }
}

/// The latest good part of each source.
#[derive(Default)]
struct Parts {
    kube: Option<KubeData>,
    prom: Option<PromData>,
}

struct Shared {
    parts: Mutex<Parts>,
    store: SnapshotStore,
    dims: Vec<Dim>,
    with_prometheus: bool,
    settings: RefreshSettings,
}

impl Shared {
    /// Changes the parts; when `change` says something changed and every source has loaded,
    /// publishes the combination under `source`, otherwise clears `source`'s error.
    fn update(&self, source: &str, change: impl FnOnce(&mut Parts) -> bool) {
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        let changed = change(&mut parts);
        let ready = parts.kube.is_some() && (parts.prom.is_some() || !self.with_prometheus);
        match (&parts.kube, changed && ready) {
            (Some(kube), true) => {
                let snapshot = combine(kube, parts.prom.as_ref(), &self.dims);
                self.store.publish(source, snapshot);
            }
            _ => self.store.clear_error(source),
        }
    }

    fn failed(&self, source: &str, error: &SourceError, took: Duration) {
        // Say what is true: before the first load there is no good data to keep.
        if self.store.snapshot().is_some() {
            tracing::warn!(source, error = %error, "placement data source failed; keeping the last good data");
        } else {
            tracing::warn!(source, error = %error,
                "placement data source failed; no placement data loaded yet (filter answers that it is not loaded)");
        }
        self.store.report_error(source, error.to_string());
        if let Some(m) = &self.settings.metrics {
            m.refresh(source, error.kind(), took);
        }
    }

    fn succeeded(&self, source: &str, took: Duration) {
        if let Some(m) = &self.settings.metrics {
            m.refresh(source, "ok", took);
        }
    }
}

/// Starts refreshing `provider`'s sources into `store` for an algorithm over `dimensions`;
/// the task ends when `shutdown` is cancelled. A provider without `kubeapi` reads the API
/// server in-cluster (`KUBERNETES_SERVICE_HOST`, the service account's token and CA); one
/// without `prometheus` gives DRAM nodes and apps without requests.
pub fn spawn_sources(
    provider: &DataProvider,
    dimensions: &[Dim],
    store: SnapshotStore,
    settings: RefreshSettings,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let shared = Arc::new(Shared {
        parts: Mutex::new(Parts::default()),
        store,
        dims: dimensions.to_vec(),
        with_prometheus: provider.prometheus.is_some(),
        settings,
    });
    let kubeapi = provider.kubeapi.clone().unwrap_or_else(|| Kubeapi {
        host: None,
        port: None,
        client_token_path: SERVICE_TOKEN_PATH.into(),
        server_cert_ca_path: SERVICE_CA_PATH.into(),
        timeout: 5.0,
        monitored_namespaces: vec!["default".into()],
    });
    let kube = tokio::spawn(run_kube(kubeapi, shared.clone(), shutdown.clone()));
    let prom = provider.prometheus.clone().map(|p| {
        let plan = plan_queries(provider.kind, &provider.queries, dimensions);
        tokio::spawn(run_prometheus(p, plan, shared.clone(), shutdown.clone()))
    });
    tokio::spawn(async move {
        let _ = kube.await;
        if let Some(prom) = prom {
            let _ = prom.await;
        }
    })
}

/// Waits until `deadline`; `false` when shut down first.
async fn wait_until(deadline: Instant, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep_until(deadline) => true,
        _ = shutdown.cancelled() => false,
    }
}

async fn run_kube(cfg: Kubeapi, shared: Arc<Shared>, shutdown: CancellationToken) {
    let interval = shared.settings.interval;
    let mut api: Option<KubeApi> = None;
    while !shutdown.is_cancelled() {
        let started = Instant::now();
        let deadline = started + interval;
        if api.is_none() {
            match KubeApi::new(&cfg) {
                Ok(a) => api = Some(a),
                Err(e) => {
                    shared.failed(KUBERNETES, &e, started.elapsed());
                    if !wait_until(deadline, &shutdown).await {
                        return;
                    }
                    continue;
                }
            }
        }
        let Some(api) = api.as_ref() else { continue };
        let listed = tokio::select! {
            r = list_all(api, &cfg.monitored_namespaces) => r,
            _ = shutdown.cancelled() => return,
        };
        let versions = match listed {
            Ok((data, versions)) => {
                shared.succeeded(KUBERNETES, started.elapsed());
                tracing::debug!(
                    nodes = data.nodes.capacity.len(),
                    pods = data.pods.len(),
                    "placement: Kubernetes API listed"
                );
                shared.update(KUBERNETES, |parts| {
                    parts.kube = Some(data);
                    true
                });
                versions
            }
            Err(e) => {
                shared.failed(KUBERNETES, &e, started.elapsed());
                if !wait_until(deadline, &shutdown).await {
                    return;
                }
                continue;
            }
        };
        if !shared.settings.watch || cfg.monitored_namespaces.is_empty() {
            if !wait_until(deadline, &shutdown).await {
                return;
            }
            continue;
        }
        let watches = futures::future::select_all(
            cfg.monitored_namespaces
                .iter()
                .zip(versions)
                .map(|(ns, rv)| Box::pin(watch_namespace(api, ns, rv, deadline, &shared))),
        );
        tokio::select! {
            _ = watches => {} // a 410 Gone: list again now
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Nodes, then the pods of each namespace with the version to watch each from.
async fn list_all(
    api: &KubeApi,
    namespaces: &[String],
) -> Result<(KubeData, Vec<Option<String>>), SourceError> {
    let nodes = api.list_nodes().await?;
    let mut pods = PodIndex::default();
    let mut versions = Vec::new();
    for ns in namespaces {
        let (list, rv) = api.list_pods(ns).await?;
        pods.replace_namespace(ns, list);
        versions.push(rv);
    }
    Ok((KubeData { nodes, pods }, versions))
}

/// Watches one namespace until `deadline`, reopening the watch after it closes or fails;
/// returns only on a 410 Gone (the caller lists again).
async fn watch_namespace(
    api: &KubeApi,
    namespace: &str,
    mut version: Option<String>,
    deadline: Instant,
    shared: &Shared,
) {
    // Doubles after each failure in a row (a proxy that cannot watch is not asked every second).
    let backoff = Backoff::doubling(shared.settings.watch_retry, shared.settings.interval);
    let mut failures = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let apply = |events: Vec<WatchEvent>| {
            if let Some(m) = &shared.settings.metrics {
                for e in &events {
                    m.watch_event(match e {
                        WatchEvent::Upsert { .. } => "upsert",
                        WatchEvent::Deleted { .. } => "deleted",
                        WatchEvent::Bookmark { .. } => "bookmark",
                        WatchEvent::Error { .. } => "error",
                    });
                }
            }
            shared.update(KUBERNETES, |parts| {
                let Some(kube) = parts.kube.as_mut() else {
                    return false;
                };
                let mut changed = false;
                for e in &events {
                    changed |= kube.pods.apply(e);
                }
                changed
            });
        };
        let started = Instant::now();
        match api
            .watch_pods(namespace, version.as_deref(), left, apply)
            .await
        {
            Ok(WatchEnd::Closed(rv)) => {
                failures = 0;
                if rv.is_some() {
                    version = rv;
                }
            }
            Err(SourceError::Gone { what, message }) => {
                tracing::info!(%what, %message, "placement: watch expired, listing again");
                return;
            }
            Err(e) => {
                shared.failed(KUBERNETES, &e, started.elapsed());
                failures += 1;
                tokio::time::sleep(backoff.nominal(failures)).await;
            }
        }
    }
}

/// The client for Prometheus: plain, or trusting the CA file of wca's `!SSL {server_verify: FILE}`.
/// The system's CA store, `server_verify: false` and client certificates are refused with a
/// clear error rather than half-honoured.
fn prometheus_client(
    cfg: &verwalter_placement::config::Prometheus,
) -> Result<HttpClient, SourceError> {
    use verwalter_placement::config::ServerVerify;
    let Some(ssl) = &cfg.ssl else {
        return Ok(request::plain_client());
    };
    if ssl.client_cert_path.is_some() || ssl.client_key_path.is_some() {
        return Err(SourceError::Setup(
            "prometheus: !SSL client certificates are not supported".into(),
        ));
    }
    match &ssl.server_verify {
        ServerVerify::CaFile(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                SourceError::Setup(format!("prometheus: !SSL server_verify {path}: {e}"))
            })?;
            request::client_with_ca(&pem)
        }
        ServerVerify::System => Err(SourceError::Setup(
            "prometheus: !SSL needs server_verify: /path/to/ca.pem (the system CA store is not read)"
                .into(),
        )),
        ServerVerify::Off => Err(SourceError::Setup(
            "prometheus: !SSL server_verify: false is refused (unverified HTTPS)".into(),
        )),
    }
}

async fn run_prometheus(
    cfg: verwalter_placement::config::Prometheus,
    plan: Result<Vec<PlannedQuery>, SourceError>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let (client, plan) = match prometheus_client(&cfg) {
        Ok(client) => (client, plan),
        Err(e) => (request::plain_client(), Err(e)),
    };
    let base = base_url(&cfg);
    let timeout = Duration::from_secs_f64(cfg.timeout.max(0.001));
    while !shutdown.is_cancelled() {
        let started = Instant::now();
        let deadline = started + shared.settings.interval;
        let result = match &plan {
            Ok(plan) => {
                let work = query_all(&client, &base, cfg.time.as_deref(), timeout, plan);
                tokio::select! {
                    r = work => r,
                    _ = shutdown.cancelled() => return,
                }
            }
            Err(e) => Err(e.clone()),
        };
        match result {
            Ok(data) => {
                shared.succeeded(PROMETHEUS, started.elapsed());
                shared.update(PROMETHEUS, |parts| {
                    parts.prom = Some(data);
                    true
                });
            }
            Err(e) => shared.failed(PROMETHEUS, &e, started.elapsed()),
        }
        if !wait_until(deadline, &shutdown).await {
            return;
        }
    }
}

/// Runs the planned queries side by side; the first failure fails the round.
async fn query_all(
    client: &HttpClient,
    base: &str,
    time: Option<&str>,
    timeout: Duration,
    plan: &[PlannedQuery],
) -> Result<PromData, SourceError> {
    let answers = futures::future::join_all(
        plan.iter()
            .map(|q| instant_query(client, base, &q.promql, time, timeout)),
    )
    .await;
    let mut results = Vec::with_capacity(plan.len());
    for (q, answer) in plan.iter().zip(answers) {
        results.push((q.clone(), answer?));
    }
    PromData::read(&results)
}

#[cfg(test)]
mod tests {
    use verwalter_placement::config::{Prometheus, ServerVerify, Ssl};

    use super::*;

    fn with_ssl(server_verify: ServerVerify) -> Prometheus {
        Prometheus {
            host: "https://prometheus".into(),
            port: 9090,
            timeout: 1.0,
            time: None,
            ssl: Some(Ssl {
                server_verify,
                client_cert_path: None,
                client_key_path: None,
            }),
        }
    }

    fn error(cfg: &Prometheus) -> String {
        match prometheus_client(cfg) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn prometheus_ssl_settings_that_cannot_be_honoured_are_refused() {
        let e = error(&with_ssl(ServerVerify::CaFile(
            "/nonexistent/ca.pem".into(),
        )));
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        assert!(error(&with_ssl(ServerVerify::System)).contains("server_verify"));
        assert!(error(&with_ssl(ServerVerify::Off)).contains("refused"));
        let mut cfg = with_ssl(ServerVerify::Off);
        cfg.ssl.as_mut().unwrap().client_cert_path = Some("/c.pem".into());
        assert!(error(&cfg).contains("client certificates"));
        cfg.ssl = None;
        assert!(prometheus_client(&cfg).is_ok(), "no !SSL: plain client");
    }
}
