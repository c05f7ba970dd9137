//! The peer list cut at this node's data center (docs/datacenters.md): the peer sources keep
//! only this DC's peers in the store, so the election and schedule distribution never see the
//! others; the other DCs become the members of the mesh, with the addresses to try.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hyper::header::{self, HeaderName, HeaderValue};
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::cluster::datacenters::wire::{DcKey, TAG_HEADER, WireError};
use verwalter_controllers::cluster::datacenters::{
    Config, DatacentersPort, Dc, Exchange, Link, Me, Outcome, Output, OutputError, PeerDc, Refusal,
    Send, View, publish_view, split_peers,
};
use verwalter_controllers::cluster::election::ElectionState;
use verwalter_controllers::machinery::store::{Field, Reader};
use verwalter_controllers::state::{Peer, Peers};

use super::coding::Coding;
use super::dc_metrics::DcMetrics;
use crate::config::DcSettings;
use crate::machinery::http_client::{HttpClient, SendError, read_body};

/// A peer source's view of the DCs: this node's, the entry points, and the members last found.
#[derive(Debug, Clone)]
pub(crate) struct DcFilter {
    own: Dc,
    entry_points: BTreeMap<Dc, Vec<String>>,
    /// The static peers' DCs by id (a cantal list brings its own).
    static_dcs: BTreeMap<String, Dc>,
    members: BTreeMap<Dc, Vec<String>>,
    /// Where the members go, when the node exchanges.
    node: Option<Arc<DcNode>>,
}

impl DcFilter {
    pub(crate) fn new(settings: &DcSettings) -> DcFilter {
        DcFilter {
            own: settings.own.clone(),
            entry_points: settings.entry_points.clone(),
            static_dcs: settings.peer_dcs.clone(),
            members: BTreeMap::new(),
            node: None,
        }
    }

    /// Hands the members to `node` as they change.
    pub(crate) fn with_node(mut self, node: Option<Arc<DcNode>>) -> DcFilter {
        self.node = node;
        self
    }

    /// Keeps the peers of this DC (and those of no DC); `dcs` names the DC of peers whose
    /// source gave one (besides the static list's). Logs the mesh's members when they change.
    pub(crate) fn split(
        &mut self,
        peers: BTreeMap<String, Peer>,
        dcs: &BTreeMap<String, Dc>,
    ) -> BTreeMap<String, Peer> {
        let dc_of = |id: &str| {
            dcs.get(id)
                .or_else(|| self.static_dcs.get(id))
                .map(String::as_str)
        };
        let split = split_peers(
            &self.own,
            peers.values().map(|p| PeerDc {
                id: &p.id,
                dc: dc_of(&p.id),
                addr: p.addr.as_deref(),
            }),
            &self.entry_points,
        );
        if split.members != self.members {
            tracing::info!(
                datacenter = %self.own,
                members = ?split.members,
                "Other data centers changed."
            );
            if let Some(node) = &self.node {
                node.set_members(split.members.clone());
            }
            self.members = split.members;
        }
        peers
            .into_iter()
            .filter(|(id, _)| split.election.contains(id))
            .collect()
    }
}

/// This node's side of the exchange, shared by the API (`POST /v1/dc/exchange`) and the task
/// that follows the election: an [`Exchange`] while this node leads its DC, none otherwise.
#[derive(Debug)]
pub struct DcNode {
    own: Dc,
    /// The election's key; without one the exchange stays off.
    key: Option<DcKey>,
    max_body: usize,
    config: Config,
    node: String,
    /// The address other DCs reach this node at.
    addr: String,
    state: Mutex<DcState>,
    /// Wakes [`run_exchange`]: the leadership, the members or an exchange changed.
    wake: Notify,
    metrics: DcMetrics,
    /// The view the schedule controller reruns on: set when what the scheduler sees changed.
    view: Field<Option<View>>,
}

#[derive(Debug, Default)]
struct DcState {
    exchange: Option<Exchange>,
    /// Counts the exchanges started: an answer to an older one is not handed to a newer one.
    generation: u64,
    /// The links as last logged.
    links: BTreeMap<Dc, Link>,
    members: BTreeMap<Dc, Vec<String>>,
    /// This DC's leader's address while another node leads.
    leader_addr: Option<String>,
    /// Per DC, why the last of this node's exchanges with it failed, and when; gone once one
    /// succeeds (`GET /v1/datacenters` shows them).
    errors: BTreeMap<Dc, (String, Instant)>,
    /// The scheduler's last output while this node leads (an exchange started after it came
    /// takes it).
    output: Option<Output>,
}

