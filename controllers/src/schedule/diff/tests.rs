use serde_json::json;

use super::*;
use crate::refs::find_path;

fn change(path: &str, kind: ChangeKind, real: Option<Value>, shadow: Option<Value>) -> Change {
    Change {
        path: path.to_string(),
        kind,
        real,
        shadow,
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn schedule() -> Value {
    json!({
        "vars": {"cluster": "prod"},
        "roles": {
            "web": {"version": "v1", "ports": [80, 443]},
            "db": {"version": "v7"},
        },
        "nodes": {
            "alpha": {"roles": {"web": {}, "db": {"primary": true}}},
            "beta": {"roles": {"web": {}}},
        },
    })
}

#[test]
fn a_schedule_against_itself_is_identical_and_empty() {
    let d = diff(&schedule(), &schedule());
    assert!(d.is_empty());
    assert_eq!(d.paths_differing(), 0);
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        json!({
            "identical": true, "paths_differing": 0,
            "roles": {"added": [], "removed": [], "changed": []},
            "nodes": {"added": [], "removed": [], "changed": []},
            "changes": [], "truncated": false,
        })
    );
}

#[test]
fn a_changed_scalar_is_one_path_with_both_values_and_its_role_changed() {
    let mut shadow = schedule();
    shadow["roles"]["web"]["version"] = json!("v2");
    let d = diff(&schedule(), &shadow);
    assert!(!d.identical);
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        json!({
            "identical": false, "paths_differing": 1,
            "roles": {"added": [], "removed": [], "changed": ["web"]},
            "nodes": {"added": [], "removed": [], "changed": []},
            "changes": [{"path": "roles.web.version", "kind": "changed", "real": "v1", "shadow": "v2"}],
            "truncated": false,
        })
    );
}

#[test]
fn an_added_or_removed_subtree_is_one_change_holding_all_of_it() {
    let mut shadow = schedule();
    shadow["roles"]["cache"] = json!({"version": "v1", "size": {"mb": 64}});
    shadow["nodes"]["gamma"] = json!({"roles": {"cache": {}}});
    shadow["roles"].as_object_mut().unwrap().remove("db");
    shadow["nodes"]["alpha"]["roles"]
        .as_object_mut()
        .unwrap()
        .remove("db");
    let d = diff(&schedule(), &shadow);
    assert_eq!(
        d.changes,
        [
            change(
                "nodes.alpha.roles.db",
                ChangeKind::Removed,
                Some(json!({"primary": true})),
                None
            ),
            change(
                "nodes.gamma",
                ChangeKind::Added,
                None,
                Some(json!({"roles": {"cache": {}}}))
            ),
            change(
                "roles.cache",
                ChangeKind::Added,
                None,
                Some(json!({"version": "v1", "size": {"mb": 64}}))
            ),
            change(
                "roles.db",
                ChangeKind::Removed,
                Some(json!({"version": "v7"})),
                None
            ),
        ]
    );
    assert_eq!(d.paths_differing, 4);
    assert_eq!(d.roles.added, names(&["cache"]));
    assert_eq!(d.roles.removed, names(&["db"]));
    assert!(d.roles.changed.is_empty());
    assert_eq!(d.nodes.added, names(&["gamma"]));
    assert_eq!(d.nodes.changed, names(&["alpha"]));
    assert!(d.nodes.removed.is_empty());
    // The absent side is left out of the JSON, not written as null.
    let text = serde_json::to_value(&d.changes[1]).unwrap();
    assert_eq!(
        text,
        json!({"path": "nodes.gamma", "kind": "added", "shadow": {"roles": {"cache": {}}}})
    );
}

#[test]
fn a_role_moved_to_another_node_is_changed_though_its_variables_are_not() {
    let mut shadow = schedule();
    shadow["nodes"]["beta"]["roles"]
        .as_object_mut()
        .unwrap()
        .remove("web");
    shadow["nodes"]["beta"]["roles"]["db"] = json!({});
    let d = diff(&schedule(), &shadow);
    assert_eq!(d.roles.changed, names(&["db", "web"]));
    assert_eq!(d.nodes.changed, names(&["beta"]));
    assert_eq!(d.nodes.added, Vec::<String>::new());
    let paths: Vec<&str> = d.changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["nodes.beta.roles.db", "nodes.beta.roles.web"]);
}

#[test]
fn a_role_only_placed_on_a_node_is_a_role_too() {
    let real = json!({"nodes": {"a": {"roles": {"x": {}}}}});
    let shadow = json!({"nodes": {"a": {"roles": {"x": {}, "y": {}}}}});
    let d = diff(&real, &shadow);
    assert_eq!(d.roles.added, names(&["y"]));
    assert!(d.roles.changed.is_empty());
}

