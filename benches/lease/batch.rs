//! Item 4, the lock alone: three contenders in this process claim the same N jobs at the same tick.
//!
//! The workers of items 3–4 also spawn a process per run, and on a small machine spawning 1,000 processes a
//! second is itself most of the load. Here the same race runs without processes: three [`RedisStore`]s
//! (one per contender, each with its own connections, each behind its own counting proxies) claim N jobs
//! in the workers' claim order ([`redcron::lock::order`]), the winners release, and the next tick follows. This shows what the
//! lock costs per tick as N grows — latency, round trips, Redis CPU — and that each (job, tick) is won once.
//!
//! The same sizes race on the [`super::peer`] too (one node, one `SET NX PX` per contender and job), and
//! the table prints redcron's claim time and commands per claim as a multiple of the peer's.

use std::time::{Duration, Instant};

use std::sync::Mutex;

use futures_util::future::join_all;
use redcron::lock::{order, ClaimOutcome, ClaimRequest, Overlap};
use redcron::schedule::Tick;
use redcron::store::redis::RedisStore;
use redcron::store::Store;

use super::cycle::settings;
use super::nodes::{Backend, Cluster, Counters};
use super::peer::{self, PeerRace};
use super::proxy::Proxy;
use super::stats::{ms, quotient, Samples, Table, Verdict};

use super::peer::CONTENDERS;

/// One batch size's results.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub jobs: usize,
    pub ticks: usize,
    /// Time from the start of the race to the last contender's last answer and the releases, per tick.
    pub race: Samples,
    /// From the tick until every job's winning outcome was known: the time the claims took to settle.
    pub claim: Samples,
    /// Ticks × jobs won exactly once, more than once, never.
    pub once: usize,
    pub twice: usize,
    pub unclaimed: usize,
    /// For the (job, tick)s won by nobody: what the contenders were told (each contender's last outcome
    /// for the job, [`outcome_label`], joined), and how many (job, tick)s got that.
    pub undecided: std::collections::BTreeMap<String, usize>,
    /// Per contender and tick, all 5 nodes: claim round trips (`ACQUIRE`/`CONFIRM` pipelines) and commands.
    pub claim_round_trips: f64,
    pub commands: f64,
    /// Redis CPU per tick, all 5 nodes (seconds).
    pub redis_cpu_per_tick: f64,
    /// From the nodes' own counters (`INFO commandstats`, `INFO cpu`), all 5 nodes, per (job, tick)
    /// settled, releases included.
    pub commands_per_claim: f64,
    pub redis_cpu_per_claim: f64,
    /// The peer's race for the same jobs and ticks.
    pub peer: Option<PeerRace>,
}

