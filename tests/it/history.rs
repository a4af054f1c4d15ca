//! Run history, membership and missed-tick alarms, written by real workers to real Redis nodes and read
//! back through the library's store.

use std::collections::BTreeMap;
use std::time::Duration;

use redcron::history::{Entry, Kind, Query};
use redcron::lock::{LockSettings, QuorumFailure};
use redcron::store::Read;

use crate::support::{Persistence, RedisCluster, TestDir, Worker};
use crate::worker::{config, start_workers};

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Every entry of `job` on the cluster, read from every node that answers.
fn read_history(cluster: &RedisCluster, job: &str) -> Result<Read<Vec<Entry>>, QuorumFailure> {
    let query = Query {
        job: job.to_string(),
        since: None,
        until: None,
        limit: 5_000,
    };
    runtime().block_on(async { cluster.store(LockSettings::default()).history(&query).await })
}

/// Every entry of `job` on the cluster, read from a majority.
pub(crate) fn history(cluster: &RedisCluster, job: &str) -> Vec<Entry> {
    read_history(cluster, job)
        .expect("a majority answers")
        .value
}

/// The run entries of `entries` by tick.
fn runs(entries: &[Entry]) -> BTreeMap<i64, Vec<&Entry>> {
    let mut runs: BTreeMap<i64, Vec<&Entry>> = BTreeMap::new();
    for entry in entries.iter().filter(|e| e.kind == Kind::Run) {
        runs.entry(entry.tick).or_default().push(entry);
    }
    runs
}

/// Two workers, three jobs every second — one that succeeds, one that fails, one that outlives its
/// interval (`overlap: skip`): each tick that ran has exactly one run entry with its token and how it
/// ended, and the ticks the long job could not take are recorded as skipped for overlap.
#[test]
fn runs_and_skips_are_recorded_on_the_nodes() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let jobs = [
        "  - name: ok\n    schedule: \"* * * * * *\"\n    command: 'true'\n",
        "  - name: fails\n    schedule: \"* * * * * *\"\n    command: 'exit 3'\n",
        "  - name: slow\n    schedule: \"* * * * * *\"\n    command: 'sleep 2.5'\n",
    ]
    .concat();
    let workers = start_workers(&cluster, &dir, 2, "", &jobs);
    // Wait for events, not time: three finished slow runs take at least 7.5 s.
    let finished = |job: &str| {
        workers
            .iter()
            .flat_map(|w| w.events("run.finished"))
            .filter(|e| e["job"] == job)
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while finished("slow") < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(workers); // SIGTERM: runs end, the writers flush their queues.

    let ok = history(&cluster, "ok");
    let ok_runs = runs(&ok);
    assert!(
        ok_runs.len() >= 5,
        "ok: only {} runs recorded",
        ok_runs.len()
    );
    for (tick, entries) in &ok_runs {
        assert_eq!(entries.len(), 1, "ok at {tick}: {entries:?}");
        let run = entries[0];
        assert!(run.token.is_some() && run.run_id.is_some() && run.started_at.is_some());
        if run.ended_at.is_some() {
            assert_eq!(run.outcome.as_deref(), Some("success"), "{run:?}");
            assert_eq!(run.exit_code, Some(0), "{run:?}");
            assert!(run.duration_ms.is_some());
        }
    }
    let fails = history(&cluster, "fails");
    let ended: Vec<&Entry> = fails
        .iter()
        .filter(|e| e.kind == Kind::Run && e.ended_at.is_some())
        .collect();
    assert!(!ended.is_empty(), "no ended run of `fails`");
    for run in ended {
        assert_eq!(run.outcome.as_deref(), Some("failure"), "{run:?}");
        assert_eq!(run.exit_code, Some(3), "{run:?}");
    }
    let slow = history(&cluster, "slow");
    let skipped = slow
        .iter()
        .filter(|e| e.kind == Kind::Skipped && e.reason.as_deref() == Some("overlap"))
        .count();
    assert!(skipped >= 2, "slow: {skipped} overlap skips in {slow:#?}");
    for entries in runs(&slow).values() {
        assert_eq!(entries.len(), 1, "slow: {entries:?}");
    }
}

