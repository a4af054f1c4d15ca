//! The web dashboard (`src/dashboard`) over HTTP, as a browser and a script reach it: real worker
//! processes of the built binary, mostly on the embedded store, one test on every shared store.
//!
//! What these prove: every route answers (pages, assets, login, the JSON API in the command line's
//! shapes, the controls); the auth rules (no token → the login page or 401, a wrong bearer answered only
//! after the failed-attempt delay, no token taken from a URL, the login's cookie, the listener's own
//! routes open); the serving rules without a token (read-only on loopback, not served on `0.0.0.0`
//! unless `public`, `controls` without a token refused at start); the CSRF rules of cookie posts; that GET
//! changes nothing; that hostile values are escaped on every page; the security headers; ETag and 304;
//! and paging through 2,500 jobs. Each test starts its own worker, on a fresh embedded store: starting one
//! costs well under a second, and no test can then disturb another.
//!
//! # Layout
//! - `routes`: every route with a token, the JSON API beside the command line, the controls; Redis.
//! - `access`: tokens, cookies, the failed-attempt delay, CSRF, serving without a token, config errors.
//! - `limits`: heavy reads take turns within a byte budget.
//! - `pages`: escaping of hostile values, skipped ticks in the strip, paging and filtering 2,500 jobs.
//! - here: the worker's config, an HTTP client that shows redirects, and what the tests read of pages.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cli::{output, redcron};
use crate::inspect::parse;
use crate::metrics::{get, listening_worker, listening_worker_with, wait_for as wait_until};
use crate::support::{Backend, TestDir, Worker};

mod access;
mod limits;
mod pages;
mod routes;

/// The tokens of the workers that need one: two names, so that the records say which one acted.
const ALICE: &str = "alice-token-0123456789";
const OPS: &str = "ops-token-0123456789abcd";
const TOKENS: &str =
    "dashboard:\n  tokens:\n    - name: alice\n      token: alice-token-0123456789\n    \
                      - name: ops\n      token: ops-token-0123456789abcd\n  controls: true\n";
/// A value that would run in a browser if a page printed it as it is.
const HOSTILE: &str = "<script>alert(1)</script>";
const ESCAPED: &str = "&lt;script&gt;alert(1)&lt;/script&gt;";
/// Jobs that never fire on their own (once a year): what runs is what a test triggers.
const QUIET: &str = "  - name: quiet\n    schedule: \"0 0 1 1 *\"\n    command: [\"true\"]\n\
                     \x20 - name: hostile\n    schedule: \"0 0 1 1 *\"\n    \
                     command: \"echo '<script>alert(1)</script>'; exit 3\"\n";

/// A worker `id`'s config on the embedded store in its directory (or on `store`, a store section),
/// listening on `listen` (an address and port), with `dashboard` (a top-level section, or empty).
fn yaml(store: &str, id: &str, listen: &str, dashboard: &str, jobs: &str) -> String {
    format!(
        "{store}lock:\n  ttl: 2s\n  renew_every: 500ms\n  node_timeout: 100ms\n  retry_delay: 50ms\n\
         worker:\n  id: {id}\n  listen: {listen}\n{dashboard}jobs:\n{jobs}"
    )
}

/// One worker on the embedded store in `dir` with `dashboard` and `jobs`, listening on loopback; its
/// port and config path.
fn dashboard_worker(dir: &TestDir, dashboard: &str, jobs: &str) -> (Worker, u16, PathBuf) {
    let (worker, port) = listening_worker(dir, "jobs", |port| {
        yaml("", "w1", &format!("127.0.0.1:{port}"), dashboard, jobs)
    });
    (worker, port, dir.join("jobs.yaml"))
}

/// An answer of the worker's listener.
struct Answer {
    status: u16,
    headers: ureq::http::HeaderMap,
    body: String,
    /// From before the request was sent to the end of the body.
    took: Duration,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The body as JSON.
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}:\n{}", self.status, self.body))
    }

    /// The `redcron_session` cookie this answer sets, as `name=value`.
    fn session(&self) -> String {
        let set = self.header("set-cookie");
        let pair = set.split(';').next().unwrap_or("");
        assert!(
            pair.starts_with("redcron_session=v1."),
            "no session: {set:?}"
        );
        pair.to_string()
    }
}

/// A client of one worker's listener that follows no redirect, so that they can be seen.
struct Client {
    port: u16,
    agent: ureq::Agent,
}

