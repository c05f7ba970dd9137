//! The exchange machine on a virtual clock: membership, periods, change detection, the cap,
//! leases, links, refusals.

use serde_json::json;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn node(dc: &str, n: u8) -> NodeId {
    format!("{dc}-node-{n}")
}

fn addr(dc: &str, n: u8) -> String {
    format!("{dc}.{n}:8379")
}

/// The leader (node 1) of `dc`, in a mesh of `ams`, `fra` and `lon` (two addresses each).
fn leader(dc: &str, epoch: u64, t0: Instant) -> Exchange {
    let me = Me {
        dc: dc.into(),
        node: node(dc, 1),
        addr: addr(dc, 1),
        epoch,
        first_seq: 1,
    };
    let mut x = Exchange::new(me, Config::default(), t0);
    x.set_members(members(&["ams", "fra", "lon"]));
    x
}

fn members(dcs: &[&str]) -> BTreeMap<Dc, Vec<String>> {
    dcs.iter()
        .map(|dc| (dc.to_string(), vec![addr(dc, 1), addr(dc, 2)]))
        .collect()
}

fn summary(v: Value) -> Output {
    Output {
        summary: Some(v),
        ..Output::default()
    }
}

fn request(id: &str, lease_ms: u64) -> Request {
    Request {
        id: id.into(),
        data: json!({"role": "web", "workers": 20}),
        lease_ms,
    }
}

fn answer(id: &str, lease_ms: u64) -> Answer {
    Answer {
        request: id.into(),
        data: json!({"workers": 12}),
        lease_ms,
    }
}

fn to<'a>(sends: &'a [Send], dc: &str) -> Option<&'a Send> {
    sends.iter().find(|s| s.dc == dc)
}

/// `send` from `a` reaches `b` after `one_way`, and `b`'s reply reaches `a` after as long again.
/// Returns the reply.
fn deliver(
    a: &mut Exchange,
    b: &mut Exchange,
    send: &Send,
    at: Instant,
    one_way: Duration,
) -> Envelope {
    let reply = b
        .receive(at + one_way, send.envelope.clone())
        .expect("taken");
    let outcome = Outcome::Reply(reply.clone());
    a.answered(at + one_way * 2, &send.dc, send.exchange, outcome);
    reply
}

#[test]
fn a_new_leader_calls_every_other_dc_at_once_and_then_on_the_period() {
    let t0 = Instant::now();
    let mut ams = leader("ams", 3, t0);
    let mut fra = leader("fra", 5, t0);
    let sends = ams.poll(t0);
    let dcs: Vec<&str> = sends.iter().map(|s| s.dc.as_str()).collect();
    assert_eq!(dcs, ["fra", "lon"], "not its own DC");
    let s = to(&sends, "fra").unwrap();
    assert_eq!(s.addr, addr("fra", 1));
    assert_eq!((s.envelope.dc.as_str(), s.envelope.epoch), ("ams", 3));
    assert!(
        ams.poll(t0 + ms(10)).is_empty(),
        "one exchange in flight per DC"
    );
    deliver(&mut ams, &mut fra, s, t0, ms(20));
    assert!(
        to(&ams.poll(t0 + ms(1999)), "fra").is_none(),
        "nothing changed: the period"
    );
    let again = ams.poll(t0 + ms(2000));
    assert_eq!(to(&again, "fra").unwrap().addr, addr("fra", 1));
    assert!(to(&again, "fra").unwrap().envelope.seq > s.envelope.seq);
    // lon never answers: its exchange fails at the timeout (longer than the period), and the
    // next try goes to its next address at once.
    assert!(to(&again, "lon").is_none(), "still in flight");
    assert!(to(&ams.poll(t0 + ms(2999)), "lon").is_none());
    let retry = ams.poll(t0 + ms(3000));
    assert_eq!(to(&retry, "lon").unwrap().addr, addr("lon", 2));
    // A refused call is over at once: the next try waits for the period.
    let s = to(&retry, "lon").unwrap().clone();
    ams.answered(t0 + ms(3010), "lon", s.exchange, Outcome::Failed);
    assert!(to(&ams.poll(t0 + ms(4999)), "lon").is_none());
    assert_eq!(
        to(&ams.poll(t0 + ms(5000)), "lon").unwrap().addr,
        addr("lon", 1)
    );
}

