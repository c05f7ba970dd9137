//! The placement data sources' requests over the one HTTP client
//! ([`crate::machinery::http_client`]): its HTTPS kind, `Accept: application/json`, errors as
//! [`SourceError`]s, and the helpers the Kubernetes and Prometheus URLs and answers need.

use std::time::Duration;

use hyper::body::{Bytes, Incoming};
use verwalter_placement::sources::SourceError;

use crate::machinery::http_client::{self, Connections, HttpClient, SendError};

/// The sources' connections: 5 s to connect (the request's own limit applies as well), idle
/// ones kept 90 s.
const CONNECTIONS: Connections = Connections {
    connect_timeout: Duration::from_secs(5),
    idle_timeout: Duration::from_secs(90),
};

/// A client for plain HTTP only (e.g. Prometheus, `kubectl proxy`): HTTPS is refused.
pub(crate) fn plain_client() -> HttpClient {
    HttpClient::https(CONNECTIONS, None).expect("a client without a CA always builds")
}

/// A client trusting the certificates in `ca_pem` (PEM) for HTTPS; plain HTTP works too.
pub(crate) fn client_with_ca(ca_pem: &[u8]) -> Result<HttpClient, SourceError> {
    HttpClient::https(CONNECTIONS, Some(ca_pem)).map_err(SourceError::Setup)
}

/// Sends a GET and returns the response head with its body still to read, within `timeout`
/// for the head. An `https` URL needs a client with a CA.
pub(crate) async fn open(
    client: &HttpClient,
    url: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<hyper::Response<Incoming>, SourceError> {
    let headers = [(hyper::header::ACCEPT, "application/json")];
    let sent = client.send(url, token.map(str::as_bytes), &headers);
    match tokio::time::timeout(timeout, sent).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(SendError::Setup(message))) => Err(SourceError::Setup(message)),
        Ok(Err(SendError::Token)) => {
            Err(SourceError::Setup("the token is not a header value".into()))
        }
        Ok(Err(SendError::Connect(message))) => Err(SourceError::Connect {
            url: url.to_owned(),
            message,
        }),
        Err(_) => Err(SourceError::Timeout {
            url: url.to_owned(),
            timeout,
        }),
    }
}

/// GETs `url`: the status and the whole body (at most `limit` bytes), all within `timeout`.
pub(crate) async fn get(
    client: &HttpClient,
    url: &str,
    token: Option<&str>,
    limit: usize,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), SourceError> {
    let work = async {
        let response = open(client, url, token, timeout).await?;
        let status = response.status();
        let body =
            http_client::read_body(response, limit)
                .await
                .map_err(|e| SourceError::Connect {
                    url: url.to_owned(),
                    message: format!("reading the body: {e}"),
                })?;
        Ok((status, body))
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(SourceError::Timeout {
            url: url.to_owned(),
            timeout,
        }),
    }
}

/// [`get`] that takes only a 200: any other status is [`SourceError::Status`] with the start
/// of the body.
pub(crate) async fn get_ok(
    client: &HttpClient,
    url: &str,
    token: Option<&str>,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, SourceError> {
    let (status, body) = get(client, url, token, limit, timeout).await?;
    if status == hyper::StatusCode::OK {
        Ok(body)
    } else {
        Err(status_error(url, status, &body))
    }
}

/// A non-200 answer, with the first line of its body (bounded) for the reason.
pub(crate) fn status_error(url: &str, status: hyper::StatusCode, body: &[u8]) -> SourceError {
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
pub(crate) fn encode_param(value: &str) -> String {
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
            client_with_ca(b"not a pem").unwrap_err().to_string(),
            "CA file: no PEM certificate in it"
        );
    }
}
