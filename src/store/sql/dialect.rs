//! What differs between PostgreSQL and MySQL/MariaDB, in one place: the SQL text of a statement
//! (placeholders, the clock, upserts, column types), how a transaction begins, and the connection URL.
//!
//! Statements are written once, with `?` placeholders and `{name}` markers, and [`Dialect::sql`] renders
//! them for the server: `{claims}` and the other tables become `<key_prefix>_claims`; `{now_us}` and
//! `{now_ms}` the server's clock as an integer since the epoch; `?` becomes `$1`, `$2`… on PostgreSQL.

use crate::config::{SqlConfig, SqlDialect, SqlTls};

/// The tables of the store (without the prefix), in the order they are created.
pub(super) const TABLES: [&str; 8] = [
    "schema", "fences", "claims", "leases", "history", "members", "paused", "triggers",
];

/// The SQL of one server for one key prefix.
#[derive(Debug, Clone)]
pub struct Dialect {
    kind: SqlDialect,
    prefix: String,
}

impl Dialect {
    /// The dialect of `kind` for tables named `<prefix>_<table>` (`prefix` is checked by the config: letters,
    /// digits and `_`, so it is a plain identifier in both servers).
    /// PostgreSQL folds unquoted names to lower case, so its prefix is kept in lower case: the names the
    /// schema check looks up are then the names the tables have.
    pub fn new(kind: SqlDialect, prefix: &str) -> Dialect {
        let prefix = match kind {
            SqlDialect::Postgres => prefix.to_ascii_lowercase(),
            SqlDialect::Mysql => prefix.to_string(),
        };
        Dialect { kind, prefix }
    }

    /// Which server.
    pub fn kind(&self) -> SqlDialect {
        self.kind
    }

