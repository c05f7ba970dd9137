//! A template dir (`templates/<name>/`) loaded: every template parsed, every `*.render.yaml`
//! checked, before anything of the role is rendered or run.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_norway::Value as Yaml;

use super::engines::{Engine, EngineKind, HandlebarsEngine, TeraEngine, Vars, kind_of};
use crate::machinery::paths::{Boundary, Escape};
use crate::render::apply::{self, Command};

/// One `*.render.yaml`: the templates it renders and the commands that apply them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Renderer {
    /// Its path relative to the template dir (the "action" name in the log).
    pub(crate) name: String,
    /// Template name (used as `{{ files.NAME }}`) -> template path relative to the template dir.
    pub(crate) templates: BTreeMap<String, String>,
    pub(crate) commands: Vec<Command>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenderFile {
    #[serde(default)]
    templates: BTreeMap<String, String>,
    #[serde(default)]
    commands: Vec<Command>,
}

/// A parsed template dir.
pub(crate) struct TemplateSet {
    /// Name relative to `templates/` (`web/v1`).
    pub(crate) name: String,
    /// How messages name the dir (`templates/web/v1`).
    pub(crate) shown: String,
    pub(crate) dir: PathBuf,
    pub(crate) renderers: Vec<Renderer>,
    engines: BTreeMap<String, EngineKind>,
    /// The text of every template, for [`TemplateSet::may_read`].
    sources: Vec<String>,
    handlebars: HandlebarsEngine,
    tera: TeraEngine,
}

impl std::fmt::Debug for TemplateSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateSet")
            .field("name", &self.name)
            .field("renderers", &self.renderers)
            .finish_non_exhaustive()
    }
}

impl TemplateSet {
    /// Loads `templates_root/<name>`. Errors name the file (relative to the config dir's
    /// `templates/`) and the line where known.
    pub(crate) fn load(templates_root: &Path, name: &str) -> Result<TemplateSet, String> {
        let dir = templates_root.join(name);
        // A symlink must not lead the template dir out of templates/.
        let root = Boundary::new(templates_root).map_err(|e| format!("templates/: {e}"))?;
        let real = root.resolve(&dir).map_err(|escape| match escape {
            Escape::Unresolved(e) => format!("templates/{name}: {e}"),
            Escape::Outside(_) => {
                format!("templates/{name}: leads outside templates/ (a symlink?)")
            }
        })?;
        TemplateSet::load_dir(&real, root.real(), name, &format!("templates/{name}"))
    }

    /// Loads the template dir `dir`, whose symlinks must stay inside `boundary` (`templates/`:
    /// a template linked to a file elsewhere on the machine would render it into a role's
    /// files); `shown` is how messages name it.
    pub(crate) fn load_dir(
        dir: &Path,
        boundary: &Path,
        name: &str,
        shown: &str,
    ) -> Result<TemplateSet, String> {
        let shown_dir = shown;
        let (files, problems) =
            crate::inputs::walk::walk_files(&crate::inputs::walk::RealFs, dir, boundary);
        if let Some(problem) = problems.into_iter().next() {
            let at = match problem.rel() {
                "" => String::new(),
                rel => format!("/{rel}"),
            };
            return Err(format!("{shown_dir}{at}: {problem}"));
        }
        let mut set = TemplateSet {
            name: name.to_string(),
            shown: shown_dir.to_string(),
            dir: dir.to_path_buf(),
            renderers: Vec::new(),
            engines: BTreeMap::new(),
            sources: Vec::new(),
            handlebars: HandlebarsEngine::default(),
            tera: TeraEngine::default(),
        };
        let mut render_files = Vec::new();
        for rel in files {
            let shown = format!("{shown_dir}/{rel}");
            if rel.ends_with(".render.yaml") || rel.ends_with(".render.yml") {
                render_files.push(rel);
                continue;
            }
            if rel.ends_with(".trm") || rel.ends_with(".trimmer") {
                return Err(format!(
                    "{shown}: trimmer templates are not supported; use .hbs or .tera"
                ));
            }
            let Some(kind) = kind_of(&rel) else { continue };
            let source =
                fs::read_to_string(set.dir.join(&rel)).map_err(|e| format!("{shown}: {e}"))?;
            let engine: &mut dyn Engine = match kind {
                EngineKind::Handlebars => &mut set.handlebars,
                EngineKind::Tera => &mut set.tera,
            };
            engine
                .add(&rel, &source)
                .map_err(|e| format!("{shown}: {e}"))?;
            set.engines.insert(rel, kind);
            set.sources.push(source);
        }
        for rel in render_files {
            let shown = format!("{shown_dir}/{rel}");
            let text = crate::inputs::runtime::read_config_yaml(&set.dir.join(&rel), &shown)?;
            let file = parse_render_file(&text).map_err(|e| format!("{shown}: {e}"))?;
            let base = Path::new(&rel).parent().unwrap_or(Path::new(""));
            let mut templates = BTreeMap::new();
            for (tname, path) in file.templates {
                let joined = normalize(&base.join(&path)).ok_or_else(|| {
                    format!("{shown}: template {tname:?}: path {path:?} leaves the template dir")
                })?;
                if !set.engines.contains_key(&joined) {
                    return Err(format!(
                        "{shown}: template {tname:?}: {path:?} is not a template in {shown_dir} \
                         (templates end in .hbs, .handlebars or .tera)"
                    ));
                }
                templates.insert(tname, joined);
            }
            let names: BTreeSet<String> = templates.keys().cloned().collect();
            apply::validate(&file.commands, &names).map_err(|e| format!("{shown}: {e}"))?;
            set.renderers.push(Renderer {
                name: rel,
                templates,
                commands: file.commands,
            });
        }
        if set.renderers.is_empty() {
            return Err(format!(
                "{shown_dir}: no *.render.yaml: nothing says what to render and apply"
            ));
        }
        Ok(set)
    }

