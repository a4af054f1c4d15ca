//! `redcron trigger` through the lock: requests from two commands at once, raced by three real workers,
//! give one run each, never overlapping (`overlap: skip`), with `REDCRON_TRIGGER` and rising tokens; no
//! worker alive, a paused job, an unknown or disabled job: a clear error and its exit code.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use redcron::history::Kind;
use serde_json::Value;

use crate::cli::redcron;
use crate::inspect::{inspect, parse};
use crate::support::{Backend, RedisCluster, TestDir};
use crate::worker::{config, start_workers_with};

/// A job that never fires by schedule, and writes `<trigger> start|end <time>` around a second's sleep.
fn job(dir: &TestDir) -> String {
    format!(
        "  - name: adhoc\n    schedule: \"@yearly\"\n    command: 'echo \"$REDCRON_TRIGGER start $(date +%s.%N)\" >> {ledger}; \
         sleep 1; echo \"$REDCRON_TRIGGER end $(date +%s.%N)\" >> {ledger}'\n",
        ledger = dir.ledger().display()
    )
}

/// `redcron trigger adhoc --wait --json -c <config>`, started in the background.
fn trigger(dir: &TestDir, config: &std::path::Path) -> std::process::Child {
    let mut command: Command = redcron(dir.path());
    command
        .args(["trigger", "adhoc", "--wait", "--json", "-c"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().expect("run redcron trigger")
}

/// Three workers, two commands triggering the same job at once: each request runs exactly once, on one
/// worker, the two runs one after the other (the second waited for the first's lease), each with its
/// request's id in `REDCRON_TRIGGER` and the `trigger` field of its log events, the second's token above the
/// first's. Then, paused, a trigger is refused at once (exit 4). On Redis and on etcd.
fn two_commands_and_three_workers_give_one_run_per_request(backend: Backend) {
    let cluster = backend.start();
    let dir = TestDir::new();
    let job = job(&dir);
    let workers = start_workers_with(&dir, 3, |worker| cluster.config(worker, &job));
    let cli = dir.join("w0.yaml");
    let commands = [trigger(&dir, &cli), trigger(&dir, &cli)];
    let mut runs = Vec::new();
    for child in commands {
        let output = child.wait_with_output().expect("trigger ends");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        let report = parse(&String::from_utf8_lossy(&output.stdout));
        assert_eq!(report["verdict"], "ended", "{report}");
        assert_eq!(report["run"]["outcome"], "success");
        runs.push(report);
    }
    // The ledger: one start and one end per request, the runs apart.
    let mut spans: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in dir.ledger_lines() {
        let [id, _, at] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            panic!("bad ledger line {line:?}")
        };
        spans
            .entry(id.to_string())
            .or_default()
            .push(at.parse().expect("a time"));
    }
    let ids: Vec<String> = runs
        .iter()
        .map(|r| r["request"]["id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(spans.keys().cloned().collect::<Vec<_>>(), {
        let mut sorted = ids.clone();
        sorted.sort();
        sorted
    });
    let mut intervals: Vec<(f64, f64)> = spans
        .values()
        .map(|v| {
            assert_eq!(v.len(), 2, "one start and one end: {v:?}");
            (v[0], v[1])
        })
        .collect();
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(
        intervals[0].1 <= intervals[1].0,
        "the runs overlapped: {intervals:?}"
    );
    let tokens: Vec<u64> = runs
        .iter()
        .map(|r| r["run"]["token"].as_u64().expect("a token"))
        .collect();
    let (first, second) = if intervals[0].0 == spans[&ids[0]][0] {
        (tokens[0], tokens[1])
    } else {
        (tokens[1], tokens[0])
    };
    assert!(second > first, "tokens {first} then {second}");
    // One run entry per request in the history, and its events carry the request's id.
    let entries = cluster.history("adhoc");
    for id in &ids {
        let of_request: Vec<_> = entries
            .iter()
            .filter(|e| e.trigger.as_deref() == Some(id))
            .collect();
        assert_eq!(
            of_request.iter().filter(|e| e.kind == Kind::Run).count(),
            1,
            "{of_request:?}"
        );
        let started = workers
            .iter()
            .flat_map(|w| w.events("run.started"))
            .filter(|e| e["trigger"] == id.as_str())
            .count();
        assert_eq!(started, 1, "run.started with trigger {id}");
    }
    // `explain` tells the request's run as such, not as an instant off the schedule.
    let requested_at = runs[0]["request"]["requested_at"].as_str().expect("a time");
    let (code, stdout, stderr) = inspect(&dir, &cli, &["explain", "adhoc", requested_at, "--json"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let explained = parse(&stdout);
    assert_eq!(explained["verdict"], "ran", "{explained}");
    // Two commands started together may ask in the same millisecond: both requests are then told.
    let told: Vec<&str> = explained["triggers"]
        .as_array()
        .map(|ids| ids.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(told.contains(&ids[0].as_str()), "{explained}");
    let story = explained["story"][1].as_str().unwrap_or_default();
    assert!(
        story.contains("asked for by `redcron trigger`"),
        "{explained}"
    );
    assert!(!stdout.contains("should run once"), "{explained}");

    let (code, stdout, stderr) = inspect(&dir, &cli, &["pause", "adhoc"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (code, stdout, _) = inspect(&dir, &cli, &["trigger", "adhoc", "--json"]);
    assert_eq!(code, 4, "{stdout}");
    let report: Value = parse(&stdout);
    assert_eq!(report["verdict"], "not_run");
    assert!(
        report["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("paused"),
        "{report}"
    );
}

/// No worker alive: the request waits for its `--timeout`, then the command says so, exit 4; an unknown
/// job names the jobs there are and a disabled one says it is, both exit 2, with nothing written.
#[test]
fn a_trigger_nobody_claims_fails_after_its_timeout() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let jobs = job(&dir)
        + "  - name: off\n    schedule: \"@yearly\"\n    command: 'true'\n    enabled: false\n";
    let config_path = dir.write_config(&config(&cluster, "  id: cli\n", &jobs));
    // While a request waits for a worker, `status` lists it.
    let mut waiting = redcron(dir.path())
        .args(["trigger", "adhoc", "--timeout", "5m", "-c"])
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run redcron trigger");
    let pending = (0..100).find_map(|_| {
        let (code, stdout, stderr) = inspect(&dir, &config_path, &["status", "--json"]);
        assert_eq!(code, 0, "{stdout}{stderr}");
        let status = parse(&stdout);
        let pending = status["jobs"][0]["pending_triggers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if pending.is_empty() {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        Some(pending)
    });
    let _ = waiting.kill();
    let _ = waiting.wait();
    let pending = pending.expect("status lists the waiting request");
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["job"], "adhoc");
    let (_, text, _) = inspect(&dir, &config_path, &["status"]);
    assert!(text.contains("TRIGGERED at"), "{text}");
    let started = std::time::Instant::now();
    let (code, stdout, stderr) =
        inspect(&dir, &config_path, &["trigger", "adhoc", "--timeout", "2s"]);
    assert_eq!(code, 4, "{stdout}{stderr}");
    assert!(
        stdout.contains("not run: no worker claimed it within 2s: no worker is alive"),
        "{stdout}"
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    let (code, _, stderr) = inspect(&dir, &config_path, &["trigger", "nope"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("known jobs: adhoc, off"), "{stderr}");
    let (code, _, stderr) = inspect(&dir, &config_path, &["trigger", "off"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("is disabled"), "{stderr}");
    let (code, _, stderr) = inspect(&dir, &config_path, &["trigger", "adhoc", "--timeout", "0s"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("at least 1s"), "{stderr}");
}

crate::on_every_store!(
    async: [],
    sync: [two_commands_and_three_workers_give_one_run_per_request],
);

/// A poller lists the trigger requests only when a node's change count moved: reads of an unchanged list
/// run no script on the nodes (a plain `GET` each), a request another store writes is seen at the next
/// read, and a request written without the count — by an older `redcron trigger` — is still seen by the
/// full list every 10 s.
#[tokio::test]
async fn trigger_polls_list_the_requests_only_when_they_changed() {
    use redcron::trigger::{TriggerRequest, DEFAULT_TIMEOUT};
    let cluster = RedisCluster::start(3);
    let reader = cluster.store(redcron::lock::LockSettings::default());
    let writer = cluster.store(redcron::lock::LockSettings::default());
    let ids =
        |read: Vec<TriggerRequest>| -> Vec<String> { read.into_iter().map(|r| r.id).collect() };
    let scripts_run = || -> u64 {
        let info: String = cluster.query(0, ::redis::cmd("INFO").arg("commandstats"));
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0)
    };
    assert!(reader.triggers().await.expect("listed").value.is_empty());
    let before = scripts_run();
    for _ in 0..3 {
        assert!(reader.triggers().await.expect("read").value.is_empty());
    }
    assert_eq!(scripts_run(), before, "an unchanged list was listed again");

    let request = TriggerRequest::new("report", chrono::Utc::now(), DEFAULT_TIMEOUT, "new");
    writer.request_trigger(&request).await.expect("written");
    let read = reader.triggers().await.expect("read").value;
    assert_eq!(ids(read), [request.id]);

    // An older `redcron trigger`: the request and its expiry, no change count.
    let old = TriggerRequest::new("report", chrono::Utc::now(), DEFAULT_TIMEOUT, "old");
    for node in 0..cluster.len() {
        let mut write = ::redis::pipe();
        write
            .cmd("HSET")
            .arg("redcron:triggers")
            .arg(&old.id)
            .arg(old.to_json());
        write
            .cmd("ZADD")
            .arg("redcron:triggers:expiry")
            .arg(old.expires_at_ms())
            .arg(&old.id);
        let () = write
            .query(&mut cluster.connection(node))
            .expect("written the old way");
    }
    let started = std::time::Instant::now();
    loop {
        let read = ids(reader.triggers().await.expect("read").value);
        if read.contains(&old.id) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "an old writer's request was not seen within 25 s: {read:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
