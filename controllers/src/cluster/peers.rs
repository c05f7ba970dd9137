//! When a fresh read of the peer source counts as a new peer list. `src/cluster/peers.rs` reads
//! the outside world and writes what this says.

use std::collections::BTreeMap;

use crate::state::{NodeId, Peer, Peers};

/// Whether `new` (a fresh read of the peer source) changes the published peer list. When each
/// peer was last heard from directly moves every second; only whether it is known counts here
/// (the election reads the times elsewhere). Before the first publication any list is a change.
pub fn peers_changed(current: &Peers, new: &BTreeMap<NodeId, Peer>) -> bool {
    let same = current.peers.len() == new.len()
        && current.peers.iter().zip(new).all(|((a, pa), (b, pb))| {
            a == b
                && pa.addr == pb.addr
                && pa.name == pb.name
                && pa.hostname == pb.hostname
                && pa.known_since == pb.known_since
                && pa.last_report_direct.is_some() == pb.last_report_direct.is_some()
        });
    !same || current.timestamp.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str, addr: &str, direct: Option<u64>) -> (NodeId, Peer) {
        let peer = Peer {
            id: id.to_string(),
            addr: Some(addr.to_string()),
            name: format!("{id}.example"),
            hostname: id.to_string(),
            schedule: None,
            known_since: 5,
            last_report_direct: direct,
            errors: 0,
        };
        (id.to_string(), peer)
    }

    #[test]
    fn a_peer_list_changes_with_its_members_not_with_their_report_times() {
        let list: BTreeMap<_, _> = [
            peer("beta", "10.0.0.2:8379", Some(100)),
            peer("gamma", "10.0.0.3:8379", None),
        ]
        .into();
        let published = Peers {
            peers: list.clone(),
            timestamp: Some(1),
        };
        assert!(
            peers_changed(&Peers::default(), &BTreeMap::new()),
            "the first list is published, even empty"
        );
        assert!(!peers_changed(&published, &list));
        let later: BTreeMap<_, _> = [
            peer("beta", "10.0.0.2:8379", Some(2000)),
            peer("gamma", "10.0.0.3:8379", None),
        ]
        .into();
        assert!(
            !peers_changed(&published, &later),
            "only a report time moved"
        );
        let heard: BTreeMap<_, _> = [
            peer("beta", "10.0.0.2:8379", Some(100)),
            peer("gamma", "10.0.0.3:8379", Some(100)),
        ]
        .into();
        assert!(peers_changed(&published, &heard), "gamma is now reported");
        let moved: BTreeMap<_, _> = [
            peer("beta", "10.0.0.9:8379", Some(100)),
            peer("gamma", "10.0.0.3:8379", None),
        ]
        .into();
        assert!(peers_changed(&published, &moved), "a new address");
        let fewer: BTreeMap<_, _> = [peer("beta", "10.0.0.2:8379", Some(100))].into();
        assert!(peers_changed(&published, &fewer));
    }
}
