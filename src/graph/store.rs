//! The executor's builds on disk: `<storage-dir>/<build id>.json`, each replaced atomically.
//!
//! Writes go through [`crate::state_dir::write_atomic`] (temp file, fsync, rename, fsync of the
//! dir), so a kill leaves the old or the new state of a build, never a part. An id that is not a
//! plain file name (a `/`, a leading dot, odd characters) is stored as `id-<sha1 of id>.json`;
//! the id itself is inside the file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use futures::future::{BoxFuture, FutureExt};
use sha1::{Digest, Sha1};
use verwalter_controllers::ports::{BuildStore, StorageError};

pub struct BuildFiles {
    dir: PathBuf,
}

impl BuildFiles {
    /// The dir, made if missing.
    pub fn open(dir: &Path) -> io::Result<BuildFiles> {
        fs::create_dir_all(dir)?;
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            ));
        }
        Ok(BuildFiles {
            dir: dir.to_owned(),
        })
    }

    /// The file of build `id`.
    pub fn path(&self, id: &str) -> PathBuf {
        let plain = !id.is_empty()
            && id.len() <= 128
            && !id.starts_with('.')
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        let name = if plain {
            format!("{id}.json")
        } else {
            format!("id-{}.json", hex::encode(Sha1::digest(id.as_bytes())))
        };
        self.dir.join(name)
    }
}

impl BuildStore for BuildFiles {
    fn save(&self, id: String, bytes: Vec<u8>) -> BoxFuture<'static, Result<(), StorageError>> {
        let path = self.path(&id);
        async move {
            let at = path.clone();
            tokio::task::spawn_blocking(move || crate::state_dir::write_atomic(&at, &bytes))
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)))
                .map_err(|e| StorageError::io(&path, "cannot write", &e))
        }
        .boxed()
    }

    fn load(&self) -> (Vec<Vec<u8>>, Vec<StorageError>) {
        let mut builds = Vec::new();
        let mut problems = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => return (builds, vec![StorageError::io(&self.dir, "cannot list", &e)]),
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for path in paths {
            match fs::read(&path) {
                Ok(bytes) => builds.push(bytes),
                Err(e) => problems.push(StorageError::io(&path, "cannot read", &e)),
            }
        }
        (builds, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn builds_are_written_whole_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let files = BuildFiles::open(&tmp.path().join("graph")).unwrap();
        files
            .save("svc-1".into(), b"{\"a\":1}".to_vec())
            .await
            .unwrap();
        files
            .save("svc-1".into(), b"{\"a\":2}".to_vec())
            .await
            .unwrap();
        files.save("../x".into(), b"{}".to_vec()).await.unwrap();
        assert_eq!(files.path("svc-1"), tmp.path().join("graph/svc-1.json"));
        assert!(
            files
                .path("../x")
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("id-")
        );
        let (builds, problems) = files.load();
        assert!(problems.is_empty());
        assert_eq!(builds.len(), 2);
        assert!(builds.contains(&b"{\"a\":2}".to_vec()));
        // No temp file is left beside them.
        assert_eq!(fs::read_dir(tmp.path().join("graph")).unwrap().count(), 2);
    }
}
