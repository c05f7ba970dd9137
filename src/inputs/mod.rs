//! The config dir reader (`/etc/verwalter`): runtime tree and scheduler sources, their content
//! hashes and errors, the scheduler's metrics declaration (`scheduler/v1/metrics.yaml`,
//! [`crate::schedule::scheduler_metrics::file`]), and a watcher that re-reads them after changes. A read that cannot see
//! everything (a file or dir that exists but cannot be read) never stands for the config dir.

pub(crate) mod metrics;
pub mod nesting;
pub mod runtime;
pub(crate) mod walk;
pub(crate) mod watcher;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha1::{Digest, Sha1};
use verwalter_controllers::state::{InputError, Inputs};

pub(crate) use runtime::Problems;
use walk::{FileSystem, RealFs};

/// The scheduler directory inside the config dir (verwalter 0.13 hard-codes `v1`).
pub const SCHEDULER_DIR: &str = "scheduler/v1";

/// Where the scheduler of a config dir lives.
pub fn scheduler_dir(config_dir: &Path) -> PathBuf {
    config_dir.join(SCHEDULER_DIR)
}

/// Reads the runtime tree and hashes the scheduler sources. Never fails: problems become
/// [`InputError`]s naming the file, read failures included (for the offline commands, which
/// report them all; the daemon uses [`read_inputs_with`] to tell them apart).
pub fn read_inputs(config_dir: &Path) -> Inputs {
    let mut problems = Problems::default();
    let mut inputs = read_inputs_with(&RealFs, config_dir, &mut problems);
    inputs.errors.append(&mut problems.failures);
    inputs.errors.sort_by(|a, b| a.path.cmp(&b.path));
    inputs
}

/// Reads the inputs through `fs`. Bad files go to the returned inputs' errors; entries that exist
/// but could not be read go to `problems.failures`, and then the inputs are incomplete.
pub(crate) fn read_inputs_with(
    fs: &dyn FileSystem,
    config_dir: &Path,
    problems: &mut Problems,
) -> Inputs {
    let mut all = Sha1::new();
    let runtime = runtime::read_tree(
        fs,
        &config_dir.join("runtime"),
        config_dir,
        "runtime",
        problems,
        &mut |f| {
            feed(&mut all, f.rel, f.bytes);
        },
    );

    let mut code = Sha1::new();
    let sched = scheduler_dir(config_dir);
    let main = format!("{SCHEDULER_DIR}/main.lua");
    // A wasm module (`scheduler.wasm`) takes the place of `main.lua` (src/schedule/wasm/).
    let wasm = fs
        .metadata(&sched.join(crate::schedule::wasm::SCHEDULER_WASM))
        .is_ok_and(|meta| meta.is_file());
    match fs.metadata(&sched.join("main.lua")) {
        _ if wasm => {}
        Ok(meta) if meta.is_file() => {}
        Err(e) if !walk::is_gone(&e) => problems.failures.push(InputError {
            path: main,
            line: None,
            message: format!("cannot read: {e}"),
        }),
        _ => problems.errors.push(InputError {
            path: main,
            line: None,
            message: "missing: the scheduler entry point (or scheduler.wasm) must exist".into(),
        }),
    }
    hash_dir(fs, &sched, config_dir, SCHEDULER_DIR, &mut code, problems);
    let metrics =
        crate::schedule::scheduler_metrics::file::read_declaration(fs, config_dir, problems);
    let scheduler_hash = hex::encode(code.finalize());
    feed(&mut all, "scheduler", scheduler_hash.as_bytes());
    let mut errors = std::mem::take(&mut problems.errors);
    errors.sort_by(|a, b| a.path.cmp(&b.path));
    Inputs {
        runtime: Arc::new(runtime),
        scheduler_hash,
        hash: hex::encode(all.finalize()),
        errors,
        metrics,
    }
}