/// What `POST /v1/dc/exchange` answers.
#[derive(Debug, PartialEq)]
pub(crate) enum Reply {
    /// 200: this node's envelope (uncompressed JSON) and its tag.
    Envelope(Vec<u8>, String),
    /// Another status with a JSON body; `reason` is the metric label (docs/datacenters.md).
    Refused {
        status: u16,
        body: serde_json::Value,
        reason: &'static str,
    },
}

impl DcNode {
    pub(crate) fn new(
        settings: &DcSettings,
        key: Option<DcKey>,
        node: String,
        addr: String,
        registry: &prometheus::Registry,
        view: Field<Option<View>>,
    ) -> DcNode {
        DcNode {
            own: settings.own.clone(),
            key,
            max_body: settings.max_body,
            config: settings.exchange.clone(),
            node,
            addr: settings.advertise.clone().unwrap_or(addr),
            state: Mutex::new(DcState {
                members: settings.entry_points.clone(),
                ..DcState::default()
            }),
            wake: Notify::new(),
            metrics: DcMetrics::register(registry),
            view,
        }
    }

    /// An envelope refused before it reached [`DcNode::receive`] (its size, its coding).
    pub(crate) fn count_dropped(&self, reason: &str) {
        self.metrics.dropped(reason);
    }

    /// The largest body taken.
    pub(crate) fn max_body(&self) -> usize {
        self.max_body
    }

    /// The other DCs and their addresses, from the peer list and the entry points.
    pub(crate) fn set_members(&self, members: BTreeMap<Dc, Vec<String>>) {
        let mut state = self.state.lock().unwrap();
        if let Some(exchange) = &mut state.exchange {
            exchange.set_members(members.clone());
        }
        state.members = members;
        self.wake.notify_one();
    }

    /// Follows the election: leading at `epoch` starts a fresh exchange (a new epoch another),
    /// anything else drops it; `leader_addr` is this DC's leader while another node leads.
    pub(crate) fn follow(&self, leading: Option<u64>, leader_addr: Option<String>, now: Instant) {
        let mut state = self.state.lock().unwrap();
        state.leader_addr = leader_addr;
        let current = state.exchange.as_ref().map(|e| e.me().epoch);
        if leading == current || self.key.is_none() {
            return;
        }
        if leading.is_none() {
            state.output = None;
        }
        state.generation += 1;
        state.errors.clear();
        self.wake.notify_one();
        state.exchange = leading.map(|epoch| {
            let first_seq = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let me = Me {
                dc: self.own.clone(),
                node: self.node.clone(),
                addr: self.addr.clone(),
                epoch,
                first_seq,
            };
            let mut exchange = Exchange::new(me, self.config.clone(), now);
            exchange.set_members(state.members.clone());
            if let Some(output) = state.output.clone() {
                exchange.set_output(now, output);
            }
            tracing::info!(datacenter = %self.own, epoch, "Exchanging with other data centers.");
            exchange
        });
    }

    /// An envelope another DC's leader sent, checked in the order of docs/datacenters.md
    /// ("On the wire"); `body` is already decompressed (within [`DcNode::max_body`]).
    pub(crate) fn receive(&self, body: &[u8], tag: Option<&str>, now: Instant) -> Reply {
        let refused = |status, body, reason| {
            if reason != "not_leader" {
                self.metrics.dropped(reason);
            }
            Reply::Refused {
                status,
                body,
                reason,
            }
        };
        let Some(key) = &self.key else {
            return refused(
                403,
                json!({"error": "the exchange between data centers needs election.key-file"}),
                "bad_tag",
            );
        };
        let envelope = match key.open(body, tag, self.max_body) {
            Ok(envelope) => envelope,
            Err(error) => {
                let status = match error {
                    WireError::TooBig { .. } => 413,
                    WireError::BadTag => 403,
                    WireError::Decode(_) | WireError::Version(_) => 400,
                };
                return refused(status, json!({"error": error.to_string()}), error.label());
            }
        };
        let mut state = self.state.lock().unwrap();
        let leader = state.leader_addr.clone();
        let Some(exchange) = &mut state.exchange else {
            return refused(
                409,
                json!({"not_leader": true, "leader": leader}),
                "not_leader",
            );
        };
        let taken = exchange.receive(now, envelope);
        if taken.is_ok() {
            // What to send next may have changed (an acknowledgement, a request).
            self.wake.notify_one();
        }
        match taken {
            Ok(reply) => match key.seal(&reply, self.max_body) {
                Ok((body, tag)) => Reply::Envelope(body, tag),
                Err(error) => refused(500, json!({"error": error.to_string()}), "too_big"),
            },
            Err(refusal) => {
                let status = match refusal {
                    Refusal::OwnDc(_) | Refusal::UnknownDc(_) => 403,
                    Refusal::Stale { .. } => 409,
                    Refusal::Version(_) | Refusal::SummaryHash => 400,
                };
                let body = match refusal {
                    Refusal::Stale { .. } => json!({"stale": true}),
                    _ => json!({"error": refusal.to_string()}),
                };
                refused(status, body, refusal.label())
            }
        }
    }
}

