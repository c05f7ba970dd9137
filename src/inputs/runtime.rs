//! The runtime tree: every YAML, JSON and text file under `runtime/`, placed at the JSON path
//! of its file path (verwalter 0.13's rules, reference §2.2).
//!
//! - `yaml`, `yml`, `json` and `txt` files become values; other files are ignored;
//! - each path component loses a `yaml`/`yml`/`json`/`txt`/`d` extension, so
//!   `runtime/app/v2/processes.yaml` is `app.v2.processes` and `app.d/` collapses into `app`;
//! - hidden entries (`.x`) and backups (`x~`, `x.bak`, `#x#`) are skipped;
//! - a `.txt` file is its text; an empty YAML document is `null`;
//! - a file that cannot be parsed, is too big or nests too deep is reported with its path (and
//!   line) and left out; so is a symlink out of the config dir or round in a loop (see
//!   [`super::walk`]); the rest of the tree is still built;
//! - a file or directory that exists but cannot be read (EMFILE, EACCES, EIO) is a read
//!   *failure*: the tree is incomplete and must not replace the last good one.

use std::collections::HashSet;
use std::path::Path;

use serde_json::{Map, Number, Value};
use verwalter_controllers::state::InputError;

use super::nesting::{MAX_NESTING, json_too_deep, yaml_too_deep};
use super::walk::{self, Dir, FileSystem, Node, Problem};

/// Extensions that are stripped from path components.
const STRIPPED: &[&str] = &["yaml", "yml", "json", "txt", "d"];

/// A runtime file bigger than this is refused unread. Parsing costs many times a file's size (a
/// 50 MB file took 3.1 GB that was never given back), and the tree goes to every scheduler run;
/// runtime files are hand-written or generated configs, far smaller than 1 MiB.
pub(crate) const MAX_FILE_BYTES: u64 = 1 << 20;

/// Reads a YAML file of the config dir outside `runtime/` (`sandbox/*.yaml`, `*.render.yaml`)
/// under the runtime files' limits, which protect the daemon the same way there: at most
/// [`MAX_FILE_BYTES`], read no further, and nesting no deeper than [`MAX_NESTING`], checked
/// before a parser sees the text. `shown` names the file in errors (with the line for nesting).
pub(crate) fn read_config_yaml(path: &Path, shown: &str) -> Result<String, String> {
    let too_big = |len: u64| {
        format!("{shown}: {len} bytes; config files are limited to {MAX_FILE_BYTES} bytes (1 MiB)")
    };
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{shown}: {e}"))?
        .len();
    if len > MAX_FILE_BYTES {
        return Err(too_big(len));
    }
    let bytes = walk::RealFs
        .read(path, MAX_FILE_BYTES)
        .map_err(|e| format!("{shown}: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        // It grew since the metadata was read.
        return Err(too_big(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|e| format!("{shown}: not valid UTF-8: {e}"))?;
    if let Some(line) = yaml_too_deep(&text, MAX_NESTING) {
        return Err(format!(
            "{shown}:{line}: nested deeper than {MAX_NESTING} levels; refused unparsed"
        ));
    }
    Ok(text)
}

/// Whether the scan skips this entry name: hidden files and editor backups.
pub(crate) fn is_skipped(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with('~')
        || name.ends_with(".bak")
        || (name.len() > 1 && name.starts_with('#') && name.ends_with('#'))
}

/// The key a path component becomes.
fn key_of(name: &str) -> &str {
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() && STRIPPED.contains(&ext) => stem,
        _ => name,
    }
}

/// A file the tree is built from, handed to `visit` for the content hash.
pub(crate) struct FileRead<'a> {
    /// Path relative to the config dir.
    pub(crate) rel: &'a str,
    pub(crate) bytes: &'a [u8],
}

/// What went wrong in one read of the config dir.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Problems {
    /// Bad entries: reported and left out, the rest is used.
    pub(crate) errors: Vec<InputError>,
    /// Entries that exist but could not be read: the read is incomplete.
    pub(crate) failures: Vec<InputError>,
}

