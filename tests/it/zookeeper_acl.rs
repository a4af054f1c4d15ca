//! Digest auth on ZooKeeper, end to end: nodes that a worker without auth made (`world:anyone:cdrwa`)
//! become the user's when a worker with `username`/`password` starts, so a client without credentials
//! can change none of them — it can neither delete a claim record (which let a tick run twice) nor a
//! lease node (which stopped a running job); and a node of another user that the worker cannot take
//! stops it at start, naming the node.
//!
//! The stranger is a plain `zookeeper_client` session without auth, as `zkCli.sh` without `addauth`.

use std::time::{Duration, Instant};

use testkit::SharedZk;
use zookeeper_client::{Acls, Client, CreateMode, Error};

use crate::support::{TestDir, Worker};
use crate::worker::{ledger, tick_time};

const USER: &str = "redcron";
const PASSWORD: &str = "s3cret-zk";

/// A worker's config on the shared ensemble under `prefix`, with digest auth when `auth` (the password
/// from `$ZK_PASSWORD`).
fn config(zk: &SharedZk, auth: bool, worker: &str, jobs: &str) -> String {
    let hosts: Vec<String> = zk
        .ensemble()
        .addresses()
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect();
    let auth = if auth {
        format!("  username: {USER}\n  password: \"${{ZK_PASSWORD}}\"\n")
    } else {
        String::new()
    };
    format!(
        "zookeeper:\n  hosts: [{}]\n  key_prefix: {}\n{auth}{}worker:\n  id: {worker}\njobs:\n{jobs}",
        hosts.join(", "),
        zk.prefix(),
        testkit::stores::ZK_LEASES,
    )
}

/// A job every 15 s whose tick may be claimed for 12 s: it writes its ledger line, then runs 3 s.
fn long_job(dir: &TestDir) -> String {
    format!(
        "  - name: long\n    schedule: \"*/15 * * * * *\"\n    misfire_grace: 12s\n    \
         command: 'echo \"$REDCRON_JOB $REDCRON_TICK $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID\" >> {}; \
         sleep 3'\n",
        dir.ledger().display()
    )
}

/// A session on the shared ensemble, with digest auth `user:password` if given; no chroot.
async fn session(zk: &SharedZk, auth: Option<(&str, &str)>) -> Client {
    let hosts = zk.ensemble().addresses().join(",");
    let mut connector = Client::connector();
    if let Some((user, password)) = auth {
        connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
    }
    connector
        .connect(&hosts)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {hosts}: {e}"))
}

/// Every node at and under `root`, as `client` lists them.
async fn tree(client: &Client, root: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut waiting = vec![root.to_string()];
    while let Some(path) = waiting.pop() {
        let children = client
            .list_children(&path)
            .await
            .unwrap_or_else(|e| panic!("cannot list {path}: {e}"));
        waiting.extend(children.iter().map(|child| format!("{path}/{child}")));
        found.push(path);
    }
    found
}

/// Stops `worker` with SIGTERM and waits for it to exit.
fn stop(mut worker: Worker) {
    worker.signal(libc::SIGTERM);
    assert!(
        worker.wait_timeout(Duration::from_secs(20)).is_some(),
        "the worker did not stop"
    );
}

