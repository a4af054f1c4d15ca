//! The embedded store end to end: worker processes of the built binary on a database file with no Redis.
//!
//! What the file adds over process memory is what these prove: a restarted worker — even one whose wall
//! clock stepped back across the restart — runs no tick again and hands out higher tokens; two worker
//! processes sharing one file run each tick once, also while one of them is frozen inside a transaction;
//! history outlives the process that wrote it; a store reopened on the file keeps its claims, fences and
//! leases, but not a lease of another boot; and a file that is not a database stops the worker (and the
//! store) with an error that names it. What the embedded store guarantees as every store does is the
//! conformance suite (`conformance::embedded::…`).

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use redcron::history::{Entry, HistorySettings, Kind, Query};
use redcron::lock::{ClaimOutcome, LockSettings};
use redcron::membership::Member;
use redcron::schedule::Tick;
use redcron::store::embedded::EmbeddedStore;
use redcron::store::{Store, StoreError};

use crate::conformance::request;
use crate::support::{won, TestDir, Worker};
use crate::worker::{ledger, ledger_job, tick_time};

/// A config without a store section: the database is `redcron.db` beside it. Short leases, as in the
/// other tests.
pub(crate) fn config(id: &str, jobs: &str) -> String {
    config_with(&format!("  id: {id}\n"), jobs)
}

/// [`config`] with `worker_section` (YAML under `worker:`, already indented) for the worker.
pub(crate) fn config_with(worker_section: &str, jobs: &str) -> String {
    format!(
        "lock:\n  ttl: 2s\n  renew_every: 500ms\n  node_timeout: 100ms\n  retry_delay: 50ms\n\
         worker:\n{worker_section}jobs:\n{jobs}"
    )
}

/// One worker `id` running `jobs` on the embedded store in `dir` (its `jobs.yaml`), started: its
/// `worker.started` logged; and the config's path, for the commands.
pub(crate) fn start_worker(dir: &TestDir, id: &str, jobs: &str) -> (Worker, PathBuf) {
    let path = dir.write_config(&config(id, jobs));
    let worker = Worker::spawn(path.clone(), &[]);
    worker
        .wait_for_event("worker.started", Duration::from_secs(10))
        .expect("worker started");
    (worker, path)
}

/// Stops `worker` with SIGTERM and asserts a graceful exit (its leases released).
fn stop(worker: &mut Worker) {
    worker.signal(libc::SIGTERM);
    let status = worker
        .wait_timeout(Duration::from_secs(15))
        .expect("the worker stops after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", worker.stderr());
}

