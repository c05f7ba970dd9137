//! Schedule distribution over HTTP (`GET /v1/schedule`, as verwalter 0.13): the adapter around
//! the replication machine (`verwalter_controllers::cluster::replication`), which decides what to fetch,
//! from whom and when, and what to do with it. This task feeds it the store's election state,
//! the peers' reports, the schedule held and the schedules peers reported; runs the fetches it
//! asks for (within [`FETCH_TIMEOUT`] and [`MAX_SCHEDULE`], checking that the data matches the
//! envelope's hash); and carries out its effects: a follower's schedule saved through the
//! [`Persister`] (which writes it again until it is written, and reports a failure) and put in
//! force (and rendered), `replaced`, and a leader's `prefetched` parents.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::cluster::replication::{
    Effect, Fetch, Purpose, Replication, ReplicationConfig, Sightings, World,
};
use verwalter_controllers::machinery::clock::Clock;
use verwalter_controllers::machinery::store::Field;
use verwalter_controllers::node::Store;
use verwalter_controllers::schedule::persist::Persister;
use verwalter_controllers::state::{Prefetched, Schedule};

use super::coding::{self, Coding};
use super::peers::{self, Liveness};
use super::vouch::Announced;
use crate::machinery::http_client::HttpClient;
use crate::metrics::Metrics;

/// Schedules larger than this are refused (a transport limit: the body is read into memory).
pub(crate) const MAX_SCHEDULE: usize = 64 << 20;
/// One request may take this long (a fetch is one or two requests, see [`Ask`]).
const FETCH_TIMEOUT: Duration = Duration::from_secs(3);

/// The schedules of other nodes that peers reported, noted by the election transport as packets
/// arrive and read by the fetcher (see [`Sightings`] for why the reports alone do not do).
pub(crate) type SharedSightings = Arc<Mutex<Sightings>>;

/// What the fetcher reads, writes and talks through (the wiring; no state of its own).
pub(crate) struct FetcherParts {
    pub(crate) store: Store,
    /// Shared with the schedule controller; written here only while following.
    pub(crate) schedule: Arc<Field<Option<Schedule>>>,
    pub(crate) prefetched: Field<Prefetched>,
    /// Schedules of other leaders replaced here (see `Store::replaced`).
    pub(crate) replaced: Field<Vec<Schedule>>,
    /// Shared with the schedule controller: writes the schedule in force, for both roles.
    pub(crate) persister: Arc<Persister>,
    pub(crate) metrics: Arc<Metrics>,
    /// When each peer's last election packet came (which peers a new leader waits for).
    pub(crate) live: Liveness,
    pub(crate) clock: Arc<dyn Clock>,
    /// Fed by the election transport.
    pub(crate) sightings: SharedSightings,
    /// Where a follower puts the leader's schedule as it arrives, for its relay children.
    pub(crate) relay: Arc<crate::http::RelayBody>,
    /// Body hashes leaders announced (noted by the election transport).
    pub(crate) announced: Arc<Announced>,
    /// Schedules inline on etcd (offered by the etcd task; `None` with the built-in election).
    pub(crate) inline: Option<Arc<InlineBodies>>,
}

/// How a fetched schedule is read: for node `host`, taking a body `announced` vouches for
/// without hashing its data, counted in `metrics`.
#[derive(Clone)]
pub(crate) struct Reading {
    pub(crate) host: Arc<str>,
    pub(crate) announced: Arc<Announced>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Reading {
    /// A body vouched for by nothing but its schedule hash (tests).
    #[cfg(test)]
    fn plain(host: &str) -> Reading {
        Reading {
            host: Arc::from(host),
            announced: Arc::default(),
            metrics: Arc::new(Metrics::new()),
        }
    }
}

/// The fetcher task: the replication machine and what it acts through.
pub(crate) struct Fetcher {
    machine: Replication,
    io: FetcherParts,
    client: HttpClient,
    /// Sent on schedule fetches ([`crate::http::HttpSettings::token_for_peers`]).
    token: Option<verwalter_controllers::http::access::Token>,
    /// This node's hostname: its part of a schedule is read as the schedule arrives.
    host: Arc<str>,
}

/// A fetch running, with the fetch it answers and whether the schedule came inline from etcd.
type Running = BoxFuture<'static, (Fetch, Result<Schedule, String>, bool)>;

/// Where an inline body's errors say it came from.
const INLINE_URL: &str = "etcd P/schedule";

/// A schedule body that came inline in etcd's `P/schedule` (docs/etcd.md, "Keys"), LZ4 as the
/// leader serves it: the etcd task offers it under the hash the value names, and the fetcher,
/// when it follows that hash, takes it instead of asking the leader, inflated and checked as a
/// fetched body is. A body that fails is counted and logged, and the leader is asked as without
/// it.
pub(crate) struct InlineBodies {
    held: Mutex<Option<(String, hyper::body::Bytes)>>,
    /// `verwalter_etcd_inline_schedules_total` by result (`taken`, `refused`).
    results: prometheus::IntCounterVec,
}

// Offered only by the etcd task (the `etcd` feature).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
impl InlineBodies {
    pub(crate) fn register(registry: &prometheus::Registry) -> InlineBodies {
        InlineBodies {
            held: Mutex::default(),
            results: crate::metrics::Families(registry).counter_vec(
                "verwalter_etcd_inline_schedules_total",
                "Schedules that came inline in etcd's P/schedule, by result (taken, refused).",
                &["result"],
            ),
        }
    }