impl Client {
    fn new(port: u16) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        Client { port, agent }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// GET `path` with `headers`.
    fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let started = Instant::now();
        let request = headers
            .iter()
            .fold(self.agent.get(self.url(path)), |r, (k, v)| r.header(*k, *v));
        let response = request.call().unwrap_or_else(|e| panic!("GET {path}: {e}"));
        answer(response, started)
    }

    /// GET `path` with the bearer `token`.
    fn get_as(&self, token: &str, path: &str) -> Answer {
        self.get(path, &[("authorization", &format!("Bearer {token}"))])
    }

    /// POST `body` of `content_type` to `path` with `headers`.
    fn post(&self, path: &str, headers: &[(&str, &str)], content_type: &str, body: &str) -> Answer {
        let started = Instant::now();
        let request = headers
            .iter()
            .fold(self.agent.post(self.url(path)), |r, (k, v)| {
                r.header(*k, *v)
            });
        let response = request
            .content_type(content_type)
            .send(body)
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        answer(response, started)
    }

    /// POST a JSON `body` to `path` with the bearer `token`.
    fn post_json(&self, token: &str, path: &str, body: &str) -> Answer {
        let bearer = format!("Bearer {token}");
        self.post(
            path,
            &[("authorization", &bearer)],
            "application/json",
            body,
        )
    }

    /// POST a form `body` to `path` with the session `cookie` and `headers`.
    fn post_form(&self, cookie: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut all = vec![("cookie", cookie)];
        all.extend_from_slice(headers);
        self.post(path, &all, "application/x-www-form-urlencoded", body)
    }

    /// Logs in with `token`: the session cookie.
    fn login(&self, token: &str) -> String {
        let answer = self.post(
            "/login",
            &[],
            "application/x-www-form-urlencoded",
            &format!("token={token}&next=%2F"),
        );
        assert_eq!(answer.status, 303, "{}", answer.body);
        answer.session()
    }
}

fn answer(mut response: ureq::http::Response<ureq::Body>, started: Instant) -> Answer {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .body_mut()
        .with_config()
        .limit(50 * 1024 * 1024)
        .read_to_string()
        .expect("a body");
    Answer {
        status,
        headers,
        body,
        took: started.elapsed(),
    }
}

/// The security headers every dashboard answer carries.
fn assert_secure(answer: &Answer, what: &str) {
    let csp = answer.header("content-security-policy");
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{what}: CSP {csp:?}"
    );
    assert!(!csp.contains("unsafe-inline"), "{what}: CSP {csp:?}");
    assert_eq!(answer.header("x-frame-options"), "DENY", "{what}");
    assert_eq!(answer.header("x-content-type-options"), "nosniff", "{what}");
}

/// The jobs listed in `/`'s table, in order.
fn rows(page: &str) -> Vec<String> {
    page.split("<tr data-job=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap_or("").to_string())
        .collect()
}

/// The value of the first `name="<field>" value="…"` input of `page`.
fn input_value(page: &str, field: &str) -> Option<String> {
    let marker = format!("name=\"{field}\" value=\"");
    let rest = page.split(&marker).nth(1)?;
    rest.split('"').next().map(str::to_string)
}

/// An object's keys.
fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .cloned()
        .collect()
}

/// `redcron <args> --json -c <config>`, which must succeed, parsed.
fn cli_json(dir: &TestDir, config: &Path, args: &[&str]) -> Value {
    let (code, stdout, stderr) = output(
        redcron(dir.path())
            .args(args)
            .arg("--json")
            .arg("-c")
            .arg(config),
    );
    assert_eq!(code, 0, "redcron {args:?}: {stderr}");
    parse(&stdout)
}

/// `redcron status --json`'s entry of job `name`.
fn cli_job(dir: &TestDir, config: &Path, name: &str) -> Value {
    let status = cli_json(dir, config, &["status"]);
    status["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no job {name} in {status}"))
}

/// Triggers `job` with the bearer `token` and waits until its run is in `/api/history`: that tick.
fn trigger_and_wait(client: &Client, token: &str, job: &str) -> Value {
    let answer = client.post_json(token, &format!("/api/jobs/{job}/trigger"), "{}");
    assert_eq!(answer.status, 202, "{}", answer.body);
    let report = answer.json();
    assert_eq!(report["result"], "requested", "{report}");
    let id = report["request"]["id"]
        .as_str()
        .expect("a request id")
        .to_string();
    let path = format!("/api/history?job={job}&limit=5");
    wait_until(Duration::from_secs(60), || {
        let history = client.get_as(token, &path).json();
        history["ticks"]
            .as_array()?
            .iter()
            .find(|t| t["trigger"] == id.as_str() && t["ended_at"].is_string())
            .cloned()
    })
    .unwrap_or_else(|| panic!("the run of trigger {id} never reached the history"))
}

/// A page's `Server-Timing`: `store;dur=<ms>, render;dur=<ms>`, the store's reads (never none: every page
/// reads it) and the rendering.
fn server_timing(answer: &Answer) -> (f64, f64) {
    let header = answer.header("server-timing");
    let dur = |name: &str| -> f64 {
        header
            .split(", ")
            .find_map(|part| part.strip_prefix(name)?.strip_prefix(";dur="))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in Server-Timing {header:?}"))
    };
    (dur("store"), dur("render"))
}

/// `text` percent-encoded for a query or a path segment.
fn enc(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
