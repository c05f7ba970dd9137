//! Leadership and publishing on etcd, sans IO (docs/etcd.md; run by the daemon's `src/cluster/etcd.rs`).
//!
//! One node's side: answers from etcd and the time in, effects out. The node holds a lease,
//! campaigns by a transaction that creates `P/leader` on that lease only when the key does not
//! exist, and leads from that key's create revision (the leadership revision). It acts as
//! leader only before its fence deadline: the send time of the last answered keep-alive plus
//! the TTL etcd answered, less a margin, so it stops before etcd can expire the lease and so
//! before anyone else can create the key. The leader publishes the schedule's identity in a
//! transaction guarded by its leadership revision; followers watch both keys, restart their
//! watch after the last revision seen, read again after a compaction, drop answers whose
//! revision went back, and take a published schedule only from the leadership that holds
//! `P/leader`.
//!
//! Times are milliseconds of a monotonic clock the adapter gives with every call.

pub mod builtin;
#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;
pub mod wire;

use serde::Serialize;

/// Milliseconds of a monotonic clock.
pub type Millis = u64;

/// The least margin taken off the lease's TTL for the fence deadline.
const MIN_MARGIN_MS: Millis = 100;

/// What a node is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This node's id (the value of `P/leader` names it).
    pub node: String,
    /// The lease TTL asked for; etcd may grant a longer one, which is then used.
    pub ttl_ms: Millis,
    /// Taken off the TTL for the fence deadline; `None`: a fifth of the TTL, at least 100 ms.
    pub margin_ms: Option<Millis>,
    /// The built-in election's leader timeout (`leader-timeout-min-ms`) when this node listens
    /// for its leaders' pings (docs/etcd.md, "Moving between backends"): a built-in leader
    /// heard within it takes precedence, and a node does not campaign before it has listened
    /// this long. `None`: it does not listen.
    pub builtin_timeout_ms: Option<Millis>,
}

impl Config {
    fn margin(&self, ttl_ms: Millis) -> Millis {
        self.margin_ms.unwrap_or((ttl_ms / 5).max(MIN_MARGIN_MS))
    }
}

/// `P/leader` as read: who holds it, on which lease, since which revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderKey {
    pub node: String,
    pub lease: i64,
    /// The leadership revision.
    pub create_rev: i64,
}

/// The schedule's identity as published in `P/schedule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub hash: String,
    pub origin: String,
    pub size: u64,
    /// The leadership revision of the leader that wrote it.
    pub leader_rev: i64,
    /// That leader's lease.
    pub lease: i64,
}

/// `P/schedule` as read or watched, with the revision that last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleKey {
    pub value: Published,
    pub mod_rev: i64,
    /// The schedule inline (`data`, as the value carries it: LZ4, base64), passed on untouched
    /// with the fetch of a value that is taken (docs/etcd.md, "Keys").
    pub data: Option<String>,
}

/// A schedule the leader made (or holds when it takes office), to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made {
    pub hash: String,
    pub origin: String,
    pub size: u64,
}

/// One watch event on the two keys, with the revision that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    LeaderPut(LeaderKey),
    LeaderDeleted,
    SchedulePut(ScheduleKey),
    ScheduleDeleted,
}

