//! Peer sources: cantal's `/all_peers.json`, polled every second, or a static list from the
//! settings file. Either publishes the peer list to the store when it changes, and notes each
//! successful refresh for the election (a stale peer list stops it, as in verwalter 0.13).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::cluster::datacenters::input::valid_dc_name;
use verwalter_controllers::cluster::peers::peers_changed;
use verwalter_controllers::machinery::clock::Clock;
use verwalter_controllers::machinery::store::Field;
use verwalter_controllers::state::{Peer, Peers};

use super::datacenters::DcFilter;
use crate::machinery::http_client::{Connections, HttpClient};
use crate::metrics::Metrics;

/// How often cantal is asked (as 0.13 did).
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// cantal's answer is capped at this size.
const CANTAL_LIMIT: usize = 10 << 20;

/// The client of cantal and of the schedule fetches between nodes: plain HTTP, keep-alive
/// connections kept 5 minutes, a second to connect.
pub(crate) fn client() -> HttpClient {
    HttpClient::http(Connections {
        connect_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(300),
    })
}

/// What every request to cantal or a peer names as its `Host`.
pub(crate) const HOST: (hyper::header::HeaderName, &str) = (hyper::header::HOST, "verwalter");

/// What the election needs to know about peers beyond the list, updated more often than the
/// list changes (so kept out of the store, whose writes wake readers): when the list was last
/// refreshed, and when each peer was last heard from directly (cantal's `last_report_direct`,
/// or for a static list, the last packet from it).
#[derive(Debug, Clone, Default)]
pub struct Liveness(Arc<LivenessInner>);

#[derive(Debug, Default)]
struct LivenessInner {
    refreshed: AtomicU64,
    direct: std::sync::Mutex<BTreeMap<String, u64>>,
    /// Last election packet from each peer (wall-clock ms).
    packets: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl Liveness {
    pub(crate) fn refreshed(&self, now_ms: u64) {
        self.0.refreshed.store(now_ms, Ordering::Relaxed);
    }
    /// Wall-clock ms of the last successful refresh (0: never).
    pub(crate) fn last_refresh(&self) -> u64 {
        self.0.refreshed.load(Ordering::Relaxed)
    }
    pub(crate) fn heard(&self, id: &str, ms: u64) {
        let mut direct = self.0.direct.lock().unwrap();
        let at = direct.entry(id.to_string()).or_insert(0);
        *at = (*at).max(ms);
    }
    /// An election packet from `id` arrived (also counts as heard directly).
    pub(crate) fn packet(&self, id: &str, ms: u64) {
        self.0.packets.lock().unwrap().insert(id.to_string(), ms);
        self.heard(id, ms);
    }
    /// When each peer's last election packet came (wall-clock ms).
    pub(crate) fn packets(&self) -> BTreeMap<String, u64> {
        self.0.packets.lock().unwrap().clone()
    }
    /// Calls `f` with when each peer was last heard from directly (wall-clock ms by id).
    pub(crate) fn with_heard<R>(&self, f: impl FnOnce(&BTreeMap<String, u64>) -> R) -> R {
        f(&self.0.direct.lock().unwrap())
    }
}

/// A peer list parsed from cantal, with a warning for each peer it had to skip.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    pub peers: BTreeMap<String, Peer>,
    pub skipped: Vec<String>,
    /// The data center of each peer whose entry names one (`datacenter`).
    pub dcs: BTreeMap<String, String>,
}

