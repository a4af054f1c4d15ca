//! The worker end to end: the built binary, real Redis nodes (and a real etcd cluster), jobs that write
//! a ledger.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::support::{
    worker_config, Backend, EtcdCluster, Persistence, RedisCluster, SentinelGroup, TestDir, Worker,
};

/// A config with the cluster's nodes, short leases and `jobs` (YAML list items, already indented).
pub(crate) fn config(cluster: &RedisCluster, worker_section: &str, jobs: &str) -> String {
    worker_config(Backend::Redis, &cluster.urls(), worker_section, jobs)
}

/// `n` workers `w0`, `w1`, … on `cluster`, each with its own `w<i>.yaml` in `dir` (`worker_section` after
/// its id), each started: its `worker.started` logged.
pub(crate) fn start_workers(
    cluster: &RedisCluster,
    dir: &TestDir,
    n: usize,
    worker_section: &str,
    jobs: &str,
) -> Vec<Worker> {
    start_workers_with(dir, n, |id| {
        config(cluster, &format!("{id}{worker_section}"), jobs)
    })
}

/// `n` workers `w0`, `w1`, … with the config `yaml(worker section with their id)`, each in its own
/// `w<i>.yaml` in `dir`, each started: its `worker.started` logged.
pub(crate) fn start_workers_with(
    dir: &TestDir,
    n: usize,
    yaml: impl Fn(&str) -> String,
) -> Vec<Worker> {
    let workers: Vec<Worker> = (0..n)
        .map(|i| {
            let text = yaml(&format!("  id: w{i}\n"));
            Worker::spawn(dir.write(format!("w{i}.yaml"), text), &[])
        })
        .collect();
    for worker in &workers {
        worker
            .wait_for_event("worker.started", Duration::from_secs(10))
            .expect("worker started");
    }
    workers
}

/// A job that appends `$REDCRON_JOB $REDCRON_TICK $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID` to the ledger.
pub(crate) fn ledger_job(name: &str, schedule: &str, ledger: &std::path::Path) -> String {
    format!(
        "  - name: {name}\n    schedule: \"{schedule}\"\n    command: 'echo \"$REDCRON_JOB $REDCRON_TICK \
         $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID\" >> {}'\n",
        ledger.display()
    )
}

/// The ledger as (job, tick) → list of (token, worker).
pub(crate) fn ledger(dir: &TestDir) -> BTreeMap<(String, String), Vec<(u64, String)>> {
    let mut runs: BTreeMap<(String, String), Vec<(u64, String)>> = BTreeMap::new();
    for line in dir.ledger_lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [job, tick, token, worker] = fields[..] else {
            panic!("bad ledger line {line:?}")
        };
        let token = token
            .parse()
            .unwrap_or_else(|_| panic!("bad token in {line:?}"));
        runs.entry((job.to_string(), tick.to_string()))
            .or_default()
            .push((token, worker.to_string()));
    }
    runs
}

/// Parses an RFC 3339 tick.
pub(crate) fn tick_time(tick: &str) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(tick)
        .expect("RFC 3339 tick")
        .to_utc()
}

/// 5 nodes, 3 workers, two jobs every second for ~15 s: every tick in the window appears in the ledger
/// exactly once, tokens strictly increase per job, and more than one worker has won.
#[test]
fn three_workers_run_each_tick_exactly_once() {
    let cluster = RedisCluster::builder()
        .nodes(5)
        .persistence(Persistence::None)
        .start();
    three_workers_each_tick_once(|worker, jobs| config(&cluster, worker, jobs), || {}, 0);
}

/// The same on a 3-member etcd cluster, whose leader is killed halfway: each tick at most once, tokens
/// (etcd revisions) rising per job, and every tick run but those raced during the election (about a
/// second, and a worker races a tick of these every-second jobs only until the next one is due: at most
/// two per job).
#[test]
fn three_workers_on_etcd_run_each_tick_exactly_once() {
    let mut cluster = EtcdCluster::start();
    let endpoints = cluster.endpoints();
    let config = |worker: &str, jobs: &str| worker_config(Backend::Etcd, &endpoints, worker, jobs);
    let kill_the_leader = || {
        let leader = cluster.leader();
        cluster.kill(leader);
    };
    three_workers_each_tick_once(config, kill_the_leader, 2);
}

