//! Reads `scheduler/v1/metrics.yaml`, the Lua scheduler's metrics declaration, with the config
//! dir (so an edit is picked up by the watcher like any other input). The format is parsed by
//! `verwalter_placement::config::scheduler_metrics`; this turns it into the
//! [`MetricsDeclaration`] the refresh uses, and its problems into [`InputError`]s naming the
//! file and line. What stays after a bad file is decided in
//! `verwalter_controllers::schedule::scheduler_metrics::keep_metrics_declaration`.

use std::path::Path;
use std::sync::Arc;

use verwalter_controllers::schedule::scheduler_metrics::{METRICS_FILE, MetricsDeclaration};
use verwalter_controllers::state::InputError;
use verwalter_placement::config::ServerVerify;
use verwalter_placement::config::scheduler_metrics::{
    MetricsFile, PrometheusAddress, load_metrics_file,
};

use crate::inputs::nesting::{MAX_NESTING, yaml_too_deep};
use crate::inputs::runtime::{MAX_FILE_BYTES, Problems};
use crate::inputs::walk::{self, FileSystem};

/// The declaration in `config_dir`, `None` without the file (or when it is bad: the problem
/// goes to `problems`, as errors, or as failures when the file could not be read).
pub(crate) fn read_declaration(
    fs: &dyn FileSystem,
    config_dir: &Path,
    problems: &mut Problems,
) -> Option<Arc<MetricsDeclaration>> {
    let path = config_dir.join(METRICS_FILE);
    let error = |line: Option<u64>, message: String| InputError {
        path: METRICS_FILE.to_string(),
        line,
        message,
    };
    // A file gone meanwhile is no file; another read error is a failure.
    let cannot_read = |problems: &mut Problems, e: std::io::Error| {
        if !walk::is_gone(&e) {
            problems
                .failures
                .push(error(None, format!("cannot read: {e}")));
        }
    };
    match fs.metadata(&path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => {
            problems
                .errors
                .push(error(None, "not a regular file".into()));
            return None;
        }
        Err(e) => {
            cannot_read(problems, e);
            return None;
        }
    }
    let bytes = match fs.read(&path, MAX_FILE_BYTES) {
        Ok(bytes) => bytes,
        Err(e) => {
            cannot_read(problems, e);
            return None;
        }
    };
    match parse(&bytes, |name| std::env::var(name).ok()) {
        Ok(decl) => Some(Arc::new(decl)),
        Err((line, message)) => {
            problems.errors.push(error(line, message));
            None
        }
    }
}

/// Parses the bytes of a `metrics.yaml`; an error comes with its line where known.
pub fn parse(
    bytes: &[u8],
    env: impl Fn(&str) -> Option<String>,
) -> Result<MetricsDeclaration, (Option<u64>, String)> {
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err((
            None,
            format!("more than {MAX_FILE_BYTES} bytes (1 MiB); refused"),
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| (None, format!("not UTF-8: {e}")))?;
    if let Some(line) = yaml_too_deep(text, MAX_NESTING) {
        return Err((
            Some(line),
            format!("nested deeper than {MAX_NESTING} levels; refused unparsed"),
        ));
    }
    let file =
        load_metrics_file(text, env).map_err(|e| (e.line().map(|l| l as u64), e.message()))?;
    declaration(file).map_err(|m| (None, m))
}

/// The refresh's view of a loaded file: the base URL, and a CA file for HTTPS when `!SSL`
/// names one (the other `!SSL` settings are refused as the placement sources refuse them).
fn declaration(file: MetricsFile) -> Result<MetricsDeclaration, String> {
    let (url, ca_file, time) = match file.prometheus {
        PrometheusAddress::Url(url) => (url, None, None),
        PrometheusAddress::Tagged(p) => {
            let ca_file = match &p.ssl {
                None => None,
                Some(ssl) if ssl.client_cert_path.is_some() => {
                    return Err("!SSL: client certificates are not supported".into());
                }
                Some(ssl) => match &ssl.server_verify {
                    ServerVerify::CaFile(path) => Some(path.clone()),
                    ServerVerify::System => {
                        return Err("!SSL: give server_verify the path of a CA file \
                                    (the system's CAs are not read)"
                            .into());
                    }
                    ServerVerify::Off => {
                        return Err(
                            "!SSL: server_verify: false is refused (unverified HTTPS)".into()
                        );
                    }
                },
            };
            (
                crate::placement::prometheus::base_url(&p),
                ca_file,
                p.time.clone(),
            )
        }
    };
    Ok(MetricsDeclaration {
        url,
        ca_file,
        time,
        interval: file.interval,
        timeout: file.timeout,
        queries: file.queries,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn both_address_forms_become_a_base_url() {
        let d = parse(b"prometheus: http://p:9090\nqueries: {up: up}\n", |_| None).unwrap();
        assert_eq!(d.url, "http://p:9090");
        assert_eq!(d.queries["up"], "up");
        let yaml = "prometheus: !Prometheus\n  host: https://p\n  port: 9443\n  time: '100'\n  ssl: !SSL {server_verify: /etc/ca.pem}\ninterval: 3\n";
        let d = parse(yaml.as_bytes(), |_| None).unwrap();
        assert_eq!(d.url, "https://p:9443");
        assert_eq!(d.ca_file.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(d.time.as_deref(), Some("100"));
        assert_eq!(d.interval, Duration::from_secs(3));
    }

    #[test]
    fn problems_name_the_line_where_known() {
        let (line, m) =
            parse(b"prometheus: http://p:9090\nqueries:\n  a: ''\n", |_| None).unwrap_err();
        assert_eq!(line, Some(3), "{m}");
        let (line, m) = parse(
            b"prometheus: !Prometheus {host: https://p, port: 1, ssl: !SSL {server_verify: false}}\n",
            |_| None,
        )
        .unwrap_err();
        assert_eq!(line, None);
        assert!(m.contains("refused"), "{m}");
        let (line, _) = parse(b"\xff", |_| None).unwrap_err();
        assert_eq!(line, None);
    }
}
