//! The embedded store: claims, leases, fencing tokens, run history and membership in one SQLite database
//! file, for the workers of a single host (a config with `embedded:`, or without any store section).
//!
//! Why SQLite: its transactions are ACID across processes on one host (through the file's locks), so
//! several workers on a host may share one database as they would share Redis nodes; all state is one
//! file to back up, move or delete; and it is among the best-tested software there is, with a file
//! format that stays readable across versions. `rusqlite`'s `bundled` feature compiles SQLite in, so
//! neither the build nor the host needs a system package.
//!
//! One database is one node and one majority, so both rounds of a claim happen in one transaction, with
//! the rules of the Lua scripts ([`crate::store::redis::scripts`]) and the names of [`crate::lock::keys`]
//! (`claim.rs`); the answers are those a Redis cluster gives in the same situation. Every claim, renewal
//! and release is one `BEGIN IMMEDIATE` transaction, which takes the database's write lock before it
//! reads, so two processes never decide on the same state. The journal is a write-ahead log (readers
//! never wait for a writer) with `synchronous = FULL`: a claim is on disk before it is answered, since
//! a claim record lost in a power cut would let its tick run again.
//!
//! Pauses (`pause.rs`) are rows that expire on this host's wall clock, as a Redis key with a TTL expires on
//! the node's; every claim reads its job's row in its transaction.
//!
//! The lock path (claims, renewals, releases and every other write) has a connection of its own; reads
//! (history, members, pauses and trigger requests, for the dashboard, the command line and the worker's
//! checks) take one of at most [`READERS`] read-only connections beside it, which the write-ahead log
//! lets run beside the writer, and each read is stopped after [`READ_LIMIT`]: no read, however large or
//! however many, delays a claim or a renewal.
//!
//! Every write first checks that the path still names the file the store opened (its device and inode):
//! a file deleted or replaced under running workers (`rm redcron.db*`, a restore) would leave them
//! claiming on a file that a worker starting now does not see, and the same tick would run twice. On a
//! file that is no longer the path's, claims answer [`StoreFault::FileReplaced`] and renewals fail as not
//! held (a lease on it excludes nobody, so the run stops at once), and `/readyz` is not ready.
//!
//! What survives a restart (of a worker or of the host): the claim records and fencing counters, kept
//! forever (those of triggers and retries until an hour after their window) — a restarted worker, even one whose clock stepped back, never runs a claimed tick again, and
//! its tokens keep rising — and the history and membership (`history.rs`). Leases survive a worker's
//! restart but not the host's: a lease's expiry is a point on `CLOCK_BOOTTIME` ([`crate::clock::boot`]),
//! which every process of the host shares and which counts a suspend, stored with the boot's id, and a
//! lease of another boot has expired.

mod claim;
mod history;
mod pause;
mod triggers;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, InterruptHandle, OpenFlags, Transaction, TransactionBehavior};

use crate::clock::boot::{self, BootInstant};
use crate::clock::cluster::Readings;
use crate::history::HistorySettings;
use crate::lock::{LockSettings, QuorumFailure, StoreFault};
use crate::store::{Health, StoreError};

/// How long a transaction waits for another process's write lock before it fails (and the claim is
/// retried like one that found no quorum). Far above a healthy transaction (one fsync), below a lease.
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// How many read-only connections a store opens at most: reads beyond them wait for one (without a
/// thread), so that what readers hold of the host's CPU, memory and the file is bounded.
const READERS: usize = 2;

/// How long one read may run before it is interrupted and fails: a read of a job's whole history with
/// large output tails takes well under a second.
const READ_LIMIT: Duration = Duration::from_secs(5);

/// The schema this version writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 2;

