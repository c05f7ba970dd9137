//! Replication decisions without IO: which schedule a follower fetches from its leader and when,
//! what a new leader gathers as the parents of its first scheduler run and when that gathering
//! ends, which other leaders' schedules a leader adds later (a healed partition), how many
//! replaced schedules a follower keeps, and the backoffs of all of it.
//!
//! The [`Replication`] machine is fed a snapshot of what the node sees ([`World`]: election
//! state, the peers' reported stamps, the schedule held, the schedules of other nodes that peers
//! reported, when each peer was last heard) and the results of the fetches it asked for, with
//! the time; it answers with [`Effect`]s. `src/cluster/replication.rs` runs the HTTP fetches and
//! writes the store; the rules are all here:
//!
//! - a follower of a stable leader fetches the leader's schedule whenever the stamp in the
//!   leader's packets differs from the schedule it holds; it takes only that very schedule
//!   (same hash) made by that leader, and backs off after failures (100 ms doubling to 5 s);
//! - a new leader waits until every peer it had an election packet from lately (two heartbeats)
//!   has answered in its epoch, or until the prefetch window ends, then fetches every distinct
//!   schedule its peers report, and those of other nodes that peers reported since shortly
//!   before it won; with the one it holds they become the parents of its first run (verwalter
//!   0.13 waited 15–75 s);
//! - once that is done, a schedule of another node that a peer reports later (the other side of
//!   a healed partition, whose leader followed this one without an election) is fetched and
//!   added to the parents, tried up to [`PARENT_TRIES`] times; meanwhile the parents say they
//!   await it ([`Prefetched::awaiting`]) and the scheduler does not run (for at most
//!   [`AWAIT_LIMIT`] in a row), so that the next schedule after a heal has the other side's
//!   among its parents (issue 28: a run in between
//!   made one with its own schedule as its only parent);
//! - schedules are fetched only from peers heard from lately (in the last two heartbeats): a
//!   schedule only silent peers report (the other side of a partition that lasts) waits until
//!   a peer that has it is heard again, instead of using up its tries before the heal;
//! - a follower fetches its leader's schedule through a relay, another follower, when there
//!   are more than [`ReplicationConfig::relay_fanout`] followers: the followers sorted by id
//!   form a tree of that fan-out under the leader, so the leader serves `fanout` of them and
//!   each of those serves up to `fanout` more. The schedule is checked by hash and origin
//!   whoever served it. A relay that fails is passed over for [`RELAY_PAUSE`] and the follower
//!   goes to its leader at once (a relay cut off from the leader answers within 250 ms);
//! - a result for a fetch that no longer matters (the leader changed, leadership was lost or
//!   the epoch moved on) is ignored.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::election::ElectionState;
use crate::defaults::RELAY_FANOUT;
use crate::machinery::backoff::Backoff;
use crate::state::{NodeId, Prefetched, Reports, Schedule, ScheduleStamp};

#[cfg(test)]
mod tests;

/// Schedules of other leaders a follower keeps after replacing them, for a new leader that has
/// not gathered them yet (`/v1/schedule/<hash>`). A heal brings two sides together, rarely more.
pub(crate) const REPLACED_KEPT: usize = 4;
/// A schedule of another leader that could not be fetched for the parents is tried this often
/// in all, the waits between tries doubling from [`PARENT_RETRY`]: a heal often brings UDP back
/// a moment before TCP works, and one failure should not lose a side's decisions.
pub(crate) const PARENT_TRIES: u32 = 4;
pub(crate) const PARENT_RETRY: Duration = Duration::from_millis(500);
/// The waits between a late parent's tries: doubling from [`PARENT_RETRY`], at most 256 times
/// it (reached only if [`PARENT_TRIES`] allowed nine tries or more).
const PARENT_BACKOFF: Backoff = Backoff::doubling(PARENT_RETRY, PARENT_RETRY.saturating_mul(256));
/// The longest the scheduler waits for late parents in a row: a heal's other side answers
/// within a fetch or a few tries, and peers that report schedule after schedule that cannot be
/// fetched (broken or hostile) must not stop this leader's scheduling.
pub(crate) const AWAIT_LIMIT: Duration = Duration::from_secs(10);
/// Sightings kept at most: far more than the sides a heal brings together; only a flood of
/// schedules from misbehaving peers gets near it, and then the oldest go first.
pub(crate) const SIGHTINGS_KEPT: usize = 64;
/// A follower's first retry after a failed fetch of the leader's schedule: short, the leader
/// may have answered during a moment of overload.
pub(crate) const FOLLOW_RETRY_FIRST: Duration = Duration::from_millis(100);
/// The retries double up to this: a follower behind a broken link still catches up within
/// seconds of its repair, without hammering a leader that cannot serve.
pub(crate) const FOLLOW_RETRY_MAX: Duration = Duration::from_secs(5);
/// A follower's waits between failed fetches of the leader's schedule.
const FOLLOW_BACKOFF: Backoff = Backoff::doubling(FOLLOW_RETRY_FIRST, FOLLOW_RETRY_MAX);

