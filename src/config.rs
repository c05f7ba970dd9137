//! Daemon settings: command-line flags over an optional YAML settings file over defaults.
//! Loading reports every problem at once.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use verwalter_controllers::defaults;
use verwalter_controllers::ernest::Templating;

use crate::machinery::identity::{self, parse_machine_id};
use crate::schedule::lua::Limits;

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
pub struct SettingsFile {
    pub config_dir: Option<PathBuf>,
    pub storage_dir: Option<PathBuf>,
    pub log_dir: Option<PathBuf>,
    pub hostname: Option<String>,
    pub name: Option<String>,
    pub host: Option<IpAddr>,
    pub port: Option<u16>,
    pub machine_id: Option<String>,
    #[serde(default)]
    pub scheduler: SchedulerSettings,
    #[serde(default)]
    pub inputs: InputSettings,
    #[serde(default)]
    pub render: RenderSettings,
    #[serde(default)]
    pub logs: LogSettings,
    #[serde(default)]
    pub actions: ActionSettings,
    /// cantal's base URL; peers come from its `/all_peers.json`.
    pub cantal_url: Option<String>,
    /// Peers for sites without cantal (every node lists the others, or all nodes).
    #[serde(default)]
    pub peers: Vec<StaticPeer>,
    pub allow_minority_cluster: Option<bool>,
    #[serde(default)]
    pub election: ElectionSettings,
    /// Frontend served at `/`.
    pub default_frontend: Option<String>,
    #[serde(default)]
    pub http: HttpFileSettings,
    /// The Kubernetes scheduler extender, served on an address of its own; off unless given.
    pub placement_extender: Option<ExtenderFileSettings>,
    /// The ernest-style graph executor over NATS; off unless given.
    pub graph: Option<GraphFileSettings>,
    /// verwalter's own deployment events published on NATS; off unless given.
    pub deployment_events: Option<EventsFileSettings>,
}

/// `deployment-events:` in the settings file (docs/graphs.md, "Deployment events on NATS").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct EventsFileSettings {
    /// [default: nats://127.0.0.1:4222]
    pub nats_url: Option<String>,
    /// The first token of the subjects [default: verwalter].
    pub prefix: Option<String>,
    /// TLS and credentials of the NATS connection, as `verwalter graph`'s `--nats-*` flags
    /// (docs/graphs.md, "Production NATS"). Paths are relative to the settings file.
    pub nats_tls_ca: Option<PathBuf>,
    pub nats_tls_cert: Option<PathBuf>,
    pub nats_tls_key: Option<PathBuf>,
    pub nats_user: Option<String>,
    pub nats_password_file: Option<PathBuf>,
    pub nats_token_file: Option<PathBuf>,
    pub nats_nkey_file: Option<PathBuf>,
    pub nats_creds_file: Option<PathBuf>,
}

/// `graph:` in the settings file (docs/graphs.md, "The graph executor over NATS"): the same as
/// `verwalter graph`'s flags. A relative `storage-dir` is relative to the settings file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct GraphFileSettings {
    /// [default: nats://127.0.0.1:4222]
    pub nats_url: Option<String>,
    /// [default: `<storage-dir>/graph`]
    pub storage_dir: Option<PathBuf>,
    /// Seconds a dispatched component may take to answer [default: 300].
    pub component_timeout: Option<f64>,
    /// `halt` (ernest's) or `block-dependents` [default: halt].
    pub error_policy: Option<String>,
    /// Finished builds' files are removed this long after they finished (`7d`, ...) [default:
    /// kept].
    pub retention: Option<String>,
    /// TLS and credentials of the NATS connection, as `verwalter graph`'s `--nats-*` flags
    /// (docs/graphs.md, "Production NATS"). Paths are relative to the settings file.
    pub nats_tls_ca: Option<PathBuf>,
    pub nats_tls_cert: Option<PathBuf>,
    pub nats_tls_key: Option<PathBuf>,
    pub nats_user: Option<String>,
    pub nats_password_file: Option<PathBuf>,
    pub nats_token_file: Option<PathBuf>,
    pub nats_nkey_file: Option<PathBuf>,
    pub nats_creds_file: Option<PathBuf>,
    /// `ernest` or `extended` [default: ernest].
    pub templating: Option<String>,
}

/// The `nats-*` keys of a settings section as `--nats-*` flags, paths relative to `settings`.
macro_rules! nats_flags {
    ($section:expr, $settings:expr) => {{
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| relative_to_settings($settings, p));
        crate::ernest::nats_options::NatsFlags {
            tls_ca: path(&$section.nats_tls_ca),
            tls_cert: path(&$section.nats_tls_cert),
            tls_key: path(&$section.nats_tls_key),
            user: $section.nats_user.clone(),
            password_file: path(&$section.nats_password_file),
            token_file: path(&$section.nats_token_file),
            nkey_file: path(&$section.nats_nkey_file),
            creds_file: path(&$section.nats_creds_file),
        }
    }};
}

/// `placement-extender:` in the settings file (docs/placement.md, "Extender"). Paths are relative
/// to the settings file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ExtenderFileSettings {
    /// `IP:PORT` [default: 127.0.0.1:30180].
    pub listen: Option<std::net::SocketAddr>,
    /// The placement config (wca-scheduler's config.yaml).
    pub config: PathBuf,
    /// The algorithm (name or alias) when the config has several.
    pub algorithm: Option<String>,
    /// A snapshot file (JSON or YAML) to read the placement data from.
    pub snapshot: Option<PathBuf>,
    /// Namespaces whose pods are scheduled [default: [default]].
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Serve HTTPS with this certificate chain (PEM), with `tls-key`.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The limits, as `verwalter extender`'s flags of the same names.
    pub max_connections: Option<usize>,
    pub idle_timeout_ms: Option<u64>,
    pub body_timeout_ms: Option<u64>,
    pub max_body_bytes: Option<u64>,
    pub body_budget_bytes: Option<u64>,
}

