//! Test support: real `redis-server` nodes, real etcd clusters, real worker processes, and sandbox
//! directories.
//!
//! Modelled on redis-rs's `redis-test` helper and cargo's testsuite: every test starts from a fresh
//! [`TestDir`], starts the [`RedisCluster`] and [`Worker`]s it needs, and everything it started is killed
//! when the handles are dropped — also when the test panics, and (on Linux) also when the whole test
//! binary is killed, so no `redis-server` or worker outlives a test run. Nothing here skips a test: a
//! missing `redis-server` is a failure that says how to install it.
//!
//! The nodes, the etcd members, the proxy, the workers and the child-process handling live in the
//! `testkit` crate (shared with the benchmark) and are re-exported here, so tests name them as
//! `crate::support::…`; what only the tests need (the sandbox directory, claiming as the worker claims)
//! stays in this crate's `support` modules.
//!
//! Not every test module uses every helper, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod garbage;
mod selftest;
mod stores;

use std::path::{Path, PathBuf};

#[allow(unused_imports)]
pub use self::stores::{claim_until_final, claim_won, won, SETTLE};
// The builders are named by tests that store them, not only chained.
#[allow(unused_imports)]
pub use testkit::{
    children, free_port, libfaketime, linearizable_read, require_program, store_keeping, store_on,
    worker_config, Backend, Cluster, DelayProxy, EmbeddedFile, EtcdCluster, Persistence,
    RedisCluster, RedisClusterBuilder, SentinelGroup, Worker, WorkerBuilder,
};

/// How many [`heavy`] tests may run at once: the test binary runs `RUST_TEST_THREADS` tests side by
/// side (3, set in `.cargo/config.toml`), most of them waiting for ticks; two of the tests that keep
/// the machine's cores busy for a minute (a chaos run, the benchmark's smoke) at once is what every test
/// has met on this 2-core machine since the suite ran two tests at a time, and no more.
pub const HEAVY_AT_ONCE: usize = 2;

/// Waits for one of the [`HEAVY_AT_ONCE`] places of the tests that load the machine (many worker
/// processes, a fault plan, a herd of jobs) and holds it until the guard is dropped (also when the test
/// panics). A test that only waits for its ticks takes no place.
pub fn heavy() -> HeavyPlace {
    let (count, freed) = &HEAVY;
    let mut running = count
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    while *running >= HEAVY_AT_ONCE {
        running = freed
            .wait(running)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    *running += 1;
    HeavyPlace(())
}

static HEAVY: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

/// A place among the heavy tests, given back on drop.
pub struct HeavyPlace(());

impl Drop for HeavyPlace {
    fn drop(&mut self) {
        let (count, freed) = &HEAVY;
        let mut running = count
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *running -= 1;
        freed.notify_one();
    }
}

/// A temporary directory for one test: its `jobs.yaml`, its ledger, anything else it writes.
///
/// Removed on drop, except when the test is panicking: then it is kept and its path printed, so the
/// files of a failed test can be looked at.
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl TestDir {
    /// A new empty directory (under the system temp dir, named `redcron-test-*`).
    pub fn new() -> TestDir {
        let dir = tempfile::Builder::new()
            .prefix("redcron-test-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let path = dir.path().to_owned();
        TestDir {
            dir: Some(dir),
            path,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this directory (not created).
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `contents` to `name` (creating parent directories) and returns its path.
    pub fn write(&self, name: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("cannot create a directory in the test dir");
        }
        std::fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// Writes `jobs.yaml` and returns its path, for [`Worker::spawn`].
    pub fn write_config(&self, yaml: &str) -> PathBuf {
        self.write("jobs.yaml", yaml)
    }

    /// The contents of `name`, or `None` if it does not exist.
    pub fn read(&self, name: impl AsRef<Path>) -> Option<String> {
        let path = self.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("cannot read {}: {e}", path.display()),
        }
    }

    /// Keeps the directory after the test, whatever its outcome; returns its path.
    pub fn keep(&mut self) -> &Path {
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        &self.path
    }

    /// The ledger file that test jobs append to, one line per run (e.g. `echo "$REDCRON_TOKEN" >> …`).
    pub fn ledger(&self) -> PathBuf {
        self.join("ledger")
    }

    /// The ledger's lines; empty while no job has written it.
    pub fn ledger_lines(&self) -> Vec<String> {
        let text = self.read("ledger").unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }
}

impl Default for TestDir {
    fn default() -> TestDir {
        TestDir::new()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                eprintln!("test failed; keeping its files in {}", dir.keep().display());
            }
        }
    }
}
