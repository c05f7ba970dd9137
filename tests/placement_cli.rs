//! `verwalter placement simulate` on the shipped experiment (`examples/placement/`).

use std::path::Path;
use std::process::Command;

use crate::util::*;

/// `verwalter placement simulate` with the example's files (or `nodes`/`tasks` given instead)
/// and `args`: exit code, stdout, stderr.
fn simulate(nodes: Option<&Path>, tasks: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    let dir = example("placement");
    let out = Command::new(BIN)
        .args(["placement", "simulate", "--config"])
        .arg(dir.join("config.yaml"))
        .arg("--nodes")
        .arg(nodes.map_or_else(|| dir.join("nodes.yaml"), Path::to_path_buf))
        .arg("--tasks")
        .arg(tasks.map_or_else(|| dir.join("tasks.yaml"), Path::to_path_buf))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const ALGORITHMS: [&str; 11] = [
    "nop",
    "fit-cpu-mem",
    "bar-cpu-mem",
    "least-used-cpu-mem",
    "least-used-bar-cpu-mem",
    "hier-bar-cpu-mem",
    "fit",
    "bar",
    "least-used",
    "least-used-bar",
    "hier-bar",
];

#[test]
fn simulate_prints_a_table_in_the_config_order() {
    let (code, stdout, stderr) = simulate(None, None, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("simulated 11 algorithm(s) × 300 task(s) on 60 node(s) in"),
        "{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 12, "{stdout}");
    assert!(lines[0].starts_with("algorithm"), "{stdout}");
    for col in [
        "broken nodes %",
        "scheduled %",
        "membw_write util %",
        "balance",
    ] {
        assert!(lines[0].contains(col), "{col}: {stdout}");
    }
    let names: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, ALGORITHMS);
    // Aligned: every row as wide as the header.
    assert!(
        lines
            .iter()
            .all(|l| l.chars().count() == lines[0].chars().count())
    );
    let fit: Vec<&str> = lines[7].split_whitespace().collect();
    assert_eq!(fit[..4], ["fit", "0.0", "0.0", "73.3"], "{stdout}");
    // docs/placement.md ("wca's experiment") shows this output as it is.
    let shown = doc_block("placement.md", "### wca's experiment", "");
    assert_eq!(shown, stdout, "docs/placement.md's table is not the output");
}

#[test]
fn simulate_json_is_deterministic_and_the_svg_names_every_algorithm() {
    let tmp = tempfile::tempdir().unwrap();
    let (svg1, svg2) = (tmp.path().join("a.svg"), tmp.path().join("b.svg"));
    let (code, first, stderr) = simulate(
        None,
        None,
        &["--format", "json", "--svg", svg1.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, second, stderr) = simulate(
        None,
        None,
        &["--format", "json", "--svg", svg2.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(first, second, "two runs differ");

    let doc: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(doc["nodes"], 60);
    assert_eq!(doc["tasks"], 300);
    let algs = doc["algorithms"].as_array().unwrap();
    let names: Vec<&str> = algs.iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, ALGORITHMS);
    let by_name = |n: &str| algs.iter().find(|a| a["name"] == n).unwrap();
    // The Fit family on all four dimensions keeps every node whole; NOP and bandwidth-blind
    // Fit do not.
    for name in ["fit", "bar", "least-used", "least-used-bar", "hier-bar"] {
        assert_eq!(by_name(name)["broken_nodes_pct"], 0.0, "{name}");
        assert_eq!(
            by_name(name)["broken_nodes"],
            serde_json::json!([]),
            "{name}"
        );
    }
    assert!(by_name("nop")["broken_nodes_pct"].as_f64().unwrap() > 0.0);
    assert_eq!(
        by_name("nop")["broken_nodes"],
        serde_json::json!(["node00"])
    );
    assert!(by_name("fit-cpu-mem")["broken_nodes_pct"].as_f64().unwrap() > 0.0);
    assert_eq!(by_name("fit")["assigned"], 220);
    assert_eq!(
        by_name("fit")["unscheduled"],
        serde_json::json!({"cpu": 40, "mem": 40})
    );
    for key in ["scheduled_pct", "utilisation_mean_pct", "balance"] {
        assert!(by_name("fit")[key].is_f64(), "{key}");
    }
    assert!(by_name("fit")["utilisation_pct"]["membw_read"].is_f64());

    let svg = std::fs::read_to_string(&svg1).unwrap();
    assert_eq!(svg, std::fs::read_to_string(&svg2).unwrap());
    assert!(svg.starts_with("<svg "), "{}", &svg[..80]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("xmlns=\"http://www.w3.org/2000/svg\""));
    // Well formed enough for a browser: every element that is opened is closed.
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    assert_eq!(svg.matches("<svg").count(), 1);
    for name in ALGORITHMS {
        assert!(
            svg.contains(&format!(">\n{name}\n</text>")),
            "{name} not in the chart"
        );
    }
    for label in ["scheduled %", "broken nodes %", "mem util %", "Balance"] {
        assert!(svg.contains(label), "{label} not in the chart");
    }
}

#[test]
fn simulate_runs_only_the_algorithms_asked_in_their_order() {
    let (code, stdout, stderr) = simulate(None, None, &["--algorithm", "hier-bar", "nop"]);
    assert_eq!(code, 0, "{stderr}");
    let names: Vec<&str> = stdout
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, ["hier-bar", "nop"]);

    // One algorithm only, with its chart.
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("fit.svg");
    let (code, stdout, stderr) = simulate(
        None,
        None,
        &["--algorithm", "fit", "--svg", svg.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.contains(">\nfit\n</text>"), "{chart}");

    let (code, stdout, stderr) = simulate(None, None, &["--algorithm", "fitt"]);
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("config.yaml: no algorithm \"fitt\" (it has: bar, bar-cpu-mem, fit,"),
        "{stderr}"
    );
}

#[test]
fn simulate_refuses_bad_node_and_task_files_naming_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let nodes = tmp.path().join("nodes.yaml");
    std::fs::write(
        &nodes,
        "groups:\n  - count: 2\n    name_prefix: n\n    capacity: {cpu: 40, memory: 192}\n",
    )
    .unwrap();
    let (code, stdout, stderr) = simulate(Some(&nodes), None, &[]);
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    let expected = format!("error: {}:4:", nodes.display());
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert!(stderr.contains("memory"), "{stderr}");

    let tasks = tmp.path().join("tasks.yaml");
    std::fs::write(
        &tasks,
        "types:\n  - name: web\n    requests: {cpu: 1}\n    count: 3\norder: shuffled\n",
    )
    .unwrap();
    let (code, _, stderr) = simulate(None, Some(&tasks), &[]);
    assert_eq!(code, 1);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: {}:5: order: shuffled needs a seed (e.g. `seed: 1`)",
            tasks.display()
        )
    );

    let (code, _, stderr) = simulate(Some(&tmp.path().join("missing.yaml")), None, &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("missing.yaml: No such file"), "{stderr}");
}

