//! Shadow runs kept: the last `keep-runs` of each shadow, in memory for the API and on disk
//! under `<storage>/shadow/<name>/<run>.json`, read back at start.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use verwalter_controllers::schedule::shadow::RunId;

/// How a shadow run ended; the `result` label of `verwalter_shadow_runs_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// Its schedule is the real one.
    Identical,
    /// Its schedule differs from the real one (`diff`).
    Differs,
    /// It made a schedule, but the real run failed: nothing to compare.
    RealFailed,
    /// It failed (`error`).
    Failed,
    /// It was still busy with an earlier round.
    Skipped,
}

impl Outcome {
    pub(crate) const ALL: [Outcome; 5] = [
        Outcome::Identical,
        Outcome::Differs,
        Outcome::RealFailed,
        Outcome::Failed,
        Outcome::Skipped,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Identical => "identical",
            Outcome::Differs => "differs",
            Outcome::RealFailed => "real_failed",
            Outcome::Failed => "failed",
            Outcome::Skipped => "skipped",
        }
    }
}

/// Why a shadow run failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunError {
    /// The failure kind, as the real scheduler's (`load`, `runtime`, `timeout`, `memory`,
    /// `bad_output`, `internal`).
    pub(crate) kind: String,
    pub(crate) message: String,
}

/// The round a skipped run was skipped for, and what held the shadow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Skipped {
    pub(crate) busy_with: RunId,
    /// When that run started (ms since the epoch).
    pub(crate) busy_since: u64,
}

/// One shadow run, whole (`/v1/shadow/<name>/runs/<id>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ShadowRun {
    pub(crate) shadow: String,
    pub(crate) run: RunId,
    /// When the real round was published (ms since the epoch), and the same in RFC 3339.
    pub(crate) time: u64,
    pub(crate) time_rfc3339: String,
    /// The hash of the scheduler input (its canonical JSON, as a schedule's hash is taken):
    /// the same for the real run and each shadow run of a round.
    pub(crate) input_hash: String,
    /// The real schedule's hash, or the real run's error.
    pub(crate) real_hash: Option<String>,
    pub(crate) real_error: Option<String>,
    /// The shadow's code version (content hash of `scheduler/<name>`).
    pub(crate) code_version: Option<String>,
    pub(crate) result: Outcome,
    /// The number of JSON paths that differ from the real schedule (0 when identical).
    pub(crate) paths_differing: Option<usize>,
    /// The schedule the shadow made (its `actions` answers are shown here, never sent).
    pub(crate) output: Option<Value>,
    pub(crate) error: Option<RunError>,
    pub(crate) log: String,
    pub(crate) duration_ms: Option<u64>,
    /// The Lua state's memory when the run ended, garbage included (none for wasm).
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) skipped: Option<Skipped>,
    /// The structural diff against the real schedule.
    pub(crate) diff: Option<Value>,
}

/// A run in a list: everything but output, log and diff.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunSummary {
    pub(crate) shadow: String,
    pub(crate) run: RunId,
    pub(crate) time: u64,
    pub(crate) time_rfc3339: String,
    pub(crate) input_hash: String,
    pub(crate) real_hash: Option<String>,
    pub(crate) result: Outcome,
    pub(crate) paths_differing: Option<usize>,
    pub(crate) error: Option<String>,
    pub(crate) duration_ms: Option<u64>,
    pub(crate) memory_bytes: Option<u64>,
}

impl ShadowRun {
    pub(crate) fn summary(&self) -> RunSummary {
        RunSummary {
            shadow: self.shadow.clone(),
            run: self.run,
            time: self.time,
            time_rfc3339: self.time_rfc3339.clone(),
            input_hash: self.input_hash.clone(),
            real_hash: self.real_hash.clone(),
            result: self.result,
            paths_differing: self.paths_differing,
            error: self.error.as_ref().map(|e| e.message.clone()),
            duration_ms: self.duration_ms,
            memory_bytes: self.memory_bytes,
        }
    }
}

/// The largest run file read back at start.
const MAX_RUN_FILE: u64 = 256 << 20;

/// Every shadow's kept runs, oldest first.
#[derive(Debug)]
pub(crate) struct Records {
    /// `<storage>/shadow`.
    dir: PathBuf,
    runs: Mutex<BTreeMap<String, VecDeque<Arc<ShadowRun>>>>,
    /// Per shadow, why its last run could not be written (none once a write succeeds again).
    write_errors: Mutex<BTreeMap<String, String>>,
}

