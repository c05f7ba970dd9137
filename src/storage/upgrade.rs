//! The first start on what verwalter 0.13 left: lists the storage and log dirs, carries out what
//! [`verwalter_controllers::storage::upgrade`] plans (a gzipped copy of the schedule, renames within the
//! storage dir, removals of 0.13's temp files) and logs what it did. A second start finds
//! nothing to do.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use verwalter_controllers::storage::upgrade::{
    self, LogListing, OWN_SCHEDULE_PREFIX, StorageListing, StoragePlan, StoredSchedule,
};

use crate::storage::backups;
use crate::storage::state_dir::{
    MAX_STORED_SCHEDULE, StateDir, open_regular, read_regular, sync_dir,
};

/// A step of the storage dir's upgrade that failed; the daemon does not start (status 3) rather
/// than go on and replace a schedule it could not keep a copy of. Every step is retried at the
/// next start. (The log dir's steps never stop the start: the daemon runs without its log.)
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot {what}: {source}")]
pub struct UpgradeError {
    path: PathBuf,
    what: &'static str,
    #[source]
    source: io::Error,
}

fn failed(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> UpgradeError {
    let path = path.to_path_buf();
    move |source| UpgradeError { path, what, source }
}

/// What the upgrade did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upgraded {
    pub(crate) storage: StoragePlan,
    /// Temp links of 0.13 removed from the log dir, `(stream, name)`.
    pub(crate) log_links: Vec<(String, String)>,
}

impl Upgraded {
    /// Whether nothing was done.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.storage.is_empty() && self.log_links.is_empty()
    }
}

/// Upgrades the storage dir and the log dir, logging what it did (nothing when there was
/// nothing to do).
pub(crate) fn migrate(state_dir: &StateDir, log_dir: &Path) -> Result<Upgraded, UpgradeError> {
    let (listing, stored_bytes) = list_storage(state_dir)?;
    let storage = upgrade::plan_storage(&listing);
    let schedule_dir = schedule_dir(state_dir);
    let backups_dir = state_dir.backups_dir();

    // First the copy of the schedule: the first scheduler run replaces the file.
    if let (Some(name), Some(bytes)) = (&storage.keep_schedule, &stored_bytes) {
        backups::keep(&backups_dir, name, bytes).map_err(failed(
            &backups_dir.join(name),
            "keep a copy of the schedule 0.13 left",
        ))?;
    }
    if !storage.moves.is_empty() {
        fs::create_dir_all(&backups_dir).map_err(failed(&backups_dir, "create"))?;
        for (from, to) in &storage.moves {
            // Same file system: the backup is under one name or the other, never lost.
            fs::rename(schedule_dir.join(from), backups_dir.join(to)).map_err(failed(
                &schedule_dir.join(from),
                "move a 0.13 backup into backups/",
            ))?;
        }
        sync_dir(&backups_dir).map_err(failed(&backups_dir, "sync"))?;
    }
    for name in &storage.remove {
        let path = schedule_dir.join(name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(failed(&path, "remove a 0.13 temp file")(e));
            }
            _ => {}
        }
    }
    if !storage.moves.is_empty() || !storage.remove.is_empty() {
        sync_dir(&schedule_dir).map_err(failed(&schedule_dir, "sync"))?;
    }

    let mut log_links = upgrade::plan_log(&list_log(log_dir));
    log_links.retain(|(stream, name)| {
        let path = log_dir.join(stream).join(name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(
                    target: "verwalter::upgrade",
                    path = %path.display(),
                    error = %e,
                    "Cannot remove a temp link verwalter 0.13 left; it stays."
                );
                false
            }
            _ => true,
        }
    });

    let done = Upgraded { storage, log_links };
    report(state_dir, log_dir, &done);
    Ok(done)
}

