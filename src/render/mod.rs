//! Rendering a role: its template dir loaded and parsed, each `*.render.yaml`'s templates rendered
//! into the role's staging dir, then its commands run (`crate::render::apply`), everything written to the
//! role's deployment log.

pub mod apply;
pub mod cli;
pub mod engines;
pub(crate) mod metrics;
pub mod shadow;
pub mod template_set;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use sha1::{Digest, Sha1};
use verwalter_controllers::machinery::ports::{ApplyError, RoleApplier, RoleJob, StorageError};
use verwalter_controllers::machinery::store::Reader;
use verwalter_controllers::render::vars::logged::Logged;
use verwalter_controllers::schedule::data::TextPart;
use verwalter_controllers::state::{InputError, TemplateFile, Templates};

use crate::storage::logs::LogDir;
pub use engines::Vars;
pub(crate) use template_set::TemplateSet;

/// Reads every file under `<config>/templates` (hidden files skipped) into a [`Templates`]
/// snapshot: content hashes, and whether a file mentions `full_schedule`.
pub fn read_templates(config_dir: &Path, errors: &mut Vec<InputError>) -> Templates {
    let mut problems = crate::inputs::Problems::default();
    let templates = read_templates_with(&crate::inputs::walk::RealFs, config_dir, &mut problems);
    errors.append(&mut problems.errors);
    errors.append(&mut problems.failures);
    templates
}

/// [`read_templates`] through `fs`, telling files that exist but could not be read (then the
/// snapshot is incomplete) from bad ones. Symlinks must stay inside `templates/`.
pub(crate) fn read_templates_with(
    fs: &dyn crate::inputs::walk::FileSystem,
    config_dir: &Path,
    problems: &mut crate::inputs::Problems,
) -> Templates {
    let mut files = BTreeMap::new();
    let root = config_dir.join("templates");
    let (found, walk_problems) = crate::inputs::walk::walk_files(fs, &root, &root);
    problems.add_walk("templates", walk_problems);
    for rel in found {
        match fs.read(&root.join(&rel), u64::MAX) {
            Ok(bytes) => {
                let hash = hex::encode(Sha1::digest(&bytes));
                let mentions_full_schedule = bytes.windows(13).any(|w| w == b"full_schedule");
                files.insert(
                    rel,
                    TemplateFile {
                        hash,
                        mentions_full_schedule,
                    },
                );
            }
            Err(e) if crate::inputs::walk::is_gone(&e) => {}
            Err(e) => problems.failures.push(InputError {
                path: format!("templates/{rel}"),
                line: None,
                message: format!("cannot read: {e}"),
            }),
        }
    }
    Templates {
        files: Arc::new(files),
    }
}

/// Loads every template dir under `<config>/templates` (each dir holding a `*.render.yaml`) the
/// way a render would, and returns the problems (for `verwalter check`).
pub fn check_template_dirs(config_dir: &Path) -> Vec<String> {
    let root = config_dir.join("templates");
    let (files, _) = crate::inputs::walk::walk_files(&crate::inputs::walk::RealFs, &root, &root);
    let dirs: std::collections::BTreeSet<&str> = files
        .iter()
        .filter(|f| f.ends_with(".render.yaml") || f.ends_with(".render.yml"))
        .filter_map(|f| f.rsplit_once('/').map(|(dir, _)| dir))
        .collect();
    dirs.into_iter()
        .filter_map(|name| TemplateSet::load(&root, name).err())
        .collect()
}

/// Settings of the applier.
#[derive(Debug, Clone)]
pub struct ApplierConfig {
    pub config_dir: PathBuf,
    /// Rendered files wait here (`<storage>/staging/<role>/`) while the commands run.
    pub staging_dir: PathBuf,
    /// Per command.
    pub command_timeout: Duration,
    /// Render and log, but run no command and write nothing outside the staging dir.
    pub dry_run: bool,
    /// `sandbox/*.yaml` `log-dirs`, for `!PeekLog`.
    pub log_dirs: BTreeMap<String, PathBuf>,
}

