//! Alert hooks and `retries`, with three real workers on three Redis nodes: the hooks are decided from
//! final outcomes only — a failed attempt that is tried again is no outcome yet, for its own tick nor for
//! the ticks that end while its retry waits — so every change of a job's outcomes alerts exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::inspect::workers::wait_for;
use crate::inspect::{inspect, parse};
use crate::support::{RedisCluster, TestDir, Worker};
use crate::worker::start_workers;

/// A hook that appends one line of `key=value` fields (the hook's `REDCRON_*` variables) to `alerts`.
fn hook(dir: &TestDir) -> String {
    format!(
        "'echo \"alert=$REDCRON_ALERT job=$REDCRON_JOB tick=$REDCRON_TICK outcome=$REDCRON_OUTCOME \
         previous=$REDCRON_PREVIOUS_OUTCOME failures=$REDCRON_FAILURES run_id=$REDCRON_RUN_ID \
         token=$REDCRON_FENCING_TOKEN worker=$REDCRON_WORKER_ID\" >> {}'",
        dir.join("alerts").display()
    )
}

/// A job with both hooks (see [`hook`]); `extra` holds its other settings, indented as list-item fields.
fn job(dir: &TestDir, name: &str, extra: &str, command: &str) -> String {
    let hook = hook(dir);
    format!("  - name: {name}\n{extra}    on_failure: {hook}\n    on_recovery: {hook}\n    command: '{command}'\n")
}

