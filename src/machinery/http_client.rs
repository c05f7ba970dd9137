//! The one HTTP/1.1 client (hyper): GETs with keep-alive connections, a bearer token when the
//! caller has one, a time limit per exchange and a body size limit. Two kinds:
//!
//! - [`HttpClient::http`]: plain HTTP only (the cluster: cantal's peer list, schedule fetches
//!   between nodes);
//! - [`HttpClient::https`]: HTTP and HTTPS (rustls with the ring provider), trusting only the CA
//!   it is given, if any (the placement data sources and the scheduler's metrics queries: the
//!   service account's `ca.crt`, Prometheus' `!SSL`); without a CA an `https` URL is refused
//!   before connecting.
//!
//! The callers word their errors: [`HttpClient::get`] names the URL in each (the cluster's
//! texts); `placement::request` builds `SourceError`s from [`HttpClient::send`] and
//! [`read_body`].

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How a client's connections are made and kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Connections {
    /// How long a connection attempt may take (the exchange's own limit applies as well).
    pub(crate) connect_timeout: Duration,
    /// How long an idle connection is kept for the next request.
    pub(crate) idle_timeout: Duration,
}

/// Cheap to clone (one connection pool).
#[derive(Clone)]
pub(crate) struct HttpClient {
    pool: Pool,
}

#[derive(Clone)]
enum Pool {
    Http(Client<HttpConnector, Full<Bytes>>),
    Https {
        client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
        has_ca: bool,
    },
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pool {
            Pool::Http(_) => f.write_str("HttpClient"),
            Pool::Https { has_ca, .. } => f
                .debug_struct("HttpClient")
                .field("has_ca", has_ca)
                .finish(),
        }
    }
}

/// Why a request was not sent, or got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SendError {
    /// The request cannot be made (a bad URL, HTTPS without a CA); the text names the URL.
    Setup(String),
    /// The token is not a header value.
    Token,
    /// No answer: the error and its causes ([`error_chain`]).
    Connect(String),
}

