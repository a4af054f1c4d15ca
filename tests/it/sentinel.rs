//! The Redis store on a Sentinel-managed group: a master, its replicas and three Sentinels, all real
//! servers. A group is one node of the majority that follows its master through failovers — planned
//! (`SENTINEL FAILOVER`: the old master lives on as a replica and answers `READONLY`) and forced (the
//! master SIGKILLed) — and keeps every claim it confirmed: a write counts only once a replica has it
//! (`WAIT`), and the promoted replica holds it.

use std::time::Duration;

use redcron::config::{RedisConfig, RedisNode, ReplicaAcks};
use redcron::lock::{ClaimOutcome, LockSettings};
use redcron::store::redis::RedisStore;
use redcron::store::Store;

use crate::conformance::{all_still_claimed, request, settings, settled, token_of};
use crate::support::{won, SentinelGroup};

/// The group as a node of `redis.nodes`.
fn node_of(group: &SentinelGroup, min_replicas_acked: ReplicaAcks) -> RedisNode {
    RedisNode::Sentinel(group.config(min_replicas_acked))
}

/// A store on `nodes` with lock settings that leave a loaded machine room (and a node timeout that
/// covers a `WAIT` for a replica).
fn store_on(nodes: &[RedisNode]) -> Store {
    let settings = LockSettings {
        node_timeout: Duration::from_millis(300),
        ..settings(3_000)
    };
    let config = RedisConfig::on(nodes.to_vec());
    Store::Redis(RedisStore::open(&config, settings).expect("a valid group"))
}

/// Through a planned failover and then a crash of the new master, every claim the group confirmed is
/// kept (no tick is granted twice) and tokens keep rising: the node follows the master each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_follows_its_master_through_failovers_and_keeps_every_claim() {
    let mut group = SentinelGroup::builder().replicas(2).sentinels(3).start();
    let store = store_on(&[node_of(&group, ReplicaAcks::All)]);
    let mut last = 0;
    for tick in 1..=5 {
        let token = token_of(&store, "w1", "job", tick * 1_000).await;
        assert!(token > last, "token {token} after {last}");
        last = token;
    }

    // Planned: the old master becomes a replica (it answers READONLY to the connection still open).
    let first = group.master().expect("a master");
    let second = group.failover();
    assert_ne!(first, second);
    all_still_claimed(&store, "job", (1..=5).map(|s| s * 1_000)).await;
    let token = token_of(&store, "w1", "job", 6_000).await;
    assert!(token > last, "token {token} after {last} across a failover");
    last = token;

    // Forced: the new master dies; the Sentinels promote a replica.
    group.data.kill(second);
    // The promoted replica may be the first master again (A → B → A): it continues B's history and
    // counts at once, as B did.
    let third = group.wait_for_new_master(second);
    assert_ne!(third, second);
    // The group's votes wait for the replica left to follow the new master (it may need a full
    // resynchronisation; on a loaded machine more than a claim's retries last).
    let left = (0..3)
        .find(|&node| node != second && node != third)
        .expect("a third data node");
    group.wait_until_following(left, third);
    all_still_claimed(&store, "job", (1..=6).map(|s| s * 1_000)).await;
    let token = token_of(&store, "w1", "job", 7_000).await;
    assert!(token > last, "token {token} after {last} across a crash");
}

/// A write that no replica acknowledged does not count: with the group's only replica down, a claim is
/// `NoQuorum`, saying why; once the replica is back, claims are granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_no_replica_acknowledged_does_not_count() {
    let mut group = SentinelGroup::builder().replicas(1).sentinels(1).start();
    let store = store_on(&[node_of(&group, ReplicaAcks::All)]);
    token_of(&store, "w1", "acked", 1_000).await;

    group.data.kill(1);
    let outcome = store.claim(&request("w1", "acked", 2_000)).await;
    let ClaimOutcome::NoQuorum(failure) = &outcome else {
        panic!("a claim without a replica counted: {outcome:?}");
    };
    let said = format!("{failure:?}");
    assert!(said.contains("WAIT saw 0 of the 1 replicas"), "{said}");
    assert!(said.contains("sentinel://"), "the group is named: {said}");

    group.data.restart(1);
    let master_port = group.data.port(0);
    let () = group
        .data
        .query(1, redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master_port));
    token_of(&store, "w1", "acked", 2_000).await;
}

