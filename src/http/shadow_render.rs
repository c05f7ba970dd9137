//! `POST /v1/shadow/render/<role>` with `{"template_version": "v2"}`: a shadow render of one of
//! this node's roles from the schedule in force, its real template against the candidate
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
    template_version: String,
}

pub(crate) struct ShadowRenderBody;

impl JsonRoute for ShadowRenderBody {
    type Body = ShadowRenderRequest;
    const RULES: BodyRules = BodyRules::json(
        BODY_LIMIT,
        "send {\"template_version\": ...} as Content-Type: application/json",
        |limit| format!("a shadow render request is at most {limit} bytes of JSON"),
    );
}

pub(crate) async fn shadow_render(
    State(state): State<AppState>,
    UrlPath(role): UrlPath<String>,
    body: JsonBody<ShadowRenderBody>,
) -> Result<Json<ShadowRender>, ApiError> {
    let request = body.into_inner();
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
    tracing::info!(%role, template_version = %request.template_version, "Shadow render.");
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
        let base = shadow::template_of(&real)?;
        let mut candidate = real.clone();
        let name = shadow::candidate_template(&base, &request.template_version)?;
        candidate.insert("template".into(), serde_json::Value::String(name));
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