#[test]
fn membership_follows_the_peer_list_and_entry_points() {
    let t0 = Instant::now();
    let mut ams = leader("ams", 1, t0);
    assert_eq!(ams.link("fra", t0), Some(Link::Unknown));
    ams.set_members(members(&["ams", "fra"]));
    assert_eq!(ams.link("lon", t0), None, "lon is gone");
    let sends = ams.poll(t0);
    assert_eq!(sends.len(), 1);
    ams.set_members(BTreeMap::from([
        ("fra".to_string(), vec![]),
        ("nyc".to_string(), vec![]),
    ]));
    assert!(ams.poll(t0 + ms(5000)).is_empty(), "no address to try");
    assert_eq!(ams.deadline(t0 + ms(5000)), None, "and nothing to wake for");
}

#[test]
fn a_summary_goes_once_until_it_changes_and_reaches_the_other_side_in_one_round_trip() {
    let t0 = Instant::now();
    let mut ams = leader("ams", 1, t0);
    let mut fra = leader("fra", 1, t0);
    assert!(ams.set_output(t0, summary(json!({"spare": 3}))).is_empty());
    let s = ams.poll(t0);
    let s = to(&s, "fra").unwrap().clone();
    assert_eq!(s.envelope.summary, Some(json!({"spare": 3})));
    let reply = deliver(&mut ams, &mut fra, &s, t0, ms(40));
    assert_eq!(
        reply.have_summary, s.envelope.summary_hash,
        "fra acknowledges it"
    );
    let seen = fra.view(t0 + ms(40));
    assert_eq!(seen.dcs["ams"].summary, Some(json!({"spare": 3})));
    // Unchanged: the heartbeat carries the hash only.
    let beat = ams.poll(t0 + ms(2000));
    let beat = to(&beat, "fra").unwrap().clone();
    assert_eq!(beat.envelope.summary, None);
    assert_eq!(beat.envelope.summary_hash, s.envelope.summary_hash);
    deliver(&mut ams, &mut fra, &beat, t0 + ms(2000), ms(40));
    // The same output again is no change; a new summary goes out at once.
    ams.set_output(t0 + ms(2100), summary(json!({"spare": 3})));
    assert!(to(&ams.poll(t0 + ms(2100)), "fra").is_none());
    ams.set_output(t0 + ms(2200), summary(json!({"spare": 1})));
    let early = ams.poll(t0 + ms(2200));
    let early = to(&early, "fra").unwrap().clone();
    assert_eq!(early.envelope.summary, Some(json!({"spare": 1})));
    deliver(&mut ams, &mut fra, &early, t0 + ms(2200), ms(40));
    let seen = fra.view(t0 + ms(2240));
    assert_eq!(seen.dcs["ams"].summary, Some(json!({"spare": 1})));
    assert_eq!(seen.dcs["ams"].summary_age_ms, Some(0));
    assert!(!seen.dcs["ams"].summary_behind);
}

#[test]
fn links_go_up_on_contact_down_after_the_link_timeout_and_measure_rtt() {
    let t0 = Instant::now();
    let mut ams = leader("ams", 1, t0);
    let mut fra = leader("fra", 1, t0);
    let s = ams.poll(t0);
    deliver(&mut ams, &mut fra, to(&s, "fra").unwrap(), t0, ms(50));
    assert_eq!(
        fra.link("ams", t0 + ms(50)),
        Some(Link::Up),
        "a call is contact"
    );
    let view = ams.view(t0 + ms(100));
    assert_eq!(view.dcs["fra"].link, Link::Up);
    assert_eq!(view.dcs["fra"].rtt_ms, Some(100));
    assert_eq!(view.dcs["fra"].leader, Some(node("fra", 1)));
    assert_eq!(view.dcs["lon"].link, Link::Unknown);
    // The next exchange takes 300 ms: the smoothed RTT moves by an eighth of the difference.
    let s = ams.poll(t0 + ms(2000));
    deliver(
        &mut ams,
        &mut fra,
        to(&s, "fra").unwrap(),
        t0 + ms(2000),
        ms(150),
    );
    assert_eq!(ams.view(t0 + ms(2300)).dcs["fra"].rtt_ms, Some(125));
    // Cut: exchanges fail from now on.
    assert_eq!(ams.link("fra", t0 + ms(12_299)), Some(Link::Up));
    assert_eq!(ams.link("fra", t0 + ms(12_300)), Some(Link::Down));
    assert_eq!(
        ams.view(t0 + ms(12_300)).dcs["fra"].summary,
        None,
        "fra published none"
    );
}