/// Logs what was done, once: the next start has nothing to report.
fn report(state_dir: &StateDir, log_dir: &Path, done: &Upgraded) {
    let storage = &done.storage;
    if !storage.is_empty() {
        let moved: Vec<&str> = storage.moves.iter().map(|(_, to)| to.as_str()).collect();
        tracing::info!(
            target: "verwalter::upgrade",
            dir = %state_dir.root().display(),
            layout = ?storage.layout,
            schedule_copy = storage.keep_schedule.as_deref().unwrap_or("-"),
            backups_moved = %moved.join(","),
            temp_files_removed = storage.remove.len(),
            "Upgraded the storage dir verwalter 0.13 left: its schedule is read where it is, its backups joined ours."
        );
        if !storage.left.is_empty() {
            tracing::info!(
                target: "verwalter::upgrade",
                dir = %schedule_dir(state_dir).display(),
                files = %storage.left.join(","),
                "Left 0.13 backups of periods backups/ has already; delete them when not needed."
            );
        }
    } else if !storage.left.is_empty() {
        tracing::debug!(
            target: "verwalter::upgrade",
            files = %storage.left.join(","),
            "0.13 backups left in schedule/."
        );
    }
    if !storage.impossible.is_empty() {
        tracing::warn!(
            target: "verwalter::upgrade",
            dir = %schedule_dir(state_dir).display(),
            files = %storage.impossible.join(","),
            "Left 0.13 backups named for periods that do not exist where they are (retention could never prune them); delete them when not needed."
        );
    }
    if !done.log_links.is_empty() {
        tracing::info!(
            target: "verwalter::upgrade",
            dir = %log_dir.display(),
            removed = done.log_links.len(),
            "Removed temp links verwalter 0.13 left in the deployment log; the log goes on as it was."
        );
    }
}

fn schedule_dir(state_dir: &StateDir) -> PathBuf {
    state_dir
        .schedule_path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| state_dir.root().to_path_buf())
}

