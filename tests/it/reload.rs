//! Hot reload: SIGHUP and a changed config file reload the jobs of a running worker; a broken file is
//! logged and not applied; a job removed while it runs finishes under its lease.

use std::time::Duration;

use serde_json::Value;

use crate::support::{Persistence, RedisCluster, TestDir, Worker};
use crate::worker::{config, ledger, ledger_job, tick_time};

const WAIT: Duration = Duration::from_secs(20);

/// When the worker logged `event`.
fn timestamp(event: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(event["timestamp"].as_str().expect("timestamp"))
        .expect("RFC 3339")
        .to_utc()
}

/// The reload events a worker logged so far.
fn reloads(worker: &Worker) -> Vec<Value> {
    worker.events("config.reloaded")
}

/// A worker running job `a` gets `b` in its place by SIGHUP: `config.reloaded` names both, SIGHUP does not
/// stop the worker, `b` runs from its next tick, and `a` is no longer raced. A broken file then changes
/// nothing and each problem is logged with its line; a file replaced by rename is picked up once.
#[test]
fn sighup_and_file_changes_reload_the_jobs() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let yaml = |jobs: &str| config(&cluster, "  id: w0\n", jobs);
    let path = dir.write(
        "jobs.yaml",
        yaml(&ledger_job("a", "* * * * * *", &dir.ledger())),
    );
    let mut worker = Worker::spawn(&path, &[]);
    worker.wait_for_event("run.finished", WAIT).expect("a runs");

    // Written in place, then SIGHUP: one reload (the watcher may see the write first; both are one reload
    // per distinct content, and SIGHUP of the same content reloads again harmlessly).
    std::fs::write(&path, yaml(&ledger_job("b", "* * * * * *", &dir.ledger()))).expect("write");
    worker.signal(libc::SIGHUP);
    let reloaded = worker
        .wait_for(WAIT, |e| {
            e["event"] == "config.reloaded" && e["added"] == "b" && e["removed"] == "a"
        })
        .expect("config.reloaded with b added and a removed");
    let reloaded_at = timestamp(&reloaded);
    worker
        .wait_for(WAIT, |e| e["event"] == "run.finished" && e["job"] == "b")
        .expect("b runs after the reload");
    assert!(
        worker.wait_timeout(Duration::from_millis(100)).is_none(),
        "SIGHUP stopped the worker"
    );

    // A broken file: logged with its line, not applied (b goes on).
    let before = reloads(&worker).len();
    let broken = yaml(&ledger_job("b", "* * * * * *", &dir.ledger())) + "    colour: blue\n";
    std::fs::write(&path, broken).expect("write");
    let failed = worker
        .wait_for_event("config.reload_failed", WAIT)
        .expect("config.reload_failed");
    let problem = failed["problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains("jobs.yaml:") && problem.contains("colour"),
        "{problem}"
    );
    // b goes on: two runs finish after the failed reload (not merely one: a run may have been under way
    // when the file changed).
    let failed_at = timestamp(&failed);
    let b_runs_after = |worker: &Worker| {
        let finished = worker.events("run.finished");
        finished
            .iter()
            .filter(|e| e["job"] == "b" && timestamp(e) > failed_at)
            .count()
    };
    let deadline = std::time::Instant::now() + WAIT;
    while b_runs_after(&worker) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "b stopped running after a broken reload"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(reloads(&worker).len(), before, "a broken file was applied");

    // An editor's write-then-rename: picked up once.
    let temp = dir.write(
        "jobs.yaml.tmp",
        yaml(
            &(ledger_job("b", "* * * * * *", &dir.ledger())
                + &ledger_job("c", "* * * * * *", &dir.ledger())),
        ),
    );
    std::fs::rename(&temp, &path).expect("rename");
    worker
        .wait_for(WAIT, |e| {
            e["event"] == "config.reloaded" && e["added"] == "c"
        })
        .expect("the renamed file is reloaded");
    std::thread::sleep(Duration::from_secs(3));
    let with_c = reloads(&worker)
        .iter()
        .filter(|e| e["added"] == "c")
        .count();
    assert_eq!(with_c, 1, "the rename was reloaded {with_c} times");
    drop(worker);

    // `a` ran only before the reload (its last tick at most a second after it).
    let last_a = ledger(&dir)
        .keys()
        .filter(|(job, _)| job == "a")
        .map(|(_, tick)| tick_time(tick))
        .max()
        .expect("a ran");
    assert!(
        last_a <= reloaded_at + chrono::Duration::seconds(1),
        "a ran at {last_a}, after the reload at {reloaded_at}"
    );
}

/// A job removed by a reload while it runs finishes under its lease (outcome success), and is not
/// raced again.
#[test]
fn a_job_removed_while_it_runs_finishes() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let yaml = |jobs: &str| config(&cluster, "  id: w0\n", jobs);
    let long = "  - name: long\n    schedule: \"* * * * * *\"\n    command: 'sleep 3'\n";
    let idle = "  - name: idle\n    schedule: \"0 0 1 1 *\"\n    command: 'true'\n";
    let path = dir.write("jobs.yaml", yaml(long));
    let mut worker = Worker::spawn(&path, &[]);
    worker
        .wait_for(WAIT, |e| e["event"] == "run.started" && e["job"] == "long")
        .expect("long starts");
    std::fs::write(&path, yaml(idle)).expect("write");
    worker.signal(libc::SIGHUP);
    worker
        .wait_for(WAIT, |e| {
            e["event"] == "config.reloaded" && e["removed"] == "long"
        })
        .expect("reloaded");
    let finished = worker
        .wait_for(WAIT, |e| e["event"] == "run.finished" && e["job"] == "long")
        .expect("the run finishes");
    assert_eq!(finished["outcome"], "success", "{finished}");
    std::thread::sleep(Duration::from_secs(2));
    let started = worker
        .events("run.started")
        .iter()
        .filter(|e| e["job"] == "long")
        .count();
    assert_eq!(started, 1, "long was raced again after its removal");
    drop(worker);
}
