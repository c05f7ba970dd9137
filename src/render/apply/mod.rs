//! The apply commands of a `*.render.yaml`: after a role's templates are rendered, they put the
//! files in place and make services pick them up.
//!
//! The files of this module:
//! - `command.rs`: a command checked and expanded into a plan, and the YAML `mode` field.
//! - `expand.rs`: `{{ role }}` and `{{ files.NAME }}` in arguments, and shell quoting.
//! - `exec.rs`: running a process with captured output, a timeout, and its process group.
//! - `files.rs`: `!Copy` and the atomic file write that `!SplitText` shares.
//! - `pattern.rs`: path patterns with one capture group, as `!SplitText` and `!CleanFiles` use.
//! - `split.rs`, `clean.rs`, `condition.rs`, `peek.rs`: one command each.
//!
//! Trust: the render.yaml and the template names are configuration; the role name is checked by
//! the caller. The rendered files come from the schedule, so their contents and the names taken
//! from them (`!SplitText`, `!CleanFiles`) are never executed and never lead a write or a delete
//! outside the directory of the command's pattern.

mod clean;
mod command;
mod condition;
mod exec;
mod expand;
mod files;
mod pattern;
mod peek;
mod split;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use serde::Deserialize;

use command::Plan;
use expand::Vars;

/// How long a command may take past its timeout before it is gone: the kill of its group.
pub(crate) use exec::TERM_GRACE as KILL_GRACE;

/// One apply command of a `*.render.yaml`, as written there with a YAML tag.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub enum Command {
    /// `!Cmd [prog, args...]`: runs `prog` directly, no shell; the arguments are expanded.
    Cmd(Vec<String>),
    /// `!Sh "script"`: `sh -exc <script>`; expanded values are shell-quoted.
    Sh(String),
    /// `!RootCommand [prog, args...]`: like `!Cmd` (the program is expanded too), through
    /// `sudo -n` when the daemon is not root.
    RootCommand(Vec<String>),
    /// `!Copy {src, dest, mode?}`: replaces `dest` by a copy of `src`, atomically.
    Copy(Copy),
    /// `!SplitText {section, validate, src, dest, mode?}`: one file per section of `src`.
    SplitText(SplitText),
    /// `!CleanFiles {pattern, keep-list}`: removes the matching files that are not listed.
    CleanFiles(CleanFiles),
    /// `!Condition {dirs-changed, commands}`: runs `commands` when a directory changed.
    Condition(Condition),
    /// `!PeekLog "name/rel/path"`: notes the size of an external log before the next commands.
    PeekLog(String),
}

/// `!Copy`: `src` (required) is copied to the file `dest`; `mode` defaults to `0o644`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Copy {
    pub(crate) src: String,
    pub(crate) dest: String,
    #[serde(default, deserialize_with = "command::deserialize_mode")]
    pub(crate) mode: Option<u32>,
}

/// `!SplitText`: a line of `src` matching the regex `section` starts a section named by its
/// first capture group (the header line itself is not written); the name must fully match
/// `validate`, be a plain file name not starting with `.`, and is put in place of the one `(*)`
/// of `dest` (an absolute path, `(*)` in the file name). Files matching `dest` that no section
/// produced are removed. Nothing is written unless every section is valid.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitText {
    pub(crate) section: String,
    pub(crate) validate: String,
    pub(crate) src: String,
    pub(crate) dest: String,
    #[serde(default, deserialize_with = "command::deserialize_mode")]
    pub(crate) mode: Option<u32>,
}

/// `!CleanFiles`: the files matching `pattern` (an absolute path with one capture group, e.g.
/// `/etc/app/(*).conf` or `/etc/app/(**/*.conf)`) whose captured part is not a line of the file
/// `keep-list` are removed. Directories, hidden names and anything behind a symlink are left.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CleanFiles {
    pub(crate) pattern: String,
    #[serde(rename = "keep-list", alias = "keep_list")]
    pub(crate) keep_list: String,
}

/// `!Condition`: `commands` run only when one of `dirs-changed` differs from how it was before
/// the first command of the list ran. Cannot contain another `!Condition`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    #[serde(rename = "dirs-changed", alias = "dirs_changed")]
    pub(crate) dirs_changed: Vec<PathBuf>,
    pub(crate) commands: Vec<Command>,
}

impl Command {
    /// The YAML tag, for messages.
    pub(crate) fn tag(&self) -> &'static str {
        match self {
            Command::Cmd(_) => "!Cmd",
            Command::Sh(_) => "!Sh",
            Command::RootCommand(_) => "!RootCommand",
            Command::Copy(_) => "!Copy",
            Command::SplitText(_) => "!SplitText",
            Command::CleanFiles(_) => "!CleanFiles",
            Command::Condition(_) => "!Condition",
            Command::PeekLog(_) => "!PeekLog",
        }
    }
}

