//! What is kept and what goes: the schedule backups (names, and which to prune) and the files of
//! the deployment log (by age and total size). The daemon lists and deletes; this decides.

use std::time::{Duration, SystemTime};

use time::OffsetDateTime;

/// How many backups of each kind are kept, as verwalter 0.13 kept them.
pub(crate) const BACKUPS_KEPT: [(&str, usize); 3] = [("hourly", 36), ("daily", 14), ("weekly", 12)];

/// Backups of this kind are never pruned: `upgrade-YYYYmmddTHHMMSS`, the schedule verwalter 0.13
/// left, copied at the upgrade ([`crate::storage::upgrade`]).
pub(crate) const UPGRADE_KIND: &str = "upgrade";

/// The names of the backups of the periods containing `now` (UTC): `hourly-YYYYmmddTHH`,
/// `daily-YYYYmmdd`, `weekly-YYYYwWW` (the week of the year starting on Monday).
pub(crate) fn backup_names(now: OffsetDateTime) -> [String; 3] {
    let now = now.to_offset(time::UtcOffset::UTC);
    let (year, month, day, hour) = (now.year(), now.month() as u8, now.day(), now.hour());
    [
        format!("hourly-{year:04}{month:02}{day:02}T{hour:02}"),
        format!("daily-{year:04}{month:02}{day:02}"),
        format!("weekly-{year:04}w{:02}", now.monday_based_week()),
    ]
}

/// Whether `name` is a backup (of any kind, [`UPGRADE_KIND`] too), by its prefix.
pub fn is_backup(name: &str) -> bool {
    BACKUPS_KEPT
        .iter()
        .map(|(kind, _)| *kind)
        .chain([UPGRADE_KIND])
        .any(|kind| kind_of(name) == Some(kind))
}

fn kind_of(name: &str) -> Option<&str> {
    name.split_once('-').map(|(kind, _)| kind)
}

/// Whether `name` is exactly a periodic backup name of a period that exists:
/// `hourly-YYYYmmddTHH` (a calendar date, hour 00–23), `daily-YYYYmmdd` (a calendar date) or
/// `weekly-YYYYwWW` (a week of that year as [`backup_names`] counts them: 00 for the days before
/// the first Monday, up to the week of 31 December). `daily-99999999`, `hourly-20250101T99` or
/// `weekly-2025w99` are not: such names sort after every real backup of their kind, so counted
/// with them they would never be pruned and would keep real ones from being kept.
pub(crate) fn is_period_backup(name: &str) -> bool {
    let Some((kind, period)) = name.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let number = |s: &str| s.parse::<u32>().ok();
    let date = |s: &str| -> Option<time::Date> {
        if s.len() != 8 || !digits(s) {
            return None;
        }
        let year = i32::try_from(number(&s[..4])?).ok()?;
        let month = time::Month::try_from(u8::try_from(number(&s[4..6])?).ok()?).ok()?;
        let day = u8::try_from(number(&s[6..])?).ok()?;
        time::Date::from_calendar_date(year, month, day).ok()
    };
    match kind {
        "hourly" => {
            let Some((day, hour)) = period.split_once('T') else {
                return false;
            };
            date(day).is_some() && hour.len() == 2 && digits(hour) && number(hour) < Some(24)
        }
        "daily" => date(period).is_some(),
        "weekly" => {
            let Some((year, week)) = period.split_once('w') else {
                return false;
            };
            if year.len() != 4 || !digits(year) || week.len() != 2 || !digits(week) {
                return false;
            }
            let (Some(year), Some(week)) = (number(year), number(week)) else {
                return false;
            };
            let day = |month, day| {
                i32::try_from(year)
                    .ok()
                    .and_then(|y| time::Date::from_calendar_date(y, month, day).ok())
                    .map(|d| u32::from(d.monday_based_week()))
            };
            match (day(time::Month::January, 1), day(time::Month::December, 31)) {
                (Some(first), Some(last)) => (first..=last).contains(&week),
                _ => false,
            }
        }
        _ => false,
    }
}

/// What to do with the backups dir: the backups of this period not taken yet, and the backups
/// to delete once they are (per kind, the oldest past [`BACKUPS_KEPT`], counting the new ones).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackupPlan {
    pub take: Vec<String>,
    pub prune: Vec<String>,
}

/// Plans the backups for `now` given the names in the backups dir (other names are ignored, and
/// so are names of periods that do not exist, [`is_period_backup`]: they are neither counted nor
/// pruned).
pub fn plan_backups(existing: &[String], now: OffsetDateTime) -> BackupPlan {
    let take: Vec<String> = backup_names(now)
        .into_iter()
        .filter(|n| !existing.contains(n))
        .collect();
    let mut prune = Vec::new();
    for (kind, keep) in BACKUPS_KEPT {
        let mut names: Vec<&String> = existing
            .iter()
            .chain(&take)
            .filter(|n| kind_of(n) == Some(kind) && is_period_backup(n))
            .collect();
        // Names sort by time within a kind.
        names.sort();
        let excess = names.len().saturating_sub(keep);
        prune.extend(names[..excess].iter().map(|n| n.to_string()));
    }
    BackupPlan { take, prune }
}