/// Parses cantal's `/all_peers.json` (tk-cantal's and real cantal's shapes). A peer without a
/// usable id, host name or name is skipped with a warning; the rest of the list is kept; this
/// node (`own_id`; real cantal leaves it out anyway) is dropped. Peer addresses are cantal's
/// `primary_addr` IP with verwalter's `port`.
pub fn parse_cantal(body: &[u8], port: u16, own_id: &str) -> Result<Parsed, String> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let list = doc
        .get("peers")
        .and_then(Value::as_array)
        .ok_or("no `peers` list")?;
    let mut parsed = Parsed::default();
    for (i, item) in list.iter().enumerate() {
        let id = item.get("id").and_then(Value::as_str).unwrap_or_default();
        let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::to_string);
        let problem = if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            Some(format!("peers[{i}]: id {id:?} is not 32 hex digits"))
        } else if text("hostname").is_none_or(|h| h.is_empty()) {
            Some(format!("peers[{i}] ({id}): no hostname"))
        } else if text("name").is_none_or(|n| n.is_empty()) {
            Some(format!("peers[{i}] ({id}): no name"))
        } else if let Some(dc) = item.get("datacenter")
            && !dc.as_str().is_some_and(valid_dc_name)
        {
            Some(format!(
                "peers[{i}] ({id}): datacenter {dc} is not a data center name"
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            parsed.skipped.push(problem);
            continue;
        }
        let addr = text("primary_addr")
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map(|a| SocketAddr::new(a.ip(), port).to_string());
        let id = id.to_ascii_lowercase();
        if id == own_id {
            continue;
        }
        if let Some(dc) = text("datacenter") {
            parsed.dcs.insert(id.clone(), dc);
        }
        parsed.peers.insert(
            id.clone(),
            Peer {
                id,
                addr,
                name: text("name").unwrap_or_default(),
                hostname: text("hostname").unwrap_or_default(),
                schedule: None,
                known_since: item.get("known_since").and_then(Value::as_u64).unwrap_or(0),
                last_report_direct: item.get("last_report_direct").and_then(Value::as_u64),
                errors: 0,
            },
        );
    }
    Ok(parsed)
}

/// Stores the list if it changed ([`peers_changed`]: `last_report_direct` times move
/// every second; the election reads them from [`Liveness`]). In a data center, only its peers
/// are stored (`dc`, with `dcs` the DCs the source named).
fn publish(
    out: &Field<Peers>,
    peers: BTreeMap<String, Peer>,
    dc: &mut Option<DcFilter>,
    dcs: &BTreeMap<String, String>,
    now_ms: u64,
) {
    let peers = match dc {
        Some(filter) => filter.split(peers, dcs),
        None => peers,
    };
    if peers_changed(&out.get(), &peers) {
        tracing::info!(peers = peers.len(), "Peer list changed.");
        out.set(Peers {
            peers,
            timestamp: Some(now_ms),
        });
    }
}

/// Where cantal is and who is asking.
#[derive(Debug, Clone)]
pub(crate) struct Cantal {
    /// Base URL, `http://127.0.0.1:22682`.
    pub(crate) url: String,
    /// verwalter's port (peer addresses are cantal's IPs with it).
    pub(crate) port: u16,
    /// This node's id (left out of the list).
    pub(crate) own_id: String,
    /// This node's data center, if in one.
    pub(crate) dc: Option<DcFilter>,
}

/// Polls cantal until shutdown.
pub(crate) async fn run_cantal(
    cantal: Cantal,
    out: Field<Peers>,
    live: Liveness,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let client = client();
    let Cantal {
        url,
        port,
        own_id,
        mut dc,
    } = cantal;
    let endpoint = format!("{url}/all_peers.json");
    let mut last_problem = String::new();
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result = client
            .get(&endpoint, None, &[HOST], CANTAL_LIMIT, REFRESH, |_| Ok(()))
            .await
            .and_then(|((), body)| parse_cantal(&body, port, &own_id));
        match result {
            Ok(parsed) => {
                metrics.peer_refresh(true);
                for problem in &parsed.skipped {
                    if *problem != last_problem {
                        tracing::warn!(%problem, "Skipped a peer cantal listed.");
                    }
                }
                last_problem = parsed.skipped.first().cloned().unwrap_or_default();
                let now = clock.now_ms();
                for (id, peer) in &parsed.peers {
                    if let Some(at) = peer.last_report_direct {
                        live.heard(id, at);
                    }
                }
                publish(&out, parsed.peers, &mut dc, &parsed.dcs, now);
                live.refreshed(now);
            }
            Err(problem) => {
                metrics.peer_refresh(false);
                if problem != last_problem {
                    tracing::warn!(%problem, "Cannot get the peer list from cantal.");
                    last_problem = problem;
                }
            }
        }
    }
}

