use serde_json::json;

use super::*;
use crate::schedule::hash::schedule_hash;
use crate::state::Schedule;

/// Data received as `text` claiming `hash`, as a follower takes it: in one pass when it can
/// (an object that hashes to `hash`), else the slow way.
fn received(text: &str, hash: &str) -> ScheduleData {
    match ScheduleData::received(text.to_string(), 0..text.len(), hash, "nobody") {
        Ok(data) => data,
        Err(text) => ScheduleData::from_raw(RawValue::from_string(text).unwrap(), hash).unwrap(),
    }
}

/// Data as a follower holds it: the canonical text of `value`, with its hash; an object is not
/// parsed.
fn as_follower(value: &Value) -> ScheduleData {
    let text = String::from_utf8(canonical_json(value)).unwrap();
    let data = received(&text, &schedule_hash(value));
    assert_eq!(
        data.is_parsed(),
        !value.is_object(),
        "an object that hashes to its hash is kept unparsed"
    );
    data
}

/// Schedules with the shapes `node_view` and `all_roles` must get right: keys in and out of
/// the view, a host absent or not an object, escapes in keys, non-object `nodes` and `roles`.
fn samples() -> Vec<Value> {
    vec![
        json!({}),
        json!({"vars": {"a": 1}, "roles": {"web": {"v": 2}}, "changes": ["x"],
               "nodes": {"alpha": {"roles": {"web": {}}}, "beta": {"roles": {"db": {}}}},
               "state": {"big": [1, 2, {"nodes": {"alpha": 1}}]}}),
        json!({"nodes": {"beta": {"roles": {"db": {}}}}}),
        json!({"nodes": {"alpha": "not an object", "al\"pha": {"roles": {"q\u{e9}": 1}}}}),
        json!({"nodes": [1, 2, 3], "roles": "none", "vars": null}),
        json!({"nodes": {"alpha": null}, "roles": [], "changes": {"k": "v"}}),
        json!({"z": {"roles": {"hidden": 1}}, "nodes": {"alpha": {"vars": {"x": 1.5e300}}}}),
        json!([1, 2]),
        json!("text"),
        json!(null),
    ]
}

#[test]
fn data_made_here_is_canonical_and_already_parsed() {
    let value = json!({"b": 1, "a": {"d": [true, null], "c": "é"}});
    let data = ScheduleData::from_value(value.clone());
    assert_eq!(data.canonical().as_bytes(), canonical_json(&value));
    assert_eq!(data.hash(), schedule_hash(&value));
    assert!(data.is_parsed());
    assert_eq!(**data.tree(), value);
}

#[test]
fn received_text_with_its_hash_is_kept_as_is_and_parsed_only_when_read() {
    let value = samples()[1].clone();
    let data = as_follower(&value);
    assert_eq!(data.canonical().as_bytes(), canonical_json(&value));
    // Serving and storing do not parse it.
    let served = serde_json::to_string(&data).unwrap();
    assert_eq!(served, data.canonical());
    assert!(!data.is_parsed());
    assert_eq!(**data.tree(), value);
    assert!(data.is_parsed());
}

#[test]
fn received_text_formatted_otherwise_is_rewritten_canonically() {
    let value = json!({"b": [1, 2], "a": {"y": 1, "x": 2}});
    let pretty = serde_json::to_string_pretty(&value).unwrap();
    let data = received(&pretty, &schedule_hash(&value));
    assert_eq!(data.canonical().as_bytes(), canonical_json(&value));
    assert_eq!(data.hash(), schedule_hash(&value));
}

#[test]
fn a_wrong_hash_is_caught_by_verify_whatever_the_text() {
    let value = json!({"nodes": {"alpha": {}}});
    let wrong = "0".repeat(40);
    let envelope = json!({"timestamp": 1, "hash": wrong, "data": value, "origin": "x"});
    let schedule: Schedule = serde_json::from_value(envelope).unwrap();
    let error = schedule.verify().unwrap_err();
    assert_eq!(error.claimed, wrong);
    assert_eq!(error.actual, schedule_hash(&value));
}

