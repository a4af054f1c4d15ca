//! Chaos: each (job, tick) runs exactly once, and a stale holder's writes are fenced off, while a seeded
//! random plan pauses, crashes, hangs, slows and skews a real cluster.
//!
//! The cluster is real: 5 `redis-server` lock nodes with `appendonly yes` and `appendfsync always` (as
//! `docs/protocol.md` requires), one of them behind a TCP proxy that adds latency and drops connections;
//! 4 processes of the built `redcron` binary, two with clocks skewed 1–3 s ahead and behind, one whose
//! clock steps during the run; and three jobs firing every second — `quick` (`overlap: skip`), `parallel`
//! (`overlap: allow`) and `long`, which runs 5.5 s against a 2 s lease so that it renews, and is taken
//! over when its holder is paused. Every job writes to a fenced ledger (a separate Redis, see [`ledger`]).
//!
//! The plan ([`plan`]) pauses the long job's holder past its TTL, crashes workers (also while they run a
//! job), kills and hangs at most 2 of the 5 nodes at once, degrades the proxy and steps a clock. The
//! harness ([`harness`]) carries it out and records a timeline; the checker ([`checker`], whose module
//! documentation states every rule) then reads the ledger, the timeline and the workers' JSON logs, prints
//! a table, and fails the test on a duplicate, an unexplained miss, a token out of order or a stale write
//! that was not fenced off.
//!
//! Environment:
//! - `REDCRON_CHAOS_SECS`: length of the fault plan (default 75 s; the test takes ~20 s more).
//! - `REDCRON_CHAOS_SEED`: the plan's seed (default: drawn from the clock; always printed).
//! - `REDCRON_CHAOS_BREAK`: `split-quorum` or `ignore-sigterm` break the cluster on purpose (see
//!   [`harness::Breakage`]); the test must then fail.
//!
//! Run it long: `REDCRON_CHAOS_SECS=600 cargo test --release --test it chaos -- --nocapture`.

mod checker;
mod facts;
mod harness;
mod ledger;
mod misses;
mod plan;
mod probe;
mod proxy;
mod report;
mod selftest;

use std::fmt::Write as _;
use std::time::Instant;

use self::checker::{Input, JobSpec};
use self::harness::{now_ms, Breakage, Cluster, LONG_JOB, LONG_MS, TTL_MS};
use self::plan::{Plan, Timing};

/// Ticks this long after the workers are up are checked (the most-ahead clock, 3 s, races them 3 s
/// early, and its first claims may still be connecting)…
const WINDOW_START_MS: i64 = 6_000;
/// …up to this long before the shutdown (a tick must have had time to be raced by the latest clock).
const WINDOW_END_MS: i64 = 6_000;

