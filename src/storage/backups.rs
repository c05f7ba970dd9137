//! Backups of the schedule in force, as verwalter 0.13 keeps them: gzipped copies of
//! `schedule.json` (which holds the same bytes as the newest schedule slot once its write after
//! the slot's succeeded; the start writes it again from the slot when a crash left it behind).
//! Which to take and which to delete is decided by
//! [`verwalter_controllers::storage::retention::plan_backups`]; this file reads, writes and
//! deletes them.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use time::OffsetDateTime;
use verwalter_controllers::storage::retention;

use crate::storage::state_dir::{MAX_STORED_SCHEDULE, create_temp, read_regular, temp_path};

/// Takes the backups of the current periods that do not exist yet from `schedule` (the stored
/// schedule file), then deletes those past retention. Returns the names created. The schedule
/// is read only as a regular file (never through a symlink, never a FIFO or device: an error
/// naming it), at most [`MAX_STORED_SCHEDULE`] bytes.
pub(crate) fn maintain(
    schedule: &Path,
    dir: &Path,
    now: OffsetDateTime,
) -> io::Result<Vec<String>> {
    match fs::symlink_metadata(schedule) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        _ => {}
    }
    fs::create_dir_all(dir)?;
    let plan = retention::plan_backups(&list(dir)?, now);
    let missing = plan.take;
    if !missing.is_empty() {
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", schedule.display()));
        let Some(bytes) = read_regular(schedule, MAX_STORED_SCHEDULE).map_err(named)? else {
            return Ok(Vec::new());
        };
        write_gzip(dir, &bytes, &missing)?;
    }
    for name in &plan.prune {
        fs::remove_file(dir.join(name))?;
    }
    Ok(missing)
}

/// Stores `data` gzipped as the backup `name` in `dir` (made if missing), whole or not at all,
/// and syncs the dir so it survives a crash. Used for the copy of 0.13's schedule at the upgrade.
pub(crate) fn keep(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    write_gzip(dir, data, &[name.to_string()])?;
    crate::storage::state_dir::sync_dir(dir)
}

/// Gzips `data` (best compression, as 0.13) into a private temp file in `dir` and hard-links it
/// under each of `names`: each name appears complete or not at all.
fn write_gzip(dir: &Path, data: &[u8], names: &[String]) -> io::Result<()> {
    // Private like the schedule itself; the links share the temp file's mode.
    let tmp = temp_path(dir, "backup");
    let result = (|| {
        let mut gz = flate2::write::GzEncoder::new(create_temp(&tmp)?, flate2::Compression::best());
        gz.write_all(data)?;
        gz.finish()?.sync_all()?;
        for name in names {
            fs::hard_link(&tmp, dir.join(name))?;
        }
        Ok::<_, io::Error>(())
    })();
    let _ = fs::remove_file(&tmp);
    result
}

/// Every backup name, sorted (the `/v1/backups` list).
pub(crate) fn list(dir: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut all: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| retention::is_backup(n))
        .collect();
    all.sort();
    Ok(all)
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    use time::macros::datetime;

    use super::*;

    #[test]
    fn backups_are_gzipped_copies_and_pruned_per_kind() {
        let tmp = tempfile::tempdir().unwrap();
        let schedule = tmp.path().join("schedule.json");
        let dir = tmp.path().join("backups");
        assert!(
            maintain(&schedule, &dir, datetime!(2026-01-01 00:00 UTC))
                .unwrap()
                .is_empty()
        );
        fs::write(&schedule, b"{\"hash\":\"x\"}").unwrap();
        let start = datetime!(2026-01-01 00:00 UTC);
        let created = maintain(&schedule, &dir, start).unwrap();
        assert_eq!(created.len(), 3);
        assert!(
            maintain(&schedule, &dir, start).unwrap().is_empty(),
            "same period"
        );
        let mut text = String::new();
        flate2::read::GzDecoder::new(fs::File::open(dir.join("daily-20260101")).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "{\"hash\":\"x\"}");
        let mode = fs::metadata(dir.join("daily-20260101"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "backups are private like the schedule");
        for hour in 1..100 {
            maintain(&schedule, &dir, start + time::Duration::hours(hour)).unwrap();
        }
        let all = list(&dir).unwrap();
        let count = |k: &str| all.iter().filter(|n| n.starts_with(k)).count();
        assert_eq!(count("hourly-"), 36);
        assert_eq!(count("daily-"), 5);
        assert_eq!(count("weekly-"), 2, "2026w00 and 2026w01");
        assert!(
            all.contains(&"hourly-20260105T03".to_string()),
            "the newest is kept"
        );
        assert!(
            !all.contains(&"hourly-20260101T00".to_string()),
            "the oldest went"
        );
    }
}

#[cfg(test)]
mod hostile_tests {
    use super::*;
    use time::macros::datetime;

    /// A symlink in the schedule's place (to a file outside the storage dir) is not read into a
    /// backup: the error names the schedule, and no backup holds the target's bytes. A FIFO is
    /// refused at once, not waited on.
    #[test]
    fn a_link_or_fifo_in_the_schedules_place_is_not_backed_up() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside.txt");
        fs::write(&outside, b"secret of another program").unwrap();
        let schedule = tmp.path().join("schedule.json");
        let dir = tmp.path().join("backups");
        std::os::unix::fs::symlink(&outside, &schedule).unwrap();
        let now = datetime!(2026-01-01 00:00 UTC);
        let err = maintain(&schedule, &dir, now).unwrap_err().to_string();
        assert!(
            err.contains("schedule.json: a symbolic link, not a regular file; refused"),
            "{err}"
        );
        assert!(list(&dir).unwrap().is_empty());
        fs::remove_file(&schedule).unwrap();
        nix::unistd::mkfifo(&schedule, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = maintain(&schedule, &dir, now).unwrap_err().to_string();
        assert!(err.contains("a FIFO, not a regular file"), "{err}");
        assert!(list(&dir).unwrap().is_empty());
    }
}
