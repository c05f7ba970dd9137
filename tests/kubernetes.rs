//! `deploy/kubernetes/` as an operator applies it (docs/placement.md, "On Kubernetes"): every
//! manifest validated by the pinned `kubernetes-validate` (and kube-scheduler's configuration
//! by its v1 fields), the objects wired to each other (names, labels, ports, the probes, the
//! certificate's names), and the extender started exactly as the Deployment starts it, with the
//! ConfigMap's config, against the Kubernetes API double and a real Prometheus, called over TLS
//! as kube-scheduler calls it by its KubeSchedulerConfiguration.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use serde_json::Value;

use crate::sources::{KubeDouble, prometheus_binary, serve, start_prometheus};
use crate::util::{self, BIN};

const PATIENCE: Duration = Duration::from_secs(30);

fn top() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn deploy() -> PathBuf {
    top().join("deploy/kubernetes")
}

/// The manifest files, in the order they are applied, and kube-scheduler's files.
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files.push(deploy().join("kube-scheduler/kube-scheduler.yaml"));
    files
}

/// Every document of a YAML file.
fn documents(path: &Path) -> Vec<Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// The object of `kind` named `name` in deploy/kubernetes/.
fn object(kind: &str, name: &str) -> Value {
    manifest_files()
        .iter()
        .flat_map(|f| documents(f))
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

fn scheduler_config() -> Value {
    let docs = documents(&deploy().join("kube-scheduler/kube-scheduler-config.yaml"));
    assert_eq!(docs.len(), 1);
    docs.into_iter().next().unwrap()
}

fn container(owner: &Value) -> &Value {
    let spec = if owner["kind"] == "Pod" {
        &owner["spec"]
    } else {
        &owner["spec"]["template"]["spec"]
    };
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    &containers[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> &'a str {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag}"));
    &args[at + 1]
}

/// The pinned version of `kubernetes-validate` (the Makefile's `KUBERNETES_VALIDATE_VERSION`).
fn pinned_validator_version() -> String {
    let makefile = std::fs::read_to_string(top().join("Makefile")).unwrap();
    makefile
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VALIDATE_VERSION := "))
        .expect("the Makefile pins kubernetes-validate")
        .trim()
        .to_owned()
}

/// `kubernetes-validate` at the pinned version, as `python3 -m kubernetes_validate` (`$PYTHON`
/// instead of `python3` when set; `make k8s-deps` installs it); `None` when it is missing: the
/// test is skipped, loudly (it fails under CI).
fn validator() -> Option<Command> {
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let command = || {
        let mut c = Command::new(&python);
        c.args(["-m", "kubernetes_validate"]);
        c
    };
    let version = command()
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let Some(version) = version else {
        let hint = format!(
            "kubernetes-validate is not installed (make k8s-deps, or python3 -m pip install \
             kubernetes-validate=={})",
            pinned_validator_version()
        );
        if std::env::var_os("CI").is_some() {
            panic!("{hint}");
        }
        eprintln!("\n\n*** SKIPPED the manifest validation: {hint} ***\n\n");
        return None;
    };
    assert_eq!(
        version,
        pinned_validator_version(),
        "kubernetes-validate is not the pinned version (make k8s-deps installs it)"
    );
    Some(command())
}

/// `KubeSchedulerConfiguration`'s other v1 fields, and those of its `clientConnection` and
/// `leaderElection`.
const CONFIG_FIELDS: &[&str] = &[
    "parallelism",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "delayCacheUntilActive",
    "enableProfiling",
    "enableContentionProfiling",
];
const CLIENT_CONNECTION_FIELDS: &[&str] = &[
    "kubeconfig",
    "acceptContentTypes",
    "contentType",
    "qps",
    "burst",
];
const LEADER_ELECTION_FIELDS: &[&str] = &[
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
];

/// kube-scheduler's `Extender` fields (k8s.io/kube-scheduler/config/v1), and its `tlsConfig`'s.
const EXTENDER_FIELDS: &[&str] = &[
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
];
const TLS_FIELDS: &[&str] = &[
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
];

#[test]
fn every_manifest_validates() {
    // kube-scheduler's configuration has no schema in kubernetes-validate: its extender is
    // checked against the v1 fields here.
    let config = scheduler_config();
    assert_eq!(config["apiVersion"], "kubescheduler.config.k8s.io/v1");
    assert_eq!(config["kind"], "KubeSchedulerConfiguration");
    for (key, value) in config.as_object().unwrap() {
        let fields: &[&str] = match key.as_str() {
            "apiVersion" | "kind" => continue,
            "clientConnection" => CLIENT_CONNECTION_FIELDS,
            "leaderElection" => LEADER_ELECTION_FIELDS,
            "extenders" => continue,
            other => {
                assert!(CONFIG_FIELDS.contains(&other), "{other}: not a field");
                continue;
            }
        };
        for key in value.as_object().unwrap().keys() {
            assert!(fields.contains(&key.as_str()), "{key}: not a field");
        }
    }
    let extenders = config["extenders"].as_array().unwrap();
    assert_eq!(extenders.len(), 1);
    for (key, value) in extenders[0].as_object().unwrap() {
        assert!(
            EXTENDER_FIELDS.contains(&key.as_str()),
            "extenders[0].{key}: not a field"
        );
        if key == "tlsConfig" {
            for key in value.as_object().unwrap().keys() {
                assert!(
                    TLS_FIELDS.contains(&key.as_str()),
                    "tlsConfig.{key}: not a field"
                );
            }
        }
    }

    let Some(mut validate) = validator() else {
        return;
    };
    let files = manifest_files();
    let out = validate.arg("--strict").args(&files).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for file in &files {
        for doc in documents(file) {
            let line = format!(
                "{} passed for resource {}/{}",
                file.display(),
                doc["kind"].as_str().unwrap().to_lowercase(),
                doc["metadata"]["name"].as_str().unwrap()
            );
            assert!(text.contains(&line), "not validated: {line}\n{text}");
        }
    }
    // The validator does refuse what the API server would: a misspelt field.
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("deployment.yaml");
    let deployment = std::fs::read_to_string(deploy().join("30-deployment.yaml")).unwrap();
    std::fs::write(
        &broken,
        deployment.replace("readOnlyRootFilesystem", "readOnlyRootFileSystem"),
    )
    .unwrap();
    let out = validator()
        .unwrap()
        .arg("--strict")
        .arg(&broken)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a misspelt field passes");
}

#[test]
fn the_manifests_fit_together() {
    let deployment = object("Deployment", "verwalter-extender");
    let pod = &deployment["spec"]["template"];
    let c = container(&deployment);
    let args = strings(&c["args"]);
    assert_eq!(args[0], "extender");
    assert_eq!(deployment["spec"]["replicas"], 2);

    // The service account, and its rights: exactly what src/placement/kube.rs asks for.
    let account = pod["spec"]["serviceAccountName"].as_str().unwrap();
    object("ServiceAccount", account);
    let role = object("ClusterRole", "verwalter-extender");
    assert_eq!(
        granted(&role),
        [("list", "nodes"), ("list", "pods"), ("watch", "pods")]
            .map(|(v, r)| (v.to_owned(), r.to_owned()))
            .into(),
        "the end-to-end test checks these are the requests the extender makes"
    );
    let binding = object("ClusterRoleBinding", "verwalter-extender");
    assert_eq!(binding["roleRef"]["name"], "verwalter-extender");
    assert_eq!(binding["subjects"][0]["name"], account);
    assert_eq!(
        binding["subjects"][0]["namespace"],
        deployment["metadata"]["namespace"]
    );
    let namespace = deployment["metadata"]["namespace"].as_str().unwrap();
    object("Namespace", namespace);

    // Hardening and resources.
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());
    // The image runs as the user the Deployment names, and is built from this version's .deb.
    let containerfile = std::fs::read_to_string(top().join("deploy/Containerfile")).unwrap();
    let uid = pod["spec"]["securityContext"]["runAsUser"]
        .as_u64()
        .unwrap();
    assert!(
        containerfile.contains(&format!("\nUSER {uid}:")),
        "Containerfile's USER"
    );
    let version = env!("CARGO_PKG_VERSION");
    assert!(containerfile.contains(&format!("ARG VERSION={version}\n")));
    assert!(containerfile.contains("COPY target/verwalter_${VERSION}_amd64.deb"));
    assert_eq!(c["image"], format!("verwalter:{version}"));

    // The probes: the extender's own routes, on its port, over HTTPS.
    let port_name = c["ports"][0]["name"].as_str().unwrap();
    let container_port = c["ports"][0]["containerPort"].as_u64().unwrap();
    let listen = flag(&args, "--listen");
    assert_eq!(listen, format!("0.0.0.0:{container_port}"));
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], port_name, "{probe}");
        assert_eq!(c[probe]["httpGet"]["scheme"], "HTTPS", "{probe}");
        assert!(
            verwalter::placement::extender::ROUTES
                .iter()
                .any(|(m, p, _)| *m == "GET" && *p == path),
            "{path} is served"
        );
    }

    // The Service selects the pods and reaches the port; kube-scheduler's urlPrefix is the
    // Service's address, its serverName the Service's DNS name.
    let service = object("Service", "verwalter-extender");
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][key], value, "selector {key}");
    }
    let service_port = &service["spec"]["ports"][0];
    assert_eq!(service_port["targetPort"], port_name);
    let extender = &scheduler_config()["extenders"][0];
    assert_eq!(
        extender["urlPrefix"],
        format!(
            "https://{}:{}",
            service["spec"]["clusterIP"].as_str().unwrap(),
            service_port["port"]
        )
    );
    assert_eq!(extender["enableHTTPS"], true);
    assert_eq!(
        extender["tlsConfig"]["serverName"],
        format!("verwalter-extender.{namespace}.svc")
    );
    assert!(args.contains(&"--tls-cert".to_owned()));
    // The config and the certificate come from the volumes mounted where the args point.
    let ext_mounts = mounts(&deployment);
    let config_path = flag(&args, "--config");
    let (volume, key) = mounted(&ext_mounts, config_path);
    assert_eq!(volume["configMap"]["name"], "verwalter-extender");
    assert!(
        object("ConfigMap", "verwalter-extender")["data"][key].is_string(),
        "the ConfigMap has {key}"
    );
    let (volume, key) = mounted(&ext_mounts, flag(&args, "--tls-cert"));
    assert_eq!(volume["secret"]["secretName"], "verwalter-extender-tls");
    assert_eq!(key, "tls.crt", "as `kubectl create secret tls` names it");
    assert_eq!(mounted(&ext_mounts, flag(&args, "--tls-key")).1, "tls.key");

    // kube-scheduler's static pod passes the configuration and mounts it and the CA.
    let static_pod = object("Pod", "kube-scheduler");
    let ks = container(&static_pod);
    let ks_mounts = mounts(&static_pod);
    let command = strings(&ks["command"]);
    let config_flag = command
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .expect("--config=");
    let (volume, _) = mounted(&ks_mounts, config_flag);
    assert_eq!(volume["hostPath"]["path"], config_flag);
    let ca = extender["tlsConfig"]["caFile"].as_str().unwrap();
    let (volume, _) = mounted(&ks_mounts, ca);
    assert!(ca.starts_with(volume["hostPath"]["path"].as_str().unwrap()));
    assert_eq!(
        scheduler_config()["clientConnection"]["kubeconfig"],
        "/etc/kubernetes/scheduler.conf"
    );
}

