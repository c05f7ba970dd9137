//! Helpers: temp copies of examples, a child daemon that is killed on drop, a tiny HTTP client.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_verwalter");
pub const MACHINE_ID: &str = "77985419c732412ea38b94db00000001";

pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

/// Copies a directory tree (examples are copied so tests can edit them).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A temp dir holding `config/`, a copy of example `name`, and room for `storage/`; the paths of
/// both. The dir goes when the `TempDir` is dropped.
pub fn example_site(name: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config");
    copy_tree(&example(name), &config);
    let storage = tmp.path().join("storage");
    (tmp, config, storage)
}

/// Points `command` (a `verwalter run`) at `config_dir`, and at `storage_dir` for its storage
/// and its logs (`log/` in it), with `RUST_LOG=info`, stdout dropped and stderr written to `log`.
pub fn with_dirs<'a>(
    command: &'a mut Command,
    config_dir: &Path,
    storage_dir: &Path,
    log: &Path,
) -> &'a mut Command {
    command
        .arg("--config-dir")
        .arg(config_dir)
        .arg("--storage-dir")
        .arg(storage_dir)
        .arg("--log-dir")
        .arg(storage_dir.join("log"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
}

/// Node `n` of a test cluster in `dir`: `verwalter run` (see [`with_dirs`]) on `config{n}`, a
/// fresh copy of `examples/minimal`, with `storage{n}` and the log `node{n}.log`, to which the
/// caller adds the node's name, address and peers. The command and the log's path.
pub fn cluster_node(dir: &Path, n: usize) -> (Command, PathBuf) {
    let config = dir.join(format!("config{n}"));
    copy_tree(&example("minimal"), &config);
    let log = dir.join(format!("node{n}.log"));
    let mut command = Command::new(BIN);
    command.arg("run");
    with_dirs(
        &mut command,
        &config,
        &dir.join(format!("storage{n}")),
        &log,
    );
    (command, log)
}

/// The lines of the deployment log's index under `log_dir` (`[time, deployment_id, pointer,
/// marker]` each); none while there is no index yet.
pub fn deployment_index(log_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log_dir.join(".index/latest"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The first fenced block of `lang` (```` ```json ````) after the line `heading` in
/// `docs/<doc>`, read at test time, so that a test runs the docs' example exactly as written.
pub fn doc_block(doc: &str, heading: &str, lang: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join(doc);
    let text = std::fs::read_to_string(&path).unwrap();
    let (_, after) = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{}: no heading {heading:?}", path.display()));
    let (_, block) = after
        .split_once(&format!("```{lang}\n"))
        .unwrap_or_else(|| panic!("{}: no ```{lang} block after {heading:?}", path.display()));
    block.split_once("```").unwrap().0.to_string()
}

/// Writes `text` to `path` the way a deploy tool should: complete under another name, then
/// renamed into place (so the daemon never reads half a file); makes the parent dirs.
pub fn replace_file(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

/// A running daemon; killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Daemon {
    /// `verwalter run` on `config_dir` as node `alpha` on 127.0.0.1, on a port the system picks.
    pub fn start(config_dir: &Path, storage_dir: &Path) -> Daemon {
        Daemon::launch(config_dir, storage_dir, &[], &[])
    }

    /// Like [`Daemon::start`], with extra environment variables for the daemon (and so for the
    /// commands it runs), e.g. `PATH`.
    pub fn start_with(config_dir: &Path, storage_dir: &Path, envs: &[(&str, &str)]) -> Daemon {
        Daemon::launch(config_dir, storage_dir, &[], envs)
    }

    /// `verwalter run` as node `alpha` on 127.0.0.1 with `--port 0`, logs under `storage_dir`,
    /// with extra flags and environment variables. The system picks a free port, read back from
    /// the daemon's `Listening.` log line: no window in which another process takes it.
    pub fn launch(
        config_dir: &Path,
        storage_dir: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Daemon {
        Daemon::launch_under(config_dir, storage_dir, args, envs, None)
    }

    /// [`Daemon::launch`] under a descriptor limit: `(soft, hard)` for RLIMIT_NOFILE, set by
    /// the shell that execs the daemon.
    pub fn launch_under(
        config_dir: &Path,
        storage_dir: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
        nofile: Option<(u64, u64)>,
    ) -> Daemon {
        let command = match nofile {
            Some((soft, hard)) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!(
                        "ulimit -Sn {soft} && ulimit -Hn {hard} && exec \"$0\" \"$@\""
                    ))
                    .arg(BIN);
                sh
            }
            None => Command::new(BIN),
        };
        Daemon::spawn(command, config_dir, storage_dir, args, envs)
    }

    /// [`Daemon::launch`] with `command` as the program that runs the daemon (`BIN`, or a shell
    /// that sets something up and execs `BIN` with its arguments).
    pub fn spawn(
        mut command: Command,
        config_dir: &Path,
        storage_dir: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Daemon {
        let log = storage_dir.with_extension("log");
        command.args([
            "run",
            "--hostname",
            "alpha",
            "--name",
            "alpha.test",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--override-machine-id",
            MACHINE_ID,
        ]);
        let child = with_dirs(&mut command, config_dir, storage_dir, &log)
            .args(args)
            .envs(envs.iter().copied())
            .spawn()
            .unwrap();
        let mut daemon = Daemon {
            child,
            port: 0,
            log,
        };
        let port = wait_for(Duration::from_secs(30), || {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("the daemon exited ({status}):\n{}", daemon.logs());
            }
            listening_port(&daemon.logs())
        });
        daemon.port = port.unwrap_or_else(|| panic!("no Listening line:\n{}", daemon.logs()));
        daemon
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    pub fn json(&self, path: &str) -> Option<serde_json::Value> {
        match self.get(path) {
            Some((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    /// Polls GET `path` until it answers JSON that satisfies `ready`, and returns that; past
    /// `timeout`, panics with `what` and the daemon's log.
    pub fn wait_json(
        &self,
        timeout: Duration,
        path: &str,
        what: &str,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_for(timeout, || self.json(path).filter(&ready))
            .unwrap_or_else(|| panic!("{what}:\n{}", self.logs()))
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let status = terminate_child(&mut self.child);
        std::mem::forget(self);
        status
    }
}

/// Sends `child` SIGTERM (as an operator stops the daemon) and waits for its exit status.
pub fn terminate_child(child: &mut std::process::Child) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    wait_for(Duration::from_secs(10), || child.try_wait().unwrap()).expect("exits on SIGTERM")
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The port of the daemon's `Listening. addr=<ip>:<port>` log line.
pub fn listening_port(log: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains("Listening."))?;
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))?;
    addr.rsplit(':').next()?.parse().ok()
}

/// HTTP/1.0 GET on 127.0.0.1; `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_at("127.0.0.1", port, path)
}

/// HTTP/1.0 GET on `host:port`; `None` when nothing answers.
pub fn http_get_at(host: &str, port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect((host, port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: verwalter\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// Polls `probe` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The binary `name` of the workspace's package `package` (built from `source`): the examples'
/// stand-ins, e.g. the cantal test double (`fake-cantal`), are crates of their own so that they
/// build without the daemon's dev-dependencies. `<target>/<profile>/<name>`, beside the `deps/`
/// dir this test executable runs from. `cargo test --test tests` does not build other packages;
/// so when the binary is missing or older than its source, it is built here with the cargo that
/// runs the tests (`CARGO`), for the same profile and target dir.
pub fn package_binary(package: &str, name: &str, source: &Path) -> PathBuf {
    let what = ["-p", package, "--bin", name];
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from <target>/<profile>/deps")
        .to_path_buf();
    let bin = profile_dir.join(name);
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale = match (modified(&bin), modified(source)) {
        (Some(built), Some(written)) => built < written,
        _ => true,
    };
    if stale {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| {
            panic!(
                "{} is missing and CARGO is not set: run `cargo build {}`",
                bin.display(),
                what.join(" ")
            )
        });
        let mut build = Command::new(cargo);
        build
            .args(["build", "--quiet"])
            .args(what)
            .arg("--manifest-path")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(profile_dir.parent().unwrap());
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some(profile) => {
                build.args(["--profile", profile]);
            }
        }
        let out = build.output().unwrap();
        assert!(
            out.status.success(),
            "cannot build the {name} example:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        bin.is_file(),
        "{} not found: run `cargo build {}`",
        bin.display(),
        what.join(" ")
    );
    bin
}

/// The value of one Prometheus sample from the daemon's `/metrics`: `series` is the name with
/// its labels as the exposition prints them, e.g. `verwalter_controller_passes_total{controller="render"}`.
/// `None` while the daemon does not answer or has no such series yet.
pub fn metric(port: u16, series: &str) -> Option<f64> {
    let (code, body) = http_get(port, "/metrics")?;
    if code != 200 {
        return None;
    }
    body.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// HTTP/1.0 POST of `body` on 127.0.0.1; the status code (0 when the answer has none) and body.
pub fn http_post(port: u16, path: &str, content_type: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(70))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: verwalter\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_string())
}
