//! Parsing: what the flags and the settings file say, as given (no defaults, no checks: those
//! are `resolve.rs`'s).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use verwalter_controllers::defaults;

/// Flags of `verwalter run` (also accepted without the subcommand, as verwalter 0.13 took them).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// Config root: scheduler, runtime, templates
    #[arg(long, value_name = "DIR")]
    pub config_dir: Option<PathBuf>,
    /// Persistent storage: the schedule in force and its backups
    #[arg(long, value_name = "DIR")]
    pub storage_dir: Option<PathBuf>,
    /// Deployment logs: index, global, changes and per-role logs
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Short host name: `current_host` for the scheduler, the key into `nodes` [default: the system's]
    #[arg(long)]
    pub hostname: Option<String>,
    /// Node name, usually the FQDN [default: the host name]
    #[arg(long)]
    pub name: Option<String>,
    /// Address to listen on, for HTTP (TCP) and election packets (UDP)
    #[arg(long)]
    pub host: Option<IpAddr>,
    /// Port to listen on; the same on every node of a cluster
    #[arg(long)]
    pub port: Option<u16>,
    /// Use this 32-hex-digit machine id instead of /etc/machine-id (tests, several nodes on one machine)
    #[arg(long, value_name = "HEX")]
    pub override_machine_id: Option<String>,
    /// Render templates and log what would be done, but run no command and record nothing as applied
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// YAML settings file; flags override it
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// Learn peers from cantal's /all_peers.json
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = defaults::CANTAL_URL)]
    pub cantal_url: Option<String>,
    /// Let a minority partition elect a leader (only peers heard from in the last 75 s count)
    #[arg(long)]
    pub allow_minority_cluster: bool,
    /// Lead at once without an election (debugging; two such nodes make two leaders)
    #[arg(long)]
    pub debug_force_leader: bool,
    /// Start each log line with this node's machine id (several nodes logging to one place)
    #[arg(long)]
    pub log_id: bool,
    /// Accepted for verwalter 0.13's unit files and ignored: rendering runs inside the daemon,
    /// which needs the rights its apply commands need (the packaged unit runs it as root)
    #[arg(long, hide = true)]
    pub use_sudo: bool,
    /// Frontend served at `/`: `common` (built in) or a dir under <config>/frontend/
    #[arg(long, value_name = "NAME")]
    pub default_frontend: Option<String>,
    /// This node's data center: only peers of it elect together (docs/datacenters.md)
    #[arg(long, value_name = "NAME")]
    pub datacenter: Option<String>,
}

/// `verwalter run`'s flags (`cmd` holds [`RunArgs`]) with their defaults from
/// [`defaults::shown`] at the end of their help.
pub fn with_defaults(mut cmd: clap::Command) -> clap::Command {
    for default in defaults::shown() {
        let Some(flag) = default.flag else { continue };
        let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(flag)) else {
            continue;
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        // `--cantal-url` is off unless given; the default is the URL it takes without one.
        let label = if arg.get_num_args().is_none_or(|n| n.min_values() > 0) {
            "default"
        } else {
            "URL default"
        };
        let help = format!("{help} [{label}: {}]", default.value);
        let id = arg.get_id().clone();
        cmd = cmd.mut_arg(id, |a| a.help(help));
    }
    cmd
}

/// The settings file. Every field is optional; unknown fields are an error. A missing field takes
/// its default from [`verwalter_controllers::defaults`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct SettingsFile {
    pub(crate) config_dir: Option<PathBuf>,
    pub(crate) storage_dir: Option<PathBuf>,
    pub(crate) log_dir: Option<PathBuf>,
    pub(crate) hostname: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) host: Option<IpAddr>,
    pub(crate) port: Option<u16>,
    pub(crate) machine_id: Option<String>,
    #[serde(default)]
    pub(crate) scheduler: SchedulerSettings,
    #[serde(default)]
    pub(crate) inputs: InputSettings,
    #[serde(default)]
    pub(crate) render: RenderSettings,
    #[serde(default)]
    pub(crate) logs: LogSettings,
    #[serde(default)]
    pub(crate) actions: ActionSettings,
    /// cantal's base URL; peers come from its `/all_peers.json`.
    pub(crate) cantal_url: Option<String>,
    /// Peers for sites without cantal (every node lists the others, or all nodes).
    #[serde(default)]
    pub(crate) peers: Vec<StaticPeer>,
    pub(crate) allow_minority_cluster: Option<bool>,
    #[serde(default)]
    pub(crate) election: ElectionSettings,
    /// Frontend served at `/`.
    pub(crate) default_frontend: Option<String>,
    #[serde(default)]
    pub(crate) http: HttpFileSettings,
    /// The Kubernetes scheduler extender, served on an address of its own; off unless given.
    pub(crate) placement_extender: Option<ExtenderFileSettings>,
    /// The ernest-style graph executor over NATS; off unless given.
    pub(crate) graph: Option<GraphFileSettings>,
    /// verwalter's own deployment events published on NATS; off unless given.
    pub(crate) deployment_events: Option<EventsFileSettings>,
    /// This node's data center (docs/datacenters.md); none: no DC, no exchange.
    pub(crate) datacenter: Option<String>,
    #[serde(default)]
    pub(crate) datacenters: DatacenterSettings,
}

