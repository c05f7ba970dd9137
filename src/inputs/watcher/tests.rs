//! A read that fails keeps the last good inputs and templates, and shows the failure.

use std::fs;
use std::io;
use std::path::Path;

use serde_json::{Value, json};
use verwalter_controllers::node::StoreWriter;

use super::*;
use crate::inputs::walk::FailingFs;

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn emfile() -> io::Error {
    io::Error::from_raw_os_error(nix::errno::Errno::EMFILE as i32)
}

/// A watcher on `dir` and readers of what it publishes.
fn watcher(
    dir: &Path,
) -> (
    InputsWatcher,
    verwalter_controllers::machinery::store::Reader<Inputs>,
    verwalter_controllers::machinery::store::Reader<Templates>,
    Arc<Metrics>,
) {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    let metrics = Arc::new(Metrics::new());
    let w = InputsWatcher::start(
        dir.to_path_buf(),
        Outputs {
            inputs: writer.inputs,
            templates: writer.templates,
        },
        metrics.clone(),
        WatchConfig::default(),
    );
    (w, store.inputs, store.templates, metrics)
}

#[test]
fn a_failed_read_keeps_the_last_good_inputs_and_reports_the_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    write(root, "scheduler/v1/main.lua", "return {}");
    write(root, "runtime/roles/web.yaml", "version: v1");
    write(root, "runtime/roles/db.yaml", "version: v7");
    write(root, "runtime/broken.yaml", "a: [1\n");
    write(root, "templates/web/v1/web.render.yaml", "commands: []");
    let (mut w, inputs, templates, metrics) = watcher(root);

    let (good, good_templates, failures) = read_all(&RealFs, root);
    assert!(failures.is_empty());
    assert_eq!(good.errors.len(), 1, "the YAML error: {:?}", good.errors);
    w.apply(good.clone(), good_templates.clone(), failures);
    assert_eq!(*inputs.peek(), good);

    // Descriptors run out: listing runtime/roles fails, as does reading templates.
    let starved = FailingFs(|call: &str, path: &Path| {
        let hit = call == "read_dir" && (path.ends_with("roles") || path.ends_with("templates"));
        hit.then(emfile)
    });
    let (partial, partial_templates, failures) = read_all(&starved, root);
    assert_eq!(
        partial.runtime["roles"],
        json!({}),
        "the read alone would drop every role"
    );
    assert!(partial_templates.files.is_empty());
    let failed: Vec<&str> = failures.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(failed, ["runtime/roles", "templates"]);
    w.apply(partial, partial_templates, failures);

    let kept = inputs.peek();
    assert_eq!(kept.runtime, good.runtime, "the last good tree stays");
    assert_eq!(kept.hash, good.hash, "so the scheduler sees no change");
    assert_eq!(*templates.peek(), good_templates);
    let shown: Vec<String> = kept.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(shown.len(), 3, "{shown:#?}");
    assert!(shown[0].starts_with("runtime/broken.yaml:2"), "{shown:#?}");
    assert!(
        shown[1].starts_with("runtime/roles: cannot read: Too many open files"),
        "{shown:#?}"
    );
    assert!(shown[2].starts_with("templates: cannot read"), "{shown:#?}");
    assert_eq!(metrics.input_figures(), (1, 3));

    // Descriptors come back, and meanwhile a role was really removed: a normal change.
    fs::remove_file(root.join("runtime/roles/db.yaml")).unwrap();
    let (inputs_now, templates_now, failures) = read_all(&RealFs, root);
    w.apply(inputs_now, templates_now, failures);
    let now = inputs.peek();
    assert_eq!(now.runtime["roles"], json!({"web": {"version": "v1"}}));
    assert_ne!(now.hash, good.hash);
    assert_eq!(now.errors.len(), 1, "the failure is gone: {:?}", now.errors);
}

#[test]
fn a_first_read_that_fails_leaves_no_inputs_to_schedule_from() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    write(root, "scheduler/v1/main.lua", "return {}");
    write(root, "runtime/a.yaml", "1");
    let (mut w, inputs, _, _) = watcher(root);
    let starved = FailingFs(|call: &str, path: &Path| {
        (call == "read" && path.ends_with("a.yaml")).then(emfile)
    });
    let (partial, templates, failures) = read_all(&starved, root);
    w.apply(partial, templates, failures);
    let kept = inputs.peek();
    // The schedule controller waits for inputs with a hash: none until a good read.
    assert!(kept.hash.is_empty());
    assert_eq!(kept.errors.len(), 1);
    assert_eq!(kept.errors[0].path, "runtime/a.yaml");
}

