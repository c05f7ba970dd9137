//! Placement data from a snapshot file: JSON or YAML in the `Snapshot` shape, read at start and
//! again whenever it changes.
//!
//! The file's dir is watched (not the file: editors and deploy tools replace it by renaming, and
//! a Kubernetes ConfigMap swaps a symlink beside it), bursts of events are debounced, and the
//! file is re-read every minute anyway in case an event was lost (every 2 s when the dir cannot
//! be watched, e.g. it does not exist yet). Unchanged bytes publish nothing. A file that cannot be
//! read or parsed keeps the last good snapshot in force; the problem is recorded in the store
//! (shown by `/status` and the `verwalter_placement_source_failing` metric) and logged once.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::inputs;
use verwalter_placement::Snapshot;

use super::store::SnapshotStore;

/// The source's name in the store's errors and the metrics.
pub(crate) const SOURCE: &str = "snapshot-file";
/// Quiet time that ends a burst of events (a write-rename sequence).
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Upper bound on the wait while events keep coming.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// Re-read this often even without events (lost events, a watch on a network file system).
const RESYNC: Duration = Duration::from_secs(60);
/// Re-read this often when the dir cannot be watched.
const POLL: Duration = Duration::from_secs(2);

/// Parses a snapshot file's bytes: JSON for `*.json`, YAML otherwise (YAML takes JSON too).
/// Errors name the file and line.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Snapshot, String> {
    let json = path.extension().is_some_and(|e| e == "json");
    if json {
        serde_json::from_slice(bytes).map_err(|e| format!("{}:{}: {e}", path.display(), e.line()))
    } else {
        serde_norway::from_slice(bytes).map_err(|e| match e.location() {
            Some(at) => format!("{}:{}: {e}", path.display(), at.line()),
            None => format!("{}: {e}", path.display()),
        })
    }
}

/// The snapshot file source: one file, one store.
pub(crate) struct SnapshotFile {
    path: PathBuf,
    store: SnapshotStore,
    /// A hash of the bytes last published, to publish only changes.
    published: Option<u64>,
    /// The problem last reported, logged once.
    failing: Option<String>,
}

impl SnapshotFile {
    pub(crate) fn new(path: PathBuf, store: SnapshotStore) -> SnapshotFile {
        SnapshotFile {
            path,
            store,
            published: None,
            failing: None,
        }
    }

    /// Reads the file once, off the async runtime, and publishes or records what it found.
    pub(crate) async fn refresh(&mut self) {
        let path = self.path.clone();
        let read = tokio::task::spawn_blocking(move || read(&path)).await;
        let read = read.unwrap_or_else(|e| Err(format!("reading panicked: {e}")));
        self.apply(read);
    }

    fn apply(&mut self, read: Result<(u64, Snapshot), String>) {
        match read {
            Ok((hash, snapshot)) => {
                if self.failing.take().is_some() {
                    tracing::info!(file = %self.path.display(), "The snapshot file is good again.");
                }
                if self.published == Some(hash) {
                    self.store.clear_error(SOURCE);
                    return;
                }
                tracing::info!(
                    file = %self.path.display(),
                    nodes = snapshot.node_capacities.len(),
                    apps = snapshot.apps_spec.len(),
                    "Loaded the snapshot file."
                );
                self.store.publish(SOURCE, snapshot);
                self.published = Some(hash);
            }
            Err(problem) => {
                if self.failing.as_ref() != Some(&problem) {
                    if self.published.is_some() {
                        tracing::error!(
                            error = %problem,
                            "Cannot use the snapshot file; the last good snapshot stays."
                        );
                    } else {
                        tracing::error!(
                            error = %problem,
                            "Cannot use the snapshot file; no snapshot loaded yet (filter answers that it is not loaded)."
                        );
                    }
                }
                self.store.report_error(SOURCE, problem.clone());
                self.failing = Some(problem);
            }
        }
    }

