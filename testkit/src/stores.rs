//! [`Backend`] and [`Cluster`]: one harness for every store, shared by the tests and the benchmark.
//!
//! A test or a benchmark item takes a [`Backend`], starts its [`Cluster`] (Redis nodes, an etcd cluster,
//! or an embedded store's SQLite file in a temporary directory) and builds redcron's
//! [`Store`](redcron::store::Store) on it through [`Cluster::store`]. What differs between the stores —
//! etcd's lease TTLs are whole seconds and its writes are Raft commits, so it needs longer TTLs and
//! timeouts, and it drops an expired lease only at its next expiry check; the embedded store fsyncs
//! every write — is answered here ([`Backend::adapt`], [`Backend::expiry`]), so that the callers say the
//! same thing for every store. A new store is a variant of each enum, and the compiler points at every
//! `match` that must answer for it.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use redcron::config::{
    ClusterSeeds, EtcdConfig, RedisConfig, RedisNode, ReplicaAcks, SqlConfig, SqlTls,
    ZookeeperConfig,
};
use redcron::history::{Entry, HistorySettings, Query};
use redcron::lock::LockSettings;
use redcron::store::embedded::EmbeddedStore;
use redcron::store::etcd::EtcdStore;
use redcron::store::redis::RedisStore;
use redcron::store::sql::SqlStore;
use redcron::store::zookeeper::ZookeeperStore;
use redcron::store::{Store, StoreError};

use crate::sentinel::MASTER_NAME as SENTINEL_MASTER;
use crate::{
    EtcdCluster, RedisCluster, SentinelGroup, ShardedRedis, SharedShardedRedis, SharedZk, SqlKind,
    SqlServer, ZkEnsemble,
};

/// Which store a test or a benchmark item runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Redis,
    /// One Sentinel-managed group (a master, a replica, a Sentinel) as the Redis store's one node.
    RedisSentinel,
    /// A Redis Cluster of 3 masters with a replica each (`redis.cluster`).
    RedisCluster,
    Etcd,
    Embedded,
    /// A PostgreSQL server (the SQL store's `postgres` dialect).
    Postgres,
    /// A MariaDB server (the SQL store's `mysql` dialect).
    Mariadb,
    /// A ZooKeeper ensemble.
    Zookeeper,
}