/// The Sentinels' and the data nodes' passwords may differ; each is used where it belongs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinels_and_data_nodes_take_their_own_passwords() {
    let group = SentinelGroup::builder()
        .replicas(1)
        .sentinels(1)
        .password("data-secret")
        .sentinel_password("sentinel-secret")
        .start();
    let with = |password: Option<&str>, sentinel_password: Option<&str>| {
        let RedisNode::Sentinel(mut config) = node_of(&group, ReplicaAcks::All) else {
            unreachable!("node_of makes a group");
        };
        config.password = password.map(str::to_string);
        config.sentinel_password = sentinel_password.map(str::to_string);
        RedisNode::Sentinel(config)
    };
    let store = store_on(&[with(Some("data-secret"), Some("sentinel-secret"))]);
    token_of(&store, "w1", "auth", 1_000).await;

    let wrong = store_on(&[with(Some("sentinel-secret"), Some("data-secret"))]);
    let outcome = wrong.claim(&request("w2", "auth", 2_000)).await;
    let ClaimOutcome::NoQuorum(failure) = &outcome else {
        panic!("wrong passwords were accepted: {outcome:?}");
    };
    let said = format!("{failure:?}");
    assert!(!said.contains("secret"), "a password is shown: {said}");
    assert!(said.contains("no Sentinel of sentinel://"), "{said}");
}