/// Inputs that would take the machine's memory are refused with the file (and line) named:
/// a device or a FIFO as a file (never read: a FIFO without a writer would block the open), a
/// file over 16 MiB, and counts of nodes or tasks over the limits.
#[test]
fn simulate_refuses_inputs_over_its_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = simulate(Some(Path::new("/dev/zero")), None, &[]);
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert_eq!(
        stderr.trim_end(),
        "error: /dev/zero: not a regular file (a character device); give a file"
    );

    let fifo = tmp.path().join("tasks.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (code, _, stderr) = simulate(None, Some(&fifo), &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("tasks.fifo: not a regular file (a FIFO)"),
        "{stderr}"
    );

    // Sparse: 17 MiB of nothing on disk.
    let big = tmp.path().join("big.yaml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(17 << 20)
        .unwrap();
    let (code, _, stderr) = simulate(Some(&big), None, &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("big.yaml: 17825792 bytes, over the limit of 16777216 bytes"),
        "{stderr}"
    );

    let tasks = tmp.path().join("tasks.yaml");
    std::fs::write(
        &tasks,
        "types:\n  - name: web\n    requests: {cpu: 1}\n    count: 100000000\n",
    )
    .unwrap();
    let (code, _, stderr) = simulate(None, Some(&tasks), &[]);
    assert_eq!(code, 1);
    let expected = format!("error: {}:2:", tasks.display());
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert!(
        stderr.contains("count: 100000000 is over the limit of 1000000 tasks"),
        "{stderr}"
    );

    let nodes = tmp.path().join("nodes.yaml");
    std::fs::write(
        &nodes,
        "groups:\n  - count: 100000000\n    name_prefix: n\n    capacity: {cpu: 40, mem: 192}\n",
    )
    .unwrap();
    let (code, _, stderr) = simulate(Some(&nodes), None, &[]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with(&format!("error: {}:2:", nodes.display()))
            && stderr.contains("count: 100000000 is over the limit of 100000 nodes"),
        "{stderr}"
    );
}
