//! redcron's test harness, shared by the integration tests (`tests/it`) and the benchmark
//! (`benches/lease`): real `redis-server` nodes ([`RedisCluster`]), real etcd clusters
//! ([`EtcdCluster`]), real ZooKeeper ensembles ([`ZkEnsemble`]), real PostgreSQL and MariaDB servers
//! ([`SqlServer`]), a proxy that delays chosen requests ([`DelayProxy`]), real worker processes of the
//! built binary ([`Worker`]), a real headless Chromium to look at the dashboard with ([`Browser`]), and
//! the spawning that makes every child die with the process that started it ([`children`]).
//!
//! Modelled on cargo's `cargo-test-support` and redis-rs's `redis-test`: one copy of the harness, so a
//! fix to how nodes start or how children are reaped reaches the tests and the benchmark alike. Everything
//! started here is killed when its handle is dropped — also when the caller panics, and (on Linux) also
//! when the whole process is killed. Nothing here skips: a missing `redis-server` or `etcd` is a failure
//! that says how to install it.
//!
//! # Layout
//! - [`browser`]: [`Browser`], headless Chromium and chromedriver, driven over WebDriver by fantoccini.
//! - [`children`]: spawning with parent-death signals, killing and reaping, finding descendants.
//! - [`redis`]: [`RedisCluster`], N nodes to crash, hang, restart and flush.
//! - [`sentinel`]: [`SentinelGroup`], a master, its replicas and Sentinels, to kill and fail over.
//! - [`etcd`]: [`EtcdCluster`], N etcd members to kill, hang and restart, with their leader and metrics.
//! - [`sql`]: [`SqlServer`], a PostgreSQL or MariaDB server to crash, hang, restart and flush.
//! - [`zookeeper`]: [`ZkEnsemble`], N ZooKeeper members to kill, hang and restart, with their leader;
//!   [`SharedZk`], one ensemble per process for the tests that leave its members alone.
//! - [`ports`]: free loopback ports, never the same twice, and which process listens on one.
//! - [`delay_proxy`]: [`DelayProxy`], a TCP proxy that holds back requests carrying a marker.
//! - [`worker`]: [`Worker`], one `redcron run` process and its JSON log.
//! - [`stores`]: [`Backend`] and [`Cluster`], any store's nodes (or file) and a redcron store on them.

pub mod browser;
pub mod children;
pub mod delay_proxy;
pub mod etcd;
pub mod ports;
pub mod redis;
pub mod sentinel;
pub mod sharded;
pub mod sql;
pub mod stores;
pub mod worker;
pub mod zookeeper;

use std::path::PathBuf;

pub use self::browser::Browser;
pub use self::delay_proxy::DelayProxy;
pub use self::etcd::{linearizable_read, EtcdCluster};
pub use self::ports::{free_port, free_ports};
pub use self::redis::{Persistence, RedisCluster, RedisClusterBuilder};
pub use self::sentinel::{SentinelGroup, SentinelGroupBuilder};
pub use self::sharded::{slot_of, ShardedRedis, ShardedRedisBuilder, SharedShardedRedis};
pub use self::sql::{SqlKind, SqlServer, SqlServerBuilder};
pub use self::stores::{store_keeping, store_on, worker_config, Backend, Cluster, EmbeddedFile};
pub use self::worker::{libfaketime, Worker, WorkerBuilder};
pub use self::zookeeper::{SharedZk, ZkEnsemble};

/// Panics unless `program` is on PATH, saying which Debian package provides it.
pub fn require_program(program: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{program}` is not on PATH; these tests need it. Install it with: \
         apt-get update && apt-get install -y {package}"
    );
}

/// The `redcron` binary that cargo built beside the running test or benchmark.
///
/// Cargo builds a package's binaries before its integration tests and benchmarks, into the directory
/// above the `deps/` directory that holds the test binary itself (as `cargo-test-support` finds cargo).
/// `REDCRON_BIN` overrides it.
pub fn redcron_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REDCRON_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("cannot find the running executable");
    let parent = exe.parent().expect("an executable lives in a directory");
    let dir = match parent.parent() {
        Some(above) if parent.ends_with("deps") => above,
        _ => parent,
    };
    let binary = dir.join(format!("redcron{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "{} not found: build it with `cargo build` (or set REDCRON_BIN)",
        binary.display()
    );
    binary
}
