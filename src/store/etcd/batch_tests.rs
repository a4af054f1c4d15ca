//! A batch's rounds against a real etcd cluster (the harness's three members): what a failed compare of
//! one claim does to the others of its transaction.

use std::time::Duration;

use testkit::EtcdCluster;

use super::{groups, Claim, CLAIMS_PER_WRITE};
use crate::config::EtcdConfig;
use crate::history::HistorySettings;
use crate::lock::{ClaimOutcome, ClaimRequest, LockSettings, Overlap};
use crate::schedule::Tick;
use crate::store::etcd::EtcdStore;
use crate::store::Claims as _;

fn store(cluster: &EtcdCluster) -> EtcdStore {
    store_with_ttl(cluster, Duration::from_secs(10))
}

/// A store whose lock TTL is `ttl`.
fn store_with_ttl(cluster: &EtcdCluster, ttl: Duration) -> EtcdStore {
    let config = EtcdConfig {
        endpoints: cluster.endpoints(),
        user: None,
        trusted_ca_file: None,
        client_identity: None,
    };
    let settings = LockSettings {
        ttl,
        node_timeout: Duration::from_secs(2),
        ..LockSettings::default()
    };
    EtcdStore::new(&config, settings, HistorySettings::default()).expect("a store")
}

/// The claims of `requests` as a batch has them after its read.
async fn read<'a>(store: &EtcdStore, requests: &'a [ClaimRequest]) -> Vec<Claim<'a>> {
    let deadline = crate::clock::boot::BootInstant::now() + Duration::from_secs(5);
    let claims = store.read_claims(requests, deadline).await;
    claims.into_iter().map(|c| c.expect("a read")).collect()
}

/// One claim's compare failing refuses only that claim: the other claims of its write transaction are
/// granted (at that transaction's one revision), and the refused one decides again on what it reads
/// back — already claimed by the claimant whose write came between its read and its write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_compare_refuses_only_its_own_claim() {
    let cluster = EtcdCluster::start();
    let (ours, theirs) = (store(&cluster), store(&cluster));
    let requests: Vec<ClaimRequest> = ["a", "b", "c"]
        .iter()
        .map(|job| ClaimRequest::new("ours", job, Tick(60_000), Overlap::Skip, "f"))
        .collect();
    let claims = read(&ours, &requests).await;
    // Between our read and our write another worker claims `b`.
    let other = ClaimRequest::new("theirs", "b", Tick(60_000), Overlap::Skip, "f");
    let [ClaimOutcome::Won(their_lease)] = &theirs.claim_many(&[other]).await[..] else {
        panic!("the other worker's claim of b was not granted");
    };
    let mut outcomes: Vec<Option<ClaimOutcome>> = vec![None, None, None];
    let mut record = |index: usize, outcome| outcomes[index] = Some(outcome);
    let again = ours.round(claims, &mut record).await;
    assert_eq!(again.len(), 1, "only b decides again");
    assert_eq!(again[0].request.job, "b");
    let again = ours.round(again, &mut record).await;
    assert!(again.is_empty());
    let tokens: Vec<u64> = [0, 2]
        .iter()
        .map(|&i| match &outcomes[i] {
            Some(ClaimOutcome::Won(lease)) => lease.token,
            other => panic!("claim {i} not granted: {other:?}"),
        })
        .collect();
    // Tokens are per job, each at least its tick's floor (tick × 1000): a and c are granted on their own
    // fences, whatever the other worker's claim of b wrote.
    assert!(
        tokens.iter().all(|token| *token >= 60_000 * 1_000),
        "{tokens:?}"
    );
    assert!(their_lease.token >= 60_000 * 1_000);
    match &outcomes[1] {
        Some(ClaimOutcome::AlreadyClaimed { by: Some(by) }) => {
            assert_eq!(by.tick, Some(Tick(60_000)));
        }
        other => panic!("b: {other:?}"),
    }
}

/// A claim whose etcd lease is not granted wrote nothing, and is decided on its keys read again: a
/// claim of a job another worker took meanwhile is told it lost (not `no_quorum`, which would leave a
/// loser of a busy cluster's herd undecided), and one nobody took fails with the grant's failure. Our
/// grants are refused here by a TTL above etcd's maximum lease TTL (9,000,000,000 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_grant_failed_is_decided_on_its_keys_read_again() {
    let cluster = EtcdCluster::start();
    let ours = store_with_ttl(&cluster, Duration::from_secs(10_000_000_000));
    let theirs = store(&cluster);
    let requests: Vec<ClaimRequest> = ["a", "b"]
        .iter()
        .map(|job| ClaimRequest::new("ours", job, Tick(60_000), Overlap::Skip, "f"))
        .collect();
    let claims = read(&ours, &requests).await;
    // Between our read and our grants another worker claims `b`.
    let other = ClaimRequest::new("theirs", "b", Tick(60_000), Overlap::Skip, "f");
    let [ClaimOutcome::Won(_)] = &theirs.claim_many(&[other]).await[..] else {
        panic!("the other worker's claim of b was not granted");
    };
    let mut outcomes: Vec<Option<ClaimOutcome>> = vec![None, None];
    let mut record = |index: usize, outcome| outcomes[index] = Some(outcome);
    let again = ours.round(claims, &mut record).await;
    assert!(again.is_empty(), "a failed grant is not tried again");
    match &outcomes[0] {
        Some(ClaimOutcome::NoQuorum(failure)) => {
            let why = format!("{failure:?}");
            assert!(why.contains("lease TTL"), "a: {why}");
        }
        other => panic!("a: {other:?}"),
    }
    match &outcomes[1] {
        Some(ClaimOutcome::AlreadyClaimed { by: Some(by) }) => {
            assert_eq!(by.tick, Some(Tick(60_000)));
        }
        other => panic!("b: {other:?}"),
    }
}

/// The write transactions of a round never hold two claims of one job (etcd refuses a transaction that
/// writes one key twice, and its writes share one revision, the token), nor more than
/// [`CLAIMS_PER_WRITE`] claims; a claim whose transaction failed as a whole is written alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_never_put_one_job_twice_in_a_transaction() {
    let cluster = EtcdCluster::with_members(1);
    let store = store(&cluster);
    let mut requests: Vec<ClaimRequest> = (0..300)
        .map(|j| ClaimRequest::new("w", &format!("j{j}"), Tick(1_000), Overlap::Skip, "f"))
        .collect();
    requests.extend((0..3).map(|t| ClaimRequest::new("w", "j0", Tick(t), Overlap::Skip, "f")));
    let mut claims = read(&store, &requests).await;
    claims[1].alone = true;
    let groups = groups(claims);
    let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
    assert!(sizes.iter().all(|n| *n <= CLAIMS_PER_WRITE), "{sizes:?}");
    assert!(groups
        .iter()
        .any(|g| g.len() == 1 && g[0].request.job == "j1"));
    assert_eq!(sizes.iter().sum::<usize>(), 303);
    for group in &groups {
        let mut jobs: Vec<&str> = group.iter().map(|c| c.request.job.as_str()).collect();
        jobs.sort_unstable();
        let n = jobs.len();
        jobs.dedup();
        assert_eq!(jobs.len(), n, "a job twice in one transaction");
    }
}
