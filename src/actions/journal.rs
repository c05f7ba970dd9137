//! The on-disk journal of pending actions (`<storage>/actions.journal`): one JSON record per
//! line, appended by one writer thread that syncs each batch once (group commit), so an action
//! is acknowledged only once it is on disk, and concurrent requests share an fsync.
//!
//! Records: `{"add":<id>,"action":<json>}` makes an action pending, `{"remove":[<id>,...]}`
//! ends some. Loading replays them in order; a last line without its newline (a write cut short
//! by a crash) is ignored, everything before it kept. When the file has grown well past what is
//! still pending, and at every start, it is rewritten with one `add` per pending action (a temp
//! file of its own, fsync, rename, fsync of the dir).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use serde_json::Value;
use tokio::sync::oneshot;
use verwalter_controllers::state::Actions;

use crate::state_dir::{FILE_MODE, write_atomic};

/// Below this size the journal is never compacted: rewriting a small file saves nothing.
const COMPACT_MIN_BYTES: u64 = 256 << 10;

#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: cannot write: {message}")]
    Write { path: PathBuf, message: String },
    #[error("the action journal's writer thread is gone")]
    Gone,
}

/// One line of the journal.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Record {
    Add { add: u64, action: Value },
    Remove { remove: Vec<u64> },
}

enum Change {
    Add(u64, Vec<u8>),
    Remove(Vec<u64>),
}

struct Request {
    change: Change,
    done: Option<oneshot::Sender<Result<(), JournalError>>>,
}

/// The handle of the writer thread; the thread ends when the handle is dropped.
#[derive(Debug)]
pub struct Journal {
    tx: mpsc::Sender<Request>,
}

impl Journal {
    /// Loads the pending actions from `path` (and from `legacy`, the `actions.json` of versions
    /// before the journal, which is removed once its actions are in the journal), rewrites the
    /// journal with them, and starts the writer thread.
    pub fn open(path: PathBuf, legacy: Option<&Path>) -> io::Result<(Journal, Actions)> {
        let (mut live, good_len) = load(&path)?;
        let legacy = legacy.filter(|p| p.exists());
        if let Some(legacy) = legacy {
            match fs::read(legacy).map(|b| serde_json::from_slice::<Actions>(&b)) {
                Ok(Ok(actions)) => {
                    for (id, action) in actions {
                        live.entry(id).or_insert_with(|| add_line(id, &action));
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(path = %legacy.display(), error = %e, "Ignoring unreadable pending actions.");
                }
                Err(e) => {
                    tracing::warn!(path = %legacy.display(), error = %e, "Cannot read the pending actions of an older version.");
                }
            }
        }
        let mut writer = Writer {
            file: None,
            path,
            live,
            len: 0,
            needs_compact: false,
        };
        match writer.compact() {
            Ok(()) => {
                if let Some(legacy) = legacy
                    && fs::remove_file(legacy).is_ok()
                    && let Some(dir) = legacy.parent()
                {
                    // Else a power loss could bring it back, and its actions, consumed since,
                    // would be pending again.
                    let _ = crate::state_dir::sync_dir(dir);
                }
            }
            Err(e) => {
                // Keep what is there untouched (the old journal, or already the rewritten one):
                // every append first tries the rewrite again, and fails while it fails.
                tracing::error!(path = %writer.path.display(), error = %e, "Cannot rewrite the action journal; actions are refused until it can be.");
                writer.len = good_len;
            }
        }
        let actions = writer
            .live
            .iter()
            .filter_map(|(id, line)| match serde_json::from_slice(line) {
                Ok(Record::Add { action, .. }) => Some((*id, action)),
                _ => None,
            })
            .collect();
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("actions-journal".into())
            .spawn(move || writer.run(rx))?;
        Ok((Journal { tx }, actions))
    }

    /// Appends an `add` record; resolves once it is synced to disk.
    pub async fn add(&self, id: u64, action: &Value) -> Result<(), JournalError> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Request {
                change: Change::Add(id, add_line(id, action)),
                done: Some(done),
            })
            .map_err(|_| JournalError::Gone)?;
        wait.await.map_err(|_| JournalError::Gone)?
    }

    /// Appends a `remove` record without waiting for it: if a crash loses it, the actions are
    /// pending again after the restart and the scheduler sees them once more.
    pub fn remove(&self, ids: &[u64]) {
        let _ = self.tx.send(Request {
            change: Change::Remove(ids.to_vec()),
            done: None,
        });
    }
}

fn add_line(id: u64, action: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(&Record::Add {
        add: id,
        action: action.clone(),
    })
    .expect("a record serializes");
    line.push(b'\n');
    line
}