/// What the commands of one role run with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context<'a> {
    /// The role, already checked to be safe as a file name by the caller.
    pub(crate) role: &'a str,
    /// Template name -> its rendered staging file (`{{ files.NAME }}`).
    pub(crate) files: &'a BTreeMap<String, PathBuf>,
    /// The sandbox's `log-dirs` (name -> directory), for `!PeekLog`.
    pub(crate) log_dirs: &'a BTreeMap<String, PathBuf>,
    /// Limit for each command; the daemon's default is 180 s, as in verwalter 0.13.
    pub(crate) timeout: Duration,
    /// Log what would happen; run nothing, write nothing, delete nothing.
    pub(crate) dry_run: bool,
}

/// Where command progress and output go (the role's deployment log; a test collects it).
pub(crate) trait ApplyLog: Send {
    /// One human-readable line, e.g. `running: ...`, `exited with status 0 after 12ms`.
    fn line(&mut self, text: &str);
    /// Raw stdout and stderr bytes of a command, as they come.
    fn output(&mut self, bytes: &[u8]);
    /// `!PeekLog`: the external log `path` (as written in the command) is `offset` bytes long.
    fn external_log(&mut self, path: &str, offset: u64);
}

/// Which command a message is about: `command 2 (!Copy)`, or `command 3.1 (!Cmd)` for the first
/// command inside the third, a `!Condition`. Counted from 1, as in the render.yaml.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    /// Position in the top-level list, from 1.
    pub(crate) index: usize,
    /// Position inside a `!Condition`, from 1.
    pub(crate) nested: Option<usize>,
    pub(crate) tag: &'static str,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.nested {
            None => write!(f, "command {} ({})", self.index, self.tag),
            Some(n) => write!(f, "command {}.{} ({})", self.index, n, self.tag),
        }
    }
}

