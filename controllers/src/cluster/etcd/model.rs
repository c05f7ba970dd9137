//! An in-memory etcd holding the two keys, for the machine's tests: one revision counter
//! raised by every change, leases that expire on the model's clock (TTL after the last
//! keep-alive it received, never below etcd's minimum TTL), the campaign and publish
//! transactions with their create-revision compares, a watch history that compaction cuts.

use std::collections::BTreeMap;

use super::{Change, Input, LeaderKey, Millis, Published, ScheduleKey};

/// etcd's least lease TTL with its default heartbeat and election timeout.
pub(super) const MIN_TTL_MS: Millis = 1500;

#[derive(Debug, Default)]
pub(super) struct Etcd {
    pub(super) rev: i64,
    leader: Option<LeaderKey>,
    schedule: Option<ScheduleKey>,
    /// Lease id -> (TTL, expiry).
    leases: BTreeMap<i64, (Millis, Millis)>,
    next_lease: i64,
    history: Vec<(i64, Change)>,
    /// Revisions up to this one are compacted away.
    pub(super) compacted: i64,
    /// Every accepted publish: the value, and who held `P/leader` then.
    pub(super) published: Vec<(Published, LeaderKey)>,
}

impl Etcd {
    pub(super) fn new() -> Etcd {
        Etcd {
            rev: 1,
            next_lease: 0x100,
            ..Etcd::default()
        }
    }

    pub(super) fn holder(&self) -> Option<&LeaderKey> {
        self.leader.as_ref()
    }

    pub(super) fn lease_alive(&self, lease: i64) -> bool {
        self.leases.contains_key(&lease)
    }

    fn change(&mut self, change: Change) {
        self.rev += 1;
        self.history.push((self.rev, change));
    }

    pub(super) fn grant(&mut self, now: Millis, ttl_ms: Millis) -> (i64, Millis) {
        self.expire(now);
        let ttl = ttl_ms.max(MIN_TTL_MS);
        self.next_lease += 1;
        self.leases.insert(self.next_lease, (ttl, now + ttl));
        (self.next_lease, ttl)
    }

    /// The TTL, or 0 when the lease is gone.
    pub(super) fn keep_alive(&mut self, now: Millis, lease: i64) -> Millis {
        self.expire(now);
        match self.leases.get_mut(&lease) {
            Some((ttl, expiry)) => {
                *expiry = now + *ttl;
                *ttl
            }
            None => 0,
        }
    }

    pub(super) fn revoke(&mut self, now: Millis, lease: i64) {
        self.expire(now);
        if self.leases.remove(&lease).is_some() {
            self.drop_keys_of(lease);
        }
    }

    fn drop_keys_of(&mut self, lease: i64) {
        if self.leader.as_ref().is_some_and(|l| l.lease == lease) {
            self.leader = None;
            self.change(Change::LeaderDeleted);
        }
    }

    /// Expires the leases whose expiry is at or before `now`, with their keys.
    pub(super) fn expire(&mut self, now: Millis) {
        let gone: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, (_, expiry))| *expiry <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.leases.remove(&id);
            self.drop_keys_of(id);
        }
    }

    /// The campaign transaction; `None` (a failed request) when the lease does not exist.
    pub(super) fn campaign(&mut self, now: Millis, node: &str, lease: i64) -> Option<Input> {
        self.expire(now);
        if self.leader.is_none() {
            if !self.leases.contains_key(&lease) {
                return None;
            }
            let key = LeaderKey {
                node: node.into(),
                lease,
                create_rev: self.rev + 1,
            };
            self.leader = Some(key.clone());
            self.change(Change::LeaderPut(key));
        }
        Some(Input::Campaigned {
            holder: self.leader.clone()?,
            revision: self.rev,
        })
    }

    pub(super) fn read(&mut self, now: Millis) -> Input {
        self.expire(now);
        Input::Read {
            revision: self.rev,
            leader: self.leader.clone(),
            schedule: self.schedule.clone(),
        }
    }

    /// The publish transaction, guarded by `P/leader`'s create revision.
    pub(super) fn publish(&mut self, now: Millis, value: Published) -> Input {
        self.expire(now);
        let Some(holder) = self.leader.clone() else {
            return Input::PublishAnswered { ok: false };
        };
        if holder.create_rev != value.leader_rev {
            return Input::PublishAnswered { ok: false };
        }
        self.published.push((value.clone(), holder));
        self.put_schedule(value);
        Input::PublishAnswered { ok: true }
    }

    /// A plain put of `P/schedule`, guarded by nothing (what a non-leader could do).
    pub(super) fn put_schedule(&mut self, value: Published) {
        self.put_schedule_inline(value, None);
    }

    /// The same with the schedule inline (`data`).
    pub(super) fn put_schedule_inline(&mut self, value: Published, data: Option<String>) {
        let key = ScheduleKey {
            value,
            mod_rev: self.rev + 1,
            data,
        };
        self.schedule = Some(key.clone());
        self.change(Change::SchedulePut(key));
    }

    pub(super) fn resign(&mut self, now: Millis, leader_rev: i64) {
        self.expire(now);
        if self
            .leader
            .as_ref()
            .is_some_and(|l| l.create_rev == leader_rev)
        {
            self.leader = None;
            self.change(Change::LeaderDeleted);
        }
    }

    /// The events after `from_rev - 1`, or the compact revision when some are compacted away.
    pub(super) fn events_from(&self, from_rev: i64) -> Result<Vec<(i64, Change)>, i64> {
        if from_rev <= self.compacted {
            return Err(self.compacted);
        }
        Ok(self
            .history
            .iter()
            .filter(|(rev, _)| *rev >= from_rev)
            .cloned()
            .collect())
    }

    pub(super) fn compact(&mut self, rev: i64) {
        self.compacted = self.compacted.max(rev.min(self.rev));
        let compacted = self.compacted;
        self.history.retain(|(r, _)| *r > compacted);
    }
}
