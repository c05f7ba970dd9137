//! `election.backend` and `election.etcd.*` (docs/etcd.md#settings): read as given, then
//! checked, each problem naming its field. The files named (TLS, the password) are read here,
//! at start, like the other secrets.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::parse::read_bounded;

/// The least lease TTL taken (etcd rounds a shorter one up anyway).
const MIN_TTL: Duration = Duration::from_secs(1);
/// The default lease TTL.
const DEFAULT_TTL: Duration = Duration::from_secs(2);
/// A PEM file or a password file above this is refused.
const FILE_LIMIT: u64 = 64 << 10;

/// `election.backend` as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BackendName {
    #[default]
    Builtin,
    Etcd,
}

/// `election.etcd` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct EtcdFileSettings {
    pub(crate) endpoints: Option<Vec<String>>,
    pub(crate) prefix: Option<String>,
    pub(crate) lease_ttl: Option<String>,
    pub(crate) fence_margin: Option<String>,
    pub(crate) tls: Option<EtcdTlsFile>,
    pub(crate) user: Option<String>,
    pub(crate) password_file: Option<PathBuf>,
}

/// `election.etcd.tls` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct EtcdTlsFile {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

/// Who elects the leader.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Backend {
    /// verwalter's own election over UDP (0.13's wire format).
    #[default]
    Builtin,
    Etcd(EtcdSettings),
}

/// The checked `election.etcd`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct EtcdSettings {
    /// `host:port` or `http(s)://host:port`, as written.
    pub(crate) endpoints: Vec<String>,
    /// Without a trailing `/`; keys are `<prefix>/leader` and `<prefix>/schedule`.
    pub(crate) prefix: String,
    pub(crate) lease_ttl: Duration,
    /// `None`: the machine's default (a fifth of the TTL, at least 100 ms).
    pub(crate) fence_margin: Option<Duration>,
    /// PEM bytes: a CA to check the members, a client certificate and its key.
    pub(crate) tls_ca: Option<Vec<u8>>,
    pub(crate) tls_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// etcd's own authentication: the user and the password read from its file.
    pub(crate) auth: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdSettings {
    /// Without the password and the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSettings")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("fence_margin", &self.fence_margin)
            .field(
                "tls",
                &(self.tls_ca.is_some() || self.tls_identity.is_some()),
            )
            .field("user", &self.auth.as_ref().map(|(user, _)| user))
            .finish()
    }
}

/// A duration as written in the settings: a number with `ms` or `s`, e.g. `2s`, `1.5s`, `300ms`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!("{text:?} is not a duration like 2s or 500ms"));
    };
    let valid = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    match number.parse::<f64>() {
        Ok(value) if valid && value.is_finite() && value * scale < 86_400.0 => {
            Ok(Duration::from_secs_f64(value * scale))
        }
        _ => Err(format!("{text:?} is not a duration like 2s or 500ms")),
    }
}

/// Checks `election.backend` and `election.etcd`; `clustered`: a peer source is configured.
/// Files are relative to `dir` (the settings file's).
pub(crate) fn resolve(
    backend: Option<BackendName>,
    file: Option<&EtcdFileSettings>,
    clustered: bool,
    dir: Option<&Path>,
    problems: &mut Vec<String>,
) -> Backend {
    if backend.unwrap_or_default() == BackendName::Builtin {
        return Backend::Builtin;
    }
    if !cfg!(feature = "etcd") {
        problems.push(
            "election.backend: etcd, but this binary was built without the `etcd` cargo feature \
             (cargo build --features etcd)"
                .into(),
        );
    }
    if !clustered {
        problems.push(
            "election.backend: etcd needs a peer source (cantal-url or peers): followers fetch \
             the schedule from the leader's address"
                .into(),
        );
    }
    let Some(file) = file else {
        problems.push("election.etcd: required with backend etcd (endpoints and prefix)".into());
        return Backend::Builtin;
    };
    let before = problems.len();
    let settings = check(file, dir, problems);
    if problems.len() > before {
        return Backend::Builtin;
    }
    Backend::Etcd(settings)
}

fn check(file: &EtcdFileSettings, dir: Option<&Path>, problems: &mut Vec<String>) -> EtcdSettings {
    let endpoints = file.endpoints.clone().unwrap_or_default();
    if endpoints.is_empty() {
        problems.push("election.etcd.endpoints: at least one endpoint is required".into());
    }
    for (i, endpoint) in endpoints.iter().enumerate() {
        if let Err(e) = check_endpoint(endpoint) {
            problems.push(format!("election.etcd.endpoints[{i}]: {e}"));
        }
    }
    let prefix = file.prefix.clone().unwrap_or_default();
    if !prefix.starts_with('/') || prefix.len() < 2 || prefix.ends_with('/') {
        problems.push(format!(
            "election.etcd.prefix: {prefix:?}: must start with / and name a cluster, e.g. \
             /verwalter/prod (no trailing /)"
        ));
    }
    let mut duration = |field: &str, value: &Option<String>| {
        value.as_deref().and_then(|v| {
            parse_duration(v)
                .map_err(|e| problems.push(format!("election.etcd.{field}: {e}")))
                .ok()
        })
    };
    let lease_ttl = duration("lease-ttl", &file.lease_ttl).unwrap_or(DEFAULT_TTL);
    let fence_margin = duration("fence-margin", &file.fence_margin);
    if lease_ttl < MIN_TTL {
        problems.push(format!(
            "election.etcd.lease-ttl: {lease_ttl:?} is under 1s (etcd's own minimum is 1.5s with \
             its default timings)"
        ));
    }
    if let Some(margin) = fence_margin.filter(|m| *m >= lease_ttl / 2) {
        problems.push(format!(
            "election.etcd.fence-margin: {margin:?} must be below half the lease TTL ({lease_ttl:?})"
        ));
    }
    let read = |field: &str, path: &Path, problems: &mut Vec<String>| {
        let path = match dir {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_path_buf(),
        };
        std::fs::File::open(&path)
            .map_err(|e| format!("{}: cannot open: {e}", path.display()))
            .and_then(|f| read_bounded(&path, f, FILE_LIMIT))
            .map_err(|e| problems.push(format!("election.etcd.{field}: {e}")))
            .ok()
    };
    let tls = file.tls.clone().unwrap_or_default();
    let tls_ca = tls.ca.as_ref().and_then(|p| read("tls.ca", p, problems));
    let tls_identity = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            read("tls.cert", cert, problems).zip(read("tls.key", key, problems))
        }
        (None, None) => None,
        _ => {
            problems.push("election.etcd.tls: cert and key go together".into());
            None
        }
    };
    let auth = match (&file.user, &file.password_file) {
        (Some(user), Some(path)) => read("password-file", path, problems).map(|bytes| {
            let password = String::from_utf8_lossy(bytes.trim_ascii()).into_owned();
            (user.clone(), password)
        }),
        (None, None) => None,
        _ => {
            problems.push("election.etcd.user: user and password-file go together".into());
            None
        }
    };
    EtcdSettings {
        endpoints,
        prefix,
        lease_ttl,
        fence_margin,
        tls_ca,
        tls_identity,
        auth,
    }
}

