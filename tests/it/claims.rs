//! The claim protocol's hard cases, each one a finding of the adversarial review that broke protocol v1
//! (see `docs/protocol.md`, "What v2 fixes"): workers that disagree on a job's definition, a slow round 2,
//! and contenders that crashed between or during their rounds. Real `redis-server` nodes throughout; each
//! test failed on v1.

use std::collections::BTreeMap;
use std::time::Duration;

use redcron::lock::{ClaimOutcome, ClaimRequest, Lease, LockSettings, Overlap};
use redcron::schedule::Tick;
use redcron::store::redis::scripts;
use redcron::store::Store;

use crate::conformance::{settings, warm};
use crate::support::{claim_until_final, store_on, won, DelayProxy, RedisCluster, TestDir, Worker};

/// A store on the Redis nodes at `urls`: a lease of 3 s, a node timeout of 50 ms.
fn store(urls: &[String]) -> Store {
    store_on(&format!("redis|{}", urls.join(",")), settings(3_000))
}

/// Finding 1: two workers race every tick with different `overlap` (so different lease keys) and
/// different definitions of the job: each tick is granted to exactly one of them, and the loser is told
/// who won, with the winner's fingerprint. (v1 granted most ticks to both, with the same token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_that_disagree_on_overlap_claim_each_tick_once() {
    let cluster = RedisCluster::start(5);
    let (a, b) = (store(&cluster.urls()), store(&cluster.urls()));
    warm(&a).await;
    warm(&b).await;
    let mut other_definition_seen = false;
    for tick in 1..=30i64 {
        let skip = ClaimRequest::new("a", "rollout", Tick(tick * 1_000), Overlap::Skip, "old");
        let allow = ClaimRequest::new("b", "rollout", Tick(tick * 1_000), Overlap::Allow, "new");
        let patience = Duration::from_secs(5);
        let (left, right) = tokio::join!(
            claim_until_final(&a, &skip, patience),
            claim_until_final(&b, &allow, patience)
        );
        let outcomes = [left, right];
        let winners: Vec<&Lease> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                ClaimOutcome::Won(lease) => Some(lease),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "tick {tick}: {outcomes:?}");
        for outcome in &outcomes {
            if let ClaimOutcome::AlreadyClaimed { by: Some(by) } = outcome {
                other_definition_seen |= by.fingerprint.as_deref() != Some("");
            }
        }
        let lease = winners[0].clone();
        let winner = if matches!(outcomes[0], ClaimOutcome::Won(_)) {
            &a
        } else {
            &b
        };
        winner.release(&lease).await;
    }
    assert!(
        other_definition_seen,
        "the loser was never told the winner's fingerprint"
    );
}

/// Finding 2: round 2 is applied on every node but answered after `node_timeout` (one slow round trip):
/// the claimant's next attempt finds its own confirmations and wins, and another worker is told the tick
/// is taken. (v1 lost the tick for good: every node kept `claim = T`, and every attempt was refused.)
#[tokio::test]
async fn a_slow_round_two_is_retried_by_the_same_claimant() {
    let cluster = RedisCluster::start(3);
    let proxies: Vec<DelayProxy> = (0..3)
        .map(|node| {
            DelayProxy::start(
                cluster.port(node),
                scripts::CONFIRM.get_hash(),
                Duration::from_millis(150),
            )
        })
        .collect();
    let slow = store(&proxies.iter().map(DelayProxy::url).collect::<Vec<_>>());
    let healthy = store(&cluster.urls());
    warm(&slow).await;
    warm(&healthy).await;
    proxies.iter().for_each(|proxy| proxy.delay_next(1));

    let request = ClaimRequest::new("slow", "report", Tick(5_000), Overlap::Skip, "f");
    let lease = won(claim_until_final(&slow, &request, Duration::from_secs(10)).await);
    assert!(
        proxies.iter().all(|proxy| proxy.delayed() == 1),
        "every node's first CONFIRM was held back"
    );
    let other = ClaimRequest::new("healthy", "report", Tick(5_000), Overlap::Skip, "f");
    match claim_until_final(&healthy, &other, Duration::from_secs(10)).await {
        ClaimOutcome::AlreadyClaimed { by: Some(by) } => assert_eq!(by.worker, "slow"),
        other => panic!("expected the tick to be taken by `slow`, got {other:?}"),
    }
    slow.release(&lease).await;
}