/// Three workers paused (SIGSTOP) past a job's misfire grace, then resumed: the ticks nobody ran are
/// reported as `tick.missed` exactly once across the three workers, and recorded as missed.
#[test]
fn a_tick_nobody_ran_is_reported_missed_once_across_the_cluster() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let jobs = "  - name: beat\n    schedule: \"* * * * * *\"\n    command: 'true'\n    misfire_grace: 1s\n";
    let mut workers: Vec<Worker> = (0..3)
        .map(|i| {
            let section = format!("  id: w{i}\n  max_clock_offset: 200ms\n");
            let yaml = config(&cluster, &section, jobs);
            Worker::spawn(dir.write(format!("w{i}.yaml"), yaml), &[])
        })
        .collect();
    for worker in &workers {
        worker
            .wait_for_event("run.finished", Duration::from_secs(20))
            .or_else(|| {
                // Not every worker wins a run; any worker's run proves the cluster is running.
                worker.wait_for_event("tick.lost", Duration::from_secs(10))
            })
            .expect("the cluster runs the job");
    }
    workers.iter_mut().for_each(Worker::stop);
    std::thread::sleep(Duration::from_secs(5));
    workers.iter_mut().for_each(Worker::cont);
    let missed = |workers: &[Worker]| -> Vec<serde_json::Value> {
        workers
            .iter()
            .flat_map(|w| w.events("tick.missed"))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while missed(&workers).len() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    // Time for a duplicate to show up, if the alarm were not claimed.
    std::thread::sleep(Duration::from_secs(4));
    let all = missed(&workers);
    drop(workers);
    assert!(
        all.len() >= 3,
        "a 5 s pause should miss at least 3 ticks: {all:?}"
    );
    let mut ticks: Vec<String> = all
        .iter()
        .map(|e| e["tick"].as_str().unwrap_or_default().to_string())
        .collect();
    ticks.sort();
    let before = ticks.len();
    ticks.dedup();
    assert_eq!(before, ticks.len(), "a tick reported missed twice: {all:?}");
    for event in &all {
        assert_eq!(event["level"], "ERROR", "{event}");
    }
    let recorded = history(&cluster, "beat")
        .into_iter()
        .filter(|e| e.kind == Kind::Missed)
        .count();
    assert!(recorded >= 3, "only {recorded} missed entries recorded");
}

