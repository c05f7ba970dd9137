//! A command checked and expanded into what will be done (a plan), and the YAML `mode` field.
//!
//! [`Plan::new`] is the single place where a command is checked: `validate` builds plans with
//! stand-in values and drops them, `run_commands` builds each plan just before running it.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use regex::Regex;
use serde::Deserializer;
use serde::de::{self, Visitor};

use super::expand::{Vars, show_argv};
use super::pattern::Pattern;
use super::{ApplyLog, At, Command, CommandError, Context};

/// Used when `!Copy` or `!SplitText` gives no `mode`: readable by all, as config files are.
pub(crate) const DEFAULT_MODE: u32 = 0o644;

/// The shell of `!Sh`; `/bin/sh` is where POSIX systems have it, whatever `PATH` says.
const SHELL: &str = "/bin/sh";

/// Used by `!RootCommand` when the daemon is not root: `-n` fails instead of asking for a
/// password nobody would type.
const SUDO: &str = "/usr/bin/sudo";

/// A command ready to run: placeholders replaced, regexes compiled, patterns parsed.
#[derive(Debug)]
pub(crate) enum Plan {
    Exec {
        argv: Vec<String>,
    },
    Copy {
        src: PathBuf,
        dest: PathBuf,
        mode: u32,
    },
    Split(super::split::SplitPlan),
    Clean {
        pattern: Pattern,
        keep_list: PathBuf,
    },
    Peek {
        path: String,
    },
}

impl Plan {
    /// Checks and expands `cmd`. A `!Condition` here is one nested in another: rejected.
    pub(crate) fn new(cmd: &Command, at: At, vars: &Vars<'_>) -> Result<Plan, CommandError> {
        let invalid = |message: String| CommandError::Invalid { at, message };
        Ok(match cmd {
            Command::Cmd(argv) => {
                let (program, args) = argv
                    .split_first()
                    .ok_or_else(|| invalid("needs a program to run".into()))?;
                check_program(program, at)?;
                let mut out = vec![program.clone()];
                for arg in args {
                    out.push(vars.expand(arg, at)?);
                }
                Plan::Exec { argv: out }
            }
            Command::RootCommand(argv) => {
                if argv.is_empty() {
                    return Err(invalid("needs a program to run".into()));
                }
                let argv = argv
                    .iter()
                    .map(|arg| vars.expand(arg, at))
                    .collect::<Result<Vec<_>, _>>()?;
                check_program(&argv[0], at)?;
                Plan::Exec {
                    argv: root_argv(argv, nix::unistd::geteuid().is_root()),
                }
            }
            Command::Sh(script) => Plan::Exec {
                argv: vec![
                    SHELL.into(),
                    "-exc".into(),
                    vars.expand_for_shell(script, at)?,
                ],
            },
            Command::Copy(copy) => {
                let src = PathBuf::from(vars.expand(&copy.src, at)?);
                let dest_text = vars.expand(&copy.dest, at)?;
                let dest = target_file(&dest_text).map_err(invalid)?;
                Plan::Copy {
                    src,
                    dest,
                    mode: copy.mode.unwrap_or(DEFAULT_MODE),
                }
            }
            Command::SplitText(split) => {
                Plan::Split(super::split::SplitPlan::new(split, at, vars)?)
            }
            Command::CleanFiles(clean) => {
                let text = vars.expand_for_pattern(&clean.pattern, at)?;
                let pattern =
                    Pattern::parse(&text).map_err(|e| invalid(format!("pattern {text:?}: {e}")))?;
                Plan::Clean {
                    pattern,
                    keep_list: PathBuf::from(vars.expand(&clean.keep_list, at)?),
                }
            }
            Command::PeekLog(path) => {
                let path = vars.expand(path, at)?;
                check_peek_path(&path).map_err(|e| invalid(format!("path {path:?}: {e}")))?;
                Plan::Peek { path }
            }
            Command::Condition(_) => {
                return Err(invalid(
                    "a !Condition cannot contain another !Condition".into(),
                ));
            }
        })
    }

