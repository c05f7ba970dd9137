//! A cluster of real processes: three nodes on 127.0.0.1–3 (one port, as on separate machines),
//! peers from the cantal test double (`examples/cluster/fake_cantal.rs`), each node on its own
//! temp copy of `examples/minimal`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

/// The nodes of [`Cluster::start`]; [`Cluster::start_n`] takes more from [`MORE_NAMES`].
pub const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
pub const MORE_NAMES: [&str; 5] = ["alpha", "beta", "gamma", "delta", "epsilon"];
/// Generous bound for elections and fetches on a loaded CI machine.
const SOON: Duration = Duration::from_secs(20);

pub struct Node {
    pub host: String,
    pub port: u16,
    child: Child,
    log: PathBuf,
}

impl Node {
    /// Node `i` (0-based) on `127.0.0.<i+1>`; with the settings file `dir/settings.yaml` if
    /// there is one (see [`Cluster::start_with`]).
    pub fn start(i: usize, dir: &Path, port: u16, cantal: &str) -> Node {
        let n = i + 1;
        let host = format!("127.0.0.{n}");
        let (mut command, log) = cluster_node(dir, n);
        let settings = dir.join("settings.yaml");
        if settings.exists() {
            command.arg("--settings").arg(settings);
        }
        let child = command
            .args(["--hostname", MORE_NAMES[i], "--name"])
            .arg(format!("{}.test", MORE_NAMES[i]))
            .args(["--host", &host, "--port", &port.to_string()])
            .arg("--override-machine-id")
            .arg(format!("77985419c732412ea38b94db{n:08}"))
            .arg("--cantal-url")
            .arg(cantal)
            .spawn()
            .unwrap();
        Node {
            host,
            port,
            child,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn json(&self, path: &str) -> Option<Value> {
        let (code, body) = http_get_at(&self.host, self.port, path)?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status code and lower-cased head of a GET.
fn http_head_at(host: &str, port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect((host, port)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: verwalter\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let head = response
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_ascii_lowercase();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, head)
}

/// The cantal test double's binary (`examples/cluster`, the crate `fake-cantal`).
pub fn fake_cantal() -> PathBuf {
    package_binary(
        "fake-cantal",
        "fake_cantal",
        &example("cluster").join("fake_cantal.rs"),
    )
}

/// Starts the cantal test double listing `names` (node i on `127.0.0.<i+1>`, see
/// [`Node::start`]), its log in `dir`; returns it with the URL it serves at.
pub fn start_cantal(dir: &Path, names: &[&str]) -> (Child, String) {
    let cantal_bin = fake_cantal();
    // Ports are picked by the system and read back from what the processes say (no
    // bind-and-release window): cantal's from its first line, the nodes' from node 1's
    // `Listening.` line; the others take the same port on their own addresses.
    let cantal_log = dir.join("cantal.log");
    let cantal = Command::new(cantal_bin)
        .args(["--listen", "127.0.0.1:0"])
        .args(names.iter().map(|n| format!("{n}.test")))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&cantal_log).unwrap())
        .spawn()
        .unwrap();
    let url = wait_for(Duration::from_secs(10), || {
        let log = std::fs::read_to_string(&cantal_log).ok()?;
        // Whole lines only: `eprintln!` may reach the file in pieces, and a line read
        // before its address was written gave the nodes the URL `http://`.
        let addr = log
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .find_map(|l| {
                l.split(" on ")
                    .nth(1)?
                    .trim()
                    .parse::<std::net::SocketAddr>()
                    .ok()
            })?;
        Some(format!("http://{addr}"))
    })
    .expect("fake_cantal says where it listens");
    (cantal, url)
}

pub struct Cluster {
    pub tmp: tempfile::TempDir,
    _cantal: Child,
    /// Where the cantal test double listens.
    pub cantal_url: String,
    pub nodes: Vec<Option<Node>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self._cantal.kill();
        let _ = self._cantal.wait();
    }
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_n(NAMES.len())
    }

    /// `n` nodes (at most five), named from [`MORE_NAMES`].
    pub fn start_n(n: usize) -> Cluster {
        Cluster::start_with(n, None)
    }

