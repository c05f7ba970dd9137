//! The deployment log under `--log-dir`, in verwalter 0.13's layout:
//!
//! ```text
//! .index/index.YYYYMMDD.json   one JSON line per event, a file per UTC day; `latest` links the newest
//! .global/log.<seg>.txt        deployment-level text; `latest`
//! .changes/log.<seg>.txt       `<time>: <hash8>: <change>` lines; `latest`
//! <role>/log.<seg>.txt         per role: variables (secrets masked), files written, command output
//! ```
//!
//! An index line is `[time, deployment_id, pointer, marker]` where the pointer says which file and
//! offset the event's text starts at (`{"variant":"Role","fields":[role, seg, offset]}`) and the
//! marker is `"DeploymentStart"`, `"RoleStart"`, `{"variant":"ActionStart","fields":[name]}`, ...
//! A segment `<seg>` is named by its UTC creation time (`20261122045549`); a new one starts when
//! the current one reaches the size limit. [`LogDir::retain`] deletes segments and index files
//! past the age and total size limits.
//!
//! A log dir verwalter 0.13 wrote goes on as it is: the same names, `latest` links and index
//! text (`variant` before `fields`), so today's index file and each `latest` segment continue.
//!
//! Writing the log never fails a deployment: a stream that cannot be written (read-only or full
//! file system, a file where a dir should be) is logged once, counted, and reported by
//! [`LogDir::problem`] until a write to it succeeds again.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use serde_json::{Value, json};
use verwalter_controllers::machinery::ports::DeploymentLog;
use verwalter_controllers::storage::retention::{self, LogFile};

mod role;
#[cfg(test)]
mod tests;

pub(crate) use role::RoleLog;

/// Limits of the deployment log (rotation and retention are decided in
/// [`verwalter_controllers::storage::retention`]).
pub use verwalter_controllers::storage::retention::LogLimits;

/// The deployment log directory. Cheap to share; every write is one `write(2)` of whole lines
/// under a lock, so readers never see half a line.
#[derive(Debug)]
pub struct LogDir {
    dir: PathBuf,
    limits: LogLimits,
    files: Mutex<Files>,
    /// Streams (`.index`, `.global`, `.changes` or a role) whose last write failed, with why.
    failing: Mutex<BTreeMap<String, String>>,
    /// Whether `failing` has entries: lets a successful write skip its lock.
    any_failing: AtomicBool,
    /// `verwalter_deployment_log_write_errors_total`, once the daemon hands it over.
    write_errors: OnceLock<prometheus::IntCounter>,
}

#[derive(Debug, Default)]
struct Files {
    index: Option<(String, File)>,
    global: Option<Segment>,
    changes: Option<Segment>,
}

/// An open segment file of one stream (global, changes or a role).
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) name: String,
    pub(crate) file: File,
    pub(crate) len: u64,
}

/// Where an event's text starts.
#[derive(Debug, Clone)]
pub(crate) enum Pointer {
    Global(String, u64),
    Changes(String, u64),
    Role(String, String, u64),
    External(String, u64),
}

impl Pointer {
    /// `{"variant":"Role","fields":[role,seg,offset]}`, keys in 0.13's order.
    fn encode(&self) -> String {
        match self {
            Pointer::Global(seg, off) => variant("Global", json!([seg, off])),
            Pointer::Changes(seg, off) => variant("Changes", json!([seg, off])),
            Pointer::Role(role, seg, off) => variant("Role", json!([role, seg, off])),
            Pointer::External(path, off) => variant("External", json!([path, off])),
        }
    }
}

/// A Rust enum value as rustc-serialize wrote it for verwalter 0.13, `variant` before `fields`
/// (serde_json would sort the keys): lines appended to an index 0.13 started read the same as
/// its own, for tools that match the text.
fn variant(name: &str, fields: Value) -> String {
    format!("{{\"variant\":{},\"fields\":{fields}}}", Value::from(name))
}

