//! Rendering end to end: the built daemon on a config dir whose scheduler passes
//! `runtime/schedule.json` through as the schedule, so each test says exactly which schedule is
//! in force. Templates copy their output into an `out/` dir and record each apply in
//! `out/calls.log`, so a test sees what ran.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::*;

const SOON: Duration = Duration::from_secs(15);

struct Site {
    _tmp: tempfile::TempDir,
    config: PathBuf,
    out: PathBuf,
    log_dir: PathBuf,
    daemon: Daemon,
}

/// The scheduler: the schedule is whatever `runtime/schedule.json` says.
pub const PASSTHROUGH: &str = "return {scheduler = function(state)\n  \
    return state.runtime.schedule or {}, 'passthrough'\nend}\n";

/// `service/v1`, the template of docs/graphs.md's `depends_on` example: copies the role's
/// `db_url` (empty without one) into out/<role>.conf, then records the call.
pub fn service_template(config: &Path, out: &Path) {
    let o = out.display();
    replace_file(
        &config.join("templates/service/v1/service.render.yaml"),
        &format!(
            "templates:\n  conf: service.conf.tera\ncommands:\n\
             - !Copy {{src: '{{{{ files.conf }}}}', dest: '{o}/{{{{ role }}}}.conf'}}\n\
             - !Sh 'echo {{{{ role }}}} >> {o}/calls.log'\n"
        ),
    );
    replace_file(
        &config.join("templates/service/v1/service.conf.tera"),
        "{% if db_url is defined %}{{ db_url }}{% endif %}\n",
    );
}

impl Site {
    fn start() -> Site {
        Site::start_args(&[])
    }

    fn start_args(args: &[&str]) -> Site {
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("config");
        let out = tmp.path().join("out");
        std::fs::create_dir_all(config.join("scheduler/v1")).unwrap();
        std::fs::create_dir_all(config.join("runtime")).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(config.join("scheduler/v1/main.lua"), PASSTHROUGH).unwrap();
        let o = out.display();
        // `app`: copy the rendered file into out/<role>.conf, then record the call.
        replace_file(
            &config.join("templates/app/v1/app.render.yaml"),
            &format!(
                "templates:\n  conf: app.conf.hbs\ncommands:\n\
                 - !Copy {{src: '{{{{ files.conf }}}}', dest: '{o}/{{{{ role }}}}.conf'}}\n\
                 - !Sh 'echo {{{{ role }}}} >> {o}/calls.log'\n"
            ),
        );
        replace_file(
            &config.join("templates/app/v1/app.conf.hbs"),
            "BEGIN {{role}}\nvalue: {{value}}\n{{filler}}\nEND\n",
        );
        // `flaky`: fails until out/fixed exists.
        replace_file(
            &config.join("templates/flaky/v1/flaky.render.yaml"),
            &format!(
                "templates:\n  conf: flaky.conf.tera\ncommands:\n\
                 - !Sh 'test -e {o}/fixed'\n\
                 - !Sh 'echo {{{{ role }}}} >> {o}/calls.log'\n"
            ),
        );
        replace_file(
            &config.join("templates/flaky/v1/flaky.conf.tera"),
            "{{ role }} {{ value }}\n",
        );
        // `timed`: fails while out/fail-<role> exists; records its start and end (ns) in
        // out/times.log. With `wait_for` set (rendered into its file, which its command reads) it
        // waits (up to 20 s) until that role has started.
        replace_file(
            &config.join("templates/timed/v1/timed.render.yaml"),
            &format!(
                "templates:\n  conf: timed.conf.hbs\ncommands:\n\
                 - !Sh 'test ! -e {o}/fail-{{{{ role }}}}'\n\
                 - !Sh 'echo start {{{{ role }}}} $(date +%s%N) >> {o}/times.log'\n\
                 - !Sh 'w=$(cat {{{{ files.conf }}}}); for i in $(seq 200); do test -z \"$w\" && break; \
                   grep -q \"^start $w \" {o}/times.log && break; sleep 0.1; done'\n\
                 - !Sh 'echo end {{{{ role }}}} $(date +%s%N) >> {o}/times.log'\n\
                 - !Sh 'echo {{{{ role }}}} >> {o}/calls.log'\n"
            ),
        );
        replace_file(
            &config.join("templates/timed/v1/timed.conf.hbs"),
            "{{wait_for}}",
        );
        service_template(&config, &out);
        let storage = tmp.path().join("storage");
        let log_dir = storage.join("log");
        let daemon = Daemon::launch(&config, &storage, args, &[]);
        Site {
            _tmp: tmp,
            config,
            out,
            log_dir,
            daemon,
        }
    }

    /// Puts `nodes.alpha.roles` = `roles` (and `vars`) in force.
    fn schedule(&self, vars: Value, roles: Value) {
        self.schedule_data(json!({"vars": vars, "nodes": {"alpha": {"roles": roles}}}));
    }