/// `datacenters:` in the settings file (docs/datacenters.md, "Settings").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct DatacenterSettings {
    /// Other DCs' entry points (`host:port` of some of their nodes' API), by DC name.
    #[serde(default)]
    pub(crate) entry_points: std::collections::BTreeMap<String, Vec<String>>,
    /// The `host:port` other DCs reach this node's API at [default: `host`:`port`].
    pub(crate) advertise: Option<String>,
    pub(crate) period_ms: Option<u64>,
    pub(crate) link_timeout_ms: Option<u64>,
    pub(crate) exchange_timeout_ms: Option<u64>,
    pub(crate) max_body_bytes: Option<u64>,
    pub(crate) traffic_cap_bytes: Option<u64>,
    pub(crate) traffic_interval_ms: Option<u64>,
    pub(crate) max_lease_ms: Option<u64>,
}

/// `deployment-events:` in the settings file (docs/graphs.md, "Deployment events on NATS").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct EventsFileSettings {
    /// [default: nats://127.0.0.1:4222]
    pub(crate) nats_url: Option<String>,
    /// The first token of the subjects [default: verwalter].
    pub(crate) prefix: Option<String>,
    /// TLS and credentials of the NATS connection, as `verwalter graph`'s `--nats-*` flags
    /// (docs/graphs.md, "Production NATS"). Paths are relative to the settings file.
    pub(crate) nats_tls_ca: Option<PathBuf>,
    pub(crate) nats_tls_cert: Option<PathBuf>,
    pub(crate) nats_tls_key: Option<PathBuf>,
    pub(crate) nats_user: Option<String>,
    pub(crate) nats_password_file: Option<PathBuf>,
    pub(crate) nats_token_file: Option<PathBuf>,
    pub(crate) nats_nkey_file: Option<PathBuf>,
    pub(crate) nats_creds_file: Option<PathBuf>,
}

/// `graph:` in the settings file (docs/graphs.md, "The graph executor over NATS"): the same as
/// `verwalter graph`'s flags. A relative `storage-dir` is relative to the settings file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct GraphFileSettings {
    /// [default: nats://127.0.0.1:4222]
    pub(crate) nats_url: Option<String>,
    /// [default: `<storage-dir>/graph`]
    pub(crate) storage_dir: Option<PathBuf>,
    /// Seconds a dispatched component may take to answer [default: 300].
    pub(crate) component_timeout: Option<f64>,
    /// `halt` (ernest's) or `block-dependents` [default: halt].
    pub(crate) error_policy: Option<String>,
    /// Finished builds' files are removed this long after they finished (`7d`, ...) [default:
    /// kept].
    pub(crate) retention: Option<String>,
    /// TLS and credentials of the NATS connection, as `verwalter graph`'s `--nats-*` flags
    /// (docs/graphs.md, "Production NATS"). Paths are relative to the settings file.
    pub(crate) nats_tls_ca: Option<PathBuf>,
    pub(crate) nats_tls_cert: Option<PathBuf>,
    pub(crate) nats_tls_key: Option<PathBuf>,
    pub(crate) nats_user: Option<String>,
    pub(crate) nats_password_file: Option<PathBuf>,
    pub(crate) nats_token_file: Option<PathBuf>,
    pub(crate) nats_nkey_file: Option<PathBuf>,
    pub(crate) nats_creds_file: Option<PathBuf>,
    /// `ernest` or `extended` [default: ernest].
    pub(crate) templating: Option<String>,
}

