//! The HTTP(S) client the data sources share: HTTP/1.1 over plain TCP or TLS (rustls with the
//! ring provider), trusting only the CA it is given (the service account's `ca.crt`), a bearer
//! token per request, a time limit per request and a body size limit.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::{Bytes, Incoming};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use verwalter_placement::sources::SourceError;

use crate::cluster::client::error_chain;

/// Cheap to clone (one connection pool).
#[derive(Clone)]
pub struct SourceClient {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    has_ca: bool,
}

impl std::fmt::Debug for SourceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceClient")
            .field("has_ca", &self.has_ca)
            .finish()
    }
}

/// How long a connection attempt may take (the request's own limit applies as well).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl SourceClient {
    /// A client for plain HTTP only (e.g. Prometheus, `kubectl proxy`).
    pub fn plain() -> SourceClient {
        SourceClient::build(None).expect("a client without a CA always builds")
    }

    /// A client trusting the certificates in `ca_pem` (PEM) for HTTPS; plain HTTP works too.
    pub fn with_ca(ca_pem: &[u8]) -> Result<SourceClient, SourceError> {
        SourceClient::build(Some(ca_pem))
    }

    fn build(ca_pem: Option<&[u8]>) -> Result<SourceClient, SourceError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        if let Some(pem) = ca_pem {
            let mut found = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| SourceError::Setup(format!("CA file: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| SourceError::Setup(format!("CA file: {e}")))?;
                found += 1;
            }
            if found == 0 {
                return Err(SourceError::Setup(
                    "CA file: no PEM certificate in it".into(),
                ));
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| SourceError::Setup(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(SourceClient {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .build(connector),
            has_ca: ca_pem.is_some(),
        })
    }

    /// Sends a GET and returns the response head with its body still to read, within `timeout`
    /// for the head. An `https` URL needs a client with a CA.
    pub async fn open(
        &self,
        url: &str,
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<hyper::Response<Incoming>, SourceError> {
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| SourceError::Setup(format!("{url}: {e}")))?;
        if uri.scheme_str() == Some("https") && !self.has_ca {
            return Err(SourceError::Setup(format!(
                "{url}: HTTPS needs a CA to trust, and none is configured"
            )));
        }
        let mut request =
            hyper::Request::get(uri).header(hyper::header::ACCEPT, "application/json");
        if let Some(token) = token {
            let mut value = hyper::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| SourceError::Setup("the token is not a header value".into()))?;
            value.set_sensitive(true);
            request = request.header(hyper::header::AUTHORIZATION, value);
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| SourceError::Setup(format!("{url}: {e}")))?;
        match tokio::time::timeout(timeout, self.client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(SourceError::Connect {
                url: url.to_owned(),
                message: error_chain(&e),
            }),
            Err(_) => Err(SourceError::Timeout {
                url: url.to_owned(),
                timeout,
            }),
        }
    }

    /// GETs `url`: the status and the whole body (at most `limit` bytes), all within `timeout`.
    pub async fn get(
        &self,
        url: &str,
        token: Option<&str>,
        limit: usize,
        timeout: Duration,
    ) -> Result<(hyper::StatusCode, Bytes), SourceError> {
        let work = async {
            let response = self.open(url, token, timeout).await?;
            let status = response.status();
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| SourceError::Connect {
                    url: url.to_owned(),
                    message: format!("reading the body: {e} (at most {limit} bytes)"),
                })?;
            Ok((status, body.to_bytes()))
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(SourceError::Timeout {
                url: url.to_owned(),
                timeout,
            }),
        }
    }

    /// [`get`](Self::get) that takes only a 200: any other status is [`SourceError::Status`]
    /// with the start of the body.
    pub async fn get_ok(
        &self,
        url: &str,
        token: Option<&str>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, SourceError> {
        let (status, body) = self.get(url, token, limit, timeout).await?;
        if status == hyper::StatusCode::OK {
            Ok(body)
        } else {
            Err(status_error(url, status, &body))
        }
    }
}

/// A non-200 answer, with the first line of its body (bounded) for the reason.
pub fn status_error(url: &str, status: hyper::StatusCode, body: &[u8]) -> SourceError {
    let text = String::from_utf8_lossy(body);
    let first: String = text
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect();
    SourceError::Status {
        url: url.to_owned(),
        status: status.as_u16(),
        body: first,
    }
}

/// Percent-encodes a query parameter value (everything but RFC 3986's unreserved characters).
pub fn encode_param(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_percent_encoded() {
        assert_eq!(
            encode_param(r#"sum(x{a="b c"}) by (app) / 1e9"#),
            "sum%28x%7Ba%3D%22b%20c%22%7D%29%20by%20%28app%29%20%2F%201e9"
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        assert_eq!(
            SourceClient::with_ca(b"not a pem").unwrap_err().to_string(),
            "CA file: no PEM certificate in it"
        );
    }
}
