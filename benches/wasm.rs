//! WebAssembly scheduler versus Lua (issue 16): the placement scheduler of `benches/placement`
//! (Lua) and its Rust port compiled to wasm (`examples/wasm-scheduler`, the shipped module) on
//! the input of `benches/scheduler.rs` (1,000 peers, 100 roles with 3 versions each).
//!
//! Each run is what the `Scheduler` port does: Lua builds the state table, calls the script and
//! converts the result to JSON; wasm serializes the input to JSON, the module parses it,
//! schedules and writes its result JSON, which is parsed back. Rounds are interleaved so machine
//! drift hits both alike; medians (min, max) and the median of the back-to-back pair ratios.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use verwalter::schedule::lua::{Limits, Sandbox};
use verwalter::schedule::wasm::WasmRun;
use verwalter_controllers::state::{Peer, SchedulerInput};

const PEERS: usize = 1000;
const ROLES: usize = 100;
const ROUNDS: usize = 60;

/// The same input as `benches/scheduler.rs`.
fn input() -> SchedulerInput {
    let mut runtime = serde_json::Map::new();
    for r in 0..ROLES {
        let mut versions = serde_json::Map::new();
        for v in 1..=3 {
            versions.insert(
                format!("v{v}"),
                json!({"image": format!("role-{r:03}.v{v}"), "instances": 5 + r % 11, "cpu": 1 + r % 4, "memory": 2 + r % 8}),
            );
        }
        runtime.insert(format!("role-{r:03}"), Value::Object(versions));
    }
    let peers = (1..=PEERS)
        .map(|i| {
            let id = format!("77985419c732412ea38b94db{i:08x}");
            let peer = Peer {
                id: id.clone(),
                addr: Some(format!("10.0.{}.{}:8379", i / 250, i % 250)),
                name: format!("node-{i:04}.example.com"),
                hostname: format!("node-{i:04}"),
                schedule: None,
                known_since: 1_700_000_000_000,
                last_report_direct: Some(1_700_000_000_500),
                errors: 0,
            };
            (id, peer)
        })
        .collect();
    SchedulerInput {
        now: 1_700_000_001_000,
        current_host: "node-0000".into(),
        current_id: "77985419c732412ea38b94db00000000".into(),
        parents: vec![Arc::new(json!({"roles": {}, "nodes": {}}))],
        actions: BTreeMap::new(),
        runtime: Arc::new(Value::Object(runtime)),
        peers,
        metrics: json!({}),
        datacenters: None,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this once as a smoke test.
    let quick = !std::env::args().any(|a| a == "--bench");
    verwalter::schedule::lua::allocator::tune();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lua = Sandbox::load(
        &root.join("benches/placement/scheduler/v1"),
        "scheduler/v1",
        Limits::default(),
    )
    .expect("the Lua scheduler loads");
    let bytes = std::fs::read(root.join("examples/wasm-scheduler/scheduler/v1/scheduler.wasm"))
        .expect("the shipped module");
    let load_started = Instant::now();
    // The daemon's memory cap, and time enough to measure a slow run instead of stopping it.
    let limits = verwalter::schedule::wasm::WasmLimits {
        memory: Limits::default().memory,
        time: Duration::from_secs(60),
    };
    let mut wasm = WasmRun::from_bytes("scheduler.wasm", &bytes, limits).expect("the module loads");
    let load = load_started.elapsed();
    let input = input();

    let a = lua.run(&input).unwrap();
    lua.after_run();
    let started = Instant::now();
    let b = wasm.run(&input).unwrap();
    println!("first wasm run: {:.2} ms", ms(started.elapsed()));
    assert_eq!(a.data, b.data, "the two schedulers disagree");
    println!("schedule: {}", b.log);
    println!(
        "module: {} KiB, compiled in {:.2} ms",
        bytes.len() / 1024,
        ms(load)
    );

    let rounds = if quick { 3 } else { ROUNDS };
    let (mut lua_times, mut wasm_times, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        let out = lua.run(&input).unwrap();
        let l = started.elapsed();
        drop(out);
        lua.after_run();
        let started = Instant::now();
        let out = wasm.run(&input).unwrap();
        let w = started.elapsed();
        drop(out);
        lua_times.push(l);
        wasm_times.push(w);
        ratios.push(w.as_secs_f64() / l.as_secs_f64());
    }
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    ratios.sort_by(f64::total_cmp);
    let (lm, lmin, lmax) = stats(&mut lua_times);
    let (wm, wmin, wmax) = stats(&mut wasm_times);
    println!("summary ({rounds} interleaved rounds, {PEERS} peers, {ROLES} roles):");
    println!(
        "  lua  run median {:>8.2} ms  (min {:.2}, max {:.2})",
        ms(lm),
        ms(lmin),
        ms(lmax)
    );
    println!(
        "  wasm run median {:>8.2} ms  (min {:.2}, max {:.2})",
        ms(wm),
        ms(wmin),
        ms(wmax)
    );
    println!(
        "  wasm/lua per back-to-back pair: median {:.2} (quartiles {:.2}, {:.2})",
        ratios[ratios.len() / 2],
        ratios[ratios.len() / 4],
        ratios[ratios.len() * 3 / 4]
    );
}