/// What happened at a pointer.
#[derive(Debug, Clone)]
pub(crate) enum Marker {
    DeploymentStart,
    DeploymentChanges,
    RoleStart,
    ActionStart(String),
    ActionFinish(String),
    ExternalLog,
    RoleFinish,
    DeploymentFinish,
}

impl Marker {
    /// `"RoleStart"`, or `{"variant":"ActionStart","fields":[name]}` for the markers with a name.
    fn encode(&self) -> String {
        match self {
            Marker::ActionStart(name) | Marker::ActionFinish(name) => {
                variant(self.label(), json!([name]))
            }
            other => Value::from(other.label()).to_string(),
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Marker::DeploymentStart => "DeploymentStart",
            Marker::DeploymentChanges => "DeploymentChanges",
            Marker::RoleStart => "RoleStart",
            Marker::ActionStart(_) => "ActionStart",
            Marker::ActionFinish(_) => "ActionFinish",
            Marker::ExternalLog => "ExternalLog",
            Marker::RoleFinish => "RoleFinish",
            Marker::DeploymentFinish => "DeploymentFinish",
        }
    }
}

/// How much of the index file's end [`LogDir::recent_index`] reads.
pub(crate) const RECENT_INDEX_BYTES: u64 = 256 << 10;

/// One line of the index, read back: `[time, deployment_id, pointer, marker]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub(crate) time: String,
    pub(crate) deployment_id: String,
    /// The marker's name (`RoleStart`, `ActionStart`, ...).
    pub(crate) marker: String,
    /// The name an `ActionStart`/`ActionFinish` marker carries.
    pub(crate) action: Option<String>,
    /// The role of a `Role` pointer.
    pub(crate) role: Option<String>,
}

impl IndexEntry {
    fn parse(line: &[u8]) -> Option<IndexEntry> {
        let line: (String, String, Value, Value) = serde_json::from_slice(line).ok()?;
        let (time, deployment_id, pointer, marker) = line;
        let (marker, action) = match marker {
            Value::String(name) => (name, None),
            Value::Object(variant) => (
                variant.get("variant")?.as_str()?.to_string(),
                variant
                    .get("fields")
                    .and_then(|f| f.get(0))
                    .and_then(Value::as_str)
                    .map(str::to_string),
            ),
            _ => return None,
        };
        let role = (pointer.get("variant").and_then(Value::as_str) == Some("Role"))
            .then(|| pointer.get("fields")?.get(0)?.as_str().map(str::to_string))
            .flatten();
        Some(IndexEntry {
            time,
            deployment_id,
            marker,
            action,
            role,
        })
    }
}

impl LogDir {
    /// Creates the directory if needed. One that cannot be created is reported
    /// ([`LogDir::problem`]), not an error: the daemon runs without its log.
    pub fn open(dir: &Path, limits: LogLimits) -> Arc<LogDir> {
        let log = Arc::new(LogDir {
            dir: dir.to_path_buf(),
            limits,
            files: Mutex::new(Files::default()),
            failing: Mutex::new(BTreeMap::new()),
            any_failing: AtomicBool::new(false),
            write_errors: OnceLock::new(),
        });
        for sub in [".index", ".global", ".changes"] {
            let path = dir.join(sub);
            if let Err(e) = fs::create_dir_all(&path) {
                log.write_failed(sub, format_args!("{}: {e}", path.display()));
            }
        }
        log
    }

    /// Counts every failed write in `counter` from now on.
    pub(crate) fn count_write_errors(&self, counter: prometheus::IntCounter) {
        let _ = self.write_errors.set(counter);
    }

    /// What cannot be written now, one entry per stream, or `None` when the last write of every
    /// stream succeeded.
    pub(crate) fn problem(&self) -> Option<String> {
        /// Streams named in full; more would make an unreadable status line.
        const SHOWN: usize = 3;
        if !self.any_failing.load(Ordering::Acquire) {
            return None;
        }
        let failing = self.failing.lock().unwrap();
        if failing.is_empty() {
            return None;
        }
        let mut text = format!(
            "cannot write the deployment log in {} (deployments go on without it): ",
            self.dir.display()
        );
        let shown: Vec<&str> = failing.values().take(SHOWN).map(String::as_str).collect();
        text.push_str(&shown.join("; "));
        if failing.len() > SHOWN {
            text.push_str(&format!("; and {} more", failing.len() - SHOWN));
        }
        Some(text)
    }

