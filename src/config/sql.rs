//! Stage two for `postgres:` and `mysql:`: one SQL server (a primary) and its database, with TLS settings
//! named as libpq's `sslmode` and the size of the worker's connection pool.
//!
//! The URL names the server and the database only (`postgres://user:${PASSWORD}@host:5432/redcron`):
//! no query string, since TLS has fields of its own and one setting must never mean two things. The URL
//! may hold a password, so no message here shows it other than redacted. Files are named relative to the
//! config file's directory and read when the store opens; here they are only checked to be given where
//! the connection would use them, and in pairs.

use std::path::Path;
use std::time::Duration;

use super::raw::{RawSql, Spanned};
use super::validate::{client_identity, config_file};
use super::{Report, SqlConfig, SqlDialect, SqlTls};
use crate::config::redact;

/// `lock.node_timeout` with a SQL store, unless given: a claim is a transaction whose commit is an fsync
/// on the server, slower than a Redis script; at most `ttl/10`.
pub(super) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The longest `key_prefix` of a SQL store: tables are `<key_prefix>_<table>`, and MySQL's table names
/// are at most 64 characters.
const MAX_TABLE_PREFIX: usize = 40;

/// The largest `pool_size`: more connections than this only load the server.
const MAX_POOL_SIZE: u32 = 64;

/// The `postgres:` or `mysql:` section (`dialect` says which), or `None` after reporting why it names no
/// database.
pub(super) fn sql(
    raw: &RawSql,
    dialect: SqlDialect,
    config_path: &Path,
    report: &mut Report,
) -> Option<SqlConfig> {
    let section = dialect.section();
    let Some(url) = &raw.url else {
        let why = format!(
            "missing field `url`: the server and database, as {}",
            example(dialect)
        );
        report.error(raw.mark, &format!("{section}.url"), why);
        return None;
    };
    if let Some(why) = url_problem(&url.value, dialect) {
        let shown = shown(&url.value).map_or(String::new(), |url| format!(" {url}"));
        let why = format!("invalid {} URL{shown}: {why}", server(dialect));
        report.error(url.mark, &format!("{section}.url"), why);
    }
    let tls = match &raw.tls {
        None => SqlTls::default(),
        Some(value) => SqlTls::from_name(value.value.trim()).unwrap_or_else(|| {
            let why = format!(
                "invalid tls {:?}: expected disable, prefer, require, verify-ca or verify-full",
                value.value
            );
            report.error(value.mark, &format!("{section}.tls"), why);
            SqlTls::default()
        }),
    };
    let tls_named = match raw.tls {
        Some(_) => format!("tls: {}", tls.name()),
        None => format!("tls: {} (the default)", tls.name()),
    };
    let file = |value: &Option<Spanned<String>>, name: &str, report: &mut Report| {
        let value = value.as_ref()?;
        let field = format!("{section}.{name}");
        if tls == SqlTls::Disable {
            let why = format!("{name} needs TLS: with {tls_named} the connection does not use TLS; set tls to require, verify-ca or verify-full, or remove {name}");
            report.error(value.mark, &field, why);
        } else if name == "ca_file" && matches!(tls, SqlTls::Prefer | SqlTls::Require) {
            let why = format!("ca_file is not used with {tls_named}, which does not check the server's certificate: verify-ca or verify-full checks the certificate against ca_file");
            report.error(value.mark, &field, why);
        }
        config_file(value, &field, config_path, report)
    };
    let ca_file = file(&raw.ca_file, "ca_file", report);
    let cert_file = file(&raw.cert_file, "cert_file", report);
    let key_file = file(&raw.key_file, "key_file", report);
    let client_identity = client_identity(
        (cert_file, &raw.cert_file),
        (key_file, &raw.key_file),
        (section, raw.mark),
        report,
    );
    let pool_size = match &raw.pool_size {
        None => SqlConfig::DEFAULT_POOL_SIZE,
        Some(value) => match value.value.trim().parse::<u32>() {
            Ok(size) if (1..=MAX_POOL_SIZE).contains(&size) => size,
            _ => {
                let why = format!(
                    "invalid pool_size {:?}: expected a whole number from 1 to {MAX_POOL_SIZE}",
                    value.value
                );
                report.error(value.mark, &format!("{section}.pool_size"), why);
                SqlConfig::DEFAULT_POOL_SIZE
            }
        },
    };
    Some(SqlConfig {
        dialect,
        url: url.value.clone(),
        tls,
        ca_file,
        client_identity,
        pool_size,
    })
}

