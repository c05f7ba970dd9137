//! The first start on a storage dir and a log dir laid out as verwalter 0.13 leaves them: the
//! files are written here by hand from what 0.13 writes (reference §1.1, §3.4–3.5, §6.6), then
//! the daemon (on a copy of `examples/minimal`) must take them over without losing any.

use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

const SOON: Duration = Duration::from_secs(20);

/// The schedule data 0.13 left: `web` pinned to v1 with 5 instances in the scheduler's
/// `state`, which `examples/minimal` carries on from its parent.
const DATA_013: &str = r#"{"changes":["web: pinned to v1"],"nodes":{"alpha":{"roles":{"web":{"instances":5}}}},"roles":{"web":{"frontend":{"kind":"version"},"version":"v1","versions":["v1","v2"]}},"state":{"web":{"instances":5,"pinned":"v1"}},"vars":{"cluster":"demo","template":"minimal/v1"}}"#;
/// SHA-1 of [`DATA_013`] (compact, keys sorted: what 0.13 hashed), computed outside verwalter.
const HASH_013: &str = "634dd84d25236a8eefb7b77ba5b090e27324bb55";
/// 2025-05-10T09:35:23.456Z, when 0.13's leader made it.
const MADE_013: u64 = 1_746_869_723_456;

/// `schedule.json` as 0.13 writes it: rustc-serialize's pretty JSON (two-space indent), fields
/// in the envelope's order.
fn schedule_json_013() -> String {
    format!(
        r#"{{
  "timestamp": {MADE_013},
  "hash": "{HASH_013}",
  "data": {{
    "changes": [
      "web: pinned to v1"
    ],
    "nodes": {{
      "alpha": {{
        "roles": {{
          "web": {{
            "instances": 5
          }}
        }}
      }}
    }},
    "roles": {{
      "web": {{
        "frontend": {{
          "kind": "version"
        }},
        "version": "v1",
        "versions": [
          "v1",
          "v2"
        ]
      }}
    }},
    "state": {{
      "web": {{
        "instances": 5,
        "pinned": "v1"
      }}
    }},
    "vars": {{
      "cluster": "demo",
      "template": "minimal/v1"
    }}
  }},
  "origin": "77985419c732412ea38b94db00000002"
}}"#
    )
}

/// An older schedule, as a backup holds it (gzip of a `schedule.json`).
const OLD_BACKUP: &str = "{\n  \"timestamp\": 1735689600000,\n  \"hash\": \"b325630474f2374cdc7a43388a0a5aeef683adab\",\n  \"data\": {\n    \"nodes\": {},\n    \"roles\": {},\n    \"vars\": {}\n  },\n  \"origin\": \"77985419c732412ea38b94db00000002\"\n}";

fn gzip(text: &str) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap()
}

fn gunzip(path: &Path) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text
}

/// The 36 hourly backups 0.13 keeps (2025-01-01T00 to 2025-01-02T11), a daily and a weekly
/// one: file names in 0.13's `schedule/` dir, oldest first.
fn backups_013() -> Vec<String> {
    let mut names: Vec<String> = (0..36)
        .map(|h| format!("hourly-202501{:02}T{:02}", 1 + h / 24, h % 24))
        .collect();
    names.push("daily-20250101".into());
    names.push("weekly-2025w00".into());
    names
}

/// Index lines of a 0.13 deployment, as rustc-serialize wrote them.
const INDEX_013: &str = r#"["2018-08-10T15:11:50Z","p0YD7nkS5Vn29UgAjK0wm5hj",{"variant":"Global","fields":["20180810151150",0]},"DeploymentStart"]
["2018-08-10T15:11:50Z","p0YD7nkS5Vn29UgAjK0wm5hj",{"variant":"Role","fields":["web","20180810151150",0]},"RoleStart"]
["2018-08-10T15:11:51Z","p0YD7nkS5Vn29UgAjK0wm5hj",{"variant":"Role","fields":["web","20180810151150",154]},"RoleFinish"]
["2018-08-10T15:11:51Z","p0YD7nkS5Vn29UgAjK0wm5hj",{"variant":"Global","fields":["20180810151150",78]},"DeploymentFinish"]
"#;
const GLOBAL_013: &str = "2018-08-10T15:11:50Z p0YD7nkS5Vn29UgAjK0wm5hj ------------ DeploymentStart ----------- \nschedule-hash: 634dd84d\n2018-08-10T15:11:51Z p0YD7nkS5Vn29UgAjK0wm5hj ------------ DeploymentFinish ----------- \n";
const ROLE_013: &str = "2018-08-10T15:11:50Z p0YD7nkS5Vn29UgAjK0wm5hj ------------ web: RoleStart ----------- \nTemplate variables: {\"role\":\"web\"}\nRendered successfully\n";

