//! Who may see and do what: tokens from a header or the login's cookie, the failed-attempt delay, the
//! CSRF rules of cookie posts, GET changing nothing, the serving rules without a token, and the config
//! errors that stop a worker before it serves anything.

use super::*;

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
    assert!(
        wrong.body.contains("<code>dashboard.tokens</code>"),
        "the login page says where a token comes from: {}",
        wrong.body
    );

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
/// the token's name, resumes it, and triggers it (303 to the page that shows the run end). A bearer
/// request needs no CSRF token. GET on a control is 405 and changes nothing.
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
    let trigger = client.post_form(
        &cookie,
        "/api/jobs/quiet/trigger",
        &headers,
        &format!("csrf={csrf}"),
    );
    assert_eq!(trigger.status, 303, "{}", trigger.body);
    let to = trigger.header("location").to_string();
    assert!(to.starts_with("/jobs/quiet?trigger="), "{to}");
    let with = [("cookie", cookie.as_str())];
    wait_until(Duration::from_secs(60), || {
        let page = client.get(&to, &with);
        page.body
            .contains("<section id=\"trigger\" data-state=\"ended\"")
            .then_some(())
    })
    .expect("the triggered run is shown ended on the page the form leads to");

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
            ("trigger", "alice", ""),
            ("pause", "ops", "by script")
        ],
        "{controls:?}"
    );
    assert!(controls.iter().all(|e| e["job"] == "quiet"
        && e["from"]
            .as_str()
            .is_some_and(|f| f.starts_with("127.0.0.1:"))));
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

/// A reload that removes a token ends its sessions and its bearer's access at once; the other token's
/// cookie goes on working (a session is the token's, not the worker's).
#[test]
fn a_token_removed_by_a_reload_ends_its_sessions() {
    let dir = TestDir::new();
    let (mut worker, port, config) = dashboard_worker(&dir, TOKENS, QUIET);
    let client = Client::new(port);
    let (alice, ops) = (client.login(ALICE), client.login(OPS));
    for cookie in [&alice, &ops] {
        assert_eq!(client.get("/", &[("cookie", cookie.as_str())]).status, 200);
    }
    let text = std::fs::read_to_string(&config).expect("the config");
    let only_ops =
        "dashboard:\n  tokens:\n    - name: ops\n      token: ops-token-0123456789abcd\n  \
                    controls: true\n";
    std::fs::write(&config, text.replace(TOKENS, only_ops)).expect("write the config");
    worker.signal(libc::SIGHUP);
    worker
        .wait_for_event("config.reloaded", Duration::from_secs(30))
        .expect("the worker reloads");
    assert_eq!(client.get("/", &[("cookie", alice.as_str())]).status, 303);
    assert_eq!(client.get_as(ALICE, "/api/status").status, 401);
    assert_eq!(client.get("/", &[("cookie", ops.as_str())]).status, 200);
    assert_eq!(client.get_as(OPS, "/api/status").status, 200);
}

