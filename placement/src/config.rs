//! Loading wca-scheduler's `config.yaml` into [`Algorithm`]s.
//!
//! Two forms of the file, one of them per file:
//! - wca's own: `algorithm: !Tag {...}` (one algorithm, loaded under the name
//!   [`SINGLE_ALGORITHM`]) with `loggers`, `kubeapi`, `data_provider`, `monitored_namespaces`,
//!   `reschedule_interval` and `dram_threshold` beside it;
//! - ours: `algorithms: {name: !Tag {...}}`, several named algorithms (the simulator, Lua).
//!
//! The YAML uses tags for the algorithm (`!Fit {...}`, `!LeastUsedBAR {...}`, …), anchors and
//! aliases (`&dp` / `*dp`, resolved by `serde_norway`) and `!Env NAME` for string values. An
//! unknown tag, an unknown field, a value of the wrong type, an unset `!Env` or a bad port is an
//! error naming the line ([`PlacementConfigError::line`]).
//!
//! Unknown top-level keys: wca builds whatever stands at the top level, and its configs use keys
//! of their own only to hold an anchor (`common: &dp !ClusterDataProvider {...}`). So a
//! top-level key verwalter does not read is accepted when its value carries one of the tags below
//! (it is checked where an alias uses it), and refused, with its line, otherwise.
//!
//! The data sources (`!ClusterDataProvider` with `!Prometheus`, `!Kubeapi`, `!Queries`, `!SSL`)
//! are read into plain structs ([`DataProvider`]); this crate never queries them.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::value::StrDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, VariantAccess, Visitor,
};
use serde::{Deserialize, Serialize};

use crate::algorithms::{Algorithm, Kind};
use crate::snapshot::Dim;

/// The Lua scheduler's `metrics.yaml` (same tags and `!Env` as this file's config).
pub mod scheduler_metrics;

/// A config that failed to load.
#[derive(Debug, thiserror::Error)]
pub enum PlacementConfigError {
    /// Bad YAML, an unknown tag or field, a wrong type, an unset `!Env`, a bad port; the message
    /// names line and column.
    #[error("config: {0}")]
    Yaml(#[from] serde_norway::Error),
}

impl PlacementConfigError {
    /// The line (from 1) the problem is on, when it is known.
    pub fn line(&self) -> Option<usize> {
        match self {
            PlacementConfigError::Yaml(e) => e.location().map(|l| l.line()),
        }
    }

    /// The problem without the `config: ` prefix and the ` at line L column C` suffix (for
    /// `FILE:LINE: message`).
    pub fn message(&self) -> String {
        match self {
            PlacementConfigError::Yaml(e) => {
                let text = e.to_string();
                match e.location() {
                    Some(l) => {
                        let suffix = format!(" at line {} column {}", l.line(), l.column());
                        text.strip_suffix(&suffix).unwrap_or(&text).to_string()
                    }
                    None => text,
                }
            }
        }
    }
}

/// The name wca's single `algorithm: !Tag {...}` is loaded under.
pub const SINGLE_ALGORITHM: &str = "algorithm";

/// A whole config file.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementConfig {
    /// The algorithms by name; wca's single `algorithm` under [`SINGLE_ALGORITHM`].
    pub algorithms: BTreeMap<String, LoadedAlgorithm>,
    /// wca's `loggers`: logger name → level (`TRACE`, `DEBUG`, `INFO`, `WARNING`, `ERROR`,
    /// `CRITICAL`, any case), as written.
    pub loggers: BTreeMap<String, String>,
    /// The top-level `kubeapi` (wca deletes the pods its reschedule picks through it).
    pub(crate) kubeapi: Option<Kubeapi>,
    /// The top-level `data_provider` (wca's mutating webhook reads app requests from it).
    pub(crate) data_provider: Option<DataProvider>,
    /// The top-level `monitored_namespaces` (default `[default]`). wca's server reads it for its
    /// mutating webhook and schedules only namespace `default`, hard-coded; it is the natural
    /// setting for the namespaces an extender schedules.
    pub(crate) monitored_namespaces: Vec<String>,
    /// How often wca runs the algorithm's reschedule; `None` when absent or 0 (never).
    pub(crate) reschedule_interval: Option<Duration>,
    /// wca's mutating webhook's `dram_threshold` (a percentage; verwalter has no webhook).
    pub(crate) dram_threshold: Option<f64>,
    /// Top-level keys verwalter does not read, each holding a tagged value (an anchor): key → tag.
    pub(crate) anchor_keys: BTreeMap<String, String>,
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
    /// `!SSL`: how to check the server and which client certificate to show (HTTPS).
    pub ssl: Option<Ssl>,
}

/// `!SSL`: wca's TLS settings for Prometheus.
#[derive(Debug, Clone, PartialEq)]
pub struct Ssl {
    pub server_verify: ServerVerify,
    /// A PEM file with the client certificate (and its key, when `client_key_path` is absent).
    pub client_cert_path: Option<String>,
    pub client_key_path: Option<String>,
}

/// wca's `server_verify`: `true` (the system's CAs, the default), `false`, or a CA file.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerVerify {
    System,
    Off,
    CaFile(String),
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
    pub(crate) node_capacity_mem_wss: String,
    /// DRAM bandwidth of a node (label `nodename`); in wca's newer configs, unused by its code.
    pub(crate) node_capacity_dram_membw: Option<String>,
    /// Per dimension, one instance's request of each app (label `app`).
    pub app_requested_resources: BTreeMap<Dim, String>,
    /// wca's newest form of the node capacities (`NODE_CAPACITY_RESOURCES_QUERY_MAP`, label
    /// `node`): per dimension other than CPU and memory (those come from the Kubernetes API).
    /// Empty unless the config gives it; read and checked, but not queried yet: the three
    /// queries above give the capacities (docs/placement.md, "Data sources").
    pub(crate) node_capacity_resources: BTreeMap<Dim, String>,
    /// Each node's DRAM hit ratio (`NODES_DRAM_HIT_RATIO`, label `nodename` as every node series).
    pub(crate) nodes_dram_hit_ratio: String,
}

impl Default for Queries {
    /// wca's default metrics, each answer in verwalter's units ([`unit_of`]): CPU in cores,
    /// memory and WSS in GB, bandwidth in GB/s, as the Kubernetes API's node capacities (whole
    /// GB) and the DRAM bandwidth default (200 GB/s) are. wca's metrics count bytes, so the
    /// queries divide by 1e9 (wca's own default queries answered bytes, and a pod's request of
    /// 4 GiB came back as 4294967296 against a node's 16 GB: every node refused every pod).
    fn default() -> Queries {
        let per_app = |metric: &str| format!("max(max_over_time({metric}[3h])) by (app)");
        let per_app_gb = |metric: &str| format!("{} / 1e9", per_app(metric));
        Queries {
            nodes_pmm_memory_mode: "sum(platform_mem_mode_size_bytes) by (nodename) != 0".into(),
            membw_capacity_read:
                "sum(platform_nvdimm_read_bandwidth_bytes_per_second) by (nodename) / 1e9".into(),
            membw_capacity_write:
                "sum(platform_nvdimm_write_bandwidth_bytes_per_second) by (nodename) / 1e9".into(),
            node_capacity_mem_wss:
                "sum(platform_dimm_total_size_bytes{dimm_type=\"ram\"}) by (nodename) / 1e9".into(),
            node_capacity_dram_membw: None,
            app_requested_resources: BTreeMap::from([
                (Dim::Cpu, per_app("task_requested_cpus")),
                (Dim::Mem, per_app_gb("task_requested_mem_bytes")),
                (
                    Dim::MembwRead,
                    per_app_gb("task_membw_reads_bytes_per_second"),
                ),
                (
                    Dim::MembwWrite,
                    per_app_gb("task_membw_writes_bytes_per_second"),
                ),
                (Dim::Wss, per_app_gb("task_wss_referenced_bytes")),
            ]),
            node_capacity_resources: BTreeMap::new(),
            nodes_dram_hit_ratio: "platform_dram_hit_ratio".into(),
        }
    }
}