/// The content hash of the code under `rel` (a dir of the config dir, such as `scheduler/v2`),
/// taken as [`read_inputs`] takes `scheduler_hash` of `scheduler/v1`: a shadow scheduler's code
/// version. A file it cannot read is left out (loading the code then reports it).
pub(crate) fn code_hash(config_dir: &Path, rel: &str) -> String {
    let mut code = Sha1::new();
    let mut problems = Problems::default();
    let dir = config_dir.join(rel);
    hash_dir(&RealFs, &dir, config_dir, rel, &mut code, &mut problems);
    hex::encode(code.finalize())
}

fn feed(hasher: &mut Sha1, rel: &str, bytes: &[u8]) {
    // Length-prefixed, so that moving bytes between name and content changes the hash.
    hasher.update((rel.len() as u64).to_le_bytes());
    hasher.update(rel.as_bytes());
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// Hashes every file under `dir` (sorted, hidden and backup files skipped).
fn hash_dir(
    fs: &dyn FileSystem,
    dir: &Path,
    boundary: &Path,
    rel: &str,
    hasher: &mut Sha1,
    problems: &mut Problems,
) {
    let (files, walk_problems) = walk::walk_files(fs, dir, boundary);
    problems.add_walk(rel, walk_problems);
    let skipped = |path: &str| path.split('/').any(runtime::is_skipped);
    for file in files.iter().filter(|f| !skipped(f)) {
        let rel_path = format!("{rel}/{file}");
        match fs.read(&dir.join(file), u64::MAX) {
            Ok(bytes) => feed(hasher, &rel_path, &bytes),
            Err(e) if walk::is_gone(&e) => {}
            Err(e) => problems.failures.push(InputError {
                path: rel_path,
                line: None,
                message: format!("cannot read: {e}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_wasm_scheduler_takes_the_place_of_main_lua_and_counts_for_the_code_version() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir_all(root.join("scheduler/v1")).unwrap();
        fs::write(root.join("scheduler/v1/scheduler.wasm"), b"\0asm one").unwrap();
        let first = read_inputs(root);
        assert!(first.errors.is_empty(), "{:?}", first.errors);
        fs::write(root.join("scheduler/v1/scheduler.wasm"), b"\0asm two").unwrap();
        assert_ne!(read_inputs(root).scheduler_hash, first.scheduler_hash);
    }

    #[test]
    fn hashes_follow_content_and_missing_main_is_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let first = read_inputs(root);
        assert_eq!(first.errors.len(), 1);
        assert_eq!(first.errors[0].path, "scheduler/v1/main.lua");

        fs::create_dir_all(root.join("scheduler/v1")).unwrap();
        fs::write(root.join("scheduler/v1/main.lua"), "return {}").unwrap();
        fs::create_dir_all(root.join("runtime")).unwrap();
        fs::write(root.join("runtime/a.yaml"), "x: 1").unwrap();
        let second = read_inputs(root);
        assert!(second.errors.is_empty());
        assert_eq!(
            read_inputs(root),
            second,
            "same content, same inputs and hashes"
        );

        fs::write(root.join("runtime/a.yaml"), "x: 2").unwrap();
        let third = read_inputs(root);
        assert_ne!(third.hash, second.hash);
        assert_eq!(third.scheduler_hash, second.scheduler_hash);

        fs::write(root.join("scheduler/v1/lib.lua"), "return 1").unwrap();
        let fourth = read_inputs(root);
        assert_ne!(fourth.scheduler_hash, third.scheduler_hash);
        assert_ne!(fourth.hash, third.hash);

        // A symlink loop in the scheduler dir ends the walk (it used to recurse until the stack
        // ran out) and adds nothing to hash.
        std::os::unix::fs::symlink(root.join("scheduler"), root.join("scheduler/v1/loop")).unwrap();
        let looped = read_inputs(root);
        assert!(looped.errors.is_empty(), "{:?}", looped.errors);
        assert_eq!(looped.scheduler_hash, fourth.scheduler_hash);
    }
}
