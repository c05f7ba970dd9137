//! Upgrading from verwalter 0.13: which layout a storage dir shows, and what the first start
//! moves, copies or removes so that nothing 0.13 kept is lost and nothing is done twice. The
//! daemon lists the dirs and carries the plans out (`src/storage/upgrade.rs`).
//!
//! What 0.13 left, and what becomes of it:
//!
//! | 0.13 left | Now |
//! |---|---|
//! | `<storage>/schedule/schedule.json`, an indented envelope | read where it is, as it is; a gzipped copy is kept first as the backup `upgrade-<time>`, since the first scheduler run replaces the file |
//! | `<storage>/schedule/<kind>-<period>.json.gz` backups | renamed into `<storage>/backups/<kind>-<period>`, so retention counts them with ours; one named for a period that does not exist (`daily-99999999`) stays where it is, logged |
//! | `<storage>/schedule/schedule.tmp`, `backup.tmp` | 0.13's temp files (a crash's leftovers, or a copy a named backup holds too): removed |
//! | the log dir | the same layout as ours: it goes on as it is; only 0.13's temp links `<stream>/latest.tmp` are removed |
//!
//! 0.13 kept nothing else on disk: which roles failed and what it applied lived in memory (after a
//! restart it rendered every role again), so a node coming from 0.13 renders its roles once.

use crate::storage::retention::UPGRADE_KIND;

/// The schedule file, in `<storage>/schedule/` for both versions.
pub const SCHEDULE_FILE: &str = "schedule.json";

/// How the `schedule.json` this daemon writes starts (compact, `timestamp` first); 0.13 wrote it
/// indented, so a file that starts otherwise was not written here.
pub const OWN_SCHEDULE_PREFIX: &[u8] = b"{\"timestamp\":";

/// Entries of the storage dir only this daemon makes: any of them means it ran here before.
const OWN_ENTRIES: [&str; 7] = [
    "roles",
    "staging",
    "backups",
    "actions.journal",
    "actions.json",
    "schedule.slot0",
    "schedule.slot1",
];

/// 0.13's temp files in `<storage>/schedule/`: `schedule.tmp` (its atomic write of
/// `schedule.json`) and `backup.tmp` (the gzip it hard-linked under the backup names).
const TEMP_FILES_013: [&str; 2] = ["schedule.tmp", "backup.tmp"];

/// 0.13's temp name of a `latest` link being replaced.
const LINK_TEMP_013: &str = "latest.tmp";

/// What the storage dir holds, as far as the upgrade cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageListing {
    /// Names directly in `<storage>`.
    pub root: Vec<String>,
    /// Names of the files in `<storage>/schedule/`.
    pub schedule: Vec<String>,
    /// Names in `<storage>/backups/`.
    pub backups: Vec<String>,
    /// `schedule/schedule.json`, when there is one.
    pub stored: Option<StoredSchedule>,
}

/// The stored schedule file, seen from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredSchedule {
    /// Whether it starts with [`OWN_SCHEDULE_PREFIX`].
    pub ours: bool,
    /// When it was made, in wall-clock ms: its `timestamp`, or when it cannot be parsed, the
    /// file's modification time. Names its copy, so the name is the same at every start.
    pub made_ms: u64,
}

/// Who left the storage dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Nothing stored yet.
    Empty,
    /// verwalter 0.13: its files and none of ours.
    V013,
    /// This daemon ran here before (0.13 may have run again since, after a downgrade).
    Current,
}

/// What the first start does to the storage dir. All names are file names in the dir named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoragePlan {
    pub layout: Layout,
    /// Keep a gzipped copy of `schedule/schedule.json` as `backups/<this name>`: the schedule
    /// 0.13 left is replaced by the first scheduler run.
    pub keep_schedule: Option<String>,
    /// Rename `schedule/<from>` to `backups/<to>`: 0.13's backups join ours.
    pub moves: Vec<(String, String)>,
    /// Remove `schedule/<name>`: 0.13's temp files.
    pub remove: Vec<String>,
    /// 0.13 backups left in `schedule/` because `backups/` has one of the same name (a period
    /// this daemon had backed up before 0.13 ran again); ours is the earlier of the period, the
    /// one a backup stands for. Not a step: the same files are found at every start.
    pub left: Vec<String>,
    /// 0.13 backups named for periods that do not exist (`daily-99999999`,
    /// `hourly-20250101T99`, `weekly-2025w99`): left where they are, and logged. Moved, they would
    /// sort after every real backup of their kind and retention would never prune them.
    pub impossible: Vec<String>,
}

