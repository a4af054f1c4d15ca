//! Series, pauses and trigger requests on a real etcd cluster, at the store: what the etcd store does in
//! its own way (etcd leases instead of TTLs on node clocks, a trigger's claim anchored on its request
//! key). The worker-level pause, trigger and retry tests run on both stores (`pause.rs`, `trigger.rs`,
//! `retries.rs`).

use std::time::{Duration, Instant};

use chrono::Utc;
use etcd_client::{Client, LeaseTimeToLiveOptions};
use redcron::lock::{ClaimOutcome, ClaimRequest, LockSettings, Series};
use redcron::schedule::Tick;
use redcron::store::Store;
use redcron::trigger::TriggerRequest;

use crate::support::{won, Backend, Cluster};

fn request(worker: &str, tick: Tick) -> ClaimRequest {
    crate::conformance::request(worker, "job", tick.0)
}

/// Polls `check` every 100 ms until it holds, for at most `limit`.
async fn eventually(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The TTL etcd gave the lease that key `key` is bound to (`None`: bound to none).
async fn lease_ttl(endpoints: &[String], key: &str) -> Option<i64> {
    let mut client = Client::connect(endpoints, None).await.expect("connect");
    let got = client.get(key, None).await.expect("get");
    let lease = got.kvs().first().expect("the key exists").lease();
    if lease == 0 {
        return None;
    }
    let options = LeaseTimeToLiveOptions::new();
    let answer = client
        .lease_time_to_live(lease, Some(options))
        .await
        .expect("lease TTL");
    Some(answer.granted_ttl())
}

/// A trigger's claim is won once, with a token above the schedule's, and its record is bound to an etcd
/// lease of its window + 1 h (etcd forgets it by itself); once the request is forgotten no other claimant
/// gets it, and a trigger that was never requested (or has expired) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trigger_is_claimed_once_while_its_request_stands() {
    let cluster = Backend::Etcd.start();
    let Cluster::Etcd(etcd) = &cluster else {
        unreachable!("an etcd cluster")
    };
    let store: Store = cluster.store(LockSettings::default());
    let now = Utc::now();
    let scheduled = won(store
        .claim(&request("a", Tick(now.timestamp_millis() - 1_000)))
        .await);
    store.release(&scheduled).await;

    let trigger = TriggerRequest::new("job", now, Duration::from_secs(30), "ops@test");
    store.request_trigger(&trigger).await.expect("requested");
    let listed = store.triggers().await.expect("read").value;
    assert_eq!(listed, std::slice::from_ref(&trigger));
    let series = Series::Trigger(trigger.id.clone());
    let not_after = Tick(trigger.not_after.timestamp_millis());
    let claim = |worker| request(worker, trigger.tick()).in_series(series.clone(), not_after);
    let lease = won(store.claim(&claim("b")).await);
    assert!(
        lease.token > scheduled.token,
        "{lease:?} after {scheduled:?}"
    );
    let record = format!("redcron:{{job}}:claim:trigger:{}", trigger.id);
    let ttl = lease_ttl(&etcd.endpoints(), &record)
        .await
        .expect("a lease");
    assert!((3_600 + 30..=3_600 + 31).contains(&ttl), "record TTL {ttl}");
    store.release(&lease).await;

    store.forget_trigger(&trigger.id);
    eventually("the request deleted", Duration::from_secs(10), async || {
        store
            .triggers()
            .await
            .is_ok_and(|read| read.value.is_empty())
    })
    .await;
    match store.claim(&claim("c")).await {
        ClaimOutcome::AlreadyClaimed { by: Some(by) } => assert_eq!(by.worker, "b"),
        other => panic!("expected the record to refuse, got {other:?}"),
    }
    let never = request("c", trigger.tick()).in_series(Series::Trigger("0ff".into()), not_after);
    assert!(matches!(
        store.claim(&never).await,
        ClaimOutcome::AlreadyClaimed { by: None }
    ));
}
