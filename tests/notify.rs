//! The daemon under a stand-in for systemd: a datagram socket as `NOTIFY_SOCKET` and
//! `WATCHDOG_USEC` set, as systemd starts a `Type=notify` unit with `WatchdogSec=`; and the exit
//! status with its one-line cause when the daemon cannot start.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::*;

/// `WatchdogSec=2`: pings are due every second.
const WATCHDOG_USEC: &str = "2000000";
const INTERVAL: Duration = Duration::from_secs(2);

/// The socket the daemon notifies, bound by the test in a temp dir.
struct Manager {
    socket: UnixDatagram,
    path: PathBuf,
    /// Every datagram so far, with when it came.
    seen: Vec<(Instant, String)>,
}

impl Manager {
    fn bind(dir: &Path) -> Manager {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        // A bound on a wait for the next datagram: past it the test fails, it never passes.
        socket
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Manager {
            socket,
            path,
            seen: Vec::new(),
        }
    }

    /// Receives datagrams until one satisfies `wanted` (within 90 s); returns its index in
    /// `seen`.
    fn until(&mut self, daemon: &Daemon, what: &str, wanted: impl Fn(&str) -> bool) -> usize {
        let mut buf = vec![0u8; 4096];
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            assert!(
                Instant::now() < deadline,
                "no {what} in {:?}:\n{}",
                self.seen,
                daemon.logs()
            );
            let n = self.socket.recv(&mut buf).unwrap_or_else(|e| {
                panic!(
                    "no datagram ({e}) while waiting for {what}:\n{}",
                    daemon.logs()
                )
            });
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            self.seen.push((Instant::now(), text));
            if wanted(&self.seen.last().unwrap().1) {
                return self.seen.len() - 1;
            }
        }
    }

    fn pings_in(&self, from: usize, to: usize) -> Vec<Instant> {
        self.seen[from..to]
            .iter()
            .filter(|(_, text)| text.lines().any(|l| l == "WATCHDOG=1"))
            .map(|(at, _)| *at)
            .collect()
    }
}

/// A copy of examples/minimal whose roles run `command` (YAML flow list) after the example's
/// one, with `settings`; the daemon started by a shell that sets `WATCHDOG_PID` to its own pid
/// and execs the daemon, as systemd sets it for the main process.
fn start(
    manager: &Manager,
    config: &Path,
    storage: &Path,
    command: &str,
    settings: &str,
    envs: &[(&str, &str)],
) -> Daemon {
    let render = config.join("templates/minimal/v1/role.render.yaml");
    let text = std::fs::read_to_string(&render).unwrap();
    std::fs::write(&render, format!("{text}- !Cmd {command}\n")).unwrap();
    let settings_file = storage.with_extension("yaml");
    std::fs::write(&settings_file, settings).unwrap();
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" \"$@\"")
        .arg(BIN);
    let mut all = vec![
        ("NOTIFY_SOCKET", manager.path.to_str().unwrap()),
        ("WATCHDOG_USEC", WATCHDOG_USEC),
    ];
    all.extend_from_slice(envs);
    Daemon::spawn(
        sh,
        config,
        storage,
        &["--settings", settings_file.to_str().unwrap()],
        &all,
    )
}

