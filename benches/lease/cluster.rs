//! Items 3–5: real `redcron run` workers on 5 nodes, with jobs that record when they started.
//!
//! Each load runs twice. The **main phase** (workers connected straight to the nodes) gives tick-to-start,
//! tick-to-won, exactly-once, CPU and RSS. The **counted phase** (each worker behind its own counting
//! proxies, see [`super::proxy`]) gives Redis round trips and commands per worker per tick; it is kept
//! apart because parsing every byte in the benchmark process would slow the workers it measures. Item 3's
//! loads then run a **plain loop** (`Setup::plain_loop`): the same jobs started at the same kind of ticks
//! by the benchmark itself, with no lock and nothing else running, the floor that tick to start is
//! compared with.
//!
//! A job is one `(job, tick)` line in a ledger file, written by the job itself as its first act:
//! `$REDCRON_JOB $REDCRON_TICK $REDCRON_WORKER_ID <wall-clock ns>`. Tick to start is that time minus the
//! tick; tick to won is the `tick.won` log event's timestamp minus the tick.

use std::fs;
use std::io;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redcron::schedule::Tick;

use super::nodes::{Backend, Cluster, Counters};
use super::proxy::Proxy;
use super::stats::{ms, Samples, Table, Verdict};
use super::workers::{
    busy_fraction, children_ticks, config_yaml, counts, cpu_ticks, machine_ticks, memory, now_ms,
    read_ledger, read_log, script_shas, sleep_until_ms, spawn, stop_all, wait_started,
};

const WORKERS: usize = 3;
/// How many of the most called Redis commands the table names.
const TOP_COMMANDS: usize = 6;

/// The jobs of item 3's herd every second (`sh -c` jobs, all due at each second), and the most jobs a load
/// runs the plain loop for.
const HERD_EVERY_SECOND: usize = 300;

/// What one load (N jobs, each firing every second) measured.
#[derive(Debug, Clone, Default)]
pub struct Load {
    pub jobs: usize,
    /// Whether each run is a `/bin/sh -c` that execs the probe (instead of the probe itself).
    pub shell: bool,
    /// Tick instants in the measured window.
    pub ticks: usize,
    /// `(job, tick)` pairs in the window that ran exactly once, more than once, never.
    pub once: usize,
    pub duplicates: usize,
    pub missing: usize,
    pub tick_to_start: Samples,
    pub tick_to_won: Samples,
    /// Tick to start of a plain loop in the benchmark's process that starts the same jobs at the same
    /// kind of ticks, one after the other, with nothing else running: no lock, no nodes' work, no
    /// workers. What this machine allows any scheduler (item 3's loads only).
    pub plain_loop: Samples,
    /// Runs in the window per worker id, sorted by id: how evenly the work spreads.
    pub runs_per_worker: Vec<(String, usize)>,
    /// Redis commands and Redis CPU seconds per run in the window, all nodes, from the nodes' own counters.
    pub commands_per_run: Option<f64>,
    pub redis_cpu_per_run: Option<f64>,
    /// The Redis commands most called in the window, per run (all nodes), most first.
    pub top_commands: Vec<(String, f64)>,
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
    /// CPU cores the jobs themselves (the workers' reaped children) kept busy during the window, and
    /// their CPU per run (seconds).
    pub jobs_cores: f64,
    pub job_cpu_per_run: f64,
}

/// Items 3–5.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub loads: Vec<Load>,
    /// RSS (kB) of each worker with 1,000 jobs loaded and none due.
    pub idle_rss_kb: Vec<u64>,
}

/// How long each phase runs, and whether its job is wrapped in `/bin/sh -c`.
struct Durations {
    main: u64,
    counted: u64,
    shell: bool,
}

