//! The store nodes a benchmark item runs against, started through the shared harness (`testkit`).
//!
//! Only Redis today: [`Store`] names the kind of node and [`Nodes`] is what the items see of them — their
//! URLs for a `jobs.yaml`, their ports for a proxy, their pids for CPU figures, their own command and CPU
//! counters, and a way to hang one. A second store (etcd) becomes one more variant here, with its own
//! answers to those questions; the items do not change. Nodes run without persistence
//! (`--save "" --appendonly no`): the lease table is in memory, and fsync would measure the disk, not
//! the lock. Every node is killed when [`Nodes`] is dropped, and with the benchmark if it is killed.

use testkit::RedisCluster;

/// Which store the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Redis,
}

/// N local nodes of one store, killed on drop.
pub enum Nodes {
    Redis(RedisCluster),
}

/// A node's own counters, read before and after a measured window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Commands the node executed (all kinds).
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
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Nodes::Redis(cluster) => cluster.len(),
        }
    }

    pub fn port(&self, i: usize) -> u16 {
        match self {
            Nodes::Redis(cluster) => cluster.port(i),
        }
    }

    /// The node's process id (0 if it is not running).
    pub fn pid(&self, i: usize) -> u32 {
        match self {
            Nodes::Redis(cluster) => cluster.pid(i).unwrap_or(0),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        match self {
            Nodes::Redis(cluster) => cluster.urls(),
        }
    }

    /// Hangs node `i` (SIGSTOP): its socket accepts connections and requests, and never answers.
    pub fn hang(&mut self, i: usize) {
        match self {
            Nodes::Redis(cluster) => cluster.stop(i),
        }
    }

    /// Resumes a node hung by [`Nodes::hang`].
    pub fn resume(&mut self, i: usize) {
        match self {
            Nodes::Redis(cluster) => cluster.cont(i),
        }
    }

    /// Empties every node.
    pub fn flush(&self) {
        match self {
            Nodes::Redis(cluster) => (0..cluster.len()).for_each(|i| cluster.flushall(i)),
        }
    }

    /// Node `i`'s own counters: `INFO commandstats` (all calls) and `INFO cpu` (user + sys).
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
        }
    }

    /// The counters of every node, summed.
    pub fn total_usage(&self) -> Usage {
        (0..self.len())
            .map(|i| self.usage(i))
            .fold(Usage::default(), |sum, u| Usage {
                commands: sum.commands + u.commands,
                cpu: sum.cpu + u.cpu,
            })
    }
}