#[test]
fn over_the_cap_the_summary_waits_for_the_next_interval_and_heartbeats_go_on() {
    let t0 = Instant::now();
    let config = Config {
        traffic_cap: 2000,
        ..Config::default()
    };
    let me = Me {
        dc: "ams".into(),
        node: node("ams", 1),
        addr: addr("ams", 1),
        epoch: 1,
        first_seq: 1,
    };
    let mut ams = Exchange::new(me, config, t0);
    ams.set_members(members(&["ams", "fra"]));
    let mut fra = leader("fra", 1, t0);
    let big = json!({"blob": "x".repeat(3000)});
    ams.set_output(t0, summary(big.clone()));
    let s = ams.poll(t0);
    let s = to(&s, "fra").unwrap().clone();
    assert_eq!(s.envelope.summary, None, "3000 bytes do not fit under 2000");
    assert!(s.envelope.summary_hash.is_some(), "the hash goes");
    assert!(ams.view(t0).dcs["fra"].summary_deferred);
    deliver(&mut ams, &mut fra, &s, t0, ms(10));
    assert!(fra.view(t0 + ms(10)).dcs["ams"].summary_behind);
    // Heartbeats still go, within the interval, without the body.
    let mut at = t0;
    for _ in 0..5 {
        at += ms(2000);
        let beat = ams.poll(at);
        let beat = to(&beat, "fra").expect("a heartbeat").clone();
        assert_eq!(beat.envelope.summary, None);
        deliver(&mut ams, &mut fra, &beat, at, ms(10));
    }
    assert!(fra.view(at).dcs["ams"].summary.is_none());
    // A bigger cap would send it; here it never fits: it stays deferred in every interval.
    let later = ams.poll(t0 + ms(60_000));
    assert_eq!(to(&later, "fra").unwrap().envelope.summary, None);
    let view = ams.view(t0 + ms(60_000));
    assert!(view.dcs["fra"].summary_deferred);
    assert!(
        view.dcs["fra"].bytes_sent < 2000 + 16 * 400,
        "only heartbeats went out"
    );
}

#[test]
fn a_deferred_summary_goes_at_the_first_heartbeat_of_the_next_interval() {
    let t0 = Instant::now();
    let config = Config {
        traffic_cap: 3000,
        traffic_interval: ms(10_000),
        ..Config::default()
    };
    let me = Me {
        dc: "ams".into(),
        node: node("ams", 1),
        addr: addr("ams", 1),
        epoch: 1,
        first_seq: 1,
    };
    let mut ams = Exchange::new(me, config, t0);
    ams.set_members(members(&["ams", "fra"]));
    let mut fra = leader("fra", 1, t0);
    ams.set_output(t0, summary(json!({"blob": "a".repeat(2000)})));
    let s = ams.poll(t0);
    let s = to(&s, "fra").unwrap().clone();
    assert!(s.envelope.summary.is_some(), "fits the first time");
    deliver(&mut ams, &mut fra, &s, t0, ms(10));
    // A second big summary does not fit in what is left of the interval.
    ams.set_output(t0 + ms(100), summary(json!({"blob": "b".repeat(2000)})));
    assert!(
        to(&ams.poll(t0 + ms(100)), "fra").is_none(),
        "an early send over the cap waits"
    );
    let beat = ams.poll(t0 + ms(2000));
    let beat = to(&beat, "fra").unwrap().clone();
    assert_eq!(beat.envelope.summary, None);
    deliver(&mut ams, &mut fra, &beat, t0 + ms(2000), ms(10));
    assert!(fra.view(t0 + ms(2020)).dcs["ams"].summary_behind);
    let mut at = t0 + ms(2000);
    while at < t0 + ms(10_000) {
        at += ms(2000);
        if let Some(s) = to(&ams.poll(at), "fra").cloned() {
            if at >= t0 + ms(10_000) {
                assert!(s.envelope.summary.is_some(), "the new interval has room");
            } else {
                assert!(s.envelope.summary.is_none());
            }
            deliver(&mut ams, &mut fra, &s, at, ms(10));
        }
    }
    let seen = fra.view(at + ms(20));
    assert_eq!(
        seen.dcs["ams"].summary,
        Some(json!({"blob": "b".repeat(2000)}))
    );
    assert!(!seen.dcs["ams"].summary_behind);
}

