//! The exchange between data centers without IO: one DC leader's mesh of the other DCs, when it
//! sends what to whom, the traffic cap, the leases of requests and answers, link state, and what
//! the scheduler sees (docs/datacenters.md).
//!
//! A node runs an [`Exchange`] only while it leads its DC, and starts a new one with each
//! leadership. The transport asks [`Exchange::poll`] for the
//! envelopes to send, reports how each exchange ended ([`Exchange::answered`]), hands over the
//! envelopes other DCs send ([`Exchange::receive`], whose `Ok` is the reply), and wakes at
//! [`Exchange::deadline`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use crate::state::NodeId;

pub mod input;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
pub mod wire;

use wire::{Answer, Envelope, Request};

/// A data center's name.
pub type Dc = String;

/// The exchange's timings and limits (docs/datacenters.md, "Settings", has the defaults' why).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// How often a leader exchanges with each other DC when nothing changed (the heartbeat).
    pub period: Duration,
    /// A DC not heard from for this long is down.
    pub link_timeout: Duration,
    /// The longest one exchange may take; past it, it failed.
    pub exchange_timeout: Duration,
    /// Bytes (uncompressed JSON) this leader may send across DCs per `traffic_interval`.
    pub traffic_cap: u64,
    pub traffic_interval: Duration,
    /// The longest lease taken; longer ones are cut to it.
    pub max_lease: Duration,
}

impl Default for Config {
    fn default() -> Config {
        use crate::defaults as d;
        Config {
            // A changed summary goes out at once; the period only renews leases and notices a
            // healed link, so seconds are enough and keep the heartbeat floor low.
            period: d::DC_PERIOD,
            // Five periods: a couple of lost exchanges on a lossy link do not flap it.
            link_timeout: d::DC_LINK_TIMEOUT,
            // Several round trips of the slowest links (500 ms) with a retransmission or two.
            exchange_timeout: d::DC_EXCHANGE_TIMEOUT,
            // 4 MiB a minute: far above the heartbeat floor of a dozen DCs (~1 KiB envelopes),
            // and a bound on what a scheduler's chatty summary costs.
            traffic_cap: d::DC_TRAFFIC_CAP_BYTES,
            traffic_interval: d::DC_TRAFFIC_INTERVAL,
            max_lease: d::DC_MAX_LEASE,
        }
    }
}

/// This leader: its DC, id, the address other DCs reach it at, the epoch it leads.
#[derive(Debug, Clone, PartialEq)]
pub struct Me {
    pub dc: Dc,
    pub node: NodeId,
    pub addr: String,
    pub epoch: u64,
    /// The first envelope's `seq`; a node that leads the same epoch again after a restart must
    /// start above what it sent before (the daemon passes the wall clock in ms).
    pub first_seq: u64,
}

/// What this DC's scheduler returned for the other DCs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    pub summary: Option<Value>,
    /// Requests to each DC, whole: a request left out is withdrawn.
    pub requests: BTreeMap<Dc, Vec<Request>>,
    /// Answers to each DC's requests, whole: an answer left out is withdrawn.
    pub answers: BTreeMap<Dc, Vec<Answer>>,
}

/// An entry of the scheduler's output that is not used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    #[error("datacenters.{kind}.{dc}[{index}]: {dc:?} is not a known data center")]
    UnknownDc {
        kind: &'static str,
        dc: Dc,
        index: usize,
    },
    #[error("datacenters.{kind}.{dc}[{index}]: {id:?} is given twice")]
    Duplicate {
        kind: &'static str,
        dc: Dc,
        index: usize,
        id: String,
    },
    #[error("datacenters.{kind}.{dc}[{index}]: a lease of 0 ms")]
    NoLease {
        kind: &'static str,
        dc: Dc,
        index: usize,
    },
    #[error("datacenters.{kind}.{dc}[{index}]: an id of 1 to 128 characters is needed")]
    BadId {
        kind: &'static str,
        dc: Dc,
        index: usize,
    },
    #[error("datacenters.answers.{dc}[{index}]: no open request {request:?} of {dc:?}")]
    NotOpen {
        dc: Dc,
        index: usize,
        request: String,
    },
}

/// Why an envelope from another DC is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("envelope version {0}, this node speaks 1")]
    Version(u32),
    #[error("envelope from this node's own data center {0:?}")]
    OwnDc(Dc),
    #[error("envelope from {0:?}, which is not a known data center")]
    UnknownDc(Dc),
    #[error("envelope from {dc:?} older than the newest one held")]
    Stale { dc: Dc },
    #[error("summary body does not match its hash")]
    SummaryHash,
}

