//! `{{ role }}` and `{{ files.NAME }}` in command arguments, quoting for the shell and escaping
//! for path patterns.
//!
//! Only these two kinds of names exist here (template variables do not); any other name is an
//! error, so a typo fails the role instead of passing a strange argument to a program.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::LazyLock;

use regex::{Captures, Regex};

use super::{At, CommandError};

static PLACEHOLDER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\{\{\s*([\w.-]+)\s*\}\}").expect("a valid regex"));

/// The values substitution can insert.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vars<'a> {
    pub(crate) role: &'a str,
    pub(crate) files: &'a BTreeMap<String, PathBuf>,
}

impl Vars<'_> {
    /// `text` with every placeholder replaced by its value.
    pub(crate) fn expand(&self, text: &str, at: At) -> Result<String, CommandError> {
        self.replace(text, at, |value| Cow::Borrowed(value))
    }

    /// Like [`Vars::expand`], with each value quoted for `sh`, so that whatever a value holds
    /// (`$(...)`, backquotes, `;`, quotes) stays one literal word.
    pub(crate) fn expand_for_shell(&self, text: &str, at: At) -> Result<String, CommandError> {
        self.replace(text, at, |value| Cow::Owned(always_quote(value)))
    }

    /// Like [`Vars::expand`] for a path pattern (`!CleanFiles` `pattern`, `!SplitText` `dest`):
    /// each value is escaped so that it matches only itself, whatever wildcard or parenthesis
    /// a role name holds.
    pub(crate) fn expand_for_pattern(&self, text: &str, at: At) -> Result<String, CommandError> {
        self.replace(text, at, |value| Cow::Owned(super::pattern::escape(value)))
    }

    fn replace(
        &self,
        text: &str,
        at: At,
        wrap: impl Fn(&str) -> Cow<'_, str>,
    ) -> Result<String, CommandError> {
        let mut failure = None;
        let out = PLACEHOLDER.replace_all(text, |caps: &Captures<'_>| {
            let name = &caps[1];
            match self.value(name, at) {
                Ok(value) => wrap(value).into_owned(),
                Err(e) => {
                    failure.get_or_insert(e);
                    String::new()
                }
            }
        });
        match failure {
            Some(e) => Err(e),
            None => Ok(out.into_owned()),
        }
    }

    fn value(&self, name: &str, at: At) -> Result<&str, CommandError> {
        if name == "role" {
            return Ok(self.role);
        }
        let path = name
            .strip_prefix("files.")
            .and_then(|template| self.files.get(template))
            .ok_or_else(|| CommandError::UnknownVariable {
                at,
                name: name.to_owned(),
            })?;
        path.to_str().ok_or_else(|| CommandError::Invalid {
            at,
            message: format!("{{{{ {name} }}}}: path {} is not UTF-8", path.display()),
        })
    }
}

/// `value` as one `sh` word in single quotes (a `'` inside becomes `'\''`).
pub(crate) fn always_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// A command line for reading in the log: words that need it are quoted as for `sh`.
pub(crate) fn show_argv(argv: &[String]) -> String {
    let words: Vec<Cow<'_, str>> = argv
        .iter()
        .map(|word| {
            let plain = !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b));
            if plain {
                Cow::Borrowed(word.as_str())
            } else {
                Cow::Owned(always_quote(word))
            }
        })
        .collect();
    words.join(" ")
}
