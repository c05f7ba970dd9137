//! The Lua scheduler's metrics declaration, `scheduler/v1/metrics.yaml`: which Prometheus to ask,
//! how often, and the named instant queries whose answers the scheduler gets as
//! `state.metrics` (docs/scheduler.md, "Metrics").
//!
//! ```yaml
//! prometheus: http://127.0.0.1:9090   # or wca's !Prometheus {host, port, timeout, ssl}
//! interval: 15                        # seconds between two rounds of queries (default 15)
//! timeout: 5                          # seconds each query may take (default below)
//! queries:
//!   cpu_busy: 'sum by (instance) (rate(node_cpu_seconds_total{mode!="idle"}[1m]))'
//! ```
//!
//! Parsed like wca's config (same `!Prometheus` and `!SSL` tags, `!Env` for strings, unknown
//! fields refused); every error names its line.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, EnumAccess, Visitor};

use super::{
    CheckedSsl, EnvScope, PlacementConfigError, Prometheus, RawPrometheus, RawSslTag, ServerVerify,
    Ssl, TextVisitor, text,
};

/// Seconds between two rounds of queries when `interval` is not given.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
/// Seconds a query may take when neither `timeout` nor the `!Prometheus` form gives one.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the queries go: a URL (`http://host:port`, a path prefix allowed) or wca's
/// `!Prometheus {...}`.
#[derive(Debug, Clone, PartialEq)]
pub enum PrometheusAddress {
    Url(String),
    Tagged(Prometheus),
}

/// A loaded `metrics.yaml`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsFile {
    pub prometheus: PrometheusAddress,
    /// Time between two rounds of queries (default [`DEFAULT_INTERVAL`]).
    pub interval: Duration,
    /// Each query's time limit: `timeout`, else the `!Prometheus` form's own (wca's default
    /// 1 s), else [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Name → PromQL, in name order.
    pub queries: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetricsFile {
    prometheus: Address,
    #[serde(default)]
    interval: Option<Seconds>,
    #[serde(default)]
    timeout: Option<Seconds>,
    #[serde(default)]
    queries: Queries,
}

/// The `queries:` map, read through `deserialize_any` so that an error in an entry names the
/// entry's line (serde_norway stamps a nested map's first line otherwise).
#[derive(Default)]
struct Queries(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Queries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Queries, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Queries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of query names to PromQL")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Queries, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(name) = map.next_key::<String>()? {
                    let Query(q) = map.next_value()?;
                    if out.insert(name.clone(), q).is_some() {
                        return Err(de::Error::custom(format!(
                            "query {name:?} is declared twice"
                        )));
                    }
                }
                Ok(Queries(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A positive number of seconds.
struct Seconds(Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Seconds, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Seconds;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a positive number of seconds")
            }
            fn visit_f64<E: de::Error>(self, s: f64) -> Result<Seconds, E> {
                if s.is_finite() && s > 0.0 && s < 1e9 {
                    Ok(Seconds(Duration::from_secs_f64(s)))
                } else {
                    Err(E::custom(format!(
                        "{s} is not a positive number of seconds"
                    )))
                }
            }
            fn visit_u64<E: de::Error>(self, s: u64) -> Result<Seconds, E> {
                self.visit_f64(s as f64)
            }
            fn visit_i64<E: de::Error>(self, s: i64) -> Result<Seconds, E> {
                self.visit_f64(s as f64)
            }
        }
        // Through `deserialize_any`, so that an error names the value's own line.
        d.deserialize_any(V)
    }
}

/// A PromQL query: a string that is not blank.
struct Query(String);

impl<'de> Deserialize<'de> for Query {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Query, D::Error> {
        let check = |q: String| {
            if q.trim().is_empty() {
                Err("a query must not be empty".to_string())
            } else {
                Ok(Query(q))
            }
        };
        // Checked inside the visitor, so that the error names the query's own line.
        d.deserialize_any(TextVisitor(check, PhantomData))
    }
}

struct Address(PrometheusAddress);

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Address, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Address;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a URL like http://prometheus:9090 or `!Prometheus {host, port}`")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Address, E> {
                url(s).map(Address).map_err(E::custom)
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Address, A::Error> {
                let (tag, variant): (String, _) = data.variant()?;
                match tag.as_str() {
                    "Prometheus" => {
                        let raw: RawPrometheus = de::VariantAccess::newtype_variant(variant)?;
                        prometheus(raw).map(Address).map_err(de::Error::custom)
                    }
                    "Env" => {
                        let name: String = de::VariantAccess::newtype_variant(variant)?;
                        let value = super::env_value(&name).map_err(de::Error::custom)?;
                        url(&value).map(Address).map_err(de::Error::custom)
                    }
                    _ => Err(de::Error::unknown_variant(&tag, &["Prometheus", "Env"])),
                }
            }
        }
        d.deserialize_any(V)
    }
}

fn url(s: &str) -> Result<PrometheusAddress, String> {
    let s = s.trim();
    if !(s.starts_with("http://") || s.starts_with("https://")) || s.len() <= "https://".len() {
        return Err(format!(
            "prometheus: {s:?} is not an http:// or https:// URL"
        ));
    }
    Ok(PrometheusAddress::Url(s.trim_end_matches('/').to_string()))
}