#[test]
fn nested_changes_are_listed_at_their_deepest_differing_path() {
    let real = json!({"a": {"b": {"c": {"d": 1, "e": 2}, "f": 3}}});
    let shadow = json!({"a": {"b": {"c": {"d": 1, "e": 5}, "f": 4}}});
    let d = diff(&real, &shadow);
    assert_eq!(
        d.changes,
        [
            change(
                "a.b.c.e",
                ChangeKind::Changed,
                Some(json!(2)),
                Some(json!(5))
            ),
            change("a.b.f", ChangeKind::Changed, Some(json!(3)), Some(json!(4))),
        ]
    );
}

#[test]
fn arrays_are_compared_by_index_and_a_length_change_adds_or_removes_elements() {
    let real = json!({"l": [1, {"k": "a"}, 3], "m": [1, 2, 3]});
    let shadow = json!({"l": [1, {"k": "b"}, 3, 4, [5]], "m": [1]});
    let d = diff(&real, &shadow);
    assert_eq!(
        d.changes,
        [
            change(
                "l.1.k",
                ChangeKind::Changed,
                Some(json!("a")),
                Some(json!("b"))
            ),
            change("l.3", ChangeKind::Added, None, Some(json!(4))),
            change("l.4", ChangeKind::Added, None, Some(json!([5]))),
            change("m.1", ChangeKind::Removed, Some(json!(2)), None),
            change("m.2", ChangeKind::Removed, Some(json!(3)), None),
        ]
    );
    // Indices come in numeric order, not as text ("l.10" after "l.9").
    let real = json!({"l": (0..12).collect::<Vec<_>>()});
    let shadow = json!({"l": (0..12).map(|i| i + 1).collect::<Vec<_>>()});
    let paths: Vec<String> = diff(&real, &shadow)
        .changes
        .into_iter()
        .map(|c| c.path)
        .collect();
    assert_eq!(paths, (0..12).map(|i| format!("l.{i}")).collect::<Vec<_>>());
}

#[test]
fn a_type_change_is_one_changed_path_with_both_values() {
    let real = json!({"a": {"x": 1, "y": 2}, "b": [1], "c": 1, "d": null, "e": 1});
    let shadow = json!({"a": [1, 2], "b": {"0": 1}, "c": "1", "d": false, "e": 1.0});
    let d = diff(&real, &shadow);
    let got: Vec<(&str, ChangeKind, Option<&Value>, Option<&Value>)> = d
        .changes
        .iter()
        .map(|c| (c.path.as_str(), c.kind, c.real.as_ref(), c.shadow.as_ref()))
        .collect();
    assert_eq!(
        got,
        [
            (
                "a",
                ChangeKind::Changed,
                Some(&json!({"x": 1, "y": 2})),
                Some(&json!([1, 2]))
            ),
            (
                "b",
                ChangeKind::Changed,
                Some(&json!([1])),
                Some(&json!({"0": 1}))
            ),
            ("c", ChangeKind::Changed, Some(&json!(1)), Some(&json!("1"))),
            (
                "d",
                ChangeKind::Changed,
                Some(&json!(null)),
                Some(&json!(false))
            ),
            // As the hash sees them: `1` and `1.0` are different schedules.
            ("e", ChangeKind::Changed, Some(&json!(1)), Some(&json!(1.0))),
        ]
    );
    // The whole document of another type is the empty path.
    let d = diff(&json!({}), &json!([]));
    assert_eq!(d.changes[0].path, "");
}

#[test]
fn a_null_value_survives_a_round_trip_through_json() {
    let d = diff(&json!({"a": null, "b": 1}), &json!({"a": 1}));
    let text = serde_json::to_string(&d).unwrap();
    let back: ScheduleDiff = serde_json::from_str(&text).unwrap();
    assert_eq!(back, d);
    assert_eq!(back.changes[0].real, Some(Value::Null));
    assert_eq!(back.changes[1].shadow, None);
}

#[test]
fn keys_with_special_characters_are_escaped_so_refs_finds_them() {
    let keys = [
        "host.example.com",
        "a\\b",
        "#(x)",
        "*?|@!",
        "q\"uote",
        "with space",
        "under_score-dash:colon",
        "ünï",
    ];
    let mut real = Map::new();
    let mut shadow = Map::new();
    for (i, key) in keys.iter().enumerate() {
        real.insert(key.to_string(), json!({"v": i}));
        shadow.insert(key.to_string(), json!({"v": i + 100}));
    }
    let (real, shadow) = (Value::Object(real), Value::Object(shadow));
    let d = diff(&real, &shadow);
    assert_eq!(d.changes.len(), keys.len());
    for c in &d.changes {
        assert_eq!(
            find_path(&shadow, &c.path).as_ref(),
            c.shadow.as_ref(),
            "{}",
            c.path
        );
        assert_eq!(find_path(&real, &c.path).as_ref(), c.real.as_ref());
    }
    let path_of = |key: &str| {
        let mut out = String::new();
        push_escaped(&mut out, key);
        out
    };
    assert_eq!(path_of("host.example.com"), "host\\.example\\.com");
    assert_eq!(path_of("under_score-dash:colon"), "under_score-dash:colon");
    assert_eq!(path_of("a\\b"), "a\\\\b");
}