impl Refusal {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Version(_) | Refusal::SummaryHash => "decode",
            Refusal::OwnDc(_) | Refusal::UnknownDc(_) => "unknown_dc",
            Refusal::Stale { .. } => "stale",
        }
    }
}

/// How one of this node's exchanges ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The other DC's envelope came back.
    Reply(Envelope),
    /// The node called does not lead its DC; it named the leader's address if it knows it.
    NotLeader(Option<String>),
    /// No answer (connection, timeout, refusal, a body that does not decode or verify).
    Failed,
}

/// An envelope to send now.
#[derive(Debug, Clone, PartialEq)]
pub struct Send {
    pub dc: Dc,
    pub addr: String,
    /// Names the exchange in [`Exchange::answered`].
    pub exchange: u64,
    pub envelope: Envelope,
}

/// The state of the link to a DC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    /// Never heard from.
    Unknown,
    Up,
    Down,
}

/// A request or answer received, kept until its lease ends.
#[derive(Debug, Clone, PartialEq)]
struct Held<T> {
    item: T,
    until: Instant,
    /// The leader that sent it: (epoch, node).
    from: (u64, NodeId),
}

/// The exchange in flight to a DC.
#[derive(Debug, Clone)]
struct InFlight {
    exchange: u64,
    sent_at: Instant,
    /// What it carried (see [`Remote::delivered`]).
    fingerprint: String,
}

/// Everything this leader knows of one other DC.
#[derive(Debug, Clone, Default)]
struct Remote {
    /// Addresses to try, from the peer list and the entry points.
    addrs: Vec<String>,
    next_addr: usize,
    /// The DC's leader's address, from its envelopes or a redirect.
    leader_addr: Option<String>,
    /// Send at once to `leader_addr` (a redirect came).
    redirect: bool,
    /// Redirects followed since the last reply (a few, so two nodes naming each other do not
    /// bounce an exchange at network speed).
    redirects: u32,
    /// The newest sender: (epoch, node, seq).
    sender: Option<(u64, NodeId, u64)>,
    /// At the newest sender's epoch, the last `seq` taken from each node (two leaders of one
    /// epoch, in minority mode): an envelope of either is taken only once.
    seqs: BTreeMap<NodeId, u64>,
    contact: Option<Instant>,
    rtt: Option<Duration>,
    srtt: Option<Duration>,
    /// The last summary body it sent: its hash, the body, when it came.
    summary: Option<(String, Value, Instant)>,
    /// The hash of the summary it last announced (newer than `summary` when the body has not
    /// come).
    announced: Option<String>,
    /// The hash of this DC's summary it said it holds.
    has_ours: Option<String>,
    /// The body of our summary with this hash went out at that time, not yet acknowledged.
    body_sent: Option<(String, Instant)>,
    requests_in: BTreeMap<String, Held<Request>>,
    answers_in: BTreeMap<String, Held<Answer>>,
    /// Our answers to its requests: until when the resources count as lent.
    lent: BTreeMap<String, Instant>,
    in_flight: Option<InFlight>,
    last_sent: Option<Instant>,
    /// The last exchange failed: wait for the period before the next.
    failed: bool,
    /// What the last exchange that came back carried: summary hash, requests, answers.
    delivered: Option<String>,
    /// A summary body was wanted but left out by the cap.
    deferred: bool,
    bytes_sent: u64,
    bytes_received: u64,
}

/// One DC leader's side of the exchange.
#[derive(Debug)]
pub struct Exchange {
    me: Me,
    config: Config,
    remotes: BTreeMap<Dc, Remote>,
    output: Output,
    /// `output.summary`'s hash.
    summary_hash: Option<String>,
    seq: u64,
    exchanges: u64,
    window_start: Instant,
    window_bytes: u64,
}

/// What `state.datacenters` shows the scheduler (and the API) of the other DCs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    #[serde(rename = "self")]
    pub self_dc: Dc,
    pub dcs: BTreeMap<Dc, DcView>,
}