/// Runs `ticks` races of each batch size on fresh nodes, then the cost model of item 4c on `cost_jobs`.
pub fn run(
    sizes: &[usize],
    ticks: usize,
    cost_jobs: usize,
    print: &mut dyn FnMut(&str),
) -> Result<(Vec<Batch>, Vec<super::ops::Op>), String> {
    let nodes = Backend::Redis.start_nodes(5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let mut batches = Vec::new();
    for &jobs in sizes {
        let mut batch = runtime.block_on(race(&nodes, jobs, ticks))?;
        let url = &nodes.urls()[0];
        batch.peer = Some(runtime.block_on(peer::race(url, jobs, ticks, || nodes.usage(0)))?);
        batches.push(batch);
    }
    print(&table(&batches));
    let ops = runtime.block_on(super::ops::measure(&nodes, cost_jobs))?;
    print(&super::ops::table(&ops));
    Ok((batches, ops))
}

async fn race(nodes: &Cluster, jobs: usize, ticks: usize) -> Result<Batch, String> {
    let shas = super::workers::script_shas();
    let mut proxies = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..CONTENDERS {
        let mine: Vec<Proxy> = (0..nodes.len())
            .map(|i| Proxy::start(nodes.port(i), Duration::ZERO, Some(shas.clone())))
            .collect::<std::io::Result<_>>()
            .map_err(|e| format!("proxy: {e}"))?;
        let urls: Vec<String> = mine.iter().map(Proxy::url).collect();
        let store = RedisStore::new(&urls, settings()).map_err(|e| e.to_string())?;
        stores.push(Store::Redis(store));
        proxies.push(mine);
    }
    let names: Vec<String> = (0..jobs).map(|j| format!("b{jobs}-{j}")).collect();
    // One warm-up race: connections, script caches.
    race_once(&stores, &names, Tick(1)).await;
    let counts = |proxies: &[Vec<Proxy>]| -> (u64, u64) {
        let mut total = (0, 0);
        for proxy in proxies.iter().flatten() {
            let kinds = proxy.counts();
            total.0 += kinds.iter().map(|(c, _)| c).sum::<u64>();
            total.1 += kinds.iter().take(2).map(|(_, r)| r).sum::<u64>();
        }
        total
    };
    let redis_cpu = || {
        (0..nodes.len())
            .map(|i| super::workers::cpu_ticks(nodes.pid(i).unwrap_or(0)))
            .sum::<u64>()
    };
    let (commands_before, trips_before) = counts(&proxies);
    let cpu_before = redis_cpu();
    let usage_before = nodes.total_usage();
    let mut batch = race_ticks(&stores, &names, ticks).await;
    let (commands_after, trips_after) = counts(&proxies);
    let per = (ticks * CONTENDERS) as f64;
    batch.commands = (commands_after - commands_before) as f64 / per;
    batch.claim_round_trips = (trips_after - trips_before) as f64 / per;
    let clock_ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    batch.redis_cpu_per_tick = (redis_cpu() - cpu_before) as f64 / clock_ticks / ticks as f64;
    let usage = usage_before.until(nodes.total_usage());
    let claims = (jobs * ticks).max(1) as f64;
    batch.commands_per_claim = usage.commands as f64 / claims;
    batch.redis_cpu_per_claim = usage.cpu / claims;
    drop(stores);
    Ok(batch)
}

/// `ticks` races of every store for all of `names` (ticks 2, 3, …; tick 1 is the warm-up's): the
/// claim and race times and how often each (job, tick) was won.
pub async fn race_ticks(stores: &[Store], names: &[String], ticks: usize) -> Batch {
    let mut batch = Batch {
        jobs: names.len(),
        ticks,
        ..Batch::default()
    };
    for t in 0..ticks {
        let started = Instant::now();
        let (won, claimed, told) = race_once(stores, names, Tick(1_000 * (t as i64 + 2))).await;
        batch.race.push(started.elapsed());
        batch.claim.push(claimed);
        for (count, told) in won.into_iter().zip(told) {
            match count {
                0 => {
                    batch.unclaimed += 1;
                    *batch.undecided.entry(told).or_default() += 1;
                }
                1 => batch.once += 1,
                _ => batch.twice += 1,
            }
        }
    }
    batch
}

/// When one contender claims which jobs (by index in `names`) after the tick.
type Wave = (Duration, Vec<(usize, ClaimRequest)>);

/// All contenders race every job at `tick` in the workers' claim order ([`redcron::lock::order`]: each
/// ranks the contenders by a hash of (contender, job, tick) and claims a job `rank × order::spread` after
/// the tick); winners release. Returns, per job, how many won, and how long the claims took to settle:
/// until every job's winning outcome was known (the backups' later answers, which find the jobs claimed,
/// delay no job); and per job what the contenders were last told, in contender order.
pub async fn race_once(
    stores: &[Store],
    names: &[String],
    tick: Tick,
) -> (Vec<usize>, Duration, Vec<String>) {
    let started = Instant::now();
    let members: Vec<String> = (0..stores.len()).map(|i| format!("c{i}")).collect();
    let spread = order::spread(settings().retry_delay, names.len());
    // Each contender is a claimant of its own for every job, grouped by when it claims them.
    let plans: Vec<Vec<Wave>> = members
        .iter()
        .map(|id| {
            let mut groups: std::collections::BTreeMap<Duration, Vec<(usize, ClaimRequest)>> =
                std::collections::BTreeMap::new();
            for (index, job) in names.iter().enumerate() {
                let delay = order::delay(Some(&members), id, job, tick, spread);
                let request = ClaimRequest::new(id, job, tick, Overlap::Skip, "bench");
                groups.entry(delay).or_default().push((index, request));
            }
            groups.into_iter().collect()
        })
        .collect();
    let won_at: Mutex<Vec<Option<Duration>>> = Mutex::new(vec![None; names.len()]);
    let leases: Mutex<Vec<(usize, redcron::lock::Lease)>> = Mutex::new(Vec::new());
    let told: Mutex<Vec<Vec<String>>> =
        Mutex::new(vec![vec![String::new(); stores.len()]; names.len()]);
    let mut won = vec![0; names.len()];
    let (won_at_ref, leases_ref, told_ref) = (&won_at, &leases, &told);
    join_all(
        stores
            .iter()
            .enumerate()
            .zip(&plans)
            .flat_map(|((contender, store), groups)| {
                groups.iter().map(move |(delay, group)| async move {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(started + *delay))
                        .await;
                    let requests: Vec<ClaimRequest> =
                        group.iter().map(|(_, r)| r.clone()).collect();
                    store
                        .claim_each(&requests, |at, outcome| {
                            if let Ok(mut told) = told_ref.lock() {
                                told[group[at].0][contender] = outcome_label(&outcome);
                            }
                            if let ClaimOutcome::Won(lease) = outcome {
                                let job = group[at].0;
                                if let Ok(mut won_at) = won_at_ref.lock() {
                                    won_at[job].get_or_insert(started.elapsed());
                                }
                                if let Ok(mut leases) = leases_ref.lock() {
                                    leases.push((contender, lease));
                                }
                            }
                        })
                        .await;
                })
            }),
    )
    .await;
    let settled = won_at
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|at| at.unwrap_or_else(|| started.elapsed()))
        .max()
        .unwrap_or_default();
    let leases = leases.into_inner().unwrap_or_default();
    for (_, lease) in &leases {
        if let Some(index) = names.iter().position(|name| *name == lease.job) {
            won[index] += 1;
        }
    }
    join_all(
        leases
            .iter()
            .map(|(contender, lease)| stores[*contender].release(lease)),
    )
    .await;
    let told = told.into_inner().unwrap_or_default();
    let told = told.into_iter().map(|each| each.join(" / ")).collect();
    (won, settled, told)
}

