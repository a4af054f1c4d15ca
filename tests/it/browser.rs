//! The dashboard in a real browser: Debian's headless Chromium, driven over WebDriver by testkit's
//! [`Browser`], sees what a person would see and does what a person would do — log in, read the tick
//! strips as the page's script keeps them live, pause through the form, resume, trigger and watch the run
//! — against three workers on real Redis nodes, while `redcron status` and the history are held against
//! what the pages said. And what a hostile page in the same browser cannot do: post a pause. And, on a
//! stand-in site that makes the race certain, that the page's script puts in a change made before its
//! first answer.
//!
//! One cluster, three workers and one browser serve every scenario, one after the other in one test: a
//! browser and three workers cost more to start than the scenarios take, and none disturbs another (each
//! pauses, resumes or triggers a job of its own, or only reads). The HTTP-level rules (every route, auth,
//! CSRF tokens, escaping, paging) are `dashboard`'s; these are about the pages working in a browser.
//!
//! Screenshots of `/`, `/jobs/tick` and `/workers` go to the test's directory (kept when it fails); with
//! `REDCRON_SCREENSHOT_DOCS=1` the one of `/` is also written to `docs/dashboard.png`, the README's.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use chrono::Utc;
use redcron::history::{Entry, Kind};
use serde_json::Value;

use crate::cli::{output, redcron};
use crate::inspect::parse;
use crate::metrics::listening_worker;
use crate::support::{Backend, Cluster, TestDir, Worker};
use testkit::Browser;

/// The dashboard token of the operator the history should name.
const ALICE: &str = "alice-token-0123456789";
/// Generous: a loaded two-core machine runs the whole suite beside these.
const WAIT: Duration = Duration::from_secs(60);