/// Workers announce themselves: three are alive; one killed disappears from the live members once its
/// heartbeat expires; one stopped gracefully says so at once.
#[test]
fn workers_announce_themselves_and_expire_when_they_die() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let jobs = "  - name: idle\n    schedule: \"0 0 1 1 *\"\n    command: 'true'\n";
    let mut workers: Vec<Worker> = (0..3)
        .map(|i| {
            let section = format!("  id: w{i}\n  heartbeat_every: 200ms\n");
            let yaml = config(&cluster, &section, jobs);
            Worker::spawn(dir.write(format!("w{i}.yaml"), yaml), &[])
        })
        .collect();
    let members = || {
        runtime()
            .block_on(async { cluster.store(LockSettings::default()).members().await })
            .expect("a majority answers")
            .value
    };
    let wait_until = |what: &str, pred: &dyn Fn(&[redcron::membership::Member]) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now = members();
            if pred(&now) {
                return now;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {now:#?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let alive =
        |m: &[redcron::membership::Member], id: &str| m.iter().any(|m| m.id == id && m.alive);
    let all = wait_until("three live workers", &|m| {
        ["w0", "w1", "w2"].iter().all(|id| alive(m, id))
    });
    let w0 = all.iter().find(|m| m.id == "w0").expect("w0");
    assert_eq!(w0.pid, workers[0].pid());
    assert!(!w0.config_fingerprint.is_empty() && !w0.version.is_empty());
    workers[1].kill();
    let after_kill = wait_until("w1 dead after its heartbeat expired", &|m| !alive(m, "w1"));
    assert!(
        after_kill.iter().any(|m| m.id == "w1"),
        "a dead worker is still listed"
    );
    assert!(alive(&after_kill, "w0") && alive(&after_kill, "w2"));
    workers[2].signal(libc::SIGTERM);
    workers[2]
        .wait_timeout(Duration::from_secs(20))
        .expect("w2 stops");
    let stopped = members();
    let w2 = stopped.iter().find(|m| m.id == "w2").expect("w2 listed");
    assert!(!w2.alive && w2.state == "stopped", "{w2:?}");
}

/// History lives on every node and is read from a majority: a node killed and restarted empty (no
/// persistence) loses none of it, and a node that is down is named as missing while the rest answer.
#[test]
fn history_survives_a_minority_of_nodes_lost() {
    let mut cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let now = chrono::Utc::now();
    let entries: Vec<Entry> = (0..20)
        .map(|i| {
            let tick = redcron::schedule::Tick(1_700_000_000_000 + i * 1000);
            let mut entry = Entry::new("job", tick, "w1", Kind::Run, now);
            entry.token = Some(i as u64 + 1);
            entry
        })
        .collect();
    // `record` returns once a majority took the entries; the last node takes them in the background, so
    // the runtime lives until every node holds them (what this test starts from).
    runtime().block_on(async {
        cluster
            .store(LockSettings::default())
            .record(&entries)
            .await
            .expect("written to a majority");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while (0..cluster.len()).any(|node| node_entries(&cluster, node, "job").len() < 20)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    for node in 0..cluster.len() {
        assert_eq!(node_entries(&cluster, node, "job").len(), 20, "node {node}");
    }
    assert_eq!(history(&cluster, "job").len(), 20);
    cluster.kill(0);
    let without_one = read_history(&cluster, "job").expect("a majority answers");
    assert_eq!(without_one.value.len(), 20);
    assert_eq!(without_one.missing.len(), 1, "{:?}", without_one.missing);
    assert!(without_one.missing[0]
        .0
        .contains(&cluster.port(0).to_string()));
    cluster.restart(0);
    cluster.kill(1);
    // Node 0 came back empty: node 2 alone still has every entry, and the merge keeps them all.
    assert_eq!(history(&cluster, "job").len(), 20);
    cluster.kill(2);
    let none = read_history(&cluster, "job");
    let failure = none.expect_err("no majority");
    assert_eq!(failure.granted, 1);
}

/// A hung node (SIGSTOP) does not hold up the history: a batch of 1,000 entries, written in several
/// pipelines one after the other, is done once the two other nodes have taken each pipeline — with a node
/// timeout of two minutes, waiting for the hung node would keep `record` far past the bound below — and
/// the hung node, resumed, holds every entry too (its requests were sent, and are answered late).
#[test]
fn a_hung_node_does_not_hold_up_the_history() {
    let mut cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let now = chrono::Utc::now();
    let entries: Vec<Entry> = (0..1_000)
        .map(|i| {
            let tick = redcron::schedule::Tick(1_700_000_000_000 + (i / 10) * 1000);
            let mut entry = Entry::new(&format!("job{}", i % 10), tick, "w1", Kind::Run, now);
            entry.token = Some(i as u64 + 1);
            entry
        })
        .collect();
    let settings = LockSettings {
        node_timeout: Duration::from_secs(120),
        ..LockSettings::default()
    };
    let runtime = runtime();
    let store = runtime.block_on(async { cluster.store(settings) });
    // A warm-up write, so that every connection is open before the node hangs.
    runtime
        .block_on(store.record(&entries[..1]))
        .expect("written to every node");
    cluster.stop(2);
    let written = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), store.record(&entries)).await
    });
    let hung = node_entries(&cluster, 0, "job3");
    cluster.cont(2);
    written
        .expect("record returned without the hung node's answers")
        .expect("written to a majority");
    assert_eq!(hung.len(), 100, "node 0 holds job3's 100 ticks");
    assert_eq!(history(&cluster, "job7").len(), 100);
    // The hung node's requests were sent while it hung (its kernel took them); resumed, it runs and
    // answers them, awaited in the background of the same runtime.
    let resumed = runtime.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let held: usize = (0..10)
                .map(|job| node_entries(&cluster, 2, &format!("job{job}")).len())
                .sum();
            if held == 1_000 || tokio::time::Instant::now() > deadline {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert_eq!(resumed, 1_000, "the resumed node holds every entry");
}

