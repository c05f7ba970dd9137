//! The storage dir (`/var/lib/verwalter`): the schedule in force, flushed to a slot file and
//! written to `schedule/schedule.json`, read at start so a restarted node begins from it.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::collections::HashMap;

use verwalter_controllers::machinery::ports::{AppliedStore, ScheduleStore, StorageError};
use verwalter_controllers::state::Schedule;
use verwalter_controllers::storage::slots::{self as plan, Found, Take, ValidJson, ValidSlot};

use crate::storage::slots::{self, SLOT_NAMES, SlotBody};

#[derive(Debug, thiserror::Error)]
pub(crate) enum StateDirError {
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
}

/// The storage dir of one node. Clones share which slot is written next: give every writer
/// of one storage dir a clone of the same `StateDir`.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
    slots: Arc<Mutex<Option<NextSlot>>>,
}

/// Where the next schedule goes: `None` until the slots were read (at the start's load, or the
/// first save).
#[derive(Debug, Clone, PartialEq, Eq)]
struct NextSlot {
    slot: usize,
    seq: u64,
    /// `(timestamp, hash)` of the schedule in the newest slot: saving it again (a retry after
    /// `schedule.json` could not be written) does not write a slot.
    newest: Option<(u64, String)>,
}

/// A slot that is whole, with its schedule.
type GoodSlot = (SlotBody, Schedule);

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir {
            root: root.into(),
            slots: Arc::new(Mutex::new(None)),
        }
    }

    /// The storage dir itself.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `<storage>/schedule/schedule.json`, as in verwalter 0.13.
    pub(crate) fn schedule_path(&self) -> PathBuf {
        self.root.join("schedule").join("schedule.json")
    }

    /// The stored schedule, `None` when there is none yet: the newest whole slot, or
    /// `schedule.json` in a storage dir without slots (or when another version wrote a newer
    /// one since), as `verwalter_controllers::storage::slots` decides. A torn or corrupt slot is
    /// logged and passed over. When the slot taken is not what `schedule.json` holds (a crash
    /// came between the two writes), `schedule.json` is written again from it.
    ///
    /// Without a whole slot, a `schedule.json` that does not parse or whose hash does not match
    /// is an error (the caller logs it and starts without), and so is anything but a regular
    /// file (a symlink is not followed, a FIFO not waited on) and a file over
    /// [`MAX_STORED_SCHEDULE`].
    pub(crate) fn load_schedule(&self) -> Result<Option<Schedule>, StateDirError> {
        let mut next = self.slots.lock().unwrap();
        let mut good = self.read_slots();
        let json = self.load_json();
        let seen = json
            .as_ref()
            .ok()
            .and_then(Option::as_ref)
            .map(|(bytes, schedule)| ValidJson {
                timestamp: schedule.timestamp,
                same_as: good
                    .each_ref()
                    .map(|g| g.as_ref().is_some_and(|(slot, _)| slot.body == *bytes)),
            });
        let (load, after) = plan_slots(&good, seen);
        *next = Some(after);
        match load.take {
            Take::Slot(n) => {
                let (slot, schedule) = good[n].take().expect("the plan takes a whole slot");
                if load.rewrite_json {
                    if let Err(error) = &json {
                        tracing::warn!(%error, "The stored schedule.json is not usable; written again from the newest schedule slot.");
                    }
                    let path = self.schedule_path();
                    if let Err(e) = write_atomic_reusing(&path, &[&slot.body], true) {
                        tracing::warn!(path = %path.display(), error = %e, "Cannot write schedule.json from the newest schedule slot; it is written with the next schedule.");
                    }
                }
                Ok(Some(schedule))
            }
            Take::Json => {
                if good.iter().any(Option::is_some) {
                    tracing::info!(path = %self.schedule_path().display(), "The stored schedule.json is newer than the schedule slots (written by a version without them); taken.");
                }
                Ok(json?.map(|(_, schedule)| schedule))
            }
            Take::Nothing => json.map(|_| None),
        }
    }

    /// Both slots, each when it is whole and holds a schedule whose hash is right; the others
    /// are logged.
    fn read_slots(&self) -> [Option<GoodSlot>; 2] {
        [0, 1].map(|n| {
            let path = slots::slot_path(&self.root, n);
            let slot = match slots::read(&path) {
                Ok(slot) => slot?,
                Err(fault) => {
                    tracing::warn!(path = %path.display(), %fault, "Passing over a schedule slot that is not whole; the other slot or schedule.json is used.");
                    return None;
                }
            };
            let schedule = serde_json::from_slice::<Schedule>(&slot.body)
                .map_err(|e| e.to_string())
                .and_then(|s| s.verify().map(|()| s).map_err(|e| e.to_string()));
            match schedule {
                Ok(schedule) => Some((slot, schedule)),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "Passing over a schedule slot whose schedule is not right; the other slot or schedule.json is used.");
                    None
                }
            }
        })
    }

    /// `schedule.json`'s bytes and schedule, `None` when there is none.
    fn load_json(&self) -> Result<Option<(Vec<u8>, Schedule)>, StateDirError> {
        let path = self.schedule_path();
        let bytes = match read_regular(&path, MAX_STORED_SCHEDULE) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(None),
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
        Ok(Some((bytes, schedule)))
    }

    /// Saves the schedule in force: into the next slot with one flush (`fdatasync`), then into
    /// `schedule/schedule.json` (temp file and rename, no flush: readers see the old file or the
    /// new one, whole; after a power loss it may be older, or torn, and the start takes the
    /// slot and writes it again). Both get the envelope around the canonical text of
    /// `schedule.data` as it is (no second serialisation of the data): compact and key-sorted.
    /// An error of either is returned (the persister retries; a retry of a schedule the newest
    /// slot holds already writes only `schedule.json`).
    pub fn save_schedule(&self, schedule: &Schedule) -> Result<(), StorageError> {
        // Compact JSON: half the bytes of indented JSON for large schedules, and the file is read
        // by programs (`jq .` shows it indented). The envelope is `Schedule::write_json`'s.
        let (head, tail) = schedule.json_envelope();
        let parts = [
            head.as_slice(),
            schedule.data.canonical().as_bytes(),
            tail.as_slice(),
            b"\n",
        ];
        let mut next = self.slots.lock().unwrap();
        let next = next.get_or_insert_with(|| self.first_slot());
        let identity = (schedule.timestamp, schedule.hash.clone());
        if next.newest.as_ref() != Some(&identity) {
            slots::write(&self.root, next.slot, next.seq, &parts).map_err(|e| {
                StorageError::io(&slots::slot_path(&self.root, next.slot), "cannot write", &e)
            })?;
            *next = NextSlot {
                slot: 1 - next.slot,
                seq: next.seq + 1,
                newest: Some(identity),
            };
        }
        let path = self.schedule_path();
        // Something else in its place (a symlink, a FIFO) is replaced, never written through.
        if let Ok(meta) = fs::symlink_metadata(&path)
            && let Some(what) = not_regular(&meta)
            && !meta.is_dir()
        {
            tracing::warn!(path = %path.display(), found = what, "Replacing what is in the place of the stored schedule (it is not followed).");
        }
        write_atomic_reusing(&path, &parts, false)
            .map_err(|e| StorageError::io(&path, "cannot write", &e))
    }

    /// Where the first save goes when the start did not load (a tool, a bench): after the
    /// newest whole slot.
    fn first_slot(&self) -> NextSlot {
        plan_slots(&self.read_slots(), None).1
    }
}