fn prometheus(p: RawPrometheus) -> Result<PrometheusAddress, String> {
    if p.queries.is_some() {
        return Err("!Prometheus: the queries go under the file's own `queries:`".into());
    }
    Ok(PrometheusAddress::Tagged(Prometheus {
        host: p.host.0,
        port: p.port.0,
        timeout: p.timeout.map_or(1.0, |s| s.0),
        time: text(p.time),
        ssl: p
            .ssl
            .map(|super::Tagged(RawSslTag::Ssl(CheckedSsl(s)))| Ssl {
                server_verify: s.server_verify.map_or(ServerVerify::System, |v| v.0),
                client_cert_path: text(s.client_cert_path),
                client_key_path: text(s.client_key_path),
            }),
    }))
}

/// Loads a `metrics.yaml`. `env` answers `!Env NAME`.
pub fn load_metrics_file(
    yaml: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<MetricsFile, PlacementConfigError> {
    let raw: RawMetricsFile = {
        let _env = EnvScope::enter(yaml, &env);
        serde_norway::from_str(yaml)?
    };
    let Address(prometheus) = raw.prometheus;
    let timeout = match (&raw.timeout, &prometheus) {
        (Some(Seconds(t)), _) => *t,
        (None, PrometheusAddress::Tagged(p)) => Duration::from_secs_f64(p.timeout.max(0.001)),
        (None, PrometheusAddress::Url(_)) => DEFAULT_TIMEOUT,
    };
    Ok(MetricsFile {
        prometheus,
        interval: raw.interval.map_or(DEFAULT_INTERVAL, |s| s.0),
        timeout,
        queries: raw.queries.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Result<MetricsFile, PlacementConfigError> {
        load_metrics_file(yaml, |n| {
            (n == "PROM").then(|| "http://p.example:9090".into())
        })
    }

    #[test]
    fn a_url_with_defaults_and_named_queries() {
        let f = load("prometheus: http://127.0.0.1:9090/\nqueries:\n  up: up\n  load: 'node_load1{job=\"n\"}'\n").unwrap();
        assert_eq!(
            f.prometheus,
            PrometheusAddress::Url("http://127.0.0.1:9090".into())
        );
        assert_eq!((f.interval, f.timeout), (DEFAULT_INTERVAL, DEFAULT_TIMEOUT));
        let names: Vec<&str> = f.queries.keys().map(String::as_str).collect();
        assert_eq!(names, ["load", "up"]);
        assert_eq!(f.queries["load"], "node_load1{job=\"n\"}");
        let env = load("prometheus: !Env PROM\ninterval: 2.5\ntimeout: 0.5\n").unwrap();
        assert_eq!(
            env.prometheus,
            PrometheusAddress::Url("http://p.example:9090".into())
        );
        assert_eq!(env.interval, Duration::from_millis(2500));
        assert_eq!(env.timeout, Duration::from_millis(500));
        assert!(env.queries.is_empty());
    }

    #[test]
    fn wca_prometheus_form_gives_its_timeout_unless_the_file_does() {
        let yaml = "prometheus: !Prometheus\n  host: http://prom\n  port: 30900\n  timeout: 2\nqueries: {a: up}\n";
        let f = load(yaml).unwrap();
        let PrometheusAddress::Tagged(p) = &f.prometheus else {
            panic!("{f:?}")
        };
        assert_eq!((p.host.as_str(), p.port), ("http://prom", 30900));
        assert_eq!(f.timeout, Duration::from_secs(2));
        let f = load(&format!("{yaml}timeout: 7\n")).unwrap();
        assert_eq!(f.timeout, Duration::from_secs(7));
        let bare = load("prometheus: !Prometheus {host: h, port: 1}\n").unwrap();
        assert_eq!(bare.timeout, Duration::from_secs(1), "wca's default");
    }

    fn error(yaml: &str) -> (Option<usize>, String) {
        let e = load(yaml).unwrap_err();
        (e.line(), e.message())
    }

    #[test]
    fn errors_name_their_line() {
        let (line, m) = error("prometheus: http://p:9090\nqueries:\n  a: up\n  b: ''\n");
        assert_eq!(line, Some(4), "{m}");
        assert!(m.contains("empty"), "{m}");
        let (line, m) = error("prometheus: http://p:9090\ninterval: -1\n");
        assert_eq!(line, Some(2), "{m}");
        assert!(m.contains("seconds"), "{m}");
        let (line, m) = error("prometheus: http://p:9090\nintervall: 5\n");
        assert_eq!(line, Some(2), "{m}");
        assert!(m.contains("intervall"), "{m}");
        let (line, m) = error("queries: {}\nprometheus: prom:9090\n");
        assert_eq!(line, Some(2), "{m}");
        assert!(m.contains("URL"), "{m}");
        let (line, m) = error("prometheus: !Prometheus\n  host: h\n  port: 99999\n");
        assert_eq!(line, Some(3), "{m}");
        let (line, m) = error("prometheus: !Kubeapi {host: h}\n");
        assert_eq!(line, Some(1), "{m}");
        let (_, m) = error("queries: {a: up}\n");
        assert!(m.contains("prometheus"), "{m}");
        let (line, m) = error("prometheus: !Env UNSET\n");
        assert_eq!(line, Some(1), "{m}");
        assert!(m.contains("UNSET"), "{m}");
    }
}
