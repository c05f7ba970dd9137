//! `POST /v1/shadow/render/<role>` with `{"template_version": "v2"}` and/or `{"shadow": "v2"}`:
//! a shadow render of one of this node's roles from the schedule in force, its real template
//! against the candidate and/or with the variables of a shadow scheduler's latest output
//! (`crate::render::shadow`), in a scratch dir under `<storage>/shadow-render/`. Nothing is
//! applied: no command runs, no staging file, applied hash or deployment log is written. One at
//! a time (another gets 503).

use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use serde::Deserialize;

use super::body::{BodyRules, JsonBody, JsonRoute};
use super::{ApiError, AppState};
use crate::render::shadow::{self, ShadowRender};
use verwalter_controllers::state::Schedule;

/// The body is one short name.
const BODY_LIMIT: usize = 4 << 10;

/// Where this node's shadow renders happen.
#[derive(Debug)]
pub(crate) struct ShadowDirs {
    config_dir: PathBuf,
    /// `<storage>/shadow-render`: each render's scratch dir is made in it and removed after.
    scratch: PathBuf,
    busy: Arc<tokio::sync::Semaphore>,
}

impl ShadowDirs {
    /// Removes what a render cut short by a stop left in `scratch`.
    pub(crate) fn new(config_dir: PathBuf, scratch: PathBuf) -> ShadowDirs {
        match std::fs::remove_dir_all(&scratch) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(dir = %scratch.display(), error = %e, "Cannot clean the shadow render dir.");
            }
            _ => {}
        }
        ShadowDirs {
            config_dir,
            scratch,
            busy: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }
}

/// The body of `POST /v1/shadow/render/<role>`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShadowRenderRequest {
    /// A template dir under `templates/` (`web/v2`) or a version of the role's (`v2`).
    #[serde(default)]
    template_version: Option<String>,
    /// A shadow scheduler: the role's variables from its latest run with an output.
    #[serde(default)]
    shadow: Option<String>,
}

pub(crate) struct ShadowRenderBody;

impl JsonRoute for ShadowRenderBody {
    type Body = ShadowRenderRequest;
    const RULES: BodyRules = BodyRules::json(
        BODY_LIMIT,
        "send {\"template_version\": ...} and/or {\"shadow\": ...} as Content-Type: application/json",
        |limit| format!("a shadow render request is at most {limit} bytes of JSON"),
    );
}

pub(crate) async fn shadow_render(
    State(state): State<AppState>,
    UrlPath(role): UrlPath<String>,
    body: JsonBody<ShadowRenderBody>,
) -> Result<Json<ShadowRender>, ApiError> {
    let request = body.into_inner();
    if request.template_version.is_none() && request.shadow.is_none() {
        return Err(ApiError::bad_request(
            "name a candidate: {\"template_version\": ...} and/or {\"shadow\": ...}",
        ));
    }
    let shadow_schedule = match &request.shadow {
        Some(name) => Some(shadow_output(&state, name).inspect_err(|error| {
            tracing::warn!(%role, %error, "Shadow render failed.");
        })?),
        None => None,
    };
    let Some(dirs) = state.http.shadow_render.clone() else {
        return Err(ApiError::internal(
            "shadow renders are not set up on this node",
        ));
    };
    let Ok(_turn) = dirs.busy.clone().try_acquire_owned() else {
        return Err(ApiError::unavailable(
            "a shadow render is in progress; retry later",
            "1",
        ));
    };
    let schedule = state.store.schedule.peek();
    let Some(schedule) = schedule.as_ref().clone() else {
        return Err(ApiError::internal("no schedule yet"));
    };
    let hostname = state.node.hostname.clone();
    tracing::info!(%role, template_version = ?request.template_version, shadow = ?request.shadow, "Shadow render.");
    let shown = role.clone();
    // Templates render off the async runtime.
    let result = tokio::task::spawn_blocking(move || {
        let id = verwalter_controllers::render::deployment_id();
        let now = verwalter_controllers::machinery::clock::rfc3339(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        );
        let real = crate::render::cli::schedule_vars(
            &dirs.config_dir,
            &schedule,
            &hostname,
            &role,
            (&id, &now),
            "the schedule in force",
        )?;
        let mut candidate = match &shadow_schedule {
            None => real.clone(),
            Some((shown, schedule)) => crate::render::cli::schedule_vars(
                &dirs.config_dir,
                schedule,
                &hostname,
                &role,
                (&id, &now),
                shown,
            )
            .map_err(|e| format!("shadow: {e}"))?,
        };
        if let Some(version) = &request.template_version {
            let base = shadow::template_of(&candidate).map_err(|e| format!("shadow: {e}"))?;
            let name = shadow::candidate_template(&base, version)?;
            candidate.insert("template".into(), serde_json::Value::String(name));
        }
        std::fs::create_dir_all(&dirs.scratch)
            .map_err(|e| format!("{}: {e}", dirs.scratch.display()))?;
        shadow::shadow_render(
            &dirs.config_dir,
            &role,
            real,
            candidate,
            Some(&dirs.scratch),
        )
    })
    .await
    .map_err(|e| ApiError::internal(format!("the shadow render did not finish: {e}")))?;
    result.map(Json).map_err(|error| {
        tracing::warn!(role = %shown, %error, "Shadow render failed.");
        ApiError::bad_request(error)
    })
}

/// The schedule of shadow `name`'s latest run with an output (and how errors name it).
fn shadow_output(state: &AppState, name: &str) -> Result<(String, Schedule), ApiError> {
    let Some(shadows) = state.http.shadows.as_ref() else {
        return Err(ApiError::bad_request(format!(
            "no shadow {name:?}: shadow schedulers run on the leader, and this node has none"
        )));
    };
    let Some(runs) = shadows.records().runs(name) else {
        return Err(ApiError::bad_request(format!(
            "no shadow {name:?} (it has no runs kept on this node)"
        )));
    };
    let Some(run) = runs.iter().find(|r| r.output.is_some()) else {
        return Err(ApiError::bad_request(format!(
            "shadow {name:?} has no run with an output among the {} kept",
            runs.len()
        )));
    };
    let output = run.output.clone().unwrap_or_default();
    let shown = format!("shadow {name:?}'s run {}", run.run);
    Ok((shown, Schedule::new(output, 0, String::new())))
}
