//! A single node on a temp copy of `examples/minimal`, driven over HTTP.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

const SOON: Duration = Duration::from_secs(10);

/// Writes `runtime/web/v3.yaml` with `instances`, waits for the schedule with web at v3 (panics
/// with `what` if none comes) and checks that it puts that many instances on alpha.
fn deploy_web_v3(daemon: &Daemon, config: &Path, instances: u64, what: &str) -> Value {
    let text = format!("image: web.v3\ninstances: {instances}\n");
    std::fs::write(config.join("runtime/web/v3.yaml"), text).unwrap();
    let schedule = daemon.wait_json(SOON, "/v1/schedule", what, |s| {
        s["data"]["roles"]["web"]["version"] == "v3"
    });
    let alpha = &schedule["data"]["nodes"]["alpha"]["roles"]["web"];
    assert_eq!(alpha["instances"], instances, "{schedule}");
    schedule
}

#[test]
fn single_node_schedules_follows_edits_and_keeps_the_last_good_schedule() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);

    // A node without peers leads itself and schedules.
    let first = daemon.wait_json(SOON, "/v1/schedule", "no schedule", |_| true);
    assert_eq!(
        first["data"]["nodes"]["alpha"]["roles"]["web"]["instances"],
        2
    );
    assert_eq!(first["origin"], MACHINE_ID);
    let status = daemon.json("/v1/status").unwrap();
    assert_eq!(status["election_state"]["is_leader"], true);
    assert_eq!(status["leader"]["name"], "alpha.test");
    assert_eq!(status["schedule_id"], first["hash"]);
    assert_eq!(status["num_errors"], 0);
    let input = daemon.json("/v1/scheduler_input").unwrap();
    assert_eq!(input["current_host"], "alpha");
    assert_eq!(input["runtime"]["web"]["v2"]["instances"], 2);

    // A new runtime file gives a new schedule without a restart.
    let second = deploy_web_v3(&daemon, &config, 3, "edit not picked up");

    // A bad runtime file is reported with its path; the rest is still used.
    std::fs::write(config.join("runtime/cache/v2.yaml"), "image: [oops\n").unwrap();
    let status = daemon.wait_json(SOON, "/v1/status", "bad file not reported", |s| {
        s["errors"].get("runtime/cache/v2.yaml").is_some()
    });
    assert!(
        status["errors"]["runtime/cache/v2.yaml"]
            .as_str()
            .unwrap()
            .starts_with("line ")
    );
    std::fs::remove_file(config.join("runtime/cache/v2.yaml")).unwrap();

    // A broken scheduler: the error shows, the last good schedule stays.
    std::fs::write(
        config.join("scheduler/v1/main.lua"),
        "return {scheduler = function(state)\n  error('no capacity for web')\nend}\n",
    )
    .unwrap();
    let status = daemon.wait_json(SOON, "/v1/status", "scheduler error not shown", |s| {
        s["errors"].get("scheduler").is_some()
    });
    let message = status["errors"]["scheduler"].as_str().unwrap();
    assert!(
        message.contains("scheduler/v1/main.lua:2: no capacity for web"),
        "{message}"
    );
    assert_eq!(status["schedule_id"], second["hash"]);
    assert_eq!(daemon.json("/v1/schedule").unwrap()["hash"], second["hash"]);
    let (code, debug) = daemon.get("/v1/scheduler_debug_info").unwrap();
    assert_eq!(code, 200);
    assert!(debug.contains("no capacity for web"));
    let (_, metrics) = daemon.get("/metrics").unwrap();
    assert!(
        metrics.contains("verwalter_scheduler_failures_total{reason=\"runtime\"}"),
        "{metrics}"
    );

    // The HTTP API answers while a runaway script burns its whole time budget.
    std::fs::write(
        config.join("scheduler/v1/main.lua"),
        "return {scheduler = function() while true do end end}\n",
    )
    .unwrap();
    let status = daemon.wait_json(SOON, "/v1/status", "timeout not reported", |s| {
        s["errors"]["scheduler"]
            .as_str()
            .is_some_and(|m| m.contains("time budget"))
    });
    assert_eq!(status["schedule_id"], second["hash"]);

    // SIGTERM stops it cleanly; a restart serves the persisted schedule even though the
    // scheduler is still broken.
    assert!(daemon.terminate().success());
    let saved: Value = serde_json::from_str(
        &std::fs::read_to_string(storage.join("schedule/schedule.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(saved["hash"], second["hash"]);
    let daemon = Daemon::start(&config, &storage);
    let restored = daemon.wait_json(SOON, "/v1/schedule", "no schedule after restart", |_| true);
    assert_eq!(restored["hash"], second["hash"]);
}

/// Reads server-sent events from `stream` (adding to `buf`) until one satisfies `want`; all
/// events so far, as JSON.
fn read_events_until(
    stream: &mut std::net::TcpStream,
    buf: &mut Vec<u8>,
    want: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    use std::io::Read;
    let mut chunk = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(buf).to_string();
        let events: Vec<Value> = text
            .split("\n\n")
            .filter(|block| block.contains("event: status"))
            .filter_map(|block| {
                let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
                serde_json::from_str(data).ok()
            })
            .collect();
        if events.iter().any(&want) {
            return events;
        }
        let n = stream
            .read(&mut chunk)
            .expect("an event within the read timeout");
        assert!(n > 0, "the stream ended");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn the_event_stream_sends_the_status_and_each_change() {
    use std::io::Write;
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let first = wait_for(SOON, || daemon.json("/v1/schedule")).expect("a schedule");
    wait_for(SOON, || {
        (daemon.json("/v1/status")?["schedule_id"] == first["hash"]).then_some(())
    })
    .unwrap();

    let mut stream = std::net::TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    // Shorter than the scheduler's 10 s period: an event must come from the change itself.
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    // HTTP/1.0: the body comes unchunked, so events are not split by chunk headers.
    write!(stream, "GET /v1/events HTTP/1.0\r\nHost: verwalter\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let events = read_events_until(&mut stream, &mut buf, |_| true);
    assert_eq!(events[0]["schedule_id"], first["hash"]);
    assert_eq!(events[0]["election_state"]["is_leader"], true);

    // A runtime edit gives a new schedule, and the stream says so without being asked.
    std::fs::write(
        config.join("runtime/web/v7.yaml"),
        "image: web.v7\ninstances: 1\n",
    )
    .unwrap();
    let target = wait_for(SOON, || {
        let s = daemon.json("/v1/schedule")?;
        (s["data"]["roles"]["web"]["version"] == "v7").then(|| s["hash"].clone())
    })
    .expect("the new schedule");
    let events = read_events_until(&mut stream, &mut buf, |e| e["schedule_id"] == target);
    assert!(events.len() >= 2, "{events:?}");
}

/// Sets the soft limit on open files of process `pid` (with util-linux `prlimit`).
fn set_open_files_limit(pid: u32, soft: usize) {
    let status = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={soft}:"))
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(status.success(), "prlimit --nofile={soft}: failed");
}

#[test]
fn a_node_out_of_descriptors_keeps_its_inputs_and_shows_the_failure() {
    let (tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let first = daemon.wait_json(SOON, "/v1/schedule", "no schedule", |_| true);
    assert_eq!(first["data"]["roles"]["web"]["version"], "v2");
    daemon.wait_json(SOON, "/v1/status", "no deployment", |s| {
        !s["last_deployment"]["finished"].is_null()
    });

    // Starve the daemon as 1,100 idle connections did in the issue: with a soft limit of 3, every
    // new descriptor (numbered 3 or more: 0, 1 and 2 are open) fails with EMFILE, while the ones
    // it has keep working.
    let pid = daemon.child.id();
    set_open_files_limit(pid, 3);
    // One change (a rename is one event), so one read, which fails.
    let staged = tmp.path().join("v3.yaml");
    std::fs::write(&staged, "image: web.v3\ninstances: 3\n").unwrap();
    std::fs::rename(&staged, config.join("runtime/web/v3.yaml")).unwrap();
    let logged = wait_for(SOON, || {
        let logs = daemon.logs();
        logs.contains("Cannot read the config dir; keeping the last good inputs.")
            .then_some(logs)
    });
    set_open_files_limit(pid, 1024);
    let logs = logged.unwrap_or_else(|| panic!("no read failure logged:\n{}", daemon.logs()));
    assert!(logs.contains("Too many open files"), "{logs}");

    // The failure is shown, and the schedule still has its roles: the scheduler never saw the
    // empty tree the failed read would have given.
    let status = daemon.wait_json(SOON, "/v1/status", "no status", |_| true);
    let error = status["errors"]["runtime"].as_str().unwrap_or_default();
    assert!(error.contains("Too many open files"), "{status}");
    let schedule = daemon.json("/v1/schedule").unwrap();
    assert_eq!(schedule["data"]["roles"]["web"]["version"], "v2");
    let input = daemon.json("/v1/scheduler_input").unwrap();
    assert_eq!(input["runtime"]["web"]["v2"]["instances"], 2);

    // With descriptors back, the next change is read as usual and the failure goes.
    deploy_web_v3(&daemon, &config, 4, "not read after recovery");
    // (Roles that failed to render while starved retry on their own; only the inputs are ours.)
    let status = daemon.json("/v1/status").unwrap();
    assert!(status["errors"].get("runtime").is_none(), "{status}");
    assert_eq!(status["metrics"]["input_errors"], 0, "{status}");
    assert!(daemon.logs().contains("The config dir is readable again."));
}

#[test]
fn idle_connections_cannot_starve_the_api_under_a_low_descriptor_limit() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    const IDLE_TIMEOUT: Duration = Duration::from_millis(1500);
    let (tmp, config, storage) = example_site("minimal");
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(
        &settings,
        format!(
            "http:\n  max-connections: 1000\n  idle-timeout-ms: {}\n",
            IDLE_TIMEOUT.as_millis()
        ),
    )
    .unwrap();
    // A soft limit under the hard one, as systemd sets them: the daemon raises it to 128 and
    // keeps half of that for connections.
    let daemon = Daemon::launch_under(
        &config,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
        Some((64, 128)),
    );
    let logs = daemon.logs();
    assert!(
        logs.contains("Raised the open file limit. nofile=128 was=64"),
        "{logs}"
    );
    assert!(logs.contains("max_connections=64"), "{logs}");
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |_| true);

    // More connections that send nothing than the cap, and than the daemon has descriptors;
    // the last one sends half a request head and stops.
    let mut idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(("127.0.0.1", daemon.port)).unwrap())
        .collect();
    write!(
        idle.last_mut().unwrap(),
        "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    )
    .unwrap();
    let opened = Instant::now();

    // The API still answers, by closing the oldest idle connections to make room.
    let status = daemon.wait_json(SOON, "/v1/status", "/v1/status does not answer", |_| true);
    assert_eq!(status["election_state"]["is_leader"], true);
    let evicted = metric(
        daemon.port,
        "verwalter_http_connections_closed_total{reason=\"evicted\"}",
    )
    .unwrap();
    assert!(evicted >= 136.0, "{evicted} evicted");

    // Every idle connection is closed by the daemon: the rest after the idle timeout.
    let deadline = opened + Duration::from_secs(30);
    let mut last_closed = opened;
    for (i, stream) in idle.iter_mut().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("connection {i} is still open: {other:?}\n{}", daemon.logs()),
        }
        last_closed = Instant::now();
    }
    assert!(
        last_closed - opened >= IDLE_TIMEOUT - Duration::from_millis(200),
        "the last connections went after {:?}, before the idle timeout",
        last_closed - opened
    );
    let open = wait_for(SOON, || {
        metric(daemon.port, "verwalter_http_connections").filter(|n| *n <= 1.0)
    });
    assert!(open.is_some(), "connections still counted open");
}

#[test]
fn request_bodies_that_never_come_do_not_hold_connections() {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    let (tmp, config, storage) = example_site("minimal");
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(
        &settings,
        "http:\n  max-connections: 8\n  idle-timeout-ms: 1000\n",
    )
    .unwrap();
    let daemon = Daemon::launch(
        &config,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    daemon.wait_json(SOON, "/v1/status", "no status", |_| true);

    // Busy connections (a request in progress) are not evicted; these promise a body and send
    // none, which used to hold them for ever.
    let mut stalled: Vec<TcpStream> = (0..6)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
            write!(
                stream,
                "POST /v1/action HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            )
            .unwrap();
            stream
        })
        .collect();
    for (i, stream) in stalled.iter_mut().enumerate() {
        stream.set_read_timeout(Some(SOON)).unwrap();
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .unwrap_or_else(|e| panic!("connection {i}: {e}\n{}", daemon.logs()));
        assert!(
            answer.starts_with("HTTP/1.1 408 "),
            "connection {i}: {answer}"
        );
    }
    assert!(daemon.json("/v1/status").is_some());
}

/// verwalter 0.13's unit files pass `--log-id`, and some `--use-sudo`: the first starts every
/// log line with the machine id, the second is taken and said to be ignored.
#[test]
fn the_flags_of_0_13_units_are_taken() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::launch(&config, &storage, &["--log-id", "--use-sudo"], &[]);
    daemon.wait_json(
        Duration::from_secs(30),
        "/v1/schedule",
        "no schedule",
        |_| true,
    );
    let logs = daemon.logs();
    assert!(logs.contains("--use-sudo is ignored"), "{logs}");
    for line in logs.lines() {
        assert!(
            line.starts_with(MACHINE_ID),
            "a line without the id: {line}"
        );
    }
}