    /// The config section's name: `postgres` or `mysql`.
    pub fn section(&self) -> &'static str {
        self.kind.section()
    }

    /// `<prefix>_<table>`.
    pub fn table(&self, table: &str) -> String {
        format!("{}_{table}", self.prefix)
    }

    /// `sql` rendered for this server (see the module).
    pub fn sql(&self, sql: &str) -> String {
        let mut text = sql.to_string();
        for table in TABLES {
            text = text.replace(&format!("{{{table}}}"), &self.table(table));
        }
        let (now_us, now_ms, read_only, key, text_type, job, id) = match self.kind {
            SqlDialect::Postgres => (
                "CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000) AS BIGINT)",
                "CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)",
                "CASE WHEN pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on' THEN 1 ELSE 0 END",
                "VARCHAR(1024)",
                "TEXT",
                "VARCHAR(512)",
                "VARCHAR(512)",
            ),
            SqlDialect::Mysql => (
                "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
                "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)",
                "CASE WHEN @@global.read_only THEN 1 ELSE 0 END",
                // Keys are ASCII (job names are), compared byte for byte: the default collation would
                // make `Backup` and `backup` one job, and a key of 1024 characters stays within InnoDB's
                // 3072 bytes per index.
                "VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin",
                "MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                "VARCHAR(512) CHARACTER SET ascii COLLATE ascii_bin",
                "VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            ),
        };
        text = text
            // A lease, claim or pause value as a claim reads it: one longer than any redcron writes (planted
            // by something else) reads as `-`, a holder nobody knows, instead of megabytes per claim.
            .replace(
                "{short_value}",
                "CASE WHEN OCTET_LENGTH(value) <= 4096 THEN value ELSE '-' END",
            )
            .replace("{now_us}", now_us)
            .replace("{now_ms}", now_ms)
            .replace("{read_only}", read_only)
            .replace("{key}", key)
            .replace("{text}", text_type)
            .replace("{job}", job)
            .replace("{id}", id);
        match self.kind {
            SqlDialect::Postgres => numbered(&text),
            SqlDialect::Mysql => text,
        }
    }

    /// An upsert of `columns` (the first `keys` of them the primary key) into `table`: insert, or on a
    /// duplicate key set the other columns to the new values.
    pub fn upsert(&self, table: &str, columns: &[&str], keys: usize) -> String {
        self.upsert_values(table, columns, &vec!["?"; columns.len()], keys)
    }

    /// As [`Dialect::upsert`], with `values` the SQL of each column's value (`?`, or `{now_ms}` …).
    pub fn upsert_values(
        &self,
        table: &str,
        columns: &[&str],
        values: &[&str],
        keys: usize,
    ) -> String {
        let marks = values.join(", ");
        let updated = &columns[keys..];
        let head = format!(
            "INSERT INTO {{{table}}} ({}) VALUES ({marks})",
            columns.join(", ")
        );
        let tail = match self.kind {
            SqlDialect::Postgres => format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                columns[..keys].join(", "),
                updated
                    .iter()
                    .map(|c| format!("{c} = EXCLUDED.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SqlDialect::Mysql => format!(
                " ON DUPLICATE KEY UPDATE {}",
                updated
                    .iter()
                    .map(|c| format!("{c} = VALUES({c})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        self.sql(&format!("{head}{tail}"))
    }

    /// An insert into `table` that does nothing if the key exists.
    pub fn insert_new(&self, table: &str, columns: &[&str]) -> String {
        let marks = vec!["?"; columns.len()].join(", ");
        let sql = match self.kind {
            SqlDialect::Postgres => format!(
                "INSERT INTO {{{table}}} ({}) VALUES ({marks}) ON CONFLICT DO NOTHING",
                columns.join(", ")
            ),
            // Not INSERT IGNORE, which would turn every error (a value too long) into a warning.
            SqlDialect::Mysql => format!(
                "INSERT INTO {{{table}}} ({}) VALUES ({marks}) ON DUPLICATE KEY UPDATE {c} = {c}",
                columns.join(", "),
                c = columns[0]
            ),
        };
        self.sql(&sql)
    }

    /// The statement that begins a transaction: `READ COMMITTED` on PostgreSQL, so that each statement
    /// sees what committed before it whatever the server's default (MySQL's connections are set to it when
    /// they open: [`Dialect::on_connect`]).
    pub fn begin(&self) -> &'static str {
        match self.kind {
            SqlDialect::Postgres => "BEGIN ISOLATION LEVEL READ COMMITTED",
            SqlDialect::Mysql => "START TRANSACTION",
        }
    }

    /// The first statement of every transaction, if any: on PostgreSQL, bounds (for this transaction only,
    /// which a pooler in transaction mode keeps) on how long it waits for a row lock and how long it may
    /// sit idle — a worker paused in the middle of one must not hold the job's rows past `idle_ms`.
    pub fn in_transaction(&self, lock_ms: u128, idle_ms: u128) -> Option<String> {
        match self.kind {
            SqlDialect::Postgres => Some(format!(
                "SELECT set_config('lock_timeout', '{lock_ms}ms', true), \
                 set_config('idle_in_transaction_session_timeout', '{idle_ms}ms', true)"
            )),
            SqlDialect::Mysql => None,
        }
    }

    /// The statements a read's session runs after [`Dialect::on_connect`]'s: on MariaDB, a bound of
    /// `read_ms` on each statement (`max_statement_time`, in a `/*M! … */` comment: MySQL's own bound,
    /// `max_execution_time`, is a name MariaDB refuses, so MySQL's reads are bounded by the client only).
    /// PostgreSQL's bound is per transaction ([`Dialect::read_bound`]).
    pub fn read_session(&self, lock_s: u64, read_ms: u128) -> Vec<String> {
        match self.kind {
            SqlDialect::Postgres => Vec::new(),
            SqlDialect::Mysql => vec![format!(
                "SET SESSION innodb_lock_wait_timeout = {lock_s} \
                 /*M!100108 , max_statement_time = {}.{:03} */",
                read_ms / 1000,
                read_ms % 1000
            )],
        }
    }

    /// On PostgreSQL, the first statement of a read's transaction ([`Dialect::begin_read`]): its
    /// statements are cancelled by the server after `read_ms`, for this transaction only.
    pub fn read_bound(&self, read_ms: u128) -> Option<String> {
        match self.kind {
            SqlDialect::Postgres => Some(format!(
                "SELECT set_config('statement_timeout', '{read_ms}ms', true)"
            )),
            SqlDialect::Mysql => None,
        }
    }

    /// The statement that begins a read's transaction (PostgreSQL): read-only, `READ COMMITTED`.
    pub fn begin_read(&self) -> &'static str {
        "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY"
    }

    /// The statements every new connection runs, if any: on MySQL, `READ COMMITTED` (InnoDB's default
    /// `REPEATABLE READ` would read a snapshot taken before a row lock was waited for), a lock wait of
    /// `lock_s`, and an idle limit of `idle_s` (a worker paused inside a transaction must not hold the
    /// job's rows for hours). MariaDB also ends a transaction left idle for `idle_transaction_s`
    /// (`idle_transaction_timeout`, in a `/*M! … */` comment that only MariaDB executes: MySQL has no
    /// such bound, and its `wait_timeout` stands in for it), so that a worker frozen inside a claim holds
    /// the jobs of its chunk for about a second, not a TTL.
    pub fn on_connect(&self, lock_s: u64, idle_s: u64, idle_transaction_s: u64) -> Vec<String> {
        match self.kind {
            SqlDialect::Postgres => Vec::new(),
            SqlDialect::Mysql => vec![
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_string(),
                format!(
                    "SET SESSION innodb_lock_wait_timeout = {lock_s}, wait_timeout = {idle_s} \
                     /*M!100300 , idle_transaction_timeout = {idle_transaction_s} */"
                ),
            ],
        }
    }
}

/// `?` placeholders numbered `$1`, `$2`…; a `?` inside a `'…'` literal stays as it is.
fn numbered(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut n = 0;
    let mut quoted = false;
    for c in text.chars() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == '?' && !quoted {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// `host:port/database` of a URL (no user, no password), to name the server.
pub fn target(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    rest.split(['?', '#']).next().unwrap_or(rest).to_string()
}

/// `text` with anything that looks like a URL's password replaced: a driver's error may quote the URL.
pub fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_inclusive(char::is_whitespace) {
        if word.contains("://") && word.contains('@') {
            out.push_str(&crate::config::redact(word.trim_end()));
            out.push_str(&word[word.trim_end().len()..]);
        } else {
            out.push_str(word);
        }
    }
    out
}

/// The URL sqlx connects with: the config's, with the TLS settings as the driver's parameters.
pub fn connect_url(config: &SqlConfig) -> Result<String, String> {
    let mut params: Vec<(&str, String)> = Vec::new();
    let file = |path: &std::path::PathBuf| -> Result<String, String> {
        let text = path
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", path.display()))?;
        Ok(encode(text))
    };
    match config.dialect {
        SqlDialect::Postgres => {
            params.push(("sslmode", config.tls.name().to_string()));
            if let Some(ca) = &config.ca_file {
                params.push(("sslrootcert", file(ca)?));
            }
            if let Some((cert, key)) = &config.client_identity {
                params.push(("sslcert", file(cert)?));
                params.push(("sslkey", file(key)?));
            }
            params.push(("application_name", "redcron".to_string()));
        }
        SqlDialect::Mysql => {
            let mode = match config.tls {
                SqlTls::Disable => "DISABLED",
                SqlTls::Prefer => "PREFERRED",
                SqlTls::Require => "REQUIRED",
                SqlTls::VerifyCa => "VERIFY_CA",
                SqlTls::VerifyFull => "VERIFY_IDENTITY",
            };
            params.push(("ssl-mode", mode.to_string()));
            if let Some(ca) = &config.ca_file {
                params.push(("ssl-ca", file(ca)?));
            }
            if let Some((cert, key)) = &config.client_identity {
                params.push(("ssl-cert", file(cert)?));
                params.push(("ssl-key", file(key)?));
            }
        }
    }
    let base = config.url.split(['?', '#']).next().unwrap_or(&config.url);
    // sqlx's Any driver picks the server by the scheme it knows.
    let base = match base.split_once("://") {
        Some(("postgresql", rest)) => format!("postgres://{rest}"),
        Some(("mariadb", rest)) => format!("mysql://{rest}"),
        _ => base.to_string(),
    };
    let query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(format!("{base}?{}", query.join("&")))
}

/// `text` percent-encoded for a URL's query.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placeholders are numbered for PostgreSQL, outside literals only; tables get the prefix.
    #[test]
    fn statements_are_rendered_per_server() {
        let postgres = Dialect::new(SqlDialect::Postgres, "Cron");
        assert_eq!(
            postgres.sql("SELECT '?', x FROM {claims} WHERE a = ? AND b = ?"),
            "SELECT '?', x FROM cron_claims WHERE a = $1 AND b = $2"
        );
        let mysql = Dialect::new(SqlDialect::Mysql, "Cron");
        assert_eq!(
            mysql.sql("SELECT x FROM {claims} WHERE a = ?"),
            "SELECT x FROM Cron_claims WHERE a = ?"
        );
    }

    /// The server is named without the user or the password; a driver's error that quotes a URL is
    /// scrubbed.
    #[test]
    fn no_password_is_shown() {
        assert_eq!(target("postgres://u:p%40ss@db:5432/cron"), "db:5432/cron");
        let scrubbed = scrub("cannot connect to mysql://u:hunter2@db/cron: refused");
        assert!(!scrubbed.contains("hunter2"), "{scrubbed}");
    }
}
