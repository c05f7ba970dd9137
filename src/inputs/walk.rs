//! Walking a config dir: every entry in name order, symlinks followed but never out of the config
//! dir nor round in a loop. Filesystem calls go through [`FileSystem`], so tests can make them fail.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Directories nested deeper than this are not followed: no real config dir is that deep.
pub(crate) const MAX_DEPTH: usize = 64;

/// Entries (files and dirs) one walk visits at most. Several links to one dir are each walked
/// (aliases such as `current -> v2` are legitimate), so a maze of such links could make a walk
/// exponential in the number of links; a real config dir has a few thousand entries at most.
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// The filesystem calls of a walk and of the readers built on it. [`RealFs`] makes them; tests
/// wrap it to fail chosen calls the way a starved or broken system does (EMFILE, EIO).
pub(crate) trait FileSystem: Sync {
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<OsString>>;
    /// Metadata of what `path` leads to (symlinks followed).
    fn metadata(&self, path: &Path) -> io::Result<fs::Metadata>;
    /// Metadata of `path` itself.
    fn symlink_metadata(&self, path: &Path) -> io::Result<fs::Metadata>;
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf>;
    fn read_link(&self, path: &Path) -> io::Result<PathBuf>;
    /// The file's bytes, but no more than `limit + 1` of them, so a caller sees that a file is
    /// over its limit without holding all of it.
    fn read(&self, path: &Path, limit: u64) -> io::Result<Vec<u8>>;
}

/// The real filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RealFs;

impl FileSystem for RealFs {
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        fs::read_dir(dir)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect()
    }
    fn metadata(&self, path: &Path) -> io::Result<fs::Metadata> {
        fs::metadata(path)
    }
    fn symlink_metadata(&self, path: &Path) -> io::Result<fs::Metadata> {
        fs::symlink_metadata(path)
    }
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        path.canonicalize()
    }
    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        fs::read_link(path)
    }
    fn read(&self, path: &Path, limit: u64) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        fs::File::open(path)?
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)?;
        Ok(bytes)
    }
}

/// A walked directory: its entries in byte order of their names.
#[derive(Debug, Default)]
pub(crate) struct Dir {
    pub(crate) entries: Vec<(String, Node)>,
}

#[derive(Debug)]
pub(crate) enum Node {
    /// A regular file (or a link to one); `len` as the walk saw it.
    File {
        path: PathBuf,
        len: u64,
    },
    Dir(Dir),
}

/// Something the walk left out. `rel` is the entry's path relative to the walked dir (empty for
/// the dir itself).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Problem {
    /// The entry exists but could not be read (EMFILE, EACCES, EIO, ...): the walk is incomplete,
    /// which is not the same as the entry being gone.
    #[error("cannot read: {source}")]
    Io {
        rel: String,
        #[source]
        source: io::Error,
    },
    #[error("symlink loop: leads back to {}, a directory it is inside; left out", target.display())]
    Loop { rel: String, target: PathBuf },
    #[error("symlink to {}, outside {}; links may not leave it; left out", target.display(), boundary.display())]
    Outside {
        rel: String,
        target: PathBuf,
        boundary: PathBuf,
    },
    #[error("symlink to {}, which does not exist; left out", target.display())]
    Dangling { rel: String, target: PathBuf },
    /// A link that never resolves: links leading round to each other (`a -> b`, `b -> a`, or
    /// `x -> x`), or a chain longer than the system follows (ELOOP).
    #[error("symlink loop: {} never resolves (the links lead round to each other); left out", target.display())]
    Unresolvable { rel: String, target: PathBuf },
    #[error("file name is not valid UTF-8; left out")]
    NotUtf8 { rel: String },
    #[error("directories nested deeper than {MAX_DEPTH} levels; not followed")]
    TooDeep { rel: String },
    #[error(
        "more than {MAX_ENTRIES} entries under the directory (a maze of symlinks?); the rest is left out"
    )]
    TooMany { rel: String },
}

impl Problem {
    pub(crate) fn rel(&self) -> &str {
        match self {
            Problem::Io { rel, .. }
            | Problem::Loop { rel, .. }
            | Problem::Outside { rel, .. }
            | Problem::Dangling { rel, .. }
            | Problem::Unresolvable { rel, .. }
            | Problem::NotUtf8 { rel }
            | Problem::TooDeep { rel }
            | Problem::TooMany { rel } => rel,
        }
    }

    /// Whether the walk failed to read something that exists: its result must not stand for the
    /// directory's content.
    pub(crate) fn is_read_failure(&self) -> bool {
        matches!(self, Problem::Io { .. })
    }
}

/// Whether an I/O error is ELOOP: too many levels of symbolic links (links that lead round to
/// each other).
pub(crate) fn is_link_loop(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::ELOOP)
}

