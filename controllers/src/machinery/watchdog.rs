//! Whether the controller drivers are making progress, which is when the daemon may tell
//! systemd's watchdog it is alive.
//!
//! Each driver records in a shared [`Progress`] when its loop last turned and, for every pass
//! running, when that pass last moved (it started, or marked a step with [`mark_step`], as the
//! applier does before each command). [`decide`] turns those records and the time into a
//! [`Verdict`]: alive only if every loop turned within the turn limit and no pass went without
//! a step for longer than its controller's step limit. A controller that hangs (a pass waiting
//! on something that never ends, a loop that stops turning) so withholds the pings, and systemd
//! restarts the daemon; a timer that pinged regardless would hide exactly that.
//!
//! A step limit must be longer than the longest step a pass may legitimately take: for the
//! render controller one apply command with its timeout (180 s by default) and the kill that
//! follows it, for the schedule controller one scheduler run with its time budget. [`MARGIN`]
//! comes on top of each.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Slack on top of a step's own bound: the work between two marks that no timeout covers
/// (rendering templates, writing staging files and the role log, a busy machine).
pub const MARGIN: Duration = Duration::from_secs(15);

/// The step limit of controllers whose passes do only local work (writing a schedule, sweeping
/// the log dir, gzipping a backup): generous, since a slow disk is not a hang.
pub const LOCAL_WORK: Duration = Duration::from_secs(120);

/// What one driver last did.
#[derive(Debug, Clone)]
struct DriverRecord {
    controller: &'static str,
    step_limit: Duration,
    /// Whether the loop must turn: a worker thread that only runs passes does not.
    turns: bool,
    turned: Instant,
    /// Running passes by a number of the driver's: the key and when the pass last moved.
    passes: HashMap<u64, (String, Instant)>,
    next_pass: u64,
}

#[derive(Debug, Default)]
struct Records {
    drivers: Vec<DriverRecord>,
}

/// The progress records of every driver, shared by the drivers (writers) and whoever decides on
/// the watchdog (reader). Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    records: Arc<Mutex<Records>>,
    /// How often an idle driver must turn its loop; `None` when nobody watches (no timer then).
    turn_every: Option<Duration>,
}

impl Progress {
    /// Records watched by a watchdog that checks every `check_every`: drivers turn their loop at
    /// least twice as often, so one that turned within [`Progress::turn_limit`] is alive.
    pub fn watched(check_every: Duration) -> Progress {
        Progress {
            records: Arc::default(),
            turn_every: Some(check_every / 2),
        }
    }

    /// How long a driver's loop may go without turning: two of its idle turns.
    pub(crate) fn turn_limit(&self) -> Option<Duration> {
        self.turn_every.map(|every| every * 2)
    }

    /// Registers a driver; it counts as having turned at `now`.
    pub fn driver(
        &self,
        controller: &'static str,
        step_limit: Duration,
        now: Instant,
    ) -> DriverBeat {
        self.register(controller, step_limit, true, now)
    }

    /// Registers a worker that has no loop to turn, only passes (the scheduler's thread: each
    /// run is a pass, and one stuck in a call its budget cannot stop is a stall).
    pub fn worker(&self, name: &'static str, step_limit: Duration) -> DriverBeat {
        self.register(name, step_limit, false, Instant::now())
    }

    fn register(
        &self,
        controller: &'static str,
        step_limit: Duration,
        turns: bool,
        now: Instant,
    ) -> DriverBeat {
        let mut records = lock(&self.records);
        records.drivers.push(DriverRecord {
            controller,
            step_limit,
            turns,
            turned: now,
            passes: HashMap::new(),
            next_pass: 0,
        });
        DriverBeat {
            records: self.records.clone(),
            index: records.drivers.len() - 1,
            turn_every: self.turn_every,
        }
    }

    /// The verdict at `now` (always alive when nobody watches).
    pub fn verdict(&self, now: Instant) -> Verdict {
        let Some(turn_limit) = self.turn_limit() else {
            return Verdict::Alive;
        };
        let records = lock(&self.records);
        decide(&records.drivers, now, turn_limit)
    }
}

/// The records are plain data written in a few instructions: a writer that panicked left them
/// whole, so a poisoned lock is taken over.
fn lock(records: &Mutex<Records>) -> MutexGuard<'_, Records> {
    records
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One driver's handle on its record.
#[derive(Debug, Clone)]
pub struct DriverBeat {
    records: Arc<Mutex<Records>>,
    index: usize,
    turn_every: Option<Duration>,
}

impl DriverBeat {
    /// How often the driver must turn its loop even when nothing happens.
    pub(crate) fn turn_every(&self) -> Option<Duration> {
        self.turn_every
    }

    /// The loop turned at `now`.
    pub(crate) fn turned(&self, now: Instant) {
        lock(&self.records).drivers[self.index].turned = now;
    }

