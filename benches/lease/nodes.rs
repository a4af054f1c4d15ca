//! The store nodes a benchmark item runs against: the shared harness's [`Cluster`] (`testkit`, the same
//! the tests start), and what only the benchmark reads of them — each node's own command and CPU counters
//! ([`Counters`]). Redis nodes run without persistence (`--save "" --appendonly no`): the lease table is
//! in memory, and fsync would measure the disk, not the lock. etcd members cannot run without their log:
//! every write is a Raft commit, fsynced on a majority before it answers, which is part of what the etcd
//! store costs. Every node is killed when its [`Cluster`] is dropped, and with the benchmark if it is
//! killed.

use std::collections::BTreeMap;

pub use testkit::{Backend, Cluster};

/// A node's own counters, read before and after a measured window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Redis: commands the node executed (all kinds). etcd: Raft entries the member committed
    /// (`etcd_server_proposals_committed_total`), the same entries on every member. ZooKeeper: the
    /// transactions the member applied (the counter of its last zxid), the same on every member.
    pub commands: u64,
    /// CPU seconds the node spent (user + system).
    pub cpu: f64,
}

impl Usage {
    /// What happened between `self` (before) and `after`.
    pub fn until(self, after: Usage) -> Usage {
        Usage {
            commands: after.commands.saturating_sub(self.commands),
            cpu: (after.cpu - self.cpu).max(0.0),
        }
    }
}

/// What the benchmark reads of a node beyond what the tests do: its own counters.
pub trait Counters {
    /// Node `i`'s own counters.
    fn usage(&self, i: usize) -> Usage;
    /// The counters of every node.
    fn total_usage(&self) -> Usage;
    /// Redis: calls per command name (`INFO commandstats`, without `info`), summed over the nodes; empty
    /// for other stores.
    fn command_calls(&self) -> BTreeMap<String, u64>;
}

impl Counters for Cluster {
    /// Node `i`'s own counters. Redis: `INFO commandstats` (all calls) and `INFO cpu` (user + sys).
    /// etcd: the member's `/metrics` (Raft entries committed, `process_cpu_seconds_total`); zero if the
    /// member does not answer. ZooKeeper: `srvr`'s zxid and the member's JVM's CPU from `/proc`.
    fn usage(&self, i: usize) -> Usage {
        match self {
            Cluster::Sentinel(group) => redis_usage(&group.data, group.master().unwrap_or(0)),
            Cluster::Redis(cluster) => redis_usage(cluster, i),
            Cluster::Sharded(sharded) => redis_usage(sharded.nodes(), i),
            Cluster::SharedSharded(shared) => redis_usage(shared.cluster().nodes(), i),
            Cluster::Etcd(cluster) => {
                let text = cluster.metrics(i).unwrap_or_default();
                let metric = |name: &str| -> f64 {
                    text.lines()
                        .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                        .filter_map(|value| value.trim().parse::<f64>().ok())
                        .sum()
                };
                Usage {
                    commands: metric("etcd_server_proposals_committed_total") as u64,
                    cpu: metric("process_cpu_seconds_total"),
                }
            }
            Cluster::Zookeeper(ensemble) => zookeeper_usage(ensemble, i),
            Cluster::SharedZookeeper(shared) => zookeeper_usage(shared.ensemble(), i),
            Cluster::Embedded(_) => Usage::default(),
            Cluster::Sql(server) => sql_usage(server),
        }
    }

    /// The counters of every node: CPU summed; Redis commands summed (each node runs its own; on a Redis
    /// Cluster, over its masters), etcd commits of the member that committed most (every member commits
    /// the same entries).
    fn total_usage(&self) -> Usage {
        // A Redis Cluster is the store's one node; its masters answer the claims (a replica's commands
        // are its master's, replicated).
        let sharded = match self {
            Cluster::Sharded(sharded) => Some(&**sharded),
            Cluster::SharedSharded(shared) => Some(shared.cluster()),
            _ => None,
        };
        if let Some(sharded) = sharded {
            let masters = sharded.masters().into_iter();
            return masters.fold(Usage::default(), |sum, (i, _)| {
                let usage = redis_usage(sharded.nodes(), i);
                Usage {
                    commands: sum.commands + usage.commands,
                    cpu: sum.cpu + usage.cpu,
                }
            });
        }
        let usages = (0..self.len()).map(|i| self.usage(i));
        let cpu = usages.clone().map(|u| u.cpu).sum();
        let commands = match self {
            Cluster::Redis(_)
            | Cluster::Sentinel(_)
            | Cluster::Sharded(_)
            | Cluster::SharedSharded(_) => usages.map(|u| u.commands).sum(),
            Cluster::Etcd(_) | Cluster::Zookeeper(_) | Cluster::SharedZookeeper(_) => {
                usages.map(|u| u.commands).max().unwrap_or(0)
            }
            Cluster::Embedded(_) => 0,
            Cluster::Sql(_) => usages.map(|u| u.commands).sum(),
        };
        Usage { commands, cpu }
    }

