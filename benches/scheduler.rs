//! Scheduler round benchmark: 1,000 peers, 100 roles with 3 versions each, and a Lua placement
//! scheduler (`benches/placement`).
//!
//! - `lua_only`: the scheduler function alone, called on a pre-built `state` table;
//! - `full_round`: state built -> Lua -> canonical JSON text -> hashed -> persisted (a schedule
//!   slot rewritten in place with one fdatasync, then `schedule.json` renamed without a flush).
//!
//! After criterion, a same-run summary prints medians (min, max) of both and their ratio.
//!
//! With `SHADOW=1`, a last summary (issue 34): the full round alone, interleaved with the full
//! round while a shadow of the same cost (the same scheduler, its own Lua state) runs on a
//! thread of its own, as when a real round comes while the previous round's shadow still runs.
//!
//! `library_*`: the same input and round with `benches/placement/library`, a scheduler that
//! places the roles with one `placement.place` call (wca's LeastUsedBAR) instead of its own
//! loop; after criterion, a summary of its medians next to the hand-written scheduler's.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use serde_json::{Value, json};
use verwalter::schedule::lua::{Limits, Sandbox};
use verwalter::storage::state_dir::StateDir;
use verwalter_controllers::state::{Peer, Schedule, ScheduleStamp, SchedulerInput};

const PEERS: usize = 1000;
const ROLES: usize = 100;
/// Interleaved rounds of the same-run summary.
const ROUNDS: usize = 100;

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
                schedule: Some(ScheduleStamp {
                    timestamp: 1_700_000_000_000,
                    hash: "a".repeat(40),
                    origin: "77985419c732412ea38b94db00000000".into(),
                }),
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

fn sandbox() -> Sandbox {
    sandbox_in("benches/placement/scheduler/v1")
}

fn sandbox_in(dir: &str) -> Sandbox {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    Sandbox::load(&dir, "scheduler/v1", Limits::default()).expect("bench scheduler loads")
}

fn lua_only(sandbox: &Sandbox, input: &SchedulerInput) {
    // The state table is built outside the timed part: the benchmark times the Lua alone.
    let state = sandbox.input_table(input).unwrap();
    let started = Instant::now();
    let results = sandbox.call(state).unwrap();
    LAST.with(|c| c.set(started.elapsed()));
    drop(results);
}

thread_local! {
    static LAST: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

fn full_round(sandbox: &Sandbox, input: &SchedulerInput, store: &StateDir) -> Schedule {
    let output = sandbox.run(input).unwrap();
    let schedule = Schedule::from_data(output.data, input.now, input.current_id.clone());
    store.save_schedule(&schedule).unwrap();
    schedule
}

fn bench(c: &mut Criterion) {
    // As the daemon does at start.
    verwalter::schedule::lua::allocator::tune();
    let sandbox = sandbox();
    let input = input();
    let tmp = tempfile::tempdir().unwrap();
    let store = StateDir::new(tmp.path());
    let check = full_round(&sandbox, &input, &store);
    let placed: usize = check.data.tree()["nodes"].as_object().map_or(0, |n| {
        n.values()
            .map(|v| v["roles"].as_object().unwrap().len())
            .sum()
    });
    eprintln!(
        "bench schedule: {placed} instances over {} nodes, {} bytes of canonical JSON, hash {}",
        check.data.tree()["nodes"].as_object().unwrap().len(),
        check.data.len(),
        check.hash
    );

    let mut group = c.benchmark_group("scheduler");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(8));
    group.bench_function("lua_only", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                lua_only(&sandbox, &input);
                total += LAST.with(|c| c.get());
                sandbox.after_run();
            }
            total
        })
    });
    group.bench_function("full_round", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                full_round(&sandbox, &input, &store);
                total += started.elapsed();
                sandbox.after_run();
            }
            total
        })
    });
    group.finish();

    // Same-run summary, interleaved so machine drift hits both alike.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        lua_only(&sandbox, &input);
        a.push(LAST.with(|c| c.get()));
        sandbox.after_run();
        let started = Instant::now();
        full_round(&sandbox, &input, &store);
        b.push(started.elapsed());
        sandbox.after_run();
    }
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    // Each (a, b) pair runs back to back, so it sees the same machine speed; the median of the
    // pair ratios is robust to the machine switching speed during the run.
    let mut pair_ratios: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(a, b)| b.as_secs_f64() / a.as_secs_f64())
        .collect();
    pair_ratios.sort_by(f64::total_cmp);
    let (am, amin, amax) = stats(&mut a);
    let (bm, bmin, bmax) = stats(&mut b);
    println!("summary ({ROUNDS} interleaved rounds):");
    println!(
        "  (a) lua_only   median {:>7.2} ms  (min {:.2}, max {:.2})",
        ms(am),
        ms(amin),
        ms(amax)
    );
    println!(
        "  (b) full_round median {:>7.2} ms  (min {:.2}, max {:.2})",
        ms(bm),
        ms(bmin),
        ms(bmax)
    );
    println!(
        "  ratio (b)/(a) of medians: {:.3}",
        bm.as_secs_f64() / am.as_secs_f64()
    );
    println!(
        "  ratio (b)/(a) per back-to-back pair: median {:.3} (quartiles {:.3}, {:.3})",
        pair_ratios[pair_ratios.len() / 2],
        pair_ratios[pair_ratios.len() / 4],
        pair_ratios[pair_ratios.len() * 3 / 4]
    );
    breakdown(&sandbox, &input, &store);
    if std::env::var_os("SHADOW").is_some_and(|v| v == "1") {
        with_shadow(&sandbox, &input, &store);
    }
}

