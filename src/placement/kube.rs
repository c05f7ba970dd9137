//! The Kubernetes API as wca reads it: `GET /api/v1/nodes`, `GET /api/v1/namespaces/{ns}/pods`,
//! and (beyond wca) a pod watch per namespace, so that a pod kube-scheduler binds is counted
//! before the next list.
//!
//! Over HTTPS with the service account's token (`Authorization: Bearer`, re-read from its file
//! for every request, since kubelet rotates it) and its CA; over plain HTTP when the host is
//! given as `http://…` (e.g. `kubectl proxy`), the token then sent only if its file is readable.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::BodyExt;
use verwalter_placement::config::Kubeapi;
use verwalter_placement::sources::{
    Nodes, Pod, SourceError, WatchEvent, parse_node_list, parse_pod_list, parse_watch_line,
};

use super::request::{self, encode_param, status_error};
use crate::machinery::http_client::HttpClient;

/// Lists larger than this are refused.
pub(crate) const BODY_LIMIT: usize = 256 << 20;
/// A watch line longer than this ends the watch (a pod object is a few KiB).
const LINE_LIMIT: usize = 4 << 20;

/// A client for one API server.
#[derive(Debug, Clone)]
pub(crate) struct KubeApi {
    client: HttpClient,
    base: String,
    token_path: PathBuf,
    https: bool,
    timeout: Duration,
}

/// The API server's URL: `host` as given when it has a scheme, else `https://host`; `:port`
/// added when given. Without a host, the in-cluster `KUBERNETES_SERVICE_HOST` and
/// `KUBERNETES_SERVICE_PORT` are used.
pub(crate) fn base_url(host: Option<&str>, port: Option<u16>) -> Result<String, SourceError> {
    let in_cluster = host.is_none();
    let host = host
        .map(str::to_owned)
        .or_else(|| std::env::var("KUBERNETES_SERVICE_HOST").ok())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            SourceError::Setup(
                "kubeapi: no host (set `host` or run in a pod with KUBERNETES_SERVICE_HOST)".into(),
            )
        })?;
    let port = port.or_else(|| {
        if !in_cluster {
            return None;
        }
        std::env::var("KUBERNETES_SERVICE_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
    });
    let host = host.trim_end_matches('/');
    let mut url = if host.contains("://") {
        host.to_owned()
    } else if host.contains(':') && !host.starts_with('[') {
        format!("https://[{host}]")
    } else {
        format!("https://{host}")
    };
    if let Some(port) = port {
        url.push_str(&format!(":{port}"));
    }
    Ok(url)
}

/// How a watch ended without an error.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WatchEnd {
    /// The server closed it (its `timeoutSeconds`); resume from this version.
    Closed(Option<String>),
}

impl KubeApi {
    /// Reads the CA (for HTTPS) and checks the URL; the token is read per request.
    pub(crate) fn new(cfg: &Kubeapi) -> Result<KubeApi, SourceError> {
        let base = base_url(cfg.host.as_deref(), cfg.port)?;
        let https = base.starts_with("https://");
        let client = if https {
            let pem = std::fs::read(&cfg.server_cert_ca_path).map_err(|e| {
                SourceError::Setup(format!(
                    "kubeapi: cannot read the CA {}: {e}",
                    cfg.server_cert_ca_path
                ))
            })?;
            request::client_with_ca(&pem)?
        } else {
            request::plain_client()
        };
        Ok(KubeApi {
            client,
            base,
            token_path: PathBuf::from(&cfg.client_token_path),
            https,
            timeout: Duration::from_secs_f64(cfg.timeout.max(0.001)),
        })
    }

    fn token(&self) -> Result<Option<String>, SourceError> {
        match std::fs::read_to_string(&self.token_path) {
            Ok(t) => Ok(Some(t.trim().to_owned())),
            Err(_) if !self.https => Ok(None),
            Err(e) => Err(SourceError::Setup(format!(
                "kubeapi: cannot read the token {}: {e}",
                self.token_path.display()
            ))),
        }
    }