impl Backend {
    /// Its name in reports: `Redis`, `etcd`, `embedded`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "Redis",
            Backend::RedisSentinel => "Redis (a Sentinel group)",
            Backend::RedisCluster => "Redis Cluster",
            Backend::Etcd => "etcd",
            Backend::Embedded => "embedded",
            Backend::Postgres => "PostgreSQL",
            Backend::Mariadb => "MariaDB",
            Backend::Zookeeper => "ZooKeeper",
        }
    }

    /// The SQL server of a SQL backend.
    pub fn sql_kind(self) -> Option<SqlKind> {
        match self {
            Backend::Postgres => Some(SqlKind::Postgres),
            Backend::Mariadb => Some(SqlKind::Mariadb),
            Backend::Redis
            | Backend::RedisSentinel
            | Backend::RedisCluster
            | Backend::Etcd
            | Backend::Embedded
            | Backend::Zookeeper => None,
        }
    }

    /// Starts the backend's usual cluster: 5 Redis nodes without persistence, 3 etcd or ZooKeeper
    /// members, or one embedded database file, or one SQL server.
    pub fn start(self) -> Cluster {
        match self {
            Backend::Redis => self.start_nodes(5),
            Backend::RedisSentinel => Cluster::Sentinel(Box::new(
                SentinelGroup::builder().replicas(1).sentinels(1).start(),
            )),
            Backend::RedisCluster => Cluster::Sharded(Box::new(ShardedRedis::start())),
            Backend::Etcd | Backend::Zookeeper => self.start_nodes(3),
            Backend::Embedded | Backend::Postgres | Backend::Mariadb => self.start_nodes(1),
        }
    }

    /// A cluster that a test which neither stops nor kills its nodes may share with other such tests of
    /// the process: for ZooKeeper the process's shared ensemble ([`SharedZk`]) under a chroot of the
    /// test's own, so that the test sees nothing of the others and starts no JVMs; for a Redis Cluster
    /// the process's shared one ([`SharedShardedRedis`]) under a key prefix of the test's own; for
    /// every other store a cluster of its own, as [`Self::start`]. Stopping a node of a shared ensemble
    /// or cluster panics.
    pub fn start_shared(self) -> Cluster {
        match self {
            Backend::Zookeeper => Cluster::SharedZookeeper(SharedZk::get()),
            Backend::RedisCluster => Cluster::SharedSharded(SharedShardedRedis::get()),
            _ => self.start(),
        }
    }

    /// Starts `n` nodes (or members) of the backend and waits until each answers; panics with a node's log
    /// otherwise. The embedded store is one file and a SQL store one server: `n` must be 1.
    pub fn start_nodes(self, n: usize) -> Cluster {
        match self {
            Backend::Redis => Cluster::Redis(RedisCluster::start(n)),
            Backend::RedisSentinel => {
                assert_eq!(n, 1, "a Sentinel group is one node");
                Backend::RedisSentinel.start()
            }
            Backend::RedisCluster => {
                assert_eq!(n, 1, "a Redis Cluster is the store's one node");
                Backend::RedisCluster.start()
            }
            Backend::Etcd => Cluster::Etcd(EtcdCluster::with_members(n)),
            Backend::Zookeeper => Cluster::Zookeeper(ZkEnsemble::start(n)),
            Backend::Embedded => {
                assert_eq!(n, 1, "the embedded store is one database file");
                Cluster::Embedded(EmbeddedFile::new())
            }
            Backend::Postgres | Backend::Mariadb => {
                assert_eq!(n, 1, "a SQL store is one server");
                Cluster::Sql(SqlServer::start(self.sql_kind().expect("a SQL backend")))
            }
        }
    }

    /// `settings` as this backend can honour them: etcd leases live whole seconds (at least one, more
    /// with etcd's minimum) and an etcd write waits for an fsync on a majority, so the TTL is at least
    /// 2 s and the node timeout at least a quarter of it (several times a commit on a loaded 2-core
    /// machine, and still well inside the lease); an embedded store's write is an fsync'd commit, slow on a
    /// loaded machine, so its TTL is at least a second; a SQL store's calls are transactions whose commit
    /// is an fsync on a server that shares the machine with the test, so it gets etcd's bounds; so does a
    /// ZooKeeper store, whose writes are quorum commits and whose lease is a session (the ensemble grants
    /// sessions of 0.5–20 s).
    pub fn adapt(self, settings: LockSettings) -> LockSettings {
        match self {
            Backend::Redis => settings,
            // Each answer waits for the replica's acknowledgement (`WAIT`): room for it.
            Backend::RedisSentinel | Backend::RedisCluster => LockSettings {
                node_timeout: settings.node_timeout.max(Duration::from_millis(500)),
                ttl: settings.ttl.max(Duration::from_secs(1)),
                renew_every: settings
                    .renew_every
                    .max(settings.ttl.max(Duration::from_secs(1)) / 3),
                ..settings
            },
            Backend::Etcd | Backend::Postgres | Backend::Mariadb | Backend::Zookeeper => {
                let ttl = settings.ttl.max(Duration::from_secs(2));
                LockSettings {
                    ttl,
                    renew_every: settings.renew_every.max(ttl / 3),
                    node_timeout: settings.node_timeout.max(ttl / 4),
                    ..settings
                }
            }
            Backend::Embedded => {
                let ttl = settings.ttl.max(Duration::from_secs(1));
                LockSettings {
                    ttl,
                    renew_every: settings.renew_every.max(ttl / 3),
                    ..settings
                }
            }
        }
    }

    /// How long after its holder's deadline the store surely has dropped a lease of `ttl` that nobody
    /// renewed: on Redis and the embedded store the TTL (plus a margin); on etcd the lease's whole
    /// seconds, the leader's expiry check (every 500 ms) and the revoke's commit; on ZooKeeper the session
    /// timeout (the TTL) counted from the session's last contact, the leader's expiry check (each tick,
    /// 250 ms in the test ensemble) and the session's close, a commit that deletes its ephemeral nodes.
    pub fn expiry(self, ttl: Duration) -> Duration {
        match self {
            // The SQL server expires a lease on its own clock, read by the next claim: a TTL after the
            // claim or renewal that wrote it.
            Backend::Redis
            | Backend::RedisSentinel
            | Backend::RedisCluster
            | Backend::Embedded
            | Backend::Postgres
            | Backend::Mariadb => ttl + Duration::from_millis(100),
            Backend::Etcd => {
                Duration::from_secs(ttl.as_millis().div_ceil(1000) as u64)
                    + Duration::from_millis(1_500)
            }
            Backend::Zookeeper => ttl + Duration::from_millis(1_000),
        }
    }

    /// The `jobs.yaml` section that names a store at `addresses`: `redis: nodes:`, `etcd: endpoints:`,
    /// `embedded: path:` (the one address being the database file), or `postgres: url:` / `mysql: url:`
    /// (without TLS: the test servers serve none), `zookeeper: hosts:`.
    pub fn section(self, addresses: &[String]) -> String {
        // JSON strings are YAML strings; `$` is doubled because the config expands `${VAR}`.
        let quoted: Vec<String> = addresses
            .iter()
            .map(|a| serde_json::to_string(&a.replace('$', "$$")).unwrap_or_default())
            .collect();
        match self {
            Backend::Redis => format!("redis:\n  nodes: [{}]\n", quoted.join(", ")),
            Backend::RedisSentinel => format!(
                "redis:\n  nodes:\n    - {{sentinels: [{}], master: {SENTINEL_MASTER}}}\n",
                quoted.join(", ")
            ),
            Backend::RedisCluster => format!("redis:\n  cluster: [{}]\n", quoted.join(", ")),
            Backend::Etcd => format!("etcd:\n  endpoints: [{}]\n", quoted.join(", ")),
            Backend::Embedded => format!("embedded:\n  path: {}\n", quoted.join(", ")),
            Backend::Postgres => {
                format!("postgres:\n  url: {}\n  tls: disable\n", quoted.join(", "))
            }
            Backend::Mariadb => format!("mysql:\n  url: {}\n  tls: disable\n", quoted.join(", ")),
            Backend::Zookeeper => format!("zookeeper:\n  hosts: [{}]\n", quoted.join(", ")),
        }
    }
}