/// Publishes a static peer list and keeps it fresh until shutdown.
pub(crate) async fn run_static(
    peers: Vec<Peer>,
    mut dc: Option<DcFilter>,
    out: Field<Peers>,
    live: Liveness,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) {
    let now = clock.now_ms();
    // A static list has no gossip saying who is alive; every listed peer counts as heard at
    // start, so that in minority mode a starting node does not lead alone before any packet.
    for peer in &peers {
        live.heard(&peer.id, now);
    }
    let peers = peers
        .into_iter()
        .map(|p| {
            (
                p.id.clone(),
                Peer {
                    known_since: now,
                    ..p
                },
            )
        })
        .collect();
    publish(&out, peers, &mut dc, &BTreeMap::new(), now);
    loop {
        live.refreshed(clock.now_ms());
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(REFRESH) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cantal_lists_are_read_tolerantly() {
        let body = br#"{"peers": [
            {"id": "77985419C732412EA38B94DB00000002", "hostname": "beta", "name": "beta.example.com",
             "primary_addr": "192.168.255.2:22682", "addresses": ["192.168.255.2:22682"],
             "known_since": 1533900000000, "last_report_direct": 1533912709500,
             "probes_sent": 3, "report": [1, {"peers": 2, "has_remote": false}]},
            {"id": "77985419c732412ea38b94db00000003", "hostname": null, "name": "gamma"},
            {"id": "nothex", "hostname": "x", "name": "x"},
            {"id": "77985419c732412ea38b94db00000004", "hostname": "delta", "name": "delta",
             "primary_addr": null, "known_since": 5}
        ]}"#;
        let parsed = parse_cantal(body, 8379, "77985419c732412ea38b94db00000001").unwrap();
        assert_eq!(parsed.peers.len(), 2, "{parsed:?}");
        let own = parse_cantal(body, 8379, "77985419c732412ea38b94db00000002").unwrap();
        assert_eq!(own.peers.len(), 1, "this node is not its own peer");
        let beta = &parsed.peers["77985419c732412ea38b94db00000002"];
        assert_eq!(beta.addr.as_deref(), Some("192.168.255.2:8379"));
        assert_eq!(beta.name, "beta.example.com");
        assert_eq!(beta.last_report_direct, Some(1533912709500));
        let delta = &parsed.peers["77985419c732412ea38b94db00000004"];
        assert_eq!(delta.addr, None, "known but unreachable");
        assert_eq!(parsed.skipped.len(), 2);
        assert!(parsed.skipped[0].contains("no hostname"));
        assert!(parsed.skipped[1].contains("not 32 hex digits"));

        assert!(parse_cantal(b"[]", 8379, "").unwrap_err().contains("peers"));
        assert!(
            parse_cantal(b"{", 8379, "")
                .unwrap_err()
                .contains("not JSON")
        );
    }

    #[test]
    fn cantal_peers_name_their_datacenter_and_a_bad_name_skips_the_peer() {
        let body = br#"{"peers": [
            {"id": "77985419c732412ea38b94db00000002", "hostname": "b", "name": "b",
             "datacenter": "fra"},
            {"id": "77985419c732412ea38b94db00000003", "hostname": "c", "name": "c"},
            {"id": "77985419c732412ea38b94db00000004", "hostname": "d", "name": "d",
             "datacenter": "Not A Name"}
        ]}"#;
        let parsed = parse_cantal(body, 8379, "").unwrap();
        assert_eq!(parsed.peers.len(), 2, "{parsed:?}");
        assert_eq!(
            parsed.dcs.into_iter().collect::<Vec<_>>(),
            [("77985419c732412ea38b94db00000002".into(), "fra".into())]
        );
        assert!(
            parsed.skipped[0].contains("datacenter \"Not A Name\" is not a data center name"),
            "{:?}",
            parsed.skipped
        );
    }
}