/// A run's lease outlives its master: SIGKILLed while the lease is held, the master is replaced and the
/// next renewal lands on the new one (the lease key replicated before the grant counted), so the run
/// goes on; meanwhile no contender gets the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_renews_on_the_new_master_after_the_old_one_dies() {
    let mut group = SentinelGroup::builder().replicas(2).sentinels(3).start();
    let settings = LockSettings {
        ttl: Duration::from_secs(8),
        renew_every: Duration::from_secs(2),
        node_timeout: Duration::from_millis(300),
        ..settings(8_000)
    };
    let store = Store::Redis(
        RedisStore::open(
            &RedisConfig::on(vec![node_of(&group, ReplicaAcks::All)]),
            settings,
        )
        .expect("a group"),
    );
    let mut lease = won(settled(&store, &request("holder", "long", 1_000)).await);

    let old = group.master().expect("a master");
    group.data.kill(old);
    group.wait_for_new_master(old);
    // Renewals fail while the Sentinels elect; the lease is good for 8 s, so one lands in time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    loop {
        match store.renew(&mut lease).await {
            Ok(()) => break,
            Err(error) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
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

/// A hung master (SIGSTOP) is replaced; resumed, it comes back as a replica. Nothing written to it while
/// it was cut off counts (its replicas follow the new master, so `WAIT` fails there), and every claim
/// made before, during and after stays claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_master_is_replaced_and_returns_as_a_replica_without_a_second_grant() {
    let mut group = SentinelGroup::builder().replicas(2).sentinels(3).start();
    let store = store_on(&[node_of(&group, ReplicaAcks::All)]);
    let mut last = token_of(&store, "w1", "hung", 1_000).await;

    let old = group.master().expect("a master");
    group.data.stop(old);
    group.wait_for_new_master(old);
    let token = token_of(&store, "w1", "hung", 2_000).await;
    assert!(token > last, "token {token} after {last}");
    last = token;

    group.data.cont(old);
    // The Sentinels turn the old master into a replica of the new one.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while group.role(old).as_deref() != Some("slave") {
        assert!(
            std::time::Instant::now() < deadline,
            "the old master did not become a replica:\n{}",
            group.sentinel_logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let token = token_of(&store, "w1", "hung", 3_000).await;
    assert!(token > last, "token {token} after {last}");
    all_still_claimed(&store, "hung", [1_000, 2_000, 3_000]).await;
}

/// What an operator is shown of a group: `check` names its Sentinels and when its answer counts;
/// `status`, `/readyz`, `/metrics` and the dashboard's workers page name the master in use — and,
/// after a failover, the new master and the failover seen (the old master's series gone).
#[test]
fn check_status_readyz_metrics_and_the_dashboard_name_the_groups_master() {
    use crate::inspect::{inspect, parse};
    use crate::metrics::{get, listening_worker, wait_for};
    use crate::support::TestDir;

    let group = SentinelGroup::builder().start();
    let dir = TestDir::new();
    let node = group.node_yaml();
    let yaml = |port: u16| {
        format!(
            "redis:\n  nodes:\n    - {node}\nlock:\n  ttl: 3s\n  renew_every: 1s\n  node_timeout: 300ms\n\
             worker:\n  id: w\n  listen: 127.0.0.1:{port}\njobs:\n  - name: tick\n    \
             schedule: \"* * * * * *\"\n    command: 'true'\n"
        )
    };
    let (worker, port) = listening_worker(&dir, "w", yaml);
    let config = dir.write("cli.yaml", yaml(port));
    let label = format!(
        "sentinel://{}@{}",
        group.master_name(),
        group.sentinel_addresses().join(",")
    );
    let first = group.master().expect("the group has a master");
    let address = |i: usize| format!("127.0.0.1:{}", group.data.port(i));
    let patience = Duration::from_secs(30);

    let (code, checked, stderr) = inspect(&dir, &config, &["check"]);
    assert_eq!(code, 0, "{stderr}");
    let sentinels = group.sentinel_addresses().join(", ");
    for line in [
        format!(
            "  node 1 of 1: Sentinel group \"{}\", its master looked up from 3 Sentinels ({sentinels}); \
             its master's answer counts once every replica the Sentinels know as up has the writes (WAIT)",
            group.master_name()
        ),
        "  a claim needs 1 of the 1 node to agree; `redcron status` names each group's master now"
            .to_string(),
    ] {
        assert!(checked.lines().any(|l| l == line), "{line:?} not in:\n{checked}");
    }

    // Everything names the first master, as the worker found it.
    let shows = |master: &str, failovers: u64| {
        let readyz = format!("group {label}: master {master}, {failovers} failover");
        let gauge =
            format!("redcron_store_group_master{{group=\"{label}\",master=\"{master}\"}} 1");
        let counter =
            format!("redcron_store_group_failovers_total{{group=\"{label}\"}} {failovers}");
        let found = wait_for(patience, || {
            let ready = get(port, "/readyz").ok()?;
            let metrics = get(port, "/metrics").ok()?;
            (ready.0 == 200
                && ready.2.contains(&readyz)
                && metrics.2.contains(&gauge)
                && metrics.2.contains(&counter))
            .then_some((ready.2, metrics.2))
        });
        let (_, metrics) = found.unwrap_or_else(|| {
            panic!(
                "/readyz and /metrics do not name master {master} and {failovers} failovers: {:?}\n{:?}",
                get(port, "/readyz").map(|r| r.2),
                get(port, "/metrics").map(|r| r.2)
            )
        });
        let masters = metrics
            .lines()
            .filter(|l| l.starts_with("redcron_store_group_master{"))
            .count();
        assert_eq!(masters, 1, "one master series per group:\n{metrics}");
        let page = get(port, "/workers").expect("the workers page").2;
        assert!(
            page.contains(&format!("data-master=\"{master}\"")),
            "{page}"
        );
        let (code, status, stderr) = inspect(&dir, &config, &["status"]);
        assert_eq!(code, 0, "{stderr}");
        let line = format!("  group {label}: master {master}");
        assert!(
            status.lines().any(|l| l == line),
            "{line:?} not in:\n{status}"
        );
        let (_, json, _) = inspect(&dir, &config, &["status", "--json"]);
        let json = parse(&json);
        assert_eq!(json["groups"][0]["group"], label.as_str(), "{json}");
        assert_eq!(json["groups"][0]["master"], master, "{json}");
    };
    shows(&address(first), 0);

    let second = group.failover();
    assert_ne!(second, first);
    shows(&address(second), 1);
    drop(worker);
}

/// A group over TLS only (data nodes, replication and Sentinels, on a private CA): with `redis.ca_file`
/// the Sentinels and the masters are verified and claims go on through a failover; without it (the
/// Mozilla roots) nothing is trusted and nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_group_is_verified_against_the_ca_file_through_a_failover() {
    use redcron::config::RedisTls;

    let group = SentinelGroup::builder().tls(true).start();
    let settings = LockSettings {
        node_timeout: Duration::from_millis(500),
        ..settings(3_000)
    };
    let store_with = |ca_file: Option<std::path::PathBuf>| {
        let config = RedisConfig {
            nodes: vec![node_of(&group, ReplicaAcks::All)],
            tls: RedisTls {
                ca_file,
                client_identity: None,
            },
        };
        Store::Redis(RedisStore::open(&config, settings.clone()).expect("a TLS group"))
    };
    let store = store_with(Some(group.ca_file()));
    let first = token_of(&store, "w1", "tls", 1_000).await;
    let untrusted = store_with(None);
    let outcome = untrusted.claim(&request("w2", "tls", 2_000)).await;
    assert!(
        matches!(outcome, ClaimOutcome::NoQuorum(_)),
        "a group whose CA is not trusted granted {outcome:?}"
    );
    group.failover();
    let second = token_of(&store, "w1", "tls", 3_000).await;
    assert!(second > first, "token {second} after {first}");
    assert_eq!(
        store.groups()[0].failovers,
        1,
        "the store followed the master over TLS: {:?}",
        store.groups()
    );
}