/// Runtime links that never resolve (`a -> b`, `b -> a`, `x -> x`) are left out with an error
/// each, like a dangling link: a fresh node schedules from the rest of the tree, shows the errors
/// in `/v1/status`, and takes later changes (the loops used to fail the whole read, so the node
/// never scheduled and later edits were never seen).
#[test]
fn runtime_links_that_lead_round_are_left_out_and_scheduling_goes_on() {
    let (_tmp, config, storage) = example_site("minimal");
    let web = config.join("runtime/web");
    std::os::unix::fs::symlink("b", web.join("a")).unwrap();
    std::os::unix::fs::symlink("a", web.join("b")).unwrap();
    std::os::unix::fs::symlink("x.yaml", web.join("x.yaml")).unwrap();
    let daemon = Daemon::start(&config, &storage);
    let first = daemon.wait_json(SOON, "/v1/schedule", "no schedule with the loops", |_| true);
    assert_eq!(first["data"]["roles"]["web"]["version"], "v2");
    let status = daemon.wait_json(SOON, "/v1/status", "loops not shown", |s| {
        ["runtime/web/a", "runtime/web/b", "runtime/web/x.yaml"]
            .iter()
            .all(|path| s["errors"].get(*path).is_some())
    });
    let message = status["errors"]["runtime/web/x.yaml"].as_str().unwrap();
    assert!(
        message.starts_with("symlink loop: x.yaml never resolves"),
        "{status}"
    );
    assert!(
        status["errors"].get("runtime").is_none(),
        "a complete read: {status}"
    );
    // A later change is read and scheduled, the loops still there.
    deploy_web_v3(
        &daemon,
        &config,
        3,
        "a change next to the loops not scheduled",
    );
}

