//! The lease, claim and token protocol against real stores.
//!
//! Every claim in `docs/protocol.md` has a test here; each test says which. The tests that take a
//! [`Backend`] are one suite, run on 5 Redis nodes (`lock::redis::…`) and on a 3-member etcd cluster
//! (`lock::etcd::…`) by [`on_every_store!`](crate::on_every_store); the others are about Redis nodes
//! (a minority down or hung, a node restarted empty, persistence, TLS), and the etcd cluster's own
//! faults are in `tests/it/etcd.rs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redcron::lock::{ClaimOutcome, ClaimRequest, LockSettings, Overlap, RenewError};
use redcron::schedule::Tick;
use redcron::store::redis::RedisStore;
use redcron::store::Leases as _;
use redcron::store::Store;

use crate::support::{claim_won, store_on, won, Backend, Persistence, RedisCluster};

crate::on_every_store!(
    async: [
        acquire_renew_release,
        two_hundred_contenders_one_winner,
        successive_leases_have_strictly_increasing_tokens,
        expired_holder_cannot_renew_or_release_the_next_holder,
        renewal_after_the_deadline_never_revives,
        a_claimed_tick_is_never_granted_again,
    ],
    sync: [contenders_in_three_processes_one_winner],
);

/// Settings for tests: a short TTL so expiry tests are quick, the default node timeout.
fn settings(ttl_ms: u64) -> LockSettings {
    LockSettings {
        ttl: Duration::from_millis(ttl_ms),
        renew_every: Duration::from_millis(ttl_ms / 3),
        node_timeout: Duration::from_millis(50),
        retry_delay: Duration::from_millis(30),
        ..LockSettings::default()
    }
}

/// Settings for races of many contenders in one process: each round carries hundreds of requests per
/// node, so a loaded CI machine needs more than 50 ms per node to answer them all.
fn race_settings() -> LockSettings {
    LockSettings {
        node_timeout: Duration::from_millis(400),
        retries: 5,
        ..settings(5_000)
    }
}

fn store(cluster: &RedisCluster, settings: LockSettings) -> Store {
    Store::Redis(RedisStore::new(&cluster.urls(), settings).expect("valid node URLs"))
}

/// A new claimant of `(job, tick)` for `worker`, with `overlap: skip`.
fn request(worker: &str, job: &str, tick: i64) -> ClaimRequest {
    ClaimRequest::new(worker, job, Tick(tick), Overlap::Skip, "test")
}

/// Waits until every node of a fresh store answers, so that the first claim does not race the connects.
async fn warm(store: &Store) {
    let _ = store.claim(&request("warm-up", "warm-up", 1)).await;
}

/// The outcome of `request` once final: a `NoQuorum` or `Contended` answer (a node slow on a loaded
/// machine) is retried with the same claimant, as the worker does, so the test sees what the tick is.
async fn settled(store: &Store, request: &ClaimRequest) -> ClaimOutcome {
    let mut outcome = store.claim(request).await;
    for _ in 0..20 {
        let Some(wait) = outcome.retry_in() else {
            break;
        };
        tokio::time::sleep(wait.max(Duration::from_millis(20))).await;
        outcome = store.claim(request).await;
    }
    outcome
}

/// Happy path: acquire, renew, release; validity is positive and below the TTL; the token is above the
/// tick's floor on Redis, and is the claim's revision (above zero) on etcd.
async fn acquire_renew_release(backend: Backend) {
    let cluster = backend.start();
    let store = cluster.store(settings(2_000));
    warm(&store).await;
    let mut lease = won(settled(&store, &request("w1", "report", 1_000)).await);
    assert!(lease.is_valid());
    assert!(lease.remaining() > Duration::ZERO && lease.remaining() < Duration::from_millis(2_000));
    let floor = match backend {
        Backend::Redis => 1_000 * 1000,
        Backend::Etcd => 1,
    };
    assert!(
        lease.token >= floor,
        "token {} is below {floor}",
        lease.token
    );
    let before = lease.deadline();
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
        .renew(&mut lease)
        .await
        .expect("renewal with all nodes up");
    assert!(lease.deadline() > before, "renewal moves the deadline");
    store.release(&lease).await;
    // Released: the next tick is free at once (no waiting for the TTL).
    won(settled(&store, &request("w2", "report", 2_000)).await);
}

/// 200 contenders (tasks) race for the same (job, tick): exactly one lease.
async fn two_hundred_contenders_one_winner(backend: Backend) {
    let cluster = backend.start();
    let store = Arc::new(cluster.store(race_settings()));
    warm(&store).await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(
                async move { store.claim(&request(&format!("w{i}"), "race", 1_000)).await },
            )
        })
        .collect();
    let mut winners = 0;
    let mut lost = std::collections::BTreeMap::new();
    for task in tasks {
        match task.await.expect("task") {
            ClaimOutcome::Won(_) => winners += 1,
            other => {
                *lost
                    .entry(format!("{other:?}").chars().take(60).collect::<String>())
                    .or_insert(0) += 1
            }
        }
    }
    assert_eq!(winners, 1, "losers: {lost:?}");
}