/// One other DC, as this leader sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DcView {
    /// The node whose envelopes are taken (its DC's leader).
    pub leader: Option<NodeId>,
    pub link: Link,
    /// The smoothed round trip of this node's exchanges.
    pub rtt_ms: Option<u64>,
    pub contact_age_ms: Option<u64>,
    /// The last summary body received (kept when the link goes down).
    pub summary: Option<Value>,
    pub summary_age_ms: Option<u64>,
    /// The DC announced a newer summary than `summary`; its body has not come (the cap).
    pub summary_behind: bool,
    /// Requests the DC addressed to this DC.
    pub requests: Vec<HeldRequest>,
    /// The DC's answers to this DC's requests.
    pub answers: Vec<HeldAnswer>,
    /// This DC's answers to the DC's requests that may still be in use there.
    pub lent: Vec<Lent>,
    /// This DC's summary is due there but waits for the traffic cap.
    pub summary_deferred: bool,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeldRequest {
    pub id: String,
    pub data: Value,
    pub expires_in_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeldAnswer {
    pub request: String,
    pub data: Value,
    pub expires_in_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lent {
    pub request: String,
    pub outstanding_ms: u64,
}

impl View {
    /// Whether `other` shows the scheduler something else: a leader, a link going up or down, a
    /// summary, a request, an answer, what is lent (a lender takes back what ends); not ages,
    /// RTTs or byte counts moving on.
    pub fn same_for_scheduler(&self, other: &View) -> bool {
        self.self_dc == other.self_dc
            && self.dcs.len() == other.dcs.len()
            && self.dcs.iter().zip(&other.dcs).all(|((a, va), (b, vb))| {
                a == b
                    && va.leader == vb.leader
                    && va.link == vb.link
                    && va.summary == vb.summary
                    && va.requests.len() == vb.requests.len()
                    && va
                        .requests
                        .iter()
                        .zip(&vb.requests)
                        .all(|(x, y)| x.id == y.id && x.data == y.data)
                    && va.answers.len() == vb.answers.len()
                    && va
                        .answers
                        .iter()
                        .zip(&vb.answers)
                        .all(|(x, y)| x.request == y.request && x.data == y.data)
                    && va.lent.len() == vb.lent.len()
                    && va
                        .lent
                        .iter()
                        .zip(&vb.lent)
                        .all(|(x, y)| x.request == y.request)
            })
    }
}

/// The schedule controller's side of this node's exchange (the daemon's `DcNode`): what the
/// scheduler sees of the other DCs, and where its `datacenters` output goes.
pub trait DatacentersPort: std::marker::Send + Sync + 'static {
    /// `state.datacenters` now; `None` while this node runs no exchange (it does not lead).
    fn view(&self) -> Option<View>;
    /// What the scheduler returned for the other DCs; the entries not used, each with its
    /// error ([`Exchange::set_output`]).
    fn set_output(&self, output: Output) -> Vec<OutputError>;
}

/// Whether two snapshots of the view differ for the scheduler (see [`View::same_for_scheduler`]).
pub fn same_for_scheduler(a: Option<&View>, b: Option<&View>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.same_for_scheduler(b),
        (None, None) => true,
        _ => false,
    }
}

/// Sets `field` (what the schedule controller reruns on) to `view` when it differs for the
/// scheduler; ages, RTTs and byte counts moving on leave it as it is. Whether it was set.
pub fn publish_view(
    field: &crate::machinery::store::Field<Option<View>>,
    view: Option<View>,
) -> bool {
    if same_for_scheduler(field.get().as_ref().as_ref(), view.as_ref()) {
        return false;
    }
    field.set(view)
}

/// A peer as the split into DCs sees it.
#[derive(Debug, Clone, Copy)]
pub struct PeerDc<'a> {
    pub id: &'a NodeId,
    /// The peer's DC; `None`: this node's (a peer list without DCs is one DC).
    pub dc: Option<&'a str>,
    pub addr: Option<&'a str>,
}

/// The peer list split at the DC boundary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// The peers of this node's DC: the only ones the election and schedule distribution see.
    pub election: std::collections::BTreeSet<NodeId>,
    /// The other DCs, each with the addresses to try: its peers', then its entry points.
    pub members: BTreeMap<Dc, Vec<String>>,
}

/// Splits the peer list and the static entry points at this node's DC: peers of this DC (or of
/// no DC) elect together, every other DC is a member of the mesh.
pub fn split_peers<'a>(
    own_dc: &str,
    peers: impl IntoIterator<Item = PeerDc<'a>>,
    entry_points: &BTreeMap<Dc, Vec<String>>,
) -> Split {
    let mut split = Split::default();
    for peer in peers {
        match peer.dc {
            None => {
                split.election.insert(peer.id.clone());
            }
            Some(dc) if dc == own_dc => {
                split.election.insert(peer.id.clone());
            }
            Some(dc) => {
                let addrs = split.members.entry(dc.to_string()).or_default();
                if let Some(addr) = peer.addr
                    && !addrs.iter().any(|a| a == addr)
                {
                    addrs.push(addr.to_string());
                }
            }
        }
    }
    for (dc, points) in entry_points {
        if dc == own_dc {
            continue;
        }
        let addrs = split.members.entry(dc.clone()).or_default();
        for point in points {
            if !addrs.contains(point) {
                addrs.push(point.clone());
            }
        }
    }
    split
}