/// What happens: etcd's answers (paired with the request by the adapter), the watch, the
/// connection, the local scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Only time passed.
    Tick,
    LeaseGranted {
        lease: i64,
        ttl_ms: Millis,
        /// When the grant request was sent.
        sent_at: Millis,
    },
    LeaseGrantFailed,
    /// A keep-alive answer; `ttl_ms` 0: the lease is gone.
    KeptAlive {
        lease: i64,
        ttl_ms: Millis,
        sent_at: Millis,
    },
    /// The campaign transaction's answer: the key after it (this node's if it won), at the
    /// answer's header revision.
    Campaigned {
        holder: LeaderKey,
        revision: i64,
    },
    CampaignFailed,
    /// A linearizable read of both keys at `revision`.
    Read {
        revision: i64,
        leader: Option<LeaderKey>,
        schedule: Option<ScheduleKey>,
    },
    ReadFailed,
    Watched {
        revision: i64,
        change: Change,
    },
    /// The watch ended; `compacted`: its start revision was compacted (etcd's compact revision).
    WatchEnded {
        compacted: Option<i64>,
    },
    /// The publish transaction's answer: `ok` false when the guard failed.
    PublishAnswered {
        ok: bool,
    },
    PublishFailed,
    Disconnected,
    Connected,
    /// The local scheduler made a schedule.
    ScheduleMade(Made),
    /// A built-in election leader's ping (see [`builtin::heard`]): its node, epoch and the
    /// schedule it made (hash, origin), if any.
    BuiltinPing {
        from: String,
        epoch: u64,
        schedule: Option<(String, String)>,
    },
}

/// Why a leader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDown {
    /// Its fence deadline passed without a newer answered keep-alive.
    Fence,
    /// etcd answered that its lease is gone.
    LeaseLost,
    /// Its publish was refused: `P/leader` is not its any more.
    PublishRefused,
    /// `P/leader` is seen deleted or held by another.
    KeyLost,
    Shutdown,
    /// A built-in election leader is heard: it takes precedence.
    Deferred,
}

/// Why a `P/schedule` value was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Nobody holds `P/leader`.
    NoLeader,
    /// Its leadership revision is not the current leader's.
    WrongLeadership,
    /// Its lease is not the current leader's.
    WrongLease,
    /// Written before the current leadership began.
    BeforeLeadership,
    /// A read answered at a revision below one already seen.
    RevisionWentBack,
}

/// What the adapter does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    GrantLease {
        ttl_ms: Millis,
    },
    KeepAlive {
        lease: i64,
    },
    RevokeLease {
        lease: i64,
    },
    /// `txn(if create_revision(P/leader) == 0 then put(P/leader, node, lease) else get)`.
    Campaign {
        lease: i64,
    },
    /// Read both keys (linearizable).
    Read,
    /// Watch both keys from this revision.
    Watch {
        from_rev: i64,
    },
    /// `txn(if create_revision(P/leader) == leader_rev then put(P/schedule, value))`.
    Publish {
        value: Published,
    },
    /// `txn(if create_revision(P/leader) == leader_rev then delete(P/leader))`.
    Resign {
        leader_rev: i64,
    },
    BecameLeader {
        leader_rev: i64,
    },
    SteppedDown {
        leader_rev: i64,
        reason: StepDown,
    },
    /// Fetch this schedule (as replication does today) from the leader `from`, or take it from
    /// `inline` (the accepted value's `data`) when that checks out.
    Fetch {
        hash: String,
        origin: String,
        from: String,
        inline: Option<String>,
    },
    /// A value or answer not taken (logged and counted).
    Ignored {
        reason: Refused,
    },
    /// The watch restarted (`compacted`: after a read, its revision being compacted).
    WatchRestarted {
        compacted: bool,
    },
    /// From now on this node defers to the built-in leader `node` (logged and counted).
    Deferring {
        node: String,
        epoch: u64,
    },
    /// The built-in leader `node` was not heard for the leader timeout: etcd elects again.
    DeferralEnded {
        node: String,
    },
}

/// The built-in election leader a node defers to (docs/etcd.md, "Moving between backends").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    pub node: String,
    /// Its epoch, as its last ping said.
    pub epoch: u64,
    /// When this node began to defer to it.
    pub since: Millis,
    /// Its last ping.
    pub last: Millis,
}

/// The lease this node holds.
#[derive(Debug, Clone)]
struct Lease {
    id: i64,
    /// The TTL etcd granted.
    ttl_ms: Millis,
    /// Acting as leader ends here.
    fence: Millis,
    next_keep_alive: Millis,
}

/// A request kind: one in flight at most, and not re-sent before `not_before` after a failure.
#[derive(Debug, Clone, Copy, Default)]
struct Request {
    pending: bool,
    not_before: Millis,
}

