//! Claims and tokens: each (job, tick) granted once, also to contenders in parallel tasks, processes and
//! connections; tokens rising across ticks, contenders, series (trigger requests, retry attempts); a later
//! tick refusing an earlier one; and the bounds of a tick and a token.

use std::sync::Arc;
use std::time::Duration;

use redcron::lock::keys::{token_floor, MAX_TOKEN};
use redcron::lock::{ClaimOutcome, ClaimRequest, LockSettings, Overlap, Refusal, Series};
use redcron::schedule::Tick;
use redcron::trigger::TriggerRequest;

use super::{race_settings, request, settings, settled, warm};
use crate::support::{store_on, won, Backend, Cluster};

/// Happy path: acquire, renew, release; validity is positive and below the TTL; the token is above the
/// tick's floor on Redis and the embedded store, and is the claim's revision (above zero) on etcd, its
/// zxid on ZooKeeper.
pub(super) async fn acquire_renew_release(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(settings(2_000));
    warm(&store).await;
    let mut lease = won(settled(&store, &request("w1", "report", 1_000)).await);
    assert!(lease.is_valid());
    let ttl = store.settings().ttl;
    assert!(lease.remaining() > Duration::ZERO && lease.remaining() < ttl);
    let floor = match backend {
        Backend::Redis
        | Backend::RedisSentinel
        | Backend::RedisCluster
        | Backend::Embedded
        | Backend::Postgres
        | Backend::Mariadb => token_floor(Tick(1_000)),
        Backend::Etcd | Backend::Zookeeper => 1,
    };
    assert!(lease.token >= floor, "token {} below {floor}", lease.token);
    let before = lease.deadline();
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.renew(&mut lease).await.expect("renewal");
    assert!(lease.deadline() > before, "renewal moves the deadline");
    store.release(&lease).await;
    // Released: the next tick is free at once (no waiting for the TTL).
    won(settled(&store, &request("w2", "report", 2_000)).await);
}