/// A running cluster of one backend, stopped (or its file removed) on drop.
pub enum Cluster {
    Redis(RedisCluster),
    /// A Sentinel group: its Sentinels' addresses are the cluster's, and it is one node. Boxed: it is
    /// large next to the other variants.
    Sentinel(Box<SentinelGroup>),
    Etcd(EtcdCluster),
    Embedded(EmbeddedFile),
    /// One PostgreSQL or MariaDB server of its own.
    Sql(SqlServer),
    Zookeeper(ZkEnsemble),
    /// The process's shared ZooKeeper ensemble under a chroot of this cluster's own
    /// ([`Backend::start_shared`]): its members are not to be stopped.
    SharedZookeeper(SharedZk),
    /// A Redis Cluster of its own, the store's one node. Boxed, as a group is.
    Sharded(Box<ShardedRedis>),
    /// The process's shared Redis Cluster under a key prefix of this cluster's own
    /// ([`Backend::start_shared`]): its nodes are not to be stopped or flushed.
    SharedSharded(SharedShardedRedis),
}

impl Cluster {
    pub fn backend(&self) -> Backend {
        match self {
            Cluster::Redis(_) => Backend::Redis,
            Cluster::Sentinel(_) => Backend::RedisSentinel,
            Cluster::Sharded(_) | Cluster::SharedSharded(_) => Backend::RedisCluster,
            Cluster::Etcd(_) => Backend::Etcd,
            Cluster::Zookeeper(_) | Cluster::SharedZookeeper(_) => Backend::Zookeeper,
            Cluster::Embedded(_) => Backend::Embedded,
            Cluster::Sql(server) => match server.kind() {
                SqlKind::Postgres => Backend::Postgres,
                SqlKind::Mariadb => Backend::Mariadb,
            },
        }
    }

