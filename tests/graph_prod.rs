//! `verwalter graph` on a production NATS server (issue 29, section 4), against the real
//! `nats-server`: TLS with a CA and a client certificate (made here with rcgen), a user and
//! password, a token and an NKey, each from a file, and a clear error naming the setting when
//! the CA or the password is wrong; the `graph.nats-*` settings of the daemon. Then the build
//! files: `verwalter graph builds list|show|prune` on a storage dir made by a real run, the
//! `--retention` sweep, and the per-component log lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use futures::StreamExt;
use serde_json::{Value, json};

use crate::graph_nats::{
    Client, Executor, Nats, dispatch_of, outputs, result_of, two_instances, wait_until,
};
use crate::util::BIN;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A server whose config file is `conf` (besides the address and port).
fn nats_with(dir: &Path, conf: &str) -> Nats {
    let config = write(dir, "nats-server.conf", conf);
    Nats::with_args(dir, None, &["-c".as_ref(), config.as_os_str()])
}

/// `verwalter graph` with `args`, its log at debug (async-nats's own lines too), until its log
/// has `text`; returns the log.
fn executor_log_until(dir: &Path, name: &str, args: &[&str], text: &str) -> String {
    let log = dir.join(format!("{name}.log"));
    let mut child = Command::new(BIN)
        .arg("graph")
        .args(args)
        .arg("--storage-dir")
        .arg(dir.join(name))
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let found = wait_until(|| {
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        logged.contains(text).then_some(logged)
    });
    let _ = child.kill();
    let _ = child.wait();
    found.unwrap_or_else(|| {
        panic!(
            "no {text:?} in the log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    })
}

/// A build with no changes: it ends at once in `build.create.done`.
fn empty_build(id: &str) -> Value {
    json!({"id": id, "changes": [], "edges": []})
}

/// Publishes an empty build with `client` and waits for its result.
async fn round_trip(client: &async_nats::Client, id: &str) -> String {
    let mut results = client.subscribe("build.create.*").await.unwrap();
    client.flush().await.unwrap();
    client
        .publish(
            "build.create",
            serde_json::to_vec(&empty_build(id)).unwrap().into(),
        )
        .await
        .unwrap();
    client.flush().await.unwrap();
    let message = tokio::time::timeout(std::time::Duration::from_secs(30), results.next())
        .await
        .expect("a result")
        .unwrap();
    message.subject.to_string()
}

/// A CA and a certificate signed by it for `names`: (CA PEM, cert PEM, key PEM).
struct Pki {
    ca_pem: String,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).unwrap();
        Pki {
            ca_pem: ca.pem(),
            ca,
            ca_key,
        }
    }

    fn issue(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.ca, &self.ca_key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_and_a_client_certificate_and_a_wrong_ca_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = Pki::new();
    let (server_cert, server_key) = pki.issue(&["127.0.0.1", "localhost"]);
    let (client_cert, client_key) = pki.issue(&["verwalter"]);
    let ca = write(dir, "ca.pem", &pki.ca_pem);
    write(dir, "server.pem", &server_cert);
    write(dir, "server-key.pem", &server_key);
    let cert = write(dir, "client.pem", &client_cert);
    let key = write(dir, "client-key.pem", &client_key);
    // The server verifies clients: without the client certificate nothing connects.
    let nats = nats_with(
        dir,
        &format!(
            "tls {{\n  cert_file: \"{0}/server.pem\"\n  key_file: \"{0}/server-key.pem\"\n  \
             ca_file: \"{0}/ca.pem\"\n  verify: true\n}}\n",
            dir.display()
        ),
    );
    let url = format!("tls://127.0.0.1:{}", nats.port);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let tls_args = [
        "--nats-tls-ca".to_string(),
        s(&ca),
        "--nats-tls-cert".into(),
        s(&cert),
        "--nats-tls-key".into(),
        s(&key),
    ];
    let args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let executor = Executor::start_with(&url, &dir.join("g"), 60.0, &dir.join("ok.log"), &args);
    executor.wait_log("Graph executor connected to NATS.", 1);

    // A client over TLS with its own certificate sends a build; the executor's result comes back.
    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(ca.clone())
        .add_client_certificate(cert.clone(), key.clone())
        .require_tls(true)
        .connect(url.as_str())
        .await
        .unwrap();
    assert_eq!(round_trip(&client, "tls-1").await, "build.create.done");

    // A CA that did not sign the server's certificate: the error names the setting.
    let other = Pki::new();
    let wrong_ca = write(dir, "other-ca.pem", &other.ca_pem);
    let wrong = [
        "--nats-url",
        &url,
        "--nats-tls-ca",
        wrong_ca.to_str().unwrap(),
        "--nats-tls-cert",
        cert.to_str().unwrap(),
        "--nats-tls-key",
        key.to_str().unwrap(),
    ];
    let text = executor_log_until(
        dir,
        "wrong-ca",
        &wrong,
        "Graph executor cannot connect to NATS",
    );
    let line = text
        .lines()
        .find(|l| l.contains("Graph executor cannot connect to NATS"))
        .unwrap();
    assert!(
        line.contains("TLS") && line.contains(&format!("--nats-tls-ca ({})", wrong_ca.display())),
        "{line}"
    );

    // A file that holds no certificate is refused before connecting, naming the flag.
    let out = Command::new(BIN)
        .args(["graph", "--nats-url", &url, "--storage-dir"])
        .arg(dir.join("g3"))
        .arg("--nats-tls-ca")
        .arg(&key)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--nats-tls-ca {}: no PEM certificate",
            key.display()
        )),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_and_password_from_a_file_and_a_wrong_one_named_never_logged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let nats = Nats::with_password(dir, "watcher", "s3cret-pw");
    let right = write(dir, "pw", "s3cret-pw\n");
    let wrong = write(dir, "wrong-pw", "wr0ng-pw\n");
    let executor = Executor::start_with(
        &nats.url(),
        &dir.join("g"),
        60.0,
        &dir.join("ok.log"),
        &[
            "--nats-user",
            "watcher",
            "--nats-password-file",
            right.to_str().unwrap(),
        ],
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    assert!(!executor.logs().contains("s3cret-pw"));
    let client =
        async_nats::ConnectOptions::with_user_and_password("watcher".into(), "s3cret-pw".into())
            .connect(nats.url())
            .await
            .unwrap();
    assert_eq!(round_trip(&client, "pw-1").await, "build.create.done");

    let text = executor_log_until(
        dir,
        "refused",
        &[
            "--nats-url",
            &nats.url(),
            "--nats-user",
            "watcher",
            "--nats-password-file",
            wrong.to_str().unwrap(),
        ],
        "Graph executor cannot connect to NATS",
    );
    assert!(!text.contains("wr0ng-pw"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("Graph executor cannot connect to NATS"))
        .unwrap();
    assert!(
        line.contains(
            "the server refused the credentials: check --nats-user and --nats-password-file"
        ),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_and_an_nkey_from_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    let token_dir = dir.join("token-server");
    std::fs::create_dir(&token_dir).unwrap();
    let nats = nats_with(&token_dir, "authorization {\n  token: \"t0k-secret\"\n}\n");
    let token = write(dir, "token", "t0k-secret\n");
    let executor = Executor::start_with(
        &nats.url(),
        &dir.join("g1"),
        60.0,
        &dir.join("token.log"),
        &["--nats-token-file", token.to_str().unwrap()],
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    let client = async_nats::ConnectOptions::with_token("t0k-secret".into())
        .connect(nats.url())
        .await
        .unwrap();
    assert_eq!(round_trip(&client, "token-1").await, "build.create.done");
    assert!(!executor.logs().contains("t0k-secret"));
    drop(executor);

    let nkey_dir = dir.join("nkey-server");
    std::fs::create_dir(&nkey_dir).unwrap();
    let user = nkeys::KeyPair::new_user();
    let nats = nats_with(
        &nkey_dir,
        &format!(
            "authorization {{\n  users = [\n    {{nkey: \"{}\"}}\n  ]\n}}\n",
            user.public_key()
        ),
    );
    let seed = user.seed().unwrap();
    let seed_file = write(dir, "user.nk", &format!("{seed}\n"));
    let executor = Executor::start_with(
        &nats.url(),
        &dir.join("g2"),
        60.0,
        &dir.join("nkey.log"),
        &["--nats-nkey-file", seed_file.to_str().unwrap()],
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    let client = async_nats::ConnectOptions::with_nkey(seed.clone())
        .connect(nats.url())
        .await
        .unwrap();
    assert_eq!(round_trip(&client, "nkey-1").await, "build.create.done");
    assert!(!executor.logs().contains(&seed));

    // Another user's seed: refused, and the error names the file's setting.
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    let stranger_file = write(dir, "stranger.nk", &stranger);
    let text = executor_log_until(
        dir,
        "stranger",
        &[
            "--nats-url",
            &nats.url(),
            "--nats-nkey-file",
            stranger_file.to_str().unwrap(),
        ],
        "Graph executor cannot connect to NATS",
    );
    assert!(text.contains("check --nats-nkey-file"), "{text}");
    assert!(!text.contains(&stranger), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_takes_nats_credentials_from_its_settings_and_names_a_bad_one() {
    let (tmp, config_dir, storage) = crate::util::example_site("minimal");
    let nats = nats_with(tmp.path(), "authorization {\n  token: \"d-t0ken\"\n}\n");
    write(tmp.path(), "nats-token", "d-t0ken\n");
    // Relative to the settings file.
    let settings = write(
        tmp.path(),
        "settings.yaml",
        &format!(
            "graph:\n  nats-url: {0}\n  nats-token-file: nats-token\n\
             deployment-events:\n  nats-url: {0}\n  nats-token-file: nats-token\n",
            nats.url()
        ),
    );
    let daemon = crate::util::Daemon::launch(
        &config_dir,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    for text in [
        "Graph executor connected to NATS.",
        "Deployment events go to NATS.",
    ] {
        let found = wait_until(|| daemon.logs().contains(text).then_some(()));
        assert!(found.is_some(), "no {text:?}:\n{}", daemon.logs());
    }
    assert!(!daemon.logs().contains("d-t0ken"));
    drop(daemon);

    // A missing file is a settings error naming the key: exit status 3.
    let bad = write(
        tmp.path(),
        "bad.yaml",
        &format!(
            "graph:\n  nats-url: {}\n  nats-token-file: missing-token\n",
            nats.url()
        ),
    );
    let out = Command::new(BIN)
        .args(["run", "--config-dir"])
        .arg(&config_dir)
        .arg("--storage-dir")
        .arg(&storage)
        .args(["--settings", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("graph.nats-token-file ") && stderr.contains("missing-token: cannot read"),
        "{stderr}"
    );
}

/// `verwalter graph builds ...` on `storage`: (exit code, stdout, stderr).
fn builds(args: &[&str], storage: &Path) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(["graph", "builds"])
        .args(args)
        .arg("--storage-dir")
        .arg(storage)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_list_show_and_prune_on_a_real_run_with_component_log_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(tmp.path());
    let storage = tmp.path().join("g");
    let executor = Executor::start(&nats.url(), &storage, 60.0, &tmp.path().join("x.log"));
    let client = Client::connect(&nats.url()).await;

    // d1 runs through (network, two instances, a load balancer); d2 keeps a component running.
    client.publish("build.create", &two_instances("d1")).await;
    for id in ["network::web", "instance::web-1", "instance::web-2"] {
        let dispatch = client.wait(1, id, dispatch_of("d1", id)).await.remove(0);
        // web-2 fails after web-1 is done: the build ends in one error.
        let errored = id == "instance::web-2";
        client.answer(&dispatch, errored, outputs(id)).await;
        if errored {
            break;
        }
    }
    let result = client.wait(1, "d1's result", result_of("d1")).await;
    assert_eq!(result[0].0, "build.create.error");
    executor.wait_log("Build d1 finished: error", 1);
    client.publish("build.create", &two_instances("d2")).await;
    client
        .wait(1, "d2's network", dispatch_of("d2", "network::web"))
        .await;
    executor.wait_log("Component dispatched.", 4);

    // One line per component: dispatched, done or error, with the duration.
    let logs = executor.logs();
    let line = |what: &str, component: &str| {
        logs.lines()
            .find(|l| l.contains(what) && l.contains(&format!("component={component}")))
            .unwrap_or_else(|| panic!("no {what} of {component}:\n{logs}"))
            .to_string()
    };
    let dispatched = line("Component dispatched.", "instance::web-1");
    assert!(
        dispatched.contains("INFO") && dispatched.contains("build=d1"),
        "{dispatched}"
    );
    assert!(
        dispatched.contains("subject=instance.create.fake"),
        "{dispatched}"
    );
    assert!(dispatched.contains("timeout_s=60"), "{dispatched}");
    let done = line("Component done.", "network::web");
    assert!(
        done.contains("INFO") && done.contains("result=\"done\""),
        "{done}"
    );
    assert!(done.contains("duration_s="), "{done}");
    let error = line("Component error.", "instance::web-2");
    assert!(error.contains("duration_s="), "{error}");

    // list: both, d1 finished with its result sent, d2 running.
    let (code, out, err) = builds(&["list"], &storage);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(
        rows[0],
        ["ID", "SUBJECT", "RESULT", "RECEIVED", "FINISHED", "CHANGES"]
    );
    assert_eq!(rows.len(), 3, "{out}");
    assert_eq!(&rows[1][..3], ["d1", "build.create", "error (sent)"]);
    assert_eq!(rows[1][5], "waiting=1,completed=2,errored=1", "{out}");
    assert_eq!(&rows[2][..3], ["d2", "build.create", "running"]);
    assert_eq!(rows[2][4], "-");
    let (code, out, _) = builds(&["list", "--json"], &storage);
    assert_eq!(code, 0);
    let first: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["id"], "d1");
    assert_eq!(first["sent"], "sent");
    assert!(first["finished_ms"].as_u64().unwrap() >= first["received_ms"].as_u64().unwrap());

    // show: the stored build with its summary.
    let (code, out, err) = builds(&["show", "d1"], &storage);
    assert_eq!(code, 0, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["summary"]["state"], "error");
    assert_eq!(shown["build"]["id"], "d1");
    assert!(
        shown["result"]["error"]
            .as_str()
            .unwrap()
            .contains("instance::web-2")
    );
    assert!(shown["file"].as_str().unwrap().ends_with("b-d1.json"));
    let (code, _, err) = builds(&["show", "nope"], &storage);
    assert_eq!(code, 1);
    assert!(err.contains("no build \"nope\""), "{err}");

    // prune: d1 finished just now, so a day keeps it; 0s removes it, never the running d2.
    let (code, out, _) = builds(&["prune", "--older-than", "1d"], &storage);
    assert_eq!(code, 0);
    assert!(out.ends_with("0 build(s) removed\n"), "{out}");
    let (code, out, _) = builds(&["prune", "--older-than", "0s", "--dry-run"], &storage);
    assert_eq!(code, 0);
    assert!(out.starts_with("would remove\td1\t"), "{out}");
    assert!(storage.join("b-d1.json").is_file());
    let (code, out, _) = builds(&["prune", "--older-than", "0s"], &storage);
    assert_eq!(code, 0);
    assert!(out.starts_with("removed\td1\t"), "{out}");
    assert!(out.ends_with("1 build(s) removed\n"), "{out}");
    assert!(!storage.join("b-d1.json").exists());
    assert!(!storage.join("b-d1.journal").exists());
    assert!(storage.join("b-d2.json").is_file());
    let (_, out, _) = builds(&["list"], &storage);
    assert_eq!(out.lines().count(), 2, "{out}");
    let (code, _, err) = builds(&["prune", "--older-than", "7w"], &storage);
    assert_eq!(code, 2, "a usage error: {err}");
    assert!(err.contains("the unit is s, m, h or d"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_removes_finished_builds_and_keeps_running_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(tmp.path());
    let storage = tmp.path().join("g");
    let executor = Executor::start_with(
        &nats.url(),
        &storage,
        60.0,
        &tmp.path().join("x.log"),
        &["--retention", "0s"],
    );
    let client = Client::connect(&nats.url()).await;
    // r2 runs first (its network never answers), then r1 finishes.
    client.publish("build.create", &two_instances("r2")).await;
    client
        .wait(1, "r2's network", dispatch_of("r2", "network::web"))
        .await;
    assert!(storage.join("b-r2.json").is_file());
    client.publish("build.create", &empty_build("r1")).await;
    client.wait(1, "r1's result", result_of("r1")).await;
    // The sweep that removed r1 saw r2's file, which was there before r1 finished.
    executor.wait_log("Finished build's files removed: past the retention.", 1);
    let logs = executor.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("Finished build's files removed"))
        .unwrap();
    assert!(line.contains("build=r1"), "{line}");
    assert!(!storage.join("b-r1.json").exists());
    assert!(!storage.join("b-r1.journal").exists());
    assert!(storage.join("b-r2.json").is_file());
}

/// A JWT (nats-jwt v2's form) with `claims`, signed by `issuer`.
fn jwt(issuer: &nkeys::KeyPair, claims: Value) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
    let signed = format!("{header}.{body}");
    let signature = URL_SAFE_NO_PAD.encode(issuer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{signature}")
}

/// Claims of `subject` issued by `issuer`, with `nats` as the NATS part.
fn claims(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: Value) -> Value {
    json!({
        "jti": format!("{}{}", name.to_uppercase(), "A".repeat(40)),
        "iat": 1_700_000_000u64,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creds_file_on_a_server_in_operator_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // An operator, an account it signs and a user the account signs, as `nsc` makes them.
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = jwt(
        &operator,
        claims(
            &operator,
            &operator.public_key(),
            "op",
            json!({"type": "operator", "version": 2}),
        ),
    );
    let unlimited = json!({"subs": -1, "data": -1, "payload": -1, "imports": -1,
        "exports": -1, "wildcards": true, "conn": -1, "leaf": -1});
    let account_jwt = jwt(
        &operator,
        claims(
            &operator,
            &account.public_key(),
            "acc",
            json!({"limits": unlimited, "default_permissions": {"pub": {}, "sub": {}},
                   "type": "account", "version": 2}),
        ),
    );
    let user_jwt = jwt(
        &account,
        claims(
            &account,
            &user.public_key(),
            "u",
            json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
                   "type": "user", "version": 2}),
        ),
    );
    let nats = nats_with(
        dir,
        &format!(
            "operator: {operator_jwt}\nresolver: MEMORY\nresolver_preload: {{\n  {}: {account_jwt}\n}}\n",
            account.public_key()
        ),
    );
    let seed = user.seed().unwrap();
    let creds = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    );
    let creds_file = write(dir, "user.creds", &creds);
    let executor = Executor::start_with(
        &nats.url(),
        &dir.join("g"),
        60.0,
        &dir.join("creds.log"),
        &["--nats-creds-file", creds_file.to_str().unwrap()],
    );
    executor.wait_log("Graph executor connected to NATS.", 1);
    let client = async_nats::ConnectOptions::with_credentials(&creds)
        .unwrap()
        .connect(nats.url())
        .await
        .unwrap();
    assert_eq!(round_trip(&client, "creds-1").await, "build.create.done");
    assert!(!executor.logs().contains(&seed));

    // Without credentials the server refuses, and the error says where they go.
    let text = executor_log_until(
        dir,
        "none",
        &["--nats-url", &nats.url()],
        "Graph executor cannot connect to NATS",
    );
    assert!(text.contains("--nats-creds-file"), "{text}");
}
