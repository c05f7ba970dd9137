//! `/v1/shadow`: the leader's shadow schedulers, their runs and each run whole
//! (docs/http-api.md#shadow-schedulers).

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use serde::Serialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::schedule::shadow::Shadows;
use crate::schedule::shadow::records::{RunSummary, ShadowRun};

/// One shadow in `/v1/shadow`.
#[derive(Debug, Serialize)]
struct ShadowInfo {
    name: String,
    /// Named in `scheduler/shadow.yaml` (and runnable) as the last round read it; a shadow
    /// no longer named is listed while runs of it are kept.
    configured: bool,
    /// The run it is busy with, if any.
    busy_with: Option<u64>,
    /// Why its last run could not be written to the storage dir (it is kept in memory).
    write_error: Option<String>,
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
            write_error: shadows.records().write_error(&name),
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

/// `Query.shadows`'s tree: each shadow as `/v1/shadow` lists it, field names in GraphQL's case;
/// `latest` with its log and diff, `history` the summaries, newest first.
pub(crate) fn graphql_tree(shadows: Option<&Shadows>) -> Value {
    let Some(shadows) = shadows else {
        return json!([]);
    };
    let config = shadows.config();
    let mut names = config.shadows.clone();
    for name in shadows.records().names() {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let run = |r: &ShadowRun, whole: bool| {
        json!({
            "run": r.run, "time": r.time, "inputHash": r.input_hash, "realHash": r.real_hash,
            "result": r.result.label(), "pathsDiffering": r.paths_differing,
            "error": r.error.as_ref().map(|e| format!("{}: {}", e.kind, e.message)),
            "durationMs": r.duration_ms, "memoryBytes": r.memory_bytes,
            "realError": r.real_error, "codeVersion": r.code_version,
            "log": whole.then(|| r.log.clone()), "diff": if whole { r.diff.clone() } else { None },
            "output": if whole { r.output.clone() } else { None },
        })
    };
    Value::Array(
        names
            .into_iter()
            .map(|name| {
                let runs = shadows.records().runs(&name).unwrap_or_default();
                json!({
                    "name": name,
                    "configured": config.shadows.contains(&name),
                    "busyWith": shadows.busy_with(&name),
                    "latest": runs.first().map(|r| run(r, true)),
                    "history": runs.iter().map(|r| run(r, false)).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}
