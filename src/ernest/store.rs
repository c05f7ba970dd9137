//! The executor's builds on disk: per build a snapshot `<storage-dir>/<build id>.json`,
//! replaced atomically, and a journal `<build id>.journal` of records appended since.
//!
//! A snapshot goes through [`crate::storage::state_dir::write_atomic`] (temp file, fsync, rename, fsync
//! of the dir), so a kill leaves the old or the new snapshot, never a part; then the journal is
//! emptied (or made, and the dir synced so that it exists after a crash) and synced. An append
//! writes one record (a JSON line) at the journal's end through a handle kept open per build,
//! then `fdatasync`s it: one small write and one sync per step instead of a whole build.
//!
//! Why a kill at any point loses nothing reported durable: each record carries the run's
//! sequence number and a snapshot the number after the last record it contains
//! ([`verwalter_controllers::ernest::BuildRun::restore_with`] applies only records that follow
//! the snapshot's number). A kill between a snapshot's rename and the journal's truncation
//! leaves old records whose numbers are not above the new snapshot's: replay skips them (and
//! the records of an earlier build with the same id, which carry that build's receive time).
//! A kill
//! during an append leaves part of a record at the end, which was never reported durable:
//! replay stops there, and the executor's first write of the build after a restart is a
//! snapshot, which drops it. After a failed append the loop writes a snapshot next, never
//! another record behind a partial one.
//!
//! File names are injective in the id: a plain id (letters, digits, `-`, `_`, `.`, not
//! leading, at most 128 bytes) is stored as `b-<id>.json` (and `.journal`), any other as
//! `h-<sha256 of id>.json`; the prefixes keep the two kinds apart, and the id itself is inside
//! the snapshot. Files named otherwise (by an earlier version: `<id>.json` and `id-<sha1>.json`,
//! where an id spelled `id-<sha1 of another id>` took the other's files) are moved to their
//! id's name when the builds are loaded, journal first.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use sha2::{Digest, Sha256};
use verwalter_controllers::ernest::BuildRun;
use verwalter_controllers::ernest::build_retention::{self, BuildSummary};
use verwalter_controllers::machinery::ports::{BuildStore, StorageError, StoredBuild};

use crate::storage::state_dir::{FILE_MODE, sync_dir, write_atomic};

pub(crate) struct BuildFiles {
    dir: PathBuf,
    /// Open journals, by path: opened at a build's first append after its snapshot, closed by
    /// the next snapshot or a failed append.
    journals: Arc<Mutex<HashMap<PathBuf, fs::File>>>,
    /// Held shared by every write, and alone by [`BuildFiles::prune`] while it checks a build
    /// and removes its files: a new build with the id of one being removed is written after.
    writing: Arc<DirLock>,
}

/// The lock of a storage dir between its writers and a prune: within the process a
/// read-write lock, and across processes (`verwalter graph builds prune` beside a running
/// executor) a `flock` of `<dir>/.lock`, taken on a descriptor of its own each time.
struct DirLock {
    path: PathBuf,
    threads: RwLock<()>,
}

impl DirLock {
    fn new(dir: &Path) -> DirLock {
        DirLock {
            path: dir.to_owned(),
            threads: RwLock::new(()),
        }
    }

    /// Runs `f` holding the lock, shared or `exclusive`.
    fn hold<T>(&self, exclusive: bool, f: impl FnOnce() -> T) -> io::Result<T> {
        use nix::fcntl::{Flock, FlockArg};
        let _threads = if exclusive {
            (
                None,
                Some(self.threads.write().unwrap_or_else(|e| e.into_inner())),
            )
        } else {
            (
                Some(self.threads.read().unwrap_or_else(|e| e.into_inner())),
                None,
            )
        };
        let mut file = fs::File::open(&self.path)?;
        let arg = if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        };
        let _locked = loop {
            match Flock::lock(file, arg) {
                Ok(locked) => break locked,
                Err((again, nix::errno::Errno::EINTR)) => file = again,
                Err((_, errno)) => return Err(io::Error::from(errno)),
            }
        };
        Ok(f())
    }
}

