//! The storage dir (`/var/lib/verwalter`): the schedule in force, written atomically, read at
//! start so a restarted node begins from it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use std::collections::HashMap;

use verwalter_controllers::ports::{AppliedStore, ScheduleStore};
use verwalter_controllers::state::Schedule;

#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a schedule envelope: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {source}")]
    Hash {
        path: PathBuf,
        #[source]
        source: verwalter_controllers::state::HashMismatch,
    },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The storage dir of one node.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    /// `<storage>/schedule/schedule.json`, as in verwalter 0.13.
    pub fn schedule_path(&self) -> PathBuf {
        self.root.join("schedule").join("schedule.json")
    }

    /// The persisted schedule, `None` when there is none yet. A file that does not parse or
    /// whose hash does not match is an error (the caller logs it and starts without).
    pub fn load_schedule(&self) -> Result<Option<Schedule>, StateDirError> {
        let path = self.schedule_path();
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateDirError::Read { path, source }),
        };
        let schedule: Schedule =
            serde_json::from_slice(&bytes).map_err(|source| StateDirError::Parse {
                path: path.clone(),
                source,
            })?;
        schedule
            .verify()
            .map_err(|source| StateDirError::Hash { path, source })?;
        Ok(Some(schedule))
    }

    pub fn save_schedule(&self, schedule: &Schedule) -> Result<(), StateDirError> {
        self.save_encoded(
            schedule,
            &verwalter_controllers::hash::canonical_json(&schedule.data),
        )
    }

    /// Writes the envelope around `canonical_data` (the canonical JSON of `schedule.data`), so
    /// the file is compact, key-sorted, and costs no second serialisation of the data.
    pub fn save_encoded(
        &self,
        schedule: &Schedule,
        canonical_data: &[u8],
    ) -> Result<(), StateDirError> {
        let path = self.schedule_path();
        // Compact JSON: half the bytes of indented JSON for large schedules, and the file is read
        // by programs (`jq .` shows it indented). Same field order as the envelope type.
        let mut bytes = Vec::with_capacity(canonical_data.len() + 160);
        bytes.extend_from_slice(
            format!("{{\"timestamp\":{},\"hash\":", schedule.timestamp).as_bytes(),
        );
        serde_json::to_writer(&mut bytes, &schedule.hash).expect("a string serializes");
        bytes.extend_from_slice(b",\"data\":");
        bytes.extend_from_slice(canonical_data);
        bytes.extend_from_slice(b",\"origin\":");
        serde_json::to_writer(&mut bytes, &schedule.origin).expect("a string serializes");
        bytes.extend_from_slice(b"}\n");
        write_atomic(&path, &bytes).map_err(|source| StateDirError::Write { path, source })
    }
}

impl StateDir {
    /// `<storage>/roles/`: one `<role>.applied` file per role with the hash last applied.
    pub fn roles_dir(&self) -> PathBuf {
        self.root.join("roles")
    }

    /// `<storage>/staging/`: rendered files waiting for their commands.
    pub fn staging_dir(&self) -> PathBuf {
        self.root.join("staging")
    }

    /// `<storage>/backups/`: gzipped schedules, hourly, daily and weekly.
    pub fn backups_dir(&self) -> PathBuf {
        self.root.join("backups")
    }
}

impl AppliedStore for StateDir {
    fn load(&self) -> HashMap<String, String> {
        let mut applied = HashMap::new();
        let Ok(entries) = fs::read_dir(self.roles_dir()) else {
            return applied;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(role) = name.to_str().and_then(|n| n.strip_suffix(".applied")) else {
                continue;
            };
            match fs::read_to_string(entry.path()) {
                Ok(hash) => {
                    applied.insert(role.to_string(), hash.trim().to_string());
                }
                Err(e) => {
                    tracing::warn!(role, error = %e, "Cannot read an applied hash; the role renders again.");
                }
            }
        }
        applied
    }

    /// Rewritten in place, without fsync: after a crash the file may be old, empty or torn, and
    /// each only makes the role render once more (a hash that matches nothing counts as not
    /// applied). In place, because creating a new inode per apply costs more than the write.
    fn save(&self, role: &str, hash: &str) -> Result<(), String> {
        let path = self.roles_dir().join(format!("{role}.applied"));
        fs::create_dir_all(self.roles_dir())
            .and_then(|()| fs::write(&path, format!("{hash}\n")))
            .map_err(|e| format!("{}: cannot write: {e}", path.display()))
    }

    fn remove(&self, role: &str) -> Result<(), String> {
        let path = self.roles_dir().join(format!("{role}.applied"));
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("{}: cannot remove: {e}", path.display()))
            }
            _ => Ok(()),
        }
    }
}

impl ScheduleStore for StateDir {
    fn save(&self, schedule: &Schedule, canonical_data: &[u8]) -> Result<(), String> {
        self.save_encoded(schedule, canonical_data)
            .map_err(|e| e.to_string())
    }
}

/// Writes `bytes` to `path` so that readers see the old or the new file, never a part: a temp
/// file in the same directory, fsync, rename over the target.
///
/// The directory is not synced: if a crash loses the rename, the node starts from the schedule
/// before, which is a valid (older) schedule the leader replaces on its next run anyway. The
/// file's own fsync stays, so the name never points at a file with missing contents.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".tmp.{name}.{}", std::process::id()));
    let result = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_round_trips_and_tampering_is_caught() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        assert!(dir.load_schedule().unwrap().is_none());
        let schedule = Schedule::test().with_role("web", "v2").build();
        dir.save_schedule(&schedule).unwrap();
        assert_eq!(dir.load_schedule().unwrap(), Some(schedule.clone()));
        let stored = fs::read_to_string(dir.schedule_path()).unwrap();
        assert_eq!(
            stored,
            format!(
                "{{\"timestamp\":{},\"hash\":\"{}\",\"data\":{},\"origin\":\"{}\"}}\n",
                schedule.timestamp,
                schedule.hash,
                serde_json::to_string(&*schedule.data).unwrap(),
                schedule.origin
            ),
            "compact envelope around the canonical data"
        );
        let text = fs::read_to_string(dir.schedule_path()).unwrap();
        fs::write(dir.schedule_path(), text.replace("v2", "v3")).unwrap();
        let err = dir.load_schedule().unwrap_err().to_string();
        assert!(
            err.contains("schedule.json") && err.contains("hash mismatch"),
            "{err}"
        );
        fs::write(dir.schedule_path(), "{").unwrap();
        assert!(
            dir.load_schedule()
                .unwrap_err()
                .to_string()
                .contains("not a schedule envelope")
        );
        let leftovers: Vec<_> = fs::read_dir(dir.schedule_path().parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
