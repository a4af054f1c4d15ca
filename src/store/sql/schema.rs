//! The store's tables on the server: created by the first worker that finds none, checked by every
//! store before its first call, versioned in `<prefix>_schema`.
//!
//! Schema 1 is this module's [`tables`]: per key, as in Redis, fence counters, claim records (with the
//! expiry of those of triggers and retries) and leases (expiring on the database's clock, in µs); history
//! entries by job and id; members by id; pauses by job; trigger requests by id. A server that answers but
//! cannot hold them — refused credentials, a missing database (or one the user may not use), a version
//! older than the store needs, a schema of a newer redcron, a table changed by hand, a user without the
//! right to create tables, a user without the rights on them that claims need (checked at start by
//! [`missing_right`]) — is [`Unusable`], with what to do about it.

use sqlx::{AnyConnection, Connection as _, Executor as _};

use super::dialect::TABLES;
use super::{Dialect, Failed, SqlStore};
use crate::config::SqlDialect;

/// The schema this version of redcron writes and reads.
pub const SCHEMA_VERSION: i64 = 1;

/// Why the server answers but the store cannot use it; each says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("the server refused the login: {0} (check the user and the password in the URL)")]
    Login(String),
    #[error("the database does not exist: {0} (create it, or name an existing one in the URL)")]
    NoDatabase(String),
    /// MySQL answers a database that does not exist and one the user has no rights on alike (1044), and
    /// PostgreSQL refuses a user without `CONNECT` on it (42501).
    #[error("the database does not exist or this user may not use it: {0} (create it, or grant the user its rights)")]
    NoAccess(String),
    #[error("the server is {found}; the SQL store needs {needed} or later")]
    TooOld { found: String, needed: &'static str },
    #[error("its tables were written by a newer redcron (schema {found}; this one knows {SCHEMA_VERSION}): upgrade this worker")]
    Newer { found: i64 },
    #[error("table {table} does not have the columns redcron made ({why}): was it changed by hand? Restore it, or drop the store's tables to start afresh")]
    Changed { table: String, why: String },
    #[error("this user may not create the store's tables ({why}). Have an administrator run, in this database, \
             the statements below (what `redcron check --sql` prints), and grant this user SELECT, INSERT, UPDATE \
             and DELETE on the tables unless it owns them:\n{sql}")]
    NoDdl { why: String, sql: String },
    #[error("this user may not {missing}. Have an administrator run, in this database:\n{grant}")]
    NoRights { missing: String, grant: String },
}

/// The store's tables for one server and key prefix, as `redcron check` shows them.
pub struct Schema {
    dialect: Dialect,
}

impl Schema {
    /// The tables of a `kind` store with `key_prefix`.
    pub fn new(kind: SqlDialect, key_prefix: &str) -> Schema {
        Schema {
            dialect: Dialect::new(kind, key_prefix),
        }
    }

    /// The tables' names, in the order they are created.
    pub fn tables(&self) -> Vec<String> {
        TABLES
            .iter()
            .map(|table| self.dialect.table(table))
            .collect()
    }

    /// The SQL that creates them ([`script`]).
    pub fn script(&self) -> String {
        script(&self.dialect)
    }
}

/// The columns of each table, in order, with their types (`{key}`, `{text}`, `{job}`, `{id}` per
/// server, see [`Dialect::sql`]), and the primary key.
fn columns(table: &str) -> (&'static [(&'static str, &'static str)], &'static str) {
    match table {
        "schema" => (&[("id", "INT NOT NULL"), ("version", "INT NOT NULL")], "id"),
        "fences" => (
            &[("lock_key", "{key} NOT NULL"), ("token", "BIGINT NOT NULL")],
            "lock_key",
        ),
        "claims" => (
            &[
                ("lock_key", "{key} NOT NULL"),
                ("tick", "BIGINT NOT NULL"),
                ("value", "{text} NOT NULL"),
                ("token", "BIGINT NOT NULL"),
                ("expires_ms", "BIGINT"),
            ],
            "lock_key",
        ),
        "leases" => (
            &[
                ("lock_key", "{key} NOT NULL"),
                ("value", "{text} NOT NULL"),
                ("expires_us", "BIGINT NOT NULL"),
            ],
            "lock_key",
        ),
        "history" => (
            &[
                ("job", "{job} NOT NULL"),
                ("id", "{id} NOT NULL"),
                ("tick", "BIGINT NOT NULL"),
                ("entry", "{text} NOT NULL"),
            ],
            "job, id",
        ),
        "members" => (
            &[
                ("id", "{id} NOT NULL"),
                ("seen_ms", "BIGINT NOT NULL"),
                ("member", "{text} NOT NULL"),
                ("expires_us", "BIGINT NOT NULL"),
                ("expired_ms", "BIGINT NOT NULL"),
            ],
            "id",
        ),
        "paused" => (
            &[
                ("job", "{job} NOT NULL"),
                ("value", "{text} NOT NULL"),
                ("until_ms", "BIGINT"),
            ],
            "job",
        ),
        _ => (
            &[
                ("id", "{job} NOT NULL"),
                ("job", "{job} NOT NULL"),
                ("request", "{text} NOT NULL"),
                ("expires_ms", "BIGINT NOT NULL"),
            ],
            "id",
        ),
    }
}