/// Per key, as in Redis: fence counters, claim records and leases (expiring on the boot clock of the
/// boot they were taken in); history entries by job and id; members by id.
const SCHEMA: &str = "
CREATE TABLE fences (key TEXT PRIMARY KEY, token INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE claims (key TEXT PRIMARY KEY, tick INTEGER NOT NULL, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE leases (key TEXT PRIMARY KEY, value TEXT NOT NULL, boot_id TEXT NOT NULL,
                     expires_ns INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE history (job TEXT NOT NULL, id TEXT NOT NULL, tick INTEGER NOT NULL, entry TEXT NOT NULL,
                      PRIMARY KEY (job, id)) WITHOUT ROWID;
CREATE INDEX history_by_tick ON history (job, tick);
CREATE TABLE members (id TEXT PRIMARY KEY, seen_ms INTEGER NOT NULL, member TEXT NOT NULL,
                      boot_id TEXT NOT NULL, expires_ns INTEGER NOT NULL,
                      expired_ms INTEGER NOT NULL) WITHOUT ROWID;
";

/// Schema 2 over schema 1: pauses (until the wall-clock instant `until_ms`, or for ever), trigger requests
/// (dropped at `expires_ms`), and the expiry of the claim records of triggers and retries (`NULL` for the
/// schedule's, kept for ever).
const SCHEMA_2: &str = "
CREATE TABLE paused (job TEXT PRIMARY KEY, value TEXT NOT NULL, until_ms INTEGER) WITHOUT ROWID;
CREATE TABLE triggers (id TEXT PRIMARY KEY, job TEXT NOT NULL, request TEXT NOT NULL,
                       expires_ms INTEGER NOT NULL) WITHOUT ROWID;
ALTER TABLE claims ADD COLUMN expires_ms INTEGER;
";

/// Claims, leases, tokens, history and membership in one SQLite file that processes of one host share.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
}

/// What the blocking calls of a store need, shared with the threads they run on.
struct Shared {
    settings: LockSettings,
    history: HistorySettings,
    path: PathBuf,
    /// This host's boot id: a lease's expiry on the boot clock holds only in the boot it was taken in.
    boot_id: String,
    /// The lock path's connection: every write, and nothing else.
    connection: Mutex<Connection>,
    /// The file the store opened, checked before every write ([`FileId::check`]).
    file: FileId,
    /// Idle read-only connections (at most [`READERS`]); a read takes one, or opens one.
    readers: Mutex<Vec<Reader>>,
    /// [`READERS`] permits: a read holds one while it runs.
    reading: tokio::sync::Semaphore,
}

/// A read-only connection, with the handle that interrupts a read past [`READ_LIMIT`].
struct Reader {
    connection: Connection,
    interrupt: Arc<InterruptHandle>,
}

/// The database file as the file system knows it (device and inode): what the path named when the
/// store opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// What `path` names now.
    fn of(path: &Path) -> std::io::Result<FileId> {
        let meta = std::fs::metadata(path)?;
        Ok(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Whether `path` still names this file (one `stat`): the fault if it was deleted or replaced, or
    /// cannot be looked at.
    fn check(self, path: &Path) -> Result<(), StoreFault> {
        let what = match FileId::of(path) {
            Ok(now) if now == self => return Ok(()),
            Ok(_) => "the database file was replaced by another file since this worker opened it"
                .to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                "the database file was deleted since this worker opened it".to_string()
            }
            Err(e) => format!("the database file cannot be looked at ({e})"),
        };
        Err(StoreFault::FileReplaced {
            path: path.display().to_string(),
            what,
        })
    }
}

/// Why a call on the file failed: the one node's failure (busy, a disk error), or a fault that waiting
/// does not mend ([`StoreFault`]).
enum Failed {
    Node(String),
    Fault(StoreFault),
}

impl From<rusqlite::Error> for Failed {
    fn from(e: rusqlite::Error) -> Failed {
        Failed::Node(e.to_string())
    }
}

impl EmbeddedStore {
    /// Opens (or creates, with its directory) the database at `path`.
    ///
    /// Fails, naming the path, if the directory or the file cannot be created or written, if the file is
    /// not a SQLite database, or if a newer redcron wrote it.
    pub fn open(
        path: &Path,
        settings: LockSettings,
        history: HistorySettings,
    ) -> Result<EmbeddedStore, StoreError> {
        let fail = |reason: String| StoreError::Embedded {
            path: path.to_path_buf(),
            reason,
        };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        }
        let boot_id = boot::boot_id().map_err(|e| {
            fail(format!(
                "cannot read this host's boot id from {}: {e}",
                boot::BOOT_ID_PATH
            ))
        })?;
        let mut connection =
            Connection::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
        // Workers started together on a new file (systemd at boot) prepare it at once: switching it to WAL
        // answers "database is locked" at once, without waiting in SQLite's busy handler, to all but one.
        let started = std::time::Instant::now();
        loop {
            match prepare(&mut connection) {
                Ok(()) => break,
                Err(Unprepared::Busy(_)) if started.elapsed() < OPEN_BUSY_LIMIT => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(Unprepared::Busy(why)) => {
                    return Err(fail(format!(
                        "still locked by another process after {} s: {why}",
                        OPEN_BUSY_LIMIT.as_secs()
                    )))
                }
                Err(Unprepared::Unusable(why)) => return Err(fail(why)),
            }
        }
        // The connection opened the file at the path a moment ago, and its schema is read: this is it.
        let file = FileId::of(path).map_err(|e| fail(format!("cannot look at the file: {e}")))?;
        Ok(EmbeddedStore {
            shared: Arc::new(Shared {
                settings,
                history,
                path: path.to_path_buf(),
                boot_id,
                connection: Mutex::new(connection),
                file,
                readers: Mutex::new(Vec::new()),
                reading: tokio::sync::Semaphore::new(READERS),
            }),
        })
    }

    /// Another handle on the same store (the same connection), for a write in the background.
    fn clone_handle(&self) -> EmbeddedStore {
        EmbeddedStore {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Runs `work` in one `BEGIN IMMEDIATE` transaction on a blocking thread and commits it; a failure
    /// (the database busy past [`BUSY_TIMEOUT`], a disk error) rolls it back and is told as the one
    /// node's failure, and a file that is no longer the path's as that fault ([`Self::write_checked`]).
    async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Shared, &Transaction) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, QuorumFailure> {
        self.write_checked(work)
            .await
            .map_err(|failed| self.shared.quorum(failed))
    }

    /// [`Self::write`], telling a file that is no longer the path's ([`FileId::check`], before the
    /// transaction) apart from the node's failures.
    async fn write_checked<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Shared, &Transaction) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, Failed> {
        let shared = Arc::clone(&self.shared);
        let joined = tokio::task::spawn_blocking(move || {
            // A panic while holding the connection leaves no transaction open (dropping one rolls it
            // back), so a poisoned lock is used as it is.
            let mut connection = shared
                .connection
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            shared.file.check(&shared.path).map_err(Failed::Fault)?;
            let transaction =
                connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let value = work(&shared, &transaction)?;
            transaction.commit()?;
            Ok(value)
        })
        .await;
        joined.unwrap_or_else(|e| Err(Failed::Node(format!("the database call failed: {e}"))))
    }

    /// Runs `work` on one of the read-only connections on a blocking thread, never on the lock path's
    /// connection: it waits (without a thread) for one of the [`READERS`], and is interrupted after
    /// [`READ_LIMIT`].
    async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Shared, &mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, QuorumFailure> {
        let Ok(_permit) = self.shared.reading.acquire().await else {
            return Err(self.shared.failure("the store is closed".to_string()));
        };
        let shared = Arc::clone(&self.shared);
        let (started, interrupt) = tokio::sync::oneshot::channel();
        let mut joined = tokio::task::spawn_blocking(move || {
            let mut reader = match shared.take_reader() {
                Ok(reader) => reader,
                Err(e) => return Err(format!("cannot open a read connection: {e}")),
            };
            let _ = started.send(Arc::clone(&reader.interrupt));
            let read = work(&shared, &mut reader.connection);
            shared.give_back(reader);
            read.map_err(|e| match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::OperationInterrupted) => {
                    format!("the read was stopped after {READ_LIMIT:?}")
                }
                _ => e.to_string(),
            })
        });
        let read = match tokio::time::timeout(READ_LIMIT, &mut joined).await {
            Ok(read) => read,
            Err(_) => {
                if let Ok(interrupt) = interrupt.await {
                    interrupt.interrupt();
                }
                joined.await
            }
        };
        read.unwrap_or_else(|e| Err(format!("the database call failed: {e}")))
            .map_err(|why| self.shared.failure(why))
    }
}