    fn schedule_data(&self, data: Value) {
        replace_file(
            &self.config.join("runtime/schedule.json"),
            &data.to_string(),
        );
        let hash = wait_for(SOON, || {
            let s = self.daemon.json("/v1/schedule")?;
            (s["data"] == data).then(|| s["hash"].as_str().unwrap().to_string())
        });
        assert!(
            hash.is_some(),
            "schedule not taken:\n{}",
            self.daemon.logs()
        );
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.out.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    fn wait_calls(&self, n: usize) -> Vec<String> {
        wait_for(SOON, || {
            let calls = self.calls();
            (calls.len() >= n).then_some(calls)
        })
        .unwrap_or_else(|| {
            panic!(
                "expected {n} calls, got {:?}\n{}",
                self.calls(),
                self.daemon.logs()
            )
        })
    }

    fn status(&self) -> Value {
        self.daemon.json("/v1/status").unwrap()
    }

    /// Index lines of the deployment log.
    fn index(&self) -> Vec<Value> {
        deployment_index(&self.log_dir)
    }

    /// The index lines of role starts, oldest first.
    fn role_starts(&self) -> Vec<Value> {
        let mut index = self.index();
        index.retain(|l| l[3] == "RoleStart");
        index
    }

    /// What the `app` template copied out for `role`.
    fn conf(&self, role: &str) -> String {
        std::fs::read_to_string(self.out.join(format!("{role}.conf"))).unwrap()
    }

    /// POST /v1/force_render_all, which must be accepted.
    fn force_render_all(&self) {
        let port = self.daemon.port;
        let (code, body) = http_post(port, "/v1/force_render_all", "application/json", b"");
        assert_eq!((code, body.as_str()), (200, "\"ok\""));
    }
}

#[test]
fn a_change_rerenders_only_that_role_and_force_render_all_renders_all() {
    let site = Site::start();
    let app = json!({"template": "app/v1", "value": 1});
    site.schedule(json!({}), json!({"web": app, "db": app}));
    let mut calls = site.wait_calls(2);
    calls.sort();
    assert_eq!(calls, vec!["db", "web"], "each role applied once");
    let web = site.conf("web");
    assert!(web.starts_with("BEGIN web\nvalue: 1\n"), "{web}");
    let first_ids: Vec<String> = site
        .role_starts()
        .iter()
        .map(|l| l[1].as_str().unwrap().to_string())
        .collect();
    assert_eq!(first_ids.len(), 2);
    assert_eq!(first_ids[0], first_ids[1], "one deployment id for the pass");

    // Only web's variables change: only web renders, under a new deployment id.
    site.schedule(
        json!({}),
        json!({"web": {"template": "app/v1", "value": 2}, "db": app}),
    );
    let calls = site.wait_calls(3);
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(calls[2], "web", "only web rendered again: {calls:?}");
    let web = site.conf("web");
    assert!(web.contains("value: 2"), "{web}");
    let role_starts = site.role_starts();
    assert_eq!(role_starts.len(), 3);
    assert_eq!(role_starts[2][2]["fields"][0], "web");
    assert_ne!(role_starts[2][1], json!(first_ids[0]));
    let web_log = std::fs::read_to_string(site.log_dir.join("web/latest")).unwrap();
    assert!(
        web_log.contains("\n  changed value: 1 -> 2\n"),
        "the change of variables is logged: {web_log}"
    );

    // A new schedule that changes nothing for this node renders nothing here: once the render
    // controller has looked at both roles under it (two passes after the change, none running
    // or waiting), no new apply has run.
    let passes = |name: &str| {
        let series = format!("verwalter_controller_{name}{{controller=\"render\"}}");
        metric(site.daemon.port, &series)
    };
    let before = passes("passes_total").unwrap();
    site.schedule_data(json!({"vars": {}, "nodes": {
        "alpha": {"roles": {"web": {"template": "app/v1", "value": 2}, "db": app}},
        "beta": {"roles": {"other": app}},
    }}));
    let looked = wait_for(SOON, || {
        let settled = passes("passes_total")? >= before + 2.0
            && passes("running")? == 0.0
            && passes("waiting")? == 0.0;
        settled.then_some(())
    });
    assert!(looked.is_some(), "render passes:\n{}", site.daemon.logs());
    assert_eq!(site.calls().len(), 3, "{:?}", site.calls());

    // force_render_all renders every role again.
    let before = site.calls().len();
    site.force_render_all();
    let calls = site.wait_calls(before + 2);
    let mut last_two = calls[before..].to_vec();
    last_two.sort();
    assert!(last_two.contains(&"db".to_string()) && last_two.contains(&"web".to_string()));
    assert_eq!(site.status()["failed_roles"], json!([]));
}

/// A role with 1 MiB of variables: its first attempt logs them by key with the big value as a
/// digest; each change logs only the paths that changed, not the megabyte again.
#[test]
fn a_big_roles_log_grows_by_what_changed_not_by_its_variables() {
    let site = Site::start();
    let services = |image: &str| -> Value {
        let pad = "p".repeat(1000);
        let mut services = serde_json::Map::new();
        for i in 0..1000 {
            let image = if i == 7 { image } else { "svc:1" };
            services.insert(format!("s{i}"), json!({"image": image, "pad": pad}));
        }
        Value::Object(services)
    };
    let web = |value: u32, image: &str| {
        let config = json!({"services": services(image)});
        json!({"web": {"template": "app/v1", "value": value, "config": config}})
    };
    let big = serde_json::to_vec(&web(1, "svc:1")).unwrap().len();
    assert!(big > 1_000_000, "{big}");
    // The role log after `n` finished attempts.
    let log_after = |n: usize| {
        let read = || std::fs::read_to_string(site.log_dir.join("web/latest")).ok();
        wait_for(SOON, || {
            read().filter(|t| t.matches("result: ok").count() >= n)
        })
        .unwrap_or_else(|| panic!("{n} attempts of web:\n{}", read().unwrap_or_default()))
    };

    site.schedule(json!({}), web(1, "svc:1"));
    let first = log_after(1);
    site.schedule(json!({}), web(2, "svc:2"));
    let second = log_after(2);
    site.schedule(json!({}), web(2, "svc:3"));
    let third = log_after(3);
    let grown = [second.len() - first.len(), third.len() - second.len()];
    eprintln!(
        "role log: first attempt {} bytes, then {grown:?} per change ({big} bytes of variables)",
        first.len()
    );
    assert!(
        first.contains("Template variables (")
            && first.contains("\"config\": \"<object, ")
            && first.contains("the whole: GET /v1/roles_data, to_render.web)"),
        "{}",
        &first[..first.len().min(2000)]
    );
    assert!(first.contains("\"value\": 1"), "{first}");

    assert!(
        grown.iter().all(|g| *g < big / 100),
        "{grown:?} of {big}:\n{}",
        &third[second.len()..]
    );
    let change = &second[first.len()..];
    assert!(
        change.contains("\n  changed config.services.s7.image: \"svc:1\" -> \"svc:2\"\n")
            && change.contains("\n  changed value: 1 -> 2\n"),
        "{change}"
    );
    assert!(
        third[second.len()..].contains("Template variables: 1 change since deployment "),
        "{}",
        &third[second.len()..]
    );
    // The whole variables are where the log says.
    let roles = site.daemon.json("/v1/roles_data").unwrap();
    assert_eq!(
        roles["to_render"]["web"]["config"]["services"]["s7"]["image"],
        "svc:3"
    );
}

#[test]
fn dry_run_renders_and_logs_but_runs_and_records_nothing() {
    let mut site = Site::start_args(&["--dry-run"]);
    site.schedule(
        json!({}),
        json!({"web": {"template": "app/v1", "value": 1}}),
    );
    let log = wait_for(SOON, || {
        let text = std::fs::read_to_string(site.log_dir.join("web/latest")).ok()?;
        text.contains("RoleFinish").then_some(text)
    })
    .unwrap_or_else(|| panic!("no role log:\n{}", site.daemon.logs()));
    assert!(log.contains("would copy"), "{log}");
    assert!(log.contains("would run: "), "{log}");
    assert!(site.calls().is_empty(), "nothing ran");
    assert!(!site.out.join("web.conf").exists(), "nothing written");

    // The same storage dir without --dry-run: the role was never applied, so it renders now.
    let storage = site.log_dir.parent().unwrap().to_path_buf();
    site.daemon.child.kill().unwrap();
    site.daemon.child.wait().unwrap();
    site.daemon = Daemon::launch(&site.config, &storage, &[], &[]);
    assert_eq!(site.wait_calls(1), vec!["web"]);
    assert!(site.out.join("web.conf").exists());
}

#[test]
fn a_failing_role_is_shown_retried_and_recovers_without_a_new_schedule() {
    let site = Site::start();
    site.schedule(
        json!({}),
        json!({"web": {"template": "app/v1", "value": 1}, "flaky": {"template": "flaky/v1", "value": 1}}),
    );
    site.wait_calls(1);
    let status = wait_for(SOON, || {
        let s = site.status();
        (s["failed_roles"] == json!(["flaky"])).then_some(s)
    })
    .unwrap_or_else(|| panic!("flaky never failed: {}", site.status()));
    let error = status["errors"]["role flaky"].as_str().unwrap();
    assert!(
        error.contains("flaky.render.yaml") && error.contains("exited with status 1"),
        "{error}"
    );
    assert!(status["num_errors"].as_u64().unwrap() >= 1);
    assert_eq!(site.calls(), vec!["web"], "the other role went on");
    let metrics = site.daemon.get("/metrics").unwrap().1;
    assert!(metrics.contains("verwalter_roles_failing 1"), "{metrics}");
    assert!(metrics.contains("verwalter_role_failed_attempts{role=\"flaky\"}"));

    // Fixing the cause is enough: the backoff retry picks it up.
    std::fs::write(site.out.join("fixed"), "").unwrap();
    let calls = site.wait_calls(2);
    assert_eq!(calls, vec!["web", "flaky"]);
    wait_for(SOON, || {
        (site.status()["failed_roles"] == json!([])).then_some(())
    })
    .expect("failure cleared");
    let flaky_log = std::fs::read_to_string(site.log_dir.join("flaky/latest")).unwrap();
    assert!(flaky_log.contains("result: error"), "{flaky_log}");
    assert!(flaky_log.trim_end().ends_with("result: ok"), "{flaky_log}");
}

#[test]
fn hostile_schedules_run_nothing_and_write_nothing_outside_the_roles_files() {
    let site = Site::start();
    let pwned = site.out.join("pwned");
    let p = pwned.display();
    let evil_value = format!("$(touch {p}1) `touch {p}2` ; touch {p}3 ' \" \n");
    let roles = json!({
        // Unsafe as file names: refused with a clear error.
        format!("../../{p}4"): {"template": "app/v1"},
        "..": {"template": "app/v1"},
        ".index": {"template": "app/v1"},
        // Safe as file names, hostile in a shell: quoted, never run.
        format!("$(touch {p}5)x").replace('/', "_"): {"template": "app/v1", "value": evil_value},
        "`touch pwned6`": {"template": "app/v1", "value": evil_value},
        "a;touch pwned7": {"template": "app/v1", "value": evil_value},
        // A template path out of templates/.
        "escape": {"template": "../../../etc"},
        "abs": {"template": "/etc"},
    });
    site.schedule(json!({"filler": "$(touch /tmp/verwalter-pwned)"}), roles);
    let calls = site.wait_calls(3);
    let mut calls = calls;
    calls.sort();
    assert_eq!(
        calls,
        vec![
            format!("$(touch {p}5)x").replace('/', "_"),
            "`touch pwned6`".into(),
            "a;touch pwned7".into()
        ],
        "the role name reaches the command as one quoted word"
    );
    let failed = wait_for(SOON, || {
        let s = site.status();
        (s["failed_roles"].as_array()?.len() == 5).then_some(s)
    })
    .unwrap_or_else(|| panic!("{}", site.status()));
    let errors = failed["errors"].to_string();
    assert!(errors.contains("role name"), "{errors}");
    assert!(errors.contains("template"), "{errors}");
    for i in 1..=7 {
        assert!(!site.out.join(format!("pwned{i}")).exists(), "pwned{i}");
    }
    assert!(!Path::new("/tmp/verwalter-pwned").exists());
    // Everything written is inside out/: the conf files and calls.log.
    let mut written: Vec<String> = std::fs::read_dir(&site.out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    written.sort();
    assert_eq!(written.len(), 4, "{written:?}");
    let conf = std::fs::read_to_string(site.out.join("a;touch pwned7.conf")).unwrap();
    assert!(
        conf.contains(&evil_value),
        "values are rendered verbatim: {conf}"
    );
    let parent: Vec<_> = std::fs::read_dir(site.out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        parent
            .iter()
            .all(|n| ["config", "out", "storage", "storage.log"].contains(&n.as_str())),
        "{parent:?}"
    );
}

#[test]
fn a_reader_never_sees_a_partial_or_missing_file_during_renders() {
    let site = Site::start();
    let filler = "x".repeat(200_000);
    site.schedule(
        json!({"filler": filler}),
        json!({"web": {"template": "app/v1", "value": 0}}),
    );
    site.wait_calls(1);
    let path = site.out.join("web.conf");
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let path = path.clone();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let text = std::fs::read_to_string(&path).expect("the file is always there");
                assert!(
                    text.starts_with("BEGIN web\n") && text.ends_with("END\n"),
                    "a partial file: {} bytes",
                    text.len()
                );
                reads += 1;
            }
            reads
        })
    };
    for i in 1..=15 {
        site.schedule(
            json!({"filler": filler}),
            json!({"web": {"template": "app/v1", "value": i}}),
        );
        site.wait_calls(1 + i);
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().expect("the reader saw only whole files");
    assert!(reads > 15, "the reader kept reading ({reads} reads)");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("value: 15"));
}