/// Waits until `worker` has logged `count` `run.finished` events.
fn wait_for_runs(worker: &Worker, count: usize, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while worker.events("run.finished").len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than {count} runs finished: {:?}",
            worker.events("run.finished")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts a worker on `config` (written as `after.yaml` in `dir`) with its wall clock 10 s behind, and
/// waits for its first `tick.lost: already_claimed` — a tick an earlier process ran.
fn restart_behind(dir: &TestDir, config: String) -> (Worker, Value) {
    let after = Worker::builder(dir.write("after.yaml", config))
        .faketime("-10s")
        .spawn();
    let lost = after
        .wait_for(Duration::from_secs(15), |e| {
            e["event"] == "tick.lost" && e["reason"] == "already_claimed"
        })
        .expect("the restarted worker meets the ticks it ran before as claimed");
    (after, lost)
}

/// Asserts that every (job, tick) of the ledger ran once and that each job's tokens rise with its ticks;
/// returns each run as (job, tick, token, worker), in tick order.
fn runs_once_with_rising_tokens(dir: &TestDir) -> Vec<(String, DateTime<Utc>, u64, String)> {
    let mut runs = Vec::new();
    for ((job, tick), entries) in ledger(dir) {
        assert_eq!(
            entries.len(),
            1,
            "{job} {tick} ran {} times: {entries:?}",
            entries.len()
        );
        let (token, worker) = entries[0].clone();
        runs.push((job, tick_time(&tick), token, worker));
    }
    runs.sort_by_key(|(job, tick, _, _)| (job.clone(), *tick));
    for pair in runs.windows(2) {
        let [(job, tick, token, _), (next_job, next_tick, next_token, _)] = pair else {
            continue;
        };
        assert!(
            job != next_job || next_token > token,
            "{job}: token {next_token} at {next_tick} after {token} at {tick}"
        );
    }
    runs
}

/// A worker restarted with a default id (`<host>-<pid>-<nonce>`, new with each process) tells the ticks
/// its earlier process claimed from ticks taken by another host: `tick.lost` names the earlier id, with
/// `by_this_host`.
#[test]
fn a_restart_with_a_default_id_knows_its_earlier_claims_as_this_hosts() {
    let dir = TestDir::new();
    let job = ledger_job("again", "* * * * * *", &dir.ledger());
    let worker_section = "  shutdown_grace: 10s\n";
    let mut before = Worker::spawn(
        dir.write("before.yaml", config_with(worker_section, &job)),
        &[],
    );
    wait_for_runs(&before, 2, Duration::from_secs(20));
    stop(&mut before);
    let earlier = runs_once_with_rising_tokens(&dir)[0].3.clone();

    let (mut after, lost) = restart_behind(&dir, config_with(worker_section, &job));
    stop(&mut after);
    assert_eq!(lost["by"], earlier.as_str(), "{lost}");
    assert_eq!(lost["by_this_host"], true, "{lost}");
    let message = lost["message"].as_str().unwrap_or_default();
    assert!(message.contains("another process of this host"), "{lost}");
}

/// A worker restarted with its wall clock 10 s behind (libfaketime) finds the ticks it already ran
/// claimed in the database and runs none of them again; once its clock passes them it runs new ticks,
/// with tokens above every earlier one. The history of both processes' runs outlives them.
#[test]
fn a_restart_with_the_clock_stepped_back_runs_no_tick_twice() {
    let dir = TestDir::new();
    let job = ledger_job("stepped", "* * * * * *", &dir.ledger());
    let mut before = Worker::spawn(dir.write("before.yaml", config("before", &job)), &[]);
    wait_for_runs(&before, 3, Duration::from_secs(20));
    stop(&mut before);
    let first = runs_once_with_rising_tokens(&dir);
    let (last_tick, last_token) = first
        .iter()
        .map(|(_, tick, token, _)| (*tick, *token))
        .max()
        .expect("runs before the restart");

    let (mut after, lost) = restart_behind(&dir, config("after", &job));
    assert_eq!(lost["by"], "before", "{lost}");
    // Another configured id is another worker, wherever it runs.
    assert_eq!(lost["by_this_host"], false, "{lost}");
    // 10 s until its clock is back where it was, with margins for a loaded machine.
    wait_for_runs(&after, 2, Duration::from_secs(40));
    stop(&mut after);

    let runs = runs_once_with_rising_tokens(&dir);
    let later: Vec<_> = runs.iter().filter(|run| run.3 == "after").collect();
    assert!(later.len() >= 2, "{runs:?}");
    for (_, tick, token, _) in later {
        assert!(*tick > last_tick && *token > last_token, "{runs:?}");
    }
    // Both processes' history is in the file, read by a third: every run, by its worker, with its token.
    let history = read_history(&dir.join("after.yaml"), "stepped");
    for (_, tick, token, worker) in &runs {
        let found = history.iter().any(|entry| {
            entry.kind == Kind::Run
                && entry.tick == tick.timestamp_millis()
                && entry.token == Some(*token)
                && &entry.worker == worker
        });
        assert!(found, "no run entry for {tick} by {worker}: {history:?}");
    }
}

/// The history of `job` as a store opened on `config` reads it.
fn read_history(config: &std::path::Path, job: &str) -> Vec<Entry> {
    let config = redcron::config::load(config).expect("a valid config");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let store = Store::open(&config).expect("the store opens");
        let query = Query {
            job: job.into(),
            since: None,
            until: None,
            limit: 1_000,
        };
        store.history(&query).await.expect("history read").value
    })
}

