//! Path containment: where a path leads once every symlink is resolved, and whether that stays
//! inside a boundary dir. Every place that follows a path given by a URL, a template dir or a
//! scheduler module checks it here; the config dir walk (`inputs::walk`) applies the same rule
//! through its filesystem seam.

use std::io;
use std::path::{Component, Path, PathBuf};

/// `rel` is a non-empty relative path of plain names: no `..`, `.`, root or NUL.
pub fn is_plain_relative(rel: &str) -> bool {
    !rel.is_empty()
        && !rel.contains('\0')
        && Path::new(rel)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// A dir that paths must not lead out of.
#[derive(Debug, Clone)]
pub struct Boundary {
    /// As given (how messages name paths under it).
    given: PathBuf,
    /// With every symlink resolved.
    real: PathBuf,
}

/// Why a path is not accepted inside a [`Boundary`].
#[derive(Debug)]
pub enum Escape {
    /// It cannot be resolved (missing, unreadable, a dangling link).
    Unresolved(io::Error),
    /// It resolves to this real path, outside the boundary.
    Outside(PathBuf),
}

impl Boundary {
    /// The boundary `dir`, which must exist.
    pub fn new(dir: &Path) -> io::Result<Boundary> {
        Ok(Boundary {
            given: dir.to_path_buf(),
            real: dir.canonicalize()?,
        })
    }

    /// The boundary `dir`, or `dir` taken as it is when it cannot be resolved (then nothing
    /// resolved under it will be inside, unless `dir` itself is real).
    pub(crate) fn new_or_given(dir: &Path) -> Boundary {
        Boundary::new(dir).unwrap_or_else(|_| Boundary {
            given: dir.to_path_buf(),
            real: dir.to_path_buf(),
        })
    }

    /// The boundary as given.
    pub(crate) fn given(&self) -> &Path {
        &self.given
    }

    /// The boundary with every symlink resolved.
    pub fn real(&self) -> &Path {
        &self.real
    }

    /// The real path of `path`, if it stays inside.
    pub(crate) fn resolve(&self, path: &Path) -> Result<PathBuf, Escape> {
        let real = path.canonicalize().map_err(Escape::Unresolved)?;
        if real.starts_with(&self.real) {
            Ok(real)
        } else {
            Err(Escape::Outside(real))
        }
    }

    /// `rel` (a plain relative path, see [`is_plain_relative`]) under the boundary, resolved and
    /// inside; `None` when `rel` is not plain.
    pub fn join_plain(&self, rel: &str) -> Option<Result<PathBuf, Escape>> {
        is_plain_relative(rel).then(|| self.resolve(&self.real.join(rel)))
    }

    /// The first entry on the way from the boundary (as given) to `path` that leads out, with
    /// where it leads: everything before it is inside, so it is a symlink. `None` when `path` is
    /// not under the boundary as given, or no entry leads out.
    pub fn first_exit(&self, path: &Path) -> Option<(PathBuf, PathBuf)> {
        let rel = path.strip_prefix(&self.given).ok()?;
        let mut at = self.given.clone();
        for part in rel.components() {
            at.push(part);
            if let Ok(leads) = at.canonicalize()
                && !leads.starts_with(&self.real)
            {
                return Some((at, leads));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn plain_relative_paths_only() {
        assert!(is_plain_relative("a/b.txt"));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a", "a\0b"] {
            assert!(!is_plain_relative(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_symlink_out_is_caught_and_named() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("sub/in.txt"), "in").unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        symlink(&outside, root.join("sub/out")).unwrap();
        symlink("in.txt", root.join("sub/alias")).unwrap();
        let b = Boundary::new(&root).unwrap();

        let inside = b.join_plain("sub/alias").unwrap().unwrap();
        assert_eq!(inside, b.real().join("sub/in.txt"));
        match b.join_plain("sub/out/secret").unwrap() {
            Err(Escape::Outside(real)) => assert!(real.ends_with("outside/secret")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            b.join_plain("sub/missing").unwrap(),
            Err(Escape::Unresolved(_))
        ));
        assert!(b.join_plain("../root/sub/in.txt").is_none());

        let (link, target) = b.first_exit(&root.join("sub/out/secret")).unwrap();
        assert_eq!(link, root.join("sub/out"));
        assert!(target.ends_with("outside"));
        assert!(b.first_exit(&root.join("sub/in.txt")).is_none());
    }
}