/// The full round alone (a) and while a same-cost shadow runs on another thread (b),
/// interleaved: medians and the ratio of each back-to-back pair.
fn with_shadow(sandbox: &Sandbox, input: &SchedulerInput, store: &StateDir) {
    let (jobs, rx) = std::sync::mpsc::channel::<Arc<SchedulerInput>>();
    let (done_tx, done) = std::sync::mpsc::channel::<Duration>();
    std::thread::spawn(move || {
        let shadow = sandbox_in("benches/placement/scheduler/v1");
        while let Ok(input) = rx.recv() {
            let started = Instant::now();
            shadow.run(&input).unwrap();
            let took = started.elapsed();
            shadow.after_run();
            let _ = done_tx.send(took);
        }
    });
    let shared = Arc::new(input.clone());
    let (mut alone, mut beside, mut shadow_took) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let started = Instant::now();
        full_round(sandbox, input, store);
        alone.push(started.elapsed());
        sandbox.after_run();
        jobs.send(shared.clone()).unwrap();
        let started = Instant::now();
        full_round(sandbox, input, store);
        beside.push(started.elapsed());
        sandbox.after_run();
        shadow_took.push(done.recv().unwrap());
    }
    let mut pairs: Vec<f64> = alone
        .iter()
        .zip(&beside)
        .map(|(a, b)| b.as_secs_f64() / a.as_secs_f64())
        .collect();
    pairs.sort_by(f64::total_cmp);
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    println!("with a shadow of the same cost ({ROUNDS} interleaved pairs, SHADOW=1):");
    println!(
        "  (a) full_round alone          median {:>7.2} ms",
        ms(median(&mut alone))
    );
    println!(
        "  (b) full_round beside shadow  median {:>7.2} ms",
        ms(median(&mut beside))
    );
    println!(
        "  the shadow's run              median {:>7.2} ms",
        ms(median(&mut shadow_took))
    );
    println!(
        "  ratio (b)/(a) per back-to-back pair: median {:.3} (quartiles {:.3}, {:.3})",
        pairs[pairs.len() / 2],
        pairs[pairs.len() / 4],
        pairs[pairs.len() * 3 / 4]
    );
}