/// The statements that create schema 1 on an empty database, in order (each idempotent, so that two
/// workers starting together on a new database both succeed).
pub fn tables(dialect: &Dialect) -> Vec<String> {
    let mut statements = Vec::new();
    for table in TABLES {
        let (columns, key) = columns(table);
        let mut body: Vec<String> = columns
            .iter()
            .map(|(name, kind)| format!("{name} {kind}"))
            .collect();
        body.push(format!("PRIMARY KEY ({key})"));
        let history_index = table == "history";
        if history_index && dialect.kind() == SqlDialect::Mysql {
            body.push(format!(
                "INDEX {}_by_tick (job, tick)",
                dialect.table("history")
            ));
        }
        let options = match dialect.kind() {
            SqlDialect::Postgres => "",
            SqlDialect::Mysql => " ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
        };
        statements.push(dialect.sql(&format!(
            "CREATE TABLE IF NOT EXISTS {{{table}}} (\n  {}\n){options}",
            body.join(",\n  ")
        )));
        if history_index && dialect.kind() == SqlDialect::Postgres {
            statements.push(dialect.sql(&format!(
                "CREATE INDEX IF NOT EXISTS {}_by_tick ON {{history}} (job, tick)",
                dialect.table("history")
            )));
        }
    }
    let version = format!("INSERT INTO {{schema}} (id, version) VALUES (1, {SCHEMA_VERSION})");
    statements.push(dialect.sql(&match dialect.kind() {
        SqlDialect::Postgres => format!("{version} ON CONFLICT DO NOTHING"),
        SqlDialect::Mysql => format!("{version} ON DUPLICATE KEY UPDATE id = id"),
    }));
    statements
}

/// The tables' SQL as an administrator runs it by hand: every statement of [`tables`], `;`-terminated.
pub fn script(dialect: &Dialect) -> String {
    tables(dialect)
        .iter()
        .map(|statement| format!("{statement};\n"))
        .collect()
}

/// Checks the server and the schema, creating the tables on a database without them; see
/// [`crate::store::Health::prepare`].
pub(super) async fn prepare(store: &SqlStore) -> Result<(), Failed> {
    let shared = &store.shared;
    let budget = shared
        .settings
        .node_timeout
        .max(std::time::Duration::from_secs(5));
    // A session of its own, not the pool's: a refused connection is told at once, with its cause.
    let mut connection = tokio::time::timeout(budget, store.direct_session())
        .await
        .map_err(|_| Failed::Before(format!("no connection within {budget:?}")))?
        .map_err(|e| classify(store, &e))?;
    match tokio::time::timeout(budget, check(&shared.dialect, &mut connection)).await {
        Ok(result) => {
            // Said goodbye to, so that the server logs no broken connection (it has just answered;
            // bounded all the same).
            let _ = tokio::time::timeout(budget, connection.close()).await;
            result
        }
        // A server that did not answer is left to notice the closed socket: no wait on it.
        Err(_) => Err(Failed::Before(format!(
            "the schema check got no answer within {budget:?}"
        ))),
    }
}

/// A failure to connect: the login refused, the database missing or not this user's to use are
/// [`Unusable`]; anything else (the server down, a timeout) may pass.
fn classify(store: &SqlStore, e: &sqlx::Error) -> Failed {
    let why = store.describe_error(e);
    let code = e
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.to_string());
    let number = e
        .as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|d| d.number());
    match (code.as_deref(), number) {
        (Some("28P01" | "28000"), _) | (_, Some(1045 | 1698)) => {
            Failed::Unusable(Unusable::Login(why))
        }
        (Some("3D000"), _) | (_, Some(1049)) => Failed::Unusable(Unusable::NoDatabase(why)),
        (Some("42501"), _) | (_, Some(1044)) => Failed::Unusable(Unusable::NoAccess(why)),
        _ => Failed::Before(why),
    }
}

