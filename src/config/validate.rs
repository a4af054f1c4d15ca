//! Stage two: what the values mean, and whether they make sense together.
//!
//! Turns the scalars of [`super::raw`] into durations, numbers, schedules and URLs, fills in defaults,
//! and makes the cross-field checks whose reasons come from the lock protocol (`docs/protocol.md`):
//! renewals must come before the lease expires, and a node's timeout must be small next to the TTL
//! because the time an acquisition round takes is subtracted from the lease's validity. A value that
//! is wrong is reported and replaced by its default, so the checks after it still run.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::raw::{RawConfig, RawEmbedded, RawHistory, RawLock, RawSql, RawWorker, Spanned};
use super::worker_id;
use super::yaml::Mark;
use super::{Config, EmbeddedConfig, Report, SqlDialect, StoreConfig, WorkerConfig};
use crate::clock::show_duration;
use crate::history::HistorySettings;
use crate::lock::{default_stop_grace, drift, renewal_slack, LockSettings};

pub(super) const TOP: Mark = Mark { line: 1, column: 1 };

/// Builds the configuration; whatever is wrong goes to `report` (the result is meaningless then).
/// `variables_under` a top-level section gives the `${VAR}` names written under it; `written` the text
/// as written of a scalar in which a `${VAR}` was replaced.
pub(crate) fn config(
    raw: RawConfig,
    path: &Path,
    report: &mut Report,
    now: DateTime<Utc>,
    variables_under: &dyn Fn(&str) -> BTreeSet<String>,
    written: &dyn Fn(super::yaml::Mark) -> Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Config {
    let sql = sql_section(&raw);
    // The store's section names the key prefix: `redis.key_prefix`, `etcd.key_prefix`, ...
    let (kind, key_prefix) = match (&raw.redis, &raw.etcd, &raw.zookeeper, sql) {
        (Some(redis), ..) => (StoreKind::Redis, section_prefix("redis", &redis.key_prefix)),
        (None, Some(etcd), ..) => (StoreKind::Etcd, section_prefix("etcd", &etcd.key_prefix)),
        (None, None, Some(zk), _) => (
            StoreKind::Zookeeper,
            section_prefix("zookeeper", &zk.key_prefix),
        ),
        (None, None, None, Some((dialect, section))) => (
            StoreKind::Sql,
            section_prefix(dialect.section(), &section.key_prefix),
        ),
        (None, None, None, None) => (StoreKind::Redis, None),
    };
    let key_prefix = key_prefix
        .as_ref()
        .map(|(prefix, field)| (*prefix, field.as_str()));
    let lock = lock(&raw.lock, key_prefix, kind, report);
    one_store_section(&raw, report);
    // No store section is legal: the worker warns at start that it uses the embedded store. A section
    // that names no store is reported; the embedded store stands in for it in this (invalid) config.
    let store = match (&raw.redis, &raw.etcd, &raw.zookeeper, sql) {
        (Some(section), ..) => super::redis::redis(section, path, report).map(StoreConfig::Redis),
        (None, Some(section), ..) => {
            super::etcd::etcd(section, path, report).map(StoreConfig::Etcd)
        }
        (None, None, Some(section), _) => {
            super::zookeeper::zookeeper(section, &lock, report).map(StoreConfig::Zookeeper)
        }
        (None, None, None, Some((dialect, section))) => {
            super::sql::sql(section, dialect, path, report).map(StoreConfig::Sql)
        }
        (None, None, None, None) => None,
    };
    let store = store.unwrap_or_else(|| {
        let section = raw.embedded.as_ref();
        StoreConfig::Embedded(embedded(section, path, &lock.key_prefix, env, report))
    });
    let mut secret_env_vars = store.env_vars(variables_under);
    secret_env_vars.extend(variables_under("dashboard"));
    let worker = worker(&raw.worker, report);
    let dashboard = super::dashboard::dashboard(raw.dashboard.as_ref(), worker.listen, report);
    let history = history(&raw.history, report);
    let alerts = super::jobs::alerts(&raw.alerts, "alerts", report);
    let jobs = super::jobs::jobs(
        raw.jobs,
        &lock,
        &alerts,
        &secret_env_vars,
        &store,
        report,
        now,
        written,
    );
    Config {
        path: path.to_path_buf(),
        store,
        lock,
        worker,
        history,
        alerts,
        dashboard,
        jobs,
        secret_env_vars,
        warnings: Vec::new(),
    }
}

/// The SQL section given, `postgres:` before `mysql:` (the order [`one_store_section`] keeps).
fn sql_section(raw: &RawConfig) -> Option<(SqlDialect, &RawSql)> {
    let postgres = raw.postgres.as_ref().map(|s| (SqlDialect::Postgres, s));
    postgres.or_else(|| raw.mysql.as_ref().map(|s| (SqlDialect::Mysql, s)))
}

/// A section's `key_prefix`, if given, with its field name.
fn section_prefix<'a>(
    section: &str,
    prefix: &'a Option<Spanned<String>>,
) -> Option<(&'a Spanned<String>, String)> {
    let prefix = prefix.as_ref()?;
    Some((prefix, format!("{section}.key_prefix")))
}

