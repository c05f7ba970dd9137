//! Inputs the fuzzer found crashing, one test each, named after what it checks; each input is
//! also in its target's corpus (`tests/fuzz/corpus/<target>/crash-*`), so every short run
//! replays it too.

use super::target;

/// `logs.max-age-days` of many digits panicked while the settings were loaded (days × 86,400
/// overflowed); now it is a problem of the settings, like every other bad value.
#[test]
fn a_log_age_too_large_for_seconds_is_a_settings_problem() {
    let class = (target("settings").run)(b"logs:\n  max-age-days: 9223372036854775807\n");
    assert_eq!(
        class,
        "logs.max-age-days: 9223372036854775807 is too large (at most 213503982334601)"
    );
}

/// Sizes in MiB and KiB that do not fit in 64 bits as bytes were wrapped (a segment of 0 bytes,
/// a Lua memory limit of 0): refused the same way.
#[test]
fn sizes_too_large_for_bytes_are_settings_problems() {
    let class = (target("settings").run)(
        b"scheduler: {memory-limit-mib: 17592186044416}\nlogs: {segment-mib: 17592186044416}\n",
    );
    assert!(
        class.contains("scheduler.memory-limit-mib: 17592186044416 is too large"),
        "{class}"
    );
    assert!(
        class.contains("logs.segment-mib: 17592186044416 is too large"),
        "{class}"
    );
}

/// `render.command-timeout-secs` of many digits panicked when the daemon started (the time
/// limit plus the kill grace overflowed a `Duration`), and other times could reach the clocks as
/// absurd deadlines: every time setting is at most 30 days now.
#[test]
fn times_too_long_for_the_clocks_are_settings_problems() {
    let class = (target("settings").run)(
        b"render: {command-timeout-secs: 18446744073709551615}\nhttp: {idle-timeout-ms: 2592000001}\ninputs: {debounce-ms: 2592000000}\n",
    );
    assert!(
        class.contains(
            "render.command-timeout-secs: 18446744073709551615 is too long (at most 2592000, 30 days)"
        ),
        "{class}"
    );
    assert!(
        class
            .contains("http.idle-timeout-ms: 2592000001 is too long (at most 2592000000, 30 days)"),
        "{class}"
    );
    assert!(
        !class.contains("debounce-ms"),
        "30 days is allowed: {class}"
    );
}

