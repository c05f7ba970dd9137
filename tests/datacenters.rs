//! Several data centers (docs/datacenters.md) between real processes: two DCs of two nodes on
//! 127.0.0.41–44, every node listing all the others with their `datacenter:`. Each DC elects
//! its own leader and no election packet crosses.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use serde_json::Value;

use crate::dc_proxy::DcProxy;
use crate::util::*;

const SOON: Duration = Duration::from_secs(30);
/// The election's key, shared by every node, which signs exchanges too.
const KEY: &[u8] = b"a key shared by every node of the site";

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
        std::fs::write(
            &settings,
            format!("{own}peers:\n{peers}election:\n  key-file: cluster.key\n"),
        )
        .unwrap();
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
        metric_sum_at(&node_ip(self.n), self.port, prefix)
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
    std::fs::write(tmp.path().join("cluster.key"), KEY).unwrap();
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
    // A node that does not lead its DC sends another DC's leader to the one that does.
    let key = verwalter_controllers::cluster::datacenters::wire::DcKey::new(KEY).unwrap();
    for (node, leader) in [(&nodes[0], &leaders[0]), (&nodes[2], &leaders[2])] {
        let follower = if id(node.n) == *leader {
            &nodes[node.n]
        } else {
            node
        };
        let other = if dc(node.n) == "ams" { "fra" } else { "ams" };
        let (body, tag) = key.seal(&envelope(other, 1), 1 << 16).unwrap();
        let (code, _, text) = post_exchange_at(&node_ip(follower.n), port, &body, Some(&tag));
        assert_eq!(code, 409, "node{}: {text}", follower.n);
        let expected = format!("{}:{port}", node_ip(leader_node(leader)));
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            answer,
            serde_json::json!({"not_leader": true, "leader": expected})
        );
    }
    drop(hold);
}

/// An envelope of another DC's leader, with nothing in it.
fn envelope(dc: &str, seq: u64) -> verwalter_controllers::cluster::datacenters::wire::Envelope {
    verwalter_controllers::cluster::datacenters::wire::Envelope {
        v: 1,
        dc: dc.into(),
        node: id(9),
        addr: "127.0.0.1:9".into(),
        epoch: 1,
        seq,
        summary_hash: None,
        summary: None,
        have_summary: None,
        requests: Vec::new(),
        answers: Vec::new(),
    }
}

/// POST of an exchange body with its tag (if any) on 127.0.0.1; status, lower-cased head, body.
pub(crate) fn post_exchange(port: u16, body: &[u8], tag: Option<&str>) -> (u16, String, String) {
    post_exchange_at("127.0.0.1", port, body, tag)
}

fn post_exchange_at(
    host: &str,
    port: u16,
    body: &[u8],
    tag: Option<&str>,
) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect((host, port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let tag = tag.map_or(String::new(), |t| format!("x-verwalter-dc-tag: {t}\r\n"));
    let head = format!(
        "POST /v1/dc/exchange HTTP/1.0\r\nHost: verwalter\r\nContent-Type: application/json\r\n\
         {tag}Content-Length: {}\r\n\r\n",
        body.len()
    );
    // A body refused for its length may be cut off: the answer still comes.
    let _ = std::io::Write::write_all(&mut s, head.as_bytes())
        .and_then(|()| std::io::Write::write_all(&mut s, body));
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut s, &mut text);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_ascii_lowercase(), body.to_string())
}

