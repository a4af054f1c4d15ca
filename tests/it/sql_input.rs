//! Bad input to the SQL store, end to end on real servers and the real `redcron` binary: an unreachable
//! server, a refused login, a missing database, a schema of a newer redcron, a table changed by hand and
//! a user without the right to create tables. Each gives its documented exit code and an error that names
//! `host:port/database` and never the password; the password, given as `${SQL_PW}` in the store's URL,
//! never reaches a job either.
//!
//! A server that does not answer may come back, so it never stops a worker (it logs the failure and races
//! again at the next tick) and it makes `status` exit 3, as a Redis majority down does. A server that
//! answers but can never hold the store (see `Unusable` in `src/store/sql/schema.rs`) stops the worker at
//! start and makes `status` exit 1.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use testkit::sql::{DATABASE, READER, READER_PASSWORD, USER};
use testkit::{SqlKind, SqlServer};

use crate::cli::{output, redcron};
use crate::support::{free_port, worker_config, Backend, TestDir, Worker};

/// The store's password variable, as the configs of these tests name it.
const PW_VAR: &str = "SQL_PW";

/// A job every second that writes its environment to `<name>.env` and prints it.
fn env_job(name: &str) -> String {
    format!(
        "  - name: {name}\n    schedule: \"* * * * * *\"\n    command: 'env > {name}.env; env'\n"
    )
}

fn backend(kind: SqlKind) -> Backend {
    match kind {
        SqlKind::Postgres => Backend::Postgres,
        SqlKind::Mariadb => Backend::Mariadb,
    }
}

/// `host:port/database`, as the store names its server.
fn target(port: u16, database: &str) -> String {
    format!("127.0.0.1:{port}/{database}")
}

/// A worker's `jobs.yaml` on a `kind` server at `port`, logging in as `user` to `database` with the
/// password in `${SQL_PW}` (never in the file), running `jobs`.
fn config(kind: SqlKind, port: u16, user: &str, database: &str, jobs: &str) -> String {
    let url = format!(
        "{}://{user}:${{{PW_VAR}}}@127.0.0.1:{port}/{database}",
        kind.scheme()
    );
    // `worker_config` doubles every `$` so that a URL is taken as it is; this one is to be expanded.
    worker_config(backend(kind), &[url], "  id: sql-input\n", jobs).replace("$${", "${")
}

/// `redcron status` on `config` with `${SQL_PW}` set to `password`: its exit code, stdout and stderr.
fn status(dir: &TestDir, config: &std::path::Path, password: &str) -> (i32, String, String) {
    output(
        redcron(dir.path())
            .args(["status", "-c"])
            .arg(config)
            .env(PW_VAR, password),
    )
}

/// Starts a worker on `config` with `${SQL_PW}` set to `password`.
fn worker(config: &std::path::Path, password: &str) -> Worker {
    Worker::builder(config).env(PW_VAR, password).spawn()
}

/// Waits for a worker that must stop at start: asserts exit 1, a `worker.failed` event and an error on
/// stderr that names `target` and holds `expected`, and no `password` anywhere; returns stderr.
fn stops_at_start(mut worker: Worker, target: &str, expected: &str, password: &str) -> String {
    let status = worker
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the worker kept running; its output: {:?}", worker.lines()));
    // The reader threads may still be behind the exit: stdout is read to its end, stderr waited for.
    let failed = worker.wait_for_event("worker.failed", Duration::from_secs(10));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !worker.stderr().contains(target) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stderr = worker.stderr();
    assert_eq!(status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains(target) && stderr.contains(expected),
        "stderr does not name {target} and say {expected:?}:\n{stderr}"
    );
    let error = failed.as_ref().and_then(|e| e["error"].as_str());
    assert!(
        error.is_some_and(|error| error.contains(target) && error.contains(expected)),
        "no worker.failed event naming {target}: {failed:?}"
    );
    assert_no_password(&worker, password);
    stderr
}

/// Neither the worker's stdout (its log) nor its stderr holds `password`.
fn assert_no_password(worker: &Worker, password: &str) {
    let (stdout, stderr) = (worker.lines().join("\n"), worker.stderr());
    assert!(!stdout.contains(password), "password in stdout:\n{stdout}");
    assert!(!stderr.contains(password), "password in stderr:\n{stderr}");
}

/// `status` exits `code`, its stderr names `target` and holds `expected`, and no output holds `password`.
fn status_fails(
    dir: &TestDir,
    config: &std::path::Path,
    password: &str,
    code: i32,
    target: &str,
    expected: &str,
) {
    let (exit, stdout, stderr) = status(dir, config, password);
    assert_eq!(exit, code, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains(target) && stderr.contains(expected),
        "status's stderr does not name {target} and say {expected:?}:\n{stderr}"
    );
    assert!(!stdout.contains(password) && !stderr.contains(password));
}

