//! The worker's HTTP listener (`worker.listen`), read as Prometheus and Kubernetes read it: `/metrics`
//! parsed by a Prometheus text-format parser and its counters held against the ledger the jobs write,
//! `/healthz`, and `/readyz` following each store's readiness rule (a majority of the Redis nodes or of the
//! etcd members, the embedded store's write lock). Real nodes, real worker processes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{DateTime, Datelike, Timelike, Utc};
use prometheus_parse::{Scrape, Value};

use crate::support::{
    free_port, worker_config, Backend, Cluster, EtcdCluster, RedisCluster, TestDir, Worker,
};
use crate::worker::config;

/// Two workers scraped every 100 ms while they run two jobs (one succeeds, one fails) at 8 consecutive
/// seconds: each worker's `redcron_runs_total` per job and outcome equals the job's ledger lines written
/// under that worker, its histograms counted each of those runs, and the scraping costs no tick — every
/// tick after the workers were up ran exactly once, none was skipped or missed.
#[test]
fn counters_match_the_ledger_while_scraped_every_100ms() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let (cron, ticks) = window(Duration::from_secs(8), 8);
    let line = r#"echo "$REDCRON_JOB $REDCRON_TICK $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID""#;
    let ledger = dir.ledger();
    let jobs = format!(
        "  - name: ok\n    schedule: \"{cron}\"\n    command: '{line} >> {ledger}'\n\
         \x20 - name: fails\n    schedule: \"{cron}\"\n    command: '{line} >> {ledger}; exit 1'\n",
        ledger = ledger.display()
    );
    let started_at = Utc::now();
    let workers: Vec<(Worker, u16)> = (0..2)
        .map(|i| {
            listening_worker(&dir, &format!("w{i}"), |port| {
                let section = format!("  id: w{i}\n  listen: 127.0.0.1:{port}\n");
                config(&cluster, &section, &jobs)
            })
        })
        .collect();
    let up_at = Utc::now();
    let scrapers: Vec<Scraper> = workers
        .iter()
        .map(|(_, port)| Scraper::start(*port))
        .collect();

    // Wait for events, not time: the last tick's runs of both jobs have ended somewhere.
    let last = ticks[ticks.len() - 1];
    let finished_last = |job: &str| {
        workers.iter().any(|(worker, _)| {
            worker
                .events("run.finished")
                .iter()
                .any(|e| e["job"] == job && tick_of(e) == Some(last))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while !(finished_last("ok") && finished_last("fails")) {
        assert!(
            Instant::now() < deadline,
            "the last tick {last} did not run"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let scrape_times: Vec<Vec<DateTime<Utc>>> = scrapers.into_iter().map(Scraper::stop).collect();

    let mut ran: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut ticks_run: BTreeMap<(String, DateTime<Utc>), usize> = BTreeMap::new();
    for line in dir.ledger_lines() {
        let [job, tick, _token, worker] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            panic!("bad ledger line {line:?}")
        };
        *ran.entry((job.to_owned(), worker.to_owned())).or_default() += 1;
        let tick = DateTime::parse_from_rfc3339(tick).expect("an RFC 3339 tick");
        *ticks_run
            .entry((job.to_owned(), tick.to_utc()))
            .or_default() += 1;
    }
    for (i, (worker, port)) in workers.iter().enumerate() {
        let id = format!("w{i}");
        let metrics = scrape(*port);
        for (job, outcome) in [("ok", "success"), ("fails", "failure")] {
            let ledger_runs = ran.get(&(job.to_owned(), id.clone())).copied().unwrap_or(0) as f64;
            for other in ["success", "failure", "timeout", "lease_lost", "shutdown"] {
                let expected = if other == outcome { ledger_runs } else { 0.0 };
                let labels = [("job", job), ("outcome", other)];
                assert_eq!(
                    value(&metrics, "redcron_runs_total", &labels),
                    Some(expected),
                    "{id}: runs of {job} with outcome {other}"
                );
            }
            for histogram in [
                "redcron_run_duration_seconds",
                "redcron_schedule_lag_seconds",
            ] {
                let count = value(&metrics, &format!("{histogram}_count"), &[("job", job)]);
                assert_eq!(
                    count.unwrap_or(0.0),
                    ledger_runs,
                    "{id}: {histogram} of {job}"
                );
            }
            let zero = Some(0.0);
            assert_eq!(
                value(&metrics, "redcron_ticks_missed_total", &[("job", job)]),
                zero
            );
            assert_eq!(
                value(&metrics, "redcron_lease_lost_total", &[("job", job)]),
                zero
            );
        }
        let successes = value(
            &metrics,
            "redcron_last_success_timestamp_seconds",
            &[("job", "ok")],
        );
        if ran.contains_key(&("ok".to_owned(), id.clone())) {
            let at = successes.expect("a worker that ran `ok` says when it last succeeded");
            assert!(
                (started_at.timestamp() as f64..=Utc::now().timestamp() as f64 + 1.0).contains(&at),
                "{id}: last success at {at}"
            );
        }
        assert!(value(&metrics, "redcron_claim_duration_seconds_count", &[]) >= Some(1.0));
        assert_eq!(value(&metrics, "redcron_store_nodes_up", &[]), Some(3.0));
        assert_eq!(
            value(&metrics, "redcron_store_nodes_configured", &[]),
            Some(3.0)
        );
        assert!(value(&metrics, "redcron_clock_offset_seconds", &[]).is_some());
        for result in ["success", "failure"] {
            let labels = [("result", result)];
            assert_eq!(
                value(&metrics, "redcron_config_reloads_total", &labels),
                Some(0.0)
            );
        }
        assert_eq!(
            value(&metrics, "redcron_history_write_failures_total", &[]),
            Some(0.0)
        );
        for event in ["tick.skipped", "tick.missed"] {
            assert_eq!(
                worker.events(event),
                Vec::<serde_json::Value>::new(),
                "{id}"
            );
        }
        // The scraping went on while the ticks were run.
        let during = scrape_times[i]
            .iter()
            .filter(|at| (ticks[0]..=last).contains(at))
            .count();
        assert!(
            during >= 5,
            "{id}: only {during} scrapes between the first and the last tick"
        );
    }
    let checked: Vec<&DateTime<Utc>> = ticks.iter().filter(|t| **t > up_at).collect();
    assert!(
        checked.len() >= 4,
        "the workers took until {up_at} to start: too few ticks left"
    );
    for tick in checked {
        for job in ["ok", "fails"] {
            let runs = ticks_run
                .get(&(job.to_owned(), *tick))
                .copied()
                .unwrap_or(0);
            assert_eq!(
                runs,
                1,
                "{job} at {tick}, ledger:\n{}",
                dir.ledger_lines().join("\n")
            );
        }
    }
    assert!(
        ticks_run.values().all(|runs| *runs == 1),
        "a tick ran twice"
    );
}

/// `/readyz` is 200 while a majority of the nodes answers, 503 with a one-line reason while two of three
/// are hung (SIGSTOP), and 200 again once they go on; `/healthz` stays 200 throughout and
/// `redcron_store_nodes_up` follows the nodes.
#[test]
fn readyz_follows_a_majority_of_the_nodes() {
    let mut cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let jobs = "  - name: tick\n    schedule: \"* * * * * *\"\n    command: 'true'\n";
    let (worker, port) = listening_worker(&dir, "w", |port| {
        let section = format!("  listen: 127.0.0.1:{port}\n  clock_check_every: 300ms\n");
        config(&cluster, &section, jobs)
    });
    let timeout = Duration::from_secs(30);
    let ready = wait_for(timeout, || get(port, "/readyz").ok().filter(|r| r.0 == 200));
    assert_eq!(ready.map(|r| r.2), Some("ready\n".to_owned()));
    assert_eq!(nodes_up(port, timeout, 3.0), 3.0);

    cluster.stop(0);
    cluster.stop(1);
    let unready = wait_for(timeout, || get(port, "/readyz").ok().filter(|r| r.0 == 503));
    let (_, _, reason) = unready.expect("/readyz turns 503 without a majority");
    assert!(
        reason.starts_with("no majority of the store's nodes answers: 1 of 3 nodes answered TIME"),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("127.0.0.1:{}", cluster.port(0))),
        "{reason}"
    );
    assert_eq!(reason.lines().count(), 1, "{reason:?}");
    assert_eq!(get(port, "/healthz").map(|r| r.0).ok(), Some(200));
    assert_eq!(nodes_up(port, timeout, 1.0), 1.0);

    cluster.cont(0);
    cluster.cont(1);
    let ready = wait_for(timeout, || get(port, "/readyz").ok().filter(|r| r.0 == 200));
    assert!(ready.is_some(), "/readyz does not turn 200 again");
    assert_eq!(nodes_up(port, timeout, 3.0), 3.0);
    drop(worker);
}

/// On etcd, `/readyz` is 200 while the cluster serves a linearizable read, 503 with a one-line reason
/// while the leader and one more of three members are hung (SIGSTOP), and 200 again once they go on.
#[test]
fn readyz_follows_a_majority_of_the_etcd_members() {
    let mut cluster = EtcdCluster::start();
    let dir = TestDir::new();
    let jobs = "  - name: tick\n    schedule: \"* * * * * *\"\n    command: 'true'\n";
    let (worker, port) = listening_worker(&dir, "w", |port| {
        let section = format!("  listen: 127.0.0.1:{port}\n");
        worker_config(Backend::Etcd, &cluster.endpoints(), &section, jobs)
    });
    assert_eq!(readyz_turns(port, 200), "ready\n");
    let leader = cluster.leader();
    let stopped = [leader, (leader + 1) % cluster.len()];
    stopped.iter().for_each(|&i| cluster.stop(i));
    let reason = readyz_turns(port, 503);
    stopped.iter().for_each(|&i| cluster.cont(i));
    one_line_starting(&reason, "no majority of the etcd members answers");
    assert_eq!(get(port, "/healthz").map(|r| r.0).ok(), Some(200));
    readyz_turns(port, 200);
    drop(worker);
}

/// The listener's line says what it serves: with the dashboard off it names only the endpoints, and why
/// the dashboard is not among them; on loopback without a token, the dashboard too.
#[test]
fn the_listening_line_says_whether_the_dashboard_is_served() {
    let dir = TestDir::new();
    let jobs = "jobs:\n  - name: tick\n    schedule: \"0 0 * * * *\"\n    command: 'true'\n";
    for (name, dashboard, says) in [
        (
            "off",
            "dashboard:\n  enabled: false\n",
            "Serving /metrics, /healthz and /readyz; the dashboard is off: dashboard.enabled is false",
        ),
        ("on", "", "Serving /metrics, /healthz, /readyz and the dashboard"),
    ] {
        let database = dir.path().join(format!("{name}.db"));
        let (worker, _) = listening_worker(&dir, name, |port| {
            let path = database.display();
            format!("embedded:\n  path: {path}\nworker:\n  listen: 127.0.0.1:{port}\n{dashboard}{jobs}")
        });
        let listening = worker.events("worker.listening");
        assert_eq!(listening[0]["message"], says, "{name}: {listening:?}");
        drop(worker);
    }
}

/// On the embedded store, `/readyz` is 200 while its database gives its write lock, 503 with a one-line
/// reason while another process holds it (an open `BEGIN IMMEDIATE`), and 200 again once that ends.
#[test]
fn readyz_follows_the_embedded_store_s_write_lock() {
    let dir = TestDir::new();
    let database = dir.path().join("cron.db");
    let jobs = "jobs:\n  - name: tick\n    schedule: \"* * * * * *\"\n    command: 'true'\n";
    let (worker, port) = listening_worker(&dir, "w", |port| {
        let path = database.display();
        format!("embedded:\n  path: {path}\nworker:\n  listen: 127.0.0.1:{port}\n{jobs}")
    });
    assert_eq!(readyz_turns(port, 200), "ready\n");
    let mut holder = rusqlite::Connection::open(&database).expect("the database opens");
    let lock = holder
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .expect("the write lock is taken");
    let reason = readyz_turns(port, 503);
    drop(lock);
    one_line_starting(&reason, "the database does not answer");
    readyz_turns(port, 200);
    drop(worker);
}

/// On a SQL store, `/readyz` is 200 while the server answers and takes writes, 503 with a one-line reason
/// while it is read-only (a standby, or `read_only` set: no claim could be written) and while it is hung
/// (SIGSTOP), and 200 again after each; `redcron_store_nodes_up` is the one server.
fn readyz_follows_the_sql_server(backend: Backend) {
    let mut cluster = backend.start();
    let Cluster::Sql(_) = &cluster else {
        panic!("a SQL backend")
    };
    let dir = TestDir::new();
    let jobs = "  - name: tick\n    schedule: \"* * * * * *\"\n    command: 'true'\n";
    let (worker, port) = listening_worker(&dir, "w", |port| {
        let section = format!("  listen: 127.0.0.1:{port}\n");
        worker_config(backend, &cluster.urls(), &section, jobs)
    });
    assert_eq!(readyz_turns(port, 200), "ready\n");
    assert_eq!(nodes_up(port, Duration::from_secs(30), 1.0), 1.0);
    let (read_only, writable) = match backend {
        Backend::Postgres => (
            "ALTER SYSTEM SET default_transaction_read_only = on; SELECT pg_reload_conf();",
            "ALTER SYSTEM RESET default_transaction_read_only; SELECT pg_reload_conf();",
        ),
        _ => ("SET GLOBAL read_only = 1;", "SET GLOBAL read_only = 0;"),
    };
    let Cluster::Sql(server) = &mut cluster else {
        unreachable!()
    };
    server.exec(read_only);
    let reason = readyz_turns(port, 503);
    server.exec(writable);
    assert!(reason.contains("read-only"), "{reason}");
    assert_eq!(reason.lines().count(), 1, "{reason:?}");
    readyz_turns(port, 200);
    server.stop();
    let reason = readyz_turns(port, 503);
    server.cont();
    assert_eq!(reason.lines().count(), 1, "{reason:?}");
    assert_eq!(get(port, "/healthz").map(|r| r.0).ok(), Some(200));
    readyz_turns(port, 200);
    drop(worker);
}

/// [`readyz_follows_the_sql_server`] on PostgreSQL.
#[test]
fn readyz_follows_the_postgres_server() {
    readyz_follows_the_sql_server(Backend::Postgres);
}

/// [`readyz_follows_the_sql_server`] on MariaDB.
#[test]
fn readyz_follows_the_mariadb_server() {
    readyz_follows_the_sql_server(Backend::Mariadb);
}

/// The body of `/readyz` once it answers `status` (tried for up to 30 s).
fn readyz_turns(port: u16, status: u16) -> String {
    let answer = wait_for(Duration::from_secs(30), || {
        get(port, "/readyz").ok().filter(|r| r.0 == status)
    });
    answer
        .unwrap_or_else(|| panic!("/readyz does not turn {status}"))
        .2
}

/// Asserts that `reason` is one line, starting with `store_s_own` (the store's readiness rule failed) or
/// saying that the store did not answer within the listener's wait.
fn one_line_starting(reason: &str, store_s_own: &str) {
    let known = reason.starts_with(store_s_own) || reason.starts_with("the store did not answer");
    assert!(known, "{reason}");
    assert_eq!(reason.lines().count(), 1, "{reason:?}");
}

/// After SIGTERM, while a running job drains, `/readyz` says the worker is shutting down and `/healthz`
/// and `/metrics` still answer; the listener goes when the worker exits. The embedded store is ready
/// without nodes.
#[test]
fn the_listener_answers_until_the_worker_has_stopped() {
    let dir = TestDir::new();
    let jobs = "jobs:\n  - name: sleepy\n    schedule: \"* * * * * *\"\n    command: 'sleep 6'\n";
    let (mut worker, port) = listening_worker(&dir, "w", |port| {
        format!("worker:\n  listen: 127.0.0.1:{port}\n  shutdown_grace: 30s\n{jobs}")
    });
    let timeout = Duration::from_secs(30);
    assert!(worker.wait_for_event("run.started", timeout).is_some());
    assert_eq!(
        get(port, "/readyz").map(|r| (r.0, r.2)).ok(),
        Some((200, "ready\n".to_owned()))
    );

    worker.signal(libc::SIGTERM);
    assert!(worker.wait_for_event("worker.stopping", timeout).is_some());
    let (status, _, reason) = get(port, "/readyz").expect("/readyz answers while draining");
    assert_eq!(
        (status, reason.starts_with("shutting down")),
        (503, true),
        "{reason}"
    );
    assert_eq!(get(port, "/healthz").map(|r| r.0).ok(), Some(200));
    let metrics = scrape(port);
    assert!(value(&metrics, "redcron_runs_total", &[("job", "sleepy")]).is_some());
    assert_eq!(
        worker.events("run.finished"),
        Vec::<serde_json::Value>::new(),
        "still draining"
    );

    let status = worker.wait_timeout(timeout).expect("the worker exits");
    assert_eq!(status.code(), Some(0));
    assert!(
        get(port, "/healthz").is_err(),
        "still listening after the worker exited"
    );
}

/// `redcron_config_reloads_total` counts each reload by result — a file with a problem as `failure`, a
/// good one as `success` — and the counters of a job added by the reload start at zero.
#[test]
fn reloads_are_counted_by_result() {
    let dir = TestDir::new();
    let job = |name: &str| {
        format!("  - name: {name}\n    schedule: \"* * * * * *\"\n    command: 'true'\n")
    };
    let path = dir.join("w.yaml");
    let (worker, port) = listening_worker(&dir, "w", |port| {
        format!("worker:\n  listen: 127.0.0.1:{port}\njobs:\n{}", job("a"))
    });
    let yaml = std::fs::read_to_string(&path).expect("the worker's config");
    // Replaced by rename, as an editor does, so that the worker never reads half a file.
    let replace = |text: String| {
        let temp = dir.write("w.yaml.tmp", text);
        std::fs::rename(temp, &path).expect("rename");
    };
    let timeout = Duration::from_secs(30);
    replace(format!("{yaml}    colour: blue\n"));
    worker
        .wait_for_event("config.reload_failed", timeout)
        .expect("the broken file is refused");
    replace(format!("{yaml}{}", job("b")));
    worker
        .wait_for_event("config.reloaded", timeout)
        .expect("the good file is reloaded");

    let metrics = scrape(port);
    let reloads = |result| {
        value(
            &metrics,
            "redcron_config_reloads_total",
            &[("result", result)],
        )
    };
    let failed = worker.events("config.reload_failed").len() as f64;
    let reloaded = worker.events("config.reloaded").len() as f64;
    assert_eq!(
        (reloads("failure"), reloads("success")),
        (Some(failed), Some(reloaded))
    );
    assert_eq!(
        (failed, reloaded),
        (1.0, 1.0),
        "one reload per version of the file"
    );
    let labels = [("job", "b"), ("outcome", "failure")];
    assert_eq!(value(&metrics, "redcron_runs_total", &labels), Some(0.0));
}

/// A `worker.listen` port that another process holds: the worker exits 1 and names the address.
#[test]
fn a_port_in_use_stops_the_worker() {
    let dir = TestDir::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let address = taken.local_addr().expect("a bound address");
    let yaml = format!(
        "worker:\n  listen: {address}\njobs:\n  - name: tick\n    schedule: \"* * * * * *\"\n    command: 'true'\n"
    );
    let mut worker = Worker::spawn(dir.write_config(&yaml), &[]);
    let status = worker
        .wait_timeout(Duration::from_secs(30))
        .expect("the worker exits");
    assert_eq!(status.code(), Some(1), "{}", worker.stderr());
    let expected =
        format!("error: cannot listen on {address} (worker.listen): Address already in use");
    assert!(worker.stderr().contains(&expected), "{}", worker.stderr());
    assert!(worker.events("run.started").is_empty());
}

/// A worker of the config `yaml` makes for a listen port, started and listening; on another port if the
/// one picked was taken before the worker bound it.
pub(crate) fn listening_worker(
    dir: &TestDir,
    name: &str,
    yaml: impl Fn(u16) -> String,
) -> (Worker, u16) {
    listening_worker_with(dir, name, &[], yaml)
}

/// [`listening_worker`] with `env` added to the worker's environment.
pub(crate) fn listening_worker_with(
    dir: &TestDir,
    name: &str,
    env: &[(&str, &str)],
    yaml: impl Fn(u16) -> String,
) -> (Worker, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut worker = Worker::spawn(dir.write(format!("{name}.yaml"), yaml(port)), env);
        let first = worker.wait_for(Duration::from_secs(30), |e| {
            e["event"] == "worker.listening" || e["event"] == "worker.failed"
        });
        match first {
            Some(event) if event["event"] == "worker.listening" => return (worker, port),
            Some(event)
                if event["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("in use")) =>
            {
                worker.wait_timeout(Duration::from_secs(10));
            }
            other => panic!("{name} is not listening: {other:?}\n{}", worker.stderr()),
        }
    }
    panic!("{name}: no free port in 5 attempts");
}

/// A 6-field cron expression that fires at `count` consecutive seconds, the first at least `lead` from
/// now, all in one minute (so that one expression names them); and the instants it fires at.
fn window(lead: Duration, count: u32) -> (String, Vec<DateTime<Utc>>) {
    let soon = Utc::now() + lead + chrono::Duration::seconds(1);
    let mut first = soon.with_nanosecond(0).expect("a valid instant");
    if first.second() + count > 60 {
        first += chrono::Duration::seconds(i64::from(60 - first.second()));
    }
    let last = first + chrono::Duration::seconds(i64::from(count - 1));
    let cron = format!(
        "{}-{} {} {} {} {} *",
        first.second(),
        last.second(),
        first.minute(),
        first.hour(),
        first.day(),
        first.month()
    );
    let ticks = (0..count)
        .map(|i| first + chrono::Duration::seconds(i64::from(i)))
        .collect();
    (cron, ticks)
}

fn tick_of(event: &serde_json::Value) -> Option<DateTime<Utc>> {
    let tick = event["tick"].as_str()?;
    DateTime::parse_from_rfc3339(tick).ok().map(|t| t.to_utc())
}

/// One GET on the worker's listener: status, `Content-Type` and body.
pub(crate) fn get(port: u16, path: &str) -> Result<(u16, String, String), ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = agent.get(format!("http://127.0.0.1:{port}{path}")).call()?;
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.body_mut().read_to_string()?;
    Ok((response.status().as_u16(), content_type, body))
}

/// `/metrics`: 200, in the OpenMetrics text format, parsed.
pub(crate) fn scrape(port: u16) -> Scrape {
    let (status, content_type, body) = get(port, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200, "{body}");
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    Scrape::parse(body.lines().map(|line| Ok(line.to_owned()))).expect("/metrics parses")
}

/// The value of the series `name` whose labels include `labels`.
///
/// prometheus-parse reads a counter's type from a `TYPE` line that names the sample (`…_total`), as the
/// classic text format does; OpenMetrics names the family there, so counters come back untyped, with
/// the same value.
pub(crate) fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let sample = scrape.samples.iter().find(|sample| {
        sample.metric == name
            && labels
                .iter()
                .all(|(key, value)| sample.labels.get(key) == Some(*value))
    })?;
    match sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
        Value::Histogram(_) | Value::Summary(_) => panic!("{name} is not a single number"),
    }
}

/// `redcron_store_nodes_up`, once it is `expected` (or the last value seen after `timeout`).
fn nodes_up(port: u16, timeout: Duration, expected: f64) -> f64 {
    let deadline = Instant::now() + timeout;
    loop {
        let up = value(&scrape(port), "redcron_store_nodes_up", &[]).unwrap_or(-1.0);
        if up == expected || Instant::now() >= deadline {
            return up;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The first `Some` of `probe`, tried every 100 ms for up to `timeout`.
pub(crate) fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
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

/// A thread that scrapes and parses `/metrics` every 100 ms, as a demanding Prometheus would; a failed
/// scrape fails the test.
struct Scraper {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<DateTime<Utc>>>,
}

impl Scraper {
    fn start(port: u16) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut times = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let scraped = scrape(port);
                    assert!(value(&scraped, "redcron_store_nodes_configured", &[]).is_some());
                    times.push(Utc::now());
                    std::thread::sleep(Duration::from_millis(100));
                }
                times
            }
        });
        Scraper { stop, thread }
    }

    /// Stops scraping; when each scrape was made.
    fn stop(self) -> Vec<DateTime<Utc>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("a scrape failed")
    }
}
