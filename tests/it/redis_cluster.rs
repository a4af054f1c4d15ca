//! The Redis store on a Redis Cluster (`redis.cluster`): 3 masters with a replica each, all real servers.
//! The cluster is the store's one node; each job's claims are decided by the master of its `{job}` slot,
//! which the store follows through the cluster's failovers — planned (`CLUSTER FAILOVER`: the old master
//! lives on as a replica and redirects with `MOVED`), forced (the master SIGKILLed) and a hung master
//! (SIGSTOP) replaced behind its back — keeping every claim that counted: a write counts only once the
//! master's replica has it (`WAIT`), and the promoted replica holds it.

use std::time::Duration;

use redcron::config::{ClusterSeeds, RedisConfig, RedisNode, ReplicaAcks};
use redcron::lock::{ClaimOutcome, LockSettings};
use redcron::store::redis::RedisStore;
use redcron::store::Store;
use testkit::{slot_of, ShardedRedis};

use crate::conformance::{all_still_claimed, request, settings, settled, token_of};
use crate::support::won;

/// A store on `cluster` with lock settings that leave a loaded machine room (a node timeout that covers
/// a `WAIT` for a replica).
fn store_on(cluster: &ShardedRedis, settings: LockSettings) -> Store {
    let seeds = ClusterSeeds {
        seeds: cluster.seed_urls(),
        min_replicas_acked: ReplicaAcks::All,
    };
    let config = RedisConfig::on(vec![RedisNode::Cluster(seeds)]);
    Store::Redis(RedisStore::open(&config, settings).expect("valid seeds"))
}

fn patient() -> LockSettings {
    LockSettings {
        node_timeout: Duration::from_millis(300),
        ..settings(3_000)
    }
}

/// The job's slot (its keys' hash tag).
fn slot(job: &str) -> u16 {
    slot_of(&format!("{{{job}}}"))
}

/// Through a planned failover and then a crash of the new master of the job's slot, every claim the
/// cluster confirmed is kept (no tick is granted twice) and tokens keep rising; jobs on the other
/// shards are claimed throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_follows_its_masters_through_failovers_and_keeps_every_claim() {
    let mut cluster = ShardedRedis::start();
    let store = store_on(&cluster, patient());
    let mut last = 0;
    for tick in 1..=5 {
        let token = token_of(&store, "w1", "job", tick * 1_000).await;
        assert!(token > last, "token {token} after {last}");
        last = token;
    }
    // Jobs whose slots other masters serve.
    let first = cluster.master_of_slot(slot("job")).expect("a master");
    let elsewhere: Vec<String> = (0..200)
        .map(|n| format!("other-{n}"))
        .filter(|job| cluster.master_of_slot(slot(job)) != Some(first))
        .take(4)
        .collect();
    for job in &elsewhere {
        token_of(&store, "w1", job, 1_000).await;
    }

    // Planned: the replica takes over; the old master becomes its replica and redirects (`MOVED`).
    let replica = cluster.replicas_of(first)[0];
    cluster.failover(replica);
    all_still_claimed(&store, "job", (1..=5).map(|s| s * 1_000)).await;
    let token = token_of(&store, "w1", "job", 6_000).await;
    assert!(token > last, "token {token} after {last} across a failover");
    last = token;

    // Forced: the new master dies; its replica (the first master) is promoted again (A → B → A).
    cluster.nodes_mut().kill(replica);
    let third = cluster.wait_for_new_master(slot("job"), replica);
    assert_eq!(third, first, "the only replica took over");
    // A write counts once a replica has it: the dead master comes back as one.
    cluster.nodes_mut().restart(replica);
    cluster.wait_until_replica(replica);
    all_still_claimed(&store, "job", (1..=6).map(|s| s * 1_000)).await;
    let token = token_of(&store, "w1", "job", 7_000).await;
    assert!(token > last, "token {token} after {last} across a crash");
    for job in &elsewhere {
        all_still_claimed(&store, job, [1_000]).await;
        token_of(&store, "w1", job, 2_000).await;
    }
    let states = store.groups();
    let moved = states
        .iter()
        .find(|state| state.master == Some(format!("127.0.0.1:{}", cluster.nodes().port(first))))
        .unwrap_or_else(|| panic!("no shard names master {first}: {states:?}"));
    assert_eq!(moved.failovers, 2, "{states:?}");
}

