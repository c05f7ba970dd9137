//! `state.metrics` of the Lua scheduler: the named Prometheus queries declared in
//! `scheduler/v1/metrics.yaml`, their last good answers, and what a scheduler run sees of them.
//!
//! The daemon refreshes the queries in the background (`src/schedule/scheduler_metrics/mod.rs`,
//! on the leader only) and writes a [`SchedulerMetrics`] into the store after each round; this
//! module decides what is kept ([`SchedulerMetrics::record`]: a failure keeps the last good
//! samples and sets the error), what survives a new declaration ([`SchedulerMetrics::declared`]),
//! whether a refresh re-runs the scheduler ([`SchedulerMetrics::same_data`]: only when a sample
//! or an error changed, not when the same values were confirmed), and the table a run gets
//! ([`SchedulerMetrics::view`], with each query's age at the run's `now`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::state::Inputs;

/// The file in the scheduler dir that declares the queries.
pub const METRICS_FILE: &str = "scheduler/v1/metrics.yaml";

/// A loaded `metrics.yaml` (the parsing is `verwalter_placement::config::scheduler_metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsDeclaration {
    /// Prometheus' base URL (`http://host:port`); queries go to `{url}/api/v1/query`.
    pub url: String,
    /// A CA file to trust for HTTPS (wca's `!SSL {server_verify: FILE}`).
    pub ca_file: Option<String>,
    /// Evaluate the queries at this time (wca's `time`), not now.
    pub time: Option<String>,
    /// Time between two rounds of queries.
    pub interval: Duration,
    /// Each query's time limit.
    pub timeout: Duration,
    /// Name → PromQL.
    pub queries: BTreeMap<String, String>,
}

/// One series of an instant query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl MetricSample {
    fn same(&self, other: &MetricSample) -> bool {
        self.labels == other.labels && self.value.to_bits() == other.value.to_bits()
    }
}

/// One declared query: its last good answer and its last error.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueryResult {
    /// The PromQL the samples answer (a changed query starts afresh).
    pub(crate) query: String,
    /// The last good answer; empty before the first.
    pub(crate) samples: Arc<Vec<MetricSample>>,
    /// Wall-clock ms of the last successful refresh; `None` before the first.
    pub(crate) updated: Option<u64>,
    /// The last refresh's error; `None` after a success.
    pub error: Option<String>,
}

/// Every declared query's result, by name (the store field `scheduler_metrics`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SchedulerMetrics {
    pub queries: BTreeMap<String, QueryResult>,
}

/// The error a query shows before its first answer when no round has run yet.
pub const NOT_YET: &str = "not queried yet";

impl SchedulerMetrics {
    /// The results for a new declaration (`None`: no `metrics.yaml`): queries still declared
    /// with the same PromQL keep what they have; new or changed ones start with no samples and
    /// [`NOT_YET`]; undeclared ones are dropped.
    pub fn declared(&self, decl: Option<&MetricsDeclaration>) -> SchedulerMetrics {
        let Some(decl) = decl else {
            return SchedulerMetrics::default();
        };
        let queries = decl
            .queries
            .iter()
            .map(|(name, query)| {
                let result = match self.queries.get(name) {
                    Some(old) if old.query == *query => old.clone(),
                    _ => QueryResult {
                        query: query.clone(),
                        error: Some(NOT_YET.into()),
                        ..QueryResult::default()
                    },
                };
                (name.clone(), result)
            })
            .collect();
        SchedulerMetrics { queries }
    }

    /// Records one answer of query `name` at wall-clock `now_ms`: a success replaces the
    /// samples and clears the error; a failure keeps the last good samples (and their time)
    /// and sets the error. A name not declared is ignored.
    pub fn record(&mut self, name: &str, answer: Result<Vec<MetricSample>, String>, now_ms: u64) {
        let Some(result) = self.queries.get_mut(name) else {
            return;
        };
        match answer {
            Ok(samples) => {
                result.samples = Arc::new(samples);
                result.updated = Some(now_ms);
                result.error = None;
            }
            Err(error) => result.error = Some(error),
        }
    }

