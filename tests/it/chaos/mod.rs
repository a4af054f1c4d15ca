//! Chaos: each (job, tick) runs exactly once, and a stale holder's writes are fenced off, while a seeded
//! random plan pauses, crashes, hangs, slows, skews and reconfigures a real cluster.
//!
//! The cluster is real: 5 `redis-server` lock nodes with `appendonly yes` and `appendfsync always` (as
//! `docs/protocol.md` requires), one of them behind a TCP proxy that adds latency and drops connections;
//! 4 processes of the built `redcron` binary, one with its clock behind, two with their clocks ahead by
//! the same amount, one of those stepping away and back during the run — each measures its offset to the
//! nodes every second and races on cluster time, so all four race each tick at about the same instant;
//! and three jobs firing every second — `quick` (`overlap: skip`), `parallel`
//! (`overlap: allow`) and `long`, which runs 5.5 s against a 2 s lease so that it renews, and is taken
//! over when its holder is paused. Every job writes to a fenced ledger (a separate Redis, see [`ledger`]).
//!
//! The plan ([`plan`], made of [`faults`]) pauses the long job's holder past its TTL, crashes workers
//! (also while they run a job, and a few milliseconds into their race of a tick), rolls a second config
//! version out to the workers one at a time and back (`quick` and `parallel` swap their `overlap`, every
//! job's `timeout` and `command` change), kills and hangs at most 2 of the 5 nodes at once, stalls all 5
//! for less than the TTL (as one slow fsync does on a shared disk), leaves a crashed contender's keys on
//! the nodes for an upcoming tick, degrades the proxy, steps a clock, and plants garbage in the store (bad
//! trigger requests for the jobs, junk members and history, on a minority or a majority of the nodes;
//! drawn from a sub-seed of its own, so a seed's other faults are where they were). The harness ([`harness`])
//! carries it out and records a [`timeline`], while a probe ([`probe`]) measures the node stalls that the
//! machine adds on its own; the checker ([`checker`], whose module documentation states every rule) then
//! reads the ledger, the timeline, the workers' JSON logs and the nodes' append-only files ([`claims`]),
//! prints a table, and fails the test on a duplicate, an unexplained miss, a token out of order, a
//! stale write that was not fenced off, a run that no scheduled tick explains, or planted garbage that a
//! running worker did not log as skipped.
//!
//! `etcd_exactly_once_under_faults` runs the same on a 3-member etcd cluster ([`store`]): member kills
//! and hangs (of a given member or of the leader, one at a time) instead of the Redis nodes' faults, the
//! same worker faults, rollouts and clock steps, the same checker; etcd's history of claim records
//! ([`etcd_claims`]) stands in for the nodes' AOF, and what explains a miss on etcd is in [`misses`].
//!
//! `postgres_exactly_once_under_faults` and `mariadb_exactly_once_under_faults` run it on one SQL server
//! (the SQL store's two dialects): the server killed and restarted on its data, and hung shorter and
//! longer than `node_timeout`, one fault at a time (a fault of the one server takes the whole store out
//! of reach, which the checker reads as no majority); the same worker faults, rollouts and clock steps,
//! garbage planted with SQL, the same checker. The server's own record of every claim and lease row it
//! committed, written by triggers inside the claiming transactions ([`sql_claims`]), stands in for the
//! nodes' AOF.
//!
//! `zookeeper_exactly_once_under_faults` runs it on a 3-member ZooKeeper ensemble: member kills and hangs
//! (of a given member or of the leader) as on etcd, the same worker faults, rollouts and clock steps, the
//! same checker, garbage planted through a client of the harness's own; each member's transaction log ([`zk_claims`]) stands in for the
//! nodes' AOF: a claim record logged by a majority of members was granted.
//!
//! `sentinel_exactly_once_under_faults` runs it on one Sentinel group as the Redis store's one node: a
//! master and 2 replicas (`appendonly yes`, `appendfsync always`, `repl-diskless-sync-delay 0`, each
//! from a config file the Sentinels rewrite), 3 Sentinels, `min_replicas_acked: all`. Its node faults,
//! one at a time and 10 s apart: the master SIGKILLed (restarted later on its data and config file, as
//! its operator would: a master, which the Sentinels convert if they promoted another), the master
//! hung longer than the Sentinels' `down-after-milliseconds` (replaced, then continued and demoted), a
//! planned failover (`SENTINEL FAILOVER`), and a replica killed or hung (the other one acknowledges).
//! The same worker faults, rollouts, clock steps and garbage (planted on the master), the same checker:
//! the group is one node, so a fault of its master takes the store out of reach until the group serves
//! again, as a SQL server's kill does ([`misses`]); every data node's AOF, read with its history, stands
//! in for the nodes' AOF — a claim write that a replica's AOF holds too counted ([`claims`]).
//!
//! `cluster_exactly_once_under_faults` runs it on a Redis Cluster as the Redis store's one node: 3
//! masters with a replica each (`appendonly yes`, `appendfsync always`, `cluster-node-timeout` 2 s),
//! `min_replicas_acked: all`. Its node faults are the Sentinel group's, aimed at the shards by turns:
//! a master SIGKILLed (restarted later on its data and `nodes.conf`: it learns it was replaced and
//! follows its replica), a master hung (for less or longer than the node timeout: continued, or
//! replaced and then demoted), a planned failover (`CLUSTER FAILOVER` on a master's replica), a
//! replica killed or hung. The same worker faults, rollouts, clock steps and garbage (each key on its
//! slot's master), the same checker, the same reading of every data node's AOF: a job's keys live on
//! one shard, so a claim write that two data nodes hold is its master's and its replica's.
//!
//! Environment:
//! - `REDCRON_CHAOS_SECS`: length of the fault plan (default 75 s on Redis, the whole test 80–90 s;
//!   45 s on etcd, on PostgreSQL, on MariaDB, on a Sentinel group and on a Redis Cluster; 40 s on
//!   ZooKeeper).
//! - `REDCRON_CHAOS_SEED`: the plan's seed (default: drawn from the clock; always printed).
//! - `REDCRON_CHAOS_BREAK`: `split-quorum` or `escape-stop` break the cluster on purpose (see
//!   [`harness::Breakage`]); the test must then fail.
//!
//! Run it long: `REDCRON_CHAOS_SECS=600 cargo test --release --test it chaos -- --nocapture`.
//!
//! Every run saves its material ([`saved`]) in its test directory, which is kept (and printed) when the
//! test fails, or always with `REDCRON_CHAOS_KEEP=1`; `REDCRON_CHAOS_REPLAY=<dir> cargo test --test it chaos::replay -- --ignored --nocapture`
//! runs the checker on it again.

