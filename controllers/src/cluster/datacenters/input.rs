//! What the exchange takes from outside, checked: a DC's name, the settings (a cap above the
//! heartbeats' floor), and the `datacenters` part of the scheduler's output.

use std::collections::BTreeMap;

use serde_json::Value;

use super::wire::{Envelope, VERSION};
use super::{Config, Output};
use crate::state::json_kind;

/// A DC's name: 1 to 64 characters of `a-z`, `0-9`, `-`, `_`, `.`.
pub fn valid_dc_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// A setting of the exchange that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("datacenters.{0}: must be above 0")]
    Zero(&'static str),
    #[error("datacenters.link-timeout-ms: must be at least twice period-ms ({period_ms} ms)")]
    LinkTimeout { period_ms: u64 },
    #[error(
        "datacenters.traffic-cap-bytes: {cap} is under twice what heartbeats alone send to \
         {dcs} other data center(s) per interval ({floor} bytes)"
    )]
    CapUnderFloor { cap: u64, dcs: usize, floor: u64 },
}

/// The largest envelope without a summary, request or answer: what a heartbeat costs at most.
fn heartbeat_bytes() -> u64 {
    let envelope = Envelope {
        v: VERSION,
        dc: "d".repeat(64),
        node: "0".repeat(32),
        // A host name and a port.
        addr: format!("{}:65535", "h".repeat(253)),
        epoch: u64::MAX,
        seq: u64::MAX,
        summary_hash: Some("0".repeat(64)),
        summary: None,
        have_summary: Some("0".repeat(64)),
        requests: Vec::new(),
        answers: Vec::new(),
    };
    envelope.to_json().len() as u64
}

impl Config {
    /// What heartbeats alone send per `traffic_interval` to `dcs` other DCs: each leader calls
    /// every other one every period and answers each one's calls.
    pub fn heartbeat_floor(&self, dcs: usize) -> u64 {
        let periods = self.traffic_interval.as_secs_f64() / self.period.as_secs_f64().max(1e-3);
        (2.0 * dcs as f64 * heartbeat_bytes() as f64 * periods.ceil()) as u64
    }

    /// Every problem of these settings for a mesh of `dcs` other DCs, all at once.
    pub fn check(&self, dcs: usize) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let named = [
            ("period-ms", self.period),
            ("exchange-timeout-ms", self.exchange_timeout),
            ("traffic-interval-ms", self.traffic_interval),
            ("max-lease-ms", self.max_lease),
        ];
        for (name, value) in named {
            if value.is_zero() {
                errors.push(ConfigError::Zero(name));
            }
        }
        if !self.period.is_zero() && self.link_timeout < self.period * 2 {
            let period_ms = u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX);
            errors.push(ConfigError::LinkTimeout { period_ms });
        }
        let floor = self.heartbeat_floor(dcs);
        if !self.period.is_zero() && self.traffic_cap < floor.saturating_mul(2) {
            errors.push(ConfigError::CapUnderFloor {
                cap: self.traffic_cap,
                dcs,
                floor,
            });
        }
        errors
    }
}

/// A part of the scheduler's `datacenters` output that cannot be read; the rest is used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ReadError {
    /// Where, as `datacenters.requests.fra[0]`.
    pub path: String,
    pub message: String,
}

impl Output {
    /// Reads the `datacenters` value a scheduler returned (`null`: nothing for other DCs).
    /// An entry that cannot be read is left out with its error; what can be read is used (what
    /// the exchange then refuses, [`super::Exchange::set_output`] says).
    pub fn from_value(value: &Value) -> (Output, Vec<ReadError>) {
        let mut errors = Vec::new();
        let mut output = Output::default();
        let error = |path: String, message: String| ReadError { path, message };
        let object = match value {
            Value::Null => return (output, errors),
            Value::Object(object) => object,
            other => {
                let message = format!("expected an object, got {}", json_kind(other));
                return (output, vec![error("datacenters".into(), message)]);
            }
        };
        for (key, value) in object {
            match key.as_str() {
                "summary" => output.summary = (!value.is_null()).then(|| value.clone()),
                "requests" => output.requests = per_dc(key, value, &mut errors),
                "answers" => output.answers = per_dc(key, value, &mut errors),
                _ => errors.push(error(
                    format!("datacenters.{key}"),
                    "unknown key (summary, requests, answers are known)".into(),
                )),
            }
        }
        (output, errors)
    }
}