/// The limits of the deployment log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// A new segment starts when the current one is at least this big.
    pub segment_size: u64,
    /// Segments and index files older than this are deleted.
    pub max_age: Duration,
    /// The oldest segments go when all of them together exceed this.
    pub max_total: u64,
}

impl Default for LogLimits {
    fn default() -> Self {
        use crate::defaults;
        LogLimits {
            segment_size: defaults::LOG_SEGMENT_MIB << 20,
            max_age: Duration::from_secs(defaults::LOG_MAX_AGE_DAYS * 86_400),
            max_total: defaults::LOG_MAX_TOTAL_MIB << 20,
        }
    }
}

impl LogLimits {
    /// Whether a segment of `len` bytes is full: the next write starts a new one.
    pub fn segment_full(&self, len: u64) -> bool {
        len >= self.segment_size
    }
}

/// Whether a file in a stream of the deployment log is one retention looks at: a segment
/// (`log.<seg>.txt`) or an index file (`index.<day>.json`).
pub fn is_log_file(name: &str) -> bool {
    (name.starts_with("log.") && name.ends_with(".txt"))
        || (name.starts_with("index.") && name.ends_with(".json"))
}

/// One file of the deployment log as retention sees it; `path` is whatever names it for the
/// caller (it breaks ties between files of the same age and size).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogFile<P> {
    pub modified: SystemTime,
    pub len: u64,
    pub path: P,
    /// The file its stream's `latest` points at.
    pub latest: bool,
}