mod checker;
mod claims;
mod contenders;
mod etcd_claims;
mod facts;
mod faults;
mod harness;
mod ledger;
mod misses;
mod plan;
mod probe;
mod proxy;
mod report;
mod saved;
mod selftest;
mod sql_claims;
mod store;
mod timeline;
mod zk_claims;

use std::fmt::Write as _;
use std::time::Instant;

use self::checker::JobSpec;
use self::harness::{now_ms, Breakage, Cluster, GRACE_S, LONG_JOB, LONG_MS};
use self::plan::{Plan, Timing};
use self::saved::Saved;
use self::store::StoreKind;

/// Ticks this long after the workers are up are checked (the most-ahead clock, 3 s, races them 3 s
/// early, and its first claims may still be connecting)…
const WINDOW_START_MS: i64 = 6_000;
/// …up to this long before the shutdown (a tick must have had time to be raced by the latest clock).
const WINDOW_END_MS: i64 = 6_000;

/// A seeded fault plan against 5 nodes and 4 workers: no (job, tick) runs twice, every tick in the
/// window runs unless a fault explains why not, tokens increase, stale writes are rejected, and a
/// paused holder's late write is fenced off.
#[test]
fn exactly_once_under_faults() {
    run_under_faults(StoreKind::Redis, 75, "chaos::exactly_once_under_faults");
}

/// The same on a 3-member etcd cluster, with member and leader kills and hangs instead of the Redis
/// nodes' faults, and the same checker; shorter by default (45 s: the stale-write case, and a rollout
/// for some seeds; from 50 s on the lease-loss case too).
#[test]
fn etcd_exactly_once_under_faults() {
    run_under_faults(StoreKind::Etcd, 45, "chaos::etcd_exactly_once_under_faults");
}

/// The same on one PostgreSQL server, with server kills (restarted on the same data) and hangs
/// (shorter and longer than `node_timeout`) instead of the Redis nodes' faults, garbage planted with SQL,
/// and the same checker; 45 s by default (about 55 s in all, to run in CI): the stale-write case, and a
/// rollout for some seeds, as on etcd.
#[test]
fn postgres_exactly_once_under_faults() {
    run_under_faults(
        StoreKind::Postgres,
        45,
        "chaos::postgres_exactly_once_under_faults",
    );
}