    /// Holds `body` as schedule `hash` (replacing the one held).
    pub(crate) fn offer(&self, hash: &str, body: hyper::body::Bytes) {
        *self.held.lock().unwrap() = Some((hash.to_string(), body));
    }

    /// The body held for `hash`, taken out.
    fn take(&self, hash: &str) -> Option<hyper::body::Bytes> {
        let mut held = self.held.lock().unwrap();
        if held.as_ref().is_some_and(|(h, _)| h == hash) {
            return held.take().map(|(_, body)| body);
        }
        None
    }

    /// An inline body that could not be taken (counted; the caller logs why).
    pub(crate) fn refused(&self) {
        self.results.with_label_values(&["refused"]).inc();
    }

    /// Schedule `hash` from `body`, checked as a fetched body is; `None` (counted, logged)
    /// when it does not check out as that schedule.
    async fn read(
        &self,
        hash: &str,
        body: hyper::body::Bytes,
        relay: Option<&crate::http::RelayBody>,
        reading: &Reading,
    ) -> Option<Schedule> {
        let fetched = Fetched {
            body,
            coding: Coding::Lz4,
        };
        let error = match pass_on(INLINE_URL, hash, fetched, relay, reading).await {
            Ok(schedule) if schedule.hash == hash => {
                self.results.with_label_values(&["taken"]).inc();
                return Some(schedule);
            }
            Ok(schedule) => format!("{INLINE_URL}: holds schedule {}", schedule.hash),
            Err(e) => e,
        };
        self.refused();
        tracing::warn!(%hash, %error, "Refused the schedule inline on etcd; fetching it from the leader.");
        None
    }
}

impl Fetcher {
    pub(crate) fn new(config: ReplicationConfig, parts: FetcherParts) -> Fetcher {
        Fetcher {
            machine: Replication::new(config),
            io: parts,
            client: peers::client(),
            token: None,
            host: Arc::from(""),
        }
    }

    /// Fetches send `token` (peers whose reads need it: `http.token-for-reads`).
    pub(crate) fn with_token(
        mut self,
        token: Option<verwalter_controllers::http::access::Token>,
    ) -> Fetcher {
        self.token = token;
        self
    }

