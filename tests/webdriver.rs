//! A small synchronous W3C WebDriver client for tests that drive headless Chromium through
//! chromedriver, and its self-test against the daemon.

use std::cell::RefCell;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::util::*;

/// The key under which W3C WebDriver passes element references in JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Longest wait for one command's answer; page loads are capped lower (`pageLoad` below), so a
/// hung driver shows up as an error here instead of a test that never ends.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);

/// How often the `wait_for*` methods look again.
const POLL: Duration = Duration::from_millis(50);

/// An element of the current page: the W3C element id chromedriver handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element(pub String);

impl Element {
    /// The element as an argument for [`Browser::execute`] (`arguments[i]` in the script).
    pub fn as_arg(&self) -> Value {
        json!({ ELEMENT_KEY: self.0 })
    }
}

/// A WebDriver session in headless Chromium; the session and chromedriver end when dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    /// Chromium's process id, to kill it should chromedriver fail to close it.
    browser_pid: Option<i32>,
    driver_log: PathBuf,
    /// Chromedriver hands out each console entry once; errors seen so far are kept here.
    console: RefCell<Vec<String>>,
    /// A fresh profile per session, so no state leaks between tests; removed after the drop.
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session. Panics when either program is
    /// missing: a browser test must fail rather than pass without a browser.
    pub fn start() -> Browser {
        let driver = locate("CHROMEDRIVER", "chromedriver");
        let chromium = locate("CHROMIUM", "chromium");
        if driver.is_none() || chromium.is_none() {
            let missing: Vec<&str> = [("chromedriver", &driver), ("chromium", &chromium)]
                .into_iter()
                .filter(|(_, found)| found.is_none())
                .map(|(name, _)| name)
                .collect();
            panic!(
                "browser tests need {} (looked at $CHROMEDRIVER/$CHROMIUM, /usr/bin and PATH): \
                 on Debian `apt-get install chromium chromium-driver`, elsewhere set \
                 CHROMIUM=/path/to/chromium and CHROMEDRIVER=/path/to/chromedriver",
                missing.join(" and ")
            );
        }
        let (driver, chromium) = (driver.unwrap(), chromium.unwrap());
        let (child, port, driver_log) = spawn_driver(&driver);
        let profile = tempfile::tempdir().unwrap();
        let capabilities = json!({
            "capabilities": {"alwaysMatch": {
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless",
                        // Chromium refuses to start as root with its sandbox (CI runs as root).
                        "--no-sandbox",
                        "--disable-gpu",
                        // Without these Chromium keeps dialing Google's services, which on a
                        // closed network floods the logs with refused connections.
                        "--disable-quic",
                        "--no-first-run",
                        "--disable-background-networking",
                        "--disable-component-update",
                        "--disable-sync",
                        // Containers often have a tiny /dev/shm; Chromium crashes when it fills.
                        "--disable-dev-shm-usage",
                        "--window-size=1280,900",
                        format!("--user-data-dir={}", profile.path().display()),
                    ],
                },
                "goog:loggingPrefs": {"browser": "ALL"},
                // A dialog stays open until the test answers it: the default would dismiss a
                // confirm behind the test's back on its next command.
                "unhandledPromptBehavior": "ignore",
                "timeouts": {"implicit": 0, "pageLoad": 60_000, "script": 30_000},
            }}
        });
        let mut browser = Browser {
            driver: child,
            port,
            session: String::new(),
            browser_pid: None,
            driver_log,
            console: RefCell::new(Vec::new()),
            _profile: profile,
        };
        match browser.call("POST", "/session", Some(capabilities)) {
            Ok(created) => {
                browser.session = created["sessionId"]
                    .as_str()
                    .expect("a new session has an id")
                    .to_string();
                browser.browser_pid = created["capabilities"]["goog:processID"]
                    .as_i64()
                    .and_then(|pid| i32::try_from(pid).ok());
            }
            Err(failure) => panic!(
                "chromedriver cannot start {}: {failure}\nchromedriver log {}:\n{}",
                chromium.display(),
                browser.driver_log.display(),
                std::fs::read_to_string(&browser.driver_log).unwrap_or_default()
            ),
        }
        browser
    }

    /// Opens `url` and waits for the page to load.
    pub fn goto(&self, url: &str) {
        let done = self.cmd("POST", "/url", Some(json!({ "url": url })));
        self.must(done, || format!("cannot open {url}"));
    }

    pub fn url(&self) -> String {
        let url = self.must(self.cmd("GET", "/url", None), || {
            "cannot read the current URL".to_string()
        });
        url.as_str().unwrap_or_default().to_string()
    }

    /// The first element matching the CSS selector `css`, if any (no waiting).
    pub fn find(&self, css: &str) -> Option<Element> {
        match self.cmd("POST", "/element", Some(by_css(css))) {
            Ok(found) => Some(element(&found)),
            Err(failure) if failure.error == "no such element" => None,
            Err(failure) => self.fail(failure, || format!("cannot look for `{css}`")),
        }
    }

    /// All elements matching the CSS selector `css`, in document order (no waiting).
    pub fn find_all(&self, css: &str) -> Vec<Element> {
        let found = self.must(self.cmd("POST", "/elements", Some(by_css(css))), || {
            format!("cannot look for `{css}`")
        });
        found
            .as_array()
            .into_iter()
            .flatten()
            .map(element)
            .collect()
    }

    /// Polls until an element matches `css`; panics after `timeout`.
    pub fn wait_for(&self, css: &str, timeout: Duration) -> Element {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.find(css) {
                return found;
            }
            if Instant::now() > deadline {
                panic!(
                    "no element matches `{css}` within {timeout:?} ({})",
                    self.whereabouts()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Polls until an element matching `css` has a text containing `needle`; panics after
    /// `timeout` with the texts it saw last.
    pub fn wait_for_text(&self, css: &str, needle: &str, timeout: Duration) -> Element {
        self.wait_for_text_read(css, needle, timeout).0
    }

    /// As [`Browser::wait_for_text`], with the text that matched: on a page that re-renders, the
    /// element may be gone by the next read (a stale element), the text read here is not.
    pub fn wait_for_text_read(
        &self,
        css: &str,
        needle: &str,
        timeout: Duration,
    ) -> (Element, String) {
        let deadline = Instant::now() + timeout;
        loop {
            let mut seen = Vec::new();
            for candidate in self.find_all(css) {
                // A page that re-renders between the search and the read makes the element
                // stale; that is the same as "not there yet".
                match self.cmd("GET", &format!("/element/{}/text", candidate.0), None) {
                    Ok(text) => {
                        let text = text.as_str().unwrap_or_default().to_string();
                        if text.contains(needle) {
                            return (candidate, text);
                        }
                        seen.push(text);
                    }
                    Err(failure) if failure.error == "stale element reference" => {}
                    Err(failure) => {
                        self.fail(failure, || format!("cannot read the text of `{css}`"))
                    }
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "no element matching `{css}` has text containing {needle:?} within \
                     {timeout:?} ({}); texts of the matches: {seen:?}",
                    self.whereabouts()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The rendered (visible) text of `element`.
    pub fn text(&self, element: &Element) -> String {
        let text = self.cmd("GET", &format!("/element/{}/text", element.0), None);
        let text = self.must(text, || format!("cannot read the text of {element:?}"));
        text.as_str().unwrap_or_default().to_string()
    }

    /// The HTML attribute `name` of `element`; `None` when it is not set.
    pub fn attr(&self, element: &Element, name: &str) -> Option<String> {
        let path = format!("/element/{}/attribute/{name}", element.0);
        let value = self.must(self.cmd("GET", &path, None), || {
            format!("cannot read attribute {name:?} of {element:?}")
        });
        value.as_str().map(String::from)
    }

    /// Clicks the first element matching `css` whose text is `text` (any text with `None`),
    /// waiting for one; when the page replaces it between the search and the click (a live page
    /// re-rendering), it looks again. Panics after `timeout`.
    pub fn click_on(&self, css: &str, text: Option<&str>, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            for candidate in self.find_all(css) {
                let matches = match text {
                    None => Ok(true),
                    Some(text) => self
                        .cmd("GET", &format!("/element/{}/text", candidate.0), None)
                        .map(|t| t.as_str() == Some(text)),
                };
                let clicked = matches.and_then(|m| {
                    m.then(|| {
                        let path = format!("/element/{}/click", candidate.0);
                        self.cmd("POST", &path, Some(json!({})))
                    })
                    .transpose()
                });
                match clicked {
                    Ok(Some(_)) => return,
                    Ok(None) => {}
                    Err(failure) if failure.error == "stale element reference" => {}
                    Err(failure) => self.fail(failure, || format!("cannot click `{css}`")),
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "nothing to click matches `{css}` with text {text:?} within {timeout:?} ({})",
                    self.whereabouts()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    pub fn click(&self, element: &Element) {
        let path = format!("/element/{}/click", element.0);
        let done = self.cmd("POST", &path, Some(json!({})));
        self.must(done, || format!("cannot click {element:?}"));
    }

    /// Runs `source` in every page this browser opens from now on, before the page's own
    /// scripts (Chrome DevTools' `Page.addScriptToEvaluateOnNewDocument`): a test's hook into
    /// what the page sees, e.g. a `fetch` that holds an answer back.
    pub fn before_every_page(&self, source: &str) {
        let body = json!({
            "cmd": "Page.addScriptToEvaluateOnNewDocument",
            "params": { "source": source },
        });
        self.must(self.cmd("POST", "/goog/cdp/execute", Some(body)), || {
            "cannot add a script to every page".to_string()
        });
    }

    /// Types `text` into `element` as a user would, key by key (WebDriver's special keys, e.g.
    /// `\u{E007}` Enter, are pressed as keys).
    pub fn send_keys(&self, element: &Element, text: &str) {
        let path = format!("/element/{}/value", element.0);
        let done = self.cmd("POST", &path, Some(json!({ "text": text })));
        self.must(done, || format!("cannot type into {element:?}"));
    }

    /// Runs `script` as a function body in the page (`arguments[i]` are `args`; elements go in
    /// as [`Element::as_arg`]) and returns what it returns.
    pub fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        let body = json!({ "script": script, "args": args });
        self.must(self.cmd("POST", "/execute/sync", Some(body)), || {
            format!("script failed: {script}")
        })
    }

    /// Waits until an `alert`/`confirm`/`prompt` dialog is open (the page's script is then
    /// blocked in it) and returns its text, leaving it open.
    pub fn wait_for_alert(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            match self.cmd("GET", "/alert/text", None) {
                Ok(text) => return text.as_str().unwrap_or_default().to_string(),
                Err(failure) if failure.error == "no such alert" && Instant::now() < deadline => {
                    std::thread::sleep(POLL);
                }
                Err(failure) => self.fail(failure, || "no dialog opened".to_string()),
            }
        }
    }

    /// Accepts an open `alert`/`confirm`/`prompt` dialog and returns its text; `None` when no
    /// dialog is open.
    pub fn accept_alert_if_any(&self) -> Option<String> {
        let text = match self.cmd("GET", "/alert/text", None) {
            Ok(text) => text.as_str().unwrap_or_default().to_string(),
            Err(failure) if failure.error == "no such alert" => return None,
            Err(failure) => self.fail(failure, || "cannot read the dialog".to_string()),
        };
        let done = self.cmd("POST", "/alert/accept", Some(json!({})));
        self.must(done, || format!("cannot accept the dialog {text:?}"));
        Some(text)
    }

    /// Writes a PNG of the viewport to `path`, creating its directory.
    pub fn screenshot(&self, path: &Path) {
        let encoded = self.must(self.cmd("GET", "/screenshot", None), || {
            format!("cannot take a screenshot for {}", path.display())
        });
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("the screenshot is not base64: {e}"));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    /// Messages of all console errors (level SEVERE: `console.error`, uncaught exceptions,
    /// failed loads) since the session started.
    pub fn console_errors(&self) -> Vec<String> {
        // Chromedriver's own endpoint (there is no W3C one); `GET /session/{id}/log` is not
        // routed by chromedriver.
        let fresh = self.cmd("POST", "/se/log", Some(json!({ "type": "browser" })));
        let fresh = self.must(fresh, || "cannot read the browser console log".to_string());
        let mut errors = self.console.borrow_mut();
        errors.extend(
            fresh
                .as_array()
                .into_iter()
                .flatten()
                .filter(|entry| entry["level"] == "SEVERE")
                .map(|entry| entry["message"].as_str().unwrap_or_default().to_string()),
        );
        errors.clone()
    }

    /// A command of this session: `path` is relative to `/session/{id}`.
    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Failure> {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// A chromedriver request; `Ok` holds the answer's `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Failure> {
        let (code, body) =
            http(self.port, method, path, body.as_ref(), COMMAND_TIMEOUT).map_err(|e| Failure {
                error: "transport".to_string(),
                message: format!("{method} {path}: {e}"),
            })?;
        let mut answer: Value = serde_json::from_slice(&body).map_err(|e| Failure {
            error: "transport".to_string(),
            message: format!(
                "{method} {path}: answer {code} is not JSON ({e}): {}",
                String::from_utf8_lossy(&body)
            ),
        })?;
        let value = answer["value"].take();
        match value["error"].as_str() {
            Some(error) => Err(Failure {
                error: error.to_string(),
                message: value["message"].as_str().unwrap_or_default().to_string(),
            }),
            None if code >= 400 => Err(Failure {
                error: format!("HTTP {code}"),
                message: value.to_string(),
            }),
            None => Ok(value),
        }
    }

    fn must(&self, result: Result<Value, Failure>, what: impl FnOnce() -> String) -> Value {
        result.unwrap_or_else(|failure| self.fail(failure, what))
    }

    fn fail(&self, failure: Failure, what: impl FnOnce() -> String) -> ! {
        panic!("{}: {failure} ({})", what(), self.whereabouts())
    }

    /// Where the browser is, for panic messages: the URL and the start of the page's text.
    /// Never panics itself (it runs while a panic is being composed).
    fn whereabouts(&self) -> String {
        let url = match self.cmd("GET", "/url", None) {
            Ok(url) => url.as_str().unwrap_or_default().to_string(),
            Err(failure) => return format!("current URL unknown: {failure}"),
        };
        let script = json!({
            "script": "return document.body ? document.body.innerText : ''",
            "args": [],
        });
        let text = match self.cmd("POST", "/execute/sync", Some(script)) {
            Ok(text) => text
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect(),
            Err(failure) => format!("<unreadable: {failure}>"),
        };
        format!("current URL {url}, page text starts {text:?}")
    }

    /// Kills Chromium by its process id, if that process is still Chromium (the id could have
    /// been reused).
    fn kill_browser(&self) {
        let Some(pid) = self.browser_pid else {
            return;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.starts_with("chrom") {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Deleting the session makes chromedriver close Chromium; killing chromedriver alone
        // would leave Chromium running.
        if !self.session.is_empty() && self.cmd("DELETE", "", None).is_err() {
            self.kill_browser();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A WebDriver error (`error` is the W3C code, e.g. `no such element`) or a transport failure.
#[derive(Debug)]
struct Failure {
    error: String,
    message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.error, self.message)
    }
}

/// `<target>/screenshots`, where browser tests leave their pictures.
pub fn screenshot_dir() -> PathBuf {
    target_dir().join("screenshots")
}

/// The cargo target dir: the test executable runs from `<target>/<profile>/deps`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .nth(3)
        .expect("the test runs from <target>/<profile>/deps")
        .to_path_buf()
}

/// `$VAR` if set (it must exist then), else `/usr/bin/<name>`, else `<name>` on PATH.
fn locate(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(var) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{var}={} does not exist (unset it to use /usr/bin/{name})",
            path.display()
        );
        return Some(path);
    }
    let default = Path::new("/usr/bin").join(name);
    if default.is_file() {
        return Some(default);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// Starts chromedriver with `--port=0` (the system picks a free port, which chromedriver
/// prints: "... started successfully on port N.") and waits until it reports ready.
fn spawn_driver(driver: &Path) -> (Child, u16, PathBuf) {
    let log_dir = target_dir().join("webdriver");
    std::fs::create_dir_all(&log_dir).unwrap();
    // One log per driver: browser tests run in parallel threads of one process.
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = log_dir.join(format!("chromedriver-{}-{nth}.log", std::process::id()));
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(driver)
        .arg("--port=0")
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", driver.display()));
    let ready = wait_for(Duration::from_secs(20), || {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(Err(status));
        }
        let text = std::fs::read_to_string(&log).ok()?;
        let port: u16 = text
            .lines()
            .find_map(|l| l.split("started successfully on port ").nth(1))?
            .trim_end_matches('.')
            .trim()
            .parse()
            .ok()?;
        driver_ready(port).then_some(Ok(port))
    });
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    match ready {
        Some(Ok(port)) => (child, port, log),
        Some(Err(status)) => panic!(
            "chromedriver exited ({status}) before it was ready; log {}:\n{}",
            log.display(),
            log_text()
        ),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromedriver not ready within 20s; log {}:\n{}",
                log.display(),
                log_text()
            );
        }
    }
}

/// Whether chromedriver's `/status` says it takes new sessions.
fn driver_ready(port: u16) -> bool {
    match http(port, "GET", "/status", None, Duration::from_secs(2)) {
        Ok((200, body)) => serde_json::from_slice::<Value>(&body)
            .is_ok_and(|status| status["value"]["ready"] == true),
        _ => false,
    }
}

fn by_css(css: &str) -> Value {
    json!({ "using": "css selector", "value": css })
}

fn element(reference: &Value) -> Element {
    let id = reference[ELEMENT_KEY]
        .as_str()
        .unwrap_or_else(|| panic!("not an element reference: {reference}"));
    Element(id.to_string())
}

/// One HTTP/1.1 request to 127.0.0.1:`port` on its own connection, with a JSON body if given.
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> io::Result<(u16, Vec<u8>)> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    if !body.is_empty() {
        request.push_str("Content-Type: application/json; charset=utf-8\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes())?;
    read_response(BufReader::new(stream))
}

/// Reads one HTTP/1.1 response: the status code and the body, framed by chunked transfer
/// encoding, by Content-Length, or (neither given) by the end of the stream.
fn read_response(mut reader: impl BufRead) -> io::Result<(u16, Vec<u8>)> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {line:?}")))?;
    let mut length = None;
    let mut chunked = false;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(bad("the connection closed inside the headers".to_string()));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let parsed = value.parse::<usize>();
            length = Some(parsed.map_err(|_| bad(format!("bad Content-Length {value:?}")))?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            // The size may carry extensions after `;`; they are ignored.
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16)
                .map_err(|_| bad(format!("bad chunk size line {line:?}")))?;
            if size == 0 {
                // Trailer fields until the blank line that ends the message.
                loop {
                    line.clear();
                    if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                        break;
                    }
                }
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..])?;
            let mut crlf = [0; 2];
            reader.read_exact(&mut crlf)?;
            if &crlf != b"\r\n" {
                return Err(bad("a chunk does not end with CRLF".to_string()));
            }
        }
    } else if let Some(length) = length {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok((code, body))
}

#[test]
fn responses_are_framed_by_length_chunks_or_the_end_of_the_stream() {
    let sized = b"HTTP/1.1 200 OK\r\nContent-Length:7\r\n\r\n{\"a\":1}trailing junk";
    assert_eq!(
        read_response(&sized[..]).unwrap(),
        (200, b"{\"a\":1}".to_vec())
    );
    let chunked = b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n\
                    3\r\n{\"a\r\n4;ext=1\r\n\":1}\r\n0\r\nX-Trailer: 1\r\n\r\n";
    assert_eq!(
        read_response(&chunked[..]).unwrap(),
        (404, b"{\"a\":1}".to_vec())
    );
    let unframed = b"HTTP/1.0 200 OK\r\n\r\nall of it";
    assert_eq!(
        read_response(&unframed[..]).unwrap(),
        (200, b"all of it".to_vec())
    );
    let cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort";
    assert!(read_response(&cut[..]).is_err());
}

#[test]
fn webdriver_client_drives_headless_chromium_against_the_daemon() {
    const SOON: Duration = Duration::from_secs(10);
    let (_tmp, config, storage) = example_site("minimal");
    let daemon = Daemon::start(&config, &storage);
    let port = daemon.port;
    wait_for(SOON, || daemon.json("/v1/status"))
        .unwrap_or_else(|| panic!("no /v1/status:\n{}", daemon.logs()));

    let browser = Browser::start();
    let url = format!("http://127.0.0.1:{port}/v1/status.pretty");
    browser.goto(&url);
    assert_eq!(browser.url(), url);
    let body = browser.wait_for_text("body", "\"hostname\": \"alpha\"", SOON);
    assert!(browser.text(&body).contains("\"hostname\": \"alpha\""));
    assert_eq!(browser.find_all("body"), vec![body.clone()]);
    assert_eq!(browser.find("#not-on-this-page"), None);

    // Scripts: plain values and elements both ways.
    assert_eq!(browser.execute("return 1 + 1", vec![]), json!(2));
    let tag = browser.execute("return arguments[0].tagName", vec![body.as_arg()]);
    assert_eq!(tag, "BODY");

    // A button that asks for confirmation: click, accept, see the answer in an attribute.
    assert_eq!(browser.accept_alert_if_any(), None);
    browser.execute(
        "const button = document.createElement('button');
         button.id = 'ask';
         button.textContent = 'Ask';
         button.onclick = () => { document.body.dataset.answer = confirm('Sure?') ? 'yes' : 'no'; };
         document.body.appendChild(button);",
        vec![],
    );
    let button = browser.wait_for("#ask", SOON);
    assert_eq!(browser.attr(&body, "data-answer"), None);
    browser.click(&button);
    assert_eq!(browser.accept_alert_if_any().as_deref(), Some("Sure?"));
    browser.wait_for("body[data-answer=yes]", SOON);
    assert_eq!(browser.attr(&body, "data-answer").as_deref(), Some("yes"));

    let shot = screenshot_dir().join("webdriver-selftest.png");
    let _ = std::fs::remove_file(&shot);
    browser.screenshot(&shot);
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        shot.display()
    );

    assert_eq!(browser.console_errors(), Vec::<String>::new());
}