#[test]
fn text_that_is_not_json_is_refused() {
    let body = r#"{"timestamp": 1, "hash": "aa", "data": {"a": }, "origin": "x"}"#;
    assert!(serde_json::from_str::<Schedule>(body).is_err());
}

#[test]
fn the_node_view_scanned_from_text_is_the_one_cut_from_the_tree() {
    for value in samples() {
        let tree = ScheduleData::from_value(value.clone());
        let text = as_follower(&value);
        for host in ["alpha", "beta", "al\"pha", "gamma"] {
            let from_tree = tree.node_view(host);
            assert_eq!(text.node_view(host), from_tree, "{value} for {host}");
            assert_eq!(text.is_parsed(), !value.is_object());
            // The view holds what role variables are made of, and nothing of other nodes.
            let expected_node = value.get("nodes").and_then(|n| n.get(host));
            assert_eq!(
                from_tree.get("nodes").and_then(|n| n.get(host)),
                expected_node
            );
            for key in VIEW_KEYS {
                assert_eq!(from_tree.get(*key), value.get(*key), "{key} of {value}");
            }
            let others = from_tree
                .get("nodes")
                .and_then(Value::as_object)
                .map_or(0, |n| n.keys().filter(|k| *k != host).count());
            assert_eq!(others, 0);
        }
    }
}

#[test]
fn role_variables_from_the_node_view_are_those_from_the_whole_schedule() {
    let value = json!({"vars": {"a": 1, "template": "t/v1"}, "roles": {"web": {"v": 2}},
                       "nodes": {"alpha": {"vars": {"b": 3}, "roles": {"web": {"c": 4}}},
                                 "beta": {"roles": {"db": {}}}}});
    let view = as_follower(&value).node_view("alpha");
    assert_eq!(crate::render::vars::node_roles(&view, "alpha"), ["web"]);
    let vars = crate::render::vars::role_vars(&view, "alpha", "web").unwrap();
    assert_eq!(
        vars,
        crate::render::vars::role_vars(&value, "alpha", "web").unwrap()
    );
    assert_eq!(
        (
            vars["a"].clone(),
            vars["v"].clone(),
            vars["b"].clone(),
            vars["c"].clone()
        ),
        (json!(1), json!(2), json!(3), json!(4))
    );
}

#[test]
fn all_roles_scanned_from_text_are_those_of_the_tree() {
    for value in samples() {
        let text = as_follower(&value);
        assert_eq!(
            *text.all_roles(),
            crate::render::vars::all_roles(&value),
            "{value}"
        );
        assert_eq!(text.is_parsed(), !value.is_object());
        assert_eq!(
            *ScheduleData::from_value(value.clone()).all_roles(),
            crate::render::vars::all_roles(&value)
        );
    }
    let value = samples()[1].clone();
    let names: Vec<String> = as_follower(&value).all_roles().iter().cloned().collect();
    assert_eq!(names, ["db", "web"]);
}

#[test]
fn a_key_given_twice_keeps_its_last_value_as_the_tree_does() {
    let text = r#"{"vars":{"a":1},"nodes":{"alpha":{"x":1},"alpha":{"x":2}},"vars":{"a":2}}"#;
    let hash = crate::schedule::hash::hash_canonical(text.as_bytes());
    let data = received(text, &hash);
    let view = data.node_view("alpha");
    assert_eq!(
        view,
        json!({"vars": {"a": 2}, "nodes": {"alpha": {"x": 2}}})
    );
    assert_eq!(data.node_view("alpha"), project(data.tree(), "alpha"));
}