pub fn run(
    worker: &Path,
    probe: &[String],
    sections: &[u8],
    smoke: bool,
    print: &mut dyn FnMut(&str),
) -> Result<Results, String> {
    let nodes = Backend::Redis.start_nodes(5);
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
                shell: false,
            },
        ));
        if !smoke {
            // What a user's job costs on top: a shell that then runs the command.
            loads.push((
                10,
                Durations {
                    main: 15,
                    counted: 3,
                    shell: true,
                },
            ));
            // Issue 22's herd every second: 300 shell jobs due at one instant, against the plain loop.
            loads.push((
                HERD_EVERY_SECOND,
                Durations {
                    main: 15,
                    counted: 3,
                    shell: true,
                },
            ));
        }
    }
    if !smoke && (sections.contains(&4) || sections.contains(&5)) {
        loads.push((
            1_000,
            Durations {
                main: 15,
                counted: 5,
                shell: false,
            },
        ));
    }
    if !smoke && sections.contains(&4) {
        loads.push((
            10_000,
            Durations {
                main: 10,
                counted: 5,
                shell: false,
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
            let mut load = setup.phase(
                &format!("s{phase}"),
                jobs,
                durations.main,
                true,
                durations.shell,
            )?;
            load.plain_loop = setup.plain_loop(&format!("l{phase}"), jobs, 1, durations.shell)?;
            results.loads.push(load);
            continue;
        }
        let main = (durations.main, false, durations.shell);
        let mut load = setup.phase(&format!("p{phase}"), jobs, main.0, main.1, main.2)?;
        let counted = setup.phase(
            &format!("c{phase}"),
            jobs,
            durations.counted,
            true,
            durations.shell,
        )?;
        load.claim_round_trips = counted.claim_round_trips;
        load.release_round_trips = counted.release_round_trips;
        load.round_trips = counted.round_trips;
        load.commands = counted.commands;
        if jobs <= HERD_EVERY_SECOND {
            load.plain_loop = setup.plain_loop(&format!("l{phase}"), jobs, main.0, main.2)?;
        }
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
    nodes: &'a Cluster,
    worker: &'a Path,
    probe: &'a [String],
    dir: &'a Path,
    /// Whole seconds between the workers' start and the window's first tick.
    lead: i64,
}

impl Setup<'_> {
    /// Runs `jobs` jobs every second on 3 workers and measures `seconds` ticks.
    fn phase(
        &self,
        tag: &str,
        jobs: usize,
        seconds: u64,
        counted: bool,
        shell: bool,
    ) -> Result<Load, String> {
        self.nodes.flush();
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
            let command = self.job_command(&ledger, shell);
            let config = self.dir.join(format!("{tag}-w{w}.yaml"));
            fs::write(
                &config,
                config_yaml(
                    Backend::Redis,
                    &urls,
                    &format!("w{w}"),
                    jobs,
                    "* * * * * *",
                    &command,
                ),
            )
            .map_err(|e| e.to_string())?;
            workers.push(spawn(self.worker, &config));
        }
        wait_started(&workers, Duration::from_secs(30))?;
        // The window starts `lead` whole seconds from now, so the workers have settled; snapshots
        // are taken half a second before its first tick and before the first tick after it.
        let first = (now_ms() / 1000 + self.lead) * 1000;
        let last = first + (seconds as i64 - 1) * 1000;
        sleep_until_ms(first - 500);
        let redis_cpu = || {
            (0..self.nodes.len())
                .map(|i| cpu_ticks(self.nodes.pid(i).unwrap_or(0)))
                .sum::<u64>()
        };
        let cpu_before: Vec<u64> = workers.iter().map(|w| cpu_ticks(w.pid())).collect();
        let jobs_cpu = || workers.iter().map(|w| children_ticks(w.pid())).sum::<u64>();
        let jobs_before = jobs_cpu();
        let (redis_before, machine_before) = (redis_cpu(), machine_ticks());
        let usage_before = (!counted).then(|| self.nodes.total_usage());
        let calls_before = (!counted).then(|| self.nodes.command_calls());
        let counts_before = counts(&proxies);
        sleep_until_ms(last + 500);
        let cpu_after: Vec<u64> = workers.iter().map(|w| cpu_ticks(w.pid())).collect();
        let jobs_after = jobs_cpu();
        let (redis_after, machine_after) = (redis_cpu(), machine_ticks());
        let usage = usage_before.map(|before| before.until(self.nodes.total_usage()));
        let calls = calls_before.map(|before| {
            let mut calls: Vec<(String, u64)> = self
                .nodes
                .command_calls()
                .into_iter()
                .map(|(name, after)| {
                    let since = after.saturating_sub(before.get(&name).copied().unwrap_or(0));
                    (name, since)
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            calls.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            calls
        });
        let counts_after = counts(&proxies);
        let (rss_kb, peak_rss_kb) = workers.iter().map(|w| memory(w.pid())).unzip();
        // Let the last window's runs end, then stop gracefully.
        std::thread::sleep(Duration::from_millis(1500));
        stop_all(&mut workers);

        let clock_ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let window = seconds as f64;
        let mut load = Load {
            jobs,
            shell,
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
            jobs_cores: jobs_after.saturating_sub(jobs_before) as f64 / clock_ticks / window,
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
            read_log(worker, first, last, &mut load);
        }
        let runs = (load.once + load.duplicates).max(1) as f64;
        load.commands_per_run = usage.map(|u| u.commands as f64 / runs);
        load.redis_cpu_per_run = usage.map(|u| u.cpu / runs);
        load.top_commands = calls
            .unwrap_or_default()
            .into_iter()
            .take(TOP_COMMANDS)
            .map(|(name, n)| (name, n as f64 / runs))
            .collect();
        load.job_cpu_per_run = load.jobs_cores * window / runs;
        Ok(load)
    }

    /// The job of every run: the probe writing to `ledger`, or (`shell`) a `/bin/sh -c` that execs it.
    fn job_command(&self, ledger: &Path, shell: bool) -> Vec<String> {
        let shell_prefix = ["/bin/sh", "-c", "exec \"$@\"", "sh"];
        shell_prefix
            .iter()
            .filter(|_| shell)
            .map(|s| s.to_string())
            .chain(self.probe.iter().cloned())
            .chain([ledger.display().to_string()])
            .collect()
    }

    /// The floor of tick to start: for `seconds` ticks one second apart, this process starts `jobs` runs
    /// of the same job at each tick, one after the other, as a plain cron loop on one host would (no
    /// lock, no nodes' work, no workers), and reaps them after the last start. Returns each run's tick to
    /// start, read from the job's own ledger like the workers'.
    fn plain_loop(
        &self,
        tag: &str,
        jobs: usize,
        seconds: u64,
        shell: bool,
    ) -> Result<Samples, String> {
        let ledger = self.dir.join(format!("{tag}.ledger"));
        let command = self.job_command(&ledger, shell);
        let (program, args) = command.split_first().ok_or("an empty command")?;
        let first = (now_ms() / 1000 + self.lead) * 1000;
        let last = first + (seconds as i64 - 1) * 1000;
        for tick in (first..=last).step_by(1000) {
            let at = UNIX_EPOCH + Duration::from_millis(tick as u64);
            let stamp = Tick(tick).to_string();
            // Precise to the microsecond, unlike `sleep_until_ms`: the loop must not start late.
            if let Ok(wait) = at.duration_since(SystemTime::now()) {
                std::thread::sleep(wait);
            }
            let mut started = Vec::with_capacity(jobs);
            for job in 0..jobs {
                let child = std::process::Command::new(program)
                    .args(args)
                    .env("REDCRON_JOB", format!("job-{job}"))
                    .env("REDCRON_TICK", &stamp)
                    .env("REDCRON_WORKER_ID", "plain-loop")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("cannot run {program}: {e}"))?;
                started.push(child);
            }
            for mut child in started {
                let _ = child.wait();
            }
        }
        let mut load = Load {
            jobs,
            ticks: seconds as usize,
            ..Load::default()
        };
        read_ledger(&ledger, first, last, &mut load)?;
        if load.once != jobs * seconds as usize {
            return Err(format!(
                "the plain loop's ledger has {} of {} runs",
                load.once,
                jobs * seconds as usize
            ));
        }
        Ok(load.tick_to_start)
    }

    /// RSS of 3 workers with `jobs` jobs loaded that fire once a year.
    fn idle(&self, jobs: usize, settle_secs: u64) -> Result<Vec<u64>, String> {
        let mut workers = Vec::new();
        for w in 0..WORKERS {
            let config = self.dir.join(format!("idle-w{w}.yaml"));
            let yaml = config_yaml(
                Backend::Redis,
                &self.nodes.urls(),
                &format!("w{w}"),
                jobs,
                "0 0 0 1 1 *",
                &["true".to_string()],
            );
            fs::write(&config, yaml).map_err(|e| e.to_string())?;
            workers.push(spawn(self.worker, &config));
        }
        wait_started(&workers, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_secs(settle_secs));
        let rss = workers.iter().map(|w| memory(w.pid()).0).collect();
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
        "missed",
        "tick→won p50 ms",
        "tick→won p99 ms",
        "tick→start p50 ms",
        "tick→start p99 ms",
        "plain loop tick→start p50 / p99 ms",
        "claim round trips /worker/tick",
        "release round trips /worker/tick",
        "all round trips /worker/tick",
        "commands /worker/tick",
        "redis commands /run",
        "redis CPU µs /run",
        "top redis commands /run",
        "CPU s /worker/min",
        "peak RSS MB /worker",
        "runs per worker",
        "redis CPU cores",
        "jobs' CPU cores",
        "jobs' CPU µs /run",
        "machine busy",
        "skipped",
    ]);
    for load in loads {
        let skipped: Vec<String> = load
            .skipped
            .iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect();
        let runs: Vec<String> = load
            .runs_per_worker
            .iter()
            .map(|(worker, n)| format!("{worker} {n}"))
            .collect();
        let peak = load
            .peak_rss_kb
            .iter()
            .map(|kb| format!("{:.1}", *kb as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(" / ");
        table.row(vec![
            if load.shell {
                format!("{} (sh -c)", load.jobs)
            } else {
                load.jobs.to_string()
            },
            load.ticks.to_string(),
            format!("{} of {}", load.once, load.jobs * load.ticks),
            load.duplicates.to_string(),
            load.missing.to_string(),
            ms(load.tick_to_won.p50()),
            ms(load.tick_to_won.p99()),
            ms(load.tick_to_start.p50()),
            ms(load.tick_to_start.p99()),
            if load.plain_loop.is_empty() {
                "–".to_string()
            } else {
                format!(
                    "{} / {}",
                    ms(load.plain_loop.p50()),
                    ms(load.plain_loop.p99())
                )
            },
            load.claim_round_trips
                .map_or("–".to_string(), |r| format!("{r:.1}")),
            load.release_round_trips
                .map_or("–".to_string(), |r| format!("{r:.1}")),
            load.round_trips
                .map_or("–".to_string(), |r| format!("{r:.1}")),
            load.commands.map_or("–".to_string(), |c| format!("{c:.0}")),
            load.commands_per_run
                .map_or("–".to_string(), |c| format!("{c:.1}")),
            load.redis_cpu_per_run
                .map_or("–".to_string(), |c| format!("{:.0}", c * 1e6)),
            if load.top_commands.is_empty() {
                "–".to_string()
            } else {
                load.top_commands
                    .iter()
                    .map(|(name, n)| format!("{name} {n:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            mean(&load.cpu_per_minute).map_or("–".to_string(), |c| format!("{c:.2}")),
            peak,
            runs.join(", "),
            format!("{:.2}", load.redis_cores),
            format!("{:.2}", load.jobs_cores),
            format!("{:.0}", load.job_cpu_per_run * 1e6),
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
         job's own first instruction (claim + process spawn; `sh -c`: a shell that execs the probe). \
         Plain loop: the benchmark's process starts the same jobs at the same kind of ticks one after the \
         other, with no lock, no nodes' work and no workers running: the floor of tick→start on this machine. \
         Missed: ticks of the window that never ran. Round trips and commands /worker/tick: all 5 nodes, mean \
         of the 3 workers, from counting proxies in a separate run of the same load; a claim round trip is \
         an `ACQUIRE` or `CONFIRM` pipeline, a release round trip one of releases or undos. Redis commands \
         and CPU per run: the nodes' own `INFO commandstats` / `INFO cpu`, all 5 nodes, over the window's \
         runs (claims, renewals, releases, history, membership; an `EVALSHA` and each command its script \
         calls count one each); top redis commands: the most called of them, per run. CPU: the \
         worker process (user + system), not its jobs; redis CPU: the 5 nodes together, in cores; jobs' CPU: the runs themselves (the \
         workers' reaped children: spawn, exec, the probe), in cores and per run; machine \
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
    if let Some(load) = results.loads.iter().find(|l| l.jobs == 1_000 && !l.shell) {
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
        let load = |jobs: usize| self.loads.iter().find(|l| l.jobs == jobs && !l.shell);
        let shell = self.loads.iter().find(|l| l.shell);
        for (l, limit) in [(shell, 10.0), (load(1_000), 100.0)] {
            if let Some(l) = l {
                let p99 = l.tick_to_start.p99();
                let job = if l.shell { " (sh -c job)" } else { "" };
                let floor = l.plain_loop.p99();
                let against = match (p99, floor) {
                    (Some(p99), Some(floor)) if !floor.is_zero() => format!(
                        " ({:.2}× a plain loop's {} ms)",
                        p99.as_secs_f64() / floor.as_secs_f64(),
                        ms(Some(floor))
                    ),
                    _ => String::new(),
                };
                verdicts.push(Verdict::new(
                    format!("tick→start p99 ≤ {limit} ms at {} jobs/s{job}", l.jobs),
                    format!("{} ms{against}", ms(p99)),
                    p99.map(|p| p.as_secs_f64() * 1e3 <= limit),
                ));
                if let Some(floor) = floor {
                    // Whether the target can be met here at all: the same starts with no scheduler.
                    verdicts.push(Verdict::new(
                        format!("a plain loop with no lock starts the same {} jobs{job} within {limit} ms (p99)", l.jobs),
                        format!("{} ms", ms(Some(floor))),
                        Some(floor.as_secs_f64() * 1e3 <= limit),
                    ));
                }
            }
        }
        let herd = self
            .loads
            .iter()
            .find(|l| l.shell && l.jobs == HERD_EVERY_SECOND);
        if let Some(l) = herd {
            let (p99, floor) = (l.tick_to_start.p99(), l.plain_loop.p99());
            let ratio = match (p99, floor) {
                (Some(p99), Some(floor)) if !floor.is_zero() => {
                    Some(p99.as_secs_f64() / floor.as_secs_f64())
                }
                _ => None,
            };
            verdicts.push(Verdict::new(
                format!("{} sh -c jobs due at one instant every second: tick→start p99 within 1.5× a plain loop's", l.jobs),
                format!(
                    "{} ms against {} ms: {}",
                    ms(p99),
                    ms(floor),
                    ratio.map_or("–".to_string(), |r| format!("{r:.2}×"))
                ),
                ratio.map(|r| r <= 1.5),
            ));
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
            let overlap = l
                .skipped
                .iter()
                .find(|(reason, _)| reason == "overlap")
                .map_or(0, |(_, n)| *n);
            verdicts.push(Verdict::new(
                "no tick skipped for overlap at 1000 jobs/s (each run ends long before its next tick)",
                format!("{overlap} overlap skips"),
                Some(overlap == 0),
            ));
            // Whether the load can fit at all: the jobs' own spawn and run, whatever schedules them.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let needed = l.job_cpu_per_run * l.jobs as f64;
            verdicts.push(Verdict::new(
                "the jobs alone at 1,000 runs/s leave half of the machine's cores to the nodes and workers",
                format!(
                    "{:.0} µs of CPU per run × 1,000/s = {needed:.2} of {cores} cores",
                    l.job_cpu_per_run * 1e6
                ),
                Some(needed <= cores as f64 / 2.0),
            ));
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