/// The alert lines written so far, each as its fields.
fn alerts(dir: &TestDir) -> Vec<BTreeMap<String, String>> {
    dir.read("alerts")
        .unwrap_or_default()
        .lines()
        .map(|line| {
            line.split_whitespace()
                .filter_map(|field| field.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// The events named `name` of `job` across `workers`, each with the id of the worker that logged it.
fn events(workers: &[Worker], name: &str, job: &str) -> Vec<(String, Value)> {
    workers
        .iter()
        .enumerate()
        .flat_map(|(i, w)| {
            w.events(name)
                .into_iter()
                .filter(|e| e["job"] == job)
                .map(move |e| (format!("w{i}"), e))
        })
        .collect()
}

/// The retry attempt an event is about (0 for a tick's first run).
fn attempt(event: &Value) -> u64 {
    event["attempt"].as_u64().unwrap_or(0)
}

/// Waits until some worker logged `run.finished` for a tick of `job` at least `after` past `tick`: by then
/// every alert about `tick` and the ticks before it has been decided, with seconds to spare.
fn wait_past(workers: &[Worker], job: &str, tick: &str, after: chrono::Duration) {
    let until = crate::worker::tick_time(tick) + after;
    wait_for(
        &format!("{job} to run a tick {after} after {tick}"),
        Duration::from_secs(90),
        || {
            events(workers, "run.finished", job)
                .into_iter()
                .find(|(_, e)| crate::worker::tick_time(e["tick"].as_str().unwrap_or("")) >= until)
        },
    );
}

/// A job that fails at attempt 0 and succeeds at attempt 1 on every tick alerts nobody: no failure (no
/// outcome ever was one), and no recovery — though while a tick's retry waits, the tick's failed attempt 0
/// is its newest entry in the history, and later ticks end meanwhile. `steady` is every second with the
/// default `overlap: skip`, its retries contending with its next ticks for the job; `staggered` makes the
/// wait certain: `overlap: allow`, and an even second's attempt 0 fails only after 2.5 s, so the odd tick
/// after it ends its attempt 1 (a success) while the even tick's retry waits its 3 s backoff (its
/// `misfire_grace` of 2 s keeps the workers from racing the 30 s of ticks before they started at once).
#[test]
fn a_failure_that_a_retry_mends_alerts_nobody() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let jobs = job(
        &dir,
        "steady",
        "    schedule: \"* * * * * *\"\n    retries: 1\n    retry_backoff: 1s\n",
        "[ \"$REDCRON_ATTEMPT\" -ge 1 ]",
    ) + &job(
        &dir,
        "staggered",
        "    schedule: \"* * * * * *\"\n    overlap: allow\n    misfire_grace: 2s\n    retries: 1\n    retry_backoff: 3s\n",
        "case \"$REDCRON_ATTEMPT:$REDCRON_TICK\" in 0:*[02468].000Z) sleep 2.5; exit 1;; 0:*) exit 1;; esac",
    );
    let workers = start_workers(&cluster, &dir, 3, "", &jobs);
    // 16 ticks of each mended by their retry.
    let mended = |job: &str| {
        events(&workers, "run.finished", job)
            .into_iter()
            .filter(|(_, e)| e["outcome"] == "success" && attempt(e) == 1)
            .map(|(_, e)| e["tick"].as_str().unwrap_or("").to_string())
            .collect::<Vec<String>>()
    };
    for name in ["steady", "staggered"] {
        wait_for(
            &format!("16 ticks of {name} mended"),
            Duration::from_secs(90),
            || (mended(name).len() >= 16).then_some(()),
        );
    }
    // Every alert those ticks (and the ticks before them) could cause has been decided.
    for name in ["steady", "staggered"] {
        let last = mended(name).into_iter().max().expect("a mended tick");
        wait_past(&workers, name, &last, chrono::Duration::seconds(12));
    }
    drop(workers);

    let sent = alerts(&dir);
    assert!(sent.is_empty(), "no alert expected: {sent:#?}");
}

/// A job whose ticks succeed, then fail on every attempt (`retries: 1`), then succeed again alerts
/// exactly once each way: `on_failure` for a tick's final attempt (attempt 1, after its
/// `run.retries_exhausted`), never for an attempt that is retried, with that run's `REDCRON_*` fields; and
/// `on_recovery` once — though when the job recovers, the retries of the ticks that failed just before
/// still wait their backoff (2 s, ticks every second).
#[test]
fn success_then_failing_then_success_alerts_once_each_way() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let flag = dir.join("failing");
    let jobs = job(
        &dir,
        "flips",
        "    schedule: \"* * * * * *\"\n    retries: 1\n    retry_backoff: 2s\n",
        &format!("test ! -e {}", flag.display()),
    );
    let workers = start_workers(&cluster, &dir, 3, "", &jobs);
    let count = |name: &str, pred: &dyn Fn(&Value) -> bool| {
        events(&workers, name, "flips")
            .into_iter()
            .filter(|(_, e)| pred(e))
            .count()
    };
    let succeeded = |e: &Value| e["outcome"] == "success";
    wait_for("3 successes", Duration::from_secs(60), || {
        (count("run.finished", &succeeded) >= 3).then_some(())
    });
    std::fs::write(&flag, "").expect("write the flag");
    wait_for(
        "3 ticks failed on every attempt",
        Duration::from_secs(60),
        || (count("run.retries_exhausted", &|_| true) >= 3).then_some(()),
    );
    std::fs::remove_file(&flag).expect("remove the flag");
    let before = count("run.finished", &succeeded);
    let recovered = wait_for("5 successes after", Duration::from_secs(60), || {
        let successes: Vec<String> = events(&workers, "run.finished", "flips")
            .into_iter()
            .filter(|(_, e)| succeeded(e))
            .map(|(_, e)| e["tick"].as_str().unwrap_or("").to_string())
            .collect();
        (successes.len() >= before + 5).then(|| successes.into_iter().max())?
    });
    wait_past(&workers, "flips", &recovered, chrono::Duration::seconds(8));
    let finished = events(&workers, "run.finished", "flips");
    let exhausted = events(&workers, "run.retries_exhausted", "flips");
    drop(workers);

    let sent = alerts(&dir);
    let of = |kind: &str| {
        sent.iter()
            .filter(|a| a["alert"] == kind)
            .collect::<Vec<_>>()
    };
    let (failure, recovery) = (of("failure"), of("recovery"));
    assert_eq!(failure.len(), 1, "one failure alert: {sent:#?}");
    assert_eq!(recovery.len(), 1, "one recovery alert: {sent:#?}");
    // The failure alert is about a final attempt: attempt 1 of a tick whose retries were exhausted, run by
    // the worker that sent it, with its token.
    let failure = failure[0];
    let (worker, run) = finished
        .iter()
        .find(|(_, e)| e["run_id"] == failure["run_id"].as_str())
        .unwrap_or_else(|| panic!("no run {failure:?}"));
    assert_eq!(attempt(run), 1, "{run}");
    assert_eq!(run["outcome"], "failure", "{run}");
    assert!(
        exhausted
            .iter()
            .any(|(w, e)| w == worker && e["tick"] == run["tick"]),
        "the alert's tick exhausted its retries on {worker}: {exhausted:?}"
    );
    assert_eq!(failure["tick"], run["tick"].as_str().unwrap_or(""));
    assert_eq!(failure["token"], run["token"].to_string());
    assert_eq!(&failure["worker"], worker);
    assert_eq!(
        (failure["job"].as_str(), failure["outcome"].as_str()),
        ("flips", "failure")
    );
    assert_eq!(
        (failure["previous"].as_str(), failure["failures"].as_str()),
        ("success", "1"),
        "{failure:?}"
    );
    // The recovery alert is about a success, by the worker that ran it.
    let recovery = recovery[0];
    let (worker, run) = finished
        .iter()
        .find(|(_, e)| e["run_id"] == recovery["run_id"].as_str())
        .unwrap_or_else(|| panic!("no run {recovery:?}"));
    assert_eq!(run["outcome"], "success", "{run}");
    assert_eq!(&recovery["worker"], worker);
    assert_eq!(recovery["token"], run["token"].to_string());
    assert_eq!(
        (
            recovery["outcome"].as_str(),
            recovery["previous"].as_str(),
            recovery["failures"].as_str()
        ),
        ("success", "failure", "0"),
        "{recovery:?}"
    );
}

/// A real failure while the previous tick's retry still waits alerts: ticks every 10 s whose attempt 0
/// fails after 3 s and attempt 1 (5 s later) succeeds; once one has succeeded, `redcron trigger` asks for a
/// run while the next tick's attempt 0 runs, so the trigger's run — a failure, and final: triggers are not
/// retried — waits for it (`overlap: skip`) and runs while its retry waits. `on_failure` runs for the
/// trigger's run (the outcome before it: the success); `on_recovery` for the waiting tick's attempt 1,
/// which succeeds after it; nothing else.
#[test]
fn a_failure_while_a_retry_waits_alerts() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let jobs = job(
        &dir,
        "pending",
        "    schedule: \"*/10 * * * * *\"\n    retries: 1\n    retry_backoff: 5s\n",
        "[ -z \"$REDCRON_TRIGGER\" ] || exit 1; [ \"$REDCRON_ATTEMPT\" -ge 1 ] || { sleep 3; exit 1; }",
    );
    let workers = start_workers(&cluster, &dir, 3, "", &jobs);
    let finished = |pred: &dyn Fn(&Value) -> bool| {
        events(&workers, "run.finished", "pending")
            .into_iter()
            .map(|(_, e)| e)
            .find(|e| pred(e))
    };
    let first = wait_for("a tick mended", Duration::from_secs(60), || {
        finished(&|e| e["outcome"] == "success" && attempt(e) == 1)
    });
    let first_tick = first["tick"].as_str().expect("a tick").to_string();
    let next = wait_for("the next tick's attempt 0", Duration::from_secs(60), || {
        events(&workers, "run.started", "pending")
            .into_iter()
            .map(|(_, e)| e)
            .find(|e| {
                attempt(e) == 0 && e["tick"].as_str().is_some_and(|t| t > first_tick.as_str())
            })
    });
    let tick = next["tick"].as_str().expect("a tick").to_string();
    let (code, stdout, stderr) = inspect(
        &dir,
        &dir.join("w0.yaml"),
        &["trigger", "pending", "--wait", "--json"],
    );
    assert_eq!(code, 1, "the trigger's run fails: {stdout}{stderr}");
    let triggered = parse(&stdout);
    assert_eq!(triggered["run"]["outcome"], "failure", "{triggered}");
    let mended = wait_for("the waiting tick mended", Duration::from_secs(60), || {
        finished(&|e| e["tick"] == tick.as_str() && attempt(e) == 1)
    });
    assert_eq!(mended["outcome"], "success", "{mended}");
    // The trigger ran while the retry waited: between the tick's attempts.
    let token = |e: &Value| e["token"].as_u64().expect("a token");
    assert!(
        token(&next) < token(&triggered["run"]) && token(&triggered["run"]) < token(&mended),
        "the trigger did not run between the tick's attempts: {next} {triggered} {mended}"
    );
    wait_past(&workers, "pending", &tick, chrono::Duration::seconds(16));
    drop(workers);

    let sent = alerts(&dir);
    assert_eq!(sent.len(), 2, "{sent:#?}");
    let (failure, recovery) = (&sent[0], &sent[1]);
    assert_eq!(failure["alert"], "failure", "{sent:#?}");
    assert_eq!(
        failure["run_id"],
        triggered["run"]["run_id"].as_str().unwrap_or(""),
        "{sent:#?}"
    );
    assert_eq!(
        (failure["previous"].as_str(), failure["failures"].as_str()),
        ("success", "1"),
        "{sent:#?}"
    );
    assert_eq!(recovery["alert"], "recovery", "{sent:#?}");
    assert_eq!(
        recovery["run_id"],
        mended["run_id"].as_str().unwrap_or(""),
        "{sent:#?}"
    );
    assert_eq!(recovery["previous"], "failure", "{sent:#?}");
}
