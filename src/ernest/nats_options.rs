//! How a NATS connection is secured and authenticated, for the graph executor (`verwalter graph`'s
//! `--nats-*` flags, `graph.nats-*` settings) and the deployment events
//! (`deployment-events.nats-*`): TLS (`tls://` URLs, a CA file, a client certificate and key),
//! a user and password, a token, an NKey seed or a `.creds` file, as async-nats offers them.
//!
//! Secrets are read from files (never needed on the command line), once, when the settings are
//! read: a missing or unreadable file, a seed that is not one, or two ways of authenticating at
//! once are settings errors naming the setting. A connection error names the settings to check
//! ([`NatsAuth::hint`]), and no secret is ever in a log line or in a `Debug` form.

use std::path::{Path, PathBuf};

/// The `--nats-*` flags (and the `nats-*` keys of the settings file's `graph:` and
/// `deployment-events:` sections, which have the same names).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct NatsFlags {
    /// PEM file with the CA certificate(s) that signed the NATS server's certificate, used
    /// instead of the system's roots; implies TLS
    #[arg(long = "nats-tls-ca", value_name = "FILE")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// PEM file with a client certificate (chain) for servers that verify clients; implies TLS
    #[arg(long = "nats-tls-cert", value_name = "FILE", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM file with the client certificate's private key
    #[arg(long = "nats-tls-key", value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The NATS user, with --nats-password-file
    #[arg(long = "nats-user", value_name = "NAME")]
    pub(crate) user: Option<String>,
    /// File holding the NATS user's password
    #[arg(long = "nats-password-file", value_name = "FILE")]
    pub(crate) password_file: Option<PathBuf>,
    /// File holding a NATS token
    #[arg(long = "nats-token-file", value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,
    /// File holding an NKey user seed (`SU...`)
    #[arg(long = "nats-nkey-file", value_name = "FILE")]
    pub(crate) nkey_file: Option<PathBuf>,
    /// A NATS `.creds` file (a user JWT and its NKey seed)
    #[arg(long = "nats-creds-file", value_name = "FILE")]
    pub(crate) creds_file: Option<PathBuf>,
}

/// How the client proves who it is, with the secret read from its file.
#[derive(Clone, PartialEq, Default)]
enum Credentials {
    /// None beyond what the URL holds.
    #[default]
    Url,
    UserPassword {
        user: String,
        password: String,
    },
    Token(String),
    NKey(String),
    Creds(String),
}

/// [`NatsFlags`] checked, with the secrets read. Its `Debug` shows which settings are in use,
/// never a secret.
#[derive(Clone, PartialEq, Default)]
pub(crate) struct NatsAuth {
    tls_ca: Option<PathBuf>,
    tls_client: Option<(PathBuf, PathBuf)>,
    credentials: Credentials,
    /// How the settings are named where they were given: `--nats-` (flags), `graph.nats-`.
    prefix: String,
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credentials = match &self.credentials {
            Credentials::Url => "url".to_string(),
            Credentials::UserPassword { user, .. } => format!("user {user} with a password"),
            Credentials::Token(_) => "token".into(),
            Credentials::NKey(_) => "nkey".into(),
            Credentials::Creds(_) => "creds".into(),
        };
        f.debug_struct("NatsAuth")
            .field("tls_ca", &self.tls_ca)
            .field("tls_client", &self.tls_client)
            .field("credentials", &credentials)
            .finish()
    }
}

