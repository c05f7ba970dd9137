//! What a follower spends taking a 1 MiB schedule, step by step (issue 15): the schedule has
//! the shape of the cluster benchmark's (2,406 service definitions spread over 100 nodes'
//! `app` roles, written canonically by `Schedule::write_json`).
//!
//! - `inflate`: the `x-verwalter-lz4` body inflated;
//! - `read_hashed`: the envelope read as a body nothing vouches for: the data's SHA-1 against
//!   the schedule hash, and the one-pass check that cuts this node's view;
//! - `read_vouched`: the same body vouched for by the hash the leader's ping announced: the
//!   LZ4 body's SHA-1 against it, then the check alone (`cluster::vouch::read`);
//! - `sha1_data`, `scan_only`: the two halves of `read_hashed` (the check is
//!   `read_vouched` without the body's hash).
//!
//! Run: `cargo bench --bench take`.

use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::{Map, Value, json};
use verwalter::cluster::coding::Coding;
use verwalter::cluster::vouch::{Announced, body_sha1, read};
use verwalter_controllers::state::Schedule;

const SERVICES: usize = 2406;
const NODES: usize = 100;
const HOST: &str = "node-042";

/// About a megabyte of service definitions, each node's share under `nodes.<host>.roles.app`.
fn schedule() -> Schedule {
    let mut nodes = Map::new();
    for n in 0..NODES {
        nodes.insert(
            format!("node-{n:03}"),
            json!({"roles": {"app": {"services": {}}}}),
        );
    }
    let mut x: u64 = 12345;
    for i in 1..=SERVICES {
        x = (x * 1_103_515_245 + 12345) % 2_147_483_648;
        let service = json!({
            "image": format!("registry.example.com/platform/service-{i}:1.0.{}", i % 17),
            "replicas": i % 7 + 1, "memory_mb": 256 + (i % 16) * 64, "cpu_shares": 100 + i % 900,
            "args": ["--listen", format!("0.0.0.0:{}", 8000 + i), "--log-level", "info",
                     "--config", format!("/etc/services/service-{i}.yaml")],
            "env": {"RUST_LOG": "info", "REGION": format!("eu-{}", i % 3),
                    "SHARD": (i % 64).to_string(),
                    "UPSTREAM": format!("http://upstream-{}.internal:8080/api/v2", i % 40)},
            "checksum": format!("{x:08x}{:08x}{:08x}{:08x}", (x * 7) % (1 << 32),
                                (x * 13 + i as u64) % (1 << 32), (x * 31) % (1 << 32)),
            "owner": format!("team-{}", i % 23),
            "description": format!("Service {i} of the benchmark fleet"),
        });
        let host = format!("node-{:03}", i % NODES);
        nodes[&host]["roles"]["app"]["services"]
            .as_object_mut()
            .unwrap()
            .insert(format!("service-{i}"), service);
    }
    let data = json!({"vars": {"template": "app/v1", "v": 1, "leader": "node-000"},
                      "nodes": Value::Object(nodes)});
    Schedule::new(
        data,
        1_700_000_000_000,
        "77985419c732412ea38b94db00000001".into(),
    )
}

fn bench(c: &mut Criterion) {
    let schedule = schedule();
    let mut body = Vec::new();
    schedule.write_json(&mut body);
    let lz4 = Coding::Lz4.encode(&body);
    let announced = Announced::default();
    announced.note(&schedule.hash, &schedule.origin, body_sha1(&lz4));
    let data = schedule.data.canonical().to_string();
    let makers = [schedule.origin.clone()];
    println!(
        "schedule {:.1} KiB, as x-verwalter-lz4 {:.1} KiB",
        body.len() as f64 / 1024.0,
        lz4.len() as f64 / 1024.0
    );

    let mut group = c.benchmark_group("take");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(3));
    group.bench_function("inflate", |b| {
        b.iter(|| Coding::Lz4.decode(lz4.clone().into(), 64 << 20).unwrap())
    });
    // The body's copy (the inflated text a read takes) is made outside the timing.
    let copy = || body.clone();
    group.bench_function("read_hashed", |b| {
        b.iter_batched(
            copy,
            |body| Schedule::from_peer(body, HOST).unwrap(),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("read_vouched", |b| {
        b.iter_batched(
            copy,
            |body| {
                let (taken, vouched) =
                    read(&announced, &schedule.hash, Coding::Lz4, &lz4, body, HOST).unwrap();
                assert!(vouched);
                taken
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("sha1_data", |b| {
        b.iter(|| verwalter_controllers::schedule::hash::hash_canonical(data.as_bytes()))
    });
    group.bench_function("scan_only", |b| {
        b.iter_batched(
            copy,
            |body| Schedule::from_vouched_peer(body, HOST, &schedule.hash, &makers).unwrap(),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
