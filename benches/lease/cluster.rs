//! Items 3–5: real `redcron run` workers on 5 nodes, with jobs that record when they started.
//!
//! Each load runs twice. The **main phase** (workers connected straight to the nodes) gives tick-to-start,
//! tick-to-won, exactly-once, CPU and RSS. The **counted phase** (each worker behind its own counting
//! proxies, see [`super::proxy`]) gives Redis round trips and commands per worker per tick; it is kept
//! apart because parsing every byte in the benchmark process would slow the workers it measures.
//!
//! A job is one `(job, tick)` line in a ledger file, written by the job itself as its first act:
//! `$REDCRON_JOB $REDCRON_TICK $REDCRON_WORKER_ID <wall-clock ns>`. Tick to start is that time minus the
//! tick; tick to won is the `tick.won` log event's timestamp minus the tick.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use super::nodes::Nodes;
use super::proxy::Proxy;
use super::stats::{ms, Samples, Table, Verdict};
use super::workers::{
    busy_fraction, config_yaml, counts, cpu_ticks, machine_ticks, memory, now_ms, read_ledger,
    read_log, script_shas, sleep_until_ms, stop_all, Worker,
};

const WORKERS: usize = 3;

/// What one load (N jobs, each firing every second) measured.
#[derive(Debug, Clone, Default)]
pub struct Load {
    pub jobs: usize,
    /// Tick instants in the measured window.
    pub ticks: usize,
    /// `(job, tick)` pairs in the window that ran exactly once, more than once, never.
    pub once: usize,
    pub duplicates: usize,
    pub missing: usize,
    pub tick_to_start: Samples,
    pub tick_to_won: Samples,
    /// Distinct workers that ran something.
    pub winners: usize,
    /// `tick.skipped` events in the window, by reason, over all workers.
    pub skipped: Vec<(String, usize)>,
    /// Per worker: CPU seconds per minute (user + system, the worker process only, not its jobs).
    pub cpu_per_minute: Vec<f64>,
    /// Per worker: RSS and peak RSS (kB) at the end of the window.
    pub rss_kb: Vec<u64>,
    pub peak_rss_kb: Vec<u64>,
    /// From the counted phase, per worker and tick over all 5 nodes (mean of the workers): round trips
    /// that claim (`ACQUIRE` and `CONFIRM` pipelines), round trips that release (releases and undos), all
    /// round trips, and all commands.
    pub claim_round_trips: Option<f64>,
    pub release_round_trips: Option<f64>,
    pub round_trips: Option<f64>,
    pub commands: Option<f64>,
    /// CPU cores busy during the window: all 5 redis-server processes; the whole machine (0–1).
    pub redis_cores: f64,
    pub machine_busy: f64,
}

/// Items 3–5.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub loads: Vec<Load>,
    /// RSS (kB) of each worker with 1,000 jobs loaded and none due.
    pub idle_rss_kb: Vec<u64>,
}

/// How long each phase runs.
struct Durations {
    main: u64,
    counted: u64,
}

