//! The placement data sources (`verwalter::placement::refresh::spawn_sources`) against test
//! doubles of the Kubernetes API (over HTTPS with a test CA and a bearer token, and over plain
//! HTTP as `kubectl proxy` serves it) and of Prometheus, and once against a real `prometheus`
//! scraping an exporter the test serves. Every wait is on what the store reports.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util;
use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use verwalter::placement::refresh::{RefreshSettings, spawn_sources};
use verwalter::placement::store::{SnapshotStore, View};
use verwalter_placement::Dim;
use verwalter_placement::config::{DataProvider, Kubeapi, Prometheus, ProviderKind, Queries};

const TOKEN: &str = "test-service-account-token";
/// How long any wait may take before the test fails (the waits end as soon as the store says so).
const PATIENCE: Duration = Duration::from_secs(30);

/// How a test double answers, switchable while a test runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Normal,
    /// HTTP 500 with a plain-text body.
    Fail,
    /// HTTP 200 with a body that is not JSON.
    Garbage,
    /// Never answers (the client's timeout must end the request).
    Hang,
}

async fn answer(mode: Mode, body: String) -> Response {
    match mode {
        Mode::Normal => ([("content-type", "application/json")], body).into_response(),
        Mode::Fail => (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response(),
        Mode::Garbage => "<html>not json</html>".into_response(),
        Mode::Hang => std::future::pending().await,
    }
}

/// A test double of the Kubernetes API server: speaks v1 `NodeList` at `/api/v1/nodes`,
/// `PodList` at `/api/v1/namespaces/{ns}/pods`, and a pod watch (`?watch=1`) as a chunked
/// stream of JSON lines the test pushes; refuses requests without `Authorization: Bearer
/// TOKEN` (401). Counts the lists it served.
#[derive(Clone)]
pub(crate) struct KubeDouble {
    inner: Arc<KubeInner>,
}

struct KubeInner {
    nodes: Mutex<Vec<String>>,
    pods: Mutex<HashMap<String, Vec<String>>>,
    mode: Mutex<Mode>,
    node_lists: Mutex<u32>,
    /// Where the open watch of each namespace takes its lines from.
    watches: Mutex<HashMap<String, mpsc::UnboundedSender<String>>>,
    /// Counts the watches opened, for [`KubeDouble::wait_watch`].
    watches_opened: tokio::sync::watch::Sender<u32>,
    require_token: bool,
    /// While `false`, node lists wait (the e2e test holds the first answer back).
    lists_open: tokio::sync::watch::Sender<bool>,
    /// Counts the node list requests received (answered or held).
    node_list_requests: tokio::sync::watch::Sender<u32>,
    /// Every (verb, resource) asked for, as RBAC names them: `list nodes`, `watch pods`, ...
    requests: Mutex<std::collections::BTreeSet<(String, String)>>,
}

fn node(name: &str, cpu: &str, memory: &str) -> String {
    format!(
        r#"{{"metadata": {{"name": "{name}", "labels": {{"kubernetes.io/hostname": "{name}"}}}},
            "status": {{"capacity": {{"cpu": "{cpu}", "memory": "{memory}"}}}}}}"#
    )
}

fn master(name: &str) -> String {
    format!(
        r#"{{"metadata": {{"name": "{name}", "labels": {{"node-role.kubernetes.io/master": ""}}}},
            "status": {{"capacity": {{"cpu": "2", "memory": "4Gi"}}}}}}"#
    )
}

fn pod(uid: &str, app: &str, node: Option<&str>) -> String {
    let node = node.map_or(String::new(), |n| format!(r#""nodeName": "{n}""#));
    format!(
        r#"{{"metadata": {{"name": "{app}-{uid}", "namespace": "default", "uid": "{uid}",
              "labels": {{"app": "{app}"}}, "resourceVersion": "{uid}"}},
            "spec": {{{node}}}, "status": {{"phase": "Pending"}}}}"#
    )
}

impl KubeDouble {
    pub(crate) fn new(require_token: bool) -> KubeDouble {
        KubeDouble {
            inner: Arc::new(KubeInner {
                nodes: Mutex::new(vec![
                    node("n1", "4", "16318504Ki"),
                    node("n2", "8", "64Gi"),
                    master("m1"),
                ]),
                pods: Mutex::new(HashMap::from([(
                    "default".to_owned(),
                    vec![pod("u1", "redis", Some("n1")), pod("u2", "redis", None)],
                )])),
                mode: Mutex::new(Mode::Normal),
                node_lists: Mutex::new(0),
                watches: Mutex::new(HashMap::new()),
                watches_opened: tokio::sync::watch::Sender::new(0),
                require_token,
                lists_open: tokio::sync::watch::Sender::new(true),
                node_list_requests: tokio::sync::watch::Sender::new(0),
                requests: Mutex::new(std::collections::BTreeSet::new()),
            }),
        }
    }

    fn set_mode(&self, mode: Mode) {
        *self.inner.mode.lock().unwrap() = mode;
    }

    /// Holds node lists back (`false`) until opened again (`true`).
    pub(crate) fn open_lists(&self, open: bool) {
        self.inner.lists_open.send_replace(open);
    }

    /// Waits until `n` node list requests have come in all (answered or held).
    pub(crate) async fn wait_node_list_request(&self, n: u32) {
        let mut rx = self.inner.node_list_requests.subscribe();
        tokio::time::timeout(PATIENCE, rx.wait_for(|&got| got >= n))
            .await
            .expect("the source lists the nodes")
            .unwrap();
    }

