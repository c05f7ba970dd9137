//! Shadow schedulers: when a candidate scheduler runs beside the real one (pure).
//!
//! The schedule controller hands each real round to a [`ShadowHook`] once the round is
//! published (the schedule in force and the scheduler status written, or the failure
//! recorded); the hook never blocks it. The leader's hook asks a [`ShadowGate`] what each shadow
//! does with the round:
//!
//! - a shadow that is free starts a run on the round's very input ([`Decision::Start`]);
//! - a shadow still busy with an earlier round is skipped for this one, and the skip is
//!   recorded ([`Decision::Skip`]): rounds are never queued behind a slow or stuck shadow, so a
//!   shadow is at most one run behind and costs at most one thread;
//! - nothing starts for a round that was not published ([`ShadowGate::published`] is the only
//!   door), so a shadow never delays the real schedule.
//!
//! A shadow's run ends with [`ShadowGate::finished`]; only then does the shadow take a round
//! again.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::schedule::data::ScheduleData;
use crate::state::SchedulerInput;

/// A shadow run's number: unique among the runs of all shadows of this node, increasing.
pub type RunId = u64;

/// A real round as the shadows see it once it is published.
#[derive(Debug, Clone)]
pub struct RealRound {
    /// The very input the real scheduler ran on.
    pub input: Arc<SchedulerInput>,
    /// The code version (content hash of `scheduler/v1`) the real scheduler ran.
    pub code_version: String,
    /// What the real run made: the schedule's hash and data, or its error.
    pub outcome: Result<(String, ScheduleData), String>,
}

/// Where the schedule controller hands each published real round; must return at once (the
/// shadows run elsewhere).
pub trait ShadowHook: Send + Sync + 'static {
    fn published(&self, round: RealRound);
}

/// What a shadow does with a published real round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run the shadow on the round's input, as run `run`.
    Start { shadow: String, run: RunId },
    /// The shadow is still busy with run `busy_with` (started at `busy_since_ms`): this round is
    /// recorded as skipped, as run `run`.
    Skip {
        shadow: String,
        run: RunId,
        busy_with: RunId,
        busy_since_ms: u64,
    },
}

impl Decision {
    pub fn shadow(&self) -> &str {
        match self {
            Decision::Start { shadow, .. } | Decision::Skip { shadow, .. } => shadow,
        }
    }

    pub fn run(&self) -> RunId {
        match self {
            Decision::Start { run, .. } | Decision::Skip { run, .. } => *run,
        }
    }
}

/// The run a busy shadow is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Busy {
    run: RunId,
    since_ms: u64,
}

/// Which shadows are busy, and the run numbers: the rule of when shadow runs start.
#[derive(Debug, Clone)]
pub struct ShadowGate {
    busy: BTreeMap<String, Busy>,
    next_run: RunId,
}

impl ShadowGate {
    /// A gate whose first run is numbered `first_run` (one past the last run kept on disk, so
    /// numbers stay unique across restarts).
    pub fn new(first_run: RunId) -> ShadowGate {
        ShadowGate {
            busy: BTreeMap::new(),
            next_run: first_run.max(1),
        }
    }

    /// A real round was published at `now_ms`, with `shadows` the shadows configured now: what
    /// each of them does with it, in their order. A shadow that appears twice is decided once.
    pub fn published(&mut self, shadows: &[String], now_ms: u64) -> Vec<Decision> {
        let mut decisions: Vec<Decision> = Vec::with_capacity(shadows.len());
        for shadow in shadows {
            if decisions.iter().any(|d| d.shadow() == shadow) {
                continue;
            }
            let run = self.next_run;
            self.next_run += 1;
            let decision = match self.busy.get(shadow) {
                Some(busy) => Decision::Skip {
                    shadow: shadow.clone(),
                    run,
                    busy_with: busy.run,
                    busy_since_ms: busy.since_ms,
                },
                None => {
                    self.busy.insert(
                        shadow.clone(),
                        Busy {
                            run,
                            since_ms: now_ms,
                        },
                    );
                    Decision::Start {
                        shadow: shadow.clone(),
                        run,
                    }
                }
            };
            decisions.push(decision);
        }
        decisions
    }

    /// Run `run` of `shadow` ended (with a result or an error); the shadow takes the next round.
    /// The end of a run the gate does not know as the shadow's current one changes nothing.
    pub fn finished(&mut self, shadow: &str, run: RunId) {
        if self.busy.get(shadow).is_some_and(|b| b.run == run) {
            self.busy.remove(shadow);
        }
    }

    /// The run `shadow` is busy with, if any.
    pub fn busy_with(&self, shadow: &str) -> Option<RunId> {
        self.busy.get(shadow).map(|b| b.run)
    }
}

#[cfg(test)]
mod tests;
