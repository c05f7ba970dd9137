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
        Ok(self.request(url, token, limit, timeout, false).await?.body)
    }

    /// [`get_with_token`](Self::get_with_token) that takes a gzip-compressed answer
    /// (`Accept-Encoding: gzip`) and returns it decompressed, at most `limit` bytes either way.
    /// Schedules travel so between nodes of this version; a server that ignores the header
    /// (verwalter 0.13) answers plain JSON, which is taken as it is.
    pub async fn get_compressed(
        &self,
        url: &str,
        token: Option<&verwalter_controllers::access::Token>,
        limit: usize,
        timeout: Duration,
    ) -> Result<Fetched, String> {
        self.request(url, token, limit, timeout, true).await
    }

    async fn request(
        &self,
        url: &str,
        token: Option<&verwalter_controllers::access::Token>,
        limit: usize,
        timeout: Duration,
        gzip: bool,
    ) -> Result<Fetched, String> {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let mut request = hyper::Request::get(uri).header(hyper::header::HOST, "verwalter");
        if gzip {
            request = request.header(hyper::header::ACCEPT_ENCODING, "gzip");
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
            let compressed = gzip
                && response
                    .headers()
                    .get(hyper::header::CONTENT_ENCODING)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| format!("{url}: {e} (at most {limit} bytes)"))?
                .to_bytes();
            if compressed {
                let plain = gunzip(&body, limit).map_err(|e| format!("{url}: {e}"))?;
                Ok(Fetched {
                    body: plain,
                    gzip: Some(body),
                })
            } else {
                Ok(Fetched { body, gzip: None })
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(format!("{url}: no answer within {timeout:?}")),
        }
    }
}

/// A body fetched: decompressed, and as it came when it came gzip-compressed.
#[derive(Debug)]
pub struct Fetched {
    pub body: Bytes,
    pub gzip: Option<Bytes>,
}

/// The decompressed `body`, refused past `limit` bytes (a small body may inflate a lot).
fn gunzip(body: &[u8], limit: usize) -> Result<Bytes, String> {
    use std::io::Read;
    let mut out = Vec::with_capacity(body.len().saturating_mul(8).min(limit));
    let read = flate2::read::GzDecoder::new(body)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot decompress the gzip body: {e}"))?;
    if read > limit {
        return Err(format!(
            "the gzip body inflates past {limit} bytes, the limit"
        ));
    }
    Ok(Bytes::from(out))
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
    use super::gunzip;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    /// A small compressed body can inflate a thousandfold: the schedule limit holds for what
    /// it inflates to, not for what came over the wire.
    #[test]
    fn a_gzip_body_is_limited_by_what_it_inflates_to() {
        let zeros = vec![b'0'; 1 << 20];
        let bomb = gzip(&zeros);
        assert!(bomb.len() < 4 << 10, "{}", bomb.len());
        assert_eq!(gunzip(&bomb, 1 << 20).unwrap().len(), 1 << 20);
        let refused = gunzip(&bomb, (1 << 20) - 1).unwrap_err();
        assert!(refused.contains("inflates past 1048575 bytes"), "{refused}");
        let torn = gunzip(&bomb[..bomb.len() / 2], 1 << 20).unwrap_err();
        assert!(torn.contains("cannot decompress"), "{torn}");
    }
}
