//! What the pages show: hostile values as text, never markup; a paused job's ticks as skipped; and 2,500
//! jobs paged, searched and filtered on the server.

use super::*;

/// A job's command, its output and a pause's reason holding `<script>` are shown as text on every page
/// (`&lt;script&gt;`), never as markup; so is a search or an unknown job name taken from the URL. (The
/// failed run also puts the job, alone, under `state=failing`.)
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
    let failing = client.get_as(OPS, "/?state=failing");
    assert_eq!(rows(&failing.body), ["hostile"], "its last run failed");
    let story = client.get_as(OPS, &format!("/jobs/hostile?tick={tick_ms}"));
    assert!(
        story.body.contains("<pre>"),
        "the output's end: {}",
        story.body
    );
    let login = client.get(&format!("/login?next=/{encoded}"), &[]);
    assert!(!login.body.contains("<script>alert"), "{}", login.body);
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

/// A paused job's ticks are recorded as skipped (paused), and the pages show them so: a `skipped` cell
/// labelled "skipped" in its strip on `/`, and a history row of outcome skipped saying why.
#[test]
fn a_paused_job_s_ticks_are_shown_skipped() {
    let dir = TestDir::new();
    let jobs = "  - name: every\n    schedule: \"* * * * * *\"\n    command: [\"true\"]\n";
    let (_worker, port, _config) = dashboard_worker(&dir, TOKENS, jobs);
    let client = Client::new(port);
    let paused = client.post_json(OPS, "/api/jobs/every/pause", r#"{"reason": "quiet"}"#);
    assert_eq!(paused.status, 200, "{}", paused.body);
    let skipped = wait_until(Duration::from_secs(30), || {
        let history = client.get_as(OPS, "/api/history?job=every&limit=10").json();
        history["ticks"]
            .as_array()?
            .iter()
            .find(|t| t["kind"] == "skipped" && t["reason"] == "paused")
            .and_then(|t| t["tick"].as_i64())
    })
    .expect("a tick skipped while paused");

    let index = client.get_as(OPS, "/");
    // A cell says its outcome in its class (the colour), its short label and its tooltip, which starts with
    // the tick.
    let cell = format!(
        "<li class=\"tick t-skipped\" title=\"{} skipped (paused)",
        redcron::inspect::time::instant_ms(skipped)
    );
    let at = index
        .body
        .find(&cell)
        .unwrap_or_else(|| panic!("no {cell} in:\n{}", index.body));
    let label = &index.body[at..].split("</li>").next().unwrap_or("");
    assert!(label.ends_with(">skip"), "the outcome as text: {label}");
    let job = client.get_as(OPS, "/jobs/every");
    let row = format!("<tr data-tick=\"{skipped}\" data-outcome=\"skipped\"");
    let at = job
        .body
        .find(&row)
        .unwrap_or_else(|| panic!("no {row} in:\n{}", job.body));
    let row = &job.body[at..].split("</tr>").next().unwrap_or("");
    assert!(row.contains("skipped") && row.contains("(paused)"), "{row}");
}

/// A job's command with a `${VAR}` (issue 46.3) is shown as written: its page shows
/// `curl -u admin:${BACKUP_PW} …` and neither the page nor the JSON API holds the variable's value
/// (before: the page showed the password).
#[test]
fn a_command_s_variables_are_shown_as_written() {
    let dir = TestDir::new();
    let secret = "s3cr3t-backup-pw-4711";
    let jobs = "  - name: backup\n    schedule: \"0 0 1 1 *\"\n    \
                command: \"echo curl -u admin:${BACKUP_PW} https://backup.example/\"\n\
                \x20 - name: listed\n    schedule: \"0 0 1 1 *\"\n    \
                command: [\"echo\", \"--password=${BACKUP_PW}\", \"x\"]\n";
    let env = [("BACKUP_PW", secret)];
    let (_worker, port) = listening_worker_with(&dir, "jobs", &env, |port| {
        yaml("", "w1", &format!("127.0.0.1:{port}"), "", jobs)
    });
    let client = Client::new(port);
    let page = client.get("/jobs/backup", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body
            .contains("echo curl -u admin:${BACKUP_PW} https://backup.example/"),
        "{}",
        page.body
    );
    let listed = client.get("/jobs/listed", &[]);
    assert!(
        listed.body.contains("echo --password=${BACKUP_PW} x"),
        "{}",
        listed.body
    );
    for path in [
        "/",
        "/jobs/backup",
        "/jobs/listed",
        "/workers",
        "/api/status",
        "/api/history",
        "/api/explain?job=backup&tick=0",
    ] {
        let answer = client.get(path, &[]);
        assert!(
            matches!(answer.status, 200 | 404),
            "{path}: {}",
            answer.status
        );
        assert!(!answer.body.contains(secret), "{path} shows the value");
    }
}
