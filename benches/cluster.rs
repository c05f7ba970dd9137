//! Cluster benchmark (issue 4): five `verwalter` processes on 127.0.0.1–5 (static peer list),
//! each rendering one role whose command is `true`. Prints p50 and p99 over the trials of:
//!
//! - failover: SIGKILL of the leader → every survivor has rendered a schedule made by the new
//!   leader (the killed node is restarted and the cluster settles between trials);
//! - distribution: a new schedule accepted on the leader → every follower holds it;
//! - propagation: a runtime file written on the leader → every follower has rendered the new
//!   schedule.
//!
//! One change before the trials warms the cluster up and is printed apart (the first schedule
//! after the start pays once for relay connections, buffers, threads and templates).
//!
//! Times come from the nodes' own logs (microsecond timestamps of "New schedule", "Took the
//! leader's schedule" and "Deployment finished"), so polling does not blur them.
//!
//! With `SCHEDULE_KB=N` the scheduler adds about N KiB of service definitions to the schedule
//! (JSON about as compressible as real ones: names, images, ports, a checksum per service), and
//! the leader's egress per schedule change is printed from its
//! `verwalter_schedule_served_bytes_total`, as a multiple of the schedule's size.
//!
//! `SHAPE` says where those services go: `spread` (the default) spreads them over the nodes'
//! roles, each node's role `app` getting its share (`nodes[host].roles.app.services`), as a
//! fleet's services would be; `shared` puts them all in role `app`'s own variables
//! (`roles.app.services`), which every node is given whole (a big shared config: versions,
//! service definitions), so each node renders the whole megabyte.
//!
//! Run: `cargo bench --bench cluster` (TRIALS=20, NODES=5, SCHEDULE_KB=0 by default;
//! FAILOVER_TRIALS=TRIALS; RELAY_FANOUT sets `election.relay-fanout`; BENCH_DIR is where the
//! nodes' dirs go, `target` by default; KEEP=1 keeps them; VERBOSE=1 prints every trial;
//! VERWALTER_BIN runs another build of the daemon, e.g. an older commit's, to compare);
//! the issue 15 scale run: `NODES=100 SCHEDULE_KB=1024 cargo bench --bench cluster`; issue
//! 32's shared one: `SHAPE=shared NODES=100 SCHEDULE_KB=1024 cargo bench --bench cluster`.
//!
//! `BACKEND=etcd` (issue 36) gives the nodes `election.backend: etcd` with a one-member etcd
//! (Debian's `etcd-server`; `ETCD_BIN` names another binary) on 127.0.2.1:2379, its data beside
//! the nodes': followers then learn of a schedule from etcd's watch instead of the leader's
//! pings. The daemon must be built with the `etcd` feature: `cargo build --release --features
//! etcd`, then `VERWALTER_BIN=target/release/verwalter BACKEND=etcd cargo bench --bench cluster`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

#[path = "support/report.rs"]
mod report;
use report::{ms, report};

/// The daemon the nodes run: this build's, or `VERWALTER_BIN` (another build, to compare).
fn bin() -> String {
    std::env::var("VERWALTER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_verwalter").into())
}
const SCHEDULER: &str = r#"
-- Every node gets role `app`; the version comes from runtime/version.json, the size of the
-- service list (KiB) from runtime/size.json; each node's role has its share of the services.
local function services(kb, v)
  local list = {}
  local x = 12345
  for i = 1, math.floor(kb * 2.35) do
    x = (x * 1103515245 + 12345 + v) % 2147483648
    list["service-" .. i] = {
      image = "registry.example.com/platform/service-" .. i .. ":1." .. v .. "." .. (i % 17),
      replicas = i % 7 + 1, memory_mb = 256 + (i % 16) * 64, cpu_shares = 100 + i % 900,
      args = {"--listen", "0.0.0.0:" .. (8000 + i), "--log-level", "info",
              "--config", "/etc/services/service-" .. i .. ".yaml"},
      env = {RUST_LOG = "info", REGION = "eu-" .. (i % 3), SHARD = tostring(i % 64),
             UPSTREAM = "http://upstream-" .. (i % 40) .. ".internal:8080/api/v2"},
      checksum = string.format("%08x%08x%08x%08x", x, (x * 7) % 4294967296,
                               (x * 13 + i) % 4294967296, (x * 31 + v) % 4294967296),
      owner = "team-" .. (i % 23), description = "Service " .. i .. " of the benchmark fleet",
    }
  end
  return list
