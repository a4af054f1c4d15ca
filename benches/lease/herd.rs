//! Item 6, the herd: N jobs due at one instant (what `0 * * * *` on hundreds of jobs is to a cron user),
//! 3 worker processes on 5 nodes, measured against what this machine can spawn and against the peer.
//!
//! Every job gets the same daily schedule, whose next tick is a few seconds after the workers start; each
//! run appends `job tick worker ns` to a ledger as its first act (the probe, `probe.rs`). From the ledger:
//! every job claimed exactly once, and the herd time — tick to the last run's first instruction. In the
//! same run, after the workers stopped, a plain loop starts the same number of `/bin/sh -c true` children:
//! the spawn time, what this machine can do without any lock; the ratio herd ÷ spawn is what redcron adds.
//! A second loop starts the herd's own job (the probe) the same way: the herd's starts are that job's,
//! whose start costs differ from `sh -c true`'s.
//! The nodes' own counters (`INFO commandstats`, `INFO cpu`, all 5 nodes, before the tick and after the
//! last run ended) give Redis commands and CPU per claim. Last, the [`super::peer`] settles the same N jobs
//! at one tick on one node; redcron's claim time (tick to the last `tick.won`) is printed as a multiple.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{Timelike as _, Utc};

use super::nodes::{Backend, Cluster, Counters, Usage};
use super::peer::{self, PeerRace};
use super::stats::{ms, quotient, Samples, Table, Verdict};
use super::workers::{
    config_yaml, now_ms, sleep_until_ms, spawn, stop_all, wait_started, LedgerEntry,
};

const WORKERS: usize = 3;

/// What the herd measured.
#[derive(Debug, Clone, Default)]
pub struct Herd {
    pub jobs: usize,
    /// Jobs that ran exactly once, more than once, never.
    pub once: usize,
    pub twice: usize,
    pub missing: usize,
    /// Tick to each run's first instruction.
    pub tick_to_start: Samples,
    /// Tick to each `tick.won` event, over all workers.
    pub tick_to_won: Samples,
    /// Runs per worker id, sorted by id.
    pub runs_per_worker: Vec<(String, usize)>,
    /// The time a plain loop took to start the same number of `/bin/sh -c true` children.
    pub spawn: Duration,
    /// The same for the herd's own job (the probe, writing to a scratch ledger).
    pub spawn_job: Duration,
    /// All 5 nodes' commands and CPU from just before the tick until every run had ended.
    pub usage: Usage,
    pub peer: Option<PeerRace>,
}

impl Herd {
    /// Tick to the last run's start: the herd time.
    pub fn herd_time(&self) -> Option<Duration> {
        self.tick_to_start.percentile(100.0)
    }

    /// Tick to the last claim won.
    pub fn claim_time(&self) -> Option<Duration> {
        self.tick_to_won.percentile(100.0)
    }

    pub fn spawn_ratio(&self) -> Option<f64> {
        quotient(self.herd_time(), Some(self.spawn))
    }

    /// Herd time ÷ the plain loop's time for the herd's own job.
    pub fn job_spawn_ratio(&self) -> Option<f64> {
        quotient(self.herd_time(), Some(self.spawn_job))
    }

    /// Redis commands per job claimed exactly once; `None` when none was (a total over no claims is not
    /// a cost per claim, and the ratio to the peer would be meaningless).
    pub fn commands_per_claim(&self) -> Option<f64> {
        (self.once > 0).then(|| self.usage.commands as f64 / self.once as f64)
    }

    /// Redis CPU seconds per job claimed exactly once; `None` when none was.
    pub fn cpu_per_claim(&self) -> Option<f64> {
        (self.once > 0).then(|| self.usage.cpu / self.once as f64)
    }
}

