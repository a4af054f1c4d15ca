//! The lease, claim and token protocol against real stores.
//!
//! The Redis store's own cases: split votes, a node restarted empty, persistence, the plain lease, TLS,
//! renewals pipelined together. What every store guarantees — one grant per tick, rising tokens, leases
//! renewed, released and lost, and the faults of a minority or a majority of nodes — is the conformance
//! suite (`tests/it/conformance`, `conformance::redis::…`); the etcd cluster's own faults are in
//! `tests/it/etcd.rs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redcron::config::{RedisConfig, RedisNode, RedisTls};
use redcron::lock::{ClaimOutcome, RenewError};
use redcron::store::redis::RedisStore;
use redcron::store::{Leases as _, Store};

use crate::conformance::{race_settings, request, settings, settled, warm};
use crate::support::{claim_won, won, Persistence, RedisCluster};

/// Split votes: contenders that each find the job's lease held by different minorities retry with jitter
/// and converge on exactly one winner; and 20 ticks raced by 10 contenders each get exactly one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn split_votes_converge_on_one_winner() {
    let cluster = RedisCluster::start(5);
    let mut lock = race_settings();
    lock.retries = 6;
    let store = Arc::new(cluster.store(lock));
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
    let store = cluster.store(settings(2_000));
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

/// A batch of more claims than one script call takes (several `EVALSHA`s in one pipeline) after every
/// node's script cache was flushed: the calls that met `NOSCRIPT` are sent again once the scripts are
/// loaded, and every claim of the batch is won once, with each call's answers matched to its own claims
/// (the right job and tick, tokens rising tick to tick).
#[tokio::test]
async fn a_batch_of_several_calls_is_won_after_every_nodes_scripts_were_flushed() {
    const JOBS: usize = 3 * redcron::store::redis::scripts::CLAIMS_PER_CALL + 7;
    let cluster = RedisCluster::start(3);
    let store = cluster.store(settings(10_000));
    warm(&store).await;
    let mut last = vec![0; JOBS];
    for tick in [60_000, 120_000] {
        for node in 0..3 {
            cluster.query::<()>(node, redis::cmd("SCRIPT").arg("FLUSH"));
        }
        let requests: Vec<_> = (0..JOBS)
            .map(|j| request("w", &format!("batch-{j}"), tick))
            .collect();
        let outcomes = store.claim_many(&requests).await;
        assert_eq!(outcomes.len(), JOBS);
        for (j, (outcome, request)) in outcomes.into_iter().zip(&requests).enumerate() {
            // A node slow on a loaded machine: the same claim again, as the worker does.
            let outcome = match outcome.retry_in() {
                Some(_) => settled(&store, request).await,
                None => outcome,
            };
            let lease = won(outcome);
            assert_eq!(
                (lease.job.as_str(), lease.tick.as_millis()),
                (request.job.as_str(), tick)
            );
            assert!(
                lease.token > last[j],
                "job {j}: token {} after {}",
                lease.token,
                last[j]
            );
            last[j] = lease.token;
            store.release(&lease).await;
        }
    }
}

/// With the persistence `docs/protocol.md` requires (AOF, fsync always), claims and fence counters
/// survive a restart of every node: a claimed tick stays claimed, and tokens go on increasing.
#[tokio::test]
async fn claims_survive_restarts_with_required_persistence() {
    let mut cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::AppendOnlyAlways)
        .start();
    let store = cluster.store(settings(2_000));
    warm(&store).await;
    let a = claim_won(&store, &request("a", "durable", 1_000)).await;
    store.release(&a).await;
    for node in 0..3 {
        cluster.kill(node);
        cluster.restart(node);
    }
    let store = cluster.store(settings(2_000));
    warm(&store).await;
    assert!(matches!(
        store.claim(&request("b", "durable", 1_000)).await,
        ClaimOutcome::AlreadyClaimed { .. }
    ));
    let b = claim_won(&store, &request("b", "durable", 1_001)).await;
    assert!(b.token > a.token);
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
    let store = cluster.store(settings(2_000));
    warm(&store).await;
    let mut lease = claim_won(&store, &request("w", "tls", 1_000)).await;
    store.renew(&mut lease).await.expect("renew over TLS");
    store.release(&lease).await;
    assert!(matches!(
        store.claim(&request("w", "tls", 1_000)).await,
        ClaimOutcome::AlreadyClaimed { .. }
    ));
}