/// The server's version, the schema's version and columns, and the tables created if there are none.
async fn check(dialect: &Dialect, connection: &mut AnyConnection) -> Result<(), Failed> {
    let before = |e: sqlx::Error| Failed::Before(super::dialect::scrub(&e.to_string()));
    server_version(dialect, connection).await?;
    let version = schema_version(dialect, connection).await?;
    match version {
        None => create(dialect, connection).await?,
        Some(SCHEMA_VERSION) => {}
        Some(found) if found > SCHEMA_VERSION => {
            return Err(Failed::Unusable(Unusable::Newer { found }))
        }
        Some(found) => {
            return Err(Failed::Unusable(Unusable::Changed {
                table: dialect.table("schema"),
                why: format!("schema version {found}, which no redcron wrote"),
            }))
        }
    }
    for table in TABLES {
        let (expected, _) = columns(table);
        let sql = dialect.sql(match dialect.kind() {
            SqlDialect::Postgres => {
                "SELECT CAST(column_name AS TEXT) FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position"
            }
            SqlDialect::Mysql => {
                "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position"
            }
        });
        let found: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(dialect.table(table))
            .fetch_all(&mut *connection)
            .await
            .map_err(before)?;
        let found: Vec<&str> = found.iter().map(|(name,)| name.as_str()).collect();
        let missing: Vec<&str> = expected
            .iter()
            .map(|(name, _)| *name)
            .filter(|name| !found.iter().any(|f| f.eq_ignore_ascii_case(name)))
            .collect();
        if !missing.is_empty() {
            let why = if found.is_empty() {
                "the table is missing".to_string()
            } else {
                format!("no column {}", missing.join(", "))
            };
            return Err(Failed::Unusable(Unusable::Changed {
                table: dialect.table(table),
                why,
            }));
        }
    }
    if let Some(missing) = missing_right(dialect, connection).await.map_err(before)? {
        let grant = grant(dialect, connection).await.map_err(before)?;
        return Err(Failed::Unusable(Unusable::NoRights { missing, grant }));
    }
    Ok(())
}

/// The first right on the store's tables that this session lacks, as "<privilege> <table> (<the server's
/// refusal>)", or `None` if it has them all: SELECT on the schema table, SELECT, INSERT, UPDATE and DELETE
/// on the others, each tried as a statement that touches no row (the server checks a statement's
/// privileges before it runs it, whatever it would match), in one transaction that is rolled back.
/// Only a permission error counts (PostgreSQL `42501`, MySQL 1142 and kin); any other is returned.
pub(super) async fn missing_right(
    dialect: &Dialect,
    connection: &mut AnyConnection,
) -> Result<Option<String>, sqlx::Error> {
    let mut transaction = connection.begin().await?;
    for table in TABLES {
        let name = dialect.table(table);
        let (columns, _) = columns(table);
        let first = columns[0].0;
        let mut statements = vec![("SELECT", format!("SELECT 1 FROM {name} WHERE 1 = 0"))];
        if table != "schema" {
            statements.extend([
                (
                    "INSERT into",
                    format!("INSERT INTO {name} SELECT * FROM {name} WHERE 1 = 0"),
                ),
                (
                    "UPDATE",
                    format!("UPDATE {name} SET {first} = {first} WHERE 1 = 0"),
                ),
                ("DELETE from", format!("DELETE FROM {name} WHERE 1 = 0")),
            ]);
        }
        for (privilege, statement) in statements {
            match transaction.execute(sqlx::AssertSqlSafe(statement)).await {
                Ok(_) => {}
                Err(e) if super::denied(&e) => {
                    // Dropped, the transaction is rolled back; PostgreSQL's is aborted already.
                    let why = e
                        .as_database_error()
                        .map_or_else(|| e.to_string(), |d| d.message().to_string());
                    return Ok(Some(format!(
                        "{privilege} {name} ({})",
                        super::dialect::scrub(&why)
                    )));
                }
                Err(e) => return Err(e),
            }
        }
    }
    transaction.rollback().await?;
    Ok(None)
}

