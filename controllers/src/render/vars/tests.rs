use serde_json::{Value, json};

use super::*;

const HOST: &str = "alpha";
const ROLE: &str = "web";

/// The four sources in precedence order (lowest first), as paths into the schedule.
const SOURCES: [&[&str]; 4] = [
    &["vars"],
    &["roles", ROLE],
    &["nodes", HOST, "vars"],
    &["nodes", HOST, "roles", ROLE],
];

/// A schedule where `web` is assigned to `alpha` and each source `i` holds `values[i]`.
fn schedule_with(values: [Option<Value>; 4]) -> Value {
    let mut data = json!({"nodes": {HOST: {"roles": {ROLE: {}}}}});
    for (path, value) in SOURCES.iter().zip(values) {
        let Some(value) = value else { continue };
        let mut at = &mut data;
        for key in *path {
            at = at
                .as_object_mut()
                .unwrap()
                .entry(key.to_string())
                .or_insert_with(|| json!({}));
        }
        for (k, v) in value.as_object().unwrap() {
            at.as_object_mut().unwrap().insert(k.clone(), v.clone());
        }
    }
    data
}

fn vars_for(values: [Option<Value>; 4]) -> Map<String, Value> {
    let mut values = values;
    // Every role needs a template; put it at the lowest level so it never interferes.
    let base = values[0].get_or_insert_with(|| json!({}));
    base.as_object_mut()
        .unwrap()
        .insert("template".into(), json!("web/v1"));
    role_vars(&schedule_with(values), HOST, ROLE).unwrap()
}

fn pairs() -> impl Iterator<Item = (usize, usize)> {
    (0..4).flat_map(|lo| (lo + 1..4).map(move |hi| (lo, hi)))
}

#[test]
fn later_source_wins_for_every_pair() {
    for (lo, hi) in pairs() {
        let mut values: [Option<Value>; 4] = Default::default();
        values[lo] = Some(json!({"color": format!("from {lo}"), "only_lo": lo}));
        values[hi] = Some(json!({"color": format!("from {hi}"), "only_hi": hi}));
        let vars = vars_for(values);
        assert_eq!(
            vars["color"],
            json!(format!("from {hi}")),
            "pair {lo} < {hi}"
        );
        assert_eq!(vars["only_lo"], json!(lo), "pair {lo} < {hi}");
        assert_eq!(vars["only_hi"], json!(hi), "pair {lo} < {hi}");
    }
}

#[test]
fn objects_merge_one_level_and_deeper_values_are_replaced_whole() {
    for (lo, hi) in pairs() {
        let mut values: [Option<Value>; 4] = Default::default();
        values[lo] = Some(json!({"common": {
            "shared": "lo", "lo_key": 1, "deep": {"a": 1, "b": 1}
        }}));
        values[hi] = Some(json!({"common": {
            "shared": "hi", "hi_key": 2, "deep": {"b": 2}
        }}));
        let vars = vars_for(values);
        assert_eq!(
            vars["common"],
            json!({"shared": "hi", "lo_key": 1, "hi_key": 2, "deep": {"b": 2}}),
            "pair {lo} < {hi}"
        );
    }
}

#[test]
fn an_object_and_a_scalar_do_not_merge_the_later_wins() {
    for (lo, hi) in pairs() {
        let mut values: [Option<Value>; 4] = Default::default();
        values[lo] = Some(json!({"x": {"a": 1}, "y": 5}));
        values[hi] = Some(json!({"x": "plain", "y": {"b": 2}}));
        let vars = vars_for(values);
        assert_eq!(vars["x"], json!("plain"), "pair {lo} < {hi}");
        assert_eq!(vars["y"], json!({"b": 2}), "pair {lo} < {hi}");
    }
}