/// Two worker processes with the same jobs on one database file race every tick: for ~8 s of two jobs
/// every second (one `overlap: skip`, one `overlap: allow`), each tick runs exactly once, tokens rise, and
/// both workers took part in every race.
#[test]
fn two_workers_on_one_file_run_each_tick_once() {
    let dir = TestDir::new();
    let jobs = ledger_job("skip", "* * * * * *", &dir.ledger())
        + &ledger_job("allow", "* * * * * *", &dir.ledger())
        + "    overlap: allow\n";
    let mut workers: Vec<Worker> = ["a", "b"]
        .into_iter()
        .map(|id| Worker::spawn(dir.write(format!("{id}.yaml"), config(id, &jobs)), &[]))
        .collect();
    for worker in &workers {
        worker
            .wait_for_event("worker.started", Duration::from_secs(10))
            .unwrap_or_else(|| panic!("worker started: {}", worker.stderr()));
    }
    let window_start = Utc::now() + chrono::Duration::seconds(1);
    std::thread::sleep(Duration::from_secs(9));
    let window_end = Utc::now() - chrono::Duration::seconds(2);
    for worker in &mut workers {
        stop(worker);
    }

    let runs = runs_once_with_rising_tokens(&dir);
    // Every tick of the window ran, but for one that every worker skipped on purpose (`overlap: skip`, on
    // a loaded machine): because it still ran (or raced for) the job's previous tick, or because it woke
    // late, with the next tick already due (`superseded`) — a miss the store has no part in.
    let overlapped = |job: &str, tick: DateTime<Utc>| {
        workers.iter().all(|worker| {
            worker.events("tick.skipped").iter().any(|e| {
                e["job"] == job
                    && (e["reason"] == "overlap" || e["reason"] == "superseded")
                    && e["tick"].as_str().map(tick_time) == Some(tick)
            })
        })
    };
    let ticks: Vec<DateTime<Utc>> = (window_start.timestamp() + 1..=window_end.timestamp())
        .filter_map(|second| DateTime::from_timestamp(second, 0))
        .collect();
    for job in ["skip", "allow"] {
        for tick in &ticks {
            let ran = runs
                .iter()
                .any(|(name, at, _, _)| name == job && at == tick);
            assert!(
                ran || (job == "skip" && overlapped(job, *tick)),
                "{job} {tick} did not run: {runs:?}"
            );
        }
    }
    for worker in &workers {
        let raced = |e: &Value| e["event"] == "tick.won" || e["event"] == "tick.lost";
        let count = worker.logs().iter().filter(|e| raced(e)).count();
        assert!(count >= ticks.len(), "a worker raced only {count} ticks");
    }
}

