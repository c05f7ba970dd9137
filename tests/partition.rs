//! Network partitions between real processes. Five nodes on 127.0.0.21–25 reach each other only
//! through forwarding proxies the test runs, one per direction and pair (node i reaches node j
//! at 127.0.(10+i).j, UDP and TCP, same port), so the test can cut and heal any link. Peers come
//! from a static list in each node's settings file.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

const N: usize = 5;

/// The address of node `n`: 127.0.0.21–25, which no other test binds. The nodes share one port,
/// picked by the system for a proxy socket; another test's daemon on 127.0.0.1 may be given the
/// same port number, which is harmless on other addresses (it once took node 1's port when the
/// nodes were on 127.0.0.1–5).
fn node_ip(n: usize) -> String {
    format!("127.0.0.{}", 20 + n)
}
const SOON: Duration = Duration::from_secs(30);

fn id(n: usize) -> String {
    format!("77985419c732412ea38b94db{n:08}")
}

fn proxy_ip(from: usize, to: usize) -> String {
    format!("127.0.{}.{to}", 10 + from)
}

/// A direction between two nodes: (from, to).
type Link = (usize, usize);

/// The links and which of them are cut.
#[derive(Clone, Default)]
struct Net {
    cut: Arc<Mutex<BTreeSet<Link>>>,
    /// Open proxied TCP connections per link, shut down when the link is cut.
    open: Arc<Mutex<Vec<(Link, TcpStream)>>>,
    stop: Arc<AtomicBool>,
}

impl Net {
    fn is_cut(&self, link: Link) -> bool {
        self.cut.lock().unwrap().contains(&link)
    }

    /// Cuts every link between `a` and `b` (both directions).
    fn split(&self, a: &[usize], b: &[usize]) {
        let mut cut = self.cut.lock().unwrap();
        for &i in a {
            for &j in b {
                cut.insert((i, j));
                cut.insert((j, i));
            }
        }
        drop(cut);
        let mut open = self.open.lock().unwrap();
        open.retain(|(link, stream)| {
            if self.is_cut(*link) {
                let _ = stream.shutdown(Shutdown::Both);
                false
            } else {
                true
            }
        });
    }

    fn heal(&self) {
        self.cut.lock().unwrap().clear();
    }

    /// Starts the proxies of link `from` → `to`: datagrams arrive on `udp` (bound at the address
    /// `from` has for `to`) and leave through `back`, the socket of the opposite link, so that
    /// `to` sees them come from the address it has for `from` (nodes drop election packets from
    /// any other source address).
    fn link(&self, from: usize, to: usize, port: u16, udp: UdpSocket, back: UdpSocket) {
        let target = format!("{}:{port}", node_ip(to));
        udp.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let net = self.clone();
        let udp_target = target.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !net.stop.load(Ordering::Relaxed) {
                if let Ok((n, _)) = udp.recv_from(&mut buf)
                    && !net.is_cut((from, to))
                {
                    let _ = back.send_to(&buf[..n], &udp_target);
                }
            }
        });
        let tcp = TcpListener::bind((proxy_ip(from, to).as_str(), port)).unwrap();
        tcp.set_nonblocking(true).unwrap();
        let net = self.clone();
        std::thread::spawn(move || {
            while !net.stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = tcp.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                if net.is_cut((from, to)) {
                    continue; // dropped: the client sees the connection closed
                }
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let mut open = net.open.lock().unwrap();
                open.push(((from, to), client.try_clone().unwrap()));
                open.push(((from, to), server.try_clone().unwrap()));
                drop(open);
                for (mut a, mut b) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = a.read(&mut buf) {
                            if n == 0 || b.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = b.shutdown(Shutdown::Write);
                    });
                }
            }
        });
    }
}

