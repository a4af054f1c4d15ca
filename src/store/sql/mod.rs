//! The SQL store: claims, leases, fencing tokens, run history, membership, pauses and trigger requests in
//! the tables of one PostgreSQL (13+) or MySQL (8.0+) / MariaDB (10.6+) database — the database most teams
//! already run (a config with `postgres:` or `mysql:`).
//!
//! One database server is one node and one majority, as the embedded store's file is: both rounds of a
//! claim happen in one transaction with the rules of the Lua scripts ([`crate::store::redis::scripts`])
//! and the keys of [`crate::lock::keys`] (`claim.rs`), so the answers are those a Redis cluster gives in the
//! same situation. What serialises two workers' decisions on one job is a row lock: every transaction that
//! decides on a job's claims or pause first locks the job's fence row (`SELECT … FOR UPDATE`) and holds it
//! to its commit, so the token strictly increases in commit order. Every time a decision depends on is
//! read from **the database's clock** (`clock_timestamp()`, `UTC_TIMESTAMP(6)`), never a worker's. No
//! session state is used (no advisory locks, no session variables), so the store works behind a pooler
//! in transaction mode (PgBouncer).
//!
//! The code is one for both servers: sqlx's `Any` driver runs the SQL text of the server's
//! [`dialect::Dialect`] (placeholders, upserts, the clock, column types). Times are stored as integers (ms
//! or µs since the epoch), so no time zone setting of the server or the session can change them.
//!
//! Reads (history, members, pauses and trigger requests, for the dashboard, the command line and the
//! worker's checks) have a pool of their own, [`READ_CONNECTIONS`] sessions whose statements the server
//! stops after the read's budget (`statement_timeout`, MariaDB's `max_statement_time`): the lock path —
//! claims, renewals, releases — keeps all of `pool_size`, and no read, however many, can take one of its
//! connections. A statement refused for want of a privilege closes its connection (the server may keep a
//! session's rights from before a `GRANT`), answers claims with [`StoreFault::PermissionDenied`] and
//! makes `/readyz` not ready until the rights are back.
//!
//! What this store assumes, and what a failure of the server costs: docs/protocol.md, *The SQL store*.

mod claim;
mod dialect;
mod pause;
mod records;
mod schema;
mod triggers;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Connection as _};

use crate::clock::cluster::{Readings, Sample};
use crate::config::SqlConfig;
use crate::history::HistorySettings;
use crate::lock::{LockSettings, QuorumFailure, StoreFault};
use crate::store::{Health, StoreError};

pub use dialect::Dialect;
pub use schema::{Schema, Unusable, SCHEMA_VERSION};

/// How many times a transaction that the server aborted as a serialization failure or a deadlock
/// (SQLSTATE `40001`, `40P01`; MySQL's 1213 is `40001`) is run again before its caller is told it failed.
const CONFLICT_RETRIES: u32 = 5;

/// How often an acquire that opens a connection (or waits for its turn to) looks for one that came back
/// to the pool (sqlx tells no one when a connection is returned).
const RETURNED_POLL: Duration = Duration::from_millis(10);

/// How long the pool goes on opening one connection after the call that needed it stopped waiting (see
/// `SqlStore::connection`): an opening is carried to its end, not replaced, unless the server has not
/// let it finish in this long (at least twice `node_timeout`).
const OPENING_PATIENCE: Duration = Duration::from_secs(5);

/// How many connections a store opens at once; the calls that need more wait for these (see
/// `SqlStore::connection`).
const OPENING_AT_ONCE: usize = 2;

/// How many sessions the reads have, beside the lock path's `pool_size`: reads beyond them wait for one
/// within their budget.
const READ_CONNECTIONS: u32 = 2;

/// Claims, leases, tokens, history, membership, pauses and triggers in one SQL database.
pub struct SqlStore {
    shared: Arc<Shared>,
}

/// What the calls of a store share, with the tasks it spawns.
struct Shared {
    settings: LockSettings,
    history: HistorySettings,
    dialect: Dialect,
    /// `host:port/database`, to name the server in logs and errors (never a password).
    target: String,
    /// The lock path's sessions: claims, renewals, releases, and the other writes.
    pool: Arc<Sessions>,
    /// The reads' sessions ([`READ_CONNECTIONS`], their statements bounded by the server).
    reads: Arc<Sessions>,
    /// The last permission error of a statement, until a check of the rights passes
    /// ([`SqlStore::rights_back`]): `/readyz` is not ready while it is set.
    denied: std::sync::Mutex<Option<String>>,
    /// The session settings every connection starts with ([`Dialect::on_connect`]).
    on_connect: Arc<[String]>,
    /// Set once the schema has been checked (and created or upgraded) on the server.
    prepared: tokio::sync::OnceCell<()>,
}

