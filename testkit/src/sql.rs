//! [`SqlServer`]: one real PostgreSQL or MariaDB server on a free loopback port, to crash, hang and revive.
//!
//! The SQL store's argument is about a single primary that crashes (SIGKILL), hangs (SIGSTOP) and comes
//! back with its data, so the server runs from Debian's own packages (`postgresql`, `mariadb-server`) in a
//! fresh temporary directory, is initialised there (`initdb`, `mariadb-install-db`: well under a second
//! each), counts as started only once it answers the protocol's first exchange on a port its own process
//! listens on ([`crate::ports`]), and fails the test with
//! its log otherwise. Like the Redis nodes and etcd members it is killed on drop and dies with the test
//! binary (`children::spawn`).
//!
//! Each server has a database [`DATABASE`] owned by [`USER`] (password [`PASSWORD`]), a second user
//! [`READER`] that may read and write the tables [`USER`] creates there but create none (the "no DDL
//! rights" case), and an administrator [`ADMIN`]; [`SqlServer::exec`] runs SQL as the administrator
//! through the server's own command-line client (`psql`, `mariadb`) over its Unix socket, so the harness
//! needs no SQL driver. Writes are fsynced by default (`fsync=on`, `innodb_flush_log_at_trx_commit=1`):
//! the store's durability across a server crash is what the tests check. On a 2-core shared machine a
//! server starts in 0.5–1.3 s (mostly `initdb` or `mariadb-install-db`) and restarts after a crash in
//! about 0.1 s.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root both servers run as an unprivileged
//! user (`postgres` or `mysql` as Debian's packages create them, else `nobody`): the child's uid is set
//! before exec, so the pid the harness holds is the server's own (no `runuser` in between for a signal to
//! hit instead). Every directory above the temporary directory must be searchable by that user.
//!
//! PostgreSQL is several processes: the postmaster and the backends it forks (each in a session of its
//! own). [`SqlServer::stop`] and [`SqlServer::cont`] signal all of them, so the server really hangs;
//! [`SqlServer::kill`] freezes the postmaster, SIGKILLs it and every backend, waits until they are gone,
//! and removes what a crashed server leaves outside its data directory (its System V interlock segment),
//! so that a restart is never refused and a test run leaks nothing. Dynamic shared memory is kept in the
//! data directory (`dynamic_shared_memory_type=mmap`), not in `/dev/shm`, for the same reason. Backends
//! killed with their postmaster are reparented to init; where init does not reap (some containers) they
//! stay zombies, which hold no port, memory or segment.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redcron::config::SqlDialect;

use crate::children;

/// The database the store uses, owned by [`USER`].
pub const DATABASE: &str = "redcron";
/// The user that owns [`DATABASE`] and may create tables in it.
pub const USER: &str = "redcron";
/// [`USER`]'s password.
pub const PASSWORD: &str = "secret-pw";
/// A user that may read, insert, update and delete in the tables of [`DATABASE`] but not create any.
pub const READER: &str = "reader";
/// [`READER`]'s password.
pub const READER_PASSWORD: &str = "reader-pw";
/// A superuser that may log in over TCP (PostgreSQL's bootstrap superuser, MariaDB's `admin@'%'`).
pub const ADMIN: &str = "admin";
/// [`ADMIN`]'s password.
pub const ADMIN_PASSWORD: &str = "admin-pw";

/// How long a starting (or restarting) server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long initialising a data directory may take.
const INIT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one [`SqlServer::exec`] may take (a hung server must fail the test, not hang it).
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the processes of a killed server may take to be gone.
const GONE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which server: the two the SQL store's dialects are tested on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlKind {
    /// PostgreSQL (Debian's `postgresql`), the [`SqlDialect::Postgres`] dialect.
    Postgres,
    /// MariaDB (Debian's `mariadb-server`), the [`SqlDialect::Mysql`] dialect.
    Mariadb,
}

impl SqlKind {
    /// The store dialect that talks to this server.
    pub fn dialect(self) -> SqlDialect {
        match self {
            SqlKind::Postgres => SqlDialect::Postgres,
            SqlKind::Mariadb => SqlDialect::Mysql,
        }
    }

    /// `postgres` or `mariadb`, for messages and directory names.
    pub fn name(self) -> &'static str {
        match self {
            SqlKind::Postgres => "postgres",
            SqlKind::Mariadb => "mariadb",
        }
    }

    /// The URL scheme of the store's `url`: `postgres` or `mysql`.
    pub fn scheme(self) -> &'static str {
        self.dialect().section()
    }
}

/// Options for [`SqlServer`]; start with [`SqlServer::builder`].
#[derive(Debug, Clone)]
pub struct SqlServerBuilder {
    kind: SqlKind,
    fsync: bool,
    tls: bool,
}