/// The same race with contenders in 3 separate processes (this test binary re-run as a contender).
fn contenders_in_three_processes_one_winner(backend: Backend) {
    let cluster = backend.start();
    let exe = std::env::current_exe().expect("test binary path");
    let children: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "lock::contender_process",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("REDCRON_TEST_CONTENDER_STORE", cluster.spec())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn contender process")
        })
        .collect();
    let mut winners = 0;
    let mut transcript = String::new();
    for child in children {
        let output = child.wait_with_output().expect("contender output");
        let stdout = String::from_utf8_lossy(&output.stdout);
        transcript.push_str(&stdout);
        assert!(output.status.success(), "contender failed: {stdout}");
        assert!(
            stdout.contains("CONTENDER done"),
            "contender did not run: {stdout}"
        );
        winners += stdout
            .lines()
            .filter(|line| line.contains("CONTENDER won"))
            .count();
    }
    assert_eq!(winners, 1, "{transcript}");
}

/// One of the contender processes of `contenders_in_three_processes_one_winner` (does nothing when run
/// on its own).
#[test]
#[ignore = "run by contenders_in_three_processes_one_winner"]
fn contender_process() {
    let Ok(spec) = std::env::var("REDCRON_TEST_CONTENDER_STORE") else {
        return;
    };
    let backend = if spec.starts_with("etcd|") {
        Backend::Etcd
    } else {
        Backend::Redis
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = Arc::new(store_on(&spec, backend.adapt(race_settings())));
        warm(&store).await;
        // Start together: at the next 300 ms boundary of the wall clock, which all three processes share.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis();
        tokio::time::sleep(Duration::from_millis((600 - (now % 300)) as u64)).await;
        let tasks: Vec<_> = (0..67)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    store
                        .claim(&request(
                            &format!("p{}-{i}", std::process::id()),
                            "race",
                            7_000,
                        ))
                        .await
                })
            })
            .collect();
        let mut lost = std::collections::BTreeMap::new();
        for task in tasks {
            match task.await.expect("task") {
                ClaimOutcome::Won(lease) => println!("CONTENDER won {}", lease.token),
                other => {
                    *lost
                        .entry(format!("{other:?}").chars().take(40).collect::<String>())
                        .or_insert(0) += 1
                }
            }
        }
        println!("CONTENDER done; lost: {lost:?}");
    });
}

/// 100 successive leases of one job from contending tasks: tokens strictly increase, no two equal.
async fn successive_leases_have_strictly_increasing_tokens(backend: Backend) {
    let cluster = backend.start();
    let store = Arc::new(cluster.store(race_settings()));
    warm(&store).await;
    let mut tokens = Vec::new();
    for tick in 1..=100 {
        let tasks: Vec<_> = (0..4)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(
                    async move { store.claim(&request(&format!("w{i}"), "succ", tick)).await },
                )
            })
            .collect();
        let mut leases = Vec::new();
        for task in tasks {
            if let ClaimOutcome::Won(lease) = task.await.expect("task") {
                leases.push(lease);
            }
        }
        assert_eq!(leases.len(), 1, "tick {tick}: exactly one winner");
        tokens.push(leases[0].token);
        store.release(&leases[0]).await;
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
}

