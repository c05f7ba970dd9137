//! Live stream benchmark (issue 5): 100 clients on `/v1/events` of one release-built node while
//! its schedule changes ten times a second for 10 s. Checks that every client saw every schedule
//! the node put in force, and prints the daemon's CPU time over the run.
//!
//! Run: `cargo bench --bench events` (CLIENTS=100, CHANGES=100 by default).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_verwalter");

/// The scheduler puts the runtime's `tick` into the schedule, so each write is a new schedule.
const SCHEDULER: &str = r#"
return {scheduler = function(state)
  return {tick = state.runtime.tick and state.runtime.tick.n or 0, nodes = {}}, "ok"
end}
"#;

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after the command name.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let clients = env("CLIENTS", 100);
    let changes = env("CHANGES", 100);
    let tmp = tempfile::Builder::new()
        .prefix("verwalter-bench-events.")
        .tempdir_in("target")
        .unwrap();
    let config = tmp.path().join("config");
    std::fs::create_dir_all(config.join("scheduler/v1")).unwrap();
    std::fs::create_dir_all(config.join("runtime")).unwrap();
    std::fs::write(config.join("scheduler/v1/main.lua"), SCHEDULER).unwrap();
    std::fs::write(config.join("runtime/tick.json"), "{\"n\": 0}").unwrap();
    let settings = tmp.path().join("settings.yaml");
    // A short debounce, so that writes 100 ms apart are 100 schedules.
    std::fs::write(&settings, "inputs:\n  debounce-ms: 10\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut daemon = Command::new(BIN)
        .args(["run", "--port", &port.to_string()])
        .args(["--override-machine-id", "0000000000000000000000000000e7e7"])
        .arg("--config-dir")
        .arg(&config)
        .arg("--storage-dir")
        .arg(tmp.path().join("storage"))
        .arg("--log-dir")
        .arg(tmp.path().join("log"))
        .arg("--settings")
        .arg(&settings)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));

    let seen: Vec<Arc<Mutex<BTreeSet<String>>>> = (0..clients)
        .map(|_| Arc::new(Mutex::new(BTreeSet::new())))
        .collect();
    for set in &seen {
        let set = set.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(s, "GET /v1/events HTTP/1.0\r\n\r\n").unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 16384];
            loop {
                let Ok(n) = s.read(&mut chunk) else { return };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                // Take whole events off the front.
                while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                    let block: Vec<u8> = buf.drain(..end + 2).collect();
                    let text = String::from_utf8_lossy(&block);
                    if let Some(data) = text.lines().find_map(|l| l.strip_prefix("data: "))
                        && let Ok(v) = serde_json::from_str::<serde_json::Value>(data)
                        && let Some(hash) = v["schedule_id"].as_str()
                    {
                        set.lock().unwrap().insert(hash.to_string());
                    }
                }
            }
        });
    }
    std::thread::sleep(Duration::from_millis(500));

    let pid = daemon.id();
    let ticks_before = cpu_ticks(pid);
    let started = Instant::now();
    let mut produced = BTreeSet::new();
    for n in 1..=changes {
        std::fs::write(config.join("runtime/tick.json"), format!("{{\"n\": {n}}}")).unwrap();
        let next = started + Duration::from_millis(100) * n as u32;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        // Every schedule in force, as the node reports it (the one it puts into events).
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = write!(s, "GET /v1/schedule HTTP/1.0\r\n\r\n");
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            if let Some(body) = text.split("\r\n\r\n").nth(1)
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(body)
                && let Some(hash) = v["hash"].as_str()
            {
                produced.insert(hash.to_string());
            }
        }
    }
    let elapsed = started.elapsed();
    let ticks = cpu_ticks(pid) - ticks_before;
    std::thread::sleep(Duration::from_millis(500));
    let clock_ticks = 100.0; // sysconf(_SC_CLK_TCK) on Linux
    let cpu = ticks as f64 / clock_ticks;
    let complete = seen
        .iter()
        .filter(|s| produced.is_subset(&s.lock().unwrap()))
        .count();
    let fewest = seen
        .iter()
        .map(|s| s.lock().unwrap().len())
        .min()
        .unwrap_or(0);
    println!("{clients} clients on /v1/events, {changes} runtime changes 100 ms apart:");
    println!(
        "  schedules sampled in force: {}; clients that saw every one of them: {complete}/{clients}; fewest schedules seen by a client: {fewest}",
        produced.len()
    );
    println!(
        "  daemon CPU over {:.1} s: {:.2} s ({:.0} % of one core)",
        elapsed.as_secs_f64(),
        cpu,
        100.0 * cpu / elapsed.as_secs_f64()
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
}