/// One node of `ams` leading alone, with `fra` as an entry point: the checks of an exchange in
/// the order of docs/datacenters.md, and a forged envelope that changes nothing.
#[test]
fn the_exchange_route_takes_only_signed_envelopes_of_member_dcs() {
    use verwalter_controllers::cluster::datacenters::wire::DcKey;
    let (tmp, config, storage) = example_site("minimal");
    std::fs::write(tmp.path().join("cluster.key"), KEY).unwrap();
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(
        &settings,
        "datacenter: ams\nelection:\n  key-file: cluster.key\n\
         datacenters:\n  entry-points: {fra: [\"127.0.0.1:9\"]}\n  max-body-bytes: 4096\n",
    )
    .unwrap();
    let settings = settings.to_str().unwrap();
    let daemon = Daemon::launch(&config, &storage, &["--settings", settings], &[]);
    wait_for(SOON, || {
        daemon
            .logs()
            .contains("Exchanging with other data centers.")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no exchange started:\n{}", daemon.logs()));
    let key = DcKey::new(KEY).unwrap();
    let forger = DcKey::new(b"not the key of this site at all".to_vec()).unwrap();
    let port = daemon.port;
    // No tag, a forged one (seq 100: were it taken, seq 50 below would be stale).
    let (body, _) = key.seal(&envelope("fra", 100), 4096).unwrap();
    assert_eq!(post_exchange(port, &body, None).0, 403);
    let (body, tag) = forger.seal(&envelope("fra", 100), 4096).unwrap();
    assert_eq!(post_exchange(port, &body, Some(&tag)).0, 403);
    // Too big: refused for its length before its tag is looked at.
    assert_eq!(post_exchange(port, &vec![b' '; 4097], None).0, 413);
    // Signed, but from a DC outside the mesh, or from this node's own.
    for dc in ["lon", "ams"] {
        let (body, tag) = key.seal(&envelope(dc, 1), 4096).unwrap();
        assert_eq!(post_exchange(port, &body, Some(&tag)).0, 403, "{dc}");
    }
    // Signed by a member: taken, and the answer is this leader's envelope, signed.
    let (body, tag) = key.seal(&envelope("fra", 50), 4096).unwrap();
    let (code, head, reply) = post_exchange(port, &body, Some(&tag));
    assert_eq!(code, 200, "{head}\n{reply}\n{}", daemon.logs());
    let reply_tag = head
        .lines()
        .find_map(|l| l.strip_prefix("x-verwalter-dc-tag: "))
        .unwrap_or_else(|| panic!("no tag: {head}"));
    let reply = key.open(reply.as_bytes(), Some(reply_tag), 4096).unwrap();
    assert_eq!(
        (reply.dc.as_str(), reply.node.as_str()),
        ("ams", MACHINE_ID)
    );
    // The same again is a replay: from the newest sender, so answered (a call that a newer
    // envelope of its sender overtook is answered), but nothing in it taken.
    let (code, _, text) = post_exchange(port, &body, Some(&tag));
    assert_eq!(code, 200, "{text}");
    // From an older leadership of that DC: stale.
    let mut old = envelope("fra", 60);
    old.epoch = 0;
    let (body, tag) = key.seal(&old, 4096).unwrap();
    let (code, _, text) = post_exchange(port, &body, Some(&tag));
    assert_eq!(code, 409, "{text}");
    assert!(text.contains("\"stale\":true"), "{text}");
    // Each refusal counted by its reason.
    for (reason, count) in [
        ("bad_tag", 2.0),
        ("too_big", 1.0),
        ("unknown_dc", 2.0),
        ("stale", 1.0),
    ] {
        let series = format!("verwalter_dc_dropped_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(port, &series), Some(count), "{series}");
    }
}

/// Two DCs of one node each, reaching each other only through proxies of 20 ms each way
/// (`datacenters.advertise`; `ams`'s entry point for `fra` leads nowhere: `fra`'s first call
/// tells `ams` where it is). Both links come up, go down when the proxies cut, and come up
/// again after the heal, without a restart.
#[test]
fn dc_leaders_exchange_through_a_slow_link_and_find_each_other_again_after_a_cut() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("cluster.key"), KEY).unwrap();
    let start = |dc: &str, other: &str, entry: &str, advertise: &str| {
        let settings = tmp.path().join(format!("{dc}.yaml"));
        std::fs::write(
            &settings,
            format!(
                "datacenter: {dc}\nelection:\n  key-file: cluster.key\n\
                 datacenters:\n  entry-points: {{{other}: [\"{entry}\"]}}\n  period-ms: 200\n  \
                 link-timeout-ms: 1000\n  exchange-timeout-ms: 500\n  {advertise}"
            ),
        )
        .unwrap();
        let config = tmp.path().join(format!("config-{dc}"));
        copy_tree(&example("minimal"), &config);
        let storage = tmp.path().join(format!("storage-{dc}"));
        let settings = settings.to_str().unwrap().to_string();
        Daemon::launch(&config, &storage, &["--settings", &settings], &[])
    };
    // Each DC tells the other to call it through its proxy (envelopes name the address to
    // call): the proxies are bound first, then the daemons started, then the proxies aimed.
    let to_ams = DcProxy::bind("127.0.0.1", Duration::from_millis(20));
    let to_fra = DcProxy::bind("127.0.0.1", Duration::from_millis(20));
    let advertise = |proxy: &DcProxy| format!("advertise: \"{}\"\n", proxy.addr);
    let ams = start("ams", "fra", "127.0.0.1:9", &advertise(&to_ams));
    to_ams.forward_to(SocketAddr::from(([127, 0, 0, 1], ams.port)));
    let fra = start("fra", "ams", &to_ams.addr.to_string(), &advertise(&to_fra));
    to_fra.forward_to(SocketAddr::from(([127, 0, 0, 1], fra.port)));
    let links = |daemon: &Daemon, state: &str| {
        daemon
            .logs()
            .lines()
            .filter(|l| l.contains("Link to another data center changed.") && l.contains(state))
            .count()
    };
    let wait_links = |state: &str, count: usize| {
        wait_for(SOON, || {
            (links(&ams, state) >= count && links(&fra, state) >= count).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "links not {state} {count} times:\n--- ams\n{}\n--- fra\n{}",
                ams.logs(),
                fra.logs()
            )
        })
    };
    wait_links("link=Up", 1);
    // The listing shows the link, the leader's id and the address tried.
    let listing = ams.json("/v1/datacenters").unwrap();
    assert_eq!(listing["self"], "ams");
    assert_eq!(listing["leading"], true);
    assert_eq!(listing["addr"], to_ams.addr.to_string());
    assert_eq!(listing["dcs"]["fra"]["link"], "up", "{listing}");
    assert_eq!(listing["dcs"]["fra"]["leader"], MACHINE_ID, "{listing}");
    assert!(
        listing["dcs"]["fra"]["bytes_received"].as_u64() > Some(0),
        "{listing}"
    );
    // GraphQL shows the same (docs/http-api.md, "GraphQL").
    let gql = graphql_datacenters(ams.port);
    assert_eq!(gql["name"], "ams", "{gql}");
    assert_eq!(gql["leading"], true, "{gql}");
    assert_eq!(gql["dcs"][0]["name"], "fra", "{gql}");
    assert_eq!(gql["dcs"][0]["link"], "up", "{gql}");
    assert_eq!(gql["dcs"][0]["leader"], MACHINE_ID, "{gql}");
    assert!(gql["dcs"][0]["bytesReceived"].as_f64() > Some(0.0), "{gql}");
    assert!(gql["dcs"][0]["contactAgeMs"].is_number(), "{gql}");
    // And the metrics, per DC.
    let up = wait_for(SOON, || {
        metric(ams.port, "verwalter_dc_link_up{dc=\"fra\"}").filter(|v| *v == 1.0)
    });
    assert_eq!(up, Some(1.0));
    let ok = "verwalter_dc_exchanges_total{dc=\"ams\",result=\"ok\"}";
    assert!(metric(fra.port, ok) > Some(0.0));
    let received = "verwalter_dc_bytes_total{dc=\"fra\",direction=\"received\"}";
    assert!(metric(ams.port, received) > Some(0.0));
    to_ams.cut();
    to_fra.cut();
    wait_links("link=Down", 1);
    let listing = fra.json("/v1/datacenters").unwrap();
    assert_eq!(listing["dcs"]["ams"]["link"], "down", "{listing}");
    let down = wait_for(SOON, || {
        metric(fra.port, "verwalter_dc_link_up{dc=\"ams\"}").filter(|v| *v == 0.0)
    });
    assert_eq!(down, Some(0.0));
    to_ams.heal();
    to_fra.heal();
    wait_links("link=Up", 2);
}