    /// Records a failed write to `stream`; logs it when the stream was fine before.
    fn write_failed(&self, stream: &str, error: fmt::Arguments<'_>) {
        if let Some(counter) = self.write_errors.get() {
            counter.inc();
        }
        let message = error.to_string();
        let mut failing = self.failing.lock().unwrap();
        let new = failing
            .insert(stream.to_string(), message.clone())
            .is_none();
        self.any_failing.store(true, Ordering::Release);
        if new {
            tracing::error!(
                dir = %self.dir.display(),
                stream,
                error = %message,
                "Cannot write the deployment log; deployments go on without it. Not logged again until it works."
            );
        }
    }

    /// Records a successful write to `stream`, which ends a failure reported for it.
    fn write_ok(&self, stream: &str) {
        if !self.any_failing.load(Ordering::Acquire) {
            return;
        }
        let mut failing = self.failing.lock().unwrap();
        if failing.remove(stream).is_some() {
            tracing::info!(dir = %self.dir.display(), stream, "The deployment log can be written again.");
        }
        self.any_failing
            .store(!failing.is_empty(), Ordering::Release);
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// The newest `limit` lines of the current index file (`.index/latest`), newest first, from
    /// its last [`RECENT_INDEX_BYTES`] at most; lines that do not parse are skipped. No index yet
    /// is no entry.
    pub(crate) fn recent_index(&self, limit: usize) -> io::Result<Vec<IndexEntry>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = match File::open(self.dir.join(".index").join("latest")) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let length = file.metadata()?.len();
        let start = length.saturating_sub(RECENT_INDEX_BYTES);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        file.take(RECENT_INDEX_BYTES).read_to_end(&mut bytes)?;
        let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
        if start > 0 && !lines.is_empty() {
            // Begins inside a line.
            lines.remove(0);
        }
        Ok(lines
            .into_iter()
            .rev()
            .filter_map(IndexEntry::parse)
            .take(limit)
            .collect())
    }

    /// Appends one index line.
    pub(crate) fn index(&self, deployment_id: &str, pointer: &Pointer, marker: &Marker) {
        let now = SystemTime::now();
        let text = format!(
            "[{},{},{},{}]\n",
            Value::from(rfc3339(now)),
            Value::from(deployment_id),
            pointer.encode(),
            marker.encode()
        );
        let day = format_utc(now, DAY);
        let mut files = self.files.lock().unwrap();
        let result = (|| -> io::Result<()> {
            if files.index.as_ref().is_none_or(|(d, _)| *d != day) {
                let name = format!("index.{day}.json");
                let file = append(&self.dir.join(".index").join(&name))?;
                relink(&self.dir.join(".index"), &name)?;
                files.index = Some((day, file));
            }
            let (_, file) = files.index.as_mut().unwrap();
            file.write_all(text.as_bytes())
        })();
        if result.is_err() {
            files.index = None;
        }
        drop(files);
        match result {
            Ok(()) => self.write_ok(".index"),
            Err(e) => self.write_failed(
                ".index",
                format_args!("{}: {e}", self.dir.join(".index").display()),
            ),
        }
    }

    /// Appends `text` to the global log with a marker line, and indexes it.
    pub(crate) fn global(&self, deployment_id: &str, marker: Marker, text: &str) {
        let header = marker_line(deployment_id, None, &marker);
        let pointer = {
            let mut files = self.files.lock().unwrap();
            let dir = self.dir.join(".global");
            let bytes = format!("{header}{text}");
            write_segment(&mut files.global, &dir, &self.limits, bytes.as_bytes())
                .map(|(seg, off)| Pointer::Global(seg, off))
        };
        match pointer {
            Ok(p) => {
                self.write_ok(".global");
                self.index(deployment_id, &p, &marker);
            }
            Err(e) => self.write_failed(
                ".global",
                format_args!("{}: {e}", self.dir.join(".global").display()),
            ),
        }
    }