/// `redis.ca_file` and a client certificate: nodes whose certificates a private CA signed, and that
/// require a client certificate (`tls-auth-clients yes`), grant claims to a store that trusts that CA
/// and presents one — and to no store that lacks either. A file that is not PEM stops the store at
/// open, naming its field and path.
#[tokio::test]
async fn tls_nodes_are_verified_against_the_ca_file_and_shown_the_client_certificate() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .tls(true)
        .client_certificates(true)
        .start();
    let nodes: Vec<RedisNode> = (0..3)
        .map(|i| RedisNode::Server(cluster.verified_url(i)))
        .collect();
    let store_with = |tls: RedisTls| {
        let config = RedisConfig {
            nodes: nodes.clone(),
            tls,
        };
        Store::Redis(RedisStore::open(&config, settings(2_000)).expect("valid certificates"))
    };
    let full = RedisTls {
        ca_file: Some(cluster.ca_file()),
        client_identity: Some(cluster.client_identity()),
    };
    let store = store_with(full.clone());
    warm(&store).await;
    let mut lease = claim_won(&store, &request("w", "private-ca", 1_000)).await;
    store.renew(&mut lease).await.expect("renew over TLS");
    store.release(&lease).await;

    for (missing, tls) in [
        (
            "the CA (the Mozilla roots do not know it)",
            RedisTls {
                ca_file: None,
                ..full.clone()
            },
        ),
        (
            "the client certificate",
            RedisTls {
                client_identity: None,
                ..full.clone()
            },
        ),
    ] {
        let store = store_with(tls);
        let outcome = store.claim(&request("w", "private-ca", 2_000)).await;
        assert!(
            matches!(outcome, ClaimOutcome::NoQuorum { .. }),
            "a store without {missing} got {outcome:?}"
        );
    }

    let not_pem = cluster.ca_file().with_file_name("not-a-ca.pem");
    std::fs::write(&not_pem, "not a certificate").expect("a test file");
    let config = RedisConfig {
        nodes: nodes.clone(),
        tls: RedisTls {
            ca_file: Some(not_pem.clone()),
            client_identity: None,
        },
    };
    let error = RedisStore::open(&config, settings(2_000))
        .err()
        .expect("a CA file without a certificate is refused")
        .to_string();
    assert_eq!(
        error,
        format!(
            "redis.ca_file {}: holds no PEM certificate",
            not_pem.display()
        )
    );
    let missing = cluster.ca_file().with_file_name("absent.pem");
    let config = RedisConfig {
        nodes,
        tls: RedisTls {
            ca_file: Some(missing.clone()),
            client_identity: None,
        },
    };
    let error = RedisStore::open(&config, settings(2_000))
        .err()
        .expect("a missing CA file is refused")
        .to_string();
    assert!(
        error.starts_with(&format!(
            "redis.ca_file {}: cannot read it",
            missing.display()
        )),
        "{error}"
    );
}

