//! Path patterns with one capture group, such as `/etc/nginx/sites/(*).conf` or
//! `/etc/app/(**/*.conf)`, and the files that match them.
//!
//! `*` and `?` match within one path component, `**` (a whole component) matches any number
//! of directories. `[c]`, one character in brackets, matches that character literally: values
//! put into a pattern by substitution are written that way ([`escape`]), so a role named `*` or
//! `a(b)` matches only itself. The leading components without wildcards are the pattern's base
//! directory; matching looks only below it, never follows a symlink, and never matches a
//! directory or a name starting with `.` (hidden files, our `.tmp.*` files).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use regex::Regex;

/// The characters with a meaning in a pattern; [`escape`] makes them literal.
const SPECIAL: &[char] = &['*', '?', '(', ')', '[', ']'];

/// `value` as pattern text that matches exactly `value`: each special character in brackets
/// (`*` → `[*]`, `(` → `[(]`, `]` → `[]]`). `/` stays a separator.
pub(crate) fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if SPECIAL.contains(&c) {
            out.push('[');
            out.push(c);
            out.push(']');
        } else {
            out.push(c);
        }
    }
    out
}

/// One piece of a pattern, after `[c]` escapes are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// A character that matches itself.
    Literal(char),
    Star,
    Question,
    Open,
    Close,
    Slash,
}

/// The pattern text as tokens; `[c]` is a literal `c`, any other `[` or `]` an error.
fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        tokens.push(match c {
            '*' => Token::Star,
            '?' => Token::Question,
            '(' => Token::Open,
            ')' => Token::Close,
            '/' => Token::Slash,
            '[' => match (chars.next(), chars.next()) {
                (Some(inner), Some(']')) if inner != '/' => Token::Literal(inner),
                _ => {
                    return Err(
                        "`[ ]` character classes are not supported (only `[c]`, one \
                                character other than `/`, which matches `c` itself)"
                            .into(),
                    );
                }
            },
            ']' => {
                return Err(
                    "`[ ]` character classes are not supported (a `]` without its `[`)".into(),
                );
            }
            c => Token::Literal(c),
        });
    }
    Ok(tokens)
}

