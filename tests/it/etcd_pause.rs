//! `redcron pause` and `resume` on etcd against their own late copies (issue 12). The store fails over
//! from a silent member, so a request can reach etcd twice, and the copy left in a hung member applies
//! when it wakes: a plain put of the pause would then pause the job again after a later `resume`. Each
//! pause and resume is a transaction guarded by the job's `…:pause_seq` revision; a late copy is that
//! same transaction with the guard read before the newer write, which is what these tests send.
//!
//! Why not the hung member itself: SIGSTOPping the member a `pause` goes to first, then `resume`, then
//! SIGCONT, never re-applied the buffered copy even before the fix (4 runs; presumably the woken member
//! also reads the client's cancellation of the request), so such a test would prove nothing either way.

use std::time::{Duration, Instant};

use chrono::Utc;
use redcron::lock::{ClaimOutcome, InForce, Pause};
use redcron::store::etcd::{EtcdStore, Guarded};
use redcron::store::Store;

use crate::etcd::{claim_until_final, request, store};
use crate::support::{won, EtcdCluster};

fn pause(for_ms: Option<i64>, reason: &str) -> Pause {
    Pause {
        until: for_ms.map(|ms| Utc::now() + chrono::Duration::milliseconds(ms)),
        by: "ops@test".to_string(),
        reason: reason.to_string(),
    }
}

fn etcd_of(store: &Store) -> &EtcdStore {
    match store {
        Store::Etcd(etcd) => etcd,
        _ => panic!("not an etcd store"),
    }
}

/// The reason of `job`'s pause as `redcron status` reads it, `None` if it is not paused.
async fn paused_for(store: &Store, job: &str) -> Option<String> {
    let read = store.pauses(&[job.to_string()]).await.expect("pauses read");
    read.value[0].as_ref().map(|read| read.pause.reason.clone())
}

fn refused(answer: Guarded) {
    assert!(matches!(answer, Guarded::Refused(_)), "applied: {answer:?}");
}

/// A late copy of each kind changes nothing: a pause after a later resume (the job runs), an old
/// `pause --for 1h` after a newer `--for 5m` (the newer stands), a resume after a later pause (the job
/// stays paused); the live commands, meanwhile, apply and answer as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_pause_or_resume_changes_nothing() {
    let cluster = EtcdCluster::start();
    let store = store(&cluster);
    let etcd = etcd_of(&store);

    // pause, resume, then the pause's late copy: the job stays resumed and its tick is granted.
    let before_pause = etcd.pause_guard("job").await.expect("guard");
    store
        .pause("job", &pause(None, "first"), InForce::KeepLonger)
        .await
        .expect("paused");
    assert!(store.resume("job").await.expect("resumed"));
    refused(
        etcd.pause_if("job", &pause(None, "first"), before_pause)
            .await
            .expect("answer"),
    );
    assert_eq!(paused_for(&store, "job").await, None);
    let lease = won(claim_until_final(&store, &request("w", "job", 1_000)).await);
    store.release(&lease).await;

    // pause --for 1h, pause --for 5m --replace, then the first one's late copy: the 5-minute pause
    // stands.
    let before_long = etcd.pause_guard("job").await.expect("guard");
    let long = pause(Some(3_600_000), "long");
    store
        .pause("job", &long, InForce::KeepLonger)
        .await
        .expect("paused");
    store
        .pause("job", &pause(Some(300_000), "short"), InForce::Replace)
        .await
        .expect("paused");
    refused(
        etcd.pause_if("job", &long, before_long)
            .await
            .expect("answer"),
    );
    assert_eq!(paused_for(&store, "job").await.as_deref(), Some("short"));

    // resume, pause, then the resume's late copy: the job stays paused and its tick is refused.
    let before_resume = etcd.pause_guard("job").await.expect("guard");
    assert!(store.resume("job").await.expect("resumed"));
    store
        .pause("job", &pause(None, "newer"), InForce::KeepLonger)
        .await
        .expect("paused");
    refused(etcd.resume_if("job", before_resume).await.expect("answer"));
    assert_eq!(paused_for(&store, "job").await.as_deref(), Some("newer"));
    match store.claim(&request("w", "job", 2_000)).await {
        ClaimOutcome::Paused(pause) => assert_eq!(pause.reason, "newer"),
        other => panic!("expected Paused, got {other:?}"),
    }

    // A copy under the current guard applies once; a second copy of it does not.
    let now = etcd.pause_guard("job").await.expect("guard");
    assert_eq!(
        etcd.resume_if("job", now).await.expect("answer"),
        Guarded::Applied { was_paused: true }
    );
    refused(etcd.resume_if("job", now).await.expect("answer"));
    assert!(!store.resume("job").await.expect("resumed"));
}

/// A `--for` pause that etcd ended (its lease expired) refuses a write carrying the guard read while it
/// stood: `resume` reads again and answers that there was no pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_ended_refuses_a_write_guarded_before() {
    let cluster = EtcdCluster::start();
    let store = store(&cluster);
    let etcd = etcd_of(&store);
    store
        .pause("job", &pause(Some(1_000), "brief"), InForce::KeepLonger)
        .await
        .expect("paused");
    let while_paused = etcd.pause_guard("job").await.expect("guard");
    // etcd's leases live whole seconds, expired by the leader every 500 ms: a margin for a loaded host.
    let deadline = Instant::now() + Duration::from_secs(20);
    while paused_for(&store, "job").await.is_some() {
        assert!(Instant::now() < deadline, "the 1 s pause never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    refused(etcd.resume_if("job", while_paused).await.expect("answer"));
    assert!(!store.resume("job").await.expect("resumed"));
}