    /// A pass of `key` starts at `now`; it is running until the mark is dropped.
    pub fn pass(&self, key: String, now: Instant) -> PassMark {
        let mut records = lock(&self.records);
        let driver = &mut records.drivers[self.index];
        let id = driver.next_pass;
        driver.next_pass += 1;
        driver.passes.insert(id, (key, now));
        PassMark {
            records: self.records.clone(),
            index: self.index,
            id,
        }
    }
}

/// A running pass; dropping it (the pass ended or was aborted) removes its record.
#[derive(Debug)]
pub struct PassMark {
    records: Arc<Mutex<Records>>,
    index: usize,
    id: u64,
}

impl PassMark {
    /// The pass took a step at `now`.
    pub(crate) fn moved(&self, now: Instant) {
        if let Some(pass) = lock(&self.records).drivers[self.index]
            .passes
            .get_mut(&self.id)
        {
            pass.1 = now;
        }
    }
}

impl Drop for PassMark {
    fn drop(&mut self) {
        lock(&self.records).drivers[self.index]
            .passes
            .remove(&self.id);
    }
}

tokio::task_local! {
    /// The pass the current task runs, set by the driver around each pass.
    static PASS: PassMark;
}

/// Runs `pass` with `mark` as the pass [`mark_step`] reports to.
pub async fn within<F: Future>(mark: PassMark, pass: F) -> F::Output {
    PASS.scope(mark, pass).await
}

/// The pass running in this task took a step (e.g. starts a command with its own timeout): its
/// step limit counts from now. Outside a pass it does nothing.
pub fn mark_step() {
    let _ = PASS.try_with(|mark| mark.moved(Instant::now()));
}

/// Whether systemd watches this process, and how often it wants a ping: libsystemd's
/// `sd_watchdog_enabled` rule on the values of `WATCHDOG_USEC` and `WATCHDOG_PID`. The interval
/// must be a number of microseconds above 0 (and not `u64::MAX`, systemd's "infinity"); then an
/// unset `WATCHDOG_PID` means the watchdog is this process's (systemd sets it, but a wrapper or
/// an older manager may not), a `WATCHDOG_PID` equal to `our_pid` too, and any other value
/// (another process's pid, or not a pid) means it is not ours.
pub fn enabled(usec: Option<&str>, pid: Option<&str>, our_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.parse().ok()?;
    if usec == 0 || usec == u64::MAX {
        return None;
    }
    if let Some(pid) = pid {
        let pid: u32 = pid.parse().ok().filter(|p| *p > 0)?;
        if pid != our_pid {
            return None;
        }
    }
    Some(Duration::from_micros(usec))
}

/// Whether the watchdog may be pinged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Alive,
    Stalled(Stall),
}

/// The first thing found stuck.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    pub controller: &'static str,
    /// The key of the pass that is stuck; `None` when the driver's loop itself stopped turning.
    pub key: Option<String>,
    /// How long since the loop turned or the pass moved.
    pub(crate) idle: Duration,
    /// The limit it went past.
    pub limit: Duration,
}

impl Stall {
    /// What is stuck, without the time that grows: stays the same while the stall lasts (a status
    /// line made from it changes only when the stall does).
    pub fn what(&self) -> String {
        match &self.key {
            Some(key) => format!(
                "{} pass {key} past its limit of {}s",
                self.controller,
                self.limit.as_secs()
            ),
            None => format!("{} loop not turning", self.controller),
        }
    }
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let idle = self.idle.as_secs();
        match &self.key {
            Some(key) => write!(
                f,
                "{} pass {key} stuck for {idle}s (limit {}s)",
                self.controller,
                self.limit.as_secs()
            ),
            None => write!(
                f,
                "{} loop not turning for {}ms (limit {}ms)",
                self.controller,
                self.idle.as_millis(),
                self.limit.as_millis()
            ),
        }
    }
}

/// The rule: alive when every driver's loop turned within `turn_limit` of `now` and every running
/// pass moved within its driver's step limit; otherwise the first stall, in registration order.
fn decide(drivers: &[DriverRecord], now: Instant, turn_limit: Duration) -> Verdict {
    for driver in drivers {
        let idle = now.saturating_duration_since(driver.turned);
        if driver.turns && idle > turn_limit {
            return Verdict::Stalled(Stall {
                controller: driver.controller,
                key: None,
                idle,
                limit: turn_limit,
            });
        }
        // The longest-stuck pass of this driver, so the report names the worst one.
        let stuck = driver
            .passes
            .values()
            .map(|(key, moved)| (key, now.saturating_duration_since(*moved)))
            .filter(|(_, idle)| *idle > driver.step_limit)
            .max_by_key(|(key, idle)| (*idle, std::cmp::Reverse((*key).clone())));
        if let Some((key, idle)) = stuck {
            return Verdict::Stalled(Stall {
                controller: driver.controller,
                key: Some(key.clone()),
                idle,
                limit: driver.step_limit,
            });
        }
    }
    Verdict::Alive
}

#[cfg(test)]
mod tests;