end
return {scheduler = function(state)
  -- The services are spread over the nodes, as a real fleet's would be: the schedule holds
  -- them all, each node's role gets its own share.
  local hosts = {state.current_host}
  for _, peer in pairs(state.peers) do hosts[#hosts + 1] = peer.hostname end
  table.sort(hosts)
  local v = state.runtime.version and state.runtime.version.v or 0
  local kb = state.runtime.size and state.runtime.size.kb or 0
  local nodes = {}
  local list = services(kb, v)
  local vars = {template = "app/v1", v = v, leader = state.current_host}
  if state.runtime.size and state.runtime.size.shape == "shared" then
    -- SHAPE=shared: the whole list in role `app`'s own variables, which every node is given
    -- (a big shared config: versions, service definitions).
    for _, host in ipairs(hosts) do nodes[host] = {roles = {app = {}}} end
    return {vars = vars, roles = {app = {services = list}}, nodes = nodes}, "ok"
  end
  for _, host in ipairs(hosts) do nodes[host] = {roles = {app = {services = {}}}} end
  for i = 1, math.floor(kb * 2.35) do
    local name = "service-" .. i
    nodes[hosts[i % #hosts + 1]].roles.app.services[name] = list[name]
  end
  return {vars = vars, nodes = nodes}, "ok"
end}
"#;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(default)
}

fn id(n: usize) -> String {
    format!("77985419c732412ea38b94db{n:08}")
}

struct Node {
    n: usize,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    tail: std::cell::RefCell<LogTail>,
}

impl Node {
    fn log(&self) -> PathBuf {
        self.dir.join("verwalter.log")
    }

    fn start(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        let child = Command::new(bin())
            .args(["run", "--hostname", &format!("node{}", self.n)])
            .args(["--host", &format!("127.0.0.{}", self.n)])
            .args(["--port", &self.port.to_string()])
            .args(["--override-machine-id", &id(self.n)])
            .arg("--config-dir")
            .arg(self.dir.join("config"))
            .arg("--storage-dir")
            .arg(self.dir.join("storage"))
            .arg("--log-dir")
            .arg(self.dir.join("log"))
            .arg("--settings")
            .arg(self.dir.join("settings.yaml"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn get(&self, path: &str) -> Option<Value> {
        serde_json::from_str(&self.get_text(path)?).ok()
    }

    /// The body of a 200 answer to `GET path`.
    fn get_text(&self, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s =
            std::net::TcpStream::connect((format!("127.0.0.{}", self.n).as_str(), self.port))
                .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.contains(" 200 ").then(|| body.to_string())
    }

    /// Bytes of schedules this node served (every encoding).
    fn served_bytes(&self) -> f64 {
        let text = self.get_text("/metrics").unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("verwalter_schedule_served_bytes_total"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum()
    }

    /// Log lines containing `needle` (one of [`EVENTS`]) with their wall-clock time. The log
    /// is read from where the last call stopped: the harness polls 100 logs every few
    /// milliseconds on the cores the nodes run on, and rereading them whole stole those nodes'
    /// CPU.
    fn events(&self, needle: &str) -> Vec<(SystemTime, String)> {
        use std::io::{Read, Seek};
        let mut tail = self.tail.borrow_mut();
        if let Ok(mut file) = fs::File::open(self.log()) {
            let mut more = Vec::new();
            if file.seek(std::io::SeekFrom::Start(tail.offset)).is_ok()
                && file.read_to_end(&mut more).is_ok()
            {
                tail.offset += more.len() as u64;
                tail.partial.extend_from_slice(&more);
            }
        }
        let whole = tail
            .partial
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |at| at + 1);
        let lines: Vec<u8> = tail.partial.drain(..whole).collect();
        for line in String::from_utf8_lossy(&lines).lines() {
            if !EVENTS.iter().any(|e| line.contains(e)) {
                continue;
            }
            let Some(stamp) = line.split_whitespace().next() else {
                continue;
            };
            if let Ok(t) =
                time::OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339)
            {
                tail.events.push((SystemTime::from(t), line.to_string()));
            }
        }
        tail.events
            .iter()
            .filter(|(_, l)| l.contains(needle))
            .cloned()
            .collect()
    }
}

/// The log lines the harness looks for.
const EVENTS: &[&str] = &[
    "New schedule.",
    "Took the leader's schedule.",
    "Deployment finished.",
];

/// What [`Node::events`] has read of a node's log.
#[derive(Default)]
struct LogTail {
    offset: u64,
    /// Bytes after the last whole line read.
    partial: Vec<u8>,
    events: Vec<(SystemTime, String)>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Where `BACKEND=etcd` runs its etcd (the nodes are on 127.0.0.1-N).
const ETCD_IP: &str = "127.0.2.1";

/// A one-member etcd for `BACKEND=etcd`, stopped when dropped.
struct Etcd(Child);

impl Etcd {
    fn start(root: &Path) -> Etcd {
        let log = fs::File::create(root.join("etcd.log")).unwrap();
        let child = Command::new(std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".into()))
            .arg("--name=bench")
            .arg(format!("--data-dir={}", root.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://{ETCD_IP}:2379"))
            .arg(format!("--advertise-client-urls=http://{ETCD_IP}:2379"))
            .arg(format!("--listen-peer-urls=http://{ETCD_IP}:2380"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://{ETCD_IP}:2380"
            ))
            .arg(format!("--initial-cluster=bench=http://{ETCD_IP}:2380"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("BACKEND=etcd runs `etcd` (Debian's etcd-server, or ETCD_BIN)");
        wait_for(Duration::from_secs(30), || {
            std::net::TcpStream::connect((ETCD_IP, 2379)).ok()
        })
        .expect("etcd listens within 30 s");
        Etcd(child)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `election` settings: `RELAY_FANOUT`, and `BACKEND=etcd`'s.
fn election_settings(backend: &str) -> String {
    let mut election = String::new();
    if let Ok(fanout) = std::env::var("RELAY_FANOUT") {
        election.push_str(&format!("  relay-fanout: {fanout}\n"));
    }
    if backend == "etcd" {
        election.push_str(&format!(
            "  backend: etcd\n  etcd:\n    endpoints: [\"{ETCD_IP}:2379\"]\n    \
             prefix: /verwalter/bench\n    lease-ttl: 2s\n"
        ));
    }
    match election.is_empty() {
        true => election,
        false => format!("election:\n{election}"),
    }
}

/// The leader (index) once every live node agrees on it and holds its schedule.
fn settled(nodes: &[Node]) -> (usize, String) {
    wait_for(Duration::from_secs(120), || {
        let mut leader = None;
        let mut hashes = std::collections::BTreeSet::new();
        for (i, node) in nodes.iter().enumerate() {
            if node.child.is_none() {
                continue;
            }
            let status = node.get("/v1/status")?;
            if status["election_state"]["is_leader"] == true {
                if leader.is_some() {
                    return None;
                }
                leader = Some(i);
            }
            hashes.insert(status["schedule_id"].as_str()?.to_string());
        }
        let leader = leader?;
        let schedule = nodes[leader].get("/v1/schedule")?;
        let hash = schedule["hash"].as_str()?.to_string();
        (hashes.len() == 1 && hashes.contains(&hash) && schedule["origin"] == id(nodes[leader].n))
            .then_some((leader, hash))
    })
    .expect("the cluster settles within 120 s")
}

/// The latest time, over `nodes` except `skip`, of the first log line with `needle` and `hash`
/// after `since`.
fn all_logged(
    nodes: &[Node],
    skip: &[usize],
    needle: &str,
    hash: &str,
    since: SystemTime,
) -> Option<SystemTime> {
    let mut latest = since;
    for (i, node) in nodes.iter().enumerate() {
        if skip.contains(&i) || node.child.is_none() {
            continue;
        }
        let at = node
            .events(needle)
            .into_iter()
            .find(|(t, line)| *t >= since && line.contains(hash))?
            .0;
        latest = latest.max(at);
    }
    Some(latest)
}

fn main() {
    let trials = env_or("TRIALS", 20);
    let nodes_n = env_or("NODES", 5);
    let kb = env_or("SCHEDULE_KB", 0);
    let shape = std::env::var("SHAPE").unwrap_or_else(|_| "spread".into());
    assert!(
        shape == "spread" || shape == "shared",
        "SHAPE is `spread` or `shared`, not {shape:?}"
    );
    let backend = std::env::var("BACKEND").unwrap_or_else(|_| "builtin".into());
    assert!(
        backend == "builtin" || backend == "etcd",
        "BACKEND is `builtin` or `etcd`, not {backend:?}"
    );
    // BENCH_DIR=/dev/shm puts the nodes' dirs on tmpfs: 100 nodes on one machine otherwise
    // share one disk, each syncing its copy of every schedule to it (a fleet has a disk per node).
    let base = std::env::var("BENCH_DIR").unwrap_or_else(|_| "target".into());
    let tmp = tempfile::Builder::new()
        .prefix("verwalter-bench-cluster.")
        .tempdir_in(&base)
        .unwrap();
    // KEEP=1 leaves the nodes' dirs (config, storage, logs) for a look afterwards.
    let root = tmp.path().to_owned();
    let _cleanup = if std::env::var("KEEP").is_ok_and(|k| k == "1") {
        println!("nodes' dirs: {}", tmp.keep().display());
        None
    } else {
        Some(tmp)
    };
    let _etcd = (backend == "etcd").then(|| Etcd::start(&root));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let peers: String = (1..=nodes_n)
        .map(|n| {
            format!(
                "- {{id: {}, addr: \"127.0.0.{n}:{port}\", hostname: node{n}}}\n",
                id(n)
            )
        })
        .collect();
    let mut nodes: Vec<Node> = (1..=nodes_n)
        .map(|n| {
            let dir = root.join(format!("node{n}"));
            let config = dir.join("config");
            fs::create_dir_all(config.join("scheduler/v1")).unwrap();
            fs::create_dir_all(config.join("runtime")).unwrap();
            fs::create_dir_all(config.join("templates/app/v1")).unwrap();
            fs::write(config.join("scheduler/v1/main.lua"), SCHEDULER).unwrap();
            fs::write(config.join("runtime/version.json"), "{\"v\": 0}").unwrap();
            fs::write(
                config.join("runtime/size.json"),
                format!("{{\"kb\": {kb}, \"shape\": \"{shape}\"}}"),
            )
            .unwrap();
            fs::write(
                config.join("templates/app/v1/app.render.yaml"),
                "templates: {conf: app.conf.hbs}\ncommands:\n- !Cmd [true]\n",
            )
            .unwrap();
            fs::write(
                config.join("templates/app/v1/app.conf.hbs"),
                "v = {{v}} from {{leader}}\n",
            )
            .unwrap();
            let election = election_settings(&backend);
            fs::write(
                dir.join("settings.yaml"),
                format!("peers:\n{peers}{election}"),
            )
            .unwrap();
            Node {
                n,
                dir,
                port,
                child: None,
                tail: Default::default(),
            }
        })
        .collect();
    for node in &mut nodes {
        node.start();
    }
    let (mut leader, _) = settled(&nodes);
    let size = nodes[leader]
        .get_text("/v1/schedule")
        .map_or(0, |body| body.len());
    println!(
        "{nodes_n} nodes on 127.0.0.1-{nodes_n}, schedule {:.1} KiB ({shape}), election \
         {backend}, {trials} trials each:",
        size as f64 / 1024.0
    );
    let mut egress = Vec::new();
    let idle_before = cpu_ms(&nodes);
    std::thread::sleep(Duration::from_secs(3));
    let idle = (cpu_ms(&nodes) - idle_before) / nodes_n as f64 / 3.0;
    println!("  idle CPU per node: {idle:.1} ms per second");

    let mut distribution = Vec::new();
    let mut propagation = Vec::new();
    let mut cpu = Vec::new();
    // Change 0 warms the nodes up and is printed apart: the first schedule after the start
    // pays once for connections to relays, buffers, blocking threads and compiled templates.
    for trial in 0..=trials {
        let cpu_before = cpu_ms(&nodes);
        let served_before = nodes[leader].served_bytes();
        let written = SystemTime::now();
        let file = nodes[leader].dir.join("config/runtime/version.json");
        fs::write(&file, format!("{{\"v\": {}}}", trial + 1)).unwrap();
        let (hash, accepted) = wait_for(Duration::from_secs(10), || {
            nodes[leader]
                .events("New schedule.")
                .into_iter()
                .rfind(|(t, _)| *t >= written)
                .and_then(|(t, line)| {
                    let hash = line.split("hash=").nth(1)?.split_whitespace().next()?;
                    Some((hash.to_string(), t))
                })
        })
        .expect("the leader schedules");
        let held = wait_for(Duration::from_secs(10), || {
            all_logged(
                &nodes,
                &[leader],
                "Took the leader's schedule.",
                &hash,
                written,
            )
        })
        .expect("followers take the schedule");
        let rendered = wait_for(Duration::from_secs(10), || {
            all_logged(&nodes, &[leader], "Deployment finished.", &hash, written)
        })
        .expect("followers render the schedule");
        let took = held.duration_since(accepted).unwrap_or_default();
        let spread = rendered.duration_since(written).unwrap_or_default();
        if trial == 0 {
            println!(
                "  first change after the start (not counted): distribution {:.1} ms, propagation {:.1} ms",
                ms(took),
                ms(spread)
            );
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        distribution.push(took);
        egress.push((nodes[leader].served_bytes() - served_before) / size.max(1) as f64);
        propagation.push(spread);
        cpu.push((cpu_ms(&nodes) - cpu_before) / nodes_n as f64);
        // VERBOSE=1: each trial's figures, to see where the slow ones fall.
        if std::env::var("VERBOSE").is_ok_and(|v| v == "1") {
            println!(
                "  trial {trial:>3}: distribution {:6.1} ms, propagation {:6.1} ms, CPU {:4.1} ms per node",
                ms(distribution[distribution.len() - 1]),
                ms(propagation[propagation.len() - 1]),
                cpu[cpu.len() - 1]
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut failover = Vec::new();
    for _ in 0..env_or("FAILOVER_TRIALS", trials) {
        let killed_at = SystemTime::now();
        nodes[leader].kill();
        let old = leader;
        let (new_leader, hash) = settled(&nodes);
        let done = wait_for(Duration::from_secs(10), || {
            all_logged(&nodes, &[], "Deployment finished.", &hash, killed_at)
        })
        .expect("survivors render the new leader's schedule");
        failover.push(done.duration_since(killed_at).unwrap_or_default());
        nodes[old].start();
        leader = settled(&nodes).0;
        let _ = new_leader;
        std::thread::sleep(Duration::from_millis(300));
    }
    if !failover.is_empty() {
        report("failover", 13, "trials", failover);
    }
    report("distribution", 13, "trials", distribution);
    report("propagation", 13, "trials", propagation);
    egress.sort_by(f64::total_cmp);
    println!(
        "  leader egress per change: median {:.2} x the schedule, max {:.2} x",
        egress[egress.len() / 2],
        egress[egress.len() - 1]
    );
    cpu.sort_by(f64::total_cmp);
    println!(
        "  CPU per node per change (all its threads, from the schedule's write to every node rendered): median {:.1} ms, max {:.1} ms",
        cpu[cpu.len() / 2],
        cpu[cpu.len() - 1]
    );
}

/// CPU time (user + system, ms) the nodes' processes used so far, from `/proc/<pid>/stat`.
fn cpu_ms(nodes: &[Node]) -> f64 {
    let tick_ms = 1000.0
        / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
    nodes
        .iter()
        .filter_map(|n| n.child.as_ref())
        .filter_map(|c| fs::read_to_string(format!("/proc/{}/stat", c.id())).ok())
        .map(|stat| {
            // The fields after the command name (which may hold spaces) in parentheses.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            (ticks(11) + ticks(12)) * tick_ms
        })
        .sum()
}
