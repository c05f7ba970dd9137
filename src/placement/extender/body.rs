//! The extender's request bodies within limits: a `Content-Length` over the cap is refused
//! before any of the body is read (413), a body must come whole within the body timeout (408),
//! and the bytes of all bodies held at once, with the replies made from them until they are
//! sent, stay within one budget shared by every request (503 when a request cannot get its
//! share within [`BUDGET_WAIT`]). The decisions (cap, status codes) are
//! `verwalter_controllers::http::access`'s.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hyper::body::Body as HttpBody;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use verwalter_controllers::http::access::{self, BodyRefusal};

use crate::http::ApiError;

/// How long a request waits for its share of the budget before it is answered 503: long
/// enough for a request in flight to finish and give its share back, short against
/// kube-scheduler's 5 s per call.
pub(crate) const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// The bytes of request bodies (and the replies made from them) held at once, all requests
/// together. Cloning shares it.
#[derive(Debug, Clone)]
pub(crate) struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: u64,
}

impl BodyBudget {
    pub(crate) fn new(total: u64) -> BodyBudget {
        let total = total.min(Semaphore::MAX_PERMITS as u64);
        BodyBudget {
            bytes: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// Bytes held now.
    pub(crate) fn held(&self) -> u64 {
        self.total - self.bytes.available_permits() as u64
    }

    /// A share of no bytes, to add to.
    fn none(&self) -> OwnedSemaphorePermit {
        self.bytes
            .clone()
            .try_acquire_many_owned(0)
            .expect("the budget is never closed")
    }

    /// `n` more bytes onto `share`, waiting until `until` at most.
    async fn add(
        &self,
        share: &mut OwnedSemaphorePermit,
        n: usize,
        until: Instant,
    ) -> Result<(), BodyRefusal> {
        if n == 0 {
            return Ok(());
        }
        let n = u32::try_from(n).map_err(|_| BodyRefusal::NoBudget)?;
        let more = tokio::time::timeout_at(until, self.bytes.clone().acquire_many_owned(n))
            .await
            .map_err(|_| BodyRefusal::NoBudget)?
            .expect("the budget is never closed");
        share.merge(more);
        Ok(())
    }
}

/// A body read whole, and its share of the budget.
pub(crate) struct ReadBody {
    pub(crate) bytes: Vec<u8>,
    pub(crate) share: OwnedSemaphorePermit,
}

/// Reads `request`'s body within `max_body` bytes and `timeout` for all of it, taking each
/// piece's bytes from `budget` as it comes.
pub(crate) async fn read(
    request: axum::extract::Request,
    max_body: u64,
    timeout: Duration,
    budget: &BodyBudget,
) -> Result<ReadBody, BodyRefusal> {
    let deadline = Instant::now() + timeout;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(refusal) = declared.and_then(|n| access::body_over_cap(n, max_body)) {
        return Err(refusal);
    }
    let mut share = budget.none();
    // Grown as the bytes come and are charged: a length announced is no reason to reserve it
    // (a large buffer grows in place, its pages taken as they are written).
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(64 << 10) as usize);
    let mut stream = request.into_body().into_data_stream();
    loop {
        let piece = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => return Err(BodyRefusal::Timeout),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(BodyRefusal::Broken),
            Ok(Some(Ok(piece))) => piece,
        };
        let length = (bytes.len() + piece.len()) as u64;
        if let Some(refusal) = access::body_over_cap(length, max_body) {
            return Err(refusal);
        }
        let until = deadline.min(Instant::now() + BUDGET_WAIT);
        budget.add(&mut share, piece.len(), until).await?;
        bytes.extend_from_slice(&piece);
    }
    Ok(ReadBody { bytes, share })
}

/// `response` holding its request's share of the budget until it is sent, the share made the
/// reply's size (more waited for within [`BUDGET_WAIT`], else the 503; the rest given back).
pub(crate) async fn charge_reply(
    response: Response,
    mut share: OwnedSemaphorePermit,
    budget: &BodyBudget,
) -> Result<Response, BodyRefusal> {
    let reply = response.body().size_hint().exact().unwrap_or(0) as usize;
    let held = share.num_permits();
    if reply > held {
        budget
            .add(&mut share, reply - held, Instant::now() + BUDGET_WAIT)
            .await?;
    } else {
        drop(share.split(held - reply));
    }
    Ok(response.map(|body| {
        // The reply holds its share of the budget until it is sent or dropped.
        Body::new(crate::http::Holding {
            body,
            _guard: share,
        })
    }))
}

