//! Item 4, the lock alone: three contenders in this process claim the same N jobs at the same tick.
//!
//! The workers of items 3–4 also spawn a process per run, and on a small machine spawning 1,000 processes a
//! second is itself most of the load. Here the same race runs without processes: three [`RedisStore`]s
//! (one per contender, each with its own connections, each behind its own counting proxies) call
//! `claim_many` for N jobs at once, the winners release, and the next tick follows. This shows what the
//! lock costs per tick as N grows — latency, round trips, Redis CPU — and that each (job, tick) is won once.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redcron::lock::{ClaimOutcome, ClaimRequest, Overlap};
use redcron::schedule::Tick;
use redcron::store::redis::RedisStore;

use super::cycle::settings;
use super::nodes::Nodes;
use super::proxy::Proxy;
use super::stats::{ms, Samples, Table, Verdict};

const CONTENDERS: usize = 3;

/// One batch size's results.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub jobs: usize,
    pub ticks: usize,
    /// Time from the start of the race to the last contender's answer, per tick.
    pub race: Samples,
    /// Ticks × jobs won exactly once, more than once, never.
    pub once: usize,
    pub twice: usize,
    pub unclaimed: usize,
    /// Per contender and tick, all 5 nodes: claim round trips (`ACQUIRE`/`CONFIRM` pipelines) and commands.
    pub claim_round_trips: f64,
    pub commands: f64,
    /// Redis CPU per tick, all 5 nodes (seconds).
    pub redis_cpu_per_tick: f64,
}

/// Runs `ticks` races of each batch size on fresh nodes.
pub fn run(
    sizes: &[usize],
    ticks: usize,
    print: &mut dyn FnMut(&str),
) -> Result<Vec<Batch>, String> {
    let nodes = Nodes::start(5).map_err(|e| format!("cannot start redis-server nodes: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let mut batches = Vec::new();
    for &jobs in sizes {
        batches.push(runtime.block_on(race(&nodes, jobs, ticks))?);
    }
    print(&table(&batches));
    Ok(batches)
}

async fn race(nodes: &Nodes, jobs: usize, ticks: usize) -> Result<Batch, String> {
    let shas = super::workers::script_shas();
    let mut proxies = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..CONTENDERS {
        let mine: Vec<Proxy> = (0..nodes.len())
            .map(|i| Proxy::start(nodes.port(i), Duration::ZERO, Some(shas.clone())))
            .collect::<std::io::Result<_>>()
            .map_err(|e| format!("proxy: {e}"))?;
        let urls: Vec<String> = mine.iter().map(Proxy::url).collect();
        stores.push(RedisStore::new(&urls, settings()).map_err(|e| e.to_string())?);
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
            .map(|i| super::workers::cpu_ticks(nodes.pid(i)))
            .sum::<u64>()
    };
    let (commands_before, trips_before) = counts(&proxies);
    let cpu_before = redis_cpu();
    let mut batch = Batch {
        jobs,
        ticks,
        ..Batch::default()
    };
    for t in 0..ticks {
        let started = Instant::now();
        let won = race_once(&stores, &names, Tick(1_000 * (t as i64 + 2))).await;
        batch.race.push(started.elapsed());
        for count in won {
            match count {
                0 => batch.unclaimed += 1,
                1 => batch.once += 1,
                _ => batch.twice += 1,
            }
        }
    }
    let (commands_after, trips_after) = counts(&proxies);
    let per = (ticks * CONTENDERS) as f64;
    batch.commands = (commands_after - commands_before) as f64 / per;
    batch.claim_round_trips = (trips_after - trips_before) as f64 / per;
    let clock_ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    batch.redis_cpu_per_tick = (redis_cpu() - cpu_before) as f64 / clock_ticks / ticks as f64;
    drop(stores);
    Ok(batch)
}

/// All contenders claim every job at `tick` at once; winners release. Returns, per job, how many won.
async fn race_once(stores: &[RedisStore], names: &[String], tick: Tick) -> Vec<usize> {
    // Each contender is a claimant of its own for every job.
    let requests: Vec<Vec<ClaimRequest>> = (0..stores.len())
        .map(|i| {
            let id = format!("c{i}");
            names
                .iter()
                .map(|job| ClaimRequest::new(&id, job, tick, Overlap::Skip, "bench"))
                .collect()
        })
        .collect();
    let outcomes = join_all(
        stores
            .iter()
            .zip(&requests)
            .map(|(store, requests)| store.claim_many(requests)),
    )
    .await;
    let mut won = vec![0; names.len()];
    let mut releases = Vec::new();
    for (store, outcomes) in stores.iter().zip(outcomes) {
        for (job, outcome) in outcomes.into_iter().enumerate() {
            if let ClaimOutcome::Won(lease) = outcome {
                won[job] += 1;
                releases.push((store, lease));
            }
        }
    }
    join_all(releases.iter().map(|(store, lease)| store.release(lease))).await;
    won
}

fn table(batches: &[Batch]) -> String {
    let mut table = Table::new(&[
        "jobs per tick",
        "ticks",
        "won exactly once",
        "twice",
        "unclaimed",
        "race p50 ms",
        "race max ms",
        "claim round trips /contender/tick",
        "commands /contender/tick",
        "redis CPU s /tick",
    ]);
    for b in batches {
        table.row(vec![
            b.jobs.to_string(),
            b.ticks.to_string(),
            format!("{} of {}", b.once, b.jobs * b.ticks),
            b.twice.to_string(),
            b.unclaimed.to_string(),
            ms(b.race.p50()),
            ms(b.race.percentile(100.0)),
            format!("{:.1}", b.claim_round_trips),
            format!("{:.0}", b.commands),
            format!("{:.3}", b.redis_cpu_per_tick),
        ]);
    }
    format!(
        "\n## 4b. The lock alone at scale: 3 contenders race for N jobs at one tick, in one process\n\n\
         No processes are spawned: each contender is a `RedisStore` behind its own counting proxies; the \
         winners release before the next tick. Race: from the start of the three `claim_many` calls to the \
         last answer (split votes retried as configured: retries 1, retry_delay 200 ms). Redis CPU: the 5 \
         nodes together.\n\n{}",
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