/// ams borrows from fra: the request and the answer travel, and each side shows them with
/// their leases.
fn lend(t0: Instant) -> (Exchange, Exchange) {
    let mut ams = leader("ams", 1, t0);
    let mut fra = leader("fra", 1, t0);
    let output = Output {
        requests: BTreeMap::from([("fra".to_string(), vec![request("burst", 60_000)])]),
        ..Output::default()
    };
    assert!(ams.set_output(t0, output).is_empty());
    let s = ams.poll(t0);
    deliver(&mut ams, &mut fra, to(&s, "fra").unwrap(), t0, ms(50));
    let asked = fra.view(t0 + ms(50));
    assert_eq!(asked.dcs["ams"].requests.len(), 1);
    assert_eq!(asked.dcs["ams"].requests[0].id, "burst");
    assert_eq!(asked.dcs["ams"].requests[0].expires_in_ms, 60_000);
    let output = Output {
        answers: BTreeMap::from([("ams".to_string(), vec![answer("burst", 30_000)])]),
        ..Output::default()
    };
    assert!(fra.set_output(t0 + ms(60), output).is_empty());
    let s = fra.poll(t0 + ms(60));
    let s = to(&s, "ams").unwrap().clone();
    assert_eq!(s.envelope.answers.len(), 1, "a change goes at once");
    deliver(&mut fra, &mut ams, &s, t0 + ms(60), ms(50));
    (ams, fra)
}

#[test]
fn a_grant_travels_with_its_lease_and_both_sides_show_it() {
    let t0 = Instant::now();
    let (ams, fra) = lend(t0);
    let got = ams.view(t0 + ms(110));
    assert_eq!(got.dcs["fra"].answers.len(), 1);
    assert_eq!(got.dcs["fra"].answers[0].data, json!({"workers": 12}));
    assert_eq!(got.dcs["fra"].answers[0].expires_in_ms, 30_000);
    let lent = fra.view(t0 + ms(60));
    assert_eq!(lent.dcs["ams"].lent.len(), 1);
    assert_eq!(
        lent.dcs["ams"].lent[0].outstanding_ms, 33_000,
        "lease + exchange timeout"
    );
}

