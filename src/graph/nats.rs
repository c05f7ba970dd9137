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
use verwalter_controllers::ports::{BusError, GraphBus};

use super::metrics::GraphMetrics;

/// Between two attempts of the first connection.
const CONNECT_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between reconnect attempts: a restarted server is found within this.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// [`GraphBus`] on an async-nats client.
#[derive(Clone)]
pub struct NatsBus(pub async_nats::Client);

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

    fn flush(&self) -> BoxFuture<'static, Result<(), BusError>> {
        let client = self.0.clone();
        async move { client.flush().await.map_err(|e| BusError(e.to_string())) }.boxed()
    }

    /// What the server announced (NATS's default when it announced nothing).
    fn max_payload(&self) -> usize {
        match self.0.server_info().max_payload {
            0 => verwalter_controllers::ernest::DEFAULT_MAX_PAYLOAD,
            announced => announced,
        }
    }
}

/// A connection with its subscriptions forwarded into the loop's inbox.
pub struct Connection {
    pub bus: NatsBus,
    pub forwarder: JoinHandle<()>,
}

/// The subjects the executor listens to (see the module docs of `graph`).
pub fn subjects() -> Vec<String> {
    let mut subjects: Vec<String> = BUILD_ACTIONS.iter().map(|a| format!("build.{a}")).collect();
    subjects.push("*.*.*.done".into());
    subjects.push("*.*.*.error".into());
    subjects
}

/// Connects to `url` (trying again every second until it can, or `None` on shutdown) and
/// subscribes.
pub async fn connect(
    url: &str,
    auth: &super::nats_options::NatsAuth,
    inbox: mpsc::Sender<Input>,
    metrics: Arc<GraphMetrics>,
    shutdown: &CancellationToken,
) -> Option<Connection> {
    let connects = Arc::new(AtomicUsize::new(0));
    let mut warned = false;
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
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(CONNECT_RETRY) => {}
        }
    };
    let mut streams = Vec::new();
    for subject in subjects() {
        match client.subscribe(subject.clone()).await {
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