/// Limits of the HTTP server (see docs/running.md, "HTTP limits").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HttpFileSettings {
    /// Open connections at most.
    pub max_connections: Option<usize>,
    /// A connection that sends no complete request head, or a request body that sends nothing,
    /// for this long is closed.
    pub idle_timeout_ms: Option<u64>,
    /// `/v1/events` streams at most, and at most a quarter of the connections.
    pub max_event_streams: Option<usize>,
    /// A client that takes no event or response data for this long is dropped.
    pub stream_stall_timeout_ms: Option<u64>,
    /// Host names (besides IP addresses, single-label names, `*.localhost` and this node's name
    /// and host name) the API answers to; `*` for any.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// A file holding the bearer token every request that changes something must carry
    /// (`Authorization: Bearer <token>`); relative to the settings file. [default: none, no
    /// token asked]
    pub token_file: Option<PathBuf>,
    /// Reads of the API and `/metrics` need the token too (the frontend's files stay open).
    pub token_for_reads: Option<bool>,
}

/// A peer of the static list.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StaticPeer {
    /// Machine id, 32 hex digits.
    pub id: String,
    /// `ip:port` of its verwalter.
    pub addr: std::net::SocketAddr,
    pub hostname: String,
    /// [default: the host name]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ElectionSettings {
    /// Leader ping period and election round.
    pub heartbeat_ms: Option<u64>,
    /// A follower starts an election after hearing nothing from its leader for a random time
    /// between these.
    pub leader_timeout_min_ms: Option<u64>,
    pub leader_timeout_max_ms: Option<u64>,
    /// A starting node waits this (plus the random part) before nominating itself.
    pub start_timeout_ms: Option<u64>,
    /// A new leader waits at most this for its peers' schedules before scheduling.
    pub prefetch_ms: Option<u64>,
    /// With allow-minority-cluster, peers not heard from directly for this long do not count
    /// for the vote.
    pub minority_window_ms: Option<u64>,
    /// Followers fetch the leader's schedule through a tree of other followers of this
    /// fan-out (0: every follower from the leader, as verwalter 0.13).
    pub relay_fanout: Option<u64>,
    /// A file holding a key shared by every node (at least 16 bytes; surrounding whitespace is
    /// dropped): election packets then carry an HMAC tag, and packets without a valid one are
    /// dropped. Relative to the settings file. [default: none, packets as verwalter 0.13's]
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RenderSettings {
    /// Time limit of one apply command, in seconds.
    pub command_timeout_secs: Option<u64>,
    /// Roles rendered and applied at once.
    pub parallel: Option<u64>,
    /// What a failing role holds back: `block-dependents` (the roles that depend on it) or
    /// `halt` (every other role that needs work, until it applies).
    pub dependency_failure: Option<verwalter_controllers::graph::ErrorPolicy>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LogSettings {
    /// A log file is continued in a new segment past this size.
    pub segment_mib: Option<u64>,
    /// Deployment log files older than this are deleted.
    pub max_age_days: Option<u64>,
    /// The oldest deployment log files go while all together exceed this.
    pub max_total_mib: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ActionSettings {
    /// At most this many actions pending on the leader.
    pub max_pending: Option<u64>,
    /// At most this much pending action JSON, in KiB.
    pub max_pending_kib: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SchedulerSettings {
    /// Rerun the scheduler at least this often.
    pub period_ms: Option<u64>,
    /// Time budget of one run.
    pub time_limit_ms: Option<u64>,
    /// Memory cap of the Lua state.
    pub memory_limit_mib: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct InputSettings {
    /// Quiet time after a change before the config dir is re-read.
    pub debounce_ms: Option<u64>,
}

/// Resolved daemon settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub config_dir: PathBuf,
    pub storage_dir: PathBuf,
    pub log_dir: PathBuf,
    pub hostname: String,
    pub name: String,
    pub host: IpAddr,
    pub port: u16,
    pub machine_id: String,
    pub dry_run: bool,
    pub scheduler_period: Duration,
    pub limits: Limits,
    pub debounce: Duration,
    pub command_timeout: Duration,
    /// Roles rendered and applied at once (`render.parallel`).
    pub render_parallel: usize,
    /// What a failing role holds back (`render.dependency-failure`).
    pub dependency_failure: verwalter_controllers::graph::ErrorPolicy,
    pub log_limits: crate::storage::logs::LogLimits,
    pub action_limits: verwalter_controllers::actions::ActionLimits,
    pub peer_source: PeerSource,
    pub allow_minority_cluster: bool,
    pub debug_force_leader: bool,
    /// `common` (the built-in frontend) or a dir under `<config-dir>/frontend/`.
    pub default_frontend: String,
    pub timings: verwalter_controllers::cluster::election::machine::Timings,
    pub prefetch: Duration,
    pub minority_window: Duration,
    /// `election.relay-fanout`.
    pub relay_fanout: usize,
    /// `election.key-file`'s key.
    /// The Kubernetes scheduler extender to serve, if the settings ask for it.
    pub placement_extender: Option<crate::placement::extender::ExtenderSetup>,
    /// The graph executor to run, if the settings ask for it.
    pub graph: Option<crate::ernest::GraphSettings>,
    /// Where to publish deployment events, if the settings ask for it.
    pub deployment_events: Option<crate::ernest::events::EventSettings>,
    pub election_key: Option<verwalter_controllers::cluster::election::wire::AuthKey>,
    pub http: crate::http::HttpSettings,
    /// What the operator should change, though the daemon can start: a settings file or a
    /// secret inside the config dir, the settings read from their old place. Logged at start.
    pub warnings: Vec<String>,
}

/// Where a node learns its peers.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerSource {
    /// Neither cantal nor a peer list: the node is alone and leads itself.
    None,
    Cantal(String),
    Static(Vec<verwalter_controllers::state::Peer>),
}

/// Every problem found while loading the settings.
#[derive(Debug, thiserror::Error)]
#[error("invalid settings:\n  - {}", .problems.join("\n  - "))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

impl Config {
    pub fn load(args: &RunArgs) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        let settings = args
            .settings
            .as_deref()
            .map(|named| settings_location(named, args.config_dir.as_deref(), &mut warnings));
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
        let machine_id = identity::machine_id(
            args.override_machine_id.as_deref(),
            file.machine_id.as_deref(),
        )
        .unwrap_or_else(|problem| {
            problems.push(problem);
            String::new()
        });
        let hostname = identity::hostname(args.hostname.as_deref(), file.hostname.as_deref())
            .unwrap_or_else(|problem| {
                problems.push(problem);
                String::new()
            });
        let name = args
            .name
            .clone()
            .or(file.name.clone())
            .unwrap_or_else(|| hostname.clone());
        let port = args.port.or(file.port).unwrap_or(defaults::PORT);
        let sched = &file.scheduler;
        let memory_mib = sched
            .memory_limit_mib
            .unwrap_or(defaults::SCHEDULER_MEMORY_MIB);
        if memory_mib < 4 {
            problems.push(format!(
                "scheduler.memory-limit-mib: {memory_mib} is too small (at least 4)"
            ));
        }
        let time_ms = sched
            .time_limit_ms
            .unwrap_or(defaults::SCHEDULER_TIME_LIMIT.as_millis() as u64);
        if time_ms == 0 {
            problems.push("scheduler.time-limit-ms: must be above 0".into());
        }
        let period_ms = sched
            .period_ms
            .unwrap_or(defaults::SCHEDULER_PERIOD.as_millis() as u64);
        if period_ms < 100 {
            problems.push(format!(
                "scheduler.period-ms: {period_ms} is too short (at least 100)"
            ));
        }
        for (name, value) in [
            (
                "render.command-timeout-secs",
                file.render.command_timeout_secs,
            ),
            ("render.parallel", file.render.parallel),
            ("logs.segment-mib", file.logs.segment_mib),
            ("logs.max-age-days", file.logs.max_age_days),
            ("logs.max-total-mib", file.logs.max_total_mib),
            ("actions.max-pending", file.actions.max_pending),
            ("actions.max-pending-kib", file.actions.max_pending_kib),
        ] {
            if value == Some(0) {
                problems.push(format!("{name}: must be above 0"));
            }
        }
        // Times are added to clocks and to each other (a command's time limit plus its kill
        // grace, a backoff doubled): a value of many digits overflowed and panicked. No time
        // needs more than 30 days.
        const MAX_DAYS: u64 = 30;
        let max_ms = MAX_DAYS * 86_400_000;
        for (name, value, unit_ms) in [
            (
                "render.command-timeout-secs",
                file.render.command_timeout_secs,
                1000,
            ),
            ("http.idle-timeout-ms", file.http.idle_timeout_ms, 1),
            (
                "http.stream-stall-timeout-ms",
                file.http.stream_stall_timeout_ms,
                1,
            ),
            ("election.heartbeat-ms", file.election.heartbeat_ms, 1),
            (
                "election.leader-timeout-min-ms",
                file.election.leader_timeout_min_ms,
                1,
            ),
            (
                "election.leader-timeout-max-ms",
                file.election.leader_timeout_max_ms,
                1,
            ),
            (
                "election.start-timeout-ms",
                file.election.start_timeout_ms,
                1,
            ),
            ("election.prefetch-ms", file.election.prefetch_ms, 1),
            (
                "election.minority-window-ms",
                file.election.minority_window_ms,
                1,
            ),
            ("scheduler.period-ms", sched.period_ms, 1),
            ("scheduler.time-limit-ms", sched.time_limit_ms, 1),
            ("inputs.debounce-ms", file.inputs.debounce_ms, 1),
        ] {
            if let Some(value) = value
                && value > max_ms / unit_ms
            {
                problems.push(format!(
                    "{name}: {value} is too long (at most {}, {MAX_DAYS} days)",
                    max_ms / unit_ms
                ));
            }
        }
        // Sizes and ages become bytes and seconds: they must fit in 64 bits then (a value of
        // many digits would panic, or wrap to a tiny limit; found by fuzzing).
        for (name, value, unit) in [
            (
                "scheduler.memory-limit-mib",
                sched.memory_limit_mib,
                1u64 << 20,
            ),
            ("logs.segment-mib", file.logs.segment_mib, 1 << 20),
            ("logs.max-total-mib", file.logs.max_total_mib, 1 << 20),
            ("logs.max-age-days", file.logs.max_age_days, 86_400),
            (
                "actions.max-pending-kib",
                file.actions.max_pending_kib,
                1 << 10,
            ),
        ] {
            if let Some(value) = value
                && value.checked_mul(unit).is_none()
            {
                problems.push(format!(
                    "{name}: {value} is too large (at most {})",
                    u64::MAX / unit
                ));
            }
        }
        let cantal = args.cantal_url.clone().or(file.cantal_url.clone());
        let peer_source = match (cantal, file.peers.is_empty()) {
            (Some(_), false) => {
                problems.push("give either cantal-url or peers, not both".into());
                PeerSource::None
            }
            (Some(url), true) => {
                if !url.starts_with("http://") {
                    problems.push(format!("cantal-url: {url:?} must start with http://"));
                }
                PeerSource::Cantal(url.trim_end_matches('/').to_string())
            }
            (None, false) => {
                let mut peers = Vec::new();
                for (i, p) in file.peers.iter().enumerate() {
                    match parse_machine_id(&p.id) {
                        Ok(id) if id == machine_id => {} // the list may include this node
                        Ok(id) => peers.push(verwalter_controllers::state::Peer {
                            id,
                            addr: Some(p.addr.to_string()),
                            name: p.name.clone().unwrap_or_else(|| p.hostname.clone()),
                            hostname: p.hostname.clone(),
                            schedule: None,
                            known_since: 0,
                            last_report_direct: None,
                            errors: 0,
                        }),
                        Err(e) => problems.push(format!("peers[{i}].id: {e}")),
                    }
                }
                PeerSource::Static(peers)
            }
            (None, true) => PeerSource::None,
        };
        let el = &file.election;
        let defaults = verwalter_controllers::cluster::election::machine::Timings::default();
        let or = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
        let timings = verwalter_controllers::cluster::election::machine::Timings {
            start_timeout: or(el.start_timeout_ms, defaults.start_timeout),
            message_timeout_min: or(el.leader_timeout_min_ms, defaults.message_timeout_min),
            message_timeout_max: or(el.leader_timeout_max_ms, defaults.message_timeout_max),
            heartbeat: or(el.heartbeat_ms, defaults.heartbeat),
        };
        let election_key = file.election.key_file.as_ref().and_then(|path| {
            read_key(&relative_to_settings(settings.as_deref(), path))
                .map_err(|problem| problems.push(format!("election.key-file: {problem}")))
                .ok()
        });
        if file.election.minority_window_ms == Some(0) {
            problems.push("election.minority-window-ms: must be above 0".into());
        }
        if timings.heartbeat.is_zero() {
            problems.push("election.heartbeat-ms: must be above 0".into());
        }
        if timings.message_timeout_min > timings.message_timeout_max {
            problems.push(
                "election.leader-timeout-min-ms: must not be above leader-timeout-max-ms".into(),
            );
        }
        if timings.message_timeout_min < timings.heartbeat * 2 {
            problems.push(format!(
                "election.leader-timeout-min-ms: {} ms is under two heartbeats ({} ms): followers \
                 would start elections while the leader is fine",
                timings.message_timeout_min.as_millis(),
                (timings.heartbeat * 2).as_millis()
            ));
        }
        let config_dir = absolute(
            args.config_dir
                .clone()
                .or(file.config_dir.clone())
                .unwrap_or_else(|| defaults::CONFIG_DIR.into()),
        );
        let default_frontend = args
            .default_frontend
            .clone()
            .or(file.default_frontend.clone())
            .unwrap_or_else(|| BUILTIN_FRONTEND.into());
        if let Err(problem) = check_frontend(&config_dir, &default_frontend) {
            problems.push(format!("default-frontend: {problem}"));
        }
        // The daemon's own settings and secrets do not belong in the config dir, which sites
        // deploy by replacing it (docs/packaging.md#configure).
        let secrets = [
            ("the settings file", settings.clone()),
            (
                "http.token-file",
                file.http
                    .token_file
                    .as_ref()
                    .map(|p| relative_to_settings(settings.as_deref(), p)),
            ),
            (
                "election.key-file",
                file.election
                    .key_file
                    .as_ref()
                    .map(|p| relative_to_settings(settings.as_deref(), p)),
            ),
        ];
        for (what, path) in secrets {
            if let Some(path) = path.filter(|p| absolute(p.clone()).starts_with(&config_dir)) {
                warnings.push(format!(
                    "{what} {} is inside the config dir {}: a deploy that replaces the config \
                     dir (rsync --delete, a checkout) deletes it. Keep it outside, e.g. in {}/",
                    path.display(),
                    config_dir.display(),
                    defaults::SETTINGS_DIR,
                ));
            }
        }
        let mut http =
            crate::http::HttpSettings::from_file(&file.http).unwrap_or_else(|mut found| {
                problems.append(&mut found);
                crate::http::HttpSettings::default()
            });
        http.token = file.http.token_file.as_ref().and_then(|path| {
            read_token(&relative_to_settings(settings.as_deref(), path))
                .map_err(|problem| problems.push(format!("http.token-file: {problem}")))
                .ok()
        });
        if http.token_for_reads && file.http.token_file.is_none() {
            problems
                .push("http.token-for-reads: needs http.token-file (the token to ask for)".into());
        }
        let placement_extender = file.placement_extender.as_ref().and_then(|e| {
            use crate::placement::extender;
            let path = |p: &PathBuf| relative_to_settings(settings.as_deref(), p);
            if e.tls_cert.is_some() != e.tls_key.is_some() {
                problems.push("placement-extender: tls-cert and tls-key go together".into());
            }
            let flags = extender::ExtenderFlags {
                config: path(&e.config),
                listen: e.listen.unwrap_or(std::net::SocketAddr::from((
                    [127, 0, 0, 1],
                    extender::DEFAULT_PORT,
                ))),
                snapshot: e.snapshot.as_ref().map(path),
                namespaces: e.namespaces.clone(),
                algorithm: e.algorithm.clone(),
                tls_cert: e.tls_cert.as_ref().map(path),
                tls_key: e.tls_key.as_ref().map(path),
                max_connections: e
                    .max_connections
                    .unwrap_or(extender::DEFAULT_MAX_CONNECTIONS),
                idle_timeout_ms: e
                    .idle_timeout_ms
                    .unwrap_or(extender::DEFAULT_IDLE_TIMEOUT_MS),
                body_timeout_ms: e
                    .body_timeout_ms
                    .unwrap_or(extender::DEFAULT_BODY_TIMEOUT_MS),
                max_body_bytes: e.max_body_bytes.unwrap_or(extender::DEFAULT_MAX_BODY_BYTES),
                body_budget_bytes: e
                    .body_budget_bytes
                    .unwrap_or(extender::DEFAULT_BODY_BUDGET_BYTES),
            };
            if let Err(problem) =
                extender::ExtenderLimits::from_flags(&flags, "placement-extender.")
            {
                problems.push(problem);
                return None;
            }
            extender::ExtenderSetup::from_flags(&flags)
                .map_err(|problem| problems.push(format!("placement-extender.config: {problem}")))
                .ok()
        });
        let storage_dir = absolute(
            args.storage_dir
                .clone()
                .or(file.storage_dir.clone())
                .unwrap_or_else(|| defaults::STORAGE_DIR.into()),
        );
        let graph = file.graph.as_ref().and_then(|g| {
            let flags = crate::ernest::GraphFlags {
                nats_url: g
                    .nats_url
                    .clone()
                    .unwrap_or_else(|| crate::ernest::DEFAULT_NATS_URL.into()),
                command: None,
                storage_dir: Some(g.storage_dir.as_ref().map_or_else(
                    || storage_dir.join("graph"),
                    |p| relative_to_settings(settings.as_deref(), p),
                )),
                component_timeout: g
                    .component_timeout
                    .unwrap_or(crate::ernest::DEFAULT_COMPONENT_TIMEOUT.as_secs_f64()),
                error_policy: match g.error_policy.as_deref().map(crate::ernest::parse_policy) {
                    None => verwalter_controllers::graph::ErrorPolicy::Halt,
                    Some(Ok(policy)) => policy,
                    Some(Err(problem)) => {
                        problems.push(format!("graph.error-policy: {problem}"));
                        verwalter_controllers::graph::ErrorPolicy::Halt
                    }
                },
                templating: match g.templating.as_deref().map(Templating::parse) {
                    None => Templating::Ernest,
                    Some(Ok(mode)) => mode,
                    Some(Err(problem)) => {
                        problems.push(format!("graph.templating: {problem}"));
                        Templating::Ernest
                    }
                },
                metrics_listen: None,
                retention: match g.retention.as_deref().map(crate::ernest::parse_age) {
                    None => None,
                    Some(Ok(age)) => Some(age),
                    Some(Err(problem)) => {
                        problems.push(format!("graph.retention: {problem}"));
                        None
                    }
                },
                nats: nats_flags!(g, settings.as_deref()),
            };
            crate::ernest::GraphSettings::from_flags(&flags, "graph.nats-")
                .map_err(|problem| {
                    problems.push(match problem.strip_prefix("--component-timeout ") {
                        Some(rest) => format!("graph.component-timeout: {rest}"),
                        None => problem,
                    })
                })
                .ok()
        });
        let deployment_events = file.deployment_events.as_ref().and_then(|e| {
            let prefix = e.prefix.clone().unwrap_or_else(|| "verwalter".into());
            let token_ok = !prefix.is_empty()
                && prefix
                    .split('.')
                    .all(|t| !t.is_empty() && !t.contains(['*', '>', ' ']));
            if !token_ok {
                problems.push(format!(
                    "deployment-events.prefix: {prefix:?} is not a NATS subject prefix"
                ));
                return None;
            }
            let nats_url = e
                .nats_url
                .clone()
                .unwrap_or_else(|| crate::ernest::DEFAULT_NATS_URL.into());
            let nats_auth = nats_flags!(e, settings.as_deref())
                .resolve("deployment-events.nats-", &nats_url)
                .map_err(|problem| problems.push(problem))
                .ok()?;
            Some(crate::ernest::events::EventSettings {
                nats_url,
                nats_auth,
                prefix,
            })
        });
        if !problems.is_empty() {
            return Err(ConfigError { problems });
        }
        Ok(Config {
            deployment_events,
            graph,
            placement_extender,
            http,
            config_dir,
            storage_dir,
            log_dir: absolute(
                args.log_dir
                    .clone()
                    .or(file.log_dir)
                    .unwrap_or_else(|| defaults::LOG_DIR.into()),
            ),
            hostname,
            name,
            host: args.host.or(file.host).unwrap_or(defaults::HOST),
            port,
            machine_id,
            dry_run: args.dry_run,
            scheduler_period: Duration::from_millis(period_ms),
            limits: Limits {
                memory: (memory_mib as usize) << 20,
                time: Duration::from_millis(time_ms),
            },
            debounce: file
                .inputs
                .debounce_ms
                .map_or(defaults::INPUT_DEBOUNCE, Duration::from_millis),
            command_timeout: file
                .render
                .command_timeout_secs
                .map_or(defaults::COMMAND_TIMEOUT, Duration::from_secs),
            render_parallel: file
                .render
                .parallel
                .map_or(defaults::RENDER_PARALLEL, |n| n as usize),
            dependency_failure: file.render.dependency_failure.unwrap_or_default(),
            log_limits: crate::storage::logs::LogLimits {
                segment_size: file.logs.segment_mib.unwrap_or(defaults::LOG_SEGMENT_MIB) << 20,
                max_age: Duration::from_secs(
                    file.logs.max_age_days.unwrap_or(defaults::LOG_MAX_AGE_DAYS) * 86_400,
                ),
                max_total: file
                    .logs
                    .max_total_mib
                    .unwrap_or(defaults::LOG_MAX_TOTAL_MIB)
                    << 20,
            },
            action_limits: {
                let default = verwalter_controllers::actions::ActionLimits::default();
                verwalter_controllers::actions::ActionLimits {
                    max_count: file
                        .actions
                        .max_pending
                        .map_or(default.max_count, |n| n as usize),
                    max_bytes: file
                        .actions
                        .max_pending_kib
                        .map_or(default.max_bytes, |k| (k as usize) << 10),
                }
            },
            peer_source,
            allow_minority_cluster: args.allow_minority_cluster
                || file.allow_minority_cluster.unwrap_or(false),
            debug_force_leader: args.debug_force_leader,
            default_frontend,
            timings,
            prefetch: or(file.election.prefetch_ms, defaults::PREFETCH),
            minority_window: or(file.election.minority_window_ms, defaults::MINORITY_WINDOW),
            relay_fanout: file
                .election
                .relay_fanout
                .map_or(verwalter_controllers::defaults::RELAY_FANOUT, |n| {
                    n.min(usize::MAX as u64) as usize
                }),
            election_key,
            warnings,
        })
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

/// The frontend built into the binary; 0.13 called its default frontend `common` too.
pub const BUILTIN_FRONTEND: &str = defaults::FRONTEND;

/// A frontend name is one plain path component, and other than the built-in one, a dir under
/// `<config-dir>/frontend/` with an `index.html`.
pub fn check_frontend(config_dir: &Path, name: &str) -> Result<(), String> {
    if !is_frontend_name(name) {
        return Err(format!(
            "{name:?} is not a frontend name (letters, digits, '-', '_', '.')"
        ));
    }
    if name == BUILTIN_FRONTEND {
        return Ok(());
    }
    let index = config_dir.join("frontend").join(name).join("index.html");
    if index.is_file() {
        Ok(())
    } else {
        Err(format!(
            "{} does not exist (use {BUILTIN_FRONTEND:?} for the built-in frontend)",
            index.display()
        ))
    }
}

/// One plain path component: letters, digits, `-`, `_`, `.`, not starting with `.`.
pub fn is_frontend_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Directories are made absolute at start: paths handed to apply commands (`{{ files.NAME }}`)
/// must not depend on the working directory a command runs in.
fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// The most a key or token file may hold: they hold one line.
const SECRET_FILE_LIMIT: u64 = 64 << 10;
/// The most a settings file may hold.
const SETTINGS_FILE_LIMIT: u64 = 1 << 20;

/// Reads at most `limit` bytes of `file`: more is an error, so that a path to `/dev/zero` or to a
/// huge file is refused instead of filling the memory.
fn read_bounded(path: &Path, file: std::fs::File, limit: u64) -> Result<Vec<u8>, String> {
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

fn open(path: &Path) -> Result<std::fs::File, String> {
    std::fs::File::open(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))
}

fn read_key(
    path: &Path,
) -> Result<verwalter_controllers::cluster::election::wire::AuthKey, String> {
    use verwalter_controllers::cluster::election::wire::{AuthKey, MIN_KEY_LEN};
    let bytes = read_bounded(path, open(path)?, SECRET_FILE_LIMIT)?;
    let key = bytes.trim_ascii();
    AuthKey::new(key).ok_or_else(|| {
        format!(
            "{}: the key is {} bytes, at least {MIN_KEY_LEN} are needed",
            path.display(),
            key.len()
        )
    })
}

/// `path` of a settings key, relative to the settings file's dir unless absolute.
fn relative_to_settings(settings: Option<&Path>, path: &Path) -> PathBuf {
    match settings.and_then(Path::parent) {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_path_buf(),
    }
}

/// The bearer token of `http.token-file`: a file only its owner may read or write (mode 0600 or
/// 0400: anyone who reads it can change what every node runs), holding at least 16 visible
/// ASCII characters.
fn read_token(path: &Path) -> Result<verwalter_controllers::http::access::Token, String> {
    use std::os::unix::fs::PermissionsExt;
    let file = open(path)?;
    let mode = file
        .metadata()
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{}: group or others may access it (mode {:03o}); make it the owner's alone: \
             chmod 600 {}",
            path.display(),
            mode & 0o777,
            path.display()
        ));
    }
    let bytes = read_bounded(path, file, SECRET_FILE_LIMIT)?;
    verwalter_controllers::http::access::Token::from_file_bytes(&bytes)
        .map_err(|problem| format!("{}: {problem}", path.display()))
}