/// Reports every store section after the first given (in the order `redis`, `etcd`, `zookeeper`, `postgres`,
/// `mysql`, `embedded`, which picks the store), at its key, naming the section it conflicts with and
/// where that is: workers claim ticks in one store.
fn one_store_section(raw: &RawConfig, report: &mut Report) {
    let given: Vec<(&str, Mark)> = [
        raw.redis.as_ref().map(|section| ("redis", section.key)),
        raw.etcd.as_ref().map(|section| ("etcd", section.mark)),
        raw.zookeeper
            .as_ref()
            .map(|section| ("zookeeper", section.mark)),
        raw.postgres
            .as_ref()
            .map(|section| ("postgres", section.mark)),
        raw.mysql.as_ref().map(|section| ("mysql", section.mark)),
        raw.embedded
            .as_ref()
            .map(|section| ("embedded", section.mark)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(((first, at), others)) = given.split_first() {
        for (other, mark) in others {
            let why = format!(
                "`{other}:` and `{first}:` cannot both be given: workers claim ticks in one store, and `{first}:` (line {}) names it; remove one",
                at.line
            );
            report.error(*mark, other, why);
        }
    }
}

/// The kind of store the config's section names, as far as `lock:` depends on it: how long one write
/// may take by default (`node_timeout`), and what a key prefix may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    /// `redis:`, or the embedded store (no section, or `embedded:`): keys as Redis takes them.
    Redis,
    /// `etcd:`: a write is a Raft commit, and keys may hold `/`.
    Etcd,
    /// `zookeeper:`: a write is a quorum commit (an fsync on a majority), and the prefix is the chroot.
    Zookeeper,
    /// `postgres:` or `mysql:`: a write is a commit, and the prefix names tables.
    Sql,
}

impl StoreKind {
    /// `lock.node_timeout` unless given: the store's own default, at most `ttl/10`, for a store whose
    /// write is an fsync on a server (etcd, SQL) rather than a Redis script in memory.
    fn default_node_timeout(self, ttl: Duration) -> Duration {
        match self {
            StoreKind::Redis => LockSettings::default().node_timeout,
            StoreKind::Etcd => super::etcd::DEFAULT_NODE_TIMEOUT.min(ttl / 10),
            StoreKind::Sql => super::sql::DEFAULT_NODE_TIMEOUT.min(ttl / 10),
            StoreKind::Zookeeper => super::zookeeper::DEFAULT_NODE_TIMEOUT.min(ttl / 10),
        }
    }

    /// Why `prefix` cannot be this store's key prefix, if it cannot.
    fn prefix_problem(self, prefix: &str) -> Option<String> {
        let allowed = |extra: &str| {
            !prefix.is_empty()
                && prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
        };
        match self {
            StoreKind::Redis if !allowed("_.:-") => Some(format!("invalid key_prefix {prefix:?}: use letters, digits and `_ . : -` (braces would change Redis hash slots)")),
            StoreKind::Etcd if !allowed("_.:-/") => Some(format!(
                "invalid key_prefix {prefix:?}: use letters, digits and `_ . : - /`"
            )),
            StoreKind::Zookeeper if !allowed("_.:-") => Some(format!(
                "invalid key_prefix {prefix:?}: use letters, digits and `_ . : -` (it names the chroot /<key_prefix>)"
            )),
            StoreKind::Sql => super::sql::table_prefix_problem(prefix),
            StoreKind::Redis | StoreKind::Etcd | StoreKind::Zookeeper => None,
        }
    }
}

/// The lock settings; `key_prefix` is the store section's, with its field name. The store's `kind`
/// gives `node_timeout`'s default and what the key prefix may hold ([`StoreKind`]).
fn lock(
    raw: &RawLock,
    key_prefix: Option<(&Spanned<String>, &str)>,
    kind: StoreKind,
    report: &mut Report,
) -> LockSettings {
    let defaults = LockSettings::default();
    let ttl = positive_duration(raw.ttl.as_ref(), "lock.ttl", report).unwrap_or(defaults.ttl);
    let default_node_timeout = kind.default_node_timeout(ttl);
    let node_timeout = positive_duration(raw.node_timeout.as_ref(), "lock.node_timeout", report)
        .unwrap_or(default_node_timeout);
    if node_timeout * 10 > ttl {
        let why = format!(
            "node_timeout ({}) must be at most a tenth of ttl ({}): a round may wait node_timeout for a node, and that time is subtracted from the lease's validity",
            show_duration(node_timeout),
            show_duration(ttl)
        );
        match (&raw.node_timeout, &raw.ttl) {
            (Some(value), _) => report.error(value.mark, "lock.node_timeout", why),
            (None, Some(value)) => report.error(value.mark, "lock.ttl", why),
            (None, None) => {}
        }
    }
    let drift_factor = match &raw.drift_factor {
        None => defaults.drift_factor,
        Some(value) => match value.value.trim().parse::<f64>() {
            Ok(drift) if (0.0..0.5).contains(&drift) => drift,
            _ => {
                let why = format!("invalid drift_factor {:?}: expected a number from 0 up to (not including) 0.5, e.g. 0.01", value.value);
                report.error(value.mark, "lock.drift_factor", why);
                defaults.drift_factor
            }
        },
    };
    let renew_every = renew_every(raw, ttl, node_timeout, drift_factor, report);
    let retries = retries(raw.retries.as_ref(), "lock.retries", report).unwrap_or(defaults.retries);
    let retry_delay = duration(raw.retry_delay.as_ref(), "lock.retry_delay", report)
        .unwrap_or(defaults.retry_delay);
    let key_prefix = match key_prefix {
        None => defaults.key_prefix,
        Some((prefix, field)) => match kind.prefix_problem(&prefix.value) {
            None => prefix.value.clone(),
            Some(why) => {
                report.error(prefix.mark, field, why);
                defaults.key_prefix
            }
        },
    };
    LockSettings {
        ttl,
        renew_every,
        node_timeout,
        drift_factor,
        retries,
        retry_delay,
        key_prefix,
    }
}

/// `lock.renew_every` (default `ttl/3`): a renewal sent on schedule must be confirmed while the lease is
/// still valid, or every run longer than the TTL loses its lease ([`crate::lock::renewal_slack`]).
fn renew_every(
    raw: &RawLock,
    ttl: Duration,
    node_timeout: Duration,
    drift_factor: f64,
    report: &mut Report,
) -> Duration {
    // To the millisecond: `ttl/3` of 10 s is 3.333 s, not 3.333333333 s.
    let default = Duration::from_millis(u64::try_from((ttl / 3).as_millis()).unwrap_or(u64::MAX));
    let given = positive_duration(raw.renew_every.as_ref(), "lock.renew_every", report);
    let every = given.unwrap_or(default);
    if every >= ttl {
        let why = format!(
            "renew_every ({}) must be below ttl ({}): the lease would expire before it is renewed",
            show_duration(every),
            show_duration(ttl)
        );
        error_at(raw.renew_every.as_ref(), "lock.renew_every", why, report);
        return default;
    }
    let settings = LockSettings {
        ttl,
        renew_every: every,
        node_timeout,
        drift_factor,
        ..LockSettings::default()
    };
    if renewal_slack(&settings).is_none() {
        let validity = ttl.saturating_sub(drift(ttl, drift_factor));
        let why = format!(
            "renew_every ({}) leaves no time to renew: a renewal sent on schedule may be confirmed node_timeout ({}) later, after the lease's validity (ttl − drift = {}) has run out, so every run longer than that would lose its lease; renew_every must be below {}",
            show_duration(every),
            show_duration(node_timeout),
            show_duration(validity),
            show_duration(validity.saturating_sub(node_timeout))
        );
        match (&raw.renew_every, &raw.ttl) {
            (Some(value), _) => report.error(value.mark, "lock.renew_every", why),
            (None, Some(value)) => report.error(value.mark, "lock.ttl", why),
            (None, None) => {}
        }
        return default;
    } else if every * 2 > ttl {
        let why = format!("renew_every ({}) is more than half of ttl ({}): a single failed renewal loses the lease; ttl/3 leaves room for two", show_duration(every), show_duration(ttl));
        if let Some(value) = &raw.renew_every {
            report.warn(value.mark, "lock.renew_every", why);
        }
    }
    every
}

/// A job's `stop_grace`: given (above zero, below the lease's slack) or the default, half the slack.
///
/// The worker stops a job whose lease has only `stop_grace` of validity left without a renewal, so that
/// the child is gone by the lease's deadline; a grace that does not fit in the slack would stop healthy
/// runs while their renewal is still on its way.
pub(super) fn stop_grace(
    value: Option<&Spanned<String>>,
    field: &str,
    lock: &LockSettings,
    report: &mut Report,
) -> Duration {
    let default = default_stop_grace(lock);
    let Some(grace) = positive_duration(value, field, report) else {
        return default;
    };
    match renewal_slack(lock) {
        Some(slack) if grace < slack => grace,
        slack => {
            let slack = slack.unwrap_or_default();
            let why = format!(
                "stop_grace ({}) must be below the lease's slack ({} = ttl − drift − renew_every − node_timeout): the job is stopped when its lease has stop_grace left without a renewal, and a renewal on schedule may only be confirmed when the slack is left; lower stop_grace or raise lock.ttl",
                show_duration(grace),
                show_duration(slack)
            );
            error_at(value, field, why, report);
            default
        }
    }
}

/// A file a store's setting names (a CA, a certificate, a key): relative to the config file's directory,
/// so that workers started from anywhere with the same config read the same file, and made absolute, so
/// that errors name it unambiguously. An empty name is reported. The file is read when the store opens.
pub(super) fn config_file(
    value: &Spanned<String>,
    field: &str,
    config_path: &Path,
    report: &mut Report,
) -> Option<PathBuf> {
    if value.value.trim().is_empty() {
        report.error(value.mark, field, "an empty file name");
        return None;
    }
    let dir = config_path.parent().unwrap_or(Path::new(""));
    let path = dir.join(&value.value);
    Some(std::path::absolute(&path).unwrap_or(path))
}

/// A client certificate and its key (`cert_file`, `key_file` of `section`, as `cert` and `key` and as
/// written), both or neither: one without the other is reported.
pub(super) fn client_identity(
    (cert, raw_cert): (Option<PathBuf>, &Option<Spanned<String>>),
    (key, raw_key): (Option<PathBuf>, &Option<Spanned<String>>),
    at: (&str, Mark),
    report: &mut Report,
) -> Option<(PathBuf, PathBuf)> {
    pair(
        (cert, raw_cert, "cert_file"),
        (key, raw_key, "key_file"),
        "a client certificate needs its key",
        at,
        report,
    )
}

/// Both values of a pair of fields of a store's section (a certificate and its key, a user and its
/// password), or neither; one without the other is reported at the one given, as `<section>.<field>`
/// (at the section's key if the given one is no longer at hand).
pub(super) fn pair<T>(
    first: (Option<T>, &Option<Spanned<String>>, &str),
    second: (Option<T>, &Option<Spanned<String>>, &str),
    why: &str,
    (section, at): (&str, Mark),
    report: &mut Report,
) -> Option<(T, T)> {
    match (first.0, second.0) {
        (Some(a), Some(b)) => Some((a, b)),
        (None, None) => None,
        (given, _) => {
            let (present, missing) = if given.is_some() {
                (first.1, second.2)
            } else {
                (second.1, first.2)
            };
            let field = if given.is_some() { first.2 } else { second.2 };
            let mark = present.as_ref().map_or(at, |value| value.mark);
            report.error(
                mark,
                &format!("{section}.{field}"),
                format!("missing `{missing}`: {why}"),
            );
            None
        }
    }
}

/// The embedded store's database file: `embedded.path`, relative to the config file's directory (so
/// that workers started from anywhere with the same config share it), or else `<key_prefix>.db` in
/// `$STATE_DIRECTORY` (set by systemd's `StateDirectory=`: `/etc` is no place for state), or else in the
/// config file's directory. Made absolute, so that `check` and the logs name the file unambiguously.
fn embedded(
    raw: Option<&RawEmbedded>,
    config_path: &Path,
    key_prefix: &str,
    env: &dyn Fn(&str) -> Option<String>,
    report: &mut Report,
) -> EmbeddedConfig {
    let config_dir = config_path.parent().unwrap_or(Path::new(""));
    let given = raw.and_then(|section| section.path.as_ref());
    let path = match given {
        Some(path) if path.value.trim().is_empty() || path.value.ends_with('/') => {
            let why = format!(
                "invalid path {:?}: expected a file name, such as /var/lib/redcron/redcron.db",
                path.value
            );
            report.error(path.mark, "embedded.path", why);
            config_dir.join(format!("{key_prefix}.db"))
        }
        Some(path) => config_dir.join(&path.value),
        None => {
            // systemd may list several directories, separated by colons: the first is this unit's own.
            let state = env("STATE_DIRECTORY")
                .and_then(|dirs| dirs.split(':').next().map(str::to_string))
                .filter(|dir| !dir.is_empty());
            let dir = state.map_or(config_dir.to_path_buf(), std::path::PathBuf::from);
            dir.join(format!("{key_prefix}.db"))
        }
    };
    let path = std::path::absolute(&path).unwrap_or(path);
    EmbeddedConfig { path }
}

/// The largest `history.keep_ticks`: beyond it a job's history costs more node memory than it is worth.
const MAX_KEEP_TICKS: usize = 100_000;

fn history(raw: &RawHistory, report: &mut Report) -> HistorySettings {
    let defaults = HistorySettings::default();
    let keep_ticks = match &raw.keep_ticks {
        None => defaults.keep_ticks,
        Some(value) => match value.value.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_KEEP_TICKS).contains(&n) => n,
            _ => {
                let why = format!(
                    "invalid keep_ticks {:?}: expected a whole number from 1 to {MAX_KEEP_TICKS}",
                    value.value
                );
                report.error(value.mark, "history.keep_ticks", why);
                defaults.keep_ticks
            }
        },
    };
    let missed_lookback = duration(
        raw.missed_lookback.as_ref(),
        "history.missed_lookback",
        report,
    )
    .unwrap_or(defaults.missed_lookback);
    HistorySettings {
        keep_ticks,
        missed_lookback,
    }
}