/// A pool of sessions with its own opening rule (see `SqlStore::connection`).
struct Sessions {
    /// What a session of the pool is called in errors: `connection`, `read connection`.
    name: &'static str,
    pool: AnyPool,
    /// The pool's largest size.
    size: u32,
    /// [`OPENING_AT_ONCE`] permits: held by an acquire that may open a connection.
    opening: tokio::sync::Semaphore,
}

impl Sessions {
    fn new(name: &'static str, pool: AnyPool, size: u32) -> Arc<Sessions> {
        Arc::new(Sessions {
            name,
            pool,
            size,
            opening: tokio::sync::Semaphore::new(OPENING_AT_ONCE),
        })
    }
}

/// Why a transaction did not answer.
#[derive(Debug)]
enum Failed {
    /// The server answered with an error before anything was committed (or could not be reached).
    Before(String),
    /// The commit was sent and its answer lost (the connection broke, or the budget ran out while it was
    /// under way): the transaction may have committed or not. Reading back tells.
    Unknown(String),
    /// The server answered, but the store cannot be used (see [`Unusable`]).
    Unusable(Unusable),
    /// The server refused a statement for want of a privilege (nothing was written); the connection was
    /// closed.
    Denied(String),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Before(why) => f.write_str(why),
            Failed::Unknown(why) => write!(f, "the commit's answer was lost: {why}"),
            Failed::Unusable(why) => write!(f, "{why}"),
            Failed::Denied(why) => write!(f, "permission denied: {why}"),
        }
    }
}