/// The unit every source answers `dim` in: what the Kubernetes API's capacities are converted
/// to and what the default queries return. A query of one's own must answer in it too (divide
/// bytes by 1e9 in the PromQL).
pub(crate) fn unit_of(dim: Dim) -> &'static str {
    match dim {
        Dim::Cpu => "cores",
        Dim::Mem | Dim::Wss => "GB",
        Dim::MembwRead | Dim::MembwWrite | Dim::MembwFlat => "GB/s",
    }
}

/// What `!ClusterScoreDataProvider` asks for besides the cluster provider's queries.
pub(crate) const APP_PROFILES_QUERY: &str = "app_profile";

// ---------------------------------------------------------------------------------------------
// `!Env`: the values are looked up before the typed parse, so that an unset one is reported
// where it is written (a deserializer cannot carry the caller's lookup function).

thread_local! {
    /// `!Env` name → its value (`None`: unset), for the typed parse running on this thread.
    static ENV: RefCell<BTreeMap<String, Option<String>>> = const { RefCell::new(BTreeMap::new()) };
}

/// Clears [`ENV`] when the parse ends, however it ends.
struct EnvScope;

impl EnvScope {
    fn enter(yaml: &str, env: &dyn Fn(&str) -> Option<String>) -> EnvScope {
        let mut names = BTreeSet::new();
        // A file that is not YAML fails again, with its line, in the typed parse.
        if let Ok(value) = serde_norway::from_str::<serde_norway::Value>(yaml) {
            env_names(&value, &mut names);
        }
        let values = names.into_iter().map(|n| {
            let v = env(&n);
            (n, v)
        });
        ENV.with(|e| *e.borrow_mut() = values.collect());
        EnvScope
    }
}

impl Drop for EnvScope {
    fn drop(&mut self) {
        ENV.with(|e| e.borrow_mut().clear());
    }
}

/// Every `NAME` of an `!Env NAME` in the document.
fn env_names(value: &serde_norway::Value, out: &mut BTreeSet<String>) {
    use serde_norway::Value;
    match value {
        Value::Tagged(t) => match (&t.value, t.tag == "Env") {
            (Value::String(name), true) => {
                out.insert(name.clone());
            }
            (inner, _) => env_names(inner, out),
        },
        Value::Sequence(items) => items.iter().for_each(|v| env_names(v, out)),
        Value::Mapping(map) => map.iter().for_each(|(k, v)| {
            env_names(k, out);
            env_names(v, out);
        }),
        _ => {}
    }
}

fn env_value(name: &str) -> Result<String, String> {
    ENV.with(|e| e.borrow().get(name).cloned().flatten())
        .ok_or_else(|| format!("environment variable {name:?} (from !Env) is not set"))
}

/// A string given literally or as `!Env NAME` (resolved while parsing); wca reads numbers into
/// string fields too (a port, a `time` stamp). `F` checks or converts it, so that its error
/// names the value's line.
struct TextVisitor<T, F: FnOnce(String) -> Result<T, String>>(F, PhantomData<T>);

impl<'de, T, F: FnOnce(String) -> Result<T, String>> Visitor<'de> for TextVisitor<T, F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string or `!Env NAME`")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
        (self.0)(s.into()).map_err(E::custom)
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<T, E> {
        (self.0)(n.to_string()).map_err(E::custom)
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<T, E> {
        (self.0)(n.to_string()).map_err(E::custom)
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<T, A::Error> {
        let (tag, variant): (String, _) = data.variant()?;
        if tag != "Env" {
            return Err(de::Error::unknown_variant(&tag, &["Env"]));
        }
        let name: String = variant.newtype_variant()?;
        (self.0)(env_value(&name).map_err(de::Error::custom)?).map_err(de::Error::custom)
    }
}

/// A string, literal or from `!Env`.
#[derive(Debug, Clone, PartialEq)]
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text, D::Error> {
        d.deserialize_any(TextVisitor(|s| Ok(Text(s)), PhantomData))
    }
}

/// A port given as a number or a string (wca's `!Env KUBERNETES_SERVICE_PORT`).
#[derive(Debug)]
struct Port(u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Port, D::Error> {
        let parse = |value: String| {
            value
                .trim()
                .parse()
                .map(Port)
                .map_err(|_| format!("port {value:?} is not a number from 0 to 65535"))
        };
        d.deserialize_any(TextVisitor(parse, PhantomData))
    }
}

fn text(t: Option<Text>) -> Option<String> {
    t.map(|t| t.0)
}

// ---------------------------------------------------------------------------------------------
// Tags.

/// A tagged value (`!Tag ...`) read so that an error inside it names its own line.
///
/// serde_norway's `deserialize_enum` leaves errors about the tag (an unknown variant) without a
/// position, and the enclosing map then stamps its own first line on them; its `deserialize_any`
/// stamps the tagged node's line, so we go through it.
#[derive(Debug)]
struct Tagged<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Tagged<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tagged<T>, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Tagged<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a tagged value like `!Fit {...}`")
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Tagged<T>, A::Error> {
                T::deserialize(de::value::EnumAccessDeserializer::new(data)).map(Tagged)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// The algorithm tags, spelled as in wca's config. The last four are wca classes verwalter does
/// not implement: they are refused by name. `!FitGeneric` and `!BARGeneric` are older wca
/// releases' names of `!Fit` and `!BAR`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum AlgorithmTag {
    #[serde(rename = "NOPAlgorithm")]
    Nop,
    #[serde(alias = "FitGeneric")]
    Fit,
    #[serde(rename = "BAR", alias = "BARGeneric")]
    Bar,
    LeastUsed,
    #[serde(rename = "LeastUsedBAR")]
    LeastUsedBar,
    #[serde(rename = "HierBAR")]
    HierBar,
    StaticAssigner,
    DramHitRatioProvision,
    Score,
    FitRiskAlgorithm,
    Creatone,
    #[serde(rename = "LeastUsedBARScore")]
    LeastUsedBarScore,
    Score2,
}

impl AlgorithmTag {
    /// The [`Kind`] variant this tag loads into, or `Err(tag)` for a tag verwalter refuses.
    fn kind_variant(self) -> Result<&'static str, &'static str> {
        match self {
            AlgorithmTag::Nop => Ok("Nop"),
            AlgorithmTag::Fit => Ok("Fit"),
            AlgorithmTag::Bar => Ok("Bar"),
            AlgorithmTag::LeastUsed => Ok("LeastUsed"),
            AlgorithmTag::LeastUsedBar => Ok("LeastUsedBar"),
            AlgorithmTag::HierBar => Ok("HierBar"),
            AlgorithmTag::StaticAssigner => Ok("StaticAssigner"),
            AlgorithmTag::DramHitRatioProvision => Ok("DramHitRatioProvision"),
            AlgorithmTag::Score => Ok("Score"),
            AlgorithmTag::FitRiskAlgorithm => Err("FitRiskAlgorithm"),
            AlgorithmTag::Creatone => Err("Creatone"),
            AlgorithmTag::LeastUsedBarScore => Err("LeastUsedBARScore"),
            AlgorithmTag::Score2 => Err("Score2"),
        }
    }
}