/// Why `prefix` cannot prefix a SQL store's table names, if it cannot: an identifier neither server
/// needs quoted, short enough for MySQL's 64-character table names.
pub(super) fn table_prefix_problem(prefix: &str) -> Option<String> {
    let mut chars = prefix.chars();
    let identifier = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !identifier {
        return Some(format!("invalid key_prefix {prefix:?}: it begins the table names (`<key_prefix>_claims`, ...), so use a letter or `_` first, then letters, digits and `_`"));
    }
    let length = prefix.len();
    (length > MAX_TABLE_PREFIX).then(|| {
        format!("key_prefix {prefix:?} has {length} characters, more than {MAX_TABLE_PREFIX}: it begins the table names (`<key_prefix>_claims`, ...), and MySQL's are at most 64")
    })
}

/// The server's name in messages.
fn server(dialect: SqlDialect) -> &'static str {
    match dialect {
        SqlDialect::Postgres => "PostgreSQL",
        SqlDialect::Mysql => "MySQL",
    }
}

/// A URL of the dialect's form, for messages.
fn example(dialect: SqlDialect) -> &'static str {
    match dialect {
        SqlDialect::Postgres => "postgres://user:${PASSWORD}@host:5432/database",
        SqlDialect::Mysql => "mysql://user:${PASSWORD}@host:3306/database",
    }
}

/// `url` as a message may show it: redacted, without a query string or fragment (which may hold a
/// password too); nothing if it does not begin with a scheme, as text before a `://` could be anything.
fn shown(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once("://")?;
    if !plain_scheme(scheme) {
        return None;
    }
    let redacted = redact(url);
    let end = redacted.find(['?', '#']).unwrap_or(redacted.len());
    Some(redacted[..end].to_string())
}

/// Whether `scheme` is one as URLs write them.
fn plain_scheme(scheme: &str) -> bool {
    !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// Why `url` does not name a server and database of `dialect`, if it does not; never quoting the user
/// information, which may hold a password.
fn url_problem(url: &str, dialect: SqlDialect) -> Option<String> {
    let (ours, theirs) = match dialect {
        SqlDialect::Postgres => (["postgres", "postgresql"], ["mysql", "mariadb"]),
        SqlDialect::Mysql => (["mysql", "mariadb"], ["postgres", "postgresql"]),
    };
    let example = example(dialect);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!("expected {example}"));
    };
    if theirs.contains(&scheme) {
        let other = match dialect {
            SqlDialect::Postgres => SqlDialect::Mysql,
            SqlDialect::Mysql => SqlDialect::Postgres,
        };
        return Some(format!(
            "{scheme}:// is a {} URL: write it under `{}:` instead of `{}:`",
            server(other),
            other.section(),
            dialect.section()
        ));
    }
    if !ours.contains(&scheme) {
        // Only a scheme that looks like one is quoted: text before a `://` could be anything.
        let named = if plain_scheme(scheme) {
            format!("scheme {scheme}:// is not supported")
        } else {
            "no scheme".to_string()
        };
        return Some(format!(
            "{named}; use {}:// or {}:// ({example})",
            ours[0], ours[1]
        ));
    }
    // As the URL standard reads it: the authority ends at the first `/`, `?` or `#`, and the user
    // information at the last `@` in it.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if tail.contains('@') {
        return Some("an `@` after a `/`, `?` or `#`: percent-encode these characters in the user name and password (`/` %2F, `?` %3F, `#` %23, `@` %40)".to_string());
    }
    if let Some(at) = tail.find(['?', '#']) {
        let what = if tail[at..].starts_with('?') {
            "a query string (`?...`)"
        } else {
            "a fragment (`#...`)"
        };
        return Some(format!("{what} is not read: set TLS with the fields `tls`, `ca_file`, `cert_file` and `key_file`, and the pool with `pool_size`, so that one setting never means two things"));
    }
    let address = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if let Some(why) = address_problem(address, dialect) {
        return Some(why);
    }
    let database = tail.strip_prefix('/').unwrap_or(tail);
    if database.is_empty() {
        return Some(format!(
            "missing database: name it after the host, as in {example}"
        ));
    }
    if database.contains('/') {
        return Some(format!(
            "database {database:?} has more than one path segment: expected the database's name only"
        ));
    }
    None
}

