//! Hot reload: SIGHUP and a changed config file reload the jobs of a running worker; a broken file is
//! logged and not applied; a job removed while it runs finishes under its lease; a file replaced (renamed
//! over) while its job runs lets the run finish and changes the ticks after each worker's reload; a
//! renamed job is a new job.

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

/// One run of a [`marked_job`], from its start and end lines.
#[derive(Debug, Clone)]
struct Marked {
    label: String,
    tick: chrono::DateTime<chrono::Utc>,
    token: u64,
    worker: String,
    started_ns: i128,
    ended_ns: Option<i128>,
}

/// A job that appends `<label> start <tick> <token> <worker> <ns>` to `ledger`, sleeps `seconds`, and
/// appends the same with `end`; `label` is shell text (`v2`, `$REDCRON_JOB`).
fn marked_job(name: &str, label: &str, seconds: f64, ledger: &std::path::Path) -> String {
    let line = |phase: &str| {
        format!(
            "echo \"{label} {phase} $REDCRON_TICK $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID $(date +%s%N)\" \
             >> {}",
            ledger.display()
        )
    };
    format!(
        "  - name: {name}\n    schedule: \"* * * * * *\"\n    command: '{}; sleep {seconds}; {}'\n",
        line("start"),
        line("end")
    )
}

/// Every run the ledger holds, in the order they started; a run is one start line and the end line of the
/// same label, tick and token.
fn marked_runs(dir: &TestDir) -> Vec<Marked> {
    let mut runs: Vec<Marked> = Vec::new();
    for line in dir.ledger_lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [label, phase, tick, token, worker, ns] = fields[..] else {
            panic!("bad ledger line {line:?}")
        };
        let token: u64 = token.parse().expect("a token");
        let ns: i128 = ns.parse().expect("nanoseconds");
        if phase == "start" {
            runs.push(Marked {
                label: label.to_string(),
                tick: tick_time(tick),
                token,
                worker: worker.to_string(),
                started_ns: ns,
                ended_ns: None,
            });
        } else if let Some(run) = runs
            .iter_mut()
            .find(|run| run.label == label && run.token == token && run.tick == tick_time(tick))
        {
            run.ended_ns = Some(ns);
        }
    }
    runs.sort_by_key(|run| run.started_ns);
    runs
}