/// `Query.datacenters` of the daemon on `port`, with the fields the tests read.
pub(crate) fn graphql_datacenters(port: u16) -> Value {
    let query = r#"{"query": "{ datacenters { name leading dcs { name link leader rttMs contactAgeMs bytesReceived } } }"}"#;
    let (code, body) = http_post(port, "/v1/graphql", "application/json", query.as_bytes());
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert!(answer.get("errors").is_none(), "{answer}");
    answer["data"]["datacenters"].clone()
}

/// `examples/multi-dc`'s config dir for `dc`, with the demand of each DC set.
fn multi_dc_config(dir: &Path, dc: &str, demand: &[(&str, u64)]) -> std::path::PathBuf {
    let config = dir.join(format!("config-{dc}"));
    copy_tree(&example("multi-dc"), &config);
    let site = config.join("runtime/site.yaml");
    let text = std::fs::read_to_string(&site).unwrap();
    let (head, _) = text
        .split_once("demand:\n")
        .expect("the example names the demand");
    let lines: String = demand
        .iter()
        .map(|(dc, n)| format!("  {dc}: {n}\n"))
        .collect();
    std::fs::write(&site, format!("{head}demand:\n{lines}")).unwrap();
    config
}

/// Two one-node DCs running `examples/multi-dc`'s scheduler as written: `ams` wants 12 workers
/// where its threshold allows 8, `fra` wants 2 and has 6 spare. Each DC's summary reaches the
/// other's scheduler input; `ams` asks `fra` for 4, `fra`'s scheduler answers, and the grant is
/// in `ams`'s schedule (what `fra` lends in `fra`'s).
#[test]
fn a_summary_reaches_the_other_dcs_scheduler_and_a_grant_the_borrowers_schedule() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("cluster.key"), KEY).unwrap();
    let demand = [("ams", 12), ("fra", 2)];
    let start = |dc: &str, other: &str, entry: &str| {
        let settings = tmp.path().join(format!("{dc}.yaml"));
        std::fs::write(
            &settings,
            format!(
                "datacenter: {dc}\nelection:\n  key-file: cluster.key\n\
                 datacenters:\n  entry-points: {{{other}: [\"{entry}\"]}}\n  period-ms: 200\n  \
                 link-timeout-ms: 1000\n  exchange-timeout-ms: 500\n"
            ),
        )
        .unwrap();
        let config = multi_dc_config(tmp.path(), dc, &demand);
        let storage = tmp.path().join(format!("storage-{dc}"));
        let settings = settings.to_str().unwrap().to_string();
        Daemon::launch(&config, &storage, &["--settings", &settings], &[])
    };
    // `ams` learns where `fra` is from `fra`'s first call.
    let ams = start("ams", "fra", "127.0.0.1:9");
    let fra = start("fra", "ams", &format!("127.0.0.1:{}", ams.port));
    let logs = || format!("--- ams\n{}\n--- fra\n{}", ams.logs(), fra.logs());
    let seen = |daemon: &Daemon, other: &str, key: &str| {
        let input = daemon.json("/v1/scheduler_input")?;
        let value = input["datacenters"]["dcs"][other]["summary"][key].as_f64()?;
        Some((value, input))
    };
    let (load, input) = wait_for(SOON, || seen(&fra, "ams", "load").filter(|(l, _)| *l > 1.0))
        .unwrap_or_else(|| panic!("ams's summary not in fra's input:\n{}", logs()));
    assert_eq!(load, 1.2, "12 of 10");
    assert_eq!(input["datacenters"]["self"], "fra", "{input}");
    let (spare, _) = wait_for(SOON, || seen(&ams, "fra", "spare"))
        .unwrap_or_else(|| panic!("fra's summary not in ams's input:\n{}", logs()));
    assert_eq!(spare, 6.0, "8 of 10 before borrowing, 2 wanted");
    // The request, answered by fra's scheduler, in ams's schedule: 12 - 8 = 4 borrowed.
    let schedule_of = |daemon: &Daemon| daemon.json("/v1/schedule").map(|s| s["data"].clone());
    let borrowed = wait_for(SOON, || {
        schedule_of(&ams).and_then(|d| d["borrowed"]["fra"].as_u64())
    })
    .unwrap_or_else(|| panic!("no grant in ams's schedule:\n{}", logs()));
    assert_eq!(borrowed, 4);
    let lent = wait_for(SOON, || {
        schedule_of(&fra).and_then(|d| d["lent"]["ams"].as_u64())
    });
    assert_eq!(lent, Some(4), "{}", logs());
    let input = ams.json("/v1/scheduler_input").unwrap();
    let answers = &input["datacenters"]["dcs"]["fra"]["answers"];
    assert_eq!(answers[0]["request"], "workers", "{input}");
    assert_eq!(
        answers[0]["data"],
        serde_json::json!({"workers": 4}),
        "{input}"
    );
    // Every entry of both schedulers' output was used.
    for daemon in [&ams, &fra] {
        let status = daemon.json("/v1/status").unwrap();
        assert_eq!(status["errors"], serde_json::json!({}), "{status}");
    }
}