/// Two workers share `redcron.db`, a job every second; the database's three files are deleted and a
/// third worker starts 4 s later on the same path (a new file): no tick runs twice (the job's own ledger),
/// the first two log at ERROR that the file was deleted or replaced (`file_replaced`), claim nothing
/// more, and answer `/readyz` with 503, naming the file and saying to restart the workers.
#[test]
fn a_database_file_deleted_under_running_workers_runs_no_tick_twice() {
    let dir = TestDir::new();
    let jobs = ledger_job("every", "* * * * * *", &dir.ledger());
    let port = crate::support::free_port();
    let first = dir.write(
        "a.yaml",
        config_with(&format!("  id: a\n  listen: 127.0.0.1:{port}\n"), &jobs),
    );
    let mut workers = vec![Worker::spawn(first, &[])];
    workers.push(Worker::spawn(dir.write("b.yaml", config("b", &jobs)), &[]));
    for worker in &workers {
        worker
            .wait_for_event("worker.started", Duration::from_secs(10))
            .unwrap_or_else(|| panic!("worker started: {}", worker.stderr()));
    }
    wait_for_runs(&workers[0], 1, Duration::from_secs(20));
    for name in ["redcron.db", "redcron.db-wal", "redcron.db-shm"] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    std::thread::sleep(Duration::from_secs(4));
    workers.push(Worker::spawn(dir.write("c.yaml", config("c", &jobs)), &[]));
    workers[2]
        .wait_for_event("worker.started", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("worker started: {}", workers[2].stderr()));
    wait_for_runs(&workers[2], 4, Duration::from_secs(20));
    let ready = crate::metrics::get(port, "/readyz").expect("/readyz answers");
    for worker in &mut workers {
        stop(worker);
    }

    runs_once(&dir);
    for worker in &workers[..2] {
        let faults: Vec<Value> = worker
            .logs()
            .into_iter()
            .filter(|e| e["reason"] == "file_replaced" && e["level"] == "ERROR")
            .collect();
        let error = faults
            .first()
            .and_then(|e| e["error"].as_str())
            .unwrap_or_else(|| panic!("no ERROR with reason file_replaced: {:?}", worker.lines()));
        assert!(
            error.contains("redcron.db")
                && (error.contains("deleted") || error.contains("replaced"))
                && error.contains("restart"),
            "{error}"
        );
    }
    assert!(
        workers[2]
            .logs()
            .iter()
            .all(|e| e["reason"] != "file_replaced"),
        "the worker on the new file saw a fault: {:?}",
        workers[2].lines()
    );
    let (status, _, body) = ready;
    assert_eq!(status, 503, "{body}");
    // By now the third worker has made a new file at the path.
    assert!(
        body.contains("replaced") && body.contains("restart"),
        "{body}"
    );
}

/// Asserts that every (job, tick) of the ledger ran once.
fn runs_once(dir: &TestDir) {
    for ((job, tick), entries) in ledger(dir) {
        assert_eq!(
            entries.len(),
            1,
            "{job} {tick} ran {} times: {entries:?}",
            entries.len()
        );
    }
}

