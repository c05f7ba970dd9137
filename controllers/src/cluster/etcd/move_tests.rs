//! A cluster moving between the built-in election and etcd (docs/etcd.md, "Moving between
//! backends"): a built-in leader's ping takes precedence over etcd, until a leader timeout
//! after the last one. On the harness of `tests.rs` (the in-memory etcd, answers at once).

use super::*;

/// The built-in leader timeout (`leader-timeout-min-ms`'s default).
const TIMEOUT: Millis = 750;

/// A node that listens for built-in leaders.
fn listening(name: &str, etcd: &mut Etcd, now: Millis) -> Node {
    let config = Config {
        builtin_timeout_ms: Some(TIMEOUT),
        ..config(name)
    };
    Node::start_with(config, etcd, now)
}

fn ping(from: &str, epoch: u64, hash: Option<&str>) -> Input {
    Input::BuiltinPing {
        from: from.into(),
        epoch,
        schedule: hash.map(|h| (h.into(), from.into())),
    }
}

fn campaigned(node: &Node) -> bool {
    node.log
        .iter()
        .any(|e| matches!(e, Effect::Campaign { .. }))
}

/// Every node, every 50 ms from `from` to `to`; `b` pings each of them every 250 ms (from
/// `from`). Checks the fencing invariant at each step.
fn run_pinged(nodes: &mut [Node], etcd: &mut Etcd, from: Millis, to: Millis) {
    let mut now = from;
    while now < to {
        now += 50;
        etcd.expire(now);
        for node in nodes.iter_mut() {
            if (now - from).is_multiple_of(250) {
                node.feed(etcd, now, ping("b", 3, Some("hb")));
            }
            node.tick(etcd, now);
        }
        check_fenced(nodes.iter().map(|n| &n.m), etcd, now);
    }
}

#[test]
fn a_node_listens_for_a_builtin_leader_for_a_leader_timeout_before_it_campaigns() {
    let mut etcd = Etcd::new();
    let mut nodes = [listening("a", &mut etcd, 0)];
    run_until(&mut nodes, &mut etcd, 0, TIMEOUT - 50);
    assert!(!campaigned(&nodes[0]), "{:?}", nodes[0].log);
    assert_eq!(
        nodes[0].m.next_wakeup(),
        TIMEOUT,
        "wakes when it stops listening"
    );
    run_until(&mut nodes, &mut etcd, TIMEOUT - 50, TIMEOUT);
    assert!(
        nodes[0].m.acting_leader(TIMEOUT).is_some(),
        "leads once it listened"
    );
}

#[test]
fn a_builtin_leaders_pings_defer_the_campaign_until_a_leader_timeout_after_the_last() {
    let mut etcd = Etcd::new();
    let mut nodes = [listening("a", &mut etcd, 0), listening("c", &mut etcd, 0)];
    // b pings from 250 to 2000: nobody campaigns, both follow b's schedule.
    run_pinged(&mut nodes, &mut etcd, 0, 2000);
    for node in &nodes {
        assert!(!campaigned(node), "{}: {:?}", node.name, node.log);
        let d = node.m.deferring(2000).expect("defers");
        assert_eq!(
            (d.node.as_str(), d.epoch, d.since, d.last),
            ("b", 3, 250, 2000)
        );
        assert_eq!(
            node.fetched(),
            ["hb"],
            "{}: b's schedule, once, from b",
            node.name
        );
        assert!(node.has(&Effect::Fetch {
            hash: "hb".into(),
            origin: "b".into(),
            from: "b".into(),
            inline: None
        }));
        assert_eq!(
            node.log
                .iter()
                .filter(|e| matches!(e, Effect::Deferring { .. }))
                .count(),
            1
        );
        assert_eq!(node.m.view(2000).counts.deferrals, 1);
    }
    assert!(etcd.holder().is_none());
    // The pings stop: still nobody until a leader timeout after the last one (2000)...
    run_until(&mut nodes, &mut etcd, 2000, 2000 + TIMEOUT - 50);
    assert!(etcd.holder().is_none());
    assert!(nodes.iter().all(|n| !campaigned(n)));
    // ...then the deferral ends and etcd elects one of them.
    run_until(&mut nodes, &mut etcd, 2000 + TIMEOUT - 50, 2000 + TIMEOUT);
    let now = 2000 + TIMEOUT;
    assert!(nodes.iter().all(|n| n.m.deferring(now).is_none()));
    assert!(nodes[0].has(&Effect::DeferralEnded { node: "b".into() }));
    assert!(leader_of(&nodes, now).is_some(), "{:?}", nodes[0].log);
}