/// The same files named in a config, relative to its directory: `redcron status` reads the TLS nodes
/// through them, and fails naming no majority once the config no longer names the CA.
#[test]
fn a_config_names_its_redis_certificates_beside_it() {
    use crate::inspect::inspect;
    use crate::support::TestDir;

    let cluster = RedisCluster::builder()
        .nodes(3)
        .tls(true)
        .client_certificates(true)
        .start();
    let dir = TestDir::new();
    std::fs::create_dir(dir.path().join("certs")).expect("a certificate directory");
    let (cert, key) = cluster.client_identity();
    for (from, to) in [
        (cluster.ca_file(), "certs/ca.pem"),
        (cert, "certs/client.pem"),
        (key, "certs/client-key.pem"),
    ] {
        std::fs::copy(from, dir.path().join(to)).expect("a copied certificate");
    }
    let nodes: Vec<String> = (0..3)
        .map(|i| format!("\"{}\"", cluster.verified_url(i)))
        .collect();
    let job = "jobs:\n  - name: a\n    schedule: \"0 0 * * * *\"\n    command: 'true'\n";
    let section = format!("redis:\n  nodes: [{}]\n", nodes.join(", "));
    let files = "  cert_file: certs/client.pem\n  key_file: certs/client-key.pem\n";
    let config = dir.write(
        "jobs.yaml",
        format!("{section}  ca_file: certs/ca.pem\n{files}{job}"),
    );
    let (code, out, err) = inspect(&dir, &config, &["status"]);
    assert_eq!(code, 0, "{out}{err}");
    let without_ca = dir.write("no-ca.yaml", format!("{section}{files}{job}"));
    let (code, _, err) = inspect(&dir, &without_ca, &["status"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("majority"), "{err}");
}

/// Renewals and releases asked for at once travel together (the lease keeper sends them in one pipeline
/// per node) and each is still decided on its own: of 200 leases renewed at once, the one released just
/// before is lost and stays lost, the 199 others are renewed; then all are released at once, and every job
/// can be claimed again at a later tick.
#[tokio::test]
async fn renewals_asked_for_together_are_each_decided_on_their_own() {
    let cluster = RedisCluster::start(5);
    let store = cluster.store(race_settings());
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

/// The failures of a claim of `request` that no majority would grant: every node's reason, as the worker
/// logs them; panics if the claim is granted or refused for another cause.
async fn no_quorum(store: &RedisStore, request: &redcron::lock::ClaimRequest) -> String {
    use redcron::store::Claims as _;
    let outcome = store.claim_many(std::slice::from_ref(request)).await;
    match outcome.into_iter().next() {
        Some(ClaimOutcome::NoQuorum(failure)) => format!("{:?}", failure.failures),
        other => panic!("expected no majority, got {other:?}"),
    }
}

/// Finding 55.4: one server listed under two names (`127.0.0.1` and `localhost`) beside a node that is
/// down votes once, not twice: no claim is granted (1 of 3 votes), and the failure names both names of the
/// server. Without identifying nodes by `run_id`, every claim was won on the one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_names_votes_once() {
    use redcron::store::Health as _;
    let mut cluster = RedisCluster::start(2);
    let port = cluster.port(0);
    let urls = [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        cluster.url(1),
    ];
    cluster.kill(1);
    let store = RedisStore::new(&urls, settings(2_000)).expect("urls");
    store.prepare().await.expect("prepare never fails");
    for tick in 1..=5 {
        let why = no_quorum(&store, &request("w", "aliased", tick * 1_000)).await;
        assert!(
            why.contains(&format!(
                "node redis://localhost:{port} is the same server as node redis://127.0.0.1:{port}"
            )) || why.contains(&format!(
                "node redis://127.0.0.1:{port} is the same server as node redis://localhost:{port}"
            )),
            "tick {tick}: the failure names both names of the server: {why}"
        );
    }
}

/// Finding 55.5 (a): a node that evicts keys (`maxmemory-policy allkeys-lru`) does not vote — beside a
/// node that is down, no claim is granted — and the failure names it and the fix. The policy is also
/// noticed when it changes on a live connection (read again every 10 s). Without the check, the evicting
/// node voted and the claim was won.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_evicts_keys_does_not_vote() {
    use redcron::store::Health as _;
    let mut cluster = RedisCluster::start(3);
    let policy = |name: &str| {
        let mut set = ::redis::cmd("CONFIG");
        set.arg("SET").arg("maxmemory-policy").arg(name);
        set
    };
    cluster.query::<()>(0, &policy("allkeys-lru"));
    cluster.query::<()>(1, &policy("volatile-ttl"));
    let store = RedisStore::new(&cluster.urls(), settings(2_000)).expect("urls");
    // As the worker does at start: every node identified before the first claim.
    store.prepare().await.expect("prepare never fails");
    let why = no_quorum(&store, &request("w", "evicted", 1_000)).await;
    for (node, name) in [(0, "allkeys-lru"), (1, "volatile-ttl")] {
        assert!(
            why.contains(&format!(
                "node {} evicts keys (maxmemory-policy {name})",
                cluster.url(node)
            )) && why.contains("CONFIG SET maxmemory-policy noeviction"),
            "node {node} refused with the fix: {why}"
        );
    }
    // Fixed on node 1 (a new store connects anew): claims are won on nodes 1 and 2 only.
    cluster.query::<()>(1, &policy("noeviction"));
    let store = RedisStore::new(&cluster.urls(), settings(2_000)).expect("urls");
    use redcron::store::Claims as _;
    let lease = won(settled_on(&store, &request("w", "evicted", 2_000)).await);
    store.release(&lease).await;
    // Broken again on the live connection: noticed at the next reading of the checks.
    cluster.query::<()>(1, &policy("allkeys-random"));
    cluster.kill(2);
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    let mut tick = 3_000;
    loop {
        let outcome = store
            .claim_many(&[request("w", "evicted", tick)])
            .await
            .remove(0);
        match outcome {
            ClaimOutcome::NoQuorum(failure)
                if format!("{:?}", failure.failures)
                    .contains("maxmemory-policy allkeys-random") =>
            {
                break
            }
            ClaimOutcome::Won(lease) => store.release(&lease).await,
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a policy changed on a live connection was never noticed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        tick += 1_000;
    }
}

/// Finding 55.5 (c): two of three nodes restarted empty one after the other while a lease is held and
/// renewed — each a minority at its time — never let the tick be granted again: not to a store that saw
/// the restarts, nor to one that connects only afterwards, and not after the holder released it. The
/// holder's renewals put its lease, record and fence back on each restarted node (`scripts::RENEW`),
/// and a restarted node does not count for one TTL. Without them, the tick was granted a second time
/// with the first grant's token, and the holder's lease was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_restarted_empty_one_after_another_never_grant_a_running_tick_again() {
    use redcron::store::Claims as _;
    let mut cluster = RedisCluster::start(3);
    let lock = settings(2_000);
    let holder = RedisStore::new(&cluster.urls(), lock.clone()).expect("urls");
    let watcher = RedisStore::new(&cluster.urls(), lock.clone()).expect("urls");
    let tick = 60_000;
    let mut lease = won(settled_on(&holder, &request("a", "restarted", tick)).await);
    let _ = settled_on(&watcher, &request("warm-up", "warm-up", 1)).await;
    for node in [0, 1] {
        cluster.restart(node);
        // The holder renews every 400 ms, as the watchdog would, past the restarted node's hold (the
        // TTL and its drift).
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        while tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(400)).await;
            match holder.renew(&mut lease).await {
                Ok(()) | Err(RenewError::Unconfirmed(_)) => {}
                Err(error) => {
                    panic!("the holder lost its lease after node {node} restarted: {error}")
                }
            }
        }
        let late = watcher
            .claim_many(&[request(&format!("b{node}"), "restarted", tick)])
            .await
            .remove(0);
        assert!(
            !matches!(late, ClaimOutcome::Won(_)),
            "after node {node} restarted empty, the running tick was granted again: {late:?}"
        );
    }
    let fresh = RedisStore::new(&cluster.urls(), lock.clone()).expect("urls");
    let again = settled_on(&fresh, &request("c", "restarted", tick)).await;
    assert!(
        matches!(again, ClaimOutcome::AlreadyClaimed { .. }),
        "a store that connected after the restarts was granted the running tick: {again:?}"
    );
    holder.release(&lease).await;
    let after = settled_on(&fresh, &request("d", "restarted", tick)).await;
    assert!(
        matches!(after, ClaimOutcome::AlreadyClaimed { .. }),
        "the tick was granted again after its run released it: {after:?}"
    );
    let next = won(settled_on(&fresh, &request("d", "restarted", tick + 60_000)).await);
    assert!(
        next.token > lease.token,
        "{} after {}",
        next.token,
        lease.token
    );
}

