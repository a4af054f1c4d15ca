//! The etcd store under the faults of its own cluster: a member killed, a member hung, the leader killed
//! while workers claim. (The claim, renew, release and token suite that both stores share is in
//! `tests/it/lock.rs`; workers on etcd are in `tests/it/worker.rs`.)
//!
//! etcd answers for its majority, so a fault costs time — an election, a reconnect, a retry of the same
//! claimant — and never a grant: each test checks that every tick is granted exactly once and tokens rise.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redcron::lock::{ClaimOutcome, ClaimRequest, Lease, LockSettings, Overlap};
use redcron::schedule::Tick;
use redcron::store::Store;

use crate::support::{store_on, Backend, EtcdCluster};

/// How long a test gives a claim to become final: an election (0.5–1 s here) plus reconnects, with a
/// margin for a loaded machine.
const SETTLE: Duration = Duration::from_secs(20);

fn settings() -> LockSettings {
    Backend::Etcd.adapt(LockSettings {
        ttl: Duration::from_secs(4),
        renew_every: Duration::from_millis(1_300),
        retry_delay: Duration::from_millis(50),
        ..LockSettings::default()
    })
}

fn store(cluster: &EtcdCluster) -> Store {
    store_on(
        &format!("etcd|{}", cluster.endpoints().join(",")),
        settings(),
    )
}

fn request(worker: &str, job: &str, tick: i64) -> ClaimRequest {
    ClaimRequest::new(worker, job, Tick(tick), Overlap::Skip, "test")
}

/// Claims `request` as the worker does: the same request again while the outcome is not final.
async fn claim_until_final(store: &Store, request: &ClaimRequest) -> ClaimOutcome {
    let deadline = Instant::now() + SETTLE;
    loop {
        let outcome = store.claim(request).await;
        match outcome.retry_in() {
            Some(wait) if Instant::now() < deadline => {
                tokio::time::sleep(wait.max(Duration::from_millis(50))).await;
            }
            _ => return outcome,
        }
    }
}

/// Renews until confirmed (a renewal that times out is retried, as the watchdog does).
async fn renew_until_confirmed(store: &Store, lease: &mut Lease) {
    let deadline = Instant::now() + SETTLE;
    while let Err(e) = store.renew(lease).await {
        assert!(!e.is_lost(), "the lease was lost: {e}");
        assert!(Instant::now() < deadline, "no renewal confirmed: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn won(outcome: ClaimOutcome) -> Lease {
    match outcome {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// A member killed, then restarted: claims, renewals and releases go on with the two left, the claims
/// made meanwhile stay claimed after the member rejoins, and tokens keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_and_restarted_costs_no_grant() {
    let mut cluster = EtcdCluster::start();
    let store = store(&cluster);
    let first = won(claim_until_final(&store, &request("w", "killed", 1_000)).await);
    store.release(&first).await;
    let victim = (cluster.leader() + 1) % cluster.len();
    cluster.kill(victim);
    let mut lease = won(claim_until_final(&store, &request("w", "killed", 2_000)).await);
    assert!(lease.token > first.token);
    renew_until_confirmed(&store, &mut lease).await;
    store.release(&lease).await;
    cluster.restart(victim);
    let again = claim_until_final(&store, &request("other", "killed", 2_000)).await;
    assert!(
        matches!(again, ClaimOutcome::AlreadyClaimed { .. }),
        "a claimed tick was granted again after the member rejoined: {again:?}"
    );
    let third = won(claim_until_final(&store, &request("w", "killed", 3_000)).await);
    assert!(third.token > lease.token);
}

/// The leader hung (SIGSTOP: its connections stay open and silent): the others elect a new leader, and
/// the same claimant's retries are granted once; a contender of the same tick is refused; after the old
/// leader resumes it follows, and the tick stays claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_leader_costs_an_election_not_a_grant() {
    let mut cluster = EtcdCluster::start();
    let store = store(&cluster);
    let first = won(claim_until_final(&store, &request("w", "hung", 1_000)).await);
    store.release(&first).await;
    let leader = cluster.leader();
    cluster.stop(leader);
    let mut lease = won(claim_until_final(&store, &request("a", "hung", 2_000)).await);
    renew_until_confirmed(&store, &mut lease).await;
    let contender = claim_until_final(&store, &request("b", "hung", 2_000)).await;
    assert!(
        matches!(contender, ClaimOutcome::AlreadyClaimed { .. }),
        "{contender:?}"
    );
    cluster.cont(leader);
    let late = claim_until_final(&store, &request("c", "hung", 2_000)).await;
    assert!(
        matches!(late, ClaimOutcome::AlreadyClaimed { .. }),
        "{late:?}"
    );
}

/// Three workers (each its own store and connections) race 24 ticks of one job, as the worker does
/// (the same claimant until the outcome is final), while the leader is killed a few ticks in and later
/// restarted: every tick is granted to exactly one of them, and tokens rise with the ticks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_killed_during_claims_grants_each_tick_once() {
    let mut cluster = EtcdCluster::start();
    let stores: Vec<Arc<Store>> = (0..3).map(|_| Arc::new(store(&cluster))).collect();
    let mut tokens = Vec::new();
    for tick in 1..=24 {
        if tick == 6 {
            let leader = cluster.leader();
            cluster.kill(leader);
        }
        if tick == 18 {
            for member in 0..cluster.len() {
                if !cluster.is_serving(member) {
                    cluster.restart(member);
                }
            }
        }
        let races: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(w, store)| {
                let store = Arc::clone(store);
                tokio::spawn(async move {
                    let outcome = claim_until_final(
                        &store,
                        &request(&format!("w{w}"), "leader", tick * 1_000),
                    )
                    .await;
                    (w, outcome)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut others = Vec::new();
        for race in races {
            match race.await.expect("claim task") {
                (w, ClaimOutcome::Won(lease)) => winners.push((w, lease)),
                (_, outcome) => others.push(format!("{outcome:?}")),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "tick {tick}: {} winners; others: {others:?}",
            winners.len()
        );
        let (w, lease) = &winners[0];
        tokens.push(lease.token);
        stores[*w].release(lease).await;
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of order: {tokens:?}"
    );
}