    async fn get(&self, path: &str) -> Result<hyper::body::Bytes, SourceError> {
        let token = self.token()?;
        let url = format!("{}{path}", self.base);
        request::get_ok(
            &self.client,
            &url,
            token.as_deref(),
            BODY_LIMIT,
            self.timeout,
        )
        .await
    }

    /// `GET /api/v1/nodes`.
    pub(crate) async fn list_nodes(&self) -> Result<Nodes, SourceError> {
        parse_node_list(&self.get("/api/v1/nodes").await?)
    }

    /// `GET /api/v1/namespaces/{ns}/pods`: the pods and the version to watch from.
    pub(crate) async fn list_pods(
        &self,
        namespace: &str,
    ) -> Result<(Vec<Pod>, Option<String>), SourceError> {
        let path = format!("/api/v1/namespaces/{}/pods", encode_param(namespace));
        parse_pod_list(&self.get(&path).await?)
    }

    /// Watches the pods of `namespace` from `resource_version` for at most `duration` (the
    /// server's `timeoutSeconds`), handing each chunk's events to `on_events` as they come.
    /// A 410 (as the status or as an `ERROR` event) is [`SourceError::Gone`]: list again.
    pub(crate) async fn watch_pods(
        &self,
        namespace: &str,
        resource_version: Option<&str>,
        duration: Duration,
        mut on_events: impl FnMut(Vec<WatchEvent>),
    ) -> Result<WatchEnd, SourceError> {
        let token = self.token()?;
        let mut url = format!(
            "{}/api/v1/namespaces/{}/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds={}",
            self.base,
            encode_param(namespace),
            duration.as_secs().max(1)
        );
        if let Some(rv) = resource_version {
            url.push_str("&resourceVersion=");
            url.push_str(&encode_param(rv));
        }
        let what = format!("pod watch of namespace {namespace}");
        let response = request::open(&self.client, &url, token.as_deref(), self.timeout).await?;
        let status = response.status();
        if status == hyper::StatusCode::GONE {
            return Err(SourceError::Gone {
                what,
                message: "HTTP 410".into(),
            });
        }
        if status != hyper::StatusCode::OK {
            let body = http_body_util::Limited::new(response.into_body(), 4096)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(status_error(&url, status, &body));
        }
        let mut body = response.into_body();
        let mut buf: Vec<u8> = Vec::new();
        let mut last_rv = resource_version.map(str::to_owned);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| SourceError::Connect {
                url: url.clone(),
                message: format!("watch stream: {e}"),
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            let mut events = Vec::new();
            while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                let event = parse_watch_line(line)?;
                if let WatchEvent::Error { code, message } = &event {
                    if !events.is_empty() {
                        on_events(std::mem::take(&mut events));
                    }
                    return Err(if *code == Some(410) {
                        SourceError::Gone {
                            what,
                            message: message.clone(),
                        }
                    } else {
                        SourceError::Status {
                            url: url.clone(),
                            status: code.unwrap_or(0),
                            body: format!("watch ERROR event: {message}"),
                        }
                    });
                }
                if let Some(rv) = event.resource_version() {
                    last_rv = Some(rv.to_owned());
                }
                events.push(event);
            }
            if buf.len() > LINE_LIMIT {
                return Err(SourceError::BadReply {
                    what,
                    message: format!("a line longer than {LINE_LIMIT} bytes"),
                });
            }
            if !events.is_empty() {
                on_events(events);
            }
        }
        Ok(WatchEnd::Closed(last_rv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_as_wca_builds_them_and_kubectl_proxy() {
        assert_eq!(
            base_url(Some("10.96.0.1"), Some(443)).unwrap(),
            "https://10.96.0.1:443"
        );
        assert_eq!(
            base_url(Some("http://127.0.0.1"), Some(8001)).unwrap(),
            "http://127.0.0.1:8001"
        );
        assert_eq!(
            base_url(Some("http://127.0.0.1:8001/"), None).unwrap(),
            "http://127.0.0.1:8001"
        );
        assert_eq!(
            base_url(Some("fd00::1"), Some(443)).unwrap(),
            "https://[fd00::1]:443"
        );
    }
}
