//! `redcron pause` and `resume` through the lock: the `Paused` outcome of a claim on real nodes — also for a
//! claim whose round 2 lands after the pause — and three real workers that start nothing while a job is
//! paused, record its ticks as skipped (`paused`), and run its next tick once it is resumed or its `--for`
//! ran out.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redcron::history::{Entry, Kind};
use redcron::lock::{ClaimOutcome, ClaimRequest, InForce, LockSettings, Overlap, Pause};
use redcron::schedule::Tick;
use redcron::store::redis::scripts;

use crate::inspect::workers::wait_for;
use crate::inspect::{controls_of, inspect, parse};
use crate::support::{Backend, Cluster, DelayProxy, RedisCluster, TestDir, Worker};
use crate::worker::{ledger, ledger_job, start_workers, start_workers_with, tick_time};

/// A claimant of `report` at `tick`.
fn request(worker: &str, tick: i64) -> ClaimRequest {
    crate::conformance::request(worker, "report", tick)
}

fn pause(for_ms: Option<i64>) -> Pause {
    Pause {
        until: for_ms.map(|ms| Utc::now() + chrono::Duration::milliseconds(ms)),
        by: "ops@test".to_string(),
        reason: "migration".to_string(),
    }
}

fn assert_paused(outcome: &ClaimOutcome) {
    match outcome {
        ClaimOutcome::Paused(pause) => {
            assert_eq!(
                (pause.by.as_str(), pause.reason.as_str()),
                ("ops@test", "migration")
            )
        }
        other => panic!("expected Paused, got {other:?}"),
    }
}

/// A pause on a majority refuses every claim, and leaves no claim record behind (the refused tick stays
/// claimable); a pause on a minority of nodes stops nothing; after `resume` the tick is granted.
#[tokio::test]
async fn a_paused_job_is_granted_nowhere_until_resumed() {
    let cluster = RedisCluster::start(3);
    let store = cluster.store(LockSettings::default());
    store
        .pause("report", &pause(None), InForce::KeepLonger)
        .await
        .expect("a majority took the pause");
    assert_paused(&store.claim(&request("a", 1_000)).await);
    for node in 0..3 {
        assert_eq!(cluster.get(node, "redcron:{report}:claim"), None);
        assert!(cluster.get(node, "redcron:{report}:paused").is_some());
    }
    let read = store.pauses(&["report".to_string()]).await.expect("read");
    assert_eq!(read.value[0].as_ref().map(|r| r.nodes), Some(3));
    assert!(store.resume("report").await.expect("resumed"));
    // Paused on one node only (a pause that did not reach a majority): claims go on.
    cluster.query::<()>(
        2,
        ::redis::cmd("SET")
            .arg("redcron:{report}:paused")
            .arg("0|x|"),
    );
    match store.claim(&request("a", 1_000)).await {
        ClaimOutcome::Won(lease) => store.release(&lease).await,
        other => panic!("expected the refused tick to be granted after resume, got {other:?}"),
    }
}

/// `--for`: the pause carries a TTL on every node and ends by itself.
#[tokio::test]
async fn a_pause_for_a_while_expires_on_every_node() {
    let cluster = RedisCluster::start(3);
    let store = cluster.store(LockSettings::default());
    store
        .pause("report", &pause(Some(1_000)), InForce::KeepLonger)
        .await
        .expect("paused");
    assert_paused(&store.claim(&request("a", 1_000)).await);
    for node in 0..3 {
        let pttl: i64 = cluster.query(node, ::redis::cmd("PTTL").arg("redcron:{report}:paused"));
        assert!(pttl > 0 && pttl <= 1_000, "node {node}: PTTL {pttl}");
    }
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert!(matches!(
        store.claim(&request("a", 1_000)).await,
        ClaimOutcome::Won(_)
    ));
}

