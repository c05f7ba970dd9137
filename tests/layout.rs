//! docs/ARCHITECTURE.md's module tables are the index of the code: every source file of the three
//! crates is named there, and every file or directory a row names exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The tables of docs/ARCHITECTURE.md whose header is `| `<root>` | Job |`: root → the rows'
/// (first cell, whole row) pairs.
fn tables(doc: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut tables = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        if let Some(root) = line
            .strip_prefix("| `")
            .and_then(|rest| rest.strip_suffix("` | Job |"))
        {
            current = Some(root.to_string());
            tables.insert(root.to_string(), Vec::new());
            continue;
        }
        let Some(root) = &current else { continue };
        if !line.starts_with('|') {
            current = None;
        } else if !line.starts_with("|---") {
            let key = line.split(" | ").next().unwrap_or_default();
            let key = key.trim_start_matches("| ").to_string();
            tables
                .get_mut(root)
                .expect("table opened")
                .push((key, line.to_string()));
        }
    }
    tables
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Test files are named by their module's row (`graph.rs, graph/tests.rs`) or not at all.
fn is_test_file(rel: &str) -> bool {
    rel.split('/').any(|part| part.contains("tests"))
}

#[test]
fn architecture_tables_name_every_source_file_and_only_files_that_exist() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(repo.join("docs/ARCHITECTURE.md")).unwrap();
    let tables = tables(&doc);
    let roots: Vec<&str> = tables.keys().map(String::as_str).collect();
    assert_eq!(roots, ["controllers/src/", "placement/src/", "src/"]);
    let mut unnamed = Vec::new();
    let mut missing = Vec::new();
    for (root, rows) in &tables {
        let mut files = Vec::new();
        rust_files(&repo.join(root), &mut files);
        for file in files {
            let rel = file.strip_prefix(repo.join(root)).unwrap();
            let rel = rel.to_str().unwrap().to_string();
            if is_test_file(&rel) {
                continue;
            }
            // Named as a row of its own, in a row of its own, or inside the row of a directory
            // holding it by its path below that directory; a directory's `mod.rs` by any row
            // of that directory.
            let named = rows.iter().any(|(key, row)| {
                let dirs = key.split(", ").filter_map(|k| k.strip_prefix('`'));
                row.contains(&format!("`{rel}`"))
                    || dirs.into_iter().any(|k| {
                        let k = k.trim_end_matches('`');
                        k.ends_with('/')
                            && rel.starts_with(k)
                            && (row.contains(&format!("`{}`", &rel[k.len()..]))
                                || rel[k.len()..] == *"mod.rs")
                    })
                    || rel.ends_with("/mod.rs")
                        && key.starts_with(&format!("`{}", rel.trim_end_matches("mod.rs")))
            });
            if !named {
                unnamed.push(format!("{root}{rel}"));
            }
        }
        for (key, _) in rows {
            for name in key.split(", ") {
                let name = name.trim_matches('`');
                let name = name.split(' ').next().unwrap_or(name).trim_end_matches('`');
                if !repo.join(root).join(name).exists() {
                    missing.push(format!("{root}{name}"));
                }
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "source files docs/ARCHITECTURE.md does not name: {unnamed:#?}"
    );
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md names files that do not exist: {missing:#?}"
    );
}
