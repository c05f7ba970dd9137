//! `verwalter render`: render one role offline, the way the daemon would, and show the result.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use verwalter_controllers::render::vars;
use verwalter_controllers::state::{Schedule, ScheduleData};

use super::shadow::{self, ShadowRender};
use super::{TemplateSet, Vars, read_log_dirs};
use crate::render::apply::{self, ApplyLog};

/// Where the variables come from.
#[derive(Debug, Clone)]
pub enum VarsSource {
    /// A JSON or YAML object: the role's variables as they are (plus `role`, `deployment_id`...).
    File(PathBuf),
    /// A schedule (envelope as in `/v1/schedule`, or its `data`) and the node to render for.
    Schedule { file: PathBuf, hostname: String },
}

#[derive(Debug, Clone)]
pub struct RenderArgs {
    pub config_dir: PathBuf,
    pub role: String,
    pub vars: VarsSource,
    pub dry_run: bool,
    pub timeout: std::time::Duration,
}

/// An `ApplyLog` that writes to stdout.
struct Stdout;

impl ApplyLog for Stdout {
    fn line(&mut self, text: &str) {
        println!("{text}");
    }
    fn output(&mut self, bytes: &[u8]) {
        let _ = std::io::stdout().write_all(bytes);
    }
    fn external_log(&mut self, path: &str, offset: u64) {
        println!("external log {path} at offset {offset}");
    }
}

fn read_object(path: &Path) -> Result<Map<String, Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let value: Value = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
    } else {
        serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
    };
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(format!("{}: expected an object", path.display())),
    }
}

/// The variables `role` gets, as the daemon would compute them.
pub fn role_vars(args: &RenderArgs) -> Result<Map<String, Value>, String> {
    let (id, now) = new_pass();
    role_vars_at(args, &args.vars, (&id, &now))
}

/// A deployment id and timestamp (RFC 3339) for a pass starting now.
fn new_pass() -> (String, String) {
    let id = verwalter_controllers::render::deployment_id();
    let now = verwalter_controllers::machinery::clock::rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    );
    (id, now)
}

/// The variables `args.role` gets from `source` in the pass `(deployment id, timestamp)`.
fn role_vars_at(
    args: &RenderArgs,
    source: &VarsSource,
    (id, now): (&str, &str),
) -> Result<Map<String, Value>, String> {
    let (id, now) = (id.to_string(), now.to_string());
    match source {
        VarsSource::File(path) => {
            let mut vars = read_object(path)?;
            vars.insert("role".into(), Value::String(args.role.clone()));
            Ok(vars::with_pass(vars, &id, &now, None))
        }
        VarsSource::Schedule { file, hostname } => {
            let object = read_object(file)?;
            // An envelope has `data` and `hash`; otherwise the file is the data itself.
            let schedule = match (object.get("data"), object.get("hash")) {
                (Some(data), Some(hash)) => Schedule {
                    timestamp: object.get("timestamp").and_then(Value::as_u64).unwrap_or(0),
                    hash: hash.as_str().unwrap_or_default().to_string(),
                    data: ScheduleData::from_value(data.clone()),
                    origin: object
                        .get("origin")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                },
                _ => Schedule::new(Value::Object(object), 0, String::new()),
            };
            schedule_vars(
                &args.config_dir,
                &schedule,
                hostname,
                &args.role,
                (&id, &now),
                &file.display().to_string(),
            )
        }
    }
}

/// The variables `role` gets on `hostname` from `schedule`, resolved and checked as a render
/// pass does, for the pass `(deployment id, timestamp)`; `shown` names the schedule in errors.
pub(crate) fn schedule_vars(
    config_dir: &Path,
    schedule: &Schedule,
    hostname: &str,
    role: &str,
    (id, now): (&str, &str),
    shown: &str,
) -> Result<Map<String, Value>, String> {
    let data = schedule.data.tree().as_ref();
    // With a `query.wasm` the node's roles are its answer, as in the daemon.
    let derived = crate::schedule::wasm::query::derive_offline(config_dir, schedule, hostname, id)
        .map_err(|e| e.message)?;
    let view = match derived {
        Some(roles) => std::borrow::Cow::Owned(vars::roles_view(data, hostname, roles)),
        None => std::borrow::Cow::Borrowed(data),
    };
    let data = view.as_ref();
    let roles = vars::node_roles(data, hostname);
    if !roles.iter().any(|r| r == role) {
        return Err(format!(
            "role {role:?} is not assigned to {hostname:?} in {shown} (its roles: {})",
            if roles.is_empty() {
                "none".into()
            } else {
                roles.join(", ")
            }
        ));
    }
    // Resolved and checked as a render pass does: `$(role.path)` references, then the role's
    // dependencies, each failing with the daemon's message.
    let merged = verwalter_controllers::render::check_schedule(data, hostname)
        .role(role)
        .unwrap_or_else(|| Err(format!("role {role:?} is not a role of this node")))?;
    Ok(vars::with_pass(merged, id, now, Some(data)))
}

