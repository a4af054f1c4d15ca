//! Which store the chaos cluster runs on, and what follows from that choice: how many nodes (Redis lock
//! nodes or etcd members), the lease timing the workers are configured with, and how long a lease whose
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
}

impl StoreKind {
    /// Lock nodes, or etcd members.
    pub fn nodes(self) -> usize {
        match self {
            StoreKind::Redis => super::plan::NODES,
            StoreKind::Etcd => 3,
        }
    }

    /// How many of [`Self::nodes`] a plan may take down at once: a minority.
    pub fn max_node_faults(self) -> usize {
        (self.nodes() - 1) / 2
    }

    /// The workers' `lock.ttl`. On etcd a lease lives whole seconds and every claim is a Raft commit (an
    /// fsync on a majority), and `node_timeout` may be at most a tenth of the TTL: 3 s allows 300 ms per
    /// request, several times a commit on a loaded 2-core machine.
    pub fn ttl_ms(self) -> u64 {
        match self {
            StoreKind::Redis => 2_000,
            StoreKind::Etcd => 3_000,
        }
    }

    /// The workers' `lock.renew_every`.
    pub fn renew_ms(self) -> u64 {
        match self {
            StoreKind::Redis => 600,
            StoreKind::Etcd => 1_000,
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
    /// that, [`crate::support::Backend::expiry`].
    pub fn lease_hold_ms(self, ttl_ms: i64) -> i64 {
        match self {
            StoreKind::Redis => ttl_ms,
            StoreKind::Etcd => crate::support::Backend::Etcd
                .expiry(std::time::Duration::from_millis(ttl_ms.max(0) as u64))
                .as_millis() as i64,
        }
    }
}