impl SqlStore {
    /// A store on the database `config` names, with a pool of lazily opened connections: nothing is sent
    /// to the server until the first call ([`Health::prepare`] checks it at once). Must be called inside
    /// a Tokio runtime. Fails only on settings that cannot name a server.
    pub fn new(
        config: &SqlConfig,
        settings: LockSettings,
        history: HistorySettings,
    ) -> Result<SqlStore, StoreError> {
        sqlx::any::install_default_drivers();
        let dialect = Dialect::new(config.dialect, &settings.key_prefix);
        let target = dialect::target(&config.url);
        let fail = |reason: String| StoreError::Sql {
            dialect: config.dialect.section(),
            target: target.clone(),
            reason,
        };
        let url = dialect::connect_url(config).map_err(fail)?;
        let options: AnyConnectOptions = url.parse().map_err(|e: sqlx::Error| {
            fail(format!(
                "the URL does not parse: {}",
                dialect::scrub(&e.to_string())
            ))
        })?;
        // The driver logs every statement, and slow ones as warnings without redcron's event names; a
        // call that fails or is late is redcron's to report (no_quorum, lease.lost, …).
        let options = sqlx::ConnectOptions::log_slow_statements(
            sqlx::ConnectOptions::log_statements(options, log::LevelFilter::Off),
            log::LevelFilter::Off,
            Duration::from_secs(3600),
        );
        // Bounds on lock waits and on idle sessions, in whole seconds on MySQL (see Dialect::on_connect).
        let lock_s = settings.node_timeout.as_secs().max(1);
        let idle_s = settings.ttl.as_secs().max(2);
        // As PostgreSQL's per-transaction bound (twice node_timeout), rounded up to whole seconds.
        let idle_transaction_s = (settings.node_timeout * 2)
            .as_millis()
            .div_ceil(1000)
            .max(1) as u64;
        let on_connect: Arc<[String]> = dialect
            .on_connect(lock_s, idle_s, idle_transaction_s)
            .into();
        // A read's statements end on the server when its longest budget (`SqlStore::read_budget`) has
        // passed, rather than running on after the client gave up on them.
        let read_ms = (settings.node_timeout * 4).as_millis().max(1);
        let mut read_session: Vec<String> = on_connect.to_vec();
        read_session.extend(dialect.read_session(lock_s, read_ms));
        let read_session: Arc<[String]> = read_session.into();
        let reads = AnyPoolOptions::new()
            .after_connect(move |connection, _| {
                let read_session = Arc::clone(&read_session);
                Box::pin(async move { start_session(connection, &read_session).await })
            })
            .max_connections(READ_CONNECTIONS)
            .min_connections(0)
            .acquire_timeout(acquire_timeout(&settings))
            .idle_timeout(Duration::from_secs(300))
            .max_lifetime(Duration::from_secs(1800))
            .test_before_acquire(config.dialect == crate::config::SqlDialect::Mysql)
            .connect_lazy_with(options.clone());
        let pool = AnyPoolOptions::new()
            .after_connect({
                let on_connect = Arc::clone(&on_connect);
                move |connection, _| {
                    let on_connect = Arc::clone(&on_connect);
                    Box::pin(async move { start_session(connection, &on_connect).await })
                }
            })
            .max_connections(config.pool_size)
            .min_connections(0)
            // Each call waits for a connection within its own budget (`SqlStore::connection`); the pool's
            // bound is how long an acquire goes on after its caller left — time to open a session on a
            // loaded server, which then serves the next call.
            .acquire_timeout(acquire_timeout(&settings))
            .idle_timeout(Duration::from_secs(300))
            .max_lifetime(Duration::from_secs(1800))
            // MySQL ends a session idle for `wait_timeout` (set to a TTL: see Dialect::on_connect), so a
            // pooled connection may be gone: pinged before use there. PostgreSQL keeps idle sessions.
            .test_before_acquire(config.dialect == crate::config::SqlDialect::Mysql)
            .connect_lazy_with(options);
        Ok(SqlStore {
            shared: Arc::new(Shared {
                settings,
                history,
                dialect,
                target,
                pool: Sessions::new("connection", pool, config.pool_size),
                reads: Sessions::new("read connection", reads, READ_CONNECTIONS),
                denied: std::sync::Mutex::new(None),
                on_connect,
                prepared: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// Another handle on the same store (the same pool), for a write in the background.
    fn clone_handle(&self) -> SqlStore {
        SqlStore {
            shared: Arc::clone(&self.shared),
        }
    }

    /// `host:port/database`: the server, as logs and errors name it.
    pub fn target(&self) -> &str {
        &self.shared.target
    }

    /// The statement `sql` with the store's tables and the server's placeholders ([`Dialect::sql`]).
    fn sql(&self, sql: &str) -> String {
        self.shared.dialect.sql(sql)
    }

    /// The budget of one call: a node's timeout, as on the other stores, and at least the time a commit
    /// takes on a loaded server.
    fn budget(&self) -> Duration {
        self.shared.settings.node_timeout
    }

    /// Runs `work` in one transaction (`READ COMMITTED`: each statement sees what committed before it)
    /// and commits it, within `budget`: again, up to [`CONFLICT_RETRIES`] times, when the server aborts it
    /// as a serialization failure or a deadlock (nothing was written). A transaction cut off by the
    /// budget, or whose connection broke, is rolled back by the server, and its connection is closed,
    /// never reused.
    async fn transaction<T, F>(&self, budget: Duration, work: F) -> Result<T, Failed>
    where
        T: Send,
        F: for<'c> Fn(&'c mut AnyConnection) -> BoxFuture<'c, Result<T, sqlx::Error>> + Send + Sync,
    {
        self.prepared().await?;
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            let left = budget.saturating_sub(started.elapsed());
            let outcome = self.attempt(left, &work).await;
            let time_left = started.elapsed() < budget;
            match outcome {
                Err(Failed::Before(_))
                    if attempt < CONFLICT_RETRIES
                        && time_left
                        && self.last_was_conflict(&outcome) =>
                {
                    attempt += 1;
                    let jitter = rand::random_range(1..=5 * u64::from(attempt));
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
                other => return other,
            }
        }
    }

    /// Whether a failed attempt was a conflict worth running again ([`SqlStore::describe_error`]).
    fn last_was_conflict<T>(&self, outcome: &Result<T, Failed>) -> bool {
        matches!(outcome, Err(Failed::Before(why)) if why.starts_with(CONFLICT_MARK))
    }

    /// One attempt of [`Self::transaction`].
    async fn attempt<T, F>(&self, budget: Duration, work: &F) -> Result<T, Failed>
    where
        T: Send,
        F: for<'c> Fn(&'c mut AnyConnection) -> BoxFuture<'c, Result<T, sqlx::Error>> + Send + Sync,
    {
        let mut connection = self.connection(&self.shared.pool, budget).await?;
        let mut committing = false;
        let result = tokio::time::timeout(budget, async {
            let mut transaction = connection.begin_with(self.shared.dialect.begin()).await?;
            let settings = &self.shared.settings;
            // A live worker's transaction is never idle for long (it is given up after its budget), so a
            // worker frozen inside one is cut off after twice the budget, not a TTL: until then it holds
            // the job's rows and every other worker's claim of the job waits.
            let idle = (settings.node_timeout * 2).max(Duration::from_secs(1));
            if let Some(bounds) = self
                .shared
                .dialect
                .in_transaction(settings.node_timeout.as_millis(), idle.as_millis())
            {
                sqlx::Executor::execute(&mut *transaction, sqlx::AssertSqlSafe(bounds)).await?;
            }
            let value = work(&mut transaction).await?;
            committing = true;
            transaction.commit().await?;
            Ok::<T, sqlx::Error>(value)
        })
        .await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                let answered = matches!(e, sqlx::Error::Database(_));
                if !answered {
                    // The connection broke: never hand it out again.
                    connection.close_on_drop();
                }
                let why = self.describe_error(&e);
                if denied(&e) {
                    connection.close_on_drop();
                    return Err(self.note_denied(why));
                }
                if committing && !answered {
                    Err(Failed::Unknown(why))
                } else {
                    Err(Failed::Before(why))
                }
            }
            Err(_) => {
                connection.close_on_drop();
                let why = format!("no answer within {budget:?}");
                if committing {
                    Err(Failed::Unknown(why))
                } else {
                    Err(Failed::Before(why))
                }
            }
        }
    }

    /// A connection of the pool, waited for at most `budget`.
    ///
    /// Opening a session costs the server a backend and both sides a login (PostgreSQL's SCRAM: 4,096
    /// rounds of HMAC-SHA-256 on the client), which on a loaded machine takes longer than a claim's
    /// budget. Two rules keep a worker's pool from starving itself once the server is back after an
    /// outage (killed, or SIGSTOPped), when every call needs a new session at once:
    /// - **An opening is carried to its end.** The acquire runs as a task of its own, bounded by the
    ///   pool's `acquire_timeout` ([`OPENING_PATIENCE`]), not by its caller: a connection it opens after
    ///   the caller left joins the pool for the next call. Cancelled with their callers, no opening ever
    ///   finished within a claim's budget (seen as 4 s of `no_quorum` on one worker); given up after 1 s,
    ///   each was replaced by a new one, eight per worker sharing the CPU and none finishing — 6–10 s of
    ///   `no_quorum` on every long-lived worker after the server was back, while a new process connected
    ///   at once.
    /// - **At most [`OPENING_AT_ONCE`] openings at a time.** An acquire that may open a connection (the
    ///   pool has no idle one and is below `pool_size`) waits for a permit first, and is dropped without
    ///   opening if its caller has left by then; so the first session is ready after one login's time,
    ///   not eight logins' shared. An acquire that can only wait for a connection to come back is
    ///   dropped as soon as its caller leaves, so no connection is handed to a caller that is gone.
    /// - **A connection that comes back is taken.** While an acquire waits for its permit or its login,
    ///   it looks every [`RETURNED_POLL`] for a connection returned to the pool and hands that over
    ///   instead (it was in use a moment ago: no liveness test); the opening goes on (or, still waiting
    ///   for its permit, never starts) and what it opens joins the pool. A call that finished must not
    ///   leave the next one waiting for a login.
    ///
    /// The reads' sessions follow the same rules, so a hung server costs each pool at most
    /// [`OPENING_AT_ONCE`] waiting connections per [`OPENING_PATIENCE`].
    async fn connection(
        &self,
        sessions: &Arc<Sessions>,
        budget: Duration,
    ) -> Result<PoolConnection<Any>, Failed> {
        let (hand_over, handed) = tokio::sync::oneshot::channel();
        let (name, size) = (sessions.name, sessions.size);
        let sessions = Arc::clone(sessions);
        tokio::spawn(async move {
            let mut hand_over = hand_over;
            let pool = &sessions.pool;
            let acquired = if pool.num_idle() == 0 && pool.size() < sessions.size {
                // The opening runs as a task of its own (carried to its end); while it waits for its
                // permit or logs in, a connection that comes back to the pool is taken instead, and
                // what the opening opens then joins the pool.
                let wanted = Arc::new(AtomicBool::new(true));
                let mut opening =
                    tokio::spawn(open_one(Arc::clone(&sessions), Arc::clone(&wanted)));
                loop {
                    tokio::select! {
                        opened = &mut opening => match opened {
                            Ok(Some(acquired)) => break acquired,
                            Ok(None) | Err(_) => return,
                        },
                        () = tokio::time::sleep(RETURNED_POLL) => {
                            if hand_over.is_closed() {
                                wanted.store(false, Ordering::Relaxed);
                                return;
                            }
                            if let Some(connection) = pool.try_acquire() {
                                wanted.store(false, Ordering::Relaxed);
                                break Ok(connection);
                            }
                        }
                    }
                }
            } else {
                tokio::select! {
                    acquired = pool.acquire() => acquired,
                    () = hand_over.closed() => return,
                }
            };
            // A caller that left drops it: back to the pool.
            let _ = hand_over.send(acquired);
        });
        match tokio::time::timeout(budget, handed).await {
            Ok(Ok(Ok(connection))) => Ok(connection),
            Ok(Ok(Err(e))) => Err(Failed::Before(self.describe_error(&e))),
            Ok(Err(_)) => Err(Failed::Before("the connection task failed".to_string())),
            Err(_) => Err(Failed::Before(format!(
                "no {name} within {budget:?} ({size} in the pool)"
            ))),
        }
    }

    /// A session outside the pool, started as the pool's are: the driver's own error when the server
    /// cannot be reached (a refused connection at once, which the pool would retry until its timeout).
    async fn direct_session(&self) -> Result<AnyConnection, sqlx::Error> {
        let options = self.shared.pool.pool.connect_options();
        let mut connection = AnyConnection::connect_with(&options).await?;
        start_session(&mut connection, &self.shared.on_connect).await?;
        Ok(connection)
    }

    /// One statement (or a few) outside a transaction, on a connection of the lock path's pool, within
    /// `budget`.
    async fn with_connection<T, F>(&self, budget: Duration, work: F) -> Result<T, Failed>
    where
        T: Send,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<T, sqlx::Error>> + Send,
    {
        self.prepared().await?;
        let connection = self.connection(&self.shared.pool, budget).await?;
        self.run_on(connection, budget, work).await
    }

    /// As [`Self::with_connection`], on a connection of the reads' pool ([`READ_CONNECTIONS`]), never
    /// one of the lock path's: waited for within `budget`, with the rest of it for the statements.
    async fn with_reader<T, F>(&self, budget: Duration, work: F) -> Result<T, Failed>
    where
        T: Send,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<T, sqlx::Error>>
            + Send
            + 'static,
    {
        self.prepared().await?;
        let started = Instant::now();
        let connection = self.connection(&self.shared.reads, budget).await?;
        let left = budget.saturating_sub(started.elapsed());
        // On PostgreSQL the bound is the transaction's own (`SET LOCAL`), so no session state is left for a
        // pooler in transaction mode to hand to another client.
        let Some(bound) = self.shared.dialect.read_bound(left.as_millis().max(1)) else {
            return self.run_on(connection, left, work).await;
        };
        let begin = self.shared.dialect.begin_read();
        self.run_on(connection, left, move |connection| {
            Box::pin(async move {
                let mut transaction = connection.begin_with(begin).await?;
                sqlx::Executor::execute(&mut *transaction, sqlx::AssertSqlSafe(bound)).await?;
                let value = work(&mut transaction).await?;
                transaction.commit().await?;
                Ok(value)
            })
        })
        .await
    }

    /// Runs `work` on `connection` within `budget`; a connection that broke, was cut off, or was refused
    /// a statement for want of a privilege is closed, never reused.
    async fn run_on<T, F>(
        &self,
        mut connection: PoolConnection<Any>,
        budget: Duration,
        work: F,
    ) -> Result<T, Failed>
    where
        T: Send,
        F: for<'c> FnOnce(&'c mut AnyConnection) -> BoxFuture<'c, Result<T, sqlx::Error>> + Send,
    {
        match tokio::time::timeout(budget, work(&mut connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if !matches!(e, sqlx::Error::Database(_)) || denied(&e) {
                    connection.close_on_drop();
                }
                let why = self.describe_error(&e);
                if denied(&e) {
                    return Err(self.note_denied(why));
                }
                Err(Failed::Before(why))
            }
            Err(_) => {
                connection.close_on_drop();
                Err(Failed::Before(format!("no answer within {budget:?}")))
            }
        }
    }