fn read_settings(path: &Path) -> Result<SettingsFile, String> {
    let bytes = read_bounded(path, open(path)?, SETTINGS_FILE_LIMIT)?;
    let text =
        String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))?;
    serde_norway::from_str(&text).map_err(|e| match e.location() {
        Some(loc) => format!("{}:{}: {e}", path.display(), loc.line()),
        None => format!("{}: {e}", path.display()),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Arguments that load the settings file `file` as node `alpha` with a fixed machine id.
    pub(crate) fn settings_args(file: &Path) -> RunArgs {
        RunArgs {
            settings: Some(file.to_path_buf()),
            override_machine_id: Some("0123456789abcdef0123456789abcdef".into()),
            hostname: Some("alpha".into()),
            ..RunArgs::default()
        }
    }

    /// docs/running.md shows the defaults of [`defaults::shown`]: in the settings-file sample
    /// and in the flags table.
    #[test]
    fn the_documented_defaults_are_the_built_in_ones() {
        let doc =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/running.md"))
                .unwrap();
        let sample = doc
            .split("```yaml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap();
        let sample: serde_json::Value = serde_norway::from_str(sample).unwrap();
        for default in defaults::shown() {
            let mut found = false;
            let in_file = default
                .key
                .split('.')
                .try_fold(&sample, |at, part| at.get(part));
            if let Some(value) = in_file {
                let value = match value {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                assert_eq!(value, default.value, "running.md sample, {}", default.key);
                found = true;
            }
            if let Some(flag) = default.flag {
                let row = doc
                    .lines()
                    .find(|l| {
                        l.starts_with(&format!("| `--{flag} "))
                            || l.starts_with(&format!("| `--{flag}`"))
                    })
                    .unwrap_or_else(|| panic!("running.md has no row for --{flag}"));
                assert!(
                    row.contains(&format!("`{}`", default.value)),
                    "running.md row of --{flag} does not show `{}`: {row}",
                    default.value
                );
                found = true;
            }
            assert!(
                found,
                "running.md does not show the default of {}",
                default.key
            );
        }
    }

    #[test]
    fn run_help_shows_the_built_in_defaults() {
        let cmd = with_defaults(<RunArgs as clap::Args>::augment_args(clap::Command::new(
            "run",
        )));
        let help = cmd.clone().render_help().to_string();
        for default in defaults::shown() {
            if default.flag.is_some() {
                assert!(
                    help.contains(&default.value),
                    "--help lacks {}: {help}",
                    default.value
                );
            }
        }
        assert!(help.contains("[default: 8379]"), "{help}");
    }

    #[test]
    fn flags_override_the_file_and_all_problems_are_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        std::fs::write(
            &file,
            "port: 9000\nhostname: from-file\nscheduler:\n  period-ms: 5000\n",
        )
        .unwrap();
        let args = RunArgs {
            settings: Some(file.clone()),
            hostname: Some("from-flag".into()),
            override_machine_id: Some("0123456789ABCDEF0123456789abcdef".into()),
            ..RunArgs::default()
        };
        let config = Config::load(&args).unwrap();
        assert_eq!(config.port, 9000);
        assert_eq!(config.hostname, "from-flag");
        assert_eq!(config.name, "from-flag");
        assert_eq!(config.machine_id, "0123456789abcdef0123456789abcdef");
        assert_eq!(config.scheduler_period, Duration::from_secs(5));

        std::fs::write(&file, "port: 9000\nbogus: 1\n").unwrap();
        let args = RunArgs {
            settings: Some(file),
            override_machine_id: Some("xyz".into()),
            ..RunArgs::default()
        };
        let err = Config::load(&args).unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
        assert!(err.to_string().contains("unknown field `bogus`"), "{err}");
        assert!(err.to_string().contains("settings.yaml:2"), "{err}");
        assert!(err.to_string().contains("32 hex digits"), "{err}");
    }

    #[test]
    fn graph_templating_is_ernests_unless_the_file_asks_for_extended() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(&settings_args(&file))
        };
        let templating = |text: &str| load(text).unwrap().graph.unwrap().templating;
        assert_eq!(templating("graph: {}\n"), Templating::Ernest);
        assert_eq!(
            templating("graph:\n  templating: extended\n"),
            Templating::Extended
        );
        let err = load("graph:\n  templating: gjson\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("graph.templating: \"gjson\" is not a templating mode"),
            "{err}"
        );
    }

    /// docs/graphs.md's settings examples under "Running it" and "Deployment events on NATS",
    /// read exactly as written, give what the text beside them says.
    #[test]
    fn the_graph_settings_examples_of_the_docs_are_read_as_written() {
        let docs = include_str!("../docs/graphs.md");
        let block = |heading: &str| {
            let section = &docs[docs.find(heading).unwrap()..];
            let start = section.find("```yaml\n").unwrap() + "```yaml\n".len();
            section[start..start + section[start..].find("```").unwrap()].to_string()
        };
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(&RunArgs {
                storage_dir: Some(tmp.path().join("storage")),
                ..settings_args(&file)
            })
            .unwrap()
        };
        let graph = load(&block("\n### Running it\n")).graph.expect("graph:");
        assert_eq!(graph.nats_url, "nats://127.0.0.1:4222");
        assert_eq!(graph.storage_dir, tmp.path().join("storage/graph"));
        assert_eq!(graph.component_timeout, std::time::Duration::from_secs(300));
        assert_eq!(
            graph.policy,
            verwalter_controllers::graph::ErrorPolicy::Halt
        );
        assert_eq!(graph.templating, Templating::Ernest);
        assert_eq!(graph.retention, None);

        let events = load(&block("\n### Deployment events on NATS\n"))
            .deployment_events
            .expect("deployment-events:");
        assert_eq!(events.nats_url, "nats://127.0.0.1:4222");
        assert_eq!(events.prefix, "verwalter");
    }

    #[test]
    fn action_caps_have_defaults_and_must_be_above_0() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(&settings_args(&file))
        };
        let config = load("port: 9000\n").unwrap();
        assert_eq!(
            config.action_limits,
            verwalter_controllers::actions::ActionLimits {
                max_count: 1000,
                max_bytes: 4 << 20
            }
        );
        let config = load("actions:\n  max-pending: 5\n  max-pending-kib: 2\n").unwrap();
        assert_eq!(config.action_limits.max_count, 5);
        assert_eq!(config.action_limits.max_bytes, 2048);
        let err = load("actions:\n  max-pending: 0\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("actions.max-pending: must be above 0"),
            "{err}"
        );
    }

    #[test]
    fn an_election_key_file_is_read_relative_to_the_settings_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        let load = |key_file: &str| {
            std::fs::write(&file, format!("election:\n  key-file: {key_file}\n")).unwrap();
            Config::load(&settings_args(&file))
        };
        std::fs::write(tmp.path().join("good.key"), "  sixteen bytes or more\n").unwrap();
        std::fs::write(tmp.path().join("short.key"), "too short\n").unwrap();
        let config = load("good.key").unwrap();
        assert!(config.election_key.is_some());
        assert!(
            !format!("{config:?}").contains("sixteen"),
            "the key is never printed"
        );
        let err = load("short.key").unwrap_err().to_string();
        assert!(
            err.contains("election.key-file") && err.contains("short.key"),
            "{err}"
        );
        assert!(err.contains("9 bytes, at least 16"), "{err}");
        let err = load("missing.key").unwrap_err().to_string();
        assert!(err.contains("missing.key: cannot read"), "{err}");
        std::fs::write(&file, "port: 9000\n").unwrap();
        let config = Config::load(&settings_args(&file)).unwrap();
        assert!(config.election_key.is_none(), "no key unless configured");
    }

    #[test]
    fn default_frontend_is_built_in_or_a_dir_with_an_index() {
        let tmp = tempfile::tempdir().unwrap();
        let args = |name: Option<&str>| RunArgs {
            config_dir: Some(tmp.path().to_path_buf()),
            override_machine_id: Some("0123456789abcdef0123456789abcdef".into()),
            hostname: Some("alpha".into()),
            default_frontend: name.map(String::from),
            ..RunArgs::default()
        };
        assert_eq!(
            Config::load(&args(None)).unwrap().default_frontend,
            "common"
        );
        let err = Config::load(&args(Some("ops"))).unwrap_err().to_string();
        assert!(
            err.contains("default-frontend:") && err.contains("frontend/ops/index.html"),
            "{err}"
        );
        let err = Config::load(&args(Some("../ops"))).unwrap_err().to_string();
        assert!(err.contains("is not a frontend name"), "{err}");
        std::fs::create_dir_all(tmp.path().join("frontend/ops")).unwrap();
        std::fs::write(tmp.path().join("frontend/ops/index.html"), "<p>ops").unwrap();
        assert_eq!(
            Config::load(&args(Some("ops"))).unwrap().default_frontend,
            "ops"
        );
    }

    #[test]
    fn endless_key_token_and_settings_files_are_refused_not_read_into_memory() {
        for read in [
            |p: &Path| read_key(p).map(|_| ()),
            |p: &Path| read_settings(p).map(|_| ()),
        ] {
            let error = read(Path::new("/dev/zero")).unwrap_err();
            assert!(
                error.starts_with("/dev/zero: larger than") && error.contains("KiB"),
                "{error}"
            );
        }
        let tmp = tempfile::tempdir().unwrap();
        let big = tmp.path().join("token");
        std::fs::write(&big, vec![b'a'; 70 << 10]).unwrap();
        std::fs::set_permissions(&big, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let error = read_token(&big).unwrap_err();
        assert!(error.contains("larger than 64 KiB"), "{error}");
    }

    /// The packages of 0.14.0 kept the settings at the top of the config dir, where a deploy with
    /// `rsync --delete` deletes them: a missing `--settings` file falls back to that old place
    /// with a warning, and a settings file, token or key inside the config dir is warned about.
    #[test]
    fn settings_and_secrets_inside_the_config_dir_are_read_with_a_warning() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("config");
        let outside = tmp.path().join("verwalter.d");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let token = config.join("api-token");
        std::fs::write(&token, "op3rator-t0ken-0123\n").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(
            config.join("settings.yaml"),
            "port: 8400\nhttp:\n  token-file: api-token\n",
        )
        .unwrap();
        let load = |settings: &Path| {
            Config::load(&RunArgs {
                settings: Some(settings.to_path_buf()),
                config_dir: Some(config.clone()),
                override_machine_id: Some("0123456789abcdef0123456789abcdef".into()),
                hostname: Some("alpha".into()),
                ..RunArgs::default()
            })
            .unwrap()
        };
        // The new place is empty: the old file is read, its relative token beside it.
        let new_place = outside.join("settings.yaml");
        let loaded = load(&new_place);
        assert_eq!(loaded.port, 8400, "the old settings were read");
        assert!(
            loaded.http.token.is_some(),
            "the token beside the old settings"
        );
        let all = loaded.warnings.join("\n");
        assert!(
            all.contains(&format!("{} does not exist", new_place.display()))
                && all.contains(&format!("mv {}", config.join("settings.yaml").display())),
            "{all}"
        );
        assert!(
            all.contains("http.token-file") && all.contains("inside the config dir"),
            "{all}"
        );

        // Settings in the new place with the token beside them: no warning, the old file unread.
        let token_outside = outside.join("api-token");
        std::fs::rename(&token, &token_outside).unwrap();
        std::fs::write(&new_place, "http:\n  token-file: api-token\n").unwrap();
        let loaded = load(&new_place);
        assert_eq!(loaded.port, defaults::PORT, "the new file is the one read");
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);

        // Named inside the config dir (a unit of one's own): read, with a warning.
        std::fs::write(config.join("settings.yaml"), "port: 8400\n").unwrap();
        let loaded = load(&config.join("settings.yaml"));
        assert_eq!(loaded.port, 8400);
        assert!(
            loaded
                .warnings
                .iter()
                .any(|w| w.starts_with("the settings file") && w.contains("inside the config dir")),
            "{:?}",
            loaded.warnings
        );
    }

    #[test]
    fn a_token_file_is_read_relative_to_the_settings_and_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        let load = |http: &str| {
            std::fs::write(&file, format!("http:\n{http}")).unwrap();
            Config::load(&settings_args(&file))
        };
        let write = |name: &str, text: &str, mode: u32| {
            let path = tmp.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("good.token", "  op3rator-t0ken-0123\n", 0o600);
        write("short.token", "short\n", 0o600);
        write("open.token", "op3rator-t0ken-0123\n", 0o644);
        let config = load("  token-file: good.token\n").unwrap();
        let token = config.http.token.as_ref().expect("a token");
        assert!(token.matches(b"op3rator-t0ken-0123"));
        assert!(!config.http.token_for_reads, "reads stay open by default");
        assert!(
            !format!("{config:?}").contains("op3rator"),
            "the token is never printed"
        );
        let config = load("  token-file: good.token\n  token-for-reads: true\n").unwrap();
        assert!(config.http.token_for_reads);

        let err = load("  token-file: short.token\n").unwrap_err().to_string();
        assert!(
            err.contains("http.token-file") && err.contains("5 bytes, at least 16"),
            "{err}"
        );
        let err = load("  token-file: open.token\n").unwrap_err().to_string();
        assert!(
            err.contains("open.token") && err.contains("mode 644") && err.contains("chmod 600"),
            "{err}"
        );
        let err = load("  token-file: missing.token\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.token: cannot read"), "{err}");
        let err = load("  token-for-reads: true\n").unwrap_err().to_string();
        assert!(err.contains("needs http.token-file"), "{err}");
        let config = load("  max-connections: 10\n").unwrap();
        assert!(config.http.token.is_none(), "no token unless configured");
    }
}