/// The keys a contender leaves when it crashes: its lease value on `lease_nodes` and, if `confirmed_on`
/// is given, its claim record on that node (a partial round 2).
fn leave_crashed_contender(
    cluster: &RedisCluster,
    tick_ms: i64,
    lease_nodes: &[usize],
    confirmed_on: Option<usize>,
    ttl: Duration,
) {
    let value = format!("crashed-worker/0f0f|1|{tick_ms}|old");
    for &node in lease_nodes {
        let mut set = redis::cmd("SET");
        set.arg("redcron:{report}:lease")
            .arg(&value)
            .arg("PX")
            .arg(ttl.as_millis() as u64);
        cluster.query::<()>(node, &set);
    }
    if let Some(node) = confirmed_on {
        let mut set = redis::cmd("SET");
        set.arg("redcron:{report}:claim")
            .arg(format!("{tick_ms} {value}"));
        cluster.query::<()>(node, &set);
    }
}

/// Finding 3: a contender crashed between its rounds and holds the lease on 2 of 3 nodes. The live
/// worker is told to wait (its lease's remaining TTL), not that the tick is lost, and wins once the lease
/// expired. (v1 answered `Busy`, final, after ~1 s.)
#[tokio::test]
async fn a_contender_that_crashed_between_rounds_is_waited_out() {
    let cluster = RedisCluster::start(3);
    let store = store(&cluster.urls());
    warm(&store).await;
    leave_crashed_contender(&cluster, 7_000, &[0, 1], None, Duration::from_millis(1_500));
    let request = ClaimRequest::new("live", "report", Tick(7_000), Overlap::Skip, "f");
    match store.claim(&request).await {
        ClaimOutcome::Contended {
            holder: Some(holder),
            retry_in,
        } => {
            assert_eq!(holder.worker, "crashed-worker");
            assert!(retry_in <= Duration::from_millis(1_500), "{retry_in:?}");
        }
        other => panic!("expected Contended by the crashed worker, got {other:?}"),
    }
    let lease = won(claim_until_final(&store, &request, Duration::from_secs(10)).await);
    store.release(&lease).await;
}

/// Finding 4: a contender crashed during its round 2 — its claim record on one node of 3, its lease on
/// another. That tick was never granted, so the live worker must still win it once the lease expired.
/// (v1 read "claimed + busy ≥ majority" as taken, and the tick never ran.)
#[tokio::test]
async fn a_partial_confirmation_of_a_crashed_contender_does_not_take_the_tick() {
    let cluster = RedisCluster::start(3);
    let store = store(&cluster.urls());
    warm(&store).await;
    leave_crashed_contender(&cluster, 9_000, &[1], Some(0), Duration::from_millis(1_000));
    let request = ClaimRequest::new("live", "report", Tick(9_000), Overlap::Skip, "f");
    let lease = won(claim_until_final(&store, &request, Duration::from_secs(10)).await);
    assert!(lease.token >= 9_000 * 1_000);
    store.release(&lease).await;
}

/// A split vote while a node hangs, so that every round that could still win waits `node_timeout` for
/// it: the contender that leads the vote keeps its keys and wins on its next round, and a contender that
/// lost the vote does not come back first to take the nodes freed meanwhile (here a crashed contender's
/// lease that expired) and overturn the lead. (Chaos seed 1795433209025223823: with one node hung and one
/// down, four live workers took turns leading 2–2 splits — each loser back after `retry_delay`, before
/// the leader's next round — until the tick's window closed, and nobody ran it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_under_a_hung_node_goes_to_its_leader() {
    let mut cluster = RedisCluster::start(5);
    // A loser used to come back `retry_delay` plus jitter (1–2 s) after its round; the leader's next round
    // starts `node_timeout` (2.5 s, node 4 hangs) plus `retry_delay / 4` after its first began. One retry
    // per call: the leader must win on that next round.
    let slow = LockSettings {
        ttl: Duration::from_secs(10),
        renew_every: Duration::from_secs(3),
        node_timeout: Duration::from_millis(2_500),
        retry_delay: Duration::from_millis(1_000),
        retries: 1,
        ..LockSettings::default()
    };
    let open = || cluster.store(slow.clone());
    let (leader, loser) = (open(), open());
    warm(&leader).await;
    warm(&loser).await;
    cluster.stop(4);
    // A contender that crashed in its round 1 holds nodes 2 and 3 for 600 ms; its value sorts after `b`.
    leave_crashed_contender(&cluster, 11_000, &[2, 3], None, Duration::from_millis(600));
    let led = ClaimRequest::new("b", "report", Tick(11_000), Overlap::Skip, "f");
    // `a` sorts before `b`: had it come back while nodes 2 and 3 were free, it would lead the next split.
    let lost = ClaimRequest::new("a", "report", Tick(11_000), Overlap::Skip, "f");
    let (first, second) = tokio::join!(leader.claim(&led), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        claim_until_final(&loser, &lost, Duration::from_secs(20)).await
    });
    cluster.cont(4);
    let lease = won(first);
    match second {
        ClaimOutcome::AlreadyClaimed { by: Some(by) } => assert_eq!(by.worker, "b"),
        other => panic!("expected the tick to be taken by `b`, got {other:?}"),
    }
    leader.release(&lease).await;
}

