//! ernest's templating against upstream's expectations (`tests/data/ernest/templating.json`,
//! each case naming its source in ernestio/scheduler v3.16.0).

use serde_json::{Value, json};

use super::*;
use crate::ernest::{Build, component_id};

const CASES: &str = include_str!("../../../../tests/data/ernest/templating.json");
const IMPORT_GRAPH: &str = include_str!("../../../../tests/data/ernest/fixtures/import-graph.json");

fn fixture(name: &str) -> &'static str {
    match name {
        "import-graph.json" => IMPORT_GRAPH,
        other => panic!("no fixture {other}"),
    }
}

#[test]
fn upstreams_templating_cases_hold() {
    let cases: Value = serde_json::from_str(CASES).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for case in cases {
        let name = format!("{} / {}", case["source"], case["test"]);
        let (doc, value) = match case["fixture"].as_str() {
            // As the executor does it: the whole build is the document, the change the value.
            Some(file) => {
                let build: Build = serde_json::from_str(fixture(file)).unwrap();
                let wanted = case["component"].as_str().unwrap();
                let change = build
                    .changes
                    .iter()
                    .find(|c| component_id(c) == Some(wanted))
                    .unwrap()
                    .clone();
                (serde_json::to_value(&build).unwrap(), Value::Object(change))
            }
            None => (case["doc"].clone(), case["value"].clone()),
        };
        let out = template(&doc, &value);
        for (key, expected) in case["expect"].as_object().unwrap() {
            assert_eq!(&out[key], expected, "{name}: {key}");
        }
        if case["fixture"].is_null() {
            assert_eq!(&out, &case["expect"], "{name}");
        }
    }
}

#[test]
fn a_chain_that_comes_back_leaves_the_string_as_it_was() {
    let doc = json!({"a": "$(b)", "b": "$(a)", "c": "$(c)"});
    assert_eq!(template(&doc, &json!("$(a)")), json!("$(a)"));
    assert_eq!(template(&doc, &json!("$(c)")), json!("$(c)"));
}

#[test]
fn gjson_text_is_plain_decimal_through_a_float() {
    assert_eq!(gjson_text(&json!(5432)), "5432");
    assert_eq!(gjson_text(&json!(0.1)), "0.1");
    assert_eq!(gjson_text(&json!(1e-7)), "0.0000001");
    // Beyond 2^53 an integer goes through a 64-bit float, as gjson reads it.
    assert_eq!(gjson_text(&json!(9007199254740993u64)), "9007199254740992");
    assert_eq!(gjson_text(&Value::Null), "");
}
