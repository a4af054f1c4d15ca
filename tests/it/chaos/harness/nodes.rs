//! The store's processes as the executor breaks them: 5 Redis lock nodes, 3 etcd or ZooKeeper members,
//! or one SQL server, each killed
//! and restarted, hung and continued by its index, whichever store the run is on.
//!
//! What only one store has stays visible as such: the Redis nodes' append-only files and latency
//! monitor ([`Nodes::redis`]), the etcd cluster's or the ZooKeeper ensemble's leader ([`Nodes::leader`]).

use testkit::{SqlServer, ZkEnsemble};

use crate::support::{EtcdCluster, RedisCluster};

/// The store's nodes (Redis), members (etcd) or server (SQL: node 0, the only one).
pub enum Nodes {
    Redis(RedisCluster),
    Etcd(EtcdCluster),
    Sql(SqlServer),
    Zookeeper(ZkEnsemble),
}

impl Nodes {
    pub fn len(&self) -> usize {
        match self {
            Nodes::Redis(nodes) => nodes.len(),
            Nodes::Etcd(members) => members.len(),
            Nodes::Zookeeper(members) => members.len(),
            Nodes::Sql(_) => 1,
        }
    }

    /// SIGKILL node `i`; it refuses connections until [`Nodes::restart`].
    pub fn kill(&mut self, i: usize) {
        match self {
            Nodes::Redis(nodes) => nodes.kill(i),
            Nodes::Etcd(members) => members.kill(i),
            Nodes::Zookeeper(members) => members.kill(i),
            Nodes::Sql(server) => server.kill(),
        }
    }

    /// Starts node `i` again on its port and data (a Redis node reloads its append-only file, an etcd
    /// or ZooKeeper member rejoins and catches up from the leader).
    pub fn restart(&mut self, i: usize) {
        match self {
            Nodes::Redis(nodes) => nodes.restart(i),
            Nodes::Etcd(members) => members.restart(i),
            Nodes::Zookeeper(members) => members.restart(i),
            Nodes::Sql(server) => server.restart(),
        }
    }

    /// SIGSTOP node `i`.
    pub fn stop(&mut self, i: usize) {
        match self {
            Nodes::Redis(nodes) => nodes.stop(i),
            Nodes::Etcd(members) => members.stop(i),
            Nodes::Zookeeper(members) => members.stop(i),
            Nodes::Sql(server) => server.stop(),
        }
    }

    /// SIGCONT node `i`.
    pub fn cont(&mut self, i: usize) {
        match self {
            Nodes::Redis(nodes) => nodes.cont(i),
            Nodes::Etcd(members) => members.cont(i),
            Nodes::Zookeeper(members) => members.cont(i),
            Nodes::Sql(server) => server.cont(),
        }
    }

    /// Whether node `i` runs and is not hung.
    pub fn is_serving(&self, i: usize) -> bool {
        match self {
            Nodes::Redis(nodes) => nodes.is_serving(i),
            Nodes::Etcd(members) => members.is_serving(i),
            Nodes::Zookeeper(members) => members.is_serving(i),
            Nodes::Sql(server) => server.is_serving(),
        }
    }

    /// The etcd or ZooKeeper member that leads now (`None` during an election, and on Redis, which has
    /// no leader).
    pub fn leader(&self) -> Option<usize> {
        match self {
            Nodes::Redis(_) | Nodes::Sql(_) => None,
            Nodes::Etcd(members) => members.current_leader(),
            Nodes::Zookeeper(members) => members.leader(),
        }
    }

    /// The port the probe asks node `i` on: the Redis port, or the member's client port.
    pub fn probe_port(&self, i: usize) -> u16 {
        match self {
            Nodes::Redis(nodes) => nodes.port(i),
            Nodes::Etcd(members) => members.client_port(i),
            Nodes::Zookeeper(members) => members.client_port(i),
            Nodes::Sql(server) => server.port(),
        }
    }

    /// The Redis nodes, on a Redis run.
    pub fn redis(&self) -> Option<&RedisCluster> {
        match self {
            Nodes::Redis(nodes) => Some(nodes),
            Nodes::Etcd(_) | Nodes::Sql(_) | Nodes::Zookeeper(_) => None,
        }
    }
}