/// A request id (or the request an answer names): 1 to 128 characters.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.chars().count() <= 128
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A lease as taken: at least 1 ms (0 is refused before), at most `max`.
fn lease(lease_ms: u64, max: Duration) -> Duration {
    Duration::from_millis(lease_ms).min(max)
}

impl Exchange {
    pub fn new(me: Me, config: Config, now: Instant) -> Exchange {
        Exchange {
            seq: me.first_seq,
            me,
            config,
            remotes: BTreeMap::new(),
            output: Output::default(),
            summary_hash: None,
            exchanges: 0,
            window_start: now,
            window_bytes: 0,
        }
    }

    pub fn me(&self) -> &Me {
        &self.me
    }

    /// The other DCs and the addresses to try for each (peers of that DC first, then its entry
    /// points). This node's own DC is left out; a DC no longer listed is dropped with everything
    /// it sent.
    pub fn set_members(&mut self, members: BTreeMap<Dc, Vec<String>>) {
        self.remotes
            .retain(|dc, _| members.contains_key(dc) && *dc != self.me.dc);
        for (dc, addrs) in members {
            if dc == self.me.dc {
                continue;
            }
            let remote = self.remotes.entry(dc).or_default();
            if remote.addrs != addrs {
                remote.addrs = addrs;
                remote.next_addr = 0;
            }
        }
    }

    /// Takes what the scheduler returned. Entries that cannot be used are left out, each with
    /// its error; the rest is used.
    pub fn set_output(&mut self, now: Instant, output: Output) -> Vec<OutputError> {
        let mut errors = Vec::new();
        let mut kept = Output {
            summary: output.summary,
            ..Output::default()
        };
        for (dc, requests) in output.requests {
            let list = self.checked(&dc, "requests", requests, |r| &r.id, &mut errors);
            if !list.is_empty() {
                kept.requests.insert(dc, list);
            }
        }
        for (dc, answers) in output.answers {
            let list = self.checked(&dc, "answers", answers, |a| &a.request, &mut errors);
            let (open, closed): (Vec<_>, Vec<_>) = list
                .into_iter()
                .enumerate()
                .partition(|(_, a)| self.is_open(&dc, &a.request, now));
            errors.extend(closed.into_iter().map(|(index, a)| OutputError::NotOpen {
                dc: dc.clone(),
                index,
                request: a.request,
            }));
            if !open.is_empty() {
                kept.answers
                    .insert(dc, open.into_iter().map(|(_, a)| a).collect());
            }
        }
        self.summary_hash = kept.summary.as_ref().map(wire::summary_hash);
        self.output = kept;
        errors
    }

    /// Whether `dc` has the request `id` open here (received, its lease not over).
    fn is_open(&self, dc: &str, id: &str, now: Instant) -> bool {
        self.remotes
            .get(dc)
            .and_then(|r| r.requests_in.get(id))
            .is_some_and(|h| h.until > now)
    }

    /// The entries of one kind to one DC that can be used: to a member, a key of 1 to 128
    /// characters, each key once, with a lease. `index` in an error is the entry's place in
    /// what the scheduler returned.
    fn checked<T: HasLease>(
        &self,
        dc: &str,
        kind: &'static str,
        items: Vec<T>,
        key: impl Fn(&T) -> &String,
        errors: &mut Vec<OutputError>,
    ) -> Vec<T> {
        let mut kept: Vec<T> = Vec::new();
        for (index, item) in items.into_iter().enumerate() {
            let dc = dc.to_string();
            let id = key(&item);
            if !self.remotes.contains_key(&dc) {
                errors.push(OutputError::UnknownDc { kind, dc, index });
            } else if !valid_id(id) {
                errors.push(OutputError::BadId { kind, dc, index });
            } else if item.lease_ms() == 0 {
                errors.push(OutputError::NoLease { kind, dc, index });
            } else if kept.iter().any(|k| key(k) == id) {
                let id = id.clone();
                errors.push(OutputError::Duplicate {
                    kind,
                    dc,
                    index,
                    id,
                });
            } else {
                kept.push(item);
            }
        }
        kept
    }

