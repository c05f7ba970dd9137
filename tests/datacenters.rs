//! Several data centers (docs/datacenters.md) between real processes: two DCs of two nodes on
//! 127.0.0.41–44, every node listing all the others with their `datacenter:`. Each DC elects
//! its own leader and no election packet crosses.

use std::net::TcpListener;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

const SOON: Duration = Duration::from_secs(30);

/// 127.0.0.41–44, which no other test binds.
fn node_ip(n: usize) -> String {
    format!("127.0.0.{}", 40 + n)
}

fn id(n: usize) -> String {
    format!("77985419c732412ea38b94db{n:08}")
}

/// Nodes 1 and 2 are in `ams`, 3 and 4 in `fra`.
fn dc(n: usize) -> &'static str {
    if n <= 2 { "ams" } else { "fra" }
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
    /// Node `n` of four; `ams` gets its DC from the settings file, `fra` from the flag.
    fn start(n: usize, dir: &Path, port: u16) -> Node {
        let peers: String = (1..=4)
            .filter(|&j| j != n)
            .map(|j| {
                format!(
                    "- {{id: {}, addr: \"{}:{port}\", hostname: node{j}, datacenter: {}}}\n",
                    id(j),
                    node_ip(j),
                    dc(j)
                )
            })
            .collect();
        let own = if dc(n) == "ams" {
            "datacenter: ams\n"
        } else {
            ""
        };
        let settings = dir.join(format!("settings{n}.yaml"));
        std::fs::write(&settings, format!("{own}peers:\n{peers}")).unwrap();
        let (mut command, log) = cluster_node(dir, n);
        if dc(n) == "fra" {
            command.args(["--datacenter", "fra"]);
        }
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

    /// The sum of a metric's series whose line starts with `prefix`.
    fn metric_sum(&self, prefix: &str) -> Option<f64> {
        let (_, body) = http_get_at(&node_ip(self.n), self.port, "/metrics")?;
        Some(
            body.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    /// The leader this node is stable with, if any.
    fn stable_leader(&self) -> Option<String> {
        let election = self.json("/v1/election")?;
        (election["is_stable"] == true)
            .then(|| election["leader"].as_str().map(str::to_string))
            .flatten()
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

#[test]
fn each_datacenter_elects_its_own_leader_and_no_election_packet_crosses() {
    let tmp = tempfile::tempdir().unwrap();
    // The nodes share a port number; it is held on 127.0.0.1 for the whole test, so no other
    // test's daemon gets it, and the nodes use it on their own addresses.
    let hold = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hold.local_addr().unwrap().port();
    let nodes: Vec<Node> = (1..=4).map(|n| Node::start(n, tmp.path(), port)).collect();
    let all_logs = || {
        nodes
            .iter()
            .map(|n| format!("--- node{}\n{}", n.n, n.logs()))
            .collect::<String>()
    };
    // Every node stable with a leader of its own DC, both nodes of a DC with the same one: one
    // leader per DC (four nodes in one cluster would have one leader in all).
    let leaders = wait_for(SOON, || {
        let leaders: Vec<String> = nodes
            .iter()
            .map(Node::stable_leader)
            .collect::<Option<_>>()?;
        (leaders[0] == leaders[1] && leaders[2] == leaders[3]).then_some(leaders)
    })
    .unwrap_or_else(|| panic!("no leader in each DC:\n{}", all_logs()));
    let leader_node = |leader: &str| (1..=4).find(|&n| id(n) == leader).unwrap();
    assert_eq!(dc(leader_node(&leaders[0])), "ams", "{leaders:?}");
    assert_eq!(dc(leader_node(&leaders[2])), "fra", "{leaders:?}");
    for node in &nodes {
        // Only the other node of its DC is a peer.
        let peers = node.json("/v1/peers").unwrap();
        let ids: Vec<&str> = peers
            .as_array()
            .map(|list| list.iter().filter_map(|p| p["id"].as_str()).collect())
            .unwrap_or_default();
        let mate = if node.n % 2 == 1 {
            node.n + 1
        } else {
            node.n - 1
        };
        assert_eq!(ids, [id(mate)], "node{}: {peers}", node.n);
        let other = if dc(node.n) == "ams" { "fra" } else { "ams" };
        assert!(
            node.logs().contains("Other data centers changed.")
                && node.logs().contains(&format!("{other:?}")),
            "node{}: {}",
            node.n,
            node.logs()
        );
    }
    // Many election packets later, none came from the other DC: a packet from a node outside
    // the peer list is dropped as `unknown_peer`.
    wait_for(SOON, || {
        nodes
            .iter()
            .all(|n| {
                n.metric_sum("verwalter_election_messages_received_total{")
                    .is_some_and(|sum| sum >= 20.0)
            })
            .then_some(())
    })
    .unwrap_or_else(|| panic!("too few election packets:\n{}", all_logs()));
    for node in &nodes {
        let crossed = node
            .metric_sum("verwalter_election_messages_dropped_total{reason=\"unknown_peer\"}")
            .unwrap();
        assert_eq!(crossed, 0.0, "node{}:\n{}", node.n, all_logs());
    }
    drop(hold);
}