/// A minority down (2 of 5 killed): acquire and renew still work. A majority down (3 of 5): no quorum,
/// reported promptly and naming the failed nodes.
#[tokio::test]
async fn minority_down_works_majority_down_reports_no_quorum() {
    let mut cluster = RedisCluster::start(5);
    let store = store(&cluster, settings(2_000));
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

/// Hung nodes (SIGSTOP, not refused): with 2 of 5 hung, acquire and renew still work; with 3 of 5 hung, no
/// quorum. Both return within a small multiple of the node timeout, not after a TCP or client timeout.
#[tokio::test]
async fn hung_nodes_cost_one_node_timeout() {
    let mut cluster = RedisCluster::start(5);
    let node_timeout = Duration::from_millis(50);
    let store = store(&cluster, settings(2_000));
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

/// Expiry: A stops renewing and its lease expires; B acquires the next tick with a higher token; A's renew
/// fails and stays failed; A's release leaves B's lease alone.
async fn expired_holder_cannot_renew_or_release_the_next_holder(backend: Backend) {
    let cluster = backend.start();
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
    // And the job is still held by B for a third contender.
    let outcome = settled(&store, &request("c", "exp", 3_000)).await;
    assert!(matches!(outcome, ClaimOutcome::Busy { .. }), "{outcome:?}");
}

/// A renewal that reaches a majority only after the deadline does not revive the lease, even when the
/// keys are still there: here the majority is hung until after the deadline.
async fn renewal_after_the_deadline_never_revives(backend: Backend) {
    let mut cluster = backend.start();
    let store = cluster.store(settings(400));
    warm(&store).await;
    let mut lease = won(settled(&store, &request("a", "revive", 1_000)).await);
    let stopped = cluster.stop_majority();
    let first = store.renew(&mut lease).await.expect_err("majority hung");
    assert!(
        !first.is_lost(),
        "a timeout before the deadline is not yet a loss: {first:?}"
    );
    tokio::time::sleep(lease.remaining() + Duration::from_millis(10)).await;
    cluster.cont(&stopped);
    assert!(store
        .renew(&mut lease)
        .await
        .expect_err("deadline passed")
        .is_lost());
    assert_eq!(store.renew(&mut lease).await, Err(RenewError::AlreadyLost));
}

/// Tick claim: A acquires (job, T) and releases; B's acquire of (job, T) answers already claimed, and
/// (job, T+1) works. The claim also outlives the lease's expiry.
async fn a_claimed_tick_is_never_granted_again(backend: Backend) {
    let cluster = backend.start();
    let store = cluster.store(settings(300));
    warm(&store).await;
    let a = won(settled(&store, &request("a", "claim", 5_000)).await);
    store.release(&a).await;
    let outcome = settled(&store, &request("b", "claim", 5_000)).await;
    assert!(
        matches!(outcome, ClaimOutcome::AlreadyClaimed { .. }),
        "{outcome:?}"
    );
    // An earlier tick is refused for good. On Redis under load it may be refused as `Busy`: a node that
    // had not yet applied A's confirmation let B's attempt at T take its lease key there, and that lost
    // attempt's undo travels in the background.
    let outcome = settled(&store, &request("b", "claim", 4_000)).await;
    assert!(
        matches!(
            outcome,
            ClaimOutcome::AlreadyClaimed { .. } | ClaimOutcome::Busy { .. }
        ),
        "{outcome:?}"
    );
    let b = won(settled(&store, &request("b", "claim", 6_000)).await);
    // b's lease expires unreleased.
    tokio::time::sleep(backend.expiry(store.settings().ttl)).await;
    let outcome = settled(&store, &request("c", "claim", 6_000)).await;
    assert!(
        matches!(outcome, ClaimOutcome::AlreadyClaimed { .. }),
        "{outcome:?}"
    );
    assert!(b.token > a.token);
}

/// Split votes: contenders that each find the job's lease held by different minorities retry with jitter
/// and converge on exactly one winner; and 20 ticks raced by 10 contenders each get exactly one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn split_votes_converge_on_one_winner() {
    let cluster = RedisCluster::start(5);
    let mut lock = race_settings();
    lock.retries = 6;
    let store = Arc::new(store(&cluster, lock));
    warm(&store).await;
    // Two crashed contenders of the same tick left a minority each: nodes 0,1 and nodes 2,3 (300 ms to
    // live). Values are `<claimant>|<attempt>|<tick ms>|<fingerprint>`.
    for (node, holder) in [
        (0, "ghost-a/1|1|1000|x"),
        (1, "ghost-a/1|1|1000|x"),
        (2, "ghost-b/2|1|1000|x"),
        (3, "ghost-b/2|1|1000|x"),
    ] {
        let mut set = ::redis::cmd("SET");
        set.arg("redcron:{split}:lease")
            .arg(holder)
            .arg("PX")
            .arg(300);
        cluster.query::<()>(node, &set);
    }
    let race = |tick: i64| {
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    // As the worker does: the same request again while the outcome is not final.
                    let request = request(&format!("w{i}"), "split", tick);
                    let mut outcome = store.claim(&request).await;
                    for _ in 0..20 {
                        let Some(wait) = outcome.retry_in() else {
                            break;
                        };
                        tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
                        outcome = store.claim(&request).await;
                    }
                    outcome
                })
            })
            .collect();
        let store = Arc::clone(&store);
        async move {
            let mut winners = HashSet::new();
            for (i, task) in tasks.into_iter().enumerate() {
                if let ClaimOutcome::Won(lease) = task.await.expect("task") {
                    winners.insert(i);
                    store.release(&lease).await;
                }
            }
            winners.len()
        }
    };
    assert_eq!(race(1_000).await, 1, "split vote did not converge");
    for tick in 2..=20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(race(tick * 1_000).await, 1, "tick {tick}");
    }
}

