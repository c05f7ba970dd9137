use std::collections::BTreeSet;

use tokio::time::Instant;

use super::*;
use crate::state::Peer;

const OWN: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const BETA: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const GAMMA: &str = "cccccccccccccccccccccccccccccccc";

fn peers(list: &[(&str, Option<&str>)]) -> Peers {
    Peers {
        peers: list
            .iter()
            .map(|(id, addr)| {
                (
                    id.to_string(),
                    Peer {
                        id: id.to_string(),
                        addr: addr.map(str::to_string),
                        name: String::new(),
                        hostname: String::new(),
                        schedule: None,
                        known_since: 0,
                        last_report_direct: None,
                        errors: 0,
                    },
                )
            })
            .collect(),
        timestamp: Some(1),
    }
}

fn stamp(origin: &str) -> ScheduleStamp {
    ScheduleStamp {
        timestamp: 7,
        hash: "h".repeat(40),
        origin: origin.to_string(),
    }
}

fn packet(from: &str, epoch: u64, kind: Kind) -> Packet {
    Packet {
        from: from.to_string(),
        epoch,
        schedule: None,
        kind,
        lz4_sha1: None,
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn the_peer_list_is_fresh_for_a_second_and_a_half() {
    assert!(!hosts_fresh(None, 10_000), "never refreshed");
    assert!(hosts_fresh(Some(10_000), 10_000));
    assert!(hosts_fresh(Some(10_000), 11_500));
    assert!(!hosts_fresh(Some(10_000), 11_501));
    // A refresh stamped after now (clock stepped back) is fresh.
    assert!(hosts_fresh(Some(12_000), 10_000));
}

#[test]
fn in_minority_mode_only_peers_heard_within_the_window_vote() {
    let list = peers(&[
        (BETA, Some("10.0.0.2:8379")),
        (GAMMA, Some("10.0.0.3:8379")),
    ]);
    let heard: BTreeMap<NodeId, u64> = [
        (BETA.to_string(), 100_000),
        (GAMMA.to_string(), 20_000),
        ("dddddddddddddddddddddddddddddddd".to_string(), 100_000),
    ]
    .into();
    assert_eq!(voters(&list, None, 100_000, &heard), 2, "all listed");
    let window = Some(Duration::from_secs(75));
    assert_eq!(
        voters(&list, window, 100_000, &heard),
        1,
        "gamma is too long silent, an unlisted node never counts"
    );
    assert_eq!(voters(&list, window, 95_000, &heard), 2, "at the edge");
    assert_eq!(voters(&list, window, 0, &BTreeMap::new()), 0);
}

#[test]
fn only_listed_peers_from_their_address_and_sane_epochs_are_taken() {
    let list = peers(&[
        (BETA, Some("10.0.0.2:8379")),
        (GAMMA, None),
        (
            "dddddddddddddddddddddddddddddddd",
            Some("[::ffff:10.0.0.4]:8379"),
        ),
    ]);
    let ping = |from: &str, epoch| packet(from, epoch, Kind::Ping);
    assert_eq!(
        admit(OWN, &ping(BETA, 3), addr("10.0.0.2:5000"), &list),
        Ok(()),
        "another source port (a NAT) is the same peer"
    );
    assert_eq!(
        admit(OWN, &ping(OWN, 3), addr("10.0.0.1:8379"), &list),
        Err(Dropped::Own)
    );
    assert_eq!(
        admit(OWN, &ping(BETA, 3), addr("10.0.0.9:8379"), &list),
        Err(Dropped::UnknownPeer),
        "a listed id from another IP"
    );
    assert_eq!(
        admit(OWN, &ping(GAMMA, 3), addr("10.0.0.3:8379"), &list),
        Err(Dropped::UnknownPeer),
        "a peer without an address cannot be checked"
    );
    assert_eq!(
        admit(
            OWN,
            &ping("eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", 3),
            addr("10.0.0.2:8379"),
            &list
        ),
        Err(Dropped::UnknownPeer)
    );
    assert_eq!(
        admit(
            OWN,
            &ping("dddddddddddddddddddddddddddddddd", 3),
            addr("10.0.0.4:8379"),
            &list
        ),
        Ok(()),
        "IPv4-mapped addresses compare as IPv4"
    );
    assert_eq!(
        admit(
            OWN,
            &ping(BETA, MAX_EPOCH + 1),
            addr("10.0.0.2:8379"),
            &list
        ),
        Err(Dropped::BadEpoch)
    );
    assert_eq!(
        admit(OWN, &ping(BETA, MAX_EPOCH), addr("10.0.0.2:8379"), &list),
        Ok(())
    );
    assert_eq!(Dropped::Own.label(), None);
    assert_eq!(Dropped::UnknownPeer.label(), Some("unknown_peer"));
    assert_eq!(Dropped::BadEpoch.label(), Some("bad_epoch"));
}

#[test]
fn a_report_keeps_the_last_error_count_until_the_next_pong() {
    let mut pong = packet(BETA, 4, Kind::Pong { errors: 3 });
    pong.schedule = Some(stamp(OWN));
    let first = report(&pong, None);
    assert_eq!(
        first,
        Report {
            schedule: Some(stamp(OWN)),
            errors: 3,
            epoch: 4
        }
    );
    let vote = packet(
        BETA,
        5,
        Kind::Vote {
            target: BETA.into(),
        },
    );
    let second = report(&vote, Some(&first));
    assert_eq!((second.errors, second.epoch, second.schedule), (3, 5, None));
    assert_eq!(report(&vote, None).errors, 0);
}

#[test]
fn other_nodes_schedules_are_sightings_and_the_leaders_pings_are_contact() {
    let mut ping = packet(BETA, 4, Kind::Ping);
    assert_eq!(sighting(OWN, &ping), None);
    ping.schedule = Some(stamp(OWN));
    assert_eq!(sighting(OWN, &ping), None, "our own schedule coming back");
    ping.schedule = Some(stamp(BETA));
    assert_eq!(sighting(OWN, &ping), Some(&stamp(BETA)));

    let now = Instant::now();
    let following = |leader: &str| State::Follower {
        leader: leader.into(),
        epoch: 4,
        deadline: now,
    };
    assert!(from_my_leader(&following(BETA), &ping));
    assert!(!from_my_leader(&following(GAMMA), &ping));
    assert!(!from_my_leader(
        &following(BETA),
        &packet(BETA, 4, Kind::Pong { errors: 0 })
    ));
    assert!(!from_my_leader(&State::Starting { deadline: now }, &ping));
}

#[test]
fn actions_become_packets_for_everyone_or_one_peer() {
    let own = OWN.to_string();
    let mine = stamp(OWN);
    let older = stamp(GAMMA);

    let body = [7u8; 20];
    let (ping, to) = outgoing(
        Effect::PingAll,
        &own,
        9,
        2,
        Some(&mine),
        Some((&mine.hash, body)),
    );
    assert_eq!((to, ping.kind, ping.epoch), (To::All, Kind::Ping, 9));
    assert_eq!(ping.schedule, Some(mine.clone()));
    assert_eq!(ping.lz4_sha1, Some(body), "the ping vouches for its body");
    let (ping, _) = outgoing(
        Effect::PingAll,
        &own,
        9,
        2,
        Some(&mine),
        Some(("0ld", body)),
    );
    assert_eq!(
        ping.lz4_sha1, None,
        "a body hash of another schedule is not announced with this one"
    );
    let (ping, _) = outgoing(
        Effect::PingAll,
        &own,
        9,
        2,
        Some(&older),
        Some((&older.hash, body)),
    );
    assert_eq!(
        (ping.schedule, ping.lz4_sha1),
        (None, None),
        "a leader's ping never carries another leader's schedule"
    );

    let (vote, to) = outgoing(
        Effect::Vote,
        &own,
        9,
        2,
        Some(&older),
        Some((&older.hash, body)),
    );
    assert_eq!(vote.lz4_sha1, None, "only pings announce a body hash");
    assert_eq!(to, To::All);
    assert_eq!(
        vote.kind,
        Kind::Vote {
            target: own.clone()
        }
    );
    assert_eq!(
        vote.schedule,
        Some(older.clone()),
        "votes carry what it has"
    );

    let (confirm, to) = outgoing(Effect::ConfirmVote(BETA.into()), &own, 9, 2, None, None);
    assert_eq!(to, To::Peer(BETA.into()));
    assert_eq!(
        confirm.kind,
        Kind::Vote {
            target: BETA.into()
        }
    );

    let (pong, to) = outgoing(Effect::Pong(BETA.into()), &own, 9, 2, Some(&older), None);
    assert_eq!(to, To::Peer(BETA.into()));
    assert_eq!(pong.kind, Kind::Pong { errors: 2 });
    assert_eq!(pong.schedule, Some(older.clone()));
    assert_eq!(pong.from, OWN);

    // Pre-votes go out at the epoch the election would have, not the node's own.
    let (pre, to) = outgoing(
        Effect::PreVote { epoch: 10 },
        &own,
        9,
        2,
        Some(&older),
        None,
    );
    assert_eq!((to, pre.epoch), (To::All, 10));
    assert_eq!(
        pre.kind,
        Kind::PreVote {
            target: own.clone()
        }
    );
    assert_eq!(pre.schedule, Some(older), "pre-votes carry what it has");
    let grant = Effect::GrantPreVote {
        candidate: BETA.into(),
        epoch: 12,
    };
    let (yes, to) = outgoing(grant, &own, 9, 2, None, None);
    assert_eq!((to, yes.epoch), (To::Peer(BETA.into()), 12));
    assert_eq!(
        yes.kind,
        Kind::PreVote {
            target: BETA.into()
        }
    );
}

#[test]
fn elections_started_are_labelled_by_what_ended_the_state_before() {
    let now = Instant::now();
    let electing = |epoch| State::Electing {
        epoch,
        votes: BTreeSet::new(),
        needed: 2,
        deadline: now,
    };
    let follower = State::Follower {
        leader: BETA.into(),
        epoch: 3,
        deadline: now,
    };
    let leader = State::Leader {
        epoch: 3,
        next_ping: now,
    };
    let voted = State::Voted {
        epoch: 3,
        peer: BETA.into(),
        deadline: now,
    };
    let starting = State::Starting { deadline: now };
    let started = |before: &State, cause| election_started(before, &electing(4), cause);

    assert_eq!(started(&starting, Cause::Timeout), Some("start"));
    assert_eq!(started(&follower, Cause::Timeout), Some("leader_timeout"));
    assert_eq!(
        started(&electing(3), Cause::Timeout),
        Some("election_timeout")
    );
    assert_eq!(started(&voted, Cause::Timeout), Some("vote_timeout"));
    assert_eq!(started(&leader, Cause::Timeout), Some("lost_majority"));
    assert_eq!(started(&leader, Cause::TwoLeaders), Some("two_leaders"));
    assert_eq!(started(&follower, Cause::Message), Some("message"));
    assert_eq!(started(&voted, Cause::Pong), Some("pong"));
    assert_eq!(
        started(&electing(4), Cause::Timeout),
        None,
        "still the same election"
    );
    assert_eq!(election_started(&follower, &leader, Cause::Timeout), None);

    // A pre-vote starts the election, each new round of it counts, a yes does not, and the
    // real election a won pre-vote leads to is the same one.
    let pre_voting = State::PreVoting {
        epoch: 3,
        grants: BTreeSet::new(),
        votes: BTreeSet::new(),
        needed: 2,
        deadline: now,
    };
    let pre = |before: &State, cause| election_started(before, &pre_voting, cause);
    assert_eq!(pre(&follower, Cause::Timeout), Some("leader_timeout"));
    assert_eq!(pre(&starting, Cause::Timeout), Some("start"));
    assert_eq!(pre(&leader, Cause::Timeout), Some("lost_majority"));
    assert_eq!(pre(&pre_voting, Cause::Timeout), Some("election_timeout"));
    assert_eq!(pre(&pre_voting, Cause::Message), None);
    assert_eq!(started(&pre_voting, Cause::Message), None);

    assert_eq!(
        Cause::of_message(&leader, &Message::Ping),
        Cause::TwoLeaders
    );
    assert_eq!(Cause::of_message(&follower, &Message::Ping), Cause::Message);
    assert_eq!(Cause::of_message(&leader, &Message::Pong), Cause::Pong);
    assert_eq!(
        Cause::of_message(&follower, &Message::Vote(BETA.into())),
        Cause::Message
    );
}

#[test]
fn a_peer_is_alive_while_heard_within_the_window() {
    let window = Duration::from_secs(75);
    let now = 1_000_000;
    assert!(heard_lately(Some(now), window, now));
    assert!(heard_lately(Some(now - 75_000), window, now), "at the edge");
    assert!(!heard_lately(Some(now - 75_001), window, now));
    assert!(!heard_lately(None, window, now), "never heard");
    // A clock that stepped back: heard "in the future" still counts.
    assert!(heard_lately(Some(now + 5_000), window, now));
}