impl Request {
    fn ready(&self, now: Millis) -> bool {
        !self.pending && now >= self.not_before
    }

    fn failed(&mut self, now: Millis, retry: Millis) {
        self.pending = false;
        self.not_before = now + retry;
    }
}

/// One node's etcd leadership machine.
#[derive(Debug)]
pub struct Machine {
    config: Config,
    /// The time of the last call.
    now: Millis,
    connected: bool,
    lease: Option<Lease>,
    grant: Request,
    campaign: Request,
    read: Request,
    publish: Request,
    /// The leadership revision while this node leads.
    leading: Option<i64>,
    /// `P/leader` as last known, and the revision that knowledge is from.
    leader: Option<LeaderKey>,
    leader_rev_seen: i64,
    /// `P/schedule` as last known.
    schedule: Option<ScheduleKey>,
    /// Whether both keys were read since the last compaction (campaigning waits for it).
    synced: bool,
    /// The highest revision any read answered at.
    max_read_rev: i64,
    /// The last revision the watch delivered (or the read it started after); `None`: no watch.
    watch_last: Option<i64>,
    /// The last schedule made here, published when this node leads.
    made: Option<Made>,
    /// Whether `made` still has to be published in this leadership.
    publish_due: bool,
    /// The hash of the last schedule this node was told to fetch.
    fetched: Option<String>,
    counts: Counts,
    /// The built-in leader this node defers to (until `last` + the built-in leader timeout).
    deferral: Option<Deferral>,
    /// No campaign before this: a node listens for a built-in leader first.
    listen_until: Millis,
}

/// What the machine counted since it started (for the status view and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub watch_restarts: u64,
    pub ignored: u64,
    pub step_downs: u64,
    /// Times this node began to defer to a built-in leader.
    pub deferrals: u64,
}

/// The backend's part of `/v1/status` and `/v1/election` (under `etcd`, by the daemon's adapter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct View {
    pub backend: &'static str,
    /// This node acts as leader now.
    pub leading: bool,
    /// `P/leader` as known: its node and leadership revision.
    pub leader: Option<String>,
    pub leader_rev: Option<i64>,
    pub lease: Option<i64>,
    /// Until the fence deadline, while this node leads.
    pub lease_left_ms: Option<Millis>,
    pub connected: bool,
    #[serde(flatten)]
    pub counts: Counts,
}

impl Machine {
    /// A machine that starts at `now`; its first effects: grant a lease, read both keys.
    pub fn new(config: Config, now: Millis) -> (Machine, Vec<Effect>) {
        let listen_until = now + config.builtin_timeout_ms.unwrap_or(0);
        let mut machine = Machine {
            config,
            now,
            connected: true,
            lease: None,
            grant: Request::default(),
            campaign: Request::default(),
            read: Request::default(),
            publish: Request::default(),
            leading: None,
            leader: None,
            leader_rev_seen: 0,
            schedule: None,
            synced: false,
            max_read_rev: 0,
            watch_last: None,
            made: None,
            publish_due: false,
            fetched: None,
            counts: Counts::default(),
            deferral: None,
            listen_until,
        };
        let mut out = Vec::new();
        machine.drive(now, &mut out);
        (machine, out)
    }

    /// The leadership revision while this node may act as leader at `now`, else `None`.
    pub fn acting_leader(&self, now: Millis) -> Option<i64> {
        let lease = self.lease.as_ref()?;
        self.leading.filter(|_| now < lease.fence)
    }

    /// The fence deadline while this node leads.
    pub fn fence(&self) -> Option<Millis> {
        self.leading.and(self.lease.as_ref().map(|l| l.fence))
    }

    /// `P/leader` as this node knows it.
    pub fn leader(&self) -> Option<&LeaderKey> {
        self.leader.as_ref()
    }

    /// The lease this node holds.
    pub fn lease(&self) -> Option<i64> {
        self.lease.as_ref().map(|l| l.id)
    }