/// A relay that failed is not asked again for this long.
pub(crate) const RELAY_PAUSE: Duration = Duration::from_secs(30);

/// Settings of the machine.
#[derive(Debug, Clone)]
pub struct ReplicationConfig {
    /// This node's machine id.
    pub id: NodeId,
    /// The longest a new leader gathers its peers' schedules before its first scheduler run.
    pub window: Duration,
    /// Peers heard from within this are live (two heartbeats, see [`ReplicationConfig::new`]):
    /// a new leader waits for them, and fetches go to them only. A dead peer would otherwise
    /// hold every failover for the whole window. Reports of other nodes' schedules count from
    /// this long before a leadership was won.
    pub recent: Duration,
    /// Followers a node serves in the relay tree (see the module docs); 0: every follower
    /// fetches from the leader, as in verwalter 0.13.
    pub relay_fanout: usize,
}

impl ReplicationConfig {
    /// The settings for a node with this election `heartbeat`: a live peer answers every ping,
    /// so two heartbeats without a packet allow one lost one.
    pub fn new(id: NodeId, window: Duration, heartbeat: Duration) -> ReplicationConfig {
        ReplicationConfig {
            id,
            window,
            recent: heartbeat * 2,
            relay_fanout: RELAY_FANOUT,
        }
    }
}

/// A schedule made by another node that a peer reported in an election packet.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sighting {
    /// The last peer that reported it.
    pub peer: NodeId,
    pub stamp: ScheduleStamp,
    /// Wall-clock ms of the last report.
    pub(crate) at_ms: u64,
}

/// Every schedule made by another node that a peer reported, by hash, with the last peer that
/// reported it and when. The reports keep only each peer's latest stamp, and after a heal a peer
/// reports the other side's schedule for about one heartbeat only (until it has fetched the
/// surviving leader's): a leader busy with a fetch or its gathering would miss it, and that
/// side's decisions with it. The election transport notes them as packets arrive.
#[derive(Debug, Clone, Default)]
pub struct Sightings {
    by_hash: BTreeMap<String, Sighting>,
}

impl Sightings {
    /// `peer` reported holding `stamp` at `at_ms`. Past [`SIGHTINGS_KEPT`] the least recently
    /// reported schedule is forgotten.
    pub fn saw(&mut self, peer: &NodeId, stamp: &ScheduleStamp, at_ms: u64) {
        self.by_hash.insert(
            stamp.hash.clone(),
            Sighting {
                peer: peer.clone(),
                stamp: stamp.clone(),
                at_ms,
            },
        );
        while self.by_hash.len() > SIGHTINGS_KEPT {
            let oldest = self
                .by_hash
                .iter()
                .min_by_key(|(_, s)| s.at_ms)
                .map(|(hash, _)| hash.clone());
            if let Some(hash) = oldest {
                self.by_hash.remove(&hash);
            }
        }
    }

    /// Sightings reported at `since_ms` or later, by hash.
    pub(crate) fn since(&self, since_ms: u64) -> impl Iterator<Item = &Sighting> {
        self.by_hash.values().filter(move |s| s.at_ms >= since_ms)
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// What the node sees now: the inputs of every decision.
#[derive(Debug, Clone, Copy)]
pub struct World<'a> {
    pub election: &'a ElectionState,
    /// What each peer last reported in election packets.
    pub reports: &'a Reports,
    /// The schedule in force here.
    pub held: Option<&'a Schedule>,
    pub sightings: &'a Sightings,
    /// Wall-clock ms of the last election packet from each peer.
    pub packets: &'a BTreeMap<NodeId, u64>,
    /// Wall-clock ms now.
    pub now_ms: u64,
    /// The ids of the nodes known (cantal's or the settings' peers, this node in or not).
    pub nodes: &'a [NodeId],
}

/// Why a schedule is fetched; a result whose purpose has passed is ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purpose {
    /// A follower takes its leader's schedule.
    Follow { leader: NodeId },
    /// A new leader gathers the parents of its first run at `epoch`.
    Gather { epoch: u64 },
    /// A leader adds a schedule of another node reported after its gathering (at `epoch`).
    LateParent { epoch: u64 },
}