/// [`postgres_exactly_once_under_faults`] on one MariaDB server (the SQL store's `mysql` dialect).
#[test]
fn mariadb_exactly_once_under_faults() {
    run_under_faults(
        StoreKind::Mariadb,
        45,
        "chaos::mariadb_exactly_once_under_faults",
    );
}

/// The same on a 3-member ZooKeeper ensemble: member and leader kills and hangs as on etcd, the same
/// worker faults and checker; 40 s by default (about 50 s in all): the stale-write case, and a rollout
/// for some seeds.
#[test]
fn zookeeper_exactly_once_under_faults() {
    run_under_faults(
        StoreKind::Zookeeper,
        40,
        "chaos::zookeeper_exactly_once_under_faults",
    );
}

/// The same on one Sentinel group (a master, 2 replicas, 3 Sentinels, `min_replicas_acked: all`) as the
/// store's one node: the master killed, hung past `down-after-milliseconds` and failed over, a replica
/// killed and hung, one at a time, instead of the Redis nodes' faults; the same worker faults and
/// checker; 45 s by default (about 60 s in all, to run in CI): the stale-write case, and a rollout for
/// some seeds.
#[test]
fn sentinel_exactly_once_under_faults() {
    run_under_faults(
        StoreKind::RedisSentinel,
        45,
        "chaos::sentinel_exactly_once_under_faults",
    );
}

/// The same on a Redis Cluster (3 masters with a replica each, `min_replicas_acked: all`) as the
/// store's one node: a shard's master killed, hung and failed over, a replica killed and hung, one at a
/// time; the same worker faults and checker; 45 s by default, as on a Sentinel group.
#[test]
fn cluster_exactly_once_under_faults() {
    run_under_faults(
        StoreKind::RedisCluster,
        45,
        "chaos::cluster_exactly_once_under_faults",
    );
}