/// A single `token:` written as `${VAR}` is read from the worker's environment; its holder acts, logs in
/// and is recorded as `operator`, and the token itself is shown nowhere.
#[test]
fn a_single_token_from_the_environment_acts_as_operator() {
    let dir = TestDir::new();
    let secret = "from-the-environment-0123456789";
    let dashboard = "dashboard:\n  token: ${DASHBOARD_TOKEN_FOR_TEST}\n  controls: true\n";
    let env = [("DASHBOARD_TOKEN_FOR_TEST", secret)];
    let (_worker, port) = listening_worker_with(&dir, "jobs", &env, |port| {
        yaml("", "w1", &format!("127.0.0.1:{port}"), dashboard, QUIET)
    });
    let client = Client::new(port);
    assert_eq!(client.get("/api/status", &[]).status, 401);
    let paused = client.post_json(secret, "/api/jobs/quiet/pause", r#"{"reason": "env"}"#);
    assert_eq!(paused.status, 200, "{}", paused.body);
    assert_eq!(paused.json()["by"], "operator via dashboard from 127.0.0.1");
    let cookie = client.login(secret);
    let page = client.get("/", &[("cookie", cookie.as_str())]);
    assert!(page.body.contains("Logged in as operator"), "{}", page.body);
    assert!(!page.body.contains(secret), "the token is never shown");
}

/// DNS rebinding (issue 46.4): a token-less loopback dashboard asked with `Host: evil.example:PORT`
/// answers 421 with a body that names no job, on every dashboard route (before: 200 with everything
/// on it); asked by its address, `localhost` or a name of `dashboard.allowed_hosts` it answers 200;
/// `/healthz`, `/readyz` and `/metrics` answer any `Host` (probes and scrapers use pod addresses and
/// service names). A post whose `Origin` and `Host` both name the rebinding site is refused, not
/// taken as same-site. Over raw HTTP, so that the `Host` is exactly what a browser would send.
#[test]
fn a_host_that_is_not_the_dashboard_s_is_refused() {
    use crate::listener::{raw, status_of};

    let dir = TestDir::new();
    let dashboard = "dashboard:\n  allowed_hosts: [cron.example.com]\n";
    let (_worker, port, _config) = dashboard_worker(&dir, dashboard, QUIET);
    let ask = |path: &str, host: &str| {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        raw(port, &request, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let evil = format!("evil.example:{port}");
    for path in [
        "/",
        "/jobs/quiet",
        "/workers",
        "/api/status",
        "/api/history",
        "/login",
        "/assets/app.js",
    ] {
        let answer = ask(path, &evil);
        assert_eq!(status_of(&answer), 421, "{path}: {answer}");
        assert!(
            answer.contains("dashboard.allowed_hosts"),
            "{path}: {answer}"
        );
        assert!(
            !answer.contains("hostile") && !answer.contains("quiet"),
            "{path}: {answer}"
        );
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("cron.example.com:{port}"),
        "CRON.example.com".to_string(),
    ] {
        let answer = ask("/api/status", &host);
        assert_eq!(status_of(&answer), 200, "{host}: {answer}");
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let answer = ask(path, &evil);
        assert_eq!(status_of(&answer), 200, "{path} with any Host: {answer}");
    }
    let post = format!(
        "POST /api/jobs/quiet/pause HTTP/1.1\r\nHost: {evil}\r\nOrigin: http://{evil}\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let answer = raw(port, &post, Duration::from_secs(10)).expect("an answer");
    assert_eq!(status_of(&answer), 421, "{answer}");
}

/// `POST /logout` ends the session (issue 46.8): the cookie copied before it gets 401 on `/api/status`,
/// and its trigger form with the session's CSRF token is refused and triggers nothing (before: both
/// went on working for the cookie's 12 hours); a new login works.
#[test]
fn a_logout_ends_the_session_for_good() {
    let dir = TestDir::new();
    let (worker, port, _config) = dashboard_worker(&dir, TOKENS, QUIET);
    let client = Client::new(port);
    let cookie = client.login(ALICE);
    let with = [("cookie", cookie.as_str())];
    let page = client.get("/jobs/quiet", &with);
    assert_eq!(page.status, 200, "{}", page.body);
    let csrf = input_value(&page.body, "csrf").expect("the page's CSRF token");
    assert_eq!(client.get("/api/status", &with).status, 200);

    let logout = client.post_form(&cookie, "/logout", &[], "");
    assert_eq!(logout.status, 303, "{}", logout.body);
    assert!(logout.header("set-cookie").contains("Max-Age=0"));

    let status = client.get("/api/status", &with);
    assert_eq!(
        status.status, 401,
        "the old cookie after the logout: {}",
        status.body
    );
    assert_eq!(client.get("/", &with).status, 303, "pages go to the login");
    let trigger = client.post_form(
        &cookie,
        "/api/jobs/quiet/trigger",
        &[],
        &format!("csrf={csrf}"),
    );
    assert_eq!(trigger.status, 401, "{}", trigger.body);
    assert!(
        worker.events("dashboard.control").is_empty(),
        "{:?}",
        worker.events("dashboard.control")
    );
    let again = client.login(ALICE);
    assert_eq!(
        client
            .get("/api/status", &[("cookie", again.as_str())])
            .status,
        200
    );
}