    /// When to call [`Machine::handle`] with [`Input::Tick`] next, at the latest.
    pub fn next_wakeup(&self) -> Millis {
        let requests = [self.grant, self.campaign, self.read, self.publish];
        let retry = requests
            .into_iter()
            .filter(|r| !r.pending && r.not_before > self.now)
            .map(|r| r.not_before);
        let lease = self.lease.iter().flat_map(|l| [l.fence, l.next_keep_alive]);
        let listening = [self.listen_until]
            .into_iter()
            .chain(self.deferral_end())
            .filter(|at| *at > self.now);
        retry
            .chain(lease)
            .chain(listening)
            .min()
            .unwrap_or(Millis::MAX)
    }

    /// The built-in leader this node defers to at `now`, if any.
    pub fn deferring(&self, now: Millis) -> Option<&Deferral> {
        let end = self.deferral_end()?;
        self.deferral.as_ref().filter(|_| now < end)
    }

    /// When the deferral ends unless another ping comes.
    fn deferral_end(&self) -> Option<Millis> {
        let timeout = self.config.builtin_timeout_ms?;
        self.deferral.as_ref().map(|d| d.last + timeout)
    }

    fn retry_ms(&self) -> Millis {
        (self.config.ttl_ms / 3).max(1)
    }

    /// Takes one input at `now`.
    pub fn handle(&mut self, now: Millis, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        self.now = now;
        self.fence_check(now, &mut out);
        self.deferral_check(now, &mut out);
        match input {
            Input::Tick => {}
            Input::LeaseGranted {
                lease,
                ttl_ms,
                sent_at,
            } => self.granted(lease, ttl_ms, sent_at, &mut out),
            Input::LeaseGrantFailed => self.grant.failed(now, self.retry_ms()),
            Input::KeptAlive {
                lease,
                ttl_ms,
                sent_at,
            } => self.kept_alive(now, lease, ttl_ms, sent_at, &mut out),
            Input::Campaigned { holder, revision } => {
                self.campaign.pending = false;
                if !self.observe_leader(Some(holder), revision, &mut out) {
                    // Older than what is known: campaign again only after a while.
                    self.campaign.not_before = now + self.retry_ms();
                }
            }
            Input::CampaignFailed => self.campaign.failed(now, self.retry_ms()),
            Input::Read {
                revision,
                leader,
                schedule,
            } => self.read_answered(now, revision, leader, schedule, &mut out),
            Input::ReadFailed => self.read.failed(now, self.retry_ms()),
            Input::Watched { revision, change } => self.watched(revision, change, &mut out),
            Input::WatchEnded { compacted } => self.watch_ended(compacted, &mut out),
            Input::PublishAnswered { ok } => self.publish_answered(ok, &mut out),
            Input::PublishFailed => {
                self.publish.failed(now, self.retry_ms());
                self.publish_due = true;
            }
            Input::Disconnected => self.disconnected(),
            Input::Connected => self.reconnected(&mut out),
            Input::ScheduleMade(made) => {
                self.made = Some(made);
                self.publish_due = true;
            }
            Input::BuiltinPing {
                from,
                epoch,
                schedule,
            } => self.builtin_ping(now, from, epoch, schedule, &mut out),
        }
        self.fence_check(now, &mut out);
        self.drive(now, &mut out);
        self.count(&out);
        out
    }

    fn count(&mut self, out: &[Effect]) {
        for effect in out {
            match effect {
                Effect::WatchRestarted { .. } => self.counts.watch_restarts += 1,
                Effect::Ignored { .. } => self.counts.ignored += 1,
                Effect::SteppedDown { .. } => self.counts.step_downs += 1,
                Effect::Deferring { .. } => self.counts.deferrals += 1,
                _ => {}
            }
        }
    }

    /// The status view at `now`.
    pub fn view(&self, now: Millis) -> View {
        let leading = self.acting_leader(now);
        View {
            backend: "etcd",
            leading: leading.is_some(),
            leader: self.leader.as_ref().map(|l| l.node.clone()),
            leader_rev: self.leader.as_ref().map(|l| l.create_rev),
            lease: self.lease(),
            lease_left_ms: leading.and(self.fence()).map(|f| f.saturating_sub(now)),
            connected: self.connected,
            counts: self.counts,
        }
    }