/// The variables last written to a role's log: the deployment, the templates' context and the
/// values kept as text.
type LoggedVars = (String, Arc<handlebars::Context>, Vec<(String, TextPart)>);

/// Renders and applies roles for the render controller.
#[derive(Clone)]
pub struct Applier(Arc<Inner>);

struct Inner {
    config: ApplierConfig,
    logs: Arc<LogDir>,
    templates: Reader<Templates>,
    /// Parsed template dirs by name, with the fingerprint they were parsed at.
    cache: Mutex<HashMap<String, (String, Arc<TemplateSet>)>>,
    /// The variables last written to each role's log, with the deployment that wrote them: the
    /// next attempt logs only what differs (the first after start logs them whole).
    logged_vars: Mutex<HashMap<String, LoggedVars>>,
}

impl Applier {
    pub fn new(config: ApplierConfig, logs: Arc<LogDir>, templates: Reader<Templates>) -> Applier {
        Applier(Arc::new(Inner {
            config,
            logs,
            templates,
            cache: Mutex::new(HashMap::new()),
            logged_vars: Mutex::new(HashMap::new()),
        }))
    }

    /// Forgets the variables last logged for roles not in `keep` (gone from the node): a role
    /// that comes back logs its variables whole again.
    pub(crate) fn forget_logged_vars(&self, keep: &std::collections::BTreeSet<String>) {
        self.0
            .logged_vars
            .lock()
            .unwrap()
            .retain(|role, _| keep.contains(role));
    }