/// Runs the herd of `jobs` jobs with `probe` as the job on 5 Redis nodes, then the spawn loop and the
/// peer.
pub fn run(
    worker: &Path,
    probe: &[String],
    jobs: usize,
    print: &mut dyn FnMut(&str),
) -> Result<Herd, String> {
    let nodes = Backend::Redis.start_nodes(5);
    let mut herd = on_nodes(&nodes, worker, probe, jobs)?;
    herd.spawn = spawn_loop(
        jobs,
        &["/bin/sh".to_string(), "-c".to_string(), "true".to_string()],
    )?;
    let scratch = tempfile::Builder::new()
        .prefix("redcron-bench-spawn-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let job: Vec<String> = probe
        .iter()
        .cloned()
        .chain([scratch.path().join("ledger").display().to_string()])
        .collect();
    herd.spawn_job = spawn_loop(jobs, &job)?;
    nodes.flush();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let url = &nodes.urls()[0];
    herd.peer = Some(runtime.block_on(peer::race(url, jobs, 1, || nodes.usage(0)))?);
    print(&table(&herd));
    Ok(herd)
}

/// The herd alone on `nodes` (either store): 3 workers, `jobs` jobs due at one instant; every run
/// recorded, the nodes' counters from just before the tick until the runs' writes were done. Leaves
/// `spawn` and `peer` empty.
pub fn on_nodes(
    nodes: &Cluster,
    worker: &Path,
    probe: &[String],
    jobs: usize,
) -> Result<Herd, String> {
    let dir = tempfile::Builder::new()
        .prefix("redcron-bench-herd-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let ledger = dir.path().join("ledger");
    // Far enough ahead for 3 workers to load N jobs; a daily schedule, so the tick comes once.
    let lead = 5 + jobs as i64 / 1_000;
    let tick = Utc::now() + chrono::Duration::seconds(lead);
    let tick_at = tick.timestamp() * 1000;
    let schedule = format!("{} {} {} * * *", tick.second(), tick.minute(), tick.hour());
    let command: Vec<String> = probe
        .iter()
        .cloned()
        .chain([ledger.display().to_string()])
        .collect();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let config = dir.path().join(format!("herd-w{w}.yaml"));
        let yaml = config_yaml(
            nodes.backend(),
            &nodes.urls(),
            &format!("w{w}"),
            jobs,
            &schedule,
            &command,
        );
        std::fs::write(&config, yaml).map_err(|e| e.to_string())?;
        workers.push(spawn(worker, &config));
    }
    wait_started(&workers, Duration::from_secs(60))?;
    if now_ms() > tick_at - 500 {
        return Err(format!(
            "the workers took more than {lead} s to start with {jobs} jobs; the herd's tick passed"
        ));
    }
    sleep_until_ms(tick_at - 300);
    let before = nodes.total_usage();
    // Until every job ran (or a minute passed), then until the runs' releases and history writes ended.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ledger_lines(&ledger) < jobs && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut usage = nodes.total_usage();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = nodes.total_usage();
        // Quiet: only the workers' background traffic (heartbeats, polls) is left.
        let quiet = now.commands.saturating_sub(usage.commands) < 200;
        usage = now;
        if quiet || Instant::now() >= deadline + Duration::from_secs(30) {
            break;
        }
    }
    let mut herd = Herd {
        jobs,
        usage: before.until(usage),
        ..Herd::default()
    };
    stop_all(&mut workers);
    read_ledger(&ledger, tick_at, &mut herd)?;
    // What each worker logged, for a herd that missed jobs or ran one twice: why, claim by claim.
    if std::env::var_os("REDCRON_BENCH_KEEP").is_some() {
        for (w, worker) in workers.iter().enumerate() {
            let log = dir.path().join(format!("herd-w{w}.log"));
            std::fs::write(&log, worker.lines().join("\n")).map_err(|e| e.to_string())?;
        }
        eprintln!(
            "The herd's worker configs, logs and ledger kept in {}",
            dir.keep().display()
        );
    }
    for worker in &workers {
        for event in worker.events("tick.won") {
            let at = event["timestamp"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
            if let Some(at) = at {
                let delay = at.timestamp_micros() - tick_at * 1000;
                herd.tick_to_won
                    .push(Duration::from_micros(delay.max(0) as u64));
            }
        }
    }
    Ok(herd)
}

fn ledger_lines(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |bytes| bytes.iter().filter(|b| **b == b'\n').count())
}

/// Exactly-once per job, tick to start and runs per worker, from the ledger's lines for `tick`.
fn read_ledger(path: &Path, tick: i64, herd: &mut Herd) -> Result<(), String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs = std::collections::HashMap::<&str, usize>::new();
    let mut per_worker = std::collections::BTreeMap::<&str, usize>::new();
    for line in text.lines() {
        let entry = LedgerEntry::parse(line)?;
        if entry.tick != tick {
            continue;
        }
        *runs.entry(entry.job).or_default() += 1;
        *per_worker.entry(entry.worker).or_default() += 1;
        herd.tick_to_start.push(entry.tick_to_start);
    }
    herd.once = runs.values().filter(|n| **n == 1).count();
    herd.twice = runs.values().filter(|n| **n > 1).count();
    herd.missing = herd.jobs.saturating_sub(runs.len());
    herd.runs_per_worker = per_worker
        .into_iter()
        .map(|(w, n)| (w.to_string(), n))
        .collect();
    Ok(())
}

/// The machine's spawn limit: a plain loop starts `n` children of `argv` (e.g. `/bin/sh -c true`),
/// reaping as it goes (a 32k pid space holds no 10,000 zombies beside everyone else's processes). The
/// time until the last `spawn` returned, which is after that child's `exec`.
pub fn spawn_loop(n: usize, argv: &[String]) -> Result<Duration, String> {
    let (program, args) = argv.split_first().ok_or("an empty command")?;
    let started = Instant::now();
    let mut running = Vec::new();
    for i in 0..n {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        running.push(child);
        if i % 64 == 63 {
            running.retain_mut(|child| !matches!(child.try_wait(), Ok(Some(_))));
        }
    }
    let spawned = started.elapsed();
    for mut child in running {
        let _ = child.wait();
    }
    Ok(spawned)
}

