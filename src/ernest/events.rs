//! verwalter's own deployment events on NATS, for other systems to react to: a tee in front of
//! the deployment log ([`DeploymentLog`]) that also publishes what the render controller reports.
//!
//! Subjects (`<prefix>` is `verwalter` unless the settings say otherwise), payloads JSON with
//! `node` and `deployment_id`:
//! - `<prefix>.deployment.started`: `roles` of the pass;
//! - `<prefix>.role.applied`, `<prefix>.role.failed`, `<prefix>.role.blocked` (with `reason`): one
//!   per role of the pass, as the role finishes, with `time` (RFC 3339) and `time_ms` (ms since
//!   the epoch);
//! - `<prefix>.deployment.finished`: `failed` and `blocked` roles, after the roles' events.
//!
//! Publishing never holds up a deployment: events go through a bounded queue to a task that
//! connects (retrying) and publishes; when the queue is full, events are dropped and counted in
//! the log.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::machinery::backoff::Backoff;
use verwalter_controllers::machinery::clock::rfc3339;
use verwalter_controllers::machinery::ports::{DeploymentLog, RoleOutcome};

/// Events waiting for the publisher at most (a deployment has a handful per role).
const QUEUE: usize = 4096;
/// Between two attempts of the first connection.
const CONNECT_RETRY: Backoff = Backoff::fixed(Duration::from_secs(1));

/// `deployment-events:` in the settings. Its `Debug` shows the NATS URL without its password.
#[derive(Clone, PartialEq)]
pub(crate) struct EventSettings {
    pub(crate) nats_url: String,
    /// TLS and credentials beyond the URL's (`deployment-events.nats-*`).
    pub(crate) nats_auth: super::nats_options::NatsAuth,
    pub(crate) prefix: String,
}

impl std::fmt::Debug for EventSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSettings")
            .field("nats_url", &super::redact_url(&self.nats_url))
            .field("nats_auth", &self.nats_auth)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// The message of a role that finished its attempt in pass `id` at `at` (ms since the epoch).
pub(crate) fn role_event(
    prefix: &str,
    node: &str,
    id: &str,
    role: &str,
    outcome: &RoleOutcome,
    at: u64,
) -> (String, Value) {
    let mut payload = json!({"node": node, "deployment_id": id, "role": role,
                             "time": rfc3339(at), "time_ms": at});
    if let RoleOutcome::Blocked(reason) = outcome {
        payload["reason"] = Value::from(reason.as_str());
    }
    (format!("{prefix}.role.{}", outcome.name()), payload)
}

/// The message of a finished pass (after its roles' own).
pub(crate) fn finish_event(
    prefix: &str,
    node: &str,
    id: &str,
    failed: &[String],
    blocked: &[(String, String)],
) -> (String, Value) {
    let blocked: Vec<&String> = blocked.iter().map(|(r, _)| r).collect();
    (
        format!("{prefix}.deployment.finished"),
        json!({"node": node, "deployment_id": id, "failed": failed, "blocked": blocked}),
    )
}

/// The deployment log, teed to NATS.
pub(crate) struct NatsEvents {
    inner: Arc<dyn DeploymentLog>,
    node: String,
    prefix: String,
    queue: mpsc::Sender<(String, Vec<u8>)>,
}

impl NatsEvents {
    /// The tee, and the task that publishes (runs until `shutdown`).
    pub(crate) fn start(
        settings: &EventSettings,
        node: &str,
        inner: Arc<dyn DeploymentLog>,
        shutdown: CancellationToken,
    ) -> (NatsEvents, BoxFuture<'static, ()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = Box::pin(publish(
            settings.nats_url.clone(),
            settings.nats_auth.clone(),
            rx,
            shutdown,
        ));
        let tee = NatsEvents {
            inner,
            node: node.to_string(),
            prefix: settings.prefix.clone(),
            queue: tx,
        };
        (tee, task)
    }

    fn send(&self, subject: String, payload: &Value) {
        let bytes = serde_json::to_vec(payload).unwrap_or_default();
        if self.queue.try_send((subject.clone(), bytes)).is_err() {
            tracing::warn!(%subject, "Deployment event dropped: the NATS publisher is behind.");
        }
    }
}

impl DeploymentLog for NatsEvents {
    fn deployment_start(
        &self,
        id: &str,
        schedule_hash: &str,
        roles: &[String],
        changes: &[String],
    ) {
        self.inner
            .deployment_start(id, schedule_hash, roles, changes);
        self.send(
            format!("{}.deployment.started", self.prefix),
            &json!({"node": self.node, "deployment_id": id, "roles": roles,
                    "schedule_hash": schedule_hash}),
        );
    }

    fn deployment_finish(&self, id: &str, failed: &[String], blocked: &[(String, String)]) {
        self.inner.deployment_finish(id, failed, blocked);
        let (subject, payload) = finish_event(&self.prefix, &self.node, id, failed, blocked);
        self.send(subject, &payload);
    }

    fn role_finished(&self, id: &str, role: &str, outcome: &RoleOutcome, at: u64) {
        self.inner.role_finished(id, role, outcome, at);
        let (subject, payload) = role_event(&self.prefix, &self.node, id, role, outcome, at);
        self.send(subject, &payload);
    }

    fn problem(&self) -> Option<String> {
        self.inner.problem()
    }
}

async fn publish(
    url: String,
    auth: super::nats_options::NatsAuth,
    mut rx: mpsc::Receiver<(String, Vec<u8>)>,
    shutdown: CancellationToken,
) {
    let mut warned = false;
    let mut failures = 0;
    let client = loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            result = auth.options(&url)
                .name("verwalter deployment events")
                .connect(url.as_str()) => match result {
                Ok(client) => break client,
                Err(error) => if !warned {
                    tracing::warn!(url = %super::redact_url(&url),
                        error = %auth.scrub(&url, &error.to_string()), hint = %auth.hint(&error),
                        "Deployment events: cannot connect to NATS; trying again every second.");
                    warned = true;
                },
            },
        }
        failures += 1;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(CONNECT_RETRY.nominal(failures)) => {}
        }
    };
    tracing::info!(url = %super::redact_url(&url), "Deployment events go to NATS.");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            event = rx.recv() => {
                let Some((subject, payload)) = event else { break };
                if let Err(error) = client.publish(subject.clone(), payload.into()).await {
                    tracing::warn!(%subject, %error, "Deployment event not published.");
                }
            }
        }
    }
    let _ = client.flush().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_says_what_became_of_it_and_when_and_the_pass_what_failed() {
        let at = 1_700_000_000_123;
        let event = |role, outcome| role_event("verwalter", "alpha", "d1", role, &outcome, at);
        let (subject, applied) = event("web", RoleOutcome::Applied);
        assert_eq!(subject, "verwalter.role.applied");
        assert_eq!(
            applied,
            json!({"node": "alpha", "deployment_id": "d1", "role": "web",
                   "time": "2023-11-14T22:13:20Z", "time_ms": at})
        );
        assert_eq!(event("db", RoleOutcome::Failed).0, "verwalter.role.failed");
        let (subject, blocked) = event("app", RoleOutcome::Blocked("depends on db".into()));
        assert_eq!(subject, "verwalter.role.blocked");
        assert_eq!(blocked["reason"], "depends on db");
        let (subject, finished) = finish_event(
            "verwalter",
            "alpha",
            "d1",
            &["db".to_string()],
            &[("app".to_string(), "depends on db".to_string())],
        );
        assert_eq!(subject, "verwalter.deployment.finished");
        assert_eq!(finished["failed"], json!(["db"]));
        assert_eq!(finished["blocked"], json!(["app"]));
    }
}