/// Median time of each step of the full round, to see where time beyond the Lua goes.
fn breakdown(sandbox: &Sandbox, input: &SchedulerInput, store: &StateDir) {
    let mut steps: [Vec<Duration>; 6] = Default::default();
    for _ in 0..21 {
        let t = Instant::now();
        let state = sandbox.input_table(input).unwrap();
        steps[0].push(t.elapsed());
        let t = Instant::now();
        let raw = sandbox.call(state).unwrap();
        steps[1].push(t.elapsed());
        let t = Instant::now();
        let output = sandbox.output(raw).unwrap();
        steps[2].push(t.elapsed());
        let t = Instant::now();
        let schedule = Schedule::from_data(output.data, input.now, input.current_id.clone());
        steps[3].push(t.elapsed());
        let t = Instant::now();
        store.save_schedule(&schedule).unwrap();
        steps[4].push(t.elapsed());
        // Not part of (b): after the round, as the scheduler thread does once the schedule is
        // handed over (checks of the reused tables, a full collection).
        let t = Instant::now();
        sandbox.after_run();
        steps[5].push(t.elapsed());
    }
    let names = [
        "build state table",
        "Lua call",
        "Lua -> JSON text",
        "hash (SHA-1)",
        "persist (fsync)",
        "after_run, not in (b)",
    ];
    println!("  breakdown of the full round (medians of 21):");
    for (name, v) in names.iter().zip(steps.iter_mut()) {
        v.sort();
        println!("    {name:<21} {:>7.3} ms", ms(v[v.len() / 2]));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Instances in a schedule: the roles on every node.
fn instances(schedule: &Schedule) -> usize {
    schedule.data.tree()["nodes"].as_object().map_or(0, |n| {
        n.values()
            .map(|v| v["roles"].as_object().unwrap().len())
            .sum()
    })
}

/// The round with `placement.place` doing the bin packing, next to the hand-written scheduler.
fn bench_library(c: &mut Criterion) {
    verwalter::schedule::lua::allocator::tune();
    let library = sandbox_in("benches/placement/library/scheduler/v1");
    let by_hand = sandbox();
    let input = input();
    let tmp = tempfile::tempdir().unwrap();
    let store = StateDir::new(tmp.path());
    let check = full_round(&library, &input, &store);
    let out = library.run(&input).unwrap();
    eprintln!(
        "library schedule: {} instances over {} nodes ({}), hash {}",
        instances(&check),
        check.data.tree()["nodes"].as_object().unwrap().len(),
        out.log,
        check.hash
    );
    library.after_run();

    let mut group = c.benchmark_group("scheduler");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(8));
    group.bench_function("library_lua_only", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                lua_only(&library, &input);
                total += LAST.with(|c| c.get());
                library.after_run();
            }
            total
        })
    });
    group.bench_function("library_full_round", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                full_round(&library, &input, &store);
                total += started.elapsed();
                library.after_run();
            }
            total
        })
    });
    group.finish();

    // Interleaved with the hand-written scheduler, so both see the same machine speed.
    let mut rounds: [Vec<Duration>; 3] = Default::default();
    for _ in 0..ROUNDS / 2 {
        lua_only(&library, &input);
        rounds[0].push(LAST.with(|c| c.get()));
        library.after_run();
        let started = Instant::now();
        full_round(&library, &input, &store);
        rounds[1].push(started.elapsed());
        library.after_run();
        let started = Instant::now();
        full_round(&by_hand, &input, &store);
        rounds[2].push(started.elapsed());
        by_hand.after_run();
    }
    let mut pair_ratios: Vec<f64> = rounds[1]
        .iter()
        .zip(&rounds[2])
        .map(|(d, b)| d.as_secs_f64() / b.as_secs_f64())
        .collect();
    pair_ratios.sort_by(f64::total_cmp);
    println!("summary ({} interleaved rounds):", ROUNDS / 2);
    for (name, v) in [
        "(c) library_lua_only  ",
        "(d) library_full_round",
        "(b) full_round (hand) ",
    ]
    .iter()
    .zip(rounds.iter_mut())
    {
        v.sort();
        println!(
            "  {name} median {:>7.2} ms  (min {:.2}, max {:.2})",
            ms(v[v.len() / 2]),
            ms(v[0]),
            ms(v[v.len() - 1])
        );
    }
    println!(
        "  ratio (d)/(b) per back-to-back pair: median {:.3} (quartiles {:.3}, {:.3})",
        pair_ratios[pair_ratios.len() / 2],
        pair_ratios[pair_ratios.len() / 4],
        pair_ratios[pair_ratios.len() * 3 / 4]
    );
}

criterion_group!(benches, bench, bench_library);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
