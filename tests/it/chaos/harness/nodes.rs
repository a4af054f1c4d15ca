//! The store's processes as the executor breaks them: 5 Redis lock nodes, 3 etcd or ZooKeeper members,
//! one SQL server, the 3 data nodes of a Sentinel group, or the 6 data nodes of a Redis Cluster, each
//! killed and restarted, hung and continued by its index, whichever store the run is on.
//!
//! What only one store has stays visible as such: the Redis nodes' append-only files and latency
//! monitor ([`Nodes::redis`]), the etcd cluster's or the ZooKeeper ensemble's leader ([`Nodes::leader`],
//! a Sentinel group's master or a cluster's masters, [`Nodes::master_for`]), a group's or a cluster's
//! replicas ([`Nodes::replicas`]) and whether it serves ([`Nodes::serving`]).

use testkit::sharded::ShardedRedis;
use testkit::{SqlServer, ZkEnsemble};

use crate::chaos::store::GROUP_ACKS;
use crate::support::{EtcdCluster, RedisCluster, SentinelGroup};

/// The store's nodes (Redis), members (etcd), server (SQL: node 0, the only one), a Sentinel group's
/// data nodes (its Sentinels are never faulted) or a Redis Cluster's.
pub enum Nodes {
    Redis(RedisCluster),
    Etcd(EtcdCluster),
    Sql(SqlServer),
    Zookeeper(ZkEnsemble),
    /// Boxed: a group is large next to the others.
    Sentinel(Box<SentinelGroup>),
    /// A Redis Cluster: its masters and replicas, faulted one at a time.
    Sharded(ShardedRedis),
}

impl Nodes {
    pub fn len(&self) -> usize {
        match self {
            Nodes::Redis(nodes) => nodes.len(),
            Nodes::Etcd(members) => members.len(),
            Nodes::Zookeeper(members) => members.len(),
            Nodes::Sql(_) => 1,
            Nodes::Sentinel(group) => group.data.len(),
            Nodes::Sharded(cluster) => cluster.len(),
        }
    }

    /// SIGKILL node `i`; it refuses connections until [`Nodes::restart`].
    pub fn kill(&mut self, i: usize) {
        match self {
            Nodes::Redis(nodes) => nodes.kill(i),
            Nodes::Etcd(members) => members.kill(i),
            Nodes::Zookeeper(members) => members.kill(i),
            Nodes::Sql(server) => server.kill(),
            Nodes::Sentinel(group) => group.data.kill(i),
            Nodes::Sharded(cluster) => cluster.nodes_mut().kill(i),
        }
    }

    /// Starts node `i` again on its port and data (a Redis node reloads its append-only file, an etcd
    /// or ZooKeeper member rejoins and catches up from the leader, a group's data node comes back with
    /// the role its config file says, as [`SentinelGroup::restart`] does; a cluster's, on its data and
    /// its `nodes.conf`: an old master comes back and learns it was replaced).
    pub fn restart(&mut self, i: usize) {
        match self {
            Nodes::Redis(nodes) => nodes.restart(i),
            Nodes::Etcd(members) => members.restart(i),
            Nodes::Zookeeper(members) => members.restart(i),
            Nodes::Sql(server) => server.restart(),
            Nodes::Sentinel(group) => group.restart(i),
            Nodes::Sharded(cluster) => cluster.nodes_mut().restart(i),
        }
    }

    /// SIGSTOP node `i`.
    pub fn stop(&mut self, i: usize) {
        match self {
            Nodes::Redis(nodes) => nodes.stop(i),
            Nodes::Etcd(members) => members.stop(i),
            Nodes::Zookeeper(members) => members.stop(i),
            Nodes::Sql(server) => server.stop(),
            Nodes::Sentinel(group) => group.data.stop(i),
            Nodes::Sharded(cluster) => cluster.nodes_mut().stop(i),
        }
    }

    /// SIGCONT node `i`.
    pub fn cont(&mut self, i: usize) {
        match self {
            Nodes::Redis(nodes) => nodes.cont(i),
            Nodes::Etcd(members) => members.cont(i),
            Nodes::Zookeeper(members) => members.cont(i),
            Nodes::Sql(server) => server.cont(),
            Nodes::Sentinel(group) => group.data.cont(i),
            Nodes::Sharded(cluster) => cluster.nodes_mut().cont(i),
        }
    }