#[test]
fn schedules_compare_and_print_by_their_text() {
    let a = ScheduleData::from_value(json!({"n": 1}));
    let b = as_follower(&json!({"n": 1}));
    assert_eq!(a, b);
    assert_ne!(a, ScheduleData::from_value(json!({"n": 2})));
    assert_eq!(format!("{a:?}"), r#"ScheduleData({"n":1})"#);
    let big = ScheduleData::from_value(json!({"s": "é".repeat(300)}));
    let printed = format!("{big:?}");
    assert!(
        printed.ends_with(&format!("… {} bytes)", big.len())),
        "{printed}"
    );
    assert!(printed.len() < 300);
}

#[test]
fn an_envelope_round_trips_through_json_and_json_values() {
    let schedule = Schedule::new(samples()[1].clone(), 7, "ab".repeat(16));
    let text = serde_json::to_string(&schedule).unwrap();
    let back: Schedule = serde_json::from_str(&text).unwrap();
    back.verify().unwrap();
    assert_eq!(back, schedule);
    assert!(back.data.is_parsed(), "serde's way parses it");
    let value = serde_json::to_value(&schedule).unwrap();
    assert_eq!(value["data"], samples()[1]);
    let again: Schedule = serde_json::from_value(value).unwrap();
    again.verify().unwrap();
    assert_eq!(again, schedule);
}

/// An envelope as `Schedule::write_json` writes it.
fn written(schedule: &Schedule) -> Vec<u8> {
    let mut out = Vec::new();
    schedule.write_json(&mut out);
    out
}

#[test]
fn an_envelope_written_here_is_read_in_one_pass_with_the_view_cut() {
    let schedule = Schedule::new(samples()[1].clone(), 1_700_000_000_123, "ab".repeat(16));
    let body = written(&schedule);
    assert_eq!(
        body,
        serde_json::to_vec(&schedule).unwrap(),
        "serde's form too"
    );
    for body in [body.clone(), [body.as_slice(), b"\n"].concat()] {
        let read = Schedule::from_peer(body, "alpha").unwrap();
        assert_eq!(read, schedule);
        assert_eq!(
            read.data.node_view("alpha"),
            schedule.data.node_view("alpha")
        );
        assert!(!read.data.is_parsed(), "nor parsed to cut the view");
    }
}

#[test]
fn other_forms_of_an_envelope_are_read_the_slow_way() {
    let data = json!({"nodes": {"alpha": {"roles": {"web": {}}}}, "vars": {"a": [1, 2.5]}});
    let schedule = Schedule::new(data.clone(), 5, "77985419c732412ea38b94db00000001".into());
    let pretty = serde_json::to_vec_pretty(&schedule).unwrap();
    let reordered = serde_json::to_vec(&json!({"origin": schedule.origin, "data": data,
        "hash": schedule.hash, "timestamp": 5}))
    .unwrap();
    let odd_origin = Schedule {
        origin: "a\"b".into(),
        ..schedule.clone()
    };
    for (body, expected) in [
        (pretty, &schedule),
        (reordered, &schedule),
        (written(&odd_origin), &odd_origin),
    ] {
        let read = Schedule::from_peer(body, "alpha").unwrap();
        assert_eq!(&read, expected);
        assert_eq!(
            read.data.node_view("alpha"),
            expected.data.node_view("alpha")
        );
    }
    // Data that is not an object is a schedule still (the slow way keeps it).
    let list = Schedule::new(json!([1, 2]), 5, "ab".repeat(16));
    assert_eq!(Schedule::from_peer(written(&list), "alpha").unwrap(), list);
}

#[test]
fn a_forged_or_broken_envelope_is_refused_with_the_reason() {
    let schedule = Schedule::new(samples()[1].clone(), 5, "ab".repeat(16));
    let body = String::from_utf8(written(&schedule)).unwrap();
    let forged = body.replace("\"a\":1", "\"a\":2");
    assert_ne!(forged, body);
    let err = Schedule::from_peer(forged.into_bytes(), "alpha").unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "schedule hash mismatch: envelope says {}",
            schedule.hash
        )),
        "{err}"
    );
    // Text that hashes to the hash but is not JSON: refused, not taken unread.
    let broken = "{\"a\":}";
    let hash = crate::schedule::hash::hash_canonical(broken.as_bytes());
    let body =
        format!("{{\"timestamp\":5,\"hash\":\"{hash}\",\"data\":{broken},\"origin\":\"x\"}}");
    let err = Schedule::from_peer(body.into_bytes(), "alpha").unwrap_err();
    assert!(err.to_string().starts_with("not a schedule: "), "{err}");
    // Not UTF-8.
    let mut bytes = written(&schedule);
    let at = bytes.windows(3).position(|w| w == b"\"a\"").unwrap();
    bytes[at + 1] = 0xff;
    let err = Schedule::from_peer(bytes, "alpha").unwrap_err();
    assert!(err.to_string().starts_with("not a schedule: "), "{err}");
    for junk in [&b""[..], b"{", b"{\"timestamp\":1,\"hash\":\"", b"null"] {
        assert!(Schedule::from_peer(junk.to_vec(), "alpha").is_err());
    }
}