    /// Keeps `why`, a permission error, for `/readyz` (until [`Self::rights_back`]), as a call's failure.
    fn note_denied(&self, why: String) -> Failed {
        *self
            .shared
            .denied
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(why.clone());
        Failed::Denied(why)
    }

    /// A permission error `why` as a claim's fault.
    fn permission_fault(&self, why: String) -> StoreFault {
        StoreFault::PermissionDenied {
            target: self.shared.target.clone(),
            why,
        }
    }

    /// After a permission error: whether the rights are back, checked as at start
    /// ([`schema::missing_right`]) on a session of its own (a pooled one may keep the rights it had);
    /// `Err` with what is missing while they are not. Clears the error once they are.
    async fn rights_back(&self) -> Result<(), String> {
        let noted = self
            .shared
            .denied
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let Some(noted) = noted else {
            return Ok(());
        };
        let target = &self.shared.target;
        let budget = self.budget() * 4;
        let checked = tokio::time::timeout(budget, async {
            let mut connection = self.direct_session().await?;
            let missing = schema::missing_right(&self.shared.dialect, &mut connection).await;
            let _ = connection.close().await;
            missing
        })
        .await;
        match checked {
            Ok(Ok(None)) => {
                *self
                    .shared
                    .denied
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
                Ok(())
            }
            Ok(Ok(Some(missing))) => Err(format!("{target}: permission denied: {missing}")),
            Ok(Err(e)) => Err(format!(
                "{target}: permission denied: {noted} (the rights could not be checked again: {})",
                self.describe_error(&e)
            )),
            Err(_) => Err(format!(
                "{target}: permission denied: {noted} (the rights could not be checked again within {budget:?})"
            )),
        }
    }