/// Whether an I/O error means the thing is gone (removed while we read: a normal change) rather
/// than unreadable.
pub(crate) fn is_gone(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

struct Walk<'a> {
    fs: &'a dyn FileSystem,
    /// Canonical; every entry's real path must stay under it.
    boundary: PathBuf,
    skip: &'a dyn Fn(&str) -> bool,
    /// Real paths of the dirs the walk is inside (the current branch), to cut loops.
    inside: Vec<PathBuf>,
    entries: usize,
    problems: Vec<Problem>,
}

/// Walks `root`, which must lead to a place under `boundary` (the config dir or part of it), as
/// must every symlink inside it. Names `skip` accepts are left out silently. A missing `root` is
/// an empty dir. Symlinks are followed, except back into a dir the walk is inside (a loop) or out
/// of `boundary`; a second name for a dir elsewhere is walked under that name too.
pub(crate) fn walk(
    fs: &dyn FileSystem,
    root: &Path,
    boundary: &Path,
    skip: &dyn Fn(&str) -> bool,
) -> (Dir, Vec<Problem>) {
    let mut walk = Walk {
        fs,
        boundary: PathBuf::new(),
        skip,
        inside: Vec::new(),
        entries: 0,
        problems: Vec::new(),
    };
    let dir = walk.root(root, boundary).unwrap_or_default();
    (dir, walk.problems)
}

impl Walk<'_> {
    fn root(&mut self, root: &Path, boundary: &Path) -> Option<Dir> {
        let io = |source: io::Error| Problem::Io {
            rel: String::new(),
            source,
        };
        let (real, meta) = match self.follow(root, "") {
            Ok(Some(found)) => found,
            Ok(None) => return None,
            Err(problem) => {
                self.problems.push(problem);
                return None;
            }
        };
        if !meta.is_dir() {
            return None;
        }
        match self.fs.canonicalize(boundary) {
            Ok(b) => self.boundary = b,
            Err(e) => {
                self.problems.push(io(e));
                return None;
            }
        }
        if !real.starts_with(&self.boundary) {
            self.problems.push(Problem::Outside {
                rel: String::new(),
                target: real,
                boundary: self.boundary.clone(),
            });
            return None;
        }
        Some(self.dir(root, real, "", 0))
    }

    /// The real path and metadata `path` leads to; `None` when it is gone.
    fn follow(&self, path: &Path, rel: &str) -> Result<Option<(PathBuf, fs::Metadata)>, Problem> {
        let io = |source: io::Error| Problem::Io {
            rel: rel.to_string(),
            source,
        };
        let meta = match self.fs.metadata(path) {
            Ok(meta) => meta,
            // A link that never resolves is a mistake in the dir, like a dangling one: left out
            // with an error, the rest is read (it used to fail the whole read).
            Err(e) if is_link_loop(&e) && self.is_symlink(path) => {
                return Err(self.unresolvable(path, rel));
            }
            Err(e) if is_gone(&e) => {
                // A link to nothing is a mistake to report; an entry gone meanwhile is a change.
                return match self.fs.symlink_metadata(path) {
                    Ok(m) if m.file_type().is_symlink() => Err(Problem::Dangling {
                        rel: rel.to_string(),
                        target: self.fs.read_link(path).unwrap_or_default(),
                    }),
                    _ => Ok(None),
                };
            }
            Err(e) => return Err(io(e)),
        };
        match self.fs.canonicalize(path) {
            Ok(real) => Ok(Some((real, meta))),
            Err(e) if is_gone(&e) => Ok(None),
            // Changed into a loop between the two calls.
            Err(e) if is_link_loop(&e) && self.is_symlink(path) => {
                Err(self.unresolvable(path, rel))
            }
            Err(e) => Err(io(e)),
        }
    }

    fn is_symlink(&self, path: &Path) -> bool {
        self.fs
            .symlink_metadata(path)
            .is_ok_and(|m| m.file_type().is_symlink())
    }

    fn unresolvable(&self, path: &Path, rel: &str) -> Problem {
        Problem::Unresolvable {
            rel: rel.to_string(),
            target: self.fs.read_link(path).unwrap_or_default(),
        }
    }

    fn dir(&mut self, path: &Path, real: PathBuf, rel: &str, depth: usize) -> Dir {
        let mut dir = Dir::default();
        let names = match self.fs.read_dir(path) {
            Ok(names) => names,
            Err(e) if is_gone(&e) => return dir,
            Err(source) => {
                self.problems.push(Problem::Io {
                    rel: rel.to_string(),
                    source,
                });
                return dir;
            }
        };
        let join = |name: &str| {
            if rel.is_empty() {
                name.to_string()
            } else {
                format!("{rel}/{name}")
            }
        };
        let mut names: Vec<String> = names
            .into_iter()
            .filter_map(|name| match name.into_string() {
                Ok(name) => Some(name),
                Err(name) => {
                    self.problems.push(Problem::NotUtf8 {
                        rel: join(&name.to_string_lossy()),
                    });
                    None
                }
            })
            .filter(|name| !(self.skip)(name))
            .collect();
        names.sort();
        self.inside.push(real.clone());
        for name in names {
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                if !self
                    .problems
                    .iter()
                    .any(|p| matches!(p, Problem::TooMany { .. }))
                {
                    self.problems.push(Problem::TooMany {
                        rel: rel.to_string(),
                    });
                }
                break;
            }
            let child = path.join(&name);
            let child_rel = join(&name);
            let (child_real, meta) = match self.fs.symlink_metadata(&child) {
                Ok(m) if !m.file_type().is_symlink() => (real.join(&name), m),
                Ok(_) => match self.follow(&child, &child_rel) {
                    Ok(Some((target, m))) => {
                        if !target.starts_with(&self.boundary) {
                            self.problems.push(Problem::Outside {
                                rel: child_rel,
                                target,
                                boundary: self.boundary.clone(),
                            });
                            continue;
                        }
                        (target, m)
                    }
                    Ok(None) => continue,
                    Err(problem) => {
                        self.problems.push(problem);
                        continue;
                    }
                },
                Err(e) if is_gone(&e) => continue,
                Err(source) => {
                    self.problems.push(Problem::Io {
                        rel: child_rel,
                        source,
                    });
                    continue;
                }
            };
            if meta.is_dir() {
                if self.inside.contains(&child_real) {
                    self.problems.push(Problem::Loop {
                        rel: child_rel,
                        target: child_real,
                    });
                } else if depth + 1 > MAX_DEPTH {
                    self.problems.push(Problem::TooDeep { rel: child_rel });
                } else {
                    let sub = self.dir(&child, child_real, &child_rel, depth + 1);
                    dir.entries.push((name, Node::Dir(sub)));
                }
            } else if meta.is_file() {
                dir.entries.push((
                    name,
                    Node::File {
                        path: child,
                        len: meta.len(),
                    },
                ));
            }
        }
        self.inside.pop();
        dir
    }
}

