//! Resolving: the flags over the settings file over the defaults, each value checked. Every
//! problem is collected (in the order of the sections below), so that loading reports them all
//! at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use verwalter_controllers::cluster::election::machine::Timings;
use verwalter_controllers::defaults;
use verwalter_controllers::ernest::Templating;

use super::parse::{Raw, RunArgs, SettingsFile, open, read_bounded};
use super::{BUILTIN_FRONTEND, Config, ConfigError, PeerSource, absolute, check_frontend};
use crate::machinery::identity::{self, parse_machine_id};
use crate::schedule::lua::Limits;

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

/// Times are added to clocks and to each other (a command's time limit plus its kill grace, a
/// backoff doubled): a value of many digits overflowed and panicked. No time needs more than 30
/// days.
const MAX_DAYS: u64 = 30;

/// The settings as `Raw` has them, and what resolving them found.
struct Resolver<'a> {
    args: &'a RunArgs,
    file: &'a SettingsFile,
    settings: Option<&'a Path>,
    problems: Vec<String>,
    warnings: Vec<String>,
}

/// The scheduler's limits as given or defaulted: memory in MiB, times in ms.
struct SchedulerLimits {
    memory_mib: u64,
    time_ms: u64,
    period_ms: u64,
}

/// The settings of `raw` resolved, or every problem found; `problems` and `warnings` hold what
/// parsing found already.
pub(super) fn resolve(
    raw: Raw<'_>,
    problems: Vec<String>,
    warnings: Vec<String>,
) -> Result<Config, ConfigError> {
    let Raw {
        args,
        file,
        settings,
    } = raw;
    let mut r = Resolver {
        args,
        file: &file,
        settings: settings.as_deref(),
        problems,
        warnings,
    };
    let (machine_id, hostname) = r.identity();
    let name = args
        .name
        .clone()
        .or(file.name.clone())
        .unwrap_or_else(|| hostname.clone());
    let port = args.port.or(file.port).unwrap_or(defaults::PORT);
    let sched = r.scheduler_limits();
    r.check_above_zero();
    r.check_times();
    r.check_sizes();
    let peer_source = r.peer_source(&machine_id);
    let (timings, election_key) = r.election();
    let election_backend = r.election_backend(peer_source != PeerSource::None);
    let config_dir = absolute(
        args.config_dir
            .clone()
            .or(file.config_dir.clone())
            .unwrap_or_else(|| defaults::CONFIG_DIR.into()),
    );
    let default_frontend = r.default_frontend(&config_dir);
    r.warn_secrets_inside(&config_dir);
    let http = r.http();
    let placement_extender = r.placement_extender();
    let storage_dir = absolute(
        args.storage_dir
            .clone()
            .or(file.storage_dir.clone())
            .unwrap_or_else(|| defaults::STORAGE_DIR.into()),
    );
    let graph = r.graph(&storage_dir);
    let deployment_events = r.deployment_events();
    let datacenter = super::datacenters::resolve(
        args.datacenter.as_deref().or(file.datacenter.as_deref()),
        file.election.key_file.is_some(),
        &file.datacenters,
        &file.peers,
        &mut r.problems,
        &mut r.warnings,
    );
    let Resolver {
        problems, warnings, ..
    } = r;
    if !problems.is_empty() {
        return Err(ConfigError { problems });
    }
    let el = &file.election;
    Ok(Config {
        datacenter,
        deployment_events,
        graph,
        placement_extender,
        http,
        config_dir,
        storage_dir,
        log_dir: absolute(
            args.log_dir
                .clone()
                .or(file.log_dir.clone())
                .unwrap_or_else(|| defaults::LOG_DIR.into()),
        ),
        hostname,
        name,
        host: args.host.or(file.host).unwrap_or(defaults::HOST),
        port,
        machine_id,
        dry_run: args.dry_run,
        scheduler_period: Duration::from_millis(sched.period_ms),
        limits: Limits {
            memory: (sched.memory_mib as usize) << 20,
            time: Duration::from_millis(sched.time_ms),
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
        log_limits: log_limits(&file),
        action_limits: action_limits(&file),
        peer_source,
        allow_minority_cluster: args.allow_minority_cluster
            || file.allow_minority_cluster.unwrap_or(false),
        debug_force_leader: args.debug_force_leader,
        default_frontend,
        timings,
        prefetch: millis_or(el.prefetch_ms, defaults::PREFETCH),
        minority_window: millis_or(el.minority_window_ms, defaults::MINORITY_WINDOW),
        relay_fanout: el
            .relay_fanout
            .map_or(verwalter_controllers::defaults::RELAY_FANOUT, |n| {
                n.min(usize::MAX as u64) as usize
            }),
        election_key,
        election_backend,
        warnings,
    })
}

/// `value` ms, else `default`.
fn millis_or(value: Option<u64>, default: Duration) -> Duration {
    value.map_or(default, Duration::from_millis)
}

fn log_limits(file: &SettingsFile) -> crate::storage::logs::LogLimits {
    crate::storage::logs::LogLimits {
        segment_size: file.logs.segment_mib.unwrap_or(defaults::LOG_SEGMENT_MIB) << 20,
        max_age: Duration::from_secs(
            file.logs.max_age_days.unwrap_or(defaults::LOG_MAX_AGE_DAYS) * 86_400,
        ),
        max_total: file
            .logs
            .max_total_mib
            .unwrap_or(defaults::LOG_MAX_TOTAL_MIB)
            << 20,
    }
}

fn action_limits(file: &SettingsFile) -> verwalter_controllers::actions::ActionLimits {
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
}

impl Resolver<'_> {
    /// `path` of a settings key, relative to the settings file's dir unless absolute.
    fn relative(&self, path: &Path) -> PathBuf {
        relative_to_settings(self.settings, path)
    }

    /// The machine id and the host name.
    fn identity(&mut self) -> (String, String) {
        let (args, file) = (self.args, self.file);
        let machine_id = identity::machine_id(
            args.override_machine_id.as_deref(),
            file.machine_id.as_deref(),
        )
        .unwrap_or_else(|problem| {
            self.problems.push(problem);
            String::new()
        });
        let hostname = identity::hostname(args.hostname.as_deref(), file.hostname.as_deref())
            .unwrap_or_else(|problem| {
                self.problems.push(problem);
                String::new()
            });
        (machine_id, hostname)
    }

    fn scheduler_limits(&mut self) -> SchedulerLimits {
        let sched = &self.file.scheduler;
        let memory_mib = sched
            .memory_limit_mib
            .unwrap_or(defaults::SCHEDULER_MEMORY_MIB);
        if memory_mib < 4 {
            self.problems.push(format!(
                "scheduler.memory-limit-mib: {memory_mib} is too small (at least 4)"
            ));
        }
        let time_ms = sched
            .time_limit_ms
            .unwrap_or(defaults::SCHEDULER_TIME_LIMIT.as_millis() as u64);
        if time_ms == 0 {
            self.problems
                .push("scheduler.time-limit-ms: must be above 0".into());
        }
        let period_ms = sched
            .period_ms
            .unwrap_or(defaults::SCHEDULER_PERIOD.as_millis() as u64);
        if period_ms < 100 {
            self.problems.push(format!(
                "scheduler.period-ms: {period_ms} is too short (at least 100)"
            ));
        }
        SchedulerLimits {
            memory_mib,
            time_ms,
            period_ms,
        }
    }

    /// Counts and sizes that must be above 0.
    fn check_above_zero(&mut self) {
        let file = self.file;
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
                self.problems.push(format!("{name}: must be above 0"));
            }
        }
    }

    /// Every time at most [`MAX_DAYS`].
    fn check_times(&mut self) {
        let file = self.file;
        let sched = &file.scheduler;
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
                self.problems.push(format!(
                    "{name}: {value} is too long (at most {}, {MAX_DAYS} days)",
                    max_ms / unit_ms
                ));
            }
        }
    }

    /// Sizes and ages become bytes and seconds: they must fit in 64 bits then (a value of many
    /// digits would panic, or wrap to a tiny limit; found by fuzzing).
    fn check_sizes(&mut self) {
        let file = self.file;
        for (name, value, unit) in [
            (
                "scheduler.memory-limit-mib",
                file.scheduler.memory_limit_mib,
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
                self.problems.push(format!(
                    "{name}: {value} is too large (at most {})",
                    u64::MAX / unit
                ));
            }
        }
    }

    /// cantal, a static peer list (without this node), or neither.
    fn peer_source(&mut self, machine_id: &str) -> PeerSource {
        let file = self.file;
        let cantal = self.args.cantal_url.clone().or(file.cantal_url.clone());
        match (cantal, file.peers.is_empty()) {
            (Some(_), false) => {
                self.problems
                    .push("give either cantal-url or peers, not both".into());
                PeerSource::None
            }
            (Some(url), true) => {
                if !url.starts_with("http://") {
                    self.problems
                        .push(format!("cantal-url: {url:?} must start with http://"));
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
                        Err(e) => self.problems.push(format!("peers[{i}].id: {e}")),
                    }
                }
                PeerSource::Static(peers)
            }
            (None, true) => PeerSource::None,
        }
    }

    /// `election.backend` and `election.etcd` (docs/etcd.md#settings); `clustered`: a peer
    /// source is configured.
    fn election_backend(&mut self, clustered: bool) -> super::Backend {
        let el = &self.file.election;
        let dir = self.settings.and_then(Path::parent);
        super::etcd::resolve(
            el.backend,
            el.etcd.as_ref(),
            clustered,
            dir,
            &mut self.problems,
        )
    }

    /// The election's timings, checked against each other, and its key.
    fn election(
        &mut self,
    ) -> (
        Timings,
        Option<verwalter_controllers::cluster::election::wire::AuthKey>,
    ) {
        let el = &self.file.election;
        let settings = self.settings;
        let defaults = Timings::default();
        let timings = Timings {
            start_timeout: millis_or(el.start_timeout_ms, defaults.start_timeout),
            message_timeout_min: millis_or(el.leader_timeout_min_ms, defaults.message_timeout_min),
            message_timeout_max: millis_or(el.leader_timeout_max_ms, defaults.message_timeout_max),
            heartbeat: millis_or(el.heartbeat_ms, defaults.heartbeat),
        };
        let election_key = el.key_file.as_ref().and_then(|path| {
            read_key(&relative_to_settings(settings, path))
                .map_err(|problem| self.problems.push(format!("election.key-file: {problem}")))
                .ok()
        });
        if el.minority_window_ms == Some(0) {
            self.problems
                .push("election.minority-window-ms: must be above 0".into());
        }
        if timings.heartbeat.is_zero() {
            self.problems
                .push("election.heartbeat-ms: must be above 0".into());
        }
        if timings.message_timeout_min > timings.message_timeout_max {
            self.problems.push(
                "election.leader-timeout-min-ms: must not be above leader-timeout-max-ms".into(),
            );
        }
        if timings.message_timeout_min < timings.heartbeat * 2 {
            self.problems.push(format!(
                "election.leader-timeout-min-ms: {} ms is under two heartbeats ({} ms): followers \
                 would start elections while the leader is fine",
                timings.message_timeout_min.as_millis(),
                (timings.heartbeat * 2).as_millis()
            ));
        }
        (timings, election_key)
    }

    fn default_frontend(&mut self, config_dir: &Path) -> String {
        let default_frontend = self
            .args
            .default_frontend
            .clone()
            .or(self.file.default_frontend.clone())
            .unwrap_or_else(|| BUILTIN_FRONTEND.into());
        if let Err(problem) = check_frontend(config_dir, &default_frontend) {
            self.problems.push(format!("default-frontend: {problem}"));
        }
        default_frontend
    }

    /// The daemon's own settings and secrets do not belong in the config dir, which sites deploy
    /// by replacing it (docs/packaging.md#configure).
    fn warn_secrets_inside(&mut self, config_dir: &Path) {
        let file = self.file;
        let secrets = [
            ("the settings file", self.settings.map(Path::to_path_buf)),
            (
                "http.token-file",
                file.http.token_file.as_ref().map(|p| self.relative(p)),
            ),
            (
                "election.key-file",
                file.election.key_file.as_ref().map(|p| self.relative(p)),
            ),
        ];
        for (what, path) in secrets {
            if let Some(path) = path.filter(|p| absolute(p.clone()).starts_with(config_dir)) {
                self.warnings.push(format!(
                    "{what} {} is inside the config dir {}: a deploy that replaces the config \
                     dir (rsync --delete, a checkout) deletes it. Keep it outside, e.g. in {}/",
                    path.display(),
                    config_dir.display(),
                    defaults::SETTINGS_DIR,
                ));
            }
        }
    }

    /// The HTTP server's limits and token.
    fn http(&mut self) -> crate::http::HttpSettings {
        let (file, settings) = (self.file, self.settings);
        let mut http =
            crate::http::HttpSettings::from_file(&file.http).unwrap_or_else(|mut found| {
                self.problems.append(&mut found);
                crate::http::HttpSettings::default()
            });
        http.token = file.http.token_file.as_ref().and_then(|path| {
            read_token(&relative_to_settings(settings, path))
                .map_err(|problem| self.problems.push(format!("http.token-file: {problem}")))
                .ok()
        });
        if http.token_for_reads && file.http.token_file.is_none() {
            self.problems
                .push("http.token-for-reads: needs http.token-file (the token to ask for)".into());
        }
        http
    }

    /// `placement-extender:`, when given.
    fn placement_extender(&mut self) -> Option<crate::placement::extender::ExtenderSetup> {
        use crate::placement::extender;
        let (file, settings) = (self.file, self.settings);
        let e = file.placement_extender.as_ref()?;
        let path = |p: &PathBuf| relative_to_settings(settings, p);
        if e.tls_cert.is_some() != e.tls_key.is_some() {
            self.problems
                .push("placement-extender: tls-cert and tls-key go together".into());
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
        if let Err(problem) = extender::ExtenderLimits::from_flags(&flags, "placement-extender.") {
            self.problems.push(problem);
            return None;
        }
        extender::ExtenderSetup::from_flags(&flags)
            .map_err(|problem| {
                self.problems
                    .push(format!("placement-extender.config: {problem}"))
            })
            .ok()
    }

    /// `graph:`, when given; its storage dir defaults to `<storage-dir>/graph`.
    fn graph(&mut self, storage_dir: &Path) -> Option<crate::ernest::GraphSettings> {
        let (file, settings) = (self.file, self.settings);
        let g = file.graph.as_ref()?;
        let flags = crate::ernest::GraphFlags {
            nats_url: g
                .nats_url
                .clone()
                .unwrap_or_else(|| crate::ernest::DEFAULT_NATS_URL.into()),
            command: None,
            storage_dir: Some(g.storage_dir.as_ref().map_or_else(
                || storage_dir.join("graph"),
                |p| relative_to_settings(settings, p),
            )),
            component_timeout: g
                .component_timeout
                .unwrap_or(crate::ernest::DEFAULT_COMPONENT_TIMEOUT.as_secs_f64()),
            error_policy: match g.error_policy.as_deref().map(crate::ernest::parse_policy) {
                None => verwalter_controllers::graph::ErrorPolicy::Halt,
                Some(Ok(policy)) => policy,
                Some(Err(problem)) => {
                    self.problems.push(format!("graph.error-policy: {problem}"));
                    verwalter_controllers::graph::ErrorPolicy::Halt
                }
            },
            templating: match g.templating.as_deref().map(Templating::parse) {
                None => Templating::Ernest,
                Some(Ok(mode)) => mode,
                Some(Err(problem)) => {
                    self.problems.push(format!("graph.templating: {problem}"));
                    Templating::Ernest
                }
            },
            metrics_listen: None,
            retention: match g.retention.as_deref().map(crate::ernest::parse_age) {
                None => None,
                Some(Ok(age)) => Some(age),
                Some(Err(problem)) => {
                    self.problems.push(format!("graph.retention: {problem}"));
                    None
                }
            },
            nats: nats_flags!(g, settings),
        };
        crate::ernest::GraphSettings::from_flags(&flags, "graph.nats-")
            .map_err(|problem| {
                self.problems
                    .push(match problem.strip_prefix("--component-timeout ") {
                        Some(rest) => format!("graph.component-timeout: {rest}"),
                        None => problem,
                    })
            })
            .ok()
    }

    /// `deployment-events:`, when given.
    fn deployment_events(&mut self) -> Option<crate::ernest::events::EventSettings> {
        let (file, settings) = (self.file, self.settings);
        let e = file.deployment_events.as_ref()?;
        let prefix = e.prefix.clone().unwrap_or_else(|| "verwalter".into());
        let token_ok = !prefix.is_empty()
            && prefix
                .split('.')
                .all(|t| !t.is_empty() && !t.contains(['*', '>', ' ']));
        if !token_ok {
            self.problems.push(format!(
                "deployment-events.prefix: {prefix:?} is not a NATS subject prefix"
            ));
            return None;
        }
        let nats_url = e
            .nats_url
            .clone()
            .unwrap_or_else(|| crate::ernest::DEFAULT_NATS_URL.into());
        let nats_auth = nats_flags!(e, settings)
            .resolve("deployment-events.nats-", &nats_url)
            .map_err(|problem| self.problems.push(problem))
            .ok()?;
        Some(crate::ernest::events::EventSettings {
            nats_url,
            nats_auth,
            prefix,
        })
    }
}

/// The most a key or token file may hold: they hold one line.
const SECRET_FILE_LIMIT: u64 = 64 << 10;

pub(super) fn read_key(
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
pub(super) fn read_token(
    path: &Path,
) -> Result<verwalter_controllers::http::access::Token, String> {
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
