//! Shadow renders: a role rendered with a candidate template dir (or another schedule's
//! variables) into a scratch dir beside its real template rendered with the same pass, and the
//! file-by-file diff of the two. No command of either side runs: only templates are rendered.
//!
//! Both sides are rendered now, with one deployment id and timestamp, rather than the shadow
//! compared with the real render's staging files: those carry the real pass's id and time (any
//! template printing them would differ everywhere), are rewritten by failed attempts, and are
//! gone after a restart until the role renders again.

mod unified;

use std::collections::BTreeMap;
use std::path::{Component, Path};

use serde::Serialize;
use serde_json::{Map, Value};
use verwalter_controllers::render::vars;

use super::{TemplateSet, Vars};

/// What a shadow render found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShadowRender {
    pub role: String,
    /// The template dirs of the two sides (`web/v1`, `web/v2`).
    pub real_template: String,
    pub shadow_template: String,
    /// No file differs.
    pub identical: bool,
    /// The files that differ, by [`FileDiff::file`].
    pub files: Vec<FileDiff>,
    /// The files both sides render alike.
    pub unchanged: Vec<String>,
}

/// One rendered file that differs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileDiff {
    /// `<render file>:<template name>` (`role.render.yaml:conf`): the render file and the name
    /// its commands know the file by (`{{ files.conf }}`).
    pub file: String,
    pub kind: FileChange,
    /// The unified diff, real (`---`) to shadow (`+++`); an added or removed file against
    /// `/dev/null`.
    pub diff: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileChange {
    /// Only the shadow renders it.
    Added,
    /// Only the real template renders it.
    Removed,
    Changed,
}

/// The template dir a candidate names: a name with a `/` is a template dir under
/// `templates/` as it is (`web/v2`); a bare version replaces the last part of the role's
/// template (`v2` with `web/v1` gives `web/v2`).
pub fn candidate_template(real: &str, candidate: &str) -> Result<String, String> {
    let name = match (candidate.contains('/'), real.rsplit_once('/')) {
        (true, _) | (false, None) => candidate.to_string(),
        (false, Some((base, _))) => format!("{base}/{candidate}"),
    };
    let path = Path::new(&name);
    if candidate.is_empty() || !path.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(format!(
            "template {candidate:?}: a dir under templates/ (like web/v2) or a version (v2)"
        ));
    }
    Ok(name)
}

/// The template dir of `vars` (its `template`).
pub fn template_of(vars: &Map<String, Value>) -> Result<String, String> {
    match vars.get("template") {
        Some(Value::String(t)) => Ok(t.clone()),
        _ => Err("the variables have no `template` (a dir under templates/)".into()),
    }
}

/// Renders `role` with `real` and with `shadow` variables (each with its `template`) into two
/// dirs of a scratch dir made under `scratch_parent` (the system's temp dir if `None`) and
/// removed at the end, and diffs the files. Errors name the side and its template dir.
pub fn shadow_render(
    config_dir: &Path,
    role: &str,
    real: Map<String, Value>,
    shadow: Map<String, Value>,
    scratch_parent: Option<&Path>,
) -> Result<ShadowRender, String> {
    if let Some(why) = vars::unsafe_role_name(role) {
        return Err(format!("role {role:?}: {why}"));
    }
    let mut builder = tempfile::Builder::new();
    builder.prefix("verwalter-shadow-render.");
    let scratch = match scratch_parent {
        Some(parent) => builder.tempdir_in(parent),
        None => builder.tempdir(),
    }
    .map_err(|e| format!("scratch dir: {e}"))?;
    let real_template = template_of(&real).map_err(|e| format!("real: {e}"))?;
    let shadow_template = template_of(&shadow).map_err(|e| format!("shadow: {e}"))?;
    let real_files = render_side(
        config_dir,
        &real_template,
        real,
        &scratch.path().join("real"),
    )
    .map_err(|e| format!("real: {e}"))?;
    let shadow_files = render_side(
        config_dir,
        &shadow_template,
        shadow,
        &scratch.path().join("shadow"),
    )
    .map_err(|e| format!("shadow: {e}"))?;
    let mut files = Vec::new();
    let mut unchanged = Vec::new();
    let names: std::collections::BTreeSet<&String> =
        real_files.keys().chain(shadow_files.keys()).collect();
    for name in names {
        let read = |side: Option<&Rendered>| -> Result<Option<(String, String)>, String> {
            side.map(|r| {
                let text = std::fs::read_to_string(&r.path)
                    .map_err(|e| format!("{}: {e}", r.path.display()))?;
                Ok((r.shown.clone(), text))
            })
            .transpose()
        };
        let (kind, diff) = match (read(real_files.get(name))?, read(shadow_files.get(name))?) {
            (Some((_, a)), Some((_, b))) if a == b => {
                unchanged.push(name.clone());
                continue;
            }
            (Some((from, a)), Some((to, b))) => (
                FileChange::Changed,
                unified::unified(&a, &b, &format!("real/{from}"), &format!("shadow/{to}")),
            ),
            (Some((from, a)), None) => (
                FileChange::Removed,
                unified::unified(&a, "", &format!("real/{from}"), "/dev/null"),
            ),
            (None, Some((to, b))) => (
                FileChange::Added,
                unified::unified("", &b, "/dev/null", &format!("shadow/{to}")),
            ),
            (None, None) => unreachable!("the name comes from one side"),
        };
        files.push(FileDiff {
            file: name.clone(),
            kind,
            diff,
        });
    }
    Ok(ShadowRender {
        role: role.to_string(),
        real_template,
        shadow_template,
        identical: files.is_empty(),
        files,
        unchanged,
    })
}

/// A file one side rendered: where it was written and which template made it.
struct Rendered {
    path: std::path::PathBuf,
    /// `templates/web/v1/role.conf.hbs`.
    shown: String,
}

/// Renders every template of `template` with `vars` into `dir` (named `<n>.<name>` as in the
/// staging dir), running nothing.
fn render_side(
    config_dir: &Path,
    template: &str,
    vars: Map<String, Value>,
    dir: &Path,
) -> Result<BTreeMap<String, Rendered>, String> {
    let set = TemplateSet::load(&config_dir.join("templates"), template)?;
    std::fs::create_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let vars = Vars::new(vars);
    let mut out = BTreeMap::new();
    for (index, renderer) in set.renderers.iter().enumerate() {
        for (name, file) in &renderer.templates {
            let text = set
                .render(file, &vars)
                .map_err(|e| format!("{}/{}: {e}", set.shown, renderer.name))?;
            let path = dir.join(format!("{index}.{}", name.replace(['/', '\\'], "_")));
            std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
            let shown = format!("{}/{file}", set.shown);
            out.insert(
                format!("{}:{name}", renderer.name),
                Rendered { path, shown },
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