    /// The schema checked once ([`Health::prepare`]); a failure as this call's.
    async fn prepared(&self) -> Result<(), Failed> {
        let shared = &self.shared;
        shared
            .prepared
            .get_or_try_init(|| schema::prepare(self))
            .await
            .map(|_| ())
    }

    /// `e` in one line without a password, marked when it is a conflict worth running again.
    fn describe_error(&self, e: &sqlx::Error) -> String {
        let Some(db) = e.as_database_error() else {
            return match e {
                // The pool retries a refused connection until its timeout and keeps no cause.
                sqlx::Error::PoolTimedOut => format!(
                    "no connection within {:?}: the server refused it, is unreachable or does not answer",
                    acquire_timeout(&self.shared.settings)
                ),
                other => dialect::scrub(&other.to_string()),
            };
        };
        let code = db.code();
        // The server's own message and code, without the driver's wrapping or its source line.
        let text = dialect::scrub(&format!(
            "{} (SQLSTATE {})",
            db.message(),
            code.as_deref().unwrap_or("?")
        ));
        let number = db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|e| e.number());
        // Serialization failures and deadlocks (nothing was written), and a lock not had within
        // `lock_timeout` / `innodb_lock_wait_timeout` (PostgreSQL 55P03, MySQL 1205): worth running again
        // while the call's budget lasts.
        if matches!(code.as_deref(), Some("40001" | "40P01" | "55P03")) || number == Some(1205) {
            format!("{CONFLICT_MARK}{text}")
        } else {
            text
        }
    }

    /// The store's one node as a failed majority: `why` names the server.
    fn failure(&self, why: impl std::fmt::Display) -> QuorumFailure {
        QuorumFailure {
            unheard: Vec::new(),
            refused: Vec::new(),
            configured: 1,
            needed: 1,
            granted: 0,
            failures: vec![(self.shared.target.clone(), why.to_string())],
        }
    }

    /// The database's clock, in µs since the epoch, with the round trip it took.
    async fn read_clock(&self) -> Result<Sample, Failed> {
        let sql = self.sql("SELECT {now_us}");
        let sent_us = chrono::Utc::now().timestamp_micros();
        let sent = Instant::now();
        let node_us: i64 = self
            .with_connection(self.budget(), move |connection| {
                Box::pin(async move {
                    let row: (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                        .fetch_one(connection)
                        .await?;
                    Ok(row.0)
                })
            })
            .await?;
        Ok(Sample {
            node: 0,
            sent_us,
            rtt: sent.elapsed(),
            node_us,
        })
    }
}

