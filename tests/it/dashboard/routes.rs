//! Every route of the dashboard with a token: the pages, the assets, the login and logout, the JSON API
//! in the command line's shapes, the controls as `redcron` sees them; and the same pages on real Redis.

use super::*;
use crate::support::{DelayProxy, RedisCluster};

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
        &format!(
            "<li class=\"tick t-ran\" title=\"{} ran on ",
            redcron::inspect::time::instant_ms(tick_ms)
        ),
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

    let resumed = client.post_json(
        OPS,
        "/api/jobs/quiet/resume",
        r#"{"reason": "migration done"}"#,
    );
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert_eq!(resumed.json()["result"], "resumed");
    assert_eq!(resumed.json()["recorded_in_history"], true);
    assert!(cli_job(&dir, &config, "quiet")["paused"].is_null());
    let again = client.post_json(OPS, "/api/jobs/quiet/resume", "{}");
    assert_eq!(again.json()["result"], "was_not_paused");
    assert!(
        again.json()["recorded_in_history"].is_null(),
        "nothing to record"
    );
    // The pause and the resume are in the history, newest first, with who and why; the resume that
    // changed nothing is not.
    let history = client.get_as(OPS, "/api/history?job=quiet").json();
    let controls: Vec<(String, String, String)> = history["controls"]
        .as_array()
        .map(|controls| {
            controls
                .iter()
                .map(|c| {
                    let text = |field: &str| c[field].as_str().unwrap_or_default().to_string();
                    (text("action"), text("by"), text("reason"))
                })
                .collect()
        })
        .unwrap_or_default();
    let by = "ops via dashboard from 127.0.0.1".to_string();
    assert_eq!(
        controls,
        [
            (
                "resumed".to_string(),
                by.clone(),
                "migration done".to_string()
            ),
            ("paused".to_string(), by, "migration".to_string()),
        ],
        "{history}"
    );
    assert!(history["controls"][1]["until"].is_string(), "{history}");
    assert!(
        history["ticks"].as_array().is_some_and(Vec::is_empty),
        "{history}"
    );
    let page = client.get_as(OPS, "/jobs/quiet");
    assert!(
        page.body.contains("<tr data-action=\"resumed\">")
            && page.body.contains("<tr data-action=\"paused\">"),
        "the job's page lists the pause and the resume: {}",
        page.body
    );

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