impl SqlServerBuilder {
    /// Whether commits are flushed to disk (on by default). Off (`fsync=off`,
    /// `innodb_flush_log_at_trx_commit=2`) a commit still reaches the kernel before it is acknowledged,
    /// so it survives a SIGKILL of the server, only not a crash of the machine: for tests that want speed.
    pub fn fsync(mut self, fsync: bool) -> Self {
        self.fsync = fsync;
        self
    }

    /// Whether the server also serves TLS (off by default): a CA and a certificate it signed for
    /// 127.0.0.1, made with `openssl` ([`SqlServer::certificate`]), the same for the server and as a
    /// client certificate it accepts. Plain connections are still served.
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Initialises a data directory, starts the server on a free port, waits until it accepts
    /// connections and creates the database and users; panics (with the server's log) otherwise.
    pub fn start(self) -> SqlServer {
        let programs = Programs::find(self.kind);
        let dir = tempfile::Builder::new()
            .prefix(&format!("redcron-{}-", self.kind.name()))
            .tempdir()
            .expect("cannot create a temporary directory");
        let account = Account::for_server(self.kind);
        if let Some(account) = account {
            std::os::unix::fs::chown(dir.path(), Some(account.uid), Some(account.gid))
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot hand {} to uid {}: {e}",
                        dir.path().display(),
                        account.uid
                    )
                });
        }
        if self.tls {
            crate::require_program("openssl", "openssl");
            let tls = dir.path().join("tls");
            std::fs::create_dir_all(&tls).expect("cannot create the TLS directory");
            crate::etcd::make_certificates(&tls);
            // The server reads its key as its own user, and PostgreSQL wants it private.
            for file in ["ca.pem", "cert.pem", "key.pem"] {
                let path = tls.join(file);
                if let Some(account) = account {
                    std::os::unix::fs::chown(&path, Some(account.uid), Some(account.gid))
                        .expect("cannot hand a TLS file to the server's user");
                }
                let mode = if file == "key.pem" { 0o600 } else { 0o644 };
                std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                    .expect("cannot set a TLS file's mode");
            }
            if let Some(account) = account {
                std::os::unix::fs::chown(&tls, Some(account.uid), Some(account.gid))
                    .expect("cannot hand the TLS directory to the server's user");
            }
        }
        let mut server = SqlServer {
            kind: self.kind,
            fsync: self.fsync,
            tls: self.tls,
            programs,
            account,
            port: 0,
            child: None,
            stopped: false,
            dir,
        };
        server.init();
        server.start_on_free_port();
        server.create_users();
        server
    }
}

/// A PostgreSQL or MariaDB server of its own, killed (with every process of it) on drop.
pub struct SqlServer {
    kind: SqlKind,
    fsync: bool,
    tls: bool,
    programs: Programs,
    account: Option<Account>,
    port: u16,
    child: Option<Child>,
    stopped: bool,
    dir: tempfile::TempDir,
}

impl SqlServer {
    /// With [`SqlServerBuilder::tls`]: the CA (`ca.pem`), and the certificate it signed for 127.0.0.1
    /// with its key (`cert.pem`, `key.pem`), the server's own and a client certificate it accepts.
    pub fn certificate(&self) -> (PathBuf, PathBuf, PathBuf) {
        let tls = self.dir.path().join("tls");
        (
            tls.join("ca.pem"),
            tls.join("cert.pem"),
            tls.join("key.pem"),
        )
    }

    /// A PostgreSQL server with fsync on.
    pub fn postgres() -> SqlServer {
        SqlServer::builder(SqlKind::Postgres).start()
    }

    /// A MariaDB server with fsync on.
    pub fn mariadb() -> SqlServer {
        SqlServer::builder(SqlKind::Mariadb).start()
    }

    /// A server of `kind` with fsync on.
    pub fn start(kind: SqlKind) -> SqlServer {
        SqlServer::builder(kind).start()
    }

    /// Options for a server of `kind`.
    pub fn builder(kind: SqlKind) -> SqlServerBuilder {
        SqlServerBuilder {
            kind,
            fsync: true,
            tls: false,
        }
    }

    pub fn kind(&self) -> SqlKind {
        self.kind
    }

    /// The loopback TCP port; the same across [`Self::restart`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id while it runs (PostgreSQL's postmaster).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Every process of the server while it runs: the server itself, and for PostgreSQL its backends.
    pub fn pids(&self) -> Vec<u32> {
        let Some(pid) = self.pid() else {
            return Vec::new();
        };
        let mut pids = vec![pid];
        pids.extend(
            children::descendants(pid)
                .iter()
                .filter_map(|p| u32::try_from(p.pid).ok()),
        );
        pids
    }

    /// Whether the server runs and is not hung by [`Self::stop`].
    pub fn is_serving(&self) -> bool {
        self.child.is_some() && !self.stopped
    }

