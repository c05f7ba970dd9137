//! The file behind the action journal (`<storage>/actions.journal`): the [`ActionJournal`] port
//! as file I/O. What the records are and when to append or rewrite is the queue's
//! (`verwalter_controllers::actions`); this reads, appends with a sync, and replaces the file
//! atomically (a temp file of its own, fsync, rename, fsync of the dir), off the async runtime.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use verwalter_controllers::machinery::ports::{ActionJournal, JournalError, SavedJournal};

use crate::storage::state_dir::{FILE_MODE, not_regular, read_regular, sync_dir, write_atomic};

/// The most of the journal (and of the `actions.json` of older versions) read at start: far
/// more than the pending caps let it hold (rewritten once past twice what is pending); a larger
/// file is refused, never read whole.
pub(crate) const MAX_JOURNAL: u64 = 256 << 20;

/// The journal file, and the `actions.json` of versions before it.
#[derive(Debug, Clone)]
pub(crate) struct FileJournal {
    path: PathBuf,
    legacy: Option<PathBuf>,
    file: Arc<Mutex<Appender>>,
}

/// The handle appends go to, and the length of the records known to be in the file.
#[derive(Debug, Default)]
struct Appender {
    file: Option<fs::File>,
    len: u64,
}

impl FileJournal {
    pub(crate) fn new(path: PathBuf, legacy: Option<PathBuf>) -> FileJournal {
        FileJournal {
            path,
            legacy,
            file: Arc::default(),
        }
    }

    /// Appends and syncs `bytes`; on failure cuts the file back to its known records.
    fn append_blocking(&self, bytes: &[u8]) -> io::Result<()> {
        let mut appender = self.file.lock().unwrap();
        if appender.file.is_none() {
            let file = open_append(&self.path)?;
            appender.len = file.metadata()?.len();
            appender.file = Some(file);
        }
        let len = appender.len;
        let file = appender.file.as_mut().expect("opened above");
        match file.write_all(bytes).and_then(|()| file.sync_data()) {
            Ok(()) => {
                appender.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                // What landed is unknown (a failed fsync leaves the file's state undefined); the
                // queue rewrites the file before its next append.
                let _ = file.set_len(len);
                Err(e)
            }
        }
    }

    /// Replaces the journal with `bytes`.
    ///
    /// The open handle is dropped first and opened again only on success: once the rename
    /// happened, the old handle names the file it unlinked, and records appended to it would
    /// be acknowledged and lost.
    fn rewrite_blocking(&self, bytes: &[u8]) -> io::Result<()> {
        let mut appender = self.file.lock().unwrap();
        appender.file = None;
        write_atomic(&self.path, bytes)?;
        appender.file = Some(open_append(&self.path)?);
        appender.len = bytes.len() as u64;
        Ok(())
    }
}

/// Runs `io` on a blocking thread; its error is a write error of `path`.
fn blocking(
    path: PathBuf,
    io: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> BoxFuture<'static, Result<(), JournalError>> {
    Box::pin(async move {
        let result = match tokio::task::spawn_blocking(io).await {
            Ok(result) => result,
            Err(e) => Err(io::Error::other(e)),
        };
        result.map_err(|source| JournalError::Write {
            path,
            source: Arc::new(source),
        })
    })
}

/// Opens the journal to append: never through a symlink (`O_NOFOLLOW`), never waiting on a
/// FIFO (`O_NONBLOCK`, then cleared), and only a regular file.
fn open_append(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if let Some(what) = not_regular(&file.metadata()?) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what}, not a regular file; refused"),
        ));
    }
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
    fcntl(&file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(file)
}

/// The file's bytes, `None` if it does not exist. Anything but a regular file (a symlink, a
/// FIFO, a device) and a file over [`MAX_JOURNAL`] are errors naming it.
fn read(path: &Path) -> Result<Option<Vec<u8>>, JournalError> {
    read_regular(path, MAX_JOURNAL).map_err(|e| JournalError::Read {
        path: path.to_owned(),
        source: Arc::new(e),
    })
}

impl ActionJournal for FileJournal {
    fn load(&self) -> Result<SavedJournal, JournalError> {
        let journal = read(&self.path)?;
        let legacy = self
            .legacy
            .as_deref()
            .and_then(|legacy| read(legacy).transpose());
        Ok(SavedJournal { journal, legacy })
    }

