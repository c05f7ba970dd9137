//! The executor's NATS connection: connect (retrying), subscribe, forward, publish, flush.
//!
//! async-nats reconnects by itself, sends the subscriptions again and then what was published
//! while it was away (up to its client capacity). The loop is told of each reconnect and
//! flushes; reconnects are logged and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::ernest::BUILD_ACTIONS;
use verwalter_controllers::ernest::executor_loop::Input;
use verwalter_controllers::machinery::backoff::Backoff;
use verwalter_controllers::machinery::ports::{BusError, GraphBus};

use super::metrics::GraphMetrics;

/// Between two attempts of the first connection.
const CONNECT_RETRY: Backoff = Backoff::fixed(Duration::from_secs(1));
/// The longest wait between reconnect attempts: a restarted server is found within this.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// [`GraphBus`] on an async-nats client.
#[derive(Clone)]
pub(crate) struct NatsBus(pub(crate) async_nats::Client);

impl GraphBus for NatsBus {
    fn publish(
        &self,
        subject: String,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), BusError>> {
        let client = self.0.clone();
        async move {
            client
                .publish(subject, payload.into())
                .await
                .map_err(|e| BusError(e.to_string()))
        }
        .boxed()
    }

    /// With `Nats-Msg-Id`: a JetStream stream that captures the subject keeps one copy within
    /// its duplicate window.
    fn publish_result(
        &self,
        subject: String,
        payload: Vec<u8>,
        msg_id: String,
    ) -> BoxFuture<'static, Result<(), BusError>> {
        let client = self.0.clone();
        async move {
            crash_for_tests(CrashPoint::BeforeResult);
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id.as_str());
            client
                .publish_with_headers(subject, headers, payload.into())
                .await
                .map_err(|e| BusError(e.to_string()))?;
            if crash_point() == Some(CrashPoint::AfterResult) {
                // On the server, and not yet marked `sent` in the build's file.
                let _ = client.flush().await;
                crash_for_tests(CrashPoint::AfterResult);
            }
            Ok(())
        }
        .boxed()
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), BusError>> {
        let client = self.0.clone();
        async move { client.flush().await.map_err(|e| BusError(e.to_string())) }.boxed()
    }

    /// What the server announced (NATS's default when it announced nothing).
    fn max_payload(&self) -> usize {
        match self.0.server_info().max_payload {
            0 => verwalter_controllers::machinery::ports::DEFAULT_MAX_PAYLOAD,
            announced => announced,
        }
    }
}

/// Where `VERWALTER_TEST_GRAPH_CRASH` kills the executor: `before-result` (a build's result is
/// stored as `sending` and not published) or `after-result` (published and flushed, not yet
/// marked `sent`). For the delivery tests (`tests/graph_nats/delivery.rs`): no test can time a
/// SIGKILL into the microseconds between those steps. Debug builds only; release builds have no
/// such switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CrashPoint {
    BeforeResult,
    AfterResult,
}

fn crash_point() -> Option<CrashPoint> {
    #[cfg(debug_assertions)]
    {
        match std::env::var("VERWALTER_TEST_GRAPH_CRASH").as_deref() {
            Ok("before-result") => return Some(CrashPoint::BeforeResult),
            Ok("after-result") => return Some(CrashPoint::AfterResult),
            _ => {}
        }
    }
    None
}

/// SIGKILL to this process when the crash point `at` is switched on.
fn crash_for_tests(at: CrashPoint) {
    if crash_point() == Some(at) {
        tracing::warn!(point = ?at, "VERWALTER_TEST_GRAPH_CRASH: killing the executor.");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// The queue group of the build subjects: among executors on one NATS server (or cluster),
/// each build goes to one of them.
pub(crate) const QUEUE_GROUP: &str = "verwalter-graph";

/// A connection with its subscriptions forwarded into the loop's inbox.
pub(crate) struct Connection {
    pub(crate) bus: NatsBus,
    pub(crate) forwarder: JoinHandle<()>,
}

/// The subjects the executor listens to (see the module docs of `graph`), each with its queue
/// group: the builds are taken by one executor of the group ([`QUEUE_GROUP`]); the answers
/// reach every executor, since only the one that holds the build (by its `service`) can take
/// them; the others ignore them.
pub(crate) fn subjects() -> Vec<(String, Option<&'static str>)> {
    let mut subjects: Vec<_> = BUILD_ACTIONS
        .iter()
        .map(|a| (format!("build.{a}"), Some(QUEUE_GROUP)))
        .collect();
    subjects.push(("*.*.*.done".into(), None));
    subjects.push(("*.*.*.error".into(), None));
    subjects
}

/// Connects to `url` (trying again every second until it can, or `None` on shutdown) and
/// subscribes.
pub(crate) async fn connect(
    url: &str,
    auth: &super::nats_options::NatsAuth,
    inbox: mpsc::Sender<Input>,
    metrics: Arc<GraphMetrics>,
    shutdown: &CancellationToken,
) -> Option<Connection> {
    let connects = Arc::new(AtomicUsize::new(0));
    let mut warned = false;
    let mut failures = 0;
    let client = loop {
        let events = inbox.clone();
        let counted = connects.clone();
        let counter = metrics.clone();
        let options = auth
            .options(url)
            .name("verwalter graph executor")
            .no_echo()
            .reconnect_delay_callback(|attempts| {
                (Duration::from_millis(100) * attempts as u32).min(MAX_RECONNECT_DELAY)
            })
            .event_callback(move |event| {
                let events = events.clone();
                let counted = counted.clone();
                let counter = counter.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            // The first connect is logged by `connect` itself.
                            if counted.fetch_add(1, Ordering::SeqCst) > 0 {
                                counter.reconnected();
                                tracing::info!("Graph executor reconnected to NATS.");
                                let _ = events.try_send(Input::Reconnected);
                            }
                        }
                        async_nats::Event::Disconnected => {
                            tracing::warn!("Graph executor lost its NATS connection; reconnecting.")
                        }
                        other => tracing::info!(event = %other, "NATS connection event."),
                    }
                }
            });
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            result = options.connect(url) => match result {
                Ok(client) => break client,
                Err(error) => {
                    if !warned {
                        tracing::warn!(url = %super::redact_url(url),
                            error = %auth.scrub(url, &error.to_string()), hint = %auth.hint(&error),
                            "Graph executor cannot connect to NATS; trying again every second.");
                        warned = true;
                    }
                }
            },
        }
        failures += 1;
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(CONNECT_RETRY.nominal(failures)) => {}
        }
    };
    let mut streams = Vec::new();
    for (subject, queue) in subjects() {
        let subscribed = match queue {
            Some(group) => client.queue_subscribe(subject.clone(), group.into()).await,
            None => client.subscribe(subject.clone()).await,
        };
        match subscribed {
            Ok(sub) => streams.push(sub),
            Err(error) => {
                tracing::error!(%subject, %error, "Graph executor cannot subscribe.");
                return None;
            }
        }
    }
    // The subscriptions reach the server before anyone is told the executor listens.
    if let Err(error) = client.flush().await {
        tracing::warn!(%error, "Flush after subscribing failed.");
    }
    tracing::info!(url = %super::redact_url(url), "Graph executor connected to NATS.");
    let mut all = futures::stream::select_all(streams);
    let forwarder = tokio::spawn(async move {
        while let Some(message) = all.next().await {
            let input = Input::Message {
                subject: message.subject.to_string(),
                payload: message.payload.to_vec(),
            };
            if inbox.send(input).await.is_err() {
                break;
            }
        }
    });
    Some(Connection {
        bus: NatsBus(client),
        forwarder,
    })
}