/// The gunzipped backups in `storage/backups/`, by name.
fn backups(storage: &Path) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let Ok(entries) = std::fs::read_dir(storage.join("backups")) else {
        return Vec::new();
    };
    let mut all: Vec<(String, Vec<u8>)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let mut bytes = Vec::new();
            flate2::read::GzDecoder::new(std::fs::File::open(e.path()).ok()?)
                .read_to_end(&mut bytes)
                .ok()?;
            Some((name, bytes))
        })
        .collect();
    all.sort();
    all
}

/// The attack: `schedule/schedule.json` a symlink to a file outside the storage dir.
/// The daemon does not read it (an error naming it), schedules, and replaces the link with its
/// own file at the first write; after several schedule changes the outside file is as it was
/// and no backup holds its bytes (they used to be gzipped into `backups/`, and later writes
/// went through the link, overwriting the file with schedule JSON).
#[test]
fn a_symlink_as_the_stored_schedule_is_replaced_never_written_through() {
    let (tmp, config, storage) = example_site("minimal");
    let outside = tmp.path().join("outside.conf");
    let precious = "# another program's file\nkey = value\n";
    std::fs::write(&outside, precious).unwrap();
    let schedule = storage.join("schedule/schedule.json");
    std::fs::create_dir_all(schedule.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&outside, &schedule).unwrap();

    let daemon = Daemon::start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |_| true);
    for version in ["v3", "v4", "v5"] {
        let text = format!("image: web.{version}\ninstances: 2\n");
        replace_file(&config.join(format!("runtime/web/{version}.yaml")), &text);
        daemon.wait_json(SOON, "/v1/schedule", "a change not scheduled", |s| {
            s["data"]["roles"]["web"]["version"] == version
        });
    }
    let served = daemon.json("/v1/schedule").unwrap();
    // The stored file is the daemon's own, with the schedule in force (written after the change).
    let stored = wait_for(SOON, || {
        let meta = std::fs::symlink_metadata(&schedule).ok()?;
        let text = std::fs::read_to_string(&schedule).ok()?;
        let value: Value = serde_json::from_str(&text).ok()?;
        (meta.is_file() && value["hash"] == served["hash"]).then_some(value)
    })
    .unwrap_or_else(|| panic!("the schedule is not stored:\n{}", daemon.logs()));
    assert_eq!(stored["data"]["roles"]["web"]["version"], "v5");
    // The backups taken (at start, then once the link was gone) hold schedules only.
    let taken = wait_for(SOON, || {
        let all = backups(&storage);
        (!all.is_empty()).then_some(all)
    })
    .unwrap_or_else(|| panic!("no backup taken:\n{}", daemon.logs()));
    for (name, bytes) in &taken {
        let value: Value = serde_json::from_slice(bytes).unwrap_or_else(|_| {
            panic!(
                "{name} is no schedule: {:?}",
                String::from_utf8_lossy(bytes)
            )
        });
        assert!(value["hash"].is_string(), "{name}");
    }
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), precious);
    let logs = daemon.logs();
    assert!(
        logs.contains("Cannot use the stored schedule; starting without one.")
            && logs.contains(
                "schedule/schedule.json: cannot read: a symbolic link, not a regular file; refused"
            ),
        "{logs}"
    );
    assert!(
        logs.contains("Replacing what is in the place of the stored schedule"),
        "{logs}"
    );
    drop(daemon);
    // Nothing under a temp name links out either.
    for entry in std::fs::read_dir(schedule.parent().unwrap())
        .unwrap()
        .flatten()
    {
        let meta = entry.path().symlink_metadata().unwrap();
        assert!(meta.is_file(), "{}", entry.path().display());
    }
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), precious);
}

/// A FIFO as the stored schedule does not block the start (it used to hang in `open()` before
/// the daemon listened): refused with its path like an unreadable schedule, the node starts
/// without one, schedules, and its first write replaces the FIFO.
#[test]
fn a_fifo_as_the_stored_schedule_does_not_block_the_start() {
    let (_tmp, config, storage) = example_site("minimal");
    let schedule = storage.join("schedule/schedule.json");
    std::fs::create_dir_all(schedule.parent().unwrap()).unwrap();
    nix::unistd::mkfifo(&schedule, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let daemon = Daemon::start(&config, &storage);
    let first = daemon.wait_json(SOON, "/v1/schedule", "no schedule", |_| true);
    let logs = daemon.logs();
    assert!(
        logs.contains("schedule/schedule.json: cannot read: a FIFO, not a regular file; refused"),
        "{logs}"
    );
    wait_for(SOON, || {
        let text = std::fs::read_to_string(&schedule).ok()?;
        let value: Value = serde_json::from_str(&text).ok()?;
        (value["hash"] == first["hash"]).then_some(())
    })
    .unwrap_or_else(|| panic!("the FIFO was not replaced:\n{}", daemon.logs()));
}