/// The statements that grant this session's user the rights [`missing_right`] checks.
async fn grant(dialect: &Dialect, connection: &mut AnyConnection) -> Result<String, sqlx::Error> {
    let tables: Vec<String> = TABLES.iter().map(|table| dialect.table(table)).collect();
    let rights = "SELECT, INSERT, UPDATE, DELETE";
    Ok(match dialect.kind() {
        SqlDialect::Postgres => {
            let (user,): (String,) = sqlx::query_as("SELECT CAST(current_user AS TEXT)")
                .fetch_one(&mut *connection)
                .await?;
            let user = format!("\"{}\"", user.replace('"', "\"\""));
            format!(
                "GRANT SELECT ON {} TO {user};\nGRANT {rights} ON {} TO {user};\n",
                tables[0],
                tables[1..].join(", ")
            )
        }
        SqlDialect::Mysql => {
            let (user,): (String,) = sqlx::query_as("SELECT CAST(CURRENT_USER() AS CHAR)")
                .fetch_one(&mut *connection)
                .await?;
            let (name, host) = user.rsplit_once('@').unwrap_or((&user, "%"));
            let user = format!(
                "'{}'@'{}'",
                name.replace('\'', "''"),
                host.replace('\'', "''")
            );
            let mut grant = format!("GRANT SELECT ON {} TO {user};\n", tables[0]);
            for table in &tables[1..] {
                grant.push_str(&format!("GRANT {rights} ON {table} TO {user};\n"));
            }
            grant
        }
    })
}

/// Refuses a server older than the store needs ([`too_old`]).
async fn server_version(dialect: &Dialect, connection: &mut AnyConnection) -> Result<(), Failed> {
    let before = |e: sqlx::Error| Failed::Before(super::dialect::scrub(&e.to_string()));
    let (version,): (String,) = sqlx::query_as(match dialect.kind() {
        SqlDialect::Postgres => "SELECT CAST(current_setting('server_version') AS TEXT)",
        SqlDialect::Mysql => "SELECT CAST(VERSION() AS CHAR)",
    })
    .fetch_one(&mut *connection)
    .await
    .map_err(before)?;
    match too_old(dialect.kind(), &version) {
        Some(unusable) => Err(Failed::Unusable(unusable)),
        None => Ok(()),
    }
}

/// Why a server whose version string is `version` (PostgreSQL's `server_version`, MySQL's `VERSION()`) is
/// too old for the store, if it is: the store is built and tested for PostgreSQL 13, MySQL 8.0 and
/// MariaDB 10.6 or later (issue 23). A version it cannot read counts as 0, so an unknown server is
/// refused, with what it said.
pub(super) fn too_old(kind: SqlDialect, version: &str) -> Option<Unusable> {
    // MariaDB's handshake (not VERSION()) prefixes "5.5.5-" for clients that check for MySQL 5.
    let numbered = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut numbers = numbered
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let (ok, needed, name) = match kind {
        SqlDialect::Postgres => (major >= 13, "PostgreSQL 13", "PostgreSQL"),
        SqlDialect::Mysql if mariadb => ((major, minor) >= (10, 6), "MariaDB 10.6", "MariaDB"),
        SqlDialect::Mysql => (major >= 8, "MySQL 8.0", "MySQL"),
    };
    (!ok).then(|| Unusable::TooOld {
        found: format!("{name} {}", crate::logging::shorten(version, 60)),
        needed,
    })
}

/// The schema version the database holds, `None` if it has no schema table (a new database).
async fn schema_version(
    dialect: &Dialect,
    connection: &mut AnyConnection,
) -> Result<Option<i64>, Failed> {
    let sql = dialect.sql("SELECT version FROM {schema} WHERE id = 1");
    match sqlx::query_as::<_, (i64,)>(sqlx::AssertSqlSafe(sql))
        .fetch_optional(&mut *connection)
        .await
    {
        Ok(Some((version,))) => Ok(Some(version)),
        // The table exists without its row: an interrupted creation, finished by `create`.
        Ok(None) => Ok(None),
        Err(e) if missing_table(&e) => Ok(None),
        Err(e) => Err(Failed::Before(super::dialect::scrub(&e.to_string()))),
    }
}

/// Whether `e` says that a table does not exist (PostgreSQL `42P01`, MySQL 1146).
fn missing_table(e: &sqlx::Error) -> bool {
    let Some(db) = e.as_database_error() else {
        return false;
    };
    let number = db
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|d| d.number());
    db.code().as_deref() == Some("42P01") || number == Some(1146)
}

