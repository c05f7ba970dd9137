//! Golden test of the runtime tree: every rule of reference §2.2 in one directory.

use std::fs;

use serde_json::json;

use super::*;

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

#[test]
fn golden_runtime_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("runtime");
    // Values by extension, extension stripped from the key.
    write(
        &rt,
        "pyapp/v2/processes.yaml",
        "daemons:\n  web: {image: web-v1, instances: 2}\n",
    );
    write(
        &rt,
        "pyapp/v3.json",
        r#"{"timestamp": 1465479290000, "ok": true}"#,
    );
    write(&rt, "pyapp/notes.txt", "plain text\n");
    write(&rt, "pyapp/extra.yml", "- 1\n- 2.5\n- x\n");
    // `.d` directories collapse to their stem.
    write(&rt, "limits.d/cpu.yaml", "3");
    write(&rt, "limits.d/mem.json", "1024");
    // Hidden files and dirs, and backups, are skipped.
    write(&rt, ".hidden.yaml", "a: 1");
    write(&rt, "pyapp/.git/config.yaml", "a: 1");
    write(&rt, "pyapp/v2/old.yaml~", "a: 1");
    write(&rt, "pyapp/v2/older.yaml.bak", "a: 1");
    write(&rt, "pyapp/v2/#draft.yaml#", "a: 1");
    // Other extensions are ignored.
    write(&rt, "pyapp/README.md", "# hi");
    write(&rt, "pyapp/blob.bin", "\u{0}\u{1}");
    // Empty YAML is null; non-string keys become strings.
    write(&rt, "empty.yaml", "");
    write(&rt, "keys.yaml", "1: one\ntrue: yes\n1.5: half\n");
    // A file and a directory of the same key merge.
    write(&rt, "svc.yaml", "port: 80\n");
    write(&rt, "svc/tls.yaml", "on: true\n");
    // Invalid files are reported with path and line; the rest is kept.
    write(&rt, "broken/bad.yaml", "good: 1\nbad: [1, 2\n");
    write(&rt, "broken/bad.json", "{\n  \"a\": 1,\n}\n");
    write(&rt, "broken/nan.yaml", "x: .nan\n");
    write(&rt, "broken/fine.yaml", "still: here\n");
    // Two files for one key: the first (by name) is kept, the clash is reported.
    write(&rt, "dup/x.json", "1");
    write(&rt, "dup/x.txt", "two");
    // Two object files of one key do not merge either.
    write(&rt, "twice/k.json", r#"{"a": 1}"#);
    write(&rt, "twice/k.yaml", "b: 2\n");

    let mut errors = Vec::new();
    let mut seen = Vec::new();
    let tree = read_tree(&rt, "runtime", &mut errors, &mut |f| {
        seen.push(f.rel.to_string())
    });
    assert_eq!(
        tree,
        json!({
            "pyapp": {
                "v2": {"processes": {"daemons": {"web": {"image": "web-v1", "instances": 2}}}},
                "v3": {"timestamp": 1465479290000u64, "ok": true},
                "notes": "plain text\n",
                "extra": [1, 2.5, "x"],
            },
            "limits": {"cpu": 3, "mem": 1024},
            "empty": null,
            "keys": {"1": "one", "true": "yes", "1.5": "half"},
            "svc": {"port": 80, "tls": {"on": true}},
            "broken": {"fine": {"still": "here"}},
            "dup": {"x": 1},
            "twice": {"k": {"a": 1}},
        })
    );
    let described: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 5, "{described:#?}");
    let find = |p: &str| {
        errors
            .iter()
            .find(|e| e.path == p)
            .unwrap_or_else(|| panic!("no error for {p}: {described:#?}"))
    };
    assert_eq!(find("runtime/broken/bad.yaml").line, Some(3));
    assert_eq!(find("runtime/broken/bad.json").line, Some(3));
    assert!(
        find("runtime/broken/nan.yaml")
            .message
            .contains("no JSON form")
    );
    assert!(
        find("runtime/dup/x.txt")
            .message
            .contains("already defined")
    );
    // Every parsed file was visited (for the content hash), skipped ones were not.
    assert!(seen.contains(&"runtime/pyapp/v3.json".to_string()));
    assert!(
        !seen
            .iter()
            .any(|p| p.contains(".git") || p.ends_with('~') || p.ends_with(".md"))
    );
}

#[test]
fn missing_runtime_dir_is_an_empty_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let mut errors = Vec::new();
    let tree = read_tree(
        &tmp.path().join("runtime"),
        "runtime",
        &mut errors,
        &mut |_| {},
    );
    assert_eq!(tree, json!({}));
    assert!(errors.is_empty());
}

#[test]
fn skip_rules() {
    for name in [".x", "a~", "a.bak", "#a#"] {
        assert!(is_skipped(name), "{name}");
    }
    for name in ["a", "a.yaml", "#a", "a#", "bak"] {
        assert!(!is_skipped(name), "{name}");
    }
    assert_eq!(key_of("a.d"), "a");
    assert_eq!(key_of("a.b.yaml"), "a.b");
    assert_eq!(key_of(".yaml"), ".yaml");
    assert_eq!(key_of("a.lua"), "a.lua");
}
