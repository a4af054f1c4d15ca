//! Cluster time end to end: workers whose clocks are seconds off (libfaketime) schedule ticks on the
//! Redis nodes' time, say what offset they measured, and warn or fall back when they should.
//!
//! The nodes run on this machine, so the nodes' clock is the test's clock: a worker faked 5 s ahead must
//! measure an offset of about −5 s, and its jobs (run without the fake clock) must see the true time.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::support::{RedisCluster, TestDir, Worker};
use crate::worker::{config, ledger, ledger_job, tick_time};

/// How far a measured offset may be from the faked one: the machine is loaded, the nodes are local.
const TOLERANCE_MS: i64 = 1_000;

/// How early (true time) a run may start before its tick: the offset's error plus the log's rounding;
/// without cluster time a worker 5 s ahead starts its runs 5 s early.
const EARLY_MS: i64 = 250;

/// `offset_ms` of a `clock.offset` or `clock.offset_high` event.
fn offset_ms(event: &Value) -> i64 {
    event["offset_ms"]
        .as_i64()
        .unwrap_or_else(|| panic!("no offset_ms in {event}"))
}

/// Asserts that `worker` measured an offset of `expected_ms` (the nodes' clock minus its own).
fn assert_offset(worker: &Worker, expected_ms: i64) {
    let event = worker
        .wait_for_event("clock.offset", Duration::from_secs(15))
        .expect("clock.offset logged");
    assert!(
        (offset_ms(&event) - expected_ms).abs() <= TOLERANCE_MS,
        "expected an offset of {expected_ms} ms: {event}"
    );
    assert_eq!(event["sampled"], 3, "{event}");
    assert_eq!(event["configured"], 3, "{event}");
}

/// A job every second that writes the ledger and, to `starts`, `<worker> <tick> <true time in ns>` as
/// it starts: the job runs without the worker's fake clock, so `date` tells the true time.
fn timed_job(dir: &TestDir) -> String {
    let starts = dir.join("starts");
    ledger_job("skew", "* * * * * *", &dir.ledger()).replace(
        "    command: '",
        &format!(
            "    env: {{LD_PRELOAD: \"\"}}\n    command: 'echo \"$REDCRON_WORKER_ID $REDCRON_TICK \
             $(date +%s%N)\" >> {}; ",
            starts.display()
        ),
    )
}

/// Workers 5 s ahead, 5 s behind and on time share one job every second: each measures its offset,
/// every tick while they race runs exactly once — also the ticks around the moment the worker ahead
/// joins, which it would otherwise claim 5 s early and so make 5 earlier ticks unclaimable — and no run
/// starts before its tick in true time, the worker ahead's included.
#[test]
fn workers_seconds_off_run_every_tick_once_and_on_time() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let job = timed_job(&dir);
    let spawn = |id: &str, fake: Option<&str>| {
        let path = dir.write(
            format!("{id}.yaml"),
            config(&cluster, &format!("  id: {id}\n"), &job),
        );
        let builder = Worker::builder(path);
        match fake {
            Some(spec) => builder.faketime(spec).spawn(),
            None => builder.spawn(),
        }
    };
    let behind = spawn("behind", Some("-5s"));
    let plain = spawn("plain", None);
    assert_offset(&behind, 5_000);
    assert_offset(&plain, 0);
    // Either may win every tick (the first to reach a majority does), so wait for the ledger.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while dir.ledger_lines().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the job never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    let window_start = chrono::Utc::now();
    let ahead = spawn("ahead", Some("+5s"));
    assert_offset(&ahead, -5_000);
    std::thread::sleep(Duration::from_secs(9));
    let window_end = chrono::Utc::now() - chrono::Duration::seconds(3);
    // The worker ahead's runs are the ones to check for starting early: it needs three (it runs every
    // tick once it is alone).
    drop(behind);
    drop(plain);
    runs_of_three_ticks(&ahead, "the worker ahead runs the job alone");
    drop(ahead);

    let runs = ledger(&dir);
    for ((_, tick), entries) in &runs {
        assert_eq!(
            entries.len(),
            1,
            "{tick} ran {} times: {entries:?}",
            entries.len()
        );
    }
    let in_window: Vec<_> = runs
        .keys()
        .map(|(_, tick)| tick_time(tick))
        .filter(|at| *at >= window_start && *at <= window_end)
        .collect();
    let expected = (window_end - window_start).num_seconds();
    assert!(
        in_window.len() as i64 >= expected,
        "{} ticks run in a window of {expected} s: {runs:?}",
        in_window.len()
    );
    none_started_early(&dir);
}