/// `request`'s outcome on `store` once final, retried as the worker does.
async fn settled_on(store: &RedisStore, request: &redcron::lock::ClaimRequest) -> ClaimOutcome {
    use redcron::store::Claims as _;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let outcome = store
            .claim_many(std::slice::from_ref(request))
            .await
            .remove(0);
        match outcome.retry_in() {
            Some(wait) if tokio::time::Instant::now() + wait < give_up => {
                tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
            }
            _ => return outcome,
        }
    }
}

/// Issue 54: a round decided before a live node answered names that node as unheard, not failed. Two
/// of three nodes are down (refused at once), the third is alive behind a proxy that holds the claim a
/// second: a majority is out of reach as soon as the two refusals are in, so the round ends without the
/// third's answer — and the failure says so, naming only the two as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_round_did_not_wait_for_is_unheard_not_failed() {
    use redcron::store::{Claims as _, Health as _};
    const JOB: &str = "unheard-marker";
    let mut cluster = RedisCluster::start(3);
    let proxy = crate::support::DelayProxy::start(cluster.port(2), JOB, Duration::from_secs(1));
    let urls = [cluster.url(0), cluster.url(1), proxy.url()];
    cluster.kill(0);
    cluster.kill(1);
    let store = RedisStore::new(&urls, settings(2_000)).expect("urls");
    store.prepare().await.expect("prepare never fails");
    proxy.delay_next(usize::MAX);
    let outcome = store
        .claim_many(&[request("w", JOB, 1_000)])
        .await
        .remove(0);
    let ClaimOutcome::NoQuorum(failure) = outcome else {
        panic!("expected no majority, got {outcome:?}");
    };
    let said = failure.to_string();
    let live = proxy.url();
    assert_eq!(failure.unheard, std::slice::from_ref(&live), "{said}");
    assert!(
        failure.failures.iter().all(|(node, _)| node != &live),
        "the live node is named as failed: {said}"
    );
    assert!(
        said.contains(&format!("decided before {live} answered")),
        "{said}"
    );
}