/// A run whose lease is lost (every node down) is stopped, and its end — written while no node answers —
/// is kept and reaches the history once the nodes are back: `explain` tells `lease_lost`.
#[test]
fn a_run_that_lost_its_lease_is_in_the_history_after_the_outage() {
    let mut cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    // Every second, `overlap: skip`: one run at a time, the first one is the one that loses its lease.
    let jobs = "  - name: long\n    schedule: \"* * * * * *\"\n    command: 'sleep 60'\n";
    let path = dir.write("w0.yaml", config(&cluster, "  id: w0\n", jobs));
    let worker = Worker::spawn(&path, &[]);
    let started = worker
        .wait_for(Duration::from_secs(20), |e| e["event"] == "run.started")
        .expect("the job starts");
    let tick = started["tick"].as_str().expect("tick").to_string();
    for node in 0..3 {
        cluster.kill(node);
    }
    let finished = worker
        .wait_for(Duration::from_secs(20), |e| e["event"] == "run.finished")
        .expect("the run is stopped");
    assert_eq!(finished["outcome"], "lease_lost", "{finished}");
    // Long enough for several writes of the run's end to fail: it must be kept, not dropped.
    std::thread::sleep(Duration::from_secs(8));
    for node in 0..3 {
        cluster.restart(node);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ended = history(&cluster, "long")
            .into_iter()
            .any(|e| e.kind == Kind::Run && e.outcome.as_deref() == Some("lease_lost"));
        if ended {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the lost run never reached the history"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, stdout, stderr) = crate::cli::output(
        crate::cli::redcron(dir.path())
            .args(["explain", "long", &tick, "-c"])
            .arg(&path),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("lease_lost"), "{stdout}");
    drop(worker);
}

/// Every entry of `job` as one node holds it (its history hash, read directly), by tick.
fn node_entries(cluster: &RedisCluster, node: usize, job: &str) -> BTreeMap<i64, Vec<Entry>> {
    let mut by_tick: BTreeMap<i64, Vec<Entry>> = BTreeMap::new();
    for key in cluster.keys(node, &format!("*{{{job}}}:history")) {
        let stored: Vec<(String, String)> = cluster.query(node, redis::cmd("HGETALL").arg(&key));
        for (_, json) in stored {
            let entry = Entry::from_json(&json).expect("a stored entry");
            by_tick.entry(entry.tick).or_default().push(entry);
        }
    }
    by_tick
}

/// Three workers with one view of each other, one job every second: each routine tick (won by the
/// worker first in its order) leaves exactly one entry on every node — the winner's run, naming the
/// three workers that raced in their order — and no `lost` entry; the losers still log `tick.lost`.
#[test]
fn a_routine_tick_leaves_one_entry_per_node() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let job = "  - name: routine\n    schedule: \"* * * * * *\"\n    command: 'true'\n";
    let workers = start_workers(&cluster, &dir, 3, "", job);
    crate::order::wait_for_views(&workers, 3);
    let settled = chrono::Utc::now().timestamp_millis() + 1_000;
    let runs = |workers: &[Worker]| -> usize {
        workers.iter().map(|w| w.events("run.finished").len()).sum()
    };
    let before = runs(&workers);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while runs(&workers) < before + 8 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    // Ticks raced while the workers stop may be skipped for the shutdown: left out.
    let stopping = chrono::Utc::now().timestamp_millis() - 1_500;
    let lost_logged: usize = workers.iter().map(|w| w.events("tick.lost").len()).sum();
    drop(workers);
    assert!(lost_logged > 0, "the losers log their loss");

    let everyone = ["w0", "w1", "w2"];
    let mut routine = 0;
    for node in 0..cluster.len() {
        let ticks = node_entries(&cluster, node, "routine");
        for (tick, entries) in ticks.range(settled..stopping) {
            let run = entries
                .iter()
                .find(|e| e.kind == Kind::Run)
                .unwrap_or_else(|| panic!("node {node}, tick {tick}: no run in {entries:#?}"));
            let raced = run.raced.clone().unwrap_or_default();
            let mut named = raced.clone();
            named.sort();
            assert_eq!(named, everyone, "node {node}, tick {tick}: {run:?}");
            // A tick the expected winner lost (a slow first place on a loaded host) may carry the
            // losers' anomalies; a routine one carries the run alone.
            if raced.first() == Some(&run.worker) {
                assert_eq!(entries.len(), 1, "node {node}, tick {tick}: {entries:#?}");
                routine += 1;
            }
        }
    }
    assert!(
        routine >= 3 * 3,
        "only {routine} routine ticks on the nodes"
    );
}
