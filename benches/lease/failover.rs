//! Item 9, a Sentinel group's failover and a Redis Cluster's as a claimant sees them: how long no claim
//! is won when the master ends — SIGKILLed, or handed over by a planned `SENTINEL FAILOVER` or `CLUSTER
//! FAILOVER`.
//!
//! One claimant claims a new tick of one job every [`PACE`] (and releases it), `min_replicas_acked:
//! all`, on a store of one group (a master, two replicas, three Sentinels with
//! `down-after-milliseconds` 1 s: [`testkit::SentinelGroup`]), or of one Redis Cluster (3 masters with
//! two replicas each, `cluster-node-timeout` 2 s: [`testkit::ShardedRedis`]), where the fault hits the
//! master of the job's slot. At a fault, the time is taken; the figure is from then to the end of the
//! first claim won that was sent after it. A crash costs the Sentinels' `down-after-milliseconds` (a
//! production group's is usually 5–30 s, which adds one for one) or the cluster's node timeout (15 s
//! by default), the election and the promotion, and the claimant's reconnection (on a cluster, its
//! reading of the new slot map); a planned failover costs the promotion and the reconnection only.
//! Each crash runs on a group or cluster of its own (its master is gone); the planned failovers follow
//! each other on one. Two replicas per master, so that a master's death leaves a replica to
//! acknowledge: with one, `all` refuses the shard's claims until another replica follows the new
//! master. Every claim is checked against the one before: tokens rise across every failover.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redcron::config::{ClusterSeeds, RedisConfig, RedisNode, ReplicaAcks};
use redcron::lock::{ClaimOutcome, ClaimRequest, LockSettings, Overlap};
use redcron::schedule::Tick;
use redcron::store::redis::RedisStore;
use redcron::store::Store;
use testkit::{slot_of, SentinelGroup, ShardedRedis};

use super::stats::{ms, Samples, Table, Verdict};

/// How often the claimant claims a new tick.
const PACE: Duration = Duration::from_millis(20);
/// How long a trial waits for a claim won after its fault.
const PATIENCE: Duration = Duration::from_secs(30);
/// The claimant's job: on a cluster, the fault hits the master of its slot.
const JOB: &str = "failover";

/// How many trials of each kind, on each mode.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub crashes: usize,
    pub planned: usize,
}

impl Size {
    pub fn smoke() -> Size {
        Size {
            crashes: 1,
            planned: 1,
        }
    }

    pub fn full() -> Size {
        Size {
            crashes: 3,
            planned: 5,
        }
    }
}

/// What the item measured.
#[derive(Debug, Clone)]
pub struct Failovers {
    pub size: Size,
    /// The Sentinels' `down-after-milliseconds`.
    pub down_after: Duration,
    /// The cluster's `cluster-node-timeout`.
    pub node_timeout: Duration,
    /// The longest stretch without a claim won around each SIGKILL of the group's master.
    pub crashes: Samples,
    /// The same around each `SENTINEL FAILOVER`.
    pub planned: Samples,
    /// The same around each SIGKILL of the master of the job's slot on a cluster.
    pub cluster_crashes: Samples,
    /// The same around each `CLUSTER FAILOVER` of that master's replica.
    pub cluster_planned: Samples,
    /// Claims sent after a fault that were not won before the next one was, over all trials.
    pub refused: usize,
    /// A token that did not rise above the one before it, if any (`job tick token ≤ previous`).
    pub token_out_of_order: Option<String>,
}

impl Failovers {
    /// Adds one series of trials' outcome.
    fn add(&mut self, into: fn(&mut Failovers) -> &mut Samples, trials: Trials) {
        let (times, refused, out_of_order) = trials;
        let samples = into(self);
        times.into_iter().for_each(|time| samples.push(time));
        self.refused += refused;
        self.token_out_of_order = self.token_out_of_order.take().or(out_of_order);
    }
}

/// Per fault, the longest stretch without a claim won; the claims refused; a token out of order.
type Trials = (Vec<Duration>, usize, Option<String>);

/// One claimant's record: when each claim was sent and ended, and its token if it was won.
#[derive(Default)]
struct Record {
    claims: Vec<(Instant, Instant, Option<u64>)>,
    out_of_order: Option<String>,
}

