//! The built-in web frontend in headless Chromium against a daemon on a temp copy of
//! `examples/minimal`: the overview shows the leader and the roles and follows changes without a
//! reload, a version button and a global action change the schedule, the re-render button starts
//! a deployment, the log pages show it, and nothing is logged to the console. Screenshots go to
//! `<target>/screenshots/frontend-*.png`.

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
    let roles = browser.wait_for_text("#roles-table", "web", SOON);
    assert!(browser.text(&roles).contains("cache"));
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
    let rows = browser.wait_for_text("#log-rows", &deployment, SOON);
    assert!(browser.text(&rows).contains("RoleStart"));
    shot(&browser, "logs");
    // The row of web's RoleStart in that deployment links to its text.
    let opened = browser.execute(
        "const row = [...document.querySelectorAll('#log-rows tr')].find((r) => \
           r.textContent.includes(arguments[0]) && r.textContent.includes('RoleStart')); \
         const a = row && row.querySelector('a[href^=\"/tail/role/web/\"]'); \
         if (a) a.click(); return !!a",
        vec![json!(deployment)],
    );
    assert_eq!(
        opened,
        json!(true),
        "no RoleStart row of web for {deployment}"
    );
    let tail = browser.wait_for_text("#tail", "web: RoleStart", SOON);
    let text = browser.text(&tail);
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
    let nodes = browser.wait_for_text("#nodes", "gamma", SOON);
    let text = browser.text(&nodes);
    for name in crate::cluster::NAMES {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    assert!(text.contains("leader"), "{text}");
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
    let processes = browser.wait_for_text("#role", "app.v7", SOON);
    assert!(browser.text(&processes).contains("two workers"));

    // A process row's button: the action, the node and process it is on, its data, the role.
    browser.click_on("#role table button[data-action='incr']", None, SOON);
    let results = browser.wait_for_text("#action-results", "echo", SOON);
    let text = browser.text(&results);
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
fn a_role_page_says_it_is_loading_until_the_status_comes_and_retries_a_full_stream_cap() {
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
    browser.goto(&format!("http://127.0.0.1:{}/roles/web", daemon.port));
    let content = browser.wait_for_text("#role-loading", "Loading the schedule", SOON);
    assert!(!browser.text(&content).contains("No role"));
    let page = browser.execute("return document.body.innerText", vec![]);
    assert!(!page.as_str().unwrap().contains("No role"), "{page}");
    shot(&browser, "role-loading");

    // Once the stream is free the page connects again by itself and shows the role.
    drop(held);
    browser.wait_for("#versions button", Duration::from_secs(60));
    assert!(browser.find("#role-loading").is_none());
}
