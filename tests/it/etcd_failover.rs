//! The etcd store with one of three members down (killed) or hung (SIGSTOP: connections accepted, no
//! answer), the member the store was talking to: the two others are a majority, so the store must go on
//! as if nothing happened — every claim of a new tick decided on its first call, a running job's lease
//! renewed through the fault, and a release that frees the job at once instead of at the lease's TTL.
//!
//! Found by the chaos test on etcd: the client's balanced channel kept sending requests to a killed or
//! hung member while the two others served, and ticks were missed. A follower is faulted (a leader's
//! fault costs an election, which `tests/it/etcd.rs` covers), listed first in each store's endpoints and
//! used by it just before the fault, so every store starts on the faulted member.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redcron::lock::{ClaimOutcome, Lease};
use redcron::store::Store;

use crate::etcd::{claim_until_final, request, settings};
use crate::support::{store_on, won, EtcdCluster};

/// Claims of new ticks made in a row while the member is faulted.
const CLAIMS: i64 = 20;

#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Hang,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_costs_no_claim_renewal_or_release() {
    claims_renewals_and_releases_go_on(Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_costs_no_claim_renewal_or_release() {
    claims_renewals_and_releases_go_on(Fault::Hang).await;
}

/// Stores (workers) that last talked to follower `victim`: one holds a running job's lease, one claims
/// new ticks, one releases its lease right after the fault (and one more sees the job freed).
async fn claims_renewals_and_releases_go_on(fault: Fault) {
    let mut cluster = EtcdCluster::start();
    let victim = (cluster.leader() + 1) % cluster.len();
    let store = || Arc::new(store_preferring(&cluster, victim));
    let (running, claimer, releaser, checker) = (store(), store(), store(), store());
    let mut lease = won(claim_until_final(&running, &request("r", "running", 1_000)).await);
    let warm = won(claim_until_final(&claimer, &request("c", "warm", 1_000)).await);
    claimer.release(&warm).await;
    let held = won(claim_until_final(&releaser, &request("x", "released", 1_000)).await);
    let seen = claim_until_final(&checker, &request("y", "released", 1_000)).await;
    assert!(
        matches!(seen, ClaimOutcome::AlreadyClaimed { .. }),
        "{seen:?}"
    );

    match fault {
        Fault::Kill => cluster.kill(victim),
        Fault::Hang => cluster.stop(victim),
    }
    let ttl = settings().ttl;

    // The running job: renewed as the watchdog does, for two TTLs, never lost.
    let renewing = tokio::spawn(async move {
        let confirmed = keep_renewed(&running, &mut lease, 2 * ttl).await;
        running.release(&lease).await;
        confirmed
    });

    // A release: the job is free for its next tick well before the lease's TTL would free it.
    let releasing = tokio::spawn(async move {
        let released_at = Instant::now();
        releaser.release(&held).await;
        loop {
            match checker.claim(&request("y", "released", 2_000)).await {
                ClaimOutcome::Won(lease) => return checker.release(&lease).await,
                outcome => {
                    assert!(
                        released_at.elapsed() < ttl,
                        "{fault:?}: the released lease still held the job after its TTL: {outcome:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });

    // New ticks: each claim decided (granted: nobody else claims them) on its first call.
    let mut tokens = Vec::new();
    for tick in 1..=CLAIMS {
        match claimer.claim(&request("c", "ticks", tick * 1_000)).await {
            ClaimOutcome::Won(lease) => {
                tokens.push(lease.token);
                claimer.release(&lease).await;
            }
            other => panic!("{fault:?}: claim {tick} of {CLAIMS} not decided: {other:?}"),
        }
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of order: {tokens:?}"
    );

    releasing.await.expect("the releasing task");
    let confirmed = renewing.await.expect("the renewing task");
    assert!(confirmed >= 2, "{fault:?}: only {confirmed} renewals");
}

/// A store on `cluster` with member `first` listed first: the member it asks first until another answers.
fn store_preferring(cluster: &EtcdCluster, first: usize) -> Store {
    let mut endpoints = cluster.endpoints();
    endpoints.rotate_left(first);
    store_on(&format!("etcd|{}", endpoints.join(",")), settings())
}

/// Renews `lease` every `renew_every` for `how_long`, as the watchdog does (a renewal not confirmed is
/// sent again until the deadline); panics if the lease is lost. Returns the renewals confirmed.
async fn keep_renewed(store: &Store, lease: &mut Lease, how_long: Duration) -> usize {
    let until = Instant::now() + how_long;
    let mut confirmed = 0;
    while Instant::now() < until {
        tokio::time::sleep(settings().renew_every).await;
        loop {
            match store.renew(lease).await {
                Ok(()) => break,
                Err(e) => {
                    assert!(!e.is_lost(), "the running job's lease was lost: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        confirmed += 1;
    }
    confirmed
}