    /// The hostname this node renders as (see `ScheduleData::received`).
    pub(crate) fn with_host(mut self, host: &str) -> Fetcher {
        self.host = Arc::from(host);
        self
    }

    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut election = self.io.store.election.clone();
        let mut reports = self.io.store.reports.clone();
        let mut peers = self.io.store.peers.clone();
        // Fetches run beside the loop, so that the machine sees the world change meanwhile (and
        // ignores a result that no longer matters). It asks for one at a time; a result it
        // stopped waiting for may still be running.
        let mut running: FuturesUnordered<Running> = FuturesUnordered::new();
        loop {
            election.get();
            reports.get();
            peers.get();
            let now = Instant::now();
            let actions = self.io.with_world(|world| self.machine.step(now, world));
            self.act(actions, &mut running, None);
            let wake = self.machine.wake_at(now);
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = election.changed() => {}
                _ = reports.changed() => {}
                _ = peers.changed() => {}
                Some((fetch, result, inline)) = running.next(), if !running.is_empty() => {
                    let ok = result.as_ref().is_ok_and(|s| {
                        verwalter_controllers::cluster::replication::refusal(&fetch, s).is_none()
                    });
                    if !inline {
                        self.io.metrics.schedule_fetch(ok);
                    }
                    let now = Instant::now();
                    let actions = self
                        .io
                        .with_world(|world| self.machine.fetched(now, world, fetch.clone(), result));
                    let from = if inline { "etcd" } else { fetch.peer.as_str() };
                    self.act(actions, &mut running, Some(from));
                }
                _ = sleep => {}
            }
        }
    }

    /// Carries out `actions`; `from`: the peer whose fetch they answer.
    fn act(
        &mut self,
        actions: Vec<Effect>,
        running: &mut FuturesUnordered<Running>,
        from: Option<&str>,
    ) {
        for action in actions {
            match action {
                Effect::Fetch(fetch) => {
                    let addr = self
                        .io
                        .store
                        .peers
                        .peek()
                        .peers
                        .get(&fetch.peer)
                        .and_then(|p| p.addr.clone());
                    let client = self.client.clone();
                    let token = self.token.clone();
                    let reading = Reading {
                        host: self.host.clone(),
                        announced: self.io.announced.clone(),
                        metrics: self.io.metrics.clone(),
                    };
                    // What a follower takes from its leader, it passes on to its children.
                    let follow = matches!(fetch.purpose, Purpose::Follow { .. });
                    let relay = follow.then(|| self.io.relay.clone());
                    let inline = self.io.inline.clone().filter(|_| follow);
                    running.push(Box::pin(async move {
                        let hash = &fetch.stamp.hash;
                        if let Some(bodies) = inline
                            && let Some(body) = bodies.take(hash)
                            && let Some(schedule) =
                                bodies.read(hash, body, relay.as_deref(), &reading).await
                        {
                            return (fetch, Ok(schedule), true);
                        }
                        let result = match addr {
                            Some(addr) => {
                                let hash = &fetch.stamp.hash;
                                let relay = relay.as_deref();
                                let token = token.as_ref();
                                let ask = Ask::new(&addr, hash, fetch.relayed());
                                fetch_schedule(&client, token, ask, hash, relay, &reading).await
                            }
                            None => Err(format!("no address known for {}", fetch.peer)),
                        };
                        (fetch, result, false)
                    }));
                }
                Effect::Replaced(list) => {
                    self.io.replaced.set(list);
                }
                Effect::Accept(schedule) => {
                    // A failure is reported and retried by the persister; the schedule is in
                    // force anyway.
                    // The write (a file and its fsync) must not hold up the runtime's other
                    // tasks, the election's among them.
                    let save = || self.io.persister.save(&schedule);
                    let _ = match tokio::runtime::Handle::current().runtime_flavor() {
                        tokio::runtime::RuntimeFlavor::MultiThread => {
                            tokio::task::block_in_place(save)
                        }
                        _ => save(),
                    };
                    tracing::info!(hash = %schedule.hash, leader = %schedule.origin,
                        from = %from.unwrap_or("-"), "Took the leader's schedule.");
                    self.io.schedule.set(Some(schedule));
                }
                Effect::Gathered { parents, took } => {
                    tracing::info!(
                        epoch = parents.epoch,
                        parents = parents.schedules.len(),
                        ?took,
                        "Leading; gathered the peers' schedules."
                    );
                    self.io.prefetched.set(parents);
                }
                Effect::Awaiting { parents } => {
                    match &parents.awaiting {
                        Some(stamp) => {
                            tracing::info!(hash = %stamp.hash, origin = %stamp.origin, "A peer holds another leader's schedule; scheduling waits until it is fetched.")
                        }
                        None => tracing::info!("No longer waiting for another leader's schedule."),
                    }
                    self.io.prefetched.set(parents);
                }
                Effect::AddedParent { parents, added } => {
                    tracing::info!(hash = %added.hash, origin = %added.origin, "A peer holds another leader's schedule; adding it to the parents.");
                    self.io.prefetched.set(parents);
                }
                Effect::Failed {
                    fetch,
                    error,
                    retry_at,
                } => {
                    let peer = &fetch.peer;
                    let retry_in = retry_at.map(|at| at.saturating_duration_since(Instant::now()));
                    match (&fetch.purpose, retry_in) {
                        (Purpose::Follow { .. }, _) if fetch.relayed() => {
                            tracing::info!(relay = %peer, %error, "The relay did not give the leader's schedule; fetching it from the leader.")
                        }
                        (Purpose::Follow { .. }, _) => {
                            tracing::warn!(leader = %peer, %error, ?retry_in, "Cannot fetch the leader's schedule.")
                        }
                        (Purpose::Gather { .. }, _) => {
                            tracing::warn!(%peer, %error, "A parent schedule could not be fetched; scheduling without it.")
                        }
                        (Purpose::LateParent { .. }, Some(retry_in)) => {
                            tracing::warn!(%peer, %error, ?retry_in, "Cannot fetch a peer's schedule for the parents; trying again.")
                        }
                        (Purpose::LateParent { .. }, None) => {
                            tracing::warn!(%peer, %error, "Cannot fetch a peer's schedule for the parents; giving up on it.")
                        }
                    }
                }
            }
        }
    }
}

impl FetcherParts {
    /// Runs `decide` on what the node sees now.
    fn with_world<R>(&self, decide: impl FnOnce(&World) -> R) -> R {
        let election = self.store.election.peek();
        let reports = self.store.reports.peek();
        let held = self.store.schedule.peek();
        let packets: BTreeMap<String, u64> = self.live.packets();
        let sightings = self.sightings.lock().unwrap();
        let nodes: Vec<String> = self.store.peers.peek().peers.keys().cloned().collect();
        decide(&World {
            election: &election,
            reports: &reports,
            held: held.as_ref().as_ref(),
            sightings: &sightings,
            packets: &packets,
            now_ms: self.clock.now_ms(),
            nodes: &nodes,
        })
    }
}

/// The URLs a fetch of a schedule asks, in order.
struct Ask {
    /// Asked in order until one answers.
    urls: Vec<String>,
}

impl Ask {
    /// Schedule `hash` from the peer at `addr`. From the leader (or another peer),
    /// `/v1/schedule/<hash>`, which also finds a schedule the peer replaced a moment ago; a peer
    /// without that route (verwalter 0.13) gets the plain `/v1/schedule`. From this node's
    /// relay (`relayed`), a follower that may be about to take that schedule itself, the
    /// request waits for it (`/v1/schedule/<hash>?wait_ms=`, see
    /// `http::api::schedule_by_hash`); no fallback to the plain `/v1/schedule` there: a relay
    /// without the hash (or of verwalter 0.13, without the route) fails the fetch, and the
    /// machine asks the leader.
    fn new(addr: &str, hash: &str, relayed: bool) -> Ask {
        if relayed {
            let wait = crate::http::RELAY_WAIT_MAX.as_millis();
            let url = format!("http://{addr}/v1/schedule/{hash}?wait_ms={wait}");
            Ask { urls: vec![url] }
        } else {
            Ask {
                urls: vec![
                    format!("http://{addr}/v1/schedule/{hash}"),
                    format!("http://{addr}/v1/schedule"),
                ],
            }
        }
    }
}