/// A stored build as `verwalter graph builds` reads it (snapshot and journal replayed).
pub(crate) struct StoredRun {
    pub(crate) path: PathBuf,
    pub(crate) run: BuildRun,
}

impl BuildFiles {
    /// The dir, made if missing.
    pub(crate) fn open(dir: &Path) -> io::Result<BuildFiles> {
        fs::create_dir_all(dir)?;
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            ));
        }
        Ok(BuildFiles {
            dir: dir.to_owned(),
            journals: Arc::default(),
            writing: Arc::new(DirLock::new(dir)),
        })
    }

    /// The dir, which must exist (the offline `builds` commands make nothing).
    pub(crate) fn existing(dir: &Path) -> io::Result<BuildFiles> {
        if !dir.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such directory"));
        }
        BuildFiles::open(dir)
    }

    /// Every build in the dir that can be read (`b-*.json`, `h-*.json` with their journals),
    /// by id; and what could not be read. Nothing is moved or written.
    pub(crate) fn list(&self) -> (Vec<StoredRun>, Vec<String>) {
        let mut runs = Vec::new();
        let mut problems = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => return (runs, vec![format!("{}: {e}", self.dir.display())]),
        };
        for path in entries.filter_map(Result::ok).map(|e| e.path()) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let ours =
                (name.starts_with("b-") || name.starts_with("h-")) && name.ends_with(".json");
            if !ours {
                continue;
            }
            match read_run(&path) {
                Ok(run) => runs.push(StoredRun { path, run }),
                Err(problem) => problems.push(problem),
            }
        }
        runs.sort_by(|a, b| a.run.id().cmp(b.run.id()));
        (runs, problems)
    }

    /// Build `id` as stored, if its file is there.
    pub(crate) fn get(&self, id: &str) -> Result<Option<StoredRun>, String> {
        let path = self.path(id);
        if !path.exists() {
            return Ok(None);
        }
        read_run(&path).map(|run| Some(StoredRun { path, run }))
    }

    /// Removes the files of every finished build whose result was published and that finished
    /// `older_than` ago or more at `now_ms` ([`build_retention::prunable`]); with `dry_run`,
    /// only says which. Each build is read again and removed while no build is being written.
    /// Returns the builds removed and what could not be done.
    pub(crate) fn prune(
        &self,
        now_ms: u64,
        older_than: Duration,
        dry_run: bool,
    ) -> (Vec<BuildSummary>, Vec<String>) {
        let mut problems = Vec::new();
        let mut removed = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => return (removed, vec![format!("{}: {e}", self.dir.display())]),
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|path| {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                (name.starts_with("b-") || name.starts_with("h-")) && name.ends_with(".json")
            })
            .collect();
        paths.sort();
        for path in paths {
            // A running build's snapshot has no result: skipped without the lock, and without
            // reading its journal while records are appended to it.
            if !has_result(&path) {
                continue;
            }
            let outcome = self.writing.hold(true, || {
                let run = match read_run(&path) {
                    Ok(run) => run,
                    // Gone or changed since it was listed.
                    Err(_) => return Ok(None),
                };
                if !build_retention::prunable(&run, now_ms, older_than) {
                    return Ok(None);
                }
                if !dry_run {
                    // The snapshot first: a stop in between leaves a journal without its
                    // snapshot, which is reported and ignored at start, never a build that
                    // looks unsent.
                    fs::remove_file(&path)
                        .map_err(|e| format!("{}: cannot remove: {e}", path.display()))?;
                    let journal = path.with_extension("journal");
                    self.journals.lock().unwrap().remove(&journal);
                    match fs::remove_file(&journal) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => {
                            return Err(format!("{}: cannot remove: {e}", journal.display()));
                        }
                        _ => {}
                    }
                }
                Ok(Some(run))
            });
            let run = match outcome {
                Ok(Ok(Some(run))) => run,
                Ok(Ok(None)) => continue,
                Ok(Err(problem)) => {
                    problems.push(problem);
                    continue;
                }
                Err(e) => {
                    problems.push(format!("{}: cannot lock: {e}", self.writing.path.display()));
                    continue;
                }
            };
            removed.push(BuildSummary::of(&run));
        }
        if !dry_run
            && !removed.is_empty()
            && let Err(e) = sync_dir(&self.dir)
        {
            problems.push(format!("{}: cannot sync: {e}", self.dir.display()));
        }
        (removed, problems)
    }

    /// The snapshot of build `id`.
    pub(crate) fn path(&self, id: &str) -> PathBuf {
        self.dir.join(file_name(id))
    }

    /// The journal of build `id`, beside its snapshot.
    pub(crate) fn journal_path(&self, id: &str) -> PathBuf {
        self.path(id).with_extension("journal")
    }
}

