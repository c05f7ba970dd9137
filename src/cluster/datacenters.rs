//! The peer list cut at this node's data center (docs/datacenters.md): the peer sources keep
//! only this DC's peers in the store, so the election and schedule distribution never see the
//! others; the other DCs become the members of the mesh, with the addresses to try.

use std::collections::BTreeMap;

use verwalter_controllers::cluster::datacenters::{Dc, PeerDc, split_peers};
use verwalter_controllers::state::Peer;

use crate::config::DcSettings;

/// A peer source's view of the DCs: this node's, the entry points, and the members last found.
#[derive(Debug, Clone)]
pub(crate) struct DcFilter {
    own: Dc,
    entry_points: BTreeMap<Dc, Vec<String>>,
    /// The static peers' DCs by id (a cantal list brings its own).
    static_dcs: BTreeMap<String, Dc>,
    members: BTreeMap<Dc, Vec<String>>,
}

impl DcFilter {
    pub(crate) fn new(settings: &DcSettings) -> DcFilter {
        DcFilter {
            own: settings.own.clone(),
            entry_points: settings.entry_points.clone(),
            static_dcs: settings.peer_dcs.clone(),
            members: BTreeMap::new(),
        }
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
            self.members = split.members;
        }
        peers
            .into_iter()
            .filter(|(id, _)| split.election.contains(id))
            .collect()
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
}