    /// Whether `other` holds the same samples and errors for the same queries: a refresh that
    /// only confirmed the values (a newer `updated`) does not re-run the scheduler; the next
    /// periodic run sees the new age.
    pub(crate) fn same_data(&self, other: &SchedulerMetrics) -> bool {
        self.queries.len() == other.queries.len()
            && self
                .queries
                .iter()
                .zip(&other.queries)
                .all(|((a, ra), (b, rb))| {
                    a == b
                        && ra.query == rb.query
                        && ra.error == rb.error
                        && ra.samples.len() == rb.samples.len()
                        && ra
                            .samples
                            .iter()
                            .zip(rb.samples.iter())
                            .all(|(x, y)| x.same(y))
                })
    }

    /// What a scheduler run at wall-clock `now_ms` gets as `metrics`:
    /// `{name: {samples: [{labels: {...}, value}], age, updated, error}}`. `age` is seconds
    /// since the last successful refresh (never below 0; `null` before the first), `updated`
    /// its ms timestamp (`null` before), `error` the last refresh's error (`null` after a
    /// success). NaN and the infinities, which JSON cannot hold, become `null`.
    pub fn view(&self, now_ms: u64) -> Value {
        let mut out = Map::new();
        for (name, r) in &self.queries {
            let samples: Vec<Value> = r
                .samples
                .iter()
                .map(|s| json!({"labels": s.labels, "value": s.value}))
                .collect();
            let age = r.updated.map(|u| now_ms.saturating_sub(u) as f64 / 1000.0);
            out.insert(
                name.clone(),
                json!({
                    "samples": samples,
                    "age": age,
                    "updated": r.updated,
                    "error": r.error,
                }),
            );
        }
        Value::Object(out)
    }
}