/// A seeded fault plan against 5 nodes and 4 workers: no (job, tick) runs twice, every tick in the
/// window runs unless a fault explains why not, tokens increase, stale writes are rejected, and a
/// paused holder's late write is fenced off.
#[test]
fn exactly_once_under_faults() {
    let secs: u64 = env_number("REDCRON_CHAOS_SECS").unwrap_or(75);
    let seed: u64 = env_number("REDCRON_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let breakage = std::env::var("REDCRON_CHAOS_BREAK").ok().map(|text| {
        Breakage::parse(&text).unwrap_or_else(|| {
            panic!("REDCRON_CHAOS_BREAK={text:?}: expected split-quorum or ignore-sigterm")
        })
    });
    let reproduce = format!(
        "REDCRON_CHAOS_SEED={seed} REDCRON_CHAOS_SECS={secs} cargo test --test it chaos -- --nocapture"
    );
    let plan = Plan::generate(
        seed,
        secs,
        Timing {
            ttl_ms: TTL_MS,
            long_ms: LONG_MS,
        },
    );
    println!("chaos: seed {seed}; reproduce with: {reproduce}");
    if let Some(breakage) = breakage {
        println!("chaos: the cluster is broken on purpose ({breakage:?}); this run must fail");
    }
    print!("{plan}");

    let begun = Instant::now();
    let mut cluster = Cluster::start(&plan, breakage);
    let setup = begun.elapsed();
    cluster.execute(&plan);
    let stop_ms = now_ms();
    let shutting = Instant::now();
    cluster.shut_down();
    let shutdown = shutting.elapsed();

    let logs = cluster.logs();
    let attempts = cluster
        .ledger
        .attempts()
        .unwrap_or_else(|e| panic!("unreadable ledger: {e}"));
    let jobs = [
        job("quick", true, false),
        job("parallel", false, false),
        job(LONG_JOB, true, true),
    ];
    let planned_cases: Vec<plan::Case> = plan.episodes.iter().filter_map(|e| e.case).collect();
    let window = (
        cluster.started_ms + WINDOW_START_MS,
        stop_ms - WINDOW_END_MS,
    );
    let checking = Instant::now();
    let mut report = checker::check(&Input {
        jobs: &jobs,
        ttl_ms: TTL_MS as i64,
        window,
        timeline: &cluster.timeline,
        logs: &logs,
        ledger: &attempts,
        planned_cases: &planned_cases,
    });

    report.failures.extend(cluster.slow_exits.iter().cloned());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "chaos: seed {seed}, {secs} s plan; window {} .. {} UTC; faults: {}",
        report::show_time(window.0),
        report::show_time(window.1),
        plan.summary()
    );
    let skipped = cluster
        .timeline
        .entries
        .iter()
        .filter(|(_, h)| matches!(h, plan::Happening::Skipped { .. }))
        .count();
    let stats = cluster.proxy.stats();
    let _ = writeln!(
        out,
        "faults skipped at run time (no target): {skipped}; proxy: {} connections, {} dropped, {} chunks delayed; \
         ledger: {} writes",
        stats.connections.load(std::sync::atomic::Ordering::Relaxed),
        stats.dropped.load(std::sync::atomic::Ordering::Relaxed),
        stats.delayed_chunks.load(std::sync::atomic::Ordering::Relaxed),
        attempts.len()
    );
    let _ = writeln!(
        out,
        "clock offsets seen in the logs: {}",
        cluster.observed_offsets().join("; ")
    );
    let worst = cluster
        .stalls
        .iter()
        .map(|s| s.to - s.from)
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "probe: {} node stalls over 50 ms (longest {worst} ms); the nodes' own latency monitor \
         (latest/max): {}",
        cluster.stalls.len(),
        cluster.node_stalls().join("; ")
    );
    let _ = write!(out, "{report}");
    let _ = writeln!(
        out,
        "timings: setup {:.1} s, plan {secs} s, shutdown {:.1} s, check {:.2} s, total {:.1} s",
        setup.as_secs_f64(),
        shutdown.as_secs_f64(),
        checking.elapsed().as_secs_f64(),
        begun.elapsed().as_secs_f64()
    );
    print!("{out}");
    save(&cluster, &logs, &attempts, &out);
    assert!(
        report.passed(),
        "the chaos run broke redcron's promises (seed {seed}); reproduce with: {reproduce}\n{}",
        cluster.stderr_of_all()
    );
}

fn job(name: &str, skip: bool, long: bool) -> JobSpec {
    JobSpec {
        name: name.to_string(),
        skip,
        period_ms: 1_000,
        long,
    }
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

/// Writes the raw material into the test directory (kept when the test fails): one JSON-lines log per
/// worker process with the arrival time of each line, the timeline, the ledger and the report.
fn save(
    cluster: &Cluster,
    logs: &[facts::InstanceLog],
    attempts: &[ledger::Attempt],
    report: &str,
) {
    for log in logs {
        let text: String = log
            .events
            .iter()
            .map(|(at, event)| format!("{at} {event}\n"))
            .collect();
        cluster
            .dir
            .write(format!("w{}-{}.log", log.worker, log.instance), text);
    }
    let timeline: String = cluster
        .timeline
        .entries
        .iter()
        .map(|(at, h)| format!("{at} {} {h:?}\n", report::show_time(*at)))
        .collect();
    cluster.dir.write("timeline.txt", timeline);
    let ledger: String = attempts.iter().map(|a| format!("{a:?}\n")).collect();
    cluster.dir.write("ledger.txt", ledger);
    cluster.dir.write("report.txt", report);
}
