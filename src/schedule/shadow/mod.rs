//! Shadow schedulers on the leader (docs/scheduler.md#shadow-schedulers): candidates under
//! `scheduler/<name>/`, named in `scheduler/shadow.yaml` ([`config`]), run on every real round
//! once it is published, on its very input, each on a thread of its own ([`engine`]), with the
//! same sandbox, limits, budget and grace as `scheduler/v1`. When a shadow starts or is skipped
//! is the controllers' rule ([`ShadowGate`]); what each run did is kept ([`records`]) and shown
//! in the API, GraphQL, the metrics and the Shadow page.
//!
//! A shadow's output goes nowhere but its record: it never becomes the schedule, never reaches
//! a follower or a renderer, and its `actions` answers are never sent.

pub mod cli;
pub(crate) mod config;
pub(crate) mod engine;
pub(crate) mod metrics;
pub(crate) mod records;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::machinery::clock::{Clock, rfc3339};
use verwalter_controllers::machinery::ports::SchedulerError;
use verwalter_controllers::schedule::shadow::{Decision, RealRound, RunId, ShadowGate, ShadowHook};
use verwalter_controllers::state::SchedulerOutput;

use crate::metrics::Metrics;
use crate::schedule::lua::Limits;
use config::ShadowConfig;
use engine::ShadowThread;
use records::{Outcome, Records, RunError, ShadowRun, Skipped};

/// The leader's shadow schedulers: the hook the schedule controller hands its rounds to, and
/// what the HTTP API reads.
#[derive(Clone)]
pub(crate) struct Shadows {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Shadows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shadows")
    }
}

struct Inner {
    config_dir: PathBuf,
    limits: Limits,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    gate: Mutex<ShadowGate>,
    threads: Mutex<BTreeMap<String, Arc<ShadowThread>>>,
    records: Records,
    /// `scheduler/shadow.yaml` as the last round read it.
    config: Mutex<ShadowConfig>,
}

/// The schedule controller's side: hands each published round to the shadows' task, at once.
pub(crate) struct RoundSender(mpsc::UnboundedSender<RealRound>);

impl ShadowHook for RoundSender {
    fn published(&self, round: RealRound) {
        // The task is gone only at shutdown.
        let _ = self.0.send(round);
    }
}

impl Shadows {
    /// The shadows of `config_dir`, their runs kept under `storage_dir/shadow`.
    pub(crate) fn new(
        config_dir: PathBuf,
        storage_dir: &std::path::Path,
        limits: Limits,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Shadows {
        let records = Records::open(storage_dir.join("shadow"));
        let gate = ShadowGate::new(records.last_run() + 1);
        Shadows {
            inner: Arc::new(Inner {
                config_dir,
                limits,
                clock,
                metrics,
                gate: Mutex::new(gate),
                threads: Mutex::new(BTreeMap::new()),
                records,
                config: Mutex::new(ShadowConfig::default()),
            }),
        }
    }

    /// The hook for the schedule controller, and the task that takes the rounds it hands over
    /// (until `shutdown`).
    pub(crate) fn start(
        &self,
        shutdown: CancellationToken,
    ) -> (
        Arc<dyn ShadowHook>,
        impl Future<Output = ()> + Send + 'static,
    ) {
        let (tx, mut rx) = mpsc::unbounded_channel::<RealRound>();
        let inner = self.inner.clone();
        let task = async move {
            loop {
                let round = tokio::select! {
                    () = shutdown.cancelled() => return,
                    round = rx.recv() => match round {
                        Some(round) => round,
                        None => return,
                    },
                };
                inner.clone().round(round).await;
            }
        };
        (Arc::new(RoundSender(tx)), task)
    }

    pub(crate) fn config(&self) -> ShadowConfig {
        self.inner.config.lock().expect("config lock").clone()
    }

    pub(crate) fn records(&self) -> &Records {
        &self.inner.records
    }

    /// The run `shadow` is busy with, if any.
    pub(crate) fn busy_with(&self, shadow: &str) -> Option<RunId> {
        self.inner.gate.lock().expect("gate lock").busy_with(shadow)
    }
}

/// What every run of a round shares.
struct Round {
    real: RealRound,
    input_hash: String,
    time: u64,
    keep: usize,
}

impl Inner {
    /// A published real round: reads `shadow.yaml`, then starts or skips each shadow.
    async fn round(self: Arc<Self>, real: RealRound) {
        let config_dir = self.config_dir.clone();
        let input = real.input.clone();
        let read = tokio::task::spawn_blocking(move || {
            let config = config::read(&config_dir);
            let hash = serde_json::to_value(&*input)
                .map(|v| verwalter_controllers::schedule::hash::schedule_hash(&v))
                .unwrap_or_default();
            (config, hash)
        })
        .await;
        let Ok((config, input_hash)) = read else {
            return;
        };
        self.take_config(&config);
        let time = self.clock.now_ms();
        let decisions = self
            .gate
            .lock()
            .expect("gate lock")
            .published(&config.shadows, time);
        let round = Arc::new(Round {
            real,
            input_hash,
            time,
            keep: config.keep_runs,
        });
        for decision in decisions {
            match decision {
                Decision::Start { shadow, run } => {
                    tokio::spawn(self.clone().run(shadow, run, round.clone()));
                }
                Decision::Skip {
                    shadow,
                    run,
                    busy_with,
                    busy_since_ms,
                } => {
                    tracing::warn!(%shadow, run, busy_with, "A shadow scheduler is still busy; skipped for this round.");
                    let mut record = self.record(&shadow, run, &round, Outcome::Skipped);
                    record.skipped = Some(Skipped {
                        busy_with,
                        busy_since: busy_since_ms,
                    });
                    let this = self.clone();
                    let keep = round.keep;
                    let _ =
                        tokio::task::spawn_blocking(move || this.keep(record, keep, None)).await;
                }
            }
        }
    }

