//! The built-in web frontend in headless Chromium against a daemon on a temp copy of
//! `examples/minimal`: the overview shows the leader and the roles and follows changes without a
//! reload, a version button and a global action change the schedule, the re-render button starts
//! a deployment, the log pages show it, and nothing is logged to the console; every page loads
//! without a script error, and a refused press, a missing log or a refused stream is shown with
//! its cause. Without a browser: every module the page imports is served as JavaScript.
//! Screenshots go to `<target>/screenshots/frontend-*.png`.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::*;
use crate::webdriver::{Browser, screenshot_dir};

const SOON: Duration = Duration::from_secs(20);

fn shot(browser: &Browser, name: &str) {
    browser.screenshot(&screenshot_dir().join(format!("frontend-{name}.png")));
}

/// The deployment id of `role`'s last attempt in the deployment log, and the log from its start.
fn last_attempt(log_dir: &Path, role: &str) -> Option<(String, String)> {
    let index = std::fs::read_to_string(log_dir.join(".index/latest")).ok()?;
    let line: Value = index
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l[2]["variant"] == "Role" && l[2]["fields"][0] == role && l[3] == "RoleStart")?;
    let fields = &line[2]["fields"];
    let file = log_dir
        .join(role)
        .join(format!("log.{}.txt", fields[1].as_str()?));
    let text = std::fs::read(file).ok()?;
    let from = fields[2].as_u64()? as usize;
    let attempt = String::from_utf8_lossy(text.get(from..)?).into_owned();
    attempt
        .contains("RoleFinish")
        .then(|| (line[1].as_str().unwrap().to_string(), attempt))
}

fn schedule(daemon: &Daemon) -> Value {
    daemon.json("/v1/schedule").expect("a schedule")
}

#[test]
fn operators_see_live_status_press_buttons_and_read_the_deployment_log() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let first = wait_for(SOON, || daemon.json("/v1/schedule"))
        .unwrap_or_else(|| panic!("no schedule:\n{}", daemon.logs()));
    let first_hash = first["hash"].as_str().unwrap().to_string();
    let base = format!("http://127.0.0.1:{}", daemon.port);
    let browser = Browser::start();

    // Overview: the leader (this node) and the roles of the schedule.
    browser.goto(&format!("{base}/"));
    browser.wait_for_text("#leader", "alpha.test", SOON);
    browser.wait_for_text("#schedule-hash", &first_hash[..8], SOON);
    let (_, roles_text) = browser.wait_for_text_read("#roles-table", "web", SOON);
    assert!(roles_text.contains("cache"));
    shot(&browser, "overview");

    // Live: a new version uploaded shows up without reloading the page.
    browser.execute("window.notReloaded = true; return null", vec![]);
    std::fs::write(
        config.join("runtime/web/v3.yaml"),
        "image: web.v3\ninstances: 1\n",
    )
    .unwrap();
    let second = wait_for(SOON, || {
        let s = daemon.json("/v1/schedule")?;
        (s["data"]["roles"]["web"]["version"] == "v3").then_some(s)
    })
    .expect("a schedule with web v3");
    let second_hash = second["hash"].as_str().unwrap();
    browser.wait_for_text("#schedule-hash", &second_hash[..8], SOON);
    browser.wait_for_text("#roles-table", "v3", SOON);
    assert_eq!(
        browser.execute("return window.notReloaded === true", vec![]),
        json!(true),
        "the page was reloaded instead of updated"
    );

    // A role page; the version button pins web to v1 through the action API.
    browser.click_on("#roles-table a[href='/roles/web']", None, SOON);
    browser.wait_for_text("#role-version", "v3", SOON);
    browser.click_on("#versions button[data-version='v1']", None, SOON);
    let question = browser
        .accept_alert_if_any()
        .expect("the version switch asks before it acts");
    assert!(
        question.contains("web") && question.contains("v1"),
        "{question}"
    );
    browser.wait_for_text("#action-results", "web pinned to v1", SOON);
    browser.wait_for_text("#role-version", "v1", SOON);
    let pinned = schedule(&daemon);
    assert_eq!(pinned["data"]["roles"]["web"]["version"], "v1");
    assert_eq!(pinned["data"]["state"]["web"]["pinned"], "v1");

    // A global action: one more instance, on this node's part of the schedule.
    browser.click_on("#global-actions button", Some("Add instance"), SOON);
    browser.wait_for_text("#action-results", "web: 2 instance(s)", SOON);
    shot(&browser, "role");

    // The deployment that rendered it is on the role page and in the log, with its text.
    let log_dir = storage.join("log");
    let deployment = wait_for(SOON, || {
        let (deployment, text) = last_attempt(&log_dir, "web")?;
        text.contains("instances: 2").then_some(deployment)
    })
    .unwrap_or_else(|| {
        panic!(
            "web was not rendered with two instances:\n{}",
            daemon.logs()
        )
    });
    browser.wait_for_text("#role-deployments", &deployment, SOON);
    browser.click_on("#nav a[href='/logs']", None, SOON);
    browser.wait_for_text("#log-rows", &deployment, SOON);
    browser.click_on(
        &format!("#log-rows tr.deployment[data-deployment='{deployment}'] button.toggle"),
        None,
        SOON,
    );
    browser.wait_for_text("#log-rows tr.detail", "RoleStart", SOON);
    shot(&browser, "logs");
    // The row of web's RoleStart in that deployment links to its text.
    let opened = browser.execute(
        "const rows = document.querySelectorAll(`#log-rows tr.detail[data-deployment='${arguments[0]}'] tr`); \
         const row = [...rows].find((r) => r.textContent.includes('RoleStart') && \
           r.querySelector('a[href^=\"/tail/role/web/\"]')); \
         const a = row && row.querySelector('a[href^=\"/tail/role/web/\"]'); \
         if (a) a.click(); return !!a",
        vec![json!(deployment)],
    );
    assert_eq!(
        opened,
        json!(true),
        "no RoleStart row of web for {deployment}"
    );
    let (_, text) = browser.wait_for_text_read("#tail", "web: RoleStart", SOON);
    assert!(text.contains(&deployment), "{text}");
    assert!(
        text.contains("instances: 2"),
        "the rendered file in the log:\n{text}"
    );
    shot(&browser, "tail");

    // Re-render everything from the overview: a new deployment of the same schedule.
    browser.goto(&format!("{base}/"));
    browser.click_on("#force-render", None, SOON);
    wait_for(SOON, || {
        let status = daemon.json("/v1/status")?;
        let last = &status["last_deployment"];
        (last["id"] != deployment.as_str() && last["finished"].is_u64()).then_some(())
    })
    .expect("a new deployment after the re-render button");

    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    assert!(screenshot_dir().join("frontend-tail.png").is_file());
}