/// The snapshot's file name of build `id`: `b-<id>.json` for a plain id, else
/// `h-<sha256>.json`. Distinct ids never share a name: the prefixes differ between the kinds,
/// a plain name gives its id back, and the hash has no known collisions.
pub(crate) fn file_name(id: &str) -> String {
    let plain = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if plain {
        format!("b-{id}.json")
    } else {
        format!("h-{}.json", hex::encode(Sha256::digest(id.as_bytes())))
    }
}

/// The build stored at `path` (a snapshot) with its journal's records applied.
pub(crate) fn read_run(path: &Path) -> Result<BuildRun, String> {
    let snapshot = fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let journal_path = path.with_extension("journal");
    let journal = match fs::read(&journal_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: cannot read: {e}", journal_path.display())),
    };
    BuildRun::restore_with(&snapshot, BuildRun::journal_records(&journal))
        .map_err(|e| format!("{}: not a stored build: {e}", path.display()))
}

/// Whether the snapshot at `path` holds a result (a finished build's does: its last snapshot is
/// written once it has one).
fn has_result(path: &Path) -> bool {
    #[derive(serde::Deserialize)]
    struct Snapshot {
        #[serde(default)]
        result: Option<serde::de::IgnoredAny>,
    }
    fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Snapshot>(&bytes).ok())
        .is_some_and(|s| s.result.is_some())
}

/// The build id inside a snapshot, if it has one.
fn id_inside(snapshot: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Snapshot {
        build: Build,
    }
    #[derive(serde::Deserialize)]
    struct Build {
        id: String,
    }
    serde_json::from_slice::<Snapshot>(snapshot)
        .ok()
        .map(|s| s.build.id)
}

/// Moves a snapshot found at `path` (and its journal) to the name of the id inside it, when it
/// has another name (an earlier version's). Returns where the build is now, or a problem: the
/// name is taken (the file is then left alone and not loaded).
fn move_to_its_name(dir: &Path, path: &Path, snapshot: &[u8]) -> Result<PathBuf, StorageError> {
    let Some(id) = id_inside(snapshot) else {
        // Not a build: loading it reports that.
        return Ok(path.to_owned());
    };
    let target = dir.join(file_name(&id));
    if target == path {
        return Ok(target);
    }
    let problem = |at: &Path, message: String| StorageError {
        path: at.display().to_string(),
        kind: io::ErrorKind::AlreadyExists,
        message,
    };
    if target.exists() {
        return Err(problem(
            path,
            format!(
                "build {id:?} is also stored as {}: this file (an earlier name) is left alone",
                target.display()
            ),
        ));
    }
    // The journal first: a stop between the two renames leaves the snapshot under its old
    // name, moved (with its journal already in place) at the next start.
    let journal = path.with_extension("journal");
    let moved = (|| {
        if journal.exists() {
            fs::rename(&journal, target.with_extension("journal"))?;
        }
        fs::rename(path, &target)?;
        sync_dir(dir)
    })();
    match moved {
        Ok(()) => {
            tracing::info!(build = %id, from = %path.display(), to = %target.display(),
                "Build file moved to its id's name.");
            Ok(target)
        }
        Err(e) => Err(StorageError::io(path, "cannot move to its id's name", &e)),
    }
}

