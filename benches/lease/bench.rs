//! The benchmark's sections, shared by the bench target (`main.rs`) and the smoke test
//! (`tests/it/bench_smoke.rs`, which includes this file by path so that the benchmark cannot rot).
//!
//! # Layout
//! - [`nodes`]: the store's local nodes (through the `testkit` harness), killed on drop.
//! - [`proxy`]: a TCP proxy that delays a node, or counts round trips.
//! - [`cycle`]: items 1–2, the lease cycle of each contender.
//! - [`cluster`]: items 3–5, real worker processes: tick to start, scale, memory.
//! - [`batch`]: item 4 without processes: three contenders claim N jobs at one tick.
//! - [`herd`]: item 6, N jobs due at one instant on 3 workers, against the spawn limit and the peer.
//! - [`etcd`]: item 7, the etcd store beside Redis: a claim, the lock alone, a herd.
//! - [`dashboard`]: item 8, the dashboard's page of 1,000 jobs: its weight, render and store times.
//! - [`failover`]: item 9, a Sentinel group's failover and a Redis Cluster's: from the master's end to
//!   the next claim won.
//! - [`job`]: the workers' job, `probe.rs`, compiled for the run.
//! - [`ops`]: item 4c, the commands and Redis CPU of each store operation (the cost model).
//! - [`peer`]: the peer of items 4b and 6, one `SET NX PX` per (job, tick) on one node.
//! - [`workers`]: worker processes, their `/proc` figures, ledgers and logs.
//! - [`report`]: the tables and target checks of items 1–2.
//! - [`stats`]: percentiles and the Markdown tables.
//!
//! Child modules are named by explicit paths so that they resolve the same way from both includers.
#![allow(dead_code)]

#[path = "batch.rs"]
pub mod batch;
#[path = "cluster.rs"]
pub mod cluster;
#[path = "cycle.rs"]
pub mod cycle;
#[path = "dashboard.rs"]
pub mod dashboard;
#[path = "etcd.rs"]
pub mod etcd;
#[path = "failover.rs"]
pub mod failover;
#[path = "herd.rs"]
pub mod herd;
#[path = "job.rs"]
pub mod job;
#[path = "nodes.rs"]
pub mod nodes;
#[path = "ops.rs"]
pub mod ops;
#[path = "peer.rs"]
pub mod peer;
#[path = "proxy.rs"]
pub mod proxy;
#[path = "report.rs"]
pub mod report;
#[path = "stats.rs"]
pub mod stats;
#[path = "workers.rs"]
pub mod workers;

use std::path::PathBuf;
use std::time::Duration;

use cycle::{Contender, Kind, Plan, Series};
use nodes::{Backend, Cluster};
use proxy::Proxy;
use report::{faulty_table, lease_table, lease_verdicts};
use stats::Verdict;

/// The node that is made slow or hung in item 2 (the last of the five).
const FAULTY: usize = 4;
/// How much slower the slow node answers.
pub const SLOW_DELAY: Duration = Duration::from_millis(100);

/// What to run and how long.
#[derive(Debug, Clone)]
pub struct Options {
    /// ~1 s per section instead of minutes: for the smoke test, not for figures.
    pub smoke: bool,
    /// Which items of the issue to run (1–9).
    pub sections: Vec<u8>,
    /// Measured cycles per contender on the healthy cluster (item 1).
    pub cycles: usize,
    /// Which contenders items 1–2 measure (default all), e.g. only redcron's lease for profiling.
    pub contenders: Vec<Kind>,
    /// Run items 1–2 on a current-thread runtime instead of the worker's multi-threaded one.
    pub current_thread: bool,
    /// The `redcron` binary, for items 3–5.
    pub worker: Option<PathBuf>,
    /// How a job records its start: `argv` prefix to which the ledger path is appended.
    pub probe: Vec<String>,
    /// The herd of item 7, on both stores (item 6's is 10,000 jobs on Redis).
    pub etcd_herd: usize,
    /// The stores item 7 runs on, by name (`redis`, `etcd`, `postgres`, `mariadb`, `zookeeper`); empty:
    /// all of them. Redis, the peer every ratio is taken to, always runs first.
    pub stores: Vec<String>,
}

