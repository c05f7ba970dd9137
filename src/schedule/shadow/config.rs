//! `scheduler/shadow.yaml`: which dirs under `scheduler/` run as shadows, and how many runs of
//! each are kept. Read again at every real round, so an edit takes effect at the next one.

use std::path::Path;

use serde::Deserialize;

/// The file, relative to the config dir.
pub(crate) const SHADOW_FILE: &str = "scheduler/shadow.yaml";

/// Runs of each shadow kept, on disk and in memory, without `keep-runs`.
pub(crate) const DEFAULT_KEEP_RUNS: usize = 20;

/// The most `keep-runs` may ask for (each run keeps the shadow's whole output).
pub(crate) const MAX_KEEP_RUNS: usize = 1000;

/// The largest `shadow.yaml` read.
const MAX_FILE_BYTES: u64 = 64 << 10;

/// What `scheduler/shadow.yaml` asks for, with what is wrong in it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ShadowConfig {
    /// The shadows that run (each one's dir checked), in the file's order.
    pub(crate) shadows: Vec<String>,
    pub(crate) keep_runs: usize,
    /// Each problem names the file, and the entry or line; the entries it names do not run.
    pub(crate) problems: Vec<String>,
}

impl Default for ShadowConfig {
    fn default() -> Self {
        ShadowConfig {
            shadows: Vec::new(),
            keep_runs: DEFAULT_KEEP_RUNS,
            problems: Vec::new(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct File {
    #[serde(default)]
    shadows: Vec<String>,
    keep_runs: Option<usize>,
}

/// Reads `scheduler/shadow.yaml` of `config_dir`; no file is no shadows.
pub(crate) fn read(config_dir: &Path) -> ShadowConfig {
    let path = config_dir.join(SHADOW_FILE);
    let bytes = match read_limited(&path) {
        Ok(None) => return ShadowConfig::default(),
        Ok(Some(bytes)) => bytes,
        Err(e) => return broken(format!("{SHADOW_FILE}: cannot read: {e}")),
    };
    let file: File = match serde_norway::from_slice(&bytes) {
        Ok(file) => file,
        Err(e) => {
            let at = e
                .location()
                .map(|l| format!(" line {}:", l.line()))
                .unwrap_or_default();
            return broken(format!("{SHADOW_FILE}:{at} {e}"));
        }
    };
    check(config_dir, file)
}

/// The file's bytes, at most [`MAX_FILE_BYTES`]; `None` without the file.
fn read_limited(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {} KiB",
            MAX_FILE_BYTES >> 10
        )));
    }
    Ok(Some(bytes))
}

fn broken(problem: String) -> ShadowConfig {
    ShadowConfig {
        problems: vec![problem],
        ..ShadowConfig::default()
    }
}

fn check(config_dir: &Path, file: File) -> ShadowConfig {
    let mut config = ShadowConfig::default();
    match file.keep_runs {
        Some(n) if n == 0 || n > MAX_KEEP_RUNS => config.problems.push(format!(
            "{SHADOW_FILE}: keep-runs: {n} is not between 1 and {MAX_KEEP_RUNS}; keeping {DEFAULT_KEEP_RUNS}"
        )),
        Some(n) => config.keep_runs = n,
        None => {}
    }
    for (i, name) in file.shadows.into_iter().enumerate() {
        let at = format!("{SHADOW_FILE}: shadows[{i}]");
        if !crate::config::is_frontend_name(&name) {
            config.problems.push(format!(
                "{at}: {name:?} is not a dir name under scheduler/ (letters, digits, '-', '_', '.')"
            ));
        } else if name == "v1" {
            config.problems.push(format!(
                "{at}: v1 is the scheduler in force, not a shadow; name another dir under scheduler/"
            ));
        } else if name == "render" {
            // `/v1/shadow/render/<role>` is the shadow render's route: a shadow of that name
            // could not be read at `/v1/shadow/render/runs`.
            config.problems.push(format!(
                "{at}: \"render\" is a reserved name (the route /v1/shadow/render/); rename scheduler/render"
            ));
        } else if !has_entry(config_dir, &name) {
            config.problems.push(format!(
                "{at}: scheduler/{name} has neither main.lua nor scheduler.wasm; it does not run"
            ));
        } else if !config.shadows.contains(&name) {
            config.shadows.push(name);
        }
    }
    config
}

/// Whether `scheduler/<name>` has a scheduler to run.
fn has_entry(config_dir: &Path, name: &str) -> bool {
    let dir = config_dir.join("scheduler").join(name);
    dir.join("main.lua").is_file() || dir.join(crate::schedule::wasm::SCHEDULER_WASM).is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(shadow_yaml: &str, dirs: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("scheduler/v1")).unwrap();
        std::fs::write(dir.path().join("scheduler/v1/main.lua"), "").unwrap();
        for (name, file) in dirs {
            let sub = dir.path().join("scheduler").join(name);
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join(file), "").unwrap();
        }
        std::fs::write(dir.path().join(SHADOW_FILE), shadow_yaml).unwrap();
        dir
    }

    #[test]
    fn no_file_is_no_shadows() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), ShadowConfig::default());
    }

    #[test]
    fn shadows_with_a_scheduler_run_and_each_bad_entry_is_named() {
        let dir = dir_with(
            "shadows: [v2, v1, gone, ../x, w, v2, render]\nkeep-runs: 5\n",
            &[
                ("v2", "main.lua"),
                ("render", "main.lua"),
                ("w", "scheduler.wasm"),
                ("gone", "README"),
            ],
        );
        let config = read(dir.path());
        assert_eq!(config.shadows, vec!["v2", "w"]);
        assert_eq!(config.keep_runs, 5);
        assert_eq!(
            config.problems,
            vec![
                "scheduler/shadow.yaml: shadows[1]: v1 is the scheduler in force, not a shadow; name another dir under scheduler/",
                "scheduler/shadow.yaml: shadows[2]: scheduler/gone has neither main.lua nor scheduler.wasm; it does not run",
                "scheduler/shadow.yaml: shadows[3]: \"../x\" is not a dir name under scheduler/ (letters, digits, '-', '_', '.')",
                "scheduler/shadow.yaml: shadows[6]: \"render\" is a reserved name (the route /v1/shadow/render/); rename scheduler/render",
            ]
        );
    }

    #[test]
    fn a_bad_file_names_its_line_and_runs_no_shadow() {
        let dir = dir_with("shadows: [v2]\nkeep: 3\n", &[("v2", "main.lua")]);
        let config = read(dir.path());
        assert!(config.shadows.is_empty());
        assert_eq!(config.problems.len(), 1);
        assert!(
            config.problems[0].starts_with("scheduler/shadow.yaml: line 2: unknown field `keep`"),
            "{:?}",
            config.problems
        );
        let dir = dir_with("shadows: [v2]\nkeep-runs: 0\n", &[("v2", "main.lua")]);
        let config = read(dir.path());
        assert_eq!(config.shadows, vec!["v2"]);
        assert_eq!(config.keep_runs, DEFAULT_KEEP_RUNS);
        assert_eq!(
            config.problems,
            vec!["scheduler/shadow.yaml: keep-runs: 0 is not between 1 and 1000; keeping 20"]
        );
    }
}
