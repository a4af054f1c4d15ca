//! Faults: what a store does when its nodes are down or hung. Every store refuses to grant without a
//! majority and recovers when it is back ([`no_majority_grants_nothing_and_the_store_recovers`]; on the
//! embedded store, its file locked by another process); each store's own faults follow: Redis nodes
//! killed or hung, an etcd member killed or its leader hung. Every fault test has its own cluster.

use std::time::{Duration, Instant};

use redcron::history::{Entry, Kind};
use redcron::lock::ClaimOutcome;
use redcron::schedule::Tick;

use super::{request, settings, warm};
use crate::etcd;
use crate::support::{claim_won, won, Backend, Cluster};

/// No majority (Redis: 3 of 5 nodes hung; etcd: the leader and one more member hung; embedded: the file's
/// write lock held by another connection): a claim is answered `NoQuorum` within seconds, never granted,
/// and a history write fails; once the nodes are back the same tick is granted, once.
pub(super) async fn no_majority_grants_nothing_and_the_store_recovers(backend: Backend) {
    let mut cluster = backend.start();
    let store = cluster.store(settings(2_000));
    warm(&store).await;
    let stopped = cluster.stop_majority();
    let started = Instant::now();
    let outcome = store.claim(&request("a", "quorum", 1_000)).await;
    assert!(
        matches!(outcome, ClaimOutcome::NoQuorum(_)),
        "expected no quorum, got {outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no quorum took {:?}",
        started.elapsed()
    );
    let entry = Entry::new("quorum", Tick(1_000), "a", Kind::Lost, chrono::Utc::now());
    assert!(
        store.record(&[entry]).await.is_err(),
        "recorded without a majority"
    );
    cluster.cont_all(&stopped);
    let lease = claim_won(&store, &request("a", "quorum", 1_000)).await;
    store.release(&lease).await;
    let again = super::settled(&store, &request("b", "quorum", 1_000)).await;
    assert!(
        matches!(again, ClaimOutcome::AlreadyClaimed { .. }),
        "{again:?}"
    );
}

/// Redis: a minority down (2 of 5 killed): acquire and renew still work. A majority down (3 of 5): no quorum,
/// reported promptly and naming the failed nodes.
pub(super) async fn a_minority_down_still_claims_and_a_majority_down_is_no_quorum(
    backend: Backend,
) {
    let mut nodes = backend.start();
    let store = nodes.store(settings(2_000));
    let Cluster::Redis(cluster) = &mut nodes else {
        panic!("Redis nodes")
    };
    warm(&store).await;
    cluster.kill(0);
    cluster.kill(1);
    let mut lease = claim_won(&store, &request("w", "down", 1_000)).await;
    store
        .renew(&mut lease)
        .await
        .expect("renew with 3 of 5 nodes");
    store.release(&lease).await;

    cluster.kill(2);
    let started = std::time::Instant::now();
    match store.claim(&request("w", "down", 2_000)).await {
        ClaimOutcome::NoQuorum(failure) => {
            assert_eq!((failure.configured, failure.needed), (5, 3));
            let text = failure.to_string();
            for node in 0..3 {
                assert!(
                    text.contains(&cluster.url(node)),
                    "{text} does not name {}",
                    cluster.url(node)
                );
            }
        }
        other => panic!("expected no quorum, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no quorum took {:?}",
        started.elapsed()
    );
}

/// Redis: hung nodes (SIGSTOP, not refused): with 2 of 5 hung, acquire and renew still work; with 3 of 5 hung, no
/// quorum. Both return within a small multiple of the node timeout, not after a TCP or client timeout.
pub(super) async fn a_hung_minority_costs_one_node_timeout(backend: Backend) {
    let mut nodes = backend.start();
    let node_timeout = Duration::from_millis(50);
    let store = nodes.store(settings(2_000));
    let Cluster::Redis(cluster) = &mut nodes else {
        panic!("Redis nodes")
    };
    warm(&store).await;
    cluster.stop(3);
    cluster.stop(4);
    let started = std::time::Instant::now();
    let mut lease = claim_won(&store, &request("w", "hung", 1_000)).await;
    store
        .renew(&mut lease)
        .await
        .expect("renew with 2 of 5 hung");
    assert!(
        started.elapsed() < node_timeout * 10,
        "took {:?} with a hung minority",
        started.elapsed()
    );
    store.release(&lease).await;

    cluster.stop(2);
    let started = std::time::Instant::now();
    let outcome = store.claim(&request("w", "hung", 2_000)).await;
    assert!(
        matches!(outcome, ClaimOutcome::NoQuorum(_)),
        "expected no quorum, got {outcome:?}"
    );
    assert!(
        started.elapsed() < node_timeout * 10,
        "took {:?} with a hung majority",
        started.elapsed()
    );
    for node in 2..5 {
        cluster.cont(node);
    }
}

/// etcd: a member killed, then restarted: claims, renewals and releases go on with the two left, the claims
/// made meanwhile stay claimed after the member rejoins, and tokens keep rising.
pub(super) async fn a_member_killed_and_restarted_costs_no_grant(backend: Backend) {
    let mut nodes = backend.start();
    let store = nodes.store(etcd::settings());
    let Cluster::Etcd(cluster) = &mut nodes else {
        panic!("an etcd cluster")
    };
    let first = won(etcd::claim_until_final(&store, &request("w", "killed", 1_000)).await);
    store.release(&first).await;
    let victim = (cluster.leader() + 1) % cluster.len();
    cluster.kill(victim);
    let mut lease = won(etcd::claim_until_final(&store, &request("w", "killed", 2_000)).await);
    assert!(lease.token > first.token);
    etcd::renew_until_confirmed(&store, &mut lease).await;
    store.release(&lease).await;
    cluster.restart(victim);
    let again = etcd::claim_until_final(&store, &request("other", "killed", 2_000)).await;
    assert!(
        matches!(again, ClaimOutcome::AlreadyClaimed { .. }),
        "a claimed tick was granted again after the member rejoined: {again:?}"
    );
    let third = won(etcd::claim_until_final(&store, &request("w", "killed", 3_000)).await);
    assert!(third.token > lease.token);
}

/// etcd: the leader hung (SIGSTOP: its connections stay open and silent): the others elect a new leader, and
/// the same claimant's retries are granted once; a contender of the same tick is refused; after the old
/// leader resumes it follows, and the tick stays claimed.
pub(super) async fn a_hung_leader_costs_an_election_not_a_grant(backend: Backend) {
    let mut nodes = backend.start();
    let store = nodes.store(etcd::settings());
    let Cluster::Etcd(cluster) = &mut nodes else {
        panic!("an etcd cluster")
    };
    let first = won(etcd::claim_until_final(&store, &request("w", "hung", 1_000)).await);
    store.release(&first).await;
    let leader = cluster.leader();
    cluster.stop(leader);
    let mut lease = won(etcd::claim_until_final(&store, &request("a", "hung", 2_000)).await);
    etcd::renew_until_confirmed(&store, &mut lease).await;
    let contender = etcd::claim_until_final(&store, &request("b", "hung", 2_000)).await;
    assert!(
        matches!(contender, ClaimOutcome::AlreadyClaimed { .. }),
        "{contender:?}"
    );
    cluster.cont(leader);
    let late = etcd::claim_until_final(&store, &request("c", "hung", 2_000)).await;
    assert!(
        matches!(late, ClaimOutcome::AlreadyClaimed { .. }),
        "{late:?}"
    );
}