/// The same on one Sentinel group (a master, two replicas, three Sentinels: `redis.nodes: [group]`), whose
/// master is SIGKILLed halfway: each tick at most once, tokens rising per job, and every tick run but
/// those raced while the Sentinels agree the master is down and promote a replica (its 1 s
/// `down-after-milliseconds`, an election, the workers' reconnection) and the replica left resyncs
/// with it (`WAIT` counts none until then): 7 s at most seen in a full suite on 2 cores.
#[test]
fn three_workers_on_a_sentinel_group_run_each_tick_exactly_once() {
    let mut group = SentinelGroup::builder().start();
    let node = group.node_yaml();
    let config = |worker: &str, jobs: &str| {
        format!(
            "redis:\n  nodes:\n    - {node}\nlock:\n  ttl: 3s\n  renew_every: 1s\n  node_timeout: 300ms\n  retry_delay: 50ms\nworker:\n{worker}jobs:\n{jobs}"
        )
    };
    let kill_the_master = || {
        let master = group.master().expect("the group has a master");
        group.data.kill(master);
        group.wait_for_new_master(master);
    };
    three_workers_each_tick_once(config, kill_the_master, 8);
}

/// The same on a Redis Cluster (3 masters with a replica each: `redis.cluster`), the master of
/// `every-second`'s slot SIGKILLed halfway and restarted once its replica took over: each tick at most
/// once, tokens rising per job, and every tick run but those raced while the cluster fails the master
/// over (its 2 s `cluster-node-timeout` and an election, during which the cluster refuses every slot:
/// `CLUSTERDOWN`) and until the old master is back as a replica for `WAIT`: 5 s on a quiet machine.
#[test]
fn three_workers_on_a_redis_cluster_run_each_tick_exactly_once() {
    let mut cluster = testkit::ShardedRedis::start();
    let seeds = cluster.cluster_yaml();
    let config = |worker: &str, jobs: &str| {
        format!(
            "redis:\n  {seeds}\nlock:\n  ttl: 3s\n  renew_every: 1s\n  node_timeout: 300ms\n  retry_delay: 50ms\nworker:\n{worker}jobs:\n{jobs}"
        )
    };
    let kill_the_master = || {
        let slot = testkit::slot_of("{every-second}");
        let master = cluster
            .master_of_slot(slot)
            .expect("a master serves the slot");
        cluster.nodes_mut().kill(master);
        cluster.wait_for_new_master(slot, master);
        cluster.nodes_mut().restart(master);
        cluster.wait_until_replica(master);
    };
    three_workers_each_tick_once(config, kill_the_master, 8);
}

/// 3 workers with the config `config(worker section, jobs)` makes, two jobs every second for ~15 s, with
/// `halfway` (a fault) done 7 s in: every tick in the window but `may_miss` per job appears in the ledger,
/// none twice, tokens strictly increase per job, and more than one worker has won.
fn three_workers_each_tick_once(
    config: impl Fn(&str, &str) -> String,
    halfway: impl FnOnce(),
    may_miss: i64,
) {
    let dir = TestDir::new();
    let jobs = ledger_job("every-second", "* * * * * *", &dir.ledger())
        + &ledger_job("other", "* * * * * *", &dir.ledger());
    let workers = start_workers_with(&dir, 3, |worker| config(worker, &jobs));
    let window_start = chrono::Utc::now() + chrono::Duration::seconds(1);
    std::thread::sleep(Duration::from_secs(7));
    halfway();
    std::thread::sleep(Duration::from_secs(8));
    let window_end = chrono::Utc::now() - chrono::Duration::seconds(2);
    // What the workers said about ticks they did not win, to name the reason of a missed tick.
    let said: Vec<String> = workers
        .iter()
        .flat_map(|w| w.logs())
        .filter(|e| {
            e["event"]
                .as_str()
                .is_some_and(|n| n.starts_with("tick.") && n != "tick.won")
        })
        .map(|e| {
            format!("{} {} {} {}", e["worker"], e["event"], e["job"], e["tick"])
                + &format!(" {}", e["reason"])
        })
        .collect();
    drop(workers);

    let runs = ledger(&dir);
    let mut winners = HashSet::new();
    for job in ["every-second", "other"] {
        let mut last_token = 0;
        let mut seen = 0;
        for ((name, tick), entries) in &runs {
            if name != job {
                continue;
            }
            assert_eq!(
                entries.len(),
                1,
                "{job} at {tick} ran {} times: {entries:?}",
                entries.len()
            );
            let (token, worker) = &entries[0];
            assert!(
                *token > last_token,
                "{job}: token {token} after {last_token}"
            );
            last_token = *token;
            winners.insert(worker.clone());
            let at = tick_time(tick);
            if at >= window_start && at <= window_end {
                seen += 1;
            }
        }
        let expected = (window_end - window_start).num_seconds();
        if seen < expected {
            eprintln!(
                "{job}: {seen} ticks run in a window of {expected} s; the workers said:\n{}",
                said.join("\n")
            );
        }
        assert!(
            seen + may_miss >= expected,
            "{job}: {seen} ticks run in a window of {expected} s; ran: {:?}; the workers said:\n{}",
            runs.keys()
                .filter(|(name, _)| name == job)
                .map(|(_, t)| t)
                .collect::<Vec<_>>(),
            said.join("\n")
        );
    }
    assert!(winners.len() > 1, "only {winners:?} ever won");
}