pub fn run(
    worker: &Path,
    probe: &[String],
    sections: &[u8],
    smoke: bool,
    print: &mut dyn FnMut(&str),
) -> Result<Results, String> {
    let nodes = Nodes::start(5).map_err(|e| format!("cannot start redis-server nodes: {e}"))?;
    let dir = tempfile::Builder::new()
        .prefix("redcron-bench-workers-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let mut results = Results::default();
    let mut loads: Vec<(usize, Durations)> = Vec::new();
    if sections.contains(&3) {
        let main = if smoke { 2 } else { 15 };
        loads.push((
            if smoke { 3 } else { 10 },
            Durations {
                main,
                counted: if smoke { 1 } else { 5 },
            },
        ));
    }
    if !smoke && (sections.contains(&4) || sections.contains(&5)) {
        loads.push((
            1_000,
            Durations {
                main: 15,
                counted: 5,
            },
        ));
    }
    if !smoke && sections.contains(&4) {
        loads.push((
            10_000,
            Durations {
                main: 10,
                counted: 5,
            },
        ));
    }
    let setup = Setup {
        nodes: &nodes,
        worker,
        probe,
        dir: dir.path(),
        lead: if smoke { 1 } else { 2 },
    };
    for (phase, (jobs, durations)) in loads.into_iter().enumerate() {
        if smoke {
            // One short counted phase gives every figure; they mean nothing, they only show it runs.
            results
                .loads
                .push(setup.phase(&format!("s{phase}"), jobs, durations.main, true)?);
            continue;
        }
        let mut load = setup.phase(&format!("p{phase}"), jobs, durations.main, false)?;
        let counted = setup.phase(&format!("c{phase}"), jobs, durations.counted, true)?;
        load.claim_round_trips = counted.claim_round_trips;
        load.release_round_trips = counted.release_round_trips;
        load.round_trips = counted.round_trips;
        load.commands = counted.commands;
        results.loads.push(load);
    }
    if sections.contains(&3) || sections.contains(&4) {
        print(&load_table(&results.loads));
    }
    if sections.contains(&5) {
        results.idle_rss_kb = if smoke {
            setup.idle(10, 1)?
        } else {
            setup.idle(1_000, 3)?
        };
        print(&memory_table(&results));
    }
    if std::env::var_os("REDCRON_BENCH_KEEP").is_some() {
        print(&format!(
            "\nWorker configs, logs and ledgers kept in {}\n",
            dir.keep().display()
        ));
    }
    Ok(results)
}

struct Setup<'a> {
    nodes: &'a Nodes,
    worker: &'a Path,
    probe: &'a [String],
    dir: &'a Path,
    /// Whole seconds between the workers' start and the window's first tick.
    lead: i64,
}

