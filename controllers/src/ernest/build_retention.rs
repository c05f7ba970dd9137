//! The graph executor's build files: what `verwalter graph builds list|show` says of a stored
//! build, which finished builds `prune --older-than` and the `retention` setting remove, and how
//! often the running executor looks. The daemon lists, reads and deletes; this decides.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::ernest::{BuildRun, Sent};

/// What a stored build is: a line of `builds list`, the head of `builds show`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BuildSummary {
    pub id: String,
    /// The subject it came on: `build.create`, ...
    pub subject: String,
    /// `running`, `done` or `error`.
    pub state: &'static str,
    /// For a finished build: `sending` (stored, maybe not published) or `sent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent: Option<&'static str>,
    pub received_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    /// Changes by `_state` (`waiting`, `running`, `completed`, `errored`), in that order.
    pub changes: Vec<(String, usize)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl BuildSummary {
    pub fn of(run: &BuildRun) -> BuildSummary {
        let mut changes: Vec<(String, usize)> = ["waiting", "running", "completed", "errored"]
            .iter()
            .map(|s| (s.to_string(), 0))
            .collect();
        for change in &run.build.changes {
            let state = change.get("_state").and_then(Value::as_str).unwrap_or("");
            match changes.iter_mut().find(|(s, _)| s == state) {
                Some((_, n)) => *n += 1,
                None => changes.push((state.to_string(), 1)),
            }
        }
        BuildSummary {
            id: run.id().to_string(),
            subject: run.subject.clone(),
            state: run.result.as_ref().map_or("running", |r| r.kind.label()),
            sent: run.result.as_ref().map(|r| match r.sent {
                Sent::Sending => "sending",
                Sent::Sent => "sent",
            }),
            received_ms: run.received_ms,
            finished_ms: run.result.as_ref().map(|r| r.finished_ms),
            changes,
            error: run.result.as_ref().and_then(|r| r.error.clone()),
        }
    }
}

/// Whether a build's files may be removed at `now_ms` when finished builds are kept for
/// `older_than`: it finished that long ago or longer, and its result was published (`sent`).
/// A running build is never removed, nor one whose result is only stored (`sending`): a restart
/// still has something to do with it.
pub fn prunable(run: &BuildRun, now_ms: u64, older_than: Duration) -> bool {
    let Some(result) = &run.result else {
        return false;
    };
    let age_ms = u128::from(now_ms.saturating_sub(result.finished_ms));
    result.sent == Sent::Sent && age_ms >= older_than.as_millis()
}

/// How often the executor looks for builds past `retention`: a quarter of it, at least every
/// 10 minutes, at most every second. A file goes at most that long after it is due.
pub fn sweep_interval(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(600))
}

/// An age: a number with a unit, `s`, `m`, `h` or `d` (`90s`, `30m`, `12h`, `7d`), or seconds
/// alone (`3600`). Fractions are allowed (`1.5h`).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&text[..at], &text[at..]),
        _ => (text, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return Err(format!("{text:?}: the unit is s, m, h or d (as in 7d)")),
    };
    number
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && *n >= 0.0)
        .and_then(|n| Duration::try_from_secs_f64(n * scale).ok())
        .ok_or_else(|| format!("{text:?} is not an age such as 90s, 30m, 12h or 7d"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ernest::{Build, RunSettings};
    use crate::graph::ErrorPolicy;

    const MIN: u64 = 60_000;

    fn build(id: &str) -> Build {
        serde_json::from_value(serde_json::json!({
            "id": id,
            "changes": [{"_component_id": "network::a", "_component": "network",
                         "_action": "create", "_provider": "fake"}],
            "edges": [{"source": "start", "destination": "network::a"}],
        }))
        .unwrap()
    }

    fn settings() -> RunSettings {
        RunSettings {
            policy: ErrorPolicy::Halt,
            component_timeout: Duration::from_secs(60),
            templating: Default::default(),
        }
    }

    #[test]
    fn only_published_builds_past_the_age_are_pruned() {
        // A fake clock: every time is given.
        let t0 = 1_000 * MIN;
        let mut run = BuildRun::new("build.create", build("b1"), settings(), t0);
        run.pump(t0);
        let hour = Duration::from_secs(3600);
        assert!(!prunable(&run, t0 + 100 * MIN, hour), "running");
        let summary = BuildSummary::of(&run);
        assert_eq!(summary.state, "running");
        assert_eq!(summary.changes[1], ("running".to_string(), 1));

        // Errored at t0 + 10 min (a timeout), its result stored but not yet published.
        let done_at = t0 + 10 * MIN;
        run.expire(done_at);
        run.pump(done_at);
        assert!(!prunable(&run, done_at + 100 * MIN, hour), "sending");
        assert_eq!(BuildSummary::of(&run).sent, Some("sending"));
        run.mark_sent();
        let summary = BuildSummary::of(&run);
        assert_eq!((summary.state, summary.sent), ("error", Some("sent")));
        assert_eq!(summary.finished_ms, Some(done_at));
        assert_eq!(summary.changes[3], ("errored".to_string(), 1));

        // The age counts from the finish, not the receipt.
        assert!(!prunable(&run, done_at + 59 * MIN, hour));
        assert!(prunable(&run, done_at + 60 * MIN, hour));
        assert!(prunable(&run, done_at, Duration::ZERO));
        // A clock behind the finish (set back) keeps the build.
        assert!(!prunable(&run, done_at - MIN, hour));
    }

    #[test]
    fn ages_and_the_sweep_interval() {
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_age("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_age("3600"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_age("1.5h"), Ok(Duration::from_secs(5400)));
        assert!(
            parse_age("7w")
                .unwrap_err()
                .contains("the unit is s, m, h or d")
        );
        assert!(parse_age("-1d").is_err());
        assert!(parse_age("d").is_err());
        assert!(parse_age("").is_err());
        assert_eq!(sweep_interval(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(
            sweep_interval(Duration::from_secs(3600)),
            Duration::from_secs(600)
        );
        assert_eq!(
            sweep_interval(Duration::from_secs(60)),
            Duration::from_secs(15)
        );
    }
}