impl Problems {
    /// Files a walk left out, named relative to the config dir (`shown` names the walked dir).
    pub(crate) fn add_walk(&mut self, shown: &str, problems: Vec<Problem>) {
        for problem in problems {
            let path = match problem.rel() {
                "" => shown.to_string(),
                rel => format!("{shown}/{rel}"),
            };
            let error = InputError {
                path,
                line: None,
                message: problem.to_string(),
            };
            if problem.is_read_failure() {
                self.failures.push(error);
            } else {
                self.errors.push(error);
            }
        }
    }
}

/// Reads `dir` (the config dir's `runtime/`) into a JSON object. Symlinks must stay inside
/// `boundary` (the config dir). `rel_prefix` names `dir` relative to the config dir in messages.
/// `visit` sees every file read, in a fixed order.
pub(crate) fn read_tree(
    fs: &dyn FileSystem,
    dir: &Path,
    boundary: &Path,
    rel_prefix: &str,
    problems: &mut Problems,
    visit: &mut dyn FnMut(FileRead<'_>),
) -> Value {
    let (walked, walk_problems) = walk::walk(fs, dir, boundary, &is_skipped);
    problems.add_walk(rel_prefix, walk_problems);
    let mut root = Map::new();
    read_dir_into(fs, walked, rel_prefix, &mut root, problems, visit);
    Value::Object(root)
}

fn read_dir_into(
    fs: &dyn FileSystem,
    dir: Dir,
    rel: &str,
    into: &mut Map<String, Value>,
    problems: &mut Problems,
    visit: &mut dyn FnMut(FileRead<'_>),
) {
    let mut file_keys = HashSet::new();
    for (name, node) in dir.entries {
        let rel_path = format!("{rel}/{name}");
        let key = key_of(&name).to_string();
        let error = |line, message| InputError {
            path: rel_path.clone(),
            line,
            message,
        };
        match node {
            Node::Dir(sub_dir) => {
                let mut sub = Map::new();
                read_dir_into(fs, sub_dir, &rel_path, &mut sub, problems, visit);
                place(
                    into,
                    key,
                    Value::Object(sub),
                    Source::Dir(&rel_path),
                    &mut problems.errors,
                    &mut file_keys,
                );
            }
            Node::File { path, len } => {
                let Some((_, ext)) = name.rsplit_once('.') else {
                    continue;
                };
                if !matches!(ext, "yaml" | "yml" | "json" | "txt") {
                    continue;
                }
                let too_big = |len: u64| {
                    error(
                        None,
                        format!(
                            "{len} bytes; runtime files are limited to {MAX_FILE_BYTES} bytes \
                             (1 MiB); left out"
                        ),
                    )
                };
                if len > MAX_FILE_BYTES {
                    problems.errors.push(too_big(len));
                    continue;
                }
                let bytes = match fs.read(&path, MAX_FILE_BYTES) {
                    Ok(bytes) if bytes.len() as u64 > MAX_FILE_BYTES => {
                        problems.errors.push(too_big(bytes.len() as u64));
                        continue;
                    }
                    Ok(bytes) => bytes,
                    Err(e) if walk::is_gone(&e) => continue, // removed meanwhile
                    Err(e) => {
                        problems
                            .failures
                            .push(error(None, format!("cannot read: {e}")));
                        continue;
                    }
                };
                visit(FileRead {
                    rel: &rel_path,
                    bytes: &bytes,
                });
                match parse_file(ext, &bytes) {
                    Ok(value) => place(
                        into,
                        key,
                        value,
                        Source::File(&rel_path),
                        &mut problems.errors,
                        &mut file_keys,
                    ),
                    Err((line, message)) => problems.errors.push(error(line, message)),
                }
            }
        }
    }
}

/// Puts `value` at `key`. A file and a directory of the same key (`app.yaml` and `app/`) merge
/// when both are objects; any other clash (two files, or a non-object) is an error and the first
/// value stays. `file_keys` remembers which keys of this directory came from files.
fn place(
    into: &mut Map<String, Value>,
    key: String,
    value: Value,
    source: Source<'_>,
    errors: &mut Vec<InputError>,
    file_keys: &mut HashSet<String>,
) {
    let (rel, is_file) = match source {
        Source::File(rel) => (rel, true),
        Source::Dir(rel) => (rel, false),
    };
    let two_files = is_file && file_keys.contains(&key);
    if is_file {
        file_keys.insert(key.clone());
    }
    match into.get_mut(&key) {
        None => {
            into.insert(key, value);
        }
        Some(Value::Object(existing)) if value.is_object() && !two_files => {
            let Value::Object(new) = value else {
                unreachable!()
            };
            for (k, v) in new {
                if existing.contains_key(&k) {
                    errors.push(InputError {
                        path: rel.into(),
                        line: None,
                        message: format!(
                            "key `{key}.{k}` is defined twice; the first definition is kept"
                        ),
                    });
                } else {
                    existing.insert(k, v);
                }
            }
        }
        Some(_) => errors.push(InputError {
            path: rel.into(),
            line: None,
            message: format!("key `{key}` is already defined by another file; this one is ignored"),
        }),
    }
}

/// Where a value placed into the tree came from.
enum Source<'a> {
    File(&'a str),
    Dir(&'a str),
}

/// Parses one file's bytes by extension. Errors carry the 1-based line where known.
/// YAML and JSON nesting deeper than [`MAX_NESTING`] is refused before parsing.
pub fn parse_file(ext: &str, bytes: &[u8]) -> Result<Value, (Option<u64>, String)> {
    let text = std::str::from_utf8(bytes).map_err(|e| (None, format!("not valid UTF-8: {e}")))?;
    let too_deep = match ext {
        "txt" => None,
        "json" => json_too_deep(text, MAX_NESTING),
        _ => yaml_too_deep(text, MAX_NESTING),
    };
    if let Some(line) = too_deep {
        return Err((
            Some(line),
            format!("nested deeper than {MAX_NESTING} levels; left out unparsed"),
        ));
    }
    match ext {
        "txt" => Ok(Value::String(text.to_string())),
        "json" => serde_json::from_str(text).map_err(|e| (Some(e.line() as u64), e.to_string())),
        _ => {
            let yaml: serde_norway::Value = serde_norway::from_str(text)
                .map_err(|e| (e.location().map(|l| l.line() as u64), e.to_string()))?;
            yaml_to_json(yaml).map_err(|message| (None, message))
        }
    }
}

/// YAML to JSON: scalar keys become strings, NaN and infinities are refused, tags are refused.
pub(crate) fn yaml_to_json(value: serde_norway::Value) -> Result<Value, String> {
    use serde_norway::Value as Y;
    Ok(match value {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Number(i.into())
            } else if let Some(u) = n.as_u64() {
                Value::Number(u.into())
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                Value::Number(
                    Number::from_f64(f).ok_or_else(|| format!("number {n} has no JSON form"))?,
                )
            }
        }
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => Value::Array(
            items
                .into_iter()
                .map(yaml_to_json)
                .collect::<Result<_, _>>()?,
        ),
        Y::Mapping(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let key = match k {
                    Y::String(s) => s,
                    Y::Bool(b) => b.to_string(),
                    Y::Number(n) => n.to_string(),
                    other => {
                        return Err(format!(
                            "mapping key {other:?} is not a string, number or boolean"
                        ));
                    }
                };
                out.insert(key, yaml_to_json(v)?);
            }
            Value::Object(out)
        }
        Y::Tagged(tagged) => {
            return Err(format!(
                "YAML tag {} is not allowed in runtime data",
                tagged.tag
            ));
        }
    })
}

#[cfg(test)]
mod tests;