/// Every file under `dir`, as paths relative to it, sorted; hidden files and dirs are skipped.
/// Symlinks follow the rules of [`walk`], with `boundary` the place they must stay in. Loops,
/// dangling links and non-UTF-8 names are left out silently; the other problems are returned.
pub(crate) fn walk_files(
    fs: &dyn FileSystem,
    dir: &Path,
    boundary: &Path,
) -> (Vec<String>, Vec<Problem>) {
    fn flatten(dir: Dir, prefix: &str, files: &mut Vec<String>) {
        for (name, node) in dir.entries {
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            match node {
                Node::File { .. } => files.push(rel),
                Node::Dir(sub) => flatten(sub, &rel, files),
            }
        }
    }
    let (root, problems) = walk(fs, dir, boundary, &|name| name.starts_with('.'));
    let mut files = Vec::new();
    flatten(root, "", &mut files);
    let problems = problems
        .into_iter()
        .filter(|p| {
            !matches!(
                p,
                Problem::Loop { .. }
                    | Problem::Unresolvable { .. }
                    | Problem::Dangling { .. }
                    | Problem::NotUtf8 { .. }
            )
        })
        .collect();
    (files, problems)
}

/// A [`RealFs`] whose calls fail where a test says: `fail(call, path)` gives the error, if any,
/// for call `read_dir`, `metadata`, `symlink_metadata`, `canonicalize`, `read_link` or `read`.
#[cfg(test)]
pub(crate) struct FailingFs<F: Fn(&str, &Path) -> Option<io::Error> + Sync>(pub F);

#[cfg(test)]
impl<F: Fn(&str, &Path) -> Option<io::Error> + Sync> FailingFs<F> {
    fn check(&self, call: &str, path: &Path) -> io::Result<()> {
        (self.0)(call, path).map_or(Ok(()), Err)
    }
}

#[cfg(test)]
impl<F: Fn(&str, &Path) -> Option<io::Error> + Sync> FileSystem for FailingFs<F> {
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        self.check("read_dir", dir)?;
        RealFs.read_dir(dir)
    }
    fn metadata(&self, path: &Path) -> io::Result<fs::Metadata> {
        self.check("metadata", path)?;
        RealFs.metadata(path)
    }
    fn symlink_metadata(&self, path: &Path) -> io::Result<fs::Metadata> {
        self.check("symlink_metadata", path)?;
        RealFs.symlink_metadata(path)
    }
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        self.check("canonicalize", path)?;
        RealFs.canonicalize(path)
    }
    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        self.check("read_link", path)?;
        RealFs.read_link(path)
    }
    fn read(&self, path: &Path, limit: u64) -> io::Result<Vec<u8>> {
        self.check("read", path)?;
        RealFs.read(path, limit)
    }
}
