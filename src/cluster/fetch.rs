//! Schedule distribution over HTTP (`GET /v1/schedule`, as verwalter 0.13):
//!
//! - a follower fetches the leader's schedule whenever the stamp in the leader's ping differs
//!   from the schedule it holds; the envelope's hash is checked and its origin must be the
//!   leader; then it is persisted and put in force (and rendered);
//! - a new leader first gathers every distinct schedule its peers report (stamps arrive in their
//!   votes and pongs) for at most the prefetch window, and hands them all to its first scheduler
//!   run as `parents` (0.13 waited 15–75 s; a window ends early once every peer answered).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::state::{NodeId, Prefetched, Schedule, ScheduleStamp};
use verwalter_controllers::store::{Field, Store};

use super::client::HttpClient;
use crate::metrics::Metrics;
use crate::state_dir::StateDir;

/// Schedules larger than this are refused.
pub const MAX_SCHEDULE: usize = 64 << 20;
/// Schedules of other leaders kept after replacing them.
const REPLACED_KEPT: usize = 4;
/// One fetch may take this long.
const FETCH_TIMEOUT: Duration = Duration::from_secs(3);

pub struct Fetcher {
    pub store: Store,
    /// Shared with the schedule controller; written here only while following.
    pub schedule: Arc<Field<Option<Schedule>>>,
    pub prefetched: Field<Prefetched>,
    /// Schedules of other leaders replaced here (see `Store::replaced`).
    pub replaced: Field<Vec<Schedule>>,
    pub state_dir: StateDir,
    pub metrics: Arc<Metrics>,
    pub id: NodeId,
    /// The prefetch window of a new leader.
    pub window: Duration,
    /// A new leader waits for the peers it had election packets from within this (two
    /// heartbeats): the live ones. A dead peer would otherwise hold every failover for the
    /// whole window.
    pub recent: Duration,
    pub live: super::peers::Liveness,
    pub clock: Arc<dyn verwalter_controllers::ports::Clock>,
    pub client: HttpClient,
    /// Foreign schedules that could not be fetched (not tried again while leading).
    pub skipped: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Fetcher {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut election = self.store.election.clone();
        let mut reports = self.store.reports.clone();
        let mut peers = self.store.peers.clone();
        let mut failures = 0u32;
        let mut retry_at: Option<Instant> = None;
        loop {
            let state = election.get();
            reports.get();
            peers.get();
            if state.is_leader {
                failures = 0;
                retry_at = None;
                if self.prefetched.get().epoch != state.epoch {
                    self.prefetch(state.epoch, &shutdown).await;
                    continue;
                }
                if self.late_parents().await {
                    continue;
                }
            } else if let Some(leader) = state.leader.clone().filter(|_| state.is_stable) {
                self.skipped.lock().unwrap().clear();
                let due = retry_at.is_none_or(|at| Instant::now() >= at);
                if due && let Some(target) = self.wanted(&leader) {
                    match self.replicate(&leader, &target).await {
                        Ok(()) => {
                            failures = 0;
                            retry_at = None;
                        }
                        Err(e) => {
                            failures += 1;
                            // 100 ms, doubling, at most 5 s.
                            let delay =
                                Duration::from_millis(100 << failures.min(7).saturating_sub(1))
                                    .min(Duration::from_secs(5));
                            tracing::warn!(leader = %leader, error = %e, retry_in = ?delay, "Cannot fetch the leader's schedule.");
                            retry_at = Some(Instant::now() + delay);
                        }
                    }
                    continue;
                }
            }
            let sleep = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = election.changed() => {}
                _ = reports.changed() => {}
                _ = peers.changed() => {}
                _ = sleep => {}
            }
        }
    }

    /// The leader's stamp, when it differs from the schedule held here.
    fn wanted(&self, leader: &NodeId) -> Option<ScheduleStamp> {
        let stamp = self.store.reports.peek().get(leader)?.schedule.clone()?;
        let current = self.store.schedule.peek();
        match current.as_ref() {
            Some(s) if s.hash == stamp.hash => None,
            _ => Some(stamp),
        }
    }

    fn addr_of(&self, peer: &NodeId) -> Option<String> {
        self.store.peers.peek().peers.get(peer)?.addr.clone()
    }

    /// Fetches and verifies the schedule `stamp` from `peer`.
    async fn fetch(&self, peer: &NodeId, stamp: &ScheduleStamp) -> Result<Schedule, String> {
        let addr = self
            .addr_of(peer)
            .ok_or_else(|| format!("no address known for {peer}"))?;
        // `/v1/schedule/<hash>` also finds a schedule the peer replaced a moment ago; a peer
        // without that route (verwalter 0.13) gets the plain `/v1/schedule`.
        let by_hash = format!("http://{addr}/v1/schedule/{}", stamp.hash);
        let url = format!("http://{addr}/v1/schedule");
        let result = async {
            let body = match self.client.get(&by_hash, MAX_SCHEDULE, FETCH_TIMEOUT).await {
                Ok(body) => body,
                Err(_) => self.client.get(&url, MAX_SCHEDULE, FETCH_TIMEOUT).await?,
            };
            let schedule: Schedule =
                serde_json::from_slice(&body).map_err(|e| format!("{url}: not a schedule: {e}"))?;
            schedule.verify().map_err(|e| format!("{url}: {e}"))?;
            if schedule.hash != stamp.hash {
                return Err(format!(
                    "{url}: got schedule {}, wanted {} (it changed meanwhile)",
                    schedule.hash, stamp.hash
                ));
            }
            Ok(schedule)
        }
        .await;
        let label = if result.is_ok() { "ok" } else { "error" };
        self.metrics
            .schedule_fetches
            .with_label_values(&[label])
            .inc();
        result
    }

    async fn replicate(&self, leader: &NodeId, stamp: &ScheduleStamp) -> Result<(), String> {
        let schedule = self.fetch(leader, stamp).await?;
        if schedule.origin != *leader {
            return Err(format!(
                "the leader sent a schedule made by {}, not by itself",
                schedule.origin
            ));
        }
        // Leadership may have changed while fetching.
        let election = self.store.election.peek();
        if election.is_leader || election.leader.as_ref() != Some(leader) {
            return Ok(());
        }
        if let Err(e) = self.state_dir.save_schedule(&schedule) {
            tracing::error!(error = %e, "Cannot persist the fetched schedule; it is in force but will not survive a restart.");
        }
        tracing::info!(hash = %schedule.hash, %leader, "Took the leader's schedule.");
        // Another leader's schedule (a healed partition's other side) stays available to the new
        // leader, which may not have gathered it yet.
        if let Some(old) = self.store.schedule.peek().as_ref()
            && old.origin != schedule.origin
        {
            let old = old.clone();
            self.replaced.update(|list| {
                list.retain(|s| s.hash != old.hash);
                list.insert(0, old);
                list.truncate(REPLACED_KEPT);
            });
        }
        self.schedule.set(Some(schedule));
        Ok(())
    }

    /// While leading: a peer reporting a schedule made by another node that is neither this
    /// node's nor among the parents already (the other side of a healed partition, whose leader
    /// followed this one without a new election) is fetched and added to the parents, so the next
    /// scheduler run merges it. Returns whether it added one.
    async fn late_parents(&self) -> bool {
        let prefetched = self.prefetched.get();
        let own = self
            .store
            .schedule
            .peek()
            .as_ref()
            .as_ref()
            .map(|s| s.hash.clone());
        let foreign = self.store.reports.peek().iter().find_map(|(peer, report)| {
            let stamp = report.schedule.as_ref()?;
            let known = Some(&stamp.hash) == own.as_ref()
                || prefetched.schedules.iter().any(|s| s.hash == stamp.hash)
                || self.skipped.lock().unwrap().contains(&stamp.hash);
            (stamp.origin != self.id && !known).then(|| (peer.clone(), stamp.clone()))
        });
        let Some((peer, stamp)) = foreign else {
            return false;
        };
        match self.fetch(&peer, &stamp).await {
            Ok(schedule) => {
                tracing::info!(hash = %schedule.hash, origin = %schedule.origin, "A peer holds another leader's schedule; adding it to the parents.");
                let mut next = (*prefetched).clone();
                next.schedules.push(schedule);
                self.prefetched.set(next);
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "Cannot fetch a peer's schedule for the parents.");
                self.skipped.lock().unwrap().insert(stamp.hash);
            }
        }
        true
    }

    /// Gathers the schedules peers report for leadership `epoch` (see the module docs).
    async fn prefetch(&self, epoch: u64, shutdown: &CancellationToken) {
        let started = Instant::now();
        let deadline = started + self.window;
        let mut reports = self.store.reports.clone();
        let live = self.live.packets_since(
            self.clock
                .now_ms()
                .saturating_sub(self.recent.as_millis() as u64),
        );
        // Wait until every live peer has answered in this epoch, or the window ends.
        loop {
            let now_reports = reports.get();
            let waiting = live
                .iter()
                .filter(|id| now_reports.get(*id).is_none_or(|r| r.epoch < epoch))
                .count();
            if waiting == 0 || Instant::now() >= deadline {
                break;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = reports.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
        let own = self.store.schedule.peek().as_ref().clone();
        let mut found: BTreeMap<String, Schedule> = BTreeMap::new();
        if let Some(s) = own {
            found.insert(s.hash.clone(), s);
        }
        let mut wanted: BTreeMap<String, (NodeId, ScheduleStamp)> = BTreeMap::new();
        for (peer, report) in self.store.reports.peek().iter() {
            if let Some(stamp) = &report.schedule
                && !found.contains_key(&stamp.hash)
            {
                wanted
                    .entry(stamp.hash.clone())
                    .or_insert((peer.clone(), stamp.clone()));
            }
        }
        for (hash, (peer, stamp)) in wanted {
            match self.fetch(&peer, &stamp).await {
                Ok(schedule) => {
                    found.insert(hash, schedule);
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "A parent schedule could not be fetched; scheduling without it.")
                }
            }
        }
        let schedules: Vec<Schedule> = found.into_values().collect();
        tracing::info!(
            epoch,
            parents = schedules.len(),
            took = ?started.elapsed(),
            "Leading; gathered the peers' schedules."
        );
        self.prefetched.set(Prefetched { epoch, schedules });
    }
}