/// One connection opened for `sessions` (see `SqlStore::connection`), once one of its
/// [`OPENING_AT_ONCE`] permits is free: `None`, without opening, if it is no longer `wanted` by then.
async fn open_one(
    sessions: Arc<Sessions>,
    wanted: Arc<AtomicBool>,
) -> Option<Result<PoolConnection<Any>, sqlx::Error>> {
    let _opening = sessions.opening.acquire().await.ok()?;
    if !wanted.load(Ordering::Relaxed) {
        return None;
    }
    Some(sessions.pool.acquire().await)
}

/// How long the pool's acquire goes on opening a connection: twice `node_timeout`, at least
/// [`OPENING_PATIENCE`].
fn acquire_timeout(settings: &LockSettings) -> Duration {
    (settings.node_timeout * 2).max(OPENING_PATIENCE)
}

/// Runs the session settings `on_connect` ([`Dialect::on_connect`]) on a new connection.
async fn start_session(
    connection: &mut AnyConnection,
    on_connect: &[String],
) -> Result<(), sqlx::Error> {
    for statement in on_connect {
        sqlx::Executor::execute(&mut *connection, sqlx::AssertSqlSafe(statement.clone())).await?;
    }
    Ok(())
}

/// Whether `e` is the server's refusal of a statement for want of a privilege: PostgreSQL `42501`;
/// MySQL/MariaDB 1142 (a command on a table), 1143 (on a column), 1044 (on the database), 1227 (needs a
/// global privilege), 1370 (a routine).
fn denied(e: &sqlx::Error) -> bool {
    let Some(db) = e.as_database_error() else {
        return false;
    };
    let number = db
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number());
    db.code().as_deref() == Some("42501")
        || matches!(number, Some(1142 | 1143 | 1044 | 1227 | 1370))
}

