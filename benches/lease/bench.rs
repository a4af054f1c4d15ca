//! The benchmark's sections, shared by the bench target (`main.rs`) and the smoke test
//! (`tests/it/bench_smoke.rs`, which includes this file by path so that the benchmark cannot rot).
//!
//! # Layout
//! - [`nodes`]: local `redis-server` nodes, killed on drop.
//! - [`proxy`]: a TCP proxy that delays a node, or counts round trips.
//! - [`cycle`]: items 1–2, the lease cycle of each contender.
//! - [`cluster`]: items 3–5, real worker processes: tick to start, scale, memory.
//! - [`batch`]: item 4 without processes: three contenders claim N jobs at one tick.
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
#[path = "nodes.rs"]
pub mod nodes;
#[path = "proxy.rs"]
pub mod proxy;
#[path = "stats.rs"]
pub mod stats;

use std::path::PathBuf;
use std::time::Duration;

use cycle::{Contender, Kind, Plan, Series};
use nodes::Nodes;
use proxy::Proxy;
use stats::{ms, quotient, ratio, Table, Verdict};

/// The node that is made slow or hung in item 2 (the last of the five).
const FAULTY: usize = 4;
/// How much slower the slow node answers.
pub const SLOW_DELAY: Duration = Duration::from_millis(100);

/// What to run and how long.
#[derive(Debug, Clone)]
pub struct Options {
    /// ~1 s per section instead of minutes: for the smoke test, not for figures.
    pub smoke: bool,
    /// Which items of the issue to run (1–5).
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
        let nodes = Nodes::start(5).map_err(|e| format!("cannot start redis-server nodes: {e}"))?;
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
            let series =
                runtime.block_on(lease_scenario(&nodes, scenario, &options.contenders, plan))?;
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
        let (sizes, ticks): (&[usize], usize) = if options.smoke {
            (&[10], 2)
        } else {
            (&[10, 1_000, 10_000], 5)
        };
        let batches = batch::run(sizes, ticks, &mut |text: &str| {
            emit(&mut report, text.to_string())
        })?;
        report.verdicts.extend(batch::verdicts(&batches));
        report.batches = batches;
    }
    let text = format!("\n## Targets\n\n{}", stats::verdicts(&report.verdicts));
    emit(&mut report, text);
    Ok(report)
}

/// One scenario of items 1–2: connect every contender, warm up, (fault), measure, (heal).
async fn lease_scenario(
    nodes: &Nodes,
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
        nodes.hang(FAULTY);
    }
    let series = cycle::measure(&mut contenders, plan, &tag).await;
    if scenario == "hung" {
        nodes.resume(FAULTY);
    }
    // The redlock thread may still be inside a call to the hung node; it ends once the node answers.
    drop(contenders);
    Ok(series)
}

fn find(series: &[Series], kind: Kind) -> Option<&Series> {
    series.iter().find(|s| s.kind == kind)
}

fn notes(s: &Series) -> String {
    let mut notes = Vec::new();
    if s.timeouts > 0 {
        notes.push(format!("{} timeout", s.timeouts));
    }
    if s.refusals > 0 {
        notes.push(format!(
            "{} failed: {}",
            s.refusals,
            s.first_refusal.as_deref().unwrap_or("")
        ));
    }
    if let Some(stopped) = &s.stopped {
        notes.push(format!("stopped: {stopped}"));
    }
    notes.join("; ")
}

fn lease_table(series: &[Series], plan: Plan) -> String {
    let floor = find(series, Kind::Floor).map(|s| (s.samples.p50(), s.samples.p99()));
    let (floor50, floor99) = floor.unwrap_or((None, None));
    let fan_out50 = find(series, Kind::FanOut).and_then(|s| s.samples.p50());
    let mut table = Table::new(&[
        "contender",
        "cycles",
        "p50 ms",
        "p99 ms",
        "cycles/s",
        "p50 × floor",
        "p99 × floor",
        "p50 × fan-out",
        "notes",
    ]);
    for s in series {
        table.row(vec![
            s.kind.name().to_string(),
            s.samples.len().to_string(),
            ms(s.samples.p50()),
            ms(s.samples.p99()),
            s.samples
                .per_second()
                .map_or("–".to_string(), |r| format!("{r:.0}")),
            ratio(s.samples.p50(), floor50),
            ratio(s.samples.p99(), floor99),
            ratio(s.samples.p50(), fan_out50),
            notes(s),
        ]);
    }
    format!(
        "\n## 1. Lease cycle: acquire + release of a fresh key, one contender, 5 nodes\n\n\
         {} cycles per contender, interleaved; each call bounded by {} s. The fan-out row is not a lock: \
         it is the same SET NX PX + DEL sent to all 5 nodes at once, the least any Redlock on this client \
         pays for its two round trips to five nodes.\n\n{}",
        plan.cycles,
        plan.call_timeout.as_secs_f64(),
        table.render()
    )
}

/// A series' p99 for comparisons: a timed-out series counts as at least the call timeout.
fn effective_p99(s: &Series, timeout: Duration) -> (Option<Duration>, bool) {
    if s.timeouts > 0 {
        (Some(timeout), true)
    } else {
        (s.samples.p99(), false)
    }
}

