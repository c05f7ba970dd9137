use serde_json::json;

use super::*;

fn resolve(value: Value, doc: &Value) -> Result<Value, RefError> {
    Resolver::new(doc).resolve(&value, "")
}

#[test]
fn a_whole_reference_keeps_the_type_and_an_embedded_one_becomes_text() {
    let doc = json!({"db": {"port": 5432, "host": "10.0.0.5", "tags": ["a"], "none": null}});
    assert_eq!(resolve(json!("$(db.port)"), &doc), Ok(json!(5432)));
    assert_eq!(resolve(json!("$(db.tags)"), &doc), Ok(json!(["a"])));
    assert_eq!(
        resolve(
            json!({"url": "postgres://$(db.host):$(db.port)/x$(db.none)"}),
            &doc
        ),
        Ok(json!({"url": "postgres://10.0.0.5:5432/x"}))
    );
    assert_eq!(
        resolve(json!(["$(db.tags)!"]), &doc),
        Ok(json!(["[\"a\"]!"]))
    );
}

#[test]
fn a_reference_to_a_value_that_is_itself_templated_is_resolved_first() {
    let doc = json!({
        "db": {"port": 5432, "url": "db:$(db.port)"},
        "app": {"database": "$(db.url)", "dsn": "tcp://$(app.database)"}
    });
    assert_eq!(
        resolve(json!("$(app.dsn)"), &doc),
        Ok(json!("tcp://db:5432"))
    );
}

#[test]
fn a_cycle_through_templating_is_an_error_naming_the_chain() {
    let doc = json!({"a": {"x": "$(b.y)"}, "b": {"y": "pre-$(a.x)"}});
    assert_eq!(
        resolve(json!({"v": "$(a.x)"}), &doc),
        Err(RefError::Cycle {
            chain: vec!["a.x".into(), "b.y".into(), "a.x".into()]
        })
    );
    assert_eq!(
        resolve(json!("$(a.x)"), &doc).unwrap_err().to_string(),
        "reference cycle: $(a.x) -> $(b.y) -> $(a.x)"
    );
}

#[test]
fn unknown_roots_are_left_alone_and_missing_paths_under_known_ones_are_errors() {
    let doc = json!({"db": {"port": 1}});
    assert_eq!(
        resolve(json!("echo $(date) $(db.port)"), &doc),
        Ok(json!("echo $(date) 1"))
    );
    assert_eq!(
        resolve(json!({"cmd": {"x": "$(db.host)"}}), &doc),
        Err(RefError::NotFound {
            at: "cmd.x".into(),
            path: "db.host".into()
        })
    );
    assert_eq!(
        resolve(json!("$(db..port)"), &doc).unwrap_err().to_string(),
        ": $(db..port) is not a valid path: an empty key (two dots, or a dot at an end)"
    );
    assert_eq!(
        resolve(json!("half $(db.port"), &doc),
        Ok(json!("half $(db.port"))
    );
}

#[test]
fn gjson_queries_pick_array_elements() {
    let doc = json!({
        "components": [
            {"_component_id": "network::web", "range": "10.1.0.0/24", "size": 2},
            {"_component_id": "instance::web-1", "ip": "10.1.0.11", "size": 4},
            {"_component_id": "instance::web-2", "ip": "10.1.0.12", "size": 8},
        ],
        "dotted": {"a.b": 7}
    });
    let cases = [
        (
            r#"$(components.#(_component_id=="network::web").range)"#,
            json!("10.1.0.0/24"),
        ),
        (
            r#"$(components.#[_component_id="instance::web-2"].ip)"#,
            json!("10.1.0.12"),
        ),
        (
            r#"$(components.#(size>3)#.ip)"#,
            json!(["10.1.0.11", "10.1.0.12"]),
        ),
        (r#"$(components.#(size<=2).range)"#, json!("10.1.0.0/24")),
        (r#"$(components.#(size!=2)#.size)"#, json!([4, 8])),
        ("$(components.#)", json!(3)),
        ("$(components.1.ip)", json!("10.1.0.11")),
        ("$(components.#.size)", json!([2, 4, 8])),
        (r"$(dotted.a\.b)", json!(7)),
    ];
    for (text, want) in cases {
        assert_eq!(resolve(json!(text), &doc), Ok(want), "{text}");
    }
    assert!(matches!(
        resolve(json!(r#"$(components.#(name=="nope").ip)"#), &doc),
        Err(RefError::NotFound { .. })
    ));
    assert!(matches!(
        resolve(json!("$(components.#(size).ip)"), &doc),
        Err(RefError::Syntax { .. })
    ));
}

#[test]
fn has_refs_finds_nested_references() {
    assert!(has_refs(&json!({"a": [1, {"b": "x$(c)"}]})));
    assert!(!has_refs(&json!({"a": [1, {"b": "x$c"}]})));
}

#[test]
fn json_text_that_may_hold_references_is_found_in_one_pass() {
    for text in [
        r#"{"a":"$(web.port)"}"#,
        r#"{"a":"price $5","b":"x$(y)"}"#,
        r#"{"a":"\u0024(web.port)"}"#,
        r#"{"a":"\\u"}"#,
    ] {
        assert!(json_may_hold_refs(text), "{text}");
    }
    for text in [
        r#"{"a":"$","b":"("}"#,
        r#"{"a":"\\n\"","b":"$ (x)"}"#,
        r#"{"a":"ends with $"}"#,
        r#"{"a":"ends with \\"}"#,
        "",
        "$",
    ] {
        assert!(!json_may_hold_refs(text), "{text}");
    }
}