    /// The server's directory: its data directory (`data`), its socket and its logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The store's URL as [`USER`] on [`DATABASE`]: `postgres://redcron:secret-pw@127.0.0.1:<port>/redcron`
    /// or `mysql://…`.
    pub fn url(&self) -> String {
        self.url_as(USER, PASSWORD, DATABASE)
    }

    /// A URL for `user` with `password` on `database` (taken as they are: URL-safe names only).
    pub fn url_as(&self, user: &str, password: &str, database: &str) -> String {
        format!(
            "{}://{user}:{password}@127.0.0.1:{}/{database}",
            self.kind.scheme(),
            self.port
        )
    }

    /// Whether the server answers the protocol's first exchange on its TCP port within `timeout`
    /// (PostgreSQL: an `SSLRequest` answered; MariaDB: its greeting): false when killed or hung.
    pub fn answers(&self, timeout: Duration) -> bool {
        answers(self.kind, self.port, timeout)
    }

    /// Runs `sql` (one or more statements) as the administrator in [`DATABASE`] through the server's
    /// command-line client; its output, one line per row, columns separated by tabs. Panics with the
    /// client's error on failure or after 30 s.
    pub fn exec(&self, sql: &str) -> String {
        self.exec_in(DATABASE, sql)
    }

    /// [`Self::exec`] in `database`.
    pub fn exec_in(&self, database: &str, sql: &str) -> String {
        self.try_exec_in(database, sql)
            .unwrap_or_else(|e| panic!("{} failed to run {sql:?}: {e}", self.kind.name()))
    }

    /// [`Self::exec`] that returns the client's error instead of panicking.
    pub fn try_exec(&self, sql: &str) -> Result<String, String> {
        self.try_exec_in(DATABASE, sql)
    }

    /// [`Self::try_exec`] in `database`.
    pub fn try_exec_in(&self, database: &str, sql: &str) -> Result<String, String> {
        let mut command = Command::new(&self.programs.client);
        match self.kind {
            SqlKind::Postgres => {
                command
                    .args(["-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1"])
                    .arg("-h")
                    .arg(self.dir.path())
                    .args([
                        "-p",
                        &self.port.to_string(),
                        "-U",
                        ADMIN,
                        "-d",
                        database,
                        "-f",
                        "-",
                    ])
                    .env_remove("PGOPTIONS")
                    .env_remove("PGSERVICE");
            }
            SqlKind::Mariadb => {
                command
                    .args(["--no-defaults", "-u", "root", "-B", "-N"])
                    .arg(format!("--socket={}", self.socket().display()))
                    .args(["-D", database]);
            }
        }
        run_with_input(command, sql, EXEC_TIMEOUT)
    }

    /// Runs `sql` as `user` with `password` in [`DATABASE`] over TCP (as the store connects): its output,
    /// or the client's error (a refused login, a denied statement).
    pub fn try_exec_as(&self, user: &str, password: &str, sql: &str) -> Result<String, String> {
        run_with_input(self.client_as(user, password), sql, EXEC_TIMEOUT)
    }

    /// The command-line client (`psql`, `mariadb`) logged in as `user` with `password` to [`DATABASE`]
    /// over TCP, reading SQL from its stdin and stopping at the first error: for a session a test keeps
    /// open (a long query, a lock held) while it does something else. Spawn it with
    /// [`children::spawn`].
    pub fn client_as(&self, user: &str, password: &str) -> Command {
        let mut command = Command::new(&self.programs.client);
        let port = self.port.to_string();
        match self.kind {
            SqlKind::Postgres => {
                command
                    .args(["-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1"])
                    .args(["-h", "127.0.0.1", "-p", &port, "-U", user, "-d", DATABASE])
                    .args(["-w", "-f", "-"])
                    .env("PGPASSWORD", password)
                    .env("PGSSLMODE", "disable")
                    .env_remove("PGOPTIONS")
                    .env_remove("PGSERVICE");
            }
            SqlKind::Mariadb => {
                command
                    .args(["--no-defaults", "--protocol=tcp", "-B", "-N"])
                    .args(["-h", "127.0.0.1", "-P", &port, "-u", user, "-D", DATABASE])
                    .env("MYSQL_PWD", password);
            }
        }
        command
    }

