//! A job never outlives its lease: the built worker, real Redis nodes, and the times its log reports.
//!
//! With every node hung (SIGSTOP), no renewal can be confirmed. The worker must then SIGTERM the job
//! when the lease has only the job's `stop_grace` left (`lease.expiring`, whose `remaining_ms` dates the
//! deadline) and SIGKILL it at the deadline at the latest. The deadline is also bounded from outside:
//! no renewal sent after the nodes were hung can be confirmed, so it is at most `ttl − drift` after the
//! moment the test hung them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::support::{RedisCluster, TestDir, Worker};

/// `ttl − drift` of [`config`]: 3 s − (30 ms + 2 ms).
const VALIDITY_MS: i64 = 2_968;
/// A job that ignores SIGTERM (its `sleep`s inherit that): only SIGKILL ends it.
const STUBBORN: &str = "trap '' TERM; while :; do sleep 0.2; done";
/// The jobs' `stop_grace`: well inside the slack (3000 − 32 − 500 − 100 = 2368 ms).
const STOP_GRACE_MS: i64 = 1_500;

/// The cluster's nodes, a 3 s lease renewed every 500 ms, and one job `name` that is due at once.
fn config(cluster: &RedisCluster, name: &str, command: &str, extra: &str) -> String {
    let nodes = cluster.nodes_yaml();
    format!(
        "redis:\n  nodes: {nodes}\nlock:\n  ttl: 3s\n  renew_every: 500ms\n  node_timeout: 100ms\n  retry_delay: 50ms\n\
         worker:\n  id: {name}-worker\njobs:\n  - name: {name}\n    schedule: \"*/30 * * * * *\"\n    misfire_grace: 30s\n\
         \x20   stop_grace: {STOP_GRACE_MS}ms\n    command: \"{command}\"\n{extra}"
    )
}

fn at(event: &Value) -> DateTime<Utc> {
    let text = event["timestamp"].as_str().expect("a timestamp");
    DateTime::parse_from_rfc3339(text)
        .expect("RFC 3339")
        .to_utc()
}

fn ms(n: i64) -> chrono::Duration {
    chrono::Duration::milliseconds(n)
}

/// Whether `pid` is gone or a zombie (dead, not yet reaped).
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// When `pid` was first seen dead (polled every 5 ms), or `until` if it was not by then.
fn wait_dead(pid: u32, until: DateTime<Utc>) -> DateTime<Utc> {
    while !is_dead(pid) && Utc::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    Utc::now()
}

/// A started run whose nodes the test then hung; dropped worker first, then the nodes, then the files.
struct Hung {
    worker: Worker,
    cluster: RedisCluster,
    _dir: TestDir,
    /// The child's pid (`run.started`).
    pid: u32,
    /// Just before the first node was hung.
    hung_at: DateTime<Utc>,
}

/// Starts 3 nodes and a worker whose job `name` runs `command`, waits for the run, lets it renew for a
/// while, then hangs every node.
fn hang_a_run(name: &str, command: &str) -> Hung {
    let mut cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let worker = Worker::spawn(dir.write_config(&config(&cluster, name, command, "")), &[]);
    let started = worker
        .wait_for_event("run.started", Duration::from_secs(15))
        .expect("run started");
    let pid = started["pid"].as_u64().expect("a pid") as u32;
    std::thread::sleep(Duration::from_millis(1_200));
    let hung_at = Utc::now();
    for node in 0..cluster.len() {
        cluster.stop(node);
    }
    Hung {
        worker,
        cluster,
        _dir: dir,
        pid,
        hung_at,
    }
}

fn cont_all(cluster: &mut RedisCluster) {
    for node in 0..cluster.len() {
        cluster.cont(node);
    }
}

/// The `lease.expiring` event and the deadline it dates, checked against the bound from outside.
fn expiring(hung: &Hung) -> (Value, DateTime<Utc>) {
    let expiring = hung
        .worker
        .wait_for_event("lease.expiring", Duration::from_secs(10))
        .expect("lease.expiring logged");
    let remaining = expiring["remaining_ms"].as_i64().expect("remaining_ms");
    assert!(
        remaining <= STOP_GRACE_MS && remaining > STOP_GRACE_MS - 1_000,
        "SIGTERM when stop_grace was left (give or take a late timer): {expiring}"
    );
    let deadline = at(&expiring) + ms(remaining);
    // A few ms for the two clocks' readings; the bound itself is exact.
    assert!(
        deadline <= hung.hung_at + ms(VALIDITY_MS + 20),
        "deadline {deadline} after the last possible renewal's {}: {expiring}",
        hung.hung_at + ms(VALIDITY_MS)
    );
    (expiring, deadline)
}

fn finished(worker: &Worker) -> Value {
    worker
        .wait_for_event("run.finished", Duration::from_secs(10))
        .expect("run finished")
}