/// The files to delete, oldest first: every one older than `max_age`, then the oldest while all
/// of them together are over `max_total`. The `latest` file of a stream is spared the size
/// limit, not the age limit.
pub fn logs_to_delete<P: Ord>(
    mut files: Vec<LogFile<P>>,
    limits: &LogLimits,
    now: SystemTime,
) -> Vec<LogFile<P>> {
    let cutoff = now
        .checked_sub(limits.max_age)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    files.sort();
    let mut total: u64 = files.iter().map(|f| f.len).sum();
    let mut delete = Vec::new();
    for file in files {
        let too_old = file.modified < cutoff;
        if too_old || (!file.latest && total > limits.max_total) {
            total -= file.len;
            delete.push(file);
        }
    }
    delete
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn backup_names_follow_0_13() {
        let names = backup_names(datetime!(2018-08-10 15:11:50 UTC));
        assert_eq!(
            names,
            ["hourly-20180810T15", "daily-20180810", "weekly-2018w32"]
        );
        // The week of the year starts on Monday; days before the first Monday are week 00.
        assert_eq!(
            backup_names(datetime!(2026-01-01 00:00 UTC))[2],
            "weekly-2026w00"
        );
        assert_eq!(
            backup_names(datetime!(2026-01-05 00:00 UTC))[2],
            "weekly-2026w01"
        );
        // Named in UTC whatever the offset of `now`.
        assert_eq!(
            backup_names(datetime!(2026-01-01 01:30 +02:00))[0],
            "hourly-20251231T23"
        );
    }

    #[test]
    fn backups_of_this_period_are_taken_once() {
        let now = datetime!(2026-01-01 00:00 UTC);
        let first = plan_backups(&[], now);
        assert_eq!(
            first.take,
            ["hourly-20260101T00", "daily-20260101", "weekly-2026w00"]
        );
        assert!(first.prune.is_empty());
        let again = plan_backups(&first.take, now);
        assert_eq!(again, BackupPlan::default(), "same period, nothing to do");
        let next_hour = plan_backups(&first.take, now + time::Duration::hours(1));
        assert_eq!(next_hour.take, ["hourly-20260101T01"]);
    }

    #[test]
    fn the_oldest_backups_past_the_limit_of_their_kind_go() {
        let start = datetime!(2026-01-01 00:00 UTC);
        let mut dir: Vec<String> = vec!["schedule.json.tmp".into(), "notes".into()];
        for hour in 0..100 {
            let plan = plan_backups(&dir, start + time::Duration::hours(hour));
            dir.extend(plan.take);
            dir.retain(|n| !plan.prune.contains(n));
        }
        let count = |kind: &str| dir.iter().filter(|n| n.starts_with(kind)).count();
        assert_eq!(count("hourly-"), 36);
        assert_eq!(count("daily-"), 5);
        assert_eq!(count("weekly-"), 2, "2026w00 and 2026w01");
        assert!(
            dir.contains(&"hourly-20260105T03".to_string()),
            "newest kept"
        );
        assert!(
            !dir.contains(&"hourly-20260101T00".to_string()),
            "oldest gone"
        );
        assert!(dir.contains(&"notes".to_string()), "other files are left");

        // Over the limit of one kind only: the oldest of that kind go, the new one stays.
        let hourly: Vec<String> = (0..40)
            .map(|h| format!("hourly-202512{:02}T{:02}", 1 + h / 24, h % 24))
            .collect();
        let plan = plan_backups(&hourly, start);
        assert_eq!(plan.prune.len(), 5);
        assert_eq!(plan.prune[0], "hourly-20251201T00");
        assert!(!plan.prune.contains(&"hourly-20260101T00".to_string()));
        assert!(is_backup("weekly-2026w01") && !is_backup("yearly-2026"));

        // A copy kept at the upgrade from 0.13 is listed and never pruned.
        let mut with_upgrade = hourly.clone();
        with_upgrade.insert(0, "upgrade-20250101T000000".into());
        assert!(is_backup(&with_upgrade[0]));
        let plan = plan_backups(&with_upgrade, start);
        assert_eq!(plan.prune.len(), 5);
        assert!(!plan.prune.contains(&with_upgrade[0]));
    }

    /// Names of periods that do not exist (put in `backups/` by an earlier upgrade, or by hand)
    /// are neither counted nor pruned: they used to sort after every real backup of their kind,
    /// so they were never pruned and kept real ones from being kept.
    #[test]
    fn backups_of_periods_that_do_not_exist_take_no_place_of_real_ones() {
        let start = datetime!(2026-01-01 00:00 UTC);
        let mut dir: Vec<String> = (0..36)
            .map(|h| format!("hourly-202512{:02}T{:02}", 30 + h / 24, h % 24))
            .collect();
        let impossible = [
            "hourly-20250101T99",
            "hourly-99991231T99",
            "daily-99999999",
            "weekly-2025w99",
        ];
        dir.extend(impossible.iter().map(|n| n.to_string()));
        let plan = plan_backups(&dir, start);
        assert_eq!(
            plan.prune,
            ["hourly-20251230T00"],
            "36 real ones kept with the new one"
        );
        for name in impossible {
            assert!(!is_period_backup(name), "{name}");
            assert!(is_backup(name), "{name}: still listed");
        }
        for name in ["hourly-20251231T23", "daily-20240229", "weekly-2024w53"] {
            assert!(is_period_backup(name), "{name}");
        }
        for name in [
            "daily-2025022",
            "weekly-2025w1",
            "hourly-20250101T1",
            "daily-２0250101",
        ] {
            assert!(!is_period_backup(name), "{name}");
        }
    }

    fn file(age_s: u64, len: u64, path: &str, latest: bool, now: SystemTime) -> LogFile<String> {
        LogFile {
            modified: now - Duration::from_secs(age_s),
            len,
            path: path.to_string(),
            latest,
        }
    }

    fn paths(files: Vec<LogFile<String>>) -> Vec<String> {
        files.into_iter().map(|f| f.path).collect()
    }

    #[test]
    fn log_files_past_the_age_limit_go_even_the_latest() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100 * 86_400);
        let limits = LogLimits {
            segment_size: 100,
            max_age: Duration::from_secs(86_400),
            max_total: 1 << 30,
        };
        let files = vec![
            file(3600, 10, "web/log.new.txt", true, now),
            file(2 * 86_400, 10, "gone/log.old.txt", true, now),
            file(3 * 86_400, 10, ".index/index.old.json", false, now),
        ];
        assert_eq!(
            paths(logs_to_delete(files, &limits, now)),
            [".index/index.old.json", "gone/log.old.txt"],
            "oldest first"
        );
    }

    #[test]
    fn the_oldest_log_files_go_while_over_the_size_limit_but_not_the_latest() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100 * 86_400);
        let limits = LogLimits {
            segment_size: 100,
            max_age: Duration::from_secs(30 * 86_400),
            max_total: 250,
        };
        let files = vec![
            file(10, 100, "web/log.3.txt", true, now),
            file(30, 100, "web/log.2.txt", false, now),
            file(50, 100, "db/log.1.txt", true, now),
            file(40, 100, "web/log.1.txt", false, now),
        ];
        // 400 bytes: db's latest is spared, web/log.1 goes (300), then web/log.2 (200).
        assert_eq!(
            paths(logs_to_delete(files.clone(), &limits, now)),
            ["web/log.1.txt", "web/log.2.txt"]
        );
        let roomy = LogLimits {
            max_total: 400,
            ..limits
        };
        assert!(
            logs_to_delete(files, &roomy, now).is_empty(),
            "at the limit"
        );
        // A clock before the age limit deletes nothing for age.
        let early = SystemTime::UNIX_EPOCH + Duration::from_secs(60);
        let young = vec![file(30, 1, "web/log.1.txt", true, early)];
        assert!(logs_to_delete(young, &limits, early).is_empty());
    }

    #[test]
    fn a_segment_is_full_at_its_size() {
        let limits = LogLimits {
            segment_size: 200,
            ..LogLimits::default()
        };
        assert!(!limits.segment_full(199));
        assert!(limits.segment_full(200));
        assert!(limits.segment_full(500));
        assert!(is_log_file("log.20261122045549.txt") && is_log_file("index.20261122.json"));
        assert!(!is_log_file("latest") && !is_log_file(".latest.tmp"));
    }
}