    /// Deletes every row of every table whose name (or whose schema's name) starts with `prefix`, in
    /// one transaction, foreign keys unchecked: the store loses its data, the server keeps running.
    pub fn flush(&self, prefix: &str) {
        let length = prefix.chars().count();
        let listing = match self.kind {
            SqlKind::Postgres => {
                let prefix = literal(self.kind, prefix);
                format!(
                    "SELECT format('%I.%I', table_schema, table_name) FROM information_schema.tables \
                     WHERE table_type = 'BASE TABLE' \
                     AND table_schema NOT IN ('pg_catalog', 'information_schema') \
                     AND (left(table_name, {length}) = {prefix} OR left(table_schema, {length}) = {prefix})"
                )
            }
            SqlKind::Mariadb => {
                let prefix = literal(self.kind, prefix);
                format!(
                    "SELECT CONCAT('`', REPLACE(table_schema, '`', '``'), '`.`', \
                     REPLACE(table_name, '`', '``'), '`') FROM information_schema.tables \
                     WHERE table_type = 'BASE TABLE' \
                     AND table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys') \
                     AND (LEFT(table_name, {length}) = BINARY {prefix} \
                     OR LEFT(table_schema, {length}) = BINARY {prefix})"
                )
            }
        };
        let tables = self.exec(&listing);
        let deletes: String = tables
            .lines()
            .filter(|table| !table.is_empty())
            .map(|table| format!("DELETE FROM {table};\n"))
            .collect();
        if deletes.is_empty() {
            return;
        }
        let unchecked = match self.kind {
            SqlKind::Postgres => "SET LOCAL session_replication_role = replica;",
            SqlKind::Mariadb => "SET FOREIGN_KEY_CHECKS = 0;",
        };
        self.exec(&format!("BEGIN;\n{unchecked}\n{deletes}COMMIT;\n"));
    }