/// Waits for `worker` to finish runs of three different ticks.
fn runs_of_three_ticks(worker: &Worker, why: &str) {
    let mut ticks = Vec::new();
    while ticks.len() < 3 {
        let finished = worker
            .wait_for(Duration::from_secs(15), |e| {
                e["event"] == "run.finished" && !ticks.contains(&e["tick"])
            })
            .expect(why);
        ticks.push(finished["tick"].clone());
    }
}

/// Asserts that no run in the `starts` file started more than [`EARLY_MS`] before its tick, in true time.
fn none_started_early(dir: &TestDir) {
    for (worker, tick, started_ns) in started(dir) {
        let tick_ns = tick_time(&tick)
            .timestamp_nanos_opt()
            .expect("a tick within the nanosecond range");
        assert!(
            started_ns >= tick_ns - EARLY_MS * 1_000_000,
            "{worker} started the run of {tick} {} ms early",
            (tick_ns - started_ns) / 1_000_000
        );
    }
}

/// The `starts` file: `(worker, tick, true time in ns)` per run.
fn started(dir: &TestDir) -> Vec<(String, String, i64)> {
    let text = dir.read("starts").unwrap_or_default();
    text.lines()
        .map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [worker, tick, ns] => (
                    worker.to_string(),
                    tick.to_string(),
                    ns.parse()
                        .unwrap_or_else(|_| panic!("bad time in {line:?}")),
                ),
                _ => panic!("bad starts line {line:?}"),
            },
        )
        .collect()
}

/// A worker 5 s ahead that starts while every node is down says once that it cannot measure its offset,
/// and schedules no tick on its own clock; once a majority is back it measures the offset and runs the
/// job — never before a tick in true time. On its own clock
/// it would claim each tick 5 s early between the nodes' return and its next measurement (the MariaDB
/// chaos run of seed 1795768255916112088: a worker restarted during an outage, 3 s ahead).
#[test]
fn a_worker_that_cannot_measure_claims_no_tick_until_it_can() {
    let mut cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let path = dir.write_config(&config(&cluster, "  id: unmeasured\n", &timed_job(&dir)));
    for node in 0..3 {
        cluster.kill(node);
    }
    let worker = Worker::builder(path).faketime("+5s").spawn();
    let unmeasured = worker
        .wait_for_event("clock.unmeasured", Duration::from_secs(10))
        .expect("clock.unmeasured logged");
    assert_eq!(unmeasured["level"], "WARN", "{unmeasured}");
    assert_eq!(unmeasured["fallback"], "local_clock", "{unmeasured}");
    let error = unmeasured["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&cluster.url(0)),
        "the error names the nodes: {error}"
    );
    // Three ticks' time: none is raced.
    std::thread::sleep(Duration::from_secs(3));
    let raced: Vec<Value> = ["tick.skipped", "tick.retrying", "tick.won", "tick.lost"]
        .iter()
        .flat_map(|name| worker.events(name))
        .collect();
    assert!(
        raced.is_empty(),
        "no tick is raced before the clock is measured: {raced:?}"
    );
    for node in 0..2 {
        cluster.restart(node);
    }
    worker
        .wait_for_event("clock.recovered", Duration::from_secs(15))
        .expect("clock.recovered logged");
    let offset = worker
        .wait_for_event("clock.offset", Duration::from_secs(5))
        .expect("clock.offset logged once measured");
    assert!(
        (offset_ms(&offset) + 5_000).abs() <= TOLERANCE_MS,
        "{offset}"
    );
    assert_eq!(offset["sampled"], 2, "{offset}");
    runs_of_three_ticks(&worker, "runs resume with 2 of 3 nodes");
    assert_eq!(
        worker.events("clock.unmeasured").len(),
        1,
        "one warning for the whole stretch"
    );
    drop(worker);
    let starts = started(&dir);
    assert!(starts.len() >= 3, "{starts:?}");
    none_started_early(&dir);
}

/// A clock 2 s ahead with `max_clock_offset: 1s` is warned about; a clock on time is not.
#[test]
fn an_offset_above_the_maximum_is_warned_about() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let worker_section = |id: &str| format!("  id: {id}\n  max_clock_offset: 1s\n");
    let job = ledger_job("w", "*/30 * * * * *", &dir.ledger());
    let ahead = Worker::builder(dir.write("a.yaml", config(&cluster, &worker_section("a"), &job)))
        .faketime("+2s")
        .spawn();
    let plain = Worker::spawn(
        dir.write("p.yaml", config(&cluster, &worker_section("p"), &job)),
        &[],
    );
    let high = ahead
        .wait_for_event("clock.offset_high", Duration::from_secs(15))
        .expect("clock.offset_high logged");
    assert_eq!(high["level"], "WARN", "{high}");
    assert!((offset_ms(&high) + 2_000).abs() <= TOLERANCE_MS, "{high}");
    assert_eq!(high["max_offset_ms"], 1_000, "{high}");
    assert_offset(&plain, 0);
    let counts: BTreeMap<&str, usize> = ["clock.offset_high", "clock.unmeasured"]
        .into_iter()
        .map(|name| (name, plain.events(name).len()))
        .collect();
    assert!(counts.values().all(|n| *n == 0), "{counts:?}");
}

