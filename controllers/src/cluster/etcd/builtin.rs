//! What a node on etcd takes from the built-in election's packets while a cluster moves
//! between the backends (docs/etcd.md, "Moving between backends"): it listens on the election
//! port without ever sending, and only a leader's ping counts. The packet has been decoded
//! (with the cluster's key, when it has one) and admitted (a listed peer at its listed address)
//! by the daemon's listener first, exactly as the built-in election takes it.

use super::Input;
use crate::cluster::election::wire::{Kind, Packet};

/// The machine's input for an admitted election packet: a ping, which only a built-in leader
/// sends (elected by a majority of the listed peers, and pinging only while it keeps one), or
/// nothing. A candidate's vote or pre-vote and a follower's pong say nothing about who leads.
pub fn heard(packet: &Packet) -> Option<Input> {
    if packet.kind != Kind::Ping {
        return None;
    }
    let schedule = packet
        .schedule
        .as_ref()
        .filter(|s| s.origin == packet.from)
        .map(|s| (s.hash.clone(), s.origin.clone()));
    Some(Input::BuiltinPing {
        from: packet.from.clone(),
        epoch: packet.epoch,
        schedule,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ScheduleStamp;

    fn packet(kind: Kind, schedule: Option<ScheduleStamp>) -> Packet {
        Packet {
            from: "b".into(),
            epoch: 7,
            schedule,
            kind,
            lz4_sha1: None,
        }
    }

    fn stamp(origin: &str) -> ScheduleStamp {
        ScheduleStamp {
            timestamp: 1,
            hash: "h".into(),
            origin: origin.into(),
        }
    }

    #[test]
    fn only_a_leaders_ping_is_heard_with_its_own_schedule() {
        assert_eq!(
            heard(&packet(Kind::Ping, Some(stamp("b")))),
            Some(Input::BuiltinPing {
                from: "b".into(),
                epoch: 7,
                schedule: Some(("h".into(), "b".into())),
            })
        );
        // A ping without a schedule yet (a new leader still gathering) is a leader's all the same.
        assert_eq!(
            heard(&packet(Kind::Ping, None)),
            Some(Input::BuiltinPing {
                from: "b".into(),
                epoch: 7,
                schedule: None,
            })
        );
        // A stamp naming another origin is not the leader's own schedule: not followed.
        assert_eq!(
            heard(&packet(Kind::Ping, Some(stamp("c")))),
            Some(Input::BuiltinPing {
                from: "b".into(),
                epoch: 7,
                schedule: None,
            })
        );
        for kind in [
            Kind::Vote { target: "b".into() },
            Kind::PreVote { target: "b".into() },
            Kind::Pong { errors: 0 },
        ] {
            assert_eq!(
                heard(&packet(kind.clone(), Some(stamp("b")))),
                None,
                "{kind:?}"
            );
        }
    }
}