/// The plan of a start on the whole slots `good` and `schedule.json`, and where the next
/// schedule is written after it.
fn plan_slots(good: &[Option<GoodSlot>; 2], json: Option<ValidJson>) -> (plan::LoadPlan, NextSlot) {
    let slots = good.each_ref().map(|g| {
        g.as_ref().map(|(slot, schedule)| ValidSlot {
            seq: slot.seq,
            timestamp: schedule.timestamp,
        })
    });
    let load = plan::plan_load(&Found { slots, json });
    let next = NextSlot {
        slot: load.next_slot,
        seq: load.next_seq,
        newest: plan::newest(&slots)
            .and_then(|n| good[n].as_ref())
            .map(|(_, s)| (s.timestamp, s.hash.clone())),
    };
    (load, next)
}

impl StateDir {
    /// Start-up housekeeping: removes temp files a crash left behind (only names
    /// [`temp_path`] makes, in the dirs it writes to) and gives files of older versions, which
    /// were world-readable, [`FILE_MODE`]. Returns how many temp files were removed.
    pub(crate) fn clean_temp_files(&self) -> usize {
        let mut removed = 0;
        for dir in [
            self.root.clone(),
            self.root.join("schedule"),
            self.backups_dir(),
        ] {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let path = entry.path();
                // `backup.tmp`: the one temp name of backups before names were unique.
                let old_backup_tmp = dir == self.backups_dir() && name == "backup.tmp";
                let temp = is_temp_name(&name) || old_backup_tmp;
                // A link or FIFO under a temp name (never ours) goes too: only the entry, what
                // it leads to is not touched.
                let remove_entry = temp && !kind.is_dir();
                if !kind.is_file() && !remove_entry {
                    continue;
                }
                if temp {
                    match fs::remove_file(&path) {
                        Ok(()) => removed += 1,
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, "Cannot remove a leftover temp file.");
                        }
                    }
                    continue;
                }
                let ours = dir == self.backups_dir()
                    || name == "schedule.json"
                    || SLOT_NAMES.contains(&name.as_str())
                    || name.starts_with("actions.");
                let loose = entry
                    .metadata()
                    .is_ok_and(|m| m.permissions().mode() & 0o077 != 0);
                if ours
                    && loose
                    && let Err(e) =
                        fs::set_permissions(&path, fs::Permissions::from_mode(FILE_MODE))
                {
                    tracing::warn!(path = %path.display(), error = %e, "Cannot make a stored file private.");
                }
            }
        }
        removed
    }

    /// `<storage>/actions.journal`: the leader's pending actions ([`crate::actions`]).
    pub(crate) fn actions_journal_path(&self) -> PathBuf {
        self.root.join("actions.journal")
    }

    /// `<storage>/actions.json`: where versions before the journal kept pending actions.
    pub(crate) fn old_actions_path(&self) -> PathBuf {
        self.root.join("actions.json")
    }

    /// `<storage>/roles/`: one `<role>.applied` file per role with the hash last applied.
    pub(crate) fn roles_dir(&self) -> PathBuf {
        self.root.join("roles")
    }

    /// `<storage>/staging/`: rendered files waiting for their commands.
    pub fn staging_dir(&self) -> PathBuf {
        self.root.join("staging")
    }

    /// `<storage>/backups/`: gzipped schedules, hourly, daily and weekly.
    pub(crate) fn backups_dir(&self) -> PathBuf {
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
            let read = read_regular(&entry.path(), MAX_APPLIED).and_then(|bytes| {
                String::from_utf8(bytes.unwrap_or_default())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            });
            match read {
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
    fn save(&self, role: &str, hash: &str) -> Result<(), StorageError> {
        let path = self.roles_dir().join(format!("{role}.applied"));
        fs::create_dir_all(self.roles_dir())
            .and_then(|()| write_in_place(&path, format!("{hash}\n").as_bytes()))
            .map_err(|e| StorageError::io(&path, "cannot write", &e))
    }

    fn remove(&self, role: &str) -> Result<(), StorageError> {
        let path = self.roles_dir().join(format!("{role}.applied"));
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StorageError::io(&path, "cannot remove", &e))
            }
            _ => Ok(()),
        }
    }
}

