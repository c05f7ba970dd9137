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
    /// A port that is not a number from 0 to 65535.
    #[error("config: port {value:?} is not a number from 0 to 65535")]
    BadPort { value: String },
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
    /// `!ClusterDataProvider` or `!ClusterScoreDataProvider` (which also reads Score's app
    /// profiles and node types).
    pub kind: ProviderKind,
    pub prometheus: Option<Prometheus>,
    pub kubeapi: Option<Kubeapi>,
    /// The PromQL wca runs; given under the provider or under `prometheus` (older configs), each
    /// query not given keeps wca's default.
    pub queries: Queries,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Cluster,
    ClusterScore,
}

/// `!Prometheus`: where the instant queries go.
#[derive(Debug, Clone, PartialEq)]
pub struct Prometheus {
    /// With its scheme, as wca takes it: `http://prometheus.example`.
    pub host: String,
    pub port: u16,
    /// Seconds; wca's default is 1.
    pub timeout: f64,
    /// Evaluate the queries at this time (wca's `time`, a Unix timestamp string), not now.
    pub time: Option<String>,
}

/// `!Kubeapi`: the Kubernetes API server wca reads nodes and pods from.
#[derive(Debug, Clone, PartialEq)]
pub struct Kubeapi {
    /// Host name or address; wca builds `https://host:port`. A host given with a scheme
    /// (`http://127.0.0.1`, e.g. `kubectl proxy`) keeps it.
    pub host: Option<String>,
    /// wca takes the port as a string (it usually comes from `!Env`); it is parsed here.
    pub port: Option<u16>,
    /// The service-account token sent as `Authorization: Bearer`.
    pub client_token_path: String,
    /// The CA that signs the API server's certificate.
    pub server_cert_ca_path: String,
    /// Seconds; wca's default is 5.
    pub timeout: f64,
    /// Namespaces whose pods count as assigned apps; wca's default is `[default]`.
    pub monitored_namespaces: Vec<String>,
}

/// wca's default service-account token path.
pub const SERVICE_TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// wca's default service-account CA path.
pub const SERVICE_CA_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// `!Queries`: the PromQL wca runs, under wca's names; every field has wca's default.
#[derive(Debug, Clone, PartialEq)]
pub struct Queries {
    /// Nodes with PMEM in memory mode (label `nodename`).
    pub nodes_pmm_memory_mode: String,
    /// Read bandwidth capacity of PMEM nodes (label `nodename`).
    pub membw_capacity_read: String,
    /// Write bandwidth capacity of PMEM nodes (label `nodename`).
    pub membw_capacity_write: String,
    /// WSS capacity of PMEM nodes (label `nodename`).
    pub node_capacity_mem_wss: String,
    /// DRAM bandwidth of a node (label `nodename`); in wca's newer configs, unused by its code.
    pub node_capacity_dram_membw: Option<String>,
    /// Per dimension, one instance's request of each app (label `app`).
    pub app_requested_resources: BTreeMap<Dim, String>,
}

impl Default for Queries {
    fn default() -> Queries {
        let per_app = |metric: &str| format!("max(max_over_time({metric}[3h])) by (app)");
        Queries {
            nodes_pmm_memory_mode: "sum(platform_mem_mode_size_bytes) by (nodename) != 0".into(),
            membw_capacity_read:
                "sum(platform_nvdimm_read_bandwidth_bytes_per_second) by (nodename)".into(),
            membw_capacity_write:
                "sum(platform_nvdimm_write_bandwidth_bytes_per_second) by (nodename)".into(),
            node_capacity_mem_wss:
                "sum(platform_dimm_total_size_bytes{dimm_type=\"ram\"}) by (nodename)".into(),
            node_capacity_dram_membw: None,
            app_requested_resources: BTreeMap::from([
                (Dim::Cpu, per_app("task_requested_cpus")),
                (Dim::Mem, per_app("task_requested_mem_bytes")),
                (Dim::MembwRead, per_app("task_membw_reads_bytes_per_second")),
                (
                    Dim::MembwWrite,
                    per_app("task_membw_writes_bytes_per_second"),
                ),
                (Dim::Wss, per_app("task_wss_referenced_bytes")),
            ]),
        }
    }
}