impl Records {
    /// Reads the runs kept under `dir` (files that cannot be read are logged and left alone;
    /// the temp files of a write a crash cut short are removed).
    pub(crate) fn open(dir: PathBuf) -> Records {
        let mut runs: BTreeMap<String, VecDeque<Arc<ShadowRun>>> = BTreeMap::new();
        for (name, files) in list(&dir) {
            remove_temp_files(&dir.join(&name));
            let kept = runs.entry(name.clone()).or_default();
            for (_, path) in files {
                match read_run(&path) {
                    Ok(run) if run.shadow == name => kept.push_back(Arc::new(run)),
                    Ok(_) => {
                        tracing::warn!(path = %path.display(), "A shadow run file of another shadow; left alone.")
                    }
                    Err(error) => {
                        tracing::warn!(path = %path.display(), %error, "Cannot read a shadow run; left alone.");
                    }
                }
            }
        }
        runs.retain(|_, kept| !kept.is_empty());
        Records {
            dir,
            runs: Mutex::new(runs),
            write_errors: Mutex::new(BTreeMap::new()),
        }
    }

    /// The largest run number kept (0 without runs).
    pub(crate) fn last_run(&self) -> RunId {
        let runs = self.runs.lock().expect("records lock");
        runs.values()
            .filter_map(|kept| kept.back())
            .map(|r| r.run)
            .max()
            .unwrap_or(0)
    }