impl ScheduleStore for StateDir {
    fn save(&self, schedule: &Schedule) -> Result<(), StorageError> {
        self.save_schedule(schedule)
    }
}

/// Mode of every file verwalter writes in the storage dir: schedules and actions may hold
/// secrets the scheduler passes on, so only the daemon's user reads them (as staging files).
pub(crate) const FILE_MODE: u32 = 0o600;

/// Prefix of our temp files; [`StateDir::clean_temp_files`] removes leftovers at start.
const TEMP_PREFIX: &str = ".tmp.";

/// A temp file name in `dir` for `name`, unique in this process and across processes
/// (`.tmp.<name>.<pid>.<n>`): two writers of the same file never share a temp file.
pub(crate) fn temp_path(dir: &Path, name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{TEMP_PREFIX}{name}.{}.{n}", std::process::id()))
}

/// Whether `name` is one of our temp files: `.tmp.<name>.<digits>` (older versions ended in the
/// pid alone, [`temp_path`] adds a counter).
fn is_temp_name(name: &str) -> bool {
    name.strip_prefix(TEMP_PREFIX)
        .and_then(|rest| rest.rsplit_once('.'))
        .is_some_and(|(_, tail)| !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()))
}

/// Creates the new file `path` with [`FILE_MODE`]; fails if anything is there, a symlink
/// included (`O_EXCL`, `O_NOFOLLOW`): a temp file is never a link someone placed.
pub(crate) fn create_private(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Creates the temp file `tmp` (a [`temp_path`]) with [`create_private`]. An entry already
/// under that name can only be a leftover of a process that had this pid before (a container's
/// pid 1 restarted) or something planted: the entry goes first (never what it leads to).
pub(crate) fn create_temp(tmp: &Path) -> io::Result<fs::File> {
    match fs::remove_file(tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    create_private(tmp)
}

/// The largest stored schedule read: the fetch limit of a schedule (`cluster::fetch`), which
/// no schedule in force can pass. A file over it is refused, not read.
pub(crate) const MAX_STORED_SCHEDULE: u64 = crate::cluster::replication::MAX_SCHEDULE as u64;

/// The largest `roles/<role>.applied` read (it holds one hash).
const MAX_APPLIED: u64 = 4 << 10;

/// What a state file found in place of a regular file is, or `None` for a regular file.
pub(crate) fn not_regular(meta: &fs::Metadata) -> Option<&'static str> {
    let kind = meta.file_type();
    if kind.is_file() {
        None
    } else if kind.is_symlink() {
        Some("a symbolic link")
    } else {
        Some(special_kind(kind).unwrap_or("not a regular file"))
    }
}

/// What a directory, FIFO, socket or device is called in a message (`None` for any other kind).
pub(crate) fn special_kind(kind: fs::FileType) -> Option<&'static str> {
    Some(if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        return None;
    })
}