/// The wca tag a [`Kind`] is written with (its [`Kind::spec`]).
pub fn tag_of(kind: &Kind) -> &'static str {
    kind.spec().tag
}

/// The algorithm tags verwalter implements, in [`AlgorithmTag`]'s order, read from its serde
/// definition: without the refused wca tags and without the older names (`FitGeneric`), which
/// only the YAML config accepts.
pub fn algorithm_tags() -> Vec<&'static str> {
    let names = crate::probe::variants::<AlgorithmTag>().unwrap_or(&[]);
    names
        .iter()
        .copied()
        .filter(|name| {
            let Ok(tag) = AlgorithmTag::deserialize(StrDeserializer::<de::value::Error>::new(name))
            else {
                return false;
            };
            // An alias deserializes to its tag, which serializes to the tag's own name.
            let own = serde_json::to_value(tag).ok();
            tag.kind_variant().is_ok() && own.as_ref().and_then(|v| v.as_str()) == Some(*name)
        })
        .collect()
}

/// The [`Kind`] variant an algorithm tag of [`algorithm_tags`] names (`"BAR"` → `"Bar"`).
pub fn kind_variant_of(tag: &str) -> Option<&'static str> {
    if !algorithm_tags().contains(&tag) {
        return None;
    }
    let tag = AlgorithmTag::deserialize(StrDeserializer::<de::value::Error>::new(tag)).ok()?;
    tag.kind_variant().ok()
}

fn unsupported<E: de::Error>(tag: &str) -> E {
    E::custom(format!(
        "`!{tag}` is a wca-scheduler tag verwalter does not support (see docs/placement.md)"
    ))
}

/// The parameters every algorithm tag takes besides its own ([`Kind`]'s fields).
#[derive(Default)]
struct Common {
    dimensions: Option<Vec<Dim>>,
    max_node_score: Option<f64>,
    alias: Option<Text>,
    data_provider: Option<Tagged<RawDataProvider>>,
}

/// One algorithm as written: its common parameters and its [`Kind`], whose own serde
/// definition (fields, defaults, `deny_unknown_fields`) reads the tag's other keys.
struct RawAlgorithm {
    common: Common,
    kind: Kind,
}

impl<'de> Deserialize<'de> for RawAlgorithm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawAlgorithm, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawAlgorithm;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an algorithm tag like `!Fit {...}`")
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<RawAlgorithm, A::Error> {
                let (tag, variant): (AlgorithmTag, _) = data.variant()?;
                let kind = tag.kind_variant().map_err(unsupported::<A::Error>)?;
                variant.struct_variant(&[], ParamsVisitor { kind })
            }
        }
        d.deserialize_enum("Algorithm", &[], V)
    }
}

/// Reads a tag's parameters: the common ones here, the rest through [`Kind`]'s variant `kind`.
struct ParamsVisitor {
    kind: &'static str,
}

impl<'de> Visitor<'de> for ParamsVisitor {
    type Value = RawAlgorithm;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the algorithm's parameters")
    }
    // A bare tag (`!Fit` with nothing after it) takes the defaults.
    fn visit_unit<E: de::Error>(self) -> Result<RawAlgorithm, E> {
        self.visit_map(de::value::MapDeserializer::<
            std::iter::Empty<(String, String)>,
            E,
        >::new(std::iter::empty()))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<RawAlgorithm, E> {
        if s.is_empty() {
            self.visit_unit()
        } else {
            Err(E::invalid_type(de::Unexpected::Str(s), &self))
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawAlgorithm, A::Error> {
        let mut common = Common::default();
        let kind = Kind::deserialize(KindParams {
            variant: self.kind,
            map: SplitMap {
                inner: map,
                common: &mut common,
            },
        })?;
        Ok(RawAlgorithm { common, kind })
    }
}

/// The common parameter a key names.
enum CommonKey {
    Dimensions,
    MaxNodeScore,
    Alias,
    DataProvider,
}

/// A key of a tag's map: a common parameter, or one for [`Kind`] (already read by its seed).
enum SplitKey<K> {
    Common(CommonKey),
    Own(K),
}

/// Reads a key from the YAML itself, so that an unknown field's error names the key's line.
struct SplitKeySeed<'s, K>(&'s mut Option<K>);

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for SplitKeySeed<'_, K> {
    type Value = SplitKey<K::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for SplitKeySeed<'_, K> {
    type Value = SplitKey<K::Value>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a parameter name")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        let common = match s {
            "dimensions" => CommonKey::Dimensions,
            "max_node_score" => CommonKey::MaxNodeScore,
            "alias" => CommonKey::Alias,
            "data_provider" => CommonKey::DataProvider,
            _ => {
                let seed = self.0.take().ok_or_else(|| E::custom("key read twice"))?;
                return seed
                    .deserialize(StrDeserializer::<E>::new(s))
                    .map(SplitKey::Own);
            }
        };
        Ok(SplitKey::Common(common))
    }
}

/// The tag's map with the common parameters taken out (into `common`) as they go by.
struct SplitMap<'c, A> {
    inner: A,
    common: &'c mut Common,
}

fn set_once<T, E: de::Error>(slot: &mut Option<T>, value: T, name: &'static str) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(name));
    }
    *slot = Some(value);
    Ok(())
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SplitMap<'_, A> {
    type Error = A::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let mut seed = Some(seed);
        loop {
            let Some(key) = self.inner.next_key_seed(SplitKeySeed(&mut seed))? else {
                return Ok(None);
            };
            let c = &mut *self.common;
            match key {
                SplitKey::Own(k) => return Ok(Some(k)),
                SplitKey::Common(CommonKey::Dimensions) => {
                    set_once(&mut c.dimensions, self.inner.next_value()?, "dimensions")?
                }
                SplitKey::Common(CommonKey::MaxNodeScore) => set_once(
                    &mut c.max_node_score,
                    self.inner.next_value()?,
                    "max_node_score",
                )?,
                SplitKey::Common(CommonKey::Alias) => {
                    set_once(&mut c.alias, self.inner.next_value()?, "alias")?
                }
                SplitKey::Common(CommonKey::DataProvider) => set_once(
                    &mut c.data_provider,
                    self.inner.next_value()?,
                    "data_provider",
                )?,
            }
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.inner.next_value_seed(seed)
    }
}

/// Hands [`Kind`]'s derived `Deserialize` the variant `variant` with the tag's other keys.
struct KindParams<'c, A> {
    variant: &'static str,
    map: SplitMap<'c, A>,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for KindParams<'_, A> {
    type Error = A::Error;
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, 'c, A: MapAccess<'de>> EnumAccess<'de> for KindParams<'c, A> {
    type Error = A::Error;
    type Variant = SplitMap<'c, A>;
    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, SplitMap<'c, A>), A::Error> {
        let v = seed.deserialize(StrDeserializer::<A::Error>::new(self.variant))?;
        Ok((v, self.map))
    }
}

/// A tag without parameters of its own (NOP) still refuses unknown ones.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParameters {}

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for SplitMap<'_, A> {
    type Error = A::Error;
    fn unit_variant(self) -> Result<(), A::Error> {
        NoParameters::deserialize(de::value::MapAccessDeserializer::new(self)).map(|_| ())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _: T) -> Result<T::Value, A::Error> {
        Err(de::Error::custom("algorithm parameters are a map"))
    }
    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, A::Error> {
        Err(de::Error::custom("algorithm parameters are a map"))
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_map(self)
    }
}