/// The answer to a refused body: its status, `{"error": "..."}`, and the connection closed
/// after it (the rest of the body is never read).
pub(crate) fn refusal_response(refusal: BodyRefusal, max_body: u64) -> Response {
    let status = StatusCode::from_u16(refusal.status()).expect("a valid status");
    let mut error =
        ApiError::new(status, refusal.message(max_body)).header(header::CONNECTION, "close");
    if refusal == BodyRefusal::NoBudget {
        error = error.header(header::RETRY_AFTER, "1");
    }
    error.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;

    fn request(head: &[(&str, &str)], body: Body) -> axum::extract::Request {
        let mut builder = axum::http::Request::builder().method("POST").uri("/filter");
        for (name, value) in head {
            builder = builder.header(*name, *value);
        }
        builder.body(body).unwrap()
    }

    /// A body whose pieces come from `rx`, and end when it is dropped.
    fn streamed() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let stream = tokio_stream_of(rx);
        (tx, Body::from_stream(stream))
    }

    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::Receiver<Bytes>,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(Ok)))
    }

    #[tokio::test]
    async fn a_declared_length_over_the_cap_is_refused_before_reading() {
        let budget = BodyBudget::new(1000);
        // A body that never comes: only the head decides.
        let (_tx, body) = streamed();
        let asked = request(&[("content-length", "100000000000")], body);
        let refused = read(asked, 100, Duration::from_secs(3600), &budget).await;
        assert_eq!(refused.err(), Some(BodyRefusal::TooLarge));
        assert_eq!(budget.held(), 0);
    }

    #[tokio::test]
    async fn bytes_past_the_cap_are_refused_without_a_length() {
        let budget = BodyBudget::new(1000);
        let asked = request(&[], Body::from(vec![b'x'; 101]));
        let refused = read(asked, 100, Duration::from_secs(3600), &budget).await;
        assert_eq!(refused.err(), Some(BodyRefusal::TooLarge));
        assert_eq!(budget.held(), 0, "the share is given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_trickling_ends_at_the_whole_body_timeout() {
        let budget = BodyBudget::new(1000);
        let (tx, body) = streamed();
        let asked = request(&[("content-length", "100")], body);
        let trickle = tokio::spawn(async move {
            // A byte every 100 ms: never idle, never done.
            while tx.send(Bytes::from_static(b"x")).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let refused = read(asked, 100, Duration::from_secs(2), &budget).await;
        assert_eq!(refused.err(), Some(BodyRefusal::Timeout));
        assert_eq!(budget.held(), 0);
        trickle.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn the_sum_of_bodies_stays_within_the_budget_and_a_request_over_it_gets_503() {
        let budget = BodyBudget::new(100);
        let first = read(
            request(&[], Body::from(vec![b'x'; 80])),
            100,
            Duration::from_secs(10),
            &budget,
        )
        .await
        .unwrap();
        assert_eq!(budget.held(), 80);
        // 80 + 30 > 100: the second waits its short while, then is refused.
        let second = read(
            request(&[], Body::from(vec![b'y'; 30])),
            100,
            Duration::from_secs(10),
            &budget,
        )
        .await;
        assert_eq!(second.err(), Some(BodyRefusal::NoBudget));
        assert_eq!(budget.held(), 80);
        // The first reply is smaller than its request: the share shrinks to the reply's size,
        // and is given back when the reply is dropped (sent).
        let reply = charge_reply(
            Response::new(Body::from(vec![b'r'; 10])),
            first.share,
            &budget,
        )
        .await
        .unwrap();
        assert_eq!(budget.held(), 10);
        let third = read(
            request(&[], Body::from(vec![b'z'; 30])),
            100,
            Duration::from_secs(10),
            &budget,
        )
        .await
        .unwrap();
        assert_eq!(budget.held(), 40);
        drop((reply, third));
        assert_eq!(budget.held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_larger_than_its_request_takes_more_or_is_refused() {
        let budget = BodyBudget::new(100);
        let small = read(
            request(&[], Body::from(vec![b'x'; 10])),
            100,
            Duration::from_secs(10),
            &budget,
        )
        .await
        .unwrap();
        let reply = charge_reply(
            Response::new(Body::from(vec![b'r'; 60])),
            small.share,
            &budget,
        )
        .await
        .unwrap();
        assert_eq!(budget.held(), 60);
        let other = read(
            request(&[], Body::from(vec![b'x'; 10])),
            100,
            Duration::from_secs(10),
            &budget,
        )
        .await
        .unwrap();
        let refused = charge_reply(
            Response::new(Body::from(vec![b'r'; 50])),
            other.share,
            &budget,
        )
        .await;
        assert_eq!(refused.err(), Some(BodyRefusal::NoBudget));
        drop(reply);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn refusals_close_the_connection_and_a_503_says_when_to_retry() {
        let response = refusal_response(BodyRefusal::NoBudget, 64);
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(refusal_response(BodyRefusal::TooLarge, 64).status(), 413);
    }
}
