//! `!Copy`, the atomic replacement of a file it shares with `!SplitText`, and the bridge that
//! runs file work off the async threads.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{ApplyLog, At, CommandError};

/// Runs `work` on the blocking pool (it reads, writes and fsyncs files, which can take a while
/// on a busy disk) and then passes the lines it logged on to `log`.
pub(crate) async fn blocking<T: Send + 'static>(
    at: At,
    log: &mut dyn ApplyLog,
    work: impl FnOnce(&mut Vec<String>) -> Result<T, CommandError> + Send + 'static,
) -> Result<T, CommandError> {
    let joined = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        let result = work(&mut lines);
        (lines, result)
    })
    .await;
    let (lines, result) = match joined {
        Ok(done) => done,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only when the runtime shuts down before the work started.
            Err(e) => {
                return Err(CommandError::Io {
                    at,
                    path: PathBuf::new(),
                    action: "run file work",
                    source: io::Error::other(e),
                });
            }
        },
    };
    for line in &lines {
        log.line(line);
    }
    result
}

/// `!Copy`: `dest` is replaced by a copy of `src` with `mode`. Returns the directory whose
/// entry changed (see [`write_atomic`]).
pub(crate) fn copy(
    src: &Path,
    dest: &Path,
    mode: u32,
    at: At,
    lines: &mut Vec<String>,
) -> Result<PathBuf, CommandError> {
    let mut input = match File::open(src) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(CommandError::MissingFile {
                at,
                what: "source file",
                path: src.to_owned(),
            });
        }
        Err(source) => return Err(io_error(at, src, "open", source)),
    };
    lines.push(format!(
        "copying {} -> {} (mode {mode:04o})",
        src.display(),
        dest.display()
    ));
    // Read whole, then written: rendered files are small, and a plain write is cheaper than the
    // copy_file_range that io::copy would use between two files.
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut input, &mut bytes).map_err(|e| io_error(at, src, "read", e))?;
    write_atomic(dest, mode, at, |file| io::Write::write_all(file, &bytes))
}

/// Replaces the file `dest` so that a reader sees the old or the new file, never a part or
/// none: `.tmp.<name>` in the same directory, filled, synced, `mode` set, renamed over `dest`.
/// Returns the directory, which the caller syncs ([`sync_dirs`]) so the rename survives a crash:
/// once per directory at the end of a command list rather than once per file.
pub(crate) fn write_atomic(
    dest: &Path,
    mode: u32,
    at: At,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<PathBuf, CommandError> {
    let (dir, name) = match (dest.parent(), dest.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => (dir, name),
        _ => {
            return Err(CommandError::Invalid {
                at,
                message: format!("{} does not name a file", dest.display()),
            });
        }
    };
    if !dir.is_dir() {
        return Err(CommandError::MissingFile {
            at,
            what: "destination directory",
            path: dir.to_owned(),
        });
    }
    if fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
        return Err(CommandError::Invalid {
            at,
            message: format!("{} is a directory, not a file", dest.display()),
        });
    }
    let mut tmp_name = std::ffi::OsString::from(".tmp.");
    tmp_name.push(name);
    let tmp = dir.join(tmp_name);
    // A temp file left by a crash is ours to replace; `create_new` below then also makes sure
    // we never write through a symlink someone put there.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(io_error(at, &tmp, "remove", source)),
    }
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| ("create", e))?;
        fill(&mut file).map_err(|e| ("write", e))?;
        // Explicitly, so the umask does not narrow the mode.
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(|e| ("set the mode of", e))?;
        file.sync_all().map_err(|e| ("sync", e))?;
        Ok::<(), (&'static str, io::Error)>(())
    })();
    if let Err((action, source)) = result {
        let _ = fs::remove_file(&tmp);
        return Err(io_error(at, &tmp, action, source));
    }
    if let Err(source) = fs::rename(&tmp, dest) {
        let _ = fs::remove_file(&tmp);
        return Err(io_error(at, dest, "replace", source));
    }
    Ok(dir.to_owned())
}

/// Syncs each directory whose entries [`write_atomic`] changed.
pub(crate) fn sync_dirs(
    dirs: &std::collections::BTreeSet<PathBuf>,
    at: At,
) -> Result<(), CommandError> {
    for dir in dirs {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| io_error(at, dir, "sync", source))?;
    }
    Ok(())
}

pub(crate) fn io_error(
    at: At,
    path: &Path,
    action: &'static str,
    source: io::Error,
) -> CommandError {
    CommandError::Io {
        at,
        path: PathBuf::from(path),
        action,
        source,
    }
}
