//! `!Condition`: directory signatures taken before the first command, compared at the
//! condition's turn.
//!
//! A signature is a SHA-1 over the sorted recursive listing: relative path, file type,
//! permission bits, size, the content of regular files and the target of symlinks. Timestamps
//! and inode numbers are left out on purpose: a deployment rewrites its files every time, and
//! a file rewritten with the same content must not count as a change (else every deployment
//! would restart the service, which is what `!Condition` exists to avoid).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha1::{Digest, Sha1};

use super::Command;

/// What a directory looked like. A missing one differs from every existing one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Signature {
    Absent,
    Present([u8; 20]),
}

/// The signatures of all `dirs-changed` of a command list, taken before it runs.
#[derive(Debug, Default)]
pub(crate) struct Signatures {
    before: BTreeMap<PathBuf, Signature>,
}

impl Signatures {
    pub(crate) async fn take(commands: &[Command]) -> Signatures {
        let dirs: BTreeSet<PathBuf> = commands
            .iter()
            .filter_map(|cmd| match cmd {
                Command::Condition(cond) => Some(cond.dirs_changed.iter().cloned()),
                _ => None,
            })
            .flatten()
            .collect();
        if dirs.is_empty() {
            return Signatures::default();
        }
        let before =
            off_thread(move || dirs.into_iter().map(|d| (d.clone(), sign(&d))).collect()).await;
        Signatures { before }
    }

    /// The first of `dirs` that is not as it was, if any.
    pub(crate) async fn changed(&self, dirs: &[PathBuf]) -> Option<PathBuf> {
        let then: Vec<(PathBuf, Option<Signature>)> = dirs
            .iter()
            .map(|d| (d.clone(), self.before.get(d).cloned()))
            .collect();
        off_thread(move || {
            then.into_iter()
                .find(|(dir, before)| before.as_ref() != Some(&sign(dir)))
                .map(|(dir, _)| dir)
        })
        .await
    }
}

/// Hashing reads every file of the directories: on the blocking pool.
async fn off_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

pub(crate) fn show_dirs(dirs: &[PathBuf]) -> String {
    let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    format!("[{}]", shown.join(", "))
}

/// The signature of `dir` now. The directory itself may be a symlink (it is configuration);
/// inside it, symlinks are recorded, not followed.
pub(crate) fn sign(dir: &Path) -> Signature {
    let meta = match fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Signature::Absent,
        Err(e) => {
            let mut hasher = Sha1::new();
            feed_error(&mut hasher, b"", &e);
            return Signature::Present(hasher.finalize().into());
        }
    };
    let mut hasher = Sha1::new();
    feed_entry(&mut hasher, b"", dir, &meta);
    if meta.is_dir() {
        walk(&mut hasher, dir, &mut Vec::new());
    }
    Signature::Present(hasher.finalize().into())
}

fn walk(hasher: &mut Sha1, dir: &Path, rel: &mut Vec<u8>) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return feed_error(hasher, rel, &e),
    };
    let mut names: Vec<_> = entries.filter_map(|e| Some(e.ok()?.file_name())).collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let len = rel.len();
        rel.push(b'/');
        rel.extend_from_slice(name.as_bytes());
        match fs::symlink_metadata(&path) {
            Ok(meta) => {
                feed_entry(hasher, rel, &path, &meta);
                if meta.is_dir() {
                    walk(hasher, &path, rel);
                }
            }
            Err(e) => feed_error(hasher, rel, &e),
        }
        rel.truncate(len);
    }
}

fn feed_entry(hasher: &mut Sha1, rel: &[u8], path: &Path, meta: &Metadata) {
    field(hasher, rel);
    let kind: &[u8] = if meta.is_dir() {
        b"dir"
    } else if meta.is_symlink() {
        b"symlink"
    } else if meta.is_file() {
        b"file"
    } else {
        b"other"
    };
    field(hasher, kind);
    field(hasher, &(meta.mode() & 0o7777).to_le_bytes());
    if meta.is_symlink() {
        let target = fs::read_link(path).unwrap_or_default();
        field(hasher, target.as_os_str().as_bytes());
    } else if meta.is_file() {
        field(hasher, &meta.size().to_le_bytes());
        let mut content = Sha1::new();
        match File::open(path).and_then(|mut f| io::copy(&mut f, &mut content)) {
            Ok(_) => field(hasher, &content.finalize()),
            Err(e) => feed_error(hasher, rel, &e),
        }
    }
}

fn feed_error(hasher: &mut Sha1, rel: &[u8], error: &io::Error) {
    field(hasher, rel);
    field(hasher, b"error");
    field(hasher, format!("{:?}", error.kind()).as_bytes());
}

/// Length-prefixed, so that bytes cannot move between fields without changing the hash.
fn field(hasher: &mut Sha1, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}
