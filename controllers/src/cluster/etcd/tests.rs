//! The machine against the in-memory etcd on a fake clock: scenarios with answers at once,
//! then a seeded randomized run with delays, lost answers, cut connections, pauses, crashes,
//! compactions and hostile writes.

use std::collections::{BTreeMap, VecDeque};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::model::{Etcd, MIN_TTL_MS};
use super::*;

/// The rule of a cluster moving between the backends, on this file's harness.
#[path = "move_tests.rs"]
mod move_tests;

const TTL: Millis = 2000;

fn config(node: &str) -> Config {
    Config {
        node: node.into(),
        ttl_ms: TTL,
        margin_ms: None,
        builtin_timeout_ms: None,
    }
}

/// A node whose requests etcd answers at once (none while `cut`).
struct Node {
    name: String,
    m: Machine,
    log: Vec<Effect>,
    /// The next revision the watch delivers.
    watch: Option<i64>,
    cut: bool,
}

impl Node {
    fn start(name: &str, etcd: &mut Etcd, now: Millis) -> Node {
        Node::start_with(config(name), etcd, now)
    }

    /// [`Node::start`] with a config of its own (named by `config.node`).
    pub(super) fn start_with(config: Config, etcd: &mut Etcd, now: Millis) -> Node {
        let name = config.node.clone();
        let (m, out) = Machine::new(config, now);
        let mut node = Node {
            name,
            m,
            log: Vec::new(),
            watch: None,
            cut: false,
        };
        node.run(etcd, now, out);
        node.pump(etcd, now);
        node
    }

    fn run(&mut self, etcd: &mut Etcd, now: Millis, effects: Vec<Effect>) {
        let mut queue: VecDeque<Effect> = effects.into();
        while let Some(effect) = queue.pop_front() {
            self.log.push(effect.clone());
            let input = if self.cut {
                failure(&effect)
            } else {
                answer(etcd, &self.name, &mut self.watch, now, now, &effect)
            };
            if let Some(input) = input {
                queue.extend(self.m.handle(now, input));
            }
        }
    }

    fn feed(&mut self, etcd: &mut Etcd, now: Millis, input: Input) {
        let out = self.m.handle(now, input);
        self.run(etcd, now, out);
    }

    /// Delivers every watch event due, one at a time.
    fn pump(&mut self, etcd: &mut Etcd, now: Millis) {
        while let (Some(from), false) = (self.watch, self.cut) {
            let input = match etcd.events_from(from) {
                Err(compact) => {
                    self.watch = None;
                    Input::WatchEnded {
                        compacted: Some(compact),
                    }
                }
                Ok(events) => match events.into_iter().next() {
                    None => return,
                    Some((revision, change)) => {
                        self.watch = Some(revision + 1);
                        Input::Watched { revision, change }
                    }
                },
            };
            self.feed(etcd, now, input);
        }
    }

    fn tick(&mut self, etcd: &mut Etcd, now: Millis) {
        self.feed(etcd, now, Input::Tick);
        self.pump(etcd, now);
    }

    fn fetched(&self) -> Vec<String> {
        self.log
            .iter()
            .filter_map(|e| match e {
                Effect::Fetch { hash, .. } => Some(hash.clone()),
                _ => None,
            })
            .collect()
    }

    fn has(&self, wanted: &Effect) -> bool {
        self.log.contains(wanted)
    }
}

fn goes_to_etcd(effect: &Effect) -> bool {
    matches!(
        effect,
        Effect::GrantLease { .. }
            | Effect::KeepAlive { .. }
            | Effect::RevokeLease { .. }
            | Effect::Campaign { .. }
            | Effect::Read
            | Effect::Publish { .. }
            | Effect::Resign { .. }
    )
}

/// The failure a request gets when its answer never comes.
fn failure(effect: &Effect) -> Option<Input> {
    match effect {
        Effect::GrantLease { .. } => Some(Input::LeaseGrantFailed),
        Effect::Campaign { .. } => Some(Input::CampaignFailed),
        Effect::Read => Some(Input::ReadFailed),
        Effect::Publish { .. } => Some(Input::PublishFailed),
        _ => None,
    }
}