/// One schedule to fetch: `GET /v1/schedule/<hash>` from `peer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub peer: NodeId,
    pub stamp: ScheduleStamp,
    pub purpose: Purpose,
}

impl Fetch {
    /// A follower's fetch of its leader's schedule from another follower (its relay).
    pub fn relayed(&self) -> bool {
        matches!(&self.purpose, Purpose::Follow { leader } if *leader != self.peer)
    }
}

/// The relay of follower `me` under `leader`: the followers (every node known but the leader,
/// with `me`) sorted by id are the nodes 1, 2, ... of a tree of fan-out `fanout` whose root
/// is the leader; node `p`'s parent is `(p - 1) / fanout`. `None`: `me` fetches from the
/// leader itself.
pub(crate) fn relay(
    me: &NodeId,
    leader: &NodeId,
    nodes: &[NodeId],
    fanout: usize,
) -> Option<NodeId> {
    if fanout == 0 || me == leader {
        return None;
    }
    let mut followers: Vec<&NodeId> = nodes.iter().filter(|n| *n != leader).collect();
    followers.push(me);
    followers.sort();
    followers.dedup();
    let position = followers.iter().position(|n| *n == me)? + 1;
    let parent = (position - 1) / fanout;
    (parent > 0).then(|| followers[parent - 1].clone())
}

/// What the machine asks the node to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Fetch this schedule and hand the result to [`Replication::fetched`].
    Fetch(Fetch),
    /// Save this schedule and put it in force (a follower, its leader's).
    Accept(Schedule),
    /// The schedules of other leaders this follower replaced, newest first (comes before the
    /// [`Effect::Accept`] that replaces one, so it is always served by one list or the other).
    Replaced(Vec<Schedule>),
    /// The new leader's gathering ended: these are the parents of its first run.
    Gathered { parents: Prefetched, took: Duration },
    /// A schedule of another node was added to the parents.
    AddedParent {
        parents: Prefetched,
        added: ScheduleStamp,
    },
    /// The parents now wait for a schedule of another node (`parents.awaiting`), or no longer
    /// do (it was given up).
    Awaiting { parents: Prefetched },
    /// A fetch failed or its schedule was refused. `retry_at`: when it is tried again; `None`
    /// when it is not (a gathering goes on without it; a late parent was given up).
    Failed {
        fetch: Fetch,
        error: String,
        retry_at: Option<Instant>,
    },
}

/// A leadership of this node, from its gathering on.
#[derive(Debug)]
struct Lead {
    epoch: u64,
    /// Sightings from this wall-clock ms on count for this leadership: from a little before it
    /// was won, so that what the voters reported is in.
    from_ms: u64,
    started: Instant,
    deadline: Instant,
    /// The peers heard lately when it was won; the gathering waits for their answers.
    live: Vec<NodeId>,
    gathering: Option<Gathering>,
}

/// The fetches of a gathering, once the wait for the peers ended.
#[derive(Debug)]
struct Gathering {
    queue: VecDeque<(NodeId, ScheduleStamp)>,
    found: BTreeMap<String, Schedule>,
}

/// The replication machine of one node.
#[derive(Debug)]
pub struct Replication {
    config: ReplicationConfig,
    /// The one fetch whose result counts (one at a time, as a single HTTP client would).
    in_flight: Option<Fetch>,
    /// Failed follower fetches in a row, and when to try again.
    failures: u32,
    retry_at: Option<Instant>,
    lead: Option<Lead>,
    /// The parents of the current or last leadership (`prefetched` in the store).
    parents: Prefetched,
    /// Late parents that could not be fetched, by hash: tries so far and when the next is due.
    skipped: BTreeMap<String, (u32, Instant)>,
    /// `replaced` in the store.
    replaced: Vec<Schedule>,
    /// When to look again for a late parent only silent peers report.
    poll_at: Option<Instant>,
    /// Since when the parents have awaited late parents without a break (see [`AWAIT_LIMIT`]).
    awaiting_since: Option<Instant>,
    /// A relay that failed, and until when it is passed over.
    relay_failed: Option<(NodeId, Instant)>,
}