/// A number JSON gave as `98446744073709551615` came back as another float after one more trip
/// through JSON (serde_json's fast float parsing); a schedule holding such a float failed its
/// hash check on every follower. Now the workspace parses floats exactly (`float_roundtrip`).
#[test]
fn a_float_survives_a_json_round_trip() {
    let class = (target("runtime_json").run)(br#"{"f":98446744073709551615}"#);
    assert_eq!(class, "ok");
    let class = (target("runtime_yaml").run)(b"3320362233720362233720363372036854775808");
    assert_eq!(class, "ok");
}

/// The same float in a schedule: what the leader serves, a follower parses and verifies.
#[test]
fn a_schedule_with_any_float_verifies_on_a_follower() {
    use verwalter_controllers::state::Schedule;
    let leader = Schedule::new(
        serde_json::json!({"f": 9.844674407370957e19, "g": 2.2525252525252522e39}),
        1_764_000_000_000,
        "77985419c732412ea38b94db00000001".into(),
    );
    let served = serde_json::to_vec(&leader).unwrap();
    let fetched: Schedule = serde_json::from_slice(&served).unwrap();
    fetched.verify().unwrap();
    assert_eq!(fetched, leader);
}

/// An envelope in the form peers write but with `"timestamp":00` (not JSON: a leading zero)
/// was taken by the follower's one-pass reading and refused by serde_json; the two must agree.
#[test]
fn a_timestamp_with_a_leading_zero_is_not_a_schedule() {
    use verwalter_controllers::state::Schedule;
    let leader = Schedule::new(serde_json::json!({"n": 1}), 0, "01".into());
    let mut body = Vec::new();
    leader.write_json(&mut body);
    let body = String::from_utf8(body).unwrap();
    assert_eq!(
        Schedule::from_peer(body.clone().into_bytes(), "n").unwrap(),
        leader
    );
    let zeros = body.replacen("\"timestamp\":0", "\"timestamp\":00", 1);
    let err = Schedule::from_peer(zeros.clone().into_bytes(), "n").unwrap_err();
    assert!(err.to_string().starts_with("not a schedule: "), "{err}");
    assert_ne!((target("schedule").run)(zeros.as_bytes()), "ok");
}

/// Two envelopes in the written form that the follower's reading and serde_json judged
/// differently (found by `make fuzz FUZZ_TARGETS=schedule`): a form feed after the envelope,
/// which serde_json refuses and the reading trimmed as whitespace; and a field after `data`,
/// which serde_json ignores and the reading took for part of the data, and refused.
#[test]
fn an_envelope_is_read_as_serde_json_reads_it_whatever_follows_the_data() {
    use verwalter_controllers::state::Schedule;
    let leader = Schedule::new(
        serde_json::json!({"nodes": {"n": {"roles": {}}}}),
        1,
        "01".into(),
    );
    let mut body = Vec::new();
    leader.write_json(&mut body);
    let body = String::from_utf8(body).unwrap();
    let fed = format!("{body}\x0c");
    let err = Schedule::from_peer(fed.clone().into_bytes(), "n").unwrap_err();
    assert!(err.to_string().starts_with("not a schedule: "), "{err}");
    assert!(Schedule::from_peer(format!("{body} \r\n\t").into_bytes(), "n").is_ok());
    let extra = body.replacen(",\"origin\":", ",\"extra\":{\"a\":[1]},\"origin\":", 1);
    assert_eq!(
        Schedule::from_peer(extra.clone().into_bytes(), "n").unwrap(),
        leader
    );
    for input in [fed, extra] {
        (target("schedule").run)(input.as_bytes()); // panics where the two disagree
    }
}

/// Schedule data `\n2` (a number after a newline) whose exact bytes hash to the claimed hash
/// was refused by a follower: not an object, so read the slow way, which hashed the value
/// without the whitespace around it. Data is taken however it is spaced when its bytes hash to
/// the hash, object or not, as serde_json parses it.
#[test]
fn spaced_data_that_hashes_to_its_hash_is_taken_whatever_the_value() {
    use verwalter_controllers::state::Schedule;
    for data in ["\n2", " [1] ", "\t{\"a\":1}\r\n", "\"x\""] {
        let hash = verwalter_controllers::schedule::hash::hash_canonical(data.as_bytes());
        let body =
            format!("{{\"timestamp\":1,\"hash\":\"{hash}\",\"data\":{data},\"origin\":\"x\"}}");
        let taken = Schedule::from_peer(body.into_bytes(), "n").unwrap();
        assert_eq!(taken.data.canonical(), data);
        assert_eq!(taken.hash, hash);
        let class = (target("schedule_data").run)(data.as_bytes());
        assert!(class == "object" || class == "other", "{class}");
    }
}

/// A `!Prometheus` timeout of 1e38 seconds in the scheduler's `metrics.yaml` panicked in
/// `Duration::from_secs_f64` while the file was read; now the file is refused with why.
#[test]
fn a_prometheus_timeout_beyond_any_duration_is_refused() {
    let class = (target("metrics_yaml").run)(
        b"prometheus: !Prometheus\n  host: L\n  port: 9090\n  timeout: 1e38\nqueries:\n  a: up\n",
    );
    assert!(
        class.contains("prometheus.timeout: invalid value")
            && class.contains("expected a number of seconds (0 or more, below 1e9)"),
        "{class}"
    );
}

/// The placement config's `reschedule_interval` and the Kubernetes API's `timeout` took any
/// number of seconds, and `u64::MAX` or 1e300 panicked when turned into a `Duration` (at load,
/// or when the data sources started); now the config is refused, naming the line.
#[test]
fn placement_waits_beyond_any_duration_are_refused_with_their_line() {
    let class = (target("placement_config").run)(
        b"algorithms:\n  fit: !Fit\n    dimensions: [cpu, mem]\nreschedule_interval: 18446744073709551615\n",
    );
    assert!(
        class.starts_with("config: reschedule_interval: invalid value")
            && class.ends_with("at line 4 column 22"),
        "{class}"
    );
    let class = (target("placement_config").run)(
        b"algorithm: !Fit\n  dimensions: [cpu, mem]\n  data_provider: !ClusterDataProvider\n    kubeapi: !Kubeapi\n      timeout: 1e300\n",
    );
    assert!(
        class.starts_with("config: algorithm.data_provider.kubeapi.timeout: invalid value")
            && class.ends_with("at line 5 column 16"),
        "{class}"
    );
}

/// A role named `cach$(web.node):$(we` with a reference among its variables had its `role`
/// variable resolved as a reference (`cachalpha:$(we`), and a role named `b$(nothing.x)` failed
/// with "finds nothing": the `role` variable, and `node` when no source sets it, are the literal
/// names; only the schedule's values are resolved.
#[test]
fn role_and_node_variables_are_never_resolved_as_references() {
    let data = serde_json::json!({"nodes": {"alpha": {"roles": {
        "web": {"template": "t", "port": 80},
        "cach$(web.node):$(we": {"template": "t", "p": "$(web.port)"},
        "b$(nothing.x)": {"template": "t", "q": "$(web.port)"},
    }}}});
    let check = verwalter_controllers::render::check_schedule(&data, "alpha");
    assert_eq!(check.roles.len(), 3);
    for (role, vars) in &check.roles {
        let vars = vars.as_ref().unwrap_or_else(|e| panic!("{role}: {e}"));
        assert_eq!(vars["role"], serde_json::json!(role));
        assert_eq!(vars["node"], "alpha");
    }
    let input = br#"{"nodes": {"alpha": {"roles": {"web": {"template": "t", "port": 80}, "cach$(web.node):$(we": {"template": "t", "p": "$(web.port)"}}}}}"#;
    assert_eq!((target("schedule_vars").run)(input), "ok");
}
