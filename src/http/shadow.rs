//! `/v1/shadow`: the leader's shadow schedulers, their runs and each run whole
//! (docs/http-api.md#shadow-schedulers).

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use serde::Serialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::schedule::shadow::Shadows;
use crate::schedule::shadow::records::RunSummary;

/// One shadow in `/v1/shadow`.
#[derive(Debug, Serialize)]
struct ShadowInfo {
    name: String,
    /// Named in `scheduler/shadow.yaml` (and runnable) as the last round read it; a shadow
    /// no longer named is listed while runs of it are kept.
    configured: bool,
    /// The run it is busy with, if any.
    busy_with: Option<u64>,
    latest: Option<RunSummary>,
}

fn shadows_of(state: &AppState) -> Option<&Shadows> {
    state.http.shadows.as_ref()
}

/// `GET /v1/shadow`: each shadow with its latest run, what is wrong in `shadow.yaml`, and how
/// many runs are kept.
pub(crate) async fn shadows(State(state): State<AppState>) -> Json<Value> {
    let Some(shadows) = shadows_of(&state) else {
        return Json(json!({"shadows": [], "problems": [], "keep_runs": null}));
    };
    let config = shadows.config();
    let mut names = config.shadows.clone();
    for name in shadows.records().names() {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let list: Vec<ShadowInfo> = names
        .into_iter()
        .map(|name| ShadowInfo {
            configured: config.shadows.contains(&name),
            busy_with: shadows.busy_with(&name),
            latest: shadows.records().latest(&name).map(|r| r.summary()),
            name,
        })
        .collect();
    Json(json!({
        "shadows": list,
        "problems": config.problems,
        "keep_runs": config.keep_runs,
    }))
}

/// `GET /v1/shadow/<name>/runs`: the runs kept, newest first.
pub(crate) async fn runs(
    State(state): State<AppState>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    let runs = shadows_of(&state)
        .and_then(|s| s.records().runs(&name))
        .ok_or_else(|| ApiError::not_found(format!("no runs of a shadow scheduler {name:?}")))?;
    let runs: Vec<RunSummary> = runs.iter().map(|r| r.summary()).collect();
    Ok(Json(json!({"shadow": name, "runs": runs})))
}

/// `GET /v1/shadow/<name>/runs/<id>`: one run whole (output, log, diff).
pub(crate) async fn run(
    State(state): State<AppState>,
    UrlPath((name, id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let missing = || {
        ApiError::not_found(format!(
            "no run {id} of a shadow scheduler {name:?} is kept"
        ))
    };
    let number: u64 = id.parse().map_err(|_| missing())?;
    let run = shadows_of(&state)
        .and_then(|s| s.records().get(&name, number))
        .ok_or_else(missing)?;
    serde_json::to_value(&*run)
        .map(Json)
        .map_err(|e| ApiError::internal(e.to_string()))
}