#[test]
fn all_four_sources_fold_in_order() {
    let vars = vars_for([
        Some(json!({"k": {"a": 0, "b": 0, "c": 0, "d": 0}})),
        Some(json!({"k": {"b": 1, "c": 1, "d": 1}})),
        Some(json!({"k": {"c": 2, "d": 2}})),
        Some(json!({"k": {"d": 3}})),
    ]);
    assert_eq!(vars["k"], json!({"a": 0, "b": 1, "c": 2, "d": 3}));
}

#[test]
fn role_and_node_are_added_node_only_when_unset() {
    let vars = vars_for(Default::default());
    assert_eq!(vars["role"], json!(ROLE));
    assert_eq!(vars["node"], json!(HOST));
    let vars = vars_for([
        None,
        Some(json!({"node": "custom", "role": "ignored"})),
        None,
        None,
    ]);
    assert_eq!(vars["node"], json!("custom"));
    assert_eq!(vars["role"], json!(ROLE), "`role` always names the role");
}

#[test]
fn pass_values_are_added_and_left_out_of_the_hash() {
    let data = schedule_with([Some(json!({"template": "t", "a": 1})), None, None, None]);
    let vars = role_vars(&data, HOST, ROLE).unwrap();
    let full = with_pass(vars.clone(), "abc", "2026-01-01T00:00:00Z", Some(&data));
    assert_eq!(full["deployment_id"], json!("abc"));
    assert_eq!(full["verwalter_version"], json!(VERWALTER_VERSION));
    assert_eq!(full["full_schedule"], data);
    let again = with_pass(
        vars.clone(),
        "other",
        "2027-01-01T00:00:00Z",
        Some(&json!({})),
    );
    assert!(!with_pass(vars, "x", "y", None).contains_key("full_schedule"));
    let encode = |m: &Map<String, Value>| {
        let mut out = Vec::new();
        write_hashed_source(Some(m), &mut out);
        String::from_utf8(out).unwrap()
    };
    assert_eq!(encode(&full), encode(&again));
    assert!(encode(&full).contains("\"a\":1"));
}

#[test]
fn roles_rendered_on_a_node_are_its_own() {
    let data = json!({
        "roles": {"global_only": {}, "web": {}},
        "nodes": {
            "alpha": {"roles": {"web": {}, "db": {}}},
            "beta": {"roles": {"cache": {}}},
        }
    });
    assert_eq!(node_roles(&data, "alpha"), vec!["db", "web"]);
    assert_eq!(node_roles(&data, "gamma"), Vec::<String>::new());
    assert_eq!(
        all_roles(&data).into_iter().collect::<Vec<_>>(),
        vec!["cache", "db", "global_only", "web"]
    );
    assert!(node_roles(&json!({"nodes": {"alpha": {"roles": []}}}), "alpha").is_empty());
}

#[test]
fn unsafe_role_names_are_refused_with_a_reason() {
    for bad in [
        "", "..", ".", ".global", "a/b", "../etc", "a\\b", "a\nb", "x\u{0}",
    ] {
        let data = json!({"vars": {"template": "t"}, "nodes": {HOST: {"roles": {bad: {}}}}});
        let err = role_vars(&data, HOST, bad).unwrap_err();
        assert_eq!(err.role, bad);
        assert!(err.message.contains("role name"), "{bad:?}: {err}");
    }
    for good in ["web", "app-2", "my_role.v2", "ünïcode"] {
        assert!(unsafe_role_name(good).is_none(), "{good}");
    }
}

#[test]
fn template_must_be_a_safe_relative_path() {
    for bad in ["/etc", "../x", "a/../b", "a//b", ".hidden", "a/./b", ""] {
        let data = json!({"vars": {"template": bad}, "nodes": {HOST: {"roles": {ROLE: {}}}}});
        let err = role_vars(&data, HOST, ROLE).unwrap_err();
        assert!(err.message.contains("template"), "{bad:?}: {err}");
    }
    let data = json!({"nodes": {HOST: {"roles": {ROLE: {}}}}});
    assert!(
        role_vars(&data, HOST, ROLE)
            .unwrap_err()
            .message
            .contains("no `template`")
    );
    let data = json!({"vars": {"template": 5}, "nodes": {HOST: {"roles": {ROLE: {}}}}});
    assert!(
        role_vars(&data, HOST, ROLE)
            .unwrap_err()
            .message
            .contains("must be a string")
    );
}

