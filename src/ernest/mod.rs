//! The ernest-style graph executor over NATS: `verwalter graph`, or the daemon's `graph:`
//! settings. What it decides is in `verwalter_controllers::ernest`; this module connects to
//! NATS, forwards the subjects it listens to into the executor's loop, publishes what the loop
//! asks for ([`nats::NatsBus`]), keeps a snapshot and a journal per build ([`store::BuildFiles`]) and counts
//! ([`metrics::GraphMetrics`]).
//!
//! Subjects listened to: `build.create`, `build.delete`, `build.patch`, `build.import`,
//! `build.sync`, and answers `*.*.*.done` / `*.*.*.error` (a dispatch subject plus `.done` or
//! `.error`). ernest subscribed to `>` and took any subject ending so; these narrower subscriptions never match the executor's own
//! dispatches (`<type>.<action>.<provider>`, three tokens) or results (`build.<action>.done`,
//! three tokens), and the connection is opened with `no_echo` as well, so nothing it publishes
//! comes back to it. The build subjects are subscribed in a queue group, so executors on one
//! server share the builds; the answers reach every executor, and the one holding the build
//! takes them.

pub mod builds;
pub(crate) mod events;
pub(crate) mod metrics;
pub(crate) mod nats;
pub(crate) mod nats_options;
pub(crate) mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::ernest::executor_loop::ExecutorLoop;
use verwalter_controllers::ernest::{Executor, RunSettings, Templating};
use verwalter_controllers::graph::ErrorPolicy;
use verwalter_controllers::machinery::clock::SystemClock;

/// ernest's default NATS address.
pub(crate) const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// A component that has not answered after this long is errored: long enough for a cloud
/// instance to boot, short enough that a lost answer does not hold a build for hours.
pub(crate) const DEFAULT_COMPONENT_TIMEOUT: Duration = Duration::from_secs(300);
/// Messages waiting for the executor's loop at most; the subscription waits when it is full.
const INBOX: usize = 8192;

/// `verwalter graph`'s flags (or a `builds` subcommand).
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct GraphFlags {
    #[command(subcommand)]
    pub command: Option<builds::GraphSubcommand>,
    /// The NATS server to connect to
    #[arg(long, value_name = "URL", default_value = DEFAULT_NATS_URL)]
    pub(crate) nats_url: String,
    /// Where the builds are kept, one file each (made if missing)
    #[arg(long, value_name = "DIR", required = true)]
    pub(crate) storage_dir: Option<PathBuf>,
    /// A dispatched component that has not answered after this many seconds is errored
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_COMPONENT_TIMEOUT.as_secs_f64())]
    pub(crate) component_timeout: f64,
    /// What a failed component stops: `halt` (ernest: nothing new starts, what runs
    /// finishes) or `block-dependents` (only what depends on it)
    #[arg(long, value_name = "POLICY", default_value = "halt", value_parser = parse_policy)]
    pub(crate) error_policy: ErrorPolicy,
    /// How `$(path)` references in a dispatched change are filled: `ernest` (only a whole
    /// `$(path)` string, as text; what finds nothing stays) or `extended` (typed values,
    /// references inside longer strings, what finds nothing errors the component)
    #[arg(long, value_name = "MODE", default_value = "ernest", value_parser = Templating::parse)]
    pub(crate) templating: Templating,
    /// Serve the executor's Prometheus metrics at http://ADDR/metrics
    #[arg(long, value_name = "IP:PORT")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// Remove the files of finished builds (result published) this long after they finished:
    /// `90s`, `30m`, `12h`, `7d` [default: keep them]
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    pub(crate) retention: Option<Duration>,
    #[command(flatten)]
    pub(crate) nats: nats_options::NatsFlags,
}

/// `7d`, `12h`, `30m`, `90s`, `0s` (or seconds alone).
pub(crate) fn parse_age(text: &str) -> Result<Duration, String> {
    verwalter_controllers::ernest::build_retention::parse_age(text)
}

/// `halt` or `block-dependents`.
pub(crate) fn parse_policy(text: &str) -> Result<ErrorPolicy, String> {
    match text {
        "halt" => Ok(ErrorPolicy::Halt),
        "block-dependents" => Ok(ErrorPolicy::BlockDependents),
        other => Err(format!(
            "{other:?} is not an error policy (halt or block-dependents)"
        )),
    }
}

