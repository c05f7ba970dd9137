//! A small HTTP/1.1 GET client (hyper) for cantal's peer list and schedule fetches: keep-alive
//! connections, a time limit per request, a body size limit.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

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
        token: Option<&verwalter_controllers::access::Token>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let mut request = hyper::Request::get(uri).header(hyper::header::HOST, "verwalter");
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
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| format!("{url}: {e} (at most {limit} bytes)"))?;
            Ok(body.to_bytes())
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(format!("{url}: no answer within {timeout:?}")),
        }
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
