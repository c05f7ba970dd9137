//! The executor's builds on disk: per build a snapshot `<storage-dir>/<build id>.json`,
//! replaced atomically, and a journal `<build id>.journal` of records appended since.
//!
//! A snapshot goes through [`crate::state_dir::write_atomic`] (temp file, fsync, rename, fsync
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
//! An id that is not a plain file name (a `/`, a leading dot, odd characters) is stored as
//! `id-<sha1 of id>.json` (and `.journal`); the id itself is inside the snapshot.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt};
use sha1::{Digest, Sha1};
use verwalter_controllers::ports::{BuildStore, StorageError, StoredBuild};

use crate::state_dir::{FILE_MODE, sync_dir, write_atomic};

pub struct BuildFiles {
    dir: PathBuf,
    /// Open journals, by path: opened at a build's first append after its snapshot, closed by
    /// the next snapshot or a failed append.
    journals: Arc<Mutex<HashMap<PathBuf, fs::File>>>,
}

impl BuildFiles {
    /// The dir, made if missing.
    pub fn open(dir: &Path) -> io::Result<BuildFiles> {
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
        })
    }

    /// The snapshot of build `id`.
    pub fn path(&self, id: &str) -> PathBuf {
        let plain = !id.is_empty()
            && id.len() <= 128
            && !id.starts_with('.')
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        let name = if plain {
            format!("{id}.json")
        } else {
            format!("id-{}.json", hex::encode(Sha1::digest(id.as_bytes())))
        };
        self.dir.join(name)
    }

    /// The journal of build `id`, beside its snapshot.
    pub fn journal_path(&self, id: &str) -> PathBuf {
        self.path(id).with_extension("journal")
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
        async move {
            let at = path.clone();
            tokio::task::spawn_blocking(move || save_blocking(&at, &journal, &bytes))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
                .map_err(|e| StorageError::io(&path, "cannot write", &e))
        }
        .boxed()
    }

    fn append(&self, id: String, record: Vec<u8>) -> BoxFuture<'static, Result<(), StorageError>> {
        let path = self.journal_path(&id);
        let journals = self.journals.clone();
        async move {
            let at = path.clone();
            tokio::task::spawn_blocking(move || {
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
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))
            .map_err(|e| StorageError::io(&path, "cannot append to", &e))
        }
        .boxed()
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
        let names: HashSet<&PathBuf> = paths.iter().collect();
        for path in &paths {
            if path.extension().is_some_and(|x| x == "journal")
                && !names.contains(&path.with_extension("json"))
            {
                problems.push(StorageError {
                    path: path.display().to_string(),
                    kind: io::ErrorKind::NotFound,
                    message: "journal without its snapshot: ignored".into(),
                });
            }
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let snapshot = match fs::read(path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    problems.push(StorageError::io(path, "cannot read", &e));
                    continue;
                }
            };
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
        assert_eq!(files.path("svc-1"), tmp.path().join("graph/svc-1.json"));
        assert!(
            files
                .path("../x")
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("id-")
        );
        let (builds, problems) = files.load();
        assert!(problems.is_empty());
        assert_eq!(builds.len(), 2);
        assert!(builds.iter().any(|b| b.snapshot == b"{\"a\":2}"));
        // No temp file is left beside them: two snapshots, two (empty) journals.
        assert_eq!(fs::read_dir(tmp.path().join("graph")).unwrap().count(), 4);
    }

    fn one(files: &BuildFiles) -> StoredBuild {
        let (builds, problems) = files.load();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(builds.len(), 1);
        builds.into_iter().next().unwrap()
    }

    #[tokio::test]
    async fn records_are_appended_and_a_snapshot_empties_the_journal() {
        let tmp = tempfile::tempdir().unwrap();
        let files = BuildFiles::open(tmp.path()).unwrap();
        files.save("b".into(), b"{\"s\":1}".to_vec()).await.unwrap();
        let journal = files.journal_path("b");
        assert_eq!(journal, tmp.path().join("b.journal"));
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