impl Setup<'_> {
    /// Runs `jobs` jobs every second on 3 workers and measures `seconds` ticks.
    fn phase(&self, tag: &str, jobs: usize, seconds: u64, counted: bool) -> Result<Load, String> {
        for i in 0..self.nodes.len() {
            self.nodes
                .command(i, &["FLUSHALL"])
                .map_err(|e| format!("FLUSHALL: {e}"))?;
        }
        let ledger = self.dir.join(format!("{tag}.ledger"));
        let proxies: Vec<Vec<Proxy>> = if counted {
            (0..WORKERS)
                .map(|_| {
                    (0..self.nodes.len())
                        .map(|i| {
                            Proxy::start(self.nodes.port(i), Duration::ZERO, Some(script_shas()))
                        })
                        .collect()
                })
                .collect::<io::Result<_>>()
                .map_err(|e| format!("proxy: {e}"))?
        } else {
            Vec::new()
        };
        let mut workers = Vec::new();
        for w in 0..WORKERS {
            let urls = match proxies.get(w) {
                Some(proxies) => proxies.iter().map(Proxy::url).collect(),
                None => self.nodes.urls(),
            };
            let command: Vec<String> = self
                .probe
                .iter()
                .cloned()
                .chain([ledger.display().to_string()])
                .collect();
            let config = self.dir.join(format!("{tag}-w{w}.yaml"));
            fs::write(
                &config,
                config_yaml(&urls, &format!("w{w}"), jobs, "* * * * * *", &command),
            )
            .map_err(|e| e.to_string())?;
            workers.push(Worker::spawn(
                self.worker,
                &config,
                &self.dir.join(format!("{tag}-w{w}.log")),
            )?);
        }
        for worker in &mut workers {
            worker.wait_started(Duration::from_secs(30))?;
        }
        // The window starts `lead` whole seconds from now, so the workers have settled; snapshots
        // are taken half a second before its first tick and before the first tick after it.
        let first = (now_ms() / 1000 + self.lead) * 1000;
        let last = first + (seconds as i64 - 1) * 1000;
        sleep_until_ms(first - 500);
        let redis_cpu = || {
            (0..self.nodes.len())
                .map(|i| cpu_ticks(self.nodes.pid(i)))
                .sum::<u64>()
        };
        let cpu_before: Vec<u64> = workers.iter().map(|w| cpu_ticks(w.pid)).collect();
        let (redis_before, machine_before) = (redis_cpu(), machine_ticks());
        let counts_before = counts(&proxies);
        sleep_until_ms(last + 500);
        let cpu_after: Vec<u64> = workers.iter().map(|w| cpu_ticks(w.pid)).collect();
        let (redis_after, machine_after) = (redis_cpu(), machine_ticks());
        let counts_after = counts(&proxies);
        let (rss_kb, peak_rss_kb) = workers.iter().map(|w| memory(w.pid)).unzip();
        // Let the last window's runs end, then stop gracefully.
        std::thread::sleep(Duration::from_millis(1500));
        stop_all(&mut workers);

        let clock_ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let window = seconds as f64;
        let mut load = Load {
            jobs,
            ticks: seconds as usize,
            cpu_per_minute: cpu_before
                .iter()
                .zip(&cpu_after)
                .map(|(b, a)| (a.saturating_sub(*b)) as f64 / clock_ticks / window * 60.0)
                .collect(),
            rss_kb,
            peak_rss_kb,
            redis_cores: redis_after.saturating_sub(redis_before) as f64 / clock_ticks / window,
            machine_busy: busy_fraction(machine_before, machine_after),
            ..Load::default()
        };
        if counted {
            // Commands (or round trips) of one kind in the window, per worker and tick.
            let per_tick = |kind: usize, trips: bool| {
                let pick =
                    |c: &[(u64, u64)]| c.get(kind).map_or(0, |(n, r)| if trips { *r } else { *n });
                let total: u64 = counts_before
                    .iter()
                    .zip(&counts_after)
                    .map(|(before, after)| pick(after).saturating_sub(pick(before)))
                    .sum();
                total as f64 / window / WORKERS as f64
            };
            let kinds = script_shas().len() + 1;
            load.claim_round_trips = Some(per_tick(0, true) + per_tick(1, true));
            load.release_round_trips = Some(per_tick(3, true));
            load.round_trips = Some((0..kinds).map(|k| per_tick(k, true)).sum());
            load.commands = Some((0..kinds).map(|k| per_tick(k, false)).sum());
        }
        read_ledger(&ledger, first, last, &mut load)?;
        for worker in &workers {
            read_log(&worker.log, first, last, &mut load)?;
        }
        Ok(load)
    }

    /// RSS of 3 workers with `jobs` jobs loaded that fire once a year.
    fn idle(&self, jobs: usize, settle_secs: u64) -> Result<Vec<u64>, String> {
        let mut workers = Vec::new();
        for w in 0..WORKERS {
            let config = self.dir.join(format!("idle-w{w}.yaml"));
            let yaml = config_yaml(
                &self.nodes.urls(),
                &format!("w{w}"),
                jobs,
                "0 0 0 1 1 *",
                &["true".to_string()],
            );
            fs::write(&config, yaml).map_err(|e| e.to_string())?;
            workers.push(Worker::spawn(
                self.worker,
                &config,
                &self.dir.join(format!("idle-w{w}.log")),
            )?);
        }
        for worker in &mut workers {
            worker.wait_started(Duration::from_secs(30))?;
        }
        std::thread::sleep(Duration::from_secs(settle_secs));
        let rss = workers.iter().map(|w| memory(w.pid).0).collect();
        stop_all(&mut workers);
        Ok(rss)
    }
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

