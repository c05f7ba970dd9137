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

// ---- The chart, read back from its SVG ---------------------------------------------------------

/// The numbers of one SVG element: `attr="value"` pairs of `<name ...>`.
fn elements<'a>(svg: &'a str, name: &str) -> Vec<std::collections::HashMap<&'a str, &'a str>> {
    let open = format!("<{name} ");
    svg.match_indices(&open)
        .map(|(at, _)| {
            let tag = &svg[at + open.len()..];
            let tag = &tag[..tag.find('>').unwrap()];
            let mut attrs = std::collections::HashMap::new();
            let mut rest = tag;
            while let Some(eq) = rest.find("=\"") {
                let key = rest[..eq].trim();
                let value_end = rest[eq + 2..].find('"').unwrap();
                attrs.insert(key, &rest[eq + 2..eq + 2 + value_end]);
                rest = &rest[eq + 2 + value_end + 1..];
            }
            attrs
        })
        .collect()
}

fn num(attrs: &std::collections::HashMap<&str, &str>, key: &str) -> f64 {
    attrs[key].parse().unwrap_or_else(|e| panic!("{key}: {e}"))
}

/// What the chart's layout tests look at.
#[derive(Debug)]
struct Chart {
    /// Left and right ends of the plotting areas (their horizontal grid lines).
    plot: (f64, f64),
    /// Light (minor) and bold (major) horizontal grid lines.
    light_lines: usize,
    bold_lines: usize,
    /// The legend's box: x, y, width, height.
    legend: (f64, f64, f64, f64),
    /// The legend's colours, top to bottom, and the colours of the balance bars, left to right,
    /// with the right end of the rightmost bar.
    legend_colours: Vec<String>,
    balance_colours: Vec<String>,
    balance_right: f64,
}

fn read_chart(svg: &str, algorithms: usize) -> Chart {
    let lines: Vec<_> = elements(svg, "line")
        .into_iter()
        .filter(|l| l["y1"] == l["y2"] && l.contains_key("opacity") && l["opacity"] != "1")
        .collect();
    let plot = (
        lines.iter().map(|l| num(l, "x1")).fold(f64::MAX, f64::min),
        lines.iter().map(|l| num(l, "x2")).fold(f64::MIN, f64::max),
    );
    let light_lines = lines.iter().filter(|l| l["opacity"] == "0.1").count();
    let rects = elements(svg, "rect");
    let boxed: Vec<usize> = (0..rects.len())
        .filter(|&i| rects[i]["fill"] == "none" && rects[i]["stroke"] == "#000000")
        .collect();
    assert_eq!(boxed.len(), 1, "one legend box: {boxed:?}");
    let b = &rects[boxed[0]];
    let legend = (num(b, "x"), num(b, "y"), num(b, "width"), num(b, "height"));
    let filled = |r: &std::collections::HashMap<&str, &str>| {
        r["fill"] != "none" && r["fill"] != "#FFFFFF" && r["stroke"] == "none"
    };
    let legend_colours = rects[boxed[0] + 1..]
        .iter()
        .filter(|r| filled(r))
        .map(|r| r["fill"].to_string())
        .collect();
    // Drawn in this order: the upper panel's bars, the balance bars, the legend.
    let bars: Vec<_> = rects[..boxed[0]].iter().filter(|r| filled(r)).collect();
    let balance = &bars[bars.len() - algorithms..];
    Chart {
        plot,
        light_lines,
        bold_lines: lines.len() - light_lines,
        legend,
        legend_colours,
        balance_colours: balance.iter().map(|r| r["fill"].to_string()).collect(),
        balance_right: balance
            .iter()
            .map(|r| num(r, "x") + num(r, "width"))
            .fold(f64::MIN, f64::max),
    }
}