/// The (verb, resource) pairs a ClusterRole grants, all in the core API group.
fn granted(role: &Value) -> std::collections::BTreeSet<(String, String)> {
    let mut granted = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(rule["apiGroups"], serde_json::json!([""]), "{rule}");
        assert!(rule.get("resourceNames").is_none(), "{rule}");
        for resource in strings(&rule["resources"]) {
            for verb in strings(&rule["verbs"]) {
                granted.insert((verb, resource.clone()));
            }
        }
    }
    granted
}

/// The container's volume mounts: (mountPath, the volume).
fn mounts(pod_owner: &Value) -> Vec<(String, Value)> {
    let spec = if pod_owner["kind"] == "Pod" {
        &pod_owner["spec"]
    } else {
        &pod_owner["spec"]["template"]["spec"]
    };
    let volumes = spec["volumes"].as_array().unwrap();
    let mut mounts: Vec<(String, Value)> = spec["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let volume = volumes
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap_or_else(|| panic!("no volume {}", m["name"]))
                .clone();
            (m["mountPath"].as_str().unwrap().to_owned(), volume)
        })
        .collect();
    // The deepest mount first: it is the one a path is in.
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    mounts
}

/// The volume `path` lies in and the path within it.
fn mounted<'a>(mounts: &'a [(String, Value)], path: &'a str) -> (&'a Value, &'a str) {
    mounts
        .iter()
        .find_map(|(at, volume)| {
            if path == at {
                return Some((volume, ""));
            }
            path.strip_prefix(at.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .map(|rest| (volume, rest))
        })
        .unwrap_or_else(|| panic!("{path} is in no mounted volume"))
}