#[test]
fn the_watch_does_not_follow_links_out_of_the_config_dir() {
    let outside = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    write(root, "runtime/a.yaml", "1");
    std::os::unix::fs::symlink(outside.path(), root.join("runtime/out")).unwrap();
    let (mut w, _, _, _) = watcher(root);
    let events = w.events.as_mut().expect("the config dir is watched");
    // A write outside, then one inside: events arrive in order, so an event for the outside
    // file would come before the marker's.
    fs::write(outside.path().join("x.yaml"), "2").unwrap();
    let marker = root.join("runtime/marker.yaml");
    fs::write(&marker, "3").unwrap();
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains(&marker) {
        assert!(
            std::time::Instant::now() < deadline,
            "no event for {marker:?}: {seen:?}"
        );
        match events.try_recv() {
            Ok((_, paths)) => seen.extend(paths),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    // (A watch through the link would name the file by the link's path.)
    let link = root.join("runtime/out");
    assert!(
        !seen
            .iter()
            .any(|p| p.starts_with(outside.path()) || p.starts_with(&link)),
        "the linked dir outside was watched: {seen:?}"
    );
}

#[tokio::test]
async fn a_dir_that_cannot_be_watched_is_polled() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("config");
    // The dir does not exist yet, so no watch can be set up.
    let (w, mut inputs, _, _) = watcher(&root);
    assert!(w.events.is_none());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(w.run(shutdown.clone()));
    write(&root, "scheduler/v1/main.lua", "return {}");
    write(&root, "runtime/a.yaml", "1");
    // The poll (every 2 s) finds it. Before, `run` ended at once: the
    // failed watcher dropped its event sender, and a closed channel meant shutdown.
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while inputs.get().hash.is_empty() {
            inputs.changed().await;
        }
    })
    .await;
    assert!(found.is_ok(), "the dir was never read");
    assert_eq!(inputs.peek().runtime["a"], json!(1));
    assert!(!task.is_finished());
    shutdown.cancel();
    task.await.unwrap();
}

/// A watcher on `dir` whose quiet time and longest wait are an hour: any read it makes before
/// then was made without a fixed wait.
fn watcher_without_timeouts(
    dir: &Path,
) -> (
    InputsWatcher,
    verwalter_controllers::machinery::store::Reader<Inputs>,
) {
    let writer = StoreWriter::new(None);
    let store = writer.store();
    let w = InputsWatcher::start(
        dir.to_path_buf(),
        Outputs {
            inputs: writer.inputs,
            templates: writer.templates,
        },
        Arc::new(Metrics::new()),
        WatchConfig {
            debounce: Duration::from_secs(3600),
            max_delay: Duration::from_secs(3600),
            resync: Duration::from_secs(3600),
        },
    );
    (w, store.inputs)
}

/// Waits until the inputs' runtime has `key`, and returns its value.
async fn runtime_value(
    inputs: &mut verwalter_controllers::machinery::store::Reader<Inputs>,
    key: &str,
) -> Value {
    loop {
        if let Some(value) = inputs.peek().runtime.get(key) {
            return value.clone();
        }
        inputs.changed().await;
    }
}

/// A file written and closed, or renamed into place, is read at once: no quiet time is waited
/// (it is an hour here). A file still open for writing is not read half-written: the read
/// waits until it is closed.
#[tokio::test]
async fn complete_files_are_read_at_once_and_an_open_one_when_it_is_closed() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    write(root, "scheduler/v1/main.lua", "return {}");
    write(root, "runtime/a.yaml", "1");
    let (mut w, mut inputs) = watcher_without_timeouts(root);
    w.refresh().await;
    assert_eq!(inputs.get().runtime["a"], json!(1));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(w.run(shutdown.clone()));

    // Written in place and closed.
    write(root, "runtime/b.yaml", "2");
    assert_eq!(runtime_value(&mut inputs, "b").await, json!(2));
    // Written under another name, then renamed into place.
    write(root, "runtime/.c.yaml.tmp~", "3");
    fs::rename(
        root.join("runtime/.c.yaml.tmp~"),
        root.join("runtime/c.yaml"),
    )
    .unwrap();
    assert_eq!(runtime_value(&mut inputs, "c").await, json!(3));

    // Half a file, left open: then another complete file. The read that shows the complete
    // one must not have happened while the open one was half written.
    let mut open = fs::File::create(root.join("runtime/d.yaml")).unwrap();
    open.write_all(b"[1, 2,").unwrap();
    open.sync_all().unwrap();
    write(root, "runtime/e.yaml", "5");
    // Closing it ends the wait: one read sees both, whole.
    open.write_all(b" 3]").unwrap();
    drop(open);
    assert_eq!(runtime_value(&mut inputs, "e").await, json!(5));
    let read = inputs.peek();
    assert_eq!(read.runtime["d"], json!([1, 2, 3]), "{:?}", read.errors);
    assert!(read.errors.is_empty(), "{:?}", read.errors);

    shutdown.cancel();
    task.await.unwrap();
}