/// Lays out `storage` and `storage/log` as 0.13 leaves them; returns today's index file name
/// (the one `.index/latest` points to, as 0.13 names them: `index.YYYYMMDD.json`, UTC).
fn lay_out_013(storage: &Path) -> String {
    let schedule = storage.join("schedule");
    std::fs::create_dir_all(&schedule).unwrap();
    std::fs::write(schedule.join("schedule.json"), schedule_json_013()).unwrap();
    let gz = gzip(OLD_BACKUP);
    // One gzip hard-linked under each name, from its `backup.tmp`, as 0.13 did.
    std::fs::write(schedule.join("backup.tmp"), &gz).unwrap();
    for name in backups_013() {
        std::fs::hard_link(
            schedule.join("backup.tmp"),
            schedule.join(format!("{name}.json.gz")),
        )
        .unwrap();
    }

    let log = storage.join("log");
    let today = time::OffsetDateTime::now_utc();
    let index = format!(
        "index.{:04}{:02}{:02}.json",
        today.year(),
        today.month() as u8,
        today.day()
    );
    for dir in [".index", ".global", ".changes", "web"] {
        std::fs::create_dir_all(log.join(dir)).unwrap();
    }
    std::fs::write(log.join(".index/index.20180810.json"), INDEX_013).unwrap();
    std::fs::write(log.join(".index").join(&index), INDEX_013).unwrap();
    symlink(&index, log.join(".index/latest")).unwrap();
    for (dir, text) in [(".global", GLOBAL_013), ("web", ROLE_013), (".changes", "")] {
        std::fs::write(log.join(dir).join("log.20180810151150.txt"), text).unwrap();
        symlink("log.20180810151150.txt", log.join(dir).join("latest")).unwrap();
    }
    // A crash of 0.13 while it replaced a `latest` link.
    symlink("log.20180810151150.txt", log.join("web/latest.tmp")).unwrap();
    index
}