/// A claim between its rounds when the pause reaches the nodes: its round 1 ran before the pause, its
/// round 2 (held back by a proxy in front of every node) lands after it, and is refused — the claim is not
/// granted, and no node records it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_lands_between_the_rounds_refuses_the_confirmation() {
    let cluster = RedisCluster::start(3);
    let proxies: Vec<DelayProxy> = (0..3)
        .map(|node| {
            let confirm = scripts::CONFIRM.get_hash();
            DelayProxy::start(cluster.port(node), confirm, Duration::from_millis(1_000))
        })
        .collect();
    // Round 2 may take the proxy's delay: a node timeout above it, and a lease that outlives both.
    let slow = LockSettings {
        ttl: Duration::from_secs(30),
        node_timeout: Duration::from_secs(3),
        ..LockSettings::default()
    };
    let proxied: Vec<String> = proxies.iter().map(DelayProxy::url).collect();
    let claimant = crate::support::store_on(&format!("redis|{}", proxied.join(",")), slow);
    let operator = cluster.store(LockSettings::default());
    let warm = ClaimRequest::new("warm", "warm-up", Tick(1), Overlap::Skip, "f");
    let _ = claimant.claim(&warm).await;
    proxies.iter().for_each(|proxy| proxy.delay_next(1));
    let claim = tokio::spawn(async move { claimant.claim(&request("a", 5_000)).await });
    wait_for(
        "every node's CONFIRM held back",
        Duration::from_secs(10),
        || proxies.iter().all(|p| p.delayed() == 1).then_some(()),
    );
    operator
        .pause("report", &pause(None), InForce::KeepLonger)
        .await
        .expect("paused");
    let outcome = claim.await.expect("the claim task");
    assert_paused(&outcome);
    for node in 0..3 {
        assert_eq!(
            cluster.get(node, "redcron:{report}:claim"),
            None,
            "node {node}"
        );
    }
}

