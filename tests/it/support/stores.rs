//! [`Backend`] and [`Cluster`]: one suite of store tests run against every shared store.
//!
//! A parameterised test takes a [`Backend`], starts its [`Cluster`] (5 Redis nodes, or a 3-member etcd
//! cluster) and builds its [`Store`] through [`Cluster::store`]; what differs between the stores —
//! etcd's lease TTLs are whole seconds and its writes are Raft commits, so it needs longer TTLs and
//! timeouts, and it drops an expired lease only at its next expiry check — is answered here, so the
//! tests themselves say the same thing for both. [`on_every_store!`] instantiates each test once per
//! backend (`<module>::redis::<test>`, `<module>::etcd::<test>`).

use std::time::Duration;

use redcron::config::EtcdConfig;
use redcron::history::{Entry, HistorySettings, Query};
use redcron::lock::{ClaimOutcome, ClaimRequest, Lease, LockSettings};
use redcron::store::etcd::EtcdStore;
use redcron::store::redis::RedisStore;
use redcron::store::Store;

use super::{EtcdCluster, RedisCluster};

/// Which store a parameterised test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Redis,
    Etcd,
}

/// A running cluster of one backend, stopped on drop.
pub enum Cluster {
    Redis(RedisCluster),
    Etcd(EtcdCluster),
}

impl Backend {
    /// Starts the backend's cluster: 5 Redis nodes without persistence, or 3 etcd members.
    pub fn start(self) -> Cluster {
        match self {
            Backend::Redis => Cluster::Redis(RedisCluster::start(5)),
            Backend::Etcd => Cluster::Etcd(EtcdCluster::start()),
        }
    }

    /// `settings` as this backend can honour them: etcd leases live whole seconds (at least one, more
    /// with etcd's minimum) and an etcd write waits for an fsync on a majority, so the TTL is at least
    /// 2 s and the node timeout at least a quarter of it (several times a commit on a loaded 2-core
    /// machine, and still well inside the lease).
    pub fn adapt(self, settings: LockSettings) -> LockSettings {
        match self {
            Backend::Redis => settings,
            Backend::Etcd => {
                let ttl = settings.ttl.max(Duration::from_secs(2));
                LockSettings {
                    ttl,
                    renew_every: settings.renew_every.max(ttl / 3),
                    node_timeout: settings.node_timeout.max(ttl / 4),
                    ..settings
                }
            }
        }
    }

    /// How long after its holder's deadline the store surely has dropped a lease of `ttl` that nobody
    /// renewed: on Redis the key's TTL (plus a margin); on etcd the lease's whole seconds, the leader's
    /// expiry check (every 500 ms) and the revoke's commit.
    pub fn expiry(self, ttl: Duration) -> Duration {
        match self {
            Backend::Redis => ttl + Duration::from_millis(100),
            Backend::Etcd => {
                Duration::from_secs(ttl.as_millis().div_ceil(1000) as u64)
                    + Duration::from_millis(1_500)
            }
        }
    }
}

impl Cluster {
    /// A store on this cluster with `settings` (adapted to the backend by [`Backend::adapt`]).
    pub fn store(&self, settings: LockSettings) -> Store {
        store_on(&self.spec(), self.backend().adapt(settings))
    }

    pub fn backend(&self) -> Backend {
        match self {
            Cluster::Redis(_) => Backend::Redis,
            Cluster::Etcd(_) => Backend::Etcd,
        }
    }

    /// `redis|<url>,…` or `etcd|<endpoint>,…`: the cluster for a store built in another process
    /// ([`store_on`]).
    pub fn spec(&self) -> String {
        match self {
            Cluster::Redis(cluster) => format!("redis|{}", cluster.urls().join(",")),
            Cluster::Etcd(cluster) => format!("etcd|{}", cluster.endpoints().join(",")),
        }
    }

    /// A worker's `jobs.yaml` on this cluster: `worker_section` (YAML under `worker:`, already indented)
    /// and `jobs` (YAML list items), with short leases — on etcd as short as its whole-second leases
    /// and Raft commits on a loaded machine allow.
    pub fn config(&self, worker_section: &str, jobs: &str) -> String {
        match self {
            Cluster::Redis(cluster) => crate::worker::config(cluster, worker_section, jobs),
            Cluster::Etcd(cluster) => etcd_config(&cluster.endpoints_yaml(), worker_section, jobs),
        }
    }

    /// How many nodes (or members) the cluster has.
    pub fn len(&self) -> usize {
        match self {
            Cluster::Redis(cluster) => cluster.len(),
            Cluster::Etcd(cluster) => cluster.len(),
        }
    }

    /// Every history entry of `job`, as a CLI reads it from this cluster.
    pub fn history(&self, job: &str) -> Vec<Entry> {
        let query = Query {
            job: job.to_string(),
            since: None,
            until: None,
            limit: 5_000,
        };
        crate::history::runtime().block_on(async {
            let store = self.store(LockSettings::default());
            store
                .history(&query)
                .await
                .expect("the store answers")
                .value
        })
    }