struct Node {
    n: usize,
    port: u16,
    child: Child,
    log: std::path::PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn start(n: usize, dir: &Path, port: u16, minority: bool, keyed: bool, window_ms: u64) -> Node {
        let peers: String = (1..=N)
            .filter(|&j| j != n)
            .map(|j| {
                format!(
                    "- {{id: {}, addr: \"{}:{port}\", hostname: node{j}}}\n",
                    id(j),
                    proxy_ip(n, j)
                )
            })
            .collect();
        let settings = dir.join(format!("settings{n}.yaml"));
        // Relative to the settings file; the key file is the same for every node.
        let key = if keyed {
            "  key-file: cluster.key\n"
        } else {
            ""
        };
        std::fs::write(
            &settings,
            format!(
                "peers:\n{peers}allow-minority-cluster: {minority}\n\
                 election:\n  minority-window-ms: {window_ms}\n{key}"
            ),
        )
        .unwrap();
        let (mut command, log) = cluster_node(dir, n);
        let child = command
            .args(["--hostname", &format!("node{n}")])
            .args(["--host", &node_ip(n), "--port", &port.to_string()])
            .args(["--override-machine-id", &id(n)])
            .arg("--settings")
            .arg(&settings)
            .spawn()
            .unwrap();
        Node {
            n,
            port,
            child,
            log,
        }
    }

    fn json(&self, path: &str) -> Option<Value> {
        let (code, body) = http_get_at(&node_ip(self.n), self.port, path)?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    /// The value of one metric series (`name{labels}`), 0 when it is not there yet.
    fn counter(&self, series: &str) -> Option<f64> {
        let (_, body) = http_get_at(&node_ip(self.n), self.port, "/metrics")?;
        Some(
            body.lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
                .unwrap_or(0.0),
        )
    }

    /// Elections the node started (each round of a pre-vote counts), over every reason.
    fn elections_started(&self) -> Option<f64> {
        let (_, body) = http_get_at(&node_ip(self.n), self.port, "/metrics")?;
        Some(
            body.lines()
                .filter(|l| l.starts_with("verwalter_elections_started_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    /// The election epoch the node is at.
    fn epoch(&self) -> Option<u64> {
        self.json("/v1/election")?["epoch"].as_u64()
    }

    fn is_leader(&self) -> bool {
        self.json("/v1/status")
            .is_some_and(|s| s["election_state"]["is_leader"] == true)
    }
}

struct Site {
    tmp: tempfile::TempDir,
    net: Net,
    nodes: Vec<Node>,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.net.stop.store(true, Ordering::Relaxed);
    }
}

impl Site {
    fn start(minority: bool) -> Site {
        Site::start_with(minority, false)
    }

    /// With `keyed`, every node has the same `election.key-file`.
    fn start_with(minority: bool, keyed: bool) -> Site {
        Site::start_windowed(minority, keyed, 1500)
    }

    /// With `window_ms` as every node's `election.minority-window-ms`.
    fn start_windowed(minority: bool, keyed: bool, window_ms: u64) -> Site {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("cluster.key"),
            "a shared secret, 32 bytes long\n",
        )
        .unwrap();
        // One port for every node and proxy, as on real machines: the system picks it for the
        // first proxy socket, which the test holds (no bind-and-release window); the other
        // addresses are this test's own.
        let net = Net::default();
        let mut udp = std::collections::BTreeMap::new();
        let mut port = 0;
        for i in 1..=N {
            for j in (1..=N).filter(|&j| j != i) {
                let socket = UdpSocket::bind((proxy_ip(i, j).as_str(), port)).unwrap();
                port = socket.local_addr().unwrap().port();
                udp.insert((i, j), socket);
            }
        }
        for i in 1..=N {
            for j in (1..=N).filter(|&j| j != i) {
                let recv = udp[&(i, j)].try_clone().unwrap();
                let back = udp[&(j, i)].try_clone().unwrap();
                net.link(i, j, port, recv, back);
            }
        }
        let nodes = (1..=N)
            .map(|n| Node::start(n, tmp.path(), port, minority, keyed, window_ms))
            .collect();
        Site { tmp, net, nodes }
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "=== node{} ===\n{}",
                    n.n,
                    std::fs::read_to_string(&n.log).unwrap_or_default()
                )
            })
            .collect()
    }

