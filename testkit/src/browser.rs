//! [`Browser`]: a real headless Chromium driven over WebDriver, for tests that look at the dashboard as a
//! person would — load a page, wait for what its JavaScript renders, fill a form, click, take a screenshot.
//!
//! Two children of the test: Debian's `chromium`, started here (not by chromedriver) so that it is forked by
//! [`children::spawn`] and dies with the test binary even when that binary is SIGKILLed — a Chromium that
//! chromedriver starts is reparented to init when chromedriver is killed, and lives on; and `chromedriver`
//! on a free loopback port, attached to that Chromium through its DevTools port (`debuggerAddress`).
//! [`fantoccini`] speaks WebDriver to chromedriver over plain HTTP on loopback. Nothing waits for a fixed
//! time: every wait polls for the awaited thing (an element, a value) every 100 ms up to a generous
//! deadline, and a deadline that passes fails the test with the page's address and source.
//!
//! The handle is synchronous, like the rest of the harness: it owns a small tokio runtime and blocks on
//! each WebDriver command. Dropping it ends the session, then SIGKILLs Chromium with every process under
//! it and chromedriver, by pid.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{json, Value};

use crate::children::{self, Process};

/// How long Chromium and chromedriver may take to start, and a session to open, on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`Browser::text`], [`Browser::attr`], [`Browser::fill`] and [`Browser::click`] wait for
/// their element to appear.
pub const WAIT: Duration = Duration::from_secs(30);
/// How often waits look again.
const POLL: Duration = Duration::from_millis(100);
/// The Chromium that Debian's `chromium` package installs (a script that execs the browser).
const CHROMIUM: &str = "/usr/bin/chromium";

/// A headless Chromium with a WebDriver session on it; Chromium and chromedriver are killed on drop.
pub struct Browser {
    /// `None` only once [`Drop`] has closed the session.
    client: Option<Client>,
    runtime: tokio::runtime::Runtime,
    chromium: Child,
    /// `None` until chromedriver answers.
    driver: Option<Child>,
    /// The profile (`--user-data-dir`) and both logs.
    dir: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium (`--headless=new`, 1280×900) and chromedriver, and opens a session on about:blank;
    /// panics with their logs if either does not come up within a minute.
    pub fn start() -> Browser {
        crate::require_program("chromium", "chromium");
        crate::require_program("chromedriver", "chromium-driver");
        let dir = tempfile::Builder::new()
            .prefix("redcron-browser-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let mut chromium = start_chromium(dir.path());
        let devtools = devtools_port(dir.path(), &mut chromium);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("cannot start a tokio runtime");
        let mut browser = Browser {
            client: None,
            runtime,
            chromium,
            driver: None,
            dir,
        };
        // Started again on another port if someone took the first one before chromedriver could bind it.
        let port = (0..5).find_map(|_| browser.start_chromedriver());
        let Some(port) = port else {
            panic!("chromedriver did not answer /status:\n{}", browser.logs());
        };
        let mut capabilities = Capabilities::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({ "debuggerAddress": format!("127.0.0.1:{devtools}") }),
        );
        let session = browser.block_on(async {
            tokio::time::timeout(
                START_TIMEOUT,
                ClientBuilder::new(HttpConnector::new())
                    .capabilities(capabilities)
                    .connect(&format!("http://127.0.0.1:{port}")),
            )
            .await
        });
        match session {
            Ok(Ok(client)) => browser.client = Some(client),
            Ok(Err(e)) => panic!("chromedriver refused a session: {e}\n{}", browser.logs()),
            Err(_) => panic!("no session within {START_TIMEOUT:?}\n{}", browser.logs()),
        }
        browser
    }

    /// Loads `url` and waits until the page has loaded (WebDriver's "normal" load strategy).
    pub fn goto(&self, url: &str) {
        self.command(&format!("load {url}"), |client| client.goto(url));
    }

    /// The address of the page shown now (after redirects and form posts).
    pub fn url(&self) -> String {
        self.command("read the address", |client| client.current_url())
            .to_string()
    }

    /// Waits up to `timeout` until an element matches the CSS selector `css`; panics with the page's
    /// source if none does.
    pub fn wait_for(&self, css: &str, timeout: Duration) {
        self.wait_until(
            &format!("an element matching {css:?}"),
            timeout,
            |browser| browser.query(css, "true").is_some(),
        );
    }