/// Finding 1 end to end: two worker processes run two versions of one job (`overlap: skip` with one
/// command, `overlap: allow` with another) against the same nodes. Every tick runs once, and the workers
/// log `job.config_differs`. (v1: 42 duplicate starts in 63 ticks.)
#[test]
fn a_rollout_that_changes_overlap_runs_each_tick_once() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let nodes = cluster
        .urls()
        .iter()
        .map(|url| format!("\"{url}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let config = |version: &str, overlap: &str| {
        format!(
            "redis:\n  nodes: [{nodes}]\nlock:\n  ttl: 2s\n  renew_every: 500ms\n  node_timeout: 100ms\n  \
             retry_delay: 50ms\njobs:\n  - name: rollout\n    schedule: \"* * * * * *\"\n    overlap: {overlap}\n    \
             command: 'echo \"$REDCRON_TICK $REDCRON_FENCING_TOKEN {version}\" >> {}'\n",
            dir.ledger().display()
        )
    };
    let old = dir.write("old.yaml", config("v1", "skip"));
    let new = dir.write("new.yaml", config("v2", "allow"));
    let mut workers = [Worker::spawn(&old, &[]), Worker::spawn(&new, &[])];
    // Whichever loses a tick sees the winner's other fingerprint and warns.
    let waited = std::time::Instant::now();
    let differs = loop {
        let found = workers
            .iter()
            .find_map(|worker| worker.events("job.config_differs").into_iter().next());
        if found.is_some() || waited.elapsed() > Duration::from_secs(30) {
            break found;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(6));
    for worker in &mut workers {
        worker.signal(libc::SIGTERM);
        assert!(
            worker.wait_timeout(Duration::from_secs(20)).is_some(),
            "worker did not stop"
        );
    }

    let mut runs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in dir.ledger_lines() {
        let mut fields = line.split_whitespace();
        let tick = fields.next().unwrap_or_default().to_string();
        runs.entry(tick).or_default().push(line.clone());
    }
    assert!(runs.len() >= 5, "too few ticks ran: {runs:?}");
    let twice: Vec<_> = runs.values().filter(|lines| lines.len() > 1).collect();
    assert!(twice.is_empty(), "ticks that ran twice: {twice:?}");
    let differs = differs.expect("a job.config_differs event from one of the workers");
    assert_eq!(differs["job"], "rollout");
}

/// Outcomes are handed out as each is decided: in one batch, a free job's claim is won in the first
/// attempt and reported while another job's claim — held by a contender that crashed between its rounds
/// — is still being retried inside the store. (`claim_many` returned both together, so the free job's
/// start waited for the other's retries.)
#[tokio::test]
async fn a_won_claim_is_handed_out_while_another_of_its_batch_is_retried() {
    let cluster = RedisCluster::start(3);
    let store = store(&cluster.urls());
    warm(&store).await;
    leave_crashed_contender(&cluster, 13_000, &[0, 1], None, Duration::from_secs(10));
    let requests = [
        ClaimRequest::new("live", "report", Tick(13_000), Overlap::Skip, "f"),
        ClaimRequest::new("live", "free", Tick(13_000), Overlap::Skip, "f"),
    ];
    let mut decided = Vec::new();
    store
        .claim_each(&requests, |index, outcome| decided.push((index, outcome)))
        .await;
    assert_eq!(decided.len(), 2, "{decided:?}");
    assert_eq!(
        decided[0].0, 1,
        "the free job's outcome comes first: {decided:?}"
    );
    let lease = match &decided[0].1 {
        ClaimOutcome::Won(lease) => lease.clone(),
        other => panic!("the free job is won at once, got {other:?}"),
    };
    assert!(
        matches!(decided[1].1, ClaimOutcome::Contended { .. }),
        "the held job is still contended after the store's retries: {decided:?}"
    );
    store.release(&lease).await;
}

/// A batch goes to each node as one script call whose claims are applied one after the other: the
/// schedule tick and a trigger request of one job share its lease key, so the second claim of the call
/// reads the lease the first one took in the same call and is refused as busy — as two scripts run back
/// to back would answer — instead of taking the lease as well.
#[tokio::test]
async fn a_later_claim_of_a_batch_sees_the_lease_an_earlier_one_took() {
    let cluster = RedisCluster::start(3);
    let store = store(&cluster.urls());
    warm(&store).await;
    let now = chrono::Utc::now().timestamp_millis();
    let schedule = ClaimRequest::new("w", "report", Tick(now), Overlap::Skip, "f");
    let trigger = ClaimRequest::new("w", "report", Tick(now), Overlap::Skip, "f").in_series(
        redcron::lock::Series::Trigger("t1".to_string()),
        Tick(now + 60_000),
    );
    let mut outcomes = store.claim_many(&[schedule.clone(), trigger]).await;
    let busy = outcomes.pop();
    let lease = won(outcomes.pop().expect("two outcomes"));
    match busy {
        Some(ClaimOutcome::Busy {
            holder: Some(holder),
            ..
        }) => assert_eq!(holder.claimant, schedule.claimant),
        other => panic!("expected the trigger's claim to find the schedule's lease, got {other:?}"),
    }
    store.release(&lease).await;
}

/// A key of another type in place of a job's claim record (written by hand: the batch scripts read keys
/// with `MGET`, which reads it as absent) proves no tick free: on a majority of nodes it makes the tick
/// lost, never won, and the nodes keep it as it was.
#[tokio::test]
async fn a_claim_record_of_another_type_is_taken_as_claimed() {
    let cluster = RedisCluster::start(3);
    let store = store(&cluster.urls());
    warm(&store).await;
    for node in 0..2 {
        let _: () = redis::cmd("HSET")
            .arg("redcron:{report}:claim")
            .arg("junk")
            .arg("1")
            .query(&mut cluster.connection(node))
            .expect("plant a hash");
    }
    let now = chrono::Utc::now().timestamp_millis();
    let request = ClaimRequest::new("w", "report", Tick(now), Overlap::Skip, "f");
    match claim_until_final(&store, &request, Duration::from_secs(5)).await {
        ClaimOutcome::AlreadyClaimed { .. } => {}
        other => panic!("expected the tick lost to the unreadable record, got {other:?}"),
    }
    for node in 0..2 {
        let kind: String = redis::cmd("TYPE")
            .arg("redcron:{report}:claim")
            .query(&mut cluster.connection(node))
            .expect("TYPE");
        assert_eq!(kind, "hash", "node {node}");
    }
}

/// The events named `event` that `worker` logged for `node`.
fn node_events(worker: &Worker, event: &str, node: &str) -> Vec<serde_json::Value> {
    worker
        .events(event)
        .into_iter()
        .filter(|e| e["node"] == node)
        .collect()
}

/// Sleeps until the wall clock is 1–4 s past a multiple of 30 s, so that a job on `*/30 * * * * *`
/// started now races a tick that has most of its window left.
fn just_after_a_half_minute() {
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let into = now.as_millis() % 30_000;
        if (1_000..4_000).contains(&into) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Finding 55.5: two of three nodes restarted empty one after the other (each a minority at its time)
/// while a 12 s run goes on: the run keeps its lease to its end, and a worker started after the restarts,
/// racing the same tick within its grace, does not run it again. The holder's renewals put its lease,
/// record and fence back on each restarted node. Without that, the second worker won the running tick
/// with the same token, and the first run was stopped on `lease.lost`.
#[test]
fn two_nodes_restarted_empty_during_a_long_run_never_run_its_tick_again() {
    let mut cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let job = "  - name: long\n    schedule: \"*/30 * * * * *\"\n    misfire_grace: 29s\n    command: 'sleep 12'\n";
    just_after_a_half_minute();
    let first = Worker::spawn(
        dir.write_config(&crate::worker::config(&cluster, "  id: first\n", job)),
        &[],
    );
    let started = first
        .wait_for_event("run.started", Duration::from_secs(10))
        .expect("the first worker runs the tick");
    for node in [0, 1] {
        cluster.restart(node);
        // Past the hold (the TTL, 2 s) and a few renewals (every 500 ms).
        std::thread::sleep(Duration::from_secs(3));
    }
    let second = Worker::spawn(
        dir.write_config(&crate::worker::config(&cluster, "  id: second\n", job)),
        &[],
    );
    second
        .wait_for_event("worker.started", Duration::from_secs(10))
        .expect("the second worker starts");
    let finished = first
        .wait_for_event("run.finished", Duration::from_secs(20))
        .expect("the first run ends");
    std::thread::sleep(Duration::from_secs(2));
    let again: Vec<_> = second
        .events("run.started")
        .into_iter()
        .filter(|e| e["tick"] == started["tick"])
        .collect();
    assert!(
        again.is_empty(),
        "tick {} ran again on the second worker: {again:?} (first: {started})",
        started["tick"]
    );
    assert_eq!(
        finished["outcome"], "success",
        "the first run kept its lease: {finished}"
    );
}

/// Finding 55.5 (b): a read-only replica listed as a node is refused at start, with an ERROR that names
/// it, instead of silently never voting until another node fails.
#[test]
fn a_replica_listed_as_a_node_is_refused_at_start() {
    let cluster = RedisCluster::start(3);
    let mut replicaof = ::redis::cmd("REPLICAOF");
    replicaof.arg("127.0.0.1").arg(cluster.port(1));
    cluster.query::<()>(0, &replicaof);
    let dir = TestDir::new();
    let job = "  - name: tick\n    schedule: \"*/30 * * * * *\"\n    command: 'true'\n";
    let worker = Worker::spawn(
        dir.write_config(&crate::worker::config(&cluster, "  id: w\n", job)),
        &[],
    );
    let refused = worker
        .wait_for(Duration::from_secs(10), |e| {
            e["event"] == "store.node_refused" && e["node"] == cluster.url(0).as_str()
        })
        .expect("the replica is refused at start");
    assert_eq!(refused["level"], "ERROR", "{refused}");
    assert!(
        refused["error"].as_str().unwrap_or("").contains("replica"),
        "{refused}"
    );
    assert!(node_events(&worker, "store.node_refused", &cluster.url(1)).is_empty());
}

/// Finding 55.4: one server under two names (`127.0.0.1` and `localhost`) and a node that is down: a
/// worker wins no tick (one server is one vote of three), logs an ERROR naming both names, and `redcron
/// check` fails on the config, naming both. Without it, every tick was won on the one server.
#[test]
fn one_server_under_two_names_wins_no_tick() {
    let mut cluster = RedisCluster::start(2);
    let port = cluster.port(0);
    let urls = [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        cluster.url(1),
    ];
    cluster.kill(1);
    let dir = TestDir::new();
    let job = "  - name: every-second\n    schedule: \"* * * * * *\"\n    command: 'true'\n";
    let yaml =
        crate::support::worker_config(crate::support::Backend::Redis, &urls, "  id: w\n", job);
    let path = dir.write_config(&yaml);
    let (code, _, stderr) = crate::cli::output(
        crate::cli::redcron(dir.path())
            .arg("check")
            .arg("--config")
            .arg(&path),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "redis://127.0.0.1:{port} and redis://localhost:{port} are one server"
        )),
        "{stderr}"
    );
    let worker = Worker::spawn(&path, &[]);
    let refused = worker
        .wait_for_event("store.node_refused", Duration::from_secs(10))
        .expect("the second name is refused");
    let error = refused["error"].as_str().unwrap_or("");
    assert!(
        error.contains(&format!("redis://127.0.0.1:{port}"))
            && error.contains(&format!("redis://localhost:{port}"))
            && error.contains("same server"),
        "{refused}"
    );
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        worker.events("run.started").is_empty(),
        "a tick was won on one server: {:?}",
        worker.events("run.started")
    );
}