/// A worker runs without auth, then one with auth on the same prefix: at its first session it gives
/// every node the user's ACL (logging `store.acl_fixed` with the count and the paths) before its first
/// claim. A client without credentials then deletes the lease node while a run holds it and the claim
/// record after the run, and the worker is restarted within the tick's grace: the run ends `success`,
/// no lease is lost, the tick runs once (before, the deleted record let the restarted worker win the
/// tick again, and the deleted lease stopped the run). Every node under the chroot has the creator's
/// ACL only, and the stranger can set, delete, create under or re-ACL none of them.
#[test]
fn nodes_made_without_auth_become_the_users_and_a_stranger_can_change_none() {
    let zk = SharedZk::get();
    let chroot = format!("/{}", zk.prefix());
    let dir = TestDir::new();
    let jobs = long_job(&dir);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let env = [("ZK_PASSWORD", PASSWORD)];

    // Without auth: the worker's nodes (and the chroot) are anyone's.
    let open = Worker::spawn(dir.write("open.yaml", config(&zk, false, "w0", &jobs)), &[]);
    open.wait_for_event("run.finished", Duration::from_secs(40))
        .unwrap_or_else(|| panic!("no run without auth; it said:\n{:?}", open.lines()));
    stop(open);
    let stranger = runtime.block_on(session(&zk, None));
    let by_hand = format!("{chroot}/jobs/made-by-hand");
    runtime
        .block_on(stranger.create(
            &by_hand,
            b"x",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        ))
        .expect("a node made by hand, without auth");

    // With auth: the nodes are made the user's before the first claim.
    let config_auth = dir.write("auth.yaml", config(&zk, true, "w1", &jobs));
    let authed = Worker::spawn(&config_auth, &env);
    let fixed = authed
        .wait_for_event("store.acl_fixed", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no store.acl_fixed; it said:\n{:?}", authed.lines()));
    eprintln!("{fixed}");
    let paths = fixed["paths"].as_str().expect("paths");
    for node in [
        chroot.clone(),
        format!("{chroot}/jobs/long"),
        format!("{chroot}/jobs/long/c"),
        by_hand.clone(),
    ] {
        assert!(
            paths.split(',').any(|p| p == node),
            "{node} not among the fixed: {fixed}"
        );
    }
    assert!(fixed["fixed"].as_u64().unwrap_or(0) >= 8, "{fixed}");
    let first_claim = authed
        .logs()
        .iter()
        .position(|e| e["event"] == "tick.won" || e["event"] == "tick.lost");
    let fixed_at = authed
        .logs()
        .iter()
        .position(|e| e["event"] == "store.acl_fixed");
    assert!(
        first_claim.is_none() || first_claim > fixed_at,
        "a claim was decided before the nodes were fixed"
    );

    // A run of the worker with auth; the stranger deletes its lease node while it runs.
    let started = authed
        .wait_for_event("run.started", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no run with auth; it said:\n{:?}", authed.lines()));
    let tick = started["tick"].as_str().expect("a tick").to_string();
    let lease_deleted = runtime.block_on(stranger.delete(&format!("{chroot}/jobs/long/l"), None));
    let finished = authed
        .wait_for(Duration::from_secs(15), |e| {
            e["event"] == "run.finished" && e["tick"] == tick.as_str()
        })
        .expect("the run finished");
    let record_deleted = runtime.block_on(stranger.delete(&format!("{chroot}/jobs/long/c"), None));
    let lost = authed.events("lease.lost");
    stop(authed);

    // Restarted within the tick's grace: the tick is not won again.
    let again = Worker::spawn(&config_auth, &env);
    let grace_over = tick_time(&tick) + chrono::Duration::seconds(14);
    let next = again
        .wait_for(Duration::from_secs(40), |e| {
            e["event"] == "run.started" && e["tick"].as_str().is_some_and(|t| t > tick.as_str())
        })
        .unwrap_or_else(|| panic!("no later tick ran; it said:\n{:?}", again.lines()));
    while chrono::Utc::now() < grace_over {
        std::thread::sleep(Duration::from_millis(200));
    }
    let runs = ledger(&dir);
    let of_tick = runs
        .get(&("long".to_string(), tick.clone()))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        of_tick.len(),
        1,
        "long at {tick} ran {} times {of_tick:?} (the stranger's delete of the claim record: {record_deleted:?})",
        of_tick.len()
    );
    assert_eq!(
        finished["outcome"], "success",
        "the run did not end well (the stranger's delete of the lease: {lease_deleted:?}): {finished}"
    );
    assert!(lost.is_empty(), "a lease was lost: {lost:?}");
    assert_eq!(record_deleted, Err(Error::NoAuth));
    assert_eq!(lease_deleted, Err(Error::NoAuth));
    eprintln!(
        "tick {tick} ran once; the next, {}, on the restarted worker",
        next["tick"]
    );

    // Every node is the user's alone, and the stranger changes none of them.
    let owner = runtime.block_on(session(&zk, Some((USER, PASSWORD))));
    let nodes = runtime.block_on(tree(&owner, &chroot));
    let own = runtime
        .block_on(owner.get_acl(&format!("{chroot}/jobs")))
        .expect("readable by its user")
        .0;
    assert!(
        own.len() == 1 && own[0].scheme() == "digest" && own[0].id().starts_with("redcron:"),
        "{own:?}"
    );
    runtime.block_on(async {
        for node in &nodes {
            let (acl, _) = owner.get_acl(node).await.expect("readable by its user");
            assert_eq!(acl, own, "{node}");
            assert_eq!(
                stranger.set_data(node, b"x", None).await,
                Err(Error::NoAuth),
                "{node}"
            );
            assert_eq!(
                stranger.set_acl(node, &Acls::anyone_all(), None).await,
                Err(Error::NoAuth),
                "{node}"
            );
            let child = format!("{node}/planted");
            let planted = stranger
                .create(
                    &child,
                    b"x",
                    &CreateMode::Persistent.with_acls(Acls::anyone_all()),
                )
                .await;
            assert!(
                matches!(planted, Err(Error::NoAuth | Error::NoChildrenForEphemerals)),
                "{child}: {planted:?}"
            );
            if *node != chroot {
                assert_eq!(
                    stranger.delete(node, None).await,
                    Err(Error::NoAuth),
                    "{node}"
                );
            }
        }
    });
    assert!(
        runtime
            .block_on(owner.check_stat(&chroot))
            .ok()
            .flatten()
            .is_some(),
        "the chroot is gone"
    );
    eprintln!(
        "{} nodes under {chroot}, each the user's alone",
        nodes.len()
    );
    stop(again);
}

/// A node under the chroot that another user made (with its creator's ACL) cannot be taken: the worker
/// with auth exits 1 at start, its error naming the node (never a password), and claims nothing.
#[test]
fn a_node_another_user_owns_stops_the_worker_at_start_naming_it() {
    let zk = SharedZk::get();
    let chroot = format!("/{}", zk.prefix());
    let dir = TestDir::new();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let theirs = format!("{chroot}/jobs/theirs");
    runtime.block_on(async {
        let stranger = session(&zk, None).await;
        let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
        stranger
            .mkdir(&format!("{chroot}/jobs"), &open)
            .await
            .expect("an open chroot");
        let other = session(&zk, Some(("mallory", "hunter2"))).await;
        other
            .create(
                &theirs,
                b"",
                &CreateMode::Persistent.with_acls(Acls::creator_all()),
            )
            .await
            .expect("another user's node");
    });
    let jobs = long_job(&dir);
    let mut worker = Worker::spawn(
        dir.write("auth.yaml", config(&zk, true, "w0", &jobs)),
        &[("ZK_PASSWORD", PASSWORD)],
    );
    let started = Instant::now();
    let status = worker
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the worker did not stop; it said:\n{:?}", worker.lines()));
    assert_eq!(status.code(), Some(1), "{:?}", worker.lines());
    let failed = worker
        .events("worker.failed")
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("no worker.failed: {:?} {}", worker.lines(), worker.stderr()));
    let error = failed["error"].as_str().expect("an error").to_string();
    eprintln!("exit 1 after {:?}: {error}", started.elapsed());
    assert!(error.contains(&theirs), "{error}");
    // Mallory's node grants this user no right, not even to read its ACL.
    assert!(error.contains("its ACL: unreadable"), "{error}");
    for secret in [PASSWORD, "hunter2"] {
        assert!(!error.contains(secret), "{error}");
    }
    assert!(worker.events("tick.won").is_empty());
}