fn refused(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{what}, not a regular file; refused (state files are never read or written through links)"
        ),
    )
}

/// Opens the state file `path` for reading if it is a regular file, `None` when there is
/// nothing there. A symlink is not followed (`O_NOFOLLOW`), a FIFO or device is refused before
/// it is opened, and opened without waiting (`O_NONBLOCK`, cleared once it is known to be a
/// regular file) should one take the file's place meanwhile: a reader never blocks in `open`.
pub(crate) fn open_regular(path: &Path) -> io::Result<Option<fs::File>> {
    match fs::symlink_metadata(path) {
        Ok(meta) => {
            if let Some(what) = not_regular(&meta) {
                return Err(refused(what));
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(refused("a symbolic link")),
        Err(e) => return Err(e),
    };
    if let Some(what) = not_regular(&file.metadata()?) {
        return Err(refused(what));
    }
    blocking_again(&file)?;
    Ok(Some(file))
}

/// Clears `O_NONBLOCK` on `file`.
fn blocking_again(file: &fs::File) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(file, FcntlArg::F_GETFL)?);
    fcntl(file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(())
}

/// The bytes of the state file `path` ([`open_regular`]), at most `limit` of them: a longer
/// file is refused with its size, never read whole. `None` when there is nothing there.
pub(crate) fn read_regular(path: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let Some(file) = open_regular(path)? else {
        return Ok(None);
    };
    let too_big = |len: u64| {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{len} bytes or more; at most {limit} are read"),
        )
    };
    let len = file.metadata()?.len();
    if len > limit {
        return Err(too_big(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(Some(bytes))
}

/// Opens `path` to write it over if it is a regular file of its own (one name): not through a
/// symlink, not a FIFO (never waited on) or device, not a file another name shares.
pub(crate) fn open_own(path: &Path) -> Option<fs::File> {
    let file = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && meta.nlink() == 1 && blocking_again(&file).is_ok()).then_some(file)
}

/// Writes `bytes` over the file `path` in place (no fsync, no rename), or into a new file when
/// there is none, or anything but a regular file of its own in its place (replaced, never
/// written through).
fn write_in_place(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = match open_own(path) {
        Some(file) => file,
        None => match create_private(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Something else is there (a link, a FIFO, a shared file): only the entry goes.
                fs::remove_file(path)?;
                create_private(path)?
            }
            Err(e) => return Err(e),
        },
    };
    file.set_len(0)?;
    file.write_all(bytes)
}

/// Syncs a directory, so a rename or a new entry in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` so that readers see the old or the new file, never a part: a temp
/// file of its own in the same directory (mode [`FILE_MODE`]), fsync, rename over the target,
/// fsync of the directory. The directory sync makes the rename itself durable: without it a
/// crash could bring back the older schedule (a rollback) or lose a compacted action journal.
/// It costs one more fsync per write, and these writes are rare.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_parts(path, &[bytes])
}