#[test]
fn a_leader_on_etcd_resigns_at_a_builtin_leaders_ping_and_follows_it() {
    let mut etcd = Etcd::new();
    let mut nodes = [listening("a", &mut etcd, 0), listening("c", &mut etcd, 0)];
    run_until(&mut nodes, &mut etcd, 0, 1000);
    let leader = leader_of(&nodes, 1000).expect("one leads");
    let rev = nodes[leader].m.acting_leader(1000).unwrap();
    let other = 1 - leader;
    let name = nodes[leader].name.clone();
    nodes[leader].feed(&mut etcd, 1000, made("ha", &name));
    nodes[other].pump(&mut etcd, 1000);
    assert_eq!(nodes[other].fetched(), ["ha"]);
    // One ping: the leader steps down at once and gives the key back; both follow b.
    nodes[leader].feed(&mut etcd, 1010, ping("b", 3, Some("hb")));
    assert_eq!(nodes[leader].m.acting_leader(1010), None);
    assert!(nodes[leader].has(&Effect::SteppedDown {
        leader_rev: rev,
        reason: StepDown::Deferred
    }));
    assert!(nodes[leader].has(&Effect::Resign { leader_rev: rev }));
    assert!(etcd.holder().is_none(), "resigned");
    assert_eq!(nodes[leader].fetched(), ["hb"]);
    nodes[other].feed(&mut etcd, 1010, ping("b", 3, Some("hb")));
    // While b pings nobody leads on etcd, and nothing published there is followed.
    nodes[other].pump(&mut etcd, 1010);
    run_pinged(&mut nodes, &mut etcd, 1010, 3000);
    assert!(etcd.holder().is_none(), "{:?}", etcd.holder());
    assert_eq!(nodes[other].fetched(), ["ha", "hb"]);
    // b gone: etcd elects again, a new leadership.
    run_until(&mut nodes, &mut etcd, 3000, 3000 + TIMEOUT + 500);
    let now = 3000 + TIMEOUT + 500;
    let again = leader_of(&nodes, now).expect("etcd elects again");
    assert!(nodes[again].m.acting_leader(now).unwrap() > rev);
}

#[test]
fn a_campaign_won_after_a_ping_is_given_back_not_led() {
    let config = Config {
        builtin_timeout_ms: Some(TIMEOUT),
        ..config("a")
    };
    let (mut m, _) = Machine::new(config, 0);
    m.handle(
        0,
        Input::LeaseGranted {
            lease: 7,
            ttl_ms: TTL,
            sent_at: 0,
        },
    );
    m.handle(
        0,
        Input::Read {
            revision: 1,
            leader: None,
            schedule: None,
        },
    );
    let out = m.handle(TIMEOUT, Input::Tick);
    assert!(out.contains(&Effect::Campaign { lease: 7 }), "{out:?}");
    // The ping comes while the campaign is on its way; then the answer: it won.
    m.handle(TIMEOUT + 1, ping("b", 3, None));
    let out = m.handle(
        TIMEOUT + 2,
        Input::Campaigned {
            holder: LeaderKey {
                node: "a".into(),
                lease: 7,
                create_rev: 2,
            },
            revision: 2,
        },
    );
    assert!(out.contains(&Effect::Resign { leader_rev: 2 }), "{out:?}");
    assert!(
        !out.iter().any(|e| matches!(e, Effect::BecameLeader { .. })),
        "{out:?}"
    );
    assert_eq!(m.acting_leader(TIMEOUT + 2), None);
}

#[test]
fn only_a_newer_builtin_leader_replaces_the_one_followed() {
    let mut etcd = Etcd::new();
    let mut node = listening("a", &mut etcd, 0);
    node.feed(&mut etcd, 100, ping("b", 3, Some("hb")));
    // Another node claiming the same or an older epoch: ignored.
    node.feed(&mut etcd, 150, ping("d", 3, Some("hd")));
    node.feed(&mut etcd, 160, ping("d", 2, Some("hd")));
    assert_eq!(node.m.deferring(160).unwrap().node, "b");
    assert_eq!(node.fetched(), ["hb"]);
    // A newer epoch: followed from now on.
    node.feed(&mut etcd, 200, ping("d", 4, Some("hd")));
    let d = node.m.deferring(200).unwrap();
    assert_eq!((d.node.as_str(), d.epoch, d.since), ("d", 4, 200));
    assert_eq!(node.fetched(), ["hb", "hd"]);
    // Its new schedule is followed; the same stamp again is not fetched twice.
    node.feed(&mut etcd, 300, ping("d", 4, Some("hd")));
    node.feed(&mut etcd, 400, ping("d", 4, Some("hd2")));
    assert_eq!(node.fetched(), ["hb", "hd", "hd2"]);
}

#[test]
fn a_node_that_does_not_listen_takes_no_ping() {
    let mut etcd = Etcd::new();
    let mut nodes = [Node::start("a", &mut etcd, 0)];
    let rev = nodes[0].m.acting_leader(0).expect("leads at once");
    nodes[0].feed(&mut etcd, 10, ping("b", 3, Some("hb")));
    assert_eq!(nodes[0].m.acting_leader(10), Some(rev));
    assert!(nodes[0].m.deferring(10).is_none());
    assert!(nodes[0].fetched().is_empty());
}