/// A write the master's only replica did not acknowledge does not count: with it down, the job's claims
/// are `NoQuorum`, naming the shard and no password, while a job on another shard is claimed; once the
/// replica is back, claims are granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_no_replica_acknowledged_does_not_count() {
    let mut cluster = ShardedRedis::builder().password("s3cret-pw").start();
    let store = store_on(&cluster, patient());
    token_of(&store, "w1", "acked", 1_000).await;
    let master = cluster.master_of_slot(slot("acked")).expect("a master");
    let other = (0..200)
        .map(|n| format!("other-{n}"))
        .find(|job| cluster.master_of_slot(slot(job)) != Some(master))
        .expect("a job on another shard");

    let replica = cluster.replicas_of(master)[0];
    cluster.nodes_mut().kill(replica);
    let outcome = store.claim(&request("w1", "acked", 2_000)).await;
    let ClaimOutcome::NoQuorum(failure) = &outcome else {
        panic!("a claim without a replica counted: {outcome:?}");
    };
    let said = format!("{failure:?}");
    assert!(said.contains("WAIT saw 0 of the 1 replicas"), "{said}");
    assert!(
        said.contains("cluster://127.0.0.1:"),
        "the cluster is named: {said}"
    );
    assert!(said.contains("slots "), "the shard is named: {said}");
    assert!(
        !said.contains("s3cret-pw"),
        "a password in an error: {said}"
    );
    token_of(&store, "w1", &other, 2_000).await;

    cluster.nodes_mut().restart(replica);
    cluster.wait_until_replica(replica);
    token_of(&store, "w1", "acked", 2_000).await;
}

/// A lease whose master dies renews on the promoted replica once that has a replica again (the old
/// master restarted), within the lease's TTL; meanwhile no contender gets the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_renews_on_the_new_master_after_the_old_one_dies() {
    let mut cluster = ShardedRedis::start();
    let settings = LockSettings {
        ttl: Duration::from_secs(12),
        renew_every: Duration::from_secs(3),
        node_timeout: Duration::from_millis(300),
        ..settings(12_000)
    };
    let store = store_on(&cluster, settings);
    let mut lease = won(settled(&store, &request("holder", "long", 1_000)).await);

    let old = cluster.master_of_slot(slot("long")).expect("a master");
    cluster.nodes_mut().kill(old);
    cluster.wait_for_new_master(slot("long"), old);
    cluster.nodes_mut().restart(old);
    cluster.wait_until_replica(old);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        match store.renew(&mut lease).await {
            Ok(()) => break,
            Err(error) => {
                assert!(
                    tokio::time::Instant::now() < deadline && lease.is_valid(),
                    "no renewal on the new master: {error:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(lease.is_valid());
    let contender = settled(&store, &request("contender", "long", 2_000)).await;
    assert!(
        !matches!(contender, ClaimOutcome::Won(_)),
        "a contender got the job while its run held the lease: {contender:?}"
    );
    store.release(&lease).await;
}

/// A hung master (SIGSTOP) is replaced by its replica; resumed, it comes back as a replica of it.
/// Nothing it answers on the connection still open counts, and every claim made before, during and
/// after stays claimed, with rising tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_master_is_replaced_and_returns_as_a_replica_without_a_second_grant() {
    let mut cluster = ShardedRedis::start();
    let store = store_on(&cluster, patient());
    let mut last = token_of(&store, "w1", "hung", 1_000).await;

    let old = cluster.master_of_slot(slot("hung")).expect("a master");
    cluster.nodes_mut().stop(old);
    cluster.wait_for_new_master(slot("hung"), old);
    cluster.nodes_mut().cont(old);
    // The old master learns it was replaced and follows the new one; then `WAIT` counts again.
    cluster.wait_until_replica(old);
    let token = token_of(&store, "w1", "hung", 2_000).await;
    assert!(token > last, "token {token} after {last}");
    last = token;
    all_still_claimed(&store, "hung", [1_000, 2_000]).await;
    let token = token_of(&store, "w1", "hung", 3_000).await;
    assert!(token > last, "token {token} after {last}");
}

/// A seed that is a standalone server is refused as a cluster node, and a cluster node listed under
/// `redis.nodes` is refused there: each says what to list instead, and nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standalone_seed_and_a_cluster_node_under_nodes_are_refused() {
    let cluster = ShardedRedis::start();
    let under_nodes =
        Store::Redis(RedisStore::new(&cluster.seed_urls()[..1], patient()).expect("a valid URL"));
    let outcome = under_nodes.claim(&request("w1", "job", 1_000)).await;
    let said = format!("{outcome:?}");
    assert!(
        said.contains("is a Redis Cluster node") && said.contains("redis.cluster"),
        "{said}"
    );

    let standalone = crate::support::RedisCluster::start(1);
    let seeds = ClusterSeeds {
        seeds: standalone.urls(),
        min_replicas_acked: ReplicaAcks::All,
    };
    let store = Store::Redis(
        RedisStore::open(&RedisConfig::on(vec![RedisNode::Cluster(seeds)]), patient())
            .expect("a valid URL"),
    );
    let outcome = store.claim(&request("w1", "job", 1_000)).await;
    let ClaimOutcome::NoQuorum(failure) = &outcome else {
        panic!("a standalone seed granted a claim: {outcome:?}");
    };
    let said = format!("{failure:?}");
    assert!(said.contains("CLUSTER SHARDS"), "{said}");
}