/// Whether `error` is, or was caused by, a TLS failure (a certificate not trusted, a handshake
/// refused): async-nats reports one seen during the handshake as an I/O error.
fn is_tls(error: &async_nats::ConnectError) -> bool {
    if error.kind() == async_nats::ConnectErrorKind::Tls {
        return true;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(e) = cause {
        if e.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The most a secret file (a password, token, seed, `.creds`) may hold.
const SECRET_LIMIT: u64 = 64 << 10;
/// The most a PEM file (a CA bundle, a certificate chain, a key) may hold.
const PEM_LIMIT: u64 = 1 << 20;

/// At most `limit` bytes of `path`: more is an error, so that a path to `/dev/zero` or to a huge
/// file is refused instead of filling the memory.
fn read_bounded(path: &Path, name: &str, limit: u64) -> Result<Vec<u8>, String> {
    std::fs::File::open(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))
        .and_then(|file| crate::config::read_bounded(path, file, limit))
        .map_err(|e| format!("{name} {e}"))
}

/// A secret file's text without the line end(s) an editor leaves; empty is an error.
fn read_secret(path: &Path, name: &str) -> Result<String, String> {
    let bytes = read_bounded(path, name, SECRET_LIMIT)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{name} {}: not UTF-8 text", path.display()))?;
    let text = text.trim_end_matches(['\r', '\n']).to_string();
    if text.is_empty() {
        return Err(format!("{name} {}: the file is empty", path.display()));
    }
    Ok(text)
}

/// The PEM certificates of `path`, at least one.
fn check_certificates(path: &Path, name: &str) -> Result<(), String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let bytes = read_bounded(path, name, PEM_LIMIT)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{name} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{name} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(())
}

impl NatsFlags {
    /// Checks the flags and reads the secrets. `prefix` names the settings in errors and hints
    /// (`--nats-` for flags, `graph.nats-` for the settings file); `url` is the server URL,
    /// which may hold a user and password or a token itself.
    pub(crate) fn resolve(&self, prefix: &str, url: &str) -> Result<NatsAuth, String> {
        let name = |key: &str| format!("{prefix}{key}");
        let tls_client = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                use rustls::pki_types::pem::PemObject;
                check_certificates(cert, &name("tls-cert"))?;
                rustls::pki_types::PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("{} {}: {e}", name("tls-key"), key.display()))?;
                Some((cert.clone(), key.clone()))
            }
            (None, None) => None,
            _ => {
                return Err(format!(
                    "{} and {} go together",
                    name("tls-cert"),
                    name("tls-key")
                ));
            }
        };
        if let Some(ca) = &self.tls_ca {
            check_certificates(ca, &name("tls-ca"))?;
        }
        let mut given = Vec::new();
        if super::url_credentials(url).is_some() {
            given.push(format!("a user or token in {}", name("url")));
        }
        let mut credentials = Credentials::Url;
        match (&self.user, &self.password_file) {
            (Some(user), Some(file)) => {
                given.push(format!("{} and {}", name("user"), name("password-file")));
                credentials = Credentials::UserPassword {
                    user: user.clone(),
                    password: read_secret(file, &name("password-file"))?,
                };
            }
            (None, None) => {}
            _ => {
                return Err(format!(
                    "{} and {} go together",
                    name("user"),
                    name("password-file")
                ));
            }
        }
        if let Some(file) = &self.token_file {
            given.push(name("token-file"));
            credentials = Credentials::Token(read_secret(file, &name("token-file"))?);
        }
        if let Some(file) = &self.nkey_file {
            given.push(name("nkey-file"));
            let seed = read_secret(file, &name("nkey-file"))?;
            let seed = seed.trim().to_string();
            if let Err(e) = nkeys::KeyPair::from_seed(&seed) {
                return Err(format!(
                    "{} {}: not an NKey seed: {e}",
                    name("nkey-file"),
                    file.display()
                ));
            }
            credentials = Credentials::NKey(seed);
        }
        if let Some(file) = &self.creds_file {
            given.push(name("creds-file"));
            // Whole: the decorated blocks end with a line end each.
            let text = read_secret(file, &name("creds-file"))? + "\n";
            if let Err(e) = async_nats::ConnectOptions::new().credentials(&text) {
                return Err(format!(
                    "{} {}: not a NATS credentials file: {e}",
                    name("creds-file"),
                    file.display()
                ));
            }
            credentials = Credentials::Creds(text);
        }
        if given.len() > 1 {
            return Err(format!(
                "give one way to authenticate to NATS, not {}",
                given.join(", ")
            ));
        }
        Ok(NatsAuth {
            tls_ca: self.tls_ca.clone(),
            tls_client,
            credentials,
            prefix: prefix.to_string(),
        })
    }
}

impl NatsAuth {
    /// No TLS settings and no credentials besides those of the URL, named as flags.
    #[cfg(test)]
    pub(crate) fn none(prefix: &str) -> NatsAuth {
        NatsAuth {
            prefix: prefix.to_string(),
            ..NatsAuth::default()
        }
    }