/// `pause --for 1h`, then `pause --for 1ms`: the CLI says the longer pause stays, and no tick runs in its
/// window; `pause --for 2s --replace` replaces it, and the job runs again after those 2 s. `cli` is the
/// config of a store where one worker runs `tick` every second, `dir` holds its ledger.
fn a_shorter_pause_for_leaves_the_longer_in_force(dir: &TestDir, cli: &Path) {
    wait_for("a run", Duration::from_secs(20), || {
        (!ledger(dir).is_empty()).then_some(())
    });
    let (code, stdout, stderr) = inspect(
        dir,
        cli,
        &["pause", "tick", "--for", "1h", "--reason", "long"],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let paused_at = Utc::now();
    let (code, stdout, stderr) = inspect(
        dir,
        cli,
        &["pause", "tick", "--for", "1ms", "--reason", "short"],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.starts_with("tick stays paused until ")
            && stdout.contains("long")
            && stdout.contains("does not shorten it")
            && stdout.contains("--replace"),
        "the CLI says the longer pause stays: {stdout}"
    );
    let (_, json, _) = inspect(dir, cli, &["pause", "tick", "--for", "1s", "--json"]);
    assert_eq!(parse(&json)["action"], "kept", "{json}");
    std::thread::sleep(Duration::from_millis(3_500));
    let during: Vec<DateTime<Utc>> = ledger(dir)
        .keys()
        .map(|(_, tick)| tick_time(tick))
        .filter(|tick| *tick > paused_at + chrono::Duration::milliseconds(50))
        .collect();
    assert!(
        during.is_empty(),
        "ran in the longer pause's window: {during:?}"
    );
    let (_, status, _) = inspect(dir, cli, &["status", "--json"]);
    assert_eq!(parse(&status)["jobs"][0]["paused"]["reason"], "long");

    let (code, stdout, stderr) = inspect(
        dir,
        cli,
        &[
            "pause",
            "tick",
            "--for",
            "2s",
            "--replace",
            "--reason",
            "short",
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.starts_with("paused tick until "), "{stdout}");
    let until = DateTime::parse_from_rfc3339(stdout.split_whitespace().nth(3).expect("until"))
        .expect("an RFC 3339 end")
        .to_utc();
    let after = wait_for("a run after the 2 s pause", Duration::from_secs(15), || {
        ledger(dir)
            .keys()
            .map(|(_, tick)| tick_time(tick))
            .find(|tick| *tick > until)
    });
    assert!(
        after <= until + chrono::Duration::seconds(4),
        "{after} after {until}"
    );
}

/// [`a_shorter_pause_for_leaves_the_longer_in_force`] on Redis and on etcd.
fn a_shorter_pause_for_leaves_the_longer_in_force_on(backend: Backend) {
    let (_cluster, dir, _workers, cli) = every_second(backend, 1);
    a_shorter_pause_for_leaves_the_longer_in_force(&dir, &cli);
}

/// [`a_shorter_pause_for_leaves_the_longer_in_force`] on the embedded store.
#[test]
fn a_shorter_pause_for_leaves_the_longer_in_force_embedded() {
    let dir = TestDir::new();
    let job = ledger_job("tick", "* * * * * *", &dir.ledger());
    let (_worker, config) = crate::embedded::start_worker(&dir, "w0", &job);
    a_shorter_pause_for_leaves_the_longer_in_force(&dir, &config);
}

/// `backend`'s cluster and `n` workers racing `tick`, a ledger job every second; the config for the
/// commands.
fn every_second(backend: Backend, n: usize) -> (Cluster, TestDir, Vec<Worker>, PathBuf) {
    let cluster = backend.start();
    let dir = TestDir::new();
    let job = ledger_job("tick", "* * * * * *", &dir.ledger());
    let workers = start_workers_with(&dir, n, |worker| cluster.config(worker, &job));
    let cli = dir.join("w0.yaml");
    (cluster, dir, workers, cli)
}

/// Three workers: a job every second runs until `redcron pause`; from the moment the command returns no
/// tick starts on any worker, each tick is in the history as skipped (paused), `status` shows the pause;
/// after `redcron resume` the next tick runs. On Redis and on etcd.
fn three_workers_start_nothing_while_paused_and_run_again_after_resume(backend: Backend) {
    let (cluster, dir, workers, cli) = every_second(backend, 3);
    wait_for("two runs", Duration::from_secs(20), || {
        (ledger(&dir).len() >= 2).then_some(())
    });

    let (code, stdout, stderr) = inspect(&dir, &cli, &["pause", "tick", "--reason", "migration"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let paused_at = Utc::now();
    assert!(
        stdout.starts_with("paused tick until `redcron resume`"),
        "{stdout}"
    );
    // A store of one node has no majority to count ("on 1 of 1 nodes" said nothing).
    let on = match cluster.len() {
        1 => "on the store".to_string(),
        nodes => format!("on {nodes} of {nodes} nodes"),
    };
    assert!(stdout.contains(&format!("{on}): migration")), "{stdout}");
    std::thread::sleep(Duration::from_millis(4_500));
    let (_, status, _) = inspect(&dir, &cli, &["status", "--json"]);
    let status = parse(&status);
    assert_eq!(status["jobs"][0]["paused"]["reason"], "migration");
    // A tick may be granted as soon as the resume reaches a majority, before the command returns: "while
    // paused" ends when the command starts.
    let resuming_at = Utc::now();
    let (code, stdout, _) = inspect(&dir, &cli, &["resume", "tick"]);
    assert_eq!(
        (code, stdout.as_str()),
        (0, "resumed tick: its next tick runs\n")
    );
    let resumed_at = Utc::now();

    let started_while_paused =
        |runs: &std::collections::BTreeMap<(String, String), Vec<(u64, String)>>| {
            runs.keys()
                .map(|(_, tick)| tick_time(tick))
                .filter(|tick| {
                    *tick > paused_at + chrono::Duration::milliseconds(50) && *tick < resuming_at
                })
                .collect::<Vec<_>>()
        };
    let after = wait_for("a run after resume", Duration::from_secs(10), || {
        let runs = ledger(&dir);
        runs.keys()
            .map(|(_, tick)| tick_time(tick))
            .find(|tick| *tick > resumed_at)
    });
    assert!(
        started_while_paused(&ledger(&dir)).is_empty(),
        "ran while paused: {:?}",
        ledger(&dir)
    );
    let entries = cluster.history("tick");
    let mut skipped = 0;
    for second in 2..5 {
        let tick = (paused_at + chrono::Duration::seconds(second)).timestamp() * 1000;
        let of_tick: Vec<&Entry> = entries.iter().filter(|e| e.tick == tick).collect();
        assert!(
            of_tick
                .iter()
                .all(|e| e.kind == Kind::Skipped && e.reason.as_deref() == Some("paused")),
            "tick {tick}: {of_tick:?}"
        );
        skipped += of_tick.len();
    }
    assert!(
        skipped >= 3,
        "ticks while paused recorded as skipped (paused): {skipped}"
    );
    assert!(
        !entries.iter().any(|e| e.kind == Kind::Missed),
        "no tick was missed"
    );
    assert!(
        after < resumed_at + chrono::Duration::seconds(3),
        "the next tick ran: {after}"
    );
    drop(workers);
}

/// `pause --for 2s` ends by itself: nothing starts for two seconds, then the job runs again. On Redis and
/// on etcd (where an etcd lease of 2 s holds the pause).
fn a_pause_for_two_seconds_ends_by_itself(backend: Backend) {
    let (_cluster, dir, _workers, cli) = every_second(backend, 1);
    let (code, stdout, stderr) = inspect(&dir, &cli, &["pause", "tick", "--for", "2s"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let paused_at = Utc::now();
    let until = DateTime::parse_from_rfc3339(stdout.split_whitespace().nth(3).expect("until"))
        .expect("an RFC 3339 end")
        .to_utc();
    let after = wait_for(
        "a run after the pause ended",
        Duration::from_secs(10),
        || {
            ledger(&dir)
                .keys()
                .map(|(_, tick)| tick_time(tick))
                .find(|tick| *tick > until)
        },
    );
    let during: Vec<DateTime<Utc>> = ledger(&dir)
        .keys()
        .map(|(_, tick)| tick_time(tick))
        .filter(|tick| *tick > paused_at + chrono::Duration::milliseconds(50) && *tick < until)
        .collect();
    assert!(during.is_empty(), "ran while paused: {during:?}");
    assert!(
        after <= until + chrono::Duration::seconds(2),
        "{after} after {until}"
    );
}

/// Bad input and faults: an unknown job names the jobs there are (exit 2), a bad `--for` says what is
/// expected (exit 2), no majority of nodes taking the pause (of one job or `--all`) or the resume is exit
/// 3 naming the nodes, `resume` of a job that is not paused says so.
#[test]
fn pause_errors_are_clear_and_no_majority_exits_3() {
    let mut cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let config = dir.write_config(&crate::worker::config(
        &cluster,
        "  id: cli\n",
        &ledger_job("tick", "@yearly", &dir.ledger()),
    ));
    let (code, _, stderr) = inspect(&dir, &config, &["pause", "nope"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("no job named \"nope\"") && stderr.contains("known jobs: tick"),
        "{stderr}"
    );
    let (code, _, stderr) = inspect(&dir, &config, &["pause", "tick", "--for", "soon"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("\"soon\" is not a duration"), "{stderr}");
    let (code, stdout, _) = inspect(&dir, &config, &["resume", "tick"]);
    assert_eq!((code, stdout.as_str()), (0, "tick was not paused\n"));
    cluster.kill(1);
    cluster.kill(2);
    for args in [
        &["pause", "tick"][..],
        &["pause", "--all"],
        &["resume", "--all"],
    ] {
        let (code, stdout, stderr) = inspect(&dir, &config, args);
        assert_eq!(code, 3, "{args:?}: {stderr}");
        assert!(
            stdout.is_empty(),
            "{args:?}: nothing changed, nothing reported: {stdout}"
        );
        assert!(
            stderr.contains("no majority: 1 of 3 nodes") && stderr.contains(&cluster.url(2)),
            "{args:?}: {stderr}"
        );
    }
}

/// `pause` sent at a random moment from 5 ms before to 5 ms after a tick of a job every second — while the
/// tick's claims are in flight — 12 times (resumed 1.3 s later), two workers racing each tick: no tick
/// whose claims began after `pause` returned ran (a tick more than 20 ms after it, for the offset between
/// cluster time and this host's clock), nor any while paused; a tick granted just before the pause may
/// still start after `pause` returned, as docs/cli.md says — counted, with how late.
#[test]
fn a_pause_at_a_tick_refuses_every_claim_begun_after_it() {
    const ROUNDS: usize = 12;
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let mut workers = start_workers(
        &cluster,
        &dir,
        2,
        "",
        &ledger_job("tick", "* * * * * *", &dir.ledger()),
    );
    let runtime = crate::history::runtime();
    let operator = runtime.block_on(async { cluster.store(LockSettings::default()) });
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        // A tick at least a second away, so that the job runs again after the last resume.
        let tick = (Utc::now().timestamp_millis() / 1_000 + 2) * 1_000;
        let aim = tick + rand::random_range(-5..=5);
        let wait = aim - Utc::now().timestamp_millis();
        std::thread::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0)));
        runtime
            .block_on(operator.pause("tick", &pause(None), InForce::KeepLonger))
            .expect("paused");
        let returned = Utc::now();
        std::thread::sleep(Duration::from_millis(1_300));
        let resuming = Utc::now();
        assert!(runtime.block_on(operator.resume("tick")).expect("resumed"));
        rounds.push((tick, returned, resuming));
    }
    wait_for(
        "a run after the last resume",
        Duration::from_secs(20),
        || {
            let last = rounds.last().map(|(_, _, resuming)| *resuming)?;
            ledger(&dir)
                .keys()
                .any(|(_, tick)| tick_time(tick) > last)
                .then_some(())
        },
    );
    for worker in &mut workers {
        worker.signal(libc::SIGTERM);
        assert!(worker.wait_timeout(Duration::from_secs(30)).is_some());
    }

    let runs = ledger(&dir);
    assert!(runs.values().all(|run| run.len() == 1), "{runs:?}");
    let ran = |tick: DateTime<Utc>| runs.keys().any(|(_, at)| tick_time(at) == tick);
    let started: Vec<serde_json::Value> = workers
        .iter()
        .flat_map(|worker| worker.events("run.started"))
        .collect();
    let (mut before, mut refused, mut started_after, mut latest) = (0, 0, 0, 0);
    for (tick, returned, resuming) in &rounds {
        let tick = DateTime::from_timestamp_millis(*tick).expect("a tick");
        let margin = chrono::Duration::milliseconds(20);
        let during: Vec<DateTime<Utc>> = (runs.keys())
            .map(|(_, at)| tick_time(at))
            .filter(|at| *at > tick && at < resuming)
            .collect();
        assert!(during.is_empty(), "ran while paused: {during:?}");
        if !ran(tick) {
            refused += 1;
            continue;
        }
        assert!(
            tick < *returned + margin,
            "{tick} ran, though its claims began after the pause returned at {returned}"
        );
        before += 1;
        let late = started.iter().find_map(|e| {
            let at = e["timestamp"].as_str().map(tick_time)?;
            (e["tick"].as_str().map(tick_time) == Some(tick) && at > *returned).then_some(at)
        });
        if let Some(at) = late {
            started_after += 1;
            latest = latest.max((at - *returned).num_microseconds().unwrap_or(0));
        }
    }
    eprintln!(
        "{ROUNDS} pauses at a tick (2 workers): {before} ticks granted before the pause ran ({started_after} \
         of them started after `pause` returned, at most {latest} µs after), {refused} refused as paused, \
         none while paused"
    );
}

/// The fields of a job's `status --json` that a pause or resume must leave as they are.
fn served(dir: &TestDir, cli: &Path) -> serde_json::Value {
    let (code, status, stderr) = inspect(dir, cli, &["status", "--json"]);
    assert_eq!(code, 0, "{status}{stderr}");
    let job = &parse(&status)["jobs"][0];
    serde_json::json!({
        "last_run": job["last_run"]["tick"],
        "last_run_kind": job["last_run"]["kind"],
        "last_success": job["last_success"]["tick"],
        "failures_in_a_row": job["failures_in_a_row"],
        "overdue": job["overdue"],
    })
}

/// `redcron pause` and `resume` each record a `control` entry of the job: `history --json` lists them
/// (newest first, with who, why and a pause's end) beside the ticks, never as one, and `status` is the
/// same before and after them (last run, last success, no failure, not overdue). `cli` is the config of a
/// store where one worker runs `tick` every second, `dir` holds its ledger.
fn controls_are_in_the_history_and_leave_the_status(dir: &TestDir, cli: &Path) {
    wait_for("a run", Duration::from_secs(20), || {
        (!ledger(dir).is_empty()).then_some(())
    });
    let pause = |args: &[&str]| {
        let (code, json, stderr) = inspect(dir, cli, args);
        assert_eq!(code, 0, "{json}{stderr}");
        let report = parse(&json);
        assert_eq!(report["recorded_in_history"], true, "{json}{stderr}");
        report
    };
    pause(&[
        "pause", "tick", "--for", "1h", "--reason", "deploy", "--json",
    ]);
    // The pause's `control` entry is stamped just before the write, but a tick whose claim ran late on a
    // loaded machine may still have been skipped by the pause and come before that stamp: the tick
    // explained below is one after it.
    let (_, json, _) = inspect(dir, cli, &["history", "--job", "tick", "--json"]);
    let history = parse(&json);
    let controls = history["controls"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let made = controls
        .iter()
        .find(|c| c["action"] == "paused")
        .and_then(|c| c["tick"].as_i64())
        .unwrap_or_else(|| panic!("the pause's control entry: {history}"));
    // Once a tick after the pause is recorded as skipped, no run of before it is still going.
    let skipped = wait_for("a tick skipped as paused", Duration::from_secs(20), || {
        let (_, json, _) = inspect(
            dir,
            cli,
            &["history", "--job", "tick", "--json", "--limit", "3"],
        );
        parse(&json)["ticks"].as_array()?.iter().find(|t| {
            t["kind"] == "skipped"
                && t["reason"] == "paused"
                && t["tick"].as_i64().is_some_and(|tick| tick > made)
        })?["tick"]
            .as_i64()
    });
    // `explain` tells the pause before the tick, and whether one stands now.
    let explain = |dir: &TestDir| {
        let (code, json, stderr) = inspect(
            dir,
            cli,
            &["explain", "tick", &skipped.to_string(), "--json"],
        );
        assert_eq!(code, 0, "{json}{stderr}");
        parse(&json)
    };
    let told = |explained: &serde_json::Value, sentence: &str| {
        explained["story"].as_array().is_some_and(|story| {
            story
                .iter()
                .any(|l| l.as_str().is_some_and(|l| l.contains(sentence)))
        })
    };
    let during = explain(dir);
    assert!(
        told(&during, "the latest pause or resume before it"),
        "{during}"
    );
    assert!(told(&during, "the job is paused now"), "{during}");
    assert_eq!(during["paused_now"]["reason"], "deploy", "{during}");
    let before = served(dir, cli);
    assert_eq!(before["last_run_kind"], "run", "{before}");
    assert_eq!(before["failures_in_a_row"], 0, "{before}");
    assert!(before["overdue"].is_null(), "{before}");
    pause(&["pause", "tick", "--replace", "--reason", "longer", "--json"]);
    assert_eq!(
        served(dir, cli),
        before,
        "a second pause changed the status"
    );
    let resumed = pause(&["resume", "tick", "--reason", "done", "--json"]);
    assert_eq!(resumed["action"], "resumed");
    let after = explain(dir);
    assert!(told(&after, "the job is not paused now"), "{after}");
    assert!(after["paused_now"].is_null(), "{after}");
    // A resume of a job that is not paused changes nothing, and records nothing.
    let (_, json, _) = inspect(dir, cli, &["resume", "tick", "--json"]);
    assert!(parse(&json)["recorded_in_history"].is_null(), "{json}");

    let (code, json, stderr) = inspect(
        dir,
        cli,
        &["history", "--job", "tick", "--json", "--limit", "500"],
    );
    assert_eq!(code, 0, "{json}{stderr}");
    let history = parse(&json);
    let controls = history["controls"].as_array().expect("a controls list");
    let seen: Vec<(&str, &str)> = controls
        .iter()
        .map(|c| {
            (
                c["action"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("resumed", "done"),
            ("paused", "longer"),
            ("paused", "deploy")
        ],
        "{json}"
    );
    for control in controls {
        assert_eq!(control["kind"], "control", "{control}");
        assert_eq!(control["worker"], "cli", "{control}");
        assert!(
            control["by"].as_str().is_some_and(|by| by.contains('@')),
            "by names user@host: {control}"
        );
        assert!(control["tick_rfc3339"].is_string(), "{control}");
    }
    assert!(controls[2]["until"].is_string(), "--for gives an end");
    assert!(controls[0]["until"].is_null() && controls[1]["until"].is_null());
    let ticks = history["ticks"].as_array().expect("a ticks list");
    assert!(
        ticks.iter().all(|t| t["kind"] != "control"),
        "a control is never a tick: {json}"
    );
    // The text lists them too, on lines of their own.
    let (_, text, _) = inspect(dir, cli, &["history", "--job", "tick", "--limit", "500"]);
    let lines = |action: &str| {
        text.lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .filter(|cells| cells.get(2) == Some(&"cli") && cells.get(4) == Some(&action))
            .count()
    };
    assert_eq!((lines("resumed"), lines("paused")), (1, 2), "{text}");

    // After the resume: still not failing, not overdue, the last run a run.
    let after = served(dir, cli);
    assert_eq!(after["last_run_kind"], "run", "{after}");
    assert_eq!(after["failures_in_a_row"], 0, "{after}");
    assert!(after["overdue"].is_null(), "{after}");
}

/// A history write that fails does not undo or fail the control: with the embedded store's history table
/// refusing every insert, `pause` and `resume` still exit 0 and take effect, warn on stderr that the
/// history does not record them, and say `recorded_in_history: false`.
#[test]
fn a_control_whose_history_write_fails_stands_and_says_so() {
    let dir = TestDir::new();
    let job = ledger_job("tick", "0 0 0 1 1 *", &dir.ledger());
    let (_worker, config) = crate::embedded::start_worker(&dir, "w0", &job);
    let database = rusqlite::Connection::open(dir.join("redcron.db")).expect("the embedded store");
    database
        .execute_batch(
            "CREATE TRIGGER refuse_history BEFORE INSERT ON history
             BEGIN SELECT RAISE(ABORT, 'history refused by the test'); END;",
        )
        .expect("a trigger that refuses history writes");
    for (args, paused) in [
        (&["pause", "tick", "--reason", "r", "--json"][..], true),
        (&["resume", "tick", "--json"][..], false),
    ] {
        let (code, json, stderr) = inspect(&dir, &config, args);
        assert_eq!(code, 0, "{args:?}: {json}{stderr}");
        let report = parse(&json);
        assert_eq!(report["recorded_in_history"], false, "{json}");
        assert!(
            stderr.contains("the history does not record it"),
            "{args:?} warns: {stderr}"
        );
        let (_, status, _) = inspect(&dir, &config, &["status", "--json"]);
        assert_eq!(
            !parse(&status)["jobs"][0]["paused"].is_null(),
            paused,
            "{args:?} took effect: {status}"
        );
    }
}

/// [`controls_are_in_the_history_and_leave_the_status`] on the shared stores.
fn controls_are_in_the_history_and_leave_the_status_on(backend: Backend) {
    let (_cluster, dir, _workers, cli) = every_second(backend, 1);
    controls_are_in_the_history_and_leave_the_status(&dir, &cli);
}

/// [`controls_are_in_the_history_and_leave_the_status`] on the embedded store.
#[test]
fn controls_are_in_the_history_and_leave_the_status_embedded() {
    let dir = TestDir::new();
    let job = ledger_job("tick", "* * * * * *", &dir.ledger());
    let (_worker, config) = crate::embedded::start_worker(&dir, "w0", &job);
    controls_are_in_the_history_and_leave_the_status(&dir, &config);
}

crate::on_every_store!(
    async: [],
    sync: [
        three_workers_start_nothing_while_paused_and_run_again_after_resume,
        a_pause_for_two_seconds_ends_by_itself,
        a_shorter_pause_for_leaves_the_longer_in_force_on,
        controls_are_in_the_history_and_leave_the_status_on,
    ],
);

/// `pause` and `resume` of several jobs, and of `--all`, on the embedded store: each named job is paused
/// (one `control` entry each), a shorter pause keeps the longer ones and writes the others, `resume
/// --all` lifts every pause; unknown names are all said and nothing is written (exit 2); a store failure
/// on a later job stops there — the jobs before it stay paused and recorded, the report lists those not
/// changed, and the exit code is the failure's.
#[test]
fn several_jobs_and_all_are_paused_and_resumed_in_one_command() {
    let dir = TestDir::new();
    let never = "0 0 0 1 1 *";
    let jobs: String = ["alpha", "beta", "gamma"]
        .iter()
        .map(|name| ledger_job(name, never, &dir.ledger()))
        .collect();
    let (_worker, config) = crate::embedded::start_worker(&dir, "w0", &jobs);
    let paused = || -> Vec<bool> {
        let (code, status, stderr) = inspect(&dir, &config, &["status", "--json"]);
        assert_eq!(code, 0, "{stderr}");
        let status = parse(&status);
        let jobs = status["jobs"].as_array().cloned().unwrap_or_default();
        jobs.iter().map(|job| !job["paused"].is_null()).collect()
    };
    let actions = |report: &serde_json::Value| -> Vec<(String, String)> {
        let jobs = report["jobs"].as_array().cloned().unwrap_or_default();
        jobs.iter()
            .map(|job| {
                let text = |field: &str| job[field].as_str().unwrap_or_default().to_string();
                (text("job"), text("action"))
            })
            .collect()
    };

    let (code, _, stderr) = inspect(&dir, &config, &["pause", "alpha", "nope", "zilch"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("no job named \"nope\"") && stderr.contains("no job named \"zilch\""),
        "{stderr}"
    );
    assert_eq!(paused(), [false, false, false], "nothing written");

    let args = [
        "pause",
        "alpha",
        "gamma",
        "alpha",
        "--reason",
        "maintenance",
        "--json",
    ];
    let (code, json, stderr) = inspect(&dir, &config, &args);
    assert_eq!(code, 0, "{stderr}");
    let report = parse(&json);
    assert_eq!(
        actions(&report),
        [
            ("alpha".into(), "paused".into()),
            ("gamma".into(), "paused".into())
        ]
    );
    assert_eq!(report["jobs"][0]["recorded_in_history"], true, "{json}");
    assert_eq!(
        report["jobs"][1]["paused"]["reason"], "maintenance",
        "{json}"
    );
    assert_eq!(report["not_changed"], serde_json::json!([]), "{json}");
    assert_eq!(paused(), [true, false, true]);

    let (code, text, stderr) = inspect(&dir, &config, &["pause", "--all", "--for", "1h"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        text.contains("alpha stays paused until `redcron resume`"),
        "{text}"
    );
    assert!(text.contains("\npaused beta until "), "{text}");
    assert!(text.contains("gamma stays paused"), "{text}");
    assert_eq!(
        text.matches("no claim of a paused job is granted anywhere")
            .count(),
        1,
        "what a pause stops is said once: {text}"
    );
    assert_eq!(paused(), [true, true, true]);

    let (code, json, stderr) = inspect(&dir, &config, &["resume", "--all", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report = parse(&json);
    let resumed: Vec<(String, String)> = ["alpha", "beta", "gamma"]
        .iter()
        .map(|job| (job.to_string(), "resumed".to_string()))
        .collect();
    assert_eq!(actions(&report), resumed);
    assert_eq!(paused(), [false, false, false]);
    let (_, history, _) = inspect(&dir, &config, &["history", "--json"]);
    let history = parse(&history);
    let count = |job: &str, action: &str| controls_of(&history, job, action);
    assert_eq!(
        [
            count("alpha", "paused"),
            count("beta", "paused"),
            count("gamma", "paused")
        ],
        [1, 1, 1],
        "a pause kept out by a longer one records nothing: {history:#}"
    );
    assert_eq!(
        [
            count("alpha", "resumed"),
            count("beta", "resumed"),
            count("gamma", "resumed")
        ],
        [1, 1, 1],
        "{history:#}"
    );

    // The store refuses beta's pause: alpha stays paused, gamma is not tried.
    let database = rusqlite::Connection::open(dir.join("redcron.db")).expect("the embedded store");
    database
        .execute_batch(
            "CREATE TRIGGER refuse_beta BEFORE INSERT ON paused WHEN NEW.job = 'beta'
             BEGIN SELECT RAISE(ABORT, 'beta refused by the test'); END;
             CREATE TRIGGER refuse_beta_again BEFORE UPDATE ON paused WHEN NEW.job = 'beta'
             BEGIN SELECT RAISE(ABORT, 'beta refused by the test'); END;",
        )
        .expect("triggers that refuse beta's pause");
    let (code, json, stderr) = inspect(&dir, &config, &["pause", "--all", "--json"]);
    assert_eq!(code, 3, "no majority took beta's pause: {json}{stderr}");
    let report = parse(&json);
    assert_eq!(actions(&report), [("alpha".into(), "paused".into())]);
    let left: Vec<&str> = report["not_changed"]
        .as_array()
        .map(|left| left.iter().filter_map(|l| l["job"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(left, ["beta", "gamma"], "{json}");
    assert!(
        report["not_changed"][0]["why"]
            .as_str()
            .is_some_and(|why| why.contains("beta refused by the test")),
        "{json}"
    );
    assert!(
        stderr.contains("stopped there: 2 of 3 jobs not changed (beta and gamma)"),
        "{stderr}"
    );
    assert_eq!(paused(), [true, false, false]);
    assert_eq!(report["jobs"][0]["recorded_in_history"], true, "{json}");
}

/// On a store of one node (the embedded file) `pause` says where it wrote without counting nodes ("on 1
/// of 1 nodes" said nothing), and a command run where neither `USER` nor `LOGNAME` is set (a container,
/// cron, `env -i`) is by the OS user, never `unknown@host`.
#[test]
fn pause_on_one_node_names_the_store_and_the_os_user() {
    let dir = TestDir::new();
    let job = ledger_job("tick", "0 0 0 1 1 *", &dir.ledger());
    let (_worker, config) = crate::embedded::start_worker(&dir, "w0", &job);
    let (code, stdout, stderr) = crate::cli::output(
        crate::cli::redcron(dir.path())
            .env_remove("USER")
            .env_remove("LOGNAME")
            .args(["pause", "tick", "-c"])
            .arg(&config),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("on the store)") && !stdout.contains("nodes"),
        "{stdout}"
    );
    assert!(!stdout.contains("(by unknown@"), "{stdout}");
    // This test runs as some user the password database knows (root in CI), or as `uid-N`.
    let by = stdout
        .split("(by ")
        .nth(1)
        .and_then(|rest| rest.split('@').next())
        .expect("by whom");
    assert!(!by.is_empty() && by != "unknown", "{stdout}");
}
