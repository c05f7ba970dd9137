//! Fuzzing every parser and decoder on stable Rust (docs/reliability.md, "Fuzzing").
//!
//! `engine.rs` is a corpus-driven mutational fuzzer (byte-level changes, and tree-level ones for
//! JSON, YAML and CBOR inputs from `structured.rs`); `targets.rs` holds one target per parser.
//! Each target's seed corpus is `tests/fuzz/corpus/<target>/`.
//!
//! - `cargo test --test tests fuzz::` (part of `make test`): every corpus entry, then a fixed
//!   number of mutated inputs per target (`FUZZ_RUNS`, 2,000 by default) from a fixed seed,
//!   in the debug build; any panic or hang fails the test with the (minimized) input.
//! - `make fuzz` (`FUZZ_SECS` per target, 60 by default; `FUZZ_TARGETS=a,b` for some;
//!   `FUZZ_SEED`): the `fuzz` profile (release with overflow checks), time-boxed per target; prints executions, executions per
//!   second, time, crashes, hangs and new corpus entries per target; crashing inputs go to
//!   `target/fuzz-out/crashes/<target>/`, new entries (with `FUZZ_SAVE=1`) to
//!   `target/fuzz-out/new-corpus/<target>/`.

mod engine;
mod regressions;
mod structured;
mod targets;

use std::path::Path;
use std::time::Duration;

use engine::{Budget, Options, Report, Target, fuzz, shown};
use targets::TARGETS;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn target(name: &str) -> &'static Target {
    TARGETS
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no fuzz target {name}"))
}

fn out_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-out")
}

/// What went wrong in a report, for an assertion message.
fn findings(name: &str, report: &Report) -> String {
    let mut text = String::new();
    if let Some((execs, time)) = report.first_crash {
        text += &format!(
            "\n{name}: first crash after {execs} executions, {:.1} s",
            time.as_secs_f64()
        );
    }
    for crash in &report.crashes {
        text += &format!(
            "\n{name}: crash {}\n  message: {}\n  input: {}",
            crash.signature,
            crash.message,
            shown(&crash.input)
        );
    }
    for hang in &report.hangs {
        text += &format!("\n{name}: hang on input {}", shown(hang));
    }
    text
}

/// The short run of one target: the corpus, then `FUZZ_RUNS` mutations from a fixed seed.
fn short_run(name: &str) {
    let target = target(name);
    let options = Options {
        budget: Budget::Runs(env_u64("FUZZ_RUNS", 2_000)),
        seed: env_u64("FUZZ_SEED", 15),
        cap: Duration::from_millis(env_u64("FUZZ_TIMEOUT_MS", 10_000)),
        out_dir: Some(out_dir()),
        save_new: false,
    };
    let report = fuzz(target, &options);
    assert!(
        report.crashes.is_empty() && report.hangs.is_empty(),
        "{}",
        findings(name, &report)
    );
    assert!(report.execs > report.seeds as u64);
}

macro_rules! short_runs {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                short_run(stringify!($name));
            }
        )*

        /// Every target has its short run above.
        #[test]
        fn every_target_has_a_short_run() {
            let listed = [$(stringify!($name)),*];
            for target in TARGETS {
                assert!(listed.contains(&target.name), "{} has no short run", target.name);
            }
        }
    };
}

short_runs!(
    runtime_yaml,
    runtime_json,
    settings,
    render_yaml,
    templates,
    schedule_vars,
    refs,
    graph,
    election_packet,
    schedule,
    schedule_data,
    action_journal,
    http,
    paths,
    cantal_peers,
    prometheus_reply,
    metrics_yaml,
    kube_api,
    placement_config,
    placement_snapshot,
    graphql_query,
    extender,
);

/// Every target's corpus dir exists and holds entries; no dir is left without a target.
#[test]
fn every_corpus_dir_belongs_to_a_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus");
    for entry in std::fs::read_dir(&root).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            TARGETS.iter().any(|t| t.name == name),
            "tests/fuzz/corpus/{name} has no target"
        );
    }
    for target in TARGETS {
        assert!(
            engine::load_corpus(target.name).len() >= 2,
            "{}: fewer than 2 corpus entries",
            target.name
        );
    }
}

/// The long run (`make fuzz`): `FUZZ_SECS` per target in turn, a table of the figures at the
/// end; fails when anything crashed or hung.
#[test]
#[ignore = "long: run by `make fuzz`"]
fn long_run() {
    let secs = env_u64("FUZZ_SECS", 60);
    let only: Option<Vec<String>> = std::env::var("FUZZ_TARGETS")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| v.split(',').map(str::to_string).collect());
    let options = Options {
        budget: Budget::Time(Duration::from_secs(secs)),
        seed: env_u64("FUZZ_SEED", 15),
        cap: Duration::from_millis(env_u64("FUZZ_TIMEOUT_MS", 2_000)),
        out_dir: Some(out_dir()),
        save_new: std::env::var_os("FUZZ_SAVE").is_some(),
    };
    let mut rows = Vec::new();
    let mut problems = String::new();
    for target in TARGETS {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == target.name))
        {
            continue;
        }
        let report = fuzz(target, &options);
        let row = format!(
            "| {} | {} | {:.0} | {:.1} | {} | {} | {} | {} |",
            target.name,
            report.execs,
            report.per_second(),
            report.elapsed.as_secs_f64(),
            report.crashes.len(),
            report.hangs.len(),
            report.seeds,
            report.new_entries,
        );
        eprintln!("{row}");
        rows.push(row);
        problems += &findings(target.name, &report);
    }
    println!(
        "\n| target | executions | per second | seconds | crashes | hangs | seeds | new entries |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        println!("{row}");
    }
    assert!(problems.is_empty(), "{problems}");
}

/// Runs the files given in `FUZZ_INPUT` (comma-separated) through `FUZZ_TARGETS`' one target and
/// prints each outcome class: to replay a crash from `target/fuzz-out/crashes/`.
#[test]
#[ignore = "a tool: FUZZ_TARGETS=<target> FUZZ_INPUT=<file>"]
fn replay() {
    let name = std::env::var("FUZZ_TARGETS").expect("FUZZ_TARGETS=<one target>");
    let target = target(&name);
    for file in std::env::var("FUZZ_INPUT")
        .expect("FUZZ_INPUT=<files>")
        .split(',')
    {
        let input = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        println!("{file}: {}", (target.run)(&input));
    }
}
