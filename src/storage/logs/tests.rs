use std::fs;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::render::apply::ApplyLog;

fn index_lines(dir: &Path) -> Vec<Value> {
    fs::read_to_string(dir.join(".index/latest"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_deployment_is_indexed_in_verwalter_0_13_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let log = LogDir::open(tmp.path(), LogLimits::default());
    log.deployment_start(
        "dep1",
        "0123456789abcdef",
        &["web".into()],
        &["web: v1 -> v2".into()],
    );
    let mut role = log.role("web", "dep1");
    role.vars(
        None,
        json!({"role": "web", "db_password": "hunter2", "nested": {"api_token": "t0k"}, "port": 80})
            .as_object()
            .unwrap(),
        &[],
    );
    role.action_start("nginx.render.yaml");
    role.line("running: echo hi");
    role.output(b"hi\n");
    role.external_log("vw/app.log", 42);
    role.action_finish("nginx.render.yaml");
    role.finish(&Ok(()));
    log.deployment_finish("dep1", &[], &[]);

    let lines = index_lines(tmp.path());
    let markers: Vec<Value> = lines.iter().map(|l| l[3].clone()).collect();
    assert_eq!(
        markers,
        vec![
            json!("DeploymentStart"),
            json!("DeploymentChanges"),
            json!("RoleStart"),
            json!({"variant": "ActionStart", "fields": ["nginx.render.yaml"]}),
            json!("ExternalLog"),
            json!({"variant": "ActionFinish", "fields": ["nginx.render.yaml"]}),
            json!("RoleFinish"),
            json!("DeploymentFinish"),
        ]
    );
    assert!(lines.iter().all(|l| l[1] == "dep1"));
    assert_eq!(lines[0][2]["variant"], "Global");
    assert_eq!(lines[1][2]["variant"], "Changes");
    let mut lines = lines;
    lines.remove(1);
    assert_eq!(lines[1][2]["variant"], "Role");
    assert_eq!(lines[1][2]["fields"][0], "web");
    assert_eq!(
        lines[3][2],
        json!({"variant": "External", "fields": ["vw/app.log", 42]})
    );
    let time = lines[0][0].as_str().unwrap();
    assert!(time.ends_with('Z') && time.len() == 20, "{time}");

    // The role pointer's offset is where the RoleStart text begins in the named segment.
    let seg = lines[1][2]["fields"][1].as_str().unwrap();
    let offset = lines[1][2]["fields"][2].as_u64().unwrap() as usize;
    let text = fs::read_to_string(tmp.path().join(format!("web/log.{seg}.txt"))).unwrap();
    assert!(text[offset..].contains("dep1 ------------ web: RoleStart -----------"));
    assert!(text.contains("hi\n"));
    assert!(text.contains("result: ok"));
    assert!(!text.contains("hunter2") && !text.contains("t0k"), "{text}");
    assert!(text.contains("\"db_password\": \"***\""));
    assert!(text.contains("\"port\": 80"));
    let changes = fs::read_to_string(tmp.path().join(".changes/latest")).unwrap();
    assert!(
        changes.ends_with(": 01234567: web: v1 -> v2\n"),
        "{changes}"
    );
    let global = fs::read_to_string(tmp.path().join(".global/latest")).unwrap();
    assert!(global.contains("schedule-hash: 0123456789abcdef"));
    assert!(global.contains("DeploymentFinish"));
}

#[test]
fn a_full_segment_rotates_and_latest_follows() {
    let tmp = tempfile::tempdir().unwrap();
    let limits = LogLimits {
        segment_size: 200,
        ..LogLimits::default()
    };
    let log = LogDir::open(tmp.path(), limits);
    for i in 0..5 {
        let role = log.role("web", &format!("dep{i}"));
        role.finish(&Err(
            verwalter_controllers::machinery::ports::ApplyError::Command("x".repeat(150)),
        ));
    }
    let segments: Vec<_> = fs::read_dir(tmp.path().join("web"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("log."))
        .collect();
    assert!(segments.len() >= 2, "{segments:?}");
    let latest = fs::read_link(tmp.path().join("web/latest")).unwrap();
    let text = fs::read_to_string(tmp.path().join("web").join(&latest)).unwrap();
    assert!(text.contains("dep4"));
    // Every index pointer names an existing segment.
    for line in index_lines(tmp.path()) {
        let seg = line[2]["fields"][1].as_str().unwrap();
        assert!(
            tmp.path().join(format!("web/log.{seg}.txt")).exists(),
            "{seg}"
        );
    }
}

#[test]
fn retention_deletes_old_and_excess_segments_but_keeps_latest() {
    let tmp = tempfile::tempdir().unwrap();
    let log = LogDir::open(
        tmp.path(),
        LogLimits {
            segment_size: 1 << 20,
            max_age: Duration::from_secs(3600),
            max_total: 1000,
        },
    );
    let web = tmp.path().join("web");
    fs::create_dir_all(&web).unwrap();
    let old = web.join("log.20200101000000.txt");
    fs::write(&old, "old").unwrap();
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    let big = web.join("log.20260101000000.txt");
    fs::write(&big, vec![b'x'; 2000]).unwrap();
    log.role("web", "dep").finish(&Ok(()));
    let unrelated = web.join("notes.txt");
    fs::write(&unrelated, "keep me").unwrap();

    let deleted = log.retain().unwrap();
    assert_eq!(deleted, 2);
    assert!(!old.exists(), "older than the age limit");
    assert!(!big.exists(), "over the size limit");
    assert!(web.join("latest").exists());
    assert!(
        fs::read_to_string(web.join("latest"))
            .unwrap()
            .contains("RoleFinish")
    );
    assert!(unrelated.exists());
    assert!(tmp.path().join(".index/latest").exists());
}

#[test]
fn a_role_gone_longer_than_the_age_limit_loses_its_log_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let log = LogDir::open(
        tmp.path(),
        LogLimits {
            max_age: Duration::from_secs(3600),
            ..LogLimits::default()
        },
    );
    log.role("gone", "dep").finish(&Ok(()));
    log.role("active", "dep").finish(&Ok(()));
    let gone = tmp.path().join("gone");
    let latest = gone.join(fs::read_link(gone.join("latest")).unwrap());
    File::options()
        .write(true)
        .open(&latest)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(7200))
        .unwrap();
    assert_eq!(log.retain().unwrap(), 1);
    assert!(!gone.exists(), "the whole dir of the old role went");
    assert!(tmp.path().join("active/latest").exists());
    // Writing goes on after a retention pass.
    log.role("active", "dep2").finish(&Ok(()));
    let text = fs::read_to_string(tmp.path().join("active/latest")).unwrap();
    assert!(text.contains("dep2"));
}

#[test]
fn a_role_log_that_cannot_be_opened_is_reported_once_and_clears_when_it_works() {
    let tmp = tempfile::tempdir().unwrap();
    let log = LogDir::open(tmp.path(), LogLimits::default());
    let counter = prometheus::IntCounter::new("errors", "test").unwrap();
    log.count_write_errors(counter.clone());
    assert_eq!(log.problem(), None);
    // A file where the role's log dir should be: as unwritable as a read-only dir, for root too.
    fs::write(tmp.path().join("web"), "in the way").unwrap();
    let mut role = log.role("web", "dep1");
    role.line("dropped");
    role.finish(&Ok(()));
    let problem = log.problem().expect("reported");
    assert!(
        problem.contains("deployment log")
            && problem.contains(&format!("{}/web", tmp.path().display())),
        "{problem}"
    );
    assert_eq!(counter.get(), 1, "the dropped entries are not retried");
    // The other streams still work and do not clear the role's report.
    log.deployment_finish("dep1", &[], &[]);
    assert!(log.problem().is_some());

    fs::remove_file(tmp.path().join("web")).unwrap();
    log.role("web", "dep2").finish(&Ok(()));
    assert_eq!(log.problem(), None);
    let text = fs::read_to_string(tmp.path().join("web/latest")).unwrap();
    assert!(text.contains("dep2") && !text.contains("dep1"), "{text}");
}

#[test]
fn a_full_log_is_reported_like_an_unwritable_one() {
    let tmp = tempfile::tempdir().unwrap();
    let log = LogDir::open(tmp.path(), LogLimits::default());
    // The role's current segment is /dev/full: opening works, every write fails with ENOSPC.
    let dir = tmp.path().join("web");
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink("/dev/full", dir.join("log.20260101000000.txt")).unwrap();
    std::os::unix::fs::symlink("log.20260101000000.txt", dir.join("latest")).unwrap();
    log.role("web", "dep").finish(&Ok(()));
    let problem = log.problem().expect("reported");
    assert!(problem.contains("web"), "{problem}");
}

#[test]
fn a_log_dir_that_is_a_file_is_reported_not_fatal() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("log");
    fs::write(&path, "in the way").unwrap();
    let log = LogDir::open(&path, LogLimits::default());
    let problem = log.problem().expect("reported at open");
    assert!(problem.contains(".index"), "{problem}");
    log.deployment_start("dep", "0123abcd", &["web".into()], &["x".into()]);
    log.role("web", "dep").finish(&Ok(()));
    log.audit("someone pressed a button");
    let problem = log.problem().unwrap();
    let named = ["/.index:", "/.global:", "/.changes:", "/web:"]
        .iter()
        .filter(|stream| problem.contains(*stream))
        .count();
    assert_eq!(named, 3, "{problem}");
    assert!(
        problem.ends_with("; and 1 more"),
        "four streams, three named: {problem}"
    );
}