    /// Whether node `i` runs and is not hung.
    pub fn is_serving(&self, i: usize) -> bool {
        match self {
            Nodes::Redis(nodes) => nodes.is_serving(i),
            Nodes::Etcd(members) => members.is_serving(i),
            Nodes::Zookeeper(members) => members.is_serving(i),
            Nodes::Sql(server) => server.is_serving(),
            Nodes::Sentinel(group) => group.data.is_serving(i),
            Nodes::Sharded(cluster) => cluster.nodes().is_serving(i),
        }
    }

    /// The etcd or ZooKeeper member that leads now (`None` during an election, and on Redis, which has
    /// no leader), or the data node every Sentinel of a group names its master and that says it is one.
    pub fn leader(&self) -> Option<usize> {
        match self {
            Nodes::Redis(_) | Nodes::Sql(_) | Nodes::Sharded(_) => None,
            Nodes::Etcd(members) => members.current_leader(),
            Nodes::Zookeeper(members) => members.leader(),
            Nodes::Sentinel(group) => group.master(),
        }
    }

    /// The master a group fault drawn `index`-th hits: a Sentinel group's one master, or one of a
    /// Redis Cluster's by turns (`None` while a group fails over, or while a cluster does not serve:
    /// one fault at a time).
    pub fn master_for(&self, index: usize) -> Option<usize> {
        match self {
            Nodes::Sharded(cluster) => {
                let shards = cluster.serving()?;
                Some(shards[index % shards.len()].0)
            }
            _ => self.leader(),
        }
    }

    /// The replicas a Sentinel group's master streams to now (empty without a master), or every
    /// replica a cluster's masters stream to; empty on the other stores.
    pub fn replicas(&self) -> Vec<usize> {
        match self {
            Nodes::Sentinel(group) => group
                .master()
                .and_then(|master| group.online_replicas(master))
                .unwrap_or_default(),
            Nodes::Sharded(cluster) => cluster
                .masters()
                .into_iter()
                .filter_map(|(master, _)| cluster.nodes().online_replicas(master))
                .flatten()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Each shard's master and its replicas, if the group serves writes that count (see
    /// [`SentinelGroup::serving`]; a Sentinel group is one shard) — as `min_replicas_acked: all` waits
    /// for, when every data node that runs (not hung) streams from a master; `None` on the other
    /// stores. A Redis Cluster serves when [`ShardedRedis::serving`] says so.
    pub fn serving(&self) -> Option<Vec<(usize, Vec<usize>)>> {
        let group = match self {
            Nodes::Sentinel(group) => group,
            Nodes::Sharded(cluster) => return cluster.serving(),
            _ => return None,
        };
        let master = group.serving(GROUP_ACKS)?;
        let replicas = group.online_replicas(master).unwrap_or_default();
        let all = (0..group.data.len())
            .filter(|&node| node != master && group.data.is_serving(node))
            .all(|node| replicas.contains(&node));
        all.then_some(vec![(master, replicas)])
    }

    /// The port the probe asks node `i` on: the Redis port, or the member's client port.
    pub fn probe_port(&self, i: usize) -> u16 {
        match self {
            Nodes::Redis(nodes) => nodes.port(i),
            Nodes::Etcd(members) => members.client_port(i),
            Nodes::Zookeeper(members) => members.client_port(i),
            Nodes::Sql(server) => server.port(),
            Nodes::Sentinel(group) => group.data.port(i),
            Nodes::Sharded(cluster) => cluster.nodes().port(i),
        }
    }

    /// Whether these are a Sentinel group's data nodes or a Redis Cluster's (the group, or the cluster,
    /// is one node of the majority).
    pub fn is_group(&self) -> bool {
        matches!(self, Nodes::Sentinel(_) | Nodes::Sharded(_))
    }

    /// The Redis nodes, on a Redis run; a Sentinel group's or a Redis Cluster's data nodes.
    pub fn redis(&self) -> Option<&RedisCluster> {
        match self {
            Nodes::Redis(nodes) => Some(nodes),
            Nodes::Sentinel(group) => Some(&group.data),
            Nodes::Sharded(cluster) => Some(cluster.nodes()),
            Nodes::Etcd(_) | Nodes::Sql(_) | Nodes::Zookeeper(_) => None,
        }
    }
}