    /// A store on this cluster with `settings` adapted to the backend ([`Backend::adapt`]) and the default
    /// history bound. Each call opens a new store: its own connections (on the embedded store, its own
    /// connection to the file), as another process would.
    pub fn store(&self, settings: LockSettings) -> Store {
        self.store_keeping(settings, HistorySettings::default())
    }

    /// [`Self::store`] with `history` as the store's history bound.
    pub fn store_keeping(&self, settings: LockSettings, history: HistorySettings) -> Store {
        let settings = self.backend().adapt(settings);
        store_keeping(&self.spec(), settings, history)
    }

    /// A store on this cluster with `settings` as they are (not adapted), the default history bound.
    pub fn open(&self, settings: LockSettings) -> Result<Store, StoreError> {
        let settings = match self {
            Cluster::SharedZookeeper(shared) => LockSettings {
                key_prefix: shared.prefix().to_string(),
                ..settings
            },
            Cluster::SharedSharded(shared) => LockSettings {
                key_prefix: shared.prefix().to_string(),
                ..settings
            },
            _ => settings,
        };
        open(
            self.backend(),
            &self.urls(),
            settings,
            HistorySettings::default(),
        )
    }

    /// `redis|<url>,…`, `etcd|<endpoint>,…` or `embedded|<path>`: the cluster for a store built in another
    /// process ([`store_on`]); a shared ZooKeeper ensemble's ends in `|<key prefix>`, the test's chroot.
    pub fn spec(&self) -> String {
        let kind = match self.backend() {
            Backend::Redis => "redis",
            Backend::RedisSentinel => "redis-sentinel",
            Backend::RedisCluster => "redis-cluster",
            Backend::Etcd => "etcd",
            Backend::Embedded => "embedded",
            Backend::Postgres => "postgres",
            Backend::Mariadb => "mariadb",
            Backend::Zookeeper => "zookeeper",
        };
        match self {
            Cluster::SharedZookeeper(shared) => {
                format!("{kind}|{}|{}", self.urls().join(","), shared.prefix())
            }
            Cluster::SharedSharded(shared) => {
                format!("{kind}|{}|{}", self.urls().join(","), shared.prefix())
            }
            _ => format!("{kind}|{}", self.urls().join(",")),
        }
    }

    /// The nodes' URLs, the members' endpoints (ZooKeeper's `127.0.0.1:<port>`), or the database file's
    /// path.
    pub fn urls(&self) -> Vec<String> {
        match self {
            Cluster::Redis(cluster) => cluster.urls(),
            Cluster::Sentinel(group) => group.sentinel_addresses(),
            Cluster::Sharded(cluster) => cluster.seed_urls(),
            Cluster::SharedSharded(shared) => shared.cluster().seed_urls(),
            Cluster::Etcd(cluster) => cluster.endpoints(),
            Cluster::Zookeeper(ensemble) => ensemble.addresses(),
            Cluster::SharedZookeeper(shared) => shared.ensemble().addresses(),
            Cluster::Embedded(file) => vec![file.path().display().to_string()],
            Cluster::Sql(server) => vec![server.url()],
        }
    }

    /// A worker's `jobs.yaml` on this cluster: `worker_section` (YAML under `worker:`, already indented)
    /// and `jobs` (YAML list items), with short leases — on etcd as short as its whole-second leases
    /// and Raft commits on a loaded machine allow.
    pub fn config(&self, worker_section: &str, jobs: &str) -> String {
        worker_config(self.backend(), &self.urls(), worker_section, jobs)
    }

