//! `!SplitText`: one rendered file split into a file per section, the stale ones removed.
//!
//! The section names come from rendered content, so from the schedule: each must be a plain
//! file name and fully match `validate`, and all are checked before the first file is written.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Write};
use std::path::PathBuf;

use regex::Regex;

use super::command::{DEFAULT_MODE, compile};
use super::expand::Vars;
use super::files::{io_error, write_atomic};
use super::pattern::Pattern;
use super::{At, CommandError, SplitText};

#[derive(Debug)]
pub(crate) struct SplitPlan {
    section: Regex,
    validate: Regex,
    validate_text: String,
    src: PathBuf,
    dest: Pattern,
    mode: u32,
}

/// One section: its name and the lines after its header.
struct Section<'a> {
    name: &'a str,
    text: String,
}

impl SplitPlan {
    pub(crate) fn new(
        split: &SplitText,
        at: At,
        vars: &Vars<'_>,
    ) -> Result<SplitPlan, CommandError> {
        let section = compile(&split.section, at)?;
        if section.captures_len() < 2 {
            return Err(CommandError::Invalid {
                at,
                message: format!(
                    "section regex {:?} needs a capture group for the name",
                    split.section
                ),
            });
        }
        compile(&split.validate, at)?;
        let validate = compile(&format!("^(?:{})$", split.validate), at)?;
        let src = PathBuf::from(vars.expand(&split.src, at)?);
        let dest_text = vars.expand_for_pattern(&split.dest, at)?;
        let dest = Pattern::parse(&dest_text)
            .ok()
            .filter(Pattern::has_slot)
            .ok_or_else(|| CommandError::Invalid {
                at,
                message: format!(
                    "dest {dest_text:?} must be an absolute path with exactly one `(*)`, in the \
                     file name, and no other wildcards"
                ),
            })?;
        Ok(SplitPlan {
            section,
            validate,
            validate_text: split.validate.clone(),
            src,
            dest,
            mode: split.mode.unwrap_or(DEFAULT_MODE),
        })
    }

    /// Returns the directories whose entries changed, for the caller to sync.
    pub(crate) fn run(
        self,
        at: At,
        dry_run: bool,
        lines: &mut Vec<String>,
    ) -> Result<BTreeSet<PathBuf>, CommandError> {
        let mut dirty = BTreeSet::new();
        let text = match fs::read_to_string(&self.src) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound && dry_run => {
                lines.push(format!(
                    "would split {} (missing now) into {}",
                    self.src.display(),
                    self.dest.text()
                ));
                return Ok(dirty);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CommandError::MissingFile {
                    at,
                    what: "source file",
                    path: self.src,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(self.bad_input(at, "is not UTF-8 text".into()));
            }
            Err(source) => return Err(io_error(at, &self.src, "read", source)),
        };
        let sections = self.sections(&text, at)?;
        let mut targets = Vec::with_capacity(sections.len());
        for section in &sections {
            let path = self.dest.fill(section.name).expect("dest has a slot");
            targets.push((path, section));
        }
        let produced: BTreeSet<&str> = sections.iter().map(|s| s.name).collect();
        let stale: Vec<PathBuf> = self
            .dest
            .matches()
            .map_err(|source| io_error(at, self.dest.base(), "list", source))?
            .into_iter()
            .filter(|(_, name)| !produced.contains(name.as_str()))
            .map(|(path, _)| path)
            .collect();
        lines.push(format!(
            "splitting {} into {} section(s) as {}",
            self.src.display(),
            sections.len(),
            self.dest.text()
        ));
        for (path, section) in &targets {
            if dry_run {
                lines.push(format!(
                    "would write {} ({} bytes, mode {:04o})",
                    path.display(),
                    section.text.len(),
                    self.mode
                ));
            } else {
                dirty.insert(write_atomic(path, self.mode, at, |file| {
                    file.write_all(section.text.as_bytes())
                })?);
                lines.push(format!("wrote {}", path.display()));
            }
        }
        for path in &stale {
            if dry_run {
                lines.push(format!("would remove {}", path.display()));
                continue;
            }
            match fs::remove_file(path) {
                Ok(()) => lines.push(format!("removed {}", path.display())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(io_error(at, path, "remove", source)),
            }
        }
        Ok(dirty)
    }

    /// All sections of `text`, every name checked; nothing is written yet.
    fn sections<'t>(&self, text: &'t str, at: At) -> Result<Vec<Section<'t>>, CommandError> {
        let mut sections: Vec<Section<'t>> = Vec::new();
        let mut first_line: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, line) in text.split_inclusive('\n').enumerate() {
            let number = i + 1;
            let body = line.strip_suffix('\n').unwrap_or(line);
            let body = body.strip_suffix('\r').unwrap_or(body);
            if let Some(caps) = self.section.captures(body) {
                let name = caps.get(1).map_or("", |m| m.as_str());
                if let Err(why) = check_name(name) {
                    return Err(
                        self.bad_input(at, format!("line {number}: section name {name:?} {why}"))
                    );
                }
                if !self.validate.is_match(name) {
                    return Err(self.bad_input(
                        at,
                        format!(
                            "line {number}: section name {name:?} does not match validate {:?}",
                            self.validate_text
                        ),
                    ));
                }
                if let Some(first) = first_line.insert(name, number) {
                    return Err(self.bad_input(
                        at,
                        format!("line {number}: section {name:?} again (first on line {first})"),
                    ));
                }
                sections.push(Section {
                    name,
                    text: String::new(),
                });
            } else if let Some(current) = sections.last_mut() {
                current.text.push_str(line);
            } else if !body.trim().is_empty() {
                return Err(
                    self.bad_input(at, format!("line {number}: text before the first section"))
                );
            }
        }
        Ok(sections)
    }

    fn bad_input(&self, at: At, message: String) -> CommandError {
        CommandError::BadInput {
            at,
            path: self.src.clone(),
            message,
        }
    }
}

/// Whether `name` can be a file name of its own: it is put into a path, so it must not be empty,
/// `.`/`..`, hidden, or hold `/`, NUL or control characters.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.starts_with('.') {
        return Err("starts with `.`");
    }
    if name.contains('/') {
        return Err("contains `/`");
    }
    if name.chars().any(char::is_control) {
        return Err("contains a control character");
    }
    Ok(())
}