    /// `n` nodes sharing the settings file `settings` (YAML), if given.
    pub fn start_with(n: usize, settings: Option<&str>) -> Cluster {
        let names = &MORE_NAMES[..n];
        let tmp = tempfile::tempdir().unwrap();
        if let Some(settings) = settings {
            std::fs::write(tmp.path().join("settings.yaml"), settings).unwrap();
        }
        let (cantal, url) = start_cantal(tmp.path(), names);
        let mut first = Node::start(0, tmp.path(), 0, &url);
        let port = wait_for(Duration::from_secs(30), || {
            listening_port(&std::fs::read_to_string(&first.log).ok()?)
        })
        .unwrap_or_else(|| panic!("node 1 does not listen:\n{}", first.logs()));
        first.port = port;
        let mut nodes = vec![Some(first)];
        nodes.extend((1..n).map(|i| Some(Node::start(i, tmp.path(), port, &url))));
        Cluster {
            tmp,
            _cantal: cantal,
            cantal_url: url,
            nodes,
        }
    }

    /// A live node other than node `leader`.
    pub fn follower(&self, leader: usize) -> &Node {
        self.live()
            .find(|n| n.host != format!("127.0.0.{}", leader + 1))
            .expect("a live follower")
    }

    pub fn live(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().flatten()
    }

    pub fn logs(&self) -> String {
        self.live()
            .map(|n| format!("=== {} ===\n{}", n.host, n.logs()))
            .collect()
    }

    /// Waits until exactly one live node leads and every live node holds a schedule made by it;
    /// returns the leader's index and the schedule hash.
    pub fn converged(&self) -> (usize, String) {
        wait_for(SOON, || {
            let mut leaders = Vec::new();
            let mut hashes = BTreeSet::new();
            let mut origins = BTreeSet::new();
            for (i, node) in self.nodes.iter().enumerate() {
                let Some(node) = node else { continue };
                let status = node.json("/v1/status")?;
                if status["election_state"]["is_leader"] == true {
                    leaders.push(i);
                }
                let schedule = node.json("/v1/schedule")?;
                hashes.insert(schedule["hash"].as_str()?.to_string());
                origins.insert(schedule["origin"].as_str()?.to_string());
            }
            let [leader] = leaders[..] else { return None };
            let leader_id = format!("77985419c732412ea38b94db{:08}", leader + 1);
            (hashes.len() == 1 && origins == BTreeSet::from([leader_id]))
                .then(|| (leader, hashes.into_iter().next().unwrap()))
        })
        .unwrap_or_else(|| {
            panic!(
                "no single leader with its schedule everywhere:\n{}",
                self.logs()
            )
        })
    }
}

#[test]
fn three_nodes_elect_one_leader_share_its_schedule_and_survive_its_death() {
    let mut cluster = Cluster::start();
    let (leader, hash) = cluster.converged();
    let follower = cluster.follower(leader);
    let status = follower.json("/v1/status").unwrap();
    assert_eq!(status["peers"], 2, "{status}");
    assert_eq!(
        status["leader"]["id"],
        format!("77985419c732412ea38b94db{:08}", leader + 1)
    );
    assert_eq!(status["schedule_id"], hash);
    assert_eq!(status["fetch_state"]["state"], "Replicating", "{status}");
    assert_eq!(status["schedule_status"], "ok", "{status}");
    assert_eq!(status["leader"]["schedule"], hash, "{status}");
    let peers = follower.json("/v1/peers").unwrap();
    assert_eq!(peers.as_array().unwrap().len(), 2, "{peers}");
    // The leader's address carries the port all nodes share; the path tail is kept.
    let (code, head) = http_head_at(
        &follower.host,
        follower.port,
        "/v1/leader-redirect-by-node-name/v1/status",
    );
    assert_eq!(code, 308, "{head}");
    assert!(
        head.contains(&format!(
            "location: http://{}.test:{}/v1/status",
            NAMES[leader], follower.port
        )),
        "{head}"
    );
    // The followers render the leader's schedule: its roles for this node are in roles_data.
    let roles = follower.json("/v1/roles_data").unwrap();
    assert!(
        roles["all_roles"].as_array().is_some_and(|r| !r.is_empty()),
        "{roles}"
    );

    strangers_and_absurd_epochs_do_not_move_leadership(&cluster, leader);

    // SIGKILL the leader: the survivors elect another and keep scheduling.
    drop(cluster.nodes[leader].take());
    let (next, _) = cluster.converged();
    assert_ne!(next, leader);
    let metrics = http_get_at(
        &format!("127.0.0.{}", next + 1),
        cluster.live().next().unwrap().port,
        "/metrics",
    )
    .unwrap()
    .1;
    assert!(
        metrics.contains("verwalter_elections_started_total"),
        "{metrics}"
    );
}