/// The harness itself: a worker's read-only dashboard (no token, loopback) loads in headless Chromium,
/// which shows the job's row and takes a screenshot that is a PNG. (`/metrics` would not do: Chromium
/// downloads an OpenMetrics answer rather than showing it.)
#[test]
fn chromium_loads_a_worker_page_and_takes_a_screenshot() {
    let store = Backend::Embedded.start();
    let dir = TestDir::new();
    let jobs = "  - name: yearly\n    schedule: \"0 0 1 1 *\"\n    command: [\"true\"]\n";
    let (_worker, port) = listening_worker(&dir, "w0", |port| {
        store.config(&format!("  id: w0\n  listen: 127.0.0.1:{port}\n"), jobs)
    });
    let browser = Browser::start();

    browser.goto(&format!("http://127.0.0.1:{port}/"));
    let row = browser.text(r#"#jobs tr[data-job="yearly"]"#);
    assert!(row.contains("yearly"), "the job's row: {row}");
    let shot = dir.join("index.png");
    browser.screenshot(&shot);
    assert_png(&shot);
}

/// The page's script puts in a change made between the page's load and its first answer, and asks
/// with that answer's ETag from then on (a page left stale for good by such a change once failed the
/// test above in CI). The real race is milliseconds wide, so a stand-in site makes it certain: it serves
/// the dashboard's own script and a page whose navigation load says `before` while every ask of the
/// script (`Accept: text/html`, as it sends) gets `after` — which only the script can put in.
#[test]
fn the_script_puts_in_a_change_made_before_its_first_answer() {
    const SCRIPT: &str = include_str!("../../src/dashboard/assets/app.js");
    const ETAG: &str = "\"after\"";
    let page = |text: &str| {
        format!(
            "<!doctype html><title>live</title><main id=\"content\" data-live=\"true\">\
             <p id=\"state\">{text}</p></main><script src=\"/assets/app.js\"></script>"
        )
    };
    let (before, after) = (page("before"), page("after"));
    let asked_again = Arc::new(AtomicBool::new(false));
    let site = Page::answering({
        let asked_again = Arc::clone(&asked_again);
        move |head| {
            if head.starts_with("GET /assets/app.js ") {
                return Reply::new("200 OK", &[("Content-Type", "text/javascript")], SCRIPT);
            }
            if !head.starts_with("GET / ") {
                return Reply::new("404 Not Found", &[], "");
            }
            if header(head, "Accept") != Some("text/html") {
                return Reply::html(&before, &[]);
            }
            if header(head, "If-None-Match") == Some(ETAG) {
                asked_again.store(true, Ordering::SeqCst);
                return Reply::new("304 Not Modified", &[("ETag", ETAG)], "");
            }
            Reply::html(&after, &[("ETag", ETAG)])
        }
    });
    let browser = Browser::start();
    browser.goto(&site.url);
    browser.wait_until("the change since the load to be put in", WAIT, |b| {
        b.text("#state") == "after"
    });
    browser.wait_until(
        "the script to ask with the first answer's ETag",
        WAIT,
        |_| asked_again.load(Ordering::SeqCst),
    );
    assert_eq!(browser.text("#state"), "after", "a 304 changes nothing");
}

/// Three workers on three Redis nodes, one browser, every scenario of issue 24 in turn: the login; the
/// tick strips on `/` show runs and grow without a reload; `/workers` of another worker shows all three
/// alive and every node up; a pause with a reason through `#pause-form` is what `redcron status` reports
/// and no tick after it runs (each is recorded skipped); the resume through `#resume-form` lets the next
/// tick run; a trigger through `#trigger-form` is followed live to `started`, then `ended`; a page of
/// another origin that posts a pause is refused (403) and pauses nothing; `/`'s form pauses and resumes
/// the jobs it lists.
#[test]
fn the_dashboard_works_in_a_real_browser() {
    let _heavy = super::support::heavy();
    let cluster = Backend::Redis.start_nodes(3);
    let dir = TestDir::new();
    let go = dir.join("go");
    let jobs = format!(
        "  - name: tick\n    schedule: \"* * * * * *\"\n    command: [\"true\"]\n\
         \x20 - name: backup\n    schedule: \"*/2 * * * * *\"\n    command: \"sleep 0.3\"\n\
         \x20 - name: report\n    schedule: \"*/3 * * * * *\"\n    command: \"echo no data >&2; exit 2\"\n\
         \x20 - name: manual\n    schedule: \"0 0 1 1 *\"\n    \
         command: \"while [ ! -e {go} ]; do sleep 0.05; done\"\n",
        go = go.display()
    );
    let dashboard = format!(
        "dashboard:\n  tokens:\n    - name: alice\n      token: {ALICE}\n  controls: true\n"
    );
    let workers: Vec<(Worker, u16)> = (0..3)
        .map(|i| {
            listening_worker(&dir, &format!("w{i}"), |port| {
                let section = format!("  id: w{i}\n  listen: 127.0.0.1:{port}\n");
                format!("{}{dashboard}", cluster.config(&section, &jobs))
            })
        })
        .collect();
    let site = |i: usize| format!("http://127.0.0.1:{}", workers[i].1);
    let config = dir.join("w0.yaml");
    let browser = Browser::start();

    log_in(&browser, &site(0));
    strips_show_runs_and_stay_live(&browser);
    let shots = dir.join("screenshots");
    every_worker_and_node_is_shown(&browser, &site(1), &shots);
    pause_and_resume(&browser, &site(0), &cluster, &config, &shots);
    trigger(&browser, &site(0), &go);
    cross_site_post_is_refused(&browser, &site(0), &config);
    pause_and_resume_the_jobs_listed(&browser, &site(2), &config);

    browser.goto(&format!("{}/", site(0)));
    browser.wait_for("#jobs li.tick.t-failed", WAIT);
    let index = shots.join("index.png");
    browser.screenshot(&index);
    assert_png(&index);
    if std::env::var_os("REDCRON_SCREENSHOT_DOCS").is_some_and(|v| v == "1") {
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/dashboard.png");
        std::fs::copy(&index, &docs)
            .unwrap_or_else(|e| panic!("cannot copy the screenshot to {}: {e}", docs.display()));
    }
}

/// `/` sends a browser without a session to the login form; the token typed there lands it on `/`.
fn log_in(browser: &Browser, site: &str) {
    browser.goto(&format!("{site}/"));
    browser.wait_for("form#login", WAIT);
    assert!(
        browser.url().starts_with(&format!("{site}/login")),
        "not sent to the login: {}",
        browser.url()
    );
    browser.fill("form#login input[name=token]", ALICE);
    browser.click("form#login button[type=submit]");
    browser.wait_for("table#jobs", WAIT);
    assert_eq!(browser.url(), format!("{site}/"));
}

/// The strip of the job that runs every second shows runs as cells of class `t-ran` labelled "ran",
/// and the page's script brings new ticks in without reloading the page.
fn strips_show_runs_and_stay_live(browser: &Browser) {
    let ran = r#"#jobs tr[data-job="tick"] ol.ticks li.tick.t-ran"#;
    browser.wait_until("three runs in the strip", WAIT, |b| b.count(ran) >= 3);
    assert_eq!(browser.text(ran), "ran");
    // A mark on the window survives a live update and would not survive a reload.
    browser.run(|client| client.execute("window.notReloaded = true", vec![]));
    let row = r#"#jobs tr[data-job="tick"]"#;
    let before = browser.text(row);
    browser.wait_until("the row to change", WAIT, |b| b.text(row) != before);
    let kept = browser.run(|client| client.execute("return window.notReloaded === true", vec![]));
    assert_eq!(kept, Value::Bool(true), "the page was reloaded");
}

/// `/workers` of another worker shows the whole cluster: three workers alive, three nodes answering.
fn every_worker_and_node_is_shown(browser: &Browser, site: &str, shots: &Path) {
    let alive = r#"#workers tr[data-state="alive"]"#;
    let up = r#"#nodes tr[data-up="true"]"#;
    // Loaded again until it holds: a worker's first heartbeat, or a node slower than the page's read
    // timeout on a loaded machine, may be seen a moment late.
    browser.wait_until("three workers alive, three nodes up", WAIT, |b| {
        b.goto(&format!("{site}/workers"));
        b.wait_for("table#nodes", WAIT);
        b.count(alive) == 3 && b.count(up) == 3
    });
    for id in ["w0", "w1", "w2"] {
        let state = browser.attr(&format!(r#"#workers tr[data-worker="{id}"]"#), "data-state");
        assert_eq!(state.as_deref(), Some("alive"), "{id}");
    }
    let shot = shots.join("workers.png");
    browser.screenshot(&shot);
    assert_png(&shot);
}

/// Pausing `tick` through its form: the page says paused, `redcron status --json` reports the pause with
/// its reason and who (the token's name), and every tick after it is skipped (paused), none run; the
/// resume form makes it active and its next tick runs.
fn pause_and_resume(browser: &Browser, site: &str, cluster: &Cluster, config: &Path, shots: &Path) {
    let reason = "browser test: maintenance window";
    browser.goto(&format!("{site}/jobs/tick"));
    browser.fill("#pause-form input[name=reason]", reason);
    browser.click("#pause-form button[type=submit]");
    browser.wait_for(r#"#job-state[data-state="paused"]"#, WAIT);
    let paused_at = Utc::now();
    assert_eq!(browser.url(), format!("{site}/jobs/tick"));

    let paused = &job_status(config, "tick")["paused"];
    assert_eq!(paused["reason"], reason, "{paused}");
    let by = paused["by"].as_str().unwrap_or_default();
    assert!(by.starts_with("alice via dashboard"), "{paused}");

    // Not a sleep: two ticks after the pause are in the history, as skipped.
    let after_pause = |entry: &Entry| entry.tick > paused_at.timestamp_millis() + 50;
    wait_for_history(cluster, "two ticks skipped while paused", |entries| {
        let skipped = entries.iter().filter(|e| {
            after_pause(e) && e.kind == Kind::Skipped && e.reason.as_deref() == Some("paused")
        });
        skipped.count() >= 2
    });
    let shot = shots.join("job.png");
    browser.goto(&format!("{site}/jobs/tick"));
    browser.wait_for("table#history", WAIT);
    browser.screenshot(&shot);
    assert_png(&shot);

    let resuming_at = Utc::now();
    browser.click("#resume-form button[type=submit]");
    browser.wait_for(r#"#job-state[data-state="active"]"#, WAIT);
    let resumed_at = Utc::now();
    assert!(job_status(config, "tick")["paused"].is_null());
    let entries = wait_for_history(cluster, "a run after the resume", |entries| {
        entries
            .iter()
            .any(|e| e.kind == Kind::Run && e.tick > resumed_at.timestamp_millis())
    });
    let while_paused: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.kind == Kind::Run && after_pause(e))
        .filter(|e| e.tick < resuming_at.timestamp_millis())
        .collect();
    assert!(
        while_paused.is_empty(),
        "ran while paused: {while_paused:?}"
    );
}

/// `/` filtered to `report` pauses the jobs it lists through `#bulk-pause-form` — `report` alone, with the
/// reason typed, under the token's name — and comes back to the same filtered page, which shows it
/// paused; `#bulk-resume-form` lifts it.
fn pause_and_resume_the_jobs_listed(browser: &Browser, site: &str, config: &Path) {
    let listed = format!("{site}/?q=report&page=1");
    browser.goto(&listed);
    browser.wait_for("#bulk-pause-form", WAIT);
    let row = r#"#jobs tr[data-job="report"]"#;
    assert_eq!(
        browser.count("#jobs tbody tr"),
        1,
        "the filter lists report alone"
    );
    browser.fill("#bulk-reason", "browser test: bulk");
    browser.click("#bulk-pause-form button[type=submit]");
    browser.wait_until("report shown paused", WAIT, |b| {
        b.attr(row, "data-paused").as_deref() == Some("true")
    });
    assert_eq!(browser.url(), listed, "back to the page the form was on");
    let paused = &job_status(config, "report")["paused"];
    assert_eq!(paused["reason"], "browser test: bulk", "{paused}");
    assert!(
        paused["by"]
            .as_str()
            .is_some_and(|by| by.starts_with("alice via dashboard")),
        "{paused}"
    );
    assert!(
        job_status(config, "tick")["paused"].is_null(),
        "a job not listed stays as it was"
    );
    browser.click("#bulk-resume-form button[type=submit]");
    browser.wait_until("report shown active", WAIT, |b| {
        b.attr(row, "data-paused").as_deref() == Some("false")
    });
    assert!(job_status(config, "report")["paused"].is_null());
}

/// Triggering `manual` (whose run waits for a file) through its form: the job's page follows the
/// trigger live, `started` while the run waits, `ended` once the file is there.
fn trigger(browser: &Browser, site: &str, go: &Path) {
    browser.goto(&format!("{site}/jobs/manual"));
    browser.click("#trigger-form button[type=submit]");
    browser.wait_for("#trigger", WAIT);
    assert!(
        browser
            .url()
            .starts_with(&format!("{site}/jobs/manual?trigger=")),
        "{}",
        browser.url()
    );
    browser.wait_for(r#"#trigger[data-state="started"]"#, WAIT);
    let started = browser.text("#trigger");
    assert!(started.contains("Running on w"), "{started}");
    std::fs::write(go, "").expect("cannot write the file the run waits for");
    browser.wait_for(r#"#trigger[data-state="ended"]"#, WAIT);
    let ended = browser.text("#trigger");
    assert!(
        ended.contains("Ran on w") && ended.contains("success"),
        "{ended}"
    );
}

/// A page on another port of the same host posts a pause of `tick` as soon as it loads. It is of the same
/// site (SameSite does not tell ports apart), so the browser sends the session cookie with the post: only
/// the dashboard's check of where a post comes from stands in the way. It answers 403, and `tick` is not
/// paused.
fn cross_site_post_is_refused(browser: &Browser, site: &str, config: &Path) {
    let page = format!(
        "<!doctype html><title>Win a prize</title>\
         <form method=\"post\" action=\"{site}/api/jobs/tick/pause\">\
         <input name=\"reason\" value=\"pwned\"><input name=\"csrf\" value=\"guessed\"></form>\
         <script>document.forms[0].submit()</script>"
    );
    let hostile = Page::serve(page);
    browser.goto(&hostile.url);
    let target = format!("{site}/api/jobs/tick/pause");
    browser.wait_until("the post to be answered", WAIT, |b| b.url() == target);
    let answer = browser.text("body");
    assert!(
        answer.starts_with("Refused: Sec-Fetch-Site is \"same-site\""),
        "{answer}"
    );
    assert!(job_status(config, "tick")["paused"].is_null());
}

/// Job `name` in `redcron status --json -c <config>`.
fn job_status(config: &Path, name: &str) -> Value {
    let dir = config.parent().expect("a config lives in a directory");
    let (code, stdout, stderr) = output(
        redcron(dir)
            .arg("status")
            .arg("--json")
            .arg("-c")
            .arg(config),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let status = parse(&stdout);
    let jobs = status["jobs"].as_array().cloned().unwrap_or_default();
    jobs.into_iter()
        .find(|job| job["name"] == name)
        .unwrap_or_else(|| panic!("no job {name} in {status}"))
}

/// `tick`'s history once `done` holds for it, looking every 200 ms for a minute.
fn wait_for_history(cluster: &Cluster, what: &str, done: impl Fn(&[Entry]) -> bool) -> Vec<Entry> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let entries = cluster.history("tick");
        if done(&entries) {
            return entries;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "waited {WAIT:?} for {what}: {entries:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A site served on another loopback port until dropped: each request's head is answered by a function.
struct Page {
    url: String,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

impl Page {
    /// Every request is answered with `html`.
    fn serve(html: String) -> Page {
        Page::answering(move |_| Reply::html(&html, &[]))
    }

    /// Each request is answered with what `respond` makes of its head (request line and headers).
    fn answering(respond: impl Fn(&str) -> Reply + Send + 'static) -> Page {
        let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind a loopback port");
        let address = listener
            .local_addr()
            .expect("a bound socket has an address");
        let stop = Arc::new(AtomicBool::new(false));
        let server = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        answer(stream, &respond);
                    }
                }
            }
        });
        Page {
            url: format!("http://{address}/"),
            stop,
            server: Some(server),
        }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept; the server sees the flag and ends (not waited for if the wake-up failed).
        let address = self.url.trim_start_matches("http://").trim_end_matches('/');
        if let (Ok(_), Some(server)) = (TcpStream::connect(address), self.server.take()) {
            let _ = server.join();
        }
    }
}

/// An answer of [`Page`]: status line, headers and body.
struct Reply(String);

impl Reply {
    fn new(status: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        Reply(format!("{head}\r\n{body}"))
    }

    fn html(html: &str, headers: &[(&str, &str)]) -> Reply {
        let mut all = vec![("Content-Type", "text/html; charset=utf-8")];
        all.extend_from_slice(headers);
        Reply::new("200 OK", &all, html)
    }
}

/// Reads a request's head and answers it with `respond`, closing the connection.
fn answer(mut stream: TcpStream, respond: &impl Fn(&str) -> Reply) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut byte = [0; 1];
    while !head.ends_with(b"\r\n\r\n") && matches!(stream.read(&mut byte), Ok(1)) {
        head.push(byte[0]);
    }
    let Reply(response) = respond(&String::from_utf8_lossy(&head));
    let _ = stream.write_all(response.as_bytes());
}

/// The value of header `name` in a request's `head`, if it has one.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (found, value) = line.split_once(':')?;
        found
            .trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim())
    })
}

/// Panics unless `path` is a PNG image of the browser's window, 1280 pixels wide.
fn assert_png(path: &Path) {
    let png = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        path.display()
    );
    // The IHDR chunk comes first: its width is the big-endian u32 at bytes 16..20.
    let width = png
        .get(16..20)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    assert_eq!(width, Some(1280), "{} is not 1280 px wide", path.display());
}
