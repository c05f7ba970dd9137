//! Daemon settings: command-line flags over an optional YAML settings file over defaults.
//! Loading reports every problem at once. `parse.rs` reads the flags and the settings file as
//! given; `resolve.rs` applies the defaults and checks every value.

mod datacenters;
mod etcd;
mod parse;
mod resolve;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use verwalter_controllers::defaults;

use crate::schedule::lua::Limits;

pub(crate) use datacenters::DcSettings;
pub(crate) use etcd::Backend;
#[cfg(feature = "etcd")]
pub(crate) use etcd::EtcdSettings;
pub(crate) use parse::HttpFileSettings;
pub(crate) use parse::read_bounded;
#[cfg(test)]
use parse::read_settings;
pub use parse::{RunArgs, with_defaults};
#[cfg(test)]
use resolve::{read_key, read_token};
#[cfg(test)]
use verwalter_controllers::ernest::Templating;

/// Resolved daemon settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub config_dir: PathBuf,
    pub storage_dir: PathBuf,
    pub log_dir: PathBuf,
    pub(crate) hostname: String,
    pub(crate) name: String,
    pub host: IpAddr,
    pub port: u16,
    pub machine_id: String,
    pub(crate) dry_run: bool,
    pub(crate) scheduler_period: Duration,
    pub(crate) limits: Limits,
    pub(crate) debounce: Duration,
    pub command_timeout: Duration,
    /// Roles rendered and applied at once (`render.parallel`).
    pub(crate) render_parallel: usize,
    /// What a failing role holds back (`render.dependency-failure`).
    pub(crate) dependency_failure: verwalter_controllers::graph::ErrorPolicy,
    pub(crate) log_limits: crate::storage::logs::LogLimits,
    pub(crate) action_limits: verwalter_controllers::actions::ActionLimits,
    pub(crate) peer_source: PeerSource,
    pub(crate) allow_minority_cluster: bool,
    pub(crate) debug_force_leader: bool,
    /// `common` (the built-in frontend) or a dir under `<config-dir>/frontend/`.
    pub(crate) default_frontend: String,
    pub(crate) timings: verwalter_controllers::cluster::election::machine::Timings,
    pub(crate) prefetch: Duration,
    pub(crate) minority_window: Duration,
    /// `election.relay-fanout`.
    pub(crate) relay_fanout: usize,
    /// `election.key-file`'s key.
    /// The Kubernetes scheduler extender to serve, if the settings ask for it.
    pub(crate) placement_extender: Option<crate::placement::extender::ExtenderSetup>,
    /// The graph executor to run, if the settings ask for it.
    pub(crate) graph: Option<crate::ernest::GraphSettings>,
    /// Where to publish deployment events, if the settings ask for it.
    pub(crate) deployment_events: Option<crate::ernest::events::EventSettings>,
    pub(crate) election_key: Option<verwalter_controllers::cluster::election::wire::AuthKey>,
    /// `election.backend`: the built-in election or etcd (docs/etcd.md). Read only by a binary
    /// with the `etcd` feature: without it the settings refuse `etcd`.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) election_backend: Backend,
    /// This node's data center and the exchange's settings; `None`: in no DC.
    pub(crate) datacenter: Option<DcSettings>,
    pub http: crate::http::HttpSettings,
    /// What the operator should change, though the daemon can start: a settings file or a
    /// secret inside the config dir, the settings read from their old place. Logged at start.
    pub warnings: Vec<String>,
}

/// Where a node learns its peers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PeerSource {
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
        let raw = parse::parse(args, &mut problems, &mut warnings);
        resolve::resolve(raw, problems, warnings)
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
pub(crate) fn is_frontend_name(name: &str) -> bool {
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
        let docs = include_str!("../../docs/graphs.md");
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
