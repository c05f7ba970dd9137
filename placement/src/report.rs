//! The simulator's report for several algorithms, as an aligned text table or as JSON.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::simulate::SimulationReport;
use crate::snapshot::Dim;

/// One algorithm's run: the name it has in the config, and its report.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub name: String,
    pub report: SimulationReport,
}

/// Every dimension any run reports a utilisation for, in [`Dim`] order.
fn dims(runs: &[Run]) -> Vec<Dim> {
    let set: BTreeSet<Dim> = runs
        .iter()
        .flat_map(|r| r.report.utilisation_pct.keys().copied())
        .collect();
    set.into_iter().collect()
}

/// An aligned table, one row per run in the given order: the name left-aligned, the numbers
/// right-aligned; percentages with one decimal, balance with three. A dimension a run has no
/// utilisation for shows `-`.
pub fn table(runs: &[Run]) -> String {
    let dims = dims(runs);
    let mut header: Vec<String> = [
        "algorithm",
        "broken nodes %",
        "broken assign. %",
        "scheduled %",
    ]
    .map(String::from)
    .to_vec();
    header.extend(dims.iter().map(|d| format!("{d} util %")));
    header.push("mean util %".into());
    header.push("balance".into());
    let mut rows = vec![header];
    for run in runs {
        let r = &run.report;
        let mut row = vec![
            run.name.clone(),
            format!("{:.1}", r.broken_nodes_pct),
            format!("{:.1}", r.broken_assignments_pct),
            format!("{:.1}", r.scheduled_pct),
        ];
        row.extend(dims.iter().map(|d| {
            r.utilisation_pct
                .get(d)
                .map_or_else(|| "-".into(), |u| format!("{u:.1}"))
        }));
        row.push(format!("{:.1}", r.utilisation_mean_pct));
        row.push(format!("{:.3}", r.balance));
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, w))| {
                if c == 0 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The JSON document: `{"nodes", "tasks", "algorithms": [{"name", ...report}]}`, keys in a fixed
/// order, runs in the given order, without the per-task placements; the same input gives the
/// same bytes.
pub fn json(runs: &[Run], nodes: usize, tasks: usize) -> String {
    #[derive(Serialize)]
    struct Doc<'a> {
        nodes: usize,
        tasks: usize,
        algorithms: Vec<Entry<'a>>,
    }
    #[derive(Serialize)]
    struct Entry<'a> {
        name: &'a str,
        broken_nodes_pct: f64,
        broken_assignments: usize,
        broken_assignments_pct: f64,
        assigned: usize,
        scheduled_pct: f64,
        utilisation_pct: &'a BTreeMap<Dim, f64>,
        utilisation_mean_pct: f64,
        balance: f64,
        broken_nodes: &'a [String],
        unscheduled: &'a BTreeMap<String, usize>,
    }
    let doc = Doc {
        nodes,
        tasks,
        algorithms: runs
            .iter()
            .map(|run| {
                let r = &run.report;
                Entry {
                    name: &run.name,
                    broken_nodes_pct: r.broken_nodes_pct,
                    broken_assignments: r.broken_assignments,
                    broken_assignments_pct: r.broken_assignments_pct,
                    assigned: r.assigned,
                    scheduled_pct: r.scheduled_pct,
                    utilisation_pct: &r.utilisation_pct,
                    utilisation_mean_pct: r.utilisation_mean_pct,
                    balance: r.balance,
                    broken_nodes: &r.broken_nodes,
                    unscheduled: &r.unscheduled,
                }
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&doc).expect("plain data serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(broken: f64, util: &[(Dim, f64)], balance: f64) -> SimulationReport {
        SimulationReport {
            broken_nodes_pct: broken,
            broken_assignments: 3,
            broken_assignments_pct: 12.5,
            assigned: 24,
            scheduled_pct: 80.0,
            utilisation_pct: util.iter().copied().collect(),
            utilisation_mean_pct: 40.0,
            balance,
            broken_nodes: vec!["n1".into()],
            unscheduled: [("web".to_string(), 6)].into(),
            placements: vec![Some("n1".into()), None],
        }
    }

    fn runs() -> Vec<Run> {
        vec![
            Run {
                name: "fit".into(),
                report: report(0.0, &[(Dim::Cpu, 41.26), (Dim::Mem, 79.0)], 0.9023),
            },
            Run {
                name: "nop-long-name".into(),
                report: report(1.6667, &[(Dim::Cpu, 100.0)], -12.5),
            },
        ]
    }

    #[test]
    fn table_is_aligned_with_a_column_per_dimension() {
        let text = table(&runs());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "algorithm      broken nodes %  broken assign. %  scheduled %  cpu util %  mem util %  mean util %  balance",
                "fit                       0.0              12.5         80.0        41.3        79.0         40.0    0.902",
                "nop-long-name             1.7              12.5         80.0       100.0           -         40.0  -12.500",
            ]
        );
    }

    #[test]
    fn json_has_stable_keys_and_no_placements() {
        let text = json(&runs(), 60, 300);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["nodes"], 60);
        assert_eq!(v["tasks"], 300);
        assert_eq!(v["algorithms"][0]["name"], "fit");
        assert_eq!(v["algorithms"][0]["utilisation_pct"]["mem"], 79.0);
        assert_eq!(v["algorithms"][1]["unscheduled"]["web"], 6);
        assert!(v["algorithms"][0].get("placements").is_none());
        // Key order is the struct's: a reader can diff two runs line by line.
        let name_at = text.find("\"name\"").unwrap();
        let balance_at = text.find("\"balance\"").unwrap();
        let unscheduled_at = text.find("\"unscheduled\"").unwrap();
        assert!(name_at < balance_at && balance_at < unscheduled_at);
        assert_eq!(text, json(&runs(), 60, 300));
    }
}