#[test]
fn a_node_upgraded_from_0_13_keeps_its_schedule_backups_and_log() {
    let (_tmp, config, storage) = example_site("minimal");
    let index = lay_out_013(&storage);
    let log = storage.join("log");
    let daemon = Daemon::start(&config, &storage);

    // The schedule 0.13 left is the parent of the first run: web stays pinned at v1 with 5
    // instances (without it, the scheduler picks the newest, v2, with 2).
    let first = daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"] != HASH_013 && s["hash"].is_string()
    });
    assert_eq!(first["data"]["roles"]["web"]["version"], "v1", "{first}");
    assert_eq!(first["data"]["roles"]["web"]["pinned"], "v1");
    assert_eq!(
        first["data"]["nodes"]["alpha"]["roles"]["web"]["instances"],
        5
    );

    // Its backups joined ours under the same names, and retention goes on counting them: the
    // first backup of this hour made the oldest of 0.13's 36 hourly ones go.
    let upgrade_copy = "upgrade-20250510T093523";
    let listed = daemon.wait_json(SOON, "/v1/backups", "no backup of this hour", |b| {
        b.as_array().unwrap().iter().any(|n| {
            let n = n.as_str().unwrap();
            n.starts_with("hourly-") && !n.starts_with("hourly-2025")
        })
    });
    let listed: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let hourly: Vec<&&str> = listed.iter().filter(|n| n.starts_with("hourly-")).collect();
    assert_eq!(hourly.len(), 36, "{listed:?}");
    assert!(!listed.contains(&"hourly-20250101T00"), "{listed:?}");
    for kept in [
        "hourly-20250101T01",
        "hourly-20250102T11",
        "daily-20250101",
        "weekly-2025w00",
    ] {
        assert!(listed.contains(&kept), "{kept} in {listed:?}");
    }
    assert!(listed.contains(&upgrade_copy), "{listed:?}");
    let backups = storage.join("backups");
    assert_eq!(gunzip(&backups.join("daily-20250101")), OLD_BACKUP);
    let copy = gunzip(&backups.join(upgrade_copy));
    assert_eq!(
        copy,
        schedule_json_013(),
        "the schedule 0.13 left, byte for byte, though the first run replaced it"
    );
    let copy: Value = serde_json::from_str(&copy).unwrap();
    assert_eq!(
        copy["data"],
        serde_json::from_str::<Value>(DATA_013).unwrap()
    );
    // Besides schedule.json, only the file it replaced, kept to be written over next time.
    let left: Vec<String> = std::fs::read_dir(storage.join("schedule"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != ".tmp.schedule.json.spare.0")
        .collect();
    assert_eq!(
        left,
        ["schedule.json"],
        "0.13's backups moved, its temp file gone"
    );

    // The deployment log goes on in the same index: 0.13's lines, then ours, in today's file;
    // each stream's segment continues where 0.13 stopped.
    let lines = wait_for(SOON, || {
        let lines = deployment_index(&log);
        lines
            .iter()
            .any(|l| l[3] == "DeploymentFinish" && l[1] != "p0YD7nkS5Vn29UgAjK0wm5hj")
            .then_some(lines)
    })
    .unwrap_or_else(|| panic!("no deployment logged:\n{}", daemon.logs()));
    let old: Vec<Value> = INDEX_013
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let latest = std::fs::read_link(log.join(".index/latest")).unwrap();
    if latest == Path::new(&index) {
        assert_eq!(lines[..4], old[..], "0.13's entries first");
        assert!(lines.len() > 4);
        let (code, body) = daemon.get("/v1/log/index/latest").unwrap();
        assert_eq!(code, 200);
        assert!(
            body.starts_with(INDEX_013),
            "old entries still listed:\n{body}"
        );
    } else {
        // The UTC day turned during the test: today's entries went to a new file, as in 0.13.
        assert_eq!(
            std::fs::read_to_string(log.join(".index").join(&index)).unwrap()[..INDEX_013.len()],
            *INDEX_013
        );
    }
    let (code, body) = daemon.get("/v1/log/index/index.20180810.json").unwrap();
    assert_eq!((code, body.as_str()), (200, INDEX_013));
    let web_start = lines
        .iter()
        .find(|l| l[3] == "RoleStart" && l[2]["fields"][0] == "web" && l[1] != old[1][1])
        .expect("web rendered");
    assert_eq!(
        web_start[2]["fields"],
        serde_json::json!(["web", "20180810151150", ROLE_013.len()]),
        "web's segment continues after 0.13's text"
    );
    let (code, text) = daemon
        .get("/v1/log/role/web/log.20180810151150.txt")
        .unwrap();
    assert_eq!(code, 200);
    assert!(text.starts_with(ROLE_013) && text[ROLE_013.len()..].contains("web: RoleStart"));
    let raw = std::fs::read_to_string(log.join(".index").join(latest)).unwrap();
    assert!(
        raw.contains(r#"{"variant":"Role","fields":["web","20180810151150","#),
        "our lines have 0.13's text:\n{raw}"
    );
    assert!(std::fs::symlink_metadata(log.join("web/latest.tmp")).is_err());

    // What was migrated is logged once; a restart finds nothing more to do and keeps it all.
    assert!(daemon.terminate().success());
    let first_log = std::fs::read_to_string(storage.with_extension("log")).unwrap();
    assert_eq!(
        first_log
            .matches("Upgraded the storage dir verwalter 0.13 left")
            .count(),
        1,
        "{first_log}"
    );
    assert!(first_log.contains(upgrade_copy), "{first_log}");
    assert!(
        first_log
            .lines()
            .any(|l| l.contains("Loaded the stored schedule.") && l.contains(HASH_013)),
        "0.13's schedule.json read, its hash verified:\n{first_log}"
    );
    assert!(first_log.contains("Removed temp links verwalter 0.13 left"));
    let daemon = Daemon::start(&config, &storage);
    let again = daemon.wait_json(SOON, "/v1/schedule", "no schedule after restart", |_| true);
    assert_eq!(again["data"]["roles"]["web"]["version"], "v1");
    let relisted = daemon.json("/v1/backups").unwrap();
    let relisted: Vec<&str> = relisted
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(
        relisted
            .iter()
            .filter(|n| n.starts_with("upgrade-"))
            .count(),
        1,
        "{relisted:?}"
    );
    assert!(daemon.terminate().success());
    let second_log = std::fs::read_to_string(storage.with_extension("log")).unwrap();
    assert!(second_log.contains("Listening."));
    assert!(
        !second_log.contains("verwalter 0.13 left"),
        "nothing more to migrate:\n{second_log}"
    );
}