    fn command_calls(&self) -> BTreeMap<String, u64> {
        let mut calls = BTreeMap::new();
        let Cluster::Redis(cluster) = self else {
            return calls;
        };
        for i in 0..cluster.len() {
            let info: String = cluster.query(i, redis::cmd("INFO").arg("commandstats"));
            for line in info.lines() {
                // `cmdstat_<name>:calls=<n>,…`
                let Some((name, rest)) = line
                    .strip_prefix("cmdstat_")
                    .and_then(|l| l.split_once(':'))
                else {
                    continue;
                };
                let count = rest
                    .strip_prefix("calls=")
                    .and_then(|r| r.split(',').next())
                    .and_then(|n| n.parse::<u64>().ok());
                if let (Some(count), false) = (count, name == "info") {
                    *calls.entry(name.to_string()).or_insert(0) += count;
                }
            }
        }
        calls
    }
}

/// A SQL server's own counters: statements run (MariaDB's `Questions`; PostgreSQL counts transactions,
/// `xact_commit + xact_rollback`, each statement outside a transaction being one), and the CPU time of its
/// processes (the server and, on PostgreSQL, its backends) from `/proc`.
fn sql_usage(server: &testkit::SqlServer) -> Usage {
    let commands = match server.kind() {
        testkit::SqlKind::Mariadb => server.exec("SHOW GLOBAL STATUS LIKE 'Questions'"),
        testkit::SqlKind::Postgres => {
            server.exec("SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database")
        }
    };
    let commands = commands
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let cpu = server.pids().iter().map(|&pid| process_cpu(pid)).sum();
    Usage { commands, cpu }
}

/// A ZooKeeper member's counters: the transactions it applied — the counter of its last zxid (`srvr`;
/// the low 32 bits, which restart at an election, and none happens in a measured window) — and its
/// JVM's CPU time.
fn zookeeper_usage(ensemble: &testkit::ZkEnsemble, i: usize) -> Usage {
    let commands = ensemble
        .srvr(i)
        .as_deref()
        .and_then(|answer| answer.lines().find_map(|l| l.strip_prefix("Zxid: 0x")))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .map_or(0, |zxid| zxid & 0xffff_ffff);
    let cpu = ensemble.pid(i).map_or(0.0, process_cpu);
    Usage { commands, cpu }
}

/// The CPU time (user + system, seconds) process `pid` spent, from `/proc`; 0 if it is gone.
fn process_cpu(pid: u32) -> f64 {
    let ticks_per_second = 100.0;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces) in parentheses: utime is the 12th, stime the 13th.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |k: usize| {
        fields
            .get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(11) + field(12)) / ticks_per_second
}

/// A Redis server's own counters: `INFO commandstats` (all calls) and `INFO cpu` (user + sys).
fn redis_usage(cluster: &testkit::RedisCluster, i: usize) -> Usage {
    let info = |section: &str| -> String { cluster.query(i, redis::cmd("INFO").arg(section)) };
    let commands = info("commandstats")
        .lines()
        // The benchmark's own INFO calls are not the load it measures.
        .filter(|line| !line.starts_with("cmdstat_info:"))
        .filter_map(|line| line.split_once("calls=")?.1.split(',').next())
        .filter_map(|calls| calls.parse::<u64>().ok())
        .sum();
    let cpu = info("cpu")
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_sys" || *k == "used_cpu_user")
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum();
    Usage { commands, cpu }
}
