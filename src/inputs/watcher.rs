//! Watches the config dir and re-reads the inputs after changes settle.
//!
//! Events are coalesced without a fixed wait: a read happens as soon as every file the burst
//! started writing is complete (closed after writing, or renamed into place), after taking
//! every event already queued. While a file is still open for writing, or when events were
//! lost, it waits until the directory has been quiet for `debounce`, at the latest `max_delay`
//! after the first event ([`Burst`]). Events that come during a read make another
//! read right after it. A periodic re-read covers lost events (inotify
//! queue overflow, a watcher that failed to start): level-triggered, a missed event costs at most
//! one resync period.
//!
//! A read that could not see everything (a file or dir that exists but could not be read:
//! descriptors exhausted, permissions, I/O errors) is not a change: the last good inputs stay in
//! force, with the failure shown among their errors, logged and counted. A read that finds
//! `scheduler/v1/metrics.yaml` bad keeps the last good metrics declaration
//! ([`keep_metrics_declaration`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RenameMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::inputs::{Burst, Touch, kept_inputs};
use verwalter_controllers::machinery::store::Field;
use verwalter_controllers::schedule::scheduler_metrics::keep_metrics_declaration;
use verwalter_controllers::state::{InputError, Inputs, Templates};

use super::Problems;
use super::walk::{FileSystem, RealFs};
use crate::metrics::Metrics;

#[derive(Debug, Clone)]
pub(crate) struct WatchConfig {
    /// Quiet time that ends a burst of events while a file is still open for writing (or events
    /// were lost); a burst of complete files is read without waiting.
    pub(crate) debounce: Duration,
    /// Upper bound on the wait while events keep coming.
    pub(crate) max_delay: Duration,
    /// Re-read even without events this often.
    pub(crate) resync: Duration,
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

/// The store fields the watcher writes.
pub(crate) struct Outputs {
    pub(crate) inputs: Field<Inputs>,
    pub(crate) templates: Field<Templates>,
}

/// Reads the config dir into the store, now and after every change.
pub(crate) struct InputsWatcher {
    config_dir: PathBuf,
    out: Outputs,
    metrics: Arc<Metrics>,
    config: WatchConfig,
    /// `None` when the dir is not watched (then it is polled).
    events: Option<mpsc::UnboundedReceiver<Event>>,
    /// Kept alive for the events; `None` when the dir cannot be watched (then it is polled).
    _watcher: Option<notify::RecommendedWatcher>,
    /// The errors of the last complete read: a failed read shows them plus its own.
    good_errors: Vec<InputError>,
    /// The failures of the last read, logged once each.
    failures: Vec<InputError>,
}

impl InputsWatcher {
    /// Starts watching `config_dir` (before the first read, so no change is missed) without
    /// reading it yet.
    pub(crate) fn start(
        config_dir: PathBuf,
        out: Outputs,
        metrics: Arc<Metrics>,
        config: WatchConfig,
    ) -> InputsWatcher {
        // What each relevant event says, with its paths (none for a watcher error).
        let (tx, events) = mpsc::unbounded_channel::<Event>();
        let handler = move |event: notify::Result<notify::Event>| {
            let touch = match &event {
                Ok(e) => match touch(&e.kind) {
                    Some(touch) => touch,
                    None => return,
                },
                Err(_) => Touch::Unknown, // e.g. queue overflow: re-read to be safe
            };
            let _ = tx.send((touch, event.map(|e| e.paths).unwrap_or_default()));
        };
        // Symlinks are not followed when adding watches: a link out of the config dir (to `/`,
        // say) would have put the whole file system under watch, and a maze of links would
        // have made the setup exponential. Dirs reached through links inside the config dir
        // are watched under their real path anyway, and the resync covers the rest.
        let notify_config = notify::Config::default().with_follow_symlinks(false);
        let watcher = notify::RecommendedWatcher::new(handler, notify_config)
            .and_then(|mut w| w.watch(&config_dir, RecursiveMode::Recursive).map(|()| w));
        let (watcher, config) = match watcher {
            Ok(w) => (Some(w), config),
            Err(e) => {
                tracing::error!(dir = %config_dir.display(), error = %e,
                    "Cannot watch the config dir; polling it every 2 s instead.");
                let polled = WatchConfig {
                    resync: Duration::from_secs(2),
                    ..config
                };
                (None, polled)
            }
        };
        InputsWatcher {
            config_dir,
            out,
            metrics,
            config,
            events: watcher.as_ref().map(|_| events),
            _watcher: watcher,
            good_errors: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// Re-reads after every change until shutdown (the first read is [`InputsWatcher::refresh`],
    /// which the daemon awaits before starting the controllers that use the inputs).
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = next_event(&mut self.events) => {
                    let Some((touch, paths)) = got else {
                        // The watcher is gone: poll instead.
                        self.config.resync = self.config.resync.min(Duration::from_secs(2));
                        continue;
                    };
                    let mut burst = Burst::new(Instant::now());
                    burst.note(Instant::now(), touch, &paths);
                    loop {
                        let WatchConfig { debounce, max_delay, .. } = self.config;
                        let read_at = burst.read_at(debounce, max_delay);
                        tokio::select! {
                            // Every event already queued is taken before a read that is due.
                            biased;
                            _ = shutdown.cancelled() => return,
                            more = next_event(&mut self.events) => {
                                let Some((touch, paths)) = more else { break };
                                burst.note(Instant::now(), touch, &paths);
                            }
                            _ = tokio::time::sleep_until(read_at) => break,
                        }
                    }
                }
                _ = tokio::time::sleep(self.config.resync) => {}
            }
            self.refresh().await;
        }
    }