/// A job that outlives its TTL keeps running (renewals work); the same job with 3 of 5 nodes hung loses its
/// lease, is stopped, and `lease.expiring` (or `lease.lost`) is logged.
#[test]
fn long_job_is_renewed_and_stopped_when_the_lease_is_lost() {
    let mut cluster = RedisCluster::start(5);
    let dir = TestDir::new();
    let marker = dir.join("finished");
    let job = format!(
        "  - name: long\n    schedule: \"*/30 * * * * *\"\n    misfire_grace: 30s\n    command: 'sleep 5; touch {}'\n",
        marker.display()
    );
    let path = dir.write_config(&config(&cluster, "  id: solo\n", &job));
    let worker = Worker::spawn(&path, &[]);
    // The first tick within the misfire grace is raced at once.
    worker
        .wait_for_event("run.started", Duration::from_secs(10))
        .expect("run started");
    let finished = worker
        .wait_for_event("run.finished", Duration::from_secs(15))
        .expect("run finished");
    assert_eq!(finished["outcome"], "success", "{finished}");
    assert!(marker.exists(), "the job ran to its end, past its 2 s TTL");
    assert!(worker.events("lease.lost").is_empty());
    drop(worker);

    // Second part: a fresh job name, so that the tick is free; hang a majority while it runs.
    let job = job.replace("name: long", "name: long2");
    let path = dir.write_config(&config(&cluster, "  id: solo\n", &job));
    let worker = Worker::spawn(&path, &[]);
    worker
        .wait_for_event("run.started", Duration::from_secs(10))
        .expect("run started");
    for node in 0..3 {
        cluster.stop(node);
    }
    // Stopped before the deadline (`lease.expiring`), or on a majority's denial (`lease.lost`).
    let lost = worker.wait_for(Duration::from_secs(5), |e| {
        e["event"] == "lease.expiring" || e["event"] == "lease.lost"
    });
    let finished = worker.wait_for_event("run.finished", Duration::from_secs(15));
    for node in 0..3 {
        cluster.cont(node);
    }
    lost.expect("lease.expiring or lease.lost logged");
    let finished = finished.expect("run finished");
    assert_eq!(finished["outcome"], "lease_lost", "{finished}");
    assert!(
        finished["duration_ms"].as_u64().unwrap_or(u64::MAX) < 5_000,
        "stopped before it ended: {finished}"
    );
}

