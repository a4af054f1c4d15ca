//! Item 9, a Sentinel group's failover as a claimant sees it: how long no claim is won when the master
//! ends — SIGKILLed, or handed over by a planned `SENTINEL FAILOVER`.
//!
//! One claimant claims a new tick of one job every [`PACE`] (and releases it), on a store of one group (a
//! master, two replicas, three Sentinels with `down-after-milliseconds` 1 s: [`testkit::SentinelGroup`]),
//! `min_replicas_acked: all`. At a fault, the time is taken; the figure is from then to the end of the
//! first claim won that was sent after it. A crash costs the Sentinels' `down-after-milliseconds` (a
//! production group's is usually 5–30 s, which adds one for one), their election and the promotion, and
//! the claimant's reconnection; a planned failover costs the promotion and the reconnection only. Each
//! crash runs on a group of its own (its master is gone); the planned failovers follow each other on one
//! group. Every claim is checked against the one before: tokens rise across every failover.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redcron::config::{RedisConfig, RedisNode, ReplicaAcks};
use redcron::lock::{ClaimOutcome, ClaimRequest, LockSettings, Overlap};
use redcron::schedule::Tick;
use redcron::store::redis::RedisStore;
use redcron::store::Store;
use testkit::SentinelGroup;

use super::stats::{ms, Samples, Table, Verdict};

/// How often the claimant claims a new tick.
const PACE: Duration = Duration::from_millis(20);
/// How long a trial waits for a claim won after its fault.
const PATIENCE: Duration = Duration::from_secs(30);

/// How many trials of each kind.
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
    /// The longest stretch without a claim won around each SIGKILL of the master.
    pub crashes: Samples,
    /// The same around each `SENTINEL FAILOVER`.
    pub planned: Samples,
    /// Claims sent after a fault that were not won before the next one was, over all trials.
    pub refused: usize,
    /// A token that did not rise above the one before it, if any (`job tick token ≤ previous`).
    pub token_out_of_order: Option<String>,
}

/// One claimant's record: when each claim was sent and ended, and its token if it was won.
#[derive(Default)]
struct Record {
    claims: Vec<(Instant, Instant, Option<u64>)>,
    out_of_order: Option<String>,
}

/// Runs the crashes, then the planned failovers; prints the item's table.
pub fn run(size: Size, print: &mut dyn FnMut(&str)) -> Result<Failovers, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let mut failovers = Failovers {
        size,
        down_after: Duration::ZERO,
        crashes: Samples::default(),
        planned: Samples::default(),
        refused: 0,
        token_out_of_order: None,
    };
    for _ in 0..size.crashes {
        let mut group = SentinelGroup::builder().start();
        failovers.down_after = group.down_after();
        let (times, refused, out_of_order) =
            runtime.block_on(trials(group.config(ReplicaAcks::All), 1, |_| {
                let master = group.master().ok_or("the group has no master")?;
                group.data.kill(master);
                group.wait_for_new_master(master);
                Ok(())
            }))?;
        times
            .into_iter()
            .for_each(|time| failovers.crashes.push(time));
        failovers.refused += refused;
        failovers.token_out_of_order = failovers.token_out_of_order.or(out_of_order);
    }
    if size.planned > 0 {
        let group = SentinelGroup::builder().start();
        failovers.down_after = group.down_after();
        let (times, refused, out_of_order) =
            runtime.block_on(trials(group.config(ReplicaAcks::All), size.planned, |_| {
                group.failover();
                Ok(())
            }))?;
        times
            .into_iter()
            .for_each(|time| failovers.planned.push(time));
        failovers.refused += refused;
        failovers.token_out_of_order = failovers.token_out_of_order.or(out_of_order);
    }
    print(&table(&failovers));
    Ok(failovers)
}

/// `faults` faults on the group of `group` (`fault(i)` returns once the group serves as before), with
/// the claimant running throughout: per fault, the longest stretch without a claim won, the claims
/// refused meanwhile, and a token out of order if one was seen.
async fn trials(
    group: redcron::config::SentinelGroup,
    faults: usize,
    mut fault: impl FnMut(usize) -> Result<(), String>,
) -> Result<(Vec<Duration>, usize, Option<String>), String> {
    let settings = LockSettings {
        node_timeout: Duration::from_millis(500),
        ttl: Duration::from_secs(3),
        renew_every: Duration::from_secs(1),
        ..LockSettings::default()
    };
    let config = RedisConfig::on(vec![RedisNode::Sentinel(group)]);
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
        // Until the group serves again as it did (`fault` returned), and a claim won after that.
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
        let request = ClaimRequest::new("bench", "failover", Tick(tick), Overlap::Skip, "bench");
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
        ("master SIGKILLed", &failovers.crashes),
        ("`SENTINEL FAILOVER`", &failovers.planned),
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
        "\n## 9. A Sentinel group's failover, as a claimant sees it\n\n\
         One claimant claims a new tick every {} ms on a group of a master, two replicas and three \
         Sentinels (`down-after-milliseconds` {} ms, `min_replicas_acked: all`); per fault, the longest \
         stretch between two claims won, from the last one before the fault until the group serves as it \
         did (a new master, and every replica following it). Claims refused meanwhile: {}. Tokens out of \
         order: {}.\n\n{}",
        PACE.as_millis(),
        failovers.down_after.as_millis(),
        failovers.refused,
        failovers.token_out_of_order.as_deref().unwrap_or("none"),
        table.render()
    )
}

/// Tokens rise across every failover; no target for the time, which the Sentinels' settings set.
pub fn verdicts(failovers: &Failovers) -> Vec<Verdict> {
    vec![Verdict::new(
        "Sentinel failovers: every token above the one before",
        failovers
            .token_out_of_order
            .clone()
            .unwrap_or_else(|| "in order".to_string()),
        Some(failovers.token_out_of_order.is_none()),
    )]
}