/// A worker whose wall clock is 3 s behind keeps the lease of a job that runs for several TTLs: its lease
/// watchdog sleeps on the boot clock, which a skewed wall clock must not move (libfaketime shifts absolute
/// timers by the skew: with them, every renewal came 3 s late and the lease of a 2 s TTL was lost).
#[test]
fn a_worker_whose_clock_is_behind_renews_its_lease_on_time() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let job = "  - name: slow\n    schedule: \"*/30 * * * * *\"\n    misfire_grace: 30s\n    command: 'sleep 5'\n";
    let worker = Worker::builder(dir.write_config(&config(&cluster, "  id: behind\n", job)))
        .faketime("-3s")
        .spawn();
    let finished = worker
        .wait_for_event("run.finished", Duration::from_secs(30))
        .expect("the run finished");
    assert_eq!(finished["outcome"], "success", "{finished}");
    let logs = worker.logs();
    let lease_trouble: Vec<&Value> = logs
        .iter()
        .filter(|e| e["event"] == "lease.lost" || e["event"] == "lease.expiring")
        .collect();
    assert!(lease_trouble.is_empty(), "{lease_trouble:?}");
}

/// A step of a worker's wall clock between two measurements of its offset moves no tick: cluster time
/// goes on from the last measurement on the boot clock. Stepped 3 s ahead and, 6 s later, 3 s behind
/// (libfaketime's file, re-read every second) while it measures only once a minute, the worker still
/// starts every tick's run once, within a second after the tick in true time — never early, none
/// passed over. (The Redis chaos run of seed 4242: a worker stepped ahead raced the next ticks early and
/// passed over those in between.)
#[test]
fn a_step_of_the_wall_clock_moves_no_tick() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let clock_file = dir.write("clock", "+0\n");
    let path = dir.write(
        "stepped.yaml",
        config(
            &cluster,
            "  id: stepped\n  clock_check_every: 60s\n",
            &timed_job(&dir),
        ),
    );
    let library = crate::support::libfaketime()
        .expect("libfaketime.so.1 (package faketime) is needed to step the clock");
    let worker = Worker::builder(path)
        .env("LD_PRELOAD", &library.display().to_string())
        .env("FAKETIME_TIMESTAMP_FILE", &clock_file.display().to_string())
        .env("FAKETIME_CACHE_DURATION", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .spawn();
    assert_offset(&worker, 0);
    worker
        .wait_for_event("run.finished", Duration::from_secs(15))
        .expect("the job runs");
    let from = chrono::Utc::now() + chrono::Duration::seconds(1);
    std::fs::write(&clock_file, "+3\n").expect("step the clock ahead");
    std::thread::sleep(Duration::from_secs(6));
    std::fs::write(&clock_file, "-3\n").expect("step the clock behind");
    std::thread::sleep(Duration::from_secs(6));
    let to = chrono::Utc::now() - chrono::Duration::seconds(2);
    let runs = started(&dir);
    let mut tick = from.timestamp() * 1_000 + 1_000;
    while tick <= to.timestamp_millis() {
        let tick_text = chrono::DateTime::from_timestamp_millis(tick)
            .expect("a tick of today")
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let of_tick: Vec<i64> = (runs.iter())
            .filter(|(_, t, _)| tick_time(t).timestamp_millis() == tick)
            .map(|(_, _, ns)| *ns)
            .collect();
        assert_eq!(
            of_tick.len(),
            1,
            "tick {tick_text} ran {} times",
            of_tick.len()
        );
        let late_ms = (of_tick[0] - tick * 1_000_000) / 1_000_000;
        assert!(
            (-EARLY_MS..1_000).contains(&late_ms),
            "the run of {tick_text} started {late_ms} ms after its tick (true time)"
        );
        tick += 1_000;
    }
    // A tick skipped because this worker still ran the previous one (`overlap`: a loaded machine slow to
    // end the echo) is no tick passed over by the clock; inside the window above it would have failed the
    // once-per-tick check already.
    let passed_over: Vec<_> = worker
        .events("tick.skipped")
        .into_iter()
        .filter(|e| e["reason"] != "overlap")
        .collect();
    assert!(passed_over.is_empty(), "ticks passed over: {passed_over:?}");
}