/// Issue 54: a node that answered and refused the claim is named with what it said, not left out. One of
/// three nodes is down and another already confirmed the tick for another worker (w9, a store of that
/// one node): the third's grant, if it is waited for, is no majority, and the failure names the down node as failed and the
/// refusing one as refused — the tick claimed by w9 — so a WARN never reads as a missing majority alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refused_says_why_in_a_failure() {
    use redcron::store::{Claims as _, Health as _};
    const JOB: &str = "refused-marker";
    let mut cluster = RedisCluster::start(3);
    let urls = [cluster.url(0), cluster.url(1), cluster.url(2)];
    let theirs = RedisStore::new(&urls[..1], settings(2_000)).expect("urls");
    theirs.prepare().await.expect("prepare never fails");
    let won = match theirs
        .claim_many(&[request("w9", JOB, 1_000)])
        .await
        .remove(0)
    {
        ClaimOutcome::Won(won) => won,
        other => panic!("w9's claim on its one node: {other:?}"),
    };
    cluster.kill(2);
    let ours = RedisStore::new(&urls, settings(2_000)).expect("urls");
    ours.prepare().await.expect("prepare never fails");
    let outcome = ours.claim_many(&[request("w", JOB, 1_000)]).await.remove(0);
    let ClaimOutcome::NoQuorum(failure) = outcome else {
        panic!("expected no majority, got {outcome:?}");
    };
    let said = failure.to_string();
    // The round may end before the live granting node answers (a majority is out of reach once the
    // refusal and the failure are in): then it is unheard, never failed.
    assert!(failure.granted <= 1, "{said}");
    assert!(
        failure.granted == 1 || failure.unheard == [urls[1].clone()],
        "{said}"
    );
    assert_eq!(
        failure.refused,
        [(urls[0].clone(), "the tick is claimed by w9".to_string())],
        "{said}"
    );
    assert!(
        failure.failures.iter().all(|(node, _)| node == &urls[2]),
        "{said}"
    );
    assert!(
        said.contains(&format!("refused: {} (the tick is claimed by w9)", urls[0])),
        "{said}"
    );
    theirs.release(&won).await;
}