/// SIGTERM during a run: the run finishes inside the grace, the lease is released, exit 0. A second
/// signal stops the run at once: exit 130.
#[test]
fn sigterm_lets_the_run_finish_and_a_second_signal_exits_130() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let job = "  - name: graceful\n    schedule: \"*/30 * * * * *\"\n    misfire_grace: 30s\n    command: 'sleep 2'\n";
    let worker_section = "  id: g\n  shutdown_grace: 10s\n";
    let path = dir.write_config(&config(&cluster, worker_section, job));
    let mut worker = Worker::spawn(&path, &[]);
    worker
        .wait_for_event("run.started", Duration::from_secs(10))
        .expect("run started");
    worker.signal(libc::SIGTERM);
    let status = worker
        .wait_timeout(Duration::from_secs(10))
        .expect("worker exits after the run");
    assert_eq!(status.code(), Some(0), "{}", worker.stderr());
    let finished = worker.events("run.finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(
        finished[0]["outcome"], "success",
        "the run finished inside the grace"
    );
    assert!(!worker.events("worker.stopped").is_empty());
    // Released: the job's lease key is gone on every node.
    for node in 0..3 {
        assert_eq!(
            cluster.get(node, "redcron:{graceful}:lease"),
            None,
            "lease left on node {node}"
        );
    }

    let job = job
        .replace("sleep 2", "sleep 30")
        .replace("graceful", "stubborn");
    let path = dir.write_config(&config(&cluster, worker_section, &job));
    let mut worker = Worker::spawn(&path, &[]);
    worker
        .wait_for_event("run.started", Duration::from_secs(10))
        .expect("run started");
    worker.signal(libc::SIGTERM);
    worker
        .wait_for_event("worker.stopping", Duration::from_secs(5))
        .expect("stopping");
    worker.signal(libc::SIGINT);
    let status = worker
        .wait_timeout(Duration::from_secs(10))
        .expect("worker exits at the second signal");
    assert_eq!(status.code(), Some(130), "{}", worker.stderr());
    let finished = worker.events("run.finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["outcome"], "shutdown");
    for node in 0..3 {
        assert_eq!(
            cluster.get(node, "redcron:{stubborn}:lease"),
            None,
            "lease left on node {node}"
        );
    }
}

/// A worker started late (within `misfire_grace`) runs a tick that nobody ran, saying that it races a tick
/// from before its start (`tick.from_before_start`); a worker that arrives after that tick was run does
/// not run it again.
#[test]
fn late_worker_runs_a_missed_tick_once() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    // Every 20 s, with a grace of 15 s; start a few seconds after a tick.
    let job = format!(
        "  - name: late\n    schedule: \"*/20 * * * * *\"\n    misfire_grace: 15s\n    command: 'echo \"$REDCRON_JOB $REDCRON_TICK $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID\" >> {}'\n",
        dir.ledger().display()
    );
    loop {
        let second = chrono::Utc::now().timestamp() % 20;
        if (2..6).contains(&second) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let first = Worker::spawn(
        dir.write("a.yaml", config(&cluster, "  id: late-a\n", &job)),
        &[],
    );
    first
        .wait_for_event("run.finished", Duration::from_secs(10))
        .expect("the missed tick was run");
    // It said that it races a tick from before its start, and why.
    let said = first
        .wait_for_event("tick.from_before_start", Duration::from_secs(5))
        .expect("tick.from_before_start");
    assert_eq!(said["job"], "late", "{said}");
    assert_eq!(said["misfire_grace_ms"], 15_000, "{said}");
    assert!(
        said["late_ms"]
            .as_u64()
            .is_some_and(|late| (1_000..15_000).contains(&late)),
        "{said}"
    );
    let second = Worker::spawn(
        dir.write("b.yaml", config(&cluster, "  id: late-b\n", &job)),
        &[],
    );
    let lost = second
        .wait_for_event("tick.lost", Duration::from_secs(10))
        .expect("b raced the same tick");
    assert_eq!(lost["reason"], "already_claimed", "{lost}");
    drop(first);
    drop(second);
    let runs = ledger(&dir);
    assert_eq!(runs.len(), 1, "{runs:?}");
    let ((_, tick), entries) = runs.into_iter().next().expect("one run");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].1, "late-a");
    assert_eq!(tick_time(&tick).timestamp() % 20, 0);
}

/// Redis nodes down when the worker starts: it says that it cannot measure their clocks, naming their
/// addresses, schedules nothing until it can (`clock::a_worker_that_cannot_measure_claims_no_tick_until_it_can`),
/// and runs ticks once a majority is back.
#[test]
fn worker_outlives_redis_down_at_start() {
    let mut cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let path = dir.write_config(&config(
        &cluster,
        "  id: patient\n",
        &ledger_job("p", "* * * * * *", &dir.ledger()),
    ));
    for node in 0..3 {
        cluster.kill(node);
    }
    let mut worker = Worker::spawn(&path, &[]);
    let unmeasured = worker
        .wait_for_event("clock.unmeasured", Duration::from_secs(10))
        .expect("clock.unmeasured logged");
    let error = unmeasured["error"].as_str().unwrap_or_default().to_string();
    assert!(
        error.contains(&cluster.url(0)),
        "the error names the nodes: {error}"
    );
    for node in 0..2 {
        cluster.restart(node);
    }
    worker
        .wait_for_event("run.finished", Duration::from_secs(15))
        .expect("runs resume with 2 of 3 nodes");
    assert!(
        worker.wait_timeout(Duration::from_millis(10)).is_none(),
        "the worker is still running"
    );
}