impl Shared {
    /// An idle read-only connection, or a new one. Opened without `CREATE`, so a file deleted since is
    /// an error here, never a new empty database.
    fn take_reader(&self) -> rusqlite::Result<Reader> {
        let idle = self
            .readers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        if let Some(reader) = idle {
            return Ok(reader);
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let connection = Connection::open_with_flags(&self.path, flags)?;
        connection.busy_timeout(BUSY_TIMEOUT)?;
        let interrupt = Arc::new(connection.get_interrupt_handle());
        Ok(Reader {
            connection,
            interrupt,
        })
    }

    /// Returns a read connection to the idle ones.
    fn give_back(&self, reader: Reader) {
        self.readers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(reader);
    }

    /// `failed` as the failure of the store's one node (a fault named as what it is).
    fn quorum(&self, failed: Failed) -> QuorumFailure {
        match failed {
            Failed::Node(why) => self.failure(why),
            Failed::Fault(fault) => self.failure(fault.to_string()),
        }
    }
}

impl Health for EmbeddedStore {
    /// `embedded:<path>`.
    fn describe(&self) -> String {
        format!("embedded:{}", self.path().display())
    }

    fn nodes(&self) -> Vec<String> {
        vec![self.describe()]
    }

    /// Not shared beyond this host: only its worker processes open the file.
    fn is_shared(&self) -> bool {
        false
    }