/// Fetches schedule `hash` as `ask` says and checks that its data matches its hash (whether it
/// is the schedule wanted is the machine's call).
async fn fetch_schedule(
    client: &HttpClient,
    token: Option<&verwalter_controllers::http::access::Token>,
    ask: Ask,
    hash: &str,
    relay: Option<&crate::http::RelayBody>,
    reading: &Reading,
) -> Result<Schedule, String> {
    let mut failed = None;
    for url in &ask.urls {
        match get_compressed(client, url, token).await {
            // Whether the body may be passed on is up to the URL that answered: the leader's
            // `/v1/schedule/<hash>` answers with that schedule, a 0.13 peer's plain route
            // with whatever it holds.
            Ok(fetched) => return pass_on(url, hash, fetched, relay, reading).await,
            Err(e) => failed = Some(e),
        }
    }
    Err(failed.expect("a fetch asks at least one URL"))
}

/// [`fetch_schedule`] from the leader (or another peer) at `addr`.
#[cfg(test)]
async fn get_schedule(
    client: &HttpClient,
    token: Option<&verwalter_controllers::http::access::Token>,
    addr: &str,
    hash: &str,
    relay: Option<&crate::http::RelayBody>,
    reading: &Reading,
) -> Result<Schedule, String> {
    let ask = Ask::new(addr, hash, false);
    fetch_schedule(client, token, ask, hash, relay, reading).await
}

/// GETs `url` asking for a compressed answer (see [`coding`]), at most [`MAX_SCHEDULE`] bytes
/// as it came, within [`FETCH_TIMEOUT`]; [`Fetched::plain`] inflates it (at most
/// [`MAX_SCHEDULE`] bytes again). Schedules travel so between nodes of this version; a server
/// that ignores the header (verwalter 0.13) answers plain JSON, taken as it is.
async fn get_compressed(
    client: &HttpClient,
    url: &str,
    token: Option<&verwalter_controllers::http::access::Token>,
) -> Result<Fetched, String> {
    let headers = [
        peers::HOST,
        (hyper::header::ACCEPT_ENCODING, coding::ACCEPTED),
    ];
    let token = token.map(|t| t.as_bytes());
    let coding_of = |head: &hyper::HeaderMap| {
        Coding::of_response(head)
            .ok_or_else(|| format!("{url}: a Content-Encoding this node cannot read"))
    };
    let (coding, body) = client
        .get(url, token, &headers, MAX_SCHEDULE, FETCH_TIMEOUT, coding_of)
        .await?;
    Ok(Fetched { body, coding })
}

/// A body fetched, as it came, in `coding`.
#[derive(Debug)]
pub(crate) struct Fetched {
    pub(crate) body: hyper::body::Bytes,
    pub(crate) coding: Coding,
}

impl Fetched {
    /// The body decoded, refused past `limit` bytes: the caller runs this off the async
    /// runtime (a megabyte's schedule takes a fraction of a millisecond).
    pub(crate) fn plain(self, limit: usize) -> Result<Vec<u8>, String> {
        self.coding.decode(self.body, limit)
    }
}

/// Offers the compressed body of `hash` to `relay` at once (see `RelayBody`), then decodes it; a body
/// that fails the check is withdrawn. (The plain `/v1/schedule` of a 0.13 peer may hold another
/// schedule than `hash`: it is offered under `hash` only if it checks out as that one.)
async fn pass_on(
    url: &str,
    hash: &str,
    fetched: Fetched,
    relay: Option<&crate::http::RelayBody>,
    reading: &Reading,
) -> Result<Schedule, String> {
    let compressed = fetched.coding != Coding::Identity;
    let relay = relay.filter(|_| compressed && !url.ends_with("/v1/schedule"));
    if let Some(relay) = relay {
        relay.offer(hash, fetched.coding, fetched.body.clone());
    }
    let decoded = decode(url, hash, fetched, reading).await;
    if let Some(relay) = relay
        && !decoded.as_ref().is_ok_and(|s| s.hash == hash)
    {
        relay.withdraw(hash);
    }
    decoded
}