impl DcNode {
    /// `GET /v1/datacenters`: this node's DC, whether it leads (and else its leader's address),
    /// the other DCs with the addresses tried, and while leading, each DC as the exchange sees
    /// it (the scheduler's view: docs/datacenters.md).
    pub(crate) fn listing(&self) -> serde_json::Value {
        let state = self.state.lock().unwrap();
        let now = Instant::now();
        let view = state.exchange.as_ref().map(|e| e.view(now));
        let errors: BTreeMap<&Dc, serde_json::Value> = state
            .errors
            .iter()
            .map(|(dc, (error, at))| {
                let age = u64::try_from(now.duration_since(*at).as_millis()).unwrap_or(u64::MAX);
                (dc, json!({"error": error, "age_ms": age}))
            })
            .collect();
        json!({
            "self": self.own,
            "exchange": if self.key.is_some() { "on" } else { "off: no election.key-file" },
            "leading": view.is_some(),
            "leader": state.leader_addr,
            "addr": self.addr,
            "members": state.members,
            "dcs": view.map_or_else(|| json!({}), |v| json!(v.dcs)),
            "errors": errors,
        })
    }

    /// The envelopes to send now, which exchange they belong to, and when to look again; none
    /// while this node does not lead.
    fn poll(&self, now: Instant) -> (u64, Vec<Send>, Option<Instant>) {
        let mut state = self.state.lock().unwrap();
        let generation = state.generation;
        let Some(exchange) = &mut state.exchange else {
            return (generation, Vec::new(), None);
        };
        let sends = exchange.poll(now);
        (generation, sends, exchange.deadline(now))
    }

    /// How one of this node's calls ended (`error`: why it failed), if the exchange it belongs
    /// to still runs.
    fn answered(
        &self,
        generation: u64,
        dc: &str,
        exchange: u64,
        outcome: Outcome,
        error: Option<String>,
    ) {
        let mut state = self.state.lock().unwrap();
        if state.generation != generation {
            return;
        }
        match (&outcome, error) {
            (Outcome::Reply(_), _) => {
                state.errors.remove(dc);
            }
            (_, Some(error)) => {
                state.errors.insert(dc.to_string(), (error, Instant::now()));
            }
            _ => {}
        }
        if let Some(current) = &mut state.exchange {
            current.answered(Instant::now(), dc, exchange, outcome);
        }
    }

    /// Logs each link that went up or down since the last look.
    fn note_links(&self, now: Instant) {
        let mut state = self.state.lock().unwrap();
        let DcState {
            exchange,
            members,
            links,
            ..
        } = &mut *state;
        let names: Vec<String> = members.keys().cloned().collect();
        let view = exchange.as_ref().map(|e| e.view(now));
        self.metrics.observe(&names, view.as_ref());
        publish_view(&self.view, view);
        let Some(exchange) = exchange else {
            links.clear();
            return;
        };
        for dc in members.keys() {
            let link = exchange.link(dc, now).unwrap_or(Link::Unknown);
            if links.insert(dc.clone(), link) != Some(link) && link != Link::Unknown {
                tracing::info!(datacenter = %dc, ?link, "Link to another data center changed.");
            }
        }
    }