impl StoragePlan {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.keep_schedule.is_none() && self.moves.is_empty() && self.remove.is_empty()
    }
}

/// Plans the upgrade of a storage dir from its listing.
pub fn plan_storage(listing: &StorageListing) -> StoragePlan {
    let ours = listing
        .root
        .iter()
        .any(|n| OWN_ENTRIES.contains(&n.as_str()));
    let mut moves: Vec<(String, String)> = Vec::new();
    let mut left = Vec::new();
    let mut names: Vec<&String> = listing.schedule.iter().collect();
    names.sort();
    let mut impossible = Vec::new();
    for name in names {
        let Some(bare) = backup_013(name) else {
            let bare = name.strip_suffix(".json.gz").unwrap_or(name);
            if looks_like_period_backup(bare) {
                impossible.push(name.clone());
            }
            continue;
        };
        // `backups/` has it, or an earlier name here maps to it (`x` and `x.json.gz`).
        let taken =
            listing.backups.iter().any(|b| b == bare) || moves.iter().any(|(_, to)| to == bare);
        if taken {
            left.push(name.clone());
        } else {
            moves.push((name.clone(), bare.to_string()));
        }
    }
    let remove: Vec<String> = listing
        .schedule
        .iter()
        .filter(|n| TEMP_FILES_013.contains(&n.as_str()))
        .cloned()
        .collect();
    let keep_schedule = listing
        .stored
        .filter(|s| !s.ours)
        .map(|s| upgrade_backup_name(s.made_ms))
        .filter(|name| !listing.backups.contains(name));
    let layout = if ours {
        Layout::Current
    } else if listing.stored.is_some()
        || !moves.is_empty()
        || !left.is_empty()
        || !impossible.is_empty()
    {
        Layout::V013
    } else {
        Layout::Empty
    };
    StoragePlan {
        layout,
        keep_schedule,
        moves,
        remove,
        left,
        impossible,
    }
}

/// The backup name (`<kind>-<period>`) of a 0.13 backup file in `schedule/`: named
/// `<kind>-<period>.json.gz`, or without the suffix; `None` for any other file.
pub(crate) fn backup_013(file: &str) -> Option<&str> {
    let bare = file.strip_suffix(".json.gz").unwrap_or(file);
    is_period_backup(bare).then_some(bare)
}

/// Whether `name` is exactly a periodic backup name of a period that exists (see
/// [`crate::storage::retention::is_period_backup`]).
pub(crate) fn is_period_backup(name: &str) -> bool {
    crate::storage::retention::is_period_backup(name)
}

