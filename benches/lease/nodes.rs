//! The store nodes a benchmark item runs against, started through the shared harness (`testkit`).
//!
//! [`Store`] names the kind of node (Redis or etcd) and [`Nodes`] is what the items see of them — their
//! URLs for a `jobs.yaml`, their ports for a proxy, their pids for CPU figures, their own command and CPU
//! counters, a way to hang one, and a redcron store on them. Redis nodes run without persistence
//! (`--save "" --appendonly no`): the lease table is in memory, and fsync would measure the disk, not
//! the lock. etcd members cannot run without their log: every write is a Raft commit, fsynced on a
//! majority before it answers, which is part of what the etcd store costs. Every node is killed when
//! [`Nodes`] is dropped, and with the benchmark if it is killed.

use redcron::config::EtcdConfig;
use redcron::history::HistorySettings;
use redcron::lock::LockSettings;
use redcron::store::etcd::EtcdStore;
use redcron::store::redis::RedisStore;
use testkit::{EtcdCluster, RedisCluster};

/// Which store the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Redis,
    Etcd,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Store::Redis => "Redis",
            Store::Etcd => "etcd",
        }
    }

    /// The `jobs.yaml` section that names nodes at `urls`: `redis: nodes:` or `etcd: endpoints:`.
    pub fn section(self, urls: &[String]) -> String {
        // JSON strings are YAML strings; `$` is doubled because the config expands `${VAR}`.
        let quoted: Vec<String> = urls
            .iter()
            .map(|u| serde_json::to_string(&u.replace('$', "$$")).unwrap_or_default())
            .collect();
        match self {
            Store::Redis => format!("redis:\n  nodes: [{}]\n", quoted.join(", ")),
            Store::Etcd => format!("etcd:\n  endpoints: [{}]\n", quoted.join(", ")),
        }
    }
}

/// N local nodes of one store, killed on drop.
pub enum Nodes {
    Redis(RedisCluster),
    Etcd(EtcdCluster),
}

/// A node's own counters, read before and after a measured window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Redis: commands the node executed (all kinds). etcd: Raft entries the member committed
    /// (`etcd_server_proposals_committed_total`), the same entries on every member.
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

impl Nodes {
    /// Starts `n` nodes of `store` and waits until each answers; panics with a node's log otherwise.
    pub fn start(store: Store, n: usize) -> Nodes {
        match store {
            Store::Redis => Nodes::Redis(RedisCluster::start(n)),
            Store::Etcd => Nodes::Etcd(EtcdCluster::with_members(n)),
        }
    }

    pub fn store(&self) -> Store {
        match self {
            Nodes::Redis(_) => Store::Redis,
            Nodes::Etcd(_) => Store::Etcd,
        }
    }

    /// A redcron store on every node with `settings` (an etcd store with the default history bound).
    pub fn open(&self, settings: LockSettings) -> Result<redcron::store::Store, String> {
        let urls = self.urls();
        Ok(match self {
            Nodes::Redis(_) => redcron::store::Store::Redis(
                RedisStore::new(&urls, settings).map_err(|e| e.to_string())?,
            ),
            Nodes::Etcd(_) => {
                let config = EtcdConfig {
                    endpoints: urls,
                    user: None,
                    trusted_ca_file: None,
                    client_identity: None,
                };
                let store = EtcdStore::new(&config, settings, HistorySettings::default())
                    .map_err(|e| e.to_string())?;
                redcron::store::Store::Etcd(Box::new(store))
            }
        })
    }

    pub fn len(&self) -> usize {
        match self {
            Nodes::Redis(cluster) => cluster.len(),
            Nodes::Etcd(cluster) => cluster.len(),
        }
    }

    pub fn port(&self, i: usize) -> u16 {
        match self {
            Nodes::Redis(cluster) => cluster.port(i),
            Nodes::Etcd(cluster) => cluster.client_port(i),
        }
    }

    /// The node's process id (0 if it is not running).
    pub fn pid(&self, i: usize) -> u32 {
        match self {
            Nodes::Redis(cluster) => cluster.pid(i).unwrap_or(0),
            Nodes::Etcd(cluster) => cluster.pid(i).unwrap_or(0),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        match self {
            Nodes::Redis(cluster) => cluster.urls(),
            Nodes::Etcd(cluster) => cluster.endpoints(),
        }
    }

    /// Hangs node `i` (SIGSTOP): its socket accepts connections and requests, and never answers.
    pub fn hang(&mut self, i: usize) {
        match self {
            Nodes::Redis(cluster) => cluster.stop(i),
            Nodes::Etcd(cluster) => cluster.stop(i),
        }
    }

    /// Resumes a node hung by [`Nodes::hang`].
    pub fn resume(&mut self, i: usize) {
        match self {
            Nodes::Redis(cluster) => cluster.cont(i),
            Nodes::Etcd(cluster) => cluster.cont(i),
        }
    }

    /// Empties every node.
    pub fn flush(&self) {
        match self {
            Nodes::Redis(cluster) => (0..cluster.len()).for_each(|i| cluster.flushall(i)),
            Nodes::Etcd(cluster) => cluster.delete_all(),
        }
    }

    /// Node `i`'s own counters. Redis: `INFO commandstats` (all calls) and `INFO cpu` (user + sys).
    /// etcd: the member's `/metrics` (Raft entries committed, `process_cpu_seconds_total`); zero if the
    /// member does not answer.
    pub fn usage(&self, i: usize) -> Usage {
        match self {
            Nodes::Redis(cluster) => {
                let info =
                    |section: &str| -> String { cluster.query(i, redis::cmd("INFO").arg(section)) };
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
            Nodes::Etcd(cluster) => {
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
        }
    }

    /// The counters of every node: CPU summed; Redis commands summed (each node runs its own), etcd
    /// commits of the member that committed most (every member commits the same entries).
    pub fn total_usage(&self) -> Usage {
        let usages = (0..self.len()).map(|i| self.usage(i));
        let cpu = usages.clone().map(|u| u.cpu).sum();
        let commands = match self {
            Nodes::Redis(_) => usages.map(|u| u.commands).sum(),
            Nodes::Etcd(_) => usages.map(|u| u.commands).max().unwrap_or(0),
        };
        Usage { commands, cpu }
    }
}