/// Why `address` (`host`, `host:port`, `[ipv6]:port`) names no one server, if it does not.
fn address_problem(address: &str, dialect: SqlDialect) -> Option<String> {
    let (host, port) = match address.strip_prefix('[') {
        Some(bracketed) => {
            let Some((host, after)) = bracketed.split_once(']') else {
                return Some("missing `]` after the IPv6 address".to_string());
            };
            if host.parse::<std::net::Ipv6Addr>().is_err() {
                return Some(format!("invalid IPv6 address [{host}]"));
            }
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Some(format!("unexpected {after:?} after [{host}]")),
                },
            }
        }
        None if address.matches(':').count() > 1 => {
            return Some(format!(
                "write an IPv6 address in brackets: [{address}] or [{address}]:{}",
                default_port(dialect)
            ))
        }
        None => match address.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (address, None),
        },
    };
    if host.is_empty() {
        return Some(format!(
            "missing host: name the server, as in {}",
            example(dialect)
        ));
    }
    if host.contains(',') {
        return Some(format!("{host:?} names several hosts: name one, the primary (the store is one server; see docs/protocol.md for replicas)"));
    }
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._:%".contains(c))
    {
        return Some(format!("invalid host {host:?}"));
    }
    match port.map(|port| (port, port.parse::<u16>())) {
        None | Some((_, Ok(1..))) => None,
        Some((port, _)) => Some(format!(
            "invalid port {port:?}: expected a number from 1 to 65535, or none for {}",
            default_port(dialect)
        )),
    }
}

/// The port a URL without one connects to.
fn default_port(dialect: SqlDialect) -> u16 {
    match dialect {
        SqlDialect::Postgres => 5432,
        SqlDialect::Mysql => 3306,
    }
}

#[cfg(test)]
mod tests {
    use super::{shown, table_prefix_problem, url_problem};
    use crate::config::SqlDialect::{Mysql, Postgres};

    #[test]
    fn urls_name_one_server_and_database() {
        for url in [
            "postgres://u:p@db.example:5432/redcron",
            "postgresql://db/redcron",
            "postgres://u@[::1]:6432/x_y",
            "postgres://u:p%2Fq@10.0.0.1/redcron",
            "postgres://u:p@s@h/db",
        ] {
            assert_eq!(url_problem(url, Postgres), None, "{url}");
        }
        for url in ["mysql://u:p@h:3306/db", "mariadb://h/db"] {
            assert_eq!(url_problem(url, Mysql), None, "{url}");
        }
        let bad = [
            ("h/db", "expected postgres://"),
            ("mysql://h/db", "is a MySQL URL: write it under `mysql:`"),
            ("http://h/db", "scheme http:// is not supported"),
            ("u:pw@h://x", "no scheme"),
            ("postgres://u:p/w@h/db", "percent-encode"),
            ("postgres://h/db?sslmode=require", "a query string"),
            ("postgres://h/db#x", "a fragment"),
            ("postgres://u:p@/db", "missing host"),
            ("postgres://h1,h2/db", "several hosts"),
            ("postgres://::1/db", "in brackets"),
            ("postgres://h:0/db", "invalid port \"0\""),
            ("postgres://h:65536/db", "invalid port \"65536\""),
            ("postgres://h:/db", "invalid port \"\""),
            ("postgres://h:5432", "missing database"),
            ("postgres://h:5432/", "missing database"),
            ("postgres://h/a/b", "more than one path segment"),
        ];
        for (url, expected) in bad {
            let why = url_problem(url, Postgres).unwrap_or_default();
            assert!(why.contains(expected), "{url}: {why}");
            assert!(!why.contains("pw") && !why.contains("p/w"), "{url}: {why}");
        }
        let why = url_problem("postgresql://h/db", Mysql).unwrap_or_default();
        assert!(why.contains("write it under `postgres:`"), "{why}");
    }

    #[test]
    fn shown_urls_hold_no_password() {
        assert_eq!(
            shown("postgres://u:secret@h/db?password=x").as_deref(),
            Some("postgres://u:***@h/db")
        );
        assert_eq!(
            shown("postgres://u:a/b@h/db").as_deref(),
            Some("postgres://u:***@h/db")
        );
        assert_eq!(shown("u:secret@h://db"), None);
        assert_eq!(shown("u:secret@h/db"), None);
    }

    #[test]
    fn table_prefixes_are_plain_identifiers() {
        assert_eq!(table_prefix_problem("redcron"), None);
        assert_eq!(table_prefix_problem("_Cron_2"), None);
        assert_eq!(table_prefix_problem(&"a".repeat(40)), None);
        for bad in ["", "2cron", "red-cron", "a.b", "cron/x", "é"] {
            assert!(table_prefix_problem(bad).is_some(), "{bad}");
        }
        assert!(
            table_prefix_problem(&"a".repeat(41)).is_some_and(|why| why.contains("41 characters"))
        );
    }
}