    fn link_of(&self, remote: &Remote, now: Instant) -> Link {
        match remote.contact {
            None => Link::Unknown,
            Some(at) if now < at + self.config.link_timeout => Link::Up,
            Some(_) => Link::Down,
        }
    }

    /// The state of the link to `dc` (`None`: not a member).
    pub fn link(&self, dc: &str, now: Instant) -> Option<Link> {
        self.remotes.get(dc).map(|r| self.link_of(r, now))
    }

    /// Our answers to `dc` that may go out: those to a request of `dc` open here, while the
    /// link is up (a lender stops renewing what a lost DC may no longer hear, so its own count
    /// of what is lent ends too).
    fn answers_to(&self, dc: &str, now: Instant) -> Vec<Answer> {
        let up = self
            .remotes
            .get(dc)
            .is_some_and(|r| self.link_of(r, now) == Link::Up);
        if !up {
            return Vec::new();
        }
        self.output
            .answers
            .get(dc)
            .map(|list| {
                list.iter()
                    .filter(|a| self.is_open(dc, &a.request, now))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What an envelope to `dc` would carry, apart from the summary body: when it differs from
    /// what the last exchange that came back carried, something changed.
    fn fingerprint(&self, dc: &str, now: Instant) -> String {
        let requests = self.output.requests.get(dc).cloned().unwrap_or_default();
        let answers = self.answers_to(dc, now);
        format!(
            "{:?}|{}|{}",
            self.summary_hash,
            serde_json::to_string(&requests).expect("requests serialize"),
            serde_json::to_string(&answers).expect("answers serialize"),
        )
    }

    /// Whether `dc` lacks this DC's summary (and its body is not already on the way).
    fn wants_body(&self, remote: &Remote) -> bool {
        self.summary_hash.is_some() && remote.has_ours != self.summary_hash
    }
}

/// Requests and answers both have a lease.
trait HasLease {
    fn lease_ms(&self) -> u64;
}

impl HasLease for Request {
    fn lease_ms(&self) -> u64 {
        self.lease_ms
    }
}

impl HasLease for Answer {
    fn lease_ms(&self) -> u64 {
        self.lease_ms
    }
}

/// The exchange's steps: sending, replies, envelopes received, wake-ups, the view.
impl Exchange {
    /// Time moved on: leases end, a late exchange fails, and the envelopes due now go out.
    pub fn poll(&mut self, now: Instant) -> Vec<Send> {
        if now >= self.window_start + self.config.traffic_interval {
            let windows = (now - self.window_start).as_nanos()
                / self.config.traffic_interval.as_nanos().max(1);
            let windows = u32::try_from(windows).unwrap_or(u32::MAX);
            self.window_start += self.config.traffic_interval * windows;
            self.window_bytes = 0;
        }
        let timeout = self.config.exchange_timeout;
        for remote in self.remotes.values_mut() {
            remote.requests_in.retain(|_, h| h.until > now);
            remote.answers_in.retain(|_, h| h.until > now);
            remote.lent.retain(|_, until| *until > now);
            if remote
                .in_flight
                .as_ref()
                .is_some_and(|f| now >= f.sent_at + timeout)
            {
                remote.in_flight = None;
                remote.fail();
            }
        }
        let dcs: Vec<Dc> = self.remotes.keys().cloned().collect();
        let mut sends = Vec::new();
        for dc in dcs {
            if let Some(send) = self.send_if_due(&dc, now) {
                sends.push(send);
            }
        }
        sends
    }

    /// The envelope to `dc`, when one is due: the first, after a redirect, at the period, or
    /// early when something changed since the last exchange that came back (within the cap).
    fn send_if_due(&mut self, dc: &str, now: Instant) -> Option<Send> {
        let remote = &self.remotes[dc];
        if remote.in_flight.is_some() {
            return None;
        }
        let addr = remote.leader_addr.clone().or_else(|| {
            remote
                .addrs
                .get(remote.next_addr % remote.addrs.len().max(1))
                .cloned()
        })?;
        let heartbeat = match remote.last_sent {
            None => true,
            Some(at) => remote.redirect || now >= at + self.config.period,
        };
        let fingerprint = self.fingerprint(dc, now);
        if !heartbeat {
            let body_due = self.wants_body(remote)
                && remote.body_sent.as_ref().map(|(h, _)| h) != self.summary_hash.as_ref();
            let changed = remote.delivered.as_ref() != Some(&fingerprint) || body_due;
            if remote.failed || !changed {
                return None;
            }
        }
        let (envelope, size) = self.envelope(dc, now);
        let deferred = self.remotes[dc].deferred;
        if !heartbeat && (deferred || self.window_bytes + size > self.config.traffic_cap) {
            // An early send over the cap waits for the heartbeat.
            self.remotes.get_mut(dc).expect("member").deferred = true;
            return None;
        }
        self.count_sent(dc, &envelope, size, now);
        self.exchanges += 1;
        let remote = self.remotes.get_mut(dc).expect("member");
        remote.redirect = false;
        remote.last_sent = Some(now);
        remote.in_flight = Some(InFlight {
            exchange: self.exchanges,
            sent_at: now,
            fingerprint,
        });
        Some(Send {
            dc: dc.to_string(),
            addr,
            exchange: self.exchanges,
            envelope,
        })
    }

    /// This DC's envelope to `dc` now and its size: the summary body only when `dc` lacks it
    /// and it fits under the cap.
    fn envelope(&mut self, dc: &str, now: Instant) -> (Envelope, u64) {
        let remote = &self.remotes[dc];
        let mut envelope = Envelope {
            v: wire::VERSION,
            dc: self.me.dc.clone(),
            node: self.me.node.clone(),
            addr: self.me.addr.clone(),
            epoch: self.me.epoch,
            seq: self.seq,
            summary_hash: self.summary_hash.clone(),
            summary: None,
            have_summary: remote.summary.as_ref().map(|(hash, _, _)| hash.clone()),
            requests: self.output.requests.get(dc).cloned().unwrap_or_default(),
            answers: self.answers_to(dc, now),
        };
        self.seq += 1;
        let bare = size_of(&envelope);
        if !self.wants_body(remote) {
            self.remotes.get_mut(dc).expect("member").deferred = false;
            return (envelope, bare);
        }
        envelope.summary = self.output.summary.clone();
        let full = size_of(&envelope);
        let fits = self.window_bytes + full <= self.config.traffic_cap;
        self.remotes.get_mut(dc).expect("member").deferred = !fits;
        if fits {
            (envelope, full)
        } else {
            envelope.summary = None;
            (envelope, bare)
        }
    }

    /// An envelope goes out to `dc`: its bytes count against the cap, a body is on its way, and
    /// the answers it carries count as lent for their lease and the exchange timeout.
    fn count_sent(&mut self, dc: &str, envelope: &Envelope, size: u64, now: Instant) {
        self.window_bytes += size;
        let (max_lease, timeout) = (self.config.max_lease, self.config.exchange_timeout);
        let remote = self.remotes.get_mut(dc).expect("member");
        remote.bytes_sent += size;
        if envelope.summary.is_some() {
            remote.body_sent = envelope.summary_hash.clone().map(|h| (h, now));
        }
        for answer in &envelope.answers {
            let until = now + lease(answer.lease_ms, max_lease) + timeout;
            let held = remote.lent.entry(answer.request.clone()).or_insert(until);
            *held = (*held).max(until);
        }
    }

    /// How exchange `exchange` to `dc` ended.
    pub fn answered(&mut self, now: Instant, dc: &str, exchange: u64, outcome: Outcome) {
        let Some(remote) = self.remotes.get_mut(dc) else {
            return;
        };
        let Some(flight) = remote.in_flight.take_if(|f| f.exchange == exchange) else {
            return;
        };
        match outcome {
            Outcome::Reply(envelope) => {
                if envelope.dc != dc || self.check(&envelope).is_err() {
                    self.remotes.get_mut(dc).expect("member").fail();
                    return;
                }
                self.take(now, envelope);
                let remote = self.remotes.get_mut(dc).expect("member");
                let rtt = now - flight.sent_at;
                remote.rtt = Some(rtt);
                remote.srtt = Some(remote.srtt.map_or(rtt, |s| (s * 7 + rtt) / 8));
                remote.delivered = Some(flight.fingerprint);
                remote.failed = false;
                remote.redirects = 0;
            }
            Outcome::NotLeader(Some(addr))
                if remote.redirects < MAX_REDIRECTS
                    && remote.leader_addr.as_ref() != Some(&addr) =>
            {
                remote.leader_addr = Some(addr);
                remote.redirect = true;
                remote.redirects += 1;
            }
            Outcome::NotLeader(_) | Outcome::Failed => remote.fail(),
        }
    }

    /// An envelope another DC's leader sent: taken, and this DC's envelope is the reply.
    ///
    /// An envelope of that DC's newest sender that a newer one of the same sender overtook is
    /// answered without being taken: the two leaders' exchanges cross (this node's reply to
    /// the sender's own call, or the sender's later call, arrived first), so nothing in it is
    /// news, and refusing the call would show the link failing for a call that only came late.
    pub fn receive(&mut self, now: Instant, envelope: Envelope) -> Result<Envelope, Refusal> {
        let dc = envelope.dc.clone();
        match self.check(&envelope) {
            Ok(()) => self.take(now, envelope),
            Err(Refusal::Stale { .. }) if self.overtaken(&envelope) => {}
            Err(refusal) => return Err(refusal),
        }
        let (reply, size) = self.envelope(&dc, now);
        self.count_sent(&dc, &reply, size, now);
        Ok(reply)
    }

    /// Whether `envelope` comes from its DC's newest sender at that sender's epoch (then
    /// [`Exchange::check`] refuses it only for its `seq`, which a newer envelope passed).
    fn overtaken(&self, envelope: &Envelope) -> bool {
        self.remotes
            .get(&envelope.dc)
            .and_then(|remote| remote.sender.as_ref())
            .is_some_and(|(epoch, node, _)| *epoch == envelope.epoch && *node == envelope.node)
    }

    /// Whether an envelope may be taken: this version, another DC of the mesh, not older than
    /// the newest one held from that DC, a summary body that matches its hash.
    fn check(&self, envelope: &Envelope) -> Result<(), Refusal> {
        if envelope.v != wire::VERSION {
            return Err(Refusal::Version(envelope.v));
        }
        if envelope.dc == self.me.dc {
            return Err(Refusal::OwnDc(envelope.dc.clone()));
        }
        let Some(remote) = self.remotes.get(&envelope.dc) else {
            return Err(Refusal::UnknownDc(envelope.dc.clone()));
        };
        if let Some((epoch, _, _)) = &remote.sender {
            let newer = envelope.epoch > *epoch
                || (envelope.epoch == *epoch
                    && remote
                        .seqs
                        .get(&envelope.node)
                        .is_none_or(|s| envelope.seq > *s));
            if !newer {
                return Err(Refusal::Stale {
                    dc: envelope.dc.clone(),
                });
            }
        }
        if let Some(body) = &envelope.summary
            && envelope.summary_hash.as_deref() != Some(wire::summary_hash(body).as_str())
        {
            return Err(Refusal::SummaryHash);
        }
        Ok(())
    }

    /// Takes a checked envelope: contact, its sender as the DC's leader, its summary, what it
    /// has of ours, and its requests and answers (replacing the ones before) with their leases.
    fn take(&mut self, now: Instant, envelope: Envelope) {
        let size = size_of(&envelope);
        let max_lease = self.config.max_lease;
        let ours: Vec<String> = self
            .output
            .requests
            .get(&envelope.dc)
            .map(|list| list.iter().map(|r| r.id.clone()).collect())
            .unwrap_or_default();
        let remote = self.remotes.get_mut(&envelope.dc).expect("checked");
        let from = (envelope.epoch, envelope.node.clone());
        if remote
            .sender
            .as_ref()
            .is_some_and(|(e, _, _)| *e != envelope.epoch)
        {
            remote.seqs.clear();
        }
        remote.seqs.insert(envelope.node.clone(), envelope.seq);
        remote.sender = Some((envelope.epoch, envelope.node, envelope.seq));
        remote.contact = Some(now);
        remote.leader_addr = Some(envelope.addr);
        remote.bytes_received += size;
        match (&envelope.summary_hash, envelope.summary) {
            (None, _) => remote.summary = None,
            (Some(hash), Some(body)) => remote.summary = Some((hash.clone(), body, now)),
            // Announced only: the old body stays, known to be behind.
            (Some(_), None) => {}
        }
        remote.announced = envelope.summary_hash;
        remote.has_ours = envelope.have_summary;
        // Requests: the sender speaks for its DC, a request it does not repeat is withdrawn
        // (a new leader's too: its scheduler decides what its DC still needs).
        remote.requests_in = envelope
            .requests
            .into_iter()
            .filter(|r| valid_id(&r.id) && r.lease_ms > 0)
            .map(|r| {
                let until = now + lease(r.lease_ms, max_lease);
                let from = from.clone();
                (
                    r.id.clone(),
                    Held {
                        item: r,
                        until,
                        from,
                    },
                )
            })
            .collect();
        // Answers: one the sender stops repeating is withdrawn; one another leader of that DC
        // gave holds until its lease ends (a grant outlives the lender's leader change unless
        // the new leader's scheduler takes it back).
        remote.answers_in.retain(|_, h| h.from != from);
        for answer in envelope.answers {
            if ours.contains(&answer.request) && answer.lease_ms > 0 {
                let until = now + lease(answer.lease_ms, max_lease);
                let held = Held {
                    item: answer,
                    until,
                    from: from.clone(),
                };
                remote.answers_in.insert(held.item.request.clone(), held);
            }
        }
        remote.answers_in.retain(|id, _| ours.contains(id));
    }
}

/// Redirects followed at once between two replies; more wait for the period.
const MAX_REDIRECTS: u32 = 3;

fn size_of(envelope: &Envelope) -> u64 {
    envelope.to_json().len() as u64
}

impl Remote {
    /// An exchange failed: try the next address, after the period.
    fn fail(&mut self) {
        self.failed = true;
        self.leader_addr = None;
        self.redirect = false;
        self.next_addr = self.next_addr.wrapping_add(1);
        self.body_sent = None;
    }
}

/// When to look again, and what the scheduler sees.
impl Exchange {
    /// When [`Exchange::poll`] has something to do (a send, a late exchange, a lease ending, a
    /// link going down); `None` when nothing will. Poll at once after every other input too
    /// (a new output, a reply, an envelope received): a change goes out early.
    pub fn deadline(&self, now: Instant) -> Option<Instant> {
        let mut at: Option<Instant> = None;
        let mut take = |t: Instant| at = Some(at.map_or(t, |a| a.min(t)));
        for remote in self.remotes.values() {
            let reachable = remote.leader_addr.is_some() || !remote.addrs.is_empty();
            match (&remote.in_flight, remote.last_sent) {
                (Some(flight), _) => take(flight.sent_at + self.config.exchange_timeout),
                _ if !reachable => {}
                (None, None) => take(now),
                (None, Some(sent)) if remote.redirect => take(sent),
                (None, Some(sent)) => take(sent + self.config.period),
            }
            remote.requests_in.values().for_each(|h| take(h.until));
            remote.answers_in.values().for_each(|h| take(h.until));
            remote.lent.values().for_each(|until| take(*until));
            if let Some(down) = remote.contact.map(|c| c + self.config.link_timeout)
                && down > now
            {
                take(down);
            }
        }
        at
    }

    /// `state.datacenters`: every other DC as this leader sees it now.
    pub fn view(&self, now: Instant) -> View {
        let age = |at: Instant| ms(now.saturating_duration_since(at));
        let left = |until: Instant| ms(until.saturating_duration_since(now));
        let dcs = self
            .remotes
            .iter()
            .map(|(dc, r)| {
                let view = DcView {
                    leader: r.sender.as_ref().map(|(_, node, _)| node.clone()),
                    link: self.link_of(r, now),
                    rtt_ms: r.srtt.map(ms),
                    contact_age_ms: r.contact.map(age),
                    summary: r.summary.as_ref().map(|(_, body, _)| body.clone()),
                    summary_age_ms: r.summary.as_ref().map(|(_, _, at)| age(*at)),
                    summary_behind: r.announced.is_some()
                        && r.announced.as_ref() != r.summary.as_ref().map(|(h, _, _)| h),
                    requests: (r.requests_in.values())
                        .filter(|h| h.until > now)
                        .map(|h| HeldRequest {
                            id: h.item.id.clone(),
                            data: h.item.data.clone(),
                            expires_in_ms: left(h.until),
                        })
                        .collect(),
                    answers: (r.answers_in.values())
                        .filter(|h| h.until > now)
                        .map(|h| HeldAnswer {
                            request: h.item.request.clone(),
                            data: h.item.data.clone(),
                            expires_in_ms: left(h.until),
                        })
                        .collect(),
                    lent: (r.lent.iter())
                        .filter(|(_, until)| **until > now)
                        .map(|(request, until)| Lent {
                            request: request.clone(),
                            outstanding_ms: left(*until),
                        })
                        .collect(),
                    summary_deferred: r.deferred,
                    bytes_sent: r.bytes_sent,
                    bytes_received: r.bytes_received,
                };
                (dc.clone(), view)
            })
            .collect();
        View {
            self_dc: self.me.dc.clone(),
            dcs,
        }
    }
}