/// A password nobody uses elsewhere, so that finding it anywhere in the output is a leak.
fn random_password() -> String {
    format!("pw-{:012x}", rand::random::<u64>())
}

// ---------------------------------------------------------------------------------------------------------
// A server that does not answer.

#[test]
fn postgres_unreachable_server_is_named_and_the_worker_keeps_running() {
    unreachable_server(SqlKind::Postgres);
}

#[test]
fn mariadb_unreachable_server_is_named_and_the_worker_keeps_running() {
    unreachable_server(SqlKind::Mariadb);
}

/// Nobody listens on the port: `status` exits 3 naming the address; a worker keeps running and logs
/// the failure with the address (it cannot read the server's clock, so it schedules nothing), never the
/// password.
fn unreachable_server(kind: SqlKind) {
    let port = free_port();
    let password = random_password();
    let target = target(port, DATABASE);
    let dir = TestDir::new();
    let path = dir.write_config(&config(kind, port, USER, DATABASE, &env_job("tick")));

    status_fails(&dir, &path, &password, 3, &target, "could not be reached");

    let mut worker = worker(&path, &password);
    let logged = worker.wait_for(Duration::from_secs(15), |e| {
        e["event"] == "clock.unmeasured"
            && e["error"]
                .as_str()
                .is_some_and(|error| error.contains(&target))
    });
    assert!(
        logged.is_some(),
        "no clock.unmeasured naming {target}: {:?}",
        worker.lines()
    );
    assert!(
        worker.wait_timeout(Duration::from_secs(2)).is_none(),
        "the worker stopped: {}",
        worker.stderr()
    );
    assert!(worker.events("run.started").is_empty(), "a job ran");
    assert_no_password(&worker, &password);
}

// ---------------------------------------------------------------------------------------------------------
// A server that answers but refuses the store.

#[test]
fn postgres_wrong_password_and_missing_database_stop_the_worker() {
    refused(SqlKind::Postgres);
}

#[test]
fn mariadb_wrong_password_and_missing_database_stop_the_worker() {
    refused(SqlKind::Mariadb);
}

/// A wrong password: the worker exits 1 at start, "refused the login", and `status` exits 1. A database
/// that does not exist: the same, "does not exist" (MariaDB answers a user without global rights as if
/// it had no rights on the database: 1044, not 1049). On PostgreSQL, a user without `CONNECT` on the
/// database: the same, "may not use it".
fn refused(kind: SqlKind) {
    let server = SqlServer::start(kind);
    let dir = TestDir::new();
    let wrong = random_password();

    let path = dir.write_config(&config(kind, server.port(), USER, DATABASE, &env_job("t")));
    let target = target(server.port(), DATABASE);
    stops_at_start(worker(&path, &wrong), &target, "refused the login", &wrong);
    status_fails(&dir, &path, &wrong, 1, &target, "refused the login");

    let password = testkit::sql::PASSWORD;
    let path = dir.write_config(&config(
        kind,
        server.port(),
        USER,
        "nosuchdb",
        &env_job("t"),
    ));
    let target = self::target(server.port(), "nosuchdb");
    stops_at_start(worker(&path, password), &target, "does not exist", password);
    status_fails(&dir, &path, password, 1, &target, "does not exist");

    if kind == SqlKind::Postgres {
        server.exec(&format!(
            "REVOKE CONNECT ON DATABASE {DATABASE} FROM PUBLIC;"
        ));
        let path = dir.write_config(&config(
            kind,
            server.port(),
            READER,
            DATABASE,
            &env_job("t"),
        ));
        let target = self::target(server.port(), DATABASE);
        let stderr = stops_at_start(
            worker(&path, READER_PASSWORD),
            &target,
            "may not use it",
            READER_PASSWORD,
        );
        assert!(stderr.contains("permission denied"), "{stderr}");
        status_fails(&dir, &path, READER_PASSWORD, 1, &target, "may not use it");
    }
}

// ---------------------------------------------------------------------------------------------------------
// Tables that are not the ones this redcron made.

#[test]
fn postgres_a_newer_schema_or_a_table_changed_by_hand_stops_the_worker() {
    foreign_schema(SqlKind::Postgres);
}

#[test]
fn mariadb_a_newer_schema_or_a_table_changed_by_hand_stops_the_worker() {
    foreign_schema(SqlKind::Mariadb);
}