    /// Runs the command; directories whose entries it replaced go into `dirty` (to be synced).
    pub(crate) async fn run(
        self,
        at: At,
        ctx: &Context<'_>,
        log: &mut dyn ApplyLog,
        dirty: &mut std::collections::BTreeSet<PathBuf>,
    ) -> Result<(), CommandError> {
        match self {
            Plan::Exec { argv } => {
                if ctx.dry_run {
                    log.line(&format!("would run: {}", show_argv(&argv)));
                    return Ok(());
                }
                super::exec::run(&argv, at, ctx.timeout, log).await
            }
            Plan::Copy { src, dest, mode } => {
                if ctx.dry_run {
                    log.line(&format!(
                        "would copy {} -> {} (mode {mode:04o})",
                        src.display(),
                        dest.display()
                    ));
                    return Ok(());
                }
                let dir = super::files::blocking(at, log, move |lines| {
                    super::files::copy(&src, &dest, mode, at, lines)
                })
                .await?;
                dirty.insert(dir);
                Ok(())
            }
            Plan::Split(plan) => {
                let dry_run = ctx.dry_run;
                let dirs =
                    super::files::blocking(at, log, move |lines| plan.run(at, dry_run, lines))
                        .await?;
                dirty.extend(dirs);
                Ok(())
            }
            Plan::Clean { pattern, keep_list } => {
                let dry_run = ctx.dry_run;
                super::files::blocking(at, log, move |lines| {
                    super::clean::run(&pattern, &keep_list, at, dry_run, lines)
                })
                .await
            }
            Plan::Peek { path } => {
                super::peek::run(&path, ctx, log);
                Ok(())
            }
        }
    }
}

/// Adds `sudo -n` in front unless we are root already.
pub(crate) fn root_argv(argv: Vec<String>, is_root: bool) -> Vec<String> {
    if is_root {
        return argv;
    }
    let mut out = Vec::with_capacity(argv.len() + 2);
    out.push(SUDO.into());
    out.push("-n".into());
    out.extend(argv);
    out
}

fn check_program(program: &str, at: At) -> Result<(), CommandError> {
    if program.is_empty() {
        return Err(CommandError::Invalid {
            at,
            message: "the program name is empty".into(),
        });
    }
    Ok(())
}

/// The file a `!Copy` writes: an absolute path naming a file, not a directory.
pub(crate) fn target_file(dest: &str) -> Result<PathBuf, String> {
    if !dest.starts_with('/') {
        return Err(format!("dest {dest:?} must be an absolute path"));
    }
    if dest.ends_with('/') || dest.ends_with("/.") || dest.ends_with("/..") {
        return Err(format!("dest {dest:?} must name a file, not a directory"));
    }
    let path = PathBuf::from(dest);
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("dest {dest:?} must not contain `..`"));
    }
    Ok(path)
}

/// `name/rel/path`: relative, plain components only, and something after the log dir's name.
fn check_peek_path(path: &str) -> Result<(), &'static str> {
    let mut count = 0;
    for component in Path::new(path).components() {
        match component {
            Component::Normal(_) => count += 1,
            Component::RootDir | Component::Prefix(_) => {
                return Err("must be relative (a log dir name, then a path inside it)");
            }
            Component::ParentDir | Component::CurDir => {
                return Err("must not contain `.` or `..`");
            }
        }
    }
    if count < 2 {
        return Err("needs a log dir name and a path inside it");
    }
    Ok(())
}

/// `regex` compiled, or an error naming the pattern.
pub(crate) fn compile(regex: &str, at: At) -> Result<Regex, CommandError> {
    Regex::new(regex).map_err(|source| CommandError::Regex {
        at,
        pattern: regex.to_owned(),
        source,
    })
}

/// `mode`: an integer (`0o644` or `420` in YAML), or a string of octal digits with a leading
/// zero (`0644`), which YAML 1.2 reads as a string but anyone who used `chmod` means as octal.
pub(crate) fn deserialize_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    struct ModeVisitor;

    impl Visitor<'_> for ModeVisitor {
        type Value = u32;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a file mode such as 0o644, 420 or \"0644\" (at most 0o777)")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u32, E> {
            // Setuid, setgid and sticky bits make no sense on a rendered file, and refusing them
            // catches the common slip `mode: 644` (decimal 644 is 0o1204).
            if v > 0o777 {
                return Err(E::custom(format!(
                    "mode {v} is 0o{v:o}, which is more than 0o777; \
                     if you meant octal, write 0{v} or 0o{v}"
                )));
            }
            Ok(v as u32)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u32, E> {
            match u64::try_from(v) {
                Ok(v) => self.visit_u64(v),
                Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
            }
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<u32, E> {
            let octal =
                v.len() > 1 && v.starts_with('0') && v.bytes().all(|b| (b'0'..=b'7').contains(&b));
            match u64::from_str_radix(v, 8) {
                Ok(n) if octal => self.visit_u64(n),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
    }

    d.deserialize_any(ModeVisitor).map(Some)
}