/// GET with extra header lines; status, lower-cased head and body.
fn get_with(port: u16, path: &str, headers: &str) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: verwalter\r\n{headers}\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, head, raw[split + 4..].to_vec())
}

#[test]
fn logs_and_backups_are_served_with_ranges_and_no_way_out() {
    let site = Site::start();
    site.schedule(
        json!({}),
        json!({"web": {"template": "app/v1", "value": 1}}),
    );
    site.wait_calls(1);
    // The pass ends after the role's last command: wait for it, so the index stops growing.
    wait_for(SOON, || {
        site.index()
            .iter()
            .any(|l| l[3] == "DeploymentFinish")
            .then_some(())
    })
    .expect("the deployment finished");
    let port = site.daemon.port;

    // The index, whole and by range; 0.13's UI reads its tail with `Range: bytes=-N`.
    let (code, _, whole) = get_with(port, "/v1/log/index/latest", "");
    assert_eq!(code, 200);
    let text = String::from_utf8(whole.clone()).unwrap();
    assert!(text.contains("\"RoleStart\""), "{text}");
    let (code, head, tail) = get_with(port, "/v1/log/index/latest", "Range: bytes=-20\r\n");
    assert_eq!(code, 206, "{head}");
    assert_eq!(tail, whole[whole.len() - 20..]);
    assert!(head.contains("content-range: bytes"), "{head}");
    // The last MiB of a smaller file is the whole file, not a 416.
    let (code, head, all) = get_with(port, "/v1/log/index/latest", "Range: bytes=-1048576\r\n");
    assert!(code == 200 || code == 206, "{code} {head}");
    assert_eq!(all, whole);
    let (code, _, role) = get_with(port, "/v1/log/role/web/latest", "");
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&role).contains("result: ok"));
    let (code, _, global) = get_with(port, "/v1/log/global/latest", "");
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&global).contains("DeploymentStart"));

    // No way out: `..`, encoded or not, unsafe role names, symlinks leading out.
    for path in [
        "/v1/log/index/..%2F..%2Fschedule%2Fschedule.json",
        "/v1/log/role/..%2F.index/latest",
        "/v1/log/role/web/..%2F..%2Fstorage.log",
        "/v1/log/nope/latest",
    ] {
        let (code, _, _) = get_with(port, path, "");
        assert_eq!(code, 404, "{path}");
    }
    std::os::unix::fs::symlink("/etc/passwd", site.log_dir.join(".global/escape")).unwrap();
    let (code, _, body) = get_with(port, "/v1/log/global/escape", "");
    assert_eq!(code, 403, "{}", String::from_utf8_lossy(&body));
    let (code, _, _) = get_with(port, "/v1/log/external/unknown/x.log", "");
    assert_eq!(code, 403);

    // Backups: listed, and each one a gzip of the schedule.
    let names: Vec<String> = wait_for(SOON, || {
        let list: Vec<String> = serde_json::from_value(site.daemon.json("/v1/backups")?).ok()?;
        (list.len() == 3).then_some(list)
    })
    .expect("hourly, daily and weekly backups");
    let daily = names.iter().find(|n| n.starts_with("daily-")).unwrap();
    let (code, head, body) = get_with(port, &format!("/v1/backup/{daily}"), "");
    assert_eq!(code, 200);
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(&body[..2], &[0x1f, 0x8b], "gzip magic");
    let (code, _, _) = get_with(port, "/v1/backup/..", "");
    assert_eq!(code, 404);
}