// ---------------------------------------------------------------------------------------------
// Data providers.

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
    port: Port,
    #[serde(default)]
    timeout: Option<Seconds>,
    #[serde(default)]
    time: Option<Text>,
    #[serde(default)]
    ssl: Option<Tagged<RawSslTag>>,
    #[serde(default)]
    queries: Option<Tagged<RawQueriesTag>>,
}

#[derive(Debug, Deserialize)]
enum RawSslTag {
    #[serde(rename = "SSL")]
    Ssl(CheckedSsl),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSsl {
    #[serde(default)]
    server_verify: Option<Verify>,
    #[serde(default)]
    client_cert_path: Option<Text>,
    #[serde(default)]
    client_key_path: Option<Text>,
}

/// `!SSL` after wca's check: a client key needs its certificate.
#[derive(Debug)]
struct CheckedSsl(RawSsl);

impl<'de> Deserialize<'de> for CheckedSsl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CheckedSsl, D::Error> {
        let raw = RawSsl::deserialize(d)?;
        if raw.client_key_path.is_some() && raw.client_cert_path.is_none() {
            return Err(de::Error::custom(
                "!SSL: client_key_path is given without client_cert_path",
            ));
        }
        Ok(CheckedSsl(raw))
    }
}

/// `server_verify`: a boolean or a CA file (literal or `!Env`).
#[derive(Debug)]
struct Verify(ServerVerify);

impl<'de> Deserialize<'de> for Verify {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Verify, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Verify;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true, false or the path of a CA file")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Verify, E> {
                Ok(Verify(if b {
                    ServerVerify::System
                } else {
                    ServerVerify::Off
                }))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Verify, E> {
                Ok(Verify(ServerVerify::CaFile(s.into())))
            }
            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Verify, A::Error> {
                TextVisitor(|s| Ok(Verify(ServerVerify::CaFile(s))), PhantomData).visit_enum(data)
            }
        }
        d.deserialize_any(V)
    }
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
    port: Option<Port>,
    #[serde(default)]
    client_token_path: Option<Text>,
    #[serde(default)]
    server_cert_ca_path: Option<Text>,
    #[serde(default)]
    timeout: Option<Seconds>,
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
    #[serde(default)]
    NODE_CAPACITY_RESOURCES_QUERY_MAP: Option<BTreeMap<Dim, Text>>,
    #[serde(default)]
    NODES_DRAM_HIT_RATIO: Option<Text>,
    /// Prometheus' `time` written inside `!Queries` by one of wca's examples
    /// (`config-bar.yaml`); taken as Prometheus' when that has none.
    #[serde(default)]
    time: Option<Text>,
}

impl RawQueries {
    /// wca's defaults with what this `!Queries` gives over them.
    fn apply(self, q: &mut Queries) {
        let set = |slot: &mut String, text: Option<Text>| {
            if let Some(t) = text {
                *slot = t.0;
            }
        };
        set(&mut q.nodes_pmm_memory_mode, self.NODES_PMM_MEMORY_MODE);
        set(&mut q.membw_capacity_read, self.MEMBW_CAPACITY_READ);
        set(&mut q.membw_capacity_write, self.MEMBW_CAPACITY_WRITE);
        set(&mut q.node_capacity_mem_wss, self.NODE_CAPACITY_MEM_WSS);
        set(&mut q.nodes_dram_hit_ratio, self.NODES_DRAM_HIT_RATIO);
        q.node_capacity_dram_membw = text(self.NODE_CAPACITY_DRAM_MEMBW);
        let maps = [
            (
                &mut q.app_requested_resources,
                self.APP_REQUESTED_RESOURCES_QUERY_MAP,
            ),
            (
                &mut q.node_capacity_resources,
                self.NODE_CAPACITY_RESOURCES_QUERY_MAP,
            ),
        ];
        for (slot, given) in maps {
            for (dim, t) in given.into_iter().flatten() {
                slot.insert(dim, t.0);
            }
        }
    }
}

fn load_kubeapi(k: RawKubeapi) -> Kubeapi {
    Kubeapi {
        host: text(k.host),
        port: k.port.map(|p| p.0),
        client_token_path: text(k.client_token_path).unwrap_or_else(|| SERVICE_TOKEN_PATH.into()),
        server_cert_ca_path: text(k.server_cert_ca_path).unwrap_or_else(|| SERVICE_CA_PATH.into()),
        timeout: k.timeout.map_or(5.0, |s| s.0),
        monitored_namespaces: match k.monitored_namespaces {
            Some(ns) => ns.into_iter().map(|t| t.0).collect(),
            None => vec!["default".into()],
        },
    }
}

fn load_provider(raw: RawDataProvider) -> DataProvider {
    let (kind, f) = match raw {
        RawDataProvider::ClusterDataProvider(f) => (ProviderKind::Cluster, f),
        RawDataProvider::ClusterScoreDataProvider(f) => (ProviderKind::ClusterScore, f),
    };
    let mut raw_queries = f.queries.map(|Tagged(RawQueriesTag::Queries(q))| q);
    let prometheus = f.prometheus.map(|Tagged(RawPrometheusTag::Prometheus(p))| {
        if let Some(Tagged(RawQueriesTag::Queries(q))) = p.queries {
            raw_queries.get_or_insert(q);
        }
        let queries_time = raw_queries.as_mut().and_then(|q| q.time.take());
        Prometheus {
            host: p.host.0,
            port: p.port.0,
            timeout: p.timeout.map_or(1.0, |s| s.0),
            time: text(p.time.or(queries_time)),
            ssl: p.ssl.map(|Tagged(RawSslTag::Ssl(CheckedSsl(s)))| Ssl {
                server_verify: s.server_verify.map_or(ServerVerify::System, |v| v.0),
                client_cert_path: text(s.client_cert_path),
                client_key_path: text(s.client_key_path),
            }),
        }
    });
    let mut queries = Queries::default();
    if let Some(q) = raw_queries {
        q.apply(&mut queries);
    }
    DataProvider {
        kind,
        prometheus,
        kubeapi: f
            .kubeapi
            .map(|Tagged(RawKubeapiTag::Kubeapi(k))| load_kubeapi(k)),
        queries,
    }
}

fn load_algorithm(raw: RawAlgorithm) -> LoadedAlgorithm {
    let mut algorithm = Algorithm::new(raw.kind);
    let c = raw.common;
    if let Some(dims) = c.dimensions {
        algorithm.dimensions = dims;
    }
    if let Some(score) = c.max_node_score {
        algorithm.max_node_score = score;
    }
    LoadedAlgorithm {
        algorithm,
        alias: text(c.alias),
        data_provider: c.data_provider.map(|Tagged(p)| load_provider(p)),
    }
}

// ---------------------------------------------------------------------------------------------
// The top level.

/// A `loggers` level, checked against the names wca's logging takes.
struct Level(String);

impl<'de> Deserialize<'de> for Level {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Level, D::Error> {
        const LEVELS: [&str; 7] = [
            "TRACE", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL",
        ];
        let check = |s: String| {
            if LEVELS.contains(&s.to_ascii_uppercase().as_str()) {
                Ok(Level(s))
            } else {
                Err(format!(
                    "log level {s:?} is not one of {}",
                    LEVELS.join(", ")
                ))
            }
        };
        d.deserialize_any(TextVisitor(check, PhantomData))
    }
}

