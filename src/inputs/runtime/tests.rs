//! Golden test of the runtime tree (every rule of reference §2.2 in one directory), and its
//! limits: symlinks, sizes, nesting, read failures.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;

use serde_json::json;

use super::*;
use crate::inputs::walk::{FailingFs, RealFs};

/// Reads `root/runtime` as the daemon does, with `root` the config dir.
fn read_with(fs: &dyn FileSystem, root: &Path) -> (Value, Problems) {
    let mut problems = Problems::default();
    let tree = read_tree(
        fs,
        &root.join("runtime"),
        root,
        "runtime",
        &mut problems,
        &mut |_| {},
    );
    (tree, problems)
}

fn read(root: &Path) -> (Value, Problems) {
    read_with(&RealFs, root)
}

fn messages(errors: &[InputError]) -> Vec<String> {
    errors.iter().map(|e| e.to_string()).collect()
}

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

    let mut problems = Problems::default();
    let mut seen = Vec::new();
    let tree = read_tree(
        &RealFs,
        &rt,
        tmp.path(),
        "runtime",
        &mut problems,
        &mut |f| seen.push(f.rel.to_string()),
    );
    assert!(problems.failures.is_empty(), "{:?}", problems.failures);
    let errors = problems.errors;
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
    let (tree, problems) = read(tmp.path());
    assert_eq!(tree, json!({}));
    assert_eq!(problems, Problems::default());
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

#[test]
fn symlink_loops_end_with_an_error_and_aliases_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let rt = root.join("runtime");
    write(&rt, "d/x.yaml", "1");
    write(&rt, "v2/app.yaml", "image: web-v2");
    // The loops from the issue: each made the walk exponential (2^64 paths).
    symlink("..", rt.join("d/up")).unwrap();
    symlink("../d", rt.join("d/self")).unwrap();
    // A second name for a dir elsewhere is legitimate and read under that name too.
    symlink("v2", rt.join("current")).unwrap();
    let (tree, problems) = read(root);
    assert_eq!(
        tree,
        json!({"d": {"x": 1}, "v2": {"app": {"image": "web-v2"}},
               "current": {"app": {"image": "web-v2"}}})
    );
    assert!(problems.failures.is_empty());
    let described = messages(&problems.errors);
    assert_eq!(problems.errors.len(), 2, "{described:#?}");
    for link in ["runtime/d/self", "runtime/d/up"] {
        let error = problems.errors.iter().find(|e| e.path == link);
        assert!(
            error.is_some_and(|e| e.message.contains("symlink loop")),
            "{link}: {described:#?}"
        );
    }
}

/// Links that never resolve (`a -> b`, `b -> a`; `x -> x`) are left out with an error each, as a
/// dangling link is: the read stays complete and the rest of the tree is used (they used to be
/// read failures, so no runtime was published at all).
#[test]
fn links_that_lead_round_to_each_other_are_left_out_and_the_rest_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let rt = root.join("runtime");
    write(&rt, "web/v1.yaml", "image: web-v1");
    symlink("b", rt.join("web/a")).unwrap();
    symlink("a", rt.join("web/b")).unwrap();
    symlink("x.yaml", rt.join("web/x.yaml")).unwrap();
    let (tree, problems) = read(root);
    assert_eq!(tree, json!({"web": {"v1": {"image": "web-v1"}}}));
    let described = messages(&problems.errors);
    assert!(problems.failures.is_empty(), "{:#?}", problems.failures);
    assert_eq!(problems.errors.len(), 3, "{described:#?}");
    for (link, target) in [
        ("runtime/web/a", "b"),
        ("runtime/web/b", "a"),
        ("runtime/web/x.yaml", "x.yaml"),
    ] {
        let error = problems.errors.iter().find(|e| e.path == link);
        assert!(
            error.is_some_and(|e| e.message
                == format!(
                    "symlink loop: {target} never resolves (the links lead round to each other); left out"
                )),
            "{link}: {described:#?}"
        );
    }
}

#[test]
fn a_maze_of_aliases_stops_at_the_entry_limit() {
    // 20 levels, each with two links to the next: 2^20 paths without the limit.
    let tmp = tempfile::tempdir().unwrap();
    let rt = tmp.path().join("runtime");
    for level in 0..20 {
        let dir = rt.join(format!("l{level}"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("v.yaml"), "1").unwrap();
        if level < 19 {
            for name in ["a", "b"] {
                symlink(format!("../l{}", level + 1), dir.join(name)).unwrap();
            }
        }
    }
    let (_, problems) = read(tmp.path());
    assert!(
        problems
            .errors
            .iter()
            .any(|e| e.message.contains("100000 entries")),
        "{:#?}",
        messages(&problems.errors)
    );
}

#[test]
fn links_out_of_the_config_dir_are_refused_by_name_and_the_rest_is_used() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret.yaml"), "password: hunter2").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let rt = root.join("runtime");
    write(&rt, "app.yaml", "port: 80");
    write(root, "shared/common.yaml", "region: eu");
    symlink(outside.path().join("secret.yaml"), rt.join("secret.yaml")).unwrap();
    symlink(outside.path(), rt.join("elsewhere")).unwrap();
    // Inside the config dir, a link may leave runtime/.
    symlink("../shared/common.yaml", rt.join("common.yaml")).unwrap();
    symlink("nothing.yaml", rt.join("dangling.yaml")).unwrap();
    let (tree, problems) = read(root);
    assert_eq!(
        tree,
        json!({"app": {"port": 80}, "common": {"region": "eu"}})
    );
    assert!(problems.failures.is_empty());
    let described = messages(&problems.errors);
    assert_eq!(problems.errors.len(), 3, "{described:#?}");
    let real_secret = outside.path().canonicalize().unwrap().join("secret.yaml");
    let secret = problems
        .errors
        .iter()
        .find(|e| e.path == "runtime/secret.yaml")
        .unwrap();
    assert!(
        secret.message.contains(&real_secret.display().to_string())
            && secret.message.contains("outside"),
        "{described:#?}"
    );
    assert!(
        problems
            .errors
            .iter()
            .any(|e| e.path == "runtime/elsewhere" && e.message.contains("outside"))
    );
    assert!(
        problems
            .errors
            .iter()
            .any(|e| e.path == "runtime/dangling.yaml" && e.message.contains("does not exist"))
    );

    // runtime/ itself leading out of the config dir is refused too.
    let other = tempfile::tempdir().unwrap();
    symlink(outside.path(), other.path().join("runtime")).unwrap();
    let (tree, problems) = read(other.path());
    assert_eq!(tree, json!({}));
    assert!(
        problems.errors[0].path == "runtime" && problems.errors[0].message.contains("outside"),
        "{:#?}",
        messages(&problems.errors)
    );
}