    /// Crashes the server: SIGKILL to every process of it, which are then gone (not merely signalled).
    /// Its port refuses connections until [`Self::restart`]; committed data stays in its directory.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        self.stopped = false;
        if self.kind == SqlKind::Mariadb {
            children::kill_and_reap(&mut child);
            return;
        }
        // Frozen, the postmaster forks no backend that the list below would miss, and does not start
        // crash recovery when its first backend dies.
        children::signal(child.id(), libc::SIGSTOP);
        let backends = children::descendants(child.id());
        for backend in &backends {
            backend.kill();
        }
        children::kill_and_reap(&mut child);
        let deadline = Instant::now() + GONE_TIMEOUT;
        while !backends.iter().all(|backend| is_gone(backend.pid)) {
            assert!(
                Instant::now() < deadline,
                "postgres backends still alive {GONE_TIMEOUT:?} after SIGKILL: {backends:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.remove_interlock();
    }

    /// Hangs the server (SIGSTOP to every process of it): connections are accepted by the kernel but
    /// get no answer, as with a frozen VM.
    pub fn stop(&mut self) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("the {} server is not running", self.kind.name()));
        // The postmaster first, so that it forks nothing new while its backends are stopped.
        children::signal(pid, libc::SIGSTOP);
        signal_all(&children::descendants(pid), libc::SIGSTOP);
        self.stopped = true;
    }

    /// Connections the kernel has accepted for the server that the server has not taken yet: the accept
    /// queue of its listening socket (`/proc/net/tcp`). While the server hangs, every connection a
    /// client opens waits here, and the resumed server starts a session for each before it serves new
    /// ones; a client that gives one up and opens another adds one more.
    pub fn accept_queue(&self) -> usize {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("cannot read /proc/net/tcp");
        let local = format!("0100007F:{:04X}", self.port);
        table
            .lines()
            .skip(1)
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            // sl local_address rem_address st tx_queue:rx_queue …; st 0A is LISTEN, whose rx_queue is
            // the accept queue's length.
            .find(|fields| fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A"))
            .and_then(|fields| fields.get(4)?.split(':').nth(1).map(str::to_owned))
            .and_then(|queue| usize::from_str_radix(&queue, 16).ok())
            .unwrap_or_else(|| panic!("no listening socket on 127.0.0.1:{}", self.port))
    }

    /// Resumes a server hung by [`Self::stop`].
    pub fn cont(&mut self) {
        if let Some(pid) = self.pid() {
            signal_all(&children::descendants(pid), libc::SIGCONT);
            children::signal(pid, libc::SIGCONT);
        }
        self.stopped = false;
    }

    /// Kills the server if it runs and starts it again on the same port and data directory (it
    /// recovers from its log, as after a crash); waits until it accepts connections.
    pub fn restart(&mut self) {
        self.kill();
        // The port was ours a moment ago; retry briefly in case the kernel has not let go of it yet.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.try_start() {
                Ok(()) => return,
                Err(log) if log.contains("Address already in use") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(log) => panic!(
                    "{} did not restart on port {}:\n{log}",
                    self.kind.name(),
                    self.port
                ),
            }
        }
    }

    /// What initialising the data directory printed, and the server's log (every start appends).
    pub fn log(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "--- {} init:\n{}--- {} server:\n{}",
            self.kind.name(),
            read("init.log"),
            self.kind.name(),
            read("server.log")
        )
    }

    /// MariaDB's temporary directory, in the server's own directory (created, and handed to the server's
    /// user, on first use).
    fn tmp(&self) -> PathBuf {
        let tmp = self.dir.path().join("tmp");
        if !tmp.exists() {
            std::fs::create_dir_all(&tmp).expect("cannot create the server's temporary directory");
            if let Some(account) = self.account {
                std::os::unix::fs::chown(&tmp, Some(account.uid), Some(account.gid))
                    .expect("cannot hand the temporary directory to the server's user");
            }
        }
        tmp
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    /// A command for a server program, run as the unprivileged account (if the tests run as root) in
    /// the server's directory.
    fn command(&self, program: &Path) -> Command {
        use std::os::unix::process::CommandExt as _;
        let mut command = Command::new(program);
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        if let Some(account) = self.account {
            // std drops root's supplementary groups before setuid; the parent-death signal that
            // `children::spawn` asks for is set after, so the uid change does not clear it.
            command.uid(account.uid).gid(account.gid);
            command.env("HOME", self.dir.path());
        }
        command
    }

    /// Creates the data directory (`initdb`, `mariadb-install-db`); panics with their output otherwise.
    fn init(&self) {
        let log = self.log_file("init.log");
        let mut command = match self.kind {
            SqlKind::Postgres => {
                let password_file = self.dir.path().join("admin-password");
                std::fs::write(&password_file, format!("{ADMIN_PASSWORD}\n"))
                    .expect("cannot write the admin password file");
                if let Some(account) = self.account {
                    std::os::unix::fs::chown(&password_file, Some(account.uid), Some(account.gid))
                        .expect("cannot hand the password file to the server's user");
                }
                let mut command = self.command(&self.programs.init);
                command
                    .arg("-D")
                    .arg(self.data())
                    .args(["--no-sync", "-U", ADMIN, "-E", "UTF8", "--locale=C"])
                    .arg(format!("--pwfile={}", password_file.display()))
                    // The administrator's client connects over the socket without a password; every TCP
                    // connection needs one, so a wrong password is refused as in production.
                    .args(["--auth-local=trust", "--auth-host=scram-sha-256"]);
                command
            }
            SqlKind::Mariadb => {
                let mut command = self.command(&self.programs.init);
                command
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", self.data().display()))
                    // Its own temporary directory: servers initialised at once in the shared /tmp
                    // removed each other's temporary tables ("Unknown table 'mysql.tmp_user_sys'").
                    .arg(format!("--tmpdir={}", self.tmp().display()))
                    // root logs in over the socket without a password, from any OS user.
                    .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
                    .args(mariadb_sizes());
                command
            }
        };
        command
            .stdout(log.try_clone().expect("cannot duplicate a file handle"))
            .stderr(log);
        let mut child = children::spawn(command)
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.programs.init.display()));
        let status = children::wait_timeout(&mut child, INIT_TIMEOUT);
        if status.is_none() {
            children::kill_and_reap(&mut child);
        }
        assert!(
            status.is_some_and(|s| s.success()),
            "{} could not initialise {} ({status:?}){}:\n{}",
            self.programs.init.display(),
            self.data().display(),
            self.account
                .map(|a| format!(
                    " as uid {}: every directory above it must be searchable by that user (set TMPDIR)",
                    a.uid
                ))
                .unwrap_or_default(),
            self.log()
        );
    }

    fn start_on_free_port(&mut self) {
        for _ in 0..5 {
            self.port = crate::free_port();
            match self.try_start() {
                Ok(()) => return,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!(
                    "{} did not start on port {}:\n{log}",
                    self.kind.name(),
                    self.port
                ),
            }
        }
        panic!("{}: no free port found in 5 attempts", self.kind.name());
    }

    /// Starts the server on its port and waits until it accepts connections; on failure, kills it and
    /// returns why with its log.
    ///
    /// Only this start's part of the log decides a retry: an earlier start's "Address already in use"
    /// must not make a restart that fails otherwise retry until its deadline.
    fn try_start(&mut self) -> Result<(), String> {
        let log = self.log_file("server.log");
        let earlier = log.metadata().map_or(0, |meta| meta.len());
        let mut command = self.command(&self.programs.server);
        match self.kind {
            SqlKind::Postgres => {
                let on_off = |on: bool| if on { "on" } else { "off" };
                command
                    .arg("-D")
                    .arg(self.data())
                    .args(["-p", &self.port.to_string()])
                    .arg("-k")
                    .arg(self.dir.path())
                    .args(["-c", "listen_addresses=127.0.0.1"])
                    .args(["-c", &format!("fsync={}", on_off(self.fsync))])
                    .args(["-c", "dynamic_shared_memory_type=mmap"])
                    // PostgreSQL 13 stores new passwords as MD5 by default, which scram-sha-256 in
                    // pg_hba.conf (initdb's --auth-host) would then refuse.
                    .args(["-c", "password_encryption=scram-sha-256"])
                    .args(["-c", "shared_buffers=32MB", "-c", "max_connections=200"]);
                if self.tls {
                    let (ca, cert, key) = self.certificate();
                    command
                        .args(["-c", "ssl=on"])
                        .args(["-c", &format!("ssl_ca_file={}", ca.display())])
                        .args(["-c", &format!("ssl_cert_file={}", cert.display())])
                        .args(["-c", &format!("ssl_key_file={}", key.display())]);
                }
            }
            SqlKind::Mariadb => {
                command
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", self.data().display()))
                    .arg(format!("--port={}", self.port))
                    .arg(format!("--socket={}", self.socket().display()))
                    .arg(format!("--tmpdir={}", self.tmp().display()))
                    .arg(format!(
                        "--pid-file={}",
                        self.dir.path().join("mysqld.pid").display()
                    ))
                    .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
                    .args(mariadb_sizes())
                    .args(["--innodb-temp-data-file-path=ibtmp1:1M:autoextend"])
                    .arg(format!(
                        "--innodb-flush-log-at-trx-commit={}",
                        if self.fsync { 1 } else { 2 }
                    ))
                    // MySQL 8's default, and MariaDB's from 11.6.
                    .arg("--character-set-server=utf8mb4")
                    .args(["--max-connections=200"]);
                if self.tls {
                    let (ca, cert, key) = self.certificate();
                    command
                        .arg(format!("--ssl-ca={}", ca.display()))
                        .arg(format!("--ssl-cert={}", cert.display()))
                        .arg(format!("--ssl-key={}", key.display()));
                }
            }
        }
        command
            .stdout(log.try_clone().expect("cannot duplicate a file handle"))
            .stderr(log);
        let mut child = children::spawn(command)
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.programs.server.display()));
        let deadline = Instant::now() + READY_TIMEOUT;
        let outcome = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break Err(format!("{} exited ({status})", self.kind.name()));
            }
            // Answering is not enough: another process may hold the port ([`crate::ports`]).
            if self.ready() && crate::ports::listened_on_by(child.id(), self.port) {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(format!(
                    "{} did not accept connections within {READY_TIMEOUT:?}",
                    self.kind.name()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        match outcome {
            Ok(()) => {
                self.child = Some(child);
                self.stopped = false;
                Ok(())
            }
            Err(why) => {
                if matches!(child.try_wait(), Ok(None)) {
                    self.child = Some(child);
                    self.kill();
                } else if self.kind == SqlKind::Postgres {
                    // Exited (and reaped): its pid is no longer ours to signal.
                    self.remove_interlock();
                }
                let log = std::fs::read(self.dir.path().join("server.log")).unwrap_or_default();
                let this_start = usize::try_from(earlier)
                    .ok()
                    .and_then(|earlier| log.get(earlier..))
                    .unwrap_or_default();
                Err(format!(
                    "{why}; its log of this start:\n{}",
                    String::from_utf8_lossy(this_start)
                ))
            }
        }
    }

    /// Whether a starting server accepts connections: PostgreSQL says `ready` in its pid file once
    /// recovery is done (before, it answers on its port only to refuse), MariaDB listens only then.
    fn ready(&self) -> bool {
        if self.kind == SqlKind::Postgres {
            let status =
                std::fs::read_to_string(self.data().join("postmaster.pid")).unwrap_or_default();
            if status.lines().nth(7).map(str::trim) != Some("ready") {
                return false;
            }
        }
        self.answers(Duration::from_millis(500))
    }

    /// Creates [`DATABASE`], [`USER`], [`READER`] and [`ADMIN`] (PostgreSQL's superuser exists already).
    fn create_users(&self) {
        match self.kind {
            SqlKind::Postgres => {
                // initdb's empty `postgres` database becomes DATABASE: CREATE DATABASE would copy a
                // template, some 300 files and 900 buffers that the first crash recovery then fsyncs.
                self.exec_in(
                    "template1",
                    &format!(
                        "CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}';\n\
                         CREATE ROLE {READER} LOGIN PASSWORD '{READER_PASSWORD}';\n\
                         ALTER DATABASE postgres RENAME TO {DATABASE};\n\
                         ALTER DATABASE {DATABASE} OWNER TO {USER};\n"
                    ),
                );
                // PostgreSQL 13 and 14 let every user create tables in `public`; 15 lets no one but its
                // owner. Either way: USER may, READER may not, and READER gets rights on what USER creates.
                self.exec(&format!(
                    "ALTER SCHEMA public OWNER TO {USER};\n\
                     REVOKE CREATE ON SCHEMA public FROM PUBLIC;\n\
                     REVOKE CREATE ON DATABASE {DATABASE} FROM PUBLIC;\n\
                     GRANT USAGE ON SCHEMA public TO {READER};\n\
                     ALTER DEFAULT PRIVILEGES FOR ROLE {USER} GRANT USAGE ON SCHEMAS TO {READER};\n\
                     ALTER DEFAULT PRIVILEGES FOR ROLE {USER} \
                     GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {READER};\n\
                     ALTER DEFAULT PRIVILEGES FOR ROLE {USER} \
                     GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {READER};\n"
                ));
            }
            SqlKind::Mariadb => {
                self.exec_in(
                    "mysql",
                    &format!(
                        "CREATE DATABASE {DATABASE};\n\
                         CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}';\n\
                         GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'%';\n\
                         CREATE USER '{READER}'@'%' IDENTIFIED BY '{READER_PASSWORD}';\n\
                         GRANT SELECT, INSERT, UPDATE, DELETE ON {DATABASE}.* TO '{READER}'@'%';\n\
                         CREATE USER '{ADMIN}'@'%' IDENTIFIED BY '{ADMIN_PASSWORD}';\n\
                         GRANT ALL PRIVILEGES ON *.* TO '{ADMIN}'@'%' WITH GRANT OPTION;\n"
                    ),
                );
            }
        }
    }

    /// After a crash, removes PostgreSQL's pid files and its System V interlock segment: every process
    /// of the server is gone, so nothing guards; a later start would find them (and, if another
    /// process took the dead postmaster's pid meanwhile, refuse to start), and nothing else would ever
    /// remove the segment.
    fn remove_interlock(&self) {
        let pid_file = self.data().join("postmaster.pid");
        let status = std::fs::read_to_string(&pid_file).unwrap_or_default();
        // Line 7: "<key> <shmid>".
        let shmid = status
            .lines()
            .nth(6)
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|id| id.parse::<libc::c_int>().ok());
        if let Some(shmid) = shmid {
            // SAFETY: IPC_RMID takes no buffer; the id names the dead server's segment, which no
            // process is attached to any more (a wrong id fails with EINVAL or EPERM, harmlessly).
            unsafe {
                libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut());
            }
        }
        let _ = std::fs::remove_file(pid_file);
        let _ = std::fs::remove_file(self.dir.path().join(format!(".s.PGSQL.{}.lock", self.port)));
    }

    fn log_file(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(name))
            .expect("cannot create a log file")
    }
}