/// Opens a journal for appending, made private if new; `true` when it was made.
fn open_journal(path: &Path) -> io::Result<(fs::File, bool)> {
    let existed = path.exists();
    let file = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .open(path)?;
    Ok((file, !existed))
}

/// Writes the snapshot, then empties the journal: both durable on `Ok`.
fn save_blocking(path: &Path, journal: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic(path, bytes)?;
    let (file, made) = open_journal(journal)?;
    if file.metadata()?.len() > 0 {
        file.set_len(0)?;
        file.sync_all()?;
    }
    if made {
        // The journal's entry must be durable before an append to it is reported durable.
        file.sync_all()?;
        sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    }
    Ok(())
}

impl BuildStore for BuildFiles {
    fn save(&self, id: String, bytes: Vec<u8>) -> BoxFuture<'static, Result<(), StorageError>> {
        let path = self.path(&id);
        let journal = self.journal_path(&id);
        // The handle's file is truncated below; the next append opens it again.
        self.journals.lock().unwrap().remove(&journal);
        let writing = self.writing.clone();
        async move {
            let at = path.clone();
            tokio::task::spawn_blocking(move || {
                writing
                    .hold(false, || save_blocking(&at, &journal, &bytes))
                    .and_then(|saved| saved)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))
            .map_err(|e| StorageError::io(&path, "cannot write", &e))
        }
        .boxed()
    }

    fn append(&self, id: String, record: Vec<u8>) -> BoxFuture<'static, Result<(), StorageError>> {
        let path = self.journal_path(&id);
        let journals = self.journals.clone();
        let writing = self.writing.clone();
        async move {
            let at = path.clone();
            tokio::task::spawn_blocking(move || {
                writing
                    .hold(false, || {
                        let open = journals.lock().unwrap().remove(&at);
                        let mut file = match open {
                            Some(file) => file,
                            None => open_journal(&at)?.0,
                        };
                        file.write_all(&record)?;
                        file.sync_data()?;
                        // Kept only after a whole record: a failed one drops the handle.
                        journals.lock().unwrap().insert(at, file);
                        Ok(())
                    })
                    .and_then(|appended| appended)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))
            .map_err(|e| StorageError::io(&path, "cannot append to", &e))
        }
        .boxed()
    }

    fn location(&self, id: &str) -> Option<String> {
        Some(self.path(id).display().to_string())
    }

    fn load(&self) -> (Vec<StoredBuild>, Vec<StorageError>) {
        let mut builds = Vec::new();
        let mut problems = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => return (builds, vec![StorageError::io(&self.dir, "cannot list", &e)]),
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        paths.sort();
        // Snapshots where they are after any move, and journals as listed: a journal is
        // checked against the former once every snapshot is in place.
        let mut snapshots: HashSet<PathBuf> = HashSet::new();
        let mut journals = Vec::new();
        for path in &paths {
            if path.extension().is_some_and(|x| x == "journal") {
                journals.push(path);
                continue;
            }
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let snapshot = match fs::read(path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    snapshots.insert(path.clone());
                    problems.push(StorageError::io(path, "cannot read", &e));
                    continue;
                }
            };
            let path = match move_to_its_name(&self.dir, path, &snapshot) {
                Ok(path) => path,
                Err(problem) => {
                    snapshots.insert(path.clone());
                    problems.push(problem);
                    continue;
                }
            };
            snapshots.insert(path.clone());
            let journal_path = path.with_extension("journal");
            let journal = match fs::read(&journal_path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(e) => {
                    // Without its journal the build would go back and dispatch again what
                    // completed since the snapshot: it is left alone for an operator.
                    problems.push(StorageError::io(&journal_path, "cannot read", &e));
                    continue;
                }
            };
            builds.push(StoredBuild { snapshot, journal });
        }
        for journal in journals {
            // A journal moved with its snapshot is no longer there.
            if journal.exists() && !snapshots.contains(&journal.with_extension("json")) {
                problems.push(StorageError {
                    path: journal.display().to_string(),
                    kind: io::ErrorKind::NotFound,
                    message: "journal without its snapshot: ignored".into(),
                });
            }
        }
        (builds, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn builds_are_written_whole_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let files = BuildFiles::open(&tmp.path().join("graph")).unwrap();
        files
            .save("svc-1".into(), b"{\"a\":1}".to_vec())
            .await
            .unwrap();
        files
            .save("svc-1".into(), b"{\"a\":2}".to_vec())
            .await
            .unwrap();
        files.save("../x".into(), b"{}".to_vec()).await.unwrap();
        assert_eq!(files.path("svc-1"), tmp.path().join("graph/b-svc-1.json"));
        assert!(
            files
                .path("../x")
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("h-")
        );
        let (builds, problems) = files.load();
        assert!(problems.is_empty());
        assert_eq!(builds.len(), 2);
        assert!(builds.iter().any(|b| b.snapshot == b"{\"a\":2}"));
        // No temp file is left beside them: two snapshots, two (empty) journals.
        assert_eq!(fs::read_dir(tmp.path().join("graph")).unwrap().count(), 4);
    }

    fn snapshot_of(id: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"build": {"id": id}, "seq": 1})).unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn ids_that_shared_a_file_pair_before_have_their_own() {
        // Before: `a/b` was stored as `id-<sha1 of a/b>`, which is also the plain name of the
        // id spelled that way; the second build overwrote the first's files.
        let sha1 = {
            use sha1::Digest as _;
            hex::encode(sha1::Sha1::digest(b"a/b"))
        };
        let spelled = format!("id-{sha1}");
        let sha256 = hex::encode(Sha256::digest(b"a/b"));
        let pairs = [
            ("a/b".to_string(), spelled.clone()),
            ("a/b".to_string(), format!("h-{sha256}")),
            ("x y".to_string(), "b-x".to_string()),
            ("b-x".to_string(), "x".to_string()),
        ];
        for (one, other) in &pairs {
            assert_ne!(file_name(one), file_name(other), "{one:?} and {other:?}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let files = BuildFiles::open(tmp.path()).unwrap();
        for id in ["a/b", spelled.as_str()] {
            files.save(id.into(), snapshot_of(id)).await.unwrap();
            files.append(id.into(), b"r\n".to_vec()).await.unwrap();
        }
        // After a restart both are there.
        let (builds, problems) = BuildFiles::open(tmp.path()).unwrap().load();
        assert!(problems.is_empty(), "{problems:?}");
        let mut ids: Vec<String> = builds
            .iter()
            .map(|b| id_inside(&b.snapshot).unwrap())
            .collect();
        ids.sort();
        assert_eq!(ids, ["a/b".to_string(), spelled.clone()]);
        assert_eq!(
            names(tmp.path()),
            [
                format!("b-{spelled}.journal"),
                format!("b-{spelled}.json"),
                format!("h-{sha256}.journal"),
                format!("h-{sha256}.json"),
            ]
        );
    }

    #[test]
    fn files_of_the_earlier_naming_are_moved_to_their_ids_names() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let sha1 = {
            use sha1::Digest as _;
            hex::encode(sha1::Sha1::digest(b"a/b"))
        };
        // `svc` as `svc.json` with a journal; `a/b` as `id-<sha1>.json`; `b-x` (a plain id that
        // looks like the new naming of `x`) as `b-x.json`; and `half`, stopped between the
        // two renames: its journal moved, its snapshot not.
        fs::write(dir.join("svc.json"), snapshot_of("svc")).unwrap();
        fs::write(dir.join("svc.journal"), b"r1\n").unwrap();
        fs::write(dir.join(format!("id-{sha1}.json")), snapshot_of("a/b")).unwrap();
        fs::write(dir.join("b-x.json"), snapshot_of("b-x")).unwrap();
        fs::write(dir.join("half.json"), snapshot_of("half")).unwrap();
        fs::write(dir.join("b-half.journal"), b"r2\n").unwrap();
        // A build stored under both names: the earlier file is left alone, with a problem.
        fs::write(dir.join("twice.json"), snapshot_of("twice")).unwrap();
        fs::write(dir.join("b-twice.json"), snapshot_of("twice")).unwrap();

        let files = BuildFiles::open(dir).unwrap();
        let (builds, problems) = files.load();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].path.ends_with("/twice.json")
                && problems[0].message.contains("is also stored as"),
            "{problems:?}"
        );
        let mut got: Vec<(String, Vec<u8>)> = builds
            .iter()
            .map(|b| (id_inside(&b.snapshot).unwrap(), b.journal.clone()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("a/b".to_string(), vec![]),
                ("b-x".to_string(), vec![]),
                ("half".to_string(), b"r2\n".to_vec()),
                ("svc".to_string(), b"r1\n".to_vec()),
                ("twice".to_string(), vec![]),
            ]
        );
        let sha256 = hex::encode(Sha256::digest(b"a/b"));
        assert_eq!(
            names(dir),
            [
                "b-b-x.json".to_string(),
                "b-half.journal".into(),
                "b-half.json".into(),
                "b-svc.journal".into(),
                "b-svc.json".into(),
                "b-twice.json".into(),
                format!("h-{sha256}.json"),
                "twice.json".into(),
            ]
        );
        // Loaded again: the same builds, nothing moves.
        let (again, problems) = files.load();
        assert_eq!(again.len(), 5);
        assert_eq!(problems.len(), 1);
    }

    fn one(files: &BuildFiles) -> StoredBuild {
        let (builds, problems) = files.load();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(builds.len(), 1);
        builds.into_iter().next().unwrap()
    }

    /// Whether `/proc/locks` shows a request blocked on a FLOCK of the inode `ino`.
    fn flock_waiter_on(ino: u64) -> bool {
        let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
        locks.lines().any(|l| {
            l.contains("->")
                && l.contains("FLOCK")
                && l.split_whitespace()
                    .any(|field| field.rsplit(':').next() == Some(&ino.to_string()))
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_waits_for_a_prune_in_another_process() {
        use nix::fcntl::{Flock, FlockArg};
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let files = BuildFiles::open(tmp.path()).unwrap();
        // Another process's prune holds the dir (a descriptor of its own, as there).
        let held = Flock::lock(fs::File::open(tmp.path()).unwrap(), FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .unwrap();
        let save = tokio::spawn(files.save("w1".into(), snapshot_of("w1")));
        let ino = fs::metadata(tmp.path()).unwrap().ino();
        // Polled until the kernel shows the write queued behind the lock (30 s at most).
        let mut waiting = false;
        for _ in 0..6000 {
            if flock_waiter_on(ino) {
                waiting = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(waiting, "the write never waited for the lock");
        // The lock is held: the write has not happened.
        assert!(!files.path("w1").exists());
        drop(held);
        save.await.unwrap().unwrap();
        assert!(files.path("w1").exists());
    }

    #[tokio::test]
    async fn records_are_appended_and_a_snapshot_empties_the_journal() {
        let tmp = tempfile::tempdir().unwrap();
        let files = BuildFiles::open(tmp.path()).unwrap();
        files.save("b".into(), b"{\"s\":1}".to_vec()).await.unwrap();
        let journal = files.journal_path("b");
        assert_eq!(journal, tmp.path().join("b-b.journal"));
        assert_eq!(fs::read(&journal).unwrap(), b"", "made with the snapshot");
        files.append("b".into(), b"r1\n".to_vec()).await.unwrap();
        files.append("b".into(), b"r2\n".to_vec()).await.unwrap();
        assert_eq!(
            one(&files),
            StoredBuild {
                snapshot: b"{\"s\":1}".to_vec(),
                journal: b"r1\nr2\n".to_vec()
            }
        );
        // A snapshot empties the journal; the next append starts it again.
        files.save("b".into(), b"{\"s\":2}".to_vec()).await.unwrap();
        assert_eq!(one(&files).journal, b"");
        files.append("b".into(), b"r3\n".to_vec()).await.unwrap();
        assert_eq!(
            one(&files),
            StoredBuild {
                snapshot: b"{\"s\":2}".to_vec(),
                journal: b"r3\n".to_vec()
            }
        );
        // Another store on the same dir (a restart) reads the same, and appends behind it.
        let again = BuildFiles::open(tmp.path()).unwrap();
        again.append("b".into(), b"r4\n".to_vec()).await.unwrap();
        assert_eq!(one(&again).journal, b"r3\nr4\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&journal).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, FILE_MODE, "private, like the snapshot");
    }

    /// A build run through the store, killed at the worst moments: a torn record at the
    /// journal's end, and a snapshot renamed in place with the old records still behind it.
    #[tokio::test]
    async fn a_torn_record_and_records_older_than_the_snapshot_are_not_replayed() {
        use serde_json::json;
        use verwalter_controllers::ernest::{BuildRun, RunSettings};
        use verwalter_controllers::graph::ErrorPolicy;

        let tmp = tempfile::tempdir().unwrap();
        let files = BuildFiles::open(tmp.path()).unwrap();
        let build = serde_json::from_value(json!({"id": "b", "changes": [
            {"_component_id": "a::1", "_component": "a", "_action": "create", "_provider": "p"},
            {"_component_id": "a::2", "_component": "a", "_action": "create", "_provider": "p"}
        ], "edges": [{"source": "a::1", "destination": "a::2"}]}))
        .unwrap();
        let settings = RunSettings {
            policy: ErrorPolicy::Halt,
            component_timeout: std::time::Duration::from_secs(60),
            templating: Default::default(),
        };
        let mut run = BuildRun::new("build.create", build, settings, 0);
        let first = run.pump(0);
        run.clear_delta();
        files
            .save("b".into(), serde_json::to_vec(&run).unwrap())
            .await
            .unwrap();
        let answer = serde_json::from_slice(&first[0].payload).unwrap();
        run.answer(answer, false, 5);
        let second = run.pump(5);
        assert_eq!(second.len(), 1, "a::2 dispatched");
        let mut record = serde_json::to_vec(&run.take_delta().unwrap()).unwrap();
        record.push(b'\n');
        files.append("b".into(), record.clone()).await.unwrap();
        let expected = serde_json::to_value(&run).unwrap();
        let replay = |stored: &StoredBuild| {
            let records = BuildRun::journal_records(&stored.journal);
            let run = BuildRun::restore_with(&stored.snapshot, records).unwrap();
            serde_json::to_value(&run).unwrap()
        };
        assert_eq!(replay(&one(&files)), expected);

        // A kill in the middle of the next append: its half is not replayed.
        let answer = serde_json::from_slice(&second[0].payload).unwrap();
        run.answer(answer, false, 9);
        let mut next = serde_json::to_vec(&run.take_delta().unwrap()).unwrap();
        next.push(b'\n');
        let mut journal = fs::OpenOptions::new()
            .append(true)
            .open(files.journal_path("b"))
            .unwrap();
        journal.write_all(&next[..next.len() / 2]).unwrap();
        assert_eq!(
            replay(&one(&files)),
            expected,
            "the torn record is left out"
        );

        // A kill after a snapshot's rename, before the journal was emptied: write the
        // snapshot alone, with the old (and torn) records still in the journal.
        run.pump(9);
        assert!(run.finished());
        run.clear_delta();
        write_atomic(&files.path("b"), &serde_json::to_vec(&run).unwrap()).unwrap();
        let stored = one(&files);
        assert!(
            stored.journal.starts_with(&record),
            "the old records are there"
        );
        let back = replay(&stored);
        assert_eq!(back, serde_json::to_value(&run).unwrap());
        assert_eq!(back["result"]["kind"], "done");
    }

    #[tokio::test]
    async fn a_journal_without_its_snapshot_is_a_problem_and_not_a_build() {
        let tmp = tempfile::tempdir().unwrap();
        let files = BuildFiles::open(tmp.path()).unwrap();
        files.save("b".into(), b"{}".to_vec()).await.unwrap();
        fs::write(tmp.path().join("lost.journal"), b"r\n").unwrap();
        let (builds, problems) = files.load();
        assert_eq!(builds.len(), 1);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].path.ends_with("lost.journal"), "{problems:?}");
    }
}