/// All nodes hung under a long job: SIGTERM comes when `stop_grace` is left, and the child is gone
/// before the lease's deadline — by the worker's log and by the test's own look at the pid.
#[test]
fn a_job_whose_lease_cannot_be_renewed_is_gone_before_the_deadline() {
    let mut hung = hang_a_run("hung", "exec sleep 60");
    let (_, deadline) = expiring(&hung);
    let seen_dead_at = wait_dead(hung.pid, deadline + ms(5_000));
    let finished = finished(&hung.worker);
    cont_all(&mut hung.cluster);
    assert!(is_dead(hung.pid), "the child still runs");
    assert!(
        seen_dead_at < deadline,
        "seen dead at {seen_dead_at}, deadline {deadline}"
    );
    assert_eq!(finished["outcome"], "lease_lost", "{finished}");
    assert_eq!(finished["signal"], libc::SIGTERM, "{finished}");
    assert!(at(&finished) < deadline, "{finished}, deadline {deadline}");
}

/// A child that ignores SIGTERM is SIGKILLed at the lease's deadline: not before (it had its
/// `stop_grace`), and not later than the deadline plus what a loaded machine may add to see it dead.
#[test]
fn a_child_that_ignores_sigterm_is_killed_by_the_deadline() {
    let mut hung = hang_a_run("stubborn", STUBBORN);
    let (_, deadline) = expiring(&hung);
    let seen_dead_at = wait_dead(hung.pid, deadline + ms(5_000));
    let finished = finished(&hung.worker);
    cont_all(&mut hung.cluster);
    assert!(is_dead(hung.pid), "the child still runs");
    assert_eq!(finished["outcome"], "lease_lost", "{finished}");
    assert_eq!(finished["signal"], libc::SIGKILL, "{finished}");
    // Seen dead after it died, so not before the SIGKILL: the grace was not cut short.
    assert!(
        seen_dead_at >= deadline - ms(20),
        "dead at {seen_dead_at}, before the deadline {deadline}"
    );
    assert!(
        seen_dead_at <= deadline + ms(500),
        "dead at {seen_dead_at}, deadline {deadline}"
    );
}

/// Nodes that answer again after SIGTERM went out: the renewal is confirmed and logged, and the stop
/// goes on (the child that ignores SIGTERM is SIGKILLed at the old deadline all the same).
#[test]
fn a_renewal_confirmed_while_stopping_does_not_take_the_stop_back() {
    let mut hung = hang_a_run("resumed", STUBBORN);
    let (_, deadline) = expiring(&hung);
    cont_all(&mut hung.cluster);
    let renewed = hung
        .worker
        .wait_for_event("lease.renewed_while_stopping", Duration::from_secs(5));
    let finished = finished(&hung.worker);
    let renewed = renewed.expect("the renewal during the stop is logged");
    assert!(at(&renewed) < deadline, "{renewed}");
    assert_eq!(finished["outcome"], "lease_lost", "{finished}");
    assert_eq!(finished["signal"], libc::SIGKILL, "{finished}");
    assert!(at(&finished) <= deadline + ms(500), "{finished}");
}

/// A majority that answers "not held" (its keys were flushed): the job is stopped at once, SIGKILL
/// `stop_grace` later (the deadline is further away).
#[test]
fn a_lease_a_majority_denies_is_stopped_at_once() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let worker = Worker::spawn(
        dir.write_config(&config(&cluster, "denied", STUBBORN, "")),
        &[],
    );
    worker
        .wait_for_event("run.started", Duration::from_secs(15))
        .expect("run started");
    cluster.flushall(0);
    cluster.flushall(1);
    let lost = worker
        .wait_for_event("lease.lost", Duration::from_secs(5))
        .expect("lease.lost logged");
    let stopping = worker
        .wait_for_event("run.stopping", Duration::from_secs(5))
        .expect("run.stopping logged");
    let finished = finished(&worker);
    assert!(
        lost["error"]
            .as_str()
            .is_some_and(|e| e.contains("no longer held")),
        "{lost}"
    );
    let kill_in = stopping["kill_in_ms"].as_i64().expect("kill_in_ms");
    assert!(
        kill_in <= STOP_GRACE_MS && kill_in > 0,
        "SIGKILL stop_grace after SIGTERM: {stopping}"
    );
    assert_eq!(finished["outcome"], "lease_lost", "{finished}");
    assert_eq!(finished["signal"], libc::SIGKILL, "{finished}");
    let waited = at(&finished) - at(&stopping);
    assert!(
        waited >= ms(kill_in - 20) && waited <= ms(kill_in + 1_000),
        "SIGKILL {waited} after SIGTERM, {kill_in} ms expected"
    );
}

/// The timeout stops a job with its `stop_grace` too: SIGTERM at the timeout, SIGKILL `stop_grace`
/// later for a child that ignores SIGTERM.
#[test]
fn a_timeout_stops_with_stop_grace() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let yaml = config(&cluster, "slow", STUBBORN, "    timeout: 1s\n");
    let worker = Worker::spawn(dir.write_config(&yaml), &[]);
    let timeout = worker
        .wait_for_event("run.timeout", Duration::from_secs(15))
        .expect("run.timeout logged");
    let finished = finished(&worker);
    assert_eq!(finished["outcome"], "timeout", "{finished}");
    assert_eq!(finished["signal"], libc::SIGKILL, "{finished}");
    let waited = at(&finished) - at(&timeout);
    assert!(
        waited >= ms(STOP_GRACE_MS - 20) && waited <= ms(STOP_GRACE_MS + 1_000),
        "SIGKILL {waited} after SIGTERM, stop_grace is {STOP_GRACE_MS} ms"
    );
}