fn load_table(loads: &[Load]) -> String {
    let mut table = Table::new(&[
        "jobs/s",
        "ticks",
        "exactly once",
        "dup",
        "missing",
        "tick→won p50 ms",
        "tick→won p99 ms",
        "tick→start p50 ms",
        "tick→start p99 ms",
        "claim round trips /worker/tick",
        "release round trips /worker/tick",
        "all round trips /worker/tick",
        "commands /worker/tick",
        "CPU s /worker/min",
        "redis CPU cores",
        "machine busy",
        "skipped",
    ]);
    for load in loads {
        let skipped: Vec<String> = load
            .skipped
            .iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect();
        table.row(vec![
            load.jobs.to_string(),
            load.ticks.to_string(),
            format!("{} of {}", load.once, load.jobs * load.ticks),
            load.duplicates.to_string(),
            load.missing.to_string(),
            ms(load.tick_to_won.p50()),
            ms(load.tick_to_won.p99()),
            ms(load.tick_to_start.p50()),
            ms(load.tick_to_start.p99()),
            load.claim_round_trips
                .map_or("–".to_string(), |r| format!("{r:.1}")),
            load.release_round_trips
                .map_or("–".to_string(), |r| format!("{r:.1}")),
            load.round_trips
                .map_or("–".to_string(), |r| format!("{r:.1}")),
            load.commands.map_or("–".to_string(), |c| format!("{c:.0}")),
            mean(&load.cpu_per_minute).map_or("–".to_string(), |c| format!("{c:.2}")),
            format!("{:.2}", load.redis_cores),
            format!("{:.0} %", load.machine_busy * 100.0),
            if skipped.is_empty() {
                "none".to_string()
            } else {
                skipped.join(", ")
            },
        ]);
    }
    format!(
        "\n## 3–4. Tick to start and scale: 3 workers, 5 nodes, every job fires every second\n\n\
         tick→won: scheduled instant to the worker's `tick.won` log event (the claim); tick→start: to the \
         job's own first instruction (claim + process spawn). Round trips and commands: all 5 nodes, mean \
         of the 3 workers, from counting proxies in a separate run of the same load; a claim round trip is \
         an `ACQUIRE` or `CONFIRM` pipeline, a release round trip one of releases or undos. CPU: the \
         worker process (user + system), not its jobs; redis CPU: the 5 nodes together, in cores; machine \
         busy: all CPUs, everything running (other users' work too).\n\n{}",
        table.render()
    )
}

fn memory_table(results: &Results) -> String {
    let mut table = Table::new(&["worker state", "RSS MB (per worker)", "peak RSS MB"]);
    let mb = |kb: &[u64]| {
        kb.iter()
            .map(|k| format!("{:.1}", *k as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    table.row(vec![
        "idle, 1,000 jobs loaded, none due".to_string(),
        mb(&results.idle_rss_kb),
        "–".to_string(),
    ]);
    if let Some(load) = results.loads.iter().find(|l| l.jobs == 1_000) {
        table.row(vec![
            "1,000 jobs/s, end of window".to_string(),
            mb(&load.rss_kb),
            mb(&load.peak_rss_kb),
        ]);
    }
    format!("\n## 5. Worker memory\n\n{}", table.render())
}

impl Results {
    pub fn verdicts(&self) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        let load = |jobs: usize| self.loads.iter().find(|l| l.jobs == jobs);
        for (jobs, limit) in [(10, 10.0), (10_000, 100.0)] {
            if let Some(l) = load(jobs) {
                let p99 = l.tick_to_start.p99();
                verdicts.push(Verdict::new(
                    format!("tick→start p99 ≤ {limit} ms at {jobs} jobs/s"),
                    format!("{} ms", ms(p99)),
                    p99.map(|p| p.as_secs_f64() * 1e3 <= limit),
                ));
            }
        }
        for l in &self.loads {
            verdicts.push(Verdict::new(
                format!("every tick run exactly once at {} jobs/s", l.jobs),
                format!(
                    "{} of {}, {} dup, {} missing",
                    l.once,
                    l.jobs * l.ticks,
                    l.duplicates,
                    l.missing
                ),
                Some(l.duplicates == 0 && l.missing == 0),
            ));
        }
        let trips: Vec<(usize, f64)> = self
            .loads
            .iter()
            .filter_map(|l| Some((l.jobs, l.claim_round_trips?)))
            .collect();
        if trips.len() > 1 {
            let low = trips.iter().map(|t| t.1).fold(f64::MAX, f64::min);
            let high = trips.iter().map(|t| t.1).fold(0.0, f64::max);
            let listed: Vec<String> = trips
                .iter()
                .map(|(j, r)| format!("{r:.1} at {j}"))
                .collect();
            verdicts.push(Verdict::new(
                "claim round trips per worker per tick independent of the job count (within 1.5×)",
                listed.join(", "),
                Some(high <= low * 1.5),
            ));
        }
        if let Some(l) = load(1_000) {
            let peak = l.peak_rss_kb.iter().copied().max().unwrap_or(0);
            verdicts.push(Verdict::new(
                "worker RSS ≤ 20 MB with 1,000 jobs",
                format!("peak {:.1} MB", peak as f64 / 1024.0),
                Some(peak <= 20 * 1024),
            ));
        }
        verdicts
    }
}