fn id(i: usize) -> String {
    format!("77985419c732412ea38b94db{:08}", i + 1)
}

/// The value of one metric series (`name{labels}`) on a node, 0 when absent.
fn metric(node: &Node, series: &str) -> f64 {
    let (_, body) = http_get_at(&node.host, node.port, "/metrics").unwrap_or_default();
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Sends a verwalter 0.13 `Ping` from `id` at `epoch`, from `socket`, to `node`.
fn spoof_ping(socket: &std::net::UdpSocket, node: &Node, id: &str, epoch: u64) {
    use verwalter_controllers::cluster::election::wire::{Kind, Packet};
    let packet = Packet {
        from: id.to_string(),
        epoch,
        schedule: None,
        kind: Kind::Ping,
        lz4_sha1: None,
    };
    socket
        .send_to(&packet.encode().unwrap(), (node.host.as_str(), node.port))
        .unwrap();
}

/// Issue 10: forged election packets. Pings from an id in no peer list, from a listed id at the
/// wrong source address, and with an epoch that would wrap are dropped, counted and never
/// answered; leadership stays where it was.
fn strangers_and_absurd_epochs_do_not_move_leadership(cluster: &Cluster, leader: usize) {
    let follower = cluster.follower(leader);
    let leader_node = cluster.nodes[leader].as_ref().unwrap();
    let before = follower.json("/v1/election").unwrap();
    let epoch = before["epoch"].as_u64().unwrap();
    assert_eq!(before["leader"], id(leader), "{before}");
    const UNKNOWN: &str = "verwalter_election_messages_dropped_total{reason=\"unknown_peer\"}";
    const BAD_EPOCH: &str = "verwalter_election_messages_dropped_total{reason=\"bad_epoch\"}";

    // From an address no peer has.
    let stranger = std::net::UdpSocket::bind("127.0.0.200:0").unwrap();
    stranger.set_nonblocking(true).unwrap();
    spoof_ping(
        &stranger,
        follower,
        "77985419c732412ea38b94db000000ff",
        epoch + 1,
    );
    spoof_ping(&stranger, follower, &id(leader), epoch + 1);
    spoof_ping(
        &stranger,
        leader_node,
        "77985419c732412ea38b94db000000ff",
        u64::MAX,
    );
    // From the leader's own IP (another port): a listed peer, but an epoch that would wrap.
    let known = std::net::UdpSocket::bind((leader_node.host.as_str(), 0)).unwrap();
    spoof_ping(&known, follower, &id(leader), u64::MAX);
    // And to the leader, from the follower's IP (0.13 stepped down, then wrapped to epoch 0).
    // Node i runs on 127.0.0.(i + 1).
    let n: usize = follower.host.rsplit('.').next().unwrap().parse().unwrap();
    let follower_id = id(n - 1);
    let as_follower = std::net::UdpSocket::bind((follower.host.as_str(), 0)).unwrap();
    spoof_ping(&as_follower, leader_node, &follower_id, u64::MAX);
    // Each counter rising is the event that comes after the packet was handled.
    wait_for(SOON, || {
        (metric(follower, UNKNOWN) >= 2.0
            && metric(leader_node, UNKNOWN) >= 1.0
            && metric(follower, BAD_EPOCH) >= 1.0
            && metric(leader_node, BAD_EPOCH) >= 1.0)
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the forged packets were not counted as dropped:\n{}",
            cluster.logs()
        )
    });
    assert!(
        follower
            .logs()
            .contains("not a listed peer at that address"),
        "no warning about the stranger:\n{}",
        follower.logs()
    );
    let mut buf = [0u8; 1024];
    assert!(
        stranger.recv_from(&mut buf).is_err(),
        "a stranger got an answer"
    );
    let after = follower.json("/v1/election").unwrap();
    assert_eq!(after["leader"], id(leader), "leadership moved: {after}");
    assert_eq!(after["epoch"], epoch, "{after}");
    let on_leader = leader_node.json("/v1/election").unwrap();
    assert_eq!(
        on_leader["is_leader"], true,
        "the leader stepped down: {on_leader}"
    );
    assert_eq!(on_leader["epoch"], epoch, "{on_leader}");
}