impl Drop for SqlServer {
    /// Ends the server, hung or not. PostgreSQL gets an immediate shutdown (SIGQUIT: its backends exit
    /// and it removes its shared memory) and SIGKILL if that takes more than 5 s.
    fn drop(&mut self) {
        if self.kind == SqlKind::Postgres {
            self.cont();
            if let Some(child) = self.child.as_mut() {
                children::signal(child.id(), libc::SIGQUIT);
                if children::wait_timeout(child, Duration::from_secs(5)).is_some() {
                    self.child = None;
                    return;
                }
            }
        }
        self.kill();
    }
}

/// The programs of one kind of server.
#[derive(Debug, Clone)]
struct Programs {
    /// `initdb`, `mariadb-install-db`.
    init: PathBuf,
    /// `postgres`, `mariadbd`.
    server: PathBuf,
    /// `psql`, `mariadb`.
    client: PathBuf,
}

impl Programs {
    /// Finds the programs, or panics saying which package to install.
    ///
    /// Debian keeps PostgreSQL's server programs in `/usr/lib/postgresql/<version>/bin`, off PATH: the
    /// highest version there is taken, else the programs on PATH (other distributions). MariaDB's
    /// server is in `/usr/sbin`, on root's PATH only.
    fn find(kind: SqlKind) -> Programs {
        match kind {
            SqlKind::Postgres => {
                let mut dirs = postgres_bin_dirs();
                dirs.extend(path_dirs());
                let find = |name: &str| {
                    dirs.iter()
                        .map(|dir| dir.join(name))
                        .find(|path| path.is_file())
                        .unwrap_or_else(|| {
                            panic!(
                                "`{name}` not found in /usr/lib/postgresql/<version>/bin or on PATH; \
                                 these tests need it. Install it with: \
                                 apt-get update && apt-get install -y postgresql"
                            )
                        })
                };
                Programs {
                    init: find("initdb"),
                    server: find("postgres"),
                    client: find("psql"),
                }
            }
            SqlKind::Mariadb => {
                let mut dirs = path_dirs();
                dirs.extend(["/usr/sbin", "/usr/libexec"].map(PathBuf::from));
                let find = |names: &[&str]| {
                    names
                        .iter()
                        .flat_map(|name| dirs.iter().map(move |dir| dir.join(name)))
                        .find(|path| path.is_file())
                        .unwrap_or_else(|| {
                            panic!(
                                "none of {names:?} found on PATH or in /usr/sbin; these tests need it. \
                                 Install it with: apt-get update && apt-get install -y mariadb-server"
                            )
                        })
                };
                Programs {
                    init: find(&["mariadb-install-db", "mysql_install_db"]),
                    server: find(&["mariadbd", "mysqld"]),
                    client: find(&["mariadb", "mysql"]),
                }
            }
        }
    }
}