#[test]
fn after_a_cut_a_grant_expires_at_the_borrower_on_its_lease_and_at_the_lender_after_the_timeout_too()
 {
    let t0 = Instant::now();
    let (mut ams, mut fra) = lend(t0);
    // From now on nothing arrives: every exchange fails.
    let mut at = t0 + ms(110);
    let end = t0 + ms(70_000);
    let mut borrower_gone = None;
    let mut lender_gone = None;
    while at < end {
        at += ms(100);
        for x in [&mut ams, &mut fra] {
            for s in x.poll(at) {
                x.answered(at, &s.dc, s.exchange, Outcome::Failed);
            }
        }
        if borrower_gone.is_none() && ams.view(at).dcs["fra"].answers.is_empty() {
            borrower_gone = Some(at);
        }
        if lender_gone.is_none() && fra.view(at).dcs["ams"].lent.is_empty() {
            lender_gone = Some(at);
        }
    }
    // The answer arrived at 110 ms with a 30 s lease. The lender heard ams last at 160 ms; it
    // carried the answer in its heartbeats (every 2 s from 2110 ms) while the link was up, the
    // last at 10110 ms, and counts it lent for the lease and the exchange timeout after that.
    assert_eq!(borrower_gone, Some(t0 + ms(30_110)));
    assert_eq!(fra.link("ams", t0 + ms(10_160)), Some(Link::Down));
    assert_eq!(lender_gone, Some(t0 + ms(43_110)));
    assert!(
        lender_gone >= borrower_gone,
        "the lender waits for the borrower"
    );
    // The request also expired at fra, so the lender's scheduler is told its answer is not open.
    let output = Output {
        answers: BTreeMap::from([("ams".to_string(), vec![answer("burst", 30_000)])]),
        ..Output::default()
    };
    let errors = fra.set_output(end, output);
    assert!(
        matches!(&errors[..], [OutputError::NotOpen { .. }]),
        "{errors:?}"
    );
}

#[test]
fn a_renewed_grant_stays_and_a_withdrawn_request_ends_its_answer() {
    let t0 = Instant::now();
    let (mut ams, mut fra) = lend(t0);
    let mut at = t0 + ms(110);
    // Both sides keep exchanging for a minute: the grant is renewed by every heartbeat.
    while at < t0 + ms(60_000) {
        at += ms(100);
        for s in ams.poll(at) {
            if s.dc == "fra" {
                deliver(&mut ams, &mut fra, &s, at, ms(20));
            }
        }
        for s in fra.poll(at) {
            if s.dc == "ams" {
                deliver(&mut fra, &mut ams, &s, at, ms(20));
            }
        }
    }
    assert_eq!(ams.view(at).dcs["fra"].answers.len(), 1, "renewed");
    // ams's scheduler no longer asks: fra's next envelope has no answer, so ams drops it.
    ams.set_output(at, Output::default());
    let s = ams.poll(at);
    deliver(&mut ams, &mut fra, to(&s, "fra").unwrap(), at, ms(20));
    assert!(
        fra.view(at + ms(20)).dcs["ams"].requests.is_empty(),
        "withdrawn"
    );
    let s = fra.poll(at + ms(2100));
    let s = to(&s, "ams").unwrap().clone();
    assert!(
        s.envelope.answers.is_empty(),
        "no answer to a request not open"
    );
    deliver(&mut fra, &mut ams, &s, at + ms(2100), ms(20));
    assert!(ams.view(at + ms(2140)).dcs["fra"].answers.is_empty());
    assert_eq!(
        fra.view(at + ms(2140)).dcs["ams"].lent.len(),
        1,
        "lent until its lease ends"
    );
}

#[test]
fn a_new_lender_leader_renews_the_grant_and_the_old_one_is_stale() {
    let t0 = Instant::now();
    let (mut ams, old_fra) = lend(t0);
    // fra elects node 2 at a higher epoch; it knows nothing yet.
    let me = Me {
        dc: "fra".into(),
        node: node("fra", 2),
        addr: addr("fra", 2),
        epoch: 2,
        first_seq: 1,
    };
    let mut fra = Exchange::new(me, Config::default(), t0 + ms(1000));
    fra.set_members(members(&["ams", "fra", "lon"]));
    assert!(fra.view(t0 + ms(1000)).dcs["ams"].requests.is_empty());
    let s = fra.poll(t0 + ms(1000));
    let reply = deliver(
        &mut fra,
        &mut ams,
        to(&s, "ams").unwrap(),
        t0 + ms(1000),
        ms(20),
    );
    assert_eq!(reply.requests.len(), 1, "ams's reply repeats the request");
    let seen = ams.view(t0 + ms(1040));
    assert_eq!(seen.dcs["fra"].leader, Some(node("fra", 2)));
    assert_eq!(
        seen.dcs["fra"].answers.len(),
        1,
        "the old leader's answer holds on its lease"
    );
    // The old leader, still believing it leads, is refused from now on.
    let mut old = old_fra;
    let late = old.poll(t0 + ms(2100));
    let err = ams.receive(t0 + ms(2100), to(&late, "ams").unwrap().envelope.clone());
    assert_eq!(err, Err(Refusal::Stale { dc: "fra".into() }));
    // The new leader's scheduler answers the request: the grant is renewed.
    let output = Output {
        answers: BTreeMap::from([("ams".to_string(), vec![answer("burst", 30_000)])]),
        ..Output::default()
    };
    assert!(fra.set_output(t0 + ms(1100), output).is_empty());
    let s = fra.poll(t0 + ms(1100));
    deliver(
        &mut fra,
        &mut ams,
        to(&s, "ams").unwrap(),
        t0 + ms(1100),
        ms(20),
    );
    let seen = ams.view(t0 + ms(1120));
    assert_eq!(seen.dcs["fra"].answers[0].expires_in_ms, 30_000);
}