#[test]
fn a_restart_with_a_stored_schedule_renders_without_a_missing_template_error() {
    let site = Site::start();
    let roles = |value| json!({"web": {"template": "app/v1", "value": value}});
    site.schedule(json!({}), roles(1));
    site.wait_calls(1);
    let Site {
        _tmp,
        config,
        out,
        log_dir,
        daemon,
    } = site;
    assert!(daemon.terminate().success());
    // Enough runtime files that reading them takes longer than starting the controllers.
    for i in 0..3000 {
        replace_file(&config.join(format!("runtime/bulk/f{i}.yaml")), "x: 1\n");
    }
    // The restart starts with the stored schedule. Rendering used to start before the first
    // read of the config dir and logged every role's template dir as missing.
    let storage = log_dir.parent().unwrap().to_path_buf();
    let daemon = Daemon::launch(&config, &storage, &[], &[]);
    let site = Site {
        _tmp,
        config,
        out,
        log_dir,
        daemon,
    };
    // A render after the restart comes after any render of the stored schedule at start.
    site.schedule(json!({}), roles(2));
    let calls = site.wait_calls(2);
    assert_eq!(calls, ["web", "web"]);
    let logs = site.daemon.logs();
    assert!(logs.contains("Loaded the stored schedule."), "{logs}");
    assert!(!logs.contains("missing or empty"), "{logs}");
    assert!(site.status()["errors"].as_object().unwrap().is_empty());
}