    /// Waits until exactly one node of `side` (node numbers) leads and every node of `side`
    /// holds a schedule it made; returns the leader's number.
    fn converged(&self, side: &[usize]) -> usize {
        wait_for(SOON, || {
            let nodes: Vec<&Node> = self.nodes.iter().filter(|n| side.contains(&n.n)).collect();
            let leaders: Vec<usize> = nodes
                .iter()
                .filter(|n| n.is_leader())
                .map(|n| n.n)
                .collect();
            let [leader] = leaders[..] else { return None };
            let origins: BTreeSet<String> = nodes
                .iter()
                .map(|n| Some(n.json("/v1/schedule")?["origin"].as_str()?.to_string()))
                .collect::<Option<_>>()?;
            (origins == BTreeSet::from([id(leader)])).then_some(leader)
        })
        .unwrap_or_else(|| panic!("side {side:?} did not converge:\n{}", self.logs()))
    }
}

/// The wiring of the election under a real split (the rules themselves are unit-tested and
/// simulated in `controllers/src/cluster/election/`): without minority mode, a leader cut off into a
/// minority stops leading once it has not heard from a majority for a leader timeout; its
/// follower then reports no leader and keeps the schedule it holds, and the minority holds
/// elections that nobody wins, while the majority elects its own leader. The minority's
/// elections never get past a pre-vote, so they do not raise its epochs past the majority's
/// leader's, and after the heal that leader leads on at its epoch (issue 28: before, the
/// minority's burnt epochs deposed it). The nodes share a key: they elect as usual, and an
/// untagged (0.13) ping from a listed address is dropped.
#[test]
fn a_leader_cut_off_into_a_minority_steps_down() {
    let site = Site::start_with(false, true);
    let all: Vec<usize> = (1..=N).collect();
    let leader = site.converged(&all);
    let follower = *all.iter().find(|&&n| n != leader).unwrap();
    untagged_pings_are_dropped(&site, leader, follower);
    let minority = [leader, follower];
    let majority: Vec<usize> = all
        .iter()
        .copied()
        .filter(|n| !minority.contains(n))
        .collect();
    let held = site.nodes[follower - 1].json("/v1/schedule").unwrap()["hash"].clone();
    let started: Vec<f64> = minority
        .iter()
        .map(|n| site.nodes[n - 1].elections_started().unwrap())
        .collect();
    site.net.split(&majority, &minority);
    let stepped_down = wait_for(SOON, || {
        let series = "verwalter_elections_started_total{reason=\"lost_majority\"}";
        let counted = site.nodes[leader - 1].counter(series)? >= 1.0;
        (counted && !site.nodes[leader - 1].is_leader()).then_some(())
    });
    assert!(
        stepped_down.is_some(),
        "node{leader} still leads its minority:\n{}",
        site.logs()
    );
    let next = site.converged(&majority);
    assert_ne!(next, leader);
    // The majority has its leader now; the minority gets none (the follower times out on the
    // pings that stopped), and keeps its schedule.
    let leaderless = wait_for(SOON, || {
        minority
            .iter()
            .all(|n| {
                site.nodes[n - 1]
                    .json("/v1/election")
                    .is_some_and(|e| e["is_leader"] == false && e["leader"] == Value::Null)
            })
            .then_some(())
    });
    assert!(
        leaderless.is_some(),
        "the minority still reports a leader:\n{}",
        site.logs()
    );
    // Until the minority has started three elections per node since the split (its nodes
    // passed their leader timeouts and lost rounds), none of them leads.
    let rounds = wait_for(SOON, || {
        let mut since = 0.0;
        for (n, before) in minority.iter().zip(&started) {
            let node = &site.nodes[n - 1];
            assert!(
                !node.is_leader(),
                "node{n} of the minority leads:\n{}",
                site.logs()
            );
            since += node.elections_started()? - before;
        }
        (since >= 3.0 * minority.len() as f64).then_some(())
    });
    assert!(
        rounds.is_some(),
        "the minority stopped holding elections:\n{}",
        site.logs()
    );
    let schedule = site.nodes[follower - 1].json("/v1/schedule").unwrap();
    assert_eq!(schedule["hash"], held, "node{follower} lost its schedule");
    // Those elections asked first (pre-votes) and got no yes from the majority: the minority's
    // epochs stay at most the majority leader's.
    let epoch = site.nodes[next - 1].epoch().unwrap();
    for n in minority {
        let at = site.nodes[n - 1].epoch().unwrap();
        assert!(
            at <= epoch,
            "node{n} of the minority raised its epoch to {at} (the leader's: {epoch}):\n{}",
            site.logs()
        );
    }
    site.net.heal();
    let healed = site.converged(&all);
    assert_eq!(
        (healed, site.nodes[healed - 1].epoch().unwrap()),
        (next, epoch),
        "the heal moved leadership:\n{}",
        site.logs()
    );
}

