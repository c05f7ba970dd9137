//! Path patterns with one capture group, such as `/etc/nginx/sites/(*).conf` or
//! `/etc/app/(**/*.conf)`, and the files that match them.
//!
//! `*` and `?` match within one path component, `**` (a whole component) matches any number
//! of directories. The leading components without wildcards are the pattern's base directory;
//! matching looks only below it, never follows a symlink, and never matches a directory or a
//! name starting with `.` (hidden files, our `.tmp.*` files).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use regex::Regex;

#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    text: String,
    base: PathBuf,
    /// Matches a path relative to `base`; group 1 is the captured part.
    regex: Regex,
    /// How many components below `base` a match has; `None` with `**`.
    depth: Option<usize>,
    /// For `<base>/<prefix>(*)<suffix>`: prefix and suffix. Only such patterns can be filled in.
    slot: Option<(String, String)>,
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let Some(path) = text.strip_prefix('/') else {
            return Err("must be an absolute path".into());
        };
        if text.matches('(').count() != 1 || text.matches(')').count() != 1 {
            return Err("needs exactly one capture group `( )`".into());
        }
        if text.find('(') > text.find(')') || text.contains("()") {
            return Err("the capture group `( )` is malformed or empty".into());
        }
        if text.contains(['[', ']']) {
            return Err("`[ ]` character classes are not supported".into());
        }
        let components: Vec<&str> = path.split('/').collect();
        for component in &components {
            let bare = component.trim_matches(['(', ')']);
            if component.is_empty() || bare == "." || bare == ".." {
                return Err("empty, `.` and `..` path components are not allowed".into());
            }
        }
        let fixed = components
            .iter()
            .take_while(|c| !c.contains(['*', '?', '(', ')']))
            .count();
        let rest = &components[fixed..];
        if rest
            .iter()
            .any(|c| c.trim_start_matches('(').starts_with('.'))
        {
            return Err("names starting with `.` are never matched".into());
        }
        let rest_text = rest.join("/");
        let (source, globstar) = to_regex(&rest_text)?;
        let regex = Regex::new(&source).map_err(|e| e.to_string())?;
        let slot = match rest {
            [name] if name.matches('*').count() == 1 && !name.contains('?') => name
                .split_once("(*)")
                .map(|(prefix, suffix)| (prefix.to_owned(), suffix.to_owned())),
            _ => None,
        };
        Ok(Pattern {
            text: text.to_owned(),
            base: Path::new("/").join(components[..fixed].join("/")),
            regex,
            depth: (!globstar).then_some(rest.len()),
            slot,
        })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn base(&self) -> &Path {
        &self.base
    }

    /// Whether the pattern is `<dir>/<prefix>(*)<suffix>`, which [`Pattern::fill`] needs.
    pub fn has_slot(&self) -> bool {
        self.slot.is_some()
    }

    /// The path with `name` (a checked safe file name) in place of `(*)`.
    pub fn fill(&self, name: &str) -> Option<PathBuf> {
        let (prefix, suffix) = self.slot.as_ref()?;
        Some(self.base.join(format!("{prefix}{name}{suffix}")))
    }

    /// The regular files and symlinks below the base directory that match, with the captured
    /// part, sorted by path. A missing base directory has none.
    pub fn matches(&self) -> io::Result<Vec<(PathBuf, String)>> {
        let mut found = Vec::new();
        match self.walk(&self.base, "", 0, &mut found) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
        found.sort();
        Ok(found)
    }

    fn walk(
        &self,
        dir: &Path,
        rel: &str,
        depth: usize,
        found: &mut Vec<(PathBuf, String)>,
    ) -> io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            // A name that is not UTF-8 cannot match a UTF-8 pattern.
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            // The entry's own type: a symlink is a symlink here, never the directory it names.
            let kind = entry.file_type()?;
            if kind.is_dir() {
                if self.depth.is_none_or(|d| depth + 1 < d) {
                    match self.walk(&entry.path(), &rel, depth + 1, found) {
                        // Removed while we looked: nothing to match in it.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        other => other?,
                    }
                }
            } else if (kind.is_file() || kind.is_symlink())
                && let Some(caps) = self.regex.captures(&rel)
            {
                let captured = caps.get(1).map_or("", |m| m.as_str()).to_owned();
                found.push((entry.path(), captured));
            }
        }
        Ok(())
    }
}

/// The part after the base directory as an anchored regex; also whether it has `**`.
fn to_regex(rest: &str) -> Result<(String, bool), String> {
    let chars: Vec<char> = rest.chars().collect();
    let mut out = String::from("^");
    let mut globstar = false;
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' if chars.get(i + 1) == Some(&'*') => {
                let mut start = i;
                if start > 0 && chars[start - 1] == '(' {
                    start -= 1;
                }
                let mut end = i + 2;
                if chars.get(end) == Some(&')') {
                    end += 1;
                }
                let whole = (start == 0 || chars[start - 1] == '/')
                    && (end == chars.len() || chars[end] == '/');
                if !whole {
                    return Err("`**` must be a whole path component".into());
                }
                globstar = true;
                if chars.get(i + 2) == Some(&'/') {
                    // `**/`: any number of directories, none included.
                    out.push_str("(?:[^/]+/)*");
                    i += 3;
                } else {
                    // `**` at the end of a component list: one or more components.
                    out.push_str("[^/]+(?:/[^/]+)*");
                    i += 2;
                }
                continue;
            }
            '*' => out.push_str("[^/]*"),
            '?' => out.push_str("[^/]"),
            '(' => out.push('('),
            ')' => out.push(')'),
            c => out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
        i += 1;
    }
    out.push('$');
    Ok((out, globstar))
}