/// The DCs of the nine-node site, three nodes each: node n (1–9) is in `SITE[(n - 1) / 3]`.
const SITE: [&str; 3] = ["ams", "fra", "lon"];

/// 127.0.0.51–59, which no other test binds.
fn site_ip(n: usize) -> String {
    format!("127.0.0.{}", 50 + n)
}

fn site_id(n: usize) -> String {
    format!("77985419c732412ea38b94dc{n:08}")
}

fn site_dc(n: usize) -> &'static str {
    SITE[(n - 1) / 3]
}

/// One node of the nine, reached by the other DCs only through `proxy` (its `advertise`, and
/// its address in their peer lists).
struct SiteNode {
    n: usize,
    port: u16,
    child: Child,
    log: std::path::PathBuf,
    proxy: DcProxy,
}

impl Drop for SiteNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SiteNode {
    fn json(&self, path: &str) -> Option<Value> {
        let (code, body) = http_get_at(&site_ip(self.n), self.port, path)?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The sum of a metric's series whose line starts with `prefix`.
    fn metric_sum(&self, prefix: &str) -> Option<f64> {
        metric_sum_at(&site_ip(self.n), self.port, prefix)
    }
}

/// Starts node `n` of the site on `port`, with the proxies of every node (`proxies[j - 1]`).
fn start_site_node(dir: &Path, n: usize, port: u16, proxies: &[std::net::SocketAddr]) -> Child {
    let peers: String = (1..=9)
        .filter(|&j| j != n)
        .map(|j| {
            // Its own DC's nodes directly (the election), the others through their proxies.
            let addr = if site_dc(j) == site_dc(n) {
                format!("{}:{port}", site_ip(j))
            } else {
                proxies[j - 1].to_string()
            };
            let (id, dc) = (site_id(j), site_dc(j));
            format!("- {{id: {id}, addr: \"{addr}\", hostname: node{j}, datacenter: {dc}}}\n")
        })
        .collect();
    let settings = dir.join(format!("settings{n}.yaml"));
    std::fs::write(
        &settings,
        format!(
            "datacenter: {}\npeers:\n{peers}election:\n  key-file: cluster.key\n\
             datacenters:\n  advertise: \"{}\"\n  period-ms: 300\n  link-timeout-ms: 1500\n  \
             exchange-timeout-ms: 1000\n",
            site_dc(n),
            proxies[n - 1]
        ),
    )
    .unwrap();
    // Each DC is short of workers or has some to spare: 30 per DC, 24 before borrowing.
    let demand = [("ams", 28), ("fra", 10), ("lon", 24)];
    let config = multi_dc_config(dir, &format!("node{n}"), &demand);
    let mut command = std::process::Command::new(BIN);
    command.arg("run");
    let log = dir.join(format!("node{n}.log"));
    with_dirs(
        &mut command,
        &config,
        &dir.join(format!("storage{n}")),
        &log,
    );
    command
        .args(["--hostname", &format!("node{n}")])
        .args(["--host", &site_ip(n), "--port", &port.to_string()])
        .args(["--override-machine-id", &site_id(n)])
        .arg("--settings")
        .arg(&settings)
        .spawn()
        .unwrap()
}

/// Three DCs of three nodes on 127.0.0.51–59 running `examples/multi-dc`'s scheduler as
/// written; every node reachable from the other DCs only through its own proxy, which delays
/// each way by 20 ms (`ams`), 60 ms (`fra`) or 100 ms (`lon`): round trips of 40–200 ms. `ams`
/// (28 wanted, 24 before borrowing) borrows 4 from `fra` (10 wanted); `lon` has nothing spare.
/// The grant reaches every node of `ams` in its schedule. Cutting `ams`'s and `fra`'s proxies
/// cuts the link between them both ways while `lon` still reaches both: the grant expires at
/// `ams` once its lease has run out since the last contact, and `fra` stops lending; after the
/// heal the grant comes back, no node restarted. No election packet ever crossed DCs.
#[test]
fn three_dcs_of_three_lend_through_slow_links_and_take_back_on_a_cut() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("cluster.key"), KEY).unwrap();
    let hold = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hold.local_addr().unwrap().port();
    let delay = |n: usize| Duration::from_millis([20, 60, 100][(n - 1) / 3]);
    let proxies: Vec<DcProxy> = (1..=9)
        .map(|n| {
            DcProxy::start(
                "127.0.0.1",
                format!("{}:{port}", site_ip(n)).parse().unwrap(),
                delay(n),
            )
        })
        .collect();
    let addrs: Vec<SocketAddr> = proxies.iter().map(|p| p.addr).collect();
    let nodes: Vec<SiteNode> = proxies
        .into_iter()
        .enumerate()
        .map(|(i, proxy)| SiteNode {
            n: i + 1,
            port,
            child: start_site_node(tmp.path(), i + 1, port, &addrs),
            log: tmp.path().join(format!("node{}.log", i + 1)),
            proxy,
        })
        .collect();
    let all_logs = || {
        nodes
            .iter()
            .map(|n| format!("--- node{}\n{}", n.n, n.logs()))
            .collect::<String>()
    };
    // A leader in each DC, of that DC, all three nodes agreeing.
    let leaders: Vec<usize> = wait_for(SOON, || {
        SITE.iter()
            .enumerate()
            .map(|(d, _)| {
                let ids: Vec<String> = (0..3)
                    .map(|i| {
                        let election = nodes[d * 3 + i].json("/v1/election")?;
                        (election["is_stable"] == true)
                            .then(|| election["leader"].as_str().map(str::to_string))?
                    })
                    .collect::<Option<_>>()?;
                let leader = (1..=9).find(|&n| site_id(n) == ids[0])?;
                (ids.iter().all(|id| *id == ids[0]) && site_dc(leader) == SITE[d]).then_some(leader)
            })
            .collect::<Option<_>>()
    })
    .unwrap_or_else(|| panic!("no leader in each DC:\n{}", all_logs()));
    let [ams, fra, lon] = [0, 1, 2].map(|d| &nodes[leaders[d] - 1]);
    let data = |node: &SiteNode| node.json("/v1/schedule").map(|s| s["data"].clone());
    let borrowed = |node: &SiteNode| data(node).and_then(|d| d["borrowed"]["fra"].as_u64());
    let lent = |node: &SiteNode| data(node).and_then(|d| d["lent"]["ams"].as_u64());
    // The grant, in the schedule of every node of ams.
    for node in &nodes[0..3] {
        let got = wait_for(SOON, || borrowed(node));
        assert_eq!(got, Some(4), "node{}:\n{}", node.n, all_logs());
    }
    assert_eq!(wait_for(SOON, || lent(fra)), Some(4), "{}", all_logs());
    // The links carry the proxies' delay: ams calls fra through 60 ms each way (its smoothed
    // RTT climbs from the first calls, which a follower of fra may have redirected to the
    // leader's address inside fra, not through the proxy).
    let listing = wait_for(SOON, || {
        let listing = ams.json("/v1/datacenters")?;
        (listing["dcs"]["fra"]["rtt_ms"].as_u64()? >= 40).then_some(listing)
    })
    .unwrap_or_else(|| panic!("no slow link: {}", ams.json("/v1/datacenters").unwrap()));
    assert_eq!(listing["dcs"]["lon"]["link"], "up", "{listing}");
    // Cut between ams and fra, both ways; lon still reaches both.
    for node in &nodes[0..6] {
        node.proxy.cut();
    }
    let input = wait_for(SOON, || {
        let input = ams.json("/v1/scheduler_input")?;
        let fra = &input["datacenters"]["dcs"]["fra"];
        (fra["answers"] == serde_json::json!([])).then_some(input)
    })
    .unwrap_or_else(|| panic!("the grant did not expire:\n{}", all_logs()));
    // It expired on its lease (3 s after the last contact, docs/datacenters.md), by the
    // daemon's own clock: not before, and within what the lender counts as lent.
    let seen = &input["datacenters"]["dcs"];
    let age = seen["fra"]["contact_age_ms"].as_u64().unwrap();
    assert!((3000..1500 + 3000 + 1000).contains(&age), "{input}");
    assert_eq!(seen["fra"]["link"], "down", "{input}");
    assert_eq!(seen["lon"]["link"], "up", "{input}");
    let gone = wait_for(SOON, || {
        data(ams).filter(|d| d["borrowed"]["fra"].is_null())
    });
    assert!(gone.is_some(), "{}", all_logs());
    let gone = wait_for(SOON, || data(fra).filter(|d| d["lent"]["ams"].is_null()));
    assert!(gone.is_some(), "{}", all_logs());
    let listing = lon.json("/v1/datacenters").unwrap();
    assert_eq!(listing["dcs"]["ams"]["link"], "up", "{listing}");
    assert_eq!(listing["dcs"]["fra"]["link"], "up", "{listing}");
    // Healed: the grant comes back without a restart.
    for node in &nodes[0..6] {
        node.proxy.heal();
    }
    assert_eq!(wait_for(SOON, || borrowed(ams)), Some(4), "{}", all_logs());
    assert_eq!(wait_for(SOON, || lent(fra)), Some(4), "{}", all_logs());
    for node in &nodes {
        // Many election packets, none from another DC (dropped as `unknown_peer`).
        let received = node.metric_sum("verwalter_election_messages_received_total{");
        assert!(received > Some(10.0), "node{}: {received:?}", node.n);
        let crossed =
            node.metric_sum("verwalter_election_messages_dropped_total{reason=\"unknown_peer\"}");
        assert_eq!(crossed, Some(0.0), "node{}:\n{}", node.n, all_logs());
    }
    drop(hold);
}