/// A worker creates the schema and runs; then the schema's version is set to 99 (a newer redcron's):
/// the next worker exits 1, "newer redcron"; with the version back and a column dropped by hand, it
/// exits 1 naming the table and the column. `status` says the same and exits 1.
fn foreign_schema(kind: SqlKind) {
    let server = SqlServer::start(kind);
    let dir = TestDir::new();
    let password = testkit::sql::PASSWORD;
    let path = dir.write_config(&config(kind, server.port(), USER, DATABASE, &env_job("t")));
    let target = target(server.port(), DATABASE);

    let mut first = worker(&path, password);
    first
        .wait_for(Duration::from_secs(20), |e| e["event"] == "run.finished")
        .unwrap_or_else(|| panic!("no run on a new database: {:?}", first.lines()));
    first.kill();

    server.exec("UPDATE redcron_schema SET version = 99;");
    stops_at_start(worker(&path, password), &target, "newer redcron", password);
    status_fails(&dir, &path, password, 1, &target, "newer redcron");

    server.exec("UPDATE redcron_schema SET version = 1;");
    server.exec("ALTER TABLE redcron_leases DROP COLUMN expires_us;");
    let stderr = stops_at_start(worker(&path, password), &target, "redcron_leases", password);
    assert!(stderr.contains("no column expires_us"), "{stderr}");
    status_fails(&dir, &path, password, 1, &target, "no column expires_us");
}

// ---------------------------------------------------------------------------------------------------------
// A user without the right to create tables.

#[test]
fn postgres_a_user_without_ddl_rights_is_given_the_sql_of_check() {
    no_ddl(SqlKind::Postgres);
}

#[test]
fn mariadb_a_user_without_ddl_rights_is_given_the_sql_of_check() {
    no_ddl(SqlKind::Mariadb);
}

/// `reader` on an empty database: the worker exits 1 and its error holds exactly what
/// `redcron check --sql` prints. An administrator runs that output and grants `reader` the rights on the
/// tables; then a `reader` worker starts and runs its job: the SQL is complete for the dialect.
fn no_ddl(kind: SqlKind) {
    let server = SqlServer::start(kind);
    let dir = TestDir::new();
    let path = dir.write_config(&config(
        kind,
        server.port(),
        READER,
        DATABASE,
        &env_job("t"),
    ));
    let target = target(server.port(), DATABASE);

    let (code, script, stderr) = output(
        redcron(dir.path())
            .args(["check", "--sql", "-c"])
            .arg(&path)
            .env(PW_VAR, READER_PASSWORD),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(script.contains("CREATE TABLE"), "{script}");

    let stderr = stops_at_start(
        worker(&path, READER_PASSWORD),
        &target,
        "may not create",
        READER_PASSWORD,
    );
    assert!(
        stderr.contains(&script),
        "the error does not hold `check --sql`'s output:\n{script}\nstderr:\n{stderr}"
    );
    assert!(stderr.contains("grant this user SELECT, INSERT, UPDATE and DELETE"));
    status_fails(&dir, &path, READER_PASSWORD, 1, &target, &script);

    server.exec(&script);
    // The tables are the administrator's: `reader` needs the rights on them that the message asks for.
    server.exec(&match kind {
        SqlKind::Postgres => format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {READER};"
        ),
        SqlKind::Mariadb => {
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {DATABASE}.* TO '{READER}'@'%';")
        }
    });
    let worker = worker(&path, READER_PASSWORD);
    let finished = worker
        .wait_for(Duration::from_secs(20), |e| e["event"] == "run.finished")
        .unwrap_or_else(|| {
            panic!(
                "no run as {READER}: {:?}\n{}",
                worker.lines(),
                worker.stderr()
            )
        });
    assert_eq!(finished["outcome"], "success", "{finished}");
    let (code, stdout, stderr) = status(&dir, &path, READER_PASSWORD);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
}

// ---------------------------------------------------------------------------------------------------------
// The password and the jobs.

#[test]
fn postgres_store_password_is_kept_from_jobs() {
    password_kept_from_jobs(SqlKind::Postgres);
}

#[test]
fn mariadb_store_password_is_kept_from_jobs() {
    password_kept_from_jobs(SqlKind::Mariadb);
}

/// The URL's `${SQL_PW}`: a job that inherits the worker's environment does not get it, and the
/// password appears nowhere in the worker's output, though the job prints its whole environment there.
fn password_kept_from_jobs(kind: SqlKind) {
    let server = SqlServer::start(kind);
    let dir = TestDir::new();
    let password = testkit::sql::PASSWORD;
    let path = dir.write_config(&config(
        kind,
        server.port(),
        USER,
        DATABASE,
        &env_job("env"),
    ));
    let worker = worker(&path, password);

    let finished = worker
        .wait_for(Duration::from_secs(20), |e| {
            e["event"] == "run.finished" && e["job"] == "env"
        })
        .unwrap_or_else(|| panic!("the job did not run: {:?}", worker.lines()));
    assert_eq!(finished["outcome"], "success", "{finished}");
    let environment: BTreeMap<String, String> = dir
        .read("env.env")
        .expect("the job wrote its environment")
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    assert!(!environment.contains_key(PW_VAR), "{environment:?}");
    assert!(environment.contains_key("PATH"), "{environment:?}");
    assert!(
        !environment.values().any(|value| value.contains(password)),
        "{environment:?}"
    );
    let printed: Vec<Value> = worker.events("run.output");
    assert!(!printed.is_empty(), "the job printed its environment");
    assert_no_password(&worker, password);
}