/// History and membership written through the store outlive it: a store opened again on the same file
/// (a restarted worker, or the command line reading) reads back the entries and the members.
#[tokio::test]
async fn history_survives_a_restart() {
    let dir = TestDir::new();
    let path = dir.write_config(&config(
        "h",
        &ledger_job("nightly", "@daily", &dir.ledger()),
    ));
    let config = redcron::config::load(&path).expect("a valid config");
    let store = Store::open(&config).expect("the store opens");
    assert_eq!(
        store.describe(),
        format!("embedded:{}", dir.join("redcron.db").display())
    );
    let mut run = Entry::new("nightly", Tick(2_000), "h", Kind::Run, Utc::now());
    run.token = Some(2_000_000);
    let lost = Entry::new("nightly", Tick(2_000), "other", Kind::Lost, Utc::now());
    let older = Entry::new("nightly", Tick(1_000), "h", Kind::Run, Utc::now());
    store
        .record(&[older.clone(), run.clone(), lost.clone()])
        .await
        .expect("recorded");
    let member: Member =
        serde_json::from_str(r#"{"id":"h","started_at":"2026-11-23T10:00:00Z"}"#).expect("member");
    store.announce(&member).await.expect("announced");
    drop(store);

    let store = Store::open(&config).expect("the store opens again");
    let query = Query {
        job: "nightly".into(),
        since: None,
        until: None,
        limit: 10,
    };
    let read = store.history(&query).await.expect("history read");
    assert_eq!(read.value, vec![run, lost, older]);
    assert!(
        read.missing.is_empty() && read.skipped.is_empty(),
        "{read:?}"
    );
    let members = store.members().await.expect("members read").value;
    assert_eq!(members.len(), 1, "{members:?}");
    assert!(
        members[0].alive && members[0].seen_at.is_some(),
        "{members:?}"
    );
}

/// A database file that is not one stops the worker at start: exit 1, and the error names the file.
#[test]
fn a_worker_on_a_file_that_is_no_database_fails_naming_it() {
    let dir = TestDir::new();
    let database = dir.write("redcron.db", vec![b'x'; 8192]);
    let path = dir.write_config(&config(
        "broken",
        &ledger_job("j", "* * * * * *", &dir.ledger()),
    ));
    let mut worker = Worker::spawn(path, &[]);
    let status = worker
        .wait_timeout(Duration::from_secs(10))
        .expect("the worker exits");
    assert_eq!(status.code(), Some(1), "{}", worker.stderr());
    let failed = worker
        .wait_for_event("worker.failed", Duration::from_secs(5))
        .expect("worker.failed logged");
    let error = failed["error"].as_str().unwrap_or_default();
    let named = format!("embedded store {}: ", database.display());
    assert!(error.contains(&named), "{failed}");
    assert!(dir.ledger_lines().is_empty());
}

/// Two workers started at the same instant on a new database file both start: the one that finds the
/// other switching the file to its write-ahead log waits for it (SQLite answers "database is locked" at
/// once there, without its busy timeout; one start in ten failed so).
#[test]
fn workers_started_together_on_a_new_file_both_start() {
    for _ in 0..10 {
        let dir = TestDir::new();
        let job = "  - name: x\n    schedule: \"0 0 1 1 *\"\n    command: 'true'\n";
        let workers: Vec<Worker> = ["a", "b"]
            .into_iter()
            .map(|id| Worker::spawn(dir.write(format!("{id}.yaml"), config(id, job)), &[]))
            .collect();
        for worker in &workers {
            worker
                .wait_for_event("worker.started", Duration::from_secs(20))
                .unwrap_or_else(|| panic!("worker did not start: {}", worker.stderr()));
        }
    }
}

/// Whether process `pid` holds the write lock of the database whose WAL index is `shm`: SQLite takes it
/// (a POSIX lock on byte 120 of the `-shm` file) at `BEGIN IMMEDIATE` and keeps it until the commit, so a
/// process stopped while it holds it was stopped inside a write transaction.
fn holds_write_lock(pid: u32, shm: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(inode) = std::fs::metadata(shm).map(|m| m.ino()) else {
        return false;
    };
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // `<n>: POSIX ADVISORY WRITE <pid> <maj:min:inode> <start> <end>`
        matches!(
            fields[..],
            [_, "POSIX", _, "WRITE", p, file, "120", "120"]
                if p == pid.to_string() && file.rsplit(':').next() == Some(&inode.to_string())
        )
    })
}