impl Options {
    /// The plans of the healthy, slow and hung scenarios.
    fn plans(&self) -> (Plan, Plan, Plan) {
        let second = Duration::from_secs(1);
        if self.smoke {
            // Enough to run every path once; a peer stops at its first failure.
            let quick = Plan {
                warm: 1,
                cycles: 2,
                call_timeout: Duration::from_millis(400),
                budget: second / 2,
                max_refusals: 1,
            };
            let healthy = Plan {
                cycles: self.cycles.min(20),
                ..quick
            };
            return (healthy, quick, quick);
        }
        let healthy = Plan {
            warm: 20,
            cycles: self.cycles,
            call_timeout: 3 * second,
            budget: 60 * second,
            max_refusals: 10,
        };
        let faulty = Plan {
            warm: 3,
            cycles: 300,
            budget: 15 * second,
            ..healthy
        };
        (healthy, faulty, faulty)
    }
}

/// Everything one run measured.
#[derive(Debug, Default)]
pub struct Report {
    /// The Markdown the benchmark prints.
    pub text: String,
    pub verdicts: Vec<Verdict>,
    /// `(scenario, series)` of items 1–2.
    pub lease: Vec<(String, Vec<Series>)>,
    pub cluster: Option<cluster::Results>,
    /// Item 4b: the lock alone at scale.
    pub batches: Vec<batch::Batch>,
    /// Item 4c: the cost of each store operation.
    pub ops: Vec<ops::Op>,
    /// Item 6: the herd.
    pub herd: Option<herd::Herd>,
    /// Item 7: the etcd store beside Redis.
    pub versus: Option<etcd::Versus>,
    /// Item 8: the dashboard's page of 1,000 jobs.
    pub dashboard: Option<dashboard::Page>,
    /// Item 9: a Sentinel group's failovers and a Redis Cluster's.
    pub failovers: Option<failover::Failovers>,
}