/// The start of a failure's text that marks it as the server's serialization failure or deadlock.
const CONFLICT_MARK: &str = "conflict: ";

impl Health for SqlStore {
    /// `postgres:<host:port/database>` or `mysql:<host:port/database>`.
    fn describe(&self) -> String {
        format!("{}:{}", self.shared.dialect.section(), self.shared.target)
    }

    fn nodes(&self) -> Vec<String> {
        vec![self.describe()]
    }

    /// Shared: every worker that names the database races in it.
    fn is_shared(&self) -> bool {
        true
    }

    fn settings(&self) -> &LockSettings {
        &self.shared.settings
    }

    fn history_settings(&self) -> &HistorySettings {
        &self.shared.history
    }

    /// The database's clock, read once: cluster time is the server's.
    async fn read_clocks(&self) -> Option<Readings> {
        Some(self.clock_readings().await)
    }

    /// The database's clock, read as a claim reads it; the server in recovery or read-only (a standby, or
    /// a primary fenced by the operator) is not ready, since no claim could be written.
    ///
    /// After a permission error, not ready until the rights are back ([`SqlStore::rights_back`]).
    async fn readiness(&self) -> Result<Option<Readings>, String> {
        self.rights_back().await?;
        let sql = self.sql("SELECT {read_only}");
        let read_only = self
            .with_connection(self.budget(), move |connection| {
                Box::pin(async move {
                    let row: (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                        .fetch_one(connection)
                        .await?;
                    Ok(row.0 != 0)
                })
            })
            .await
            .map_err(|e| format!("{}: {e}", self.shared.target))?;
        if read_only {
            return Err(format!(
                "{}: the server is read-only (a standby, or read_only set): no claim can be written",
                self.shared.target
            ));
        }
        Ok(Some(self.clock_readings().await))
    }

    /// See [`SqlStore::prepared`]: the schema checked, created or upgraded.
    async fn prepare(&self) -> Result<(), StoreError> {
        match self.prepared().await {
            Ok(()) | Err(Failed::Before(_) | Failed::Unknown(_) | Failed::Denied(_)) => Ok(()),
            Err(Failed::Unusable(why)) => Err(StoreError::Sql {
                dialect: self.shared.dialect.section(),
                target: self.shared.target.clone(),
                reason: why.to_string(),
            }),
        }
    }
}

impl SqlStore {
    /// The one reading of the database's clock, as [`Readings`].
    async fn clock_readings(&self) -> Readings {
        let mut readings = Readings {
            configured: 1,
            ..Readings::default()
        };
        match self.read_clock().await {
            Ok(sample) => readings.samples.push(sample),
            Err(why) => readings
                .failures
                .push((self.shared.target.clone(), why.to_string())),
        }
        readings
    }
}