    /// Stops: resigns and revokes the lease (best effort).
    pub fn shutdown(&mut self, _now: Millis) -> Vec<Effect> {
        let mut out = Vec::new();
        if let Some(rev) = self.leading.take() {
            out.push(Effect::SteppedDown {
                leader_rev: rev,
                reason: StepDown::Shutdown,
            });
            out.push(Effect::Resign { leader_rev: rev });
            self.counts.step_downs += 1;
        }
        if let Some(lease) = self.lease.take() {
            out.push(Effect::RevokeLease { lease: lease.id });
        }
        out
    }

    /// At the fence deadline the leader steps down, and the lease is given up: an answer
    /// arriving later cannot revive it.
    fn fence_check(&mut self, now: Millis, out: &mut Vec<Effect>) {
        let Some(lease) = &self.lease else { return };
        if now < lease.fence {
            return;
        }
        let id = lease.id;
        self.step_down(StepDown::Fence, out);
        self.lease = None;
        out.push(Effect::RevokeLease { lease: id });
    }

    /// A built-in leader not heard for its leader timeout no longer takes precedence: both
    /// keys are read again (the schedule on etcd is followed, or a node campaigns).
    fn deferral_check(&mut self, now: Millis, out: &mut Vec<Effect>) {
        let Some(end) = self.deferral_end() else {
            return;
        };
        if now < end {
            return;
        }
        if let Some(gone) = self.deferral.take() {
            out.push(Effect::DeferralEnded { node: gone.node });
        }
        self.synced = false;
        self.fetched = None;
    }

    /// A built-in leader's ping: that leader takes precedence (docs/etcd.md, "Moving between
    /// backends"). A leader here steps down and resigns at once; the ping's schedule is
    /// followed. Another built-in leader replaces the one followed only with a newer epoch
    /// (the older one's pings stop when it learns of it).
    fn builtin_ping(
        &mut self,
        now: Millis,
        from: String,
        epoch: u64,
        schedule: Option<(String, String)>,
        out: &mut Vec<Effect>,
    ) {
        if self.config.builtin_timeout_ms.is_none() {
            return;
        }
        match self.deferral.as_mut() {
            Some(d) if d.node == from && epoch >= d.epoch => {
                d.last = now;
                d.epoch = epoch;
            }
            Some(d) if epoch <= d.epoch => return,
            _ => {
                self.deferral = Some(Deferral {
                    node: from.clone(),
                    epoch,
                    since: now,
                    last: now,
                });
                self.fetched = None;
                out.push(Effect::Deferring {
                    node: from.clone(),
                    epoch,
                });
            }
        }
        if let Some(rev) = self.leading {
            self.step_down(StepDown::Deferred, out);
            out.push(Effect::Resign { leader_rev: rev });
        }
        if let Some((hash, origin)) = schedule.filter(|(_, origin)| *origin == from)
            && self.fetched.as_deref() != Some(hash.as_str())
        {
            self.fetched = Some(hash.clone());
            out.push(Effect::Fetch {
                hash,
                origin,
                from,
                inline: None,
            });
        }
    }

    fn step_down(&mut self, reason: StepDown, out: &mut Vec<Effect>) {
        if let Some(rev) = self.leading.take() {
            out.push(Effect::SteppedDown {
                leader_rev: rev,
                reason,
            });
        }
    }

    /// A lease granted while one is held (a late answer) is given back.
    fn granted(&mut self, lease: i64, ttl_ms: Millis, sent_at: Millis, out: &mut Vec<Effect>) {
        self.grant.pending = false;
        if self.lease.is_some() || ttl_ms == 0 {
            out.push(Effect::RevokeLease { lease });
            return;
        }
        let margin = self.config.margin(ttl_ms);
        self.lease = Some(Lease {
            id: lease,
            ttl_ms,
            fence: (sent_at + ttl_ms).saturating_sub(margin),
            next_keep_alive: sent_at + ttl_ms / 3,
        });
    }