/// Runs the crashes, then the planned failovers, on a Sentinel group and then on a Redis Cluster;
/// prints the item's table.
pub fn run(size: Size, print: &mut dyn FnMut(&str)) -> Result<Failovers, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let mut failovers = Failovers {
        size,
        down_after: Duration::ZERO,
        node_timeout: Duration::ZERO,
        crashes: Samples::default(),
        planned: Samples::default(),
        cluster_crashes: Samples::default(),
        cluster_planned: Samples::default(),
        refused: 0,
        token_out_of_order: None,
    };
    let on_group = |group: &SentinelGroup| {
        RedisConfig::on(vec![RedisNode::Sentinel(group.config(ReplicaAcks::All))])
    };
    for _ in 0..size.crashes {
        let mut group = SentinelGroup::builder().start();
        failovers.down_after = group.down_after();
        let trials = runtime.block_on(trials(on_group(&group), 1, |_| {
            let master = group.master().ok_or("the group has no master")?;
            group.data.kill(master);
            group.wait_for_new_master(master);
            Ok(())
        }))?;
        failovers.add(|f| &mut f.crashes, trials);
    }
    if size.planned > 0 {
        let group = SentinelGroup::builder().start();
        failovers.down_after = group.down_after();
        let trials = runtime.block_on(trials(on_group(&group), size.planned, |_| {
            group.failover();
            Ok(())
        }))?;
        failovers.add(|f| &mut f.planned, trials);
    }
    let slot = slot_of(&format!("{{{JOB}}}"));
    let sharded = || ShardedRedis::builder().replicas_per_master(2).start();
    let on_cluster = |cluster: &ShardedRedis| {
        RedisConfig::on(vec![RedisNode::Cluster(ClusterSeeds {
            seeds: cluster.seed_urls(),
            min_replicas_acked: ReplicaAcks::All,
        })])
    };
    for _ in 0..size.crashes {
        let mut cluster = sharded();
        failovers.node_timeout = cluster.node_timeout();
        let config = on_cluster(&cluster);
        let trials = runtime.block_on(trials(config, 1, |_| {
            let master = cluster
                .master_of_slot(slot)
                .ok_or("no master serves the job's slot")?;
            cluster.nodes_mut().kill(master);
            cluster.wait_for_new_master(slot, master);
            Ok(())
        }))?;
        failovers.add(|f| &mut f.cluster_crashes, trials);
    }
    if size.planned > 0 {
        let cluster = sharded();
        failovers.node_timeout = cluster.node_timeout();
        let trials = runtime.block_on(trials(on_cluster(&cluster), size.planned, |_| {
            let master = cluster
                .master_of_slot(slot)
                .ok_or("no master serves the job's slot")?;
            let replica = *cluster
                .replicas_of(master)
                .first()
                .ok_or("the job's master has no replica")?;
            cluster.failover(replica);
            Ok(())
        }))?;
        failovers.add(|f| &mut f.cluster_planned, trials);
    }
    print(&table(&failovers));
    Ok(failovers)
}

/// `faults` faults on the store `config` names (`fault(i)` returns once it serves as before), with the
/// claimant running throughout: per fault, the longest stretch without a claim won, the claims
/// refused meanwhile, and a token out of order if one was seen.
async fn trials(
    config: RedisConfig,
    faults: usize,
    mut fault: impl FnMut(usize) -> Result<(), String>,
) -> Result<Trials, String> {
    let settings = LockSettings {
        node_timeout: Duration::from_millis(500),
        ttl: Duration::from_secs(3),
        renew_every: Duration::from_secs(1),
        ..LockSettings::default()
    };
    let store = Store::Redis(RedisStore::open(&config, settings).map_err(|e| e.to_string())?);
    let record = Arc::new(Mutex::new(Record::default()));
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let claimant = tokio::spawn(claim_on(store, Arc::clone(&record), Arc::clone(&running)));
    let (mut times, mut refused) = (Vec::new(), 0);
    for i in 0..faults {
        // A won claim before the fault: the claimant is connected to the master.
        wait_for_win_after(&record, Instant::now()).await?;
        let at = Instant::now();
        tokio::task::block_in_place(|| fault(i))?;
        // Until the store serves again as it did (`fault` returned), and a claim won after that.
        let back = wait_for_win_after(&record, Instant::now()).await?;
        let Ok(record) = record.lock() else {
            return Err("the claimant's record is poisoned".to_string());
        };
        // The longest stretch without a claim won, from the last one before the fault: a planned
        // failover's old master may grant claims for a while after it was asked for.
        let wins: Vec<Instant> = record
            .claims
            .iter()
            .filter(|(_, ended, token)| token.is_some() && *ended <= back)
            .map(|(_, ended, _)| *ended)
            .collect();
        let last_before = wins.iter().rev().find(|&&ended| ended < at).copied();
        let during: Vec<Instant> = last_before
            .into_iter()
            .chain(wins.iter().copied().filter(|&ended| ended >= at))
            .collect();
        let longest = during
            .windows(2)
            .map(|pair| pair[1] - pair[0])
            .max()
            .unwrap_or_default();
        times.push(longest);
        refused += record
            .claims
            .iter()
            .filter(|(sent, ended, token)| *sent >= at && *ended <= back && token.is_none())
            .count();
    }
    running.store(false, std::sync::atomic::Ordering::Release);
    let _ = claimant.await;
    let out_of_order = record.lock().ok().and_then(|r| r.out_of_order.clone());
    Ok((times, refused, out_of_order))
}