#[test]
fn role_names_match_literally_in_clean_files_patterns() {
    let site = Site::start();
    let o = site.out.display();
    replace_file(
        &site.config.join("templates/clean/v1/clean.render.yaml"),
        &format!(
            "templates:\n  keep: keep.hbs\ncommands:\n\
             - !CleanFiles {{pattern: '{o}/clean/{{{{ role }}}}/(*).conf', keep-list: '{{{{ files.keep }}}}'}}\n\
             - !Sh 'echo {{{{ role }}}} >> {o}/calls.log'\n"
        ),
    );
    replace_file(&site.config.join("templates/clean/v1/keep.hbs"), "keep\n");
    replace_file(&site.out.join("clean/victim/important.conf"), "precious");
    for role in ["*", "a(b)"] {
        replace_file(&site.out.join(format!("clean/{role}/keep.conf")), "x");
        replace_file(&site.out.join(format!("clean/{role}/old.conf")), "x");
    }
    let clean = json!({"template": "clean/v1"});
    site.schedule(json!({}), json!({"*": clean, "a(b)": clean}));
    let mut calls = site.wait_calls(2);
    calls.sort();
    assert_eq!(calls, vec!["*", "a(b)"], "{}", site.status());
    assert_eq!(
        std::fs::read_to_string(site.out.join("clean/victim/important.conf")).unwrap(),
        "precious",
        "a role named * cleans only its own dir"
    );
    for role in ["*", "a(b)"] {
        let dir = site.out.join(format!("clean/{role}"));
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["keep.conf"], "{role}");
    }
    assert_eq!(site.status()["failed_roles"], json!([]));
}

#[test]
fn roles_apply_when_the_deployment_log_cannot_be_written_and_it_is_reported() {
    let site = Site::start();
    // A file where web's log dir should be: unwritable even for root (tests run as root).
    std::fs::create_dir_all(&site.log_dir).unwrap();
    let blocker = site.log_dir.join("web");
    std::fs::write(&blocker, "in the way").unwrap();
    site.schedule(
        json!({}),
        json!({"web": {"template": "app/v1", "value": 1}}),
    );
    assert_eq!(
        site.wait_calls(1),
        vec!["web"],
        "web applied without its log"
    );
    assert!(site.out.join("web.conf").exists());
    let status = wait_for(SOON, || {
        let s = site.status();
        s["errors"].get("deployment_log").is_some().then_some(s)
    })
    .unwrap_or_else(|| panic!("not reported: {}\n{}", site.status(), site.daemon.logs()));
    let error = status["errors"]["deployment_log"].as_str().unwrap();
    assert!(error.contains(&blocker.display().to_string()), "{error}");
    assert_eq!(status["failed_roles"], json!([]));
    assert!(status["num_errors"].as_u64().unwrap() >= 1);

    // Another deployment: applied again, counted again, but logged only once.
    site.force_render_all();
    site.wait_calls(2);
    let errors = metric(
        site.daemon.port,
        "verwalter_deployment_log_write_errors_total",
    );
    assert!(errors.is_some_and(|n| n >= 2.0), "{errors:?}");
    let logged = site
        .daemon
        .logs()
        .matches("Cannot write the deployment log")
        .count();
    assert_eq!(logged, 1, "{}", site.daemon.logs());

    // Fixed: the next deployment writes the log and the report goes.
    std::fs::remove_file(&blocker).unwrap();
    site.force_render_all();
    site.wait_calls(3);
    wait_for(SOON, || {
        site.status()["errors"]
            .get("deployment_log")
            .is_none()
            .then_some(())
    })
    .unwrap_or_else(|| panic!("still reported: {}", site.status()));
    let web_log = std::fs::read_to_string(site.log_dir.join("web/latest")).unwrap();
    assert!(web_log.contains("result: ok"), "{web_log}");
}

/// `(start, end)` in ns of each role's last run, from out/times.log.
fn times(site: &Site) -> std::collections::HashMap<String, (u128, u128)> {
    let text = std::fs::read_to_string(site.out.join("times.log")).unwrap_or_default();
    let mut out = std::collections::HashMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let entry = out.entry(parts[1].to_string()).or_insert((0, 0));
        let at: u128 = parts[2].parse().unwrap();
        if parts[0] == "start" {
            entry.0 = at;
        } else {
            entry.1 = at;
        }
    }
    out
}

/// `first` <- `second` <- `third` (each depends on the one before) and `solo`, which waits in
/// its command until `third` has started: it can only finish if the chain runs beside it.
fn chain_roles() -> Value {
    json!({
        "first": {"template": "timed/v1"},
        "second": {"template": "timed/v1", "depends_on": ["first"]},
        "third": {"template": "timed/v1", "depends_on": ["second"]},
        "solo": {"template": "timed/v1", "wait_for": "third"},
    })
}

