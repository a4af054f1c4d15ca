//! A herd of jobs due at one instant on a worker with few file descriptors: each running child holds three
//! of the worker's (two pipes and a pidfd), so past the limit a spawn fails with `Too many open files` —
//! a tick claimed and never run. The worker raises its soft limit to the hard one and lets a won run wait
//! for a slot instead.

use std::time::Duration;

use chrono::{DateTime, Timelike as _, Utc};

use crate::support::{RedisCluster, TestDir, Worker};
use crate::worker::{config, ledger, tick_time};

/// 400 jobs due at one tick, each running for a second, on a worker whose hard limit is 1,000 open files
/// (room for 248 children beside the 256 it keeps): every tick runs exactly once, none fails to start, and
/// never more than 248 run at once. Without the slots, 1,200 descriptors were needed and runs failed to
/// start; with a timerfd per watchdog timer (two per running child, one per run waiting
/// for a slot), the slots' 3 descriptors per child were 5, and runs failed again.
#[test]
fn a_herd_past_the_open_files_limit_waits_for_slots_and_every_tick_runs() {
    let _heavy = super::support::heavy();
    const JOBS: usize = 400;
    const LIMIT: u64 = 1_000;
    const SLOTS: usize = (LIMIT as usize - 256) / 3;
    let dir = TestDir::new();
    // A daily schedule whose only tick comes once the worker has started (10 s: room for a slow start on a
    // loaded machine).
    let tick = Utc::now() + chrono::Duration::seconds(10);
    let schedule = format!("{} {} {} * * *", tick.second(), tick.minute(), tick.hour());
    let mut yaml = String::from("worker:\n  id: w\njobs:\n");
    for j in 0..JOBS {
        yaml.push_str(&format!(
            "  - name: j{j:03}\n    schedule: \"{schedule}\"\n    command: 'echo \"$REDCRON_JOB $REDCRON_TICK \
             $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID\" >> {}; sleep 1'\n",
            dir.ledger().display()
        ));
    }
    let worker = Worker::builder(dir.write_config(&yaml))
        .open_files_limit(LIMIT)
        .spawn();
    let started = worker
        .wait_for_event("worker.started", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the worker did not start: {}", worker.stderr()));
    assert_eq!(started["fd_limit"], LIMIT, "{started}");
    assert_eq!(started["max_children"], SLOTS, "{started}");

    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while worker.events("run.finished").len() < JOBS {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {JOBS} runs finished: {}",
            worker.events("run.finished").len(),
            worker.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let failed: Vec<_> = worker
        .events("run.finished")
        .into_iter()
        .filter(|event| event["outcome"] != "success")
        .collect();
    assert!(failed.is_empty(), "runs that did not succeed: {failed:?}");
    let runs = ledger(&dir);
    assert_eq!(runs.len(), JOBS, "{runs:?}");
    assert!(runs.values().all(|entries| entries.len() == 1), "{runs:?}");
    // Children running at once, in the order the worker logged their starts and ends (a run logs
    // `run.finished` before it gives its slot back).
    let (mut running, mut most) = (0usize, 0usize);
    for event in worker.logs() {
        match event["event"].as_str() {
            Some("run.started") => running += 1,
            Some("run.finished") => running = running.saturating_sub(1),
            _ => continue,
        }
        most = most.max(running);
    }
    assert!(most <= SLOTS, "{most} children ran at once, {SLOTS} slots");
    assert!(most > 1, "the runs did not overlap at all: {most}");
}

/// A won run that waits for a slot keeps its lease and starts when one frees, however long past the
/// lease's TTL, until the tick's window ends; past it the tick is skipped as `no_slot`. One slot (a limit
/// of 259 open files), 3 jobs of 4 s due at one tick, a 2 s TTL on 3 real Redis nodes, a 6 s misfire
/// grace: the first runs at once, the second starts 4 s later (2 TTLs, renewed meanwhile), the third
/// would start 8 s after the tick and is skipped at 6 s.
#[test]
fn a_run_waiting_for_a_slot_keeps_its_lease_until_the_window_ends() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let jobs = jobs_due_once(&dir, 3, "    misfire_grace: 6s\n", 4);
    let worker = Worker::builder(dir.write_config(&config(&cluster, "  id: w\n", &jobs)))
        .open_files_limit(259)
        .spawn();
    let started = worker
        .wait_for_event("worker.started", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the worker did not start: {}", worker.stderr()));
    assert_eq!(started["max_children"], 1, "{started}");

    let skipped = worker
        .wait_for(Duration::from_secs(60), |event| {
            event["event"] == "tick.skipped" && event["reason"] == "no_slot"
        })
        .unwrap_or_else(|| {
            panic!(
                "no tick was skipped for want of a slot: {}",
                worker.stderr()
            )
        });
    assert_eq!(skipped["level"], "ERROR", "{skipped}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while worker.events("run.finished").len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "two runs did not finish: {}",
            worker.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let finished = worker.events("run.finished");
    assert!(
        finished.iter().all(|event| event["outcome"] == "success"),
        "{finished:?}"
    );
    let runs = ledger(&dir);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.values().all(|entries| entries.len() == 1), "{runs:?}");
    assert!(
        worker.events("lease.lost").is_empty(),
        "a waiting run lost its lease: {}",
        worker.stderr()
    );
    // The second run waited for the first one's 4 s: longer than its lease's TTL without a renewal.
    let starts: Vec<DateTime<Utc>> = worker
        .events("run.started")
        .iter()
        .map(|event| tick_time(event["timestamp"].as_str().expect("a timestamp")))
        .collect();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert!(
        starts[1] - starts[0] >= chrono::Duration::seconds(3),
        "the second run did not wait for the first: {starts:?}"
    );
}

/// A run still waiting for a slot when shutdown is requested does not start: its tick is skipped as
/// `shutdown` (its lease released), while the run under way gets the shutdown grace and finishes. One
/// slot, 2 jobs of 3 s due at one tick, SIGTERM once the first has started.
#[test]
fn a_run_waiting_for_a_slot_does_not_start_after_shutdown_is_requested() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let jobs = jobs_due_once(&dir, 2, "", 3);
    let mut worker = Worker::builder(dir.write_config(&config(&cluster, "  id: w\n", &jobs)))
        .open_files_limit(259)
        .spawn();
    worker
        .wait_for_event("worker.started", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the worker did not start: {}", worker.stderr()));
    worker
        .wait_for_event("run.started", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no run started: {}", worker.stderr()));
    worker.signal(libc::SIGTERM);
    let status = worker
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the worker did not exit: {}", worker.stderr()));
    assert!(status.success(), "{status:?}: {}", worker.stderr());
    assert_eq!(worker.events("run.started").len(), 1, "{}", worker.stderr());
    let finished = worker.events("run.finished");
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(finished[0]["outcome"], "success", "{finished:?}");
    let skipped: Vec<_> = worker
        .events("tick.skipped")
        .into_iter()
        .filter(|event| event["reason"] == "shutdown")
        .collect();
    assert_eq!(skipped.len(), 1, "{}", worker.stderr());
    assert_eq!(ledger(&dir).len(), 1);
}

/// `count` jobs `j0`, `j1`, … due once, at one tick 6 s from now (a daily schedule), each appending its
/// line to the ledger and then sleeping `sleep_s` seconds; `extra` is added to each job's YAML.
fn jobs_due_once(dir: &TestDir, count: usize, extra: &str, sleep_s: u32) -> String {
    let tick = Utc::now() + chrono::Duration::seconds(6);
    let schedule = format!("{} {} {} * * *", tick.second(), tick.minute(), tick.hour());
    (0..count)
        .map(|j| {
            format!(
                "  - name: j{j}\n    schedule: \"{schedule}\"\n{extra}    command: 'echo \"$REDCRON_JOB \
                 $REDCRON_TICK $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID\" >> {}; sleep {sleep_s}'\n",
                dir.ledger().display()
            )
        })
        .collect()
}
