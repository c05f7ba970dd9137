//! Wiring of the leader's action queue (`verwalter_controllers::actions`, where its rules
//! live) to the storage dir: the journal file ([`journal`]) and the system clock.

pub(crate) mod journal;

use std::sync::Arc;

use verwalter_controllers::actions::{ActionLimits, ActionQueue};
use verwalter_controllers::machinery::clock::SystemClock;
use verwalter_controllers::machinery::ports::JournalError;
use verwalter_controllers::machinery::store::Field;
use verwalter_controllers::node::Store;
use verwalter_controllers::state::Actions;

use self::journal::FileJournal;
use crate::storage::state_dir::StateDir;

/// The queue over `<storage>/actions.journal`, with the actions an earlier run left there (and
/// in the `actions.json` of older versions). Err: the journal exists but cannot be read.
pub(crate) fn open(
    out: Field<Actions>,
    store: Store,
    state_dir: &StateDir,
    limits: ActionLimits,
) -> Result<Arc<ActionQueue>, JournalError> {
    let journal = FileJournal::new(
        state_dir.actions_journal_path(),
        Some(state_dir.old_actions_path()),
    );
    ActionQueue::open(out, store, Arc::new(journal), Arc::new(SystemClock), limits)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tokio_util::sync::CancellationToken;
    use verwalter_controllers::cluster::election::ElectionState;
    use verwalter_controllers::node::StoreWriter;

    use super::*;

    /// A leading node's queue over the storage dir `dir`, running.
    fn start(dir: &std::path::Path) -> (Arc<ActionQueue>, Store, CancellationToken) {
        let writer = StoreWriter::new(None);
        let store = writer.store();
        writer.election.set(ElectionState {
            is_leader: true,
            ..Default::default()
        });
        let queue = open(
            writer.actions,
            store.clone(),
            &StateDir::new(dir),
            ActionLimits::default(),
        )
        .unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(queue.clone().run(shutdown.clone()));
        (queue, store, shutdown)
    }

    /// Many concurrent actions share syncs, and every acknowledged one is in the file: a queue
    /// started on the same storage dir has them all. The older versions' `actions.json` is
    /// taken over and gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acknowledged_actions_are_on_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let legacy = tmp.path().join("actions.json");
        std::fs::write(&legacy, r#"{"7":{"old":true}}"#).unwrap();
        let (queue, _store, shutdown) = start(tmp.path());
        let tasks: Vec<_> = (0..200u64)
            .map(|n| {
                let queue = queue.clone();
                tokio::spawn(async move { queue.register(json!({"n": n}), false).await })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert!(!legacy.exists(), "taken over");
        shutdown.cancel();
        let (_queue, store, shutdown) = start(tmp.path());
        let pending = store.actions.peek();
        assert_eq!(pending.len(), 201);
        assert_eq!(pending[&7], json!({"old": true}));
        shutdown.cancel();
    }

    #[test]
    fn a_journal_that_cannot_be_read_stops_the_start() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("actions.journal")).unwrap();
        let writer = StoreWriter::new(None);
        let store = writer.store();
        let err = open(
            writer.actions,
            store,
            &StateDir::new(tmp.path()),
            ActionLimits::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("cannot read the action journal"),
            "{err}"
        );
    }
}