fn faulty_table(scenarios: &[(String, Vec<Series>)], timeout: Duration) -> String {
    let healthy = &scenarios[0].1;
    let mut table = Table::new(&[
        "node 5",
        "contender",
        "cycles",
        "p50 ms",
        "p99 ms",
        "p99 × healthy",
        "p99 ÷ redcron lease p99",
        "notes",
    ]);
    for (scenario, series) in scenarios {
        let lease = find(series, Kind::Lease).and_then(|s| s.samples.p99());
        for s in series {
            let (p99, bound) = effective_p99(s, timeout);
            let p99_text = if bound {
                format!("> {}", ms(p99))
            } else {
                ms(p99)
            };
            let versus = quotient(p99, lease).map_or("–".to_string(), |q| {
                format!("{}{q:.1}", if bound { "> " } else { "" })
            });
            let label = match scenario.as_str() {
                "healthy" => "healthy".to_string(),
                "slow" => format!("+{} ms", SLOW_DELAY.as_millis()),
                _ => "hung (SIGSTOP)".to_string(),
            };
            table.row(vec![
                label,
                s.kind.name().to_string(),
                s.samples.len().to_string(),
                ms(s.samples.p50()),
                p99_text,
                ratio(
                    s.samples.p99(),
                    find(healthy, s.kind).and_then(|h| h.samples.p99()),
                ),
                versus,
                notes(s),
            ]);
        }
    }
    format!(
        "\n## 2. One slow node: node 5 of 5 behind a proxy adding {} ms, or hung by SIGSTOP\n\n\
         Cycles as in item 1; a contender stops at its first call that does not return within {} s, or when \
         it has spent its time budget.\n\n{}",
        SLOW_DELAY.as_millis(),
        timeout.as_secs_f64(),
        table.render()
    )
}

fn lease_verdicts(scenarios: &[(String, Vec<Series>)], timeout: Duration) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    let Some((_, healthy)) = scenarios.first() else {
        return verdicts;
    };
    let p50 = |kind| find(healthy, kind).and_then(|s| s.samples.p50());
    let floor = p50(Kind::Floor);
    let fan_out = p50(Kind::FanOut);
    for (kind, limit) in [(Kind::Lease, 1.3), (Kind::Claim, 2.5)] {
        let q = quotient(p50(kind), floor);
        verdicts.push(Verdict::new(
            format!("{} p50 ≤ {limit}× floor", kind.name()),
            q.map_or("–".to_string(), |q| format!("{q:.2}×")),
            q.map(|q| q <= limit),
        ));
        let q = quotient(p50(kind), fan_out);
        verdicts.push(Verdict::new(
            format!(
                "(same, against the 5-node fan-out) {} p50 ≤ {limit}× fan-out",
                kind.name()
            ),
            q.map_or("–".to_string(), |q| format!("{q:.2}×")),
            q.map(|q| q <= limit),
        ));
        for peer in [Kind::Rslock, Kind::Redlock] {
            let q = quotient(p50(kind), p50(peer));
            verdicts.push(Verdict::new(
                format!("{} p50 ≤ {} p50", kind.name(), peer.name()),
                q.map_or("–".to_string(), |q| format!("{q:.2}×")),
                q.map(|q| q <= 1.0),
            ));
        }
    }
    for (scenario, series) in &scenarios[1..] {
        for kind in [Kind::Lease, Kind::Claim] {
            let ours = find(series, kind).and_then(|s| s.samples.p99());
            let before = find(healthy, kind).and_then(|s| s.samples.p99());
            let q = quotient(ours, before);
            // The floor's own change says how much of it is the machine (noise, the proxy's work).
            let floor_change = quotient(
                find(series, Kind::Floor).and_then(|s| s.samples.p99()),
                find(healthy, Kind::Floor).and_then(|s| s.samples.p99()),
            );
            verdicts.push(Verdict::new(
                format!(
                    "{scenario} node: {} p99 within 1.5× of healthy",
                    kind.name()
                ),
                q.map_or("–".to_string(), |q| {
                    let floor = floor_change.map_or("–".to_string(), |f| format!("{f:.2}×"));
                    format!("{q:.2}× ({} ms; the floor's p99 moved {floor})", ms(ours))
                }),
                q.map(|q| q <= 1.5),
            ));
            for peer in [Kind::Rslock, Kind::Redlock] {
                let Some(theirs) = find(series, peer) else {
                    continue;
                };
                let (p99, bound) = effective_p99(theirs, timeout);
                let q = quotient(p99, ours);
                verdicts.push(Verdict::new(
                    format!(
                        "{scenario} node: {} p99 ≥ 10× better than {}",
                        kind.name(),
                        peer.name()
                    ),
                    q.map_or("–".to_string(), |q| {
                        format!("{}{q:.1}×", if bound { "> " } else { "" })
                    }),
                    q.map(|q| q >= 10.0),
                ));
            }
        }
    }
    verdicts
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
