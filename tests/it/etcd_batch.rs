//! Many claims in one batch on etcd (`store/etcd/batch.rs`): a few transactions for hundreds of claims,
//! and each claim still decided on its own — two claims of one job, contenders racing the same batch.
//! (A failed compare inside a shared write transaction is proved against the store's rounds themselves,
//! `cargo test --lib store::etcd::batch`.)

use redcron::lock::{ClaimOutcome, ClaimRequest, Overlap, Series};
use redcron::schedule::Tick;

use crate::etcd::{request, store};
use crate::support::{won, EtcdCluster};

/// The transactions etcd's members answered so far (`grpc_server_handled_total` of method `Txn`,
/// summed over the members: each request is answered by one).
fn transactions(cluster: &EtcdCluster) -> u64 {
    (0..cluster.len())
        .filter_map(|i| cluster.metrics(i))
        .flat_map(|text| {
            text.lines()
                .filter(|l| l.starts_with("grpc_server_handled_total{"))
                .filter(|l| l.contains("grpc_method=\"Txn\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum::<f64>() as u64
}

/// A batch of 300 claims (more than etcd's `--max-txn-ops`, 128, allows operations in one transaction)
/// raced by two stores at once: every job is granted exactly once, the loser is told it is claimed, and
/// the two batches cost a few dozen transactions, not the 1,200 reads and writes of one claim at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_larger_than_max_txn_ops_grants_each_job_once_in_few_transactions() {
    let cluster = EtcdCluster::start();
    let (a, b) = (store(&cluster), store(&cluster));
    won(crate::etcd::claim_until_final(&a, &request("a", "warm-a", 1)).await);
    won(crate::etcd::claim_until_final(&b, &request("b", "warm-b", 1)).await);
    let jobs: Vec<String> = (0..300).map(|j| format!("herd-{j}")).collect();
    let of = |worker: &str| -> Vec<ClaimRequest> {
        jobs.iter()
            .map(|job| request(worker, job, 60_000))
            .collect()
    };
    let (ra, rb) = (of("a"), of("b"));
    let before = transactions(&cluster);
    let (oa, ob) = tokio::join!(a.claim_many(&ra), b.claim_many(&rb));
    let spent = transactions(&cluster) - before;
    for (job, (x, y)) in jobs.iter().zip(oa.iter().zip(&ob)) {
        let wins = [x, y]
            .iter()
            .filter(|o| matches!(o, ClaimOutcome::Won(_)))
            .count();
        assert_eq!(wins, 1, "{job}: {x:?} / {y:?}");
        let lost = if matches!(x, ClaimOutcome::Won(_)) {
            y
        } else {
            x
        };
        assert!(
            matches!(lost, ClaimOutcome::AlreadyClaimed { by: Some(_) }),
            "{job}: the loser was told {lost:?}"
        );
    }
    // At least each batch's reads (900 gets, 128 a transaction: 8) are counted; 22 in a quiet run.
    assert!(
        (16..=60).contains(&spent),
        "{spent} transactions for two batches of 300 claims"
    );
}

/// Claims of one job in one batch are decided one after the other, never in one write transaction: of
/// two claimants of the same `(job, tick)` one is granted and the other told it is claimed; a job's
/// scheduled tick and a retry of it (`overlap: allow`, their own lease keys and records) are both granted,
/// with two different tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_claims_of_one_job_in_one_batch_get_their_own_transactions() {
    let cluster = EtcdCluster::start();
    let store = store(&cluster);
    won(crate::etcd::claim_until_final(&store, &request("w", "warm", 1)).await);
    let scheduled = ClaimRequest::new("w", "allow", Tick(60_000), Overlap::Allow, "f");
    // A one-off claim's window ends on this host's clock: an hour from now.
    let window = Tick(chrono::Utc::now().timestamp_millis() + 3_600_000);
    let retry = ClaimRequest::new("w", "allow", Tick(60_000), Overlap::Allow, "f")
        .in_series(Series::Retry(1), window);
    let requests = [
        request("x", "twice", 60_000),
        request("y", "twice", 60_000),
        scheduled,
        retry,
        request("x", "other", 60_000),
    ];
    let outcomes = store.claim_many(&requests).await;
    let won_twice = outcomes[..2]
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Won(_)))
        .count();
    assert_eq!(won_twice, 1, "{:?}", &outcomes[..2]);
    assert!(
        outcomes[..2]
            .iter()
            .any(|o| matches!(o, ClaimOutcome::AlreadyClaimed { by: Some(_) })),
        "{:?}",
        &outcomes[..2]
    );
    let tokens: Vec<u64> = outcomes[2..]
        .iter()
        .map(|o| match o {
            ClaimOutcome::Won(lease) => lease.token,
            other => panic!("not granted: {other:?}"),
        })
        .collect();
    assert_ne!(tokens[0], tokens[1], "one job's two grants share a token");
}