/// `/usr/lib/postgresql/<version>/bin` for every installed version, the highest first.
fn postgres_bin_dirs() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") else {
        return Vec::new();
    };
    let mut versions: Vec<(u32, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect())
        .unwrap_or_default()
}

/// MariaDB's sizes for a small test server, at its data directory's creation and every start: an 8 MB
/// redo log and a 16 MB buffer pool (the defaults, 96 MB and 128 MB, only cost disk and memory here).
fn mariadb_sizes() -> [&'static str; 2] {
    ["--innodb-log-file-size=8M", "--innodb-buffer-pool-size=16M"]
}

/// The unprivileged user a server runs as when the tests run as root.
#[derive(Debug, Clone, Copy)]
struct Account {
    uid: u32,
    gid: u32,
}

impl Account {
    /// `None` unless running as root; then the server's own Debian user, else `nobody`.
    fn for_server(kind: SqlKind) -> Option<Account> {
        // SAFETY: geteuid has no memory effects.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let own = match kind {
            SqlKind::Postgres => "postgres",
            SqlKind::Mariadb => "mysql",
        };
        let account = [own, "nobody"]
            .into_iter()
            .find_map(Account::named)
            .unwrap_or_else(|| {
                panic!(
                    "running as root, and neither user `{own}` nor `nobody` exists to run {} as \
                     (it refuses root): create one, e.g. `useradd --system {own}`",
                    kind.name()
                )
            });
        Some(account)
    }

    /// The account of user `name`, if it exists and is not root.
    fn named(name: &str) -> Option<Account> {
        let name = std::ffi::CString::new(name).ok()?;
        // SAFETY: getpwnam_r writes only into `entry` and `buffer`, both ours and large enough (it
        // says ERANGE otherwise), and `found` points into them or is null.
        unsafe {
            let mut entry: libc::passwd = std::mem::zeroed();
            let mut buffer = vec![0 as libc::c_char; 16 * 1024];
            let mut found: *mut libc::passwd = std::ptr::null_mut();
            let rc = libc::getpwnam_r(
                name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            );
            (rc == 0 && !found.is_null() && entry.pw_uid != 0).then_some(Account {
                uid: entry.pw_uid,
                gid: entry.pw_gid,
            })
        }
    }
}