fn worker(raw: &RawWorker, report: &mut Report) -> WorkerConfig {
    let id = match &raw.id {
        None => worker_id::default_id(),
        Some(id) if !id.value.is_empty() && id.value.chars().all(worker_id::is_id_char) => {
            id.value.clone()
        }
        Some(id) => {
            report.error(
                id.mark,
                "worker.id",
                format!(
                    "invalid worker id {:?}: use letters, digits and `_ . - : @`",
                    id.value
                ),
            );
            worker_id::default_id()
        }
    };
    let shutdown_grace = duration(raw.shutdown_grace.as_ref(), "worker.shutdown_grace", report)
        .unwrap_or(Duration::from_secs(30));
    let max_clock_offset = positive_duration(
        raw.max_clock_offset.as_ref(),
        "worker.max_clock_offset",
        report,
    )
    .unwrap_or(Duration::from_millis(500));
    let clock_check_every = positive_duration(
        raw.clock_check_every.as_ref(),
        "worker.clock_check_every",
        report,
    )
    .unwrap_or(Duration::from_secs(60));
    let heartbeat_every = positive_duration(
        raw.heartbeat_every.as_ref(),
        "worker.heartbeat_every",
        report,
    )
    .unwrap_or(crate::membership::HEARTBEAT_EVERY);
    WorkerConfig {
        id,
        id_is_default: raw.id.is_none(),
        shutdown_grace,
        max_clock_offset,
        clock_check_every,
        heartbeat_every,
        listen: listen(raw.listen.as_ref(), report),
    }
}

