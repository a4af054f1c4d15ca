//! The web dashboard (`src/dashboard`) over HTTP, as a browser and a script reach it: real worker
//! processes of the built binary, mostly on the embedded store, one on real Redis.
//!
//! What these prove: every route answers (pages, assets, login, the JSON API in the command line's
//! shapes, the controls); the auth rules (no token → the login page or 401, a wrong bearer answered only
//! after the failed-attempt delay, no token taken from a URL, the login's cookie, the listener's own
//! routes open); the serving rules without a token (read-only on loopback, not served on `0.0.0.0`
//! unless `public`, `controls` without a token refused at start); the CSRF rules of cookie posts; that GET
//! changes nothing; that hostile values are escaped on every page; the security headers; ETag and 304;
//! and paging through 2,500 jobs. Each test starts its own worker, on a fresh embedded store: starting one
//! costs well under a second, and no test can then disturb another.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cli::{output, redcron};
use crate::inspect::parse;
use crate::metrics::{get, listening_worker};
use crate::support::{Backend, RedisCluster, TestDir, Worker};

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
/// listening on loopback `port` (or `listen`) with `dashboard` (a top-level section, or empty).
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

/// The first `Some` of `probe`, tried every 100 ms for up to `timeout`.
fn wait_until<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = probe() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
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
fn cli_json(dir: &TestDir, config: &PathBuf, args: &[&str]) -> Value {
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
fn cli_job(dir: &TestDir, config: &PathBuf, name: &str) -> Value {
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

/// Every page and JSON route answers with a token: the pages with their contract's elements, the JSON
/// API with the same top-level keys (and the same ticks) as `redcron status|history|explain --json`,
/// `/api/explain` taking the tick in RFC 3339 and in epoch milliseconds; the assets, `/login` and
/// `/logout`; an unknown job is 404 on the page and in the API; every dashboard answer carries the
/// security headers; a page's ETag sent back as `If-None-Match` gets 304; pages say their store and render
/// times in `Server-Timing`.
#[test]
fn every_route_answers_and_the_api_speaks_the_command_line_s_shapes() {
    let dir = TestDir::new();
    let (worker, port, config) = dashboard_worker(&dir, TOKENS, QUIET);
    let listening = worker
        .wait_for_event("worker.listening", Duration::from_secs(1))
        .expect("listening");
    assert_eq!(listening["dashboard"], "token, controls on");
    let client = Client::new(port);
    let tick = trigger_and_wait(&client, OPS, "quiet");
    let tick_ms = tick["tick"].as_i64().expect("a tick in ms");
    let tick_rfc3339 = tick["tick_rfc3339"].as_str().expect("a tick").to_string();

    // Pages.
    let index = client.get_as(ALICE, "/");
    assert_eq!(index.status, 200, "{}", index.body);
    assert!(index.header("content-type").starts_with("text/html"));
    assert_eq!(rows(&index.body), ["quiet", "hostile"]);
    for element in [
        "<table id=\"jobs\"",
        "<form id=\"filter\" method=\"get\" action=\"/\"",
        "name=\"q\"",
        "<select id=\"state\" name=\"state\"",
        "<main id=\"content\"",
        &format!("data-outcome=\"ran\" data-tick=\"{tick_ms}\""),
        "class=\"tick t-ran\"",
    ] {
        assert!(
            index.body.contains(element),
            "/ lacks {element}:\n{}",
            index.body
        );
    }
    let job = client.get_as(ALICE, "/jobs/quiet");
    assert_eq!(job.status, 200, "{}", job.body);
    for element in [
        "<h1>quiet</h1>",
        "<p id=\"job-state\" data-state=\"active\"",
        "<svg id=\"timeline\"",
        "<table id=\"history\"",
        &format!("<tr data-tick=\"{tick_ms}\""),
        "<form id=\"pause-form\" method=\"post\" action=\"/api/jobs/quiet/pause\"",
        "<form id=\"trigger-form\" method=\"post\" action=\"/api/jobs/quiet/trigger\"",
        "name=\"reason\" required",
    ] {
        assert!(
            job.body.contains(element),
            "/jobs/quiet lacks {element}:\n{}",
            job.body
        );
    }
    assert!(!job.body.contains("id=\"explain\""), "no tick asked");
    for asked in [tick_ms.to_string(), tick_rfc3339.clone()] {
        let story = client.get_as(ALICE, &format!("/jobs/quiet?tick={}", enc(&asked)));
        assert_eq!(story.status, 200, "{}", story.body);
        assert!(
            story.body.contains("<section id=\"explain\""),
            "{}",
            story.body
        );
    }
    let workers = client.get_as(ALICE, "/workers");
    assert_eq!(workers.status, 200, "{}", workers.body);
    for element in [
        "<table id=\"workers\"",
        "<tr data-worker=\"w1\" data-state=\"alive\"",
        "<table id=\"nodes\"",
        "data-up=\"true\"",
    ] {
        assert!(
            workers.body.contains(element),
            "/workers lacks {element}:\n{}",
            workers.body
        );
    }
    for (page, answer) in [("/", &index), ("/jobs/quiet", &job), ("/workers", &workers)] {
        let (store, render) = server_timing(answer);
        assert!(
            store > 0.0 && render > 0.0,
            "{page}: {:?}",
            answer.header("server-timing")
        );
    }
    let missing = client.get_as(ALICE, "/jobs/nope");
    assert_eq!(missing.status, 404, "{}", missing.body);
    assert!(missing.body.contains("No such job"), "{}", missing.body);

    // Pages are not read again while they did not change. The page may change between two requests (the
    // worker announces the run's end at its next heartbeat): then the second carries a new ETag, and the
    // pair is asked again.
    let bearer = format!("Bearer {ALICE}");
    let (etag, again) = wait_until(Duration::from_secs(30), || {
        let page = client.get_as(ALICE, "/");
        let etag = page.header("etag").to_string();
        assert!(etag.starts_with('"'), "an ETag: {etag:?}");
        let again = client.get("/", &[("authorization", &bearer), ("if-none-match", &etag)]);
        match again.status {
            304 => Some((etag, again)),
            200 => {
                assert_ne!(
                    again.header("etag"),
                    etag,
                    "the same page is not sent again"
                );
                None
            }
            other => panic!("If-None-Match: {other}: {}", again.body),
        }
    })
    .expect("an unchanged page is answered 304");
    assert!(again.body.is_empty());
    assert_eq!(again.header("etag"), etag);
    let other = client.get(
        "/",
        &[("authorization", &bearer), ("if-none-match", "\"0\"")],
    );
    assert_eq!(other.status, 200);

    // The JSON API, beside the command line's documents.
    let status = client.get_as(ALICE, "/api/status");
    assert_eq!(status.status, 200, "{}", status.body);
    assert!(status
        .header("content-type")
        .starts_with("application/json"));
    let (api, cli) = (status.json(), cli_json(&dir, &config, &["status"]));
    assert_eq!(keys(&api), keys(&cli), "/api/status: {api}\nCLI: {cli}");
    let names = |v: &Value| -> Vec<Value> {
        v["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .map(|j| j["name"].clone())
            .collect()
    };
    assert_eq!(names(&api), names(&cli));
    assert_eq!(keys(&api["jobs"][0]), keys(&cli["jobs"][0]));
    assert_eq!(api["jobs"][0]["last_run"]["tick"], tick_ms, "{api}");

    let history = client
        .get_as(ALICE, "/api/history?job=quiet&limit=5")
        .json();
    let cli = cli_json(
        &dir,
        &config,
        &["history", "--job", "quiet", "--limit", "5"],
    );
    assert_eq!(
        keys(&history),
        keys(&cli),
        "/api/history: {history}\nCLI: {cli}"
    );
    let ticks = |v: &Value| -> Vec<Value> {
        v["ticks"]
            .as_array()
            .expect("ticks")
            .iter()
            .map(|t| t["tick"].clone())
            .collect()
    };
    assert_eq!(ticks(&history), ticks(&cli));
    assert_eq!(ticks(&history), [Value::from(tick_ms)]);
    let every_job = client.get_as(ALICE, "/api/history").json();
    assert_eq!(
        ticks(&every_job),
        [Value::from(tick_ms)],
        "no job named: all jobs"
    );
    for bad in [
        "/api/history?limit=0",
        "/api/history?limit=x",
        "/api/explain?job=quiet",
    ] {
        let answer = client.get_as(ALICE, bad);
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
        assert!(answer.json()["error"].is_string());
    }
    for unknown in ["/api/history?job=nope", "/api/explain?job=nope&tick=0"] {
        assert_eq!(client.get_as(ALICE, unknown).status, 404, "{unknown}");
    }

    let cli = cli_json(&dir, &config, &["explain", "quiet", &tick_rfc3339]);
    for asked in [tick_ms.to_string(), tick_rfc3339.clone()] {
        let path = format!("/api/explain?job=quiet&tick={}", enc(&asked));
        let explain = client.get_as(ALICE, &path);
        assert_eq!(explain.status, 200, "{path}: {}", explain.body);
        let explain = explain.json();
        assert_eq!(keys(&explain), keys(&cli), "{path}: {explain}\nCLI: {cli}");
        assert_eq!(explain["tick_ms"], tick_ms);
        assert_eq!(explain["verdict"], cli["verdict"]);
        assert_eq!(explain["story"], cli["story"]);
    }

    // What needs no token, and the way out.
    let login = client.get("/login", &[]);
    assert_eq!(login.status, 200);
    for element in [
        "<form id=\"login\" method=\"post\" action=\"/login\"",
        "type=\"password\" name=\"token\"",
        "<button type=\"submit\"",
    ] {
        assert!(
            login.body.contains(element),
            "/login lacks {element}:\n{}",
            login.body
        );
    }
    let script = client.get("/assets/app.js", &[]);
    assert_eq!(script.status, 200);
    assert!(script.header("content-type").starts_with("text/javascript"));
    assert!(script.body.contains("If-None-Match"));
    let style = client.get("/assets/style.css", &[]);
    assert_eq!(style.status, 200);
    assert!(style.header("content-type").starts_with("text/css"));
    let cookie = client.login(ALICE);
    let logout = client.post_form(&cookie, "/logout", &[], "");
    assert_eq!(logout.status, 303, "{}", logout.body);
    assert_eq!(logout.header("location"), "/login");
    assert!(
        logout.header("set-cookie").contains("Max-Age=0"),
        "{:?}",
        logout.header("set-cookie")
    );

    for (what, answer) in [
        ("/", &index),
        ("/jobs/quiet", &job),
        ("/workers", &workers),
        ("/jobs/nope", &missing),
        ("304", &again),
        ("/api/status", &status),
        ("/login", &login),
        ("/assets/app.js", &script),
        ("/assets/style.css", &style),
        ("/logout", &logout),
    ] {
        assert_secure(answer, what);
    }
    assert_secure(&client.get("/", &[]), "a redirect to /login");
    assert_secure(&client.get("/api/status", &[]), "a 401");
}

/// Without a token pages go to `/login` (303, back to where they were) and `/api/*` answers 401; a wrong
/// bearer is 401, answered only after the failed-attempt delay (~1 s), as a wrong login is; a token in
/// the URL (`?token=`) is no token; a login sets an HttpOnly, SameSite=Strict session cookie that then
/// opens pages and the API; `/metrics`, `/healthz` and `/readyz` never need a token.
#[test]
fn pages_need_a_token_from_a_header_or_the_login_s_cookie() {
    let dir = TestDir::new();
    let (_worker, port, _config) = dashboard_worker(&dir, TOKENS, QUIET);
    let client = Client::new(port);

    for page in ["/", "/jobs/quiet?tick=0", "/workers"] {
        let answer = client.get(page, &[]);
        assert_eq!(answer.status, 303, "{page}: {}", answer.body);
        let to = answer.header("location");
        assert!(to.starts_with("/login?next="), "{page}: {to}");
    }
    for api in [
        "/api/status",
        "/api/history",
        "/api/explain?job=quiet&tick=0",
    ] {
        let answer = client.get(api, &[]);
        assert_eq!(answer.status, 401, "{api}: {}", answer.body);
        assert!(answer.header("www-authenticate").starts_with("Bearer"));
    }
    let post = client.post("/api/jobs/quiet/pause", &[], "application/json", "{}");
    assert_eq!(post.status, 401, "{}", post.body);

    // A token in the URL is not read.
    for path in [
        format!("/?token={ALICE}"),
        format!("/api/status?token={ALICE}"),
    ] {
        let answer = client.get(&path, &[]);
        assert!(
            matches!(answer.status, 303 | 401),
            "{path}: {}",
            answer.status
        );
    }

    // A wrong bearer, or a wrong login, costs its sender the delay.
    for wrong in [
        "Bearer alice-token-012345678X",
        "Bearer ",
        "Basic YWxpY2U6eA==",
    ] {
        let answer = client.get("/api/status", &[("authorization", wrong)]);
        assert_eq!(answer.status, 401, "{wrong}: {}", answer.body);
        assert!(
            answer.took >= Duration::from_millis(950),
            "{wrong}: {:?}",
            answer.took
        );
    }
    let page = client.get("/", &[("authorization", "Bearer wrong-wrong-wrong-wrong")]);
    assert_eq!(
        page.status, 401,
        "a wrong bearer is not sent to the login page"
    );
    let form = "application/x-www-form-urlencoded";
    let wrong = client.post("/login", &[], form, "token=not-a-token-at-all&next=%2F");
    assert_eq!(wrong.status, 401);
    assert!(wrong.took >= Duration::from_millis(950), "{:?}", wrong.took);
    assert!(wrong.header("set-cookie").is_empty());
    assert!(wrong.body.contains("<form id=\"login\""), "the form again");

    // The login's cookie.
    let login = client.post("/login", &[], form, &format!("token={OPS}&next=%2Fworkers"));
    assert_eq!(login.status, 303, "{}", login.body);
    assert_eq!(login.header("location"), "/workers");
    let set = login.header("set-cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attribute), "{attribute} in {set:?}");
    }
    let cookie = login.session();
    let elsewhere = client.post(
        "/login",
        &[],
        form,
        &format!("token={OPS}&next=//evil.example/"),
    );
    assert_eq!(
        elsewhere.header("location"),
        "/",
        "a login sends nobody elsewhere"
    );
    let with = [("cookie", cookie.as_str())];
    let index = client.get("/", &with);
    assert_eq!(index.status, 200, "{}", index.body);
    assert!(index.body.contains("Logged in as ops"), "{}", index.body);
    assert_eq!(client.get("/api/status", &with).status, 200);
    let forged = cookie.replace("v1.", "v1.00");
    assert_eq!(client.get("/", &[("cookie", forged.as_str())]).status, 303);

    // The listener's own routes.
    for open in ["/metrics", "/healthz", "/readyz"] {
        let (status, _, body) = get(port, open).expect("answers");
        assert_eq!(status, 200, "{open}: {body}");
    }
}

/// A state-changing request with the session cookie passes only with the session's CSRF token and from
/// this site: without the form's `csrf` field, with `Sec-Fetch-Site: cross-site` or a foreign `Origin`
/// it is refused (403) and changes nothing; with them the form pauses the job (303 back to its page) under
/// the token's name. A bearer request needs no CSRF token. GET on a control is 405 and changes nothing.
/// Every control is logged with who, from where and why.
#[test]
fn cookie_posts_need_the_session_s_csrf_token_and_this_site() {
    let dir = TestDir::new();
    let (worker, port, config) = dashboard_worker(&dir, TOKENS, QUIET);
    let client = Client::new(port);
    let cookie = client.login(ALICE);
    let page = client.get("/jobs/quiet", &[("cookie", cookie.as_str())]);
    assert_eq!(page.status, 200, "{}", page.body);
    let csrf = input_value(&page.body, "csrf").expect("the pause form's CSRF token");
    assert!(page
        .body
        .contains(&format!("<meta name=\"csrf-token\" content=\"{csrf}\"")));
    let pause = "/api/jobs/quiet/pause";
    let origin = format!("http://127.0.0.1:{port}");
    let body = format!("reason=by+form&for=&csrf={csrf}");

    let refused = [
        (
            "no csrf",
            client.post_form(&cookie, pause, &[], "reason=by+form"),
        ),
        (
            "a wrong csrf",
            client.post_form(&cookie, pause, &[], "reason=x&csrf=00ff"),
        ),
        (
            "cross-site",
            client.post_form(&cookie, pause, &[("sec-fetch-site", "cross-site")], &body),
        ),
        (
            "same-site",
            client.post_form(&cookie, pause, &[("sec-fetch-site", "same-site")], &body),
        ),
        (
            "a foreign origin",
            client.post_form(&cookie, pause, &[("origin", "http://evil.example")], &body),
        ),
    ];
    for (why, answer) in &refused {
        assert_eq!(answer.status, 403, "{why}: {}", answer.body);
    }
    let get = client.get_as(OPS, pause);
    assert_eq!(get.status, 405, "GET on a control: {}", get.body);
    assert_eq!(client.get_as(OPS, "/api/jobs/quiet/trigger").status, 405);
    assert!(
        cli_job(&dir, &config, "quiet")["paused"].is_null(),
        "nothing changed"
    );
    assert!(worker.events("dashboard.control").is_empty());

    let headers = [
        ("origin", origin.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    let done = client.post_form(&cookie, pause, &headers, &body);
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(done.header("location"), "/jobs/quiet");
    let paused = cli_job(&dir, &config, "quiet");
    assert_eq!(
        paused["paused"]["by"], "alice via dashboard from 127.0.0.1",
        "{paused}"
    );
    assert_eq!(paused["paused"]["reason"], "by form");
    let page = client.get("/jobs/quiet", &[("cookie", cookie.as_str())]);
    assert!(page.body.contains("data-state=\"paused\""), "{}", page.body);
    assert!(
        page.body.contains("<form id=\"resume-form\""),
        "{}",
        page.body
    );
    let resume = client.post_form(
        &cookie,
        "/api/jobs/quiet/resume",
        &headers,
        &format!("csrf={csrf}"),
    );
    assert_eq!(resume.status, 303, "{}", resume.body);
    assert!(cli_job(&dir, &config, "quiet")["paused"].is_null());

    // A bearer needs no CSRF token; a browser never adds the header by itself.
    let bearer = client.post_json(OPS, pause, r#"{"reason": "by script"}"#);
    assert_eq!(bearer.status, 200, "{}", bearer.body);
    assert_eq!(bearer.json()["by"], "ops via dashboard from 127.0.0.1");

    // The log line is written before the answer, but read from the worker's stdout by another thread.
    let last = |e: &Value| e["event"] == "dashboard.control" && e["operator"] == "ops";
    worker
        .wait_for(Duration::from_secs(10), last)
        .expect("the last control is logged");
    let controls = worker.events("dashboard.control");
    let said: Vec<(&str, &str, &str)> = controls
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap_or(""),
                e["operator"].as_str().unwrap_or(""),
                e["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        said,
        [
            ("pause", "alice", "by form"),
            ("resume", "alice", ""),
            ("pause", "ops", "by script")
        ],
        "{controls:?}"
    );
    assert!(controls.iter().all(|e| e["job"] == "quiet"
        && e["from"]
            .as_str()
            .is_some_and(|f| f.starts_with("127.0.0.1:"))));
}

/// The controls through the API, as `redcron` sees them: a pause with `for` and `reason` is reported
/// paused by `status --json` with `by` naming the token, until its resume; a trigger's run appears in
/// `/api/history` with its request's id, and on the job's page (`?trigger=ID`) as ended.
#[test]
fn pause_resume_and_trigger_through_the_api_are_the_command_line_s() {
    let dir = TestDir::new();
    let (_worker, port, config) = dashboard_worker(&dir, TOKENS, QUIET);
    let client = Client::new(port);

    let paused = client.post_json(
        OPS,
        "/api/jobs/quiet/pause",
        r#"{"for": "10m", "reason": "migration"}"#,
    );
    assert_eq!(paused.status, 200, "{}", paused.body);
    let report = paused.json();
    assert_eq!(report["result"], "paused", "{report}");
    let status = cli_job(&dir, &config, "quiet");
    assert_eq!(
        status["paused"]["by"], "ops via dashboard from 127.0.0.1",
        "{status}"
    );
    assert_eq!(status["paused"]["reason"], "migration");
    assert!(
        status["paused"]["until"].is_string(),
        "`for` gives an end: {status}"
    );
    let index = client.get_as(OPS, "/");
    assert!(
        index
            .body
            .contains("<tr data-job=\"quiet\" data-paused=\"true\""),
        "{}",
        index.body
    );
    let api = client.get_as(OPS, "/api/status").json();
    assert_eq!(api["jobs"][0]["paused"]["by"], status["paused"]["by"]);

    let resumed = client.post_json(OPS, "/api/jobs/quiet/resume", "");
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert_eq!(resumed.json()["result"], "resumed");
    assert!(cli_job(&dir, &config, "quiet")["paused"].is_null());
    let again = client.post_json(OPS, "/api/jobs/quiet/resume", "{}");
    assert_eq!(again.json()["result"], "was_not_paused");

    let tick = trigger_and_wait(&client, ALICE, "quiet");
    assert_eq!(tick["outcome"], "success", "{tick}");
    let id = tick["trigger"].as_str().expect("a trigger id");
    let page = client.get_as(ALICE, &format!("/jobs/quiet?trigger={id}"));
    assert!(
        page.body
            .contains("<section id=\"trigger\" data-state=\"ended\""),
        "{}",
        page.body
    );

    for (path, body, status) in [
        ("/api/jobs/nope/pause", "{}", 404),
        ("/api/jobs/quiet/pause", r#"{"for": "soon"}"#, 400),
        ("/api/jobs/quiet/pause", "not json", 400),
    ] {
        let answer = client.post_json(OPS, path, body);
        assert_eq!(answer.status, status, "{path} {body}: {}", answer.body);
    }
    let text = client.post(
        "/api/jobs/quiet/pause",
        &[("authorization", &format!("Bearer {OPS}"))],
        "text/plain",
        "x",
    );
    assert_eq!(text.status, 415, "{}", text.body);
}

/// A job's command, its output and a pause's reason holding `<script>` are shown as text on every page
/// (`&lt;script&gt;`), never as markup; so is a search or an unknown job name taken from the URL.
#[test]
fn hostile_values_are_escaped_on_every_page() {
    let dir = TestDir::new();
    let (_worker, port, _config) = dashboard_worker(&dir, TOKENS, QUIET);
    let client = Client::new(port);
    let tick = trigger_and_wait(&client, OPS, "hostile");
    assert_eq!(tick["exit_code"], 3, "{tick}");
    let body = serde_json::json!({ "reason": HOSTILE }).to_string();
    let paused = client.post_json(OPS, "/api/jobs/hostile/pause", &body);
    assert_eq!(paused.status, 200, "{}", paused.body);

    let tick_ms = tick["tick"].as_i64().expect("a tick");
    let encoded = enc(HOSTILE);
    let pages = [
        ("/".to_string(), true),
        ("/jobs/hostile".to_string(), true),
        (format!("/jobs/hostile?tick={tick_ms}"), true),
        ("/workers".to_string(), false),
        (format!("/?q={encoded}"), true),
        (format!("/jobs/{encoded}"), true),
        (format!("/jobs/hostile?tick={encoded}"), false),
    ];
    for (path, shown) in pages {
        let answer = client.get_as(OPS, &path);
        assert!(
            matches!(answer.status, 200 | 404),
            "{path}: {}",
            answer.status
        );
        assert!(
            !answer.body.contains("<script>alert"),
            "{path} shows markup:\n{}",
            answer.body
        );
        if shown {
            assert!(
                answer.body.contains(ESCAPED),
                "{path} does not show it as text:\n{}",
                answer.body
            );
        }
        assert_secure(&answer, &path);
    }
    let story = client.get_as(OPS, &format!("/jobs/hostile?tick={tick_ms}"));
    assert!(
        story.body.contains("<pre>"),
        "the output's end: {}",
        story.body
    );
    let login = client.get(&format!("/login?next=/{encoded}"), &[]);
    assert!(!login.body.contains("<script>alert"), "{}", login.body);
}

/// Without a token the dashboard is read-only on a loopback address (pages and the API answer, the
/// controls are 403); on `0.0.0.0` it is not served (404) while `/metrics` answers, unless
/// `public: true`.
#[test]
fn without_a_token_the_dashboard_is_read_only_and_loopback_only() {
    let dir = TestDir::new();
    let (worker, port, _) = dashboard_worker(&dir, "", QUIET);
    let listening = worker.events("worker.listening");
    assert_eq!(listening[0]["dashboard"], "read-only, no token");
    let client = Client::new(port);
    for path in [
        "/",
        "/jobs/quiet",
        "/workers",
        "/api/status",
        "/api/history",
    ] {
        let answer = client.get(path, &[]);
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert_secure(&answer, path);
    }
    let jobs = client.get("/jobs/quiet", &[]);
    assert!(
        !jobs.body.contains("pause-form"),
        "no controls: {}",
        jobs.body
    );
    for control in ["pause", "resume", "trigger"] {
        let path = format!("/api/jobs/quiet/{control}");
        let answer = client.post(&path, &[], "application/json", "{}");
        assert_eq!(answer.status, 403, "{path}: {}", answer.body);
    }

    for (public, served) in [("", false), ("dashboard:\n  public: true\n", true)] {
        let name = if served { "public" } else { "private" };
        let (worker, port) = listening_worker(&dir, name, |port| {
            yaml("", name, &format!("0.0.0.0:{port}"), public, QUIET)
        });
        let listening = worker.events("worker.listening");
        let expected = if served { "read-only, no token" } else { "off" };
        assert_eq!(listening[0]["dashboard"], expected, "{name}");
        let client = Client::new(port);
        for path in ["/", "/api/status", "/workers"] {
            let answer = client.get(path, &[]);
            assert_eq!(
                answer.status,
                if served { 200 } else { 404 },
                "{name} {path}: {}",
                answer.body
            );
        }
        let (status, _, body) = get(port, "/metrics").expect("/metrics answers");
        assert_eq!(status, 200, "{name}: {body}");
    }
}

/// `controls: true` without a token stops the worker before it starts: exit 2, the file and the line of
/// `controls` named; so does a token too short to be one.
#[test]
fn controls_without_a_token_are_a_config_error() {
    let dir = TestDir::new();
    for (dashboard, field, key) in [
        (
            "dashboard:\n  controls: true\n",
            "dashboard.controls",
            "  controls:",
        ),
        (
            "dashboard:\n  token: sEcReT42\n  controls: true\n",
            "dashboard.token",
            "  token:",
        ),
    ] {
        let text = yaml("", "w1", "127.0.0.1:1", dashboard, QUIET);
        let line = 1 + text
            .lines()
            .position(|l| l.starts_with(key))
            .expect("the field is in the config");
        let config = dir.write_config(&text);
        let mut worker = Worker::spawn(&config, &[]);
        let exit = worker
            .wait_timeout(Duration::from_secs(30))
            .expect("the worker stops at once");
        let stderr = worker.stderr();
        assert_eq!(exit.code(), Some(2), "{stderr}");
        let place = format!("jobs.yaml:{line}:");
        assert!(
            stderr.contains(&place) && stderr.contains(field),
            "{place} {field}:\n{stderr}"
        );
        assert!(
            !stderr.contains("sEcReT42"),
            "a token is never shown: {stderr}"
        );
    }
}

/// 2,500 jobs (none due): `/` shows 100 rows by default, `per=1000&page=3` the last 500, a search narrows
/// them (ignoring case), `state=paused` lists exactly the two jobs paused through the API, a page past the
/// end shows the last page, and the paging links say where they lead.
#[test]
fn two_thousand_five_hundred_jobs_are_paged_filtered_and_searched() {
    let dir = TestDir::new();
    let jobs: String = (0..2_500)
        .map(|i| {
            format!("  - name: job-{i:04}\n    schedule: \"0 0 1 1 *\"\n    command: [\"true\"]\n")
        })
        .collect();
    let (_worker, port, _config) = dashboard_worker(&dir, TOKENS, &jobs);
    let client = Client::new(port);
    let names = |range: std::ops::Range<usize>| -> Vec<String> {
        range.map(|i| format!("job-{i:04}")).collect()
    };

    let first = client.get_as(OPS, "/");
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(rows(&first.body), names(0..100));
    assert!(first.body.contains("2500 of 2500 jobs"), "{}", first.body);
    assert!(
        first.body.contains("rel=\"next\" href=\"/?page=2\""),
        "{}",
        first.body
    );
    assert!(!first.body.contains("rel=\"prev\""));
    let third = client.get_as(OPS, "/?per=1000&page=3");
    assert_eq!(rows(&third.body), names(2_000..2_500));
    assert!(
        third
            .body
            .contains("rel=\"prev\" href=\"/?per=1000&amp;page=2\""),
        "{}",
        third.body
    );
    assert!(!third.body.contains("rel=\"next\""));
    let past = client.get_as(OPS, "/?page=99");
    assert_eq!(past.status, 200);
    assert_eq!(rows(&past.body), names(2_400..2_500));
    assert!(past.body.contains("page 25 of 25"), "{}", past.body);
    for q in ["job-249", "JOB-249"] {
        let found = client.get_as(OPS, &format!("/?q={q}"));
        assert_eq!(rows(&found.body), names(2_490..2_500), "q={q}");
    }
    let none = client.get_as(OPS, "/?q=nothing-like-it");
    assert!(rows(&none.body).is_empty() && none.body.contains("No job matches."));

    let paused = client.get_as(OPS, "/?state=paused");
    assert!(rows(&paused.body).is_empty(), "nothing paused yet");
    for job in ["job-0007", "job-1234"] {
        let answer = client.post_json(
            OPS,
            &format!("/api/jobs/{job}/pause"),
            r#"{"reason": "paging"}"#,
        );
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let paused = client.get_as(OPS, "/?state=paused");
    assert_eq!(rows(&paused.body), ["job-0007", "job-1234"]);
    assert!(paused.body.contains("2 of 2500 jobs"), "{}", paused.body);
    let narrowed = client.get_as(OPS, "/?state=paused&q=123");
    assert_eq!(rows(&narrowed.body), ["job-1234"]);
    let disabled = client.get_as(OPS, "/?state=disabled");
    assert!(rows(&disabled.body).is_empty());
}

/// On real Redis (3 nodes) the dashboard reads the same store: the status API, the jobs page, and the
/// workers page with each node answering.
#[test]
fn the_dashboard_reads_redis() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let nodes: Vec<String> = cluster.urls();
    let store = Backend::Redis.section(&nodes);
    let (_worker, port) = listening_worker(&dir, "jobs", |port| {
        yaml(&store, "r1", &format!("127.0.0.1:{port}"), TOKENS, QUIET)
    });
    let client = Client::new(port);
    let status = client.get_as(ALICE, "/api/status");
    assert_eq!(status.status, 200, "{}", status.body);
    assert_eq!(status.json()["jobs"][1]["name"], "hostile");
    let index = client.get_as(ALICE, "/");
    assert_eq!(rows(&index.body), ["quiet", "hostile"]);
    let workers = client.get_as(ALICE, "/workers");
    assert!(
        workers
            .body
            .contains("<tr data-worker=\"r1\" data-state=\"alive\""),
        "{}",
        workers.body
    );
    assert_eq!(
        workers.body.matches("data-up=\"true\"").count(),
        3,
        "{}",
        workers.body
    );
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