/// What etcd does with a request arriving at `now` (sent at `sent_at`), and its answer.
fn answer(
    etcd: &mut Etcd,
    name: &str,
    watch: &mut Option<i64>,
    sent_at: Millis,
    now: Millis,
    effect: &Effect,
) -> Option<Input> {
    match effect {
        Effect::GrantLease { ttl_ms } => {
            let (lease, ttl_ms) = etcd.grant(now, *ttl_ms);
            Some(Input::LeaseGranted {
                lease,
                ttl_ms,
                sent_at,
            })
        }
        Effect::KeepAlive { lease } => Some(Input::KeptAlive {
            lease: *lease,
            ttl_ms: etcd.keep_alive(now, *lease),
            sent_at,
        }),
        Effect::RevokeLease { lease } => {
            etcd.revoke(now, *lease);
            None
        }
        Effect::Campaign { lease } => Some(
            etcd.campaign(now, name, *lease)
                .unwrap_or(Input::CampaignFailed),
        ),
        Effect::Read => Some(etcd.read(now)),
        Effect::Watch { from_rev } => {
            *watch = Some(*from_rev);
            None
        }
        Effect::Publish { value } => Some(etcd.publish(now, value.clone())),
        Effect::Resign { leader_rev } => {
            etcd.resign(now, *leader_rev);
            None
        }
        _ => None,
    }
}

fn made(hash: &str, origin: &str) -> Input {
    Input::ScheduleMade(Made {
        hash: hash.into(),
        origin: origin.into(),
        size: 10,
    })
}

/// Advances every node from `from` to `to` in 50 ms steps, checking the fencing invariant.
fn run_until(nodes: &mut [Node], etcd: &mut Etcd, from: Millis, to: Millis) {
    let mut now = from;
    while now < to {
        now += 50;
        etcd.expire(now);
        for node in nodes.iter_mut() {
            node.tick(etcd, now);
        }
        check_fenced(nodes.iter().map(|n| &n.m), etcd, now);
    }
}

/// No node acts as leader unless it holds `P/leader` on a live lease: so never two at once.
fn check_fenced<'a>(machines: impl Iterator<Item = &'a Machine>, etcd: &Etcd, now: Millis) {
    let mut acting = 0;
    for m in machines {
        if let Some(rev) = m.acting_leader(now) {
            acting += 1;
            let holder = etcd.holder().expect("acting with P/leader absent");
            assert_eq!(
                holder.create_rev, rev,
                "acting on another's leadership at {now}"
            );
            assert_eq!(
                Some(holder.lease),
                m.lease(),
                "acting on another lease at {now}"
            );
            assert!(etcd.lease_alive(holder.lease));
        }
    }
    assert!(acting <= 1, "{acting} nodes act as leader at {now}");
}

fn leader_of(nodes: &[Node], now: Millis) -> Option<usize> {
    nodes.iter().position(|n| n.m.acting_leader(now).is_some())
}

#[test]
fn a_lone_node_takes_a_lease_campaigns_and_leads_from_the_keys_create_revision() {
    let mut etcd = Etcd::new();
    let mut nodes = [Node::start("a", &mut etcd, 0)];
    let holder = etcd.holder().cloned().expect("a leads");
    assert_eq!(holder.node, "a");
    assert_eq!(nodes[0].m.acting_leader(0), Some(holder.create_rev));
    assert!(nodes[0].has(&Effect::BecameLeader {
        leader_rev: holder.create_rev
    }));
    // Keep-alives hold it for as long as etcd answers.
    run_until(&mut nodes, &mut etcd, 0, 10_000);
    assert_eq!(nodes[0].m.acting_leader(10_000), Some(holder.create_rev));
    // The fence deadline is the last keep-alive's send time + TTL - margin.
    let fence = nodes[0].m.fence().unwrap();
    assert!(fence > 10_000 && fence <= 10_000 + TTL - TTL / 5, "{fence}");
}

#[test]
fn a_second_node_follows_and_fetches_what_the_leader_publishes_once() {
    let mut etcd = Etcd::new();
    let mut nodes = [
        Node::start("a", &mut etcd, 0),
        Node::start("b", &mut etcd, 0),
    ];
    assert_eq!(nodes[1].m.leader().unwrap().node, "a");
    assert_eq!(nodes[1].m.acting_leader(0), None);
    nodes[0].feed(&mut etcd, 10, made("h1", "a"));
    run_until(&mut nodes, &mut etcd, 10, 500);
    assert_eq!(nodes[1].fetched(), ["h1"]);
    assert!(nodes[1].log.contains(&Effect::Fetch {
        hash: "h1".into(),
        origin: "a".into(),
        from: "a".into(),
        inline: None
    }));
    assert!(nodes[0].fetched().is_empty(), "the leader fetches nothing");
    // The published value carries the leadership that wrote it.
    let (value, holder) = etcd.published.last().unwrap();
    assert_eq!(value.leader_rev, holder.create_rev);
    assert_eq!(value.lease, holder.lease);
}

