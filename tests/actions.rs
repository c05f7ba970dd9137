//! The action API against the built daemon (a single node, so it leads): registering, waiting
//! for the scheduler's answer, request errors, the audit line, and pending actions surviving a
//! restart.

use std::time::Duration;

use serde_json::{Value, json};

use crate::util::*;

const SOON: Duration = Duration::from_secs(15);

/// Answers every action whose `button.reply` is true with `{"echo": button}`.
const SCHEDULER: &str = r#"
return {scheduler = function(state)
  local replies = {}
  for id, action in pairs(state.actions) do
    if action.button and action.button.reply then replies[id] = {echo = action.button} end
  end
  return {actions = replies, nodes = {}}, "ok"
end}
"#;

fn site() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config");
    std::fs::create_dir_all(config.join("scheduler/v1")).unwrap();
    std::fs::create_dir_all(config.join("runtime")).unwrap();
    std::fs::write(config.join("scheduler/v1/main.lua"), SCHEDULER).unwrap();
    let storage = tmp.path().join("storage");
    (tmp, config, storage)
}

#[test]
fn actions_are_answered_checked_audited_and_kept_across_a_restart() {
    let (_tmp, config, storage) = site();
    let daemon = Daemon::start(&config, &storage);
    wait_for(SOON, || daemon.json("/v1/schedule")).expect("a first schedule");
    let port = daemon.port;

    // wait_action returns the scheduler's answer, or 204 without one.
    let (code, body) = http_post(
        port,
        "/v1/wait_action",
        "application/json; charset=utf-8",
        br#"{"button": {"reply": true, "role": "web"}}"#,
    );
    assert_eq!(code, 200, "{body}");
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply, json!({"echo": {"reply": true, "role": "web"}}));
    let (code, body) = http_post(
        port,
        "/v1/wait_action",
        "application/json",
        br#"{"button": {}}"#,
    );
    assert_eq!(code, 204, "{body}");

    // action registers and returns the id; the scheduler consumes it soon.
    let (code, body) = http_post(
        port,
        "/v1/action",
        "application/json",
        br#"{"button": {"x": 1}}"#,
    );
    assert_eq!(code, 200, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["registered"]
        .as_u64()
        .unwrap();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        id / 1000 <= now_s && id / 1000 + 5 >= now_s,
        "id {id} is seconds*1000+n"
    );
    wait_for(SOON, || {
        let pending = daemon.json(&format!("/v1/action_is_pending/{id}"))?;
        (pending["pending"] == false).then_some(())
    })
    .expect("the action was consumed");

    // Request errors are JSON with a clear status.
    let (code, body) = http_post(port, "/v1/action", "text/plain", b"{}");
    assert_eq!(code, 415, "{body}");
    assert!(body.contains("application/json"));
    let (code, body) = http_post(port, "/v1/action", "application/json", b"{not json");
    assert_eq!(code, 400, "{body}");
    let big = format!("{{\"x\": \"{}\"}}", "a".repeat(70_000));
    let (code, _) = http_post(port, "/v1/action", "application/json", big.as_bytes());
    assert_eq!(code, 413);
    let (code, _) = daemon.get("/v1/action_is_pending/abc").unwrap();
    assert_eq!(code, 400);

    // Every action received leaves an audit line with its source and body.
    let global = std::fs::read_to_string(storage.join("log/.global/latest")).unwrap();
    assert!(
        global.contains(&format!("audit: action {id} from 127.0.0.1:")),
        "{global}"
    );
    assert!(global.contains(r#"{"button":{"x":1}}"#), "{global}");

    // With the scheduler broken, an action stays pending, and a restart keeps it.
    std::fs::write(
        config.join("scheduler/v1/main.lua"),
        "return {scheduler = function() error('broken') end}\n",
    )
    .unwrap();
    wait_for(SOON, || {
        let status = daemon.json("/v1/status")?;
        status["errors"].get("scheduler").map(|_| ())
    })
    .expect("the broken scheduler is seen");
    let (code, body) = http_post(port, "/v1/action", "application/json", br#"{"keep": "me"}"#);
    assert_eq!(code, 200, "{body}");
    let kept = serde_json::from_str::<Value>(&body).unwrap()["registered"]
        .as_u64()
        .unwrap();
    assert!(daemon.json("/v1/pending_actions").unwrap()[kept.to_string()].is_object());
    drop(daemon);
    let daemon = Daemon::start(&config, &storage);
    let pending = wait_for(SOON, || daemon.json("/v1/pending_actions"))
        .expect("the daemon answers after the restart");
    assert_eq!(pending[kept.to_string()], json!({"keep": "me"}));
}

/// Actions acknowledged to concurrent clients are on disk: all survive a kill -9. Past the cap
/// (`actions.max-pending`) an action is refused with 503 and a message. Temp files a crash left
/// in the storage dir are removed at start; the journal is private.
#[test]
fn acknowledged_actions_survive_a_kill_and_the_queue_is_capped() {
    use std::os::unix::fs::PermissionsExt;

    const CLIENTS: usize = 8;
    const EACH: usize = 5;
    let (tmp, config, storage) = site();
    std::fs::write(
        config.join("scheduler/v1/main.lua"),
        "return {scheduler = function() error('broken') end}\n",
    )
    .unwrap();
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(
        &settings,
        format!("actions:\n  max-pending: {}\n", CLIENTS * EACH),
    )
    .unwrap();
    std::fs::create_dir_all(&storage).unwrap();
    let leftover = storage.join(".tmp.actions.journal.4242.0");
    std::fs::write(&leftover, "left by a crash").unwrap();
    let launch = || {
        Daemon::launch(
            &config,
            &storage,
            &["--settings", settings.to_str().unwrap()],
            &[],
        )
    };
    let daemon = launch();
    wait_for(SOON, || {
        let status = daemon.json("/v1/status")?;
        status["errors"].get("scheduler").map(|_| ())
    })
    .expect("the daemon runs, its scheduler failing");
    assert!(!leftover.exists(), "crash leftovers are removed at start");

    let port = daemon.port;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            std::thread::spawn(move || {
                (0..EACH)
                    .map(|n| {
                        let body = format!(r#"{{"client": {c}, "n": {n}}}"#);
                        let (code, body) =
                            http_post(port, "/v1/action", "application/json", body.as_bytes());
                        assert_eq!(code, 200, "{body}");
                        serde_json::from_str::<Value>(&body).unwrap()["registered"]
                            .as_u64()
                            .unwrap()
                    })
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut acknowledged: Vec<u64> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    acknowledged.sort();
    acknowledged.dedup();
    assert_eq!(acknowledged.len(), CLIENTS * EACH, "unique ids");

    let (code, body) = http_post(
        port,
        "/v1/action",
        "application/json",
        b"{\"one\": \"more\"}",
    );
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("at most 40"), "{body}");

    let pending_ids = |daemon: &Daemon| -> Option<Vec<u64>> {
        let pending = daemon.json("/v1/pending_actions")?;
        let mut ids: Vec<u64> = pending
            .as_object()?
            .keys()
            .map(|k| k.parse().unwrap())
            .collect();
        ids.sort();
        Some(ids)
    };
    assert_eq!(pending_ids(&daemon).unwrap(), acknowledged);
    drop(daemon); // SIGKILL
    let daemon = launch();
    let pending = wait_for(SOON, || pending_ids(&daemon)).expect("the daemon answers");
    assert_eq!(
        pending, acknowledged,
        "every acknowledged action survived the kill"
    );
    let mode = std::fs::metadata(storage.join("actions.journal"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A shared object that slows the wall clock (`CLOCK_REALTIME`) of the process it is preloaded
/// into a hundredfold, starting at the whole second `SLOW_REALTIME_S` when the process starts
/// (Rust's `SystemTime` asks libc's `clock_gettime`): two runs of the daemon a few real seconds
/// apart both see the same second. Every other clock, and so every timer, runs as usual. Built
/// with the C compiler the build needs anyway.
fn slow_clock_shim(dir: &std::path::Path) -> std::path::PathBuf {
    let source = dir.join("slow_clock.c");
    std::fs::write(
        &source,
        r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static long long base_s = -1;
static struct timespec start;
__attribute__((constructor)) static void init(void) {
    const char *s = getenv("SLOW_REALTIME_S");
    if (s) base_s = atoll(s);
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &start);
}
int clock_gettime(clockid_t id, struct timespec *ts) {
    if (base_s >= 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        struct timespec now;
        syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &now);
        long long ns = (now.tv_sec - start.tv_sec) * 1000000000LL + (now.tv_nsec - start.tv_nsec);
        ns /= 100;
        ts->tv_sec = base_s + ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
        return 0;
    }
    return syscall(SYS_clock_gettime, id, ts);
}
"#,
    )
    .unwrap();
    let shim = dir.join("slow_clock.so");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&shim)
        .arg(&source)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc could not build the clock shim");
    shim
}

/// The issue's attack, made deterministic: three actions taken by the scheduler, a kill -9 and a
/// restart within the same wall-clock second (both runs start at the same whole second, on a clock
/// slowed a hundredfold), three more: no
/// id is given twice (the new ones used to repeat the old ones: the restarted node only knew the
/// ids still pending). The journal keeps the high-water mark.
#[test]
fn action_ids_are_not_given_again_after_a_restart_within_the_same_second() {
    let (tmp, config, storage) = site();
    let shim = slow_clock_shim(tmp.path());
    let second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let envs = [
        ("LD_PRELOAD", shim.to_str().unwrap()),
        ("SLOW_REALTIME_S", second.as_str()),
    ];
    let mut seen: Vec<u64> = Vec::new();
    for run in 0..2 {
        let daemon = Daemon::launch(&config, &storage, &[], &envs);
        wait_for(SOON, || daemon.json("/v1/schedule")).expect("a first schedule");
        for n in 0..3 {
            let body = format!(r#"{{"run": {run}, "n": {n}}}"#);
            let (code, body) = http_post(
                daemon.port,
                "/v1/action",
                "application/json",
                body.as_bytes(),
            );
            assert_eq!(code, 200, "{body}");
            let id = serde_json::from_str::<Value>(&body).unwrap()["registered"]
                .as_u64()
                .unwrap();
            assert_eq!(id / 1000, second.parse::<u64>().unwrap(), "the same second");
            assert!(
                !seen.contains(&id),
                "run {run}: id {id} given again: {seen:?}"
            );
            seen.push(id);
        }
        // The scheduler takes them: none is pending when the node is killed.
        wait_for(SOON, || {
            let pending = daemon.json("/v1/pending_actions")?;
            pending.as_object()?.is_empty().then_some(())
        })
        .expect("the scheduler takes the actions");
        // And their `remove` record is on disk (it is not waited for): after the kill nothing
        // is pending, the case where the ids were given again.
        let journal = storage.join("actions.journal");
        wait_for(SOON, || {
            let text = std::fs::read_to_string(&journal).ok()?;
            text.lines()
                .last()
                .is_some_and(|l| {
                    l.starts_with("{\"remove\"") && l.contains(&seen[seen.len() - 1].to_string())
                })
                .then_some(())
        })
        .expect("the remove record is written");
        drop(daemon); // SIGKILL
    }
    assert_eq!(seen.len(), 6);
}
