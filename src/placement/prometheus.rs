//! Prometheus instant queries (`GET /api/v1/query?query=…[&time=…]`), as wca runs them.

use std::time::Duration;

use verwalter_placement::config::Prometheus;
use verwalter_placement::sources::{Sample, SourceError, parse_query_reply};

use super::request::{self, encode_param, status_error};
use crate::machinery::http_client::HttpClient;

/// Replies larger than this are refused (a query gone wrong, not a placement input).
pub(crate) const BODY_LIMIT: usize = 16 << 20;

/// `host:port` with the scheme wca expects in `host` (`http://` when it has none).
pub(crate) fn base_url(p: &Prometheus) -> String {
    let host = p.host.trim_end_matches('/');
    let host = if host.contains("://") {
        host.to_owned()
    } else {
        format!("http://{host}")
    };
    format!("{host}:{}", p.port)
}

/// The query URL: `{base}/api/v1/query?query=…`, with `&time=…` when given.
pub(crate) fn query_url(base_url: &str, query: &str, time: Option<&str>) -> String {
    let mut url = format!(
        "{}/api/v1/query?query={}",
        base_url.trim_end_matches('/'),
        encode_param(query)
    );
    if let Some(time) = time {
        url.push_str("&time=");
        url.push_str(&encode_param(time));
    }
    url
}

/// Runs one instant query and returns its series. Prometheus' own errors (a bad query, a
/// timeout on its side) arrive with a 4xx/5xx status and a JSON body: they come back as
/// [`SourceError::Prometheus`]; other failures as connect, timeout, status or bad-reply errors.
pub(crate) async fn instant_query(
    client: &HttpClient,
    base_url: &str,
    query: &str,
    time: Option<&str>,
    timeout: Duration,
) -> Result<Vec<Sample>, SourceError> {
    let url = query_url(base_url, query, time);
    let (status, body) = request::get(client, &url, None, BODY_LIMIT, timeout).await?;
    if status == hyper::StatusCode::OK {
        return parse_query_reply(&body);
    }
    match parse_query_reply(&body) {
        Err(e @ SourceError::Prometheus { .. }) => Err(e),
        _ => Err(status_error(&url, status, &body)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_as_wca_builds_them() {
        let p = Prometheus {
            host: "http://100.64.176.36".into(),
            port: 30900,
            timeout: 5.0,
            time: None,
            ssl: None,
        };
        assert_eq!(base_url(&p), "http://100.64.176.36:30900");
        let bare = Prometheus {
            host: "prometheus".into(),
            ..p
        };
        assert_eq!(base_url(&bare), "http://prometheus:30900");
        assert_eq!(
            query_url("http://p:9090", "app_profile", Some("1586245624")),
            "http://p:9090/api/v1/query?query=app_profile&time=1586245624"
        );
    }
}