    /// Keeps `run` (on disk first, when it can), and the last `keep` runs of its shadow.
    /// Returns why the run could not be written, if it could not (it is kept in memory then,
    /// and the error is kept for [`Records::write_error`] until a later write succeeds).
    pub(crate) fn add(&self, run: ShadowRun, keep: usize) -> Option<String> {
        let dir = self.dir.join(&run.shadow);
        let path = dir.join(file_name(run.run));
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            let bytes = serde_json::to_vec(&run).map_err(std::io::Error::other)?;
            crate::storage::state_dir::write_atomic(&path, &bytes)
        });
        let failed = written
            .err()
            .map(|error| format!("cannot write {}: {error}", path.display()));
        {
            let mut errors = self.write_errors.lock().expect("write errors lock");
            match &failed {
                Some(error) => {
                    tracing::warn!(shadow = %run.shadow, run = run.run, %error, "Cannot write a shadow run; it is kept in memory only.");
                    errors.insert(run.shadow.clone(), error.clone());
                }
                None => {
                    errors.remove(&run.shadow);
                }
            }
        }
        let mut runs = self.runs.lock().expect("records lock");
        let kept = runs.entry(run.shadow.clone()).or_default();
        // In run order: a run finishes after the skips recorded while it ran (later numbers).
        let at = kept.partition_point(|r| r.run < run.run);
        kept.insert(at, Arc::new(run));
        while kept.len() > keep {
            kept.pop_front();
        }
        let oldest = kept.front().map_or(0, |r| r.run);
        drop(runs);
        // Files of runs older than the ones kept go (whatever `keep` was when they were made).
        if let Some((_, files)) = list(&self.dir)
            .into_iter()
            .find(|(n, _)| n == dir_name(&dir))
        {
            for (id, path) in files {
                if id < oldest {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        failed
    }

    /// Why the last run of `shadow` could not be written to the storage dir, while that lasts.
    pub(crate) fn write_error(&self, shadow: &str) -> Option<String> {
        self.write_errors
            .lock()
            .expect("write errors lock")
            .get(shadow)
            .cloned()
    }

    /// The shadows with runs kept.
    pub(crate) fn names(&self) -> Vec<String> {
        self.runs
            .lock()
            .expect("records lock")
            .keys()
            .cloned()
            .collect()
    }

    /// The latest run of `shadow`.
    pub(crate) fn latest(&self, shadow: &str) -> Option<Arc<ShadowRun>> {
        let runs = self.runs.lock().expect("records lock");
        runs.get(shadow)?.back().cloned()
    }

    /// The kept runs of `shadow`, newest first; `None` for a shadow without runs.
    pub(crate) fn runs(&self, shadow: &str) -> Option<Vec<Arc<ShadowRun>>> {
        let runs = self.runs.lock().expect("records lock");
        Some(runs.get(shadow)?.iter().rev().cloned().collect())
    }

    /// Run `id` of `shadow`, if kept.
    pub(crate) fn get(&self, shadow: &str, id: RunId) -> Option<Arc<ShadowRun>> {
        let runs = self.runs.lock().expect("records lock");
        runs.get(shadow)?.iter().find(|r| r.run == id).cloned()
    }
}

fn file_name(run: RunId) -> String {
    format!("{run}.json")
}

fn dir_name(dir: &Path) -> &str {
    dir.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// Each shadow dir under `dir` with its run files, by run number.
fn list(dir: &Path) -> Vec<(String, Vec<(RunId, PathBuf)>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !crate::config::is_frontend_name(&name) || !entry.path().is_dir() {
            continue;
        }
        let Ok(files) = std::fs::read_dir(entry.path()) else {
            continue;
        };
        let mut runs: Vec<(RunId, PathBuf)> = files
            .flatten()
            .filter_map(|f| {
                let file = f.file_name();
                let id = file.to_str()?.strip_suffix(".json")?.parse().ok()?;
                Some((id, f.path()))
            })
            .collect();
        runs.sort();
        out.push((name, runs));
    }
    out.sort();
    out
}

/// Removes the temp files of `write_atomic` (`.tmp.<name>...`) in `dir`.
fn remove_temp_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(".tmp."))
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn read_run(path: &Path) -> std::io::Result<ShadowRun> {
    let bytes = crate::storage::state_dir::read_regular(path, MAX_RUN_FILE)?
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(shadow: &str, id: RunId) -> ShadowRun {
        ShadowRun {
            shadow: shadow.into(),
            run: id,
            time: 1_000 * id,
            time_rfc3339: String::new(),
            input_hash: "i".into(),
            real_hash: Some("r".into()),
            real_error: None,
            code_version: Some("c".into()),
            result: Outcome::Identical,
            paths_differing: Some(0),
            output: Some(serde_json::json!({"roles": {}})),
            error: None,
            log: "log".into(),
            duration_ms: Some(1),
            memory_bytes: None,
            skipped: None,
            diff: None,
        }
    }

    #[test]
    fn the_last_runs_are_kept_on_disk_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path().join("shadow"));
        assert_eq!(records.last_run(), 0);
        for id in 1..=5 {
            records.add(run("v2", id), 3);
        }
        records.add(run("v3", 6), 3);
        let ids =
            |r: &Records, s| -> Vec<RunId> { r.runs(s).unwrap().iter().map(|r| r.run).collect() };
        assert_eq!(ids(&records, "v2"), vec![5, 4, 3]);
        let mut files: Vec<String> = std::fs::read_dir(dir.path().join("shadow/v2"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(files, vec!["3.json", "4.json", "5.json"]);
        let leftover = dir.path().join("shadow/v2/.tmp.9.json.1234.0");
        std::fs::write(&leftover, "half").unwrap();
        let again = Records::open(dir.path().join("shadow"));
        assert!(
            !leftover.exists(),
            "a crash's temp file is removed at start"
        );
        assert_eq!(again.names(), vec!["v2", "v3"]);
        assert_eq!(ids(&again, "v2"), vec![5, 4, 3]);
        assert_eq!(again.last_run(), 6);
        assert_eq!(*again.get("v2", 4).unwrap(), run("v2", 4));
        assert!(again.get("v2", 1).is_none());
        assert!(again.runs("v9").is_none());
    }

    #[test]
    fn a_run_that_ends_after_the_skips_made_while_it_ran_is_kept_in_run_order() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path().join("shadow"));
        records.add(run("v2", 1), 3);
        // Run 2 still runs while rounds 3 and 4 are recorded as skipped; then it ends.
        records.add(run("v2", 3), 3);
        records.add(run("v2", 4), 3);
        records.add(run("v2", 2), 3);
        assert_eq!(records.latest("v2").unwrap().run, 4);
        let ids: Vec<RunId> = records.runs("v2").unwrap().iter().map(|r| r.run).collect();
        assert_eq!(ids, vec![4, 3, 2], "the oldest (1) went, newest first");
    }

    #[test]
    fn a_run_that_cannot_be_written_is_kept_in_memory_and_its_error_shown_until_a_write_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("shadow")).unwrap();
        // A file where the shadow's dir should be: no run of it can be written.
        let blocker = dir.path().join("shadow/v2");
        std::fs::write(&blocker, "not a dir").unwrap();
        let records = Records::open(dir.path().join("shadow"));
        let error = records.add(run("v2", 1), 3).expect("the write fails");
        assert!(error.contains("shadow/v2/1.json"), "{error}");
        assert_eq!(records.write_error("v2"), Some(error));
        assert_eq!(records.get("v2", 1).unwrap().run, 1);
        assert_eq!(records.write_error("v3"), None);

        std::fs::remove_file(&blocker).unwrap();
        assert_eq!(records.add(run("v2", 2), 3), None);
        assert_eq!(records.write_error("v2"), None);
        assert!(blocker.join("2.json").is_file());
    }
}