/// The first step of every promotion — a replica told `REPLICAOF NO ONE` while the old master still
/// takes writes — done by hand: with `min_replicas_acked: all` a write the promoted replica lacks does
/// not count (`WAIT` sees 1 of the 2 replicas the Sentinels know), though the other replica has it;
/// `min_replicas_acked: 1` counts it, which a failover would lose (the tick could run twice). Once the
/// replica follows the master again, claims count again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_the_replica_promoted_next_lacks_does_not_count() {
    let group = SentinelGroup::builder().replicas(2).sentinels(3).start();
    let all = store_on(&[node_of(&group, ReplicaAcks::All)]);
    let one = store_on(&[node_of(&group, ReplicaAcks::Exactly(1))]);
    token_of(&all, "w1", "promoted", 1_000).await;
    token_of(&one, "w1", "promoted-one", 2_000).await;

    let promoted = (0..3)
        .find(|&i| Some(i) != group.master())
        .expect("a replica");
    let () = group
        .data
        .query(promoted, redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
    let outcome = all.claim(&request("w1", "promoted", 3_000)).await;
    let ClaimOutcome::NoQuorum(failure) = &outcome else {
        panic!("a write the promoted replica lacks counted: {outcome:?}");
    };
    let said = format!("{failure:?}");
    assert!(said.contains("WAIT saw 1 of the 2 replicas"), "{said}");
    let counted = one.claim(&request("w1", "promoted-one", 4_000)).await;
    let ClaimOutcome::Won(lease) = counted else {
        panic!("with min_replicas_acked: 1, one replica's acknowledgement counts: {counted:?}");
    };
    one.release(&lease).await;

    let master = group.master().expect("the group has a master");
    let () = group.data.query(
        promoted,
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(group.data.port(master)),
    );
    token_of(&all, "w1", "promoted", 5_000).await;
}

/// Until a Sentinel says how many replicas are up, `min_replicas_acked: all` does not know how many
/// `WAIT` must see, so the group's answers do not count: with a Sentinel user that may look the master
/// up but not list its replicas, a claim is `NoQuorum`, saying why. Once the user may list them, the
/// count is read again within a few seconds and claims are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_whose_replicas_no_sentinel_lists_does_not_count() {
    let group = SentinelGroup::builder().replicas(2).sentinels(1).start();
    let limited = |rule: &str| {
        let set: Option<String> = group.sentinel_query(
            0,
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("limited")
                .arg("on")
                .arg(">limited-secret")
                .arg("+@all")
                .arg("allchannels")
                .arg(rule),
        );
        assert_eq!(set.as_deref(), Some("OK"), "ACL SETUSER {rule}");
    };
    limited("-sentinel|replicas");
    let RedisNode::Sentinel(mut config) = node_of(&group, ReplicaAcks::All) else {
        unreachable!("node_of makes a group");
    };
    config.sentinel_username = Some("limited".to_string());
    config.sentinel_password = Some("limited-secret".to_string());
    let store = store_on(&[RedisNode::Sentinel(config)]);

    let outcome = store.claim(&request("w1", "counted", 1_000)).await;
    let ClaimOutcome::NoQuorum(failure) = &outcome else {
        panic!("a group whose replicas are unknown counted: {outcome:?}");
    };
    let said = format!("{failure:?}");
    assert!(said.contains("said how many replicas are up"), "{said}");
    assert!(
        !said.contains("limited-secret"),
        "a password is shown: {said}"
    );

    limited("+sentinel|replicas");
    token_of(&store, "w1", "counted", 1_000).await;
}
