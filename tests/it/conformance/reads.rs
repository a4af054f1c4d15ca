//! Reads beside the lock path: a store hammered with reads of a large history (as a worker's dashboard
//! reads it) must not delay the same store's claims, renewals or releases — on the embedded store the
//! lock path has its own connection and the reads a few read-only ones, on a SQL store the reads a pool
//! of their own, on Redis connections of their own, two reads at a time and bounded pages of entries, on
//! ZooKeeper two reads at a time in chunks of 16 entries, and on etcd clients of their own, two reads at
//! a time and pages of entries below the client's bound on an answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use redcron::history::{Entry, Kind, Query};
use redcron::lock::ClaimOutcome;
use redcron::schedule::Tick;

use super::{request, settings, warm};
use crate::support::{heavy, Backend};

/// Ticks of the large job's history, and the bytes of each of its two output tails.
const TICKS: i64 = 200;
const TAIL: usize = 32 * 1024;

/// How long the readers hammer the store, and how many at once (twice a SQL store's pool).
const HAMMER: Duration = Duration::from_secs(8);
const READERS: usize = 16;

/// The longest a renewal, or a claim and its release, may take while the reads run: a few commits on a
/// loaded machine, far below the TTL.
const PROMPT: Duration = Duration::from_millis(750);

/// A job's history of 200 failed runs with 64 KB of output each (12.8 MB), then 16 tasks reading all of
/// it (`limit` 5,000, as `/api/history` may ask) on one store for 8 s, while the same store renews a
/// lease and claims and releases a tick of another job every 250 ms: every renewal succeeds within
/// 750 ms, and every tick is won (retried as the worker retries) within 1.5 s.
pub(super) async fn reads_of_a_large_history_never_delay_claims_or_renewals(backend: Backend) {
    let _place = heavy();
    let cluster = backend.start();
    let store = Arc::new(cluster.store(settings(2_000)));
    warm(&store).await;
    let start = Utc::now().timestamp_millis() / 1000 * 1000 - 3_600_000;
    let tail = "x".repeat(TAIL);
    for batch in 0..TICKS / 10 {
        let entries: Vec<Entry> = (0..10)
            .map(|i| {
                let tick = Tick(start + (batch * 10 + i) * 1000);
                let mut entry = Entry::new("big", tick, "filler", Kind::Run, Utc::now());
                entry.outcome = Some("failure".to_string());
                entry.exit_code = Some(1);
                entry.tail_out = Some(tail.clone());
                entry.tail_err = Some(tail.clone());
                entry
            })
            .collect();
        store
            .record(&entries)
            .await
            .expect("the history is written");
    }
    let mut lease = crate::support::claim_won(&store, &request("w", "long", 1_000)).await;

    let (stop, answered, bytes) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let refused = Arc::new(std::sync::Mutex::new(None::<String>));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
            let (answered, bytes) = (Arc::clone(&answered), Arc::clone(&bytes));
            let refused = Arc::clone(&refused);
            tokio::spawn(async move {
                let query = Query {
                    job: "big".to_string(),
                    since: None,
                    until: None,
                    limit: 5_000,
                };
                while !stop.load(Ordering::Relaxed) {
                    let read = store.history(&query).await;
                    if let Err(e) = &read {
                        let mut first = refused.lock().unwrap_or_else(|p| p.into_inner());
                        first.get_or_insert_with(|| e.to_string());
                    }
                    if let Ok(read) = read {
                        answered.fetch_add(1, Ordering::Relaxed);
                        let size: usize = read
                            .value
                            .iter()
                            .map(|e| e.tail_out.as_ref().map_or(0, String::len) * 2)
                            .sum();
                        bytes.fetch_add(size as u64, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // The reads under way before the lock path is timed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hammered = Instant::now();
    let (mut slowest, mut tick, mut slow) = (Duration::ZERO, 1_000, Vec::new());
    while hammered.elapsed() < HAMMER {
        let renewing = Instant::now();
        let renewed = store.renew(&mut lease).await;
        let took = renewing.elapsed();
        slowest = slowest.max(took);
        if renewed.is_err() || took > PROMPT {
            slow.push(format!("renewal: {renewed:?} after {took:?}"));
        }
        tick += 1_000;
        let claiming = Instant::now();
        // Retried as the worker retries it: a commit slowed by the reads' CPU on a loaded machine
        // answers `NoQuorum` once in a while; the tick must still be won promptly.
        let outcome =
            crate::support::claim_until_final(&store, &request("w", "every", tick), PROMPT * 2)
                .await;
        if let ClaimOutcome::Won(won) = &outcome {
            store.release(won).await;
        }
        let took = claiming.elapsed();
        slowest = slowest.max(took);
        if !matches!(outcome, ClaimOutcome::Won(_)) || took > PROMPT * 2 {
            slow.push(format!("claim of tick {tick}: {outcome:?} after {took:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let _ = reader.await;
    }
    let answered = answered.load(Ordering::Relaxed);
    eprintln!(
        "{}: {answered} reads of the history ({} MB) in {:?}; the slowest renewal or claim took {slowest:?}",
        backend.name(),
        bytes.load(Ordering::Relaxed) / 1_000_000,
        hammered.elapsed()
    );
    assert!(
        slow.is_empty(),
        "reads delayed the lock path on {}: {slow:#?}",
        backend.name()
    );
    assert!(
        answered > 0,
        "no read was answered: {:?}",
        refused.lock().unwrap_or_else(|p| p.into_inner())
    );
    store.release(&lease).await;
}