/// 200 contenders (tasks) race for the same (job, tick): exactly one lease.
pub(super) async fn two_hundred_contenders_one_winner(backend: Backend) {
    let cluster = backend.start_shared();
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

/// The same race with contenders in 3 separate processes (this test binary re-run as a contender), each
/// with its own store: its own connections to the nodes, or to the embedded store's file.
pub(super) fn contenders_in_three_processes_one_winner(backend: Backend) {
    let cluster = backend.start_shared();
    let exe = std::env::current_exe().expect("test binary path");
    let children: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "conformance::claims::contender_process",
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
    let backend = match spec.split_once('|').map(|(kind, _)| kind) {
        Some("etcd") => Backend::Etcd,
        Some("embedded") => Backend::Embedded,
        Some("postgres") => Backend::Postgres,
        Some("mariadb") => Backend::Mariadb,
        Some("zookeeper") => Backend::Zookeeper,
        Some("redis-sentinel") => Backend::RedisSentinel,
        Some("redis-cluster") => Backend::RedisCluster,
        _ => Backend::Redis,
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
                    let worker = format!("p{}-{i}", std::process::id());
                    store.claim(&request(&worker, "race", 7_000)).await
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

/// 100 successive ticks of one job, each raced by 4 tasks on two stores (two processes' connections, on
/// the embedded store two connections to its file), each claiming as the worker does ([`settled`]): each
/// tick has one winner, and the tokens strictly increase, no two equal.
pub(super) async fn successive_leases_have_strictly_increasing_tokens(backend: Backend) {
    let cluster = backend.start_shared();
    // Four contenders a tick, not hundreds: the suite's short node timeout rather than race_settings'
    // 400 ms. The losers of a Redis split vote keep away for the leader's round, `node_timeout` and more
    // (`RedisStore::yield_delay`), so with 400 ms each split cost the tick half a second (30 s a run on
    // Redis, 2 s on the other stores, whose node timeout the harness raises anyway). race_settings'
    // retries stay; a contender that a slow node on a loaded machine answers `NoQuorum` or `Contended`
    // claims again, as the worker does, so the tick's winner is never lost to a timeout.
    let four = LockSettings {
        retries: race_settings().retries,
        ..settings(5_000)
    };
    let stores = [
        Arc::new(cluster.store(four.clone())),
        Arc::new(cluster.store(four)),
    ];
    for store in &stores {
        warm(store).await;
    }
    let mut tokens = Vec::new();
    for tick in 1..=100 {
        let tasks: Vec<_> = (0..4)
            .map(|i| {
                let store = Arc::clone(&stores[i % 2]);
                tokio::spawn(async move {
                    let outcome = settled(&store, &request(&format!("w{i}"), "succ", tick)).await;
                    (i % 2, outcome)
                })
            })
            .collect();
        let mut leases = Vec::new();
        for task in tasks {
            if let (store, ClaimOutcome::Won(lease)) = task.await.expect("task") {
                leases.push((store, lease));
            }
        }
        assert_eq!(leases.len(), 1, "tick {tick}: exactly one winner");
        let (store, lease) = &leases[0];
        tokens.push(lease.token);
        stores[*store].release(lease).await;
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
}

/// Tick claim: A acquires (job, T) and releases; B's acquire of (job, T) answers already claimed, an
/// earlier tick is refused for good, and (job, T+1) works with a higher token. The claim also outlives the
/// lease's expiry.
pub(super) async fn a_claimed_tick_is_never_granted_again(backend: Backend) {
    let cluster = backend.start_shared();
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

/// Workers that disagree on `overlap` take different lease keys, but meet on the claim record: one
/// (job, tick) is granted once, and the loser is told who won, with the winner's fingerprint (finding 1
/// of the protocol review). A request claimed again by its own claimant after a release continues its own
/// claim: its own record does not count against it, and its token rises.
pub(super) async fn workers_that_disagree_on_overlap_claim_a_tick_once(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(settings(2_000));
    warm(&store).await;
    let skip = ClaimRequest::new("a", "job", Tick(1_000), Overlap::Skip, "f1");
    let allow = ClaimRequest::new("b", "job", Tick(1_000), Overlap::Allow, "f2");
    let first = won(settled(&store, &skip).await);
    match settled(&store, &allow).await {
        ClaimOutcome::AlreadyClaimed { by: Some(by) } => {
            assert_eq!(by.worker, "a");
            assert_eq!(by.fingerprint.as_deref(), Some("f1"));
        }
        other => panic!("expected AlreadyClaimed naming worker a, got {other:?}"),
    }
    store.release(&first).await;
    let again = won(settled(&store, &skip).await);
    assert!(again.token > first.token, "{again:?} after {first:?}");
}

/// Series are independent and share the job's lease and fence: a trigger request claimed at a time later
/// than a pending scheduled tick leaves that tick claimable, and is claimed once (on Redis its record expires an hour after its
/// window, the schedule's is kept); while its run holds the
/// job's lease (`overlap: skip`) the scheduled tick is busy; the scheduled tick's token is above the
/// trigger's, and a retry attempt's above both, each granted once. A retry whose window has ended is
/// refused on every store (on the store's clock where it has one, else on this host's).
pub(super) async fn series_have_their_own_claims_and_share_lease_and_fence(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(settings(60_000));
    warm(&store).await;
    let now = chrono::Utc::now();
    let window = Tick(now.timestamp_millis() + 60_000);
    // On etcd a trigger's claim is anchored on its request: write it first, as `redcron trigger` does.
    let asked = TriggerRequest::new("series", now, Duration::from_secs(60), "ops@test");
    store.request_trigger(&asked).await.expect("requested");
    let trigger = |worker: &str| {
        ClaimRequest::new(worker, "series", asked.tick(), Overlap::Skip, "f")
            .in_series(Series::Trigger(asked.id.clone()), window)
    };
    let triggered = won(settled(&store, &trigger("a")).await);
    let scheduled = request("b", "series", 5_000);
    let busy = settled(&store, &scheduled).await;
    assert!(matches!(busy, ClaimOutcome::Busy { .. }), "{busy:?}");
    store.release(&triggered).await;
    let again = settled(&store, &trigger("c")).await;
    assert!(
        matches!(again, ClaimOutcome::AlreadyClaimed { .. }),
        "{again:?}"
    );
    let tick = won(settled(&store, &scheduled).await);
    assert!(tick.token > triggered.token, "the fence is shared");
    store.release(&tick).await;
    let retry = |worker: &str| request(worker, "series", 5_000).in_series(Series::Retry(1), window);
    let retried = won(settled(&store, &retry("d")).await);
    assert!(retried.token > tick.token);
    store.release(&retried).await;
    let twice = settled(&store, &retry("e")).await;
    assert!(
        matches!(twice, ClaimOutcome::AlreadyClaimed { .. }),
        "{twice:?}"
    );
    // The one-off claim records expire an hour after their window; the schedule's record is kept. Each
    // on a majority of nodes at least (a node that missed a round has none: PTTL -2).
    if let Cluster::Redis(redis) = &cluster {
        let pttl = |key: &str| -> Vec<i64> {
            (0..redis.len())
                .map(|node| redis.query(node, ::redis::cmd("PTTL").arg(key)))
                .filter(|&ttl: &i64| ttl != -2)
                .collect()
        };
        let record = pttl(&format!("redcron:{{series}}:claim:trigger:{}", asked.id));
        assert!(record.len() > redis.len() / 2, "{record:?}");
        assert!(record.iter().all(|&ttl| ttl > 3_600_000), "{record:?}");
        let kept = pttl("redcron:{series}:claim");
        assert!(
            kept.len() > redis.len() / 2 && kept.iter().all(|&ttl| ttl == -1),
            "{kept:?}"
        );
    }
    let late = request("f", "series", 5_000).in_series(Series::Retry(2), Tick(1));
    let refused = settled(&store, &late).await;
    assert!(
        matches!(refused, ClaimOutcome::AlreadyClaimed { by: None }),
        "{refused:?}"
    );
}

/// Issue 20, finding 1: a claim of a tick more than an hour ahead of the store's clock (the year 2300) is
/// refused, in the schedule and in a trigger's series, writing nothing: the next claim of a tick of now
/// gets a token of now. On the stores with a clock (Redis: the nodes'; embedded: the host's).
pub(super) async fn a_tick_far_ahead_of_the_clock_is_refused(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(settings(60_000));
    warm(&store).await;
    let far: chrono::DateTime<chrono::Utc> = "2300-01-01T00:00:00Z".parse().expect("a time");
    let far = Tick(far.timestamp_millis());
    let scheduled = ClaimRequest::new("w0", "j", far, Overlap::Skip, "f");
    let triggered = ClaimRequest::new("w1", "j", far, Overlap::Skip, "f")
        .in_series(Series::Trigger("t1".into()), Tick(far.as_millis() + 30_000));
    for request in [scheduled, triggered] {
        match settled(&store, &request).await {
            ClaimOutcome::Refused(refusal @ Refusal::TickAhead { tick, .. }) => {
                assert_eq!(tick, far);
                assert_eq!(refusal.reason(), "tick_ahead");
            }
            other => panic!("expected the far tick refused, got {other:?}"),
        }
    }
    if let Cluster::Redis(redis) = &cluster {
        assert!((0..redis.len()).all(|node| redis.keys(node, "redcron:{j}:*").is_empty()));
    }
    let now = chrono::Utc::now().timestamp_millis();
    let lease = won(settled(&store, &request("w2", "j", now)).await);
    assert_eq!(lease.token, token_floor(Tick(now)));
}

/// Issue 20, finding 1: with the fence counter past 2^53 (a trigger from a clock at 2300 put it there),
/// each claim's token is exactly one above the last, and a majority of nodes keeps it exactly (Redis: `CONFIRM`
/// compares the counter as decimal text, not as a Lua double, where `fence + 1 == fence`). At 2^63 − 1
/// the next claim is refused, naming the bound, instead of repeating the token; it leaves no lease behind.
/// On the stores whose tokens are fence counters (Redis, embedded; etcd's are revisions).
pub(super) async fn tokens_are_exact_to_their_bound_and_refused_past_it(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(settings(60_000));
    warm(&store).await;
    plant_fence(&cluster, "big", 10_413_792_000_569_000);
    let now = chrono::Utc::now().timestamp_millis();
    let mut tokens = Vec::new();
    for n in 0..3 {
        let lease = won(settled(&store, &request(&format!("w{n}"), "big", now + n)).await);
        tokens.push(lease.token);
        store.release(&lease).await;
    }
    assert_eq!(
        tokens,
        [
            10_413_792_000_569_001,
            10_413_792_000_569_002,
            10_413_792_000_569_003
        ]
    );
    assert_eq!(fence(&cluster, "big"), Some(10_413_792_000_569_003));

    plant_fence(&cluster, "big", MAX_TOKEN - 1);
    let lease = won(settled(&store, &request("w3", "big", now + 3)).await);
    assert_eq!(lease.token, MAX_TOKEN);
    store.release(&lease).await;
    match settled(&store, &request("w4", "big", now + 4)).await {
        ClaimOutcome::Refused(refusal @ Refusal::TokenLimit { fence, .. }) => {
            assert_eq!(fence, MAX_TOKEN);
            assert!(refusal.to_string().contains("2^63 - 1"), "{refusal}");
        }
        other => panic!("expected a refusal at the bound, got {other:?}"),
    }
    // Refused before anything was written: the counter stands at the bound, the job holds no lease.
    assert_eq!(fence(&cluster, "big"), Some(MAX_TOKEN));
    won(settled(&store, &request("w5", "other", now)).await);
    // The refused attempt's round-1 holds are undone in the background, after the refusal is returned:
    // gone from every node soon (bounded wait, not a sleep), never kept until they expire (60 s).
    if let Cluster::Redis(redis) = &cluster {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while (0..redis.len()).any(|node| redis.get(node, "redcron:{big}:lease").is_some()) {
            assert!(
                std::time::Instant::now() < deadline,
                "a lease of the refused claim outlived its undo"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// The fence counter of `job` that a majority of nodes keep (a node that missed a round may lag behind
/// until the next claim reaches it), `None` if there is none.
fn fence(cluster: &Cluster, job: &str) -> Option<u64> {
    let key = format!("redcron:{{{job}}}:fence");
    let fences: Vec<Option<u64>> = match cluster {
        Cluster::Redis(redis) => (0..redis.len())
            .map(|node| redis.get(node, &key).and_then(|v| v.parse().ok()))
            .collect(),
        Cluster::Sentinel(group) => {
            let master = group.master().expect("the group has a master");
            vec![group.data.get(master, &key).and_then(|v| v.parse().ok())]
        }
        Cluster::Sharded(sharded) => vec![sharded.get(&key).and_then(|v| v.parse().ok())],
        Cluster::SharedSharded(shared) => {
            let key = key.replacen("redcron:", &format!("{}:", shared.prefix()), 1);
            vec![shared.cluster().get(&key).and_then(|v| v.parse().ok())]
        }
        Cluster::Embedded(file) => {
            let connection = rusqlite::Connection::open(file.path()).expect("open the database");
            let fence: Option<i64> = connection
                .query_row("SELECT token FROM fences WHERE key = ?1", [&key], |row| {
                    row.get(0)
                })
                .ok();
            vec![fence.and_then(|fence| u64::try_from(fence).ok())]
        }
        Cluster::Sql(server) => {
            let found = server.exec(&format!(
                "SELECT token FROM redcron_fences WHERE lock_key = '{key}'"
            ));
            vec![found.trim().parse().ok()]
        }
        Cluster::Etcd(_) => panic!("etcd's tokens are revisions: no fence counter"),
        Cluster::Zookeeper(_) | Cluster::SharedZookeeper(_) => {
            panic!("ZooKeeper's tokens are zxids: no fence counter")
        }
    };
    let majority = fences.len() / 2 + 1;
    let held = |value: &Option<u64>| fences.iter().filter(|f| *f == value).count();
    fences
        .iter()
        .find(|value| held(value) >= majority)
        .copied()
        .flatten()
}

/// Sets the fence counter of `job` to `fence` on every node, as a claim of a far-off tick left it.
fn plant_fence(cluster: &Cluster, job: &str, fence: u64) {
    let key = format!("redcron:{{{job}}}:fence");
    match cluster {
        Cluster::Redis(redis) => {
            for node in 0..redis.len() {
                let () = redis.query(node, ::redis::cmd("SET").arg(&key).arg(fence));
            }
        }
        Cluster::Sentinel(group) => {
            let master = group.master().expect("the group has a master");
            let () = group
                .data
                .query(master, ::redis::cmd("SET").arg(&key).arg(fence));
        }
        Cluster::Sharded(sharded) => sharded.set(&key, fence),
        Cluster::SharedSharded(shared) => {
            let key = key.replacen("redcron:", &format!("{}:", shared.prefix()), 1);
            shared.cluster().set(&key, fence);
        }
        Cluster::Embedded(file) => {
            let connection = rusqlite::Connection::open(file.path()).expect("open the database");
            connection
                .busy_timeout(Duration::from_secs(10))
                .expect("a busy timeout");
            let fence = i64::try_from(fence).expect("an INTEGER");
            connection
                .execute(
                    "INSERT OR REPLACE INTO fences (key, token) VALUES (?1, ?2)",
                    rusqlite::params![key, fence],
                )
                .expect("planted");
        }
        Cluster::Sql(server) => {
            server.exec(&format!(
                "DELETE FROM redcron_fences WHERE lock_key = '{key}';
                 INSERT INTO redcron_fences (lock_key, token) VALUES ('{key}', {fence})"
            ));
        }
        Cluster::Etcd(_) => panic!("etcd's tokens are revisions: no fence counter"),
        Cluster::Zookeeper(_) | Cluster::SharedZookeeper(_) => {
            panic!("ZooKeeper's tokens are zxids: no fence counter")
        }
    }
}
