//! `retries` and `retry_backoff`: real workers retry a failed run through the lock — each attempt claimed
//! as its own series of the same tick, with `REDCRON_ATTEMPT`, a token above the attempt before, after the
//! doubling backoff — until it succeeds or gives up after N, and the alert hook hears the final outcome only.

use std::collections::BTreeMap;
use std::time::Duration;

use redcron::history::{Entry, Kind};

use crate::inspect::workers::wait_for;
use crate::support::{Backend, TestDir};
use crate::worker::start_workers_with;

/// A job every 10 s that appends `<job> <tick> <attempt> <token> <start> <end>` to the ledger and fails
/// unless `succeed_at` attempts have been made (never, with `None`).
fn job(dir: &TestDir, name: &str, succeed_at: Option<u32>, retries: &str) -> String {
    let test = succeed_at.map_or("false".to_string(), |n| {
        format!("[ \"$REDCRON_ATTEMPT\" -ge {n} ]")
    });
    format!(
        "  - name: {name}\n    schedule: \"*/10 * * * * *\"\n{retries}    on_failure: 'echo \"$REDCRON_JOB $REDCRON_TICK\" >> {alerts}'\n    \
         command: 'start=$(date +%s.%N); sleep 0.2; echo \"$REDCRON_JOB $REDCRON_TICK $REDCRON_ATTEMPT $REDCRON_FENCING_TOKEN $start $(date +%s.%N)\" >> {ledger}; {test}'\n",
        alerts = dir.join("alerts").display(),
        ledger = dir.ledger().display(),
    )
}

/// One attempt as the ledger has it.
#[derive(Debug)]
struct Attempt {
    attempt: u32,
    token: u64,
    start: f64,
    end: f64,
}

/// The ledger's attempts of `job` by tick, in attempt order.
fn attempts(dir: &TestDir, job: &str) -> BTreeMap<String, Vec<Attempt>> {
    let mut ticks: BTreeMap<String, Vec<Attempt>> = BTreeMap::new();
    for line in dir.ledger_lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, tick, attempt, token, start, end] = fields[..] else {
            panic!("bad ledger line {line:?}")
        };
        if name != job {
            continue;
        }
        let number = |text: &str| text.parse::<f64>().expect("a number");
        ticks.entry(tick.to_string()).or_default().push(Attempt {
            attempt: attempt.parse().expect("an attempt"),
            token: token.parse().expect("a token"),
            start: number(start),
            end: number(end),
        });
    }
    ticks
        .values_mut()
        .for_each(|a| a.sort_by_key(|a| a.attempt));
    ticks
}