    /// Re-reads after every change until `shutdown` (the first read is [`SnapshotFile::refresh`]).
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let (tx, mut events) = mpsc::unbounded_channel::<()>();
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let handler = move |event: notify::Result<notify::Event>| {
            // Our own reads open and close the file: only a close after writing is new content.
            let relevant = match &event {
                Ok(e) => {
                    !matches!(e.kind, EventKind::Access(_))
                        || matches!(
                            e.kind,
                            EventKind::Access(AccessKind::Close(AccessMode::Write))
                        )
                }
                Err(_) => true,
            };
            if relevant {
                let _ = tx.send(());
            }
        };
        let watcher = notify::RecommendedWatcher::new(handler, notify::Config::default())
            .and_then(|mut w| w.watch(&dir, RecursiveMode::NonRecursive).map(|()| w));
        let (_watcher, resync) = match watcher {
            Ok(w) => (Some(w), RESYNC),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error,
                    "Cannot watch the snapshot file's dir; reading the file every 2 s instead.");
                (None, POLL)
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                Some(()) = events.recv() => {
                    let first = Instant::now();
                    let mut last = first;
                    loop {
                        let read_at = inputs::read_at(first, last, DEBOUNCE, MAX_DELAY);
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            Some(()) = events.recv() => last = Instant::now(),
                            _ = tokio::time::sleep_until(read_at) => break,
                        }
                    }
                }
                _ = tokio::time::sleep(resync) => {}
            }
            self.refresh().await;
        }
    }
}

/// The file's bytes' hash and its snapshot.
fn read(path: &Path) -> Result<(u64, Snapshot), String> {
    let bytes = super::input::read_capped(path, super::input::MAX_SNAPSHOT_BYTES)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let mut hasher = std::hash::DefaultHasher::new();
    bytes.hash(&mut hasher);
    let snapshot = parse(path, &bytes)?;
    Ok((hasher.finish(), snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_parse_and_errors_name_file_and_line() {
        let s = parse(
            Path::new("s.json"),
            br#"{"node_capacities": {"n1": {"cpu": 4}}, "apps_spec": {"web": {"cpu": 1}}}"#,
        )
        .unwrap();
        assert_eq!(s.node_capacities.len(), 1);
        let s = parse(
            Path::new("s.yaml"),
            b"node_capacities:\n  n1: {cpu: 4, mem: 16}\nassigned_apps:\n  n1: {web: 2}\n",
        )
        .unwrap();
        assert_eq!(s.count("n1", "web"), 2);
        let e = parse(Path::new("s.yaml"), b"node_capacities:\n  n1: {gpu: 1}\n").unwrap_err();
        assert!(
            e.starts_with("s.yaml:2: ") && e.contains("unknown variant `gpu`"),
            "{e}"
        );
        let e = parse(Path::new("s.json"), b"{\n\"nodes_capacities\": {}}").unwrap_err();
        assert!(e.starts_with("s.json:2: unknown field"), "{e}");
    }

    #[tokio::test]
    async fn a_bad_file_keeps_the_last_good_snapshot_and_a_fix_clears_the_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("snapshot.yaml");
        let store = SnapshotStore::new();
        let mut source = SnapshotFile::new(path.clone(), store.clone());
        source.refresh().await;
        assert!(store.snapshot().is_none());
        assert!(store.view().errors[SOURCE].message.contains("cannot read"));

        let good = "node_capacities: {n1: {cpu: 4}}\n";
        std::fs::write(&path, good).unwrap();
        source.refresh().await;
        assert_eq!(store.view().generation, 1);
        assert!(store.view().errors.is_empty());
        source.refresh().await;
        assert_eq!(
            store.view().generation,
            1,
            "unchanged bytes publish nothing"
        );

        std::fs::write(&path, "node_capacities: [").unwrap();
        source.refresh().await;
        let view = store.view();
        assert!(view.errors[SOURCE].message.contains("snapshot.yaml"));
        assert_eq!(view.snapshot.as_ref().unwrap().node_capacities.len(), 1);

        std::fs::write(&path, good).unwrap();
        source.refresh().await;
        assert!(store.view().errors.is_empty());
        assert_eq!(store.view().generation, 1);
    }
}