    /// One call: the envelope sealed and sent as LZ4, the answer read within the limits and
    /// opened with the key; an error says why it failed, naming the address called.
    async fn call(&self, client: &HttpClient, send: &Send) -> Result<Outcome, String> {
        let Some(key) = &self.key else {
            return Err("no election.key-file".into());
        };
        let (body, tag) = key
            .seal(&send.envelope, self.max_body)
            .map_err(|e| format!("this node's envelope: {e}"))?;
        let url = format!("http://{}/v1/dc/exchange", send.addr);
        let text = |s: &str| HeaderValue::from_str(s).ok();
        let accept = format!("{}, gzip", Coding::Lz4.token());
        let headers = [
            (header::HOST, text(super::peers::HOST.1)),
            (header::CONTENT_TYPE, text("application/json")),
            (header::CONTENT_ENCODING, text(Coding::Lz4.token())),
            (header::ACCEPT_ENCODING, text(&accept)),
            (HeaderName::from_static(TAG_HEADER), text(&tag)),
        ];
        let headers = headers
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?)))
            .collect();
        let response = match client.post(&url, headers, Coding::Lz4.encode(&body)).await {
            Ok(response) => response,
            Err(error) => {
                tracing::debug!(%url, ?error, "An exchange with another data center failed.");
                return Err(match error {
                    SendError::Setup(message) | SendError::Connect(message) => {
                        format!("{}: {message}", send.addr)
                    }
                    SendError::Token => format!("{}: a bad header", send.addr),
                });
            }
        };
        let status = response.status().as_u16();
        let head = response.headers().clone();
        let body = read_body(response, self.max_body)
            .await
            .map_err(|e| format!("{}: the answer: {e}", send.addr))?;
        let answer = || {
            let text = String::from_utf8_lossy(&body);
            let said: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let said = said["error"].as_str().map_or_else(
                || text.chars().take(200).collect::<String>(),
                str::to_string,
            );
            format!("{}: answered {status}: {said}", send.addr)
        };
        if status == 409 {
            let said: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if said["not_leader"] == true {
                return Ok(Outcome::NotLeader(
                    said["leader"].as_str().map(str::to_string),
                ));
            }
            return Err(answer());
        }
        if status != 200 {
            return Err(answer());
        }
        let plain = Coding::of_response(&head)
            .ok_or_else(|| format!("{}: an answer of an unknown coding", send.addr))?
            .decode(body, self.max_body)
            .map_err(|e| format!("{}: the answer: {e}", send.addr))?;
        let tag = head.get(TAG_HEADER).and_then(|v| v.to_str().ok());
        key.open(&plain, tag, self.max_body)
            .map(Outcome::Reply)
            .map_err(|e| format!("{}: the answer: {e}", send.addr))
    }
}

impl DatacentersPort for DcNode {
    fn view(&self) -> Option<View> {
        let state = self.state.lock().unwrap();
        state.exchange.as_ref().map(|e| e.view(Instant::now()))
    }

    /// Kept for the exchange of this leadership (one that starts later takes it too); what
    /// changed goes out at once.
    fn set_output(&self, output: Output) -> Vec<OutputError> {
        let mut state = self.state.lock().unwrap();
        let errors = match &mut state.exchange {
            Some(exchange) => exchange.set_output(Instant::now(), output.clone()),
            None => Vec::new(),
        };
        state.output = Some(output);
        self.wake.notify_one();
        errors
    }
}