/// Seconds, not negative, below [`MAX_SECONDS`].
#[derive(Debug)]
struct Seconds(f64);

/// About 31 years: any longer wait or timeout is a typo, and `Duration::from_secs_f64` panics on
/// numbers beyond `u64::MAX` seconds (found by fuzzing).
const MAX_SECONDS: f64 = 1e9;

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Seconds, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Seconds;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number of seconds (0 or more, below 1e9)")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Seconds, E> {
                if v.is_finite() && (0.0..MAX_SECONDS).contains(&v) {
                    Ok(Seconds(v))
                } else {
                    Err(E::invalid_value(de::Unexpected::Float(v), &self))
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seconds, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seconds, E> {
                self.visit_f64(v as f64)
            }
        }
        d.deserialize_any(V)
    }
}

/// The value of a top-level key verwalter does not read: only a tagged value (an anchor) may
/// stand there; its tag must be one verwalter knows.
struct AnchorSeed<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for AnchorSeed<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AnchorSeed<'_> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "a tagged value under `{}`: verwalter does not read that key, so it may only hold \
             an anchor like `{}: &name !Kubeapi {{...}}`",
            self.0, self.0
        )
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<String, A::Error> {
        let (tag, variant): (String, _) = data.variant()?;
        // The value is checked here as it would be where an alias uses it.
        if let Ok(t) = AlgorithmTag::deserialize(StrDeserializer::<A::Error>::new(&tag)) {
            let kind = t.kind_variant().map_err(unsupported::<A::Error>)?;
            variant.struct_variant(&[], ParamsVisitor { kind })?;
            return Ok(tag);
        }
        match tag.as_str() {
            "ClusterDataProvider" | "ClusterScoreDataProvider" => {
                variant.newtype_variant::<RawDataProviderFields>()?;
            }
            "Kubeapi" => {
                variant.newtype_variant::<RawKubeapi>()?;
            }
            "Prometheus" => {
                variant.newtype_variant::<RawPrometheus>()?;
            }
            "Queries" => {
                variant.newtype_variant::<RawQueries>()?;
            }
            "SSL" => {
                variant.newtype_variant::<CheckedSsl>()?;
            }
            _ => {
                return Err(de::Error::custom(format!(
                    "unknown tag `!{tag}` under `{}`",
                    self.0
                )));
            }
        }
        Ok(tag)
    }
}

/// The top-level keys verwalter reads.
#[derive(Clone, Copy, PartialEq)]
enum TopKey {
    Loggers,
    Algorithm,
    Algorithms,
    Kubeapi,
    DataProvider,
    MonitoredNamespaces,
    RescheduleInterval,
    DramThreshold,
}

/// Reads a top-level key and refuses `algorithm` beside `algorithms` on the key's own line.
struct TopKeySeed<'s> {
    seen: &'s BTreeSet<&'static str>,
}

impl<'de> DeserializeSeed<'de> for TopKeySeed<'_> {
    type Value = Result<TopKey, String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for TopKeySeed<'_> {
    type Value = Result<TopKey, String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        let key = match s {
            "loggers" => TopKey::Loggers,
            "algorithm" => TopKey::Algorithm,
            "algorithms" => TopKey::Algorithms,
            "kubeapi" => TopKey::Kubeapi,
            "data_provider" => TopKey::DataProvider,
            "monitored_namespaces" => TopKey::MonitoredNamespaces,
            "reschedule_interval" => TopKey::RescheduleInterval,
            "dram_threshold" => TopKey::DramThreshold,
            other => return Ok(Err(other.to_string())),
        };
        let other = match key {
            TopKey::Algorithm => "algorithms",
            TopKey::Algorithms => "algorithm",
            _ => "",
        };
        if self.seen.contains(other) {
            return Err(E::custom(format!(
                "a config has either `algorithm` (wca's one algorithm) or `algorithms` (named \
                 ones), not both; `{other}` came first"
            )));
        }
        Ok(Ok(key))
    }
}

/// The whole file as written.
#[derive(Default)]
struct RawConfig {
    algorithms: BTreeMap<String, RawAlgorithm>,
    loggers: BTreeMap<String, String>,
    kubeapi: Option<RawKubeapi>,
    data_provider: Option<RawDataProvider>,
    monitored_namespaces: Option<Vec<String>>,
    reschedule_interval: Option<f64>,
    dram_threshold: Option<f64>,
    anchor_keys: BTreeMap<String, String>,
    has_algorithm: bool,
}

impl<'de> Deserialize<'de> for RawConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawConfig, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map with `algorithm: !Tag {...}` or `algorithms: {name: ...}`")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawConfig, A::Error> {
                let mut raw = RawConfig::default();
                let mut seen = BTreeSet::new();
                while let Some(key) = map.next_key_seed(TopKeySeed { seen: &seen })? {
                    let key = match key {
                        Ok(key) => key,
                        Err(other) => {
                            let tag = map.next_value_seed(AnchorSeed(&other))?;
                            raw.anchor_keys.insert(other, tag);
                            continue;
                        }
                    };
                    match key {
                        TopKey::Loggers => {
                            let levels: BTreeMap<String, Level> = map.next_value()?;
                            raw.loggers = levels.into_iter().map(|(k, v)| (k, v.0)).collect();
                        }
                        TopKey::Algorithm => {
                            seen.insert("algorithm");
                            raw.has_algorithm = true;
                            let Tagged(a) = map.next_value()?;
                            raw.algorithms.insert(SINGLE_ALGORITHM.into(), a);
                        }
                        TopKey::Algorithms => {
                            seen.insert("algorithms");
                            raw.has_algorithm = true;
                            let named: BTreeMap<String, Tagged<RawAlgorithm>> = map.next_value()?;
                            raw.algorithms = named.into_iter().map(|(k, v)| (k, v.0)).collect();
                        }
                        TopKey::Kubeapi => {
                            let Tagged(RawKubeapiTag::Kubeapi(k)) = map.next_value()?;
                            raw.kubeapi = Some(k);
                        }
                        TopKey::DataProvider => {
                            let Tagged(p) = map.next_value()?;
                            raw.data_provider = Some(p);
                        }
                        TopKey::MonitoredNamespaces => {
                            let ns: Vec<Text> = map.next_value()?;
                            raw.monitored_namespaces = Some(ns.into_iter().map(|t| t.0).collect());
                        }
                        TopKey::RescheduleInterval => {
                            raw.reschedule_interval = Some(map.next_value::<Seconds>()?.0);
                        }
                        TopKey::DramThreshold => raw.dram_threshold = Some(map.next_value()?),
                    }
                }
                if !raw.has_algorithm {
                    return Err(de::Error::custom(
                        "no algorithm: give `algorithm: !Tag {...}` (wca's form) or \
                         `algorithms: {name: !Tag {...}}`",
                    ));
                }
                Ok(raw)
            }
        }
        d.deserialize_map(V)
    }
}