/// A control made on the dashboard is stamped with the instant before its write, not when the history
/// records it: with every Redis node's copy of the pause held back for HOLD (a slow store), a pause of
/// one job and of several are stamped before the write landed, so the ticks a pause skipped come after
/// its `control` entry.
#[test]
fn dashboard_controls_are_stamped_before_their_writes() {
    const HOLD: Duration = Duration::from_millis(1_500);
    // Only in the pause written to the nodes (its reason), never in what is read before it.
    const MARKER: &str = "stamp-before-the-write";
    let redis = RedisCluster::start(3);
    let proxies: Vec<DelayProxy> = (0..redis.len())
        .map(|node| DelayProxy::start(redis.port(node), MARKER, HOLD))
        .collect();
    let nodes: Vec<String> = proxies.iter().map(|p| format!("\"{}\"", p.url())).collect();
    let dir = TestDir::new();
    let never = "schedule: \"0 0 1 1 *\"\n    command: [\"true\"]\n";
    let (worker, port) = listening_worker(&dir, "jobs", |port| {
        // A node timeout above HOLD: the held write is slow, not lost.
        format!(
            "redis:\n  nodes: [{}]\nlock:\n  ttl: 30s\n  node_timeout: 3s\nworker:\n  id: w1\n  \
             listen: 127.0.0.1:{port}\n{TOKENS}jobs:\n  - name: alpha\n    {never}  - name: beta\n    {never}",
            nodes.join(", ")
        )
    });
    let config = dir.join("jobs.yaml");
    let client = Client::new(port);
    let body = format!(r#"{{"reason": "{MARKER}"}}"#);
    let bulk = format!(r#"{{"jobs": ["beta"], "reason": "{MARKER}"}}"#);
    for (job, path, body) in [
        ("alpha", "/api/jobs/alpha/pause", body),
        ("beta", "/api/jobs/pause", bulk),
    ] {
        proxies.iter().for_each(|proxy| proxy.delay_next(1));
        let asked = chrono::Utc::now().timestamp_millis();
        let answer = client.post_json(OPS, path, &body);
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert!(
            proxies.iter().all(|proxy| proxy.delayed() > 0),
            "{path}: the pause was not held back: the test proves nothing"
        );
        let history = cli_json(&dir, &config, &["history", "--job", job]);
        let control = history["controls"][0].clone();
        let stamp = control["tick"].as_i64().expect("a control's tick");
        // Half the hold spare for a loaded machine; stamped on record, it would come after the hold.
        assert!(
            stamp < asked + HOLD.as_millis() as i64 / 2,
            "{path}: asked at {asked}, stamped {stamp}: {control}"
        );
    }
    drop(worker);
}

/// Several jobs at once — a maintenance window — through `/api/jobs/pause` and `/resume`: named jobs or
/// `all`, one `by` and end for every pause, each job's change logged and recorded in its history; an
/// unknown name is 404 and changes nothing, a body naming no jobs (or both ways) is 400, `trigger` of
/// several jobs does not exist; and `/`'s form names the jobs it lists, needs the session's CSRF token,
/// and goes back to the page it came from.
#[test]
fn several_jobs_are_paused_and_resumed_at_once() {
    let dir = TestDir::new();
    let never = "schedule: \"0 0 1 1 *\"\n    command: [\"true\"]\n";
    let jobs: String = ["alpha", "beta", "gamma"]
        .iter()
        .map(|name| format!("  - name: {name}\n    {never}"))
        .collect();
    let (worker, port, config) = dashboard_worker(&dir, TOKENS, &jobs);
    let client = Client::new(port);
    let paused = || -> Vec<bool> {
        ["alpha", "beta", "gamma"]
            .iter()
            .map(|name| !cli_job(&dir, &config, name)["paused"].is_null())
            .collect()
    };
    let results = |report: &Value| -> Vec<(String, String)> {
        let jobs = report["jobs"].as_array().cloned().unwrap_or_default();
        jobs.iter()
            .map(|j| {
                let text = |field: &str| j[field].as_str().unwrap_or_default().to_string();
                (text("job"), text("result"))
            })
            .collect()
    };

    for (body, status) in [
        (r#"{"jobs": ["alpha", "nope"], "reason": "r"}"#, 404),
        (r#"{"reason": "r"}"#, 400),
        (r#"{"jobs": ["alpha"], "all": true}"#, 400),
        (r#"{"jobs": [], "reason": "r"}"#, 400),
        (r#"{"jobs": ["alpha"], "for": "soon"}"#, 400),
    ] {
        let answer = client.post_json(OPS, "/api/jobs/pause", body);
        assert_eq!(answer.status, status, "{body}: {}", answer.body);
    }
    let unknown = client.post_json(OPS, "/api/jobs/pause", r#"{"jobs": ["alpha", "nope"]}"#);
    assert!(unknown.json()["error"]
        .as_str()
        .is_some_and(|why| why.contains("\"nope\"") && why.contains("nothing was changed")));
    let trigger = client.post_json(OPS, "/api/jobs/trigger", r#"{"all": true}"#);
    assert_eq!(trigger.status, 404, "{}", trigger.body);
    assert_eq!(paused(), [false, false, false], "nothing changed");

    let body = r#"{"jobs": ["gamma", "alpha", "gamma"], "for": "2h", "reason": "disk swap"}"#;
    let answer = client.post_json(OPS, "/api/jobs/pause", body);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let report = answer.json();
    assert_eq!(
        results(&report),
        [
            ("gamma".into(), "paused".into()),
            ("alpha".into(), "paused".into())
        ]
    );
    assert_eq!(report["by"], "ops via dashboard from 127.0.0.1", "{report}");
    assert_eq!(report["recorded_in_history"], true, "{report}");
    assert_eq!(paused(), [true, false, true]);
    let alpha = cli_job(&dir, &config, "alpha");
    let gamma = cli_job(&dir, &config, "gamma");
    assert_eq!(alpha["paused"]["reason"], "disk swap", "{alpha}");
    assert!(alpha["paused"]["until"].is_string(), "{alpha}");
    assert_eq!(
        alpha["paused"]["until"], gamma["paused"]["until"],
        "one end for all"
    );

    // `/`'s form lists the page's jobs; with the session's CSRF token it resumes them and goes back.
    let cookie = client.login(ALICE);
    let index = client.get("/?q=a", &[("cookie", cookie.as_str())]);
    assert_eq!(index.status, 200, "{}", index.body);
    assert!(
        index.body.contains("<form id=\"bulk-resume-form\""),
        "{}",
        index.body
    );
    let csrf = input_value(&index.body, "csrf").expect("the form's CSRF token");
    let listed = input_value(&index.body, "jobs").expect("the jobs listed");
    assert_eq!(listed, "alpha beta gamma");
    // As a browser reads the attribute.
    let back = input_value(&index.body, "back")
        .expect("the way back")
        .replace("&amp;", "&");
    let origin = format!("http://127.0.0.1:{port}");
    let headers = [
        ("origin", origin.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    let form = format!("jobs={}&back={}", enc(&listed), enc(&back));
    let refused = client.post_form(&cookie, "/api/jobs/resume", &headers, &form);
    assert_eq!(refused.status, 403, "no CSRF token: {}", refused.body);
    assert_eq!(paused(), [true, false, true]);
    let with_csrf = format!("{form}&csrf={csrf}&reason=done");
    let resumed = client.post_form(&cookie, "/api/jobs/resume", &headers, &with_csrf);
    assert_eq!(resumed.status, 303, "{}", resumed.body);
    assert_eq!(resumed.header("location"), "/?q=a&page=1");
    assert_eq!(paused(), [false, false, false]);

    let all = client.post_json(
        OPS,
        "/api/jobs/pause",
        r#"{"all": true, "reason": "freeze"}"#,
    );
    assert_eq!(all.status, 200, "{}", all.body);
    let names = ["alpha", "beta", "gamma"].map(String::from);
    assert_eq!(
        results(&all.json()),
        names.clone().map(|n| (n, "paused".to_string()))
    );
    let again = client.post_json(OPS, "/api/jobs/resume", r#"{"all": true}"#);
    assert_eq!(
        results(&again.json()),
        names.map(|n| (n, "resumed".to_string()))
    );

    let history = cli_json(&dir, &config, &["history"]);
    let count = |job: &str, action: &str| crate::inspect::controls_of(&history, job, action);
    assert_eq!(
        [
            count("alpha", "paused"),
            count("beta", "paused"),
            count("alpha", "resumed")
        ],
        [2, 1, 2],
        "{history:#}"
    );
    let last = |e: &Value| {
        e["event"] == "dashboard.control"
            && e["job"] == "gamma"
            && e["result"] == "resumed"
            && e["operator"] == "ops"
    };
    worker
        .wait_for(Duration::from_secs(10), last)
        .expect("the last change is logged");
    let logged = worker.events("dashboard.control");
    assert_eq!(logged.len(), 11, "one event per job changed: {logged:#?}");
    assert!(logged.iter().all(|e| e["bulk"] == true), "{logged:#?}");
}

/// On each shared store the dashboard reads the cluster as the store holds it: a job every second shows its
/// runs in its strip, the workers page lists the worker alive and every node answering, and a trigger
/// through the API runs, its run recorded with who asked (the token's name).
fn the_dashboard_reads_the_store(backend: Backend) {
    let cluster = backend.start();
    let dir = TestDir::new();
    let jobs =
        format!("  - name: tick\n    schedule: \"* * * * * *\"\n    command: [\"true\"]\n{QUIET}");
    let (_worker, port) = listening_worker(&dir, "jobs", |port| {
        let worker = format!("  id: d1\n  listen: 127.0.0.1:{port}\n");
        format!("{TOKENS}{}", cluster.config(&worker, &jobs))
    });
    let client = Client::new(port);
    wait_until(Duration::from_secs(60), || {
        let history = client.get_as(ALICE, "/api/history?job=tick&limit=3").json();
        let ran = history["ticks"]
            .as_array()?
            .iter()
            .filter(|t| t["outcome"] == "success")
            .count();
        (ran >= 2).then_some(())
    })
    .expect("two runs of tick in the history");
    let index = client.get_as(ALICE, "/");
    assert_eq!(index.status, 200, "{}", index.body);
    assert_eq!(rows(&index.body), ["tick", "quiet", "hostile"]);
    assert!(
        index.body.contains("<li class=\"tick t-ran\""),
        "{}",
        index.body
    );
    let workers = client.get_as(ALICE, "/workers");
    assert!(
        workers
            .body
            .contains("<tr data-worker=\"d1\" data-state=\"alive\""),
        "{}",
        workers.body
    );
    let nodes = match backend {
        Backend::Postgres | Backend::Mariadb | Backend::Embedded => 1,
        _ => cluster.len(),
    };
    assert_eq!(
        workers.body.matches("data-up=\"true\"").count(),
        nodes,
        "{}",
        workers.body
    );
    assert!(
        !workers.body.contains("data-up=\"false\""),
        "{}",
        workers.body
    );
    let status = client.get_as(ALICE, "/api/status");
    assert_eq!(status.json()["jobs"][0]["last_run"]["worker"], "d1");
    let run = trigger_and_wait(&client, ALICE, "quiet");
    assert_eq!(run["worker"], "d1", "{run}");
    assert_eq!(run["by"], "alice via dashboard from 127.0.0.1", "{run}");
}

crate::on_every_store!(async: [], sync: [the_dashboard_reads_the_store]);

/// MariaDB and ZooKeeper, which [`on_every_store!`](crate::on_every_store) leaves out: the dashboard is
/// served on every store.
mod mariadb {
    #[test]
    fn the_dashboard_reads_the_store() {
        super::the_dashboard_reads_the_store(crate::support::Backend::Mariadb)
    }
}

mod zookeeper {
    #[test]
    fn the_dashboard_reads_the_store() {
        super::the_dashboard_reads_the_store(crate::support::Backend::Zookeeper)
    }
}