/// Drives this node's exchange until shutdown: sends what [`Exchange::poll`] asks (each call
/// on its own task, within `exchange-timeout-ms`), hands back how each ended, logs the links
/// going up and down, and sleeps until the next deadline or a change.
pub(crate) async fn run_exchange(dc: Arc<DcNode>, shutdown: CancellationToken) {
    let client = super::peers::client();
    loop {
        let now = Instant::now();
        let (generation, sends, deadline) = dc.poll(now);
        for send in sends {
            let (dc, client) = (dc.clone(), client.clone());
            tokio::spawn(async move {
                let limit = dc.config.exchange_timeout;
                let (outcome, error) =
                    match tokio::time::timeout(limit, dc.call(&client, &send)).await {
                        Ok(Ok(outcome)) => (outcome, None),
                        Ok(Err(error)) => (Outcome::Failed, Some(error)),
                        Err(_) => (
                            Outcome::Failed,
                            Some(format!("{}: no answer within {limit:?}", send.addr)),
                        ),
                    };
                let result = match outcome {
                    Outcome::Reply(_) => "ok",
                    Outcome::NotLeader(_) => "not_leader",
                    Outcome::Failed => "failed",
                };
                dc.metrics.exchange(&send.dc, result);
                dc.answered(generation, &send.dc, send.exchange, outcome, error);
                dc.wake.notify_one();
            });
        }
        dc.note_links(now);
        // Links go down without an event: look at least every period.
        let next = deadline.map_or(now + dc.config.period, |d| d.min(now + dc.config.period));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = dc.wake.notified() => {}
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

/// Follows this node's election for `dc` until shutdown: which node leads, at which epoch, and
/// that leader's address (from the peer list).
pub(crate) async fn follow_election(
    dc: Arc<DcNode>,
    mut election: Reader<ElectionState>,
    peers: Reader<Peers>,
    shutdown: CancellationToken,
) {
    loop {
        let state = election.get();
        let leader_addr = state
            .leader
            .as_ref()
            .and_then(|id| peers.peek().peers.get(id).and_then(|p| p.addr.clone()));
        let leading = state.is_leader.then_some(state.epoch);
        dc.follow(leading, leader_addr, Instant::now());
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = election.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str) -> Peer {
        Peer {
            id: id.into(),
            addr: Some(format!("{id}:8379")),
            name: id.into(),
            hostname: id.into(),
            schedule: None,
            known_since: 0,
            last_report_direct: None,
            errors: 0,
        }
    }

    #[test]
    fn only_this_dcs_peers_stay_and_the_others_are_members() {
        let settings = DcSettings {
            own: "ams".into(),
            entry_points: [("lon".to_string(), vec!["lon1:8379".to_string()])].into(),
            exchange: Default::default(),
            max_body: 1000,
            peer_dcs: [("b".to_string(), "fra".to_string())].into(),
            advertise: None,
        };
        let mut filter = DcFilter::new(&settings);
        let peers = ["a", "b", "c", "d"]
            .into_iter()
            .map(|id| (id.to_string(), peer(id)))
            .collect();
        // `c` is named by the source as this DC's, `d` as lon's, `a` has none (this DC's).
        let dcs = [
            ("c".to_string(), "ams".to_string()),
            ("d".to_string(), "lon".to_string()),
        ]
        .into();
        let kept = filter.split(peers, &dcs);
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(
            filter.members,
            [
                ("fra".to_string(), vec!["b:8379".to_string()]),
                (
                    "lon".to_string(),
                    vec!["d:8379".to_string(), "lon1:8379".to_string()]
                ),
            ]
            .into()
        );
    }

    /// `GET /v1/datacenters` names why the last exchange with a DC failed until one succeeds;
    /// a redirect is no failure, and a new exchange (a new epoch) starts without errors.
    #[test]
    fn the_last_failure_per_dc_is_listed_until_an_exchange_succeeds() {
        let settings = DcSettings {
            own: "ams".into(),
            entry_points: [("fra".to_string(), vec!["fra1:8379".to_string()])].into(),
            exchange: Default::default(),
            max_body: 1 << 16,
            peer_dcs: Default::default(),
            advertise: None,
        };
        let key = DcKey::new(b"a key of this test".to_vec());
        let node = DcNode::new(
            &settings,
            key,
            "n1".into(),
            "10.1.0.1:8379".into(),
            &prometheus::Registry::new(),
            Field::new(None),
        );
        node.follow(Some(1), None, Instant::now());
        let generation = node.state.lock().unwrap().generation;
        let refused = "fra1:8379: connection refused".to_string();
        node.answered(generation, "fra", 0, Outcome::Failed, Some(refused.clone()));
        let listing = node.listing();
        assert_eq!(listing["errors"]["fra"]["error"], refused.as_str());
        assert!(listing["errors"]["fra"]["age_ms"].is_u64(), "{listing}");
        // An answer to an older exchange (another generation) changes nothing.
        node.answered(
            generation + 1,
            "fra",
            0,
            Outcome::Failed,
            Some("old".into()),
        );
        assert_eq!(node.listing()["errors"]["fra"]["error"], refused.as_str());
        node.answered(generation, "fra", 0, Outcome::NotLeader(None), None);
        assert_eq!(node.listing()["errors"]["fra"]["error"], refused.as_str());
        let reply = verwalter_controllers::cluster::datacenters::wire::Envelope {
            v: 1,
            dc: "fra".into(),
            node: "n2".into(),
            addr: "fra1:8379".into(),
            epoch: 1,
            seq: 1,
            summary_hash: None,
            summary: None,
            have_summary: None,
            requests: Vec::new(),
            answers: Vec::new(),
        };
        node.answered(generation, "fra", 0, Outcome::Reply(reply), None);
        assert_eq!(node.listing()["errors"], json!({}));
        node.answered(generation, "fra", 0, Outcome::Failed, Some(refused));
        node.follow(Some(2), None, Instant::now());
        assert_eq!(node.listing()["errors"], json!({}));
    }
}