/// What an operator is shown of a cluster: `check` names its seeds and when a shard's answer counts;
/// `status`, `/readyz`, `/metrics` and the dashboard's workers page name each shard (by its slots) and
/// its master — and, after a failover, the shard's new master and the failover seen.
#[test]
fn check_status_readyz_metrics_and_the_dashboard_name_each_shards_master() {
    use crate::inspect::{inspect, parse};
    use crate::metrics::{get, listening_worker, wait_for};
    use crate::support::TestDir;

    let cluster = ShardedRedis::start();
    let dir = TestDir::new();
    let seeds = cluster.cluster_yaml();
    let yaml = |port: u16| {
        format!(
            "redis:\n  {seeds}\nlock:\n  ttl: 3s\n  renew_every: 1s\n  node_timeout: 300ms\n\
             worker:\n  id: w\n  listen: 127.0.0.1:{port}\njobs:\n  - name: tick\n    \
             schedule: \"* * * * * *\"\n    command: 'true'\n"
        )
    };
    let (worker, port) = listening_worker(&dir, "w", yaml);
    let config = dir.write("cli.yaml", yaml(port));
    let hosts: Vec<String> = (0..cluster.len())
        .map(|i| format!("127.0.0.1:{}", cluster.nodes().port(i)))
        .collect();
    let label = format!("cluster://{}", hosts.join(","));
    let patience = Duration::from_secs(30);

    let (code, checked, stderr) = inspect(&dir, &config, &["check"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        checked.contains(&format!(
            "store: a Redis Cluster, 6 seeds: redis://{}",
            hosts[0]
        )),
        "{checked}"
    );
    let rule = format!(
        "  Redis Cluster {label}: the slot map read from its nodes (CLUSTER SHARDS); each job's keys \
         on the master of its {{job}} slot, whose answer decides the job's claims once every replica \
         of its master that the cluster sees online has the writes (WAIT)"
    );
    assert!(
        checked.lines().any(|l| l == rule),
        "{rule:?} not in:\n{checked}"
    );

    // Every shard, as the cluster was formed: master m serves the m-th third of the slots.
    let shards = ["slots 0-5460", "slots 5461-10921", "slots 10922-16383"];
    let shows = |masters: [usize; 3], failovers: [u64; 3]| {
        let found = wait_for(patience, || {
            let ready = get(port, "/readyz").ok()?;
            let metrics = get(port, "/metrics").ok()?;
            let all = (0..3).all(|s| {
                let group = format!("{label} {}", shards[s]);
                let master = &hosts[masters[s]];
                ready.2.contains(&format!(
                    "group {group}: master {master}, {} failover",
                    failovers[s]
                )) && metrics.2.contains(&format!(
                    "redcron_store_group_master{{group=\"{group}\",master=\"{master}\"}} 1"
                )) && metrics.2.contains(&format!(
                    "redcron_store_group_failovers_total{{group=\"{group}\"}} {}",
                    failovers[s]
                ))
            });
            (ready.0 == 200 && all).then_some(())
        });
        found.unwrap_or_else(|| {
            panic!(
                "/readyz and /metrics do not name masters {masters:?} and failovers {failovers:?}: \
                 {:?}\n{:?}",
                get(port, "/readyz").map(|r| r.2),
                get(port, "/metrics").map(|r| r.2)
            )
        });
        let page = get(port, "/workers").expect("the workers page").2;
        let (code, status, stderr) = inspect(&dir, &config, &["status"]);
        assert_eq!(code, 0, "{stderr}");
        let (_, json, _) = inspect(&dir, &config, &["status", "--json"]);
        let json = parse(&json);
        for s in 0..3 {
            let master = &hosts[masters[s]];
            assert!(
                page.contains(&format!("data-master=\"{master}\"")),
                "{page}"
            );
            let line = format!("  group {label} {}: master {master}", shards[s]);
            assert!(
                status.lines().any(|l| l == line),
                "{line:?} not in:\n{status}"
            );
            let listed = json["groups"].as_array().is_some_and(|groups| {
                groups.iter().any(|g| {
                    g["group"] == format!("{label} {}", shards[s]).as_str()
                        && g["master"] == master.as_str()
                })
            });
            assert!(listed, "{json}");
        }
    };
    shows([0, 1, 2], [0, 0, 0]);

    let replica = cluster.replicas_of(1)[0];
    cluster.failover(replica);
    shows([0, replica, 2], [0, 1, 0]);
    drop(worker);
}
