//! verwalter's own deployment events on NATS, for other systems to react to: a tee in front of
//! the deployment log ([`DeploymentLog`]) that also publishes what the render controller reports.
//!
//! Subjects (`<prefix>` is `verwalter` unless the settings say otherwise), payloads JSON with
//! `node` and `deployment_id`:
//! - `<prefix>.deployment.started`: `roles` of the pass;
//! - `<prefix>.role.applied`, `<prefix>.role.failed`, `<prefix>.role.blocked` (with `reason`): one
//!   per role of the pass, when the pass finishes;
//! - `<prefix>.deployment.finished`: `failed` and `blocked` roles.
//!
//! Publishing never holds up a deployment: events go through a bounded queue to a task that
//! connects (retrying) and publishes; when the queue is full, events are dropped and counted in
//! the log.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use verwalter_controllers::ports::DeploymentLog;

/// Events waiting for the publisher at most (a deployment has a handful per role).
const QUEUE: usize = 4096;
/// Between two attempts of the first connection.
const CONNECT_RETRY: Duration = Duration::from_secs(1);

/// `deployment-events:` in the settings. Its `Debug` shows the NATS URL without its password.
#[derive(Clone, PartialEq)]
pub struct EventSettings {
    pub nats_url: String,
    /// TLS and credentials beyond the URL's (`deployment-events.nats-*`).
    pub nats_auth: super::nats_options::NatsAuth,
    pub prefix: String,
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

/// The messages of a finished pass: one per role, then the deployment's.
pub fn finish_events(
    prefix: &str,
    node: &str,
    id: &str,
    roles: &[String],
    failed: &[String],
    blocked: &[(String, String)],
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for role in roles {
        let (what, reason) = if failed.contains(role) {
            ("failed", None)
        } else if let Some((_, why)) = blocked.iter().find(|(r, _)| r == role) {
            ("blocked", Some(why.clone()))
        } else {
            ("applied", None)
        };
        let mut payload = json!({"node": node, "deployment_id": id, "role": role});
        if let Some(reason) = reason {
            payload["reason"] = Value::from(reason);
        }
        out.push((format!("{prefix}.role.{what}"), payload));
    }
    let blocked: Vec<&String> = blocked.iter().map(|(r, _)| r).collect();
    out.push((
        format!("{prefix}.deployment.finished"),
        json!({"node": node, "deployment_id": id, "failed": failed, "blocked": blocked}),
    ));
    out
}

/// The deployment log, teed to NATS.
pub struct NatsEvents {
    inner: Arc<dyn DeploymentLog>,
    node: String,
    prefix: String,
    queue: mpsc::Sender<(String, Vec<u8>)>,
    /// Roles of each pass that has started and not finished.
    passes: Mutex<HashMap<String, Vec<String>>>,
}

impl NatsEvents {
    /// The tee, and the task that publishes (runs until `shutdown`).
    pub fn start(
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
            passes: Mutex::new(HashMap::new()),
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
        self.passes
            .lock()
            .unwrap()
            .insert(id.to_string(), roles.to_vec());
        self.send(
            format!("{}.deployment.started", self.prefix),
            &json!({"node": self.node, "deployment_id": id, "roles": roles,
                    "schedule_hash": schedule_hash}),
        );
    }

    fn deployment_finish(&self, id: &str, failed: &[String], blocked: &[(String, String)]) {
        self.inner.deployment_finish(id, failed, blocked);
        let roles = self.passes.lock().unwrap().remove(id).unwrap_or_default();
        for (subject, payload) in
            finish_events(&self.prefix, &self.node, id, &roles, failed, blocked)
        {
            self.send(subject, &payload);
        }
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
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(CONNECT_RETRY) => {}
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
    fn a_finished_pass_says_what_became_of_each_role() {
        let roles = ["web".to_string(), "db".to_string(), "app".to_string()];
        let events = finish_events(
            "verwalter",
            "alpha",
            "d1",
            &roles,
            &["db".to_string()],
            &[("app".to_string(), "depends on db".to_string())],
        );
        let subjects: Vec<&str> = events.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(
            subjects,
            [
                "verwalter.role.applied",
                "verwalter.role.failed",
                "verwalter.role.blocked",
                "verwalter.deployment.finished"
            ]
        );
        assert_eq!(events[2].1["reason"], "depends on db");
        assert_eq!(events[3].1["failed"], json!(["db"]));
        assert_eq!(events[3].1["blocked"], json!(["app"]));
        assert_eq!(events[0].1["node"], "alpha");
    }
}