fn open_append(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Replays the journal: the pending actions (as their `add` lines) and the length of its whole
/// lines.
/// A journal that exists but cannot be read is an error: taking it for "no actions" would
/// rewrite it empty and lose every pending action.
fn load(path: &Path) -> io::Result<(BTreeMap<u64, Vec<u8>>, u64)> {
    let mut live = BTreeMap::new();
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((live, 0)),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot read the action journal {}: {e}", path.display()),
            ));
        }
    };
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if whole < bytes.len() {
        tracing::warn!(path = %path.display(), bytes = bytes.len() - whole, "Ignoring a torn last record of the action journal (a crash cut it short).");
    }
    for (n, line) in bytes[..whole].split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Record>(line) {
            Ok(Record::Add { add, .. }) => {
                let mut owned = line.to_vec();
                owned.push(b'\n');
                live.insert(add, owned);
            }
            Ok(Record::Remove { remove }) => {
                for id in remove {
                    live.remove(&id);
                }
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), line = n + 1, error = %e, "Ignoring a bad record of the action journal.");
            }
        }
    }
    Ok((live, whole as u64))
}

/// The writer thread's state: the file and the pending actions as their `add` lines.
struct Writer {
    file: Option<fs::File>,
    path: PathBuf,
    live: BTreeMap<u64, Vec<u8>>,
    /// Length of the file's whole records.
    len: u64,
    /// A write failed after part of it may have landed, or a remove was not written: the next
    /// batch rewrites the file from `live`.
    needs_compact: bool,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Request>) {
        while let Ok(first) = rx.recv() {
            // Everything queued while the last fsync ran goes into this one.
            let mut batch = vec![first];
            batch.extend(rx.try_iter());
            let mut bytes = Vec::new();
            for request in &batch {
                match &request.change {
                    Change::Add(_, line) => bytes.extend_from_slice(line),
                    Change::Remove(ids) => {
                        let mut line = serde_json::to_vec(&Record::Remove {
                            remove: ids.clone(),
                        })
                        .expect("a record serializes");
                        line.push(b'\n');
                        bytes.extend_from_slice(&line);
                    }
                }
            }
            let result = self.append(&bytes);
            if let Err(e) = &result {
                tracing::error!(path = %self.path.display(), error = %e, "Cannot write the action journal.");
            }
            let mut waiters = Vec::new();
            for request in batch {
                match request.change {
                    Change::Add(id, line) => {
                        if result.is_ok() {
                            self.live.insert(id, line);
                        }
                    }
                    Change::Remove(ids) => {
                        // Gone from memory either way; a failed write is made good by the
                        // rewrite below.
                        for id in ids {
                            self.live.remove(&id);
                        }
                    }
                }
                waiters.extend(request.done);
            }
            let reply = result.map_err(|e| JournalError::Write {
                path: self.path.clone(),
                message: e.to_string(),
            });
            for done in waiters {
                let _ = done.send(reply.clone());
            }
            let live_bytes: u64 = self.live.values().map(|l| l.len() as u64).sum();
            let grown = self.len >= COMPACT_MIN_BYTES && self.len >= 2 * live_bytes;
            if (self.needs_compact || grown)
                && let Err(e) = self.compact()
            {
                tracing::error!(path = %self.path.display(), error = %e, "Cannot compact the action journal.");
            }
        }
    }

    /// Appends and syncs `bytes`; on failure cuts the file back to its whole records.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.needs_compact {
            self.compact()?;
        }
        if self.file.is_none() {
            self.file = Some(open_append(&self.path)?);
        }
        let file = self.file.as_mut().expect("opened above");
        let result = file.write_all(bytes).and_then(|()| file.sync_data());
        match result {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                // What landed is unknown (a failed fsync leaves the file's state undefined), and
                // removes of this batch are gone from `live` but not from the file: the next
                // batch rewrites the file from `live` first.
                let _ = file.set_len(self.len);
                self.needs_compact = true;
                Err(e)
            }
        }
    }

    /// Rewrites the journal with one `add` per pending action.
    ///
    /// On any failure the open handle is dropped and the rewrite is due again: once the rename
    /// happened, the handle names the file it unlinked, and records appended to it would be
    /// acknowledged and lost.
    fn compact(&mut self) -> io::Result<()> {
        self.file = None;
        self.needs_compact = true;
        let bytes: Vec<u8> = self.live.values().flatten().copied().collect();
        write_atomic(&self.path, &bytes)?;
        self.file = Some(open_append(&self.path)?);
        self.len = bytes.len() as u64;
        self.needs_compact = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn actions_survive_a_reopen_and_removed_ones_stay_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("actions.journal");
        let (journal, loaded) = Journal::open(path.clone(), None).unwrap();
        assert!(loaded.is_empty());
        journal.add(1, &json!({"a": 1})).await.unwrap();
        journal.add(2, &json!({"b": 2})).await.unwrap();
        journal.remove(&[1]);
        journal.add(3, &json!("c")).await.unwrap();
        drop(journal);
        let (_journal, loaded) = Journal::open(path.clone(), None).unwrap();
        assert_eq!(
            loaded,
            Actions::from([(2, json!({"b": 2})), (3, json!("c"))])
        );
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(
            text, "{\"add\":2,\"action\":{\"b\":2}}\n{\"add\":3,\"action\":\"c\"}\n",
            "rewritten at start"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A crash in the middle of an append leaves a torn last line: it is ignored and every
    /// record before it kept (a torn `actions.json` used to lose every pending action).
    #[tokio::test]
    async fn a_torn_last_record_is_ignored_and_the_rest_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("actions.journal");
        fs::write(
            &path,
            "{\"add\":1,\"action\":{\"a\":1}}\n{\"add\":2,\"action\":\"b\"}\n{\"remove\":[1]}\n{\"add\":3,\"act",
        )
        .unwrap();
        let (journal, loaded) = Journal::open(path.clone(), None).unwrap();
        assert_eq!(loaded, Actions::from([(2, json!("b"))]));
        // Appends after the load start on a line of their own.
        journal.add(4, &json!(4)).await.unwrap();
        drop(journal);
        let (_journal, loaded) = Journal::open(path, None).unwrap();
        assert_eq!(loaded, Actions::from([(2, json!("b")), (4, json!(4))]));
    }

    #[test]
    fn a_journal_that_cannot_be_read_is_an_error_not_an_empty_queue() {
        let tmp = tempfile::tempdir().unwrap();
        // A directory where the journal should be: reading it fails, but not for "not found".
        let path = tmp.path().join("actions.journal");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("keep"), "x").unwrap();
        let err = Journal::open(path.clone(), None).expect_err("an error");
        assert!(
            err.to_string().contains("cannot read the action journal"),
            "{err}"
        );
        assert!(path.join("keep").exists(), "nothing was rewritten");
    }

    #[test]
    fn after_a_failed_rewrite_nothing_is_appended_to_the_old_file() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("actions.journal");
        fs::write(tmp.path().join("blocked"), "a file").unwrap();
        let mut writer = Writer {
            file: Some(open_append(&old).unwrap()),
            // A rewrite here fails: a file is in the way of its dir.
            path: tmp.path().join("blocked/actions.journal"),
            live: BTreeMap::from([(1, b"{\"add\":1,\"action\":1}\n".to_vec())]),
            len: 0,
            needs_compact: false,
        };
        assert!(writer.compact().is_err());
        // The handle may name a file the rename unlinked: it is dropped, and every append
        // retries the rewrite first, failing while it fails.
        assert!(writer.file.is_none() && writer.needs_compact);
        assert!(writer.append(b"{\"add\":2,\"action\":2}\n").is_err());
        assert_eq!(fs::read(&old).unwrap(), b"", "nothing went to the old file");
        // An append error of any kind makes the next batch rewrite from `live`.
        fs::remove_file(tmp.path().join("blocked")).unwrap();
        assert!(writer.append(b"{\"add\":3,\"action\":3}\n").is_ok());
        assert!(!writer.needs_compact);
        let (_journal, loaded) = Journal::open(writer.path.clone(), None).unwrap();
        assert_eq!(loaded, Actions::from([(1, json!(1)), (3, json!(3))]));
    }

    #[tokio::test]
    async fn the_actions_json_of_older_versions_is_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("actions.journal");
        let legacy = tmp.path().join("actions.json");
        fs::write(&legacy, r#"{"7":{"old":true}}"#).unwrap();
        let (journal, loaded) = Journal::open(path.clone(), Some(&legacy)).unwrap();
        assert_eq!(loaded, Actions::from([(7, json!({"old": true}))]));
        assert!(!legacy.exists(), "removed once in the journal");
        drop(journal);
        let (_journal, loaded) = Journal::open(path, Some(&legacy)).unwrap();
        assert_eq!(loaded, Actions::from([(7, json!({"old": true}))]));
    }

    /// Many concurrent adds share fsyncs and every acknowledged one is in the file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_adds_are_all_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("actions.journal");
        let (journal, _) = Journal::open(path.clone(), None).unwrap();
        let journal = std::sync::Arc::new(journal);
        let tasks: Vec<_> = (0..200u64)
            .map(|id| {
                let journal = journal.clone();
                tokio::spawn(async move { journal.add(id, &json!({"n": id})).await })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let (_, loaded) = Journal::open(path, None).unwrap();
        assert_eq!(loaded.len(), 200);
    }
}