/// Runs the selected sections; `print` receives each section's Markdown as soon as it is done.
pub fn run(options: &Options, print: &mut dyn FnMut(&str)) -> Result<Report, String> {
    let mut report = Report::default();
    let mut emit = |report: &mut Report, text: String| {
        print(&text);
        report.text.push_str(&text);
    };
    emit(&mut report, machine());
    if options.sections.iter().any(|s| *s == 1 || *s == 2) {
        let mut nodes = Backend::Redis.start_nodes(5);
        // The worker's runtime (multi-threaded, one thread per core), unless asked otherwise.
        let mut builder = if options.current_thread {
            tokio::runtime::Builder::new_current_thread()
        } else {
            tokio::runtime::Builder::new_multi_thread()
        };
        let runtime = builder
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let (healthy, slow, hung) = options.plans();
        let scenarios: Vec<&str> = if options.sections.contains(&2) {
            vec!["healthy", "slow", "hung"]
        } else {
            vec!["healthy"]
        };
        for scenario in scenarios {
            let plan = match scenario {
                "healthy" => healthy,
                "slow" => slow,
                _ => hung,
            };
            let series = runtime.block_on(lease_scenario(
                &mut nodes,
                scenario,
                &options.contenders,
                plan,
            ))?;
            report.lease.push((scenario.to_string(), series));
            if scenario == "healthy" {
                let text = lease_table(&report.lease[0].1, plan);
                emit(&mut report, text);
            }
        }
        if report.lease.len() > 1 {
            let text = faulty_table(&report.lease, slow.call_timeout);
            emit(&mut report, text);
        }
        let verdicts = lease_verdicts(&report.lease, slow.call_timeout);
        report.verdicts.extend(verdicts);
    }
    if options.sections.iter().any(|s| (3..=5).contains(s)) {
        let worker = options
            .worker
            .clone()
            .ok_or("items 3-5 need the redcron binary")?;
        let results = cluster::run(
            &worker,
            &options.probe,
            &options.sections,
            options.smoke,
            &mut |text: &str| emit(&mut report, text.to_string()),
        )?;
        report.verdicts.extend(results.verdicts());
        report.cluster = Some(results);
    }
    if options.sections.contains(&4) {
        let (sizes, ticks, cost_jobs): (&[usize], usize, usize) = if options.smoke {
            (&[10], 2, 10)
        } else {
            (&[10, 1_000, 10_000], 5, 1_000)
        };
        let (batches, ops) = batch::run(sizes, ticks, cost_jobs, &mut |text: &str| {
            emit(&mut report, text.to_string())
        })?;
        report.verdicts.extend(batch::verdicts(&batches));
        report.batches = batches;
        report.ops = ops;
    }
    if options.sections.contains(&6) {
        let worker = options
            .worker
            .clone()
            .ok_or("item 6 needs the redcron binary")?;
        let jobs = if options.smoke { 20 } else { 10_000 };
        let herd = herd::run(&worker, &options.probe, jobs, &mut |text: &str| {
            emit(&mut report, text.to_string())
        })?;
        report.verdicts.extend(herd::verdicts(&herd));
        report.herd = Some(herd);
    }
    if options.sections.contains(&7) {
        let worker = options
            .worker
            .clone()
            .ok_or("item 7 needs the redcron binary")?;
        let sizes = if options.smoke {
            etcd::Sizes {
                claims: 5,
                race_jobs: 10,
                race_ticks: 2,
                herd: options.etcd_herd.min(20),
                herd_race_ticks: 1,
                // One tick of each store's steady phase shows it runs: no figure is checked.
                steady_seconds: 1,
                settle_seconds: 1,
            }
        } else {
            etcd::Sizes {
                claims: 300,
                race_jobs: 10,
                race_ticks: 20,
                herd: options.etcd_herd,
                herd_race_ticks: 3,
                steady_seconds: 10,
                settle_seconds: 2,
            }
        };
        let versus = etcd::run(
            &worker,
            &options.probe,
            sizes,
            &options.stores,
            &mut |text: &str| emit(&mut report, text.to_string()),
        )?;
        report.verdicts.extend(etcd::verdicts(&versus));
        report.versus = Some(versus);
    }
    if options.sections.contains(&8) {
        let worker = options
            .worker
            .clone()
            .ok_or("item 8 needs the redcron binary")?;
        let size = if options.smoke {
            dashboard::Size::smoke()
        } else {
            dashboard::Size::full()
        };
        let page = dashboard::run(&worker, size, &mut |text: &str| {
            emit(&mut report, text.to_string())
        })?;
        report.verdicts.extend(dashboard::verdicts(&page));
        report.dashboard = Some(page);
    }
    if options.sections.contains(&9) {
        let size = if options.smoke {
            failover::Size::smoke()
        } else {
            failover::Size::full()
        };
        let failovers = failover::run(size, &mut |text: &str| emit(&mut report, text.to_string()))?;
        report.verdicts.extend(failover::verdicts(&failovers));
        report.failovers = Some(failovers);
    }
    let text = format!("\n## Targets\n\n{}", stats::verdicts(&report.verdicts));
    emit(&mut report, text);
    Ok(report)
}

/// One scenario of items 1–2: connect every contender, warm up, (fault), measure, (heal).
async fn lease_scenario(
    nodes: &mut Cluster,
    scenario: &str,
    kinds: &[Kind],
    plan: Plan,
) -> Result<Vec<Series>, String> {
    let mut urls = nodes.urls();
    let _proxy = if scenario == "slow" {
        let proxy = Proxy::start(nodes.port(FAULTY), SLOW_DELAY, None)
            .map_err(|e| format!("proxy: {e}"))?;
        urls[FAULTY] = proxy.url();
        Some(proxy)
    } else {
        None
    };
    let mut contenders = Vec::new();
    for &kind in kinds {
        contenders.push(
            Contender::connect(kind, &urls)
                .await
                .map_err(|e| format!("{}: {e}", kind.name()))?,
        );
    }
    let tag = format!("{scenario}-{}", std::process::id());
    cycle::warm_up(&mut contenders, plan.warm, &tag, plan.call_timeout).await;
    if scenario == "hung" {
        nodes.stop(FAULTY);
    }
    let series = cycle::measure(&mut contenders, plan, &tag).await;
    if scenario == "hung" {
        nodes.cont(FAULTY);
    }
    // The redlock thread may still be inside a call to the hung node; it ends once the node answers.
    drop(contenders);
    Ok(series)
}

/// The machine the figures come from: cores, CPU model, Redis version, kernel.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "redis-server not found".to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "# redcron benchmark\n\nMachine: {cores} cores, {cpu}; Linux {}; {redis}; 5 local nodes on loopback, \
         `--save \"\" --appendonly no`. Load average at start: {}.\n",
        kernel.trim(),
        load.join(" ")
    )
}
