//! Item 4c, the cost model: what each store operation costs the nodes, measured one kind at a time.
//!
//! One contender (no contention) on the 5 nodes claims N jobs at one tick, renews every lease once, writes
//! one history entry per run (one `record` call, as the worker's recorder batches them), and releases
//! every lease. Before and after each step the nodes' own counters are read (`INFO commandstats`, which
//! counts the commands a script calls as well as the `EVALSHA` itself, and `INFO cpu`), so each step's
//! commands and Redis CPU per job are its own. This is the input of `docs/scaling.md`.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redcron::history::{Entry, Kind};
use redcron::lock::{ClaimOutcome, ClaimRequest, Overlap};
use redcron::schedule::Tick;
use redcron::store::redis::RedisStore;
use redcron::store::{Claims, Health, Leases, Records};

use super::cycle::settings;
use super::nodes::{Cluster, Counters, Usage};
use super::stats::Table;

/// How many times the claim step sends the claims that are not final yet.
const CLAIM_ROUNDS: usize = 5;

/// One operation's cost over N jobs.
#[derive(Debug, Clone)]
pub struct Op {
    pub name: &'static str,
    pub jobs: usize,
    /// Wall time of the step (all N at once).
    pub took: Duration,
    /// How many of the N the store confirmed (a renewal or history write can miss its quorum under load).
    pub confirmed: usize,
    pub usage: Usage,
}

impl Op {
    pub fn commands_per_job(&self) -> f64 {
        self.usage.commands as f64 / self.jobs.max(1) as f64
    }

    pub fn cpu_per_job(&self) -> f64 {
        self.usage.cpu / self.jobs.max(1) as f64
    }
}

/// Claims, renews, records and releases `jobs` jobs once each; one [`Op`] per step.
pub async fn measure(nodes: &Cluster, jobs: usize) -> Result<Vec<Op>, String> {
    let store = RedisStore::new(&nodes.urls(), settings()).map_err(|e| e.to_string())?;
    let tick = Tick(chrono::Utc::now().timestamp_millis());
    let requests: Vec<ClaimRequest> = (0..jobs)
        .map(|j| {
            ClaimRequest::new(
                "ops",
                &format!("ops{jobs}-{j}"),
                tick,
                Overlap::Skip,
                "bench",
            )
        })
        .collect();
    // Warm-up: connections and script caches, on other jobs.
    let warm: Vec<ClaimRequest> = (0..10)
        .map(|j| ClaimRequest::new("ops", &format!("warm{j}"), tick, Overlap::Skip, "bench"))
        .collect();
    for outcome in store.claim_many(&warm).await {
        if let ClaimOutcome::Won(lease) = outcome {
            store.release(&lease).await;
        }
    }
    let mut ops = Vec::new();
    let mut step = |name: &'static str, confirmed: usize, before: Usage, started: Instant| {
        ops.push(Op {
            name,
            jobs,
            confirmed,
            took: started.elapsed(),
            usage: before.until(nodes.total_usage()),
        });
    };

    let (before, started) = (nodes.total_usage(), Instant::now());
    // As the worker does, a claim that is not final (no quorum within `node_timeout` on a loaded
    // machine) is sent again, for a few rounds; the step's counters include the retries.
    let (mut leases, mut pending) = (Vec::new(), requests);
    for _ in 0..CLAIM_ROUNDS {
        let outcomes = store.claim_many(&pending).await;
        let mut again = Vec::new();
        for (request, outcome) in pending.into_iter().zip(outcomes) {
            match outcome {
                ClaimOutcome::Won(lease) => leases.push(lease),
                other if other.retry_in().is_some() => again.push(request),
                _ => {}
            }
        }
        pending = again;
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(store.settings().retry_delay).await;
    }
    step("claim (2 rounds)", leases.len(), before, started);
    if leases.len() != jobs {
        return Err(format!("cost model: {} of {jobs} claims won", leases.len()));
    }

    let (before, started) = (nodes.total_usage(), Instant::now());
    let renewed = join_all(leases.iter_mut().map(|lease| store.renew(lease))).await;
    let confirmed = renewed.iter().filter(|r| r.is_ok()).count();
    step("renew", confirmed, before, started);

    let now = chrono::Utc::now();
    let entries: Vec<Entry> = (0..jobs)
        .map(|j| Entry::new(&format!("ops{jobs}-{j}"), tick, "ops", Kind::Run, now))
        .collect();
    let (before, started) = (nodes.total_usage(), Instant::now());
    let written = store.record(&entries).await.map_or(0, |()| jobs);
    step("history write (1 entry)", written, before, started);

    let (before, started) = (nodes.total_usage(), Instant::now());
    join_all(leases.iter().map(|lease| store.release(lease))).await;
    step("release", jobs, before, started);
    Ok(ops)
}

pub fn table(ops: &[Op]) -> String {
    let mut table = Table::new(&[
        "operation",
        "jobs",
        "confirmed",
        "wall ms (all at once)",
        "redis commands /job",
        "redis CPU µs /job",
    ]);
    for op in ops {
        table.row(vec![
            op.name.to_string(),
            op.jobs.to_string(),
            op.confirmed.to_string(),
            format!("{:.1}", op.took.as_secs_f64() * 1e3),
            format!("{:.1}", op.commands_per_job()),
            format!("{:.1}", op.cpu_per_job() * 1e6),
        ]);
    }
    format!(
        "\n## 4c. Cost per operation: one contender, 5 nodes, N jobs at once\n\n\
         The nodes' own counters before and after each step, all 5 nodes together, divided by the jobs: \
         `INFO commandstats` (an `EVALSHA` and the commands its script calls) and `INFO cpu` (user + \
         system). No contention: one claimant, every claim won.\n\n{}",
        table.render()
    )
}