/// A worker SIGSTOPped inside a write transaction — stopped at random moments just after the second's
/// claims until stops found it holding the database's write lock for each hold (0.5, 3 and 6 s: inside
/// and past the 2 s busy timeout and the 2 s lease) and the second worker has timed out on the lock at
/// least once — beside a second worker on the same file, four jobs every second: no
/// tick runs twice and tokens rise; the second worker's transactions time out instead of waiting for good
/// (`tick.retrying` or `tick.skipped`, "database is locked") and it runs ticks again once the first
/// resumes; every tick ran or is in the history as skipped or missed; the file passes SQLite's integrity
/// check.
#[test]
fn a_worker_stopped_inside_a_transaction_blocks_nothing_for_good() {
    let dir = TestDir::new();
    let jobs: String = (0..4)
        .map(|i| ledger_job(&format!("j{i}"), "* * * * * *", &dir.ledger()))
        .collect();
    // The history keeps every tick of the test (four minutes at most), for the check that none was lost.
    let yaml = |id: &str| format!("history:\n  keep_ticks: 1000\n{}", config(id, &jobs));
    let mut workers: Vec<Worker> = ["a", "b"]
        .into_iter()
        .map(|id| Worker::spawn(dir.write(format!("{id}.yaml"), yaml(id)), &[]))
        .collect();
    for worker in &workers {
        worker
            .wait_for_event("worker.started", Duration::from_secs(20))
            .unwrap_or_else(|| panic!("worker started: {}", worker.stderr()));
    }
    let window_start = Utc::now() + chrono::Duration::seconds(2);
    let shm = dir.join("redcron.db-shm");
    let holds = [500, 3_000, 6_000];
    // b's claims that waited out the busy timeout: retried, or skipped once the next tick came.
    let locked = |b: &Worker| {
        b.logs()
            .iter()
            .filter(|e| e["event"] == "tick.retrying" || e["event"] == "tick.skipped")
            .filter(|e| {
                e["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("database is locked"))
            })
            .count()
    };
    let (mut stops, mut inside, mut resumed_at) = (0, 0, Utc::now());
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    // Until every hold was caught inside a transaction once and b met the lock past its busy timeout
    // (the event the test is about, not a count of stops that usually brings it: 4 stops once did not).
    while inside < holds.len() || locked(&workers[1]) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {inside} of {stops} stops were inside a transaction, b timed out on the lock {} times",
            locked(&workers[1])
        );
        // Just after a second's claims begin, at a few random offsets: a claim, a release or a history
        // write is under way then. A stop that finds no transaction is continued at once.
        let second = Utc::now().timestamp() + 1;
        let mut offsets: Vec<i64> = (0..4).map(|_| rand::random_range(0..80)).collect();
        offsets.sort_unstable();
        for offset in offsets {
            let at = second * 1_000 + offset;
            let wait = at - Utc::now().timestamp_millis();
            std::thread::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0)));
            workers[0].stop();
            stops += 1;
            let held = holds_write_lock(workers[0].pid(), &shm);
            if held {
                std::thread::sleep(Duration::from_millis(holds[inside % holds.len()]));
                inside += 1;
            }
            workers[0].cont();
            resumed_at = Utc::now();
            if held {
                break;
            }
        }
        // Between stops the first worker gets a moment to go on as usual.
        std::thread::sleep(Duration::from_millis(rand::random_range(300..1_000)));
    }
    // Both run again after the last resume: a tick of every job after it ran.
    let ran_after = |job: &str| {
        ledger(&dir).keys().any(|(name, tick)| {
            name == job && tick_time(tick) > resumed_at + chrono::Duration::seconds(1)
        })
    };
    crate::inspect::workers::wait_for(
        "runs after the last resume",
        Duration::from_secs(30),
        || (0..4).all(|i| ran_after(&format!("j{i}"))).then_some(()),
    );
    let window_end = resumed_at;
    // Every tick of the window ran (the ledger) or is in the history: skipped or missed, or a run that
    // ended without writing its line — its lease lost before the job could (a claim won just before the
    // other worker's lock wait ended, the job stopped at once: `lease_lost`).
    let told =
        |runs: &[(String, DateTime<Utc>)], history: &[Entry], job: &str, tick: DateTime<Utc>| {
            runs.iter().any(|(name, at)| name == job && *at == tick)
                || history.iter().any(|e| {
                    e.job == job
                        && e.tick == tick.timestamp_millis()
                        && (matches!(e.kind, Kind::Skipped | Kind::Missed)
                            || e.kind == Kind::Run
                                && e.outcome.as_deref().is_some_and(|o| o != "success"))
                })
        };
    let window: Vec<(String, DateTime<Utc>)> = (window_start.timestamp()..=window_end.timestamp())
        .flat_map(|second| {
            let tick = DateTime::from_timestamp(second, 0).expect("a second");
            (0..4).map(move |i| (format!("j{i}"), tick))
        })
        .collect();
    // Until a tick nobody ran is reported missed (its window, max_clock_offset, 2 s, then the next
    // check): waited for, at most 30 s; whatever is still untold then fails the check below.
    let wait_told = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < wait_told {
        let ran: Vec<(String, DateTime<Utc>)> = (ledger(&dir).keys())
            .map(|(name, tick)| (name.clone(), tick_time(tick)))
            .collect();
        let history: Vec<Entry> = (0..4)
            .flat_map(|i| read_history(&dir.join("b.yaml"), &format!("j{i}")))
            .collect();
        if window
            .iter()
            .all(|(job, tick)| told(&ran, &history, job, *tick))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let locked = locked(&workers[1]);
    for worker in &mut workers {
        stop(worker);
    }

    let runs = runs_once_with_rising_tokens(&dir);
    let history: Vec<Entry> = (0..4)
        .flat_map(|i| read_history(&dir.join("b.yaml"), &format!("j{i}")))
        .collect();
    let ran: Vec<(String, DateTime<Utc>)> = (runs.iter())
        .map(|(name, at, _, _)| (name.clone(), *at))
        .collect();
    let mut reported = 0;
    for (job, tick) in &window {
        if ran.iter().any(|(name, at)| name == job && at == tick) {
            continue;
        }
        let of_tick: Vec<&Entry> = (history.iter())
            .filter(|e| e.job == *job && e.tick == tick.timestamp_millis())
            .collect();
        assert!(
            told(&[], &history, job, *tick),
            "{job} {tick} neither ran nor was reported: {of_tick:?}"
        );
        reported += 1;
    }
    assert!(locked > 0, "b never timed out on the lock");
    let database = rusqlite::Connection::open(dir.join("redcron.db")).expect("the file opens");
    let check: String = database
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity_check runs");
    assert_eq!(check, "ok");
    eprintln!(
        "SQLite worker stopped {stops} times, {inside} inside a write transaction: {} runs, each tick once, \
         {reported} ticks skipped or missed (reported), b timed out on the lock {locked} times, integrity ok",
        runs.len()
    );
}