    /// How many nodes (or members) the cluster has: 1 for the embedded store's file.
    pub fn len(&self) -> usize {
        match self {
            Cluster::Redis(cluster) => cluster.len(),
            Cluster::Sentinel(_) | Cluster::Sharded(_) | Cluster::SharedSharded(_) => 1,
            Cluster::Etcd(cluster) => cluster.len(),
            Cluster::Zookeeper(ensemble) => ensemble.len(),
            Cluster::SharedZookeeper(shared) => shared.ensemble().len(),
            Cluster::Embedded(_) | Cluster::Sql(_) => 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Node `i`'s client port; panics on the embedded store, which has none.
    pub fn port(&self, i: usize) -> u16 {
        match self {
            Cluster::Redis(cluster) => cluster.port(i),
            Cluster::Sentinel(group) => group.data.port(group.master().unwrap_or(0)),
            Cluster::Sharded(cluster) => cluster.nodes().port(i),
            Cluster::SharedSharded(shared) => shared.cluster().nodes().port(i),
            Cluster::Etcd(cluster) => cluster.client_port(i),
            Cluster::Zookeeper(ensemble) => ensemble.client_port(i),
            Cluster::SharedZookeeper(shared) => shared.ensemble().client_port(i),
            Cluster::Embedded(_) => panic!("the embedded store has no port"),
            Cluster::Sql(server) => server.port(),
        }
    }

    /// Node `i`'s process id, if it runs (the embedded store has no process of its own).
    pub fn pid(&self, i: usize) -> Option<u32> {
        match self {
            Cluster::Redis(cluster) => cluster.pid(i),
            Cluster::Sentinel(group) => group.data.pid(group.master().unwrap_or(0)),
            Cluster::Sharded(cluster) => cluster.nodes().pid(i),
            Cluster::SharedSharded(shared) => shared.cluster().nodes().pid(i),
            Cluster::Etcd(cluster) => cluster.pid(i),
            Cluster::Zookeeper(ensemble) => ensemble.pid(i),
            Cluster::SharedZookeeper(shared) => shared.ensemble().pid(i),
            Cluster::Embedded(_) => None,
            Cluster::Sql(server) => server.pid(),
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
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let store = self.store(LockSettings::default());
            store
                .history(&query)
                .await
                .expect("the store answers")
                .value
        })
    }

    /// Hangs node `i`: SIGSTOP for a Redis node, an etcd or a ZooKeeper member (its socket accepts requests and never
    /// answers); on the embedded store, another connection takes the file's write lock and keeps it, so
    /// that every write waits for it until its busy timeout; a SQL server is SIGSTOPped (every process of
    /// it).
    pub fn stop(&mut self, i: usize) {
        match self {
            Cluster::Redis(cluster) => cluster.stop(i),
            // The group is one node: every data node hangs (so no replica can be promoted either).
            Cluster::Sentinel(group) => (0..group.data.len()).for_each(|i| group.data.stop(i)),
            // The cluster is one node: every node hangs (so no replica is promoted either).
            Cluster::Sharded(cluster) => {
                let nodes = cluster.nodes_mut();
                (0..nodes.len()).for_each(|i| nodes.stop(i));
            }
            Cluster::SharedSharded(_) => panic!("{SHARED_UNDISTURBED}"),
            Cluster::Etcd(cluster) => cluster.stop(i),
            Cluster::Zookeeper(ensemble) => ensemble.stop(i),
            Cluster::SharedZookeeper(_) => panic!("{SHARED_UNDISTURBED}"),
            Cluster::Embedded(file) => file.lock(),
            Cluster::Sql(server) => server.stop(),
        }
    }

    /// Resumes node `i` hung by [`Self::stop`].
    pub fn cont(&mut self, i: usize) {
        match self {
            Cluster::Redis(cluster) => cluster.cont(i),
            Cluster::Sentinel(group) => (0..group.data.len()).for_each(|i| group.data.cont(i)),
            Cluster::Sharded(cluster) => {
                let nodes = cluster.nodes_mut();
                (0..nodes.len()).for_each(|i| nodes.cont(i));
            }
            Cluster::SharedSharded(_) => panic!("{SHARED_UNDISTURBED}"),
            Cluster::Etcd(cluster) => cluster.cont(i),
            Cluster::Zookeeper(ensemble) => ensemble.cont(i),
            Cluster::SharedZookeeper(_) => panic!("{SHARED_UNDISTURBED}"),
            Cluster::Embedded(file) => file.unlock(),
            Cluster::Sql(server) => server.cont(),
        }
    }

    /// Hangs ([`Self::stop`]) a majority: Redis nodes 0..N/2+1; on etcd the leader and one more member, so
    /// that the member left cannot answer for the cluster; every ZooKeeper member; the embedded store's
    /// file.
    pub fn stop_majority(&mut self) -> Vec<usize> {
        let stopped: Vec<usize> = match self {
            Cluster::Redis(cluster) => (0..cluster.len() / 2 + 1).collect(),
            Cluster::Etcd(cluster) => {
                let leader = cluster.leader();
                vec![leader, (leader + 1) % cluster.len()]
            }
            // Every member: a leader answers `sync` and reads alone until it sees (after `syncLimit`) that
            // its followers are gone, and the leader may change between asking `srvr` and the SIGSTOP.
            // With all hung, the majority's silence is certain. (Two conformance runs renewed anyway,
            // most likely through another test's ensemble that held a member's port, which no readiness
            // check noticed then — see `ports`.)
            Cluster::Zookeeper(ensemble) => (0..ensemble.len()).collect(),
            Cluster::SharedZookeeper(_) | Cluster::SharedSharded(_) => {
                panic!("{SHARED_UNDISTURBED}")
            }
            Cluster::Embedded(_) | Cluster::Sql(_) | Cluster::Sentinel(_) | Cluster::Sharded(_) => {
                vec![0]
            }
        };
        for &i in &stopped {
            self.stop(i);
        }
        stopped
    }

    /// Resumes the nodes or members hung by [`Self::stop_majority`].
    pub fn cont_all(&mut self, stopped: &[usize]) {
        for &i in stopped {
            self.cont(i);
        }
    }

    /// Empties every node (the embedded store: every table of its file).
    pub fn flush(&self) {
        match self {
            Cluster::Redis(cluster) => (0..cluster.len()).for_each(|i| cluster.flushall(i)),
            Cluster::Sentinel(group) => group.data.flushall(group.master().unwrap_or(0)),
            Cluster::Sharded(cluster) => {
                for (master, _) in cluster.masters() {
                    cluster.nodes().flushall(master);
                }
            }
            Cluster::SharedSharded(_) => panic!("{SHARED_UNDISTURBED}"),
            Cluster::Etcd(cluster) => cluster.delete_all(),
            Cluster::Zookeeper(ensemble) => ensemble.delete_all(),
            Cluster::SharedZookeeper(shared) => shared.delete_all(),
            Cluster::Embedded(file) => file.empty(),
            Cluster::Sql(server) => server.flush("redcron"),
        }
    }
}

/// Why a shared ZooKeeper ensemble's members cannot be stopped: the other tests on it would fail.
const SHARED_UNDISTURBED: &str =
    "the shared ZooKeeper ensemble (or Redis Cluster) serves other tests: a test that stops \
     members or flushes starts one of its own (Backend::start)";

/// A worker's `jobs.yaml` on the `backend` store at `addresses` ([`Backend::section`]): `worker_section`
/// (YAML under `worker:`, already indented) and `jobs` (YAML list items), with short leases — on etcd as
/// short as its whole-second leases and Raft commits on a loaded machine allow.
pub fn worker_config(
    backend: Backend,
    addresses: &[String],
    worker_section: &str,
    jobs: &str,
) -> String {
    let lock = match backend {
        Backend::Redis | Backend::Embedded => SHORT_LEASES,
        Backend::RedisSentinel | Backend::RedisCluster => SQL_LEASES,
        Backend::Etcd => ETCD_LEASES,
        Backend::Postgres | Backend::Mariadb => SQL_LEASES,
        Backend::Zookeeper => ZK_LEASES,
    };
    let section = backend.section(addresses);
    format!("{section}{lock}worker:\n{worker_section}jobs:\n{jobs}")
}

/// The lock settings of a worker's config on Redis and the embedded store: short leases, quick tests.
const SHORT_LEASES: &str =
    "lock:\n  ttl: 2s\n  renew_every: 500ms\n  node_timeout: 100ms\n  retry_delay: 50ms\n";

/// The lock settings of a worker's config on etcd: whole-second leases, room for Raft commits.
const ETCD_LEASES: &str =
    "lock:\n  ttl: 5s\n  renew_every: 1s\n  node_timeout: 500ms\n  retry_delay: 50ms\n";

/// The lock settings of a worker's config on a SQL store: a commit is an fsync on a server that shares the
/// loaded test machine, so room for it, as on etcd.
const SQL_LEASES: &str =
    "lock:\n  ttl: 3s\n  renew_every: 1s\n  node_timeout: 300ms\n  retry_delay: 50ms\n";

/// The lock settings of a worker's config on ZooKeeper: the lease is the session (4 s, within the test
/// ensemble's 0.5–20 s), renewed every second; a claim is a quorum commit, so room for it, as on etcd —
/// `node_timeout` at its bound, a tenth of the TTL.
pub const ZK_LEASES: &str =
    "lock:\n  ttl: 4s\n  renew_every: 1s\n  node_timeout: 400ms\n  retry_delay: 50ms\n";

/// The embedded store's database file, `redcron.db` in a temporary directory removed on drop, and the
/// connection that holds its write lock while it is hung ([`Cluster::stop`]).
pub struct EmbeddedFile {
    dir: tempfile::TempDir,
    path: PathBuf,
    /// Set while the file is locked: dropping it ends the locking transaction.
    lock: Option<mpsc::Sender<()>>,
}

impl EmbeddedFile {
    fn new() -> EmbeddedFile {
        let dir = tempfile::Builder::new()
            .prefix("redcron-embedded-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let path = dir.path().join("redcron.db");
        EmbeddedFile {
            dir,
            path,
            lock: None,
        }
    }

    /// The database file (created by the first store opened on it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory the file is in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Takes the file's write lock (`BEGIN IMMEDIATE`, as every write of the store begins) on a
    /// connection of its own, held by a thread until [`Self::unlock`]; returns once it is held.
    fn lock(&mut self) {
        if self.lock.is_some() {
            return;
        }
        let (release, released) = mpsc::channel::<()>();
        let (held, is_held) = mpsc::channel::<()>();
        let path = self.path.clone();
        std::thread::spawn(move || {
            let connection = rusqlite::Connection::open(&path).expect("open the database");
            connection
                .busy_timeout(Duration::from_secs(10))
                .expect("a busy timeout");
            connection
                .execute_batch("BEGIN IMMEDIATE")
                .expect("take the write lock");
            let _ = held.send(());
            let _ = released.recv();
            let _ = connection.execute_batch("ROLLBACK");
        });
        is_held.recv().expect("the lock is taken");
        self.lock = Some(release);
    }

    /// Deletes every row of every table (a file no store opened yet stays as it is).
    fn empty(&self) {
        if !self.path.exists() {
            return;
        }
        let connection = rusqlite::Connection::open(&self.path).expect("open the database");
        connection
            .busy_timeout(Duration::from_secs(10))
            .expect("a busy timeout");
        let mut tables = connection
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
            .expect("list the tables");
        let names: Vec<String> = tables
            .query_map([], |row| row.get(0))
            .expect("list the tables")
            .filter_map(Result::ok)
            .collect();
        for name in names {
            connection
                .execute(&format!("DELETE FROM \"{name}\""), [])
                .expect("empty a table");
        }
    }

    /// Ends the transaction that [`Self::lock`] holds.
    fn unlock(&mut self) {
        if let Some(release) = self.lock.take() {
            let _ = release.send(());
        }
    }
}

impl Drop for EmbeddedFile {
    fn drop(&mut self) {
        self.unlock();
    }
}

/// A store for the cluster `spec` names ([`Cluster::spec`]), with `settings` as they are (but for the key
/// prefix of a shared ZooKeeper ensemble's spec).
pub fn store_on(spec: &str, settings: LockSettings) -> Store {
    store_keeping(spec, settings, HistorySettings::default())
}

/// [`store_on`] with `history` as the store's history bound.
pub fn store_keeping(spec: &str, settings: LockSettings, history: HistorySettings) -> Store {
    let (kind, list) = spec.split_once('|').expect("a cluster spec is kind|list");
    // A shared ZooKeeper ensemble's spec ends in `|<key prefix>`: the test's chroot.
    let (list, settings) = match list.split_once('|') {
        Some((list, prefix)) if kind == "zookeeper" || kind == "redis-cluster" => (
            list,
            LockSettings {
                key_prefix: prefix.to_string(),
                ..settings
            },
        ),
        _ => (list, settings),
    };
    let addresses: Vec<String> = list.split(',').map(str::to_string).collect();
    let backend = match kind {
        "redis" => Backend::Redis,
        "redis-sentinel" => Backend::RedisSentinel,
        "redis-cluster" => Backend::RedisCluster,
        "etcd" => Backend::Etcd,
        "embedded" => Backend::Embedded,
        "postgres" => Backend::Postgres,
        "mariadb" => Backend::Mariadb,
        "zookeeper" => Backend::Zookeeper,
        other => panic!("unknown store kind {other}"),
    };
    open(backend, &addresses, settings, history)
        .unwrap_or_else(|e| panic!("a store on {spec}: {e}"))
}

/// The `backend` store at `addresses` (node URLs, member endpoints, or the one database file).
fn open(
    backend: Backend,
    addresses: &[String],
    settings: LockSettings,
    history: HistorySettings,
) -> Result<Store, StoreError> {
    Ok(match backend {
        Backend::Redis => Store::Redis(RedisStore::new(addresses, settings)?.with_history(history)),
        Backend::RedisSentinel => {
            let group = crate::sentinel::group_config(addresses.to_vec(), ReplicaAcks::All);
            let config = RedisConfig::on(vec![RedisNode::Sentinel(group)]);
            Store::Redis(RedisStore::open(&config, settings)?.with_history(history))
        }
        Backend::RedisCluster => {
            let cluster = ClusterSeeds {
                seeds: addresses.to_vec(),
                min_replicas_acked: ReplicaAcks::All,
            };
            let config = RedisConfig::on(vec![RedisNode::Cluster(cluster)]);
            Store::Redis(RedisStore::open(&config, settings)?.with_history(history))
        }
        Backend::Etcd => {
            let config = EtcdConfig {
                endpoints: addresses.to_vec(),
                user: None,
                trusted_ca_file: None,
                client_identity: None,
            };
            Store::Etcd(Box::new(EtcdStore::new(&config, settings, history)?))
        }
        Backend::Embedded => {
            let path = addresses.first().map(PathBuf::from).unwrap_or_default();
            Store::Embedded(EmbeddedStore::open(&path, settings, history)?)
        }
        Backend::Postgres | Backend::Mariadb => {
            let kind = backend.sql_kind().expect("a SQL backend");
            let config = SqlConfig {
                dialect: kind.dialect(),
                url: addresses.first().cloned().unwrap_or_default(),
                tls: SqlTls::Disable,
                ca_file: None,
                client_identity: None,
                pool_size: SqlConfig::DEFAULT_POOL_SIZE,
            };
            Store::Sql(Box::new(SqlStore::new(&config, settings, history)?))
        }
        Backend::Zookeeper => {
            let config = ZookeeperConfig {
                hosts: addresses.to_vec(),
                session_timeout: settings.ttl,
                auth: None,
                tls: None,
            };
            Store::Zookeeper(Box::new(ZookeeperStore::new(&config, settings, history)?))
        }
    })
}

impl RedisCluster {
    /// A redcron store on every node, with `settings` as they are and the default history bound.
    pub fn store(&self, settings: LockSettings) -> Store {
        open(
            Backend::Redis,
            &self.urls(),
            settings,
            HistorySettings::default(),
        )
        .expect("valid node URLs")
    }
}

impl EtcdCluster {
    /// A redcron store on every member, with `settings` as they are and the default history bound.
    pub fn store(&self, settings: LockSettings) -> Store {
        open(
            Backend::Etcd,
            &self.endpoints(),
            settings,
            HistorySettings::default(),
        )
        .expect("no TLS files to read")
    }
}

impl ZkEnsemble {
    /// A redcron store on every member, with `settings` as they are (the session timeout their TTL) and
    /// the default history bound.
    pub fn store(&self, settings: LockSettings) -> Store {
        open(
            Backend::Zookeeper,
            &self.addresses(),
            settings,
            HistorySettings::default(),
        )
        .expect("no TLS files to read")
    }
}
