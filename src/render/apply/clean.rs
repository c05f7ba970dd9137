//! `!CleanFiles`: removes the files matching a pattern whose captured part is not listed in a
//! keep-list file (typically rendered, one name per line).

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;

use super::files::io_error;
use super::pattern::Pattern;
use super::{At, CommandError};

pub(crate) fn run(
    pattern: &Pattern,
    keep_list: &Path,
    at: At,
    dry_run: bool,
    lines: &mut Vec<String>,
) -> Result<(), CommandError> {
    let text = match fs::read_to_string(keep_list) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(CommandError::MissingFile {
                at,
                what: "keep list",
                path: keep_list.to_owned(),
            });
        }
        Err(source) => return Err(io_error(at, keep_list, "read", source)),
    };
    // Surrounding blanks are dropped: a stray space must not get a file deleted.
    let keep: BTreeSet<&str> = text
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect();
    let found = pattern
        .matches()
        .map_err(|source| io_error(at, pattern.base(), "list", source))?;
    lines.push(format!(
        "cleaning {} ({} name(s) kept by {})",
        pattern.text(),
        keep.len(),
        keep_list.display()
    ));
    for (path, name) in found {
        if keep.contains(name.as_str()) {
            continue;
        }
        if dry_run {
            lines.push(format!("would remove {}", path.display()));
            continue;
        }
        match fs::remove_file(&path) {
            Ok(()) => lines.push(format!("removed {}", path.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(io_error(at, &path, "remove", source)),
        }
    }
    Ok(())
}