impl HttpClient {
    /// A client for plain HTTP only.
    pub(crate) fn http(connections: Connections) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connections.connect_timeout));
        connector.set_nodelay(true);
        HttpClient {
            pool: Pool::Http(
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(connections.idle_timeout)
                    .build(connector),
            ),
        }
    }

    /// A client for HTTP and HTTPS trusting the certificates in `ca_pem` (PEM); without one,
    /// HTTPS is refused. The error says what is wrong with the CA file.
    pub(crate) fn https(
        connections: Connections,
        ca_pem: Option<&[u8]>,
    ) -> Result<HttpClient, String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        if let Some(pem) = ca_pem {
            let mut found = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("CA file: {e}"))?;
                roots.add(cert).map_err(|e| format!("CA file: {e}"))?;
                found += 1;
            }
            if found == 0 {
                return Err("CA file: no PEM certificate in it".into());
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connections.connect_timeout));
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(HttpClient {
            pool: Pool::Https {
                client: Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(connections.idle_timeout)
                    .build(connector),
                has_ca: ca_pem.is_some(),
            },
        })
    }

    /// Sends a GET of `url` with `headers`, and `token` as `Authorization: Bearer` when given
    /// (marked sensitive; errors never include it): the response head, its body still to read.
    /// No time limit of its own: the caller bounds the exchange.
    pub(crate) async fn send(
        &self,
        url: &str,
        token: Option<&[u8]>,
        headers: &[(HeaderName, &'static str)],
    ) -> Result<hyper::Response<Incoming>, SendError> {
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| SendError::Setup(format!("{url}: {e}")))?;
        if let Pool::Https { has_ca: false, .. } = self.pool
            && uri.scheme_str() == Some("https")
        {
            return Err(SendError::Setup(format!(
                "{url}: HTTPS needs a CA to trust, and none is configured"
            )));
        }
        let mut request = hyper::Request::get(uri);
        for (name, value) in headers {
            request = request.header(name, *value);
        }
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, bearer(token)?);
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| SendError::Setup(format!("{url}: {e}")))?;
        self.request(request).await
    }

    /// Sends a POST of `body` to `url` with `headers` (the exchange between data centers): the
    /// response head, its body still to read. No time limit of its own.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Vec<u8>,
    ) -> Result<hyper::Response<Incoming>, SendError> {
        let mut request = hyper::Request::post(url);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| SendError::Setup(format!("{url}: {e}")))?;
        self.request(request).await
    }

    async fn request(
        &self,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<hyper::Response<Incoming>, SendError> {
        let sent = match &self.pool {
            Pool::Http(client) => client.request(request).await,
            Pool::Https { client, .. } => client.request(request).await,
        };
        sent.map_err(|e| SendError::Connect(error_chain(&e)))
    }

    /// GETs `url`: the body of a 200 answer, at most `limit` bytes, all within `timeout`, and
    /// what `check` makes of the answer's head, read before the body (a head it refuses is the
    /// error, and the body is not read). Errors name the URL.
    pub(crate) async fn get<T>(
        &self,
        url: &str,
        token: Option<&[u8]>,
        headers: &[(HeaderName, &'static str)],
        limit: usize,
        timeout: Duration,
        check: impl FnOnce(&HeaderMap) -> Result<T, String>,
    ) -> Result<(T, Bytes), String> {
        let work = async {
            let response = self.send(url, token, headers).await.map_err(|e| match e {
                SendError::Setup(message) => message,
                SendError::Token => format!("{url}: the token is not a header value"),
                SendError::Connect(message) => format!("{url}: {message}"),
            })?;
            let status = response.status();
            if status != hyper::StatusCode::OK {
                return Err(format!("{url}: HTTP {status}"));
            }
            let checked = check(response.headers())?;
            let body = read_body(response, limit)
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            Ok((checked, body))
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(format!("{url}: no answer within {timeout:?}")),
        }
    }
}

/// `Bearer <token>` as a sensitive header value; a token that is not visible ASCII is refused.
fn bearer(token: &[u8]) -> Result<HeaderValue, SendError> {
    if !token
        .iter()
        .all(|b| *b == b'\t' || (b' '..=b'~').contains(b))
    {
        return Err(SendError::Token);
    }
    let mut value = b"Bearer ".to_vec();
    value.extend_from_slice(token);
    let mut value = HeaderValue::from_bytes(&value).map_err(|_| SendError::Token)?;
    value.set_sensitive(true);
    Ok(value)
}

/// The whole body of `response`, refused past `limit` bytes; the error reads
/// `<why> (at most <limit> bytes)`.
pub(crate) async fn read_body(
    response: hyper::Response<Incoming>,
    limit: usize,
) -> Result<Bytes, String> {
    Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map(|body| body.to_bytes())
        .map_err(|e| format!("{e} (at most {limit} bytes)"))
}

/// An error with its causes, `a: b: c`.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_token_is_visible_ascii_and_sensitive() {
        let value = bearer(b"t0ken-1").unwrap();
        assert_eq!(value, "Bearer t0ken-1");
        assert!(value.is_sensitive());
        assert_eq!(bearer("tök".as_bytes()), Err(SendError::Token));
        assert_eq!(bearer(b"a\nb"), Err(SendError::Token));
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let connections = Connections {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
        };
        assert_eq!(
            HttpClient::https(connections, Some(b"not a pem")).unwrap_err(),
            "CA file: no PEM certificate in it"
        );
    }

    #[tokio::test]
    async fn https_without_a_ca_is_refused_before_connecting() {
        let connections = Connections {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
        };
        let client = HttpClient::https(connections, None).unwrap();
        let refused = client.send("https://127.0.0.1:1/x", None, &[]).await;
        assert_eq!(
            refused.unwrap_err(),
            SendError::Setup(
                "https://127.0.0.1:1/x: HTTPS needs a CA to trust, and none is configured".into()
            )
        );
    }
}