/// Minority mode over real sockets: split 3/2 with the leader on the two-node side, both sides
/// lead, each schedules a new version; after the heal the surviving leader's scheduler gets both
/// sides' last schedules as parents (issue 10: the three-node side's leader survives the heal
/// and must still get the two-node side's). The other placements and the gathering rules are
/// simulated in `controllers/src/cluster/election/sim.rs` and unit-tested in `replication/tests.rs`.
#[test]
fn with_minority_mode_both_sides_lead_and_the_healed_leader_merges_both() {
    let site = Site::start(true);
    let all: Vec<usize> = (1..=N).collect();
    let first = site.converged(&all);
    let mut others = all.iter().copied().filter(|&n| n != first);
    let minority = vec![first, others.next().unwrap()];
    let majority: Vec<usize> = all
        .iter()
        .copied()
        .filter(|n| !minority.contains(n))
        .collect();
    site.net.split(&majority, &minority);
    let other = site.converged(&majority);
    assert_eq!(site.converged(&minority), first);
    let leader = first;
    assert_ne!(other, leader);
    // Each side moves on: its leader gets a new runtime version and schedules it.
    for (side_leader, version) in [(leader, "v8"), (other, "v9")] {
        let file = site
            .tmp
            .path()
            .join(format!("config{side_leader}/runtime/web/{version}.yaml"));
        std::fs::write(file, "image: web\ninstances: 1\n").unwrap();
        wait_for(SOON, || {
            let schedule = site.nodes[side_leader - 1].json("/v1/schedule")?;
            (schedule["data"]["roles"]["web"]["version"] == version).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "node{side_leader} did not schedule {version}:\n{}",
                site.logs()
            )
        });
    }

    site.net.heal();
    let healed = site.converged(&all);
    // The healed leader's scheduler got both sides' last schedules as parents: the one with
    // v8 and the one with v9 (the schedule from before the split names the same hosts, so the
    // versions are what tells the sides' last schedules apart).
    let parents = wait_for(SOON, || {
        let input = site.nodes[healed - 1].json("/v1/scheduler_input")?;
        let versions: BTreeSet<String> = input["parents"]
            .as_array()?
            .iter()
            .filter_map(|p| Some(p["roles"]["web"]["version"].as_str()?.to_string()))
            .collect();
        (versions.contains("v8") && versions.contains("v9")).then_some(versions)
    });
    assert!(
        parents.is_some(),
        "parents of node{healed} lack a side's last schedule (leaders node{leader} and node{other}):\n{}",
        site.logs()
    );
}