/// What `!ClusterScoreDataProvider` asks for besides the cluster provider's queries.
pub const APP_PROFILES_QUERY: &str = "app_profile";
/// Per node (`%NODE%` replaced by the quoted node name): its `nodetype` label, pmem or dram.
pub const NODE_TYPE_QUERY: &str = "node_type{nodename=%NODE%}";

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
            // wca reads numbers into string fields too (a port, a `time` stamp).
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Text, E> {
                Ok(Text::Literal(n.to_string()))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Text, E> {
                Ok(Text::Literal(n.to_string()))
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
    ClusterScoreDataProvider(RawDataProviderFields),
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
    port: Text,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    time: Option<Text>,
    #[serde(default)]
    queries: Option<Tagged<RawQueriesTag>>,
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
    port: Option<Text>,
    #[serde(default)]
    client_token_path: Option<Text>,
    #[serde(default)]
    server_cert_ca_path: Option<Text>,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    monitored_namespaces: Option<Vec<Text>>,
}

#[derive(Debug, Deserialize)]
enum RawQueriesTag {
    Queries(RawQueries),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(non_snake_case)]
struct RawQueries {
    #[serde(default)]
    NODES_PMM_MEMORY_MODE: Option<Text>,
    #[serde(default)]
    MEMBW_CAPACITY_READ: Option<Text>,
    #[serde(default)]
    MEMBW_CAPACITY_WRITE: Option<Text>,
    #[serde(default)]
    NODE_CAPACITY_MEM_WSS: Option<Text>,
    #[serde(default)]
    NODE_CAPACITY_DRAM_MEMBW: Option<Text>,
    #[serde(default)]
    APP_REQUESTED_RESOURCES_QUERY_MAP: Option<BTreeMap<Dim, Text>>,
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
    let (kind, f) = match raw.0 {
        RawDataProvider::ClusterDataProvider(f) => (ProviderKind::Cluster, f),
        RawDataProvider::ClusterScoreDataProvider(f) => (ProviderKind::ClusterScore, f),
    };
    let mut queries = Queries::default();
    let mut raw_queries = f.queries.map(|Tagged(RawQueriesTag::Queries(q))| q);
    let prometheus = match f.prometheus {
        Some(Tagged(RawPrometheusTag::Prometheus(p))) => {
            if let Some(Tagged(RawQueriesTag::Queries(q))) = p.queries {
                raw_queries.get_or_insert(q);
            }
            Some(Prometheus {
                host: p.host.resolve(env)?,
                port: port(p.port, env)?,
                timeout: p.timeout.unwrap_or(1.0),
                time: p.time.map(|t| t.resolve(env)).transpose()?,
            })
        }
        None => None,
    };
    let kubeapi = match f.kubeapi {
        Some(Tagged(RawKubeapiTag::Kubeapi(k))) => Some(Kubeapi {
            host: k.host.map(|h| h.resolve(env)).transpose()?,
            port: k.port.map(|p| port(p, env)).transpose()?,
            client_token_path: match k.client_token_path {
                Some(t) => t.resolve(env)?,
                None => SERVICE_TOKEN_PATH.into(),
            },
            server_cert_ca_path: match k.server_cert_ca_path {
                Some(t) => t.resolve(env)?,
                None => SERVICE_CA_PATH.into(),
            },
            timeout: k.timeout.unwrap_or(5.0),
            monitored_namespaces: match k.monitored_namespaces {
                Some(ns) => resolve_all(ns, env)?,
                None => vec!["default".into()],
            },
        }),
        None => None,
    };
    if let Some(q) = raw_queries {
        let set = |slot: &mut String, text: Option<Text>| -> Result<(), ConfigError> {
            if let Some(t) = text {
                *slot = t.resolve(env)?;
            }
            Ok(())
        };
        set(&mut queries.nodes_pmm_memory_mode, q.NODES_PMM_MEMORY_MODE)?;
        set(&mut queries.membw_capacity_read, q.MEMBW_CAPACITY_READ)?;
        set(&mut queries.membw_capacity_write, q.MEMBW_CAPACITY_WRITE)?;
        set(&mut queries.node_capacity_mem_wss, q.NODE_CAPACITY_MEM_WSS)?;
        queries.node_capacity_dram_membw = q
            .NODE_CAPACITY_DRAM_MEMBW
            .map(|t| t.resolve(env))
            .transpose()?;
        if let Some(map) = q.APP_REQUESTED_RESOURCES_QUERY_MAP {
            for (dim, text) in map {
                queries
                    .app_requested_resources
                    .insert(dim, text.resolve(env)?);
            }
        }
    }
    Ok(DataProvider {
        kind,
        prometheus,
        kubeapi,
        queries,
    })
}

/// A port given as a number or a string (wca's `!Env KUBERNETES_SERVICE_PORT`).
fn port(text: Text, env: &dyn Fn(&str) -> Option<String>) -> Result<u16, ConfigError> {
    let value = text.resolve(env)?;
    value
        .trim()
        .parse()
        .map_err(|_| ConfigError::BadPort { value })
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
        MEMBW_CAPACITY_READ: sum(read_bw) by (nodename)
        APP_REQUESTED_RESOURCES_QUERY_MAP:
          cpu: max(cpus) by (app)
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
        assert_eq!(
            (prom.port, prom.timeout, prom.time.as_deref()),
            (9090, 2.0, None)
        );
        let kube = dp.kubeapi.as_ref().unwrap();
        assert_eq!(
            kube.monitored_namespaces,
            vec!["default".to_string(), "batch".to_string()]
        );
        assert_eq!(
            (kube.timeout, kube.client_token_path.as_str()),
            (5.0, SERVICE_TOKEN_PATH),
            "wca's defaults"
        );
        assert_eq!(dp.queries.membw_capacity_read, "sum(read_bw) by (nodename)");
        assert_eq!(
            dp.queries.app_requested_resources[&Dim::Cpu],
            "max(cpus) by (app)"
        );
        assert_eq!(
            dp.queries.app_requested_resources[&Dim::Mem],
            Queries::default().app_requested_resources[&Dim::Mem],
            "a query not given keeps wca's default"
        );
        assert_eq!(
            dp.queries.nodes_pmm_memory_mode,
            Queries::default().nodes_pmm_memory_mode
        );

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
    fn kubeapi_port_from_env_and_queries_under_prometheus() {
        let yaml = "algorithms:\n  a: !Score\n    data_provider: !ClusterScoreDataProvider\n      kubeapi: !Kubeapi\n        host: !Env KUBE_HOST\n        port: !Env KUBE_PORT\n      prometheus: !Prometheus\n        host: http://p\n        port: 30900\n        time: '1586245624'\n        queries: !Queries\n          NODES_PMM_MEMORY_MODE: pmm\n";
        let env = |n: &str| match n {
            "KUBE_HOST" => Some("10.0.0.1".to_string()),
            "KUBE_PORT" => Some("443".to_string()),
            _ => None,
        };
        let loaded = load(yaml, env).unwrap();
        let dp = loaded["a"].data_provider.as_ref().unwrap();
        assert_eq!(dp.kind, ProviderKind::ClusterScore);
        let kube = dp.kubeapi.as_ref().unwrap();
        assert_eq!(
            (kube.host.as_deref(), kube.port),
            (Some("10.0.0.1"), Some(443))
        );
        assert_eq!(kube.monitored_namespaces, vec!["default".to_string()]);
        let prom = dp.prometheus.as_ref().unwrap();
        assert_eq!(
            (prom.port, prom.time.as_deref()),
            (30900, Some("1586245624"))
        );
        assert_eq!(dp.queries.nodes_pmm_memory_mode, "pmm");

        let bad = "algorithms:\n  a: !Fit\n    data_provider: !ClusterDataProvider\n      kubeapi: !Kubeapi {port: !Env KUBE_HOST}\n";
        let e = load(bad, env).unwrap_err().to_string();
        assert!(e.contains("\"10.0.0.1\"") && e.contains("port"), "{e}");
        let bad = "algorithms:\n  a: !Fit\n    data_provider: !ClusterDataProvider\n      queries: !Queries\n        app_profiles: x\n";
        let e = load(bad, env).unwrap_err().to_string();
        assert!(e.contains("app_profiles") && e.contains("line 5"), "{e}");
    }

    #[test]
    fn missing_env_names_the_variable() {
        let e = error("algorithms:\n  a: !Fit\n    alias: !Env NOPE\n");
        assert!(e.contains("\"NOPE\""), "{e}");
    }
}