impl Replication {
    pub fn new(config: ReplicationConfig) -> Replication {
        Replication {
            config,
            in_flight: None,
            failures: 0,
            retry_at: None,
            lead: None,
            parents: Prefetched::default(),
            skipped: BTreeMap::new(),
            replaced: Vec::new(),
            poll_at: None,
            awaiting_since: None,
            relay_failed: None,
        }
    }

    /// The fetch whose result is awaited, if any.
    pub fn in_flight(&self) -> Option<&Fetch> {
        self.in_flight.as_ref()
    }

    /// Looks at the world and decides. Call it whenever the world changed, at
    /// [`Replication::wake_at`], and after carrying out the actions of
    /// [`Replication::fetched`] (so that the world shows a schedule just accepted).
    pub fn step(&mut self, now: Instant, world: &World) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.in_flight.as_ref().is_some_and(|f| moot(f, world)) {
            self.in_flight = None;
        }
        let election = world.election;
        if election.is_leader {
            self.failures = 0;
            self.retry_at = None;
            self.lead(now, world, &mut out);
        } else {
            // A gathering stops with the leadership; the next one starts afresh.
            self.lead = None;
            if let Some(leader) = election.leader.as_ref().filter(|_| election.is_stable) {
                self.skipped.clear();
                self.follow(now, world, leader, &mut out);
            }
        }
        out
    }

    /// A fetch asked for by [`Effect::Fetch`] ended. A result for a fetch that no longer
    /// matters is ignored. Carry out the actions, then call [`Replication::step`].
    pub fn fetched(
        &mut self,
        now: Instant,
        world: &World,
        fetch: Fetch,
        result: Result<Schedule, String>,
    ) -> Vec<Effect> {
        if self.in_flight.as_ref() != Some(&fetch) || moot(&fetch, world) {
            return Vec::new();
        }
        self.in_flight = None;
        let result = result.and_then(|schedule| match refusal(&fetch, &schedule) {
            Some(why) => Err(why),
            None => Ok(schedule),
        });
        let mut out = Vec::new();
        match (&fetch.purpose, result) {
            (Purpose::Follow { .. }, Ok(schedule)) => {
                self.failures = 0;
                self.retry_at = None;
                // Another leader's schedule (a healed partition's other side) stays available
                // to the new leader, which may not have gathered it yet.
                if let Some(old) = world.held
                    && old.origin != schedule.origin
                {
                    self.replaced.retain(|s| s.hash != old.hash);
                    self.replaced.insert(0, old.clone());
                    self.replaced.truncate(REPLACED_KEPT);
                    out.push(Effect::Replaced(self.replaced.clone()));
                }
                out.push(Effect::Accept(schedule));
            }
            (Purpose::Follow { .. }, Err(error)) if fetch.relayed() => {
                // The leader is asked at once (the next step); this relay waits its turn.
                self.relay_failed = Some((fetch.peer.clone(), now + RELAY_PAUSE));
                out.push(Effect::Failed {
                    fetch,
                    error,
                    retry_at: Some(now),
                });
            }
            (Purpose::Follow { .. }, Err(error)) => {
                self.failures += 1;
                let at = now + FOLLOW_BACKOFF.nominal(self.failures);
                self.retry_at = Some(at);
                out.push(Effect::Failed {
                    fetch,
                    error,
                    retry_at: Some(at),
                });
            }
            (Purpose::Gather { .. }, Ok(schedule)) => {
                if let Some(gathering) = self.lead.as_mut().and_then(|l| l.gathering.as_mut()) {
                    gathering.found.insert(schedule.hash.clone(), schedule);
                }
            }
            (Purpose::Gather { .. }, Err(error)) => out.push(Effect::Failed {
                fetch,
                error,
                retry_at: None,
            }),
            (Purpose::LateParent { epoch }, Ok(schedule)) => {
                self.skipped.remove(&schedule.hash);
                if self.parents.epoch == *epoch {
                    let added = schedule.stamp();
                    self.parents.schedules.push(schedule);
                    // Another one to fetch keeps the scheduler waiting (its fetch is asked for
                    // at the next step): no run between the two.
                    let next = self.next_late_parent(now, world).map(|f| f.stamp);
                    self.parents.awaiting = self.awaited(now, next);
                    out.push(Effect::AddedParent {
                        parents: self.parents.clone(),
                        added,
                    });
                }
            }
            (Purpose::LateParent { .. }, Err(error)) => {
                let (tries, next) = self
                    .skipped
                    .entry(fetch.stamp.hash.clone())
                    .or_insert((0, now));
                *tries += 1;
                *next = now + PARENT_BACKOFF.nominal(*tries);
                let retry_at = (*tries < PARENT_TRIES).then_some(*next);
                out.push(Effect::Failed {
                    fetch,
                    error,
                    retry_at,
                });
                if retry_at.is_none() {
                    // Given up: the scheduler waits for the next one, if any, or no longer.
                    let next = self.next_late_parent(now, world).map(|f| f.stamp);
                    let next = self.awaited(now, next);
                    if self.parents.awaiting != next {
                        self.parents.awaiting = next;
                        out.push(Effect::Awaiting {
                            parents: self.parents.clone(),
                        });
                    }
                }
            }
        }
        out
    }

    /// When to call [`Replication::step`] again if nothing changes: a follower's retry, the end
    /// of a gathering's wait, a late parent's next try.
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        let waiting = self
            .lead
            .as_ref()
            .filter(|l| l.gathering.is_none())
            .map(|l| l.deadline);
        let parent = match &self.lead {
            Some(lead) if self.parents.epoch == lead.epoch => self
                .skipped
                .values()
                .filter(|(tries, _)| *tries < PARENT_TRIES)
                .map(|(_, next)| *next)
                .chain(self.poll_at)
                .chain(
                    self.awaiting_since
                        .filter(|_| self.parents.awaiting.is_some())
                        .map(|since| since + AWAIT_LIMIT),
                )
                .min(),
            _ => None,
        };
        [self.retry_at, waiting, parent]
            .into_iter()
            .flatten()
            .filter(|at| *at > now)
            .min()
    }

    fn follow(&mut self, now: Instant, world: &World, leader: &NodeId, out: &mut Vec<Effect>) {
        if self.in_flight.is_some() || self.retry_at.is_some_and(|at| now < at) {
            return;
        }
        let Some(stamp) = world.reports.get(leader).and_then(|r| r.schedule.clone()) else {
            return;
        };
        if world.held.is_some_and(|s| s.hash == stamp.hash) {
            return;
        }
        let relay = relay(
            &self.config.id,
            leader,
            world.nodes,
            self.config.relay_fanout,
        )
        .filter(|r| {
            !self
                .relay_failed
                .as_ref()
                .is_some_and(|(failed, until)| failed == r && now < *until)
        });
        self.ask(
            Fetch {
                peer: relay.unwrap_or_else(|| leader.clone()),
                stamp,
                purpose: Purpose::Follow {
                    leader: leader.clone(),
                },
            },
            out,
        );
    }

    fn lead(&mut self, now: Instant, world: &World, out: &mut Vec<Effect>) {
        let epoch = world.election.epoch;
        if self.parents.epoch == epoch {
            self.late_parent(now, world, out);
            return;
        }
        if self.lead.as_ref().is_none_or(|l| l.epoch != epoch) {
            self.in_flight = None;
            let from_ms = world
                .now_ms
                .saturating_sub(self.config.recent.as_millis() as u64);
            self.lead = Some(Lead {
                epoch,
                from_ms,
                started: now,
                deadline: now + self.config.window,
                live: world
                    .packets
                    .iter()
                    .filter(|(_, at)| **at >= from_ms)
                    .map(|(id, _)| id.clone())
                    .collect(),
                gathering: None,
            });
        }
        let lead = self.lead.as_mut().expect("set above");
        if lead.gathering.is_none() {
            let waiting = lead
                .live
                .iter()
                .filter(|id| world.reports.get(*id).is_none_or(|r| r.epoch < epoch))
                .count();
            if waiting > 0 && now < lead.deadline {
                return;
            }
            let live_since = live_since(world, self.config.recent);
            lead.gathering = Some(gathering(world, lead.from_ms, live_since, &self.config.id));
        }
        if self.in_flight.is_some() {
            return;
        }
        let gathering = lead.gathering.as_mut().expect("set above");
        if let Some((peer, stamp)) = gathering.queue.pop_front() {
            let fetch = Fetch {
                peer,
                stamp,
                purpose: Purpose::Gather { epoch },
            };
            self.ask(fetch, out);
            return;
        }
        let found = std::mem::take(&mut gathering.found);
        let took = now.saturating_duration_since(lead.started);
        self.parents = Prefetched {
            epoch,
            schedules: found.into_values().collect(),
            awaiting: None,
        };
        // Anything reported meanwhile is a late parent: the first run waits for it too.
        self.awaiting_since = None;
        let next = self.next_late_parent(now, world).map(|f| f.stamp);
        self.parents.awaiting = self.awaited(now, next);
        out.push(Effect::Gathered {
            parents: self.parents.clone(),
            took,
        });
        self.late_parent(now, world, out);
    }

    /// While leading with the parents gathered: a peer reporting a schedule made by another
    /// node that is neither this node's nor among the parents already (the other side of a
    /// healed partition, whose leader followed this one without a new election) is fetched and
    /// added to the parents, so the next scheduler run merges it. Reports since the leadership
    /// began count even when the peer has moved on since.
    /// The scheduler waits while a late parent is being fetched or tried again from a peer heard
    /// lately (see [`Prefetched::awaiting`]); one only silent peers report (a partition that
    /// lasts) does not hold it up.
    fn late_parent(&mut self, now: Instant, world: &World, out: &mut Vec<Effect>) {
        let fetch = if self.in_flight.is_some() {
            None
        } else {
            self.next_late_parent(now, world)
        };
        let awaiting = match (&fetch, &self.in_flight) {
            (Some(fetch), _) => Some(fetch.stamp.clone()),
            (None, Some(f)) if matches!(f.purpose, Purpose::LateParent { .. }) => {
                Some(f.stamp.clone())
            }
            // A try again is due later: still waiting for it.
            (None, _) => self.retrying_late_parent(world),
        };
        let awaiting = self.awaited(now, awaiting);
        if self.parents.awaiting != awaiting {
            self.parents.awaiting = awaiting;
            out.push(Effect::Awaiting {
                parents: self.parents.clone(),
            });
        }
        if let Some(fetch) = fetch {
            self.ask(fetch, out);
        }
    }

    /// What the parents await: `pending`, unless they have awaited late parents for
    /// [`AWAIT_LIMIT`] without a break.
    fn awaited(&mut self, now: Instant, pending: Option<ScheduleStamp>) -> Option<ScheduleStamp> {
        let Some(stamp) = pending else {
            self.awaiting_since = None;
            return None;
        };
        let since = *self.awaiting_since.get_or_insert(now);
        (now < since + AWAIT_LIMIT).then_some(stamp)
    }

    /// A late parent whose fetch failed and is tried again later, from a peer heard lately.
    fn retrying_late_parent(&self, world: &World) -> Option<ScheduleStamp> {
        let from_ms = self.lead.as_ref().map(|l| l.from_ms)?;
        let live_since = live_since(world, self.config.recent);
        let own = world.held.map(|s| &s.hash);
        sources(world, from_ms, live_since, &self.config.id, false)
            .into_iter()
            .find(|(hash, source)| {
                source.live
                    && Some(hash) != own
                    && !self.parents.schedules.iter().any(|s| s.hash == *hash)
                    && self
                        .skipped
                        .get(hash)
                        .is_some_and(|(tries, _)| *tries < PARENT_TRIES)
            })
            .map(|(_, source)| source.stamp)
    }

    /// The next late parent to fetch, if any (the choice of [`Replication::late_parent`]).
    fn next_late_parent(&mut self, now: Instant, world: &World) -> Option<Fetch> {
        self.poll_at = None;
        let from_ms = self.lead.as_ref().map_or_else(
            || {
                world
                    .now_ms
                    .saturating_sub(self.config.recent.as_millis() as u64)
            },
            |l| l.from_ms,
        );
        let live_since = live_since(world, self.config.recent);
        let own = world.held.map(|s| &s.hash);
        for (hash, source) in sources(world, from_ms, live_since, &self.config.id, false) {
            let waiting = self
                .skipped
                .get(&hash)
                .is_some_and(|(tries, next)| *tries >= PARENT_TRIES || now < *next);
            let known = Some(&hash) == own || self.parents.schedules.iter().any(|s| s.hash == hash);
            if known || waiting {
                continue;
            }
            if !source.live {
                // Only peers not heard from lately report it (the other side of a partition
                // that lasts): a fetch would fail and use up a try. Look again soon: a report
                // from a peer heard again does not always change the reports.
                self.poll_at = Some(now + self.config.recent);
                continue;
            }
            return Some(Fetch {
                peer: source.peer,
                stamp: source.stamp,
                purpose: Purpose::LateParent {
                    epoch: world.election.epoch,
                },
            });
        }
        None
    }

    fn ask(&mut self, fetch: Fetch, out: &mut Vec<Effect>) {
        self.in_flight = Some(fetch.clone());
        out.push(Effect::Fetch(fetch));
    }
}