/// `placement-extender:` in the settings file (docs/placement.md, "Extender"). Paths are relative
/// to the settings file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct ExtenderFileSettings {
    /// `IP:PORT` [default: 127.0.0.1:30180].
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// The placement config (wca-scheduler's config.yaml).
    pub(crate) config: PathBuf,
    /// The algorithm (name or alias) when the config has several.
    pub(crate) algorithm: Option<String>,
    /// A snapshot file (JSON or YAML) to read the placement data from.
    pub(crate) snapshot: Option<PathBuf>,
    /// Namespaces whose pods are scheduled [default: [default]].
    #[serde(default)]
    pub(crate) namespaces: Vec<String>,
    /// Serve HTTPS with this certificate chain (PEM), with `tls-key`.
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    /// The limits, as `verwalter extender`'s flags of the same names.
    pub(crate) max_connections: Option<usize>,
    pub(crate) idle_timeout_ms: Option<u64>,
    pub(crate) body_timeout_ms: Option<u64>,
    pub(crate) max_body_bytes: Option<u64>,
    pub(crate) body_budget_bytes: Option<u64>,
}

/// Limits of the HTTP server (see docs/running.md, "HTTP limits").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct HttpFileSettings {
    /// Open connections at most.
    pub(crate) max_connections: Option<usize>,
    /// A connection that sends no complete request head, or a request body that sends nothing,
    /// for this long is closed.
    pub(crate) idle_timeout_ms: Option<u64>,
    /// `/v1/events` streams at most, and at most a quarter of the connections.
    pub(crate) max_event_streams: Option<usize>,
    /// A client that takes no event or response data for this long is dropped.
    pub(crate) stream_stall_timeout_ms: Option<u64>,
    /// Host names (besides IP addresses, single-label names, `*.localhost` and this node's name
    /// and host name) the API answers to; `*` for any.
    #[serde(default)]
    pub(crate) allowed_hosts: Vec<String>,
    /// A file holding the bearer token every request that changes something must carry
    /// (`Authorization: Bearer <token>`); relative to the settings file. [default: none, no
    /// token asked]
    pub(crate) token_file: Option<PathBuf>,
    /// Reads of the API and `/metrics` need the token too (the frontend's files stay open).
    pub(crate) token_for_reads: Option<bool>,
}

