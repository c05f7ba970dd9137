use std::fs;

use serde_json::{Value, json};

use super::*;
use crate::apply::ApplyLog;

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
    let log = LogDir::open(tmp.path(), LogLimits::default()).unwrap();
    log.deployment_start(
        "dep1",
        "0123456789abcdef",
        &["web".into()],
        &["web: v1 -> v2".into()],
    );
    let mut role = log.role("web", "dep1").unwrap();
    role.vars(
        json!({"role": "web", "db_password": "hunter2", "nested": {"api_token": "t0k"}, "port": 80})
            .as_object()
            .unwrap(),
    );
    role.action_start("nginx.render.yaml");
    role.line("running: echo hi");
    role.output(b"hi\n");
    role.external_log("vw/app.log", 42);
    role.action_finish("nginx.render.yaml");
    role.finish(&Ok(()));
    log.deployment_finish("dep1", &[]);

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
fn secrets_are_masked_at_any_depth_and_any_case() {
    let masked = mask_secrets(&json!({
        "PASSWORD": "a", "list": [{"SecretKey": "b"}], "keys": ["c"], "plain": "d"
    }));
    assert_eq!(
        masked,
        json!({"PASSWORD": "***", "list": [{"SecretKey": "***"}], "keys": "***", "plain": "d"})
    );
}

#[test]
fn a_full_segment_rotates_and_latest_follows() {
    let tmp = tempfile::tempdir().unwrap();
    let limits = LogLimits {
        segment_size: 200,
        ..LogLimits::default()
    };
    let log = LogDir::open(tmp.path(), limits).unwrap();
    for i in 0..5 {
        let role = log.role("web", &format!("dep{i}")).unwrap();
        role.finish(&Err("x".repeat(150)));
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
    )
    .unwrap();
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
    log.role("web", "dep").unwrap().finish(&Ok(()));
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
    )
    .unwrap();
    log.role("gone", "dep").unwrap().finish(&Ok(()));
    log.role("active", "dep").unwrap().finish(&Ok(()));
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
    log.role("active", "dep2").unwrap().finish(&Ok(()));
    let text = fs::read_to_string(tmp.path().join("active/latest")).unwrap();
    assert!(text.contains("dep2"));
}
