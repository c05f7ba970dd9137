//! What the config dir's watcher decides before it writes the inputs: when a burst of changes in
//! the config dir is read, what stays after a read that could not see everything.
//! `src/inputs/watcher.rs` reads the outside world and writes what this says.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::state::{InputError, Inputs};

/// When the watcher reads after a burst of events that started at `first` and whose latest
/// came at `last`: once the dir has been quiet for `debounce`, or at the latest `max_delay`
/// after the first event (so an editor's save sequence costs one read and a steady stream of
/// changes cannot postpone the read forever).
pub fn read_at(first: Instant, last: Instant, debounce: Duration, max_delay: Duration) -> Instant {
    (last + debounce).min(first + max_delay)
}

/// What one config-dir event says about the files it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// Being written: created, or its data modified, and not closed yet.
    Writing,
    /// Complete: closed after writing, renamed into place, a dir made, its mode changed.
    Done,
    /// No longer there under that name: removed, or renamed away.
    Gone,
    /// Nothing known (the watcher lost events, or an event of an unknown kind).
    Unknown,
}

/// A burst of config-dir events and when to read after it. A read goes as soon as every file
/// the burst started writing is complete (closed, or renamed into place): a deploy tool that
/// renames finished files into place, an editor's save or `cp` costs no wait at all. While a
/// file is still open for writing, or when the watcher could not tell (lost events, a kind it
/// does not know), the read waits for the quiet time `debounce`, at most `max_delay` after the
/// first event, as [`read_at`] says.
#[derive(Debug, Clone)]
pub struct Burst {
    first: Instant,
    last: Instant,
    writing: BTreeSet<PathBuf>,
    unknown: bool,
}

impl Burst {
    pub fn new(now: Instant) -> Burst {
        Burst {
            first: now,
            last: now,
            writing: BTreeSet::new(),
            unknown: false,
        }
    }

    /// An event that came at `now`.
    pub fn note(&mut self, now: Instant, touch: Touch, paths: &[PathBuf]) {
        self.last = now;
        match touch {
            Touch::Writing => self.writing.extend(paths.iter().cloned()),
            Touch::Done | Touch::Gone => paths.iter().for_each(|p| {
                self.writing.remove(p);
            }),
            Touch::Unknown => self.unknown = true,
        }
    }

    /// When to read, given what came so far.
    pub fn read_at(&self, debounce: Duration, max_delay: Duration) -> Instant {
        if self.writing.is_empty() && !self.unknown {
            self.last
        } else {
            read_at(self.first, self.last, debounce, max_delay)
        }
    }
}

/// The inputs in force after a read that could not see everything (`failures`: files or dirs
/// that exist but could not be read): the last good ones (`last`), their own errors
/// (`good_errors`, the errors of the read that produced them) and the failures, sorted by path.
pub fn kept_inputs(last: &Inputs, good_errors: &[InputError], failures: &[InputError]) -> Inputs {
    let mut kept = last.clone();
    kept.errors = good_errors.to_vec();
    kept.errors.extend(failures.iter().cloned());
    kept.errors.sort_by(|a, b| a.path.cmp(&b.path));
    kept
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_burst_is_read_when_quiet_or_at_the_latest_after_max_delay() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let (debounce, max) = (ms(100), ms(1000));
        assert_eq!(read_at(t0, t0, debounce, max), t0 + ms(100), "one event");
        assert_eq!(
            read_at(t0, t0 + ms(450), debounce, max),
            t0 + ms(550),
            "each event restarts the quiet time"
        );
        assert_eq!(
            read_at(t0, t0 + ms(950), debounce, max),
            t0 + ms(1000),
            "but not past max_delay"
        );
    }

    #[test]
    fn a_burst_of_complete_files_is_read_at_once_and_an_open_one_waits() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let (debounce, max) = (ms(100), ms(1000));
        let path = |p: &str| vec![PathBuf::from(p)];

        // A deploy tool: written under a temp name, closed, renamed into place.
        let mut burst = Burst::new(t0);
        burst.note(t0, Touch::Writing, &path("runtime/web/.v3.yaml.tmp"));
        assert_eq!(burst.read_at(debounce, max), t0 + ms(100), "still open");
        burst.note(t0 + ms(3), Touch::Done, &path("runtime/web/.v3.yaml.tmp"));
        assert_eq!(burst.read_at(debounce, max), t0 + ms(3), "closed: read now");
        burst.note(t0 + ms(4), Touch::Gone, &path("runtime/web/.v3.yaml.tmp"));
        burst.note(t0 + ms(4), Touch::Done, &path("runtime/web/v3.yaml"));
        assert_eq!(burst.read_at(debounce, max), t0 + ms(4));

        // Two files written at once: the read waits for both to close.
        let mut burst = Burst::new(t0);
        burst.note(t0, Touch::Writing, &path("a.yaml"));
        burst.note(t0 + ms(1), Touch::Writing, &path("b.yaml"));
        burst.note(t0 + ms(2), Touch::Done, &path("a.yaml"));
        assert_eq!(burst.read_at(debounce, max), t0 + ms(102));
        burst.note(t0 + ms(50), Touch::Writing, &path("b.yaml"));
        assert_eq!(burst.read_at(debounce, max), t0 + ms(150));
        // A file removed while written is no longer waited for.
        burst.note(t0 + ms(60), Touch::Gone, &path("b.yaml"));
        assert_eq!(burst.read_at(debounce, max), t0 + ms(60));

        // A writer that never closes does not hold the read past max_delay.
        let mut burst = Burst::new(t0);
        burst.note(t0, Touch::Writing, &path("log.txt"));
        burst.note(t0 + ms(980), Touch::Writing, &path("log.txt"));
        assert_eq!(burst.read_at(debounce, max), t0 + ms(1000));

        // Lost events: back to the quiet time, even once the files are closed.
        let mut burst = Burst::new(t0);
        burst.note(t0, Touch::Unknown, &[]);
        burst.note(t0 + ms(1), Touch::Done, &path("a.yaml"));
        assert_eq!(burst.read_at(debounce, max), t0 + ms(101));
    }

    fn error(path: &str) -> InputError {
        InputError {
            path: path.to_string(),
            line: None,
            message: format!("bad {path}"),
        }
    }

    #[test]
    fn a_failed_read_keeps_the_last_good_inputs_and_shows_why() {
        let good = Inputs {
            runtime: Arc::new(serde_json::json!({"app": 1})),
            scheduler_hash: "s".into(),
            hash: "h".into(),
            errors: vec![error("runtime/b.yaml")],
            metrics: None,
        };
        // A previous failure shown in `good.errors` is not carried over: only its own errors.
        let shown = Inputs {
            errors: vec![error("runtime/b.yaml"), error("runtime/old")],
            ..good.clone()
        };
        let kept = kept_inputs(
            &shown,
            &good.errors,
            &[error("scheduler/v1"), error("runtime/a")],
        );
        assert_eq!((kept.hash.as_str(), &kept.runtime), ("h", &good.runtime));
        let paths: Vec<&str> = kept.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["runtime/a", "runtime/b.yaml", "scheduler/v1"]);
    }
}