fn table(herd: &Herd) -> String {
    let mut table = Table::new(&[
        "jobs at one tick",
        "claimed exactly once",
        "twice",
        "never",
        "tick→start p50 ms",
        "herd time ms (tick→last start)",
        "spawn time ms (plain loop)",
        "herd ÷ spawn",
        "spawn time ms (plain loop, the herd's job)",
        "herd ÷ that",
        "claim time ms (tick→last won)",
        "runs per worker",
        "redis commands /claim",
        "redis CPU µs /claim",
    ]);
    let runs: Vec<String> = herd
        .runs_per_worker
        .iter()
        .map(|(w, n)| format!("{w} {n}"))
        .collect();
    table.row(vec![
        herd.jobs.to_string(),
        format!("{} of {}", herd.once, herd.jobs),
        herd.twice.to_string(),
        herd.missing.to_string(),
        ms(herd.tick_to_start.p50()),
        ms(herd.herd_time()),
        ms(Some(herd.spawn)),
        herd.spawn_ratio()
            .map_or("–".to_string(), |r| format!("{r:.1}×")),
        ms(Some(herd.spawn_job)),
        herd.job_spawn_ratio()
            .map_or("–".to_string(), |r| format!("{r:.1}×")),
        ms(herd.claim_time()),
        runs.join(", "),
        herd.commands_per_claim().map_or_else(
            || format!("– ({} commands, no claim)", herd.usage.commands),
            |c| format!("{c:.1}"),
        ),
        herd.cpu_per_claim()
            .map_or("–".to_string(), |c| format!("{:.1}", c * 1e6)),
    ]);
    let mut peer_table = Table::new(&[
        "contender",
        "settle ms (all jobs decided)",
        "won exactly once",
        "commands /claim",
        "redis CPU µs /claim",
        "redcron ÷ peer, time",
        "redcron ÷ peer, commands",
        "redcron ÷ peer, CPU",
    ]);
    if let Some(peer) = &herd.peer {
        peer_table.row(vec![
            "peer: 1 node, SET NX PX ×3".to_string(),
            ms(peer.settle.p50()),
            format!("{} of {}", peer.once, peer.jobs),
            format!("{:.1}", peer.commands_per_claim()),
            format!("{:.1}", peer.cpu_per_claim() * 1e6),
            quotient(herd.claim_time(), peer.settle.p50())
                .map_or("–".to_string(), |q| format!("{q:.1}×")),
            herd.commands_per_claim().map_or("–".to_string(), |c| {
                format!("{:.1}×", c / peer.commands_per_claim().max(1e-9))
            }),
            herd.cpu_per_claim().map_or("–".to_string(), |c| {
                format!("{:.1}×", c / peer.cpu_per_claim().max(1e-12))
            }),
        ]);
    }
    format!(
        "\n## 6. The herd: {} jobs due at one instant, 3 workers, 5 nodes\n\n\
         Each run's first act appends to a ledger; herd time is the tick to the last run's start. Spawn time: \
         the same number of `/bin/sh -c true` children started by a plain loop in this process, in the same \
         run (the machine's limit without any lock); then the same for the herd's own job, the probe. \
         Claim time: the tick to the last `tick.won` event. \
         Redis commands and CPU per claim: all 5 nodes' `INFO commandstats` / `INFO cpu` from just before \
         the tick until the runs' releases and history writes were done (the workers' background traffic \
         included).\n\n{}\n\nThe peer under the same herd, lock level only (no processes): one node, 3 \
         contenders each sending one `SET NX PX` per job at once. redcron's time here is its claim time.\n\n{}",
        herd.jobs,
        table.render(),
        peer_table.render()
    )
}

/// The herd's targets: exactly once, and the ratios printed so that a regression shows.
pub fn verdicts(herd: &Herd) -> Vec<Verdict> {
    let mut verdicts = vec![Verdict::new(
        format!("herd: each of {} jobs claimed exactly once", herd.jobs),
        format!(
            "{} of {}, {} twice, {} never",
            herd.once, herd.jobs, herd.twice, herd.missing
        ),
        Some(herd.twice == 0 && herd.missing == 0),
    )];
    verdicts.push(Verdict::new(
        "herd: started within 2× of the machine's spawn limit",
        herd.spawn_ratio()
            .map_or("–".to_string(), |r| format!("{r:.1}×")),
        herd.spawn_ratio().map(|r| r <= 2.0),
    ));
    verdicts
}