/// A schedule from the body `fetched`, inflated and checked (its data against its hash, or
/// the body against the one the leader announced for `hash`, see [`crate::cluster::vouch`]), on
/// a blocking thread (a megabyte takes a millisecond or two that the runtime's other tasks must
/// not wait). The data stays text: the schedule's `ScheduleData` parses it when something
/// reads it whole.
async fn decode(
    url: &str,
    hash: &str,
    fetched: Fetched,
    reading: &Reading,
) -> Result<Schedule, String> {
    let (url, hash, reading) = (url.to_string(), hash.to_string(), reading.clone());
    let work = move || {
        let (coding, coded) = (fetched.coding, fetched.body.clone());
        let body = fetched
            .plain(MAX_SCHEDULE)
            .map_err(|e| format!("{url}: {e}"))?;
        let (schedule, vouched) = super::vouch::read(
            &reading.announced,
            &hash,
            coding,
            &coded,
            body,
            &reading.host,
        )
        .map_err(|e| format!("{url}: {e}"))?;
        reading.metrics.schedule_checked(vouched);
        Ok(schedule)
    };
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| format!("decoding the schedule failed: {e}"))?
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use verwalter_controllers::cluster::election::ElectionState;
    use verwalter_controllers::machinery::clock::SystemClock;
    use verwalter_controllers::machinery::ports::ScheduleStore;
    use verwalter_controllers::machinery::store::Reader;
    use verwalter_controllers::node::StoreWriter;
    use verwalter_controllers::state::{Peer, Peers, Report};
    use verwalter_controllers::testing::{MemoryScheduleStore, disk_full};

    use super::*;
    use crate::storage::state_dir::StateDir;

    const ME: &str = "77985419c732412ea38b94db00000001";
    const PEER: &str = "77985419c732412ea38b94db00000002";
    const OTHER_LEADER: &str = "77985419c732412ea38b94db00000003";

    /// Peers count as heard from lately for a minute: these tests run on the real clock, and
    /// the peer's packets are noted once (see [`heard`]).
    fn config() -> ReplicationConfig {
        ReplicationConfig {
            id: ME.into(),
            window: Duration::from_secs(2),
            recent: Duration::from_secs(60),
            relay_fanout: verwalter_controllers::defaults::RELAY_FANOUT,
        }
    }

    /// What the election transport notes when a packet from `peer` arrives.
    fn heard(peer: &str) -> Liveness {
        let live = Liveness::default();
        live.packet(peer, SystemClock.now_ms());
        live
    }

    /// A request's head as text, read up to its blank line; `None` when the client goes first.
    async fn read_head(conn: &mut tokio::net::TcpStream) -> Option<String> {
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        Some(String::from_utf8_lossy(&request).into_owned())
    }

    /// Serves `schedule` as the answer to every GET but the first `failures` (503), on a local
    /// port it returns.
    async fn serve(schedule: Schedule, failures: usize) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = serde_json::to_vec(&schedule).unwrap();
        tokio::spawn(async move {
            let mut served = 0;
            while let Ok((mut conn, _)) = listener.accept().await {
                served += 1;
                let fail = served <= failures;
                let body = body.clone();
                tokio::spawn(async move {
                    let Some(_) = read_head(&mut conn).await else {
                        return;
                    };
                    if fail {
                        let head = "HTTP/1.1 503 Service Unavailable\r\n\
                                    Content-Length: 0\r\nConnection: close\r\n\r\n";
                        let _ = conn.write_all(head.as_bytes()).await;
                        return;
                    }
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(&body).await;
                });
            }
        });
        port
    }

    /// Issue 10: after a heal, a peer reports the other side's schedule only until it has
    /// fetched this leader's (one heartbeat). A leader that looks at the reports only after the
    /// peer moved on still merges that schedule, from what the transport noted.
    #[tokio::test]
    async fn a_leader_merges_a_schedule_a_peer_reported_only_briefly() {
        // Leading at epoch 5, its parents gathered: the late-parents path.
        parents_after_a_brief_report(5, 0).await;
    }

    /// A fetch of such a schedule that fails (a heal often brings UDP back before TCP) is tried
    /// again a little later, not given up at once.
    #[tokio::test]
    async fn a_parent_that_cannot_be_fetched_at_first_is_tried_again() {
        // One try is two requests (by hash, then the plain route): the first try fails.
        parents_after_a_brief_report(5, 2).await;
    }

    /// The same for a leader elected after the heal (its gathering at takeover, epoch 5).
    #[tokio::test]
    async fn a_new_leader_gathers_a_schedule_a_peer_reported_only_briefly() {
        parents_after_a_brief_report(4, 0).await;
    }

    /// A store in which `PEER`, listening on `port`, is the only peer and `leader` leads epoch 5
    /// (this node, if it is `ME`).
    fn cluster(held: Option<Schedule>, port: u16, leader: &str) -> StoreWriter {
        let writer = StoreWriter::new(held);
        let peer = Peer {
            id: PEER.into(),
            addr: Some(format!("127.0.0.1:{port}")),
            name: "peer".into(),
            hostname: "peer".into(),
            schedule: None,
            known_since: 0,
            last_report_direct: None,
            errors: 0,
        };
        writer.peers.set(Peers {
            peers: BTreeMap::from([(PEER.to_string(), peer)]),
            timestamp: Some(1),
        });
        writer.election.set(ElectionState {
            is_leader: leader == ME,
            is_stable: true,
            leader: Some(leader.into()),
            epoch: 5,
            ..ElectionState::default()
        });
        writer
    }

    /// `PEER`'s next election packet (epoch 5) says it holds `held`.
    fn peer_reports(writer: &StoreWriter, held: &Schedule) {
        let report = Report {
            schedule: Some(held.stamp()),
            errors: 0,
            epoch: 5,
        };
        writer
            .reports
            .update(|all| _ = all.insert(PEER.into(), report));
    }

    /// A fetcher over `writer`'s store, writing schedules to `disk`, running until `stop`.
    /// Returns the store, the persister and the fetcher's task.
    fn spawn_fetcher(
        writer: StoreWriter,
        disk: Arc<dyn ScheduleStore>,
        sightings: SharedSightings,
        stop: &CancellationToken,
    ) -> (Store, Arc<Persister>, tokio::task::JoinHandle<()>) {
        let store = writer.store();
        let StoreWriter {
            schedule,
            prefetched,
            replaced,
            persist_error,
            peers,
            election,
            reports,
            ..
        } = writer;
        let persister = Arc::new(Persister::new(disk, persist_error));
        let fetcher = Fetcher::new(
            config(),
            FetcherParts {
                store: store.clone(),
                schedule: Arc::new(schedule),
                prefetched,
                replaced,
                persister: persister.clone(),
                metrics: Arc::new(Metrics::new()),
                live: heard(PEER),
                clock: Arc::new(SystemClock),
                sightings,
                relay: Default::default(),
                announced: Default::default(),
                inline: None,
            },
        );
        let stop = stop.clone();
        let task = tokio::spawn(async move {
            // The fetcher waits on these fields: their writers stay alive while it runs.
            let _writers = (peers, election, reports);
            fetcher.run(stop).await
        });
        (store, persister, task)
    }

    /// `reader`'s first value that passes `done` within `limit` (waiting on its changes).
    async fn within<T: Send + Sync + 'static>(
        limit: Duration,
        mut reader: Reader<T>,
        done: impl Fn(&T) -> bool,
    ) -> Option<Arc<T>> {
        let wait = async {
            loop {
                let now = reader.get();
                if done(&now) {
                    return now;
                }
                reader.changed().await;
            }
        };
        tokio::time::timeout(limit, wait).await.ok()
    }

    /// This node leads epoch 5 with parents gathered for `prefetched_epoch`; a peer reported
    /// another leader's schedule, then this node's. That schedule must end up among the parents.
    async fn parents_after_a_brief_report(prefetched_epoch: u64, failures: usize) {
        let other = Schedule::new(json!({"side": "other"}), 1000, OTHER_LEADER.into());
        let own = Schedule::new(json!({"side": "this"}), 2000, ME.into());
        let port = serve(other.clone(), failures).await;
        let writer = cluster(Some(own.clone()), port, ME);
        writer.prefetched.set(Prefetched {
            epoch: prefetched_epoch,
            schedules: vec![own.clone()],
            awaiting: None,
        });
        // What the transport saw: the peer's pong with the other side's schedule, then (before
        // the fetcher looked) its next pong with this leader's.
        let sightings = SharedSightings::default();
        sightings
            .lock()
            .unwrap()
            .saw(&PEER.into(), &other.stamp(), SystemClock.now_ms());
        for held in [&other, &own] {
            peer_reports(&writer, held);
        }
        let tmp = tempfile::tempdir().unwrap();
        let disk = Arc::new(StateDir::new(tmp.path()));
        let stop = CancellationToken::new();
        let (store, _, task) = spawn_fetcher(writer, disk, sightings, &stop);
        let has = |parents: &Prefetched| parents.schedules.iter().any(|s| s.hash == other.hash);
        // A new leader's gathering has it at once, for the first run.
        let merged = within(Duration::from_secs(10), store.prefetched.clone(), |now| {
            now.epoch == 5 && (has(now) || prefetched_epoch != 5)
        })
        .await
        .is_some_and(|now| has(&now));
        stop.cancel();
        task.await.unwrap();
        assert!(
            merged,
            "the other side's schedule is not among the parents: {:?}",
            store.prefetched.peek()
        );
    }

    /// Issue 10: a follower that cannot write the leader's schedule (disk full) puts it in force,
    /// reports the failure in the store's `persist_error` (status and metric), and writes it
    /// once the disk takes it, without a new fetch (it used to log once and never write it).
    #[tokio::test]
    async fn a_follower_writes_the_leaders_schedule_once_the_disk_takes_it() {
        const FULL: &str = "schedule.json: No space left on device";
        let theirs = Schedule::new(json!({"from": "leader"}), 1000, PEER.into());
        let port = serve(theirs.clone(), 0).await;
        let writer = cluster(None, port, PEER);
        peer_reports(&writer, &theirs);
        let disk = Arc::new(MemoryScheduleStore::default());
        *disk.fail.lock().unwrap() = Some(disk_full());
        let stop = CancellationToken::new();
        let (store, persister, task) =
            spawn_fetcher(writer, disk.clone(), Default::default(), &stop);
        let retries = tokio::spawn(
            persister
                .driver(verwalter_controllers::machinery::driver::DriverConfig::default())
                .run(stop.clone()),
        );
        let taken = within(Duration::from_secs(10), store.schedule.clone(), |held| {
            held.as_ref().map(|s| &s.hash) == Some(&theirs.hash)
        })
        .await;
        assert!(taken.is_some(), "the leader's schedule was not taken");
        assert_eq!(store.persist_error.peek().as_deref(), Some(FULL));
        assert_eq!(
            disk.failed.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "tried once"
        );
        *disk.fail.lock().unwrap() = None;
        // The retry comes PERSIST_RETRY after the failure; generous for a loaded machine.
        let cleared = within(Duration::from_secs(30), store.persist_error.clone(), |e| {
            e.is_none()
        })
        .await;
        stop.cancel();
        task.await.unwrap();
        retries.await.unwrap();
        assert!(cleared.is_some(), "the persist error was never cleared");
        assert_eq!(disk.hashes(), vec![theirs.hash.clone()]);
    }

    /// Serves `schedule` only to requests that carry `Authorization: Bearer <token>`, else 401
    /// (a node with `http.token-for-reads`); the request heads it saw.
    async fn serve_with_token(
        schedule: Schedule,
        token: &'static str,
    ) -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = serde_json::to_vec(&schedule).unwrap();
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let head = read_head(&mut conn).await.unwrap_or_default();
                let head = head.to_ascii_lowercase();
                let allowed = head.contains(&format!(
                    "authorization: bearer {}\r\n",
                    token.to_ascii_lowercase()
                ));
                seen.lock().unwrap().push(head);
                let answer = if allowed {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                } else {
                    "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_string()
                };
                let _ = conn.write_all(answer.as_bytes()).await;
                if allowed {
                    let _ = conn.write_all(&body).await;
                }
            }
        });
        (port, heads)
    }

    #[tokio::test]
    async fn schedule_fetches_carry_the_token_only_when_given_one() {
        const TOKEN: &str = "Peer-read-t0ken-0123";
        let schedule = Schedule::test().with_role("web", "v1").build();
        let (port, heads) = serve_with_token(schedule.clone(), TOKEN).await;
        let addr = format!("127.0.0.1:{port}");
        let client = peers::client();
        let err = get_schedule(
            &client,
            None,
            &addr,
            &schedule.hash,
            None,
            &Reading::plain(""),
        )
        .await
        .unwrap_err();
        assert!(err.contains("401"), "{err}");
        assert!(
            heads
                .lock()
                .unwrap()
                .iter()
                .all(|h| !h.contains("authorization")),
            "no token given, none sent"
        );
        let token =
            verwalter_controllers::http::access::Token::from_file_bytes(TOKEN.as_bytes()).unwrap();
        let got = get_schedule(
            &client,
            Some(&token),
            &addr,
            &schedule.hash,
            None,
            &Reading::plain(""),
        )
        .await
        .unwrap();
        assert_eq!(got.hash, schedule.hash);
    }

    fn gzip(bytes: &[u8]) -> hyper::body::Bytes {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap().into()
    }

    /// A follower offers the leader's schedule to its relay children as soon as it arrives,
    /// before checking it, and withdraws it when the check fails.
    #[tokio::test]
    async fn a_schedule_is_passed_on_as_it_arrives_and_withdrawn_when_bad() {
        let relay = crate::http::RelayBody::default();
        let schedule = Schedule::test().with_role("web", "v1").build();
        let json = serde_json::to_vec(&schedule).unwrap();
        let by_hash = format!("http://127.0.0.2:1/v1/schedule/{}", schedule.hash);
        let arrived = Fetched {
            body: gzip(&json),
            coding: Coding::Gzip,
        };
        let mut changes = relay.subscribe();
        let reading = Reading::plain("");
        let taking = pass_on(&by_hash, &schedule.hash, arrived, Some(&relay), &reading);
        let passed = tokio::join!(taking, async {
            changes.changed().await.unwrap();
            relay.get(&schedule.hash)
        });
        assert_eq!(passed.0.unwrap().hash, schedule.hash);
        assert_eq!(
            passed.1,
            Some((Coding::Gzip, gzip(&json))),
            "offered before the check ended"
        );
        assert_eq!(
            relay.get(&schedule.hash),
            Some((Coding::Gzip, gzip(&json))),
            "and kept"
        );
        assert_eq!(relay.get("0000"), None);

        // Data that does not hash to the hash: refused, and no longer passed on.
        let mut forged: serde_json::Value = serde_json::to_value(&schedule).unwrap();
        forged["data"]["roles"]["web"]["version"] = "v666".into();
        let forged = serde_json::to_vec(&forged).unwrap();
        let arrived = Fetched {
            body: gzip(&forged),
            coding: Coding::Gzip,
        };
        let err = pass_on(
            &by_hash,
            &schedule.hash,
            arrived,
            Some(&relay),
            &Reading::plain(""),
        )
        .await
        .unwrap_err();
        assert!(err.contains("hash mismatch"), "{err}");
        assert_eq!(relay.get(&schedule.hash), None);

        // A 0.13 peer's plain `/v1/schedule` might hold another schedule: not passed on.
        let arrived = Fetched {
            body: gzip(&json),
            coding: Coding::Gzip,
        };
        pass_on(
            "http://127.0.0.2:1/v1/schedule",
            &schedule.hash,
            arrived,
            Some(&relay),
            &Reading::plain(""),
        )
        .await
        .unwrap();
        assert_eq!(relay.get(&schedule.hash), None);
    }

    /// Serves `body` gzipped as every answer, except 404 to `/v1/schedule/<hash>` when
    /// `by_hash` is false (a verwalter 0.13 peer); the request paths it saw.
    async fn serve_gzipped(
        body: Vec<u8>,
        by_hash: bool,
    ) -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = gzip(&body);
        let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = paths.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let head = read_head(&mut conn).await.unwrap_or_default();
                let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                seen.lock().unwrap().push(path.clone());
                if !by_hash && path != "/v1/schedule" {
                    let answer = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
                    let _ = conn.write_all(answer.as_bytes()).await;
                    continue;
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.write_all(&body).await;
            }
        });
        (port, paths)
    }

    /// A follower that fetched the leader's schedule by its hash passes the body on to its relay
    /// children; one that got it from a 0.13 peer's plain `/v1/schedule` does not.
    #[tokio::test]
    async fn a_schedule_fetched_by_its_hash_is_passed_on_and_a_plain_one_is_not() {
        let schedule = Schedule::test().with_role("web", "v1").build();
        let json = serde_json::to_vec(&schedule).unwrap();
        let client = peers::client();
        let reading = Reading::plain("");

        let relay = crate::http::RelayBody::default();
        let (port, paths) = serve_gzipped(json.clone(), true).await;
        let addr = format!("127.0.0.1:{port}");
        let got = get_schedule(&client, None, &addr, &schedule.hash, Some(&relay), &reading)
            .await
            .unwrap();
        assert_eq!(got.hash, schedule.hash);
        assert_eq!(
            *paths.lock().unwrap(),
            [format!("/v1/schedule/{}", schedule.hash)]
        );
        assert_eq!(
            relay.get(&schedule.hash),
            Some((Coding::Gzip, gzip(&json))),
            "the body as it came, for the relay children"
        );

        let relay = crate::http::RelayBody::default();
        let (port, paths) = serve_gzipped(json.clone(), false).await;
        let addr = format!("127.0.0.1:{port}");
        let got = get_schedule(&client, None, &addr, &schedule.hash, Some(&relay), &reading)
            .await
            .unwrap();
        assert_eq!(got.hash, schedule.hash);
        assert_eq!(
            *paths.lock().unwrap(),
            [
                format!("/v1/schedule/{}", schedule.hash),
                "/v1/schedule".into()
            ]
        );
        assert_eq!(relay.get(&schedule.hash), None);
    }

    /// An LZ4 body whose hash the leader announced is taken without hashing its data; any other
    /// body (another hash, another coding) is checked against the schedule hash.
    #[tokio::test]
    async fn an_lz4_body_the_leader_announced_is_taken_on_its_hash() {
        use super::{Coding, Fetched};
        use crate::cluster::vouch::body_sha1;
        let schedule = Schedule::test().with_role("web", "v1").build();
        let json = serde_json::to_vec(&schedule).unwrap();
        // Forged in the form this version writes, so that it would be read the fast way.
        let forged = String::from_utf8(json.clone()).unwrap();
        let forged = forged.replace("\"v1\"", "\"v666\"").into_bytes();
        assert_ne!(forged, json);
        let (lz4, forged_lz4) = (Coding::Lz4.encode(&json), Coding::Lz4.encode(&forged));
        let reading = Reading::plain("");
        reading
            .announced
            .note(&schedule.hash, &schedule.origin, body_sha1(&lz4));
        let url = format!("http://127.0.0.2:1/v1/schedule/{}", schedule.hash);
        let fetch = |body: &[u8], coding| {
            let fetched = Fetched {
                body: body.to_vec().into(),
                coding,
            };
            pass_on(&url, &schedule.hash, fetched, None, &reading)
        };
        let checked = |vouched| reading.metrics.schedules_checked(vouched);

        assert_eq!(fetch(&lz4, Coding::Lz4).await.unwrap(), schedule);
        assert_eq!(
            (checked(true), checked(false)),
            (1, 0),
            "on the body's hash"
        );
        // The same bytes inflated and sent as plain JSON: the data's hash.
        assert_eq!(fetch(&json, Coding::Identity).await.unwrap(), schedule);
        assert_eq!(
            (checked(true), checked(false)),
            (1, 1),
            "on the data's hash"
        );
        // Bytes the leader did not announce are checked, and forged data refused.
        let err = fetch(&forged_lz4, Coding::Lz4).await.unwrap_err();
        assert!(err.contains("hash mismatch"), "{err}");
        assert_eq!((checked(true), checked(false)), (1, 1));
        // Another node (a relay, say) announcing the forged bytes under the leader's schedule
        // hash vouches only for its own schedules: the forged data is still refused.
        let relay = "77985419c732412ea38b94db00000099";
        assert_ne!(relay, schedule.origin);
        reading
            .announced
            .note(&schedule.hash, relay, body_sha1(&forged_lz4));
        let err = fetch(&forged_lz4, Coding::Lz4).await.unwrap_err();
        assert!(err.contains("hash mismatch"), "{err}");
        assert_eq!((checked(true), checked(false)), (1, 1));
    }
}