/// `text` as an SQL string literal of `kind` (MariaDB reads backslashes as escapes, PostgreSQL not).
fn literal(kind: SqlKind, text: &str) -> String {
    let text = match kind {
        SqlKind::Postgres => text.to_owned(),
        SqlKind::Mariadb => text.replace('\\', "\\\\"),
    };
    format!("'{}'", text.replace('\'', "''"))
}

/// Runs `command` with `input` on its stdin; its stdout if it succeeds within `timeout`, else its
/// stderr (or why it was killed).
fn run_with_input(mut command: Command, input: &str, timeout: Duration) -> Result<String, String> {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child =
        children::spawn(command).map_err(|e| format!("cannot run the SQL client: {e}"))?;
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = input.to_owned();
    // Written from a thread, and the output read from another, so that neither pipe fills and blocks.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let output = match outcome.recv_timeout(timeout) {
        Ok(output) => output.map_err(|e| format!("cannot wait for the SQL client: {e}"))?,
        Err(_) => {
            // Still unreaped (the waiting thread holds it), so the pid is still the client's.
            children::signal(pid, libc::SIGKILL);
            return Err(format!("the SQL client did not finish within {timeout:?}"));
        }
    };
    let _ = writer.join();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        ))
    }
}

/// Whether the server on `port` answers its protocol's first exchange within `timeout`.
fn answers(kind: SqlKind, port: u16, timeout: Duration) -> bool {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&address, timeout) else {
        return false;
    };
    if stream.set_read_timeout(Some(timeout)).is_err()
        || stream.set_write_timeout(Some(timeout)).is_err()
    {
        return false;
    }
    match kind {
        SqlKind::Postgres => {
            // SSLRequest: length 8, code 80877103; the server answers one byte, `S` or `N`.
            let request = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
            let mut answer = [0u8; 1];
            stream.write_all(&request).is_ok()
                && stream.read_exact(&mut answer).is_ok()
                && matches!(answer[0], b'S' | b'N')
        }
        SqlKind::Mariadb => {
            // The greeting: a 4-byte packet header, then protocol version 10 (0xff would be an error).
            let mut greeting = [0u8; 5];
            stream.read_exact(&mut greeting).is_ok() && greeting[4] == 10
        }
    }
}

/// Sends `signal` to each of `processes` (positive pids only: `kill(0, …)` would signal our own group).
fn signal_all(processes: &[children::Process], signal: i32) {
    for process in processes {
        if let Ok(pid) = u32::try_from(process.pid) {
            if pid > 0 {
                children::signal(pid, signal);
            }
        }
    }
}

/// Whether `pid` is gone: no such process, or a zombie (which holds no port, memory or segment).
fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}