/// A tick that finds no majority is raced again within its misfire grace: an outage of a majority of
/// nodes shorter than the grace costs no run.
#[test]
fn a_tick_survives_an_outage_shorter_than_its_grace() {
    let mut cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let job = ledger_job("outage", "*/10 * * * * *", &dir.ledger())
        .replace("    command:", "    misfire_grace: 8s\n    command:");
    let path = dir.write_config(&config(&cluster, "  id: o\n", &job));
    let worker = Worker::spawn(&path, &[]);
    // Measured: a worker that has not measured the nodes' clocks schedules no tick (and a measurement
    // that the hang cut would leave it so for the whole test).
    worker
        .wait_for_event("clock.offset", Duration::from_secs(15))
        .expect("the nodes' clocks measured");
    // Hang the majority just before a tick, so that tick has (nearly) all its 8 s grace ahead of it.
    while chrono::Utc::now().timestamp() % 10 != 9 {
        std::thread::sleep(Duration::from_millis(100));
    }
    for node in 0..2 {
        cluster.stop(node);
    }
    let retrying = worker
        .wait_for(Duration::from_secs(15), |e| e["event"] == "tick.retrying")
        .expect("the tick is retried while the majority is hung");
    std::thread::sleep(Duration::from_secs(2));
    for node in 0..2 {
        cluster.cont(node);
    }
    let tick = retrying["tick"].as_str().expect("tick").to_string();
    // run.finished, not run.started: the ledger line is written by the job itself.
    let finished = worker
        .wait_for(Duration::from_secs(10), |e| {
            e["event"] == "run.finished" && e["tick"] == tick.as_str()
        })
        .expect("the same tick runs once the majority is back");
    assert_eq!(finished["outcome"], "success", "{finished}");
    let runs = ledger(&dir);
    assert_eq!(
        runs.get(&("outage".to_string(), tick.clone()))
            .map(Vec::len),
        Some(1),
        "{runs:?}"
    );
}

/// `jitter`: three workers race each tick at tick + the same hash-derived delay, so every run starts no
/// earlier than that delay after its tick, the delays differ from tick to tick, and each tick runs once.
#[test]
fn jitter_delays_each_tick_by_the_same_amount_on_every_worker() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let jobs = ledger_job("spread", "* * * * * *", &dir.ledger()) + "    jitter: 900ms\n";
    let yaml = |i: usize| config(&cluster, &format!("  id: w{i}\n"), &jobs);
    let parsed =
        redcron::config::parse(&yaml(0), std::path::Path::new("jobs.yaml")).expect("valid");
    let job = parsed.jobs[0].clone();
    let workers: Vec<Worker> = (0..3)
        .map(|i| Worker::spawn(dir.write(format!("w{i}.yaml"), yaml(i)), &[]))
        .collect();
    let started = |workers: &[Worker]| -> Vec<serde_json::Value> {
        workers
            .iter()
            .flat_map(|w| w.events("run.started"))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while started(&workers).len() < 6 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let runs = started(&workers);
    drop(workers);
    assert!(runs.len() >= 6, "only {} runs", runs.len());
    let mut delays = HashSet::new();
    for run in &runs {
        let tick = tick_time(run["tick"].as_str().expect("tick"));
        let at = tick_time(run["timestamp"].as_str().expect("timestamp"));
        let delay = job.jitter_for(redcron::schedule::Tick(tick.timestamp_millis()));
        // Cluster time may differ from the log's wall clock by the measured offset (a few ms here).
        assert!(
            at + chrono::Duration::milliseconds(20)
                >= tick + chrono::Duration::from_std(delay).expect("delay"),
            "{} started at {at}, before its jitter of {delay:?}",
            run["tick"]
        );
        delays.insert(delay);
    }
    assert!(
        delays.len() > 1,
        "every tick had the same delay: {delays:?}"
    );
    for ((name, tick), entries) in ledger(&dir) {
        assert_eq!(
            entries.len(),
            1,
            "{name} at {tick} ran {} times",
            entries.len()
        );
    }
}