    /// The (verb, resource) pairs asked for so far.
    pub(crate) fn requests(&self) -> std::collections::BTreeSet<(String, String)> {
        self.inner.requests.lock().unwrap().clone()
    }

    fn record(&self, verb: &str, resource: &str) {
        self.inner
            .requests
            .lock()
            .unwrap()
            .insert((verb.to_owned(), resource.to_owned()));
    }

    fn node_lists(&self) -> u32 {
        *self.inner.node_lists.lock().unwrap()
    }

    /// Waits until `n` watches have been opened in all.
    pub(crate) async fn wait_watch(&self, n: u32) {
        let mut rx = self.inner.watches_opened.subscribe();
        tokio::time::timeout(PATIENCE, rx.wait_for(|&opened| opened >= n))
            .await
            .expect("the source opens a watch")
            .unwrap();
    }

    /// Sends one event to the open watch of `namespace`, as one line of JSON like the API
    /// server; `false` when no watch is open.
    fn push(&self, namespace: &str, event: String) -> bool {
        let line = serde_json::from_str::<serde_json::Value>(&event)
            .unwrap()
            .to_string();
        self.push_raw(namespace, line)
    }

    /// Sends `line` as it is (garbage included) to the open watch of `namespace`.
    fn push_raw(&self, namespace: &str, line: String) -> bool {
        let watches = self.inner.watches.lock().unwrap();
        watches
            .get(namespace)
            .is_some_and(|tx| tx.send(line + "\n").is_ok())
    }

    pub(crate) fn router(&self) -> Router {
        Router::new()
            .route("/api/v1/nodes", get(kube_nodes))
            .route("/api/v1/namespaces/{ns}/pods", get(kube_pods))
            .with_state(self.clone())
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        !self.inner.require_token
            || headers.get("authorization").and_then(|v| v.to_str().ok())
                == Some(&format!("Bearer {TOKEN}"))
    }
}

fn list(kind: &str, items: &[String]) -> String {
    format!(
        r#"{{"kind": "{kind}", "apiVersion": "v1", "metadata": {{"resourceVersion": "100"}},
            "items": [{}]}}"#,
        items.join(",")
    )
}

async fn kube_nodes(State(k): State<KubeDouble>, headers: HeaderMap) -> Response {
    if !k.authorized(&headers) {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    }
    k.record("list", "nodes");
    k.inner.node_list_requests.send_modify(|n| *n += 1);
    let mut open = k.inner.lists_open.subscribe();
    let _ = open.wait_for(|open| *open).await;
    *k.inner.node_lists.lock().unwrap() += 1;
    let mode = *k.inner.mode.lock().unwrap();
    let body = list("NodeList", &k.inner.nodes.lock().unwrap());
    answer(mode, body).await
}

async fn kube_pods(
    State(k): State<KubeDouble>,
    axum::extract::Path(ns): axum::extract::Path<String>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !k.authorized(&headers) {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    }
    let watch = params.get("watch").map(String::as_str) == Some("1");
    k.record(if watch { "watch" } else { "list" }, "pods");
    if watch {
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        k.inner.watches.lock().unwrap().insert(ns, tx);
        k.inner.watches_opened.send_modify(|n| *n += 1);
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|line| (Ok::<_, std::io::Error>(line), rx))
        });
        return (
            [("content-type", "application/json")],
            Body::from_stream(stream),
        )
            .into_response();
    }
    let mode = *k.inner.mode.lock().unwrap();
    let items = k
        .inner
        .pods
        .lock()
        .unwrap()
        .get(&ns)
        .cloned()
        .unwrap_or_default();
    answer(mode, list("PodList", &items)).await
}

/// A test double of Prometheus' HTTP API: `GET /api/v1/query?query=…` answers the vector the
/// test set for that exact query (an empty vector for others) in Prometheus' JSON format, and
/// records the `time` parameter it was given.
#[derive(Clone)]
struct PromDouble {
    inner: Arc<PromInner>,
}

struct PromInner {
    results: Mutex<HashMap<String, String>>,
    mode: Mutex<Mode>,
    times: Mutex<Vec<Option<String>>>,
}

impl PromDouble {
    fn new(results: &[(&str, &str)]) -> PromDouble {
        PromDouble {
            inner: Arc::new(PromInner {
                results: Mutex::new(
                    results
                        .iter()
                        .map(|(q, r)| (q.to_string(), r.to_string()))
                        .collect(),
                ),
                mode: Mutex::new(Mode::Normal),
                times: Mutex::new(Vec::new()),
            }),
        }
    }

    fn set_mode(&self, mode: Mode) {
        *self.inner.mode.lock().unwrap() = mode;
    }

    fn router(&self) -> Router {
        Router::new()
            .route("/api/v1/query", get(prom_query))
            .with_state(self.clone())
    }
}

async fn prom_query(
    State(p): State<PromDouble>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    p.inner
        .times
        .lock()
        .unwrap()
        .push(params.get("time").cloned());
    let query = params.get("query").cloned().unwrap_or_default();
    if query == "bad query(" {
        let body = r#"{"status":"error","errorType":"bad_data","error":"parse error: unclosed left parenthesis"}"#;
        return (StatusCode::BAD_REQUEST, body).into_response();
    }
    let result = p
        .inner
        .results
        .lock()
        .unwrap()
        .get(&query)
        .cloned()
        .unwrap_or_default();
    let body =
        format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{result}]}}}}"#);
    let mode = *p.inner.mode.lock().unwrap();
    answer(mode, body).await
}

/// Serves `router` over plain HTTP on 127.0.0.1; the address and the task.
pub(crate) async fn serve(router: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (addr, task)
}

