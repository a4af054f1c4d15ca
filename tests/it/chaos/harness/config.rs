//! The workers' jobs file, in its two versions, and their clocks.
//!
//! Version 1 is what a rolling config change deploys: every job's `timeout` and `command` differ (an
//! extra argument the ledger ignores), and `quick` and `parallel` swap their `overlap` — which in the
//! lock means a different lease key, so during a rollout two workers may race one tick on two keys.
//! Each job's ledger scope follows its overlap (`job` for skip, `tick` for allow).

use std::path::Path;

use super::{Breakage, GRACE_S, LONG_JOB, LONG_MS, SHUTDOWN_GRACE_S};
use crate::chaos::store::StoreKind;

/// `+1.500` / `-2.250`: a libfaketime offset in seconds.
pub(super) fn faketime_spec(offset_ms: i64) -> String {
    let sign = if offset_ms < 0 { '-' } else { '+' };
    format!(
        "{sign}{}.{:03}",
        offset_ms.abs() / 1000,
        offset_ms.abs() % 1000
    )
}

/// The jobs file of worker `w` in config `version` (0 or 1), on `store` at `nodes` (Redis URLs, etcd
/// endpoints, ZooKeeper `host:port`s, the SQL server's one URL, a Sentinel group's one entry of
/// `redis.nodes` in YAML flow style, or a Redis Cluster's `cluster: [seed URLs]` field).
pub(super) fn config(
    worker: usize,
    version: usize,
    store: StoreKind,
    nodes: &[String],
    ledger: &Path,
    breakage: Option<Breakage>,
) -> String {
    let group = nodes.join(", ");
    let nodes = nodes
        .iter()
        .map(|url| format!("\"{url}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let ledger = ledger.display();
    // The long job writes a start and an end; with `escape-stop` it runs in a session of its own, out of
    // the reach of the worker's SIGTERM/SIGKILL to its process group.
    let long_s = LONG_MS as f64 / 1000.0;
    let long = |rolled: &str| {
        let script =
            format!("{ledger} start job{rolled} && sleep {long_s} && {ledger} end job{rolled}");
        if breakage == Some(Breakage::EscapeStop) {
            format!("setsid -w sh -c '{script}'")
        } else {
            script
        }
    };
    let jobs = match version {
        0 => format!(
            r#"  - name: quick
    schedule: "* * * * * *"
    command: ['{ledger}', start, job]
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
  - name: parallel
    schedule: "* * * * * *"
    overlap: allow
    command: ['{ledger}', start, tick]
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
  - name: {LONG_JOB}
    schedule: "* * * * * *"
    command: "{long}"
    timeout: 30s
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
"#,
            long = long(""),
        ),
        _ => format!(
            r#"  - name: quick
    schedule: "* * * * * *"
    overlap: allow
    command: ['{ledger}', start, tick, rolled]
    timeout: 20s
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
  - name: parallel
    schedule: "* * * * * *"
    overlap: skip
    command: ['{ledger}', start, job, rolled]
    timeout: 20s
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
  - name: {LONG_JOB}
    schedule: "* * * * * *"
    command: "{long}"
    timeout: 25s
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
"#,
            long = long(" rolled"),
        ),
    };
    let section = match store {
        StoreKind::Redis => format!("redis:\n  nodes: [{nodes}]"),
        StoreKind::Etcd => format!("etcd:\n  endpoints: [{nodes}]"),
        StoreKind::Zookeeper => format!("zookeeper:\n  hosts: [{nodes}]"),
        // The test servers serve no TLS.
        StoreKind::Postgres => format!("postgres:\n  url: {nodes}\n  tls: disable"),
        StoreKind::Mariadb => format!("mysql:\n  url: {nodes}\n  tls: disable"),
        StoreKind::RedisSentinel => format!("redis:\n  nodes:\n    - {group}"),
        // `nodes` holds the cluster's `cluster: [seed URLs]` field.
        StoreKind::RedisCluster => format!("redis:\n  {group}"),
    };
    let (ttl, renew, node_timeout) = (store.ttl_ms(), store.renew_ms(), store.node_timeout_ms());
    format!(
        r#"{section}
lock:
  ttl: {ttl}ms
  renew_every: {renew}ms
  node_timeout: {node_timeout}ms
  retry_delay: 100ms
worker:
  id: w{worker}
  shutdown_grace: {SHUTDOWN_GRACE_S}s
  clock_check_every: 1s
jobs:
{jobs}"#
    )
}