/// Names in `dir` (only files, with `files_only`); none when it does not exist.
fn names(dir: &Path, files_only: bool) -> Result<Vec<String>, UpgradeError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(failed(dir, "list")(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(failed(dir, "list"))?;
        if files_only && !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// The storage dir's listing, and the bytes of a `schedule.json` this daemon did not write.
fn list_storage(state_dir: &StateDir) -> Result<(StorageListing, Option<Vec<u8>>), UpgradeError> {
    let root = names(state_dir.root(), false)?;
    let schedule = names(&schedule_dir(state_dir), true)?;
    let backups = names(&state_dir.backups_dir(), false)?;
    let mut bytes = None;
    let mut stored = None;
    if schedule.iter().any(|n| n == upgrade::SCHEDULE_FILE) {
        let path = state_dir.schedule_path();
        // Our own file is known by its first bytes; only one written elsewhere is read whole.
        // Read as a regular file only (listed as one; not through a link that took its place
        // meanwhile, nor a FIFO), within the stored schedule's limit.
        let mut head = Vec::with_capacity(OWN_SCHEDULE_PREFIX.len());
        open_regular(&path)
            .and_then(|f| match f {
                Some(f) => f
                    .take(OWN_SCHEDULE_PREFIX.len() as u64)
                    .read_to_end(&mut head)
                    .map(drop),
                None => Ok(()),
            })
            .map_err(failed(&path, "read"))?;
        let ours = head == OWN_SCHEDULE_PREFIX;
        let mut made = 0;
        if !ours {
            let data = read_regular(&path, MAX_STORED_SCHEDULE)
                .map_err(failed(&path, "read"))?
                .unwrap_or_default();
            made = made_ms(&path, &data);
            bytes = Some(data);
        }
        stored = Some(StoredSchedule {
            ours,
            made_ms: made,
        });
    }
    let listing = StorageListing {
        root,
        schedule,
        backups,
        stored,
    };
    Ok((listing, bytes))
}

/// The envelope's `timestamp`, or when the file is no envelope, its modification time.
fn made_ms(path: &Path, data: &[u8]) -> u64 {
    let timestamp = serde_json::from_slice::<serde_json::Value>(data)
        .ok()
        .and_then(|v| v.get("timestamp").and_then(serde_json::Value::as_u64));
    timestamp.unwrap_or_else(|| {
        fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64)
    })
}

/// The symlinks directly in each dir of the log dir; what cannot be listed is left out (the log
/// dir reports its own problems when it is written).
fn list_log(log_dir: &Path) -> LogListing {
    let mut links = Vec::new();
    let Ok(entries) = fs::read_dir(log_dir) else {
        return LogListing::default();
    };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(stream) = entry.file_name().into_string() else {
            continue;
        };
        let Ok(files) = fs::read_dir(entry.path()) else {
            continue;
        };
        for file in files.flatten() {
            if file.file_type().is_ok_and(|t| t.is_symlink())
                && let Ok(name) = file.file_name().into_string()
            {
                links.push((stream.clone(), name));
            }
        }
    }
    LogListing { links }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use verwalter_controllers::storage::upgrade::Layout;

    use super::*;

    const ENVELOPE: &str = "{\n  \"timestamp\": 1778405723456,\n  \"hash\": \"x\",\n  \"data\": {},\n  \"origin\": \"00\"\n}";

    fn gunzip(path: &Path) -> String {
        let mut text = String::new();
        flate2::read::GzDecoder::new(fs::File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    #[test]
    fn files_013_left_are_moved_copied_and_cleaned_once() {
        let tmp = tempfile::tempdir().unwrap();
        let state_dir = StateDir::new(tmp.path().join("storage"));
        let schedule = schedule_dir(&state_dir);
        let logs = tmp.path().join("log");
        fs::create_dir_all(&schedule).unwrap();
        fs::create_dir_all(logs.join("web")).unwrap();
        fs::write(schedule.join("schedule.json"), ENVELOPE).unwrap();
        fs::write(schedule.join("daily-20260510.json.gz"), b"gz").unwrap();
        fs::write(schedule.join("backup.tmp"), b"gz").unwrap();
        std::os::unix::fs::symlink("log.1.txt", logs.join("web/latest")).unwrap();
        std::os::unix::fs::symlink("log.2.txt", logs.join("web/latest.tmp")).unwrap();

        let done = migrate(&state_dir, &logs).unwrap();
        assert_eq!(done.storage.layout, Layout::V013);
        let backups = state_dir.backups_dir();
        assert_eq!(
            backups::list(&backups).unwrap(),
            ["daily-20260510", "upgrade-20260510T093523"]
        );
        assert_eq!(fs::read(backups.join("daily-20260510")).unwrap(), b"gz");
        assert_eq!(gunzip(&backups.join("upgrade-20260510T093523")), ENVELOPE);
        assert_eq!(
            fs::read_to_string(state_dir.schedule_path()).unwrap(),
            ENVELOPE,
            "the schedule stays where it is, as it is"
        );
        assert!(!schedule.join("backup.tmp").exists());
        assert!(!schedule.join("daily-20260510.json.gz").exists());
        assert!(fs::symlink_metadata(logs.join("web/latest")).is_ok());
        assert!(fs::symlink_metadata(logs.join("web/latest.tmp")).is_err());

        let again = migrate(&state_dir, &logs).unwrap();
        assert!(again.is_empty(), "{again:?}");
    }

    /// A step that fails stops the start with the path; nothing has moved, and once
    /// the cause is gone the next start does it all. A log dir in the way stops nothing.
    #[test]
    fn a_failed_step_loses_nothing_and_is_done_at_the_next_start() {
        let tmp = tempfile::tempdir().unwrap();
        let state_dir = StateDir::new(tmp.path().join("storage"));
        let schedule = schedule_dir(&state_dir);
        fs::create_dir_all(&schedule).unwrap();
        fs::write(schedule.join("schedule.json"), ENVELOPE).unwrap();
        fs::write(schedule.join("weekly-2026w18.json.gz"), b"gz").unwrap();
        fs::write(state_dir.backups_dir(), b"a file where backups/ goes").unwrap();
        let not_a_dir = tmp.path().join("log-is-a-file");
        fs::write(&not_a_dir, b"").unwrap();

        let err = migrate(&state_dir, &not_a_dir).unwrap_err().to_string();
        assert!(
            err.contains("storage/backups: cannot list: Not a directory"),
            "{err}"
        );
        assert!(schedule.join("weekly-2026w18.json.gz").exists());
        assert_eq!(
            fs::read_to_string(state_dir.schedule_path()).unwrap(),
            ENVELOPE
        );

        fs::remove_file(state_dir.backups_dir()).unwrap();
        let done = migrate(&state_dir, &not_a_dir).unwrap();
        assert_eq!(done.storage.moves.len(), 1);
        assert_eq!(
            backups::list(&state_dir.backups_dir()).unwrap(),
            ["upgrade-20260510T093523", "weekly-2026w18"]
        );
    }

    #[test]
    fn nothing_to_do_on_a_fresh_node() {
        let tmp = tempfile::tempdir().unwrap();
        let state_dir = StateDir::new(tmp.path().join("none"));
        let done = migrate(&state_dir, &tmp.path().join("no-log")).unwrap();
        assert!(done.is_empty());
        assert_eq!(done.storage.layout, Layout::Empty);
        assert!(!state_dir.root().exists(), "nothing created");
    }
}