#[test]
fn ready_status_and_pings_while_working_then_stopping_and_commands_do_not_see_the_socket() {
    let (tmp, config, storage) = example_site("minimal");
    let mut manager = Manager::bind(tmp.path());
    let daemon = start(&manager, &config, &storage, "[env]", "{}\n", &[]);

    let ready = manager.until(&daemon, "READY=1", |d| d.contains("READY=1"));
    assert_eq!(ready, 0, "READY comes first: {:?}", manager.seen);
    assert!(
        manager.seen[0].1.contains("\nSTATUS="),
        "{:?}",
        manager.seen
    );
    // The status line follows the node: it leads itself and makes a schedule. On a quick start
    // the schedule is made before READY, whose own STATUS line then names it already.
    let with_schedule = |d: &str| {
        d.lines()
            .find(|l| l.starts_with("STATUS=leader (epoch 1); schedule "))
            .map(str::to_string)
    };
    let status = match with_schedule(&manager.seen[ready].1) {
        Some(_) => ready,
        None => manager.until(&daemon, "a status with the schedule", |d| {
            with_schedule(d).is_some()
        }),
    };
    let line = with_schedule(&manager.seen[status].1).unwrap();
    let hash = daemon.wait_json(Duration::from_secs(10), "/v1/status", "a schedule", |s| {
        s["schedule_id"].is_string()
    })["schedule_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        line,
        format!(
            "STATUS=leader (epoch 1); schedule {}; 0 failing roles",
            &hash[..8]
        )
    );
    // Pings keep coming, each well within the interval of the one before.
    let first = manager.until(&daemon, "a ping", |d| d == "WATCHDOG=1\n");
    let mut last = first;
    for _ in 0..4 {
        last = manager.until(&daemon, "the next ping", |d| d == "WATCHDOG=1\n");
    }
    let pings = manager.pings_in(first, last + 1);
    assert!(pings.len() >= 5);
    for pair in pings.windows(2) {
        assert!(pair[1] - pair[0] < INTERVAL, "{:?}", manager.seen);
    }

    // The apply command printed its environment into the role log: no service manager there.
    let role_log = storage.join("log/web/latest");
    let env = wait_for(Duration::from_secs(10), || {
        std::fs::read_to_string(&role_log)
            .ok()
            .filter(|log| log.contains("PATH="))
    })
    .unwrap_or_else(|| panic!("no env in the role log:\n{}", daemon.logs()));
    for name in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
        assert!(!env.contains(name), "{name} in the command's env:\n{env}");
    }

    let pid = nix::unistd::Pid::from_raw(daemon.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    manager.until(&daemon, "STOPPING=1", |d| d.contains("STOPPING=1"));
    assert!(daemon.terminate().success());
}