/// Generates a plan for `store` (`default_secs` long unless `REDCRON_CHAOS_SECS` says), carries it out,
/// checks the run and fails the test `name` if it broke a promise.
fn run_under_faults(store: StoreKind, default_secs: u64, name: &str) {
    let _heavy = crate::support::heavy();
    let secs: u64 = env_number("REDCRON_CHAOS_SECS").unwrap_or(default_secs);
    let seed: u64 = env_number("REDCRON_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let breakage = std::env::var("REDCRON_CHAOS_BREAK").ok().map(|text| {
        Breakage::parse(&text).unwrap_or_else(|| {
            panic!("REDCRON_CHAOS_BREAK={text:?}: expected split-quorum or escape-stop")
        })
    });
    let reproduce = format!(
        "REDCRON_CHAOS_SEED={seed} REDCRON_CHAOS_SECS={secs} cargo test --test it {name} -- --exact --nocapture"
    );
    let plan = Plan::generate(
        seed,
        secs,
        Timing {
            ttl_ms: store.ttl_ms(),
            long_ms: LONG_MS,
        },
        store,
    );
    println!("chaos: seed {seed}; reproduce with: {reproduce}");
    if let Some(breakage) = breakage {
        println!("chaos: the cluster is broken on purpose ({breakage:?}); this run must fail");
    }
    print!("{plan}");

    let begun = Instant::now();
    let mut cluster = Cluster::start(&plan, breakage);
    let setup = begun.elapsed();
    cluster.execute(&plan);
    let stop_ms = now_ms();
    let shutting = Instant::now();
    cluster.shut_down();
    let shutdown = shutting.elapsed();

    let saved = Saved {
        store,
        window: (
            cluster.started_ms + WINDOW_START_MS,
            stop_ms - WINDOW_END_MS,
        ),
        planned_cases: plan.episodes.iter().filter_map(|e| e.case).collect(),
        timeline: cluster.timeline.clone(),
        logs: cluster.logs(),
        ledger: cluster
            .ledger
            .attempts()
            .unwrap_or_else(|e| panic!("unreadable ledger: {e}")),
        claims: cluster.claim_writes(),
    };
    let (window, attempts) = (saved.window, &saved.ledger);
    let checking = Instant::now();
    let mut report = saved.check();
    report
        .failures
        .extend(cluster.unplanned_exits.iter().cloned());
    report.failures.extend(cluster.slow_exits.iter().cloned());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "chaos: {store:?}, seed {seed}, {secs} s plan; window {} .. {} UTC; faults: {}",
        report::show_time(window.0),
        report::show_time(window.1),
        plan.summary()
    );
    let skipped = cluster
        .timeline
        .entries
        .iter()
        .filter(|(_, h)| matches!(h, timeline::Happening::Skipped { .. }))
        .count();
    let proxy = cluster.proxy.as_ref().map_or("none".to_string(), |proxy| {
        let stats = proxy.stats();
        format!(
            "{} connections, {} dropped, {} chunks delayed",
            stats.connections.load(std::sync::atomic::Ordering::Relaxed),
            stats.dropped.load(std::sync::atomic::Ordering::Relaxed),
            stats
                .delayed_chunks
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    });
    let _ = writeln!(
        out,
        "faults skipped at run time (no target): {skipped}; proxy: {proxy}; ledger: {} writes",
        attempts.len()
    );
    let _ = writeln!(
        out,
        "clock offsets seen in the logs: {}",
        cluster.observed_offsets().join("; ")
    );
    let worst = cluster
        .stalls
        .iter()
        .map(|s| s.to - s.from)
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "probe: {} node stalls (slower than 50 ms on Redis, 100 ms on etcd, a write over 100 ms on ZooKeeper, a commit over 150 ms on SQL, \
         a write with WAIT over 100 ms or unacknowledged on a Sentinel group or any shard of a Redis Cluster; longest {worst} ms); the nodes' own latency monitor \
         (latest/max): {}",
        cluster.stalls.len(),
        cluster.node_stalls().join("; ")
    );
    let _ = write!(out, "{report}");
    let _ = writeln!(
        out,
        "timings: setup {:.1} s, plan {secs} s, shutdown {:.1} s, check {:.2} s, total {:.1} s",
        setup.as_secs_f64(),
        shutdown.as_secs_f64(),
        checking.elapsed().as_secs_f64(),
        begun.elapsed().as_secs_f64()
    );
    print!("{out}");
    if let Err(e) = saved.write(cluster.dir.path(), &out) {
        println!(
            "chaos: could not save the run in {}: {e}",
            cluster.dir.path().display()
        );
    }
    if std::env::var_os("REDCRON_CHAOS_KEEP").is_some() {
        println!(
            "chaos: keeping the run's files in {}",
            cluster.dir.keep().display()
        );
    }
    if !report.passed() {
        let stderr = cluster.stderr_of_all();
        let kept = cluster.dir.keep().to_owned();
        // The cluster is stopped before the panic, not by it: a worker dropped while the test panics
        // dumps its last 200 lines (the saved run holds them all), and CI keeps only the tail of a
        // failed run's output — where the verdict must be.
        drop(cluster);
        panic!(
            "{stderr}\nthe chaos run broke redcron's promises ({store:?}, seed {seed}):\n  * {}\n\
             the run is saved in {} (replay its check with REDCRON_CHAOS_REPLAY=<dir> cargo test --test it chaos::replay -- --ignored --nocapture);\n\
             reproduce with: {reproduce}",
            report.failures.join("\n  * "),
            kept.display()
        );
    }
}

/// Re-runs the checker on a run saved by `exactly_once_under_faults` (its directory is kept when it
/// fails, and printed): `REDCRON_CHAOS_REPLAY=<dir> cargo test --test it chaos::replay -- --ignored
/// --nocapture`.
#[test]
#[ignore = "needs REDCRON_CHAOS_REPLAY=<directory of a saved chaos run>"]
fn replay_a_saved_run() {
    let dir = std::env::var("REDCRON_CHAOS_REPLAY")
        .expect("set REDCRON_CHAOS_REPLAY to a saved run's directory");
    let saved = Saved::read(std::path::Path::new(&dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let report = saved.check();
    print!("{report}");
    assert!(
        report.passed(),
        "the saved run in {dir} breaks the checker's rules"
    );
}

/// The jobs of the cluster under test (see `harness::config`): `quick` and `parallel` swap their
/// `overlap` between the two config versions.
fn jobs() -> Vec<JobSpec> {
    vec![
        job("quick", [true, false], false),
        job("parallel", [false, true], false),
        job(LONG_JOB, [true, true], true),
    ]
}

fn job(name: &str, skip: [bool; plan::VERSIONS], long: bool) -> JobSpec {
    JobSpec {
        name: name.to_string(),
        skip,
        period_ms: 1_000,
        grace_ms: GRACE_S as i64 * 1000,
        long,
    }
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}
