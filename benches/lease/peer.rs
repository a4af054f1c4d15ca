//! The peer: what users deploy instead of redcron — one Redis, one `SET key NX PX` per (job, tick), as
//! ShedLock's and gocron's Redis lockers do. Three contenders race for the same jobs at the same tick.
//!
//! Each contender has one multiplexed connection and sends its `SET`s for every job at once (the client
//! pipelines them), which is the best case for the peer: one round trip's worth of waiting per tick. A
//! contender wins a job when its `SET` answers `OK`. There is no release — the key names the tick and
//! expires — so the peer's cost is exactly one command per contender per (job, tick). It has none of
//! redcron's guarantees (one node: a crash or failover hands the lock out twice; no fencing token); it is
//! the floor a user compares against.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::nodes::Usage;
use super::stats::Samples;

/// How many processes race for each job.
pub const CONTENDERS: usize = 3;

/// What one batch size measured on the peer.
#[derive(Debug, Clone, Default)]
pub struct PeerRace {
    pub jobs: usize,
    pub ticks: usize,
    /// From the start of the contenders' `SET`s to the last answer, per tick.
    pub settle: Samples,
    /// Ticks × jobs won exactly once, more than once, never.
    pub once: usize,
    pub twice: usize,
    pub unclaimed: usize,
    /// The node's commands and CPU seconds over the measured ticks.
    pub usage: Usage,
}

impl PeerRace {
    /// Redis commands per (job, tick) settled.
    pub fn commands_per_claim(&self) -> f64 {
        self.usage.commands as f64 / (self.jobs * self.ticks).max(1) as f64
    }

    /// Redis CPU seconds per (job, tick) settled.
    pub fn cpu_per_claim(&self) -> f64 {
        self.usage.cpu / (self.jobs * self.ticks).max(1) as f64
    }
}

/// Runs `ticks` races of `jobs` jobs on the node at `url`; `usage` reads that node's counters.
pub async fn race(
    url: &str,
    jobs: usize,
    ticks: usize,
    usage: impl Fn() -> Usage,
) -> Result<PeerRace, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    // The client's default response timeout is far below what 10,000 queued SETs take on a busy node.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    let mut connections = Vec::new();
    for _ in 0..CONTENDERS {
        connections.push(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|e| format!("peer: cannot connect to {url}: {e}"))?,
        );
    }
    let names: Vec<String> = (0..jobs).map(|j| format!("peer{jobs}-{j}")).collect();
    // One warm-up tick: connections and the node's first allocations.
    race_once(&connections, &names, 0).await?;
    let before = usage();
    let mut result = PeerRace {
        jobs,
        ticks,
        ..PeerRace::default()
    };
    for tick in 1..=ticks {
        let started = Instant::now();
        let won = race_once(&connections, &names, tick).await?;
        result.settle.push(started.elapsed());
        for count in won {
            match count {
                0 => result.unclaimed += 1,
                1 => result.once += 1,
                _ => result.twice += 1,
            }
        }
    }
    result.usage = before.until(usage());
    Ok(result)
}

/// Every contender sends `SET <job>:<tick> <contender> NX PX 60000` for every job at once; returns, per
/// job, how many contenders got `OK`.
async fn race_once(
    connections: &[redis::aio::MultiplexedConnection],
    names: &[String],
    tick: usize,
) -> Result<Vec<usize>, String> {
    let contenders = connections.iter().enumerate().map(|(c, connection)| {
        join_all(names.iter().map(move |job| {
            let mut connection = connection.clone();
            async move {
                redis::cmd("SET")
                    .arg(format!("{job}:{tick}"))
                    .arg(c)
                    .arg("NX")
                    .arg("PX")
                    .arg(Duration::from_secs(60).as_millis() as u64)
                    .query_async::<Option<String>>(&mut connection)
                    .await
            }
        }))
    });
    let answers = join_all(contenders).await;
    let mut won = vec![0; names.len()];
    for replies in answers {
        for (job, reply) in replies.into_iter().enumerate() {
            let reply = reply.map_err(|e| format!("peer SET failed: {e}"))?;
            if reply.is_some() {
                won[job] += 1;
            }
        }
    }
    Ok(won)
}
