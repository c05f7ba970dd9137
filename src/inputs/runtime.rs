//! The runtime tree: every YAML, JSON and text file under `runtime/`, placed at the JSON path
//! of its file path (verwalter 0.13's rules, reference §2.2).
//!
//! - `yaml`, `yml`, `json` and `txt` files become values; other files are ignored;
//! - each path component loses a `yaml`/`yml`/`json`/`txt`/`d` extension, so
//!   `runtime/app/v2/processes.yaml` is `app.v2.processes` and `app.d/` collapses into `app`;
//! - hidden entries (`.x`) and backups (`x~`, `x.bak`, `#x#`) are skipped;
//! - a `.txt` file is its text; an empty YAML document is `null`;
//! - a file that cannot be read or parsed is reported with its path (and line) and left out;
//!   the rest of the tree is still built.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use serde_json::{Map, Number, Value};
use verwalter_controllers::state::InputError;

/// Extensions that are stripped from path components.
const STRIPPED: &[&str] = &["yaml", "yml", "json", "txt", "d"];

/// Directory nesting deeper than this is reported instead of followed (symlink loops).
const MAX_DEPTH: usize = 64;

/// Whether the scan skips this entry name: hidden files and editor backups.
pub fn is_skipped(name: &str) -> bool {
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
pub struct FileRead<'a> {
    /// Path relative to the config dir.
    pub rel: &'a str,
    pub bytes: &'a [u8],
}

/// Reads `dir` (the config dir's `runtime/`) into a JSON object. `rel_prefix` names `dir`
/// relative to the config dir in error messages. `visit` sees every file read, in a fixed order.
pub fn read_tree(
    dir: &Path,
    rel_prefix: &str,
    errors: &mut Vec<InputError>,
    visit: &mut dyn FnMut(FileRead<'_>),
) -> Value {
    let mut root = Map::new();
    if dir.is_dir() {
        read_dir_into(dir, rel_prefix, 0, &mut root, errors, visit);
    }
    Value::Object(root)
}

fn read_dir_into(
    dir: &Path,
    rel: &str,
    depth: usize,
    into: &mut Map<String, Value>,
    errors: &mut Vec<InputError>,
    visit: &mut dyn FnMut(FileRead<'_>),
) {
    if depth > MAX_DEPTH {
        errors.push(InputError {
            path: rel.into(),
            line: None,
            message: "directories nested too deep (a symlink loop?)".into(),
        });
        return;
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            errors.push(InputError {
                path: rel.into(),
                line: None,
                message: format!("cannot read directory: {e}"),
            });
            return;
        }
    };
    let mut names: Vec<String> = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => match entry.file_name().into_string() {
                Ok(name) if !is_skipped(&name) => names.push(name),
                Ok(_) => {}
                Err(name) => errors.push(InputError {
                    path: format!("{rel}/{}", name.to_string_lossy()),
                    line: None,
                    message: "file name is not valid UTF-8".into(),
                }),
            },
            Err(e) => errors.push(InputError {
                path: rel.into(),
                line: None,
                message: format!("cannot list directory: {e}"),
            }),
        }
    }
    names.sort();
    let mut file_keys = HashSet::new();
    for name in names {
        let path = dir.join(&name);
        let rel_path = format!("{rel}/{name}");
        // Follow symlinks, as a plain read would.
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) => {
                errors.push(InputError {
                    path: rel_path,
                    line: None,
                    message: format!("cannot stat: {e}"),
                });
                continue;
            }
        };
        let key = key_of(&name).to_string();
        if meta.is_dir() {
            let mut sub = Map::new();
            read_dir_into(&path, &rel_path, depth + 1, &mut sub, errors, visit);
            place(
                into,
                key,
                Value::Object(sub),
                Source::Dir(&rel_path),
                errors,
                &mut file_keys,
            );
        } else if meta.is_file() {
            let Some((_, ext)) = name.rsplit_once('.') else {
                continue;
            };
            if !matches!(ext, "yaml" | "yml" | "json" | "txt") {
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    errors.push(InputError {
                        path: rel_path,
                        line: None,
                        message: format!("cannot read: {e}"),
                    });
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
                    errors,
                    &mut file_keys,
                ),
                Err((line, message)) => errors.push(InputError {
                    path: rel_path,
                    line,
                    message,
                }),
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
pub fn parse_file(ext: &str, bytes: &[u8]) -> Result<Value, (Option<u64>, String)> {
    let text = std::str::from_utf8(bytes).map_err(|e| (None, format!("not valid UTF-8: {e}")))?;
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
pub fn yaml_to_json(value: serde_norway::Value) -> Result<Value, String> {
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
