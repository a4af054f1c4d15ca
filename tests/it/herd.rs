//! A herd of jobs due at one instant on a worker with few file descriptors: each running child holds three
//! of the worker's (two pipes and a pidfd), so past the limit a spawn fails with `Too many open files` —
//! a tick claimed and never run. The worker raises its soft limit to the hard one and lets a won run wait
//! for a slot instead.

use std::time::Duration;

use chrono::{Timelike as _, Utc};

use crate::support::{TestDir, Worker};
use crate::worker::ledger;

/// 150 jobs due at one tick, each running for a second, on a worker whose hard limit is 400 open files
/// (room for 48 children beside the 256 it keeps): every tick runs exactly once, none fails to start, and
/// never more than 48 run at once. Without the slots, 450 descriptors were needed and about a third of the
/// runs failed to start.
#[test]
fn a_herd_past_the_open_files_limit_waits_for_slots_and_every_tick_runs() {
    const JOBS: usize = 150;
    const SLOTS: usize = (400 - 256) / 3;
    let dir = TestDir::new();
    // A daily schedule whose only tick comes once the worker has started.
    let tick = Utc::now() + chrono::Duration::seconds(6);
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
        .open_files_limit(400)
        .spawn();
    let started = worker
        .wait_for_event("worker.started", Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the worker did not start: {}", worker.stderr()));
    assert_eq!(started["fd_limit"], 400, "{started}");
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