    /// Whether a template of the dir may read the variable `key`
    /// ([`verwalter_controllers::render::vars::templates_may_read`]).
    pub(crate) fn may_read(&self, key: &str) -> bool {
        verwalter_controllers::render::vars::templates_may_read(
            self.sources.iter().map(String::as_str),
            key,
        )
    }

    /// Renders one template (a path relative to the template dir).
    pub(crate) fn render(&self, template: &str, vars: &Vars) -> Result<String, String> {
        let shown = format!("{}/{template}", self.shown);
        let engine: &dyn Engine = match self.engines.get(template) {
            Some(EngineKind::Handlebars) => &self.handlebars,
            Some(EngineKind::Tera) => &self.tera,
            None => return Err(format!("{shown}: no such template")),
        };
        engine
            .render(template, vars)
            .map_err(|e| format!("{shown}: {e}"))
    }
}

/// Parses a `*.render.yaml`: keys may be written with `-` or `_`; keys starting with `_` are
/// ignored (a place for YAML anchors); other unknown keys are an error.
pub fn parse_render_file(text: &str) -> Result<RenderFileParts, String> {
    let mut value: Yaml = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    if value.is_null() {
        return Err("empty: expected `templates:` and `commands:`".into());
    }
    if strip_underscored(&mut value) {
        let file: RenderFile = serde_norway::from_value(value).map_err(|e| e.to_string())?;
        Ok(RenderFileParts::from(file))
    } else {
        // Straight from the text, so errors carry line numbers.
        let file: RenderFile = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        Ok(RenderFileParts::from(file))
    }
}

/// The parts of a render file (public for `verwalter render --check-dir`).
#[derive(Debug, Clone, PartialEq)]
pub struct RenderFileParts {
    pub templates: BTreeMap<String, String>,
    pub commands: Vec<Command>,
}

impl From<RenderFile> for RenderFileParts {
    fn from(f: RenderFile) -> Self {
        RenderFileParts {
            templates: f.templates,
            commands: f.commands,
        }
    }
}

/// Removes mapping keys starting with `_` at any depth; returns whether any was found.
fn strip_underscored(value: &mut Yaml) -> bool {
    match value {
        Yaml::Mapping(map) => {
            let before = map.len();
            map.retain(|k, _| !k.as_str().is_some_and(|k| k.starts_with('_')));
            let mut found = map.len() != before;
            for (_, v) in map.iter_mut() {
                found |= strip_underscored(v);
            }
            found
        }
        Yaml::Sequence(items) => items
            .iter_mut()
            .fold(false, |f, v| strip_underscored(v) | f),
        Yaml::Tagged(tagged) => strip_underscored(&mut tagged.value),
        _ => false,
    }
}

/// `a/./b/../c` -> `a/c`; None when it climbs above the start or is absolute.
fn normalize(path: &Path) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::Normal(s) => parts.push(s.to_str()?),
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                parts.pop()?;
            }
            _ => return None,
        }
    }
    Some(parts.join("/"))
}