#[test]
fn envelopes_from_outside_the_mesh_old_ones_and_bad_summaries_are_refused() {
    let t0 = Instant::now();
    let mut ams = leader("ams", 1, t0);
    let mut fra = leader("fra", 4, t0);
    let s = fra.poll(t0);
    let good = to(&s, "ams").unwrap().envelope.clone();
    let mut e = good.clone();
    e.dc = "nyc".into();
    assert_eq!(ams.receive(t0, e), Err(Refusal::UnknownDc("nyc".into())));
    let mut e = good.clone();
    e.dc = "ams".into();
    assert_eq!(ams.receive(t0, e), Err(Refusal::OwnDc("ams".into())));
    let mut e = good.clone();
    e.v = 2;
    assert_eq!(ams.receive(t0, e), Err(Refusal::Version(2)));
    let mut e = good.clone();
    e.summary = Some(json!({"forged": true}));
    e.summary_hash = Some(wire::summary_hash(&json!({"real": true})));
    assert_eq!(ams.receive(t0, e).unwrap_err().label(), "decode");
    assert!(ams.receive(t0, good.clone()).is_ok());
    // A replay of the newest sender's envelope (or one a newer envelope overtook) is answered
    // but nothing in it is taken: here a summary it did not have.
    let mut replay = good.clone();
    replay.summary = Some(json!({"late": true}));
    replay.summary_hash = Some(wire::summary_hash(&json!({"late": true})));
    assert!(ams.receive(t0, replay).is_ok(), "a replay");
    assert_eq!(ams.view(t0).dcs["fra"].summary, good.summary);
    let mut older = good.clone();
    older.epoch = 3;
    older.seq += 10;
    assert!(ams.receive(t0, older).is_err(), "an older epoch");
    let mut newer = good.clone();
    newer.seq += 1;
    assert!(ams.receive(t0, newer.clone()).is_ok());
    // A second leader of fra at the same epoch (minority mode): taken, and then neither's
    // envelopes are taken twice.
    let mut twin = good;
    twin.node = node("fra", 2);
    twin.seq = 5;
    assert!(ams.receive(t0, twin.clone()).is_ok());
    assert_eq!(ams.view(t0).dcs["fra"].leader, Some(node("fra", 2)));
    assert!(
        ams.receive(t0, newer.clone()).is_err(),
        "a replay of the first"
    );
    assert!(
        ams.receive(t0, twin.clone()).is_ok(),
        "a replay of the second, the newest sender: answered"
    );
    assert_eq!(ams.view(t0).dcs["fra"].leader, Some(node("fra", 2)));
    newer.seq += 1;
    assert!(ams.receive(t0, newer).is_ok());
}