/// Two workers: a job that succeeds at its third attempt runs attempts 0, 1, 2 of its first tick, each
/// after the backoff (500 ms, then 1 s) and with a higher token, and alerts nobody; a job that always fails
/// gives up after `retries: 2` (attempts 0 to 2), and its failure hook runs once for the tick. On Redis
/// and on etcd.
fn failed_runs_are_retried_with_backoff_until_success_or_the_last_attempt(backend: Backend) {
    let cluster = backend.start();
    let dir = TestDir::new();
    let jobs = job(
        &dir,
        "recovers",
        Some(2),
        "    retries: 5\n    retry_backoff: 500ms\n",
    ) + &job(
        &dir,
        "gives-up",
        None,
        "    retries: 2\n    retry_backoff: 300ms\n",
    );
    let workers = start_workers_with(&dir, 2, |worker| cluster.config(worker, &jobs));
    let exhausted = wait_for(
        "the retries of gives-up exhausted",
        Duration::from_secs(40),
        || {
            workers
                .iter()
                .flat_map(|w| w.events("run.retries_exhausted"))
                .next()
        },
    );
    assert_eq!(exhausted["attempts"], 3);
    let tick = exhausted["tick"].as_str().expect("a tick").to_string();
    let recovered = wait_for("recovers succeeded", Duration::from_secs(20), || {
        let ticks = attempts(&dir, "recovers");
        let (tick, done) = ticks.into_iter().next()?;
        (done.len() == 3).then_some((tick, done))
    });
    std::thread::sleep(Duration::from_secs(2));

    let (_, runs) = &recovered;
    assert_eq!(
        runs.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    for (before, after) in runs.iter().zip(&runs[1..]) {
        assert!(after.token > before.token, "{runs:?}");
    }
    let waited = |k: usize| runs[k].start - runs[k - 1].end;
    assert!(waited(1) >= 0.5 && waited(2) >= 1.0, "backoff: {runs:?}");
    assert_eq!(
        attempts(&dir, "recovers")[&recovered.0].len(),
        3,
        "no attempt after the success"
    );
    // The events' `tick` is written as `REDCRON_TICK` is.
    let given_up = &attempts(&dir, "gives-up")[&tick];
    assert_eq!(
        given_up.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert!(
        given_up[2].start - given_up[1].end >= 0.6,
        "backoff doubles: {given_up:?}"
    );

    // The history: one entry per attempt; the alert hook ran for the final failure of gives-up only.
    let entries = cluster.history("recovers");
    // The first tick that ran: an earlier tick may have an entry without a run (a worker that started
    // just before a tick boundary raced the tick before it late and lost it to the new one).
    let first_run = entries
        .iter()
        .filter(|e| e.kind == Kind::Run)
        .map(|e| e.tick)
        .min()
        .unwrap_or(0);
    let attempts_recorded: Vec<Option<u32>> = entries
        .iter()
        .filter(|e| e.kind == Kind::Run && e.tick == first_run)
        .map(|e| e.attempt)
        .collect();
    assert_eq!(
        attempts_recorded,
        [Some(2), Some(1), None],
        "latest attempt first"
    );
    let alerts = std::fs::read_to_string(dir.join("alerts")).unwrap_or_default();
    assert!(!alerts.contains("recovers"), "{alerts}");
    assert_eq!(
        alerts.lines().filter(|l| l.starts_with("gives-up")).count(),
        1,
        "{alerts}"
    );
    drop(workers);
}

crate::on_every_store!(
    async: [],
    sync: [failed_runs_are_retried_with_backoff_until_success_or_the_last_attempt],
);

/// A job of the reload test every 10 s, with `retries` and a backoff of 5 s, that appends
/// `<label> <attempt> <tick>` to the ledger, then exits `exit`.
fn labelled(dir: &TestDir, name: &str, label: &str, exit: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    schedule: \"*/10 * * * * *\"\n    retry_backoff: 5s\n{extra}    \
         command: 'echo \"{label} $REDCRON_ATTEMPT $REDCRON_TICK\" >> {ledger}; {exit}'\n",
        ledger = dir.ledger().display(),
    )
}

/// A reload while retries wait for their backoff: the retry of a job the reload removed, of one it
/// disabled, and of one whose `retries` it lowered to 0, is not run but skipped (`removed`, `disabled`,
/// `retries_lowered`) in the log and the history; the retry of a job whose definition changed runs the new
/// definition.
#[test]
fn a_retry_looks_the_job_up_again_and_a_removed_or_disabled_job_is_not_retried() {
    let cluster = Backend::Redis.start();
    let dir = TestDir::new();
    let keep = "  - name: keep\n    schedule: \"@yearly\"\n    command: 'true'\n";
    let two = "    retries: 2\n";
    let before = labelled(&dir, "gone", "gone", "false", two)
        + &labelled(&dir, "off", "off", "false", two)
        + &labelled(&dir, "fewer", "fewer", "false", two)
        + &labelled(&dir, "changes", "old", "false", two)
        + keep;
    let mut workers = start_workers_with(&dir, 1, |worker| cluster.config(worker, &before));
    let worker = &mut workers[0];
    // The first tick's four runs failed; their first retries wait 5 s.
    let scheduled = wait_for("four retries scheduled", Duration::from_secs(30), || {
        let scheduled = worker.events("run.retry_scheduled");
        (scheduled.len() >= 4).then_some(scheduled)
    });
    let tick = scheduled[0]["tick"].as_str().expect("a tick").to_string();
    let after = labelled(
        &dir,
        "off",
        "off",
        "false",
        "    retries: 2\n    enabled: false\n",
    ) + &labelled(&dir, "fewer", "fewer", "false", "    retries: 0\n")
        + &labelled(&dir, "changes", "new", "true", two)
        + keep;
    dir.write("w0.yaml", cluster.config("  id: w0\n", &after));
    worker.signal(libc::SIGHUP);
    let reloaded = worker
        .wait_for_event("config.reloaded", Duration::from_secs(10))
        .expect("the config reloaded");
    assert_eq!(reloaded["removed"], "gone,off", "{reloaded}");
    // The retries that waited at the reload: one per job, or two when the worker's start caught up on
    // the tick before and the next tick came (and failed) before the reload.
    let logs = worker.logs();
    let reload_at = logs
        .iter()
        .position(|e| e["event"] == "config.reloaded")
        .expect("config.reloaded in the log");
    let waiting = |job: &str| {
        logs[..reload_at]
            .iter()
            .filter(|e| e["event"] == "run.retry_scheduled" && e["job"] == job)
            .count()
    };

    let skips = [
        ("gone", "removed"),
        ("off", "disabled"),
        ("fewer", "retries_lowered"),
    ];
    for (job, reason) in skips {
        let skipped = worker.wait_for(Duration::from_secs(20), |event| {
            event["event"] == "tick.skipped" && event["job"] == job && event["reason"] == reason
        });
        let skipped = skipped.unwrap_or_else(|| panic!("no tick.skipped {reason} for {job}"));
        assert_eq!(skipped["attempt"], 1, "{skipped}");
    }
    let retried = format!("new 1 {tick}");
    wait_for(
        "the changed job's retry ran",
        Duration::from_secs(20),
        || dir.ledger_lines().contains(&retried).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(1));
    // The first tick ran once per job, and no retry ran an old definition (later ticks of `fewer` and
    // of the changed job may have run meanwhile, as attempt 0).
    let ledger = dir.ledger_lines();
    for label in ["gone", "off", "fewer", "old"] {
        let first = format!("{label} 0 {tick}");
        assert_eq!(
            ledger.iter().filter(|l| **l == first).count(),
            1,
            "{ledger:?}"
        );
        let retry = format!("{label} 0 ");
        assert!(
            ledger
                .iter()
                .all(|l| !l.starts_with(label) || l.starts_with(&retry)),
            "a retry of {label} ran: {ledger:?}"
        );
    }

    for (job, reason) in skips {
        // The history writer gathers entries before it writes them, and a loaded machine delays it: wait
        // for the skip's entry rather than read once.
        let skipped_retry = |e: &&Entry| e.kind == Kind::Skipped && e.attempt == Some(1);
        let expected = waiting(job);
        assert!(expected >= 1, "no retry of {job} waited at the reload");
        let entries = wait_for(
            &format!("the history entries of {job}'s {expected} skipped retries"),
            Duration::from_secs(20),
            || {
                let entries = cluster.history(job);
                let written = entries.iter().filter(skipped_retry).count() >= expected;
                written.then_some(entries)
            },
        );
        let skipped: Vec<_> = entries.iter().filter(skipped_retry).collect();
        assert_eq!(skipped.len(), expected, "{entries:?}");
        assert!(
            skipped.iter().all(|e| e.reason.as_deref() == Some(reason)),
            "{entries:?}"
        );
        assert!(
            !entries
                .iter()
                .any(|e| e.kind == Kind::Run && e.attempt.is_some()),
            "{entries:?}"
        );
    }
}
