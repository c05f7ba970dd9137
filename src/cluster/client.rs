//! A small HTTP/1.1 GET client (hyper) for cantal's peer list and schedule fetches: keep-alive
//! connections, a time limit per request, a body size limit.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::cluster::coding;
pub use crate::cluster::coding::Coding;

#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpClient")
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        connector.set_nodelay(true);
        HttpClient {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(300))
                .build(connector),
        }
    }
}

impl HttpClient {
    /// GETs `url`; the body of a 200 response, at most `limit` bytes, within `timeout`.
    pub async fn get(&self, url: &str, limit: usize, timeout: Duration) -> Result<Bytes, String> {
        self.get_with_token(url, None, limit, timeout).await
    }

    /// [`get`](Self::get), sending `token` as `Authorization: Bearer` when given (a peer whose
    /// reads need it). Errors never include it.
    pub async fn get_with_token(
        &self,
        url: &str,
        token: Option<&verwalter_controllers::http::access::Token>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, String> {
        Ok(self.request(url, token, limit, timeout, false).await?.body)
    }

    /// [`get_with_token`](Self::get_with_token) that takes a compressed answer (see
    /// [`crate::cluster::coding`]), at most `limit` bytes as it came; [`Fetched::plain`]
    /// inflates it (at most `limit` bytes again). Schedules travel so between nodes of this
    /// version; a server that ignores the header (verwalter 0.13) answers plain JSON, taken as
    /// it is.
    pub async fn get_compressed(
        &self,
        url: &str,
        token: Option<&verwalter_controllers::http::access::Token>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Fetched, String> {
        self.request(url, token, limit, timeout, true).await
    }

    async fn request(
        &self,
        url: &str,
        token: Option<&verwalter_controllers::http::access::Token>,
        limit: usize,
        timeout: Duration,
        compressed: bool,
    ) -> Result<Fetched, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let mut request = hyper::Request::get(uri).header(hyper::header::HOST, "verwalter");
        if compressed {
            request = request.header(hyper::header::ACCEPT_ENCODING, coding::ACCEPTED);
        }
        if let Some(token) = token {
            let mut value = b"Bearer ".to_vec();
            value.extend_from_slice(token.as_bytes());
            let mut value = hyper::header::HeaderValue::from_bytes(&value)
                .map_err(|_| format!("{url}: the token is not a header value"))?;
            value.set_sensitive(true);
            request = request.header(hyper::header::AUTHORIZATION, value);
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| format!("{url}: {e}"))?;
        let work = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("{url}: {}", error_chain(&e)))?;
            let status = response.status();
            if status != hyper::StatusCode::OK {
                return Err(format!("{url}: HTTP {status}"));
            }
            let coding = if compressed {
                Coding::of_response(response.headers())
                    .ok_or_else(|| format!("{url}: a Content-Encoding this node cannot read"))?
            } else {
                Coding::Identity
            };
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| format!("{url}: {e} (at most {limit} bytes)"))?
                .to_bytes();
            Ok(Fetched { body, coding })
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(format!("{url}: no answer within {timeout:?}")),
        }
    }
}

/// A body fetched, as it came, in `coding`.
#[derive(Debug)]
pub struct Fetched {
    pub body: Bytes,
    pub coding: Coding,
}

impl Fetched {
    /// The body decoded, refused past `limit` bytes: the caller runs this off the async
    /// runtime (a megabyte's schedule takes a fraction of a millisecond).
    pub fn plain(self, limit: usize) -> Result<Vec<u8>, String> {
        self.coding.decode(self.body, limit)
    }
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