#[cfg(test)]
mod inline_tests {
    use verwalter_controllers::state::Schedule;

    use super::{Coding, InlineBodies, Reading};

    /// A schedule inline on etcd is taken once, for its own hash only, checked as a fetched
    /// body: data that does not hash to the schedule's hash, a body that does not inflate, or
    /// another schedule than the value names is refused and counted.
    #[tokio::test]
    async fn an_inline_body_is_taken_only_when_it_checks_out_as_its_schedule() {
        let schedule = Schedule::test().with_role("web", "v1").build();
        let json = serde_json::to_vec(&schedule).unwrap();
        let forged = String::from_utf8(json.clone()).unwrap();
        let forged = forged.replace("\"v1\"", "\"v666\"").into_bytes();
        let other = Schedule::test().with_role("web", "v2").build();
        let other_json = serde_json::to_vec(&other).unwrap();
        let registry = prometheus::Registry::new();
        let bodies = InlineBodies::register(&registry);
        let reading = Reading::plain("");
        let count = |result: &str| bodies.results.with_label_values(&[result]).get();
        let hash = schedule.hash.as_str();

        bodies.offer(hash, Coding::Lz4.encode(&json).into());
        assert_eq!(bodies.take("another"), None, "held for its own hash only");
        let body = bodies.take(hash).unwrap();
        assert_eq!(bodies.take(hash), None, "taken once");
        let got = bodies.read(hash, body, None, &reading).await;
        assert_eq!(got, Some(schedule.clone()));
        assert_eq!((count("taken"), count("refused")), (1, 0));

        for bad in [
            Coding::Lz4.encode(&forged),
            json.clone(),
            Coding::Lz4.encode(&other_json),
        ] {
            assert_eq!(bodies.read(hash, bad.into(), None, &reading).await, None);
        }
        assert_eq!((count("taken"), count("refused")), (1, 3));
    }
}