/// Renders the role's templates, prints them, and runs (or with `dry_run`, shows) its commands.
/// Returns the process exit status.
pub async fn render(args: &RenderArgs) -> Result<(), String> {
    let vars = role_vars(args)?;
    let template = match vars.get("template") {
        Some(Value::String(t)) => t.clone(),
        _ => return Err("the variables have no `template` (a dir under templates/)".into()),
    };
    if let Some(why) = vars::unsafe_role_name(&args.role) {
        return Err(format!("role {:?}: {why}", args.role));
    }
    let set = TemplateSet::load(&args.config_dir.join("templates"), &template)?;
    let log_dirs = read_log_dirs(&args.config_dir)?;
    let staging = tempfile::Builder::new()
        .prefix("verwalter-render.")
        .tempdir()
        .map_err(|e| format!("staging dir: {e}"))?;
    let shared = Vars::new(vars);
    for (index, renderer) in set.renderers.iter().enumerate() {
        println!("=== {}/{} ===", set.shown, renderer.name);
        let mut files = BTreeMap::new();
        for (name, template) in &renderer.templates {
            let text = set.render(template, &shared)?;
            let path = staging
                .path()
                .join(format!("{index}.{}", name.replace(['/', '\\'], "_")));
            std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("--- files.{name} = {}/{template} ---", set.shown);
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            files.insert(name.clone(), path);
        }
        println!(
            "--- commands ({}) ---",
            if args.dry_run { "dry run" } else { "running" }
        );
        let ctx = apply::Context {
            role: &args.role,
            files: &files,
            log_dirs: &log_dirs,
            timeout: args.timeout,
            dry_run: args.dry_run,
        };
        apply::run_commands(&renderer.commands, &ctx, &mut Stdout)
            .await
            .map_err(|e| format!("{}/{}: {e}", set.shown, renderer.name))?;
    }
    Ok(())
}

/// `--shadow TEMPLATE` / `--shadow-schedule FILE`: the role rendered as `args` says and again
/// with the candidate template dir or version, or the variables of another schedule for the
/// same node (or both), in one pass (same deployment id and time); no command of either runs.
pub fn shadow(
    args: &RenderArgs,
    template: Option<&str>,
    schedule: Option<&Path>,
) -> Result<ShadowRender, String> {
    let (id, now) = new_pass();
    let pass = (id.as_str(), now.as_str());
    let real = role_vars_at(args, &args.vars, pass)?;
    let mut shadow = match (schedule, &args.vars) {
        (None, _) => real.clone(),
        (Some(file), VarsSource::Schedule { hostname, .. }) => {
            let source = VarsSource::Schedule {
                file: file.to_path_buf(),
                hostname: hostname.clone(),
            };
            role_vars_at(args, &source, pass).map_err(|e| format!("shadow: {e}"))?
        }
        (Some(_), VarsSource::File(_)) => {
            return Err("--shadow-schedule needs --schedule and --hostname".into());
        }
    };
    if let Some(candidate) = template {
        let base = shadow::template_of(&shadow).map_err(|e| format!("shadow: {e}"))?;
        let name = shadow::candidate_template(&base, candidate)?;
        shadow.insert("template".into(), Value::String(name));
    }
    shadow::shadow_render(&args.config_dir, &args.role, real, shadow, None)
}

/// Prints a shadow render: each differing file's diff, then a summary line.
pub fn print_shadow(result: &ShadowRender) {
    for file in &result.files {
        let kind = match file.kind {
            shadow::FileChange::Added => "added",
            shadow::FileChange::Removed => "removed",
            shadow::FileChange::Changed => "changed",
        };
        println!("=== {} ({kind}) ===", file.file);
        print!("{}", file.diff);
    }
    println!(
        "{}: templates/{} -> templates/{}: {} differing, {} the same; no command was run",
        result.role,
        result.real_template,
        result.shadow_template,
        result.files.len(),
        result.unchanged.len()
    );
}

/// `--check-dir DIR`: parses every template and render file of DIR and renders each template
/// with `sample` vars. Returns the problems found (empty: all good).
pub fn check_dir(dir: &Path, sample: Map<String, Value>) -> Vec<String> {
    let (Some(root), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str())) else {
        return vec![format!("{}: not a directory name", dir.display())];
    };
    let root = if root.as_os_str().is_empty() {
        Path::new(".")
    } else {
        root
    };
    let set = match TemplateSet::load(root, name) {
        Ok(set) => set,
        Err(e) => return vec![e],
    };
    let vars = Vars::new(sample);
    let mut problems = Vec::new();
    for renderer in &set.renderers {
        for template in renderer.templates.values() {
            if let Err(e) = set.render(template, &vars) {
                problems.push(e);
            }
        }
    }
    problems
}
