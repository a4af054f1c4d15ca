//! The redcron performance benchmark: `cargo bench --bench lease` (all items, a few minutes), or
//! `cargo bench --bench lease -- --smoke` (about a second per item, for checking that it runs).
//!
//! It starts its own `redis-server` nodes, etcd members and `redcron` workers, measures the items of issues 5, 11 and 12, and prints
//! Markdown tables with the machine they ran on and a list of targets met or missed. Options after `--`:
//!
//! - `--smoke` (or `REDCRON_BENCH_SMOKE=1`): tiny runs, for the smoke test; the figures mean nothing.
//! - `--items 1,2,3,4,5,6,7,8,9`: which items to run (default all; 6 is the herd of 10,000 jobs at one tick,
//!   7 the etcd store beside Redis, which needs `etcd` from Debian's `etcd-server`, 8 the dashboard's page
//!   of 1,000 jobs, about 40 s, 9 a Sentinel group's failovers and a Redis Cluster's, about 90 s).
//! - `--etcd-herd N`: the herd of item 7, on every store (default 2,000).
//! - `--stores redis,redis-sentinel,redis-cluster,etcd,postgres,mariadb,zookeeper`: the stores item 7 runs on (default all; Redis,
//!   the peer of every ratio, always runs).
//! - `--cycles N`: measured lease cycles per contender on the healthy cluster (default 1000).
//! - `--current-thread`: items 1–2 on a current-thread runtime (default: multi-threaded, as the worker).
//! - `--only floor,fanout,lease,claim,rslock,redlock`: which contenders items 1–2 measure (default all).
//!
//! - `REDCRON_BENCH_WORKER=<path>`: the `redcron` binary items 3–8 run as the workers (default: the one
//!   Cargo built with the benchmark), e.g. a base build kept aside for an A/B in one session.
//! - `REDCRON_BENCH_KEEP=1`: keep the workers' configs, JSON logs and ledgers (items 3–5, and the herds of
//!   items 6–7) and print where.
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it does nothing: the smoke test in
//! `tests/it/bench_smoke.rs` runs it instead.
//!
//! The benchmark's job is `probe.rs`, compiled alone with `rustc` into the run's scratch directory when
//! the benchmark starts: it appends `$REDCRON_JOB $REDCRON_TICK $REDCRON_WORKER_ID <wall-clock ns>` to a
//! ledger, first thing, which is how a job records when it started. Where `rustc` cannot build it, the
//! binary runs itself as the job (`lease --probe <ledger>`), which costs several times the CPU per run
//! (the report says which job ran).

mod bench;
mod probe;

use std::io::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|a| a == "--probe") {
        return probe::record(args.get(at + 1).map(Into::into));
    }
    let smoke = args.iter().any(|a| a == "--smoke")
        || std::env::var_os("REDCRON_BENCH_SMOKE").is_some_and(|v| v == "1");
    if !args.iter().any(|a| a == "--bench") && !smoke {
        println!("redcron benchmark: run it with `cargo bench --bench lease` (it is not part of the tests)");
        return ExitCode::SUCCESS;
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let sections = match value("--items") {
        Some(list) => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        None => vec![1, 2, 3, 4, 5, 6, 7, 8, 9],
    };
    let cycles = value("--cycles")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let contenders = match value("--only") {
        Some(list) => bench::cycle::Kind::ALL
            .into_iter()
            .filter(|kind| list.split(',').any(|name| name == kind.short()))
            .collect(),
        None => bench::cycle::Kind::ALL.to_vec(),
    };
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut print = |text: &str| {
        print!("{text}");
        let _ = std::io::stdout().flush();
    };
    // Kept until the end: the compiled probe lives in it.
    let scratch = tempfile::Builder::new()
        .prefix("redcron-bench-probe-")
        .tempdir();
    let compiled = match &scratch {
        Ok(dir) => bench::job::compile_probe(dir.path()),
        Err(why) => Err(format!("no scratch directory: {why}")),
    };
    let probe = match compiled {
        Ok(program) => {
            print(&format!(
                "Job: `benches/lease/probe.rs`, compiled for this run ({} KB)\n",
                std::fs::metadata(&program).map_or(0, |m| m.len() / 1024)
            ));
            vec![program.display().to_string()]
        }
        Err(why) => {
            print(&format!(
                "Job: this benchmark binary as `--probe` (the probe could not be compiled: {why}); \
                 its start costs several times the compiled probe's CPU per run\n"
            ));
            vec![exe, "--probe".to_string()]
        }
    };
    let options = bench::Options {
        smoke,
        sections,
        cycles,
        contenders,
        current_thread: args.iter().any(|a| a == "--current-thread"),
        // `REDCRON_BENCH_WORKER` runs another build of the worker (an A/B against a binary kept aside).
        worker: Some(
            std::env::var_os("REDCRON_BENCH_WORKER")
                .map_or_else(|| env!("CARGO_BIN_EXE_redcron").into(), Into::into),
        ),
        probe,
        etcd_herd: value("--etcd-herd")
            .and_then(|n| n.parse().ok())
            .unwrap_or(2_000),
        stores: value("--stores").map_or_else(Vec::new, |list| {
            list.split(',').map(|s| s.trim().to_lowercase()).collect()
        }),
    };
    match bench::run(&options, &mut print) {
        Ok(_) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("benchmark failed: {why}");
            ExitCode::FAILURE
        }
    }
}