    /// Removes what a previous run left in the staging dir.
    pub(crate) fn clean_staging(&self) -> std::io::Result<()> {
        match fs::remove_dir_all(&self.0.config.staging_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl Inner {
    /// The parsed template dir, reparsed only when one of its files changed.
    fn template_set(&self, name: &str) -> Result<Arc<TemplateSet>, String> {
        let fingerprint = self.templates.peek().fingerprint(name);
        if let Some((f, set)) = self.cache.lock().unwrap().get(name)
            && *f == fingerprint
        {
            return Ok(set.clone());
        }
        let set = Arc::new(TemplateSet::load(
            &self.config.config_dir.join("templates"),
            name,
        )?);
        self.cache
            .lock()
            .unwrap()
            .insert(name.to_string(), (fingerprint, set.clone()));
        Ok(set)
    }

    async fn run(self: Arc<Self>, mut job: RoleJob) -> Result<(), ApplyError> {
        // A role log that cannot be written does not stop the role (the log dir reports it).
        let mut log = self.logs.role(&job.role, &job.deployment_id);
        let this = self.clone();
        let template = job.template.clone();
        let set = tokio::task::spawn_blocking(move || this.template_set(&template))
            .await
            .map_err(|e| ApplyError::Templates(format!("loading templates: {e}")))
            .and_then(|set| set.map_err(ApplyError::Templates));
        // The templates' context takes the variables over (the render controller hands them
        // on, so nothing is copied) and is kept for the next attempt's log. Big values kept as
        // text are parsed into it when a template may read them; the others stay text.
        let mut vars = Arc::unwrap_or_clone(std::mem::take(&mut job.vars));
        let mut texts = std::mem::take(&mut job.unparsed);
        texts.retain(|(key, part)| {
            let read = set.as_ref().is_ok_and(|set| set.may_read(key));
            if read {
                vars.insert(key.clone(), part.parse());
            }
            !read
        });
        let vars = Vars::new(vars);
        let last = self.logged_vars.lock().unwrap().insert(
            job.role.clone(),
            (job.deployment_id.clone(), vars.shared(), texts.clone()),
        );
        log.vars(
            last.as_ref().map(|(id, vars, texts)| Logged {
                deployment_id: id,
                vars: engines::vars_of(vars),
                texts,
            }),
            vars.map(),
            &texts,
        );
        let result = match set {
            Ok(set) => {
                self.clone()
                    .render_and_apply(&job, &set, &vars, &mut log)
                    .await
            }
            Err(e) => Err(e),
        };
        log.finish(&result);
        result
    }

    async fn render_and_apply(
        self: Arc<Self>,
        job: &RoleJob,
        set: &TemplateSet,
        vars: &Vars,
        log: &mut crate::storage::logs::RoleLog,
    ) -> Result<(), ApplyError> {
        // The role's staging dir stays between attempts: its files are rewritten in place, which
        // is much cheaper on ext4 than creating and deleting them each time. Files no attempt
        // wrote are removed below; the dir goes when the role leaves the schedule.
        let staging = self.config.staging_dir.join(&job.role);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&staging)
            .map_err(|e| ApplyError::Staging(StorageError::io(&staging, "cannot create", &e)))?;
        let mut written = Vec::new();
        for (index, renderer) in set.renderers.iter().enumerate() {
            log.action_start(&renderer.name);
            let result = self
                .apply_renderer(set, index, renderer, vars, &staging, job, log, &mut written)
                .await;
            log.action_finish(&renderer.name);
            result.map_err(|e| e.within(&format!("{}/{}", set.shown, renderer.name)))?;
        }
        remove_others(&staging, &written);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn apply_renderer(
        &self,
        set: &TemplateSet,
        index: usize,
        renderer: &template_set::Renderer,
        vars: &Vars,
        staging: &Path,
        job: &RoleJob,
        log: &mut crate::storage::logs::RoleLog,
        written: &mut Vec<String>,
    ) -> Result<(), ApplyError> {
        let mut files = BTreeMap::new();
        for (name, template) in &renderer.templates {
            let text = set.render(template, vars).map_err(ApplyError::Render)?;
            let file_name = format!("{index}.{}", name.replace(['/', '\\'], "_"));
            let path = staging.join(&file_name);
            written.push(file_name);
            write_private(&path, text.as_bytes())
                .map_err(|e| ApplyError::Staging(StorageError::io(&path, "cannot write", &e)))?;
            log.text(&format!(
                "rendered {template} -> {} ({} bytes)\n",
                path.display(),
                text.len()
            ));
            files.insert(name.clone(), path);
        }
        let ctx = apply::Context {
            role: &job.role,
            files: &files,
            log_dirs: &self.config.log_dirs,
            timeout: self.config.command_timeout,
            dry_run: self.config.dry_run,
        };
        apply::run_commands(&renderer.commands, &ctx, log)
            .await
            .map_err(|e| ApplyError::Command(e.to_string()))
    }
}

impl RoleApplier for Applier {
    fn apply(&self, job: RoleJob) -> BoxFuture<'static, Result<(), ApplyError>> {
        Box::pin(self.0.clone().run(job))
    }
}

/// Removes the files of `dir` not named in `keep` (staging files of renamed templates).
fn remove_others(dir: &Path, keep: &[String]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !keep.iter().any(|k| entry.file_name() == k.as_str()) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Removes the staging dirs of roles not in `keep`.
pub(crate) fn retain_staging(staging_dir: &Path, keep: &std::collections::BTreeSet<String>) {
    let Ok(entries) = fs::read_dir(staging_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(|n| keep.contains(n)) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// A staging file, readable by its owner only (rendered files may hold secrets). Rewritten in
/// place and then cut to length: truncating to zero first makes ext4 free and reallocate the
/// blocks, which costs more than the write.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.set_len(bytes.len() as u64)
}

/// `log-dirs` of every `<config>/sandbox/*.yaml` (name -> dir).
pub(crate) fn read_log_dirs(config_dir: &Path) -> Result<BTreeMap<String, PathBuf>, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    struct Sandbox {
        #[serde(default, alias = "log_dirs")]
        log_dirs: BTreeMap<String, PathBuf>,
    }
    let mut dirs = BTreeMap::new();
    let dir = config_dir.join("sandbox");
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(dirs);
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        if !matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            continue;
        }
        let text = crate::inputs::runtime::read_config_yaml(&path, &path.display().to_string())?;
        let sandbox: Sandbox =
            serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        dirs.extend(sandbox.log_dirs);
    }
    Ok(dirs)
}