/// A store on the database file `redcron.db` in `dir`, with leases of a minute.
fn open(dir: &TestDir) -> Store {
    let settings = LockSettings {
        ttl: Duration::from_secs(60),
        ..LockSettings::default()
    };
    let path = dir.join("state/redcron.db");
    let store = EmbeddedStore::open(&path, settings, HistorySettings::default());
    Store::Embedded(store.expect("the store opens"))
}

/// A reopened store (a restarted worker) keeps the claims and the fence: an earlier tick stays claimed,
/// the lease of the previous process still holds the job, and tokens go on rising.
#[tokio::test]
async fn claims_fences_and_leases_survive_a_reopen() {
    let dir = TestDir::new();
    let first = won(open(&dir).claim(&request("a", "job", 5_000)).await);
    let store = open(&dir);
    let early = store.claim(&request("b", "job", 4_000)).await;
    assert!(
        matches!(early, ClaimOutcome::AlreadyClaimed { .. }),
        "{early:?}"
    );
    let busy = store.claim(&request("b", "job", 6_000)).await;
    assert!(matches!(busy, ClaimOutcome::Busy { .. }), "{busy:?}");
    store.release(&first).await;
    let next = won(store.claim(&request("b", "job", 6_000)).await);
    assert!(next.token > first.token);
}

/// A lease stored in another boot of the host has expired, whatever its time on the boot clock says.
#[tokio::test]
async fn a_lease_of_another_boot_has_expired() {
    let dir = TestDir::new();
    let store = open(&dir);
    won(store.claim(&request("a", "job", 1_000)).await);
    let file = rusqlite::Connection::open(dir.join("state/redcron.db")).expect("open");
    file.execute("UPDATE leases SET boot_id = 'an-earlier-boot'", [])
        .expect("update");
    won(store.claim(&request("b", "job", 2_000)).await);
}

/// A file that is not a database, or a directory that cannot be made, fails with the path named.
#[test]
fn an_unusable_file_is_an_error_that_names_it() {
    let dir = TestDir::new();
    let garbage = dir.write("garbage.db", vec![b'x'; 8192]);
    let under_a_file = garbage.join("redcron.db");
    for path in [garbage, under_a_file] {
        let opened = EmbeddedStore::open(&path, LockSettings::default(), Default::default());
        match opened {
            Err(error @ StoreError::Embedded { .. }) => {
                assert!(
                    error.to_string().contains(&path.display().to_string()),
                    "{error}"
                );
            }
            Err(other) => panic!("{path:?}: unexpected error {other}"),
            Ok(_) => panic!("{path:?} opened"),
        }
    }
}
