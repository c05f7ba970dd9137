//! Loading wca-scheduler's `config.yaml` into [`Algorithm`]s.
//!
//! The YAML uses tags for the algorithm (`!Fit {...}`, `!LeastUsedBAR {...}`, …), anchors and
//! aliases (`&dp` / `*dp`, resolved by `serde_norway`) and `!Env NAME` for string values. An
//! unknown tag, an unknown field or a value of the wrong type is an error naming the line.
//!
//! The data sources (`!ClusterDataProvider` with `!Prometheus`, `!Kubeapi`, `!Queries`) are read
//! into plain structs and kept in [`LoadedAlgorithm::data_provider`]; nothing queries them yet.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, EnumAccess, VariantAccess, Visitor};

use crate::algorithms::{Algorithm, Kind};
use crate::snapshot::Dim;

/// A config that failed to load.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Bad YAML, an unknown tag or field, a wrong type; the message names line and column.
    #[error("config: {0}")]
    Yaml(#[from] serde_norway::Error),
    /// `!Env NAME` with `NAME` not set.
    #[error("config: environment variable {name:?} (from !Env) is not set")]
    MissingEnv { name: String },
}

/// The whole file: named algorithms.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    algorithms: BTreeMap<String, Tagged<RawAlgorithm>>,
}

/// A tagged value (`!Tag ...`) read so that an error inside it names its own line.
///
/// serde_norway's `deserialize_enum` leaves errors about the tag (an unknown variant) without a
/// position, and the enclosing map then stamps its own first line on them; its `deserialize_any`
/// stamps the tagged node's line, so we go through it.
#[derive(Debug)]
struct Tagged<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Tagged<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tagged<T>, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Tagged<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a tagged value like `!Fit {...}`")
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Tagged<T>, A::Error> {
                T::deserialize(de::value::EnumAccessDeserializer::new(data)).map(Tagged)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// One algorithm as loaded: what [`Algorithm`] runs, plus what only the scheduler front needs.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedAlgorithm {
    pub algorithm: Algorithm,
    /// wca's `alias`: the name the algorithm reports under.
    pub alias: Option<String>,
    /// Where wca would get its numbers; parsed, kept for later, not used yet.
    pub data_provider: Option<DataProvider>,
}