#[test]
fn a_leader_cut_off_from_etcd_steps_down_at_its_fence_before_its_lease_expires() {
    let mut etcd = Etcd::new();
    let mut nodes = [
        Node::start("a", &mut etcd, 0),
        Node::start("b", &mut etcd, 0),
    ];
    run_until(&mut nodes, &mut etcd, 0, 1000);
    let rev = nodes[0].m.acting_leader(1000).unwrap();
    let lease = nodes[0].m.lease().unwrap();
    nodes[0].cut = true;
    nodes[0].feed(&mut etcd, 1000, Input::Disconnected);
    let fence = nodes[0].m.fence().unwrap();
    // Acting until the fence, not a moment after; the lease is still alive in etcd then.
    let mut now = 1000;
    while now < fence {
        now += 10;
        etcd.expire(now);
        nodes[0].tick(&mut etcd, now);
        nodes[1].tick(&mut etcd, now);
        check_fenced(nodes.iter().map(|n| &n.m), &etcd, now);
    }
    assert_eq!(nodes[0].m.acting_leader(fence), None);
    assert!(nodes[0].has(&Effect::SteppedDown {
        leader_rev: rev,
        reason: StepDown::Fence
    }));
    assert!(
        etcd.lease_alive(lease),
        "stepped down before etcd expired the lease"
    );
    assert_eq!(
        leader_of(&nodes, now),
        None,
        "nobody else leads before it expires"
    );
    // Once etcd expires it, b takes over with a higher leadership revision.
    run_until(&mut nodes, &mut etcd, now, now + TTL);
    let b = nodes[1].m.acting_leader(now + TTL).expect("b leads");
    assert!(b > rev);
    assert_eq!(leader_of(&nodes, now + TTL), Some(1));
}

#[test]
fn a_lease_etcd_reports_gone_makes_the_leader_step_down_and_start_over() {
    let mut etcd = Etcd::new();
    let mut nodes = [Node::start("a", &mut etcd, 0)];
    let rev = nodes[0].m.acting_leader(0).unwrap();
    let lease = nodes[0].m.lease().unwrap();
    // An operator revokes the lease; the next keep-alive is answered with TTL 0.
    etcd.revoke(100, lease);
    nodes[0].feed(&mut etcd, 700, Input::Tick);
    assert!(nodes[0].has(&Effect::SteppedDown {
        leader_rev: rev,
        reason: StepDown::LeaseLost
    }));
    // A new lease, a new campaign, a new leadership.
    run_until(&mut nodes, &mut etcd, 700, 1000);
    let again = nodes[0].m.acting_leader(1000).expect("leads again");
    assert!(again > rev);
    assert_ne!(nodes[0].m.lease(), Some(lease));
}

#[test]
fn the_key_seen_deleted_ends_leadership_even_before_a_keep_alive_says_so() {
    let mut etcd = Etcd::new();
    let mut nodes = [Node::start("a", &mut etcd, 0)];
    let rev = nodes[0].m.acting_leader(0).unwrap();
    let now = 100;
    nodes[0].feed(
        &mut etcd,
        now,
        Input::Watched {
            revision: rev + 5,
            change: Change::LeaderDeleted,
        },
    );
    assert_eq!(nodes[0].m.acting_leader(now), None);
    assert!(nodes[0].has(&Effect::SteppedDown {
        leader_rev: rev,
        reason: StepDown::KeyLost
    }));
}

#[test]
fn keep_alive_answers_after_the_fence_do_not_revive_the_lease() {
    let mut etcd = Etcd::new();
    let mut nodes = [Node::start("a", &mut etcd, 0)];
    let lease = nodes[0].m.lease().unwrap();
    let fence = nodes[0].m.fence().unwrap();
    nodes[0].cut = true;
    nodes[0].feed(&mut etcd, fence, Input::Tick);
    assert_eq!(nodes[0].m.lease(), None);
    // An answer to a keep-alive sent before arrives late: ignored.
    let late = nodes[0].m.handle(
        fence + 1,
        Input::KeptAlive {
            lease,
            ttl_ms: MIN_TTL_MS.max(TTL),
            sent_at: fence - 10,
        },
    );
    assert!(
        late.iter()
            .all(|e| !matches!(e, Effect::BecameLeader { .. }))
    );
    assert_eq!(nodes[0].m.acting_leader(fence + 1), None);
}