#[test]
fn a_dependency_chain_applies_in_order_while_an_independent_role_overlaps_it() {
    let site = Site::start();
    site.schedule(json!({"wait_for": ""}), chain_roles());
    let mut calls = site.wait_calls(4);
    calls.sort();
    assert_eq!(calls, vec!["first", "second", "solo", "third"]);
    let t = times(&site);
    assert!(
        t["first"].1 <= t["second"].0,
        "second started before first ended: {t:?}"
    );
    assert!(
        t["second"].1 <= t["third"].0,
        "third started before second ended: {t:?}"
    );
    assert!(
        t["solo"].0 < t["third"].0 && t["third"].0 < t["solo"].1,
        "solo did not run beside the chain: {t:?}"
    );
    let status = site.status();
    assert_eq!(status["blocked_roles"], json!({}));
    assert_eq!(status["last_deployment"]["blocked"], json!([]));
}

#[test]
fn a_failing_middle_role_blocks_only_its_dependents_and_its_fix_resumes_the_chain() {
    let site = Site::start();
    std::fs::write(site.out.join("fail-second"), "").unwrap();
    let roles = json!({
        "first": {"template": "timed/v1"},
        "second": {"template": "timed/v1", "depends_on": ["first"]},
        "third": {"template": "timed/v1", "depends_on": ["second"]},
        "solo": {"template": "timed/v1"},
    });
    site.schedule(json!({"wait_for": ""}), roles);
    let status = wait_for(SOON, || {
        let s = site.status();
        (s["blocked_roles"]["third"]["state"] == "blocked").then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "third never blocked: {}\n{}",
            site.status(),
            site.daemon.logs()
        )
    });
    assert_eq!(status["failed_roles"], json!(["second"]));
    assert_eq!(status["blocked_roles"]["third"]["on"], json!(["second"]));
    assert_eq!(
        status["blocked_roles"]["third"]["reason"],
        "depends on second, which failed or is blocked"
    );
    let mut calls = site.wait_calls(2);
    calls.sort();
    assert_eq!(calls, vec!["first", "solo"], "third never ran");
    let metrics = site.daemon.get("/metrics").unwrap().1;
    assert!(
        metrics.contains("verwalter_roles_held{state=\"blocked\"} 1"),
        "{metrics}"
    );
    // The pass ends with second failed and third blocked, and the log says why.
    let last = wait_for(SOON, || {
        let d = site.status()["last_deployment"].clone();
        d["finished"].is_u64().then_some(d)
    })
    .expect("the pass finished");
    assert_eq!(last["failed"], json!(["second"]));
    assert_eq!(last["blocked"], json!(["third"]));
    let global = std::fs::read_to_string(site.log_dir.join(".global/latest")).unwrap();
    assert!(
        global.contains("blocked role third: depends on second, which failed or is blocked"),
        "{global}"
    );
    // The frontend: the role list marks third blocked, its page says on what.
    let browser = crate::webdriver::Browser::start();
    browser.goto(&format!(
        "http://127.0.0.1:{}/roles/third",
        site.daemon.port
    ));
    // (The page redraws as the status streams in: each check waits for its own text.)
    browser.wait_for_text("#role-held", "Blocked on this node", SOON);
    browser.wait_for_text(
        "#role-held",
        "depends on second, which failed or is blocked",
        SOON,
    );
    browser.wait_for_text("#role-held a[href='/roles/second']", "second", SOON);
    browser.wait_for_text("a[href='/roles/third']", "blocked", SOON);
    browser.screenshot(&crate::webdriver::screenshot_dir().join("render-blocked-role.png"));

    // The fix, and nothing else: the retry of second applies it, which wakes third.
    std::fs::remove_file(site.out.join("fail-second")).unwrap();
    let calls = site.wait_calls(4);
    assert_eq!(&calls[2..], ["second", "third"]);
    wait_for(SOON, || {
        let s = site.status();
        (s["blocked_roles"] == json!({}) && s["failed_roles"] == json!([])).then_some(())
    })
    .expect("nothing held back once second applied");
}

/// Issue 29: docs/graphs.md's `depends_on` example gave `database` no host or port, so `app`
/// failed on `$(database.host) finds nothing` instead of becoming what the text says. The
/// example runs here exactly as written (read from the doc), under the doc's `render:` settings:
/// `network` and `metrics` first, `database` after `network`, `app` after `database`, with its
/// `db_url` resolved.
#[test]
fn the_depends_on_example_of_the_docs_runs_as_the_docs_say() {
    let settings_dir = tempfile::tempdir().unwrap();
    let settings = settings_dir.path().join("settings.yaml");
    std::fs::write(
        &settings,
        doc_block(
            "graphs.md",
            "### What a failure holds back: `render.dependency-failure`",
            "yaml",
        ),
    )
    .unwrap();
    let site = Site::start_args(&["--settings", settings.to_str().unwrap()]);
    let example: Value = serde_json::from_str(&doc_block(
        "graphs.md",
        "## Roles in dependency order (`depends_on`)",
        "json",
    ))
    .unwrap();
    site.schedule_data(example);
    let calls = site.wait_calls(4);
    let at = |role: &str| calls.iter().position(|c| c == role).unwrap();
    assert!(
        at("network") < at("database") && at("database") < at("app"),
        "{calls:?}"
    );
    assert_eq!(site.conf("app"), "pg://10.0.0.5:5432/app\n");
    let status = site.status();
    assert_eq!(status["failed_roles"], json!([]), "{status}");
    assert_eq!(status["blocked_roles"], json!({}), "{status}");
}