/// What the executor needs, from the flags or the daemon's settings. Its `Debug` shows the NATS
/// URL without its password ([`redact_url`]).
#[derive(Clone, PartialEq)]
pub(crate) struct GraphSettings {
    pub(crate) nats_url: String,
    pub(crate) storage_dir: PathBuf,
    pub(crate) component_timeout: Duration,
    pub(crate) policy: ErrorPolicy,
    /// TLS and credentials of the NATS connection beyond the URL's.
    pub(crate) nats_auth: nats_options::NatsAuth,
    /// Finished builds' files are removed this long after they finished (kept without).
    pub(crate) retention: Option<Duration>,
    pub(crate) templating: Templating,
}

impl std::fmt::Debug for GraphSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphSettings")
            .field("nats_url", &redact_url(&self.nats_url))
            .field("storage_dir", &self.storage_dir)
            .field("component_timeout", &self.component_timeout)
            .field("policy", &self.policy)
            .field("nats_auth", &self.nats_auth)
            .field("retention", &self.retention)
            .field("templating", &self.templating)
            .finish()
    }
}

/// The user info of a NATS URL (or of the first in a comma-separated list that has one):
/// `user:password` or a token alone, percent-decoded.
fn url_credentials(url: &str) -> Option<(Option<String>, String)> {
    url.split(',').find_map(|one| {
        let rest = one.find("://").map_or(one, |at| &one[at + 3..]);
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        let userinfo = &authority[..authority.rfind('@')?];
        Some(match userinfo.split_once(':') {
            Some((user, password)) => (Some(percent_decode(user)), percent_decode(password)),
            None => (None, percent_decode(userinfo)),
        })
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `options` with the credentials of `url` (`nats://user:password@host` or `nats://token@host`),
/// which async-nats itself does not read from the URL.
pub(crate) fn with_url_credentials(
    options: async_nats::ConnectOptions,
    url: &str,
) -> async_nats::ConnectOptions {
    match url_credentials(url) {
        Some((Some(user), password)) => options.user_and_password(user, password),
        Some((None, token)) => options.token(token),
        None => options,
    }
}

/// A NATS URL (or a comma-separated list of them) as it may be logged or shown: a password in
/// it replaced by `***` (`nats://user:***@host:4222`), and so is a token given alone
/// (`nats://***@host:4222`). The user name stays.
pub(crate) fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let (scheme, rest) = match one.find("://") {
                Some(at) => one.split_at(at + 3),
                None => ("", one),
            };
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(end);
            match authority.rfind('@') {
                Some(at) => {
                    let (userinfo, host) = authority.split_at(at);
                    let shown = match userinfo.split_once(':') {
                        Some((user, _)) => format!("{user}:***"),
                        None => "***".to_string(),
                    };
                    format!("{scheme}{shown}{host}{tail}")
                }
                None => one.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl GraphSettings {
    /// `prefix` names the NATS settings in errors: `--nats-` for the flags, `graph.nats-` for
    /// the settings file.
    pub(crate) fn from_flags(flags: &GraphFlags, prefix: &str) -> Result<GraphSettings, String> {
        let component_timeout = Duration::try_from_secs_f64(flags.component_timeout)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                format!(
                    "--component-timeout {}: a positive number of seconds",
                    flags.component_timeout
                )
            })?;
        let storage_dir = flags.storage_dir.clone().ok_or("--storage-dir is needed")?;
        Ok(GraphSettings {
            nats_auth: flags.nats.resolve(prefix, &flags.nats_url)?,
            nats_url: flags.nats_url.clone(),
            storage_dir,
            component_timeout,
            policy: flags.error_policy,
            retention: flags.retention,
            templating: flags.templating,
        })
    }
}

/// Why the executor could not start.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("graph executor: cannot use the storage dir {}: {source}", path.display())]
    Storage {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("graph executor: cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Starts the executor: its metrics on `registry`, its storage dir made. The returned task
/// connects to NATS (retrying until it can), resumes the stored builds and runs until
/// `shutdown`.
pub(crate) fn start(
    settings: &GraphSettings,
    registry: &Registry,
    shutdown: CancellationToken,
) -> Result<BoxFuture<'static, ()>, ExecutorError> {
    let files = store::BuildFiles::open(&settings.storage_dir).map_err(|source| {
        ExecutorError::Storage {
            path: settings.storage_dir.clone(),
            source,
        }
    })?;
    let metrics = Arc::new(metrics::GraphMetrics::register(registry));
    let settings = settings.clone();
    let files = Arc::new(files);
    Ok(Box::pin(async move {
        let sweeper = settings.retention.map(|retention| {
            tokio::spawn(builds::sweep(
                files.clone(),
                retention,
                Arc::new(SystemClock),
                shutdown.clone(),
            ))
        });
        let (tx, rx) = tokio::sync::mpsc::channel(INBOX);
        let Some(connection) = nats::connect(
            &settings.nats_url,
            &settings.nats_auth,
            tx,
            metrics.clone(),
            &shutdown,
        )
        .await
        else {
            return;
        };
        let executor = Executor::new(RunSettings {
            policy: settings.policy,
            component_timeout: settings.component_timeout,
            templating: settings.templating,
        });
        let looped = ExecutorLoop::new(
            executor,
            Arc::new(connection.bus),
            files,
            Arc::new(SystemClock),
            metrics,
        );
        tracing::info!(
            storage = %settings.storage_dir.display(),
            timeout_s = settings.component_timeout.as_secs_f64(),
            policy = ?settings.policy,
            retention_s = settings.retention.map(|r| r.as_secs_f64()),
            templating = ?settings.templating,
            "Graph executor running."
        );
        looped.run(rx, shutdown.clone()).await;
        connection.forwarder.abort();
        if let Some(sweeper) = sweeper {
            sweeper.abort();
        }
    }))
}

/// `verwalter graph`: runs until `shutdown`.
pub async fn run(flags: &GraphFlags, shutdown: CancellationToken) -> Result<(), String> {
    let settings = GraphSettings::from_flags(flags, "--nats-")?;
    let registry = Registry::new();
    let executor = start(&settings, &registry, shutdown.clone()).map_err(|e| e.to_string())?;
    let server = match flags.metrics_listen {
        Some(addr) => Some(
            metrics::serve(addr, registry, shutdown.clone())
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    // Both run until `shutdown`: the metrics are served while the executor works.
    let server = server.unwrap_or_else(|| Box::pin(async {}));
    futures::future::join(executor, server).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_and_tokens_in_nats_urls_are_hidden() {
        let cases = [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            (
                "nats://ann:s3cret@nats.example:4222",
                "nats://ann:***@nats.example:4222",
            ),
            (
                "tls://ann:p@ss:w@rd@host/path?q=1",
                "tls://ann:***@host/path?q=1",
            ),
            ("nats://t0ken@host", "nats://***@host"),
            ("ann:pw@host:4222", "ann:***@host:4222"),
            (
                "nats://a:x@h1:4222,nats://b:y@h2:4222",
                "nats://a:***@h1:4222,nats://b:***@h2:4222",
            ),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        let settings = GraphSettings {
            nats_url: "nats://ann:s3cret@host:4222".into(),
            storage_dir: "/g".into(),
            component_timeout: Duration::from_secs(1),
            policy: ErrorPolicy::Halt,
            nats_auth: nats_options::NatsAuth::none("--nats-"),
            retention: None,
            templating: Templating::Ernest,
        };
        let shown = format!("{settings:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("ann:***@host"),
            "{shown}"
        );
        assert_eq!(url_credentials("nats://127.0.0.1:4222"), None);
        assert_eq!(
            url_credentials("nats://h1,nats://ann:p%40ss@h2:4222/x"),
            Some((Some("ann".into()), "p@ss".into()))
        );
        assert_eq!(
            url_credentials("nats://t0k%zz@h"),
            Some((None, "t0k%zz".into()))
        );
        let events = events::EventSettings {
            nats_url: "nats://ann:s3cret@host:4222".into(),
            nats_auth: nats_options::NatsAuth::none("deployment-events.nats-"),
            prefix: "v".into(),
        };
        let shown = format!("{events:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("ann:***@host"),
            "{shown}"
        );
    }
}
