//! `verwalter placement simulate`: reads a placement config, a node set and a task set, runs
//! wca's simulator for each algorithm and prints the report (table or JSON), and draws the
//! comparison chart. The decisions are in `verwalter_placement` (`simulate`, `experiment`,
//! `report`); this reads the files and writes the output.

use std::path::{Path, PathBuf};
use std::time::Instant;

use verwalter_placement::report::{self, Run};
use verwalter_placement::{config, experiment, simulate};

use super::chart;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// An aligned text table, one row per algorithm.
    Table,
    /// A JSON document with stable keys (docs/placement.md, "Simulator").
    Json,
}

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Placement config with the algorithms to compare (wca-scheduler's config.yaml format)
    #[arg(long, value_name = "FILE")]
    pub(crate) config: PathBuf,
    /// Node set: groups of identical nodes and/or single nodes with their capacities
    #[arg(long, value_name = "FILE")]
    pub(crate) nodes: PathBuf,
    /// Task set: task types with requests and counts, and the order they arrive in
    #[arg(long, value_name = "FILE")]
    pub(crate) tasks: PathBuf,
    /// How to print the report
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,
    /// Also write a chart comparing the algorithms to FILE (SVG)
    #[arg(long, value_name = "FILE")]
    pub(crate) svg: Option<PathBuf>,
    /// Run only these algorithms of the config, in this order (default: all, in the file's order)
    #[arg(long = "algorithm", value_name = "NAME", num_args = 1..)]
    pub(crate) algorithms: Vec<String>,
}

/// Runs the simulation: the report to print on success, one line of cause on failure. A line
/// with the size of the run and the time it took goes to standard error.
pub fn run(args: &SimulateArgs) -> Result<String, String> {
    let config_text = read(&args.config)?;
    let loaded = config::load(&config_text, |n| std::env::var(n).ok())
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let nodes = experiment::parse_nodes(&read(&args.nodes)?).map_err(|e| at(&args.nodes, e))?;
    let tasks = experiment::parse_tasks(&read(&args.tasks)?).map_err(|e| at(&args.tasks, e))?;
    let names = if args.algorithms.is_empty() {
        experiment::config_order(&config_text, loaded.keys())
    } else {
        for name in &args.algorithms {
            if !loaded.contains_key(name) {
                let known: Vec<&str> = loaded.keys().map(String::as_str).collect();
                return Err(format!(
                    "{}: no algorithm {name:?} (it has: {})",
                    args.config.display(),
                    known.join(", ")
                ));
            }
        }
        args.algorithms.clone()
    };
    if names.is_empty() {
        return Err(format!("{}: no algorithms", args.config.display()));
    }
    let snapshot = experiment::snapshot(&nodes, &tasks);
    let task_list = experiment::task_list(&tasks);
    let started = Instant::now();
    let mut runs = Vec::with_capacity(names.len());
    for name in names {
        let report = simulate(&loaded[&name].algorithm, snapshot.clone(), &task_list)
            .map_err(|e| format!("{name}: {e}"))?;
        runs.push(Run { name, report });
    }
    eprintln!(
        "simulated {} algorithm(s) × {} task(s) on {} node(s) in {:.1} ms",
        runs.len(),
        task_list.len(),
        snapshot.node_capacities.len(),
        started.elapsed().as_secs_f64() * 1000.0
    );
    if let Some(path) = &args.svg {
        let subtitle = format!(
            "node set {} ({} nodes) · task set {} ({} tasks)",
            file_name(&args.nodes),
            snapshot.node_capacities.len(),
            file_name(&args.tasks),
            task_list.len()
        );
        let svg = chart::svg(&runs, &subtitle)?;
        std::fs::write(path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(match args.format {
        Format::Table => report::table(&runs),
        Format::Json => report::json(&runs, snapshot.node_capacities.len(), task_list.len()),
    })
}

/// The last part of `path` (the whole path when it has none).
fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// `file:line:column: message`, or `file: message` when the line is not known.
fn at(path: &Path, e: experiment::InputError) -> String {
    match e.line {
        Some(_) => format!("{}:{e}", path.display()),
        None => format!("{}: {e}", path.display()),
    }
}

/// A regular file's text, of at most `experiment::MAX_FILE_BYTES` (`super::input`).
fn read(path: &Path) -> Result<String, String> {
    super::input::read_text_capped(path, experiment::MAX_FILE_BYTES)
        .map_err(|e| format!("{}: {e}", path.display()))
}