/// Waits until `worker` logged `count` reloads; returns when it logged each, and its worker id.
fn reloads_of(worker: &Worker, count: usize) -> (String, Vec<chrono::DateTime<chrono::Utc>>) {
    let deadline = std::time::Instant::now() + WAIT;
    while reloads(worker).len() < count {
        if std::time::Instant::now() >= deadline {
            // What the worker was doing instead (seen once in a full suite, not alone: kept for the next
            // one to read).
            let logs = worker.logs();
            let last: Vec<String> = logs
                .iter()
                .rev()
                .take(40)
                .rev()
                .map(|e| format!("{} {} {}", e["timestamp"], e["event"], e["message"]))
                .collect();
            panic!(
                "fewer than {count} reloads in {WAIT:?}; the worker's last events:\n{}\nstderr:\n{}",
                last.join("\n"),
                worker.stderr()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let id = worker
        .wait_for_event("worker.started", WAIT)
        .and_then(|e| e["worker"].as_str().map(str::to_string))
        .expect("the worker's id");
    (id, reloads(worker).iter().map(timestamp).collect())
}

/// Replaces `path` as editors and deploys do: a new file renamed over it.
fn replace(path: &std::path::Path, contents: &str) {
    let temp = path.with_extension("yaml.new");
    std::fs::write(&temp, contents).expect("write");
    std::fs::rename(&temp, path).expect("rename");
}

/// Asserts what holds of every run whatever the reloads: each (label, tick) ran once, every run ended,
/// each label's tokens rise with its ticks; returns the runs.
fn each_once_and_ended(dir: &TestDir) -> Vec<Marked> {
    let runs = marked_runs(dir);
    for (i, run) in runs.iter().enumerate() {
        let twice = runs[..i]
            .iter()
            .any(|other| other.label == run.label && other.tick == run.tick);
        assert!(!twice, "{} {} ran twice: {runs:?}", run.label, run.tick);
        assert!(run.ended_ns.is_some(), "a run never ended: {run:?}");
    }
    let mut by_tick = runs.clone();
    by_tick.sort_by_key(|run| run.tick);
    for (i, run) in by_tick.iter().enumerate() {
        let before = by_tick[..i].iter().filter(|other| other.label == run.label);
        assert!(
            before.clone().all(|other| other.token < run.token),
            "{run:?} after {:?}",
            before.collect::<Vec<_>>()
        );
    }
    runs
}

/// The definition a worker ran tick `tick` with: the one its last reload before the tick loaded (a tick
/// taken due before a reload runs the old definition, and a changed or new job is raced from its next
/// tick after the reload), as the index into its reloads (0: the file it started with); `None` for a tick
/// too near a reload to tell (log timestamps are the wall clock, ticks cluster time).
fn loaded_at(
    reloads: &[chrono::DateTime<chrono::Utc>],
    tick: chrono::DateTime<chrono::Utc>,
) -> Option<usize> {
    let margin = chrono::Duration::milliseconds(50);
    let clear = reloads.iter().all(|at| (tick - *at).abs() > margin);
    clear.then(|| reloads.iter().filter(|at| **at < tick).count())
}

/// The definition `run`'s worker had loaded at its tick ([`loaded_at`]), from each worker's reloads.
fn loaded_by(
    reloads: &[(String, Vec<chrono::DateTime<chrono::Utc>>)],
    run: &Marked,
) -> Option<usize> {
    let (_, of_worker) = reloads
        .iter()
        .find(|(id, _)| *id == run.worker)
        .unwrap_or_else(|| panic!("{run:?} by an unknown worker"));
    loaded_at(of_worker, run.tick)
}

/// A config file replaced (a new file renamed over it, as editors and deploys do) 5 times, each time while
/// a 3-second run of the job it defines is under way, under two workers that read the same file: each run
/// under way finishes with its definition (success, its lease kept: no lease lost, no run of the next
/// definition starts while it holds the job), every later tick runs the new definition on each worker
/// from its reload on, each tick runs once, tokens rise.
#[test]
fn a_config_replaced_while_its_job_runs_lets_the_run_finish() {
    const REPLACEMENTS: usize = 5;
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let yaml = |version: usize| {
        let job = marked_job("deploy", &format!("v{version}"), 3.0, &dir.ledger());
        config(&cluster, "  heartbeat_every: 1s\n", &job)
    };
    let path = dir.write("jobs.yaml", yaml(0));
    let mut workers = [Worker::spawn(&path, &[]), Worker::spawn(&path, &[])];
    let mut in_flight = Vec::new();
    for version in 1..=REPLACEMENTS {
        let running = crate::inspect::workers::wait_for("a run under way", WAIT, || {
            let runs = marked_runs(&dir);
            runs.into_iter()
                .find(|run| run.label == format!("v{}", version - 1) && run.ended_ns.is_none())
        });
        replace(&path, &yaml(version));
        in_flight.push(running);
        for worker in &workers {
            let (_, reloads) = reloads_of(worker, version);
            assert!(reloads.len() == version, "{reloads:?}");
        }
    }
    crate::inspect::workers::wait_for("a run of the last definition", WAIT, || {
        let last = format!("v{REPLACEMENTS}");
        marked_runs(&dir)
            .into_iter()
            .find(|run| run.label == last && run.ended_ns.is_some())
    });
    let reloads: Vec<(String, Vec<_>)> = workers
        .iter()
        .map(|worker| reloads_of(worker, REPLACEMENTS))
        .collect();
    for worker in &mut workers {
        worker.signal(libc::SIGTERM);
        let status = worker.wait_timeout(Duration::from_secs(30)).expect("stops");
        assert_eq!(status.code(), Some(0));
    }

    let runs = each_once_and_ended(&dir);
    for worker in &workers {
        for event in ["lease.lost", "lease.expiring", "config.reload_failed"] {
            assert!(
                worker.events(event).is_empty(),
                "{event}: {:?}",
                worker.events(event)
            );
        }
        let finished = worker.events("run.finished");
        assert!(
            finished.iter().all(|e| e["outcome"] == "success"),
            "{finished:?}"
        );
    }
    // The run under way at each replacement finished, with its own definition.
    for running in &in_flight {
        let ended = runs.iter().any(|run| {
            run.tick == running.tick && run.label == running.label && run.ended_ns.is_some()
        });
        assert!(ended, "{running:?} did not finish: {runs:?}");
    }
    // One run at a time (`overlap: skip`), across the definitions: the lease of the run under way held
    // the job against the new definition's ticks.
    for pair in runs.windows(2) {
        let (earlier, later) = (&pair[0], &pair[1]);
        assert!(
            earlier.ended_ns.is_some_and(|end| end <= later.started_ns),
            "{later:?} started while {earlier:?} ran"
        );
    }
    // Each worker ran each tick with the definition it had loaded by then.
    let mut with_new = 0;
    for run in &runs {
        if let Some(version) = loaded_by(&reloads, run) {
            assert_eq!(
                run.label,
                format!("v{version}"),
                "{run:?}; reloads {reloads:?}"
            );
            with_new += usize::from(version > 0);
        }
    }
    assert!(
        with_new >= REPLACEMENTS,
        "too few runs of the new definitions: {runs:?}"
    );
    let reloaded_during = reloads
        .iter()
        .flat_map(|(_, at)| at.iter())
        .filter(|at| {
            let ns = at.timestamp_nanos_opt().map_or(0, i128::from);
            runs.iter()
                .any(|run| run.started_ns < ns && run.ended_ns.is_some_and(|end| end > ns))
        })
        .count();
    eprintln!(
        "config replaced {REPLACEMENTS} times while its job ran (2 workers): {} runs, each tick once, one at a \
         time, {reloaded_during} of {} reloads applied while a run was under way, every run finished with \
         success, no lease lost",
        runs.len(),
        2 * REPLACEMENTS
    );
}

/// A job renamed in the config file while its run is under way, under two workers that read the file:
/// renaming makes a new job. The old name's run finishes (success) and the old name is raced no more
/// after each worker's reload; the new name is raced from its next tick after the reload, once per tick,
/// with its own claims and tokens. Done again after `redcron pause <name> --for 1m` (docs/cli.md's way to
/// rename without a gap in which the workers' reloads disagree): no instant then runs under both names.
#[test]
fn a_renamed_job_is_a_new_job_and_the_old_names_run_finishes() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let yaml = |name: &str| {
        let job = marked_job(name, "$REDCRON_JOB", 2.5, &dir.ledger());
        config(&cluster, "  heartbeat_every: 1s\n", &job)
    };
    let path = dir.write("jobs.yaml", yaml("old"));
    let mut workers = [Worker::spawn(&path, &[]), Worker::spawn(&path, &[])];
    let under_way = |label: &str| {
        crate::inspect::workers::wait_for("a run under way", WAIT, || {
            marked_runs(&dir)
                .into_iter()
                .find(|run| run.label == label && run.ended_ns.is_none())
        })
    };
    let finished = |label: &str, count: usize| {
        crate::inspect::workers::wait_for("runs of the new name", WAIT, || {
            let runs = marked_runs(&dir);
            let ended = runs
                .iter()
                .filter(|run| run.label == label && run.ended_ns.is_some());
            (ended.count() >= count).then_some(())
        })
    };
    let renamed = under_way("old");
    replace(&path, &yaml("new"));
    for worker in &workers {
        worker
            .wait_for(WAIT, |e| {
                e["event"] == "config.reloaded" && e["added"] == "new" && e["removed"] == "old"
            })
            .expect("the rename reloaded as a new job and a removed one");
    }
    finished("new", 2);

    // The way without a gap: the old name paused first, then renamed.
    let paused = under_way("new");
    let (code, stdout, stderr) =
        crate::inspect::inspect(&dir, &path, &["pause", "new", "--for", "1m"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let paused_at = chrono::Utc::now();
    replace(&path, &yaml("newer"));
    for worker in &workers {
        reloads_of(worker, 2);
    }
    finished("newer", 2);
    let reloads: Vec<(String, Vec<_>)> = workers.iter().map(|w| reloads_of(w, 2)).collect();
    for worker in &mut workers {
        worker.signal(libc::SIGTERM);
        let status = worker.wait_timeout(Duration::from_secs(30)).expect("stops");
        assert_eq!(status.code(), Some(0));
    }

    let runs = each_once_and_ended(&dir);
    // The runs under way at the renames finished, as successes.
    for running in [&renamed, &paused] {
        let outcome = workers.iter().find_map(|worker| {
            worker.events("run.finished").into_iter().find(|e| {
                e["job"] == running.label.as_str()
                    && e["tick"].as_str().map(tick_time) == Some(running.tick)
            })
        });
        let outcome = outcome.unwrap_or_else(|| panic!("{running:?} never finished"));
        assert_eq!(outcome["outcome"], "success", "{outcome}");
    }
    // Each worker ran the names its file had when the tick came: old, then new, then newer.
    let names = ["old", "new", "newer"];
    for run in &runs {
        if let Some(loaded) = loaded_by(&reloads, run) {
            assert_eq!(run.label, names[loaded], "{run:?}; reloads {reloads:?}");
        }
    }
    // Paused, the old name ran nothing after `pause` returned, so no instant ran under both.
    let ticks = |label: &str| -> Vec<chrono::DateTime<chrono::Utc>> {
        runs.iter()
            .filter(|run| run.label == label)
            .map(|run| run.tick)
            .collect()
    };
    let after_pause: Vec<_> = ticks("new")
        .into_iter()
        .filter(|t| *t > paused_at)
        .collect();
    assert!(
        after_pause.is_empty(),
        "new ran while paused: {after_pause:?}"
    );
    let both: Vec<_> = ticks("newer")
        .into_iter()
        .filter(|t| ticks("new").contains(t))
        .collect();
    assert!(
        both.is_empty(),
        "instants run as new and as newer: {both:?}"
    );
    let unpaused_both = ticks("new")
        .into_iter()
        .filter(|t| ticks("old").contains(t))
        .count();
    // No lease is shared between the names: the new one's first run may start while the old one's runs.
    let side_by_side = runs
        .iter()
        .filter(|run| run.label != "old")
        .filter(|run| {
            runs.iter().any(|other| {
                other.label != run.label
                    && other.started_ns < run.started_ns
                    && other.ended_ns.is_some_and(|end| end > run.started_ns)
            })
        })
        .count();
    eprintln!(
        "renamed twice under 2 workers: {} runs, each (name, tick) once; the renamed runs finished; \
         instants run under both names: {unpaused_both} renamed plainly, 0 renamed after a pause; runs of \
         a new name started while the old name's ran: {side_by_side}",
        runs.len()
    );
}

/// A worker whose file names no `worker.id` keeps the id it made up at start across reloads: a reload
/// that changes only a job logs `config.reloaded` and no `config.restart_needed` (two made-up ids always
/// differ, and every reload used to ask for a restart). A reload that does change a worker setting still
/// asks for one, naming the section.
#[test]
fn a_reload_keeps_a_made_up_worker_id_and_asks_no_restart() {
    let dir = TestDir::new();
    let yaml = |worker: &str, jobs: &str| crate::embedded::config_with(worker, jobs);
    let path = dir.write_config(&yaml(
        "  shutdown_grace: 5s\n",
        &ledger_job("a", "* * * * * *", &dir.ledger()),
    ));
    let mut worker = Worker::spawn(path.clone(), &[]);
    worker
        .wait_for_event("worker.started", WAIT)
        .expect("worker.started");

    replace(
        &path,
        &yaml(
            "  shutdown_grace: 5s\n",
            &ledger_job("b", "* * * * * *", &dir.ledger()),
        ),
    );
    worker.signal(libc::SIGHUP);
    worker
        .wait_for(WAIT, |e| {
            e["event"] == "config.reloaded" && e["added"] == "b"
        })
        .expect("config.reloaded with b added");
    assert!(
        worker.events("config.restart_needed").is_empty(),
        "a reload that changed only a job asked for a restart: {:?}",
        worker.events("config.restart_needed")
    );

    replace(
        &path,
        &yaml(
            "  shutdown_grace: 6s\n",
            &ledger_job("b", "* * * * * *", &dir.ledger()),
        ),
    );
    worker.signal(libc::SIGHUP);
    let restart = worker
        .wait_for_event("config.restart_needed", WAIT)
        .expect("a changed worker setting asks for a restart");
    assert_eq!(restart["sections"], "worker", "{restart}");
}