    /// Appends an audit line (an operator action received) to the global log.
    pub(crate) fn audit(&self, text: &str) {
        let line = format!("{} audit: {text}\n", rfc3339(SystemTime::now()));
        let mut files = self.files.lock().unwrap();
        let dir = self.dir.join(".global");
        let result = write_segment(&mut files.global, &dir, &self.limits, line.as_bytes());
        drop(files);
        match result {
            Ok(_) => self.write_ok(".global"),
            Err(e) => self.write_failed(
                ".global",
                format_args!("{}: {e}", self.dir.join(".global").display()),
            ),
        }
    }

    /// Appends change lines (`<time>: <hash8>: <change>`) and indexes them.
    pub(crate) fn changes(&self, deployment_id: &str, schedule_hash: &str, changes: &[String]) {
        if changes.is_empty() {
            return;
        }
        let now = rfc3339(SystemTime::now());
        let short = &schedule_hash[..schedule_hash.len().min(8)];
        let text: String = changes
            .iter()
            .map(|c| format!("{now}: {short}: {c}\n"))
            .collect();
        let pointer = {
            let mut files = self.files.lock().unwrap();
            let dir = self.dir.join(".changes");
            write_segment(&mut files.changes, &dir, &self.limits, text.as_bytes())
                .map(|(seg, off)| Pointer::Changes(seg, off))
        };
        match pointer {
            Ok(p) => {
                self.write_ok(".changes");
                self.index(deployment_id, &p, &Marker::DeploymentChanges);
            }
            Err(e) => self.write_failed(
                ".changes",
                format_args!("{}: {e}", self.dir.join(".changes").display()),
            ),
        }
    }

    /// The log of one role's attempt in deployment `deployment_id` (starts with `RoleStart`).
    /// When the role's log cannot be opened, its entries are dropped and the failure reported.
    pub(crate) fn role(self: &Arc<Self>, role: &str, deployment_id: &str) -> RoleLog {
        RoleLog::start(self.clone(), role, deployment_id)
    }

    /// Deletes segments and index files older than the age limit, then the oldest ones while
    /// the total is over the size limit. The `latest` file of each stream is spared the size
    /// limit, not the age limit: a role gone from the node for longer than the age limit loses
    /// its whole log dir. Returns the number of files deleted.
    pub(crate) fn retain(&self) -> io::Result<usize> {
        let mut all = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            let stream = entry.path();
            let current = fs::read_link(stream.join("latest")).ok();
            for file in fs::read_dir(&stream)? {
                let file = file?;
                let name = file.file_name();
                let name = name.to_string_lossy();
                if !retention::is_log_file(&name) {
                    continue;
                }
                let meta = file.metadata()?;
                all.push(LogFile {
                    modified: meta.modified()?,
                    len: meta.len(),
                    path: file.path(),
                    latest: current.as_deref() == Some(Path::new(&*name)),
                });
            }
        }
        let doomed = retention::logs_to_delete(all, &self.limits, SystemTime::now());
        let deleted = doomed.len();
        for LogFile { path, latest, .. } in doomed {
            fs::remove_file(&path)?;
            if latest && let Some(stream) = path.parent() {
                let _ = fs::remove_file(stream.join("latest"));
                let is_role = stream
                    .file_name()
                    .is_some_and(|n| !n.to_string_lossy().starts_with('.'));
                if is_role {
                    // Only removes the dir when nothing else is in it.
                    let _ = fs::remove_dir(stream);
                }
            }
        }
        // Streams open here continue in a new segment.
        *self.files.lock().unwrap() = Files::default();
        Ok(deleted)
    }
}

impl DeploymentLog for LogDir {
    fn deployment_start(
        &self,
        id: &str,
        schedule_hash: &str,
        roles: &[String],
        changes: &[String],
    ) {
        self.global(
            id,
            Marker::DeploymentStart,
            &format!(
                "schedule-hash: {schedule_hash}\nroles: {}\n",
                roles.join(", ")
            ),
        );
        self.changes(id, schedule_hash, changes);
    }