/// A body vouched for by the hash its maker announced is taken without hashing its data, but
/// only as the schedule the vouch names, and only if it is JSON.
#[test]
fn a_vouched_body_skips_the_data_hash_and_nothing_else() {
    let schedule = Schedule::new(samples()[1].clone(), 5, "ab".repeat(16));
    let body = String::from_utf8(written(&schedule)).unwrap();
    let maker = [schedule.origin.clone()];
    let read =
        Schedule::from_vouched_peer(body.clone().into_bytes(), "alpha", &schedule.hash, &maker);
    let read = read.unwrap();
    assert_eq!(read, schedule);
    assert_eq!(
        read.data.node_view("alpha"),
        schedule.data.node_view("alpha")
    );
    // The vouch stands for the hash: altered bytes vouched for are taken as they are (their
    // maker announced them), but vouched for another schedule they are checked, and refused.
    let altered = body.replace("\"a\":1", "\"a\":2");
    let taken = Schedule::from_vouched_peer(
        altered.clone().into_bytes(),
        "alpha",
        &schedule.hash,
        &maker,
    );
    assert_eq!(taken.unwrap().data.canonical(), {
        let at = altered.find("\"data\":").unwrap() + 7;
        &altered[at..altered.rfind(",\"origin\"").unwrap()]
    });
    let other = "cd".repeat(20);
    let err = Schedule::from_vouched_peer(altered.clone().into_bytes(), "alpha", &other, &maker)
        .unwrap_err();
    assert!(
        err.to_string().starts_with("schedule hash mismatch"),
        "{err}"
    );
    // A node vouches only for its own schedules: vouched for by another, the bytes are checked.
    let someone = ["cd".repeat(16)];
    let err = Schedule::from_vouched_peer(altered.into_bytes(), "alpha", &schedule.hash, &someone);
    assert!(
        err.unwrap_err()
            .to_string()
            .starts_with("schedule hash mismatch"),
        "another maker"
    );
    // Vouched-for text that is not JSON is refused all the same.
    for bad in ["{\"a\":}", r#"{"a":"\ud800"}"#] {
        let body = format!(
            "{{\"timestamp\":5,\"hash\":\"{}\",\"data\":{bad},\"origin\":\"{}\"}}",
            schedule.hash, schedule.origin
        );
        let err = Schedule::from_vouched_peer(body.into_bytes(), "alpha", &schedule.hash, &maker);
        assert!(err.is_err(), "{bad} taken");
    }
}