    /// Reads the inputs off the async runtime and publishes them if anything changed. A read
    /// that failed to see everything publishes nothing new: the last good inputs and templates
    /// stay, with the failures added to the inputs' errors.
    pub(crate) async fn refresh(&mut self) {
        let dir = self.config_dir.clone();
        let read = tokio::task::spawn_blocking(move || read_all(&RealFs, &dir));
        let Ok((inputs, templates, failures)) = read.await else {
            tracing::error!("Reading the inputs panicked.");
            return;
        };
        self.apply(inputs, templates, failures);
    }

    fn apply(&mut self, inputs: Inputs, templates: Templates, failures: Vec<InputError>) {
        if failures.is_empty() {
            if !self.failures.is_empty() {
                tracing::info!("The config dir is readable again.");
                self.failures.clear();
            }
            if self.out.templates.set(templates) {
                tracing::info!("Templates changed.");
            }
            self.good_errors = inputs.errors.clone();
            let mut inputs = inputs;
            keep_metrics_declaration(&self.out.inputs.get(), &mut inputs);
            publish(&self.out.inputs, inputs, &self.metrics);
            return;
        }
        self.metrics.input_read_failed();
        for failure in &failures {
            if !self.failures.contains(failure) {
                tracing::error!(file = %failure.path, error = %failure.message,
                    "Cannot read the config dir; keeping the last good inputs.");
            }
        }
        let kept = kept_inputs(&self.out.inputs.get(), &self.good_errors, &failures);
        self.failures = failures;
        self.metrics.input_read(kept.errors.len());
        self.out.inputs.set(kept);
    }
}

/// A relevant event: what it says of its paths.
type Event = (Touch, Vec<PathBuf>);

/// What an event of `kind` says, or `None` when it does not matter: our own reads open and
/// close files, only a close after writing means new content.
fn touch(kind: &EventKind) -> Option<Touch> {
    Some(match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => Touch::Done,
        EventKind::Access(_) => return None,
        EventKind::Create(CreateKind::Folder) => Touch::Done,
        EventKind::Create(_) => Touch::Writing,
        EventKind::Modify(ModifyKind::Data(_)) => Touch::Writing,
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => Touch::Gone,
        EventKind::Modify(ModifyKind::Name(_)) | EventKind::Modify(ModifyKind::Metadata(_)) => {
            Touch::Done
        }
        EventKind::Remove(_) => Touch::Gone,
        EventKind::Modify(_) | EventKind::Any | EventKind::Other => Touch::Unknown,
    })
}

/// The next event; `None` once the watcher is gone, then never ready again.
async fn next_event(events: &mut Option<mpsc::UnboundedReceiver<Event>>) -> Option<Event> {
    match events {
        Some(rx) => match rx.recv().await {
            Some(event) => Some(event),
            None => {
                *events = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

/// One read of the config dir: inputs, templates, and the entries that exist but could not be
/// read (when there are any, the rest is incomplete).
pub(crate) fn read_all(fs: &dyn FileSystem, dir: &Path) -> (Inputs, Templates, Vec<InputError>) {
    let mut problems = Problems::default();
    let mut inputs = super::read_inputs_with(fs, dir, &mut problems);
    let templates = crate::render::read_templates_with(fs, dir, &mut problems);
    inputs.errors.append(&mut problems.errors);
    inputs.errors.sort_by(|a, b| a.path.cmp(&b.path));
    (inputs, templates, problems.failures)
}

/// Stores new inputs, logging what changed and each error once.
pub(crate) fn publish(out: &Field<Inputs>, inputs: Inputs, metrics: &Metrics) {
    metrics.input_read(inputs.errors.len());
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

#[cfg(test)]
mod tests;