    fn settings(&self) -> &LockSettings {
        &self.shared.settings
    }

    fn history_settings(&self) -> &HistorySettings {
        &self.shared.history
    }

    /// None: the only clock is this host's.
    async fn read_clocks(&self) -> Option<Readings> {
        None
    }

    /// The database's write lock taken (`BEGIN IMMEDIATE`, as a claim takes it) and let go, waiting for
    /// another process's at most `BUSY_TIMEOUT`: the file answers, and a claim could be decided now.
    ///
    /// A file that is no longer the path's ([`StoreFault::FileReplaced`]) is not ready.
    async fn readiness(&self) -> Result<Option<Readings>, String> {
        match self.write_checked(|_, _| Ok(())).await {
            Ok(()) => Ok(None),
            Err(Failed::Fault(fault)) => Err(fault.to_string()),
            Err(Failed::Node(why)) => Err(format!(
                "the database does not answer: {}: {why}",
                self.shared.label()
            )),
        }
    }

    /// Nothing to prepare: ready at once.
    async fn prepare(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl Shared {
    /// `why` as the failure of this store's one node, named by its path.
    fn failure(&self, why: String) -> QuorumFailure {
        QuorumFailure {
            unheard: Vec::new(),
            refused: Vec::new(),
            configured: 1,
            needed: 1,
            granted: 0,
            failures: vec![(self.label(), why)],
        }
    }

    /// The database's path, to name it in failures.
    fn label(&self) -> String {
        self.path.display().to_string()
    }

    /// How long a lease or heartbeat stored as `(boot_id, expires_ns)` has left at `now`; `None` once it
    /// expired, or if it was stored in another boot.
    fn left(&self, boot_id: &str, expires_ns: i64, now: BootInstant) -> Option<Duration> {
        let expires = BootInstant::from_since_boot(Duration::from_nanos(
            u64::try_from(expires_ns).unwrap_or(0),
        ));
        (boot_id == self.boot_id && expires > now).then(|| expires.saturating_duration_since(now))
    }
}

/// This host's wall clock in milliseconds since the epoch: what pauses, trigger requests and the windows
/// of one-off claims expire on (as Redis expires keys on its own clock).
fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A point on the boot clock as stored: nanoseconds since boot (an `i64` lasts 292 years of uptime).
fn nanos(at: BootInstant) -> i64 {
    i64::try_from(at.since_boot().as_nanos()).unwrap_or(i64::MAX)
}

/// Why [`prepare`] failed: another process holds the file for now (try again), or it cannot be used.
enum Unprepared {
    Busy(String),
    Unusable(String),
}

/// How long a starting worker waits for other processes preparing the same file.
const OPEN_BUSY_LIMIT: Duration = Duration::from_secs(10);

/// Sets the connection up (write-ahead log, full sync, busy timeout) and creates or checks the schema;
/// the error says what is wrong with the file, or that another process holds it for now.
fn prepare(connection: &mut Connection) -> Result<(), Unprepared> {
    let not_usable = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            Unprepared::Busy(e.to_string())
        }
        _ => Unprepared::Unusable(format!("not a usable SQLite database: {e}")),
    };
    connection.busy_timeout(BUSY_TIMEOUT).map_err(not_usable)?;
    // The first read of the file: one that is not a database fails here.
    connection
        .query_row("PRAGMA journal_mode = WAL", [], |row| {
            row.get::<_, String>(0)
        })
        .map_err(not_usable)?;
    if connection.is_readonly(rusqlite::MAIN_DB).unwrap_or(true) {
        return Err(Unprepared::Unusable(
            "the file is read-only to this user".to_string(),
        ));
    }
    connection
        .pragma_update(None, "synchronous", "FULL")
        .map_err(not_usable)?;
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(not_usable)?;
    let version: i64 = transaction
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(not_usable)?;
    match version {
        0 | 1 => {
            // A new file gets schema 1 first, so that every file reaches the same schema the same way.
            if version == 0 {
                transaction.execute_batch(SCHEMA).map_err(not_usable)?;
            }
            transaction.execute_batch(SCHEMA_2).map_err(not_usable)?;
            transaction
                .pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(not_usable)?;
        }
        SCHEMA_VERSION => {}
        newer => {
            return Err(Unprepared::Unusable(format!(
                "written by a newer redcron (schema {newer}; this one knows {SCHEMA_VERSION})"
            )))
        }
    }
    transaction.commit().map_err(not_usable)
}
