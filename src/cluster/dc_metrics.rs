//! The exchange's metric families, per other data center (docs/metrics.md, docs/datacenters.md):
//! registered on the daemon's registry by [`super::datacenters::DcNode`], set from the
//! exchange's view each time its task wakes, counted as calls end and envelopes are refused.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use verwalter_controllers::cluster::datacenters::{Link, View};

use crate::metrics::Families;

pub(crate) struct DcMetrics {
    link_up: IntGaugeVec,
    rtt: GaugeVec,
    contact_age: GaugeVec,
    bytes: IntCounterVec,
    exchanges: IntCounterVec,
    dropped: IntCounterVec,
    grants: IntGaugeVec,
    /// The byte counts of the view last seen, by (dc, direction): the counter grows by the
    /// difference (a new exchange starts from 0 again).
    seen: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl std::fmt::Debug for DcMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DcMetrics")
    }
}

impl DcMetrics {
    pub(crate) fn register(registry: &Registry) -> DcMetrics {
        let f = Families(registry);
        let float = |name: &str, help: &str| {
            f.register(GaugeVec::new(Opts::new(name, help), &["dc"]).expect("valid metric"))
        };
        DcMetrics {
            link_up: f.gauge_vec(
                "verwalter_dc_link_up",
                "1 while the link to another data center is up (this node leads its DC).",
                &["dc"],
            ),
            rtt: float(
                "verwalter_dc_rtt_seconds",
                "Smoothed round trip of the exchanges with another data center.",
            ),
            contact_age: float(
                "verwalter_dc_contact_age_seconds",
                "Time since the last contact with another data center.",
            ),
            bytes: f.counter_vec(
                "verwalter_dc_bytes_total",
                "Uncompressed envelope bytes exchanged with another data center, by direction (sent, received).",
                &["dc", "direction"],
            ),
            exchanges: f.counter_vec(
                "verwalter_dc_exchanges_total",
                "Calls to another data center's leader, by result (ok, not_leader, failed).",
                &["dc", "result"],
            ),
            dropped: f.counter_vec(
                "verwalter_dc_dropped_total",
                "Envelopes from other data centers refused, by reason (too_big, bad_tag, decode, unknown_dc, stale).",
                &["reason"],
            ),
            grants: f.gauge_vec(
                "verwalter_dc_grants",
                "Answers held from another data center (borrowed) and this DC's answers still in use there (lent).",
                &["dc", "side"],
            ),
            seen: Mutex::default(),
        }
    }

    /// A call to `dc` ended with `result`.
    pub(crate) fn exchange(&self, dc: &str, result: &str) {
        self.exchanges.with_label_values(&[dc, result]).inc();
    }

    /// An envelope was refused for `reason`.
    pub(crate) fn dropped(&self, reason: &str) {
        self.dropped.with_label_values(&[reason]).inc();
    }

    /// Sets the per-DC series from `view` (`None`: this node does not lead, no link is up).
    pub(crate) fn observe(&self, members: &[String], view: Option<&View>) {
        for dc in members {
            let one = view.and_then(|v| v.dcs.get(dc));
            let up = one.is_some_and(|d| d.link == Link::Up);
            self.link_up.with_label_values(&[dc]).set(i64::from(up));
            let secs = |ms: Option<u64>| ms.map_or(0.0, |ms| ms as f64 / 1000.0);
            self.rtt
                .with_label_values(&[dc])
                .set(secs(one.and_then(|d| d.rtt_ms)));
            self.contact_age
                .with_label_values(&[dc])
                .set(secs(one.and_then(|d| d.contact_age_ms)));
            let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            self.grants
                .with_label_values(&[dc, "borrowed"])
                .set(count(one.map_or(0, |d| d.answers.len())));
            self.grants
                .with_label_values(&[dc, "lent"])
                .set(count(one.map_or(0, |d| d.lent.len())));
            let Some(one) = one else { continue };
            let mut seen = self.seen.lock().unwrap();
            for (direction, now) in [("sent", one.bytes_sent), ("received", one.bytes_received)] {
                let last = seen.insert((dc.clone(), direction), now).unwrap_or(0);
                let grown = if now >= last { now - last } else { now };
                self.bytes.with_label_values(&[dc, direction]).inc_by(grown);
            }
        }
    }
}
