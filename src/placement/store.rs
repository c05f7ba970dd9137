//! The one place the current placement snapshot lives.
//!
//! Writers are the data sources (a refresh replaces a source's part; a watch event edits it);
//! readers take an `Arc` of the current [`View`] and never wait on a writer for longer than a
//! pointer copy. A failed refresh keeps the last good snapshot and records the error by source.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;
use verwalter_placement::{Snapshot, Usage};

/// What readers see: the snapshot (none before the first successful load) and how fresh it is.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// `None` until the first load: the extender answers "not loaded yet" in-band.
    pub snapshot: Option<Arc<Snapshot>>,
    /// `Usage::of(snapshot)`, kept with it: the writers pay for summing each node's apps (a few
    /// ms for 5,000 nodes, at each publish and edit), readers deciding thousands of nodes per
    /// request look usage up.
    pub(crate) usage: Option<Arc<Usage>>,
    /// When the snapshot was last replaced or edited.
    pub(crate) updated: Option<SystemTime>,
    /// Counts every change of `snapshot`, so a reader can tell two views apart.
    pub(crate) generation: u64,
    /// The last error of each source whose latest attempt failed (cleared by its next success).
    pub errors: BTreeMap<String, SourceError>,
}

/// A source's failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceError {
    pub message: String,
    pub(crate) at: SystemTime,
}

/// Cheap to clone; all clones share one current [`View`].
#[derive(Clone)]
pub struct SnapshotStore {
    tx: Arc<watch::Sender<Arc<View>>>,
}

impl Default for SnapshotStore {
    fn default() -> Self {
        SnapshotStore::new()
    }
}

impl std::fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStore")
            .field("generation", &self.view().generation)
            .finish()
    }
}

impl SnapshotStore {
    pub fn new() -> SnapshotStore {
        SnapshotStore {
            tx: Arc::new(watch::Sender::new(Arc::new(View::default()))),
        }
    }

    /// The current view: a pointer copy under a short read lock.
    pub fn view(&self) -> Arc<View> {
        self.tx.borrow().clone()
    }

    /// The current snapshot, `None` before the first load.
    pub(crate) fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.tx.borrow().snapshot.clone()
    }

    /// Wakes on every change (a new snapshot, an edit, an error recorded or cleared).
    pub fn subscribe(&self) -> watch::Receiver<Arc<View>> {
        self.tx.subscribe()
    }

    /// Replaces the snapshot and clears `source`'s error.
    pub(crate) fn publish(&self, source: &str, snapshot: Snapshot) {
        let usage = Usage::of(&snapshot);
        self.change(|view| {
            view.snapshot = Some(Arc::new(snapshot));
            view.usage = Some(Arc::new(usage));
            view.updated = Some(SystemTime::now());
            view.generation += 1;
            view.errors.remove(source);
        });
    }

    /// Edits the snapshot in place (copy-on-write: readers holding the old one keep it), e.g. to
    /// count a pod the moment it is bound. Does nothing before the first load.
    #[cfg(test)]
    pub(crate) fn edit(&self, edit: impl FnOnce(&mut Snapshot)) {
        self.change(|view| {
            if let Some(snapshot) = &mut view.snapshot {
                edit(Arc::make_mut(snapshot));
                view.usage = Some(Arc::new(Usage::of(snapshot)));
                view.updated = Some(SystemTime::now());
                view.generation += 1;
            }
        });
    }

    /// Records that `source` failed; the snapshot in force stays.
    pub(crate) fn report_error(&self, source: &str, message: String) {
        self.change(|view| {
            view.errors.insert(
                source.to_owned(),
                SourceError {
                    message,
                    at: SystemTime::now(),
                },
            );
        });
    }

    /// Clears `source`'s error (its latest attempt succeeded without replacing the snapshot).
    pub(crate) fn clear_error(&self, source: &str) {
        if self.tx.borrow().errors.contains_key(source) {
            self.change(|view| {
                view.errors.remove(source);
            });
        }
    }

    fn change(&self, f: impl FnOnce(&mut View)) {
        self.tx.send_modify(|view| f(Arc::make_mut(view)));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use verwalter_placement::{Assigned, Dim};

    use super::*;

    fn snapshot(mem: f64) -> Snapshot {
        let mut s = Snapshot::default();
        s.node_capacities
            .insert("n1".into(), BTreeMap::from([(Dim::Mem, mem)]));
        s
    }

    #[test]
    fn nothing_is_loaded_until_the_first_publish() {
        let store = SnapshotStore::new();
        assert!(store.snapshot().is_none());
        store.edit(|s| {
            s.apps_spec.insert("x".into(), BTreeMap::new());
        });
        assert!(
            store.snapshot().is_none(),
            "an edit before a load is dropped"
        );
        store.publish("file", snapshot(4.0));
        assert_eq!(
            store.snapshot().unwrap().node_capacities["n1"][&Dim::Mem],
            4.0
        );
        assert_eq!(store.view().generation, 1);
    }

    #[test]
    fn an_error_keeps_the_last_good_snapshot_until_the_source_succeeds() {
        let store = SnapshotStore::new();
        store.publish("kube", snapshot(4.0));
        store.report_error("kube", "connection refused".into());
        let view = store.view();
        assert_eq!(view.errors["kube"].message, "connection refused");
        assert_eq!(
            view.snapshot.as_ref().unwrap().node_capacities["n1"][&Dim::Mem],
            4.0
        );
        store.publish("kube", snapshot(8.0));
        assert!(store.view().errors.is_empty());
        store.report_error("prometheus", "timeout".into());
        store.clear_error("prometheus");
        assert!(store.view().errors.is_empty());
    }

    #[test]
    fn an_edit_leaves_readers_of_the_old_view_alone() {
        let store = SnapshotStore::new();
        store.publish("kube", snapshot(4.0));
        let before = store.snapshot().unwrap();
        store.edit(|s| {
            s.assigned_apps
                .entry("n1".into())
                .or_default()
                .insert("redis".into(), Assigned::Count(1));
        });
        assert_eq!(before.count("n1", "redis"), 0);
        assert_eq!(store.snapshot().unwrap().count("n1", "redis"), 1);
        let view = store.view();
        assert_eq!(
            view.usage.as_deref(),
            Some(&Usage::of(view.snapshot.as_ref().unwrap())),
            "the usage follows the edit"
        );
        assert_eq!(store.view().generation, 2);
    }
}