/// Whether `name` has the shape of a periodic backup name, whatever its digits say
/// (`daily-99999999`): a 0.13 backup of a period that does not exist is left where it is and
/// named in the log, rather than taken silently for any other file.
fn looks_like_period_backup(name: &str) -> bool {
    let Some((kind, period)) = name.split_once('-') else {
        return false;
    };
    if !period.is_ascii() {
        return false;
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let split = |at: usize, sep: u8| {
        period.len() > at
            && period.as_bytes()[at] == sep
            && digits(&period[..at])
            && digits(&period[at + 1..])
    };
    match kind {
        "hourly" => period.len() == 11 && split(8, b'T'),
        "daily" => period.len() == 8 && digits(period),
        "weekly" => period.len() == 7 && split(4, b'w'),
        _ => false,
    }
}

/// `upgrade-YYYYmmddTHHMMSS` (UTC): the name of the copy of a schedule file this daemon did not
/// write, after when the schedule was made.
pub(crate) fn upgrade_backup_name(made_ms: u64) -> String {
    let secs = i64::try_from(made_ms / 1000).unwrap_or(i64::MAX);
    let t =
        time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{UPGRADE_KIND}-{:04}{:02}{:02}T{:02}{:02}{:02}",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The symlinks of the log dir: `(stream dir, link name)` for every symlink directly in a dir
/// of the log dir (`.index/latest`, `web/latest`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogListing {
    pub links: Vec<(String, String)>,
}

/// What the first start does to the log dir: remove `<stream>/<name>` for each pair, 0.13's
/// temp links (left by a crash while it replaced a `latest`; they would keep the dir of a role
/// gone from the node from being removed by retention). Everything else goes on as it is: the
/// layout, names, index lines and `latest` links are 0.13's.
pub fn plan_log(listing: &LogListing) -> Vec<(String, String)> {
    let mut remove: Vec<(String, String)> = listing
        .links
        .iter()
        .filter(|(_, name)| name == LINK_TEMP_013)
        .cloned()
        .collect();
    remove.sort();
    remove
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A storage dir as 0.13 leaves it: `schedule/` with the schedule, its backups and a temp.
    fn left_by_013() -> StorageListing {
        StorageListing {
            root: names(&["schedule"]),
            schedule: names(&[
                "schedule.json",
                "hourly-20260510T09.json.gz",
                "daily-20260510.json.gz",
                "weekly-2026w18.json.gz",
                "backup.tmp",
            ]),
            backups: Vec::new(),
            stored: Some(StoredSchedule {
                ours: false,
                made_ms: 1_778_405_723_456,
            }),
        }
    }

    #[test]
    fn a_013_dir_keeps_its_schedule_and_its_backups_join_ours() {
        let plan = plan_storage(&left_by_013());
        assert_eq!(plan.layout, Layout::V013);
        assert_eq!(
            plan.keep_schedule.as_deref(),
            Some("upgrade-20260510T093523")
        );
        assert_eq!(
            plan.moves,
            [
                ("daily-20260510.json.gz".into(), "daily-20260510".into()),
                (
                    "hourly-20260510T09.json.gz".into(),
                    "hourly-20260510T09".into()
                ),
                ("weekly-2026w18.json.gz".into(), "weekly-2026w18".into()),
            ]
        );
        assert_eq!(plan.remove, ["backup.tmp"]);
        assert!(plan.left.is_empty());
        assert!(!plan.is_empty());
    }

    /// After the plan is carried out, the next start finds nothing to do, even while
    /// `schedule.json` is still the one 0.13 wrote (no scheduler run replaced it yet).
    #[test]
    fn a_second_start_finds_nothing_to_do() {
        let first = left_by_013();
        let plan = plan_storage(&first);
        let mut after = first.clone();
        after.root.push("backups".into());
        after.schedule = names(&["schedule.json"]);
        after.backups = plan.moves.iter().map(|(_, to)| to.clone()).collect();
        after.backups.extend(plan.keep_schedule.clone());
        let again = plan_storage(&after);
        assert!(again.is_empty(), "{again:?}");
        assert_eq!(again.layout, Layout::Current);
        // Once the scheduler wrote its own schedule, the same.
        after.stored = Some(StoredSchedule {
            ours: true,
            made_ms: 1_778_405_999_000,
        });
        assert!(plan_storage(&after).is_empty());
    }

    #[test]
    fn an_empty_or_own_dir_needs_nothing() {
        let empty = plan_storage(&StorageListing::default());
        assert_eq!(empty.layout, Layout::Empty);
        assert!(empty.is_empty());
        let own = StorageListing {
            root: names(&["schedule", "roles", "backups", "actions.journal"]),
            schedule: names(&["schedule.json", ".tmp.schedule.json.12.0"]),
            backups: names(&["hourly-20260510T09", "upgrade-20260101T000000"]),
            stored: Some(StoredSchedule {
                ours: true,
                made_ms: 5,
            }),
        };
        let plan = plan_storage(&own);
        assert_eq!(plan.layout, Layout::Current);
        assert!(plan.is_empty(), "{plan:?}");
        // The schedule's slots alone say this daemon ran here (nothing rendered yet).
        for slot in ["schedule.slot0", "schedule.slot1"] {
            let slots_only = StorageListing {
                root: names(&["schedule", slot]),
                schedule: names(&["schedule.json"]),
                backups: Vec::new(),
                stored: Some(StoredSchedule {
                    ours: true,
                    made_ms: 5,
                }),
            };
            assert_eq!(plan_storage(&slots_only).layout, Layout::Current, "{slot}");
        }
    }

    /// 0.13 ran again after this daemon (a downgrade and back): its new backups join ours, but
    /// not over one of the same period, which stays where 0.13 put it; its schedule is kept.
    #[test]
    fn after_a_downgrade_only_new_periods_move() {
        let listing = StorageListing {
            root: names(&["schedule", "backups", "roles"]),
            schedule: names(&[
                "schedule.json",
                "daily-20260510.json.gz",
                "daily-20260511.json.gz",
                "daily-20260511",
            ]),
            backups: names(&["daily-20260510", "hourly-20260510T09"]),
            stored: Some(StoredSchedule {
                ours: false,
                made_ms: 0,
            }),
        };
        let plan = plan_storage(&listing);
        assert_eq!(plan.layout, Layout::Current);
        assert_eq!(
            plan.moves,
            [("daily-20260511".into(), "daily-20260511".into())]
        );
        assert_eq!(
            plan.left,
            ["daily-20260510.json.gz", "daily-20260511.json.gz"]
        );
        assert_eq!(
            plan.keep_schedule.as_deref(),
            Some("upgrade-19700101T000000")
        );
    }

    #[test]
    fn only_exact_backup_names_are_taken() {
        for good in [
            "hourly-20260510T09",
            "daily-20260510",
            "weekly-2026w00",
            "weekly-2024w53.json.gz",
            "hourly-20240229T23",
            "daily-20000229",
        ] {
            assert!(backup_013(good).is_some(), "{good}");
        }
        for bad in [
            "schedule.json",
            "hourly-20260510",
            "hourly-2026051009",
            "daily-2026051",
            "daily-20260510.json",
            "weekly-2026-18",
            "weekly-2026w1",
            "monthly-202605",
            "upgrade-20260510T093523",
            "hourly-２0260510T09",
            "daily-",
            "-20260510",
        ] {
            assert!(backup_013(bad).is_none(), "{bad}");
        }
        assert_eq!(backup_013("daily-20260510.json.gz"), Some("daily-20260510"));
    }

    /// The names, and others of periods that do not exist: not taken as backups, left
    /// where they are and named (they would sort after every real backup and never be pruned).
    #[test]
    fn backups_of_periods_that_do_not_exist_are_left_out_and_named() {
        let impossible = [
            "daily-99999999.json.gz",
            "hourly-20250101T99.json.gz",
            "weekly-2025w99.json.gz",
            "daily-20250229",
            "daily-20251301",
            "daily-20250100",
            "daily-20250432.json.gz",
            "hourly-20250101T24",
            "weekly-2025w53",
            "weekly-2018w00",
        ];
        for name in impossible {
            assert!(backup_013(name).is_none(), "{name}");
        }
        let mut listing = left_by_013();
        listing.schedule.extend(names(&impossible));
        listing.schedule.push("notes-99999999".into());
        let plan = plan_storage(&listing);
        assert_eq!(
            plan.moves,
            plan_storage(&left_by_013()).moves,
            "only the real ones"
        );
        let mut named = names(&impossible);
        named.sort();
        assert_eq!(plan.impossible, named);
        // A dir holding nothing but such files is still 0.13's, so the log names them.
        let only = StorageListing {
            root: names(&["schedule"]),
            schedule: names(&["daily-99999999.json.gz"]),
            ..StorageListing::default()
        };
        let plan = plan_storage(&only);
        assert_eq!(plan.layout, Layout::V013);
        assert!(plan.moves.is_empty());
        assert_eq!(plan.impossible, ["daily-99999999.json.gz"]);
    }

    /// An upgraded node reads and writes where 0.13 did and listens on its port.
    #[test]
    fn the_default_paths_and_port_are_013s() {
        use crate::defaults;
        assert_eq!(defaults::CONFIG_DIR, "/etc/verwalter");
        assert_eq!(defaults::STORAGE_DIR, "/var/lib/verwalter");
        assert_eq!(defaults::LOG_DIR, "/var/log/verwalter");
        assert_eq!(defaults::PORT, 8379);
    }

    #[test]
    fn only_013_temp_links_leave_the_log_dir() {
        let listing = LogListing {
            links: vec![
                ("web".into(), "latest".into()),
                ("web".into(), "latest.tmp".into()),
                (".index".into(), "latest.tmp".into()),
                (".index".into(), "latest".into()),
                (".global".into(), ".latest.tmp".into()),
            ],
        };
        assert_eq!(
            plan_log(&listing),
            [
                (".index".to_string(), "latest.tmp".to_string()),
                ("web".to_string(), "latest.tmp".to_string())
            ]
        );
        assert!(plan_log(&LogListing::default()).is_empty());
    }
}
