//! `/v1/events`: a server-sent events stream of `/v1/status`, for pages that would otherwise poll.
//!
//! The first event is the status now; another follows each time something `/v1/status` shows
//! changed (election, peers, schedule, scheduler, inputs, roles, peer reports, pending actions),
//! at most one per 50 ms so that a burst of changes costs one event. Each event is
//! `event: status` with the status JSON as data; a comment every 15 s keeps proxies from closing
//! an idle stream.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use futures::future::BoxFuture;
use verwalter_controllers::store::Trigger;

use super::AppState;
use super::api::build_status;

/// Changes closer together than this go out as one event.
const COALESCE: Duration = Duration::from_millis(50);

struct Watch {
    state: AppState,
    triggers: Vec<Box<dyn Trigger>>,
    first: bool,
    last: Option<String>,
}

impl Watch {
    /// Waits for any watched field to change.
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            futures::future::select_all(self.triggers.iter_mut().map(|t| t.changed())).await;
        })
    }
}

pub async fn events(
    State(state): State<AppState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let store = &state.store;
    let mut triggers: Vec<Box<dyn Trigger>> = vec![
        store.election.trigger(),
        store.peers.trigger(),
        store.schedule.trigger(),
        store.scheduler.trigger(),
        store.inputs.trigger(),
        store.roles.trigger(),
        store.reports.trigger(),
        store.actions.trigger(),
    ];
    for t in &mut triggers {
        t.mark_seen();
    }
    let watch = Watch {
        state,
        triggers,
        first: true,
        last: None,
    };
    let stream = futures::stream::unfold(watch, |mut watch| async move {
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
            let event = Event::default().event("status").data(text);
            return Some((Ok(event), watch));
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