#[test]
fn big_and_deeply_nested_files_are_refused_by_name_before_parsing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let rt = root.join("runtime");
    let big = format!("x: \"{}\"\n", "a".repeat(MAX_FILE_BYTES as usize));
    write(&rt, "big.yaml", &big);
    let just_fits = format!("\"{}\"", "a".repeat(MAX_FILE_BYTES as usize - 2));
    write(&rt, "fits.json", &just_fits);
    let deep: String = (0..300)
        .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
        .collect();
    write(&rt, "deep.yaml", &deep);
    // The issue's case: 100,000 levels took 38 s to parse, at every re-read.
    write(&rt, "deeper.yaml", &format!("a: {}", "[".repeat(100_000)));
    write(
        &rt,
        "deep.json",
        &format!("{}1{}", "[".repeat(200), "]".repeat(200)),
    );
    write(&rt, "fine.yaml", "a: {b: [1, {c: 2}]}\n");
    // The CPU time of this thread, which reads the tree: unlike the wall clock, a loaded
    // machine does not stretch it.
    let cpu = || {
        let usage =
            nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD).unwrap();
        let (user, system) = (usage.user_time(), usage.system_time());
        std::time::Duration::new(user.tv_sec() as u64, user.tv_usec() as u32 * 1000)
            + std::time::Duration::new(system.tv_sec() as u64, system.tv_usec() as u32 * 1000)
    };
    let started = cpu();
    let (tree, problems) = read(root);
    let spent = cpu() - started;
    assert!(spent < std::time::Duration::from_secs(10), "{spent:?}");
    assert_eq!(tree["fine"], json!({"a": {"b": [1, {"c": 2}]}}));
    assert_eq!(
        tree["fits"].as_str().map(str::len),
        Some(just_fits.len() - 2)
    );
    let described = messages(&problems.errors);
    assert_eq!(problems.errors.len(), 4, "{described:#?}");
    let find = |p: &str| problems.errors.iter().find(|e| e.path == p).unwrap();
    assert_eq!(find("runtime/deeper.yaml").line, Some(1));
    assert!(
        find("runtime/big.yaml")
            .message
            .contains("limited to 1048576 bytes")
    );
    assert_eq!(find("runtime/deep.yaml").line, Some(129));
    assert!(
        find("runtime/deep.yaml")
            .message
            .contains("deeper than 128")
    );
    assert_eq!(find("runtime/deep.json").line, Some(1));
}

#[test]
fn a_read_failure_is_told_apart_from_a_file_that_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let rt = root.join("runtime");
    write(&rt, "a.yaml", "1");
    write(&rt, "sub/b.yaml", "2");
    let emfile = || io::Error::from_raw_os_error(nix::errno::Errno::EMFILE as i32);
    // Descriptors exhausted when listing a dir: a failure naming the dir, not an empty dir.
    let fs_ = FailingFs(|call: &str, path: &Path| {
        (call == "read_dir" && path.ends_with("sub")).then(emfile)
    });
    let (_, problems) = read_with(&fs_, root);
    assert_eq!(problems.failures.len(), 1, "{:?}", problems.failures);
    assert_eq!(problems.failures[0].path, "runtime/sub");
    assert!(problems.failures[0].message.contains("Too many open files"));
    // ... or when opening a file, or listing runtime/ itself.
    let fs_ = FailingFs(|call: &str, path: &Path| {
        (call == "read" && path.ends_with("a.yaml")).then(emfile)
    });
    let (_, problems) = read_with(&fs_, root);
    assert_eq!(problems.failures[0].path, "runtime/a.yaml");
    let fs_ = FailingFs(|call: &str, path: &Path| {
        (call == "read_dir" && path.ends_with("runtime")).then(emfile)
    });
    let (tree, problems) = read_with(&fs_, root);
    assert_eq!(tree, json!({}));
    assert_eq!(problems.failures[0].path, "runtime");
    // A file removed between the listing and the read is a change, not a failure.
    let fs_ = FailingFs(|call: &str, path: &Path| {
        (call == "read" && path.ends_with("a.yaml"))
            .then(|| io::Error::from(io::ErrorKind::NotFound))
    });
    let (tree, problems) = read_with(&fs_, root);
    assert_eq!(tree, json!({"sub": {"b": 2}}));
    assert_eq!(problems, Problems::default());
}