#[test]
fn bad_entries_of_the_output_are_named_and_left_out() {
    let t0 = Instant::now();
    let mut ams = leader("ams", 1, t0);
    let output = Output {
        summary: None,
        requests: BTreeMap::from([
            (
                "fra".to_string(),
                vec![
                    request("a", 1000),
                    request("a", 1000),
                    request("b", 0),
                    request("", 5),
                ],
            ),
            ("nyc".to_string(), vec![request("c", 1000)]),
        ]),
        answers: BTreeMap::from([("lon".to_string(), vec![answer("x", 1000)])]),
    };
    let errors: Vec<String> = ams
        .set_output(t0, output)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        errors,
        [
            "datacenters.requests.fra[1]: \"a\" is given twice",
            "datacenters.requests.fra[2]: a lease of 0 ms",
            "datacenters.requests.fra[3]: an id of 1 to 128 characters is needed",
            "datacenters.requests.nyc[0]: \"nyc\" is not a known data center",
            "datacenters.answers.lon[0]: no open request \"x\" of \"lon\"",
        ]
    );
    let s = ams.poll(t0);
    assert_eq!(
        to(&s, "fra").unwrap().envelope.requests,
        [request("a", 1000)]
    );
}

#[test]
fn a_follower_names_its_leader_and_the_call_goes_there_at_once() {
    let t0 = Instant::now();
    let mut ams = leader("ams", 1, t0);
    let s = ams.poll(t0);
    let s = to(&s, "fra").unwrap().clone();
    ams.answered(
        t0 + ms(40),
        "fra",
        s.exchange,
        Outcome::NotLeader(Some("fra.7:8379".into())),
    );
    assert_eq!(
        ams.link("fra", t0 + ms(40)),
        Some(Link::Unknown),
        "not contact"
    );
    let again = ams.poll(t0 + ms(40));
    assert_eq!(to(&again, "fra").unwrap().addr, "fra.7:8379");
    // Two nodes naming each other: a few hops at once, then the period.
    let mut at = t0 + ms(40);
    let mut hops = 0;
    let mut s = to(&again, "fra").unwrap().clone();
    loop {
        let target = if s.addr == "fra.7:8379" {
            "fra.8:8379"
        } else {
            "fra.7:8379"
        };
        ams.answered(
            at,
            "fra",
            s.exchange,
            Outcome::NotLeader(Some(target.into())),
        );
        at += ms(1);
        match to(&ams.poll(at), "fra") {
            Some(next) => {
                hops += 1;
                s = next.clone();
            }
            None => break,
        }
    }
    assert_eq!(hops, 2, "three redirects followed in all, then the period");
}

#[test]
fn the_scheduler_reruns_on_what_it_sees_not_on_ages() {
    let t0 = Instant::now();
    let (ams, fra) = lend(t0);
    let a = ams.view(t0 + ms(200));
    let b = ams.view(t0 + ms(900));
    assert_ne!(a, b, "ages moved on");
    assert!(a.same_for_scheduler(&b));
    let down = ams.view(t0 + ms(10_200));
    assert!(!a.same_for_scheduler(&down), "the link went down");
    // The lender's view: what it lent ends 33 s after it was sent (at 60 ms).
    let lending = fra.view(t0 + ms(200));
    assert!(lending.same_for_scheduler(&fra.view(t0 + ms(1000))));
    let ended = fra.view(t0 + ms(33_060));
    assert!(ended.dcs["ams"].lent.is_empty());
    let mut only_lent = lending.clone();
    only_lent.dcs.get_mut("ams").unwrap().lent.clear();
    assert!(
        !lending.same_for_scheduler(&only_lent),
        "what is lent ended"
    );
    let json = serde_json::to_value(&a).unwrap();
    assert_eq!(json["self"], "ams");
    assert_eq!(json["dcs"]["fra"]["link"], "up");
    assert_eq!(json["dcs"]["fra"]["answers"][0]["request"], "burst");
}