/// Why a fetched schedule is refused for `fetch`, if it is: it must be the schedule asked for
/// (the peer may have moved on meanwhile), and a leader's must be made by that leader.
pub fn refusal(fetch: &Fetch, schedule: &Schedule) -> Option<String> {
    if schedule.hash != fetch.stamp.hash {
        return Some(format!(
            "got schedule {}, wanted {} (it changed meanwhile)",
            schedule.hash, fetch.stamp.hash
        ));
    }
    match &fetch.purpose {
        Purpose::Follow { leader } if schedule.origin != *leader => Some(format!(
            "the leader sent a schedule made by {}, not by itself",
            schedule.origin
        )),
        _ => None,
    }
}

/// A fetch no longer matters: the leader it followed is not this node's leader any more, or
/// the leadership it gathered for ended.
fn moot(fetch: &Fetch, world: &World) -> bool {
    let election = world.election;
    match &fetch.purpose {
        Purpose::Follow { leader } => {
            election.is_leader || election.leader.as_ref() != Some(leader)
        }
        Purpose::Gather { epoch } | Purpose::LateParent { epoch } => {
            !election.is_leader || election.epoch != *epoch
        }
    }
}

/// Peers whose last election packet came at or after this (wall-clock ms) count as heard from
/// lately: a fetch from them is likely to work.
fn live_since(world: &World, recent: Duration) -> u64 {
    world.now_ms.saturating_sub(recent.as_millis() as u64)
}