#[test]
fn a_followers_frontend_shows_the_cluster_and_sends_operators_to_the_leader() {
    let cluster = crate::cluster::Cluster::start();
    let (leader, hash) = cluster.converged();
    let follower = cluster.follower(leader);
    let status = follower.json("/v1/status").unwrap();
    let leader_addr = status["leader"]["addr"].as_str().unwrap().to_string();
    let browser = Browser::start();

    browser.goto(&format!("http://{}:{}/", follower.host, follower.port));
    let leader_name = format!("{}.test", crate::cluster::NAMES[leader]);
    browser.wait_for_text("#leader", &leader_name, SOON);
    browser.wait_for_text("#schedule-hash", &hash[..8], SOON);
    browser.wait_for_text("#leader-badge", &leader_name, SOON);

    // The buttons are there but disabled, with the same page on the leader one click away.
    browser.goto(&format!(
        "http://{}:{}/roles/web",
        follower.host, follower.port
    ));
    browser.wait_for("#versions button", SOON);
    let notice = browser.wait_for_text("#leader-notice", "leader only", SOON);
    let link = browser
        .find_all("#leader-notice a")
        .into_iter()
        .next()
        .expect("a link to the leader");
    assert_eq!(
        browser.attr(&link, "href").as_deref(),
        Some(format!("http://{leader_addr}/roles/web").as_str()),
        "{}",
        browser.text(&notice)
    );
    let all_disabled = browser.execute(
        "return [...document.querySelectorAll('#versions button, #global-actions button')] \
           .every((b) => b.disabled)",
        vec![],
    );
    assert_eq!(all_disabled, json!(true));

    // The nodes page lists all three, the leader marked.
    browser.goto(&format!("http://{}:{}/nodes", follower.host, follower.port));
    let (nodes, text) = browser.wait_for_text_read("#nodes", "gamma", SOON);
    for name in crate::cluster::NAMES {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    assert!(text.contains("leader"), "{text}");
    // Who elects the leader: the built-in election here (etcd's page: tests/etcd.rs).
    let (_, backend) =
        browser.wait_for_text_read("#election-backend", "verwalter's own election", SOON);
    assert!(backend.contains("Leader elected by"), "{backend}");
    // Liveness as the follower judges it (heard from directly, here through cantal, within the
    // window), not the age of a list that is republished only on change; and every id whole,
    // so that nodes whose ids share a prefix can be told apart.
    wait_for(SOON, || {
        let alive = browser.execute(
            "return [...document.querySelectorAll('#nodes td.heard')].filter((td) => \
               td.textContent.startsWith('alive')).length",
            vec![],
        );
        (alive == json!(2)).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the two peers are not shown alive:\n{}",
            browser.text(&nodes)
        )
    });
    let ids = browser.execute(
        "return [...document.querySelectorAll('#nodes td.id')].map((td) => td.textContent)",
        vec![],
    );
    let ids: std::collections::BTreeSet<String> = ids
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.iter().all(|id| id.len() == 32), "{ids:?}");
    shot(&browser, "follower");
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

/// Declares a role with processes on this node and every kind of button, and answers each press
/// with the button it got, so the test sees exactly what the page sent.
const ECHO_SCHEDULER: &str = r#"
return {scheduler = function(state)
  local replies = {}
  for id, action in pairs(state.actions) do replies[id] = {echo = action.button} end
  local host = state.current_host
  return {
    actions = replies,
    roles = {app = {
      title = "The app", badge = "beta", info = "two workers",
      frontend = {kind = "example"},
      daemon_actions = {{title = "+", id = "incr", data = {incr = 1}}},
      global_actions = {{title = "Restart all", id = "restart", confirm = "Restart every worker?"}},
    }},
    nodes = {[host] = {roles = {app = {daemons = {
      worker = {image = "app.v7", instances = 2, config = "/cfg/worker.yaml"},
    }}}}},
  }, "ok"
end}
"#;