/// One of 5 nodes restarted empty between two leases: tokens still strictly increase (the tick's floor
/// carries them), and the restarted node takes part again (its scripts are loaded after NOSCRIPT).
#[tokio::test]
async fn node_restarted_empty_keeps_tokens_increasing() {
    let mut cluster = RedisCluster::start(5);
    let store = store(&cluster, settings(2_000));
    warm(&store).await;
    let mut last = 0;
    for (round, tick) in (1..=6).map(|i| i * 60_000).enumerate() {
        let lease = claim_won(&store, &request("w", "restart", tick)).await;
        assert!(lease.token > last, "token {} after {last}", lease.token);
        last = lease.token;
        store.release(&lease).await;
        cluster.restart(round % 5);
    }
    // After every node was restarted once, all five answer again: stop two and claims still succeed.
    cluster.stop(0);
    cluster.stop(1);
    claim_won(&store, &request("w", "restart", 10_000_000)).await;
    cluster.cont(0);
    cluster.cont(1);
}

/// With the persistence `docs/protocol.md` requires (AOF, fsync always), claims and fence counters
/// survive a restart of every node: a claimed tick stays claimed, and tokens go on increasing.
#[tokio::test]
async fn claims_survive_restarts_with_required_persistence() {
    let mut cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::AppendOnlyAlways)
        .start();
    let store = store(&cluster, settings(2_000));
    warm(&store).await;
    let a = claim_won(&store, &request("a", "durable", 1_000)).await;
    store.release(&a).await;
    for node in 0..3 {
        cluster.kill(node);
        cluster.restart(node);
    }
    let store = store_for(&cluster);
    warm(&store).await;
    assert!(matches!(
        store.claim(&request("b", "durable", 1_000)).await,
        ClaimOutcome::AlreadyClaimed { .. }
    ));
    let b = claim_won(&store, &request("b", "durable", 1_001)).await;
    assert!(b.token > a.token);
}

fn store_for(cluster: &RedisCluster) -> Store {
    store(cluster, settings(2_000))
}

/// The plain lease (no claim, no token) is mutually exclusive and released by compare-and-delete.
#[tokio::test]
async fn plain_lease_is_exclusive() {
    let cluster = RedisCluster::start(3);
    let store = RedisStore::new(&cluster.urls(), settings(2_000)).expect("urls");
    let lease = won(store.acquire_lease("a", "resource").await);
    assert_eq!(lease.token, 0);
    assert!(matches!(
        store.acquire_lease("b", "resource").await,
        ClaimOutcome::Busy { .. }
    ));
    store.release(&lease).await;
    won(store.acquire_lease("b", "resource").await);
}

/// `rediss://` nodes: the same claim, renew and release over TLS.
#[tokio::test]
async fn claims_work_over_tls() {
    let cluster = RedisCluster::builder().nodes(3).tls(true).start();
    let store = store(&cluster, settings(2_000));
    warm(&store).await;
    let mut lease = claim_won(&store, &request("w", "tls", 1_000)).await;
    store.renew(&mut lease).await.expect("renew over TLS");
    store.release(&lease).await;
    assert!(matches!(
        store.claim(&request("w", "tls", 1_000)).await,
        ClaimOutcome::AlreadyClaimed { .. }
    ));
}

/// Renewals and releases asked for at once travel together (the lease keeper sends them in one pipeline
/// per node) and each is still decided on its own: of 200 leases renewed at once, the one released just
/// before is lost and stays lost, the 199 others are renewed; then all are released at once, and every job
/// can be claimed again at a later tick.
#[tokio::test]
async fn renewals_asked_for_together_are_each_decided_on_their_own() {
    let cluster = RedisCluster::start(5);
    let store = store(&cluster, race_settings());
    warm(&store).await;
    let jobs: Vec<String> = (0..200).map(|j| format!("kept{j}")).collect();
    let mut leases = Vec::new();
    for job in &jobs {
        leases.push(claim_won(&store, &request("a", job, 1_000)).await);
    }
    store.release(&leases[7]).await;
    let outcomes =
        futures_util::future::join_all(leases.iter_mut().map(|lease| store.renew(lease))).await;
    for (index, outcome) in outcomes.iter().enumerate() {
        if index == 7 {
            assert!(
                matches!(outcome, Err(RenewError::NotHeld(_))),
                "the released lease was renewed: {outcome:?}"
            );
        } else {
            assert_eq!(outcome, &Ok(()), "lease {index}");
        }
    }
    assert!(leases[7].is_lost());
    assert!(leases
        .iter()
        .enumerate()
        .all(|(i, l)| i == 7 || l.is_valid()));

    futures_util::future::join_all(leases.iter().map(|lease| store.release(lease))).await;
    for job in &jobs {
        let outcome = settled(&store, &request("b", job, 2_000)).await;
        assert!(
            matches!(outcome, ClaimOutcome::Won(_)),
            "{job} still held after the releases: {outcome:?}"
        );
    }
}