/// Five nodes with a relay fan-out of 1: the leader serves one follower, which serves the next,
/// and so on down a chain of four. Each schedule reaches every node, most of them through a
/// relay, checked by hash (of the body, which the leader's ping announces); and a client that does not ask for gzip (verwalter 0.13, curl)
/// still gets plain JSON from every node.
#[test]
fn followers_take_the_leaders_schedule_through_relays() {
    let cluster = Cluster::start_with(5, Some("election:\n  relay-fanout: 1\n"));
    let (leader, first) = cluster.converged();
    let leader_node = cluster.nodes[leader].as_ref().unwrap();
    // A new schedule: the leader's runtime gains a version.
    replace_file(
        &cluster
            .tmp
            .path()
            .join(format!("config{}/runtime/web/v7.yaml", leader + 1)),
        "image: web.v7\ninstances: 2\n",
    );
    let second = wait_for(SOON, || {
        let (next, hash) = cluster.converged();
        (next == leader && hash != first).then_some(hash)
    })
    .unwrap_or_else(|| panic!("the new schedule did not spread:\n{}", cluster.logs()));

    // Who served each follower: the `from` of its "Took the leader's schedule." lines.
    let leader_id = id(leader);
    let mut relayed = 0;
    let mut took_all = 0;
    for node in cluster.live().filter(|n| n.host != leader_node.host) {
        let logs = node.logs();
        let took: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("Took the leader's schedule.") && l.contains(&second))
            .collect();
        assert_eq!(took.len(), 1, "{}:\n{logs}", node.host);
        took_all += logs
            .lines()
            .filter(|l| l.contains("Took the leader's schedule."))
            .count();
        let from = took[0]
            .split_whitespace()
            .find_map(|w| w.strip_prefix("from="))
            .unwrap_or_else(|| panic!("no from= in {}", took[0]));
        if from != leader_id {
            relayed += 1;
        }
        // The leader's ping announced the hash of the LZ4 body, which relays pass on as it
        // came: the follower checked that instead of hashing the data.
        let vouched = metric(node, "verwalter_schedules_checked_total{by=\"body_hash\"}");
        assert!(vouched >= 1.0, "{}: {vouched}\n{logs}", node.host);
        let (code, body) = http_get_at(&node.host, node.port, "/v1/schedule").unwrap();
        assert_eq!(code, 200);
        let plain: Value = serde_json::from_str(&body).expect("plain JSON without gzip");
        assert_eq!(plain["hash"], second.as_str());
    }
    assert!(
        relayed >= 3,
        "a chain of four relays three:\n{}",
        cluster.logs()
    );
    // The leader served its schedules compressed, and fewer of them than the followers took.
    let served = metric(
        leader_node,
        "verwalter_schedules_served_total{encoding=\"x-verwalter-lz4\"}",
    );
    assert!(
        served >= 1.0 && served < took_all as f64,
        "served {served}, taken {took_all}"
    );
}