/// [`write_atomic`] of `parts` one after the other (a schedule's envelope around its data,
/// without copying a megabyte into one buffer first).
pub(crate) fn write_atomic_parts(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        fs::create_dir_all(dir)?;
        // The new directory's entry must survive a crash as well as the file in it.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = temp_path(dir, &name);
    let result = (|| {
        let mut file = create_temp(&tmp)?;
        for part in parts {
            file.write_all(part)?;
        }
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    sync_dir(dir)
}

/// [`write_atomic_parts`] for a file rewritten whole at every change (the schedule: a megabyte
/// on a large fleet, on every node): the file it replaces is kept under a temp name
/// (`.tmp.<name>.spare.0`) and the next write goes into that file, over pages the kernel already
/// has, instead of into a new one whose pages it must allocate while it frees the old file's.
/// The spare is never the file in force, so a crash while it is written leaves the file as it
/// was; the start-up cleanup removes a spare with the other temp files.
///
/// Without `durable`, nothing is flushed (no `fsync` of the file nor of the directory): readers
/// still see the old file or the new one, whole, but after a power loss the file may be the
/// older one or torn. For `schedule.json`, which the schedule slots make durable first.
pub(crate) fn write_atomic_reusing(
    path: &Path,
    parts: &[&[u8]],
    durable: bool,
) -> std::io::Result<()> {
    let (Some(dir), Some(name)) = (
        path.parent().filter(|d| d.is_dir()),
        path.file_name().and_then(|n| n.to_str()),
    ) else {
        return write_atomic_parts(path, parts);
    };
    let spare = dir.join(format!("{TEMP_PREFIX}{name}.spare.0"));
    let tmp = temp_path(dir, name);
    let mut kept = None;
    let result = (|| {
        // Renamed first, so that two writers never share it: the one that loses writes anew.
        // A spare someone else linked to is left to them (it would change under them), and one
        // that is not a regular file (a symlink someone placed, a FIFO) is never written
        // through nor waited on: only the entry goes.
        let claimed = fs::rename(&spare, &tmp).is_ok();
        let mut file = match claimed.then(|| open_own(&tmp)).flatten() {
            Some(file) => file,
            None => create_temp(&tmp)?,
        };
        let mut len = 0;
        for part in parts {
            file.write_all(part)?;
            len += part.len() as u64;
        }
        file.set_len(len)?;
        if durable {
            file.sync_all()?;
        }
        // Only a regular file is kept as the next spare: a link (`link` names the link itself,
        // not what it leads to) or FIFO in the file's place is dropped with the rename.
        let keep = temp_path(dir, name);
        if fs::hard_link(path, &keep).is_ok() {
            let regular = fs::symlink_metadata(&keep).is_ok_and(|m| m.is_file());
            if regular {
                kept = Some(keep);
            } else {
                let _ = fs::remove_file(&keep);
            }
        }
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    if let Some(keep) = kept
        && (result.is_err() || fs::rename(&keep, &spare).is_err())
    {
        let _ = fs::remove_file(&keep);
    }
    result?;
    if durable { sync_dir(dir) } else { Ok(()) }
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
                serde_json::to_string(&**schedule.data.tree()).unwrap(),
                schedule.origin
            ),
            "compact envelope around the canonical data"
        );
        // Without slots (a storage dir of an older version), schedule.json alone is checked.
        for name in SLOT_NAMES {
            fs::remove_file(dir.root.join(name)).ok();
        }
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

    /// Each save after the first writes into the file the one before replaced, and the file in
    /// force is always whole: schedules that grow and shrink read back as they were saved.
    #[test]
    fn a_schedule_is_written_over_the_file_it_replaced_two_saves_ago() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        let spare = dir.root.join("schedule/.tmp.schedule.json.spare.0");
        let mut inodes = Vec::new();
        for (n, size) in [1000, 10, 5000, 3, 3, 700].into_iter().enumerate() {
            let schedule = Schedule::new(
                serde_json::json!({"pad": "x".repeat(size)}),
                n as u64,
                "a".into(),
            );
            dir.save_schedule(&schedule).unwrap();
            assert_eq!(dir.load_schedule().unwrap(), Some(schedule), "save {n}");
            inodes.push(fs::metadata(dir.schedule_path()).unwrap().ino());
            assert_eq!(spare.exists(), n > 0, "save {n}");
        }
        assert_eq!(inodes[2], inodes[0], "the first file, written again");
        assert_eq!(inodes[3], inodes[1]);
        assert_ne!(inodes[1], inodes[0]);
        // A spare that another name links to is not written over.
        let link = tmp.path().join("someone-elses");
        fs::hard_link(&spare, &link).unwrap();
        let before = fs::read(&link).unwrap();
        dir.save_schedule(&Schedule::new(serde_json::json!({"n": 7}), 7, "a".into()))
            .unwrap();
        assert_eq!(fs::read(&link).unwrap(), before);
        // The start-up cleanup removes the spare with the other temp files.
        assert_eq!(dir.clean_temp_files(), 1);
        assert!(!spare.exists());
    }

    /// The attack: `schedule.json` a symlink to a file outside the storage dir. It is
    /// not read (an error naming it), and the saves that follow replace the link without ever
    /// writing through it, nor through a spare (the link used to become the spare, and later
    /// saves overwrote the outside file with schedule JSON). A symlink placed as the spare, or
    /// under a temp name, is not followed either.
    #[test]
    fn a_symlink_in_the_schedules_place_is_never_read_or_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside.conf");
        fs::write(&outside, "precious = 1\n").unwrap();
        let dir = StateDir::new(tmp.path().join("storage"));
        let schedule_dir = dir.schedule_path().parent().unwrap().to_path_buf();
        fs::create_dir_all(&schedule_dir).unwrap();
        std::os::unix::fs::symlink(&outside, dir.schedule_path()).unwrap();
        let err = dir.load_schedule().unwrap_err().to_string();
        assert!(
            err.contains(
                "schedule/schedule.json: cannot read: a symbolic link, not a regular file; refused"
            ),
            "{err}"
        );
        for n in 0..5 {
            let schedule = Schedule::new(serde_json::json!({"n": n}), n, "a".into());
            dir.save_schedule(&schedule).unwrap();
            assert_eq!(dir.load_schedule().unwrap(), Some(schedule), "save {n}");
            assert_eq!(fs::read_to_string(&outside).unwrap(), "precious = 1\n");
        }
        assert!(fs::symlink_metadata(dir.schedule_path()).unwrap().is_file());
        // A link someone puts as the spare, or a FIFO, is dropped, not written through or waited on.
        let spare = schedule_dir.join(".tmp.schedule.json.spare.0");
        fs::remove_file(&spare).unwrap();
        std::os::unix::fs::symlink(&outside, &spare).unwrap();
        dir.save_schedule(&Schedule::new(serde_json::json!({"n": 9}), 9, "a".into()))
            .unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious = 1\n");
        fs::remove_file(&spare).unwrap();
        nix::unistd::mkfifo(&spare, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        dir.save_schedule(&Schedule::new(serde_json::json!({"n": 10}), 10, "a".into()))
            .unwrap();
        assert!(
            fs::symlink_metadata(&spare).unwrap().is_file(),
            "the replaced file"
        );
        // A link under a temp name is refused as a temp file and removed at start.
        let planted = schedule_dir.join(".tmp.schedule.json.1.0");
        std::os::unix::fs::symlink(&outside, &planted).unwrap();
        assert!(create_private(&planted).is_err());
        let mut made = create_temp(&planted).unwrap();
        made.write_all(b"ours").unwrap();
        assert!(fs::symlink_metadata(&planted).unwrap().is_file());
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious = 1\n");
        fs::remove_file(&planted).unwrap();
        std::os::unix::fs::symlink(&outside, &planted).unwrap();
        assert_eq!(dir.clean_temp_files(), 2, "the link and the spare");
        assert!(fs::symlink_metadata(&planted).is_err());
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious = 1\n");
    }

    /// A FIFO in the schedule's place is refused at once (the start used to block in `open`
    /// before it listened), a link to `/dev/zero` is not read without end, and a file over the
    /// limit is refused by its size, not read.
    #[test]
    fn a_fifo_a_device_or_a_huge_file_as_the_schedule_is_refused_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        let path = dir.schedule_path();
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = dir.load_schedule().unwrap_err().to_string();
        assert!(err.contains("a FIFO, not a regular file; refused"), "{err}");
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let err = dir.load_schedule().unwrap_err().to_string();
        assert!(err.contains("a symbolic link"), "{err}");
        fs::remove_file(&path).unwrap();
        let file = fs::File::create(&path).unwrap();
        file.set_len(MAX_STORED_SCHEDULE + 1).unwrap(); // sparse
        let err = dir.load_schedule().unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "{} bytes or more; at most {MAX_STORED_SCHEDULE} are read",
                MAX_STORED_SCHEDULE + 1
            )),
            "{err}"
        );
        assert_eq!(
            read_regular(&tmp.path().join("none"), 1).unwrap(),
            None,
            "nothing there"
        );
    }

    /// `roles/<role>.applied`: a link in its place is neither read (the role renders again) nor
    /// written through (replaced by the daemon's own file); a FIFO is not waited on.
    #[test]
    fn applied_hashes_are_never_read_or_written_through_links() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::write(&outside, "precious\n").unwrap();
        let dir = StateDir::new(tmp.path().join("storage"));
        fs::create_dir_all(dir.roles_dir()).unwrap();
        std::os::unix::fs::symlink(&outside, dir.roles_dir().join("web.applied")).unwrap();
        nix::unistd::mkfifo(
            &dir.roles_dir().join("db.applied"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        AppliedStore::save(&dir, "ok", "h0").unwrap();
        let loaded = AppliedStore::load(&dir);
        assert_eq!(
            loaded,
            HashMap::from([("ok".to_string(), "h0".to_string())])
        );
        AppliedStore::save(&dir, "web", "h1").unwrap();
        AppliedStore::save(&dir, "db", "h2").unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious\n");
        let loaded = AppliedStore::load(&dir);
        assert_eq!(loaded["web"], "h1");
        assert_eq!(loaded["db"], "h2");
        AppliedStore::save(&dir, "web", "h3").unwrap();
        assert_eq!(AppliedStore::load(&dir)["web"], "h3");
    }

    fn saved(dir: &StateDir, n: u64) -> Schedule {
        let schedule = Schedule::new(serde_json::json!({"n": n}), 1000 + n, "a".into());
        dir.save_schedule(&schedule).unwrap();
        schedule
    }

    /// The slots are written by turns with rising sequence numbers, and a start takes the
    /// newest; `schedule.json` holds the same bytes as the newest slot.
    #[test]
    fn saves_alternate_between_the_slots_and_a_start_takes_the_newest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        let slot = |n: usize| slots::read(&slots::slot_path(tmp.path(), n)).unwrap();
        for n in 1..=5 {
            let schedule = saved(&dir, n);
            let newest = slot(((n - 1) % 2) as usize).unwrap();
            assert_eq!(newest.seq, n, "save {n}");
            assert_eq!(newest.body, fs::read(dir.schedule_path()).unwrap());
            // A fresh start (another StateDir on the same dir) takes it and goes on after it.
            let again = StateDir::new(tmp.path());
            assert_eq!(again.load_schedule().unwrap(), Some(schedule), "save {n}");
        }
        assert_eq!(slot(0).unwrap().seq, 5);
        assert_eq!(slot(1).unwrap().seq, 4);
        let again = StateDir::new(tmp.path());
        again.load_schedule().unwrap();
        saved(&again, 6);
        assert_eq!(slot(1).unwrap().seq, 6, "written over the older slot");
        assert_eq!(slot(0).unwrap().seq, 5, "the newest before it is kept");
        // Without a load first (a tool), a save goes after the newest slot all the same.
        saved(&StateDir::new(tmp.path()), 7);
        assert_eq!((slot(0).unwrap().seq, slot(1).unwrap().seq), (7, 6));
    }

    /// A torn or corrupt newest slot (the crash came while it was written, so `schedule.json`
    /// is still the schedule before, or missing) is passed over: the other slot's schedule is
    /// taken, `schedule.json` is written from it when missing, and the next save goes over the
    /// torn slot, not over the good one. (A torn slot beside a `schedule.json` newer than the
    /// good slot, which a crash cannot leave, takes `schedule.json`: see the test below.)
    #[test]
    fn a_torn_slot_falls_back_to_the_other_and_is_written_next() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        let first = saved(&dir, 1);
        let first_json = fs::read(dir.schedule_path()).unwrap();
        saved(&dir, 2);
        let torn = slots::slot_path(tmp.path(), 1);
        let good = fs::read(&torn).unwrap();
        let len = slots::HEADER_LEN + 20;
        for damage in [
            good[..len].to_vec(),                                  // cut short
            [&good[..len], &vec![0u8; good.len() - len]].concat(), // the rest not written yet
            Vec::new(),                                            // empty
        ] {
            for json in [Some(&first_json), None] {
                fs::write(&torn, &damage).unwrap();
                match json {
                    Some(bytes) => fs::write(dir.schedule_path(), bytes).unwrap(),
                    None => fs::remove_file(dir.schedule_path()).unwrap(),
                }
                let dir = StateDir::new(tmp.path());
                assert_eq!(dir.load_schedule().unwrap(), Some(first.clone()));
                assert_eq!(
                    fs::read(dir.schedule_path()).unwrap(),
                    first_json,
                    "schedule.json is the good slot's"
                );
            }
        }
        let dir = StateDir::new(tmp.path());
        dir.load_schedule().unwrap();
        let third = saved(&dir, 3);
        let read = |n| {
            slots::read(&slots::slot_path(tmp.path(), n))
                .unwrap()
                .unwrap()
        };
        assert_eq!(
            read(1).seq,
            2,
            "the torn slot written, with the sequence after the good one"
        );
        assert_eq!(read(0).seq, 1, "the good one kept");
        assert_eq!(
            StateDir::new(tmp.path()).load_schedule().unwrap(),
            Some(third)
        );
        // Both slots broken: schedule.json, as in a storage dir without slots.
        for n in 0..2 {
            fs::write(slots::slot_path(tmp.path(), n), b"junk").unwrap();
        }
        let fallback = StateDir::new(tmp.path()).load_schedule().unwrap().unwrap();
        assert_eq!(fallback.data.tree()["n"], 3);
    }

    /// A slot newer than `schedule.json` (the crash came after the slot's flush, before
    /// `schedule.json` was written; or its write failed) is taken, and `schedule.json` brought
    /// up to it. A `schedule.json` newer than both slots and neither's (written by a version
    /// without slots after this one ran) is taken instead, and the next save goes after the
    /// newest slot. A storage dir without slots (older versions, 0.13) loads `schedule.json`.
    #[test]
    fn a_slot_newer_than_schedule_json_wins_and_a_foreign_newer_json_is_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        let old = saved(&dir, 1);
        let old_json = fs::read(dir.schedule_path()).unwrap();
        let new = saved(&dir, 2);
        fs::write(dir.schedule_path(), &old_json).unwrap();
        assert_eq!(
            StateDir::new(tmp.path()).load_schedule().unwrap(),
            Some(new.clone())
        );
        let json: Schedule =
            serde_json::from_slice(&fs::read(dir.schedule_path()).unwrap()).unwrap();
        assert_eq!(json, new, "schedule.json brought up to the slot");
        // Missing schedule.json: the same.
        fs::remove_file(dir.schedule_path()).unwrap();
        assert_eq!(
            StateDir::new(tmp.path()).load_schedule().unwrap(),
            Some(new.clone())
        );
        assert!(dir.schedule_path().exists());

        // An older version wrote a newer schedule.json after this one ran.
        let foreign = Schedule::new(serde_json::json!({"by": "0.13"}), 5000, "b".into());
        fs::write(dir.schedule_path(), serde_json::to_vec(&foreign).unwrap()).unwrap();
        let dir = StateDir::new(tmp.path());
        assert_eq!(dir.load_schedule().unwrap(), Some(foreign.clone()));
        saved(&dir, 3);
        let read = |n| {
            slots::read(&slots::slot_path(tmp.path(), n))
                .unwrap()
                .unwrap()
        };
        assert_eq!((read(0).seq, read(1).seq), (3, 2), "after the newest slot");
        // Neither slot's but older: a schedule.json left behind; the slot wins.
        fs::write(dir.schedule_path(), &old_json).unwrap();
        let _ = old;
        let newest = StateDir::new(tmp.path()).load_schedule().unwrap().unwrap();
        assert_eq!(newest.data.tree()["n"], 3);

        // No slots: schedule.json as it is; the first save makes slot 0 with sequence 1.
        let bare = tempfile::tempdir().unwrap();
        let dir = StateDir::new(bare.path());
        fs::create_dir_all(dir.schedule_path().parent().unwrap()).unwrap();
        fs::write(dir.schedule_path(), serde_json::to_vec(&foreign).unwrap()).unwrap();
        assert_eq!(dir.load_schedule().unwrap(), Some(foreign));
        saved(&dir, 1);
        assert_eq!(
            slots::read(&slots::slot_path(bare.path(), 0))
                .unwrap()
                .unwrap()
                .seq,
            1
        );
    }

    /// A retry after `schedule.json` could not be written does not write a slot again: the
    /// newest slot holds that schedule already.
    #[test]
    fn saving_the_schedule_the_newest_slot_holds_writes_only_schedule_json() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        let schedule = saved(&dir, 1);
        fs::remove_file(dir.schedule_path()).unwrap();
        dir.save_schedule(&schedule).unwrap();
        assert!(dir.schedule_path().exists());
        assert!(!slots::slot_path(tmp.path(), 1).exists(), "no second slot");
        saved(&dir, 2);
        assert_eq!(
            slots::read(&slots::slot_path(tmp.path(), 1))
                .unwrap()
                .unwrap()
                .seq,
            2
        );
    }

    #[test]
    fn the_schedule_is_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        dir.save_schedule(&Schedule::test().build()).unwrap();
        for path in [dir.schedule_path(), dir.root.join(SLOT_NAMES[0])] {
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
    }

    /// Many threads writing the same file at once each use their own temp file: every write
    /// succeeds and the file holds one of them whole (with a shared temp name, writers renamed
    /// each other's files away and failed or left a mix).
    #[test]
    fn concurrent_writers_of_one_file_do_not_collide() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f.json");
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for n in 0..50 {
                        let text = format!("{t}-{n}-").repeat(1000);
                        write_atomic(&path, text.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        let text = fs::read_to_string(&path).unwrap();
        let first = text.split_inclusive('-').take(2).collect::<String>();
        assert_eq!(text, first.repeat(1000), "one write, whole");
        let names: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["f.json"]);
    }

    #[test]
    fn start_removes_our_temp_files_only_and_tightens_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        dir.save_schedule(&Schedule::test().build()).unwrap();
        fs::set_permissions(dir.schedule_path(), fs::Permissions::from_mode(0o644)).unwrap();
        let schedule_dir = dir.schedule_path().parent().unwrap().to_path_buf();
        fs::create_dir_all(dir.backups_dir()).unwrap();
        let leftovers = [
            schedule_dir.join(".tmp.schedule.json.123"),
            schedule_dir.join(".tmp.schedule.json.123.7"),
            tmp.path().join(".tmp.actions.journal.9.0"),
            dir.backups_dir().join(".tmp.backup.55.2"),
            dir.backups_dir().join("backup.tmp"),
        ];
        let kept = [
            schedule_dir.join(".tmp.notes"),
            tmp.path().join("tmp.actions.1"),
            dir.backups_dir().join("hourly-20260101T00"),
        ];
        for path in leftovers.iter().chain(&kept) {
            fs::write(path, "x").unwrap();
        }
        assert_eq!(dir.clean_temp_files(), leftovers.len());
        for path in &leftovers {
            assert!(!path.exists(), "{} removed", path.display());
        }
        for path in &kept {
            assert!(path.exists(), "{} kept", path.display());
        }
        let slot = dir.root.join(SLOT_NAMES[0]);
        fs::set_permissions(&slot, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(dir.clean_temp_files(), 0);
        for path in [dir.schedule_path(), kept[2].clone(), slot] {
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        }
    }
}