/// wca's data provider: Prometheus for metrics, the Kubernetes API for CPU, memory and pods.
#[derive(Debug, Clone, PartialEq)]
pub struct DataProvider {
    pub prometheus: Option<Prometheus>,
    pub kubeapi: Option<Kubeapi>,
    /// Query name → PromQL, overriding wca's defaults.
    pub queries: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Prometheus {
    pub host: String,
    pub port: u16,
    pub timeout: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Kubeapi {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub monitored_namespaces: Vec<String>,
}

/// A string given literally or as `!Env NAME`.
#[derive(Debug, Clone, PartialEq)]
enum Text {
    Literal(String),
    Env(String),
}

impl Text {
    fn resolve(self, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
        match self {
            Text::Literal(s) => Ok(s),
            Text::Env(name) => env(&name).ok_or(ConfigError::MissingEnv { name }),
        }
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or `!Env NAME`")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text, E> {
                Ok(Text::Literal(s.into()))
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Text, A::Error> {
                let (tag, variant): (String, _) = data.variant()?;
                if tag != "Env" {
                    return Err(de::Error::unknown_variant(&tag, &["Env"]));
                }
                Ok(Text::Env(variant.newtype_variant()?))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
enum RawDataProvider {
    ClusterDataProvider(RawDataProviderFields),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataProviderFields {
    #[serde(default)]
    prometheus: Option<Tagged<RawPrometheusTag>>,
    #[serde(default)]
    kubeapi: Option<Tagged<RawKubeapiTag>>,
    #[serde(default)]
    queries: Option<Tagged<RawQueriesTag>>,
}

#[derive(Debug, Deserialize)]
enum RawPrometheusTag {
    Prometheus(RawPrometheus),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrometheus {
    host: Text,
    port: u16,
    #[serde(default)]
    timeout: Option<f64>,
}

#[derive(Debug, Deserialize)]
enum RawKubeapiTag {
    Kubeapi(RawKubeapi),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKubeapi {
    #[serde(default)]
    host: Option<Text>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    monitored_namespaces: Vec<Text>,
}

#[derive(Debug, Deserialize)]
enum RawQueriesTag {
    Queries(BTreeMap<String, Text>),
}

/// The parameters every algorithm takes, collected from any tag's struct.
struct Common {
    dimensions: Vec<Dim>,
    max_node_score: f64,
    alias: Option<Text>,
    data_provider: Option<Tagged<RawDataProvider>>,
}

fn ten() -> f64 {
    10.0
}

fn one() -> f64 {
    1.0
}

fn point97() -> f64 {
    0.97
}

/// One struct per tag: the common parameters plus the tag's own, refusing any other field
/// (`deny_unknown_fields` does not work through `flatten`, hence the macro).
macro_rules! tag_struct {
    ($name:ident { $($(#[$m:meta])* $f:ident : $t:ty,)* } => $kind:expr) => {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $name {
            #[serde(default = "crate::algorithms::default_dimensions")]
            dimensions: Vec<Dim>,
            #[serde(default = "ten")]
            max_node_score: f64,
            #[serde(default)]
            alias: Option<Text>,
            #[serde(default)]
            data_provider: Option<Tagged<RawDataProvider>>,
            $($(#[$m])* $f: $t,)*
        }

        impl $name {
            fn split(self) -> (Common, Kind) {
                let $name {
                    dimensions,
                    max_node_score,
                    alias,
                    data_provider,
                    $($f,)*
                } = self;
                let common = Common {
                    dimensions,
                    max_node_score,
                    alias,
                    data_provider,
                };
                (common, $kind)
            }
        }
    };
}

tag_struct!(NopTag {} => Kind::Nop);
tag_struct!(FitTag {
    #[serde(default = "one")]
    cpu_scale_factor: f64,
} => Kind::Fit { cpu_scale_factor });
tag_struct!(BarTag {
    #[serde(default = "one")]
    cpu_scale_factor: f64,
    #[serde(default)]
    bar_weights: BTreeMap<Dim, f64>,
} => Kind::Bar { cpu_scale_factor, bar_weights });
tag_struct!(LeastUsedTag {
    #[serde(default = "one")]
    cpu_scale_factor: f64,
    #[serde(default)]
    least_used_weights: BTreeMap<Dim, f64>,
} => Kind::LeastUsed { cpu_scale_factor, least_used_weights });
tag_struct!(LeastUsedBarTag {
    #[serde(default = "one")]
    cpu_scale_factor: f64,
    #[serde(default)]
    bar_weights: BTreeMap<Dim, f64>,
    #[serde(default)]
    least_used_weights: BTreeMap<Dim, f64>,
    #[serde(default = "one")]
    least_used_weight: f64,
} => Kind::LeastUsedBar { cpu_scale_factor, bar_weights, least_used_weights, least_used_weight });
tag_struct!(HierBarTag {
    #[serde(default = "one")]
    cpu_scale_factor: f64,
    #[serde(default)]
    bar_weights: BTreeMap<Dim, f64>,
    #[serde(default)]
    least_used_weights: BTreeMap<Dim, f64>,
    #[serde(default = "one")]
    least_used_weight: f64,
    #[serde(default)]
    merge_threshold: Option<f64>,
} => Kind::HierBar {
    cpu_scale_factor,
    bar_weights,
    least_used_weights,
    least_used_weight,
    merge_threshold,
});
tag_struct!(StaticAssignerTag {
    targeted_assigned_apps_counts: BTreeMap<String, BTreeMap<String, u64>>,
} => Kind::StaticAssigner { targeted_assigned_apps_counts });
tag_struct!(DramHitRatioProvisionTag {
    #[serde(default = "point97")]
    threshold: f64,
} => Kind::DramHitRatioProvision { threshold });
tag_struct!(ScoreTag {
    #[serde(default = "one")]
    cpu_scale_factor: f64,
    #[serde(default = "point97")]
    threshold: f64,
    #[serde(default)]
    score_target: Option<f64>,
    #[serde(default)]
    strict_mode_placement: bool,
} => Kind::Score { cpu_scale_factor, threshold, score_target, strict_mode_placement });

/// The algorithm tags, spelled as in wca's config.
#[derive(Debug, Deserialize)]
enum RawAlgorithm {
    #[serde(rename = "NOPAlgorithm")]
    Nop(NopTag),
    Fit(FitTag),
    #[serde(rename = "BAR")]
    Bar(BarTag),
    LeastUsed(LeastUsedTag),
    #[serde(rename = "LeastUsedBAR")]
    LeastUsedBar(LeastUsedBarTag),
    #[serde(rename = "HierBAR")]
    HierBar(HierBarTag),
    StaticAssigner(StaticAssignerTag),
    DramHitRatioProvision(DramHitRatioProvisionTag),
    Score(ScoreTag),
}

impl RawAlgorithm {
    fn split(self) -> (Common, Kind) {
        match self {
            RawAlgorithm::Nop(t) => t.split(),
            RawAlgorithm::Fit(t) => t.split(),
            RawAlgorithm::Bar(t) => t.split(),
            RawAlgorithm::LeastUsed(t) => t.split(),
            RawAlgorithm::LeastUsedBar(t) => t.split(),
            RawAlgorithm::HierBar(t) => t.split(),
            RawAlgorithm::StaticAssigner(t) => t.split(),
            RawAlgorithm::DramHitRatioProvision(t) => t.split(),
            RawAlgorithm::Score(t) => t.split(),
        }
    }
}

fn resolve_all(
    texts: Vec<Text>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ConfigError> {
    texts.into_iter().map(|t| t.resolve(env)).collect()
}

fn load_provider(
    raw: Tagged<RawDataProvider>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<DataProvider, ConfigError> {
    let Tagged(RawDataProvider::ClusterDataProvider(f)) = raw;
    let prometheus = match f.prometheus {
        Some(Tagged(RawPrometheusTag::Prometheus(p))) => Some(Prometheus {
            host: p.host.resolve(env)?,
            port: p.port,
            timeout: p.timeout,
        }),
        None => None,
    };
    let kubeapi = match f.kubeapi {
        Some(Tagged(RawKubeapiTag::Kubeapi(k))) => Some(Kubeapi {
            host: k.host.map(|h| h.resolve(env)).transpose()?,
            port: k.port,
            monitored_namespaces: resolve_all(k.monitored_namespaces, env)?,
        }),
        None => None,
    };
    let mut queries = BTreeMap::new();
    if let Some(Tagged(RawQueriesTag::Queries(q))) = f.queries {
        for (name, text) in q {
            queries.insert(name, text.resolve(env)?);
        }
    }
    Ok(DataProvider {
        prometheus,
        kubeapi,
        queries,
    })
}

/// Loads a config: `algorithms: {name: !Tag {...}}`. `env` answers `!Env NAME` (pass
/// `|n| std::env::var(n).ok()` for the process environment).
pub fn load(
    yaml: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, LoadedAlgorithm>, ConfigError> {
    let raw: RawConfig = serde_norway::from_str(yaml)?;
    let mut out = BTreeMap::new();
    for (name, Tagged(algo)) in raw.algorithms {
        let (common, kind) = algo.split();
        let loaded = LoadedAlgorithm {
            algorithm: Algorithm {
                dimensions: common.dimensions,
                max_node_score: common.max_node_score,
                kind,
            },
            alias: common.alias.map(|a| a.resolve(&env)).transpose()?,
            data_provider: common
                .data_provider
                .map(|p| load_provider(p, &env))
                .transpose()?,
        };
        out.insert(name, loaded);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PROM_HOST" => Some("http://prom.example:9090".into()),
            _ => None,
        }
    }

    const EXAMPLE: &str = "\
algorithms:
  balanced: !LeastUsedBAR
    alias: balanced-v2
    dimensions: [cpu, mem, membw_read, membw_write]
    least_used_weight: 2.5
    bar_weights: {membw_read: 3}
    data_provider: &dp !ClusterDataProvider
      prometheus: !Prometheus
        host: !Env PROM_HOST
        port: 9090
        timeout: 2.0
      kubeapi: !Kubeapi
        monitored_namespaces: [default, batch]
      queries: !Queries
        app_profiles: sum(app_profile) by (app)
  by_shape: !HierBAR
    merge_threshold: 1.5
    data_provider: *dp
  plain: !Fit {}
  nothing: !NOPAlgorithm {}
  pinned: !StaticAssigner
    targeted_assigned_apps_counts: {node-1: {redis: 2}}
  dram: !DramHitRatioProvision
    dimensions: [cpu]
  score: !Score
    score_target: 3
    strict_mode_placement: true
";

    #[test]
    fn example_loads_with_shared_provider_and_env() {
        let loaded = load(EXAMPLE, env).unwrap();
        assert_eq!(loaded.len(), 7);

        let balanced = &loaded["balanced"];
        assert_eq!(balanced.alias.as_deref(), Some("balanced-v2"));
        assert_eq!(
            balanced.algorithm.dimensions,
            vec![Dim::Cpu, Dim::Mem, Dim::MembwRead, Dim::MembwWrite]
        );
        assert_eq!(
            balanced.algorithm.kind,
            Kind::LeastUsedBar {
                cpu_scale_factor: 1.0,
                bar_weights: BTreeMap::from([(Dim::MembwRead, 3.0)]),
                least_used_weights: BTreeMap::new(),
                least_used_weight: 2.5,
            }
        );
        let dp = balanced.data_provider.as_ref().unwrap();
        let prom = dp.prometheus.as_ref().unwrap();
        assert_eq!(prom.host, "http://prom.example:9090");
        assert_eq!((prom.port, prom.timeout), (9090, Some(2.0)));
        assert_eq!(
            dp.kubeapi.as_ref().unwrap().monitored_namespaces,
            vec!["default".to_string(), "batch".to_string()]
        );
        assert_eq!(dp.queries["app_profiles"], "sum(app_profile) by (app)");

        let by_shape = &loaded["by_shape"];
        assert_eq!(by_shape.data_provider.as_ref(), Some(dp), "alias *dp");
        assert_eq!(
            by_shape.algorithm,
            Algorithm::new(Kind::HierBar {
                cpu_scale_factor: 1.0,
                bar_weights: BTreeMap::new(),
                least_used_weights: BTreeMap::new(),
                least_used_weight: 1.0,
                merge_threshold: Some(1.5),
            })
        );
        assert_eq!(by_shape.alias, None);

        assert_eq!(
            loaded["plain"].algorithm,
            Algorithm::new(Kind::Fit {
                cpu_scale_factor: 1.0
            })
        );
        assert_eq!(loaded["nothing"].algorithm, Algorithm::new(Kind::Nop));
        assert_eq!(
            loaded["pinned"].algorithm.kind,
            Kind::StaticAssigner {
                targeted_assigned_apps_counts: BTreeMap::from([(
                    "node-1".to_string(),
                    BTreeMap::from([("redis".to_string(), 2)])
                )])
            }
        );
        assert_eq!(
            loaded["dram"].algorithm,
            Algorithm::new(Kind::DramHitRatioProvision { threshold: 0.97 })
                .with_dimensions(&[Dim::Cpu])
        );
        assert_eq!(
            loaded["score"].algorithm.kind,
            Kind::Score {
                cpu_scale_factor: 1.0,
                threshold: 0.97,
                score_target: Some(3.0),
                strict_mode_placement: true,
            }
        );
    }

    fn error(yaml: &str) -> String {
        load(yaml, env).unwrap_err().to_string()
    }

    #[test]
    fn unknown_algorithm_tag_names_the_line() {
        let e = error("algorithms:\n  a: !Fit {}\n  b: !Magic {}\n");
        assert!(e.contains("Magic") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn unknown_field_names_the_field_and_line() {
        let e = error("algorithms:\n  a: !BAR\n    bar_weights: {}\n    least_used_weight: 2\n");
        assert!(
            e.contains("least_used_weight") && e.contains("line 4"),
            "{e}"
        );
        let e = error("algorithms: {}\nextra: 1\n");
        assert!(e.contains("extra") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn wrong_type_names_the_line() {
        let e = error("algorithms:\n  a: !Fit\n    cpu_scale_factor: lots\n");
        assert!(e.contains("line 3"), "{e}");
        let e = error("algorithms:\n  a: !Fit\n    dimensions: [cpu, gpu]\n");
        assert!(e.contains("gpu") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn unknown_tag_on_a_string_names_the_line() {
        let yaml = "algorithms:\n  a: !Fit\n    alias: !Secret x\n";
        let e = error(yaml);
        assert!(e.contains("Secret") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn data_provider_errors_name_the_line() {
        let e = error(
            "algorithms:\n  a: !Fit\n    data_provider: !ClusterDataProvider\n      prometheus: !Prometheus\n        host: h\n        port: 1\n        tls: true\n",
        );
        assert!(e.contains("tls") && e.contains("line 7"), "{e}");
        let e = error(
            "algorithms:\n  a: !Fit\n    data_provider: !ClusterDataProvider\n      kubeapi: !Kube {}\n",
        );
        assert!(e.contains("Kube") && e.contains("line 4"), "{e}");
        let e = error("algorithms:\n  a: !Fit\n    data_provider:\n      prometheus: {}\n");
        assert!(e.contains("line 4"), "an untagged provider is refused: {e}");
    }

    #[test]
    fn a_tag_without_parameters_takes_the_defaults() {
        let loaded = load("algorithms:\n  a: !Fit\n  b: !NOPAlgorithm\n", env).unwrap();
        assert_eq!(
            loaded["a"].algorithm,
            Algorithm::new(Kind::Fit {
                cpu_scale_factor: 1.0
            })
        );
        assert_eq!(loaded["b"].algorithm, Algorithm::new(Kind::Nop));
    }

    #[test]
    fn a_loaded_algorithm_places() {
        let yaml = "algorithms:\n  pin: !StaticAssigner\n    targeted_assigned_apps_counts: {n2: {redis: 1}}\n  fit: !Fit {dimensions: [mem]}\n";
        let loaded = load(yaml, env).unwrap();
        let mut snap = crate::Snapshot::default();
        for (node, mem) in [("n1", 4.0), ("n2", 1.0)] {
            snap.node_capacities
                .insert(node.into(), BTreeMap::from([(Dim::Mem, mem)]));
        }
        snap.apps_spec
            .insert("redis".into(), BTreeMap::from([(Dim::Mem, 2.0)]));
        let nodes = vec!["n1".to_string(), "n2".to_string()];

        let (best, filtered) =
            crate::place(&loaded["pin"].algorithm, &snap, "redis", &nodes).unwrap();
        assert_eq!(best.as_deref(), Some("n2"));
        assert!(filtered.failed.contains_key("n1"));

        let (best, filtered) =
            crate::place(&loaded["fit"].algorithm, &snap, "redis", &nodes).unwrap();
        assert_eq!(best.as_deref(), Some("n1"));
        assert!(filtered.failed["n2"].contains("mem"), "{filtered:?}");
    }

    #[test]
    fn missing_env_names_the_variable() {
        let e = error("algorithms:\n  a: !Fit\n    alias: !Env NOPE\n");
        assert!(e.contains("\"NOPE\""), "{e}");
    }
}