/// A peer of the static list.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct StaticPeer {
    /// Machine id, 32 hex digits.
    pub(crate) id: String,
    /// `ip:port` of its verwalter.
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) hostname: String,
    /// [default: the host name]
    pub(crate) name: Option<String>,
    /// Its data center [default: this node's].
    pub(crate) datacenter: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct ElectionSettings {
    /// Leader ping period and election round.
    pub(crate) heartbeat_ms: Option<u64>,
    /// A follower starts an election after hearing nothing from its leader for a random time
    /// between these.
    pub(crate) leader_timeout_min_ms: Option<u64>,
    pub(crate) leader_timeout_max_ms: Option<u64>,
    /// A starting node waits this (plus the random part) before nominating itself.
    pub(crate) start_timeout_ms: Option<u64>,
    /// A new leader waits at most this for its peers' schedules before scheduling.
    pub(crate) prefetch_ms: Option<u64>,
    /// With allow-minority-cluster, peers not heard from directly for this long do not count
    /// for the vote.
    pub(crate) minority_window_ms: Option<u64>,
    /// Followers fetch the leader's schedule through a tree of other followers of this
    /// fan-out (0: every follower from the leader, as verwalter 0.13).
    pub(crate) relay_fanout: Option<u64>,
    /// A file holding a key shared by every node (at least 16 bytes; surrounding whitespace is
    /// dropped): election packets then carry an HMAC tag, and packets without a valid one are
    /// dropped. Relative to the settings file. [default: none, packets as verwalter 0.13's]
    pub(crate) key_file: Option<PathBuf>,
    /// Who elects: `builtin` (the UDP election above) or `etcd` (docs/etcd.md).
    pub(crate) backend: Option<super::etcd::BackendName>,
    /// The etcd backend's settings (docs/etcd.md#settings).
    pub(crate) etcd: Option<super::etcd::EtcdFileSettings>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RenderSettings {
    /// Time limit of one apply command, in seconds.
    pub(crate) command_timeout_secs: Option<u64>,
    /// Roles rendered and applied at once.
    pub(crate) parallel: Option<u64>,
    /// What a failing role holds back: `block-dependents` (the roles that depend on it) or
    /// `halt` (every other role that needs work, until it applies).
    pub(crate) dependency_failure: Option<verwalter_controllers::graph::ErrorPolicy>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct LogSettings {
    /// A log file is continued in a new segment past this size.
    pub(crate) segment_mib: Option<u64>,
    /// Deployment log files older than this are deleted.
    pub(crate) max_age_days: Option<u64>,
    /// The oldest deployment log files go while all together exceed this.
    pub(crate) max_total_mib: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct ActionSettings {
    /// At most this many actions pending on the leader.
    pub(crate) max_pending: Option<u64>,
    /// At most this much pending action JSON, in KiB.
    pub(crate) max_pending_kib: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct SchedulerSettings {
    /// Rerun the scheduler at least this often.
    pub(crate) period_ms: Option<u64>,
    /// Time budget of one run.
    pub(crate) time_limit_ms: Option<u64>,
    /// Memory cap of the Lua state.
    pub(crate) memory_limit_mib: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct InputSettings {
    /// Quiet time after a change before the config dir is re-read.
    pub(crate) debounce_ms: Option<u64>,
}

/// What the flags and the settings file say, before defaults and checks.
pub(super) struct Raw<'a> {
    pub(crate) args: &'a RunArgs,
    /// The settings file's keys; all unset without a file or when it cannot be read.
    pub(crate) file: SettingsFile,
    /// The settings file read (its dir is where relative paths in it start).
    pub(crate) settings: Option<PathBuf>,
}

/// Reads the settings file `args` name, if any; a file that cannot be read is a problem (the
/// keys are then all unset), one read from its old place a warning.
pub(super) fn parse<'a>(
    args: &'a RunArgs,
    problems: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Raw<'a> {
    let settings = args
        .settings
        .as_deref()
        .map(|named| settings_location(named, args.config_dir.as_deref(), warnings));
    let file = match &settings {
        Some(path) => match read_settings(path) {
            Ok(file) => file,
            Err(problem) => {
                problems.push(problem);
                SettingsFile::default()
            }
        },
        None => SettingsFile::default(),
    };
    Raw {
        args,
        file,
        settings,
    }
}

/// The settings file to read for `--settings named`: `named`, unless it does not exist and the
/// config dir (`--config-dir`, else the default) holds a `settings.yaml`, where the packages of
/// 0.14.0 kept it: that one is read, with a warning saying where to move it.
fn settings_location(
    named: &Path,
    config_dir: Option<&Path>,
    warnings: &mut Vec<String>,
) -> PathBuf {
    let old = config_dir
        .unwrap_or(Path::new(defaults::CONFIG_DIR))
        .join("settings.yaml");
    let missing = matches!(
        std::fs::symlink_metadata(named),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound
    );
    if missing && old != named && old.is_file() {
        warnings.push(format!(
            "{} does not exist: read {} instead, where earlier packages kept the settings. Move \
             it out of the config dir: mv {} {}",
            named.display(),
            old.display(),
            old.display(),
            named.display()
        ));
        old
    } else {
        named.to_path_buf()
    }
}

/// The most a settings file may hold.
const SETTINGS_FILE_LIMIT: u64 = 1 << 20;

/// Reads at most `limit` bytes of `file`: more is an error, so that a path to `/dev/zero` or to a
/// huge file is refused instead of filling the memory.
pub(crate) fn read_bounded(
    path: &Path,
    file: std::fs::File,
    limit: u64,
) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, limit + 1), &mut bytes)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "{}: larger than {} KiB, which is not what this file should hold",
            path.display(),
            limit >> 10
        ));
    }
    Ok(bytes)
}

pub(super) fn open(path: &Path) -> Result<std::fs::File, String> {
    std::fs::File::open(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))
}

pub(super) fn read_settings(path: &Path) -> Result<SettingsFile, String> {
    let bytes = read_bounded(path, open(path)?, SETTINGS_FILE_LIMIT)?;
    let text =
        String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))?;
    serde_norway::from_str(&text).map_err(|e| match e.location() {
        Some(loc) => format!("{}:{}: {e}", path.display(), loc.line()),
        None => format!("{}: {e}", path.display()),
    })
}