/// A scheduler giving roles `reader` and `plain` the same ~30 KiB of services in their own
/// variables (each node renders both), at the version in `runtime/big.json`.
const BIG_SHARED_SCHEDULER: &str = r#"
return {scheduler = function(state)
  local hosts = {state.current_host}
  for _, peer in pairs(state.peers) do hosts[#hosts + 1] = peer.hostname end
  local v = state.runtime.big and state.runtime.big.v or 0
  local services = {}
  for i = 1, 400 do
    services[string.format("s%04d", i)] = {image = "registry.example.com/app-" .. i .. ":" .. v,
                                           port = 8000 + i}
  end
  local nodes = {}
  for _, host in ipairs(hosts) do nodes[host] = {roles = {reader = {}, plain = {}}} end
  return {vars = {v = v},
          roles = {reader = {template = "named/v1", services = services},
                   plain = {template = "plain/v1", services = services}},
          nodes = nodes}, "ok"
end}
"#;

#[test]
fn a_follower_renders_a_big_shared_role_and_logs_its_changes_as_the_leader_does() {
    let cluster = Cluster::start_n(2);
    let (leader, _) = cluster.converged();
    let out = cluster.tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Every node: a template dir whose template reads the services, one whose does not.
    for n in 1..=2 {
        let config = cluster.tmp.path().join(format!("config{n}"));
        for (dir, template) in [
            (
                "named",
                "{{#each services}}{{@key}}={{image}}\n{{/each}}v={{v}}\n",
            ),
            ("plain", "v={{v}}\n"),
        ] {
            let at = config.join(format!("templates/{dir}/v1"));
            let copy = out.join(format!("{dir}{n}.txt"));
            replace_file(&at.join("t.hbs"), template);
            replace_file(
                &at.join("t.render.yaml"),
                &format!(
                    "templates: {{t: t.hbs}}\ncommands:\n- !Cmd [cp, \"{{{{ files.t }}}}\", {}]\n",
                    copy.display()
                ),
            );
        }
        replace_file(&config.join("runtime/big.json"), "{\"v\": 1}");
        replace_file(&config.join("scheduler/v1/main.lua"), BIG_SHARED_SCHEDULER);
    }
    let follower = 2 - leader;
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    for v in [1, 2] {
        if v == 2 {
            let runtime = format!("config{}/runtime/big.json", leader + 1);
            replace_file(&cluster.tmp.path().join(runtime), "{\"v\": 2}");
        }
        // The follower took the leader's schedule vouched for by its body's hash (it keeps the
        // services as text); both render what the leader renders.
        for n in [leader + 1, follower] {
            wait_for(SOON, || {
                let named = read(&format!("named{n}.txt"));
                (named.ends_with(&format!("s0400=registry.example.com/app-400:{v}\nv={v}\n"))
                    && named.starts_with(&format!("s0001=registry.example.com/app-1:{v}\n"))
                    && read(&format!("plain{n}.txt")) == format!("v={v}\n"))
                .then_some(())
            })
            .unwrap_or_else(|| panic!("node {n} did not render v{v}:\n{}", cluster.logs()));
        }
    }
    let node = cluster.nodes[follower - 1].as_ref().unwrap();
    assert!(metric(node, "verwalter_schedules_checked_total{by=\"body_hash\"}") >= 1.0);
    // Each role's log on each node: the services whole, then what changed.
    for n in [leader + 1, follower] {
        for role in ["reader", "plain"] {
            let dir = cluster.tmp.path().join(format!("storage{n}/log/{role}"));
            let log = read_tree(&dir);
            assert!(
                log.contains("Template variables: more than 50 changes since deployment ")
                    && log.contains(
                        "  changed services.s0001.image: \"registry.example.com/app-1:1\" -> \
                         \"registry.example.com/app-1:2\"\n"
                    )
                    && log.contains(
                        "  changed services.s0050.image: \"registry.example.com/app-50:1\" -> \
                         \"registry.example.com/app-50:2\"\n  ... and more\n"
                    ),
                "node {n}, {role}:\n{log}"
            );
        }
    }
}

/// Every file under `dir`, read and joined.
fn read_tree(dir: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            text.push_str(&read_tree(&path));
        } else {
            text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    text
}

/// `examples/cluster/run.sh`'s output: its lines, as they come.
struct RunSh {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl RunSh {
    /// The first line so far for which `want` holds, waiting for it if none has come yet (the
    /// nodes' lines interleave in any order; every line read is kept in `seen`).
    fn until(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        if let Some(line) = self.seen.iter().find(|l| want(l)) {
            return line.clone();
        }
        let deadline = std::time::Instant::now() + SOON;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(_) => panic!("run.sh printed no {what}:\n{}", self.seen.join("\n")),
            }
        }
    }
}