// ---------------------------------------------------------------------------------------------------------
// A user without the rights on the tables.

#[test]
fn postgres_a_user_without_write_rights_is_refused_at_start_and_a_revoke_is_a_permission_error() {
    no_rights(SqlKind::Postgres);
}

#[test]
fn mariadb_a_user_without_write_rights_is_refused_at_start_and_a_revoke_is_a_permission_error() {
    no_rights(SqlKind::Mariadb);
}

/// A user that may only SELECT the tables: the worker exits 1 naming a table and the GRANT to run. Then
/// `reader`'s INSERT, UPDATE and DELETE are revoked while its worker runs: its claims are logged as
/// denied (`permission_denied`, not `no_quorum`); granted back, its job runs again within seconds (the
/// connections that were refused are closed, not reused with the rights they had).
fn no_rights(kind: SqlKind) {
    let server = SqlServer::start(kind);
    let dir = TestDir::new();
    let target = target(server.port(), DATABASE);
    let password = testkit::sql::PASSWORD;
    let path = dir.write_config(&config(kind, server.port(), USER, DATABASE, &env_job("t")));
    let mut first = worker(&path, password);
    first
        .wait_for(Duration::from_secs(20), |e| e["event"] == "run.finished")
        .unwrap_or_else(|| panic!("no run on a new database: {:?}", first.lines()));
    first.kill();

    server.exec(&match kind {
        SqlKind::Postgres => "CREATE ROLE viewer LOGIN PASSWORD 'viewer-pw';\n\
                              GRANT USAGE ON SCHEMA public TO viewer;\n\
                              GRANT SELECT ON ALL TABLES IN SCHEMA public TO viewer;\n"
            .to_string(),
        SqlKind::Mariadb => format!(
            "CREATE USER 'viewer'@'%' IDENTIFIED BY 'viewer-pw';\n\
             GRANT SELECT ON {DATABASE}.* TO 'viewer'@'%';\n"
        ),
    });
    let viewer = dir.write(
        "viewer.yaml",
        config(kind, server.port(), "viewer", DATABASE, &env_job("t")),
    );
    let stderr = stops_at_start(
        worker(&viewer, "viewer-pw"),
        &target,
        "may not",
        "viewer-pw",
    );
    assert!(
        stderr.contains("GRANT SELECT, INSERT, UPDATE, DELETE ON redcron_fences"),
        "{stderr}"
    );

    let reading = dir.write(
        "reader.yaml",
        config(kind, server.port(), READER, DATABASE, &env_job("t")),
    );
    let mut running = worker(&reading, READER_PASSWORD);
    running
        .wait_for(Duration::from_secs(20), |e| e["event"] == "run.finished")
        .unwrap_or_else(|| panic!("no run as {READER}: {:?}", running.lines()));
    let (revoke, grant) = match kind {
        SqlKind::Postgres => (
            format!("REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public FROM {READER};"),
            format!("GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {READER};"),
        ),
        SqlKind::Mariadb => (
            // MariaDB checks database-level rights when a session starts: a revoke reaches the sessions
            // already open only once they end, so the operator's revoke ends them (`KILL USER`), and the
            // pool's new sessions are refused.
            format!("REVOKE INSERT, UPDATE, DELETE ON {DATABASE}.* FROM '{READER}'@'%'; FLUSH PRIVILEGES; KILL USER '{READER}';"),
            format!("GRANT INSERT, UPDATE, DELETE ON {DATABASE}.* TO '{READER}'@'%'; FLUSH PRIVILEGES;"),
        ),
    };
    server.exec(&revoke);
    let denied = running
        .wait_for(Duration::from_secs(20), |e| {
            e["reason"] == "permission_denied"
        })
        .unwrap_or_else(|| panic!("no permission_denied: {:?}", running.lines()));
    assert_eq!(denied["level"], "ERROR", "{denied}");
    let error = denied["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&target) && error.contains("permission denied"),
        "{error}"
    );
    assert!(
        !running
            .logs()
            .iter()
            .any(|e| e["job"] == "t" && e["reason"] == "no_quorum"),
        "a denied claim was told as no quorum: {:?}",
        running.lines()
    );

    server.exec(&grant);
    let granted = chrono::Utc::now();
    running
        .wait_for(Duration::from_secs(10), |e| {
            e["event"] == "run.finished"
                && e["timestamp"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|t| t.to_utc() > granted)
        })
        .unwrap_or_else(|| panic!("no run after the rights were back: {:?}", running.lines()));
    running.kill();
}