    fn deployment_finish(&self, id: &str, failed: &[String], blocked: &[(String, String)]) {
        let mut text = if failed.is_empty() && blocked.is_empty() {
            "all roles applied\n".to_string()
        } else if failed.is_empty() {
            String::new()
        } else {
            format!("failed roles: {}\n", failed.join(", "))
        };
        for (role, why) in blocked {
            text.push_str(&format!("blocked role {role}: {why}\n"));
        }
        self.global(id, Marker::DeploymentFinish, &text);
    }

    fn problem(&self) -> Option<String> {
        LogDir::problem(self)
    }
}

/// `<time> <id> ------------ [<role>: ]<Marker> -----------` and a newline.
fn marker_line(deployment_id: &str, role: Option<&str>, marker: &Marker) -> String {
    let what = match marker {
        Marker::ActionStart(n) | Marker::ActionFinish(n) => format!("{} {n}", marker.label()),
        other => other.label().to_string(),
    };
    let role = role.map(|r| format!("{r}: ")).unwrap_or_default();
    format!(
        "{} {deployment_id} ------------ {role}{what} -----------\n",
        rfc3339(SystemTime::now())
    )
}

/// Writes to the stream's current segment (opening or rotating as needed); returns the segment
/// name and the offset the text starts at.
pub(crate) fn write_segment(
    current: &mut Option<Segment>,
    dir: &Path,
    limits: &LogLimits,
    bytes: &[u8],
) -> io::Result<(String, u64)> {
    if current.as_ref().is_none_or(|s| limits.segment_full(s.len)) {
        *current = Some(open_segment(dir, limits)?);
    }
    let seg = current.as_mut().unwrap();
    let offset = seg.len;
    if let Err(e) = seg.file.write_all(bytes) {
        *current = None;
        return Err(e);
    }
    seg.len += bytes.len() as u64;
    Ok((seg.name.clone(), offset))
}

/// Opens the stream's `latest` segment if it is not full, else starts a new one.
pub(crate) fn open_segment(dir: &Path, limits: &LogLimits) -> io::Result<Segment> {
    fs::create_dir_all(dir)?;
    if let Ok(target) = fs::read_link(dir.join("latest"))
        && let Some(name) = target
            .to_str()
            .and_then(|t| t.strip_prefix("log."))
            .and_then(|t| t.strip_suffix(".txt"))
    {
        let path = dir.join(&target);
        if let Ok(meta) = fs::metadata(&path)
            && !limits.segment_full(meta.len())
        {
            return Ok(Segment {
                name: name.to_string(),
                file: append(&path)?,
                len: meta.len(),
            });
        }
    }
    let mut name = format_utc(SystemTime::now(), SECOND);
    // Two rotations within a second get distinct names.
    let mut n = 1;
    while dir.join(format!("log.{name}.txt")).exists() {
        n += 1;
        name = format!("{}-{n}", format_utc(SystemTime::now(), SECOND));
    }
    let file_name = format!("log.{name}.txt");
    let file = append(&dir.join(&file_name))?;
    relink(dir, &file_name)?;
    Ok(Segment { name, file, len: 0 })
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Points `dir/latest` at `target` atomically (a new link renamed over the old one).
fn relink(dir: &Path, target: &str) -> io::Result<()> {
    let tmp = dir.join(".latest.tmp");
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    fs::rename(&tmp, dir.join("latest"))
}

const DAY: &[time::format_description::FormatItem<'static>] =
    time::macros::format_description!("[year][month][day]");
const SECOND: &[time::format_description::FormatItem<'static>] =
    time::macros::format_description!("[year][month][day][hour][minute][second]");

fn format_utc(t: SystemTime, format: &[time::format_description::FormatItem<'static>]) -> String {
    time::OffsetDateTime::from(t)
        .format(format)
        .unwrap_or_default()
}

/// `2026-11-22T04:55:49Z` (see [`verwalter_controllers::machinery::clock::rfc3339`]).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    verwalter_controllers::machinery::clock::rfc3339(ms)
}
