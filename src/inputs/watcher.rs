//! Watches the config dir and re-reads the inputs after changes settle.
//!
//! Events are debounced: a read happens once the directory has been quiet for `debounce`, or at
//! the latest `max_delay` after the first event, so an editor's write-rename-chmod burst or a
//! deploy tool copying a tree costs one read. A periodic re-read covers lost events (inotify
//! queue overflow, a watcher that failed to start): level-triggered, a missed event costs at most
//! one resync period.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::state::{Inputs, Templates};
use verwalter_controllers::store::Field;

use crate::metrics::Metrics;

#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// Quiet time that ends a burst of events. 100 ms covers an editor's save sequence and keeps
    /// an edit-to-schedule round well under a second.
    pub debounce: Duration,
    /// Upper bound on the wait while events keep coming.
    pub max_delay: Duration,
    /// Re-read even without events this often.
    pub resync: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            debounce: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            resync: Duration::from_secs(60),
        }
    }
}

/// Reads the inputs once now, then after every change until shutdown.
pub async fn run(
    config_dir: PathBuf,
    out: Outputs,
    metrics: Arc<Metrics>,
    config: WatchConfig,
    shutdown: CancellationToken,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            // Our own reads open files; only a close after writing means new content.
            Ok(e) => {
                !matches!(e.kind, EventKind::Access(_))
                    || matches!(
                        e.kind,
                        EventKind::Access(AccessKind::Close(AccessMode::Write))
                    )
            }
            Err(_) => true, // e.g. queue overflow: re-read to be safe
        };
        if relevant {
            let _ = tx.send(());
        }
    })
    .and_then(|mut w| w.watch(&config_dir, RecursiveMode::Recursive).map(|()| w));
    let resync = match &watcher {
        Ok(_) => config.resync,
        Err(e) => {
            tracing::error!(dir = %config_dir.display(), error = %e,
                "Cannot watch the config dir; polling it every 2 s instead.");
            Duration::from_secs(2)
        }
    };
    refresh(&config_dir, &out, &metrics).await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            got = rx.recv() => {
                if got.is_none() {
                    return;
                }
                let first = Instant::now();
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        more = rx.recv() => if more.is_none() { return },
                        _ = tokio::time::sleep(config.debounce) => break,
                        _ = tokio::time::sleep_until(first + config.max_delay) => break,
                    }
                }
            }
            _ = tokio::time::sleep(resync) => {}
        }
        refresh(&config_dir, &out, &metrics).await;
    }
}

/// Reads the inputs off the async runtime and publishes them if anything changed.
pub async fn refresh(config_dir: &std::path::Path, out: &Outputs, metrics: &Metrics) {
    let dir = config_dir.to_path_buf();
    let read = tokio::task::spawn_blocking(move || {
        let mut inputs = super::read_inputs(&dir);
        let templates = crate::render::read_templates(&dir, &mut inputs.errors);
        inputs.errors.sort_by(|a, b| a.path.cmp(&b.path));
        (inputs, templates)
    });
    let Ok((inputs, templates)) = read.await else {
        tracing::error!("Reading the inputs panicked.");
        return;
    };
    if out.templates.set(templates) {
        tracing::info!("Templates changed.");
    }
    publish(&out.inputs, inputs, metrics);
}

/// The store fields the watcher writes.
pub struct Outputs {
    pub inputs: Field<Inputs>,
    pub templates: Field<Templates>,
}

/// Stores new inputs, logging what changed and each error once.
pub fn publish(out: &Field<Inputs>, inputs: Inputs, metrics: &Metrics) {
    metrics.input_reads.inc();
    metrics.input_errors.set(inputs.errors.len() as i64);
    let previous = out.get();
    for error in &inputs.errors {
        if !previous.errors.contains(error) {
            tracing::warn!(file = %error.path, line = error.line, message = %error.message, "Bad input file.");
        }
    }
    let hash = inputs.hash.clone();
    if out.set(inputs) {
        tracing::info!(hash = %hash, "Inputs changed.");
    }
}