/// The literal text of tokens that are all literals.
fn literal(tokens: &[Token]) -> Option<String> {
    tokens
        .iter()
        .map(|t| match t {
            Token::Literal(c) => Some(*c),
            _ => None,
        })
        .collect()
}

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
    pub(crate) fn parse(text: &str) -> Result<Pattern, String> {
        let tokens = tokenize(text)?;
        let Some(path) = tokens.strip_prefix(&[Token::Slash]) else {
            return Err("must be an absolute path".into());
        };
        let count = |token: Token| tokens.iter().filter(|t| **t == token).count();
        if count(Token::Open) != 1 || count(Token::Close) != 1 {
            return Err("needs exactly one capture group `( )`".into());
        }
        let open = tokens.iter().position(|t| *t == Token::Open);
        let close = tokens.iter().position(|t| *t == Token::Close);
        if open > close || tokens.windows(2).any(|w| w == [Token::Open, Token::Close]) {
            return Err("the capture group `( )` is malformed or empty".into());
        }
        let components: Vec<&[Token]> = path.split(|t| *t == Token::Slash).collect();
        for component in &components {
            let bare: Vec<Token> = component
                .iter()
                .copied()
                .filter(|t| !matches!(t, Token::Open | Token::Close))
                .collect();
            let name = literal(&bare);
            if component.is_empty() || matches!(name.as_deref(), Some("." | "..")) {
                return Err("empty, `.` and `..` path components are not allowed".into());
            }
        }
        let fixed = components
            .iter()
            .take_while(|c| literal(c).is_some())
            .count();
        let rest = &components[fixed..];
        let hidden = rest.iter().any(|c| {
            let c = c.strip_prefix(&[Token::Open]).unwrap_or(c);
            c.first() == Some(&Token::Literal('.'))
        });
        if hidden {
            return Err("names starting with `.` are never matched".into());
        }
        let rest_tokens = rest.join(&Token::Slash);
        let (source, globstar) = to_regex(&rest_tokens)?;
        let regex = Regex::new(&source).map_err(|e| e.to_string())?;
        let slot = match rest {
            [name] => slot(name),
            _ => None,
        };
        let base = components[..fixed]
            .iter()
            .filter_map(|c| literal(c))
            .fold(PathBuf::from("/"), |base, name| base.join(name));
        Ok(Pattern {
            text: text.to_owned(),
            base,
            regex,
            depth: (!globstar).then_some(rest.len()),
            slot,
        })
    }

    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    pub(crate) fn base(&self) -> &Path {
        &self.base
    }

    /// Whether the pattern is `<dir>/<prefix>(*)<suffix>`, which [`Pattern::fill`] needs.
    pub(crate) fn has_slot(&self) -> bool {
        self.slot.is_some()
    }

    /// The path with `name` (a checked safe file name) in place of `(*)`.
    pub(crate) fn fill(&self, name: &str) -> Option<PathBuf> {
        let (prefix, suffix) = self.slot.as_ref()?;
        Some(self.base.join(format!("{prefix}{name}{suffix}")))
    }

    /// The regular files and symlinks below the base directory that match, with the captured
    /// part, sorted by path. A missing base directory has none.
    pub(crate) fn matches(&self) -> io::Result<Vec<(PathBuf, String)>> {
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

/// For a last component `<prefix>(*)<suffix>` (no other wildcard): prefix and suffix.
fn slot(name: &[Token]) -> Option<(String, String)> {
    let open = name.iter().position(|t| *t == Token::Open)?;
    if name.get(open + 1..open + 3)? != [Token::Star, Token::Close] {
        return None;
    }
    Some((literal(&name[..open])?, literal(&name[open + 3..])?))
}

/// The part after the base directory as an anchored regex; also whether it has `**`.
fn to_regex(tokens: &[Token]) -> Result<(String, bool), String> {
    let mut out = String::from("^");
    let mut globstar = false;
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i] {
            Token::Star if tokens.get(i + 1) == Some(&Token::Star) => {
                let mut start = i;
                if start > 0 && tokens[start - 1] == Token::Open {
                    start -= 1;
                }
                let mut end = i + 2;
                if tokens.get(end) == Some(&Token::Close) {
                    end += 1;
                }
                let whole = (start == 0 || tokens[start - 1] == Token::Slash)
                    && (end == tokens.len() || tokens[end] == Token::Slash);
                if !whole {
                    return Err("`**` must be a whole path component".into());
                }
                globstar = true;
                if tokens.get(i + 2) == Some(&Token::Slash) {
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
            Token::Star => out.push_str("[^/]*"),
            Token::Question => out.push_str("[^/]"),
            Token::Open => out.push('('),
            Token::Close => out.push(')'),
            Token::Slash => out.push('/'),
            Token::Literal(c) => out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
        i += 1;
    }
    out.push('$');
    Ok((out, globstar))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escaped_value_is_literal_in_base_slot_and_match() {
        for name in ["*", "**", "a(b)", "?", "[x]", "]", "(", "a b"] {
            let dir = Pattern::parse(&format!("/x/{}/(*).conf", escape(name))).unwrap();
            assert_eq!(dir.base(), Path::new("/x").join(name), "{name}");
            assert!(dir.has_slot(), "{name}");
            let file = Pattern::parse(&format!("/x/{}-(*)", escape(name))).unwrap();
            assert_eq!(file.base(), Path::new("/x"), "{name}");
            assert_eq!(
                file.fill("v"),
                Some(Path::new("/x").join(format!("{name}-v"))),
                "{name}"
            );
            let path = format!("{name}-v");
            let caps = file.regex.captures(&path).unwrap();
            assert_eq!(&caps[1], "v", "{name}");
            assert!(!file.regex.is_match("other-v"), "{name}");
        }
    }

    #[test]
    fn only_one_character_brackets_are_accepted() {
        for text in [
            "/x/[ab]/(*)",
            "/x/[a/(*)",
            "/x/a]/(*)",
            "/x/[/]/(*)",
            "/x/(*)[",
        ] {
            let err = Pattern::parse(text).unwrap_err();
            assert!(err.contains("character classes"), "{text}: {err}");
        }
        assert_eq!(
            Pattern::parse("/x/[.]/(*)").unwrap_err(),
            "empty, `.` and `..` path components are not allowed"
        );
        assert!(
            Pattern::parse("/x/([.]*)")
                .unwrap_err()
                .contains("starting with `.`")
        );
    }
}