#[test]
fn a_source_that_is_not_an_object_is_named() {
    let data = json!({"vars": {"template": "t"}, "roles": {ROLE: [1]},
        "nodes": {HOST: {"roles": {ROLE: {}}}}});
    let err = role_vars(&data, HOST, ROLE).unwrap_err();
    assert_eq!(
        err.message,
        "schedule field `roles.web` must be an object, got an array"
    );
    // null counts as empty (a scheduler writing `web = nil` into JSON as null)
    let data = json!({"vars": {"template": "t"}, "nodes": {HOST: {"roles": {ROLE: null}}}});
    assert!(role_vars(&data, HOST, ROLE).is_ok());
}

/// Issue 29: an empty table may come out of a scheduler as `[]` as well as `{}` (Lua cannot
/// tell them apart): an empty array where a source's object goes is an empty source.
#[test]
fn an_empty_array_as_a_source_is_an_empty_source() {
    let data = json!({"vars": {"template": "t"}, "roles": {ROLE: []},
        "nodes": {HOST: {"vars": [], "roles": {ROLE: []}}}});
    let vars = role_vars(&data, HOST, ROLE).unwrap();
    assert_eq!(vars["template"], "t");
    let data = json!({"vars": [], "nodes": {HOST: {"roles": {ROLE: {"template": "t"}}}}});
    assert!(role_vars(&data, HOST, ROLE).is_ok());
}

#[test]
fn secrets_are_masked_at_any_depth_and_any_case() {
    let vars = json!({
        "PASSWORD": "a", "list": [{"SecretKey": "b"}], "keys": ["c"], "plain": "d",
        "full_schedule": {"nodes": {}}, "api_Token": {"x": 1}
    });
    let shown = serde_json::to_value(MaskedVars(vars.as_object().unwrap())).unwrap();
    assert_eq!(
        shown,
        json!({"PASSWORD": "***", "list": [{"SecretKey": "***"}], "keys": "***", "plain": "d",
               "full_schedule": FULL_SCHEDULE_SHOWN, "api_Token": "***"})
    );
}

#[test]
fn templates_may_read_what_they_name_or_reach_without_a_name() {
    let may = |text: &str| templates_may_read([text], "services");
    for text in [
        "{{#each services}}{{@key}}{{/each}}",
        "{% for s in services %}{% endfor %}",
        "a line about services, outside any tag",
        "{{#each this}}{{@key}}{{/each}}",
        "{{#each .}}x{{/each}}",
        "{{.}}",
        "{{ lookup @root name }}",
        "{{#with vars}}{{../x}}{{/with}}",
        "{{#each a}}{{#each ..}}{{/each}}{{/each}}",
        "{{ __tera_context }}",
        "{{> partial this}}",
        "{% set all = __tera_context %}",
        "{{ 1.5 }} {{ \"1.\" }}",
    ] {
        assert!(may(text), "{text}");
    }
    for text in [
        "",
        "v = {{v}} from {{leader}}\n",
        "{{#each hosts}}{{name}}.{{domain}} {{/each}}",
        "{{ a.b }} {{ a.[0] }} {{ 1.5 }} {{#if (eq x 1)}}y{{/if}}",
        "{% for h in hosts %}{{ h.name | upper }}{% endfor %}",
        "this is only text. ../ and . outside tags {{x}}",
    ] {
        assert!(!may(text), "{text}");
    }
    assert!(templates_may_read(["{{x}}", "{{services}}"], "services"));
    assert!(!templates_may_read(Vec::<&str>::new(), "services"));
}
