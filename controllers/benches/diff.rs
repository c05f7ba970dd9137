//! The structural diff of two 1 MiB schedules (issue 34's goal: at most 20 ms), as a shadow run
//! computes it against the real schedule: 400 roles with their variables and versions, placed
//! on 200 nodes with per-node variables. Three cases: the same schedule (a copy, nothing differs),
//! a shadow that moves a tenth of the roles to other versions, and one that differs nearly
//! everywhere (half the versions, every node's and placed role's variables: 2,800 paths), whose
//! change list is cut at 1,000.
//!
//! Prints criterion's (wall-clock) figures, then the CPU time per diff of each case.
//!
//! `cargo bench -p verwalter-controllers --bench diff`

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Map, Value, json};
use verwalter_controllers::schedule::diff::diff;

const ROLES: usize = 1000;
const NODES: usize = 1200;

/// A schedule of about 1 MiB of compact JSON; `version(role)` picks each role's version and
/// `salt` goes into every node's variables.
fn schedule(version: impl Fn(usize) -> usize, salt: &str) -> Value {
    let roles: Map<String, Value> = (0..ROLES)
        .map(|r| {
            let role = json!({
                "version": format!("v{}", version(r)),
                "versions": (0..8).map(|v| format!("v{v}")).collect::<Vec<_>>(),
                "title": format!("Role number {r} of the benchmark"),
                "ports": [8000 + r, 9000 + r],
                "env": {"LOG_LEVEL": "info", "REPLICAS": r % 5 + 1, "REGION": "eu-central"},
            });
            (format!("role-{r:03}"), role)
        })
        .collect();
    let nodes: Map<String, Value> = (0..NODES)
        .map(|n| {
            let placed: Map<String, Value> = (0..12)
                .map(|k| {
                    let r = (n * 7 + k * 31) % ROLES;
                    let vars = json!({"instances": 1 + k % 3, "weight": n % 10, "salt": salt});
                    (format!("role-{r:03}"), vars)
                })
                .collect();
            let node = json!({
                "vars": {"rack": format!("r{}", n / 20), "salt": salt, "ip": format!("10.0.{}.{}", n / 250, n % 250)},
                "shortinfo": format!("node {n} of the benchmark cluster, 12 roles"),
                "roles": placed,
            });
            (format!("node-{n:03}.example.com"), node)
        })
        .collect();
    json!({"vars": {"cluster": "bench"}, "roles": roles, "nodes": nodes})
}

fn bench(c: &mut Criterion) {
    let real = schedule(|_| 1, "a");
    let bytes = serde_json::to_vec(&real).unwrap().len();
    assert!(
        (1 << 20..(1 << 20) + (1 << 18)).contains(&bytes),
        "the schedule is {bytes} bytes, not about 1 MiB"
    );
    let copy = real.clone();
    let some = schedule(|r| if r % 10 == 0 { 2 } else { 1 }, "a");
    let most = schedule(|r| 1 + r % 2, "b");
    assert!(diff(&real, &copy).is_empty());
    assert_eq!(diff(&real, &some).paths_differing(), ROLES / 10);
    assert!(diff(&real, &most).truncated);
    let mut group = c.benchmark_group("diff_1mib");
    group.bench_function("identical", |b| b.iter(|| diff(&real, &copy)));
    group.bench_function("a_tenth_of_the_roles", |b| b.iter(|| diff(&real, &some)));
    group.bench_function("nearly_everything", |b| b.iter(|| diff(&real, &most)));
    group.finish();
    // The machine may be busy: criterion's figures are wall-clock time, so the CPU time this
    // thread spent per diff comes too (Linux's schedstat, nanoseconds on a CPU).
    for (name, shadow) in [
        ("identical", &copy),
        ("a_tenth_of_the_roles", &some),
        ("nearly_everything", &most),
    ] {
        let before = cpu_ns();
        for _ in 0..ROUNDS {
            std::hint::black_box(diff(&real, shadow));
        }
        let per = (cpu_ns() - before) as f64 / f64::from(ROUNDS) / 1e6;
        println!("diff_1mib/{name}: {per:.2} ms of CPU time per diff ({ROUNDS} diffs)");
    }
    // For scale: serde_json's own `==` of the schedule and its copy (one walk of both trees
    // that finds them equal, nothing recorded), the least a diff of equal schedules can cost.
    let before = cpu_ns();
    for _ in 0..ROUNDS {
        assert!(std::hint::black_box(&real) == std::hint::black_box(&copy));
    }
    let per = (cpu_ns() - before) as f64 / f64::from(ROUNDS) / 1e6;
    println!("diff_1mib/serde_json_eq_for_scale: {per:.2} ms of CPU time per comparison");
}

const ROUNDS: u32 = 50;

/// This thread's time on a CPU so far, in nanoseconds.
#[allow(clippy::disallowed_methods)] // a bench reads /proc, not the crate
fn cpu_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

criterion_group!(benches, bench);
criterion_main!(benches);
