//! `!PeekLog`: notes how long an external log (in a sandbox `log-dirs` directory) is now, so the
//! deployment log can show what the next commands add to it. Never fails.

use std::fs;
use std::path::{Component, Path, PathBuf};

use super::{ApplyLog, Context};

/// `path` was checked by the plan: relative, plain components, at least two.
pub(crate) fn run(path: &str, ctx: &Context<'_>, log: &mut dyn ApplyLog) {
    let mut components = Path::new(path).components().filter_map(|c| match c {
        Component::Normal(part) => Some(part),
        _ => None,
    });
    let name = components.next().and_then(|n| n.to_str()).unwrap_or("");
    let rest: PathBuf = components.collect();
    let Some(dir) = ctx.log_dirs.get(name) else {
        log.line(&format!(
            "peek log {path}: no log dir {name:?} in the sandbox, skipped"
        ));
        return;
    };
    // A log that does not exist yet is empty: what comes is all new.
    let size = fs::metadata(dir.join(rest)).map_or(0, |m| m.len());
    if ctx.dry_run {
        log.line(&format!("would note log {path} at {size} bytes"));
        return;
    }
    log.external_log(path, size);
}