/// When the first claim sent at or after `at` was won; an error after [`PATIENCE`].
async fn wait_for_win_after(record: &Mutex<Record>, at: Instant) -> Result<Instant, String> {
    let deadline = at + PATIENCE;
    loop {
        let won = record.lock().ok().and_then(|record| {
            record
                .claims
                .iter()
                .find(|(sent, _, token)| *sent >= at && token.is_some())
                .map(|(_, ended, _)| *ended)
        });
        if let Some(won) = won {
            return Ok(won);
        }
        if Instant::now() > deadline {
            return Err(format!("no claim won within {PATIENCE:?} of a failover"));
        }
        tokio::time::sleep(PACE).await;
    }
}

/// Claims a new tick of one job every [`PACE`] until `running` is cleared, releasing each lease won,
/// and records every claim (a token not above the one before is noted).
async fn claim_on(
    store: Store,
    record: Arc<Mutex<Record>>,
    running: Arc<std::sync::atomic::AtomicBool>,
) {
    let (mut tick, mut last) = (0i64, 0u64);
    while running.load(std::sync::atomic::Ordering::Acquire) {
        tick += 1_000;
        let request = ClaimRequest::new("bench", JOB, Tick(tick), Overlap::Skip, "bench");
        let sent = Instant::now();
        let outcome = store.claim(&request).await;
        let ended = Instant::now();
        let token = match outcome {
            ClaimOutcome::Won(lease) => {
                store.release(&lease).await;
                Some(lease.token)
            }
            _ => None,
        };
        if let Ok(mut record) = record.lock() {
            if let Some(token) = token {
                if token <= last && record.out_of_order.is_none() {
                    record.out_of_order = Some(format!("tick {tick}: token {token} ≤ {last}"));
                }
                last = token;
            }
            record.claims.push((sent, ended, token));
        }
        tokio::time::sleep(PACE).await;
    }
}

/// The item's table.
fn table(failovers: &Failovers) -> String {
    let mut table = Table::new(&[
        "fault",
        "trials",
        "longest stretch without a claim won: p50",
        "max",
    ]);
    for (fault, samples) in [
        ("Sentinel group: master SIGKILLed", &failovers.crashes),
        ("Sentinel group: `SENTINEL FAILOVER`", &failovers.planned),
        (
            "Redis Cluster: the job's master SIGKILLed",
            &failovers.cluster_crashes,
        ),
        (
            "Redis Cluster: `CLUSTER FAILOVER` on its replica",
            &failovers.cluster_planned,
        ),
    ] {
        let max = samples.percentile(100.0);
        table.row(vec![
            fault.to_string(),
            samples.len().to_string(),
            ms(samples.p50()),
            ms(max),
        ]);
    }
    format!(
        "\n## 9. A Sentinel group's failover and a Redis Cluster's, as a claimant sees them\n\n\
         One claimant claims a new tick every {} ms, `min_replicas_acked: all`, on a group of a master, \
         two replicas and three Sentinels (`down-after-milliseconds` {} ms), and on a Redis Cluster of 3 \
         masters with two replicas each (`cluster-node-timeout` {} ms; the fault hits the master of the \
         job's slot); per fault, the longest stretch between two claims won, from the last one before \
         the fault until the store serves as it did (a new master, and every replica following it). \
         Claims refused meanwhile: {}. Tokens out of order: {}.\n\n{}",
        PACE.as_millis(),
        failovers.down_after.as_millis(),
        failovers.node_timeout.as_millis(),
        failovers.refused,
        failovers.token_out_of_order.as_deref().unwrap_or("none"),
        table.render()
    )
}

/// Tokens rise across every failover; no target for the time, which the Sentinels' and the cluster's
/// settings set.
pub fn verdicts(failovers: &Failovers) -> Vec<Verdict> {
    vec![Verdict::new(
        "Sentinel and Redis Cluster failovers: every token above the one before",
        failovers
            .token_out_of_order
            .clone()
            .unwrap_or_else(|| "in order".to_string()),
        Some(failovers.token_out_of_order.is_none()),
    )]
}