    fn kept_alive(
        &mut self,
        now: Millis,
        lease: i64,
        ttl_ms: Millis,
        sent_at: Millis,
        out: &mut Vec<Effect>,
    ) {
        let margin = self.config.margin(ttl_ms);
        if self.lease.as_ref().is_none_or(|l| l.id != lease) {
            return;
        }
        if ttl_ms == 0 {
            self.step_down(StepDown::LeaseLost, out);
            self.lease = None;
            self.grant.not_before = now;
            return;
        }
        let Some(held) = self.lease.as_mut() else {
            return;
        };
        held.ttl_ms = ttl_ms;
        held.fence = held.fence.max((sent_at + ttl_ms).saturating_sub(margin));
    }

    /// Takes what is known of `P/leader` at `revision`, unless newer knowledge is held
    /// (then returns false).
    fn observe_leader(
        &mut self,
        key: Option<LeaderKey>,
        revision: i64,
        out: &mut Vec<Effect>,
    ) -> bool {
        if revision < self.leader_rev_seen {
            return false;
        }
        self.leader_rev_seen = revision;
        let mine = self.lease.as_ref().map(|l| l.id);
        match (&key, self.leading) {
            (Some(k), Some(rev)) if k.create_rev == rev && Some(k.lease) == mine => {}
            // This node's key while a built-in leader takes precedence (a campaign answered
            // after a ping, or a resign that did not land): given back, not led from.
            (Some(k), None) if Some(k.lease) == mine && self.deferral.is_some() => {
                out.push(Effect::Resign {
                    leader_rev: k.create_rev,
                });
            }
            (Some(k), None) if Some(k.lease) == mine => {
                self.leading = Some(k.create_rev);
                self.publish_due = self.made.is_some();
                out.push(Effect::BecameLeader {
                    leader_rev: k.create_rev,
                });
            }
            (_, Some(_)) => self.step_down(StepDown::KeyLost, out),
            (_, None) => {}
        }
        self.leader = key;
        true
    }

    fn read_answered(
        &mut self,
        now: Millis,
        revision: i64,
        leader: Option<LeaderKey>,
        schedule: Option<ScheduleKey>,
        out: &mut Vec<Effect>,
    ) {
        self.read.pending = false;
        if revision < self.max_read_rev {
            out.push(Effect::Ignored {
                reason: Refused::RevisionWentBack,
            });
            self.read.not_before = now + self.retry_ms();
            return;
        }
        self.max_read_rev = revision;
        self.synced = true;
        self.observe_leader(leader, revision, out);
        self.schedule = schedule;
        self.consider_schedule(out);
        self.watch_last = Some(revision);
        out.push(Effect::Watch {
            from_rev: revision + 1,
        });
    }

    fn watched(&mut self, revision: i64, change: Change, out: &mut Vec<Effect>) {
        let Some(last) = self.watch_last else { return };
        if revision <= last {
            return;
        }
        self.watch_last = Some(revision);
        match change {
            Change::LeaderPut(key) => {
                self.observe_leader(Some(key), revision, out);
            }
            Change::LeaderDeleted => {
                self.observe_leader(None, revision, out);
            }
            Change::SchedulePut(key) => {
                self.schedule = Some(key);
                self.consider_schedule(out);
            }
            Change::ScheduleDeleted => self.schedule = None,
        }
    }

    fn watch_ended(&mut self, compacted: Option<i64>, out: &mut Vec<Effect>) {
        let Some(last) = self.watch_last else { return };
        if compacted.is_some() {
            out.push(Effect::WatchRestarted { compacted: true });
            self.watch_last = None;
            self.synced = false;
        } else if self.connected {
            out.push(Effect::WatchRestarted { compacted: false });
            out.push(Effect::Watch { from_rev: last + 1 });
        }
    }