/// An outcome in a few words: its kind, and for `no_quorum` the first reason given.
fn outcome_label(outcome: &ClaimOutcome) -> String {
    match outcome {
        ClaimOutcome::Won(_) => "won".to_string(),
        ClaimOutcome::AlreadyClaimed { .. } => "already_claimed".to_string(),
        ClaimOutcome::Busy { .. } => "busy".to_string(),
        ClaimOutcome::Contended { .. } => "contended".to_string(),
        ClaimOutcome::NoQuorum(failure) => match failure.failures.first() {
            Some((_, why)) => format!("no_quorum ({})", why.chars().take(60).collect::<String>()),
            None => "no_quorum".to_string(),
        },
        ClaimOutcome::Paused(_) => "paused".to_string(),
        ClaimOutcome::Refused(_) => "refused".to_string(),
        ClaimOutcome::Fault(fault) => fault.reason().to_string(),
    }
}

fn table(batches: &[Batch]) -> String {
    let mut table = Table::new(&[
        "jobs per tick",
        "ticks",
        "won exactly once",
        "twice",
        "unclaimed",
        "claim p50 ms",
        "race p50 ms",
        "race max ms",
        "claim round trips /contender/tick",
        "commands /contender/tick",
        "redis commands /claim",
        "redis CPU µs /claim",
        "peer settle p50 ms",
        "peer commands /claim",
        "peer CPU µs /claim",
        "claim p50 ÷ peer",
        "commands ÷ peer",
    ]);
    for b in batches {
        let peer = b.peer.as_ref();
        let or_dash = |value: Option<String>| value.unwrap_or_else(|| "–".to_string());
        table.row(vec![
            b.jobs.to_string(),
            b.ticks.to_string(),
            format!("{} of {}", b.once, b.jobs * b.ticks),
            b.twice.to_string(),
            b.unclaimed.to_string(),
            ms(b.claim.p50()),
            ms(b.race.p50()),
            ms(b.race.percentile(100.0)),
            format!("{:.1}", b.claim_round_trips),
            format!("{:.0}", b.commands),
            format!("{:.1}", b.commands_per_claim),
            format!("{:.1}", b.redis_cpu_per_claim * 1e6),
            or_dash(peer.map(|p| ms(p.settle.p50()))),
            or_dash(peer.map(|p| format!("{:.1}", p.commands_per_claim()))),
            or_dash(peer.map(|p| format!("{:.1}", p.cpu_per_claim() * 1e6))),
            or_dash(
                quotient(b.claim.p50(), peer.and_then(|p| p.settle.p50()))
                    .map(|q| format!("{q:.1}×")),
            ),
            or_dash(peer.map(|p| {
                format!(
                    "{:.1}×",
                    b.commands_per_claim / p.commands_per_claim().max(1e-9)
                )
            })),
        ]);
    }
    format!(
        "\n## 4b. The lock alone at scale: 3 contenders race for N jobs at one tick, in one process\n\n\
         No processes are spawned: each contender is a `RedisStore` behind its own counting proxies; the \
         winners release before the next tick. The contenders claim in the workers' order (each job first \
         by one contender, the others backing it up one and two spreads later: 50 ms plus 0.8 ms per job of the tick). Claim: from the tick until every \
         job's winning outcome is known; race: until the last contender's last answer (the backups' \
         included) and the winners' releases (split votes retried as configured: retries 1, retry_delay \
         200 ms). Redis commands and CPU per claim: the 5 nodes' own counters \
         (`INFO commandstats`, `INFO cpu`), releases included, per (job, tick). Peer: one node, one \
         `SET NX PX` per contender and job (ShedLock, gocron), all sent at once, no release; its figures \
         are that one node's.\n\n{}",
        table.render()
    )
}