/// A peer to fetch a schedule from.
#[derive(Debug)]
struct Source {
    peer: NodeId,
    stamp: ScheduleStamp,
    /// The peer was heard from lately.
    live: bool,
}

/// Schedules that peers report now (made by any node with `any_origin`, else by other nodes) and
/// schedules of other nodes that peers reported since `since_ms`, by hash, each with a peer to
/// fetch it from: one heard from since `live_since` if there is one, else a peer holding it now
/// (the likelier one to serve it), else the last one that reported it.
fn sources(
    world: &World,
    since_ms: u64,
    live_since: u64,
    me: &NodeId,
    any_origin: bool,
) -> BTreeMap<String, Source> {
    let mut found: BTreeMap<String, Source> = BTreeMap::new();
    let mut offer = |peer: &NodeId, stamp: &ScheduleStamp| {
        let live = world.packets.get(peer).is_some_and(|at| *at >= live_since);
        let better = found.get(&stamp.hash).is_none_or(|s| live && !s.live);
        if better {
            let source = Source {
                peer: peer.clone(),
                stamp: stamp.clone(),
                live,
            };
            found.insert(stamp.hash.clone(), source);
        }
    };
    for (peer, report) in world.reports {
        if let Some(stamp) = &report.schedule
            && (any_origin || stamp.origin != *me)
        {
            offer(peer, stamp);
        }
    }
    for sighting in world.sightings.since(since_ms) {
        if sighting.stamp.origin != *me {
            offer(&sighting.peer, &sighting.stamp);
        }
    }
    found
}

/// What a new leader fetches once its wait ended: every distinct schedule its peers report (any
/// origin) and every schedule of another node reported since `from_ms`, but the one it holds,
/// each from a peer heard from lately. (A schedule only silent peers report would cost the
/// first scheduler run a fetch timeout; another node's is fetched later, as a late parent, once
/// a peer heard from reports it.)
fn gathering(world: &World, from_ms: u64, live_since: u64, me: &NodeId) -> Gathering {
    let mut found = BTreeMap::new();
    if let Some(held) = world.held {
        found.insert(held.hash.clone(), held.clone());
    }
    let queue = sources(world, from_ms, live_since, me, true)
        .into_iter()
        .filter(|(hash, source)| source.live && !found.contains_key(hash))
        .map(|(_, source)| (source.peer, source.stamp))
        .collect();
    Gathering { queue, found }
}