    /// Waits up to `timeout` until `condition` holds, looking every 100 ms; panics naming `what`, with the
    /// page's address and source, if it never does.
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut condition: impl FnMut(&Browser) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        while !condition(self) {
            if Instant::now() >= deadline {
                panic!(
                    "waited {timeout:?} for {what} on {}; the page:\n{}",
                    self.url(),
                    truncated(&self.source(), 8_000)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The rendered text (`innerText`) of the first element matching `css`, once there is one.
    pub fn text(&self, css: &str) -> String {
        self.wait_for(css, WAIT);
        self.query(css, "e.innerText").unwrap_or_default()
    }

    /// Attribute `name` of the first element matching `css` (`None` if it has no such attribute), once
    /// there is such an element.
    pub fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.wait_for(css, WAIT);
        let script = format!("e.getAttribute({})", json!(name));
        self.query(css, &script)
    }

    /// The number of elements matching `css` now (no waiting).
    pub fn count(&self, css: &str) -> usize {
        let script = "return document.querySelectorAll(arguments[0]).length";
        let n = self.command(&format!("count {css:?}"), |client| {
            client.execute(script, vec![json!(css)])
        });
        n.as_u64().map_or(0, |n| n as usize)
    }

    /// Types `value` into the field matching `css` (once there is one), replacing what it held.
    pub fn fill(&self, css: &str, value: &str) {
        self.on_element(css, "fill", |field| async move {
            field.clear().await?;
            field.send_keys(value).await
        });
    }

    /// Clicks the element matching `css` (once there is one) and, if that loads a page, waits for it.
    pub fn click(&self, css: &str) {
        self.on_element(css, "click", |element| async move { element.click().await });
    }

    /// The page's HTML as the browser holds it now.
    pub fn source(&self) -> String {
        self.command("read the page source", |client| client.source())
    }

    /// Writes a PNG of the window (1280×900) to `path`, creating its directory.
    pub fn screenshot(&self, path: impl AsRef<Path>) {
        let path = path.as_ref();
        let png = self.command("take a screenshot", |client| client.screenshot());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
        }
        std::fs::write(path, png)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    /// Runs a fantoccini command on the session, for what the helpers above do not cover.
    pub fn run<'a, F, T>(&'a self, command: impl FnOnce(&'a Client) -> F) -> T
    where
        F: Future<Output = Result<T, fantoccini::error::CmdError>>,
    {
        self.command("run a command", command)
    }

    /// `expression` (JavaScript over `e`, the first element matching `css`) as a string, or `None` if
    /// nothing matches or it is null. One script, so an element the page's JavaScript replaces between
    /// finding and reading it cannot fail the read.
    fn query(&self, css: &str, expression: &str) -> Option<String> {
        let script = format!(
            "const e = document.querySelector(arguments[0]); \
             if (!e) return null; const v = {expression}; return v === null ? null : String(v);"
        );
        let value = self.command(&format!("query {css:?}"), |client| {
            client.execute(&script, vec![json!(css)])
        });
        match value {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Runs `action` on the element matching `css` once there is one, again on the new element if the
    /// page's script replaced it meanwhile (a live update swaps `#content`'s elements for new ones).
    fn on_element<F>(&self, css: &str, what: &str, action: impl Fn(Element) -> F)
    where
        F: Future<Output = Result<(), fantoccini::error::CmdError>>,
    {
        for _ in 0..5 {
            self.wait_for(css, WAIT);
            let client = self
                .client
                .as_ref()
                .expect("the session is open until drop");
            let done = self.block_on(async {
                let element = client.find(Locator::Css(css)).await?;
                action(element).await
            });
            match done {
                Ok(()) => return,
                Err(e) if e.is_stale_element_reference() || e.is_no_such_element() => continue,
                Err(e) => panic!("cannot {what} {css:?} in the browser: {e}"),
            }
        }
        panic!("cannot {what} {css:?}: the page replaced it five times in a row");
    }

    /// Blocks on one WebDriver command; panics saying what was being done if it fails.
    fn command<'a, F, T>(&'a self, what: &str, command: impl FnOnce(&'a Client) -> F) -> T
    where
        F: Future<Output = Result<T, fantoccini::error::CmdError>>,
    {
        let client = self
            .client
            .as_ref()
            .expect("the session is open until drop");
        self.block_on(command(client))
            .unwrap_or_else(|e| panic!("cannot {what} in the browser: {e}"))
    }

    fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Starts chromedriver on a loopback port that was free a moment ago and waits until it answers
    /// `GET /status` with `ready: true`; `None` (and no chromedriver) if it exits or the start timeout
    /// passes first.
    fn start_chromedriver(&mut self) -> Option<u16> {
        let port = crate::free_port();
        let mut command = Command::new("chromedriver");
        command
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                self.dir.path().join("chromedriver.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let driver =
            children::spawn(command).unwrap_or_else(|e| panic!("cannot run chromedriver: {e}"));
        let driver = self.driver.insert(driver);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline && matches!(driver.try_wait(), Ok(None)) {
            if status(port).is_some_and(|status| status["value"]["ready"] == true) {
                return Some(port);
            }
            std::thread::sleep(POLL);
        }
        children::kill_and_reap(driver);
        self.driver = None;
        None
    }

    /// Both logs, for a failure message.
    fn logs(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "--- chromedriver.log ---\n{}\n--- chromium.log ---\n{}",
            truncated(&read("chromedriver.log"), 8_000),
            truncated(&read("chromium.log"), 8_000)
        )
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // A browser that hangs must not hang the test: the kills below end it either way.
            let _ = self.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(10), client.close()).await
            });
        }
        // Chromium's helpers (zygotes, renderers, the GPU and network processes) exit with it; killed by
        // pid all the same, in case one is slow to notice.
        let helpers: Vec<Process> = children::descendants(self.chromium.id());
        children::kill_and_reap(&mut self.chromium);
        helpers.iter().for_each(|process| process.kill());
        if let Some(driver) = &mut self.driver {
            children::kill_and_reap(driver);
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// Starts headless Chromium with a DevTools port of its choosing (written to `DevToolsActivePort` in the
/// profile) and nothing that reaches out to the network by itself.
fn start_chromium(dir: &Path) -> Child {
    let log = std::fs::File::create(dir.join("chromium.log")).expect("cannot create a log file");
    let mut command = Command::new(CHROMIUM);
    command
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--password-store=basic",
        ])
        .arg(format!("--user-data-dir={}", profile(dir).display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cannot duplicate a file handle"))
        .stderr(log);
    children::spawn(command).unwrap_or_else(|e| panic!("cannot run {CHROMIUM}: {e}"))
}

fn profile(dir: &Path) -> PathBuf {
    dir.join("profile")
}

/// Waits for Chromium to write its DevTools port; panics with its log if it exits or never does.
fn devtools_port(dir: &Path, chromium: &mut Child) -> u16 {
    let file = profile(dir).join("DevToolsActivePort");
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        // The first line is the port; the file may be seen before that line is complete.
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if let Some(Ok(port)) = text.split_once('\n').map(|(port, _)| port.parse()) {
            return port;
        }
        let failure = match chromium.try_wait() {
            Ok(Some(status)) => Some(format!("chromium exited ({status})")),
            _ if Instant::now() >= deadline => {
                Some(format!("chromium wrote no {}", file.display()))
            }
            _ => None,
        };
        if let Some(failure) = failure {
            children::kill_and_reap(chromium);
            let log = std::fs::read_to_string(dir.join("chromium.log")).unwrap_or_default();
            panic!(
                "{failure} within {START_TIMEOUT:?}:\n{}",
                truncated(&log, 8_000)
            );
        }
        std::thread::sleep(POLL);
    }
}

/// chromedriver's `/status` document, read with a bare HTTP/1.1 request. chromedriver refuses HTTP/1.0
/// and keeps the connection open after its answer whatever the request says, so the body is read until
/// it parses.
fn status(port: u16) -> Option<Value> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        let n = stream.read(&mut buffer).ok().filter(|&n| n > 0)?;
        answer.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&answer);
        if let Some(Ok(status)) = text
            .split_once("\r\n\r\n")
            .map(|(_, body)| serde_json::from_str(body))
        {
            return Some(status);
        }
    }
}

/// At most the last `max` bytes of `text`, cut at a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}
