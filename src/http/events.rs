//! `/v1/events`: a server-sent events stream of `/v1/status`, for pages that would otherwise poll.
//!
//! The first event is the status now; another follows each time a store field `/v1/status` is
//! made from changed (the fields of `status::Fields`), at most one per 50 ms so that a burst of
//! changes costs one event. Each event is `event: status` with the status JSON as data; a
//! comment every 15 s keeps proxies from closing an idle stream.
//!
//! A slow reader costs no queue: an event is made from the status when the client is ready for
//! it, so it gets the latest state, never a backlog. A reader that stops reading is dropped once
//! an event has waited `http.stream-stall-timeout-ms` for it, and at most `http.max-event-streams`
//! streams are open (more get 503).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use tokio::sync::{OwnedSemaphorePermit, watch};
use verwalter_controllers::machinery::store::Trigger;
use verwalter_controllers::status::Fields;

use super::AppState;
use super::api::build_status;
use super::serve::ConnectionHandle;

/// Changes closer together than this go out as one event.
const COALESCE: Duration = Duration::from_millis(50);

struct Watch {
    state: AppState,
    triggers: Vec<Box<dyn Trigger>>,
    first: bool,
    last: Option<String>,
    /// (events asked for, events handed out), for the stall watchdog.
    progress: watch::Sender<(u64, u64)>,
    _slot: Slot,
}

/// A place among the open streams (and GraphQL WebSockets), given back when the stream goes.
pub(super) struct Slot {
    _permit: OwnedSemaphorePermit,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl Slot {
    pub(super) fn new(
        permit: OwnedSemaphorePermit,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Slot {
        Slot {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics.event_stream_closed();
    }
}

impl Watch {
    /// Waits for any watched field to change.
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            futures::future::select_all(self.triggers.iter_mut().map(|t| t.changed())).await;
        })
    }
}

pub(crate) async fn events(
    State(state): State<AppState>,
    connection: Option<axum::Extension<ConnectionHandle>>,
) -> Response {
    let Ok(permit) = state.http.streams.clone().try_acquire_owned() else {
        return super::ApiError::unavailable(
            format!(
                "{} event streams are open, the most this node serves \
                 (http.max-event-streams, at most a quarter of the connection cap)",
                state.http.max_streams
            ),
            "5",
        )
        .into_response();
    };
    state.metrics.event_stream_opened();
    let slot = Slot {
        _permit: permit,
        metrics: state.metrics.clone(),
    };
    // Exactly the fields the status is made from.
    let triggers = Fields::new(&state.store).triggers();
    let (progress, watched) = watch::channel((0, 0));
    if let Some(axum::Extension(connection)) = connection {
        tokio::spawn(watchdog(
            watched,
            state.http.settings.stream_stall_timeout,
            connection,
            state.metrics.clone(),
        ));
    }
    let watch = Watch {
        state,
        triggers,
        first: true,
        last: None,
        progress,
        _slot: slot,
    };
    let stream = futures::stream::unfold(watch, |mut watch| async move {
        // The client (through hyper's buffer) is ready for another event.
        watch.progress.send_modify(|(asked, _)| *asked += 1);
        loop {
            if !watch.first {
                watch.changed().await;
                tokio::time::sleep(COALESCE).await;
            }
            watch.first = false;
            let status = build_status(&watch.state);
            let text = serde_json::to_string(&status).expect("status serializes");
            // A change to a field the status does not show sends nothing.
            if watch.last.as_deref() == Some(text.as_str()) {
                continue;
            }
            watch.last = Some(text.clone());
            watch.progress.send_modify(|(_, sent)| *sent += 1);
            let event = Event::default().event("status").data(text);
            return Some((Ok::<_, Infallible>(event), watch));
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Closes the connection of a stream whose client has not asked for the next event within
/// `stall` of the last one handed out: hyper asks at once while its buffer has room, so a
/// reader that stopped reading shows as a stream that is never asked again. Ends with the
/// stream.
async fn watchdog(
    mut progress: watch::Receiver<(u64, u64)>,
    stall: Duration,
    connection: ConnectionHandle,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    loop {
        // Wait until an event is handed out that has not been followed by a new ask.
        if progress
            .wait_for(|(asked, sent)| asked <= sent)
            .await
            .is_err()
        {
            return;
        }
        let next = progress.borrow().1 + 1;
        match tokio::time::timeout(stall, progress.wait_for(|(asked, _)| *asked >= next)).await {
            Ok(Ok(_)) => continue,
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::info!(
                    stall_ms = stall.as_millis() as u64,
                    "Dropped an events client that stopped reading."
                );
                metrics
                    .http_closed(crate::metrics::HttpClose::StalledStream)
                    .inc();
                connection.close();
                return;
            }
        }
    }
}