/// With a shared key: a ping without a tag, from the address `follower` has for another
/// follower and at a newer epoch, is dropped as `bad_auth`; `leader` still leads.
fn untagged_pings_are_dropped(site: &Site, leader: usize, follower: usize) {
    use verwalter_controllers::cluster::election::wire::{Kind, Packet};
    let node = &site.nodes[follower - 1];
    let other = (1..=N).find(|&n| n != leader && n != follower).unwrap();
    let epoch = node.json("/v1/election").unwrap()["epoch"]
        .as_u64()
        .unwrap();
    let packet = Packet {
        from: id(other),
        epoch: epoch + 1,
        schedule: None,
        kind: Kind::Ping,
        lz4_sha1: None,
    };
    let socket = UdpSocket::bind((proxy_ip(follower, other).as_str(), 0)).unwrap();
    socket
        .send_to(&packet.encode().unwrap(), (node_ip(follower), node.port))
        .unwrap();
    let series = "verwalter_election_messages_dropped_total{reason=\"bad_auth\"}";
    let dropped = wait_for(SOON, || (node.counter(series)? >= 1.0).then_some(()));
    assert!(
        dropped.is_some(),
        "the untagged ping was not dropped:\n{}",
        site.logs()
    );
    let election = node.json("/v1/election").unwrap();
    assert_eq!(election["leader"], id(leader), "{election}");
}

/// Issue 28: minority mode (its window shortened to 6 s by `election.minority-window-ms`), split
/// 3/2 with the leader on the three-node side. The two-node side elects its own leader once
/// the window has passed, without burning epochs meanwhile (its nodes ask first, with
/// pre-votes: 0.13's rules took it about one epoch per 375 ms round, 10 and more here), and
/// each side schedules a change; after the heal the surviving leader's scheduler has both
/// sides' last schedules as parents.
#[test]
fn with_minority_mode_a_heal_keeps_both_sides_schedules_when_the_majority_kept_its_leader() {
    let site = Site::start_windowed(true, false, 6000);
    let all: Vec<usize> = (1..=N).collect();
    let leader = site.converged(&all);
    let minority: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&n| n != leader)
        .take(2)
        .collect();
    let majority: Vec<usize> = all
        .iter()
        .copied()
        .filter(|n| !minority.contains(n))
        .collect();
    let at_split = site.nodes[leader - 1].epoch().unwrap();
    site.net.split(&majority, &minority);
    let other = site.converged(&minority);
    assert_eq!(site.converged(&majority), leader);
    let other_epoch = site.nodes[other - 1].epoch().unwrap();
    let started: f64 = minority
        .iter()
        .map(|n| site.nodes[n - 1].elections_started().unwrap())
        .sum();
    // A real election per epoch (a split vote between the two costs one more), not one per
    // round of the window.
    assert!(
        other_epoch <= at_split + 3,
        "the minority's leader node{other} is at epoch {other_epoch}, split at {at_split} \
         ({started} elections started):\n{}",
        site.logs()
    );
    for (side_leader, version) in [(leader, "v8"), (other, "v9")] {
        let file = site
            .tmp
            .path()
            .join(format!("config{side_leader}/runtime/web/{version}.yaml"));
        std::fs::write(file, "image: web\ninstances: 1\n").unwrap();
        wait_for(SOON, || {
            let schedule = site.nodes[side_leader - 1].json("/v1/schedule")?;
            (schedule["data"]["roles"]["web"]["version"] == version).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "node{side_leader} did not schedule {version}:\n{}",
                site.logs()
            )
        });
    }
    site.net.heal();
    let healed = site.converged(&all);
    let parents = wait_for(SOON, || {
        let input = site.nodes[healed - 1].json("/v1/scheduler_input")?;
        let versions: BTreeSet<String> = input["parents"]
            .as_array()?
            .iter()
            .filter_map(|p| Some(p["roles"]["web"]["version"].as_str()?.to_string()))
            .collect();
        (versions.contains("v8") && versions.contains("v9")).then_some(versions)
    });
    assert!(
        parents.is_some(),
        "parents of node{healed} lack a side's last schedule (leaders node{leader} and \
         node{other}): {:?}\n{}",
        site.nodes[healed - 1]
            .json("/v1/scheduler_input")
            .map(|i| i["parents"].clone()),
        site.logs()
    );
}
