//! Walking a config dir: every file, symlinks followed, loops cut.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Every file under `dir`, as paths relative to it, sorted; hidden files and dirs are skipped.
/// Symlinks to files and dirs are followed, but never into a dir the walk is already inside, so a
/// symlink loop ends there (a second name for a dir elsewhere is walked under that name too).
/// Dirs that cannot be read are returned with their relative path and the error.
pub fn walk_files(dir: &Path) -> (Vec<String>, Vec<(String, std::io::Error)>) {
    fn visit(
        dir: &Path,
        prefix: &str,
        inside: &mut BTreeSet<PathBuf>,
        files: &mut Vec<String>,
        problems: &mut Vec<(String, std::io::Error)>,
    ) {
        let real = match dir.canonicalize() {
            Ok(real) => real,
            Err(e) => return problems.push((prefix.to_string(), e)),
        };
        if !inside.insert(real.clone()) {
            return; // a symlink back to a dir the walk is in
        }
        let entries = match fs::read_dir(dir).and_then(|e| e.collect::<Result<Vec<_>, _>>()) {
            Ok(entries) => entries,
            Err(e) => return problems.push((prefix.to_string(), e)),
        };
        let mut entries = entries;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let rel = if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}/{name}")
            };
            let path = entry.path();
            if path.is_dir() {
                visit(&path, &rel, inside, files, problems);
            } else if path.is_file() {
                files.push(rel);
            }
        }
        inside.remove(&real);
    }
    let (mut files, mut problems) = (Vec::new(), Vec::new());
    visit(dir, "", &mut BTreeSet::new(), &mut files, &mut problems);
    (files, problems)
}