/// What wca's agent exports for the apps (the series the ConfigMap's queries read): `web` asks
/// 2 cores and 20 GB.
async fn agent_metrics() -> String {
    "# TYPE task_requested_cpus gauge\n\
     task_requested_cpus{app=\"web\",task=\"web-1\"} 2\n\
     # TYPE task_requested_mem_bytes gauge\n\
     task_requested_mem_bytes{app=\"web\",task=\"web-1\"} 20000000000\n"
        .to_owned()
}

/// A `verwalter extender` child, killed on drop.
struct Child2(Child, PathBuf);

impl Drop for Child2 {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Child2 {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

/// kube-scheduler's side of a call: HTTPS to 127.0.0.1:`port` (where the Service leads),
/// checking the certificate against `ca` for `server_name`, as its tlsConfig says.
struct Scheduler {
    connector: tokio_rustls::TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
    port: u16,
}

impl Scheduler {
    async fn call(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .unwrap();
        let mut tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await
            .expect("the certificate holds the serverName and is signed by the CA");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.server_name.to_str(),
            body.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(body.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response).await;
        let response = String::from_utf8(response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").expect("a response");
        let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (code, body.to_owned())
    }

    /// Calls `path` until it answers `code` (the extender's own report), at most [`PATIENCE`].
    async fn wait_for(&self, path: &str, code: u16, ext: &Child2) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (got, body) = self.call("GET", path, "").await;
            if got == code {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{path} never {code} (now {got} {body}):\n{}",
                ext.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_scheduler_calls_the_extender_as_deployed() {
    let Some(prometheus) = prometheus_binary() else {
        if std::env::var_os("CI").is_some() {
            panic!("prometheus is not installed (make prometheus-deps installs Debian's package)");
        }
        eprintln!(
            "\n\n*** SKIPPED kube_scheduler_calls_the_extender_as_deployed: no prometheus ***\n\n"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let deployment = object("Deployment", "verwalter-extender");
    let c = container(&deployment);
    let configmap = object("ConfigMap", "verwalter-extender");

    // The Secret's files, made with the command docs/placement.md gives, run as written in a
    // dir that has the checkout's deploy/; the Secret it creates next is the one mounted.
    let block = util::doc_block("placement.md", "### 3. TLS", "sh");
    let lines: Vec<&str> = block.lines().collect();
    assert_eq!(lines[0], "deploy/kubernetes/make-tls.sh tls");
    std::os::unix::fs::symlink(top().join("deploy"), tmp.path().join("deploy")).unwrap();
    let out = Command::new("sh")
        .args(["-c", lines[0]])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tls = tmp.path().join("tls");
    assert_eq!(
        lines[2],
        format!(
            "kubectl -n {} create secret tls verwalter-extender-tls --cert=tls/tls.crt --key=tls/tls.key",
            deployment["metadata"]["namespace"].as_str().unwrap()
        )
    );

    // The volumes as kubelet mounts them, under tmp/root.
    let root = tmp.path().join("root");
    let volumes = mounts(&deployment);
    for (at, volume) in &volumes {
        let dir = root.join(at.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        if volume["configMap"]["name"] == "verwalter-extender" {
            for (key, value) in configmap["data"].as_object().unwrap() {
                std::fs::write(dir.join(key), value.as_str().unwrap()).unwrap();
            }
        } else if volume["secret"]["secretName"] == "verwalter-extender-tls" {
            for key in ["tls.crt", "tls.key"] {
                std::fs::copy(tls.join(key), dir.join(key)).unwrap();
            }
        } else {
            panic!("a volume the test does not know: {volume}");
        }
    }
    // The container's args, exactly, with paths under the mounts moved under tmp/root and the
    // port the system picks (its value is checked against containerPort above).
    let args: Vec<String> = strings(&c["args"])
        .into_iter()
        .map(|a| {
            if a.starts_with('/') && volumes.iter().any(|(at, _)| a.starts_with(at.as_str())) {
                root.join(a.trim_start_matches('/')).display().to_string()
            } else if a.starts_with("0.0.0.0:") {
                "127.0.0.1:0".to_owned()
            } else {
                a
            }
        })
        .collect();

    // A real Prometheus scraping what wca's agent exports, waited on until it has the series.
    let (agent, _agent_task) = serve(Router::new().route("/metrics", get(agent_metrics))).await;
    let real = start_prometheus(&prometheus, tmp.path(), agent);
    let prom_port = real.port;
    tokio::task::spawn_blocking(move || {
        util::wait_for(PATIENCE, || {
            let (_, body) =
                util::http_get(prom_port, "/api/v1/query?query=task_requested_mem_bytes")?;
            body.contains("web-1").then_some(())
        })
        .expect("prometheus scrapes the agent's series");
    })
    .await
    .unwrap();

    // The Kubernetes API double, holding its first node list back.
    let kube = KubeDouble::new(false);
    kube.open_lists(false);
    let (kube_addr, _kube_task) = serve(kube.router()).await;

    // The container's environment, with the Prometheus address the operator sets there and
    // the API server's that kubelet sets (over plain HTTP: the service account's token and CA
    // cannot be at their fixed paths here; tests/sources.rs covers HTTPS with them).
    let mut env: BTreeMap<String, String> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (name, value) in [
        ("PROMETHEUS_HOST", "http://127.0.0.1".to_owned()),
        ("PROMETHEUS_PORT", prom_port.to_string()),
    ] {
        assert!(env.contains_key(name), "the Deployment sets {name}");
        env.insert(name.to_owned(), value);
    }
    env.insert("KUBERNETES_SERVICE_HOST".into(), "http://127.0.0.1".into());
    env.insert(
        "KUBERNETES_SERVICE_PORT".into(),
        kube_addr.port().to_string(),
    );
    let log = tmp.path().join("extender.log");
    let ext = Child2(
        Command::new(BIN)
            .args(&args)
            .env_clear()
            .envs(&env)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
        log,
    );
    let port = tokio::task::spawn_blocking({
        let log = ext.1.clone();
        move || {
            util::wait_for(PATIENCE, || {
                crate::extender::extender_port(&std::fs::read_to_string(&log).unwrap_or_default())
            })
        }
    })
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("no listening line:\n{}", ext.logs()));

    // kube-scheduler's side, from its configuration.
    let extender = &scheduler_config()["extenders"][0];
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(tls.join("ca.crt")).unwrap();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let scheduler = Scheduler {
        connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        server_name: rustls::pki_types::ServerName::try_from(
            extender["tlsConfig"]["serverName"]
                .as_str()
                .unwrap()
                .to_owned(),
        )
        .unwrap(),
        port,
    };
    let probe = |name: &str| c[name]["httpGet"]["path"].as_str().unwrap().to_owned();

    // Not ready while the API server has not answered: the first list is held.
    kube.wait_node_list_request(1).await;
    let (code, body) = scheduler.call("GET", &probe("readinessProbe"), "").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("not ready: the placement data is not loaded yet"),
        "{body}"
    );
    assert_eq!(
        scheduler.call("GET", &probe("livenessProbe"), "").await,
        (200, "ok\n".to_owned())
    );
    kube.open_lists(true);
    scheduler
        .wait_for(&probe("readinessProbe"), 200, &ext)
        .await;

    // The calls kube-scheduler makes: <urlPrefix>/<verb>, NodeNames only (nodeCacheCapable).
    assert_eq!(extender["nodeCacheCapable"], true);
    let url_path = |verb: &str| {
        let prefix = extender["urlPrefix"].as_str().unwrap();
        let after_host = prefix.splitn(4, '/').nth(3).unwrap_or("");
        format!(
            "/{}{}",
            after_host.trim_end_matches('/').to_owned() + "/",
            verb
        )
        .replace("//", "/")
    };
    let request = r#"{"Pod": {"metadata": {"name": "web-2", "namespace": "default", "labels": {"app": "web"}}}, "NodeNames": ["m1", "n1", "n2"]}"#;
    let (code, body) = scheduler
        .call(
            "POST",
            &url_path(extender["filterVerb"].as_str().unwrap()),
            request,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let filtered: Value = serde_json::from_str(&body).unwrap();
    // web asks 20 GB: n1 has 16, n2 68 (64 GiB); m1 is a control-plane node, not in the data.
    assert_eq!(filtered["NodeNames"], serde_json::json!(["n2"]), "{body}");
    assert_eq!(filtered["Error"], "", "{body}");
    let failed = filtered["FailedNodes"].as_object().unwrap();
    assert_eq!(failed.keys().collect::<Vec<_>>(), ["m1", "n1"], "{body}");
    assert!(failed["n1"].as_str().unwrap().contains("mem"), "{body}");

    let (code, body) = scheduler
        .call(
            "POST",
            &url_path(extender["prioritizeVerb"].as_str().unwrap()),
            request,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let scores: BTreeMap<String, i64> = serde_json::from_str::<Vec<Value>>(&body)
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["Host"].as_str().unwrap().to_owned(),
                h["Score"].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(scores.values().all(|s| (0..=10).contains(s)), "{body}");
    assert!(
        scores["n2"] > scores["n1"],
        "the node with room scores higher: {body}"
    );

    // The ClusterRole grants exactly what the extender asked the API server for: its lists and,
    // once loaded, its pod watch.
    kube.wait_watch(1).await;
    assert_eq!(
        kube.requests(),
        granted(&object("ClusterRole", "verwalter-extender"))
    );
    drop(real);
}