/// A test CA and a server certificate for 127.0.0.1 signed by it: (CA PEM, server config).
fn test_tls() -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca.pem(), Arc::new(config))
}

/// Serves `router` over HTTPS (HTTP/1.1) on 127.0.0.1 with `tls`.
async fn serve_tls(router: Router, tls: Arc<rustls::ServerConfig>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let router = router.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(router);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn kubeapi(host: &str, port: u16, dir: &Path, ca_pem: Option<&str>) -> Kubeapi {
    std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
    if let Some(pem) = ca_pem {
        std::fs::write(dir.join("ca.crt"), pem).unwrap();
    }
    Kubeapi {
        host: Some(host.to_owned()),
        port: Some(port),
        client_token_path: dir.join("token").display().to_string(),
        server_cert_ca_path: dir.join("ca.crt").display().to_string(),
        timeout: 2.0,
        monitored_namespaces: vec!["default".into()],
    }
}

fn prometheus(port: u16, timeout: f64, time: Option<&str>) -> Prometheus {
    Prometheus {
        host: "http://127.0.0.1".into(),
        port,
        timeout,
        time: time.map(str::to_owned),
        ssl: None,
    }
}

/// The queries of the tests: wca's defaults, requests from `app_req{dim=…}`.
fn queries() -> Queries {
    let mut q = Queries::default();
    for (dim, name) in [
        (Dim::Cpu, "cpu"),
        (Dim::Mem, "mem"),
        (Dim::MembwRead, "mbw_read"),
        (Dim::MembwWrite, "mbw_write"),
    ] {
        q.app_requested_resources
            .insert(dim, format!(r#"app_req{{dim="{name}"}}"#));
    }
    q.nodes_pmm_memory_mode = "pmem_mode != 0".into();
    q.membw_capacity_read = r#"node_capacity{dim="mbw_read"}"#.into();
    q.membw_capacity_write = r#"node_capacity{dim="mbw_write"}"#.into();
    q
}

const DIMS: [Dim; 4] = [Dim::Cpu, Dim::Mem, Dim::MembwRead, Dim::MembwWrite];

/// What the Prometheus double answers for [`queries`].
fn prom_results() -> PromDouble {
    PromDouble::new(&[
        (
            r#"app_req{dim="cpu"}"#,
            r#"{"metric":{"app":"redis"},"value":[1,"1.9"]}"#,
        ),
        (
            r#"app_req{dim="mem"}"#,
            r#"{"metric":{"app":"redis"},"value":[1,"4"]}"#,
        ),
        (
            r#"app_req{dim="mbw_read"}"#,
            r#"{"metric":{"app":"redis"},"value":[1,"10"]}"#,
        ),
        (
            r#"app_req{dim="mbw_write"}"#,
            r#"{"metric":{"app":"redis"},"value":[1,"5"]}"#,
        ),
        (
            "pmem_mode != 0",
            r#"{"metric":{"nodename":"n2"},"value":[1,"1"]}"#,
        ),
        (
            r#"node_capacity{dim="mbw_read"}"#,
            r#"{"metric":{"nodename":"n2"},"value":[1,"70.5"]}"#,
        ),
        (
            r#"node_capacity{dim="mbw_write"}"#,
            r#"{"metric":{"nodename":"n2"},"value":[1,"20"]}"#,
        ),
        (
            "platform_dram_hit_ratio",
            r#"{"metric":{"nodename":"n2"},"value":[1,"0.95"]}"#,
        ),
    ])
}

/// Waits until the store's view satisfies `ok`; panics with the last view after [`PATIENCE`].
async fn wait_for(store: &SnapshotStore, what: &str, ok: impl Fn(&View) -> bool) -> Arc<View> {
    let mut rx = store.subscribe();
    match tokio::time::timeout(PATIENCE, rx.wait_for(|v| ok(v))).await {
        Ok(Ok(view)) => view.clone(),
        _ => panic!("waited for {what}; the store holds {:#?}", store.view()),
    }
}

fn count(view: &View, node: &str, app: &str) -> u64 {
    view.snapshot.as_ref().map_or(0, |s| s.count(node, app))
}

fn settings(interval: Duration) -> RefreshSettings {
    RefreshSettings {
        interval,
        watch_retry: Duration::from_millis(20),
        ..RefreshSettings::default()
    }
}

#[tokio::test]
async fn https_kubernetes_and_prometheus_make_the_snapshot_and_a_bound_pod_counts_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, tls) = test_tls();
    let kube = KubeDouble::new(true);
    let kube_addr = serve_tls(kube.router(), tls).await;
    let prom = prom_results();
    let (prom_addr, _) = serve(prom.router()).await;
    let provider = DataProvider {
        kind: ProviderKind::Cluster,
        prometheus: Some(prometheus(prom_addr.port(), 2.0, Some("1586245624"))),
        kubeapi: Some(kubeapi(
            "127.0.0.1",
            kube_addr.port(),
            dir.path(),
            Some(&ca),
        )),
        queries: queries(),
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    // An hour between lists: whatever changes after the first list comes from the watch.
    let task = spawn_sources(
        &provider,
        &DIMS,
        store.clone(),
        settings(Duration::from_secs(3600)),
        shutdown.clone(),
    );

    let view = wait_for(&store, "the first snapshot", |v| v.snapshot.is_some()).await;
    let snap = view.snapshot.as_ref().unwrap();
    // n1: DRAM, 16318504 Ki = 16 GB, 200/200 bandwidth; n2: PMEM, bandwidth from the queries;
    // the master is left out; the unbound pod is not counted.
    assert_eq!(
        snap.node_capacities["n1"],
        BTreeMap::from([
            (Dim::Cpu, 4.0),
            (Dim::Mem, 16.0),
            (Dim::MembwRead, 200.0),
            (Dim::MembwWrite, 200.0)
        ])
    );
    assert_eq!(snap.node_capacities["n2"][&Dim::MembwRead], 70.0);
    assert_eq!(snap.node_capacities["n2"][&Dim::Mem], 68.0);
    assert!(!snap.node_capacities.contains_key("m1"));
    assert!(snap.is_pmem("n2"));
    assert_eq!(snap.nodes["n2"].platform_dram_hit_ratio, Some(0.95));
    assert_eq!(
        snap.apps_spec["redis"],
        BTreeMap::from([
            (Dim::Cpu, 1.9),
            (Dim::Mem, 4.0),
            (Dim::MembwRead, 10.0),
            (Dim::MembwWrite, 5.0)
        ])
    );
    assert_eq!(count(&view, "n1", "redis"), 1);
    assert_eq!(count(&view, "n2", "redis"), 0);
    assert!(view.errors.is_empty(), "{:?}", view.errors);
    assert!(
        prom.inner
            .times
            .lock()
            .unwrap()
            .iter()
            .all(|t| t.as_deref() == Some("1586245624")),
        "every query is evaluated at the configured time"
    );

    // kube-scheduler binds the pending pod to n2: the watch says so, the count follows.
    let bound = format!(
        r#"{{"type": "MODIFIED", "object": {}}}"#,
        pod("u2", "redis", Some("n2"))
    );
    kube.wait_watch(1).await;
    assert!(kube.push("default", bound));
    let view = wait_for(&store, "the bound pod counted", |v| {
        count(v, "n2", "redis") == 1
    })
    .await;
    assert_eq!(count(&view, "n1", "redis"), 1);
    assert_eq!(
        kube.node_lists(),
        1,
        "counted from the watch, not a new list"
    );
    // A new pod, bound at once, then the first one deleted.
    kube.push(
        "default",
        format!(
            r#"{{"type": "ADDED", "object": {}}}"#,
            pod("u3", "redis", Some("n2"))
        ),
    );
    wait_for(&store, "the added pod", |v| count(v, "n2", "redis") == 2).await;
    kube.push(
        "default",
        format!(
            r#"{{"type": "DELETED", "object": {}}}"#,
            pod("u1", "redis", Some("n1"))
        ),
    );
    wait_for(&store, "the deleted pod", |v| count(v, "n1", "redis") == 0).await;

    shutdown.cancel();
    tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_wrong_token_or_an_unknown_ca_is_reported_and_nothing_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, tls) = test_tls();
    let kube = KubeDouble::new(true);
    let addr = serve_tls(kube.router(), tls).await;
    let mut api = kubeapi("127.0.0.1", addr.port(), dir.path(), Some(&ca));
    std::fs::write(dir.path().join("token"), "someone-else").unwrap();
    let provider = DataProvider {
        kind: ProviderKind::Cluster,
        prometheus: None,
        kubeapi: Some(api.clone()),
        queries: queries(),
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    spawn_sources(
        &provider,
        &DIMS,
        store.clone(),
        settings(Duration::from_millis(50)),
        shutdown.clone(),
    );
    let view = wait_for(&store, "the 401", |v| v.errors.contains_key("kubernetes")).await;
    assert!(
        view.errors["kubernetes"].message.contains("HTTP 401"),
        "{:?}",
        view.errors
    );
    assert!(view.snapshot.is_none());
    // The token file is read again for every request: fixing it is enough.
    std::fs::write(dir.path().join("token"), TOKEN).unwrap();
    wait_for(&store, "a snapshot with the right token", |v| {
        v.snapshot.is_some() && v.errors.is_empty()
    })
    .await;
    shutdown.cancel();

    // A CA that did not sign the server's certificate.
    let (other_ca, _) = test_tls();
    std::fs::write(dir.path().join("ca.crt"), other_ca).unwrap();
    api.server_cert_ca_path = dir.path().join("ca.crt").display().to_string();
    let provider = DataProvider {
        kubeapi: Some(api),
        ..provider
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    spawn_sources(
        &provider,
        &DIMS,
        store.clone(),
        settings(Duration::from_millis(50)),
        shutdown.clone(),
    );
    let view = wait_for(&store, "the TLS error", |v| {
        v.errors.contains_key("kubernetes")
    })
    .await;
    let message = &view.errors["kubernetes"].message;
    assert!(message.contains("cannot connect"), "{message}");
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    shutdown.cancel();
}

#[tokio::test]
async fn failures_keep_the_last_good_snapshot_and_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDouble::new(false);
    let (kube_addr, _) = serve(kube.router()).await;
    let prom = prom_results();
    let (prom_addr, _) = serve(prom.router()).await;
    // Plain HTTP, as `kubectl proxy` serves the API.
    let provider = DataProvider {
        kind: ProviderKind::Cluster,
        prometheus: Some(prometheus(prom_addr.port(), 0.3, None)),
        kubeapi: Some(kubeapi(
            "http://127.0.0.1",
            kube_addr.port(),
            dir.path(),
            None,
        )),
        queries: queries(),
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    spawn_sources(
        &provider,
        &DIMS,
        store.clone(),
        settings(Duration::from_millis(50)),
        shutdown.clone(),
    );
    let good = wait_for(&store, "the first snapshot", |v| v.snapshot.is_some()).await;
    let good = good.snapshot.clone().unwrap();

    for (mode, says) in [
        (Mode::Fail, "HTTP 500: internal error"),
        (Mode::Garbage, "not the expected JSON"),
        (Mode::Hang, "no answer within 300ms"),
    ] {
        prom.set_mode(mode);
        let view = wait_for(&store, says, |v| {
            v.errors
                .get("prometheus")
                .is_some_and(|e| e.message.contains(says))
        })
        .await;
        assert_eq!(
            view.snapshot.as_deref(),
            Some(&*good),
            "the last good snapshot stays"
        );
        prom.set_mode(Mode::Normal);
        wait_for(&store, "prometheus recovered", |v| {
            !v.errors.contains_key("prometheus")
        })
        .await;
    }
    for (mode, says) in [
        (Mode::Fail, "HTTP 500"),
        (Mode::Garbage, "node list: not the expected JSON"),
        (Mode::Hang, "no answer within 2s"),
    ] {
        kube.set_mode(mode);
        let view = wait_for(&store, says, |v| {
            v.errors
                .get("kubernetes")
                .is_some_and(|e| e.message.contains(says))
        })
        .await;
        assert_eq!(
            view.snapshot.as_deref(),
            Some(&*good),
            "the last good snapshot stays"
        );
        kube.set_mode(Mode::Normal);
        wait_for(&store, "kubernetes recovered", |v| {
            !v.errors.contains_key("kubernetes")
        })
        .await;
    }
    shutdown.cancel();
}

#[tokio::test]
async fn connection_refused_and_prometheus_errors_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDouble::new(false);
    let (kube_addr, _) = serve(kube.router()).await;
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let provider = DataProvider {
        kind: ProviderKind::Cluster,
        prometheus: Some(prometheus(closed_port, 1.0, None)),
        kubeapi: Some(kubeapi(
            "http://127.0.0.1",
            kube_addr.port(),
            dir.path(),
            None,
        )),
        queries: queries(),
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    spawn_sources(
        &provider,
        &DIMS,
        store.clone(),
        settings(Duration::from_millis(50)),
        shutdown.clone(),
    );
    let view = wait_for(&store, "connection refused", |v| {
        v.errors.contains_key("prometheus")
    })
    .await;
    assert!(
        view.errors["prometheus"].message.contains("cannot connect"),
        "{:?}",
        view.errors
    );
    assert!(
        view.snapshot.is_none(),
        "nothing before Prometheus answers once"
    );
    shutdown.cancel();

    // Prometheus' own error reply (HTTP 400 with a JSON body) is shown as Prometheus says it.
    let prom = prom_results();
    let (prom_addr, _) = serve(prom.router()).await;
    let mut q = queries();
    q.app_requested_resources
        .insert(Dim::Cpu, "bad query(".into());
    let provider = DataProvider {
        prometheus: Some(prometheus(prom_addr.port(), 1.0, None)),
        queries: q,
        ..provider
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    spawn_sources(
        &provider,
        &DIMS,
        store.clone(),
        settings(Duration::from_millis(50)),
        shutdown.clone(),
    );
    let view = wait_for(&store, "the query error", |v| {
        v.errors.contains_key("prometheus")
    })
    .await;
    assert_eq!(
        view.errors["prometheus"].message,
        "prometheus: bad_data: parse error: unclosed left parenthesis"
    );
    shutdown.cancel();
}

#[tokio::test]
async fn an_expired_watch_lists_again() {
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDouble::new(false);
    let (kube_addr, _) = serve(kube.router()).await;
    let provider = DataProvider {
        kind: ProviderKind::Cluster,
        prometheus: None,
        kubeapi: Some(kubeapi(
            "http://127.0.0.1",
            kube_addr.port(),
            dir.path(),
            None,
        )),
        queries: queries(),
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    spawn_sources(
        &provider,
        &[Dim::Cpu, Dim::Mem],
        store.clone(),
        settings(Duration::from_secs(3600)),
        shutdown.clone(),
    );
    wait_for(&store, "the first snapshot", |v| v.snapshot.is_some()).await;
    // Meanwhile a pod was bound, and the watch's version expired: the relist must find it.
    kube.inner.pods.lock().unwrap().insert(
        "default".into(),
        vec![
            pod("u1", "redis", Some("n1")),
            pod("u2", "redis", Some("n1")),
        ],
    );
    let gone = r#"{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}}"#;
    kube.wait_watch(1).await;
    assert!(kube.push("default", gone.to_owned()));
    wait_for(&store, "the relist", |v| count(v, "n1", "redis") == 2).await;
    assert_eq!(kube.node_lists(), 2);
    shutdown.cancel();
}

#[tokio::test]
async fn a_broken_watch_is_reported_and_opened_again() {
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDouble::new(false);
    let (kube_addr, _) = serve(kube.router()).await;
    let provider = DataProvider {
        kind: ProviderKind::Cluster,
        prometheus: None,
        kubeapi: Some(kubeapi(
            "http://127.0.0.1",
            kube_addr.port(),
            dir.path(),
            None,
        )),
        queries: queries(),
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    spawn_sources(
        &provider,
        &[Dim::Cpu, Dim::Mem],
        store.clone(),
        settings(Duration::from_secs(3600)),
        shutdown.clone(),
    );
    let first = wait_for(&store, "the first snapshot", |v| v.snapshot.is_some()).await;
    kube.wait_watch(1).await;
    assert!(kube.push_raw("default", "{not json".into()));
    let view = wait_for(&store, "the watch error", |v| {
        v.errors.contains_key("kubernetes")
    })
    .await;
    assert!(
        view.errors["kubernetes"]
            .message
            .starts_with("pod watch: not the expected JSON"),
        "{:?}",
        view.errors
    );
    assert_eq!(view.snapshot, first.snapshot, "the snapshot in force stays");
    // The watch is opened again (not a new list) and its events count.
    kube.wait_watch(2).await;
    let bound = format!(
        r#"{{"type": "MODIFIED", "object": {}}}"#,
        pod("u2", "redis", Some("n2"))
    );
    assert!(kube.push("default", bound));
    let view = wait_for(&store, "the bound pod", |v| count(v, "n2", "redis") == 1).await;
    assert!(view.errors.is_empty(), "the next event clears the error");
    assert_eq!(kube.node_lists(), 1);
    shutdown.cancel();
}

/// A test double of an exporter, speaking Prometheus' text exposition format, with `app_req{app,dim}`,
/// `node_capacity{nodename,dim}`, `pmem_mode{nodename}` and `platform_dram_hit_ratio` series.
async fn exporter() -> String {
    "# TYPE app_req gauge\n\
     app_req{app=\"redis\",dim=\"cpu\"} 2.5\n\
     app_req{app=\"redis\",dim=\"mem\"} 3\n\
     app_req{app=\"redis\",dim=\"mbw_read\"} 12\n\
     app_req{app=\"redis\",dim=\"mbw_write\"} 6\n\
     app_req{app=\"web\",dim=\"cpu\"} 1\n\
     app_req{app=\"web\",dim=\"mem\"} 1\n\
     app_req{app=\"web\",dim=\"mbw_read\"} 1\n\
     app_req{app=\"web\",dim=\"mbw_write\"} 1\n\
     # TYPE node_capacity gauge\n\
     node_capacity{nodename=\"n2\",dim=\"mbw_read\"} 88.8\n\
     node_capacity{nodename=\"n2\",dim=\"mbw_write\"} 33\n\
     # TYPE pmem_mode gauge\n\
     pmem_mode{nodename=\"n1\"} 0\n\
     pmem_mode{nodename=\"n2\"} 1\n\
     # TYPE platform_dram_hit_ratio gauge\n\
     platform_dram_hit_ratio{nodename=\"n2\"} 0.875\n"
        .to_owned()
}

/// The `prometheus` binary: `$PROMETHEUS`, or Debian's `/usr/bin/prometheus` (`make
/// prometheus-deps` installs it), or one on `PATH`.
pub(crate) fn prometheus_binary() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("PROMETHEUS") {
        return Some(p.into());
    }
    let debian = Path::new("/usr/bin/prometheus");
    if debian.exists() {
        return Some(debian.to_owned());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    })
}

/// A real `prometheus` child, killed on drop.
pub(crate) struct RealPrometheus {
    child: std::process::Child,
    pub(crate) port: u16,
}

impl Drop for RealPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `prometheus` scraping `target` every second, with its data in `dir`. Prometheus
/// cannot report a port it picked itself, so a free port is taken and, should another process
/// grab it first (prometheus then exits saying so), another one.
pub(crate) fn start_prometheus(binary: &Path, dir: &Path, target: SocketAddr) -> RealPrometheus {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: exporter\n    static_configs:\n\
             \x20     - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    for attempt in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log_path = dir.join(format!("prometheus-{attempt}.log"));
        let mut child = std::process::Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join(format!("data-{attempt}")).display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        // Ready once it logs so; an early exit (port taken) tries another port.
        let ready = crate::util::wait_for(PATIENCE, || {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if log.contains("Server is ready to receive web requests") {
                Some(true)
            } else if child.try_wait().ok().flatten().is_some() {
                Some(false)
            } else {
                None
            }
        });
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if ready == Some(true) {
            return RealPrometheus { child, port };
        }
        let _ = child.kill();
        let _ = child.wait();
        if !log.contains("address already in use") {
            panic!("prometheus did not start:\n{log}");
        }
    }
    panic!("prometheus found no free port in 5 attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scraping_an_exporter_feeds_the_snapshot() {
    let Some(binary) = prometheus_binary() else {
        if std::env::var_os("CI").is_some() {
            panic!("prometheus is not installed (make prometheus-deps installs Debian's package)");
        }
        eprintln!(
            "\n\n*** SKIPPED a_real_prometheus_scraping_an_exporter_feeds_the_snapshot: no \
             prometheus binary (run `make prometheus-deps`, or set PROMETHEUS) ***\n\n"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (exporter_addr, _) = serve(Router::new().route("/metrics", get(exporter))).await;
    let real = start_prometheus(&binary, dir.path(), exporter_addr);
    let kube = KubeDouble::new(false);
    let (kube_addr, _) = serve(kube.router()).await;
    let provider = DataProvider {
        kind: ProviderKind::Cluster,
        prometheus: Some(prometheus(real.port, 5.0, None)),
        kubeapi: Some(kubeapi(
            "http://127.0.0.1",
            kube_addr.port(),
            dir.path(),
            None,
        )),
        queries: queries(),
    };
    let store = SnapshotStore::new();
    let shutdown = CancellationToken::new();
    // Prometheus has nothing until its first scrape: the source asks again every 100 ms and the
    // test waits until the snapshot holds what the exporter serves.
    spawn_sources(
        &provider,
        &DIMS,
        store.clone(),
        settings(Duration::from_millis(100)),
        shutdown.clone(),
    );
    let view = wait_for(&store, "the exporter's series through prometheus", |v| {
        v.snapshot
            .as_ref()
            .is_some_and(|s| s.apps_spec.len() == 2 && s.is_pmem("n2"))
    })
    .await;
    let snap = view.snapshot.as_ref().unwrap();
    assert_eq!(
        snap.apps_spec["redis"],
        BTreeMap::from([
            (Dim::Cpu, 2.5),
            (Dim::Mem, 3.0),
            (Dim::MembwRead, 12.0),
            (Dim::MembwWrite, 6.0)
        ])
    );
    assert_eq!(snap.node_capacities["n2"][&Dim::MembwRead], 88.0);
    assert_eq!(snap.node_capacities["n2"][&Dim::MembwWrite], 33.0);
    assert_eq!(snap.node_capacities["n1"][&Dim::MembwRead], 200.0);
    assert!(!snap.is_pmem("n1"), "pmem_mode 0 is filtered by `!= 0`");
    assert_eq!(snap.nodes["n2"].platform_dram_hit_ratio, Some(0.875));
    assert_eq!(snap.count("n1", "redis"), 1);
    shutdown.cancel();
    drop(real);
}

/// An exporter with wca's raw metrics (bytes, as wca's agent reports them) and series of
/// kube-state-metrics' names and shape (`kube_pod_container_resource_requests` per container,
/// `kube_pod_labels` with `label_app` as `--metric-labels-allowlist=pods=[app]` gives it).
async fn wca_and_kube_state_metrics_exporter() -> String {
    let req = |ns: &str, pod: &str, container: &str, resource: &str, unit: &str, v: &str| {
        format!(
            "kube_pod_container_resource_requests{{namespace=\"{ns}\",pod=\"{pod}\",\
             uid=\"uid-{pod}\",container=\"{container}\",node=\"n1\",resource=\"{resource}\",\
             unit=\"{unit}\"}} {v}\n"
        )
    };
    let mut text = String::from(
        "# TYPE task_requested_cpus gauge\n\
         task_requested_cpus{app=\"redis\"} 2\n\
         # TYPE task_requested_mem_bytes gauge\n\
         task_requested_mem_bytes{app=\"redis\"} 4294967296\n\
         # TYPE kube_pod_container_resource_requests gauge\n",
    );
    for (pod, container, cpu, mem) in [
        ("redis-1", "redis", "0.5", "1073741824"),
        ("redis-1", "sidecar", "0.25", "268435456"),
        ("redis-2", "redis", "0.5", "2147483648"),
        ("web-1", "web", "1", "536870912"),
    ] {
        text += &req("default", pod, container, "cpu", "core", cpu);
        text += &req("default", pod, container, "memory", "byte", mem);
    }
    text += &req("kube-system", "coredns-1", "coredns", "cpu", "core", "8");
    text += "# TYPE kube_pod_labels gauge\n";
    for (ns, pod, app) in [
        ("default", "redis-1", Some("redis")),
        ("default", "redis-2", Some("redis")),
        ("default", "web-1", Some("web")),
        ("kube-system", "coredns-1", None),
    ] {
        let label = app.map_or(String::new(), |a| format!(",label_app=\"{a}\""));
        text += &format!(
            "kube_pod_labels{{namespace=\"{ns}\",pod=\"{pod}\",uid=\"uid-{pod}\"{label}}} 1\n"
        );
    }
    text
}

/// Against a real `prometheus`: wca's default queries answer in GB, so a pod asking 4 GiB fits
/// a node of 16 GB (before, every node refused it: `missing (mem: 4294967262.0)`); and
/// `examples/kube-state-metrics/placement.yaml`, loaded as written, reads the apps' requests from
/// kube-state-metrics' series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_answers_the_default_and_the_kube_state_metrics_queries_in_gb() {
    let Some(binary) = prometheus_binary() else {
        if std::env::var_os("CI").is_some() {
            panic!("prometheus is not installed (make prometheus-deps installs Debian's package)");
        }
        eprintln!(
            "\n\n*** SKIPPED a_real_prometheus_answers_the_default_and_the_kube_state_metrics_\
             queries_in_gb: no prometheus binary (run `make prometheus-deps`, or set PROMETHEUS) ***\n\n"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (exporter_addr, _) =
        serve(Router::new().route("/metrics", get(wca_and_kube_state_metrics_exporter))).await;
    let real = start_prometheus(&binary, dir.path(), exporter_addr);
    let kube = KubeDouble::new(false);
    let (kube_addr, _) = serve(kube.router()).await;
    let shutdown = CancellationToken::new();

    // wca's default queries.
    let dims = [Dim::Cpu, Dim::Mem];
    let provider = DataProvider {
        kind: ProviderKind::Cluster,
        prometheus: Some(prometheus(real.port, 5.0, None)),
        kubeapi: Some(kubeapi(
            "http://127.0.0.1",
            kube_addr.port(),
            dir.path(),
            None,
        )),
        queries: Queries::default(),
    };
    let store = SnapshotStore::new();
    spawn_sources(
        &provider,
        &dims,
        store.clone(),
        settings(Duration::from_millis(100)),
        shutdown.clone(),
    );
    let view = wait_for(&store, "redis's requests through prometheus", |v| {
        v.snapshot
            .as_ref()
            .is_some_and(|s| s.apps_spec.contains_key("redis"))
    })
    .await;
    let snap = view.snapshot.as_ref().unwrap();
    assert_eq!(
        snap.apps_spec["redis"],
        BTreeMap::from([(Dim::Cpu, 2.0), (Dim::Mem, 4294967296.0 / 1e9)])
    );
    assert_eq!(snap.node_capacities["n1"][&Dim::Mem], 16.0, "16318504Ki");
    let fit = verwalter_placement::Algorithm::new(verwalter_placement::Kind::Fit {
        cpu_scale_factor: 1.0,
    });
    let result = fit
        .filter(snap, "redis", &["n1".to_string(), "n2".to_string()])
        .unwrap();
    assert_eq!(result.nodes, ["n1", "n2"], "{:?}", result.failed);

    // The kube-state-metrics example, as written.
    let yaml = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kube-state-metrics/placement.yaml"),
    )
    .unwrap();
    let kube_port = kube_addr.port().to_string();
    let prom_port = real.port.to_string();
    let config = verwalter_placement::config::load_config(&yaml, |name| match name {
        "KUBERNETES_SERVICE_HOST" => Some("http://127.0.0.1".into()),
        "KUBERNETES_SERVICE_PORT" => Some(kube_port.clone()),
        "PROMETHEUS_URL" => Some("http://127.0.0.1".into()),
        "PROMETHEUS_PORT" => Some(prom_port.clone()),
        _ => None,
    })
    .unwrap();
    let loaded = &config.algorithms[verwalter_placement::config::SINGLE_ALGORITHM];
    let store = SnapshotStore::new();
    spawn_sources(
        loaded.data_provider.as_ref().unwrap(),
        &loaded.algorithm.dimensions,
        store.clone(),
        settings(Duration::from_millis(100)),
        shutdown.clone(),
    );
    let view = wait_for(
        &store,
        "kube-state-metrics' requests through prometheus",
        |v| v.snapshot.as_ref().is_some_and(|s| s.apps_spec.len() == 2),
    )
    .await;
    let snap = view.snapshot.as_ref().unwrap();
    assert_eq!(
        snap.apps_spec["redis"],
        BTreeMap::from([(Dim::Cpu, 0.75), (Dim::Mem, 2147483648.0 / 1e9)]),
        "the larger pod of the app, its containers summed"
    );
    assert_eq!(
        snap.apps_spec["web"],
        BTreeMap::from([(Dim::Cpu, 1.0), (Dim::Mem, 536870912.0 / 1e9)])
    );
    let result = loaded
        .algorithm
        .filter(snap, "redis", &["n1".to_string(), "n2".to_string()])
        .unwrap();
    assert_eq!(result.nodes, ["n1", "n2"], "{:?}", result.failed);
    shutdown.cancel();
    drop(real);
}

/// `verwalter extender` (the real binary) with a config whose data provider names the test
/// doubles: the Kubernetes API over plain HTTP as `kubectl proxy` serves it, and Prometheus. The
/// extender decides on what they report, and a pod bound through the watch is counted on its node
/// before any new list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extender_decides_on_what_the_kubernetes_api_and_prometheus_report() {
    let dir = tempfile::tempdir().unwrap();
    let kube = KubeDouble::new(false);
    let (kube_addr, _kube_task) = serve(kube.router()).await;
    let prom = prom_results();
    let (prom_addr, _prom_task) = serve(prom.router()).await;
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            r#"algorithm: !LeastUsedBAR
  dimensions: [cpu, mem]
  data_provider: !ClusterDataProvider
    kubeapi: !Kubeapi
      host: http://127.0.0.1
      port: {kube_port}
      client_token_path: {dir}/no-token
      monitored_namespaces: [default]
    prometheus: !Prometheus
      host: http://127.0.0.1
      port: {prom_port}
      timeout: 2.0
    queries: !Queries
      APP_REQUESTED_RESOURCES_QUERY_MAP:
        cpu: 'app_req{{dim="cpu"}}'
        mem: 'app_req{{dim="mem"}}'
"#,
            kube_port = kube_addr.port(),
            prom_port = prom_addr.port(),
            dir = dir.path().display(),
        ),
    )
    .unwrap();
    let request = r#"{"Pod": {"metadata": {"name": "redis-x", "namespace": "default", "labels": {"app": "redis"}}}, "NodeNames": ["n1", "n2", "m1"]}"#;

    let dir_path = dir.path().to_owned();
    let config_path = config.display().to_string();
    let ext = tokio::task::spawn_blocking(move || {
        let ext = crate::extender::Extender::start(&dir_path, &["--config", &config_path]);
        ext.wait_status("loaded from the sources", |s| s["loaded"] == true);
        let (code, body) = ext.post("/filter", request);
        assert_eq!(code, 200, "{body}");
        // redis asks 1.9 CPUs (as Prometheus answers, wca's `float(value)`) and 4 GB; m1 is a master
        // and not in the snapshot.
        assert_eq!(
            body,
            r#"{"Nodes":null,"NodeNames":["n1","n2"],"FailedNodes":{"m1":"No capacity known for dimensions: cpu, mem."},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        let used = util::metric(
            ext.port(),
            r#"verwalter_placement_node_used{node="n1",resource="cpu"}"#,
        );
        assert_eq!(used, Some(1.9), "u1 runs on n1");
        assert!(
            util::metric(
                ext.port(),
                r#"verwalter_placement_source_refreshes_total{result="ok",source="kubernetes"}"#
            )
            .is_some_and(|n| n >= 1.0),
            "the sources' refreshes are counted on the extender's /metrics"
        );
        ext
    })
    .await
    .unwrap();

    kube.wait_watch(1).await;
    assert!(kube.push(
        "default",
        format!(
            r#"{{"type": "MODIFIED", "object": {}}}"#,
            pod("u2", "redis", Some("n1"))
        )
    ));
    tokio::task::spawn_blocking(move || {
        let used = util::wait_for(PATIENCE, || {
            util::metric(
                ext.port(),
                r#"verwalter_placement_node_used{node="n1",resource="cpu"}"#,
            )
            .filter(|&n| n == 3.8)
        });
        assert_eq!(
            used,
            Some(3.8),
            "the bound pod counts at once:\n{}",
            ext.logs()
        );
        assert_eq!(kube.node_lists(), 1, "without a new list");
    })
    .await
    .unwrap();
}