/// A read whose `metrics.yaml` is bad (an error names [`METRICS_FILE`]) keeps the metrics
/// declaration of the inputs in force (`last`): the scheduler goes on getting the queries it
/// had, and the error shows with the other input errors until the file is fixed. A read
/// without the file (no error, no declaration) drops the declaration.
pub fn keep_metrics_declaration(last: &Inputs, new: &mut Inputs) {
    if new.metrics.is_none() && new.errors.iter().any(|e| e.path == METRICS_FILE) {
        new.metrics = last.metrics.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinery::clock::Clock;
    use crate::testing::FakeClock;

    fn decl(queries: &[(&str, &str)]) -> MetricsDeclaration {
        MetricsDeclaration {
            url: "http://prom:9090".into(),
            ca_file: None,
            time: None,
            interval: Duration::from_secs(15),
            timeout: Duration::from_secs(5),
            queries: queries
                .iter()
                .map(|(n, q)| (n.to_string(), q.to_string()))
                .collect(),
        }
    }

    fn sample(instance: &str, value: f64) -> MetricSample {
        MetricSample {
            labels: [("instance".to_string(), instance.to_string())].into(),
            value,
        }
    }

    #[test]
    fn ages_follow_the_clock_and_failures_keep_the_last_good_samples() {
        let clock = FakeClock::at(1_700_000_000_000);
        let mut m = SchedulerMetrics::default().declared(Some(&decl(&[("up", "up")])));
        let never = m.view(clock.now_ms());
        assert_eq!(
            never["up"],
            json!({"samples": [], "age": null, "updated": null, "error": NOT_YET}),
            "declared but not answered yet"
        );

        let t0 = clock.now_ms();
        m.record("up", Ok(vec![sample("a", 1.5)]), t0);
        clock.advance(Duration::from_millis(2500));
        let seen = m.view(clock.now_ms());
        assert_eq!(
            seen["up"],
            json!({"samples": [{"labels": {"instance": "a"}, "value": 1.5}],
                   "age": 2.5, "updated": t0, "error": null})
        );

        m.record(
            "up",
            Err("prom: no answer within 5s".into()),
            clock.now_ms(),
        );
        clock.advance(Duration::from_secs(10));
        let failed = m.view(clock.now_ms());
        assert_eq!(failed["up"]["samples"], seen["up"]["samples"], "kept");
        assert_eq!(failed["up"]["age"], json!(12.5), "age of the kept samples");
        assert_eq!(failed["up"]["updated"], json!(t0));
        assert_eq!(failed["up"]["error"], json!("prom: no answer within 5s"));

        let t1 = clock.now_ms();
        m.record("up", Ok(vec![]), t1);
        let back = m.view(t1);
        assert_eq!(
            back["up"],
            json!({"samples": [], "age": 0.0, "updated": t1, "error": null}),
            "an empty answer is an answer"
        );
        assert_eq!(m.view(t1 - 5000)["up"]["age"], json!(0.0), "never negative");
        m.record("gone", Ok(vec![sample("x", 1.0)]), t1);
        assert_eq!(m.queries.len(), 1, "an undeclared name is ignored");
    }

    #[test]
    fn a_new_declaration_keeps_unchanged_queries_only() {
        let mut m = SchedulerMetrics::default().declared(Some(&decl(&[("a", "up"), ("b", "x")])));
        m.record("a", Ok(vec![sample("n1", 1.0)]), 100);
        m.record("b", Ok(vec![sample("n1", 2.0)]), 100);
        let next = m.declared(Some(&decl(&[("a", "up"), ("b", "y"), ("c", "z")])));
        assert_eq!(next.queries["a"], m.queries["a"], "same query: kept");
        assert!(
            next.queries["b"].samples.is_empty(),
            "changed query: afresh"
        );
        assert_eq!(next.queries["b"].error.as_deref(), Some(NOT_YET));
        assert_eq!(next.queries["c"].updated, None);
        assert!(m.declared(None).queries.is_empty(), "no file: no metrics");
        assert_eq!(m.declared(None).view(0), json!({}));
    }

    #[test]
    fn only_new_values_or_errors_are_new_data() {
        let mut a = SchedulerMetrics::default().declared(Some(&decl(&[("q", "up")])));
        a.record("q", Ok(vec![sample("n", f64::NAN)]), 100);
        let mut b = a.clone();
        b.record("q", Ok(vec![sample("n", f64::NAN)]), 200);
        assert!(a.same_data(&b), "the same values, confirmed later");
        assert_ne!(a, b);
        let mut c = b.clone();
        c.record("q", Ok(vec![sample("n", 1.0)]), 300);
        assert!(!b.same_data(&c), "a value changed");
        let mut d = c.clone();
        d.record("q", Err("down".into()), 400);
        assert!(!c.same_data(&d), "an error is news");
        let e = d.declared(Some(&decl(&[("q", "up"), ("r", "x")])));
        assert!(!d.same_data(&e), "a query added");
        assert_eq!(a.view(100)["q"]["samples"][0]["value"], Value::Null, "NaN");
    }

    fn input_error(path: &str) -> crate::state::InputError {
        crate::state::InputError {
            path: path.to_string(),
            line: None,
            message: format!("bad {path}"),
        }
    }

    #[test]
    fn a_bad_metrics_file_keeps_the_last_good_declaration() {
        let decl = Arc::new(MetricsDeclaration {
            url: "http://prom:9090".into(),
            ca_file: None,
            time: None,
            interval: Duration::from_secs(15),
            timeout: Duration::from_secs(5),
            queries: [("up".to_string(), "up".to_string())].into(),
        });
        let last = Inputs {
            metrics: Some(decl.clone()),
            ..Inputs::default()
        };
        let mut bad = Inputs {
            errors: vec![input_error("runtime/x.yaml"), input_error(METRICS_FILE)],
            ..Inputs::default()
        };
        keep_metrics_declaration(&last, &mut bad);
        assert_eq!(bad.metrics, Some(decl.clone()));
        let mut other_error = Inputs {
            errors: vec![input_error("runtime/x.yaml")],
            ..Inputs::default()
        };
        keep_metrics_declaration(&last, &mut other_error);
        assert_eq!(other_error.metrics, None, "the file was removed");
        let newer = Arc::new(MetricsDeclaration {
            interval: Duration::from_secs(1),
            ..(*decl).clone()
        });
        let mut good = Inputs {
            metrics: Some(newer.clone()),
            ..Inputs::default()
        };
        keep_metrics_declaration(&last, &mut good);
        assert_eq!(good.metrics, Some(newer), "a good file is taken");
    }
}