/// Issue 29: the Overview's roles card showed blocked and waiting roles as `ok`, and a role's
/// page named only the direct dependency, with a gap before the `)` after it (`database )`).
/// `third` depends on `second`, which depends on `first`, which fails; `late` waits for `slow`,
/// which runs until the test lets it finish.
#[test]
fn the_frontend_shows_held_roles_on_the_overview_and_the_root_cause_on_a_role_page() {
    let site = Site::start();
    std::fs::write(site.out.join("fail-first"), "").unwrap();
    let browser = crate::webdriver::Browser::start();
    site.schedule(
        json!({"wait_for": ""}),
        json!({
            "first": {"template": "timed/v1"},
            "second": {"template": "timed/v1", "depends_on": ["first"]},
            "third": {"template": "timed/v1", "depends_on": ["second"]},
            "slow": {"template": "timed/v1", "wait_for": "go"},
            "late": {"template": "timed/v1", "depends_on": ["slow"]},
        }),
    );
    let status = wait_for(SOON, || {
        let s = site.status();
        let held = &s["blocked_roles"];
        (held["third"]["root_cause"] == json!(["first"]) && held["late"]["state"] == "waiting")
            .then_some(s)
    })
    .unwrap_or_else(|| panic!("{}\n{}", site.status(), site.daemon.logs()));
    assert_eq!(status["blocked_roles"]["third"]["on"], json!(["second"]));
    assert_eq!(
        status["blocked_roles"]["late"]["root_cause"],
        json!(["slow"])
    );

    let base = format!("http://127.0.0.1:{}", site.daemon.port);
    browser.goto(&format!("{base}/"));
    for (role, mark) in [
        ("first", "failing"),
        ("second", "blocked"),
        ("third", "blocked"),
        ("late", "waiting"),
        ("slow", "ok"),
    ] {
        browser.wait_for_text(&format!("#roles-table tr[data-role='{role}']"), mark, SOON);
    }
    browser.wait_for_text(
        "#roles-table tr[data-role='third'] a[href='/roles/third']",
        "blocked",
        SOON,
    );
    browser.screenshot(&crate::webdriver::screenshot_dir().join("render-overview-held-roles.png"));

    browser.goto(&format!("{base}/roles/third"));
    browser.wait_for_text(
        "#role-held",
        "depends on second, which failed or is blocked (depends_on: second). Root cause: first failed.",
        SOON,
    );
    browser.wait_for_text("#role-root-cause a[href='/roles/first']", "first", SOON);
    // No gap between the dependency's name and the `)` after it.
    let gap = browser.execute(
        "const a = document.querySelector(\"#role-held a[href='/roles/second']\");
         let n = a; while (!n.nextSibling) n = n.parentNode;
         const r = document.createRange(); r.setStart(n.nextSibling, 0); r.setEnd(n.nextSibling, 1);
         return [r.toString(), r.getBoundingClientRect().left - a.getBoundingClientRect().right];",
        vec![],
    );
    assert_eq!(gap[0], ")", "{gap}");
    assert!(
        gap[1].as_f64().unwrap().abs() < 1.0,
        "a gap before `)`: {gap}"
    );
    browser.screenshot(&crate::webdriver::screenshot_dir().join("render-root-cause.png"));
    browser.goto(&format!("{base}/roles/late"));
    browser.wait_for_text("#role-held", "Waiting on this node", SOON);
    browser.wait_for_text(
        "#role-held",
        "waits for slow to apply (depends_on: slow)",
        SOON,
    );

    // slow may finish now; late follows it.
    let mut times = std::fs::OpenOptions::new()
        .append(true)
        .open(site.out.join("times.log"))
        .unwrap();
    writeln!(times, "start go 0").unwrap();
    wait_for(SOON, || {
        let calls = site.calls();
        calls.contains(&"late".to_string()).then_some(())
    })
    .unwrap_or_else(|| panic!("late never applied: {:?}", site.calls()));
}

/// Issue 29: roles `x` and `y` depending on each other failed about 977,000 times in 35 s and
/// logged 388 MB. Now each fails under the backoff (about 1, 2, 4 s apart) and its repeated error
/// is logged once. The third attempt of each is the event that must come after: by then each has
/// one "Reconcile failed." line, and the role beside them applied.
#[test]
fn a_dependency_cycle_retries_under_backoff_and_logs_its_error_once() {
    let site = Site::start();
    site.schedule(
        json!({"value": 1, "filler": ""}),
        json!({
            "x": {"template": "app/v1", "depends_on": ["y"]},
            "y": {"template": "app/v1", "depends_on": ["x"]},
            "w": {"template": "app/v1"},
        }),
    );
    let port = site.daemon.port;
    let attempts = |role: &str| {
        metric(
            port,
            &format!("verwalter_role_failed_attempts{{role=\"{role}\"}}"),
        )
        .unwrap_or(0.0)
    };
    wait_for(Duration::from_secs(30), || {
        (attempts("x") >= 3.0 && attempts("y") >= 3.0).then_some(())
    })
    .unwrap_or_else(|| panic!("no third attempt:\n{}", site.daemon.logs()));
    let (x, y) = (attempts("x"), attempts("y"));
    assert!(
        x <= 5.0 && y <= 5.0,
        "the cycle spins: x {x}, y {y} attempts"
    );
    assert_eq!(site.calls(), vec!["w"]);
    let status = site.status();
    let failed = status["failed_roles"].as_array().unwrap();
    assert!(
        failed.contains(&json!("x")) && failed.contains(&json!("y")),
        "{status}"
    );
    let logs = site.daemon.logs();
    for role in ["x", "y"] {
        let failures: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("Reconcile failed") && l.contains(&format!("key=\"{role}\"")))
            .collect();
        assert_eq!(failures.len(), 1, "{role}: {failures:#?}");
        assert!(
            failures[0].contains("is in a dependency cycle: x -> y -> x"),
            "{}",
            failures[0]
        );
    }
    // Nothing else about them is logged per attempt either.
    let lines = logs
        .lines()
        .filter(|l| l.contains("\"x\"") || l.contains("\"y\""))
        .count();
    assert!(lines <= 10, "{lines} lines about x and y:\n{logs}");
}

