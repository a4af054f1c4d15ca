//! Which store the chaos cluster runs on, and what follows from that choice: how many nodes (Redis lock
//! nodes, etcd or ZooKeeper members, the one SQL server, the one Sentinel group or the one Redis Cluster), the lease timing the workers are configured with, and how long a lease whose
//! holder stopped renewing may still hold its key.
//!
//! The plan, the harness and the miss rules ask this instead of assuming Redis; the safety rules of the
//! checker (duplicates, token order, fencing, the deterministic cases) do not depend on it at all.

/// The store under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StoreKind {
    /// 5 `redis-server` lock nodes (append-only, fsync always), one behind the proxy.
    Redis,
    /// A 3-member etcd cluster.
    Etcd,
    /// One PostgreSQL server (the SQL store's `postgres` dialect).
    Postgres,
    /// One MariaDB server (the SQL store's `mysql` dialect).
    Mariadb,
    /// A 3-member ZooKeeper ensemble.
    Zookeeper,
    /// One Sentinel-managed group as the Redis store's one node: a master and 2 replicas (append-only,
    /// fsync always), 3 Sentinels, `min_replicas_acked: all` (the default).
    RedisSentinel,
    /// A Redis Cluster as the Redis store's one node: 3 masters with a replica each (append-only, fsync
    /// always), `min_replicas_acked: all` (the default).
    RedisCluster,
}

/// The data nodes of a Sentinel group: a master and its replicas.
pub const GROUP_DATA_NODES: usize = 3;
/// How many replicas at least have a group's write that counted: with `min_replicas_acked: all`, every
/// replica the Sentinels know as up, which is at least one.
pub const GROUP_ACKS: usize = 1;

impl StoreKind {
    /// Lock nodes, or etcd or ZooKeeper members: what a majority is counted of (a Sentinel group is one
    /// node, whatever its data nodes).
    pub fn nodes(self) -> usize {
        match self {
            StoreKind::Redis => super::plan::NODES,
            StoreKind::Etcd | StoreKind::Zookeeper => 3,
            StoreKind::Postgres
            | StoreKind::Mariadb
            | StoreKind::RedisSentinel
            | StoreKind::RedisCluster => 1,
        }
    }

    /// Whether the store is one node made of data nodes, a Sentinel group or a Redis Cluster: its node
    /// faults are a master's kill, hang and planned failover, and a replica's kill and hang, one at a
    /// time.
    pub fn is_group(self) -> bool {
        matches!(self, StoreKind::RedisSentinel | StoreKind::RedisCluster)
    }

    /// The test server of a SQL store.
    pub fn sql_kind(self) -> Option<testkit::SqlKind> {
        match self {
            StoreKind::Postgres => Some(testkit::SqlKind::Postgres),
            StoreKind::Mariadb => Some(testkit::SqlKind::Mariadb),
            StoreKind::Redis
            | StoreKind::Etcd
            | StoreKind::Zookeeper
            | StoreKind::RedisSentinel
            | StoreKind::RedisCluster => None,
        }
    }

    /// Whether the store is an ensemble of members with a leader (etcd, ZooKeeper): its node faults are
    /// member kills and hangs, of a given member or of the leader, one at a time.
    pub fn has_leader(self) -> bool {
        matches!(self, StoreKind::Etcd | StoreKind::Zookeeper)
    }

    /// How many of [`Self::nodes`] a plan may take down at once: a minority — except on a SQL store,
    /// whose single server is the only thing to kill or hang: the store is then out of reach as a whole
    /// (which the checker reads as no majority, so such a fault explains misses and nothing else); and
    /// on a Sentinel group, one fault of one data node at a time (the master's takes the group out of
    /// reach until a new master answers; a replica's leaves the other to acknowledge); on a Redis
    /// Cluster the same, one data node of one shard at a time.
    pub fn max_node_faults(self) -> usize {
        match self {
            StoreKind::Postgres
            | StoreKind::Mariadb
            | StoreKind::RedisSentinel
            | StoreKind::RedisCluster => 1,
            StoreKind::Redis | StoreKind::Etcd | StoreKind::Zookeeper => (self.nodes() - 1) / 2,
        }
    }

    /// The workers' `lock.ttl`. On a SQL store every claim is a transaction whose commit is an fsync on
    /// a server sharing the 2-core machine with the workers: etcd's timing. On etcd a lease lives whole seconds and every claim is a Raft commit (an
    /// fsync on a majority), and `node_timeout` may be at most a tenth of the TTL: 3 s allows 300 ms per
    /// request, several times a commit on a loaded 2-core machine. On ZooKeeper the lease is the session
    /// (its timeout the TTL): 4 s, so that a session whose member was killed or hung has time to move to
    /// another member (the client gives up on a silent one after two thirds of the timeout). On a
    /// Sentinel group every answer waits for a replica's acknowledgement (`WAIT`), its fsync included:
    /// two fsyncs in a row on the shared disk, so etcd's timing too; on a Redis Cluster, the same.
    pub fn ttl_ms(self) -> u64 {
        match self {
            StoreKind::Redis => 2_000,
            StoreKind::Etcd
            | StoreKind::Postgres
            | StoreKind::Mariadb
            | StoreKind::RedisSentinel
            | StoreKind::RedisCluster => 3_000,
            StoreKind::Zookeeper => 4_000,
        }
    }

    /// The workers' `lock.renew_every`.
    pub fn renew_ms(self) -> u64 {
        match self {
            StoreKind::Redis => 600,
            StoreKind::Etcd
            | StoreKind::Postgres
            | StoreKind::Mariadb
            | StoreKind::Zookeeper
            | StoreKind::RedisSentinel
            | StoreKind::RedisCluster => 1_000,
        }
    }

    /// The workers' `lock.node_timeout`.
    pub fn node_timeout_ms(self) -> u64 {
        self.ttl_ms() / 10
    }

    /// How long after its holder's last renewal a lease of `ttl_ms` may still hold its key, as the miss
    /// rules count it. Redis expires the key at its TTL (the rules add their own margins). etcd expires
    /// the lease on the leader at its TTL in whole seconds, finds it in its next expiry check (every
    /// 500 ms) and deletes the key by a revoke that is itself a Raft commit: the test support's bound for
    /// that, [`crate::support::Backend::expiry`]. A SQL server's lease ends a TTL after the claim or
    /// renewal on its own clock, and the next claim reads that: as on Redis. ZooKeeper ends a lease with
    /// its session, a session timeout after the session's last contact, found by the leader's next
    /// expiry check and closed by a commit: [`crate::support::Backend::expiry`]. A Sentinel group's
    /// master, and a Redis Cluster's, expires the key at its TTL, as a Redis node does.
    pub fn lease_hold_ms(self, ttl_ms: i64) -> i64 {
        match self {
            StoreKind::Redis
            | StoreKind::Postgres
            | StoreKind::Mariadb
            | StoreKind::RedisSentinel
            | StoreKind::RedisCluster => ttl_ms,
            StoreKind::Etcd => crate::support::Backend::Etcd
                .expiry(std::time::Duration::from_millis(ttl_ms.max(0) as u64))
                .as_millis() as i64,
            StoreKind::Zookeeper => crate::support::Backend::Zookeeper
                .expiry(std::time::Duration::from_millis(ttl_ms.max(0) as u64))
                .as_millis() as i64,
        }
    }
}