/// `#RRGGBB` as CIELAB as seen with normal vision or, after Machado, Oliveira and Fernandes'
/// (2009) simulation at full severity, by a protanope, deuteranope or tritanope.
fn seen(hex: &str, vision: usize) -> [f64; 3] {
    const SIMULATION: [[[f64; 3]; 3]; 4] = [
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
        [
            [0.152286, 1.052583, -0.204868],
            [0.114503, 0.786281, 0.099216],
            [-0.003882, -0.048116, 1.051998],
        ],
        [
            [0.367322, 0.860646, -0.227968],
            [0.280085, 0.672501, 0.047413],
            [-0.011820, 0.042940, 0.968881],
        ],
        [
            [1.255528, -0.076749, -0.178779],
            [-0.078411, 0.930809, 0.147602],
            [0.004733, 0.691367, 0.303900],
        ],
    ];
    let channel = |i: usize| {
        let c = u8::from_str_radix(&hex[1 + 2 * i..3 + 2 * i], 16).unwrap() as f64 / 255.0;
        if c <= 0.04045 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    };
    let linear = [channel(0), channel(1), channel(2)];
    let m = SIMULATION[vision];
    let [r, g, b] = [0, 1, 2]
        .map(|i| (m[i][0] * linear[0] + m[i][1] * linear[1] + m[i][2] * linear[2]).clamp(0.0, 1.0));
    let x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047;
    let y = 0.2126 * r + 0.7152 * g + 0.0722 * b;
    let z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883;
    let f = |t: f64| {
        if t > 0.008856 {
            t.cbrt()
        } else {
            7.787 * t + 16.0 / 116.0
        }
    };
    [
        116.0 * f(y) - 16.0,
        500.0 * (f(x) - f(y)),
        200.0 * (f(y) - f(z)),
    ]
}

#[test]
fn simulate_chart_has_its_legend_outside_the_plot_distinct_colours_and_a_subtitle() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("chart.svg");
    let (code, _, stderr) = simulate(None, None, &["--svg", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(
        svg.contains(
            ">\nnode set nodes.yaml (60 nodes) · task set tasks.yaml (300 tasks)\n</text>"
        ),
        "no subtitle naming the sets"
    );
    let chart = read_chart(&svg, ALGORITHMS.len());
    let (left, right) = chart.plot;
    // The legend's box lies right of the plotting areas, inside the picture.
    let (x, _, width, height) = chart.legend;
    assert!(
        x > right,
        "legend at x={x} overlaps the plot ending at {right}"
    );
    assert!(x + width <= 1600.0, "{chart:?}");
    assert!(height >= ALGORITHMS.len() as f64 * 14.0, "{chart:?}");
    // At most one minor line between two major ones.
    assert!(
        chart.light_lines <= chart.bold_lines,
        "{} minor grid lines for {} major",
        chart.light_lines,
        chart.bold_lines
    );
    // One colour per algorithm, the same in the legend and on the balance bars, and no two
    // that are near for normal, protan, deutan or tritan vision (CIE76 ΔE; Okabe-Ito's own
    // closest pair is 16 apart, plotters' default palette had pairs 5 apart).
    assert_eq!(chart.legend_colours.len(), ALGORITHMS.len(), "{chart:?}");
    assert_eq!(chart.legend_colours, chart.balance_colours);
    for vision in 0..4 {
        for (i, a) in chart.legend_colours.iter().enumerate() {
            for b in &chart.legend_colours[i + 1..] {
                let (pa, pb) = (seen(a, vision), seen(b, vision));
                let distance = (0..3).map(|c| (pa[c] - pb[c]).powi(2)).sum::<f64>().sqrt();
                assert!(
                    distance >= 12.0,
                    "{a} and {b} are {distance:.1} apart for vision {vision}"
                );
            }
        }
    }
    // The balance panel has one slot per algorithm: the last bar ends within half a slot of
    // the axis' end (its margin), no empty slot after it.
    let slot = (right - left) / ALGORITHMS.len() as f64;
    assert!(
        right - chart.balance_right < slot / 2.0,
        "{} px empty right of the last bar (slot {slot})",
        right - chart.balance_right
    );

    // One algorithm: its balance bar fills the one slot.
    let (code, _, stderr) = simulate(
        None,
        None,
        &["--algorithm", "fit", "--svg", path.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    let one = read_chart(&std::fs::read_to_string(&path).unwrap(), 1);
    let bar_width = one.balance_right - one.plot.0;
    assert!(
        bar_width > (one.plot.1 - one.plot.0) / 2.0,
        "single balance bar {bar_width} px wide: {one:?}"
    );
}
