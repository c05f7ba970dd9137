//! Where the placement data sources are started: [`start_sources`] decides which sources fill a
//! [`SnapshotStore`] and returns their tasks. Every reader of placement data (the extender, and
//! later the Lua scheduler) gets its store filled through here.

use std::path::PathBuf;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use verwalter_placement::Dim;
use verwalter_placement::config::DataProvider;

use super::refresh::{RefreshSettings, spawn_sources};
use super::snapshot_file::SnapshotFile;
use super::store::SnapshotStore;

/// The sources asked for: a snapshot file, and the data provider of the placement config.
#[derive(Debug, Clone, Default)]
pub(crate) struct SourcePlan {
    /// `--snapshot FILE` (or `snapshot:` in the daemon's settings).
    pub(crate) snapshot_file: Option<PathBuf>,
    /// The algorithm's `data_provider` (Kubernetes API and Prometheus).
    pub(crate) data_provider: Option<DataProvider>,
    /// The algorithm's dimensions: which Prometheus queries the data provider runs.
    pub(crate) dimensions: Vec<Dim>,
    /// How often the data provider refreshes, and where its refreshes are counted.
    pub(crate) refresh: RefreshSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum SourcesError {
    /// Neither a snapshot file nor a data provider.
    #[error(
        "no placement data source: give a snapshot file (--snapshot FILE, or `snapshot:` in the \
         settings), or a data_provider in the placement config"
    )]
    NoSource,
}

/// Starts the sources of `plan` writing to `store`: reads what can be read at once (so a good
/// snapshot file is in force when this returns; a missing or bad one leaves the store empty,
/// with the error recorded), and returns the tasks that keep the store fresh until `shutdown`.
///
/// A snapshot file, when given, is the source; a data provider in the config is then not used.
/// Otherwise the data provider's Kubernetes API and Prometheus sources start refreshing in the
/// background ([`spawn_sources`]); the store stays empty until both have answered once.
pub(crate) async fn start_sources(
    plan: &SourcePlan,
    store: &SnapshotStore,
    shutdown: CancellationToken,
) -> Result<Vec<BoxFuture<'static, ()>>, SourcesError> {
    let mut tasks: Vec<BoxFuture<'static, ()>> = Vec::new();
    match (&plan.snapshot_file, &plan.data_provider) {
        (Some(path), provider) => {
            if provider.is_some() {
                tracing::info!(
                    file = %path.display(),
                    "A snapshot file is given: the config's data provider is not used."
                );
            }
            let mut source = SnapshotFile::new(path.clone(), store.clone());
            source.refresh().await;
            tasks.push(Box::pin(source.run(shutdown)));
        }
        (None, Some(provider)) => {
            let refresh = spawn_sources(
                provider,
                &plan.dimensions,
                store.clone(),
                plan.refresh.clone(),
                shutdown,
            );
            tasks.push(Box::pin(async move {
                if let Err(error) = refresh.await {
                    tracing::error!(%error, "placement: the data sources' task failed");
                }
            }));
        }
        (None, None) => return Err(SourcesError::NoSource),
    }
    Ok(tasks)
}