/// Alert hooks with two workers: a job that fails for several ticks, then succeeds, alerts once when it
/// starts failing and once when it recovers — whichever workers ran the ticks — with the run's fields in
/// the hook's environment.
#[test]
fn alert_hooks_fire_once_per_change() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let flag = dir.write("failing", "");
    let alerts = dir.join("alerts");
    let hook = |kind: &str| {
        format!(
            "'echo {kind} $REDCRON_ALERT $REDCRON_OUTCOME $REDCRON_FAILURES $REDCRON_PREVIOUS_OUTCOME >> {}'",
            alerts.display()
        )
    };
    let jobs = format!(
        "  - name: flaky\n    schedule: \"* * * * * *\"\n    command: 'test ! -e {}'\n    on_failure: {}\n    on_recovery: {}\n",
        flag.display(),
        hook("F"),
        hook("R")
    );
    let workers: Vec<Worker> = (0..2)
        .map(|i| {
            Worker::spawn(
                dir.write(
                    format!("w{i}.yaml"),
                    config(&cluster, &format!("  id: w{i}\n"), &jobs),
                ),
                &[],
            )
        })
        .collect();
    let finished = |workers: &[Worker], outcome: &str| {
        workers
            .iter()
            .flat_map(|w| w.events("run.finished"))
            .filter(|e| e["outcome"] == outcome)
            .count()
    };
    let wait = |workers: &[Worker], outcome: &str, count: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while finished(workers, outcome) < count {
            assert!(
                std::time::Instant::now() < deadline,
                "{count} runs with outcome {outcome}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait(&workers, "failure", 4);
    std::fs::remove_file(&flag).expect("remove the flag");
    wait(&workers, "success", 4);
    // Time for a late or duplicate alert to show.
    std::thread::sleep(Duration::from_secs(2));
    drop(workers);
    let lines: Vec<String> = std::fs::read_to_string(&alerts)
        .expect("alerts were written")
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(lines[0], "F failure failure 1", "{lines:#?}");
    assert_eq!(lines[1], "R recovery success 0 failure", "{lines:#?}");
}

/// A worker that starts late races every tick within the grace of an `overlap: allow` job, oldest first;
/// the ticks another worker already claimed are refused, the older ones because a later tick is claimed:
/// it says so (`later_tick_claimed`, naming the later tick), never "lost to" a claim of that tick, and runs
/// none of them again.
#[test]
fn a_late_worker_is_told_when_a_later_tick_was_claimed_first() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let job = format!(
        "  - name: allow\n    schedule: \"* * * * * *\"\n    overlap: allow\n    misfire_grace: 4s\n    command: 'echo \"$REDCRON_JOB $REDCRON_TICK $REDCRON_FENCING_TOKEN $REDCRON_WORKER_ID\" >> {}'\n",
        dir.ledger().display()
    );
    let mut first = Worker::spawn(
        dir.write("a.yaml", config(&cluster, "  id: early\n", &job)),
        &[],
    );
    // Three ticks run by `early`, then it stops: the ticks in the late worker's grace are all claimed.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while first.events("run.finished").len() < 3 {
        assert!(std::time::Instant::now() < deadline, "early ran no 3 ticks");
        std::thread::sleep(Duration::from_millis(100));
    }
    first.signal(libc::SIGKILL);
    let _ = first.wait_timeout(Duration::from_secs(10));
    let ran_by_early = ledger(&dir);
    let late = Worker::spawn(
        dir.write("b.yaml", config(&cluster, "  id: late\n", &job)),
        &[],
    );
    let refused = late
        .wait_for(Duration::from_secs(10), |e| {
            e["event"] == "tick.lost" && e["reason"] == "later_tick_claimed"
        })
        .expect("late raced an older tick after a later one was claimed");
    // The later tick is one `early` claimed, or — when the claim order put this old tick after the
    // current one — the current tick, which `late` won first.
    let later_won_by_late = late
        .events("tick.won")
        .iter()
        .any(|won| won["tick"] == refused["by_tick"]);
    assert!(
        refused["by"] == "early" || (refused["by"] == "late" && later_won_by_late),
        "{refused}"
    );
    let (tick, later) = (
        tick_time(refused["tick"].as_str().expect("tick")),
        tick_time(refused["by_tick"].as_str().expect("by_tick")),
    );
    assert!(later > tick, "by_tick {later} is not after tick {tick}");
    drop(late);
    // No tick that `early` ran was run again.
    for (key, runs) in ledger(&dir) {
        if ran_by_early.contains_key(&key) {
            assert_eq!(runs.len(), 1, "{key:?} ran {runs:?}");
        }
    }
}