#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs the fault switch of debug builds"
)]
fn a_stuck_render_pass_stops_the_pings_and_shows_in_the_status() {
    let (tmp, config, storage) = example_site("minimal");
    let mut manager = Manager::bind(tmp.path());
    // The command outlives its timeout of 1 s; the fault switch of debug builds makes the killed
    // process unreapable, as one in uninterruptible sleep is (see src/render/apply/exec.rs), so the
    // render pass hangs. Its step limit: 1 s + 2 s for the kill + 15 s.
    let daemon = start(
        &manager,
        &config,
        &storage,
        "[sleep, '600']",
        "render:\n  command-timeout-secs: 1\n",
        &[("VERWALTER_TEST_UNKILLABLE", "1")],
    );
    let first = manager.until(&daemon, "a ping", |d| d == "WATCHDOG=1\n");
    let stuck = manager.until(&daemon, "the stall on the status line", |d| {
        d.starts_with("STATUS=") && d.contains("; stuck: render pass")
    });
    assert!(
        manager.seen[stuck].1.contains("past its limit of 18s"),
        "{:?}",
        manager.seen[stuck]
    );
    let before = manager.pings_in(first, stuck);
    assert!(
        before.len() >= 3,
        "pinged while the pass ran within its limit"
    );
    // Four withheld pings (two intervals, each logged) must come after the stall: then stop the
    // daemon, whose STOPPING=1 comes after everything it sent before.
    let withheld = "A controller is stuck; not pinging the watchdog.";
    wait_for(Duration::from_secs(30), || {
        (daemon.logs().matches(withheld).count() >= 4).then_some(())
    })
    .unwrap_or_else(|| panic!("no withheld pings logged:\n{}", daemon.logs()));
    let pid = nix::unistd::Pid::from_raw(daemon.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let stopping = manager.until(&daemon, "STOPPING=1", |d| d.contains("STOPPING=1"));
    assert!(
        manager.pings_in(stuck, stopping).is_empty(),
        "pinged while stuck: {:?}",
        &manager.seen[stuck..]
    );
    let silence = manager.seen[stopping].0 - *before.last().unwrap();
    assert!(silence > INTERVAL, "{silence:?}");
    assert!(daemon.terminate().success());
}

/// Without `WATCHDOG_PID` (a manager or a wrapper that does not set it), the watchdog is the
/// daemon's: libsystemd's rule (`sd_watchdog_enabled`) takes an unset `WATCHDOG_PID` as "any
/// process", so the pings come as with systemd's own variables.
#[test]
fn without_watchdog_pid_the_watchdog_is_still_pinged() {
    let (tmp, config, storage) = example_site("minimal");
    let mut manager = Manager::bind(tmp.path());
    let mut command = Command::new(BIN);
    command.env_remove("WATCHDOG_PID");
    let daemon = Daemon::spawn(
        command,
        &config,
        &storage,
        &[],
        &[
            ("NOTIFY_SOCKET", manager.path.to_str().unwrap()),
            ("WATCHDOG_USEC", WATCHDOG_USEC),
        ],
    );
    manager.until(&daemon, "READY=1", |d| d.contains("READY=1"));
    let first = manager.until(&daemon, "a ping", |d| d == "WATCHDOG=1\n");
    let next = manager.until(&daemon, "the next ping", |d| d == "WATCHDOG=1\n");
    assert_eq!(manager.pings_in(first, next + 1).len(), 2);
    assert!(daemon.terminate().success());
}

/// `verwalter run` with `args` on a fresh storage dir unless given: exit status and stderr.
fn run_daemon(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(BIN)
        .arg("run")
        .args(["--override-machine-id", MACHINE_ID, "--hostname", "alpha"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_settings_error_a_port_in_use_and_an_unusable_storage_dir_exit_3_with_the_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let config = example("minimal");
    let dirs = |storage: &Path| {
        [
            "--config-dir".to_string(),
            config.to_str().unwrap().to_string(),
            "--storage-dir".to_string(),
            storage.to_str().unwrap().to_string(),
            "--log-dir".to_string(),
            tmp.path().join("log").to_str().unwrap().to_string(),
        ]
    };
    let storage = tmp.path().join("storage");
    let with = |extra: &[&str], storage: &Path| {
        let dirs = dirs(storage);
        let mut args: Vec<&str> = dirs.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        run_daemon(&args)
    };

    let settings = tmp.path().join("bad.yaml");
    std::fs::write(&settings, "bogus: 1\n").unwrap();
    let (code, stderr) = with(&["--settings", settings.to_str().unwrap()], &storage);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("unknown field `bogus`"), "{stderr}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let (code, stderr) = with(&["--port", &port], &storage);
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().collect::<Vec<_>>(),
        [format!(
            "verwalter: cannot listen on 127.0.0.1:{port}: Address already in use (os error 98)"
        )]
    );

    // A file where the storage dir should be (a mode 000 dir would not do: the tests run as
    // root in CI, and root reads it).
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let (code, stderr) = with(&["--port", "0"], &file);
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().collect::<Vec<_>>(),
        [format!(
            "verwalter: cannot use the storage dir {}: not a directory",
            file.display()
        )]
    );
}

/// A FIFO, or a link (to `/dev/zero`, or to a file outside the storage dir), as the action
/// journal stops the start at once with exit status 3 and one line naming the path, as an
/// unreadable journal does: a FIFO used to block the daemon in `open()` before it listened,
/// `/dev/zero` grew it until it ran out of memory.
#[test]
fn an_action_journal_that_is_no_regular_file_exits_3_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let config = example("minimal");
    let storage = tmp.path().join("storage");
    std::fs::create_dir_all(&storage).unwrap();
    let journal = storage.join("actions.journal");
    let outside = tmp.path().join("outside");
    std::fs::write(&outside, "{\"add\":1,\"action\":\"x\"}\n").unwrap();
    // What is put in the journal's place: a FIFO, or a link to the path given.
    let cases = [
        ("a FIFO", None),
        ("a symbolic link", Some(Path::new("/dev/zero"))),
        ("a symbolic link", Some(outside.as_path())),
    ];
    for (what, link_to) in cases {
        match link_to {
            None => nix::unistd::mkfifo(&journal, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .unwrap(),
            Some(target) => std::os::unix::fs::symlink(target, &journal).unwrap(),
        }
        let mut child = Command::new(BIN)
            .arg("run")
            .args(["--override-machine-id", MACHINE_ID, "--hostname", "alpha"])
            .arg("--config-dir")
            .arg(&config)
            .arg("--storage-dir")
            .arg(&storage)
            .arg("--log-dir")
            .arg(tmp.path().join("log"))
            .args(["--port", "0"])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_for(Duration::from_secs(30), || child.try_wait().unwrap());
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon did not stop on {what} as the journal");
        }
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "{what}: {stderr}");
        let lines: Vec<&str> = stderr.trim_end().lines().collect();
        assert_eq!(lines.len(), 1, "{what}: {stderr}");
        assert!(
            lines[0].starts_with("verwalter: cannot start the action journal: ")
                && lines[0].contains(&journal.display().to_string())
                && lines[0].contains(&format!("{what}, not a regular file; refused")),
            "{what}: {stderr}"
        );
        std::fs::remove_file(&journal).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "{\"add\":1,\"action\":\"x\"}\n"
    );
}