#[test]
fn a_large_diff_lists_the_first_thousand_and_counts_them_all() {
    let real: Map<String, Value> = (0..3000)
        .map(|i| (format!("r{i:05}"), json!({"version": "v1"})))
        .collect();
    let mut shadow = real.clone();
    for i in 0..2500 {
        shadow[&format!("r{i:05}")]["version"] = json!("v2");
    }
    let real = json!({ "roles": real });
    let shadow = json!({ "roles": shadow });
    let d = diff(&real, &shadow);
    assert_eq!(d.paths_differing, 2500);
    assert_eq!(d.changes.len(), MAX_CHANGES);
    assert!(d.truncated);
    assert!(!d.identical);
    assert_eq!(d.changes[0].path, "roles.r00000.version");
    assert_eq!(d.changes[999].path, "roles.r00999.version");
    // The summary is not cut: every changed role is named.
    assert_eq!(d.roles.changed.len(), 2500);
    // Exactly the cap is not truncated.
    let mut shadow = real.clone();
    for i in 0..MAX_CHANGES {
        shadow["roles"][&format!("r{i:05}")]["version"] = json!("v3");
    }
    let d = diff(&real, &shadow);
    assert_eq!((d.changes.len(), d.truncated), (MAX_CHANGES, false));
}

#[test]
fn the_same_schedules_give_the_same_diff_whatever_order_their_keys_were_built_in() {
    let forward: Map<String, Value> = (0..50).map(|i| (format!("k{i}"), json!(i))).collect();
    let backward: Map<String, Value> = (0..50)
        .rev()
        .map(|i| (format!("k{i}"), json!(i * 2)))
        .collect();
    let a = diff(
        &Value::Object(forward.clone()),
        &Value::Object(backward.clone()),
    );
    let b = diff(&Value::Object(forward), &Value::Object(backward));
    assert_eq!(a, b);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    let paths: Vec<&str> = a.changes.iter().map(|c| c.path.as_str()).collect();
    let mut sorted = paths.clone();
    sorted.sort_unstable();
    assert_eq!(paths, sorted);
    assert_eq!(a.paths_differing, 49); // k0 is 0 on both sides
}

#[test]
fn a_role_is_changed_when_a_node_or_placement_holding_it_is_added_or_replaced_whole() {
    let real = json!({"roles": {"web": {}, "db": {}}, "nodes": {"a": {"roles": {"web": {}}}}});
    let cases = [
        // A new node runs web: one added path (nodes.b), and web runs elsewhere.
        json!({"roles": {"web": {}, "db": {}}, "nodes": {"a": {"roles": {"web": {}}}, "b": {"roles": {"web": {}}}}}),
        // Node a's roles replaced by another type.
        json!({"roles": {"web": {}, "db": {}}, "nodes": {"a": {"roles": ["web"]}}}),
        // No nodes at all.
        json!({"roles": {"web": {}, "db": {}}}),
        // `nodes` of another type.
        json!({"roles": {"web": {}, "db": {}}, "nodes": []}),
    ];
    for shadow in cases {
        let d = diff(&real, &shadow);
        assert_eq!(d.roles.changed, names(&["web"]), "{shadow}");
        assert_eq!(d.paths_differing, 1, "{shadow}");
    }
    // `roles` replaced whole: every role of either side that both know.
    let shadow = json!({"roles": {"web": {"v": 2}}, "nodes": {"a": {"roles": {"web": {}}}}});
    let d = diff(&real, &shadow);
    assert_eq!(d.roles.changed, names(&["web"]));
    assert_eq!(d.roles.removed, names(&["db"]));
    let shadow = json!({"roles": [], "nodes": {"a": {"roles": {"web": {}}}}});
    assert_eq!(diff(&real, &shadow).roles.changed, names(&["web"]));
    // Another type at the root: everything both sides name.
    let d = diff(&real, &json!([real.clone()]));
    assert_eq!((d.changes[0].path.as_str(), d.paths_differing), ("", 1));
    assert_eq!(d.roles.removed, names(&["db", "web"]));
    assert_eq!(d.nodes.removed, names(&["a"]));
}

#[test]
fn serde_json_maps_iterate_in_key_order_as_the_merge_of_keys_needs() {
    // The walk merges two maps' keys in step; with serde_json's `preserve_order` (insertion
    // order) it would pair the wrong keys.
    let map: Map<String, Value> = ["b", "c", "a"]
        .into_iter()
        .map(|k| (k.to_string(), json!(1)))
        .collect();
    assert_eq!(map.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
}