/// `worker.listen`: an IP address and a port (`127.0.0.1:9464`, `0.0.0.0:9464`, `[::]:9464`), or none.
/// A host name is refused rather than resolved: which interface a name lands on is not for a config
/// check to guess.
fn listen(value: Option<&Spanned<String>>, report: &mut Report) -> Option<SocketAddr> {
    let value = value?;
    let why = match value.value.trim().parse::<SocketAddr>() {
        Ok(address) if address.port() != 0 => return Some(address),
        Ok(_) => "port 0 would listen on a random port; name one, e.g. 127.0.0.1:9464",
        Err(_) => {
            "expected an IP address and a port, such as 127.0.0.1:9464, 0.0.0.0:9464 or [::]:9464"
        }
    };
    let message = format!("invalid listen address {:?}: {why}", value.value);
    report.error(value.mark, "worker.listen", message);
    None
}

/// A duration such as `30s`, `500ms`, `10m`, `1h`, `1m30s`.
pub(super) fn duration(
    value: Option<&Spanned<String>>,
    field: &str,
    report: &mut Report,
) -> Option<Duration> {
    let value = value?;
    match humantime::parse_duration(value.value.trim()) {
        Ok(duration) => Some(duration),
        Err(e) => {
            report.error(
                value.mark,
                field,
                format!(
                    "invalid duration {:?}: {e} (write e.g. 30s, 500ms, 10m, 1h or 1m30s)",
                    value.value
                ),
            );
            None
        }
    }
}