    fn append(&self, records: Vec<u8>) -> BoxFuture<'static, Result<(), JournalError>> {
        let journal = self.clone();
        blocking(self.path.clone(), move || journal.append_blocking(&records))
    }

    fn rewrite(&self, records: Vec<u8>) -> BoxFuture<'static, Result<(), JournalError>> {
        let journal = self.clone();
        blocking(self.path.clone(), move || {
            journal.rewrite_blocking(&records)
        })
    }

    fn remove_legacy(&self) -> BoxFuture<'static, Result<(), JournalError>> {
        let Some(legacy) = self.legacy.clone() else {
            return Box::pin(std::future::ready(Ok(())));
        };
        blocking(legacy.clone(), move || {
            match fs::remove_file(&legacy) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            // Else a power loss could bring it back, and its actions, consumed since, would be
            // pending again.
            match legacy.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
                _ => Ok(()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn appends_and_rewrites_land_in_a_private_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("actions.journal");
        let journal = FileJournal::new(path.clone(), None);
        assert!(journal.load().unwrap().journal.is_none(), "none yet");
        journal.rewrite(b"a\n".to_vec()).await.unwrap();
        journal.append(b"b\n".to_vec()).await.unwrap();
        journal.append(b"c\n".to_vec()).await.unwrap();
        assert_eq!(journal.load().unwrap().journal.unwrap(), b"a\nb\nc\n");
        journal.rewrite(b"c\n".to_vec()).await.unwrap();
        journal.append(b"d\n".to_vec()).await.unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"c\nd\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_journal_that_cannot_be_read_is_an_error_not_an_empty_one() {
        let tmp = tempfile::tempdir().unwrap();
        // A directory where the journal should be: reading it fails, but not for "not found".
        let path = tmp.path().join("actions.journal");
        fs::create_dir(&path).unwrap();
        let err = FileJournal::new(path, None).load().expect_err("an error");
        assert!(matches!(err, JournalError::Read { .. }), "{err:?}");
        assert!(
            err.to_string().contains("cannot read the action journal"),
            "{err}"
        );
    }

    /// After a failed rewrite the handle on the old file is gone: an append opens the journal's
    /// path again (and fails while a file is in the way), never writes to the old file.
    #[tokio::test]
    async fn after_a_failed_rewrite_nothing_is_appended_to_the_old_file() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("actions.journal");
        fs::write(tmp.path().join("blocked"), "a file").unwrap();
        let journal = FileJournal::new(tmp.path().join("blocked/actions.journal"), None);
        *journal.file.lock().unwrap() = Appender {
            file: Some(open_append(&old).unwrap()),
            len: 0,
        };
        let err = journal.rewrite(b"1\n".to_vec()).await.unwrap_err();
        assert!(err.to_string().contains("blocked/actions.journal"), "{err}");
        assert!(journal.append(b"2\n".to_vec()).await.is_err());
        assert_eq!(fs::read(&old).unwrap(), b"", "nothing went to the old file");
        fs::remove_file(tmp.path().join("blocked")).unwrap();
        fs::create_dir(tmp.path().join("blocked")).unwrap();
        journal.rewrite(b"1\n".to_vec()).await.unwrap();
        journal.append(b"3\n".to_vec()).await.unwrap();
        assert_eq!(journal.load().unwrap().journal.unwrap(), b"1\n3\n");
    }

    /// A symlink (to a file outside the storage dir), a FIFO or a link to a device in the
    /// journal's place is refused at once with its path: never read through, never waited on
    /// (a FIFO used to block the start in `open`), never read without end (`/dev/zero`).
    #[test]
    fn a_journal_that_is_no_regular_file_is_refused_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("actions.journal");
        let outside = tmp.path().join("outside");
        fs::write(&outside, "{\"add\":1,\"action\":\"x\"}\n").unwrap();
        let cases: [(&str, &dyn Fn()); 3] = [
            ("a symbolic link", &|| {
                std::os::unix::fs::symlink(&outside, &path).unwrap()
            }),
            ("a FIFO", &|| {
                nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }),
            ("a symbolic link", &|| {
                std::os::unix::fs::symlink("/dev/zero", &path).unwrap()
            }),
        ];
        for (what, make) in cases {
            make();
            let err = FileJournal::new(path.clone(), None)
                .load()
                .expect_err(what)
                .to_string();
            assert!(
                err.contains("actions.journal")
                    && err.contains(&format!("{what}, not a regular file")),
                "{err}"
            );
            // Nor is anything appended through it.
            assert!(open_append(&path).is_err(), "{what}");
            fs::remove_file(&path).unwrap();
        }
        assert_eq!(
            fs::read_to_string(&outside).unwrap(),
            "{\"add\":1,\"action\":\"x\"}\n"
        );
    }

    #[tokio::test]
    async fn the_actions_json_of_older_versions_is_read_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let legacy = tmp.path().join("actions.json");
        let journal = FileJournal::new(tmp.path().join("actions.journal"), Some(legacy.clone()));
        assert!(journal.load().unwrap().legacy.is_none(), "none there");
        fs::write(&legacy, r#"{"7":{"old":true}}"#).unwrap();
        let saved = journal.load().unwrap();
        assert_eq!(saved.legacy.unwrap().unwrap(), br#"{"7":{"old":true}}"#);
        journal.remove_legacy().await.unwrap();
        assert!(!legacy.exists());
    }
}