/// Index lines are byte for byte what 0.13 wrote: `variant` before `fields`, no spaces.
#[test]
fn index_lines_have_0_13_text() {
    let tmp = tempfile::tempdir().unwrap();
    let log = LogDir::open(tmp.path(), LogLimits::default());
    let mut role = log.role("web", "dep1");
    role.action_start("a \"b\".render.yaml");
    drop(role);
    let text = fs::read_to_string(tmp.path().join(".index/latest")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let seg = fs::read_link(tmp.path().join("web/latest")).unwrap();
    let seg = seg.to_str().unwrap();
    let seg = &seg["log.".len()..seg.len() - ".txt".len()];
    let time = &lines[0][2..22];
    assert_eq!(
        lines[0],
        format!(r#"["{time}","dep1",{{"variant":"Role","fields":["web","{seg}",0]}},"RoleStart"]"#)
    );
    assert!(
        lines[1].ends_with(r#"{"variant":"ActionStart","fields":["a \"b\".render.yaml"]}]"#),
        "{}",
        lines[1]
    );
}

/// A log dir verwalter 0.13 left goes on: today's index file gets the new lines after its own,
/// and each stream's `latest` segment continues at its end.
#[test]
fn a_log_dir_0_13_left_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let day = format_utc(SystemTime::now(), DAY);
    let old_line = r#"["2018-08-10T15:11:50Z","p0YD7nkS5Vn29UgAjK0wm5hj",{"variant":"Role","fields":["web","20180810151150",0]},"RoleStart"]"#;
    for stream in [".index", ".global", "web"] {
        fs::create_dir_all(dir.join(stream)).unwrap();
    }
    let index = format!("index.{day}.json");
    fs::write(dir.join(".index").join(&index), format!("{old_line}\n")).unwrap();
    std::os::unix::fs::symlink(&index, dir.join(".index/latest")).unwrap();
    for stream in [".global", "web"] {
        fs::write(
            dir.join(stream).join("log.20180810151150.txt"),
            "old text\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("log.20180810151150.txt", dir.join(stream).join("latest"))
            .unwrap();
    }

    let log = LogDir::open(dir, LogLimits::default());
    log.deployment_start("dep2", "0123456789abcdef", &["web".into()], &[]);
    log.role("web", "dep2").finish(&Ok(()));

    assert_eq!(
        fs::read_link(dir.join(".index/latest")).unwrap(),
        Path::new(&index)
    );
    let lines = index_lines(dir);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[0], serde_json::from_str::<Value>(old_line).unwrap());
    assert_eq!(
        lines[1][2],
        json!({"variant": "Global", "fields": ["20180810151150", 9]}),
        "the global segment continues after 0.13's text"
    );
    assert_eq!(
        lines[2][2],
        json!({"variant": "Role", "fields": ["web", "20180810151150", 9]})
    );
    let text = fs::read_to_string(dir.join("web/log.20180810151150.txt")).unwrap();
    assert!(
        text.starts_with("old text\n") && text[9..].contains("dep2"),
        "{text}"
    );
}

#[test]
fn recent_index_entries_come_back_newest_first_and_from_the_tail_only() {
    let tmp = tempfile::tempdir().unwrap();
    let log = LogDir::open(tmp.path(), LogLimits::default());
    assert_eq!(log.recent_index(10).unwrap(), vec![], "no index yet");
    log.deployment_start("dep1", "0123456789abcdef", &["web".into()], &[]);
    let mut role = log.role("web", "dep1");
    role.action_start("nginx.render.yaml");
    role.finish(&Ok(()));
    log.deployment_finish("dep1", &[], &[]);

    let recent = log.recent_index(3).unwrap();
    let markers: Vec<&str> = recent.iter().map(|e| e.marker.as_str()).collect();
    assert_eq!(markers, ["DeploymentFinish", "RoleFinish", "ActionStart"]);
    assert_eq!(recent[2].action.as_deref(), Some("nginx.render.yaml"));
    assert_eq!(recent[2].role.as_deref(), Some("web"));
    assert!(recent.iter().all(|e| e.deployment_id == "dep1"));
    assert!(recent[0].time.ends_with('Z'));
    let all = log.recent_index(100).unwrap();
    assert_eq!(all.last().unwrap().marker, "DeploymentStart");

    // A long index is read from its end: the first line read is cut and skipped, not misread.
    for i in 0..(RECENT_INDEX_BYTES / 100 + 10) {
        log.deployment_start(&format!("dep-{i:06}"), "0123456789abcdef", &[], &[]);
    }
    let newest = log.recent_index(usize::MAX).unwrap();
    assert!(newest.len() < 3000, "{}", newest.len());
    assert!(newest[0].deployment_id.starts_with("dep-"));
    assert!(newest.iter().all(|e| e.deployment_id.starts_with("dep-")));
}