#[test]
fn a_watch_that_ends_resumes_after_the_last_revision_without_losing_or_repeating_events() {
    let mut etcd = Etcd::new();
    let mut nodes = [
        Node::start("a", &mut etcd, 0),
        Node::start("b", &mut etcd, 0),
    ];
    nodes[0].feed(&mut etcd, 10, made("h1", "a"));
    nodes[1].pump(&mut etcd, 10);
    let last = nodes[1].watch.unwrap() - 1;
    // b's watch breaks; a publishes twice meanwhile.
    nodes[1].watch = None;
    nodes[1].feed(&mut etcd, 20, Input::WatchEnded { compacted: None });
    assert!(nodes[1].has(&Effect::WatchRestarted { compacted: false }));
    assert!(nodes[1].has(&Effect::Watch { from_rev: last + 1 }));
    nodes[0].feed(&mut etcd, 30, made("h2", "a"));
    nodes[0].feed(&mut etcd, 40, made("h3", "a"));
    nodes[1].pump(&mut etcd, 50);
    assert_eq!(nodes[1].fetched(), ["h1", "h2", "h3"]);
    // An event delivered twice (at or below the last revision) is skipped.
    let before = nodes[1].log.len();
    let out = nodes[1].m.handle(
        60,
        Input::Watched {
            revision: last,
            change: Change::LeaderDeleted,
        },
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(nodes[1].m.leader().unwrap().node, "a");
    assert_eq!(nodes[1].log.len(), before);
}

#[test]
fn a_compacted_watch_reads_both_keys_again_and_takes_the_newest_schedule() {
    let mut etcd = Etcd::new();
    let mut nodes = [
        Node::start("a", &mut etcd, 0),
        Node::start("b", &mut etcd, 0),
    ];
    // b is cut off while a publishes twice; etcd compacts past b's watch.
    nodes[1].cut = true;
    nodes[0].feed(&mut etcd, 10, made("h1", "a"));
    nodes[0].feed(&mut etcd, 20, made("h2", "a"));
    etcd.compact(etcd.rev);
    nodes[1].cut = false;
    nodes[1].pump(&mut etcd, 30);
    assert!(nodes[1].has(&Effect::WatchRestarted { compacted: true }));
    let reads = nodes[1].log.iter().filter(|e| **e == Effect::Read).count();
    assert_eq!(reads, 2, "one at start, one after the compaction");
    assert!(nodes[1].has(&Effect::Watch {
        from_rev: etcd.rev + 1
    }));
    assert_eq!(nodes[1].fetched(), ["h2"], "the newest only");
}

#[test]
fn a_read_answered_at_a_revision_below_one_seen_is_dropped_and_read_again() {
    let mut etcd = Etcd::new();
    let mut nodes = [
        Node::start("a", &mut etcd, 0),
        Node::start("b", &mut etcd, 0),
    ];
    nodes[0].feed(&mut etcd, 10, made("h1", "a"));
    let leader = nodes[1].m.leader().cloned();
    // A compaction makes b read again; the answer comes from an etcd gone back in time.
    nodes[1].watch = None;
    let out = nodes[1]
        .m
        .handle(20, Input::WatchEnded { compacted: Some(3) });
    assert!(out.contains(&Effect::Read), "{out:?}");
    let out = nodes[1].m.handle(
        30,
        Input::Read {
            revision: 1,
            leader: None,
            schedule: None,
        },
    );
    assert_eq!(
        out,
        [Effect::Ignored {
            reason: Refused::RevisionWentBack
        }]
    );
    assert_eq!(
        nodes[1].m.leader().cloned(),
        leader,
        "nothing taken from it"
    );
    // It reads again after the retry interval, and resumes.
    let retry = 30 + TTL / 3;
    assert!(nodes[1].m.next_wakeup() <= retry);
    let out = nodes[1].m.handle(retry - 1, Input::Tick);
    assert!(
        !out.contains(&Effect::Read),
        "not before the retry interval"
    );
    let logged = nodes[1].log.len();
    nodes[1].feed(&mut etcd, retry, Input::Tick);
    assert!(nodes[1].log[logged..].contains(&Effect::Read));
    assert!(nodes[1].has(&Effect::Watch {
        from_rev: etcd.rev + 1
    }));
    assert_eq!(nodes[1].m.leader().cloned(), leader);
}

/// The inline `data` of a value that is taken goes with its fetch; a refused value's never.
#[test]
fn the_inline_data_of_a_taken_value_goes_with_its_fetch() {
    let mut etcd = Etcd::new();
    let mut nodes = [
        Node::start("a", &mut etcd, 0),
        Node::start("b", &mut etcd, 0),
    ];
    let holder = etcd.holder().cloned().unwrap();
    let value = |hash: &str, lease: i64| Published {
        hash: hash.into(),
        origin: "a".into(),
        size: 1,
        leader_rev: holder.create_rev,
        lease,
    };
    let inline = |data: &str| Some(data.to_string());
    etcd.put_schedule_inline(value("x1", holder.lease + 1), inline("FORGED"));
    etcd.put_schedule_inline(value("h1", holder.lease), inline("DATA1"));
    etcd.put_schedule_inline(value("h2", holder.lease), None);
    nodes[1].pump(&mut etcd, 10);
    let fetches: Vec<(String, Option<String>)> = nodes[1]
        .log
        .iter()
        .filter_map(|e| match e {
            Effect::Fetch { hash, inline, .. } => Some((hash.clone(), inline.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        fetches,
        [("h1".into(), inline("DATA1")), ("h2".into(), None)]
    );
    assert!(nodes[1].has(&Effect::Ignored {
        reason: Refused::WrongLease
    }));
}

#[test]
fn a_schedule_key_written_by_a_non_leader_is_ignored_by_followers() {
    let mut etcd = Etcd::new();
    let mut nodes = [
        Node::start("a", &mut etcd, 0),
        Node::start("b", &mut etcd, 0),
    ];
    let holder = etcd.holder().cloned().unwrap();
    let forged = |hash: &str, leader_rev: i64, lease: i64| Published {
        hash: hash.into(),
        origin: "mallory".into(),
        size: 1,
        leader_rev,
        lease,
    };
    etcd.put_schedule(forged("x1", holder.create_rev, holder.lease + 1));
    etcd.put_schedule(forged("x2", holder.create_rev + 1, holder.lease));
    etcd.put_schedule(forged("x3", holder.create_rev - 1, holder.lease));
    nodes[1].pump(&mut etcd, 10);
    let ignored: Vec<Refused> = nodes[1]
        .log
        .iter()
        .filter_map(|e| match e {
            Effect::Ignored { reason } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        ignored,
        [
            Refused::WrongLease,
            Refused::WrongLeadership,
            Refused::WrongLeadership
        ]
    );
    assert!(nodes[1].fetched().is_empty());
    // The leader's own publish is taken.
    nodes[0].feed(&mut etcd, 20, made("h1", "a"));
    nodes[1].pump(&mut etcd, 20);
    assert_eq!(nodes[1].fetched(), ["h1"]);
}

#[test]
fn a_schedule_from_a_former_leadership_is_not_fetched_until_the_new_leader_publishes() {
    let mut etcd = Etcd::new();
    let mut nodes = [Node::start("a", &mut etcd, 0)];
    nodes[0].feed(&mut etcd, 10, made("old", "a"));
    let rev = nodes[0].m.acting_leader(10).unwrap();
    nodes[0].feed(&mut etcd, 20, Input::Tick);
    let out = nodes[0].m.shutdown(20);
    nodes[0].run(&mut etcd, 20, out);
    assert!(etcd.holder().is_none(), "resigned");
    // c starts, reads the old value, leads, and publishes its own; d then follows c.
    let mut c = Node::start("c", &mut etcd, 30);
    assert!(c.m.acting_leader(30).unwrap() > rev);
    let d = Node::start("d", &mut etcd, 40);
    assert!(d.has(&Effect::Ignored {
        reason: Refused::WrongLeadership
    }));
    assert!(d.fetched().is_empty());
    c.feed(&mut etcd, 50, made("new", "c"));
    let mut d = d;
    d.pump(&mut etcd, 50);
    assert_eq!(d.fetched(), ["new"]);
}

#[test]
fn a_refused_publish_makes_the_leader_step_down_and_read_again() {
    let mut etcd = Etcd::new();
    let mut nodes = [Node::start("a", &mut etcd, 0)];
    let rev = nodes[0].m.acting_leader(0).unwrap();
    let out = nodes[0].m.handle(10, made("h1", "a"));
    assert!(matches!(&out[..], [Effect::Publish { value }] if value.leader_rev == rev));
    let out = nodes[0].m.handle(20, Input::PublishAnswered { ok: false });
    assert!(out.contains(&Effect::SteppedDown {
        leader_rev: rev,
        reason: StepDown::PublishRefused
    }));
    assert!(out.contains(&Effect::Read));
    assert_eq!(nodes[0].m.acting_leader(20), None);
}

#[test]
fn only_the_newest_schedule_is_published_after_one_in_flight() {
    let mut etcd = Etcd::new();
    let mut nodes = [Node::start("a", &mut etcd, 0)];
    let first = nodes[0].m.handle(10, made("h1", "a"));
    assert_eq!(first.len(), 1);
    assert!(nodes[0].m.handle(11, made("h2", "a")).is_empty());
    assert!(nodes[0].m.handle(12, made("h3", "a")).is_empty());
    let next = nodes[0].m.handle(13, Input::PublishAnswered { ok: true });
    assert!(matches!(&next[..], [Effect::Publish { value }] if value.hash == "h3"));
}

#[test]
fn a_late_campaign_answer_older_than_the_delete_seen_is_not_taken() {
    let mut etcd = Etcd::new();
    let mut b = Node::start("b", &mut etcd, 0);
    let lease = b.m.lease().unwrap();
    let rev = b.m.acting_leader(0).unwrap();
    // b sees its key deleted (at rev + 1), then an answer from before arrives.
    b.feed(
        &mut etcd,
        10,
        Input::Watched {
            revision: rev + 1,
            change: Change::LeaderDeleted,
        },
    );
    assert_eq!(b.m.acting_leader(10), None);
    let out = b.m.handle(
        11,
        Input::Campaigned {
            holder: LeaderKey {
                node: "b".into(),
                lease,
                create_rev: rev,
            },
            revision: rev,
        },
    );
    assert!(
        out.iter()
            .all(|e| !matches!(e, Effect::BecameLeader { .. }))
    );
    assert_eq!(b.m.acting_leader(11), None);
}

/// One node of the randomized run.
struct Sim {
    m: Machine,
    incarnation: u32,
    alive: bool,
    connected: bool,
    watch: Option<i64>,
    cut_until: Millis,
    paused_until: Millis,
}

#[derive(Debug)]
enum Event {
    /// A request reaches etcd.
    Arrive {
        node: usize,
        sent_at: Millis,
        effect: Effect,
    },
    /// An answer or watch event reaches the node.
    Deliver {
        node: usize,
        incarnation: u32,
        input: Input,
    },
    Tick {
        node: usize,
        incarnation: u32,
    },
    Chaos,
}

struct World {
    rng: SmallRng,
    /// The nodes' fence margin (0: the tightest, safe only because the model's clock is
    /// shared).
    margin_ms: Option<Millis>,
    etcd: Etcd,
    nodes: Vec<Sim>,
    queue: BTreeMap<(Millis, u64), Event>,
    seq: u64,
    now: Millis,
    /// Leaderships seen (node, revision), the hashes published by leaders, those fetched.
    leaderships: Vec<(usize, i64)>,
    fetched: Vec<String>,
}

impl World {
    fn push(&mut self, at: Millis, event: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    fn delay(&mut self) -> Millis {
        if self.rng.random_bool(0.1) {
            self.rng.random_range(200..1500)
        } else {
            self.rng.random_range(1..60)
        }
    }

    fn cut(&self, node: usize) -> bool {
        self.now < self.nodes[node].cut_until
    }

    fn send(&mut self, node: usize, effects: Vec<Effect>) {
        let incarnation = self.nodes[node].incarnation;
        for effect in effects {
            match &effect {
                Effect::Watch { from_rev } => self.nodes[node].watch = Some(*from_rev),
                Effect::BecameLeader { leader_rev } => {
                    self.leaderships.push((node, *leader_rev));
                }
                Effect::Fetch { hash, .. } => self.fetched.push(hash.clone()),
                Effect::Publish { value } => {
                    assert_eq!(
                        self.nodes[node].m.acting_leader(self.now),
                        Some(value.leader_rev)
                    );
                }
                _ => {}
            }
            if !goes_to_etcd(&effect) {
                continue;
            }
            if self.cut(node) || self.rng.random_bool(0.02) {
                if let Some(input) = failure(&effect) {
                    let at = self.now + 300;
                    self.push(
                        at,
                        Event::Deliver {
                            node,
                            incarnation,
                            input,
                        },
                    );
                }
                continue;
            }
            let (at, sent_at) = (self.now + self.delay(), self.now);
            self.push(
                at,
                Event::Arrive {
                    node,
                    sent_at,
                    effect,
                },
            );
        }
    }

    fn arrive(&mut self, node: usize, incarnation: u32, sent_at: Millis, effect: &Effect) {
        let name = format!("n{node}");
        let mut watch = None;
        let answer = answer(&mut self.etcd, &name, &mut watch, sent_at, self.now, effect);
        let Some(input) = answer else { return };
        if self.rng.random_bool(0.03) {
            // The answer is lost on the way back: the request times out.
            if let Some(input) = failure(effect) {
                let at = self.now + 300;
                self.push(
                    at,
                    Event::Deliver {
                        node,
                        incarnation,
                        input,
                    },
                );
            }
            return;
        }
        let at = self.now + self.delay();
        self.push(
            at,
            Event::Deliver {
                node,
                incarnation,
                input,
            },
        );
    }

    /// The node's watch hands over what is due (or ends now and then, or finds it compacted).
    fn pump(&mut self, node: usize) -> Option<Input> {
        let from = self.nodes[node].watch?;
        if self.rng.random_bool(0.02) {
            self.nodes[node].watch = None;
            return Some(Input::WatchEnded { compacted: None });
        }
        match self.etcd.events_from(from) {
            Err(compact) => {
                self.nodes[node].watch = None;
                Some(Input::WatchEnded {
                    compacted: Some(compact),
                })
            }
            Ok(events) => {
                let (revision, change) = events.into_iter().next()?;
                self.nodes[node].watch = Some(revision + 1);
                Some(Input::Watched { revision, change })
            }
        }
    }

    fn feed(&mut self, node: usize, input: Input) {
        let now = self.now;
        let out = self.nodes[node].m.handle(now, input);
        self.send(node, out);
    }

    fn tick(&mut self, node: usize) {
        if self.cut(node) {
            if self.nodes[node].connected {
                self.nodes[node].connected = false;
                self.nodes[node].watch = None;
                self.feed(node, Input::Disconnected);
            }
        } else {
            if !self.nodes[node].connected {
                self.nodes[node].connected = true;
                self.feed(node, Input::Connected);
            }
            for _ in 0..self.rng.random_range(0..4) {
                let Some(input) = self.pump(node) else { break };
                self.feed(node, input);
            }
        }
        self.feed(node, Input::Tick);
        let at = self.now + self.rng.random_range(10..80);
        let incarnation = self.nodes[node].incarnation;
        self.push(at, Event::Tick { node, incarnation });
    }

    fn start(&mut self, node: usize) {
        let config = Config {
            margin_ms: self.margin_ms,
            ..config(&format!("n{node}"))
        };
        let (m, out) = Machine::new(config, self.now);
        let sim = &mut self.nodes[node];
        sim.m = m;
        sim.incarnation += 1;
        sim.alive = true;
        sim.connected = true;
        sim.watch = None;
        sim.paused_until = 0;
        self.send(node, out);
        let (at, incarnation) = (self.now + 10, self.nodes[node].incarnation);
        self.push(at, Event::Tick { node, incarnation });
    }

    fn chaos(&mut self) {
        let node = self.rng.random_range(0..self.nodes.len());
        match self.rng.random_range(0..10) {
            0 | 1 => self.nodes[node].cut_until = self.now + self.rng.random_range(100..4000),
            2 => self.nodes[node].paused_until = self.now + self.rng.random_range(100..4000),
            3 if self.nodes[node].alive => {
                self.nodes[node].alive = false;
                self.nodes[node].incarnation += 1;
            }
            3 => self.start(node),
            4 => self
                .etcd
                .compact(self.etcd.rev - self.rng.random_range(0..3)),
            5 if self.nodes[node].alive => {
                let out = self.nodes[node].m.shutdown(self.now);
                self.send(node, out);
                self.nodes[node].alive = false;
                self.nodes[node].incarnation += 1;
            }
            6 => {
                let holder = self.etcd.holder().cloned();
                let (rev, lease) = holder.map_or((7, 7), |h| (h.create_rev, h.lease + 1));
                self.etcd.put_schedule(Published {
                    hash: format!("forged-{}", self.seq),
                    origin: "mallory".into(),
                    size: 1,
                    leader_rev: rev,
                    lease,
                });
            }
            _ if self.nodes[node].m.acting_leader(self.now).is_some() => {
                let hash = format!("h{}", self.seq);
                self.feed(node, made(&hash, &format!("n{node}")));
            }
            _ => {}
        }
        let at = self.now + self.rng.random_range(50..700);
        self.push(at, Event::Chaos);
    }

    fn current(&self, node: usize, incarnation: u32) -> bool {
        let sim = &self.nodes[node];
        sim.alive && sim.incarnation == incarnation
    }

    /// Runs until `end`; checks the fencing invariant at every event.
    fn run(&mut self, end: Millis) {
        while let Some(((at, seq), event)) = self.queue.pop_first() {
            if at > end {
                break;
            }
            self.now = at;
            self.etcd.expire(at);
            let node = match &event {
                Event::Arrive { node, .. }
                | Event::Deliver { node, .. }
                | Event::Tick { node, .. } => Some(*node),
                Event::Chaos => None,
            };
            if let Some(n) = node.filter(|n| self.nodes[*n].paused_until > at) {
                let until = self.nodes[n].paused_until;
                if !matches!(event, Event::Arrive { .. }) {
                    self.queue.insert((until, seq), event);
                    continue;
                }
            }
            match event {
                Event::Arrive {
                    node,
                    sent_at,
                    effect,
                } => {
                    // Requests on the wire reach etcd even from a process that died since.
                    let incarnation = self.nodes[node].incarnation;
                    self.arrive(node, incarnation, sent_at, &effect);
                }
                Event::Deliver {
                    node,
                    incarnation,
                    input,
                } if self.current(node, incarnation) => {
                    if self.cut(node) {
                        if let Some(failed) = failure_of(&input) {
                            self.feed(node, failed);
                        }
                    } else {
                        self.feed(node, input);
                    }
                }
                Event::Tick { node, incarnation } if self.current(node, incarnation) => {
                    self.tick(node)
                }
                Event::Chaos => self.chaos(),
                _ => {}
            }
            let alive = self.nodes.iter().filter(|s| s.alive).map(|s| &s.m);
            check_fenced(alive, &self.etcd, at);
        }
    }
}

/// The failure a request's answer turns into when it is lost on a cut connection.
fn failure_of(input: &Input) -> Option<Input> {
    match input {
        Input::LeaseGranted { .. } => Some(Input::LeaseGrantFailed),
        Input::Campaigned { .. } => Some(Input::CampaignFailed),
        Input::Read { .. } => Some(Input::ReadFailed),
        Input::PublishAnswered { .. } => Some(Input::PublishFailed),
        _ => None,
    }
}

fn world(seed: u64, nodes: usize, margin_ms: Option<Millis>) -> World {
    let mut world = World {
        rng: SmallRng::seed_from_u64(seed),
        margin_ms,
        etcd: Etcd::new(),
        nodes: Vec::new(),
        queue: BTreeMap::new(),
        seq: 0,
        now: 0,
        leaderships: Vec::new(),
        fetched: Vec::new(),
    };
    for node in 0..nodes {
        let (m, _) = Machine::new(config(&format!("n{node}")), 0);
        world.nodes.push(Sim {
            m,
            incarnation: 0,
            alive: false,
            connected: true,
            watch: None,
            cut_until: 0,
            paused_until: 0,
        });
        world.start(node);
    }
    world.push(100, Event::Chaos);
    world
}

#[test]
fn no_two_candidates_ever_act_as_leader_over_many_seeded_interleavings() {
    let mut leaderships = 0;
    let mut fetched = 0;
    for seed in 0..200 {
        // Odd seeds with no margin at all: fencing must hold on the send times alone.
        let margin = (seed % 2 == 1).then_some(0);
        let mut world = world(seed, 3, margin);
        world.run(40_000);
        // Not vacuous: leaders came and went, and followers fetched what leaders published.
        assert!(
            world.leaderships.len() >= 2,
            "seed {seed}: {:?}",
            world.leaderships
        );
        let revs: Vec<i64> = world.leaderships.iter().map(|(_, r)| *r).collect();
        assert!(
            revs.windows(2).all(|w| w[0] <= w[1]),
            "seed {seed}: {revs:?}"
        );
        for hash in &world.fetched {
            assert!(!hash.starts_with("forged"), "seed {seed}: fetched {hash}");
            let published = world.etcd.published.iter().any(|(v, _)| &v.hash == hash);
            assert!(
                published,
                "seed {seed}: {hash} was never published by a leader"
            );
        }
        for (value, holder) in &world.etcd.published {
            assert_eq!(
                (value.leader_rev, value.lease),
                (holder.create_rev, holder.lease)
            );
        }
        leaderships += world.leaderships.len();
        fetched += world.fetched.len();
    }
    eprintln!("leaderships {leaderships}, fetched {fetched}");
    assert!(
        leaderships > 200 && fetched > 100,
        "{leaderships} {fetched}"
    );
}

#[test]
fn the_view_shows_the_leader_the_time_left_and_the_counts() {
    let mut etcd = Etcd::new();
    let mut nodes = [
        Node::start("a", &mut etcd, 0),
        Node::start("b", &mut etcd, 0),
    ];
    let rev = etcd.holder().unwrap().create_rev;
    let view = nodes[0].m.view(100);
    assert!(view.leading);
    assert_eq!(
        (view.leader.as_deref(), view.leader_rev),
        (Some("a"), Some(rev))
    );
    assert_eq!(view.lease_left_ms, Some(TTL - TTL / 5 - 100));
    let json = serde_json::to_value(nodes[1].m.view(100)).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "backend": "etcd", "leading": false, "leader": "a", "leader_rev": rev,
            "lease": nodes[1].m.lease(), "lease_left_ms": null, "connected": true,
            "watch_restarts": 0, "ignored": 0, "step_downs": 0, "deferrals": 0
        })
    );
    // A forged value and a broken watch are counted.
    etcd.put_schedule(Published {
        hash: "x".into(),
        origin: "mallory".into(),
        size: 1,
        leader_rev: rev,
        lease: 1,
    });
    nodes[1].pump(&mut etcd, 200);
    nodes[1].watch = None;
    nodes[1].feed(&mut etcd, 210, Input::WatchEnded { compacted: None });
    let view = nodes[1].m.view(210);
    assert_eq!((view.counts.ignored, view.counts.watch_restarts), (1, 1));
    // The leader's step down is counted too.
    nodes[0].cut = true;
    let fence = nodes[0].m.fence().unwrap();
    nodes[0].feed(&mut etcd, fence, Input::Tick);
    let view = nodes[0].m.view(fence);
    assert_eq!(
        (view.leading, view.counts.step_downs, view.lease_left_ms),
        (false, 1, None)
    );
}