/// `{dc: [entry, ...]}`, each entry read on its own.
fn per_dc<T: serde::de::DeserializeOwned>(
    kind: &str,
    value: &Value,
    errors: &mut Vec<ReadError>,
) -> BTreeMap<String, Vec<T>> {
    let mut out = BTreeMap::new();
    let Some(object) = value.as_object() else {
        if !value.is_null() {
            errors.push(ReadError {
                path: format!("datacenters.{kind}"),
                message: format!(
                    "expected an object of lists by DC, got {}",
                    json_kind(value)
                ),
            });
        }
        return out;
    };
    for (dc, list) in object {
        let path = format!("datacenters.{kind}.{dc}");
        let Some(items) = list.as_array() else {
            let message = format!("expected a list, got {}", json_kind(list));
            errors.push(ReadError { path, message });
            continue;
        };
        let mut kept = Vec::new();
        for (index, item) in items.iter().enumerate() {
            match serde_json::from_value::<T>(item.clone()) {
                Ok(entry) => kept.push(entry),
                Err(e) => errors.push(ReadError {
                    path: format!("{path}[{index}]"),
                    message: e.to_string(),
                }),
            }
        }
        out.insert(dc.clone(), kept);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    #[test]
    fn dc_names_are_short_lowercase_words() {
        for good in ["ams", "eu-west-1", "dc_2", "a.b", &"x".repeat(64)] {
            assert!(valid_dc_name(good), "{good}");
        }
        for bad in ["", "AMS", "a b", "a/b", "ü", &"x".repeat(65)] {
            assert!(!valid_dc_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_defaults_pass_and_a_cap_under_the_heartbeats_is_refused() {
        assert_eq!(heartbeat_bytes(), 637, "docs/datacenters.md says so");
        assert_eq!(Config::default().check(12), []);
        let floor = Config::default().heartbeat_floor(2);
        // 30 periods a minute, two envelopes each to each of 2 DCs.
        assert_eq!(floor, 2 * 2 * 30 * 637);
        let config = Config {
            traffic_cap: 2 * floor - 1,
            link_timeout: Duration::from_secs(3),
            exchange_timeout: Duration::ZERO,
            ..Config::default()
        };
        let errors: Vec<String> = config.check(2).iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "datacenters.exchange-timeout-ms: must be above 0".to_string(),
                "datacenters.link-timeout-ms: must be at least twice period-ms (2000 ms)".into(),
                format!(
                    "datacenters.traffic-cap-bytes: {} is under twice what heartbeats alone \
                     send to 2 other data center(s) per interval ({floor} bytes)",
                    2 * floor - 1
                ),
            ]
        );
    }

    #[test]
    fn the_scheduler_output_is_read_entry_by_entry() {
        let value = json!({
            "summary": {"spare": 3},
            "requests": {"fra": [
                {"id": "burst", "data": {"workers": 20}, "lease_ms": 60000},
                {"id": "no-lease", "data": 1},
            ]},
            "answers": {"lon": "not a list", "fra": [{"request": "x", "data": null, "lease_ms": 5}]},
            "extra": 1,
        });
        let (output, errors) = Output::from_value(&value);
        assert_eq!(output.summary, Some(json!({"spare": 3})));
        assert_eq!(output.requests["fra"].len(), 1);
        assert_eq!(output.requests["fra"][0].id, "burst");
        assert_eq!(output.answers["fra"][0].request, "x");
        let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("datacenters.answers.lon: expected a list, got a string"));
        assert_eq!(
            errors[1],
            "datacenters.extra: unknown key (summary, requests, answers are known)"
        );
        assert!(errors[2].starts_with("datacenters.requests.fra[1]: missing field `lease_ms`"));
        assert_eq!(
            Output::from_value(&Value::Null),
            (Output::default(), vec![])
        );
        let (_, errors) = Output::from_value(&json!([1]));
        assert_eq!(
            errors[0].to_string(),
            "datacenters: expected an object, got an array"
        );
    }
}