/// `host:port` or `http(s)://host:port`.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    let port = rest
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(_))) if !host.is_empty() && !host.contains('/') => Ok(()),
        _ => Err(format!(
            "{endpoint:?} is not host:port or https://host:port"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(yaml: &str) -> EtcdFileSettings {
        serde_norway::from_str(yaml).unwrap()
    }

    fn problems_of(yaml: &str) -> Vec<String> {
        let mut problems = Vec::new();
        resolve(
            Some(BackendName::Etcd),
            Some(&file(yaml)),
            true,
            None,
            &mut problems,
        );
        problems.retain(|p| !p.contains("cargo feature"));
        problems
    }

    #[test]
    fn durations_take_seconds_and_milliseconds() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        for bad in ["2", "s", "-1s", "2m", "1e3s", "nans"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_good_etcd_section_is_taken_with_its_defaults() {
        let mut problems = Vec::new();
        let backend = resolve(
            Some(BackendName::Etcd),
            Some(&file(
                "endpoints: [127.0.0.1:2379, 'https://e2:2379']\nprefix: /verwalter/a\n",
            )),
            true,
            None,
            &mut problems,
        );
        if cfg!(feature = "etcd") {
            assert_eq!(problems, Vec::<String>::new());
            let Backend::Etcd(settings) = backend else {
                panic!("not etcd: {backend:?}")
            };
            assert_eq!(settings.lease_ttl, DEFAULT_TTL);
            assert_eq!(settings.fence_margin, None);
            assert_eq!(settings.prefix, "/verwalter/a");
        } else {
            // Without the feature: a start error naming the setting and the feature.
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0].contains("election.backend")
                    && problems[0].contains("`etcd` cargo feature")
            );
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            ("prefix: /v\n", "election.etcd.endpoints"),
            (
                "endpoints: [e1]\nprefix: /v\n",
                "election.etcd.endpoints[0]",
            ),
            ("endpoints: [e1:2379]\n", "election.etcd.prefix"),
            (
                "endpoints: [e1:2379]\nprefix: v/x\n",
                "election.etcd.prefix",
            ),
            (
                "endpoints: [e1:2379]\nprefix: /v/\n",
                "election.etcd.prefix",
            ),
            (
                "endpoints: [e1:2379]\nprefix: /v\nlease-ttl: 500ms\n",
                "election.etcd.lease-ttl",
            ),
            (
                "endpoints: [e1:2379]\nprefix: /v\nlease-ttl: 2\n",
                "election.etcd.lease-ttl",
            ),
            (
                "endpoints: [e1:2379]\nprefix: /v\nfence-margin: 1s\n",
                "election.etcd.fence-margin",
            ),
            (
                "endpoints: [e1:2379]\nprefix: /v\nuser: root\n",
                "election.etcd.user",
            ),
            (
                "endpoints: [e1:2379]\nprefix: /v\ntls: {cert: c.pem}\n",
                "election.etcd.tls",
            ),
            (
                "endpoints: [e1:2379]\nprefix: /v\ntls: {ca: /nonexistent/ca.pem}\n",
                "election.etcd.tls.ca",
            ),
        ];
        for (yaml, field) in cases {
            let problems = problems_of(yaml);
            assert!(
                problems.iter().any(|p| p.starts_with(&format!("{field}:"))),
                "{yaml}: {problems:?}"
            );
        }
        assert_eq!(
            problems_of("endpoints: [e1:2379]\nprefix: /v\nfence-margin: 900ms\n"),
            Vec::<String>::new()
        );
        assert!(serde_norway::from_str::<EtcdFileSettings>("bogus: 1\n").is_err());
    }

    #[test]
    fn etcd_needs_a_section_and_a_peer_source() {
        let mut problems = Vec::new();
        resolve(Some(BackendName::Etcd), None, false, None, &mut problems);
        assert!(
            problems.iter().any(|p| p.starts_with("election.etcd:")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("needs a peer source")),
            "{problems:?}"
        );
        let mut problems = Vec::new();
        let backend = resolve(None, None, false, None, &mut problems);
        assert_eq!((backend, problems), (Backend::Builtin, Vec::new()));
    }
}