    fn publish_answered(&mut self, ok: bool, out: &mut Vec<Effect>) {
        self.publish.pending = false;
        if !ok {
            self.step_down(StepDown::PublishRefused, out);
            self.synced = false;
            self.watch_last = None;
        }
    }

    /// Pending requests are lost with the connection; the watch resumes when it is back.
    fn disconnected(&mut self) {
        self.connected = false;
        for request in [
            &mut self.grant,
            &mut self.campaign,
            &mut self.read,
            &mut self.publish,
        ] {
            request.pending = false;
        }
    }

    /// The watch resumes after the last revision it delivered.
    fn reconnected(&mut self, out: &mut Vec<Effect>) {
        self.connected = true;
        if let Some(last) = self.watch_last {
            out.push(Effect::WatchRestarted { compacted: false });
            out.push(Effect::Watch { from_rev: last + 1 });
        }
    }

    /// Whether the current `P/schedule` is taken: only from the leadership holding `P/leader`.
    fn consider_schedule(&mut self, out: &mut Vec<Effect>) {
        let Some(key) = &self.schedule else { return };
        let value = &key.value;
        let refused = match &self.leader {
            None => Some(Refused::NoLeader),
            Some(l) if value.leader_rev != l.create_rev => Some(Refused::WrongLeadership),
            Some(l) if value.lease != l.lease => Some(Refused::WrongLease),
            Some(l) if key.mod_rev <= l.create_rev => Some(Refused::BeforeLeadership),
            Some(_) => None,
        };
        if let Some(reason) = refused {
            out.push(Effect::Ignored { reason });
            return;
        }
        if self.deferral.is_some() {
            // The built-in leader's schedule is followed meanwhile.
            return;
        }
        let leader = self
            .leader
            .as_ref()
            .map(|l| l.node.clone())
            .unwrap_or_default();
        if leader == self.config.node || self.fetched.as_deref() == Some(value.hash.as_str()) {
            return;
        }
        self.fetched = Some(value.hash.clone());
        out.push(Effect::Fetch {
            hash: value.hash.clone(),
            origin: value.origin.clone(),
            from: leader,
            inline: key.data.clone(),
        });
    }

    /// Sends what is due: keep-alives, a lease, a read, the watch, a campaign, a publish.
    fn drive(&mut self, now: Millis, out: &mut Vec<Effect>) {
        if !self.connected {
            return;
        }
        if let Some(lease) = self.lease.as_mut() {
            if now >= lease.next_keep_alive {
                lease.next_keep_alive = now + lease.ttl_ms / 3;
                out.push(Effect::KeepAlive { lease: lease.id });
            }
        } else if self.grant.ready(now) {
            self.grant.pending = true;
            out.push(Effect::GrantLease {
                ttl_ms: self.config.ttl_ms,
            });
        }
        if !self.synced && self.read.ready(now) {
            self.read.pending = true;
            out.push(Effect::Read);
        }
        self.drive_campaign(now, out);
        self.drive_publish(now, out);
    }

    fn drive_campaign(&mut self, now: Millis, out: &mut Vec<Effect>) {
        let Some(lease) = &self.lease else { return };
        if now < self.listen_until || self.deferral.is_some() {
            return;
        }
        if self.synced && self.leader.is_none() && self.campaign.ready(now) {
            self.campaign.pending = true;
            out.push(Effect::Campaign { lease: lease.id });
        }
    }

    fn drive_publish(&mut self, now: Millis, out: &mut Vec<Effect>) {
        let (Some(rev), Some(made), Some(lease)) =
            (self.acting_leader(now), &self.made, self.lease())
        else {
            return;
        };
        if self.publish_due && self.publish.ready(now) {
            self.publish.pending = true;
            self.publish_due = false;
            out.push(Effect::Publish {
                value: Published {
                    hash: made.hash.clone(),
                    origin: made.origin.clone(),
                    size: made.size,
                    leader_rev: rev,
                    lease,
                },
            });
        }
    }
}
