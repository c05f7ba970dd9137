//! systemd's notify protocol over `$NOTIFY_SOCKET` (the `sd-notify` crate, no libsystemd):
//! `READY=1` once the daemon serves, `STATUS=` kept to the status view's one line, `WATCHDOG=1`
//! while the controllers make progress (the rule: `controllers/src/machinery/watchdog.rs`), `STOPPING=1`
//! at shutdown. Without `NOTIFY_SOCKET` every call does nothing.
//!
//! The variables stay in the daemon's environment (removing them is not safe once threads
//! run); the apply commands do not get them (`src/render/apply/exec.rs`).

use std::sync::Arc;
use std::time::Duration;

use futures::future;
use sd_notify::NotifyState;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use verwalter_controllers::machinery::watchdog::{Progress, Stall, Verdict};
use verwalter_controllers::status::{self, Fields, NodeInfo, SchedulerRuns};

/// The service manager, as the environment describes it.
#[derive(Debug, Clone)]
pub(crate) struct Notify {
    /// `NOTIFY_SOCKET` is set.
    enabled: bool,
    /// `WATCHDOG_USEC`, when the watchdog is this process's (`watchdog::enabled`: `WATCHDOG_PID`
    /// unset or ours).
    watchdog: Option<Duration>,
}

impl Notify {
    pub(crate) fn from_env() -> Notify {
        let enabled = std::env::var_os("NOTIFY_SOCKET").is_some();
        let var = |name| std::env::var(name).ok();
        let watchdog = enabled
            .then(|| {
                let (usec, pid) = (var("WATCHDOG_USEC"), var("WATCHDOG_PID"));
                verwalter_controllers::machinery::watchdog::enabled(
                    usec.as_deref(),
                    pid.as_deref(),
                    std::process::id(),
                )
            })
            .flatten();
        Notify { enabled, watchdog }
    }

    /// `WatchdogSec=` of the unit, when systemd watches this process.
    pub(crate) fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Where the drivers record their progress: watched at every ping (half the watchdog
    /// interval, as systemd advises), or not watched at all.
    pub(crate) fn progress(&self) -> Progress {
        match self.watchdog {
            Some(interval) => Progress::watched(interval / 2),
            None => Progress::default(),
        }
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if !self.enabled {
            return;
        }
        if let Err(error) = sd_notify::notify(false, states) {
            tracing::warn!(%error, "Cannot notify the service manager.");
        }
    }

    /// The daemon serves: `READY=1` with its first status line.
    pub(crate) fn ready(&self, line: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(line)]);
    }

    /// Keeps `STATUS=` current and pings the watchdog while `progress` says the controllers
    /// move, until `shutdown`; then sends `STOPPING=1`. `first` is the line sent with `READY=1`.
    pub(crate) async fn run(
        self,
        sources: Fields,
        node: Arc<NodeInfo>,
        progress: Progress,
        first: String,
        shutdown: CancellationToken,
    ) {
        if !self.enabled {
            // Nobody listens: no status to compute on every change. (The task lasts as long as
            // the daemon: one that ends early counts as a part that died.)
            shutdown.cancelled().await;
            return;
        }
        let mut triggers = sources.triggers();
        let mut sent = first;
        let mut ticks = self.watchdog.map(|interval| {
            let mut ticks = tokio::time::interval(interval / 2);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticks
        });
        let mut stalled: Option<Stall> = None;
        loop {
            let tick = async {
                match &mut ticks {
                    Some(ticks) => ticks.tick().await,
                    None => future::pending().await,
                }
            };
            let changed = future::select_all(triggers.iter_mut().map(|t| t.changed()));
            let ping = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tick => true,
                _ = changed => false,
            };
            let verdict = if ping {
                Some(progress.verdict(Instant::now()))
            } else {
                None
            };
            match &verdict {
                Some(Verdict::Stalled(stall)) => {
                    tracing::error!(%stall, "A controller is stuck; not pinging the watchdog.");
                    stalled = Some(stall.clone());
                }
                Some(Verdict::Alive) => {
                    if let Some(stall) = stalled.take() {
                        tracing::warn!(%stall, "The stuck controller moved again.");
                    }
                }
                None => {}
            }
            let line = status_line(&sources, &node, stalled.as_ref());
            if line != sent {
                self.send(&[NotifyState::Status(&line)]);
                sent = line;
            }
            // After the status: a stall is on the status line before the first missing ping.
            if verdict == Some(Verdict::Alive) {
                self.send(&[NotifyState::Watchdog]);
            }
        }
        self.send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    }
}

/// The status view's line, and the stall while there is one.
pub(crate) fn status_line(sources: &Fields, node: &NodeInfo, stall: Option<&Stall>) -> String {
    // The line shows no run counts.
    let view = status::view(node, &sources.snapshot(), SchedulerRuns::default());
    match stall {
        Some(stall) => format!("{}; stuck: {}", view.line(), stall.what()),
        None => view.line(),
    }
}