/// `make multi-dc` as a user runs it (`examples/multi-dc/run.sh`), with the test's binary and a
/// port held for it: three one-node DCs on 127.0.0.111, .121 and .131 print where to look, and
/// with the example's numbers as shipped `ams` borrows 4 workers from `fra`; an edit of the
/// copied `runtime/site.yaml` (`fra` wants 8: nothing spare) makes `ams` ask `lon` for 3 instead.
#[test]
fn make_multi_dc_starts_three_dcs_that_lend() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("multi-dc");
    let hold = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hold.local_addr().unwrap().port();
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut child = std::process::Command::new(top.join("examples/multi-dc/run.sh"))
        .env("VERWALTER", BIN)
        .env("MULTI_DC_DIR", &dir)
        .env("PORT", port.to_string())
        .env_remove("NODES")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    /// Stops run.sh (as Ctrl-C would), which stops the nodes.
    struct Stop(Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let _stop = Stop(child);
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        let done = line.starts_with("Ctrl-C stops all.");
        lines.push(line);
        if done {
            break;
        }
    }
    let text = lines.join("\n");
    for (dc, ip) in [("ams", 111), ("fra", 121), ("lon", 131)] {
        let url = format!("{dc}-1: http://127.0.0.{ip}:{port}/v1/datacenters");
        assert!(text.contains(&url), "{url}:\n{text}");
    }
    assert!(text.contains("/v1/scheduler_input"), "{text}");
    let logs = || {
        ["ams-1", "fra-1", "lon-1"]
            .map(|n| {
                let log = std::fs::read_to_string(dir.join(n).join("verwalter.log"));
                format!("--- {n}\n{}", log.unwrap_or_default())
            })
            .concat()
    };
    let schedule = |ip: u8| {
        let (code, body) = http_get_at(&format!("127.0.0.{ip}"), port, "/v1/schedule")?;
        let schedule: Value = serde_json::from_str(&body).ok().filter(|_| code == 200)?;
        Some(schedule["data"].clone())
    };
    let borrowed = |from: &'static str, n: u64| {
        wait_for(SOON, || {
            schedule(111).filter(|d| d["borrowed"] == serde_json::json!({from: n}))
        })
        .unwrap_or_else(|| panic!("ams did not borrow {n} from {from}:\n{}", logs()))
    };
    borrowed("fra", 4);
    let site = dir.join("config/runtime/site.yaml");
    let text = std::fs::read_to_string(&site).unwrap();
    replace_file(&site, &text.replace("  fra: 2\n", "  fra: 8\n"));
    borrowed("lon", 3);
    let lent = wait_for(SOON, || schedule(131).filter(|d| d["lent"]["ams"] == 3));
    assert!(lent.is_some(), "{}", logs());
    drop(hold);
}

/// The sum of the series of the daemon at `host:port` whose `/metrics` line starts with `prefix`.
fn metric_sum_at(host: &str, port: u16, prefix: &str) -> Option<f64> {
    let (_, body) = http_get_at(host, port, "/metrics")?;
    Some(
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}