impl Drop for RunSh {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

fn alive(pid: &str) -> bool {
    // A zombie (exited, not yet reaped by run.sh) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

/// `make cluster` as a user runs it, with the test's binaries in place of the release build
/// (`VERWALTER`, `FAKE_CANTAL`) and ports the system picks (`PORT=0`: the other nodes take
/// node 1's): every node's log lines reach the terminal labelled with its name, each node has a
/// pid file, `make cluster-stop NODE=beta` stops beta only (and says so; a second stop says it
/// is not running), and stopping run.sh stops the rest and removes the pid files. The example
/// scheduler gives every node a share of the instances (issue 31: it gave all to the leader).
#[test]
fn make_cluster_labels_each_nodes_lines_and_stops_one_node() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(top.join("examples/cluster/run.sh"))
        .env("VERWALTER", BIN)
        .env("FAKE_CANTAL", fake_cantal())
        .env("CLUSTER_DIR", &dir)
        .env("PORT", "0")
        .env("CANTAL_PORT", "0")
        .env("N", "3")
        .env_remove("LABELS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (send, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    let mut run = RunSh {
        child,
        lines,
        seen: Vec::new(),
    };

    // Each node's lines come labelled; the port is the one node 1 was given.
    let mut port = 0;
    for (i, name) in NAMES.iter().enumerate() {
        let line = run.until(&format!("{name}'s Listening. line"), |l| {
            l.starts_with(&format!("{name} | ")) && l.contains("Listening.")
        });
        assert!(line.contains(&format!("addr=127.0.0.{}:", i + 1)), "{line}");
        let this = listening_port(line.split_once(" | ").unwrap().1).unwrap();
        assert!(port == 0 || port == this, "{line}");
        port = this;
    }
    let leader = run.until("leader", |l| l.contains("is_leader=true"));
    let leader = NAMES
        .iter()
        .position(|n| leader.starts_with(&format!("{n} | ")))
        .unwrap();
    // The example scheduler deals the instances out over the nodes, the leader first (cache x1,
    // then web x2): each node has one, and every node renders both roles with its share.
    let shares = wait_for(SOON, || {
        let mut shares = Vec::new();
        for i in 0..NAMES.len() {
            let host = format!("127.0.0.{}", i + 1);
            let (code, body) = http_get_at(&host, port, "/v1/roles_data")?;
            let data: Value = serde_json::from_str(&body).ok().filter(|_| code == 200)?;
            let rendered = data["last_deployment"]["roles"].as_array()?;
            if rendered.len() != 2 || data["last_deployment"]["finished"].is_null() {
                return None;
            }
            let to_render = &data["to_render"];
            shares.push((
                to_render["cache"]["instances"].as_u64()?,
                to_render["web"]["instances"].as_u64()?,
            ));
        }
        Some(shares)
    })
    .unwrap_or_else(|| panic!("not every node rendered:\n{}", run.seen.join("\n")));
    for (i, share) in shares.iter().enumerate() {
        let want = if i == leader { (1, 0) } else { (0, 1) };
        assert_eq!(
            *share, want,
            "{}: {shares:?}, {} leads",
            NAMES[i], NAMES[leader]
        );
    }
    let pid = |name: &str| std::fs::read_to_string(dir.join(name).join("pid")).ok();
    let pids: Vec<String> = NAMES
        .iter()
        .map(|n| pid(n).unwrap().trim().to_string())
        .collect();
    assert!(pids.iter().all(|p| alive(p)), "{pids:?}");

    // Stop beta by name.
    let make = |node: &str| {
        Command::new("make")
            .args(["-s", "-C"])
            .arg(top)
            .arg("cluster-stop")
            .arg(format!("NODE={node}"))
            .env("CLUSTER_DIR", &dir)
            .output()
            .unwrap()
    };
    let out = make("beta");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("beta: stopped (pid {})\n", pids[1])
    );
    assert!(!alive(&pids[1]));
    assert_eq!(pid("beta"), None, "beta's pid file is removed");
    // Its last lines reach the terminal labelled too.
    run.until("beta's Shutting down.", |l| {
        l.starts_with("beta | ") && l.contains("Shutting down.")
    });
    // The others run on and answer.
    for (i, p) in pids.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert!(alive(p), "{} stopped too", NAMES[i]);
        let host = format!("127.0.0.{}", i + 1);
        assert_eq!(http_get_at(&host, port, "/v1/status").unwrap().0, 200);
    }
    let again = make("beta");
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("beta: no ")
            && String::from_utf8_lossy(&again.stderr).contains("the node is not running"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let usage = Command::new("make")
        .args(["-s", "-C"])
        .arg(top)
        .arg("cluster-stop")
        .output()
        .unwrap();
    assert!(!usage.status.success());
    assert!(String::from_utf8_lossy(&usage.stderr).contains("usage: make cluster-stop NODE="));

    // SIGTERM to run.sh (as Ctrl-C): every node stops, the pid files go.
    drop(run);
    for (i, p) in pids.iter().enumerate() {
        assert!(!alive(p), "{} still runs", NAMES[i]);
    }
    assert!(NAMES.iter().all(|n| pid(n).is_none()));
    assert!(!dir.join("cantal.pid").exists());
}
