//! The harness's own PostgreSQL and MariaDB servers (`testkit::sql`): if these fail, no test of the SQL
//! store means anything. Each server starts, answers as its three users with their rights, keeps a
//! committed row across a crash and a restart on its port, hangs when stopped and answers when
//! continued, is flushed, and leaves no process behind when dropped.

use std::io::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use testkit::sql::{ADMIN, ADMIN_PASSWORD, PASSWORD, READER, READER_PASSWORD, USER};
use testkit::{children, SqlKind, SqlServer};

#[test]
fn postgres_starts_crashes_hangs_and_is_gone_when_dropped() {
    smoke(SqlKind::Postgres);
}

#[test]
fn mariadb_starts_crashes_hangs_and_is_gone_when_dropped() {
    smoke(SqlKind::Mariadb);
}

/// Without fsync the server says so (and still runs the store's SQL).
#[test]
fn servers_without_fsync_say_so() {
    for kind in [SqlKind::Postgres, SqlKind::Mariadb] {
        let server = SqlServer::builder(kind).fsync(false).start();
        assert_eq!(server.exec(durability(kind)).trim(), durable(kind, false));
    }
}

/// The setting that decides whether a commit is flushed to disk.
fn durability(kind: SqlKind) -> &'static str {
    match kind {
        SqlKind::Postgres => "SHOW fsync;",
        SqlKind::Mariadb => "SELECT @@innodb_flush_log_at_trx_commit;",
    }
}

/// [`durability`]'s value with fsync on or off.
fn durable(kind: SqlKind, fsync: bool) -> &'static str {
    match (kind, fsync) {
        (SqlKind::Postgres, true) => "on",
        (SqlKind::Postgres, false) => "off",
        (SqlKind::Mariadb, true) => "1",
        (SqlKind::Mariadb, false) => "2",
    }
}

/// A process is gone once it no longer exists or is a zombie: a killed PostgreSQL's backends are
/// reparented to init, which need not reap them.
fn is_gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

fn smoke(kind: SqlKind) {
    let started = Instant::now();
    let mut server = SqlServer::start(kind);
    eprintln!("{} started in {:?}", kind.name(), started.elapsed());
    let scheme = kind.scheme();
    assert_eq!(
        server.url(),
        format!(
            "{scheme}://redcron:secret-pw@127.0.0.1:{}/redcron",
            server.port()
        )
    );
    assert_eq!(server.exec("SELECT 1;").trim(), "1");
    assert_eq!(server.exec(durability(kind)).trim(), durable(kind, true));

    // The store's user creates tables; the reader writes to them but creates none; passwords count.
    server
        .try_exec_as(
            USER,
            PASSWORD,
            "CREATE TABLE rc_smoke (id INT PRIMARY KEY); INSERT INTO rc_smoke VALUES (1);",
        )
        .unwrap_or_else(|e| panic!("{e}"));
    server
        .try_exec_as(READER, READER_PASSWORD, "INSERT INTO rc_smoke VALUES (2); UPDATE rc_smoke SET id = 3 WHERE id = 2; DELETE FROM rc_smoke WHERE id = 3;")
        .unwrap_or_else(|e| panic!("{e}"));
    let denied = server.try_exec_as(READER, READER_PASSWORD, "CREATE TABLE rc_denied (id INT);");
    assert!(
        denied.as_ref().is_err_and(|e| e.contains("denied")),
        "{denied:?}"
    );
    let refused = server.try_exec_as(USER, "wrong-pw", "SELECT 1;");
    assert!(refused.is_err(), "{refused:?}");
    let admin = server.try_exec_as(ADMIN, ADMIN_PASSWORD, "SELECT count(*) FROM rc_smoke;");
    assert_eq!(admin.as_deref().map(str::trim), Ok("1"));

    // A committed row survives SIGKILL, a query running meanwhile dies with the server (PostgreSQL: its
    // backend too), and the server comes back on its port as other processes.
    let mut session = server.client_as(ADMIN, ADMIN_PASSWORD);
    session
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut session = children::spawn(session).expect("the SQL client runs");
    let (sleep, running) = match kind {
        SqlKind::Postgres => (
            "SELECT pg_sleep(60);\n",
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60);'",
        ),
        SqlKind::Mariadb => (
            "SELECT SLEEP(60);\n",
            "SELECT count(*) FROM information_schema.processlist WHERE info = 'SELECT SLEEP(60)'",
        ),
    };
    let mut stdin = session.stdin.take().expect("stdin is piped");
    stdin
        .write_all(sleep.as_bytes())
        .expect("the client reads its stdin");
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.exec(running).trim() != "1" {
        assert!(Instant::now() < deadline, "the long query never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let port = server.port();
    let before = server.pids();
    assert!(!before.is_empty());
    server.kill();
    assert!(before.iter().all(|&pid| is_gone(pid)), "{before:?}");
    let ended = children::wait_timeout(&mut session, Duration::from_secs(10));
    assert!(ended.is_some_and(|status| !status.success()), "{ended:?}");
    assert!(!server.answers(Duration::from_millis(300)));
    let restarted = Instant::now();
    server.restart();
    eprintln!("{} restarted in {:?}", kind.name(), restarted.elapsed());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), before.first().copied());
    assert_eq!(server.exec("SELECT id FROM rc_smoke;").trim(), "1");

    // Stopped, it accepts no exchange; continued, it answers again.
    server.stop();
    assert!(!server.is_serving());
    assert!(!server.answers(Duration::from_millis(300)));
    server.cont();
    assert!(server.answers(Duration::from_secs(2)));
    assert_eq!(server.exec("SELECT count(*) FROM rc_smoke;").trim(), "1");

    // Flushed, its tables of that prefix are empty and still there.
    server.exec("CREATE TABLE other_kept (id INT); INSERT INTO other_kept VALUES (7);");
    server.flush("rc_");
    assert_eq!(server.exec("SELECT count(*) FROM rc_smoke;").trim(), "0");
    assert_eq!(server.exec("SELECT count(*) FROM other_kept;").trim(), "1");

    // Dropped while hung, every process of it is gone.
    server.stop();
    let pids = server.pids();
    drop(server);
    assert!(pids.iter().all(|&pid| is_gone(pid)), "{pids:?}");
}
