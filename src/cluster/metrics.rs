//! The cluster's metric families: peers, the election and the schedule's replication between
//! nodes (docs/metrics.md).

use prometheus::{Gauge, IntCounterVec, IntGauge, Registry};
use verwalter_controllers::status::Status;

use crate::metrics::Families;

pub(crate) struct ClusterMetrics {
    pub(crate) leader: IntGauge,
    pub(crate) election_epoch: IntGauge,
    pub(crate) peers: IntGauge,
    pub(crate) peer_refreshes: IntCounterVec,
    pub(crate) messages_sent: IntCounterVec,
    pub(crate) messages_received: IntCounterVec,
    pub(crate) messages_dropped: IntCounterVec,
    pub(crate) elections_started: IntCounterVec,
    pub(crate) schedule_fetches: IntCounterVec,
    pub(crate) schedules_checked: IntCounterVec,
    pub(crate) schedule_served_bytes: IntCounterVec,
    pub(crate) schedules_served: IntCounterVec,
    /// Wall-clock ms of the last packet from the leader (0: none), for the age gauge.
    pub(crate) leader_contact_ms: std::sync::atomic::AtomicU64,
    pub(crate) leader_contact_age: Gauge,
}

impl ClusterMetrics {
    /// Creates the families, with the series of every packet type, fetch result, check and
    /// encoding, and registers them on `registry`.
    pub(crate) fn register(registry: &Registry) -> ClusterMetrics {
        let f = Families(registry);
        let m = ClusterMetrics {
            leader: f.gauge("verwalter_leader", "1 when this node is the leader."),
            election_epoch: f.gauge("verwalter_election_epoch", "Current election epoch."),
            peers: f.gauge("verwalter_peers", "Other nodes known."),
            peer_refreshes: f.counter_vec(
                "verwalter_peer_refreshes_total",
                "Peer list refreshes from cantal, by result (ok, error).",
                &["result"],
            ),
            messages_sent: f.counter_vec(
                "verwalter_election_messages_sent_total",
                "Election packets sent, by type (ping, pong, vote).",
                &["type"],
            ),
            messages_received: f.counter_vec(
                "verwalter_election_messages_received_total",
                "Election packets received, by type (ping, pong, vote).",
                &["type"],
            ),
            messages_dropped: f.counter_vec(
                "verwalter_election_messages_dropped_total",
                "Election packets dropped, by reason (decode, bad_auth, unknown_peer, bad_epoch, send_error).",
                &["reason"],
            ),
            elections_started: f.counter_vec(
                "verwalter_elections_started_total",
                "Elections this node started, by reason (start, leader_timeout, election_timeout, vote_timeout, two_leaders, pong, lost_majority).",
                &["reason"],
            ),
            schedule_fetches: f.counter_vec(
                "verwalter_schedule_fetches_total",
                "Schedules fetched from other nodes, by result (ok, error).",
                &["result"],
            ),
            schedules_checked: f.counter_vec(
                "verwalter_schedules_checked_total",
                "Schedules fetched from other nodes and taken as sound, by what vouched for them: data_hash (the SHA-1 of the data is the schedule hash) or body_hash (the SHA-1 of the x-verwalter-lz4 body is the one the leader announced in its ping).",
                &["by"],
            ),
            schedule_served_bytes: f.counter_vec(
                "verwalter_schedule_served_bytes_total",
                "Bytes of schedule bodies this node served (/v1/schedule, /v1/schedule/<hash>), by encoding (identity, gzip, x-verwalter-lz4).",
                &["encoding"],
            ),
            schedules_served: f.counter_vec(
                "verwalter_schedules_served_total",
                "Schedules this node served to peers and clients, by encoding (identity, gzip, x-verwalter-lz4).",
                &["encoding"],
            ),
            leader_contact_ms: Default::default(),
            leader_contact_age: f.register(
                Gauge::new(
                    "verwalter_leader_contact_age_seconds",
                    "Seconds since the last packet from the leader (0 on the leader; -1: never).",
                )
                .expect("valid metric"),
            ),
        };
        for t in ["ping", "pong", "vote", "pre_vote"] {
            m.messages_sent.with_label_values(&[t]);
            m.messages_received.with_label_values(&[t]);
        }
        for r in ["ok", "error"] {
            m.schedule_fetches.with_label_values(&[r]);
        }
        for by in ["data_hash", "body_hash"] {
            m.schedules_checked.with_label_values(&[by]);
        }
        for e in ["identity", "gzip", crate::cluster::coding::LZ4] {
            m.schedule_served_bytes.with_label_values(&[e]);
            m.schedules_served.with_label_values(&[e]);
        }
        m
    }

    /// The gauges that repeat the election state and the peers of `status`.
    pub(crate) fn refresh(&self, status: &Status) {
        let election = &status.election_state;
        self.leader.set(i64::from(election.is_leader));
        self.election_epoch.set(election.epoch as i64);
        self.peers.set(status.peers as i64);
        let contact = self
            .leader_contact_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        self.leader_contact_age.set(if election.is_leader {
            0.0
        } else if contact == 0 {
            -1.0
        } else {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            now.saturating_sub(contact) as f64 / 1000.0
        });
    }
}