/// A failed apply command. Each variant names the command (see [`At`]).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A `{{ name }}` other than `role` and `files.<template>`.
    #[error("{at}: unknown variable {{{{ {name} }}}} (known: role, files.<template name>)")]
    UnknownVariable { at: At, name: String },
    /// The command is written wrongly (found before anything runs).
    #[error("{at}: {message}")]
    Invalid { at: At, message: String },
    #[error("{at}: bad regex {pattern:?}: {source}")]
    Regex {
        at: At,
        pattern: String,
        #[source]
        source: regex::Error,
    },
    /// A file or directory the command needs does not exist.
    #[error("{at}: {what} {path} does not exist")]
    MissingFile {
        at: At,
        what: &'static str,
        path: PathBuf,
    },
    /// The rendered input of the command is unusable (e.g. a `!SplitText` section name).
    #[error("{at}: {path}: {message}")]
    BadInput {
        at: At,
        path: PathBuf,
        message: String,
    },
    #[error("{at}: cannot start {program}: {source}")]
    Spawn {
        at: At,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{at}: {program} {}{}", exec::describe(*status), exec::show_tail(tail))]
    Failed {
        at: At,
        program: String,
        status: ExitStatus,
        /// The last line the command wrote (stderr if it wrote any, else stdout), for the
        /// error shown in the status API; the whole output is in the role log.
        tail: String,
    },
    #[error("{at}: {program} killed after timeout of {timeout:?}")]
    Timeout {
        at: At,
        program: String,
        timeout: Duration,
    },
    #[error("{at}: {path}: cannot {action}: {source}")]
    Io {
        at: At,
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl CommandError {
    /// The command the error is about.
    #[cfg(test)]
    pub(crate) fn at(&self) -> At {
        match self {
            CommandError::UnknownVariable { at, .. }
            | CommandError::Invalid { at, .. }
            | CommandError::Regex { at, .. }
            | CommandError::MissingFile { at, .. }
            | CommandError::BadInput { at, .. }
            | CommandError::Spawn { at, .. }
            | CommandError::Failed { at, .. }
            | CommandError::Timeout { at, .. }
            | CommandError::Io { at, .. } => *at,
        }
    }

    /// A bounded label for metrics.
    #[cfg(test)]
    pub(crate) fn label(&self) -> &'static str {
        match self {
            CommandError::UnknownVariable { .. } | CommandError::Invalid { .. } => "invalid",
            CommandError::Regex { .. } => "invalid",
            CommandError::MissingFile { .. } => "missing_file",
            CommandError::BadInput { .. } => "bad_input",
            CommandError::Spawn { .. } => "spawn",
            CommandError::Failed { .. } => "failed",
            CommandError::Timeout { .. } => "timeout",
            CommandError::Io { .. } => "io",
        }
    }
}

/// Checks a command list without running it: the substitution names are known (`{{ role }}`,
/// `{{ files.NAME }}` with NAME in `template_names`), the regexes compile, patterns are well
/// formed, no `!Condition` is nested, `!PeekLog` paths are relative, programs are not empty.
/// Used when the template dir is loaded, so that a bad render.yaml fails before anything runs.
pub fn validate(
    commands: &[Command],
    template_names: &BTreeSet<String>,
) -> Result<(), CommandError> {
    // Stand-in values: validation checks the shape of the expanded text, not real paths.
    let files: BTreeMap<String, PathBuf> = template_names
        .iter()
        .map(|name| (name.clone(), PathBuf::from(format!("/validate/{name}"))))
        .collect();
    let vars = Vars {
        role: "role",
        files: &files,
    };
    for (i, cmd) in commands.iter().enumerate() {
        let at = at(i, None, cmd);
        match cmd {
            Command::Condition(cond) => {
                for (j, inner) in cond.commands.iter().enumerate() {
                    Plan::new(inner, at_nested(at, j, inner), &vars)?;
                }
            }
            _ => {
                Plan::new(cmd, at, &vars)?;
            }
        }
    }
    Ok(())
}

/// Runs the commands in order; the first failure stops the rest and is returned.
///
/// The whole list is validated first (with the template names of `ctx.files`), and the
/// directories of every `!Condition` are signed before the first command runs; a `!Condition`
/// runs its commands only if one of its directories changed, appeared or disappeared since.
pub(crate) async fn run_commands(
    commands: &[Command],
    ctx: &Context<'_>,
    log: &mut (dyn ApplyLog + Send),
) -> Result<(), CommandError> {
    let names: BTreeSet<String> = ctx.files.keys().cloned().collect();
    validate(commands, &names)?;
    let vars = Vars {
        role: ctx.role,
        files: ctx.files,
    };
    let before = if ctx.dry_run {
        condition::Signatures::default()
    } else {
        condition::Signatures::take(commands).await
    };
    // Directories whose entries `!Copy` and `!SplitText` replaced: synced once each at the end
    // (also after a failure), before the caller records the role as applied.
    let mut dirty = BTreeSet::new();
    let result = run_list(commands, ctx, log, &vars, &before, &mut dirty).await;
    if dirty.is_empty() {
        return result;
    }
    let last = commands.len().saturating_sub(1);
    let at_end = at(last, None, &commands[last]);
    let synced = files::blocking(at_end, log, move |_| files::sync_dirs(&dirty, at_end)).await;
    result.and(synced)
}

async fn run_list(
    commands: &[Command],
    ctx: &Context<'_>,
    log: &mut (dyn ApplyLog + Send),
    vars: &Vars<'_>,
    before: &condition::Signatures,
    dirty: &mut BTreeSet<PathBuf>,
) -> Result<(), CommandError> {
    for (i, cmd) in commands.iter().enumerate() {
        let at = at(i, None, cmd);
        let Command::Condition(cond) = cmd else {
            Plan::new(cmd, at, vars)?.run(at, ctx, log, dirty).await?;
            continue;
        };
        if ctx.dry_run {
            log.line(&format!(
                "{at}: would run the next {} command(s) if one of {} changed",
                cond.commands.len(),
                condition::show_dirs(&cond.dirs_changed)
            ));
        } else {
            match before.changed(&cond.dirs_changed).await {
                Some(dir) => log.line(&format!(
                    "{at}: {} changed, running {} command(s)",
                    dir.display(),
                    cond.commands.len()
                )),
                None => {
                    log.line(&format!(
                        "{at}: no change in {}, skipping its commands",
                        condition::show_dirs(&cond.dirs_changed)
                    ));
                    continue;
                }
            }
        }
        for (j, inner) in cond.commands.iter().enumerate() {
            let at = at_nested(at, j, inner);
            Plan::new(inner, at, vars)?.run(at, ctx, log, dirty).await?;
        }
    }
    Ok(())
}

fn at(i: usize, nested: Option<usize>, cmd: &Command) -> At {
    At {
        index: i + 1,
        nested: nested.map(|j| j + 1),
        tag: cmd.tag(),
    }
}

fn at_nested(outer: At, j: usize, cmd: &Command) -> At {
    At {
        index: outer.index,
        nested: Some(j + 1),
        tag: cmd.tag(),
    }
}