#[test]
fn buttons_send_what_the_schedule_declares() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config");
    std::fs::create_dir_all(config.join("scheduler/v1")).unwrap();
    std::fs::create_dir_all(config.join("runtime")).unwrap();
    std::fs::write(config.join("scheduler/v1/main.lua"), ECHO_SCHEDULER).unwrap();
    let daemon = Daemon::start(&config, &tmp.path().join("storage"));
    wait_for(SOON, || daemon.json("/v1/schedule"))
        .unwrap_or_else(|| panic!("no schedule:\n{}", daemon.logs()));
    // `app` has no template, so it fails before any deployment starts: the log index is empty
    // (not a 404, which the browser would report as an error on the role page).
    let failed = wait_for(SOON, || {
        let status = daemon.json("/v1/status")?;
        (status["failed_roles"] == json!(["app"])).then_some(status)
    })
    .expect("app fails without a template");
    assert_eq!(failed["last_deployment"], Value::Null);
    assert_eq!(
        daemon.get("/v1/log/index/latest"),
        Some((200, String::new()))
    );
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/roles/app", daemon.port));
    browser.wait_for_text("#role", "The app (app)", SOON);
    let (_, processes_text) = browser.wait_for_text_read("#role", "app.v7", SOON);
    assert!(processes_text.contains("two workers"));

    // A process row's button: the action, the node and process it is on, its data, the role.
    browser.click_on("#role table button[data-action='incr']", None, SOON);
    let (_, text) = browser.wait_for_text_read("#action-results", "echo", SOON);
    let answer: Value = serde_json::from_str(text.split_once(": ").unwrap().1).unwrap();
    assert_eq!(
        answer,
        json!({"echo": {"action": "incr", "host": "alpha", "daemon": "worker",
                        "data": {"incr": 1}, "role": "app"}})
    );

    // A global action asks first when it says so: nothing is sent while the question is open.
    // Proof by order: an action the test registers while the dialog is open gets a lower id
    // than the button's, which is registered only once the dialog is accepted.
    browser.click_on("#global-actions button", None, SOON);
    assert_eq!(browser.wait_for_alert(SOON), "Restart every worker?");
    let (code, body) = http_post(
        daemon.port,
        "/v1/action",
        "application/json",
        br#"{"marker": true}"#,
    );
    assert_eq!(code, 200, "{body}");
    let marker = serde_json::from_str::<Value>(&body).unwrap()["registered"]
        .as_u64()
        .unwrap();
    assert_eq!(
        browser.accept_alert_if_any().as_deref(),
        Some("Restart every worker?")
    );
    browser.wait_for_text(
        "#action-results",
        r#"{"echo":{"action":"restart","role":"app"}}"#,
        SOON,
    );
    let audit = std::fs::read_to_string(tmp.path().join("storage/log/.global/latest")).unwrap();
    let restart: u64 = audit
        .lines()
        .find(|line| line.contains("audit: action") && line.contains(r#""restart""#))
        .and_then(|line| {
            line.split("audit: action ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no audit line for the restart:\n{audit}"));
    assert!(
        restart > marker,
        "the restart ({restart}) was sent before the question was answered (marker {marker})"
    );
    shot(&browser, "buttons");
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

#[test]
fn a_role_page_says_it_is_loading_until_the_status_comes_and_why_and_retries_a_full_stream_cap() {
    use std::io::{Read, Write};
    let (tmp, config, storage) = example_site("minimal");
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(&settings, "http:\n  max-event-streams: 1\n").unwrap();
    let daemon = Daemon::launch(
        &config,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    wait_for(SOON, || daemon.json("/v1/schedule"))
        .unwrap_or_else(|| panic!("no schedule:\n{}", daemon.logs()));

    // This test holds the only stream, so the page gets 503 and no status.
    let mut held = std::net::TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    held.set_read_timeout(Some(SOON)).unwrap();
    write!(held, "GET /v1/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("event: status") {
        let mut chunk = [0u8; 4096];
        let n = held.read(&mut chunk).expect("the first event");
        assert!(n > 0, "the stream ended");
        seen.extend_from_slice(&chunk[..n]);
    }
    let (code, _) = daemon.get("/v1/events").unwrap();
    assert_eq!(code, 503, "the one stream is taken");

    let browser = Browser::start();
    // Every page says that it waits for the status, rather than showing nothing under the
    // header; the stream is not called live.
    for path in ["/", "/nodes", "/roles/web"] {
        browser.goto(&format!("http://127.0.0.1:{}{path}", daemon.port));
        browser.wait_for_text("#status-loading", "Loading the status", SOON);
        let live = browser.wait_for("#live", SOON);
        assert_ne!(browser.text(&live), "live", "{path}");
    }
    let (_, content_text) =
        browser.wait_for_text_read("#role-loading", "Loading the schedule", SOON);
    assert!(!content_text.contains("No role"));
    let page = browser.execute("return document.body.innerText", vec![]);
    assert!(!page.as_str().unwrap().contains("No role"), "{page}");
    // Why: the node's answer to the stream, in a notice.
    let (_, text) = browser.wait_for_text_read("#notices", "Could not load /v1/events: 503", SOON);
    assert!(text.contains("event streams are open"), "{text}");
    shot(&browser, "role-loading");

    // Once the stream is free the page connects again by itself, shows the role, and the
    // notice is gone.
    drop(held);
    browser.wait_for("#versions button", Duration::from_secs(60));
    assert!(browser.find("#role-loading").is_none());
    assert!(browser.find("#status-loading").is_none());
    assert_eq!(notices(&browser), Vec::<String>::new());
    browser.wait_for_text("#live", "live", SOON);
}

/// One HTTP/1.0 GET on 127.0.0.1: the status, the `Content-Type` and the body.
fn get_typed(port: u16, path: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: verwalter\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer for {path}: {response:?}"));
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    (code, content_type, body.to_string())
}

/// The `src` of each `<script type="module" src="...">` of a page, or with `module` false of
/// each classic `<script src="...">`.
fn scripts(html: &str, module: bool) -> Vec<String> {
    html.split("<script")
        .skip(1)
        .map(|tag| tag.split('>').next().unwrap_or_default())
        .filter(|tag| tag.contains(r#"type="module""#) == module)
        .filter_map(|tag| Some(tag.split(r#"src=""#).nth(1)?.split('"').next()?.to_string()))
        .collect()
}

fn module_scripts(html: &str) -> Vec<String> {
    scripts(html, true)
}

/// The specifiers of a module's static imports and re-exports (`import ... from "x"`,
/// `import "x"`, `export ... from "x"`, the `} from "x"` line that ends a long import list).
fn imports(module: &str) -> Vec<String> {
    let quoted = |text: &str| {
        let text = text.trim_start();
        let quote = text.chars().next().filter(|c| *c == '"' || *c == '\'')?;
        Some(text[1..].split(quote).next()?.to_string())
    };
    module
        .lines()
        .map(str::trim)
        .filter(|line| {
            line.starts_with("import ") || line.starts_with("export ") || line.starts_with("} from")
        })
        .filter_map(|line| match line.rsplit_once(" from ") {
            Some((_, rest)) => quoted(rest),
            None => quoted(line.strip_prefix("import ")?),
        })
        .collect()
}

/// `specifier` resolved against the URL path `base` (the importing module's).
fn resolve(base: &str, specifier: &str) -> String {
    let mut parts: Vec<&str> = if specifier.starts_with('/') {
        Vec::new()
    } else {
        let dir = &base[..base.rfind('/').unwrap()];
        dir.split('/').filter(|p| !p.is_empty()).collect()
    };
    for part in specifier.split('/').filter(|p| !p.is_empty()) {
        match part {
            "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

#[test]
fn every_module_the_page_imports_is_served_as_javascript() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("frontend");
    let mut on_disk: Vec<String> = walk_js(&source)
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&source).unwrap().to_str().unwrap();
            format!("/common/{rel}")
        })
        .collect();
    on_disk.sort();

    // The same page at `/`, a deep link and under `/~common/`: the modules are the same files.
    for page in ["/", "/roles/web", "/~common/logs"] {
        let (code, content_type, html) = get_typed(daemon.port, page);
        assert_eq!(code, 200, "{page}");
        assert!(
            content_type.starts_with("text/html"),
            "{page}: {content_type}"
        );
        let mut queue = module_scripts(&html);
        assert_eq!(queue, ["/common/app.js"], "the module scripts of {page}");
        // The one classic script: it tells when the module could not be loaded.
        let classic = scripts(&html, false);
        assert_eq!(
            classic,
            ["/common/js/boot.js"],
            "the classic scripts of {page}"
        );
        queue.extend(classic);
        let mut served = Vec::new();
        while let Some(url) = queue.pop() {
            if served.contains(&url) {
                continue;
            }
            let (code, content_type, text) = get_typed(daemon.port, &url);
            assert_eq!(
                code, 200,
                "{url} (imported by the page) is not served: is it in FILES in src/http/frontend.rs?"
            );
            assert!(
                content_type.starts_with("text/javascript"),
                "{url} is served as {content_type:?}: browsers run modules only as JavaScript"
            );
            assert!(
                !text.contains("import("),
                "{url}: a dynamic import, which this test cannot follow"
            );
            for specifier in imports(&text) {
                assert!(
                    specifier.starts_with("./") || specifier.starts_with("../"),
                    "{url} imports {specifier:?}: imports are relative, so that they work \
                     wherever the files are served"
                );
                queue.push(resolve(&url, &specifier));
            }
            served.push(url);
        }
        served.sort();
        assert_eq!(
            served, on_disk,
            "the modules the page loads from {page} and the .js files of frontend/ differ"
        );
    }
}

/// Every `.js` file under `dir`.
fn walk_js(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk_js(&path));
        } else if path.extension().is_some_and(|e| e == "js") {
            found.push(path);
        }
    }
    found
}

#[test]
fn imports_are_found_and_resolved_as_a_browser_does() {
    let module = "import {a, b} from \"./js/x.js\";\nimport './side.js';\nimport {\n  c,\n} from \"../y.js\";\nexport {d} from \"./pages/z.js\";\nconst s = \"not an import from './no.js'\";\n";
    assert_eq!(
        imports(module),
        ["./js/x.js", "./side.js", "../y.js", "./pages/z.js"]
    );
    assert_eq!(resolve("/common/app.js", "./js/x.js"), "/common/js/x.js");
    assert_eq!(
        resolve("/common/js/pages/roles.js", "../dom.js"),
        "/common/js/dom.js"
    );
    assert_eq!(resolve("/common/js/api.js", "/other.js"), "/other.js");
}

/// The notices shown now (`#notices`), by text.
fn notices(browser: &Browser) -> Vec<String> {
    browser
        .find_all("#notices .notice .notice-text")
        .iter()
        .map(|n| browser.text(n))
        .collect()
}

#[test]
fn every_page_loads_without_a_script_error_or_a_notice() {
    let (_tmp, config, storage) = example_site("minimal");
    // A script of this node that throws, for the end (the page's Content-Security-Policy runs
    // no inline script, so it comes as a file: an alternative frontend's).
    let thrower = config.join("frontend/test/js/throw.js");
    std::fs::create_dir_all(thrower.parent().unwrap()).unwrap();
    std::fs::write(
        &thrower,
        "setTimeout(() => { throw new Error('thrown by the test') });\n",
    )
    .unwrap();
    let daemon = Daemon::start(&config, &storage);
    wait_for(SOON, || {
        let status = daemon.json("/v1/status")?;
        status["last_deployment"]["finished"].is_u64().then_some(())
    })
    .unwrap_or_else(|| panic!("no deployment:\n{}", daemon.logs()));
    wait_for(SOON, || {
        let backups = daemon.json("/v1/backups")?;
        (!backups.as_array()?.is_empty()).then_some(())
    })
    .unwrap_or_else(|| panic!("no backup:\n{}", daemon.logs()));
    let browser = Browser::start();
    // Each page with something that shows it has loaded what it reads.
    let pages = [
        ("", "#roles-table", "web"),
        ("/roles", "#role-list", "cache"),
        ("/roles/web", "#role-deployments", "log"),
        ("/nodes", "#nodes", "alpha"),
        ("/schedule", "#schedule-tree", "roles"),
        ("/scheduler", "#scheduler-log", ""),
        ("/logs", "#log-rows", "ok"),
        ("/tail/global/latest", ".toolbar", "bytes "),
        ("/shadow", "#shadow-list", "No shadow schedulers"),
        ("/backups", "#backups", ""),
        ("/api", "#routes", "/v1/roles_data"),
    ];
    for base in ["", "/~common"] {
        for (path, css, text) in pages {
            let url = format!("http://127.0.0.1:{}{base}{path}", daemon.port);
            browser.goto(&url);
            browser.wait_for_text("#live", "live", SOON);
            browser.wait_for_text(css, text, SOON);
            assert_eq!(notices(&browser), Vec::<String>::new(), "notices on {url}");
            let errors = browser.console_errors();
            assert!(errors.is_empty(), "console errors on {url}: {errors:#?}");
        }
    }
    // Back to a page left before: it is live again (the browser may have kept it with its
    // stream closed, or load it anew).
    browser.execute("history.back(); return null", vec![]);
    browser.wait_for_text("#backups", "", SOON);
    browser.wait_for_text("#live", "live", SOON);
    assert!(
        browser.url().ends_with("/~common/backups"),
        "{}",
        browser.url()
    );
    // Links inside the page keep the base they were served under.
    let link = browser.wait_for("#nav a[href='/~common/roles']", SOON);
    browser.click(&link);
    browser.wait_for_text("#role-list", "web", SOON);
    assert!(
        browser.url().ends_with("/~common/roles"),
        "{}",
        browser.url()
    );

    // A script error is shown on the page too, not only in the console.
    // (From a script of the page: the browser hides the text of errors of the test's own
    // scripts from the page.)
    browser.execute(
        "const script = document.createElement('script'); \
         script.src = '/~test/js/throw.js'; \
         document.head.append(script); return null",
        vec![],
    );
    let (_, notice_text) = browser.wait_for_text_read("#notices", "Script error", SOON);
    assert!(
        notice_text.contains("thrown by the test"),
        "{}",
        notice_text
    );
    let errors = browser.console_errors();
    assert!(
        errors.len() == 1 && errors[0].contains("thrown by the test"),
        "{errors:#?}"
    );

    // The page's Content-Security-Policy holds (issue 28): an inline script does not run...
    let ran = browser.execute(
        "const script = document.createElement('script'); \
         script.textContent = 'window.inlineRan = true'; \
         document.head.append(script); return window.inlineRan === true",
        vec![],
    );
    assert_eq!(
        ran,
        json!(false),
        "an inline script ran under the page's policy"
    );
    // ...and no page may frame it, not even its own (frame-ancestors 'none', X-Frame-Options):
    // the browser says it refused, and the frame holds no page of the node.
    browser.execute(
        "const frame = document.createElement('iframe'); frame.id = 'framed'; \
         frame.src = '/roles/web'; document.body.append(frame); return null",
        vec![],
    );
    wait_for(SOON, || {
        let errors = browser.console_errors();
        errors
            .iter()
            .any(|e| e.contains("frame-ancestors") || e.contains("X-Frame-Options"))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("framing was not refused: {:#?}", browser.console_errors()));
    let framed = browser.execute(
        "const doc = document.getElementById('framed').contentDocument; \
         return Boolean(doc && doc.getElementById('bar'))",
        vec![],
    );
    assert_eq!(framed, json!(false), "the node's page loaded in a frame");
}

/// A role whose one button sends more than the leader may hold pending (`actions.max-pending-kib:
/// 1` in the test's settings), and a small one.
const BIG_BUTTON_SCHEDULER: &str = r#"
return {scheduler = function(state)
  local replies = {}
  for id, action in pairs(state.actions) do replies[id] = {ok = "took " .. action.button.action} end
  return {
    actions = replies,
    roles = {app = {global_actions = {
      {title = "Upload", id = "upload", data = {blob = string.rep("x", 2048)}},
      {title = "Ping", id = "ping"},
    }}},
    nodes = {},
  }, "ok"
end}
"#;

#[test]
fn operators_see_why_a_press_or_a_page_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config");
    std::fs::create_dir_all(config.join("scheduler/v1")).unwrap();
    std::fs::create_dir_all(config.join("runtime")).unwrap();
    std::fs::write(config.join("scheduler/v1/main.lua"), BIG_BUTTON_SCHEDULER).unwrap();
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(&settings, "actions:\n  max-pending-kib: 1\n").unwrap();
    let daemon = Daemon::launch(
        &config,
        &tmp.path().join("storage"),
        &["--settings", settings.to_str().unwrap()],
        &[],
    );
    wait_for(SOON, || daemon.json("/v1/schedule"))
        .unwrap_or_else(|| panic!("no schedule:\n{}", daemon.logs()));
    let base = format!("http://127.0.0.1:{}", daemon.port);
    let browser = Browser::start();

    // A press the leader refuses: the line under the buttons says so, with the node's reason.
    browser.goto(&format!("{base}/roles/app"));
    browser.click_on("#global-actions button", Some("Upload"), SOON);
    let (_, text) = browser.wait_for_text_read("#action-results .result.bad", "503", SOON);
    assert!(
        text.contains("POST /v1/wait_action") && text.contains("at most 1024 may be pending"),
        "{text}"
    );
    // The next press is sent and answered on its own line.
    browser.click_on("#global-actions button", Some("Ping"), SOON);
    browser.wait_for_text("#action-results .result.ok", "took ping", SOON);
    assert!(browser.find("#action-results .result.pending").is_none());
    shot(&browser, "refused");

    // A log that does not exist: a notice names the request and the answer.
    browser.goto(&format!("{base}/tail/role/nope/latest"));
    let (_, notice_text) = browser.wait_for_text_read("#notices", "/v1/log/role/nope/latest", SOON);
    assert!(notice_text.contains("404"), "{}", notice_text);
    browser.wait_for_text("#tail", "There is no log role/nope/latest", SOON);
    shot(&browser, "missing-log");
    // It belongs to that page: leaving it takes the notice away.
    browser.click_on("#nav a[href='/']", None, SOON);
    browser.wait_for("#roles-table", SOON);
    assert_eq!(notices(&browser), Vec::<String>::new());
    // The browser's own lines for the refused requests are all the console has.
    let errors = browser.console_errors();
    assert!(
        errors.iter().all(|e| e.contains("Failed to load resource")),
        "{errors:#?}"
    );
}

const API_TOKEN: &str = "Op3rator-API-t0ken-for-the-test";

/// A node on a copy of `examples/minimal` that asks for [`API_TOKEN`] (`http.token-file`, mode
/// 0600), on reads too with `reads`; logging at debug, so that a token in any log line shows.
fn token_site(reads: bool) -> (tempfile::TempDir, std::path::PathBuf, Daemon) {
    use std::os::unix::fs::PermissionsExt;
    let (tmp, config, storage) = example_site("minimal");
    let token_file = tmp.path().join("api.token");
    std::fs::write(&token_file, format!("{API_TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let settings = tmp.path().join("settings.yaml");
    std::fs::write(
        &settings,
        format!("http:\n  token-file: api.token\n  token-for-reads: {reads}\n"),
    )
    .unwrap();
    let daemon = Daemon::launch(
        &config,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[("RUST_LOG", "debug")],
    );
    (tmp, storage, daemon)
}

/// One HTTP/1.0 request on 127.0.0.1 with `headers`: the status code and the body.
pub(crate) fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(70))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.0\r\nHost: verwalter\r\n");
    for header in headers {
        head += &format!("{header}\r\n");
    }
    head += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
    s.write_all(head.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    (code.unwrap_or(0), body.to_string())
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if std::fs::read(&path)
            .unwrap_or_default()
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
        {
            found.push(path);
        }
    }
    found
}

/// Fills the token form and sends it.
fn enter_token(browser: &Browser, token: &str) {
    browser.wait_for("#token-form #token-input", SOON);
    browser.execute(
        "document.getElementById('token-input').value = arguments[0]; \
         document.getElementById('token-form').requestSubmit(); return null",
        vec![json!(token)],
    );
}

#[test]
fn with_an_api_token_writes_need_it_and_the_page_asks_for_it_once() {
    let (tmp, storage, daemon) = token_site(false);
    wait_for(SOON, || daemon.json("/v1/schedule"))
        .unwrap_or_else(|| panic!("no schedule:\n{}", daemon.logs()));
    let port = daemon.port;
    let json_type = "Content-Type: application/json";
    let bearer = format!("Authorization: Bearer {API_TOKEN}");

    // Over HTTP: 401 without the token or with another, through with it; reads stay open.
    for headers in [
        vec![json_type],
        vec![json_type, "Authorization: Bearer wrong-token-0123456789"],
    ] {
        let (code, body) = request(port, "POST", "/v1/action", &headers, r#"{"x": 1}"#);
        assert_eq!(code, 401, "{body}");
        assert!(body.starts_with(r#"{"error":"#), "a JSON error: {body}");
        let (code, _) = request(port, "POST", "/v1/force_render_all", &headers[1..], "");
        assert_eq!(code, 401);
    }
    let (code, body) = request(
        port,
        "POST",
        "/v1/action",
        &[json_type, &bearer],
        r#"{"x": 1}"#,
    );
    assert_eq!(code, 200, "{body}");
    let (code, body) = request(port, "POST", "/v1/force_render_all", &[&bearer], "");
    assert_eq!(code, 200, "{body}");
    assert_eq!(daemon.get("/v1/status").map(|r| r.0), Some(200));

    // The page loads without it; a button press asks for it.
    let base = format!("http://127.0.0.1:{port}");
    let browser = Browser::start();
    browser.goto(&format!("{base}/roles/web"));
    browser.wait_for_text("#live", "live", SOON);
    browser.click_on("#versions button[data-version='v1']", None, SOON);
    browser
        .accept_alert_if_any()
        .expect("the version switch asks first");
    let (_, form_text) = browser.wait_for_text_read("#token-form", "401", SOON);
    assert!(form_text.contains("POST /v1/wait_action"), "{}", form_text);
    shot(&browser, "token-form");
    // A wrong token: the 401 is shown and the form asks again.
    enter_token(&browser, "not-the-token-of-this-node");
    let (_, notice_text) = browser.wait_for_text_read("#notices", "401", SOON);
    assert!(notice_text.contains("not this node's"), "{}", notice_text);
    // The right one: the press goes through, and the notice of the wrong one goes.
    enter_token(&browser, API_TOKEN);
    browser.wait_for_text("#action-results", "web pinned to v1", SOON);
    assert!(browser.find("#token-form").is_none(), "the form is gone");
    assert_eq!(notices(&browser), Vec::<String>::new());
    assert_eq!(schedule(&daemon)["data"]["state"]["web"]["pinned"], "v1");

    // After a reload in the same session, presses go through without asking.
    browser.goto(&format!("{base}/roles/web"));
    browser.wait_for_text("#live", "live", SOON);
    browser.click_on("#global-actions button", Some("Add instance"), SOON);
    browser.wait_for_text("#action-results", "web: 2 instance(s)", SOON);
    assert!(browser.find("#token-form").is_none(), "not asked again");
    let errors = browser.console_errors();
    assert!(
        errors.iter().all(|e| e.contains("401")),
        "only the refused requests: {errors:#?}"
    );

    // The token is in no log line, metric, deployment log, journal or stored file.
    let (code, metrics) = request(port, "GET", "/metrics", &[], "");
    assert_eq!(code, 200);
    assert!(!metrics.contains(API_TOKEN), "the token is in /metrics");
    let logs = daemon.logs();
    assert!(logs.contains("Action registered."), "{logs}");
    assert!(
        !logs.contains(API_TOKEN),
        "the token is in the daemon's log:\n{logs}"
    );
    assert_eq!(
        files_holding(&storage, API_TOKEN),
        Vec::<std::path::PathBuf>::new()
    );
    drop(tmp);
}

#[test]
fn with_token_for_reads_the_page_asks_before_it_shows_anything_and_streams_with_it() {
    let (_tmp, _storage, daemon) = token_site(true);
    let port = daemon.port;
    let bearer = format!("Authorization: Bearer {API_TOKEN}");
    let schedule = wait_for(SOON, || {
        match request(port, "GET", "/v1/schedule", &[&bearer], "") {
            (200, body) => serde_json::from_str::<Value>(&body).ok(),
            _ => None,
        }
    })
    .unwrap_or_else(|| panic!("no schedule:\n{}", daemon.logs()));
    let hash = schedule["hash"].as_str().unwrap();
    for path in ["/v1/status", "/v1/events", "/metrics"] {
        assert_eq!(request(port, "GET", path, &[], "").0, 401, "{path}");
    }
    assert_eq!(request(port, "GET", "/", &[], "").0, 200, "the page loads");

    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{port}/"));
    enter_token(&browser, API_TOKEN);
    browser.wait_for_text("#live", "live", SOON);
    browser.wait_for_text("#schedule-hash", &hash[..8], SOON);
    browser.wait_for_text("#roles-table", "web", SOON);
    assert_eq!(notices(&browser), Vec::<String>::new());
    // A reload keeps the token: the page is live without asking.
    browser.goto(&format!("http://127.0.0.1:{port}/nodes"));
    browser.wait_for_text("#live", "live", SOON);
    browser.wait_for_text("#nodes", "alpha", SOON);
    assert!(browser.find("#token-form").is_none(), "not asked again");
    assert!(!daemon.logs().contains(API_TOKEN));
}

#[test]
fn with_token_for_reads_the_graphql_page_queries_and_subscribes_with_the_token() {
    let (_tmp, _storage, daemon) = token_site(true);
    let port = daemon.port;
    let bearer = format!("Authorization: Bearer {API_TOKEN}");
    wait_for(SOON, || {
        (request(port, "GET", "/v1/schedule", &[&bearer], "").0 == 200).then_some(())
    })
    .unwrap_or_else(|| panic!("no schedule:\n{}", daemon.logs()));
    // The token the tab keeps, as the page's form would have stored it.
    let set_token = |browser: &Browser, token: &str| {
        browser.execute(
            "sessionStorage.setItem('verwalter-api-token', arguments[0]); return null",
            vec![json!(token)],
        );
    };
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{port}/v1/graphiql"));
    // The frontend's page: it asks for the token once, then is live and reads the schema.
    enter_token(&browser, API_TOKEN);
    browser.wait_for_text("#live", "live", SOON);
    browser.wait_for_text("#gql-roots", "Query", SOON);
    let editor = browser.wait_for("#gql-query", SOON);
    browser.execute(
        "arguments[0].value = '{ status { hostname } }'; return null",
        vec![editor.as_arg()],
    );

    // A browser sends no Authorization on a WebSocket: the page puts the token in
    // connection_init, and the node closes the socket (4403) on a wrong one.
    set_token(&browser, "wrong-t0ken-0123456789");
    browser.click_on("#gql-subscribe", None, SOON);
    browser.wait_for_text("#gql-socket", "closed: Forbidden", SOON);
    browser.wait_for_text("#gql-result", "needs its API token", SOON);
    set_token(&browser, API_TOKEN);
    browser.click_on("#gql-subscribe", None, SOON);
    browser.wait_for_text("#gql-socket", "update 1", SOON);
    browser.wait_for_text("#gql-result", "\"hostname\": \"alpha\"", SOON);
    // Run stops the subscription and POSTs the query with the token as a header.
    browser.execute(
        "document.getElementById('gql-result').textContent = ''; return null",
        vec![],
    );
    browser.click_on("#gql-run", None, SOON);
    browser.wait_for_text("#gql-result", "\"hostname\": \"alpha\"", SOON);
    assert_eq!(
        browser.text(&browser.wait_for("#gql-subscribe", SOON)),
        "Subscribe"
    );
    // Kept for the tab, never in the address; no log line holds it.
    let kept = browser.execute(
        "return sessionStorage.getItem('verwalter-api-token')",
        vec![],
    );
    assert_eq!(kept, json!(API_TOKEN));
    assert!(!browser.url().contains(API_TOKEN));
    assert!(!daemon.logs().contains(API_TOKEN));
}

/// The x position of the first button in the versions row of `version`.
fn button_x(browser: &Browser, version: &str) -> f64 {
    browser
        .execute(
            "const b = document.querySelector(`#versions button[data-version='${arguments[0]}']`); \
             return b ? b.getBoundingClientRect().left : null",
            vec![json!(version)],
        )
        .as_f64()
        .unwrap_or_else(|| panic!("no button for {version}"))
}

/// A role page (issue 31): every column of the versions table has a header, the buttons stay in
/// place when the marks beside them change (a fixed layout), its own labels are capitalised like
/// the schedule's (`Nodes` beside `Instances`), and each deployment of the role shows its result.
#[test]
fn a_role_page_heads_every_column_keeps_its_buttons_in_place_and_shows_each_result() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    wait_for(SOON, || {
        let status = daemon.json("/v1/status")?;
        status["last_deployment"]["finished"].is_u64().then_some(())
    })
    .unwrap_or_else(|| panic!("no deployment:\n{}", daemon.logs()));
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/roles/web", daemon.port));
    browser.wait_for("#versions button[data-version='v1']", SOON);
    let headers = browser.execute(
        "return [...document.querySelectorAll('#versions th')].map((th) => th.textContent)",
        vec![],
    );
    assert_eq!(headers, json!(["Version", "State", "Action"]));
    let facts = browser.execute(
        "return [...document.querySelectorAll('#role dl.kv dt')].map((dt) => dt.textContent)",
        vec![],
    );
    let facts: Vec<String> = serde_json::from_value(facts).unwrap();
    assert!(facts.contains(&"Nodes".to_string()), "{facts:?}");
    assert!(facts.contains(&"Instances".to_string()), "{facts:?}");
    assert!(!facts.contains(&"nodes".to_string()), "{facts:?}");

    // Pinning v1 puts `pinned` and `current` on its row: its button does not move.
    let before = button_x(&browser, "v1");
    browser.click_on("#versions button[data-version='v1']", None, SOON);
    browser
        .accept_alert_if_any()
        .expect("the switch asks first");
    browser.wait_for_text("#versions", "pinned", SOON);
    browser.wait_for_text("#role-version", "v1", SOON);
    assert_eq!(button_x(&browser, "v1"), before, "the button moved");

    // The deployments: a Result column, `ok` for the attempts that applied.
    let table = browser.wait_for_text("#role-deployments td.result", "ok", SOON);
    let _ = table;
    let heads = browser.execute(
        "return [...document.querySelectorAll('#role-deployments th')].map((th) => th.textContent)",
        vec![],
    );
    assert_eq!(heads, json!(["Time", "Deployment", "Result", ""]));
    shot(&browser, "role-columns");
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

/// The Logs page (issue 31): one row per deployment, with its schedule and result; opening it
/// shows its events, each linking to its text.
#[test]
fn the_logs_page_shows_one_row_per_deployment_with_its_result_and_its_events_when_opened() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let status = wait_for(SOON, || {
        let status = daemon.json("/v1/status")?;
        status["last_deployment"]["finished"]
            .is_u64()
            .then_some(status)
    })
    .unwrap_or_else(|| panic!("no deployment:\n{}", daemon.logs()));
    let deployment = status["last_deployment"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let hash = status["last_deployment"]["schedule"]
        .as_str()
        .unwrap()
        .to_string();
    let index = std::fs::read_to_string(storage.join("log/.index/latest")).unwrap();
    let ids: std::collections::BTreeSet<String> = index
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|l| l[1].as_str().unwrap().to_string())
        .collect();
    let events_of_last = index.lines().filter(|l| l.contains(&deployment)).count();
    assert!(events_of_last > 1, "{index}");

    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/logs", daemon.port));
    let row = format!("#log-rows tr.deployment[data-deployment='{deployment}']");
    // The texts as the waits read them: the page re-renders the rows as the log grows.
    let (_, text) = browser.wait_for_text_read(&row, "ok", SOON);
    assert!(text.contains(&hash[..8]), "{text}");
    assert!(text.contains("web") && text.contains("cache"), "{text}");
    let rows = browser.execute(
        "return [...document.querySelectorAll('#log-rows tr.deployment')].map((r) => r.dataset.deployment)",
        vec![],
    );
    let rows: Vec<String> = serde_json::from_value(rows).unwrap();
    assert_eq!(
        rows.iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        ids,
        "one row per deployment"
    );
    assert_eq!(rows.len(), ids.len(), "one row per deployment: {rows:?}");
    assert!(browser.find("#log-rows tr.detail").is_none());

    browser.click_on(&format!("{row} button.toggle"), None, SOON);
    let detail = format!("#log-rows tr.detail[data-deployment='{deployment}']");
    browser.wait_for_text(&detail, "RoleStart", SOON);
    let events = browser.execute(
        "return document.querySelectorAll(arguments[0] + ' table.events tbody tr').length",
        vec![json!(detail)],
    );
    assert_eq!(events, json!(events_of_last));
    browser.wait_for(&format!("{detail} a[href^='/tail/role/web/']"), SOON);

    // A template that does not render: the next deployment fails both roles, and says so.
    replace_file(
        &config.join("templates/minimal/v1/role.conf.hbs"),
        "{{#if unclosed}}\n",
    );
    let (code, _) = http_post(daemon.port, "/v1/force_render_all", "application/json", b"");
    assert_eq!(code, 200);
    let failed = wait_for(SOON, || {
        let status = daemon.json("/v1/status")?;
        let last = &status["last_deployment"];
        (last["id"] != deployment.as_str() && last["finished"].is_u64()).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("no second deployment:\n{}", daemon.logs()));
    let mut failed_roles: Vec<&str> = failed["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    failed_roles.sort();
    assert_eq!(failed_roles, ["cache", "web"], "{failed}");
    let second = failed["id"].as_str().unwrap();
    let (_, text) = browser.wait_for_text_read(
        &format!("#log-rows tr.deployment[data-deployment='{second}'] td.result"),
        "failed: ",
        SOON,
    );
    assert!(text.contains("cache") && text.contains("web"), "{text}");
    let (_, first) = browser.wait_for_text_read(&format!("{row} td.result"), "ok", SOON);
    assert_eq!(first, "ok");
    shot(&browser, "logs-deployments");
    // The role page: the failed attempt and the one before it, each with its result (a failing
    // role is tried again, so more failed attempts may follow).
    browser.click_on("#log-rows a[href='/roles/web']", None, SOON);
    let result_of = |id: &str| {
        let got = browser.execute(
            "const row = [...document.querySelectorAll('#role-deployments tbody tr')].find((r) => \
               r.children[1].textContent.startsWith(arguments[0])); \
             return row ? row.querySelector('td.result').textContent : null",
            vec![json!(id)],
        );
        got.as_str()
            .filter(|r| *r == "ok" || *r == "failed")
            .map(str::to_string)
    };
    let got = wait_for(SOON, || result_of(second))
        .unwrap_or_else(|| panic!("no result of {second} on the role page"));
    assert_eq!(got, "failed");
    // Waited for as well: a retry of the failing role reloads the index, and its results show
    // "…" until they are read again.
    let got = wait_for(SOON, || result_of(&deployment))
        .unwrap_or_else(|| panic!("no result of {deployment} on the role page"));
    assert_eq!(got, "ok");
    shot(&browser, "role-results");
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

/// The API page (issue 31) lists the route table the router serves (`/v1/routes`), every route
/// of it, and links the OpenAPI description, which this node serves as text.
#[test]
fn the_api_page_lists_every_route_of_the_route_table_and_links_the_openapi_description() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let table = wait_for(SOON, || daemon.json("/v1/routes"))
        .unwrap_or_else(|| panic!("no route table:\n{}", daemon.logs()));
    let paths: Vec<String> = table
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_string())
        .collect();
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/api", daemon.port));
    browser.wait_for_text("#routes", "/v1/graphql", SOON);
    let listed = browser.execute(
        "return [...document.querySelectorAll('#routes tbody tr td:first-child')].map((td) => td.textContent)",
        vec![],
    );
    let listed: Vec<String> = serde_json::from_value(listed).unwrap();
    assert_eq!(listed, paths);
    for wanted in [
        "/v1/graphql",
        "/v1/graphiql",
        "/v1/wait_action",
        "/v1/log/role/{role}/{file}",
        "/v1/log/{stream}/{file}",
    ] {
        assert!(listed.iter().any(|p| p == wanted), "{wanted}: {listed:?}");
    }
    let link = browser.wait_for("#openapi-link", SOON);
    assert_eq!(
        browser.attr(&link, "href").as_deref(),
        Some("/v1/openapi.yaml")
    );
    let (code, content_type, body) = get_typed(daemon.port, "/v1/openapi.yaml");
    assert_eq!(code, 200);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    assert!(body.contains("/v1/routes:"), "{body}");
    shot(&browser, "api");
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

/// Before the first status comes through the open `/v1/events` stream (issue 31, Pages 1), the
/// page says it is loading and the stream is not called live: the test holds the stream's body
/// back in the page (its `fetch` answers with the headers at once and the events only once
/// released), then lets it through.
#[test]
fn until_the_first_status_comes_the_page_says_it_is_loading_and_not_live() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    wait_for(SOON, || daemon.json("/v1/schedule"))
        .unwrap_or_else(|| panic!("no schedule:\n{}", daemon.logs()));
    let browser = Browser::start();
    browser.before_every_page(
        "const realFetch = window.fetch; let release; \
         const gate = new Promise((done) => { release = done; }); \
         window.releaseStatus = () => release(); \
         window.streamOpened = false; \
         window.fetch = async (input, init) => { \
           const response = await realFetch(input, init); \
           if (!String(input).includes('/v1/events')) return response; \
           window.streamOpened = true; \
           const body = new ReadableStream({async start(out) { \
             await gate; const reader = response.body.getReader(); \
             for (;;) { const {value, done} = await reader.read(); \
               if (done) { out.close(); return; } out.enqueue(value); } }}); \
           return new Response(body, {status: response.status, headers: response.headers}); \
         };",
    );
    browser.goto(&format!("http://127.0.0.1:{}/", daemon.port));
    wait_for(SOON, || {
        (browser.execute("return window.streamOpened === true", vec![]) == json!(true))
            .then_some(())
    })
    .expect("the page opens the stream");
    browser.wait_for_text("#status-loading", "Loading the status of this node", SOON);
    // The stream is open and its status held back; the page had its turn to react to the open
    // stream once a script run after it sees the same state.
    let live = browser.execute(
        "return new Promise((done) => setTimeout(() => \
           done(document.getElementById('live').textContent), 0))",
        vec![],
    );
    assert_eq!(live, json!("connecting"));
    shot(&browser, "loading");

    browser.execute("window.releaseStatus(); return null", vec![]);
    browser.wait_for_text("#live", "live", SOON);
    browser.wait_for_text("#roles-table", "web", SOON);
    assert!(browser.find("#status-loading").is_none());
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

#[test]
fn the_graphql_page_has_the_header_a_schema_explorer_and_completion_and_runs_a_query() {
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let browser = Browser::start();
    let base = format!("http://127.0.0.1:{}", daemon.port);
    browser.goto(&format!("{base}/v1/graphiql"));
    // The frontend's header, live, with its link marked.
    browser.wait_for_text("#live", "live", SOON);
    browser.wait_for_text("#nav a.active", "GraphQL", SOON);

    // The explorer lists Query's fields, with their types, and opens a field's type.
    browser.click_on("#gql-roots a", Some("Query"), SOON);
    browser.wait_for_text("#gql-type-name", "Query", SOON);
    let (_, fields_text) = browser.wait_for_text_read("#gql-type-fields", "status", SOON);
    assert!(fields_text.contains("status: Status"), "{}", fields_text);
    browser.click_on("#gql-type-fields a", Some("Status!"), SOON);
    browser.wait_for_text("#gql-type-name", "Status", SOON);
    browser.wait_for_text("#gql-type-fields", "hostname: String!", SOON);
    browser.click_on("#gql-back", None, SOON);
    browser.wait_for_text("#gql-type-name", "Query", SOON);

    // Completion: typed inside `status { }`, "hostn" offers `hostname`; Enter takes it.
    let editor = browser.wait_for("#gql-query", SOON);
    browser.execute(
        "const e = arguments[0]; e.value = '{\\n  status {\\n    \\n  }\\n}\\n';
         e.focus(); e.selectionStart = e.selectionEnd = '{\\n  status {\\n    '.length;",
        vec![editor.as_arg()],
    );
    browser.send_keys(&editor, "hostn");
    browser.wait_for_text("#gql-complete li", "hostname", SOON);
    shot(&browser, "graphql-completion");
    browser.send_keys(&editor, "\u{E007}");
    let value = browser.execute("return arguments[0].value", vec![editor.as_arg()]);
    assert_eq!(
        value.as_str().unwrap(),
        "{\n  status {\n    hostname\n  }\n}\n"
    );
    assert!(browser.find("#gql-complete:not([hidden])").is_none());

    // The query runs: the answer names this node.
    let hostname = daemon.json("/v1/status").unwrap()["hostname"]
        .as_str()
        .unwrap()
        .to_string();
    browser.click_on("#gql-run", None, SOON);
    browser.wait_for_text(
        "#gql-result",
        &format!("\"hostname\": \"{hostname}\""),
        SOON,
    );
    shot(&browser, "graphql");

    // The header links back to the frontend's pages.
    browser.click_on("#nav a[href='/roles']", None, SOON);
    browser.wait_for("#role-list", SOON);
    assert!(browser.url().ends_with("/roles"), "{}", browser.url());
    assert_eq!(notices(&browser), Vec::<String>::new());
    assert_eq!(browser.console_errors(), Vec::<String>::new());
}

#[test]
fn the_shadow_page_shows_each_shadows_diff_and_history() {
    let (_tmp, config, storage) = crate::shadow::site();
    crate::shadow_render::wide_shadow(&config);
    std::fs::write(
        config.join("scheduler/shadow.yaml"),
        "shadows: [twin, extra, fail, v1, wide]\n",
    )
    .unwrap();
    // A file where the twin's runs would be kept: its runs stay in memory, the page says so.
    std::fs::create_dir_all(storage.join("shadow")).unwrap();
    std::fs::write(storage.join("shadow/twin"), "in the way").unwrap();
    let daemon = crate::shadow::start(&config, &storage);
    daemon.wait_json(SOON, "/v1/schedule", "no schedule", |s| {
        s["hash"].is_string()
    });
    let (real, _) = crate::shadow::real_round(&daemon);
    for shadow in ["twin", "extra", "fail", "wide"] {
        crate::shadow::run_on(&daemon, shadow, &real);
    }
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/shadow", daemon.port));
    browser.wait_for_text("#live", "live", SOON);
    // The list, with each shadow's latest result.
    let (_, list) = browser.wait_for_text_read("#shadow-list", "extra", SOON);
    assert!(
        list.contains("twin") && list.contains("identical"),
        "{list}"
    );
    assert!(
        list.contains("differs in 1 path") && list.contains("failed"),
        "{list}"
    );
    // The diff, readably: the added path with the shadow's value; none for the twin.
    let (_, extra) = browser.wait_for_text_read("#shadow-diff-extra", "shadow_note", SOON);
    assert!(extra.contains("\"extra\""), "{extra}");
    browser.wait_for_text("#shadow-diff-twin", "Identical to the real schedule.", SOON);
    browser.wait_for_text("#shadow-diff-fail", "the failing shadow", SOON);
    browser.wait_for_text("#shadow-history-twin", "identical", SOON);
    browser.wait_for_text("#shadow-problems", "v1 is the scheduler in force", SOON);
    browser.wait_for_text(
        "#shadow-write-error-twin",
        "Not kept on disk: cannot write",
        SOON,
    );
    assert!(browser.find("#shadow-write-error-extra").is_none());
    // A shadow render of this node's web from `wide`'s schedule: the file diff. Only a shadow
    // whose latest run differs offers it.
    assert!(browser.find("#shadow-render-twin").is_none());
    assert!(browser.find("#shadow-render-fail").is_none());
    browser.click_on("#shadow-render-wide .shadow-render-role", Some("web"), SOON);
    let (_, render) = browser.wait_for_text_read("#shadow-render-wide", "no command was run", SOON);
    assert!(
        render.contains(
            "web: templates/minimal/v1 → templates/minimal/v1: 1 differing, 0 the same; no \
             command was run"
        ),
        "{render}"
    );
    assert!(
        render.contains("role.render.yaml:conf") && render.contains("-instances: 2\n+instances: 7"),
        "{render}"
    );
    assert_eq!(notices(&browser), Vec::<String>::new());
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

/// A one-node data center `dc` on a copy of `examples/minimal`, with the other DCs'
/// `entry_points` (YAML flow map) and short periods; signed with the site's key unless `keyless`.
fn dc_daemon(dir: &Path, dc: &str, entry_points: &str, keyless: bool) -> Daemon {
    dc_daemon_with(dir, dc, entry_points, keyless, |_| {})
}

/// [`dc_daemon`] with `edit` applied to its config dir before it starts.
fn dc_daemon_with(
    dir: &Path,
    dc: &str,
    entry_points: &str,
    keyless: bool,
    edit: impl FnOnce(&Path),
) -> Daemon {
    let key = if keyless {
        ""
    } else {
        "election:\n  key-file: cluster.key\n"
    };
    let settings = dir.join(format!("{dc}.yaml"));
    std::fs::write(
        &settings,
        format!(
            "datacenter: {dc}\n{key}datacenters:\n  entry-points: {entry_points}\n  \
             period-ms: 200\n  link-timeout-ms: 1000\n  exchange-timeout-ms: 500\n"
        ),
    )
    .unwrap();
    let config = dir.join(format!("config-{dc}"));
    copy_tree(&example("minimal"), &config);
    edit(&config);
    let storage = dir.join(format!("storage-{dc}"));
    Daemon::launch(
        &config,
        &storage,
        &["--settings", settings.to_str().unwrap()],
        &[],
    )
}

/// The Data centers page of `ams` with `fra` beside it: both DCs, the link up with its RTT and
/// traffic, a request another DC (`lon`, signed with the site's key) made, then `fra` stopped and
/// its link shown down, live. A node in no DC says so and how to set one; a DC without the key
/// shows the exchange off.
#[test]
fn the_datacenters_page_shows_each_dc_its_link_and_grants_and_a_link_going_down() {
    use verwalter_controllers::cluster::datacenters::wire::{DcKey, Envelope, Request};
    let key_bytes: &[u8] = b"a key shared by every node of the site";
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("cluster.key"), key_bytes).unwrap();
    // `fra` learns where `ams` is from `ams`'s first call (its entry point leads nowhere).
    let fra = dc_daemon(tmp.path(), "fra", "{ams: [\"127.0.0.1:9\"]}", false);
    let entry = format!(
        "{{fra: [\"127.0.0.1:{}\"], lon: [\"127.0.0.1:9\"]}}",
        fra.port
    );
    // ams's scheduler also asks a DC that is not a member: that entry is named, not used.
    let ams = dc_daemon_with(tmp.path(), "ams", &entry, false, |config| {
        let main = config.join("scheduler/v1/main.lua");
        let code = std::fs::read_to_string(&main).unwrap();
        let asks = "    schedule.datacenters = {requests = {nowhere = {{id = \"x\", data = {}, lease_ms = 60000}}}}\n    return json.encode(schedule)";
        std::fs::write(
            &main,
            code.replacen("    return json.encode(schedule)", asks, 1),
        )
        .unwrap();
    });
    let fra_addr = format!("127.0.0.1:{}", fra.port);
    // While the link is up, no error with `fra`.
    wait_for(SOON, || {
        let listing = ams.json("/v1/datacenters")?;
        (listing["dcs"]["fra"]["link"] == "up").then_some(())
    })
    .unwrap_or_else(|| panic!("no link:\n{}", ams.logs()));
    let listing = ams.json("/v1/datacenters").unwrap();
    assert!(listing["errors"].get("fra").is_none(), "{listing}");
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/datacenters", ams.port));
    browser.wait_for_text("#live", "live", SOON);
    browser.wait_for_text("#dc-self", "ams", SOON);
    browser.wait_for_text(
        "#dc-scheduler-errors",
        "datacenters.requests.nowhere[0]: \"nowhere\" is not a known data center",
        SOON,
    );
    let (_, fra_row) =
        browser.wait_for_text_read("#dc-table tr[data-dc='fra'] .dc-link", "up", SOON);
    assert!(fra_row.contains("RTT"), "{fra_row}");
    let (_, table) = browser.wait_for_text_read("#dc-table", "received", SOON);
    assert!(
        table.contains("this DC") && table.contains("alpha.test (this node)"),
        "{table}"
    );
    assert!(
        table.contains(&MACHINE_ID[..8]) && table.contains("lon"),
        "{table}"
    );
    // `lon` asks `ams` for workers: the request is listed with its time left.
    let key = DcKey::new(key_bytes).unwrap();
    let envelope = Envelope {
        v: 1,
        dc: "lon".into(),
        node: "77985419c732412ea38b94db00000009".into(),
        addr: "127.0.0.1:9".into(),
        epoch: 1,
        seq: 1,
        summary_hash: None,
        summary: None,
        have_summary: None,
        requests: vec![Request {
            id: "web-burst".into(),
            data: json!({"role": "web", "workers": 20}),
            lease_ms: 600_000,
        }],
        answers: Vec::new(),
    };
    let (body, tag) = key.seal(&envelope, 1 << 16).unwrap();
    let (code, _, text) = crate::datacenters::post_exchange(ams.port, &body, Some(&tag));
    assert_eq!(code, 200, "{text}");
    let (_, grants) = browser.wait_for_text_read("#dc-grants", "web-burst", SOON);
    assert!(
        grants.contains("requested from us") && grants.contains("min"),
        "{grants}"
    );
    shot(&browser, "datacenters");
    // `fra` stops: its link goes down on the page, without a reload.
    browser.execute("window.notReloaded = true; return null", vec![]);
    drop(fra);
    browser.wait_for_text("#dc-table tr[data-dc='fra'] .dc-link", "down", SOON);
    // Why: the last exchange's error, on the page as in /v1/datacenters and GraphQL.
    let (_, why) = browser.wait_for_text_read("#dc-errors tr[data-dc='fra']", &fra_addr, SOON);
    let listing = ams.json("/v1/datacenters").unwrap();
    let error = listing["errors"]["fra"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(error.starts_with(&fra_addr), "{listing}");
    assert!(why.contains(&fra_addr) && why.contains("ago"), "{why}");
    let query = r#"{"query": "{ datacenters { dcs { name lastError lastErrorAgeMs } } }"}"#;
    let (code, body) = http_post(
        ams.port,
        "/v1/graphql",
        "application/json",
        query.as_bytes(),
    );
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let gql_fra = &answer["data"]["datacenters"]["dcs"][0];
    assert_eq!(gql_fra["name"], "fra", "{answer}");
    assert!(
        gql_fra["lastError"]
            .as_str()
            .is_some_and(|e| e.starts_with(&fra_addr)),
        "{answer}"
    );
    assert!(gql_fra["lastErrorAgeMs"].is_number(), "{answer}");
    assert_eq!(
        browser.execute("return window.notReloaded === true", vec![]),
        json!(true)
    );
    assert_eq!(notices(&browser), Vec::<String>::new());
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");

    // A DC without the election's key: the exchange is off, and the page says why. (Each
    // daemon stops once the browser has left its page, so no stream of it breaks.)
    let keyless = dc_daemon(tmp.path(), "lon", "{fra: [\"127.0.0.1:9\"]}", true);
    browser.goto(&format!("http://127.0.0.1:{}/datacenters", keyless.port));
    browser.wait_for_text("#dc-exchange-off", "off: no election.key-file", SOON);
    drop(ams);

    // A node in no DC: the page says so and how to set one (its one request answers 404).
    let (_solo_tmp, config, storage) = example_site("minimal");
    let solo = Daemon::start(&config, &storage);
    browser.goto(&format!("http://127.0.0.1:{}/datacenters", solo.port));
    drop(keyless);
    browser.wait_for_text("#live", "live", SOON);
    let (_, none) = browser.wait_for_text_read("#dc-none", "in no data center", SOON);
    assert!(none.contains("datacenter:"), "{none}");
    let docs = browser.find("#dc-none a").expect("a link to the docs");
    assert!(
        browser
            .attr(&docs, "href")
            .is_some_and(|h| h.ends_with("docs/datacenters.md#settings")),
        "{none}"
    );
    assert_eq!(notices(&browser), Vec::<String>::new());
    let errors = browser.console_errors();
    assert!(
        errors
            .iter()
            .all(|e| e.contains("/v1/datacenters") && e.contains("404")),
        "console errors: {errors:#?}"
    );
}