pub fn verdicts(batches: &[Batch]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for b in batches {
        verdicts.push(Verdict::new(
            format!(
                "lock alone: each of {} jobs won exactly once per tick",
                b.jobs
            ),
            format!(
                "{} of {}, {} twice, {} unclaimed",
                b.once,
                b.jobs * b.ticks,
                b.twice,
                b.unclaimed
            ),
            Some(b.twice == 0 && b.unclaimed == 0),
        ));
        let limit = match b.jobs {
            10 => Some(5.0),
            10_000 => Some(1_000.0),
            _ => None,
        };
        if let Some(limit) = limit {
            let p50 = b.claim.p50();
            verdicts.push(Verdict::new(
                format!(
                    "lock alone: 3 contenders settle {} jobs at one tick, p50 ≤ {limit} ms",
                    b.jobs
                ),
                format!("{} ms", ms(p50)),
                p50.map(|p| p.as_secs_f64() * 1e3 <= limit),
            ));
        }
    }
    if batches.len() > 1 {
        let trips: Vec<f64> = batches.iter().map(|b| b.claim_round_trips).collect();
        let (low, high) = (
            trips.iter().copied().fold(f64::MAX, f64::min),
            trips.iter().copied().fold(0.0, f64::max),
        );
        let listed: Vec<String> = batches
            .iter()
            .map(|b| format!("{:.1} at {}", b.claim_round_trips, b.jobs))
            .collect();
        verdicts.push(Verdict::new(
            "lock alone: claim round trips per contender per tick independent of the job count (within 1.5×)",
            listed.join(", "),
            Some(high <= low * 1.5),
        ));
    }
    verdicts
}