/// A whole number of retries, from 0 to 100 (`lock.retries`, a job's `retries`); `None` when absent or
/// invalid (reported).
pub(super) fn retries(
    value: Option<&Spanned<String>>,
    field: &str,
    report: &mut Report,
) -> Option<u32> {
    let retries = whole_number(value, field, 100, "a whole number from 0 to 100", report)?;
    u32::try_from(retries).ok()
}

/// A whole number from 0 to `max`; `None` when absent or invalid, reported as `invalid <name> "<value>":
/// expected <expected>`, `<name>` being the field's last part.
pub(super) fn whole_number(
    value: Option<&Spanned<String>>,
    field: &str,
    max: usize,
    expected: &str,
    report: &mut Report,
) -> Option<usize> {
    let value = value?;
    match value.value.trim().parse::<usize>() {
        Ok(number) if number <= max => Some(number),
        _ => {
            let name = field.rsplit('.').next().unwrap_or(field);
            let why = format!("invalid {name} {:?}: expected {expected}", value.value);
            report.error(value.mark, field, why);
            None
        }
    }
}

/// A duration that must not be zero.
pub(super) fn positive_duration(
    value: Option<&Spanned<String>>,
    field: &str,
    report: &mut Report,
) -> Option<Duration> {
    let duration = duration(value, field, report)?;
    if duration.is_zero() {
        error_at(value, field, "must be more than zero".to_string(), report);
        return None;
    }
    Some(duration)
}

fn error_at(value: Option<&Spanned<String>>, field: &str, message: String, report: &mut Report) {
    if let Some(value) = value {
        report.error(value.mark, field, message);
    }
}