    /// Logs what is wrong in `shadow.yaml` when it changed, and keeps it for the API; drops
    /// the threads of shadows no longer named.
    fn take_config(&self, config: &ShadowConfig) {
        let mut last = self.config.lock().expect("config lock");
        if last.problems != config.problems {
            for problem in &config.problems {
                tracing::warn!(%problem, "A shadow scheduler is misconfigured.");
            }
        }
        self.metrics.shadow().config_problems(config.problems.len());
        *last = config.clone();
        drop(last);
        self.threads
            .lock()
            .expect("threads lock")
            .retain(|name, _| config.shadows.contains(name));
    }

    /// One shadow run on the round's input.
    async fn run(self: Arc<Self>, shadow: String, run: RunId, round: Arc<Round>) {
        let ran = match self.thread(&shadow) {
            Ok(thread) => {
                let config_dir = self.config_dir.clone();
                let rel = format!("scheduler/{shadow}");
                let version = tokio::task::spawn_blocking(move || {
                    crate::inputs::code_hash(&config_dir, &rel)
                })
                .await
                .unwrap_or_default();
                let started = Instant::now();
                let result = thread.run(&version, round.real.input.clone()).await;
                (Some(version), result, thread.memory(), started.elapsed())
            }
            Err(error) => (None, Err(error), None, std::time::Duration::ZERO),
        };
        let (version, result, memory, duration) = ran;
        let this = self.clone();
        let name = shadow.clone();
        // The diff and the write off the async runtime; the shadow is busy until its run is
        // kept.
        let _ = tokio::task::spawn_blocking(move || {
            let mut record = this.finish(&name, run, &round, result);
            record.code_version = version;
            record.duration_ms = Some(duration.as_millis() as u64);
            record.memory_bytes = memory;
            this.keep(record, round.keep, Some(duration));
        })
        .await;
        self.gate.lock().expect("gate lock").finished(&shadow, run);
    }

    /// The thread of `shadow`, started on its first run.
    fn thread(&self, shadow: &str) -> Result<Arc<ShadowThread>, SchedulerError> {
        let mut threads = self.threads.lock().expect("threads lock");
        if let Some(thread) = threads.get(shadow) {
            return Ok(thread.clone());
        }
        let thread =
            ShadowThread::start(self.config_dir.clone(), shadow, self.limits).map_err(|e| {
                SchedulerError {
                    kind: verwalter_controllers::state::SchedulerFailure::Internal,
                    message: format!("cannot start the shadow scheduler's thread: {e}"),
                    log: String::new(),
                }
            })?;
        let thread = Arc::new(thread);
        threads.insert(shadow.to_string(), thread.clone());
        Ok(thread)
    }

    /// The record of a finished run, its diff against the real schedule taken.
    fn finish(
        &self,
        shadow: &str,
        run: RunId,
        round: &Round,
        result: Result<SchedulerOutput, SchedulerError>,
    ) -> ShadowRun {
        match result {
            Err(error) => {
                let mut record = self.record(shadow, run, round, Outcome::Failed);
                record.log = error.log;
                record.error = Some(RunError {
                    kind: error.kind.label().to_string(),
                    message: error.message,
                });
                record
            }
            Ok(output) => {
                let diff = match &round.real.outcome {
                    Ok((_, real)) => Some(verwalter_controllers::schedule::diff::diff(
                        real.tree(),
                        output.data.tree(),
                    )),
                    Err(_) => None,
                };
                let outcome = match &diff {
                    None => Outcome::RealFailed,
                    Some(d) if d.is_empty() => Outcome::Identical,
                    Some(_) => Outcome::Differs,
                };
                let mut record = self.record(shadow, run, round, outcome);
                record.paths_differing = diff.as_ref().map(|d| d.paths_differing());
                record.diff = diff.and_then(|d| serde_json::to_value(d).ok());
                record.output = Some(Value::clone(output.data.tree()));
                record.log = output.log;
                record
            }
        }
    }

    /// A record of `shadow`'s run `run` of `round`, with nothing of the run in it yet.
    fn record(&self, shadow: &str, run: RunId, round: &Round, result: Outcome) -> ShadowRun {
        let (real_hash, real_error) = match &round.real.outcome {
            Ok((hash, _)) => (Some(hash.clone()), None),
            Err(error) => (None, Some(error.clone())),
        };
        ShadowRun {
            shadow: shadow.to_string(),
            run,
            time: round.time,
            time_rfc3339: rfc3339(round.time),
            input_hash: round.input_hash.clone(),
            real_hash,
            real_error,
            code_version: None,
            result,
            paths_differing: None,
            output: None,
            error: None,
            log: String::new(),
            duration_ms: None,
            memory_bytes: None,
            skipped: None,
            diff: None,
        }
    }

    /// Logs, counts and keeps a run (`duration` for a run that ran).
    fn keep(&self, record: ShadowRun, keep: usize, duration: Option<std::time::Duration>) {
        tracing::info!(
            shadow = %record.shadow,
            run = record.run,
            input_hash = %record.input_hash,
            result = record.result.label(),
            paths_differing = record.paths_differing,
            "Shadow scheduler run."
        );
        self.metrics.shadow().run(
            &record.shadow,
            record.result,
            duration,
            record.paths_differing,
        );
        let shadow = record.shadow.clone();
        let failed = self.records.add(record, keep).is_some();
        self.metrics.shadow().write(&shadow, failed);
    }
}
