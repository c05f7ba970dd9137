//! A stand-in for ernest's cloud connectors: publishes a build (`build.create` or, for a build
//! whose `action` is `delete`, `build.delete`), answers every dispatch at once with `.done` and
//! a few made-up fields, prints what it sees, and exits with the build's result.
//!
//! `cargo run -p ernest-fake-worker -- nats://127.0.0.1:4222 examples/graphs/ernest-service/build.json`

use std::process::ExitCode;

use futures::StreamExt;
use serde_json::{Value, json};

/// What the fake cloud fills in, by component type.
fn outputs(kind: &str, name: &str) -> Value {
    match kind {
        "network" => json!({"network_aws_id": format!("subnet-{name}")}),
        "firewall" => json!({"security_group_aws_id": format!("sg-{name}")}),
        "instance" => {
            let n: u8 = name
                .rsplit('-')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            json!({"instance_aws_id": format!("i-{name}"), "ip": format!("10.0.1.{}", 10 + n)})
        }
        "elb" => json!({"dns_name": format!("{name}.example")}),
        _ => json!({}),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(file)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: ernest_fake_worker NATS_URL BUILD.json");
        return ExitCode::from(2);
    };
    let build: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let id = build["id"].as_str().unwrap_or_default().to_string();
    let action = build["action"].as_str().unwrap_or("create");
    let client = async_nats::connect(url.as_str()).await.unwrap();
    // Dispatches have three tokens; `build.<action>.done|error` too, and end the run.
    let mut messages = client.subscribe("*.*.*").await.unwrap();
    client.flush().await.unwrap();
    let subject = format!("build.{action}");
    client
        .publish(subject.clone(), serde_json::to_vec(&build).unwrap().into())
        .await
        .unwrap();
    println!("-> {subject} {id}");
    while let Some(m) = messages.next().await {
        let mut payload: Value = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
        if m.subject.starts_with("build.") {
            if payload["id"] != id.as_str() {
                continue;
            }
            println!("<- {}", m.subject);
            println!("{}", serde_json::to_string_pretty(&payload).unwrap());
            return if m.subject.ends_with(".done") {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        let cid = payload["_component_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (kind, name) = cid.split_once("::").unwrap_or((&cid, ""));
        println!("<- {} {cid}", m.subject);
        for (k, v) in outputs(kind, name).as_object().unwrap() {
            payload[k] = v.clone();
        }
        client
            .publish(
                format!("{}.done", m.subject),
                serde_json::to_vec(&payload).unwrap().into(),
            )
            .await
            .unwrap();
    }
    ExitCode::FAILURE
}