/// serde_json checks a value it skips (`RawValue`, `IgnoredAny`) less than one it parses: a lone
/// surrogate (`\ud800`) or nesting deeper than its limit passes the first and fails the second.
/// Such text must never be kept unread, or reading it later would fail.
#[test]
fn text_that_would_not_parse_is_refused_however_it_comes() {
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    for bad in [
        r#"{"a":"\ud800","nodes":{"alpha":{"x":1}}}"#.to_string(),
        format!(r#"{{"a":{deep},"nodes":{{"alpha":{{"x":1}}}}}}"#),
        format!(r#"{{"nodes":{{"beta":{deep},"alpha":{{"x":1}}}}}}"#),
    ] {
        let hash = crate::schedule::hash::hash_canonical(bad.as_bytes());
        assert!(
            serde_json::from_str::<Box<RawValue>>(&bad).is_ok(),
            "serde skips it"
        );
        assert!(ScheduleData::received(bad.clone(), 0..bad.len(), &hash, "alpha").is_err());
        let raw = RawValue::from_string(bad.clone()).unwrap();
        assert!(ScheduleData::from_raw(raw, &hash).is_err());
        let body =
            format!("{{\"timestamp\":5,\"hash\":\"{hash}\",\"data\":{bad},\"origin\":\"x\"}}");
        let err = Schedule::from_peer(body.into_bytes(), "alpha").unwrap_err();
        assert!(err.to_string().starts_with("not a schedule: "), "{err}");
    }
    // A surrogate pair is a character; text that hashes as it came is kept as it came.
    let pair = r#"{"a":"\ud83d\ude00"}"#;
    let hash = crate::schedule::hash::hash_canonical(pair.as_bytes());
    let data = ScheduleData::received(pair.to_string(), 0..pair.len(), &hash, "alpha").unwrap();
    assert_eq!(data.canonical(), pair);
    assert_eq!(data.tree()["a"], "\u{1f600}");
}

/// What the one-pass check takes and refuses is serde_json's, at every edge of the grammar, and
/// the view it cuts is the one cut from the tree.
#[test]
fn the_one_pass_check_agrees_with_serde_json_at_the_edges() {
    let nest = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    let mut texts: Vec<String> = [
        r#"{}"#,
        r#" { } "#,
        "{\t\"a\"\r\n:\n1}",
        "\u{feff}{}",
        " \x0c{}",
        r#"{"a":1} x"#,
        r#"{"a":1,}"#,
        r#"{"a":[1,]}"#,
        r#"{,}"#,
        r#"{"a" 1}"#,
        r#"{"a":}"#,
        r#"{a:1}"#,
        r#"{"a":1 "b":2}"#,
        r#"{"a":[1 2]}"#,
        r#"{"a":{"b":1]}"#,
        r#"{"a":[1}"#,
        r#"[]"#,
        r#"1"#,
        r#"{"a":-0}"#,
        r#"{"a":01}"#,
        r#"{"a":-01}"#,
        r#"{"a":1.}"#,
        r#"{"a":.5}"#,
        r#"{"a":-}"#,
        r#"{"a":+1}"#,
        r#"{"a":1e}"#,
        r#"{"a":1e+}"#,
        r#"{"a":1E+2}"#,
        r#"{"a":0.5e-3}"#,
        r#"{"a":1e400}"#,
        r#"{"a":-1e400}"#,
        r#"{"a":0e999999}"#,
        r#"{"a":1e-99999}"#,
        r#"{"a":123456789012345678901234567890}"#,
        r#"{"a":1.7976931348623157e308}"#,
        r#"{"a":tru}"#,
        r#"{"a":true}"#,
        r#"{"a":nul}"#,
        r#"{"a":nulll}"#,
        r#"{"a":falsey}"#,
        r#"{"a":"\ud800"}"#,
        r#"{"a":"\udc00"}"#,
        r#"{"a":"\ud800\u0041"}"#,
        r#"{"a":"\ud800\n"}"#,
        r#"{"a":"\ud83d\ude00"}"#,
        r#"{"a":"\uDBFF\uDFFF"}"#,
        r#"{"a":"\u00e9\/\b\f\n\r\t\"\\"}"#,
        r#"{"a":"\x"}"#,
        r#"{"a":"\u12G4"}"#,
        r#"{"a":"\u123"}"#,
        "{\"a\":\"\u{7f}\u{e9}\u{1f600}\"}",
        "{\"a\":\"\t\"}",
        "{\"a\":\"\u{1f}\"}",
        r#"{"a":"unterminated}"#,
        r#"{"a":"12345678\"9abcdef"}"#,
        r#"{"no\u0064es":{"alpha":{"x":1}},"v\u0061rs":{"y":2}}"#,
        r#"{"nodes":{"alph\u0061":{"x":1}}}"#,
        r#"{"nodes":{"alpha":{"x":1}},"nodes":{"beta":{}}}"#,
        r#"{"nodes":{"alpha":{"x":1}},"nodes":[1]}"#,
        r#"{"nodes":{"alpha":1,"alpha":{"x":2}},"vars":1,"vars":{"v":3},"roles":{},"changes":[]}"#,
    ]
    .into_iter()
    .map(String::from)
    .collect();
    // serde_json nests 127 containers, not 128: the limit at the top, under `nodes`, in the
    // node's own entry and elsewhere.
    for n in [125, 126, 127, 128] {
        texts.push(nest(n));
        texts.push(format!(r#"{{"a":{}}}"#, nest(n - 1)));
        texts.push(format!(r#"{{"vars":{}}}"#, nest(n - 1)));
        texts.push(format!(r#"{{"nodes":{{"alpha":{}}}}}"#, nest(n - 2)));
        texts.push(format!(r#"{{"nodes":{{"beta":{}}}}}"#, nest(n - 2)));
        texts.push(format!(
            r#"{{"x":{}}}"#,
            "{\"a\":".repeat(n - 1) + "1" + &"}".repeat(n - 1)
        ));
    }
    for text in &texts {
        let parsed = serde_json::from_str::<Value>(text);
        let cut = super::cut_view(text, "alpha");
        match &parsed {
            Ok(tree) if tree.is_object() => {
                let cut = cut.unwrap_or_else(|| panic!("refused what serde takes: {text:?}"));
                assert_eq!(
                    Value::Object(cut),
                    super::project(tree, "alpha"),
                    "{text:?}"
                );
            }
            _ => assert!(
                cut.is_none(),
                "took what serde refuses: {text:?} ({parsed:?})"
            ),
        }
    }
}

#[test]
fn the_view_cut_on_arrival_is_put_together_canonical() {
    for value in samples().into_iter().filter(Value::is_object) {
        let text = String::from_utf8(canonical_json(&value)).unwrap();
        for host in ["alpha", "beta", "al\"pha", "nobody"] {
            let data =
                ScheduleData::received(text.clone(), 0..text.len(), &schedule_hash(&value), host)
                    .unwrap();
            let view = data.node_view_data(host);
            let expected = project(&value, host);
            assert_eq!(**view.tree(), expected, "{value} for {host}");
            assert_eq!(
                view.canonical().as_bytes(),
                canonical_json(&expected),
                "{value} for {host}"
            );
        }
    }
}

#[test]
fn a_view_cut_from_vouched_text_holds_each_roles_canonical_text() {
    let mut values = samples();
    values.push(
        json!({"roles": {"web": {"v": [1, {"b": 2, "a": "x"}]}, "d\"b": {}, "e": null},
                       "nodes": {"alpha": {"roles": {"web": {}}}}}),
    );
    for value in values.into_iter().filter(Value::is_object) {
        let text = String::from_utf8(canonical_json(&value)).unwrap();
        let data = ScheduleData::received_vouched(text.clone(), 0..text.len(), "alpha").unwrap();
        let view = data.node_view_data("alpha");
        let roles = value.get("roles").and_then(Value::as_object);
        // Text that only hashes to its hash may be spaced: its roles' text is not noted.
        let hashed =
            ScheduleData::received(text.clone(), 0..text.len(), &schedule_hash(&value), "alpha")
                .unwrap();
        assert_eq!(hashed.node_view_data("alpha").role_text("web"), None);
        for role in ["web", "d\"b", "e", "db", "nobody"] {
            let expected = roles
                .and_then(|r| r.get(role))
                .map(|v| String::from_utf8(canonical_json(v)).unwrap());
            assert_eq!(
                view.role_text(role).map(str::to_string),
                expected,
                "{value}: {role}"
            );
        }
        assert_eq!(data.role_text("web"), None, "only a view holds them");
    }
}

#[test]
fn a_vouched_view_leaves_a_roles_big_own_values_as_text() {
    let big = |tag: &str| -> Value {
        (0..800)
            .map(|i| {
                (
                    format!("s{i:03}"),
                    json!({"image": format!("{tag}:{i}"), "n": i}),
                )
            })
            .collect::<Map<String, Value>>()
            .into()
    };
    let value = json!({
        "vars": {"template": "t/v1"},
        "roles": {
            "web": {"services": big("a"), "small": [1, 2], "depends_on": big("b"),
                    "refs": {"x": "$(db.port)", "pad": big("c")}, "esc\"aped": big("d"),
                    "template": "web/v1"},
            "db": {"port": 5432},
            "e\"sc": {"big": big("e")}
        },
        "nodes": {"alpha": {"roles": {"web": {}, "db": {}, "e\"sc": {}}}}
    });
    let text = String::from_utf8(canonical_json(&value)).unwrap();
    assert!(canonical_json(&big("a")).len() >= UNPARSED_MIN);
    let data = ScheduleData::received_vouched(text.clone(), 0..text.len(), "alpha").unwrap();
    let view = data.node_view_data("alpha");
    assert!(!view.is_parsed(), "the tree is parsed on first use only");
    let skeleton = view.skeleton().clone();
    let web = &skeleton["roles"]["web"];
    // Big values are null in the skeleton and kept as their text; the ones the controller
    // reads or that hold references are parsed, as is everything small.
    assert_eq!(web["services"], Value::Null);
    assert_eq!(web["esc\"aped"], Value::Null);
    assert_eq!(web["depends_on"], value["roles"]["web"]["depends_on"]);
    assert_eq!(web["refs"], value["roles"]["web"]["refs"]);
    assert_eq!(web["small"], json!([1, 2]));
    assert_eq!(skeleton["roles"]["db"], json!({"port": 5432}));
    assert_eq!(skeleton["roles"]["e\"sc"], json!({"big": null}));
    let unparsed = view.unparsed("web");
    let keys: Vec<&str> = unparsed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["esc\"aped", "services"]);
    for (key, part) in &unparsed {
        let want = &value["roles"]["web"][key];
        assert_eq!(part.text().as_bytes(), canonical_json(want), "{key}");
        assert_eq!(&part.parse(), want, "{key}");
    }
    assert_eq!(view.unparsed("e\"sc").len(), 1);
    assert!(view.unparsed("db").is_empty() && view.unparsed("nobody").is_empty());
    // Everything else is as before: the tree, the text, the roles' texts.
    let mut expected = value.clone();
    expected["nodes"] = json!({"alpha": value["nodes"]["alpha"]});
    assert_eq!(**view.tree(), expected);
    assert_eq!(view.canonical().as_bytes(), canonical_json(&expected));
    assert_eq!(
        view.role_text("web").unwrap().as_bytes(),
        canonical_json(&value["roles"]["web"])
    );
    // Text that is only hashed is not known to be canonical: nothing is left as text.
    let hashed =
        ScheduleData::received(text.clone(), 0..text.len(), &schedule_hash(&value), "alpha")
            .unwrap()
            .node_view_data("alpha");
    assert!(hashed.unparsed("web").is_empty());
    assert_eq!(hashed.skeleton(), &expected);
}

#[test]
fn the_arrival_check_writes_the_tape_of_each_value_kept_as_text() {
    // Every kind of value, nested, empty and escaped, repeated past UNPARSED_MIN.
    let odd = json!({
        "a": [], "b": {}, "c": [[], [{}], {"x": [1, -2.5, 3e-7, 0]}],
        "d": "quote \" backslash \\ tab \t newline \n ü €", "e": true, "f": false, "g": null,
        "h": [null, "", {"": ""}], "i": -0.0, "j": 12345678901234567890u64
    });
    let big = (0..300)
        .map(|i| (format!("k{i:03}"), odd.clone()))
        .collect::<Map<String, Value>>();
    let value = json!({
        "roles": {"web": {"services": big, "list": vec![odd.clone(); 300], "small": odd}},
        "nodes": {"alpha": {"roles": {"web": {}}}}
    });
    let text = String::from_utf8(canonical_json(&value)).unwrap();
    let data = ScheduleData::received_vouched(text.clone(), 0..text.len(), "alpha").unwrap();
    let view = data.node_view_data("alpha");
    let unparsed = view.unparsed("web");
    let keys: Vec<&str> = unparsed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["list", "services"]);
    for (key, part) in &unparsed {
        let written = part
            .tape
            .get()
            .expect("written on arrival, not on first use");
        assert_eq!(*written, json_text::tape(part.text()), "{key}");
        // Shared by every part handed out for it.
        let again = view.unparsed("web");
        let same = again.iter().find(|(k, _)| k == key).unwrap();
        assert!(Arc::ptr_eq(&same.1.tape, &part.tape), "{key}");
    }
}

#[test]
fn dropped_text_buffers_are_kept_for_the_next_texts_the_biggest_two() {
    let mut spare = Vec::new();
    for size in [100, 300, 200] {
        give_spare(&mut spare, Vec::with_capacity(size));
    }
    let mut kept: Vec<usize> = spare.iter().map(Vec::capacity).collect();
    kept.sort_unstable();
    assert_eq!(kept, [200, 300]);
    assert!(spare.iter().all(Vec::is_empty));
    // A schedule's text and its view's each take one that fits, while one does.
    assert!(take_spare(&mut spare, 301).is_none());
    assert_eq!(take_spare(&mut spare, 250).map(|b| b.capacity()), Some(300));
    assert_eq!(take_spare(&mut spare, 150).map(|b| b.capacity()), Some(200));
    assert!(take_spare(&mut spare, 1).is_none());
}

/// The leader's own schedule (data this node wrote) gives its node view as a follower's vouched
/// view does: cut from the text without parsing the whole, roles' texts noted, big values kept
/// as text; data read from elsewhere is projected from its tree as before.
#[test]
fn data_written_here_has_its_view_cut_from_the_text() {
    let services: Value = (0..800)
        .map(|i| (format!("s{i:03}"), json!({"image": format!("i:{i}")})))
        .collect::<Map<String, Value>>()
        .into();
    let mut values = samples();
    values.push(
        json!({"vars": {"template": "t/v1"}, "roles": {"web": {"services": services}},
                       "nodes": {"alpha": {"roles": {"web": {}}}, "beta": {"x": 1}}}),
    );
    for value in values {
        let text = String::from_utf8(canonical_json(&value)).unwrap();
        let vouched = ScheduleData::received_vouched(text.clone(), 0..text.len(), "alpha");
        for data in [
            ScheduleData::from_canonical(text.clone()),
            ScheduleData::from_value(value.clone()),
        ] {
            let view = data.node_view_data("alpha");
            assert_eq!(**view.tree(), data.node_view("alpha"), "{value}");
            assert_eq!(view.canonical().as_bytes(), canonical_json(view.tree()));
            let Ok(vouched) = &vouched else {
                continue; // Not an object at the top: projected.
            };
            let vouched = vouched.node_view_data("alpha");
            assert_eq!(view.role_text("web"), vouched.role_text("web"), "{value}");
            let keys = |d: &ScheduleData| -> Vec<String> {
                d.unparsed("web").into_iter().map(|(k, _)| k).collect()
            };
            assert_eq!(keys(&view), keys(&vouched), "{value}");
        }
        let canonical = ScheduleData::from_canonical(text.clone());
        let _ = canonical.node_view_data("alpha");
        assert!(!canonical.is_parsed(), "{value}: the whole is not parsed");
    }
    let big = values_with_big_role();
    let data = ScheduleData::from_canonical(String::from_utf8(canonical_json(&big)).unwrap());
    let view = data.node_view_data("alpha");
    assert_eq!(view.unparsed("web").len(), 1);
    // Read from the disk (or a peer that formats otherwise): projected from the tree.
    let read = ScheduleData::from_text(data.canonical(), &data.hash()).unwrap();
    let view = read.node_view_data("alpha");
    assert!(view.unparsed("web").is_empty() && view.role_text("web").is_none());
    assert_eq!(**view.tree(), read.node_view("alpha"));
}

fn values_with_big_role() -> Value {
    let services: Value = (0..800)
        .map(|i| (format!("s{i:03}"), json!({"image": format!("i:{i}")})))
        .collect::<Map<String, Value>>()
        .into();
    json!({"roles": {"web": {"services": services}}, "nodes": {"alpha": {"roles": {"web": {}}}}})
}
