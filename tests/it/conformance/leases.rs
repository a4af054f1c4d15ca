//! Leases: renewal keeps one past its TTL; a lease that expired or whose renewal came too late is lost
//! for good, never renewed again; a release never deletes the next holder's lease.

use std::time::Duration;

use redcron::lock::{ClaimOutcome, RenewError};

use super::{request, settings, settled, warm};
use crate::support::{won, Backend};

/// Expiry: A stops renewing and its lease expires; B acquires the next tick with a higher token; A's renew
/// fails and stays failed; A's release leaves B's lease alone, and the job is still busy for a third.
pub(super) async fn expired_holder_cannot_renew_or_release_the_next_holder(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(settings(300));
    warm(&store).await;
    let mut a = won(settled(&store, &request("a", "exp", 1_000)).await);
    tokio::time::sleep(backend.expiry(store.settings().ttl)).await;
    let mut b = won(settled(&store, &request("b", "exp", 2_000)).await);
    assert!(b.token > a.token);
    assert!(store.renew(&mut a).await.expect_err("A expired").is_lost());
    assert_eq!(store.renew(&mut a).await, Err(RenewError::AlreadyLost));
    store.release(&a).await;
    store
        .renew(&mut b)
        .await
        .expect("B still holds its lease after A's release");
    let outcome = settled(&store, &request("c", "exp", 3_000)).await;
    assert!(matches!(outcome, ClaimOutcome::Busy { .. }), "{outcome:?}");
}

/// Renewed every third of its TTL, a lease outlives its TTL several times over, and holds the job.
pub(super) async fn renewal_keeps_a_lease_past_its_ttl(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(settings(1_000));
    warm(&store).await;
    let ttl = store.settings().ttl;
    let mut lease = won(settled(&store, &request("a", "kept", 1_000)).await);
    let held_until = tokio::time::Instant::now() + ttl * 2;
    while tokio::time::Instant::now() < held_until {
        tokio::time::sleep(ttl / 4).await;
        store
            .renew(&mut lease)
            .await
            .expect("renewal within the validity");
    }
    assert!(lease.is_valid());
    let busy = settled(&store, &request("b", "kept", 2_000)).await;
    assert!(matches!(busy, ClaimOutcome::Busy { .. }), "{busy:?}");
}

/// A renewal that reaches a majority only after the deadline does not revive the lease, even when the
/// keys are still there: here the majority is hung (on the embedded store, its file locked) until after
/// the deadline.
pub(super) async fn renewal_after_the_deadline_never_revives(backend: Backend) {
    let mut cluster = backend.start();
    // Above the embedded store's busy timeout (2 s), so that its first renewal fails before the deadline.
    let ttl = match backend {
        Backend::Embedded => 4_000,
        Backend::Redis
        | Backend::RedisSentinel
        | Backend::RedisCluster
        | Backend::Etcd
        | Backend::Postgres
        | Backend::Mariadb
        | Backend::Zookeeper => 400,
    };
    let store = cluster.store(settings(ttl));
    warm(&store).await;
    let mut lease = won(settled(&store, &request("a", "revive", 1_000)).await);
    let stopped = cluster.stop_majority();
    let first = store.renew(&mut lease).await.expect_err("majority hung");
    assert!(
        !first.is_lost(),
        "a timeout before the deadline is not yet a loss: {first:?}"
    );
    tokio::time::sleep(lease.remaining() + Duration::from_millis(10)).await;
    cluster.cont_all(&stopped);
    assert!(store
        .renew(&mut lease)
        .await
        .expect_err("deadline passed")
        .is_lost());
    assert_eq!(store.renew(&mut lease).await, Err(RenewError::AlreadyLost));
}