/// Issue 29: `depends_on = {}` in a Lua scheduler (its empty table comes out as `{}`) was refused
/// as "must be a list of role names". The site's scheduler is Lua: the schedule goes through a
/// Lua table and back, as a scheduler's own would.
#[test]
fn an_empty_lua_table_as_depends_on_is_no_dependencies() {
    let site = Site::start();
    site.schedule(
        json!({"value": 1, "filler": ""}),
        json!({
            "a": {"template": "app/v1", "depends_on": {}},
            "b": {"template": "app/v1", "depends_on": ["a"]},
        }),
    );
    let calls = site.wait_calls(2);
    assert_eq!(calls, vec!["a", "b"]);
    let status = site.status();
    assert_eq!(status["failed_roles"], json!([]), "{status}");
    assert_eq!(status["blocked_roles"], json!({}), "{status}");
}

/// A `scheduler/v1/query.wasm` whose `init`, `render_roles` and `query` return the given JSON
/// (WAT data, quotes escaped as `\"`).
pub fn query_wasm(init: &str, render_roles: &str, query: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 8192))
  (data (i32.const 16) "{init}")
  (data (i32.const 1024) "{render_roles}")
  (data (i32.const 4096) "{query}")
  (func (export "alloc") (param $len i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (local.get $len)))
    (block $fits
      (br_if $fits (i32.le_u (global.get $next) (i32.mul (memory.size) (i32.const 65536))))
      (drop (memory.grow (i32.add (i32.const 1) (i32.div_u (global.get $next) (i32.const 65536))))))
    (local.get $p))
  (func (export "dealloc") (param i32))
  (func (export "init") (param i32 i32) (result i32) (i32.const 16))
  (func (export "render_roles") (param i32 i32) (result i32) (i32.const 1024))
  (func (export "query") (param i32 i32) (result i32) (i32.const 4096)))"#
    ))
    .unwrap()
}

const QUERY_ROLES: &str = r#"{\"Ok\": {\"api\": {\"template\": \"app/v1\", \"value\": 7, \"filler\": \"from query.wasm\"}}}"#;

#[test]
fn query_wasm_decides_the_roles_rendered_and_answers_queries() {
    let site = Site::start();
    std::fs::write(
        site.config.join("scheduler/v1/query.wasm"),
        query_wasm(
            r#"{\"Ok\": null}"#,
            QUERY_ROLES,
            r#"{\"Ok\": {\"answer\": 42}}"#,
        ),
    )
    .unwrap();
    // The schedule's own role (`web`) is not this node's: query.wasm says `api`.
    site.schedule(
        json!({}),
        json!({"web": {"template": "app/v1", "value": 1, "filler": ""}}),
    );
    assert_eq!(site.wait_calls(1), vec!["api"]);
    let conf = site.conf("api");
    assert!(
        conf.contains("BEGIN api\nvalue: 7\nfrom query.wasm\n"),
        "{conf}"
    );
    assert!(!site.out.join("web.conf").exists());
    let (code, body) = http_post(site.daemon.port, "/v1/query/x", "application/json", b"{}");
    assert_eq!((code, body.as_str()), (200, r#"{"answer":42}"#));
    // `/v1/roles_data` shows what is rendered: query.wasm's roles, as 0.13 answered it.
    let roles = site.daemon.json("/v1/roles_data").unwrap();
    let to_render = roles["to_render"].as_object().unwrap();
    assert_eq!(to_render.keys().collect::<Vec<_>>(), vec!["api"], "{roles}");
    assert_eq!(to_render["api"]["value"], 7, "{roles}");
    assert_eq!(to_render["api"]["filler"], "from query.wasm", "{roles}");
}

#[test]
fn a_query_wasm_whose_init_fails_renders_nothing_and_is_shown_until_fixed() {
    let site = Site::start();
    let module = site.config.join("scheduler/v1/query.wasm");
    std::fs::write(
        &module,
        query_wasm(
            r#"{\"Err\": {\"kind\": \"InitError\", \"message\": \"no cluster named prod\"}}"#,
            QUERY_ROLES,
            r#"{\"Ok\": null}"#,
        ),
    )
    .unwrap();
    site.schedule(
        json!({}),
        json!({"web": {"template": "app/v1", "value": 1, "filler": ""}}),
    );
    let status = wait_for(SOON, || {
        let s = site.status();
        let error = s["errors"]["role scheduler/v1/query.wasm"]
            .as_str()?
            .to_string();
        Some(error)
    })
    .unwrap_or_else(|| panic!("no query.wasm error shown: {}", site.status()));
    assert!(
        status.contains("InitError: no cluster named prod") && status.contains("not rendered"),
        "{status}"
    );
    let metrics = site.daemon.get("/metrics").unwrap().1;
    assert!(
        metrics.contains("verwalter_role_failed_attempts{role=\"scheduler/v1/query.wasm\"}"),
        "{metrics}"
    );
    assert!(site.calls().is_empty(), "nothing may be rendered");

    // A fixed module is read on the next retry, without a new schedule.
    std::fs::write(
        &module,
        query_wasm(r#"{\"Ok\": null}"#, QUERY_ROLES, r#"{\"Ok\": null}"#),
    )
    .unwrap();
    assert_eq!(site.wait_calls(1), vec!["api"]);
    wait_for(SOON, || {
        (site.status()["failed_roles"] == json!([])).then_some(())
    })
    .expect("the query.wasm failure cleared");
}