    /// Connect options for `url` with these settings (and the URL's own credentials).
    pub(crate) fn options(&self, url: &str) -> async_nats::ConnectOptions {
        let mut options = super::with_url_credentials(async_nats::ConnectOptions::new(), url);
        match &self.credentials {
            Credentials::Url => {}
            Credentials::UserPassword { user, password } => {
                options = options.user_and_password(user.clone(), password.clone())
            }
            Credentials::Token(token) => options = options.token(token.clone()),
            Credentials::NKey(seed) => options = options.nkey(seed.clone()),
            Credentials::Creds(text) => {
                // Checked when the settings were read.
                options = match options.credentials(text) {
                    Ok(options) => options,
                    Err(_) => async_nats::ConnectOptions::new(),
                }
            }
        }
        if let Some(ca) = &self.tls_ca {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let Some((cert, key)) = &self.tls_client {
            options = options
                .add_client_certificate(cert.clone(), key.clone())
                .require_tls(true);
        }
        options
    }

    /// What to check after `error`, naming the settings in use.
    pub(crate) fn hint(&self, error: &async_nats::ConnectError) -> String {
        use async_nats::ConnectErrorKind as Kind;
        let name = |key: &str| format!("{}{key}", self.prefix);
        match error.kind() {
            Kind::Tls | Kind::Io if is_tls(error) => {
                let mut settings = vec![match &self.tls_ca {
                    Some(ca) => format!("{} ({})", name("tls-ca"), ca.display()),
                    None => format!(
                        "{} (the system's roots are used without it)",
                        name("tls-ca")
                    ),
                }];
                if let Some((cert, key)) = &self.tls_client {
                    settings.push(format!("{} ({})", name("tls-cert"), cert.display()));
                    settings.push(format!("{} ({})", name("tls-key"), key.display()));
                }
                format!(
                    "the TLS connection failed: check {} and that the server speaks TLS",
                    settings.join(", ")
                )
            }
            Kind::AuthorizationViolation | Kind::Authentication => {
                let what = match &self.credentials {
                    Credentials::Url => format!(
                        "the user and password (or token) in {}, or give credentials with {}, {}, {} or {}",
                        name("url"),
                        name("user"),
                        name("token-file"),
                        name("nkey-file"),
                        name("creds-file")
                    ),
                    Credentials::UserPassword { .. } => {
                        format!("{} and {}", name("user"), name("password-file"))
                    }
                    Credentials::Token(_) => name("token-file"),
                    Credentials::NKey(_) => name("nkey-file"),
                    Credentials::Creds(_) => name("creds-file"),
                };
                format!("the server refused the credentials: check {what}")
            }
            _ => format!("check {} and that the server runs", name("url")),
        }
    }

    /// `text` (an error's message) with any secret of these settings or of `url` replaced by
    /// `***`, in case a library put one in it.
    pub(crate) fn scrub(&self, url: &str, text: &str) -> String {
        let mut secrets: Vec<String> = Vec::new();
        if let Some((_, secret)) = super::url_credentials(url) {
            secrets.push(secret);
        }
        match &self.credentials {
            Credentials::UserPassword { password, .. } => secrets.push(password.clone()),
            Credentials::Token(secret) | Credentials::NKey(secret) => secrets.push(secret.clone()),
            Credentials::Creds(_) | Credentials::Url => {}
        }
        let mut text = text.replace(url, &super::redact_url(url));
        for secret in secrets.iter().filter(|s| s.len() >= 3) {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn settings_are_checked_and_errors_name_them() {
        let tmp = tempfile::tempdir().unwrap();
        let url = "nats://127.0.0.1:4222";
        let password = write(tmp.path(), "pw", "s3cret\n");
        let flags = NatsFlags {
            user: Some("ann".into()),
            password_file: Some(password.clone()),
            ..NatsFlags::default()
        };
        let auth = flags.resolve("graph.nats-", url).unwrap();
        assert!(
            auth.credentials
                == Credentials::UserPassword {
                    user: "ann".into(),
                    password: "s3cret".into()
                }
        );
        let shown = format!("{auth:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(
            auth.scrub(url, "refused s3cret at nats://127.0.0.1:4222"),
            "refused *** at nats://127.0.0.1:4222"
        );

        let err = |flags: NatsFlags, url: &str| flags.resolve("graph.nats-", url).unwrap_err();
        let only_user = NatsFlags {
            user: Some("ann".into()),
            ..NatsFlags::default()
        };
        assert_eq!(
            err(only_user, url),
            "graph.nats-user and graph.nats-password-file go together"
        );
        let missing = NatsFlags {
            token_file: Some(tmp.path().join("nope")),
            ..NatsFlags::default()
        };
        let e = err(missing, url);
        assert!(e.starts_with("graph.nats-token-file "), "{e}");
        assert!(e.contains("cannot read"), "{e}");
        let empty = NatsFlags {
            token_file: Some(write(tmp.path(), "empty", "\n")),
            ..NatsFlags::default()
        };
        assert!(err(empty, url).contains("the file is empty"));
        let two = NatsFlags {
            token_file: Some(password.clone()),
            ..NatsFlags::default()
        };
        assert_eq!(
            err(two, "nats://ann:pw@host"),
            "give one way to authenticate to NATS, not a user or token in graph.nats-url, \
             graph.nats-token-file"
        );
        let bad_seed = NatsFlags {
            nkey_file: Some(password.clone()),
            ..NatsFlags::default()
        };
        let e = err(bad_seed, url);
        assert!(
            e.starts_with("graph.nats-nkey-file ") && e.contains("not an NKey seed"),
            "{e}"
        );
        let bad_creds = NatsFlags {
            creds_file: Some(password.clone()),
            ..NatsFlags::default()
        };
        let e = err(bad_creds, url);
        assert!(e.contains("not a NATS credentials file"), "{e}");
        let endless = NatsFlags {
            tls_ca: Some("/dev/zero".into()),
            ..NatsFlags::default()
        };
        assert_eq!(
            err(endless, url),
            "graph.nats-tls-ca /dev/zero: larger than 1024 KiB, which is not what this file \
             should hold"
        );
        let endless = NatsFlags {
            token_file: Some("/dev/zero".into()),
            ..NatsFlags::default()
        };
        assert!(err(endless, url).contains("larger than 64 KiB"));
        let bad_ca = NatsFlags {
            tls_ca: Some(password.clone()),
            ..NatsFlags::default()
        };
        let e = err(bad_ca, url);
        assert!(
            e.starts_with("graph.nats-tls-ca ") && e.contains("no PEM certificate"),
            "{e}"
        );
        let half = NatsFlags {
            tls_key: Some(password),
            ..NatsFlags::default()
        };
        assert_eq!(
            err(half, url),
            "graph.nats-tls-cert and graph.nats-tls-key go together"
        );
        let seed = nkeys::KeyPair::new_user().seed().unwrap();
        let nkey = NatsFlags {
            nkey_file: Some(write(tmp.path(), "seed", &format!("{seed}\n"))),
            ..NatsFlags::default()
        };
        let auth = nkey.resolve("--nats-", url).unwrap();
        assert!(auth.credentials == Credentials::NKey(seed.clone()));
        assert!(!format!("{auth:?}").contains(&seed));
    }
}

#[cfg(test)]
mod docs_example {
    use crate::config::{Config, tests::settings_args};

    /// docs/graphs.md's settings example under "Production NATS", read as written (with the
    /// files it names made beside it): both connections get their TLS CA and credentials.
    #[test]
    fn the_documented_settings_are_read_as_written() {
        let docs = include_str!("../../docs/graphs.md");
        let section = &docs[docs.find("### Production NATS").unwrap()..];
        let start = section.find("```yaml\n").unwrap() + "```yaml\n".len();
        let example = &section[start..start + section[start..].find("```").unwrap()];
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        std::fs::write(&file, example).unwrap();
        let load = || Config::load(&settings_args(&file));
        // The files it names are missing: the first one is named with its key.
        let err = load().unwrap_err().to_string();
        assert!(err.contains("graph.nats-tls-ca "), "{err}");
        assert!(err.contains("nats-ca.pem: cannot read"), "{err}");

        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        std::fs::write(tmp.path().join("nats-ca.pem"), ca.pem()).unwrap();
        std::fs::write(tmp.path().join("nats-password"), "pa55word\n").unwrap();
        let seed = nkeys::KeyPair::new_user().seed().unwrap();
        let creds = format!(
            "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QifQ.e30.c2ln\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        );
        std::fs::write(tmp.path().join("events.creds"), creds).unwrap();
        let config = load().unwrap();
        let graph = config.graph.expect("graph settings");
        assert_eq!(graph.nats_url, "tls://nats.example:4222");
        let shown = format!("{graph:?}");
        assert!(shown.contains("user verwalter with a password"), "{shown}");
        assert!(shown.contains("nats-ca.pem"), "{shown}");
        assert!(!shown.contains("pa55word"), "{shown}");
        let events = config.deployment_events.expect("event settings");
        let shown = format!("{events:?}");
        assert!(
            shown.contains("\"creds\"") && !shown.contains(&seed),
            "{shown}"
        );
    }
}

#[cfg(test)]
mod retention_setting {
    use crate::config::{Config, tests::settings_args};
    use std::time::Duration;

    #[test]
    fn graph_retention_is_an_age_and_a_bad_one_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("settings.yaml");
        let load = |retention: &str| {
            std::fs::write(&file, format!("graph:\n  retention: {retention}\n")).unwrap();
            Config::load(&settings_args(&file))
        };
        let graph = load("7d").unwrap().graph.unwrap();
        assert_eq!(graph.retention, Some(Duration::from_secs(7 * 86400)));
        let err = load("7w").unwrap_err().to_string();
        assert!(
            err.contains("graph.retention: \"7w\": the unit is s, m, h or d"),
            "{err}"
        );
    }
}
