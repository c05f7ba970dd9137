//! `verwalter graph builds list|show ID|prune --older-than AGE`: the executor's build files,
//! read (and pruned) offline; and the running executor's retention sweep. What a build is and
//! which go is decided in `verwalter_controllers::ernest::build_retention`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use verwalter_controllers::ernest::build_retention::{self, BuildSummary};
use verwalter_controllers::machinery::clock::rfc3339;
use verwalter_controllers::machinery::clock::{Clock, SystemClock};

use super::store::BuildFiles;

/// `verwalter graph`'s subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum GraphSubcommand {
    /// Look at the builds in the executor's storage dir, or remove finished ones
    #[command(subcommand)]
    Builds(BuildsCommand),
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BuildsCommand {
    /// One line per build: id, state, result, when received and finished, changes by state
    List {
        /// The executor's storage dir
        #[arg(long, value_name = "DIR")]
        storage_dir: PathBuf,
        /// One JSON object per line instead of the table
        #[arg(long)]
        json: bool,
    },
    /// The stored build (its snapshot with its journal applied) as JSON, with a `summary`
    Show {
        /// The build's id
        id: String,
        /// The executor's storage dir
        #[arg(long, value_name = "DIR")]
        storage_dir: PathBuf,
    },
    /// Remove the files of finished builds whose result was published, finished AGE ago or more
    Prune {
        /// `90s`, `30m`, `12h`, `7d` (`0s`: every finished build)
        #[arg(long, value_name = "AGE", value_parser = super::parse_age)]
        older_than: Duration,
        /// The executor's storage dir
        #[arg(long, value_name = "DIR")]
        storage_dir: PathBuf,
        /// Say what would be removed, and remove nothing
        #[arg(long)]
        dry_run: bool,
    },
}

fn open(dir: &std::path::Path) -> Result<BuildFiles, String> {
    BuildFiles::existing(dir).map_err(|e| format!("--storage-dir {}: {e}", dir.display()))
}

fn line(summary: &BuildSummary) -> String {
    let changes: Vec<String> = summary
        .changes
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(state, n)| format!("{state}={n}"))
        .collect();
    let result = match summary.sent {
        Some(sent) => format!("{} ({sent})", summary.state),
        None => summary.state.to_string(),
    };
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}",
        summary.id,
        summary.subject,
        result,
        rfc3339(summary.received_ms),
        summary.finished_ms.map_or("-".to_string(), rfc3339),
        changes.join(",")
    )
}

/// Runs a `builds` subcommand: what it prints on stdout (problems on stderr) and whether it
/// did what was asked.
pub fn run(command: &BuildsCommand) -> Result<(), String> {
    match command {
        BuildsCommand::List { storage_dir, json } => {
            let files = open(storage_dir)?;
            let (runs, problems) = files.list();
            if !json {
                println!("ID\tSUBJECT\tRESULT\tRECEIVED\tFINISHED\tCHANGES");
            }
            for stored in &runs {
                let summary = BuildSummary::of(&stored.run);
                if *json {
                    println!("{}", serde_json::to_string(&summary).unwrap_or_default());
                } else {
                    println!("{}", line(&summary));
                }
            }
            for problem in &problems {
                eprintln!("verwalter graph builds list: {problem}");
            }
            Ok(())
        }
        BuildsCommand::Show { id, storage_dir } => {
            let files = open(storage_dir)?;
            let stored = files
                .get(id)?
                .ok_or_else(|| format!("no build {id:?} in {}", storage_dir.display()))?;
            let mut shown = serde_json::to_value(&stored.run).map_err(|e| e.to_string())?;
            shown["summary"] =
                serde_json::to_value(BuildSummary::of(&stored.run)).map_err(|e| e.to_string())?;
            shown["file"] = stored.path.display().to_string().into();
            println!(
                "{}",
                serde_json::to_string_pretty(&shown).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        BuildsCommand::Prune {
            older_than,
            storage_dir,
            dry_run,
        } => {
            let files = open(storage_dir)?;
            let (removed, problems) = files.prune(SystemClock.now_ms(), *older_than, *dry_run);
            let verb = if *dry_run { "would remove" } else { "removed" };
            for summary in &removed {
                println!("{verb}\t{}", line(summary));
            }
            println!("{} build(s) {verb}", removed.len());
            if problems.is_empty() {
                Ok(())
            } else {
                Err(problems.join("; "))
            }
        }
    }
}

/// The running executor's retention: removes finished builds past `retention` at start and
/// then every [`build_retention::sweep_interval`], until `shutdown`.
pub(crate) async fn sweep(
    files: Arc<BuildFiles>,
    retention: Duration,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) {
    let every = build_retention::sweep_interval(retention);
    loop {
        let now = clock.now_ms();
        let swept = files.clone();
        let (removed, problems) =
            tokio::task::spawn_blocking(move || swept.prune(now, retention, false))
                .await
                .unwrap_or_default();
        for summary in removed {
            let age_s = summary
                .finished_ms
                .map_or(0, |f| now.saturating_sub(f) / 1000);
            tracing::info!(build = %summary.id, result = summary.state, age_s,
                retention_s = retention.as_secs_f64(),
                "Finished build's files removed: past the retention.");
        }
        for problem in problems {
            tracing::warn!(%problem, "Build retention: a file could not be removed.");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