/// Runs the statements of [`tables`]: on PostgreSQL in one transaction (its DDL is transactional, so the
/// schema appears whole or not at all), with the notices of tables a racing worker made first
/// ("already exists, skipping") kept from the log.
async fn create_tables(
    dialect: &Dialect,
    connection: &mut AnyConnection,
) -> Result<(), sqlx::Error> {
    match dialect.kind() {
        SqlDialect::Postgres => {
            let mut transaction = connection.begin().await?;
            transaction
                .execute("SET LOCAL client_min_messages = warning")
                .await?;
            for statement in tables(dialect) {
                transaction.execute(sqlx::AssertSqlSafe(statement)).await?;
            }
            transaction.commit().await
        }
        SqlDialect::Mysql => {
            for statement in tables(dialect) {
                connection.execute(sqlx::AssertSqlSafe(statement)).await?;
            }
            Ok(())
        }
    }
}

/// Creates the tables; a user without the right to is told the SQL to have run for it. Two workers
/// creating them at once both succeed (every statement is idempotent; a race inside PostgreSQL's
/// catalog is tried again).
async fn create(dialect: &Dialect, connection: &mut AnyConnection) -> Result<(), Failed> {
    for attempt in 0..3 {
        let Err(e) = create_tables(dialect, connection).await else {
            return Ok(());
        };
        let db = e.as_database_error();
        let code = db.and_then(|d| d.code()).map(|c| c.to_string());
        let number = db
            .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
            .map(|d| d.number());
        let why = super::dialect::scrub(&e.to_string());
        if code.as_deref() == Some("42501") || matches!(number, Some(1142 | 1044 | 1227)) {
            return Err(Failed::Unusable(Unusable::NoDdl {
                why,
                sql: script(dialect),
            }));
        }
        // Two creators racing on PostgreSQL's catalog: the other one's table is there now.
        if attempt < 2 && matches!(code.as_deref(), Some("23505" | "42P07")) {
            continue;
        }
        return Err(Failed::Before(why));
    }
    let _ = connection.ping().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version strings as the servers report them (Debian's and upstream's builds).
    #[test]
    fn too_old_reads_real_version_strings() {
        let postgres = SqlDialect::Postgres;
        let mysql = SqlDialect::Mysql;
        for (kind, version, refused) in [
            (postgres, "12.17 (Debian 12.17-1.pgdg120+1)", true),
            (postgres, "9.6.24", true),
            (postgres, "13.0", false),
            (postgres, "15.18", false),
            (postgres, "15.18 (Debian 15.18-0+deb12u1)", false),
            (postgres, "17beta1", false),
            (mysql, "10.5.23-MariaDB-0+deb11u1", true),
            (mysql, "5.5.5-10.5.23-MariaDB-0+deb11u1", true),
            (mysql, "10.6.0-MariaDB", false),
            (mysql, "10.11.6-MariaDB-0+deb12u1", false),
            (mysql, "5.5.5-10.11.6-MariaDB-0+deb12u1", false),
            (mysql, "11.4.2-MariaDB", false),
            (mysql, "5.7.44", true),
            (mysql, "5.7.44-log", true),
            (mysql, "8.0.36", false),
            (mysql, "8.0.36-0ubuntu0.22.04.1", false),
            (mysql, "", true),
        ] {
            assert_eq!(
                too_old(kind, version).is_some(),
                refused,
                "{kind:?} {version:?}"
            );
        }
    }

    /// The refusal names the server as it said it and the version needed.
    #[test]
    fn too_old_says_what_was_found_and_what_is_needed() {
        let message = too_old(SqlDialect::Mysql, "10.5.23-MariaDB-0+deb11u1")
            .map(|u| u.to_string())
            .unwrap_or_default();
        assert_eq!(
            message,
            "the server is MariaDB 10.5.23-MariaDB-0+deb11u1; the SQL store needs MariaDB 10.6 or later"
        );
        let message = too_old(SqlDialect::Postgres, "12.17 (Debian 12.17-1.pgdg120+1)")
            .map(|u| u.to_string())
            .unwrap_or_default();
        assert!(message.contains("PostgreSQL 12.17") && message.contains("needs PostgreSQL 13"));
        let message = too_old(SqlDialect::Mysql, "5.7.44")
            .map(|u| u.to_string())
            .unwrap_or_default();
        assert!(message.contains("MySQL 5.7.44") && message.contains("needs MySQL 8.0"));
    }
}