#[test]
fn the_peer_list_splits_into_the_election_and_the_mesh() {
    let ids: Vec<NodeId> = (1..=5).map(|n| format!("n{n}")).collect();
    let peers = [
        PeerDc {
            id: &ids[0],
            dc: Some("ams"),
            addr: Some("10.0.0.1:8379"),
        },
        PeerDc {
            id: &ids[1],
            dc: None,
            addr: Some("10.0.0.2:8379"),
        },
        PeerDc {
            id: &ids[2],
            dc: Some("fra"),
            addr: Some("10.1.0.3:8379"),
        },
        PeerDc {
            id: &ids[3],
            dc: Some("fra"),
            addr: None,
        },
        PeerDc {
            id: &ids[4],
            dc: Some("lon"),
            addr: Some("10.2.0.5:8379"),
        },
    ];
    let entry = BTreeMap::from([
        (
            "fra".to_string(),
            vec!["fra.example:8379".to_string(), "10.1.0.3:8379".to_string()],
        ),
        ("nyc".to_string(), vec!["nyc.example:8379".to_string()]),
        ("ams".to_string(), vec!["ams.example:8379".to_string()]),
    ]);
    let split = split_peers("ams", peers, &entry);
    let election: Vec<&str> = split.election.iter().map(String::as_str).collect();
    assert_eq!(election, ["n1", "n2"], "this DC's peers and peers of no DC");
    assert_eq!(
        split.members,
        BTreeMap::from([
            (
                "fra".to_string(),
                vec!["10.1.0.3:8379".to_string(), "fra.example:8379".to_string()]
            ),
            ("lon".to_string(), vec!["10.2.0.5:8379".to_string()]),
            ("nyc".to_string(), vec!["nyc.example:8379".to_string()]),
        ])
    );
}

/// docs/datacenters.md shows `state.datacenters` with every field the view has, and no other.
#[test]
fn the_documented_view_has_the_fields_of_the_view() {
    let doc = include_str!("../../../../docs/datacenters.md");
    let section = doc
        .split("## What the scheduler sees and returns")
        .nth(1)
        .unwrap();
    let block = section
        .split("```text\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let t0 = Instant::now();
    let (ams, fra) = lend(t0);
    let borrower = serde_json::to_value(ams.view(t0 + ms(200))).unwrap();
    let lender = serde_json::to_value(fra.view(t0 + ms(200))).unwrap();
    let mut keys: Vec<String> = borrower.as_object().unwrap().keys().cloned().collect();
    let dc = &borrower["dcs"]["fra"];
    keys.extend(dc.as_object().unwrap().keys().cloned());
    for item in [
        &dc["answers"][0],
        &lender["dcs"]["ams"]["requests"][0],
        &lender["dcs"]["ams"]["lent"][0],
    ] {
        keys.extend(item.as_object().expect("an entry").keys().cloned());
    }
    keys.push("fra".into()); // the DC's name, a key of `dcs`
    keys.sort();
    keys.dedup();
    let mut written: Vec<String> = block
        .split('"')
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[1].trim_start().starts_with(':'))
        .map(|w| w[0].to_string())
        .collect();
    written.sort();
    written.dedup();
    assert_eq!(written, keys);
}

/// Two leaders calling each other at once: ams's reply to fra's call overtakes ams's own call,
/// which fra then answers without taking (nothing in it is news) instead of refusing it as
/// stale, so neither side sees its link fail.
#[test]
fn crossing_exchanges_are_answered_and_nothing_is_taken_twice() {
    let t0 = Instant::now();
    let mut ams = leader("ams", 1, t0);
    let mut fra = leader("fra", 1, t0);
    let from_ams = ams.poll(t0);
    let from_fra = fra.poll(t0);
    let ams_call = to(&from_ams, "fra").unwrap().clone();
    // fra's call reaches ams first; ams's reply (a newer envelope than its call) reaches fra.
    deliver(
        &mut fra,
        &mut ams,
        to(&from_fra, "ams").unwrap(),
        t0,
        ms(20),
    );
    // Then ams's call, sent before that reply was made, arrives.
    let reply = fra
        .receive(t0 + ms(60), ams_call.envelope.clone())
        .expect("an overtaken call is answered");
    ams.answered(t0 + ms(80), "fra", ams_call.exchange, Outcome::Reply(reply));
    for (exchange, other) in [(&ams, "fra"), (&fra, "ams")] {
        let view = exchange.view(t0 + ms(80));
        assert_eq!(view.dcs[other].link, Link::Up, "{other} seen up");
    }
}