    /// Hangs (SIGSTOP) a majority: Redis nodes 0..N/2+1; on etcd the leader and one more member, so
    /// that the member left cannot answer for the cluster.
    pub fn stop_majority(&mut self) -> Vec<usize> {
        let stopped: Vec<usize> = match self {
            Cluster::Redis(cluster) => (0..cluster.len() / 2 + 1).collect(),
            Cluster::Etcd(cluster) => {
                let leader = cluster.leader();
                vec![leader, (leader + 1) % cluster.len()]
            }
        };
        for &i in &stopped {
            match self {
                Cluster::Redis(cluster) => cluster.stop(i),
                Cluster::Etcd(cluster) => cluster.stop(i),
            }
        }
        stopped
    }

    /// Resumes the nodes or members hung by [`Self::stop_majority`].
    pub fn cont(&mut self, stopped: &[usize]) {
        for &i in stopped {
            match self {
                Cluster::Redis(cluster) => cluster.cont(i),
                Cluster::Etcd(cluster) => cluster.cont(i),
            }
        }
    }
}

/// A worker's `jobs.yaml` on the etcd members `endpoints` (a YAML list): see [`Cluster::config`].
pub fn etcd_config(endpoints: &str, worker_section: &str, jobs: &str) -> String {
    format!(
        "etcd:\n  endpoints: {endpoints}\nlock:\n  ttl: 5s\n  renew_every: 1s\n  node_timeout: 500ms\n  \
         retry_delay: 50ms\nworker:\n{worker_section}jobs:\n{jobs}"
    )
}

/// The lease of a won claim; panics on any other outcome.
pub fn won(outcome: ClaimOutcome) -> Lease {
    match outcome {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// How long a test gives a claim to become final ([`claim_won`]): no quorum within a 50 ms `node_timeout`
/// on a loaded machine, a contender between its rounds, an etcd election (0.5–1 s) plus reconnects.
pub const SETTLE: Duration = Duration::from_secs(20);

/// Claims `request` as the worker does: the same request again while the outcome is not final, after the
/// delay the outcome asks for, for at most `patience`.
pub async fn claim_until_final(
    store: &Store,
    request: &ClaimRequest,
    patience: Duration,
) -> ClaimOutcome {
    let give_up = tokio::time::Instant::now() + patience;
    loop {
        let outcome = store.claim(request).await;
        match outcome.retry_in() {
            Some(wait) if tokio::time::Instant::now() + wait < give_up => {
                tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
            }
            _ => return outcome,
        }
    }
}

/// The lease of `request`, claimed as the worker does ([`claim_until_final`] for [`SETTLE`]); panics on
/// any other final outcome.
pub async fn claim_won(store: &Store, request: &ClaimRequest) -> Lease {
    won(claim_until_final(store, request, SETTLE).await)
}

/// A store for the cluster `spec` names ([`Cluster::spec`]).
pub fn store_on(spec: &str, settings: LockSettings) -> Store {
    store_keeping(spec, settings, HistorySettings::default())
}

/// [`store_on`] with `history` as the store's history bound.
pub fn store_keeping(spec: &str, settings: LockSettings, history: HistorySettings) -> Store {
    let (kind, list) = spec.split_once('|').expect("a cluster spec is kind|list");
    let addresses: Vec<String> = list.split(',').map(str::to_string).collect();
    match kind {
        "redis" => Store::Redis(
            RedisStore::new(&addresses, settings)
                .expect("valid node URLs")
                .with_history(history),
        ),
        "etcd" => {
            let config = EtcdConfig {
                endpoints: addresses,
                user: None,
                trusted_ca_file: None,
                client_identity: None,
            };
            let store = EtcdStore::new(&config, settings, history).expect("no TLS files to read");
            Store::Etcd(Box::new(store))
        }
        other => panic!("unknown store kind {other}"),
    }
}

/// Instantiates tests once per shared store: `async` ones as multi-threaded Tokio tests, `sync` ones as
/// plain tests; each named function takes a [`Backend`].
#[macro_export]
macro_rules! on_every_store {
    (async: [$($async_test:ident),* $(,)?], sync: [$($sync_test:ident),* $(,)?] $(,)?) => {
        /// The suite on 5 Redis nodes.
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $async_test() {
                    super::$async_test($crate::support::Backend::Redis).await
                }
            )*
            $(
                #[test]
                fn $sync_test() {
                    super::$sync_test($crate::support::Backend::Redis)
                }
            )*
        }
        /// The suite on a 3-member etcd cluster.
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $async_test() {
                    super::$async_test($crate::support::Backend::Etcd).await
                }
            )*
            $(
                #[test]
                fn $sync_test() {
                    super::$sync_test($crate::support::Backend::Etcd)
                }
            )*
        }
    };
}