/// Loads a config in either form (`algorithm: !Tag {...}` with wca's other top-level keys, or
/// `algorithms: {name: !Tag {...}}`). `env` answers `!Env NAME` (pass
/// `|n| std::env::var(n).ok()` for the process environment).
pub fn load_config(
    yaml: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<PlacementConfig, PlacementConfigError> {
    let raw: RawConfig = {
        let _env = EnvScope::enter(yaml, &env);
        serde_norway::from_str(yaml)?
    };
    let reschedule_interval = raw
        .reschedule_interval
        .filter(|s| *s > 0.0)
        .map(Duration::from_secs_f64);
    Ok(PlacementConfig {
        algorithms: raw
            .algorithms
            .into_iter()
            .map(|(name, a)| (name, load_algorithm(a)))
            .collect(),
        loggers: raw.loggers,
        kubeapi: raw.kubeapi.map(load_kubeapi),
        data_provider: raw.data_provider.map(load_provider),
        monitored_namespaces: raw
            .monitored_namespaces
            .unwrap_or_else(|| vec!["default".into()]),
        reschedule_interval,
        dram_threshold: raw.dram_threshold,
        anchor_keys: raw.anchor_keys,
    })
}

/// Loads a config and returns only its algorithms by name (see [`load_config`]).
pub fn load(
    yaml: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, LoadedAlgorithm>, PlacementConfigError> {
    load_config(yaml, env).map(|c| c.algorithms)
}

impl Kubeapi {
    /// The API server's base URL as wca builds it: `https://host:port`; a host that carries its
    /// own scheme (`http://127.0.0.1`) keeps it.
    pub(crate) fn url(&self) -> String {
        let host = self.host.as_deref().unwrap_or("");
        let base = if host.contains("://") {
            host.to_string()
        } else {
            format!("https://{host}")
        };
        match self.port {
            Some(port) => format!("{base}:{port}"),
            None => base,
        }
    }
}

fn describe_kubeapi(k: &Kubeapi) -> String {
    format!(
        "Kubernetes API {} (namespaces {}, timeout {} s)",
        k.url(),
        k.monitored_namespaces.join(", "),
        k.timeout
    )
}

/// A data provider; with `dims` (an algorithm's dimensions), the PromQL it runs for them.
fn describe_provider(dp: &DataProvider, dims: Option<&[Dim]>) -> Vec<String> {
    let tag = match dp.kind {
        ProviderKind::Cluster => "ClusterDataProvider",
        ProviderKind::ClusterScore => "ClusterScoreDataProvider",
    };
    let mut lines = vec![format!("data provider !{tag}")];
    if let Some(p) = &dp.prometheus {
        let mut line = format!(
            "  Prometheus {}:{} (timeout {} s",
            p.host, p.port, p.timeout
        );
        if let Some(t) = &p.time {
            line += &format!(", at time {t}");
        }
        if p.ssl.is_some() {
            line += ", !SSL";
        }
        lines.push(line + ")");
    }
    if let Some(k) = &dp.kubeapi {
        lines.push(format!("  {}", describe_kubeapi(k)));
    }
    let Some(dims) = dims else {
        lines.push("  not queried by verwalter (wca's mutating webhook reads it)".into());
        return lines;
    };
    if dp.prometheus.is_none() {
        lines.push(
            "  no Prometheus: no queries (nodes count as DRAM nodes, apps have no requests)".into(),
        );
        return lines;
    }
    match crate::sources::plan_queries(dp.kind, &dp.queries, dims) {
        Ok(plan) => {
            lines.push(format!(
                "  PromQL run every refresh ({} queries):",
                plan.len()
            ));
            for q in plan {
                lines.push(format!("    {}: {}", q.kind.describe(), q.promql));
            }
        }
        Err(e) => lines.push(format!("  PromQL: cannot run: {e}")),
    }
    if !dp.queries.node_capacity_resources.is_empty() {
        let given: Vec<&str> = dp
            .queries
            .node_capacity_resources
            .keys()
            .map(|d| d.name())
            .collect();
        lines.push(format!(
            "  NODE_CAPACITY_RESOURCES_QUERY_MAP ({}): read, not queried (node bandwidth and WSS \
             come from MEMBW_CAPACITY_READ, MEMBW_CAPACITY_WRITE, NODE_CAPACITY_MEM_WSS)",
            given.join(", ")
        ));
    }
    lines
}

/// What a loaded config holds, one fact a line, as `verwalter check --placement-config` prints
/// it.
pub fn describe(config: &PlacementConfig) -> String {
    let mut lines = Vec::new();
    for (name, loaded) in &config.algorithms {
        let a = &loaded.algorithm;
        let dims: Vec<&str> = a.dimensions.iter().map(|d| d.name()).collect();
        let mut line = format!(
            "algorithm {name:?}: !{}, dimensions [{}], max_node_score {}",
            tag_of(&a.kind),
            dims.join(", "),
            a.max_node_score
        );
        if let Some(alias) = &loaded.alias {
            line += &format!(", alias {alias:?}");
        }
        lines.push(line);
        if let Some(dp) = &loaded.data_provider {
            lines.extend(
                describe_provider(dp, Some(&a.dimensions))
                    .into_iter()
                    .map(|l| format!("  {l}")),
            );
        } else {
            lines.push("  no data provider (the data comes from elsewhere)".into());
        }
    }
    if let Some(k) = &config.kubeapi {
        lines.push(format!("kubeapi: {}", describe_kubeapi(k)));
    }
    if let Some(dp) = &config.data_provider {
        let mut provider = describe_provider(dp, None);
        provider[0] = format!("data_provider: {}", provider[0]);
        lines.extend(provider);
    }
    lines.push(format!(
        "monitored_namespaces: {}",
        config.monitored_namespaces.join(", ")
    ));
    let score = config
        .algorithms
        .values()
        .any(|a| a.algorithm.kind.spec().reschedules);
    lines.push(match (config.reschedule_interval, score) {
        (Some(every), true) => format!(
            "reschedule_interval: {} s (Score's moves, shown in /status; nothing is deleted)",
            every.as_secs_f64()
        ),
        (Some(every), false) => format!(
            "reschedule_interval: {} s, not used: only Score reschedules",
            every.as_secs_f64()
        ),
        (None, _) => "reschedule_interval: off".into(),
    });
    if !config.loggers.is_empty() {
        let loggers: Vec<String> = config
            .loggers
            .iter()
            .map(|(name, level)| format!("{name}={level}"))
            .collect();
        lines.push(format!("loggers: {}", loggers.join(", ")));
    }
    for (key, tag) in &config.anchor_keys {
        lines.push(format!("{key}: !{tag} (not read; anchors only)"));
    }
    lines.join("\n")
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
    fn missing_env_names_the_variable_and_its_line() {
        let e = load("algorithms:\n  a: !Fit\n    alias: !Env NOPE\n", env).unwrap_err();
        assert!(e.message().contains("\"NOPE\""), "{e}");
        assert_eq!(e.line(), Some(3), "{e}");
    }

    fn kube_env(name: &str) -> Option<String> {
        match name {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".into()),
            "KUBERNETES_SERVICE_PORT" => Some("443".into()),
            _ => None,
        }
    }

    /// wca's example files, unchanged (`tests/wca-configs/`).
    const WCA_EXAMPLES: [(&str, &str); 9] = [
        (
            "config.yaml",
            include_str!("../tests/wca-configs/config.yaml"),
        ),
        (
            "config-bar.yaml",
            include_str!("../tests/wca-configs/config-bar.yaml"),
        ),
        (
            "config-hier.yaml",
            include_str!("../tests/wca-configs/config-hier.yaml"),
        ),
        (
            "config-hierbar-older.yaml",
            include_str!("../tests/wca-configs/config-hierbar-older.yaml"),
        ),
        (
            "wca-scheduler-config.yaml",
            include_str!("../tests/wca-configs/wca-scheduler-config.yaml"),
        ),
        (
            "wca-scheduler-config-bar.yaml",
            include_str!("../tests/wca-configs/wca-scheduler-config-bar.yaml"),
        ),
        (
            "wca-scheduler-config-hier.yaml",
            include_str!("../tests/wca-configs/wca-scheduler-config-hier.yaml"),
        ),
        (
            "docs-wca-scheduler-rst.yaml",
            include_str!("../tests/wca-configs/docs-wca-scheduler-rst.yaml"),
        ),
        (
            "newest-shape.yaml",
            include_str!("../tests/wca-configs/newest-shape.yaml"),
        ),
    ];

    #[test]
    fn every_wca_example_loads_under_the_name_algorithm() {
        for (file, yaml) in WCA_EXAMPLES {
            let config = load_config(yaml, kube_env).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(
                config.algorithms.keys().collect::<Vec<_>>(),
                vec![SINGLE_ALGORITHM],
                "{file}"
            );
            assert!(!config.loggers.is_empty(), "{file}");
            let expected_tag = match file {
                "config.yaml" => "Score",
                "config-hier.yaml"
                | "config-hierbar-older.yaml"
                | "wca-scheduler-config-hier.yaml" => "HierBAR",
                "docs-wca-scheduler-rst.yaml" => "NOPAlgorithm",
                "newest-shape.yaml" => "LeastUsedBAR",
                _ => "BAR",
            };
            let loaded = &config.algorithms[SINGLE_ALGORITHM];
            assert_eq!(tag_of(&loaded.algorithm.kind), expected_tag, "{file}");
            if expected_tag == "NOPAlgorithm" {
                continue;
            }
            let dp = loaded.data_provider.as_ref().unwrap();
            let kube = dp.kubeapi.as_ref().unwrap();
            assert_eq!(
                (kube.host.as_deref(), kube.port),
                (Some("10.96.0.1"), Some(443)),
                "{file}: !Env"
            );
            assert!(dp.prometheus.is_some(), "{file}");
        }
    }

    #[test]
    fn wca_examples_keep_their_details() {
        let score = load_config(WCA_EXAMPLES[0].1, kube_env).unwrap();
        let a = &score.algorithms[SINGLE_ALGORITHM];
        assert_eq!(a.algorithm.max_node_score, 10000.0);
        assert_eq!(a.algorithm.dimensions.len(), 5);
        assert!(matches!(
            a.algorithm.kind,
            Kind::Score { score_target: Some(t), .. } if t == -3.0
        ));
        let dp = a.data_provider.as_ref().unwrap();
        assert_eq!(dp.kind, ProviderKind::ClusterScore);
        assert_eq!(
            score.kubeapi.as_ref(),
            dp.kubeapi.as_ref(),
            "the anchor &kubeapi"
        );
        assert_eq!(
            dp.queries.node_capacity_dram_membw.as_deref(),
            Some("ceil(platform_dimm_speed_bytes_per_second / 1e9)")
        );
        assert_eq!(score.reschedule_interval, None, "commented out");
        assert_eq!(score.monitored_namespaces, vec!["default".to_string()]);

        // config-bar.yaml writes Prometheus' `time` inside its `!Queries`.
        let bar = load_config(WCA_EXAMPLES[1].1, kube_env).unwrap();
        let prom = bar.algorithms[SINGLE_ALGORITHM]
            .data_provider
            .as_ref()
            .and_then(|d| d.prometheus.clone())
            .unwrap();
        assert_eq!(prom.time.as_deref(), Some("1582308900"));

        let newest = load_config(WCA_EXAMPLES[8].1, kube_env).unwrap();
        assert_eq!(newest.reschedule_interval, Some(Duration::from_secs(5)));
        let dp = newest.data_provider.as_ref().unwrap();
        assert_eq!(
            newest.algorithms[SINGLE_ALGORITHM].data_provider.as_ref(),
            Some(dp),
            "*data_provider"
        );
        assert_eq!(
            dp.queries.node_capacity_resources,
            BTreeMap::from([(Dim::Wss, "node_capacity{dim=\"wss\"}".to_string())])
        );
        assert_eq!(dp.queries.nodes_dram_hit_ratio, "platform_dram_hit_ratio");
        assert_eq!(newest.loggers["wca.scheduler.data_providers"], "DEBUG");
    }

    #[test]
    fn describe_says_what_was_loaded() {
        let text = describe(&load_config(WCA_EXAMPLES[0].1, kube_env).unwrap());
        for line in [
            "algorithm \"algorithm\": !Score, dimensions [mem, cpu, membw_write, membw_read, wss], max_node_score 10000",
            "    Prometheus http://100.64.176.36:30900 (timeout 5 s, at time 1586245624)",
            "    Kubernetes API https://10.96.0.1:443 (namespaces default, timeout 5 s)",
            "kubeapi: Kubernetes API https://10.96.0.1:443",
            "reschedule_interval: off",
            "loggers: wca.scheduler.algorithms=TRACE, wca.scheduler.server=INFO",
        ] {
            assert!(text.contains(line), "{line:?} not in:\n{text}");
        }
        let kube = Kubeapi {
            host: Some("http://127.0.0.1".into()),
            port: Some(8001),
            ..load_config("kubeapi: !Kubeapi\nalgorithms: {}\n", env)
                .unwrap()
                .kubeapi
                .unwrap()
        };
        assert_eq!(kube.url(), "http://127.0.0.1:8001", "kubectl proxy");
    }

    #[test]
    fn describe_prints_the_promql_run_for_the_dimensions_in_use_only() {
        let yaml = "\
reschedule_interval: 5
algorithm: !Fit
  dimensions: [cpu, mem]
  data_provider: !ClusterDataProvider
    prometheus: !Prometheus {host: http://p, port: 9090}
    queries: !Queries
      APP_REQUESTED_RESOURCES_QUERY_MAP: {cpu: 'app_req{dim=\"cpu\"}'}
";
        let text = describe(&load_config(yaml, env).unwrap());
        let d = Queries::default();
        for line in [
            "    PromQL run every refresh (3 queries):".to_string(),
            "      app requests cpu, cores (APP_REQUESTED_RESOURCES_QUERY_MAP): app_req{dim=\"cpu\"}"
                .to_string(),
            format!(
                "      app requests mem, GB (APP_REQUESTED_RESOURCES_QUERY_MAP): {}",
                d.app_requested_resources[&Dim::Mem]
            ),
            format!(
                "      DRAM hit ratio (NODES_DRAM_HIT_RATIO): {}",
                d.nodes_dram_hit_ratio
            ),
            "reschedule_interval: 5 s, not used: only Score reschedules".to_string(),
        ] {
            assert!(text.contains(&line), "{line:?} not in:\n{text}");
        }
        for absent in ["membw", "wss", "NODES_PMM_MEMORY_MODE", "queried for"] {
            assert!(!text.contains(absent), "{absent:?} in:\n{text}");
        }
        // Score reschedules: the interval is in use; bandwidth and WSS bring their queries.
        let text = describe(&load_config(WCA_EXAMPLES[8].1, kube_env).unwrap());
        assert!(
            text.contains("reschedule_interval: 5 s, not used: only Score reschedules"),
            "wca's newest example runs LeastUsedBAR:\n{text}"
        );
        assert!(
            text.contains("NODE_CAPACITY_RESOURCES_QUERY_MAP (wss): read, not queried"),
            "{text}"
        );
        let score = load_config("reschedule_interval: 5\nalgorithm: !Score\n", env).unwrap();
        assert!(
            describe(&score).contains("reschedule_interval: 5 s (Score's moves"),
            "{}",
            describe(&score)
        );
        let text = describe(&load_config(WCA_EXAMPLES[0].1, kube_env).unwrap());
        for line in [
            "      PMEM nodes (NODES_PMM_MEMORY_MODE): ",
            "      PMEM nodes' read bandwidth, GB/s (MEMBW_CAPACITY_READ): ",
            "      PMEM nodes' WSS, GB (NODE_CAPACITY_MEM_WSS): ",
            "      app requests wss, GB (APP_REQUESTED_RESOURCES_QUERY_MAP): ",
            "      node types (Score): node_type",
        ] {
            assert!(text.contains(line), "{line:?} not in:\n{text}");
        }
    }

    #[test]
    fn an_unset_env_in_a_wca_example_names_its_line() {
        let e = load_config(WCA_EXAMPLES[0].1, |_| None).unwrap_err();
        assert_eq!(e.line(), Some(5), "{e}");
        assert!(e.message().contains("KUBERNETES_SERVICE_HOST"), "{e}");
    }

    #[test]
    fn every_algorithm_tag_loads_and_unsupported_ones_are_named() {
        for (tag, expected) in [
            ("NOPAlgorithm", "NOPAlgorithm"),
            ("Fit", "Fit"),
            ("FitGeneric", "Fit"),
            ("BAR", "BAR"),
            ("BARGeneric", "BAR"),
            ("LeastUsed", "LeastUsed"),
            ("LeastUsedBAR", "LeastUsedBAR"),
            ("HierBAR", "HierBAR"),
            ("DramHitRatioProvision", "DramHitRatioProvision"),
            ("Score", "Score"),
        ] {
            let c = load_config(&format!("algorithm: !{tag} {{}}\n"), env).unwrap();
            assert_eq!(tag_of(&c.algorithms["algorithm"].algorithm.kind), expected);
        }
        for tag in [
            "FitRiskAlgorithm",
            "Creatone",
            "LeastUsedBARScore",
            "Score2",
        ] {
            let e =
                load_config(&format!("loggers: {{}}\nalgorithm: !{tag} {{}}\n"), env).unwrap_err();
            assert_eq!(e.line(), Some(2), "{e}");
            assert!(
                e.message().contains(tag) && e.message().contains("does not support"),
                "{e}"
            );
        }
        let e = load_config("algorithm: !StaticAssigner {}\n", env).unwrap_err();
        assert!(e.message().contains("targeted_assigned_apps_counts"), "{e}");
        let e = load_config("algorithm: !NOPAlgorithm {x: 1}\n", env).unwrap_err();
        assert!(e.message().contains("`x`") && e.line() == Some(1), "{e}");
    }

    #[test]
    fn top_level_keys() {
        let yaml = "\
loggers: {wca: trace}
monitored_namespaces: [default, !Env NS]
reschedule_interval: 0.5
dram_threshold: 80
common: &dp !ClusterDataProvider
  prometheus: !Prometheus
    host: https://prom
    port: 9090
    ssl: !SSL
      server_verify: /etc/ca.pem
      client_cert_path: /etc/client.pem
kubeapi: !Kubeapi {host: http://127.0.0.1, port: 8001}
data_provider: *dp
algorithm: !Fit {data_provider: *dp}
";
        let env = |n: &str| (n == "NS").then(|| "batch".to_string());
        let c = load_config(yaml, env).unwrap();
        assert_eq!(c.loggers["wca"], "trace");
        assert_eq!(
            c.monitored_namespaces,
            vec!["default".to_string(), "batch".to_string()]
        );
        assert_eq!(c.reschedule_interval, Some(Duration::from_millis(500)));
        assert_eq!(c.dram_threshold, Some(80.0));
        assert_eq!(
            c.anchor_keys,
            BTreeMap::from([("common".to_string(), "ClusterDataProvider".to_string())])
        );
        assert_eq!(c.kubeapi.as_ref().unwrap().port, Some(8001));
        let dp = c.data_provider.as_ref().unwrap();
        assert_eq!(c.algorithms["algorithm"].data_provider.as_ref(), Some(dp));
        assert_eq!(
            dp.prometheus.as_ref().unwrap().ssl,
            Some(Ssl {
                server_verify: ServerVerify::CaFile("/etc/ca.pem".into()),
                client_cert_path: Some("/etc/client.pem".into()),
                client_key_path: None,
            })
        );
        let c = load_config("reschedule_interval: 0\nalgorithms: {}\n", env).unwrap();
        assert_eq!(c.reschedule_interval, None, "0 turns it off, as in wca");
    }

    #[test]
    fn top_level_problems_name_their_line() {
        let cases = [
            ("algorithm: !Fit\nextra: 1\n", 2, "extra"),
            ("algorithm: !Fit\nextra: !Magic {}\n", 2, "Magic"),
            (
                "algorithm: !Fit\nextra: !FitRiskAlgorithm {}\n",
                2,
                "does not support",
            ),
            ("algorithm: !Fit\nalgorithms: {}\n", 2, "not both"),
            ("loggers:\n  wca: LOUD\nalgorithm: !Fit\n", 2, "LOUD"),
            ("reschedule_interval: -1\nalgorithm: !Fit\n", 1, "seconds"),
            (
                "algorithm: !Fit\nkubeapi: !Kubeapi\n  port: '70000'\n",
                3,
                "70000",
            ),
            (
                "algorithm: !Fit\ncommon: !Prometheus\n  host: h\n  port: 1\n  ssl: !SSL\n    client_key_path: /k\n",
                5,
                "client_cert_path",
            ),
        ];
        for (yaml, line, word) in cases {
            let e = load_config(yaml, env).unwrap_err();
            assert_eq!(e.line(), Some(line), "{yaml}: {e}");
            assert!(e.message().contains(word), "{yaml}: {e}");
        }
        let e = load_config("loggers: {}\n", env).unwrap_err();
        assert!(e.message().contains("no algorithm"), "{e}");
    }

    #[test]
    fn algorithm_tags_are_the_implemented_tags_and_name_their_kinds() {
        let tags = algorithm_tags();
        assert_eq!(
            tags,
            [
                "NOPAlgorithm",
                "Fit",
                "BAR",
                "LeastUsed",
                "LeastUsedBAR",
                "HierBAR",
                "StaticAssigner",
                "DramHitRatioProvision",
                "Score"
            ]
        );
        for tag in tags {
            let params = if tag == "StaticAssigner" {
                "{targeted_assigned_apps_counts: {}}"
            } else {
                ""
            };
            let loaded = load(
                &format!("algorithms:\n  a: !{tag} {params}\n"),
                |_: &str| None,
            )
            .unwrap();
            let kind = &loaded["a"].algorithm.kind;
            // The spec's tag is the tag the kind was loaded from ...
            assert_eq!(tag_of(kind), tag);
            // ... and the tag names the kind's serde variant.
            let variant = kind_variant_of(tag).unwrap();
            let value = serde_json::to_value(kind).unwrap();
            let serialized = value.as_str().or_else(|| {
                value
                    .as_object()
                    .and_then(|o| o.keys().next().map(|k| k.as_str()))
            });
            assert_eq!(serialized, Some(variant), "{tag}");
        }
        // The older names and the refused tags are not among them.
        assert_eq!(kind_variant_of("FitGeneric"), None);
        assert_eq!(kind_variant_of("BARGeneric"), None);
        assert_eq!(kind_variant_of("Score2"), None);
        assert_eq!(kind_variant_of("Bar"), None);
    }
}
