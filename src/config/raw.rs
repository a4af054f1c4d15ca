//! Stage one: the shape of `jobs.yaml`, close to the file.
//!
//! Reads the marked YAML tree into plain structs whose leaves are the scalars as written, each with its
//! position. Unknown and duplicate keys, and values of the wrong shape (a list where a single value
//! belongs), are reported here — all of them, not just the first, which is why this is a small reader
//! of its own rather than serde (serde stops at the first error). What the values *mean* (durations,
//! cron expressions, URLs) is stage two, in the parent module.

use std::collections::HashMap;

use super::yaml::{Kind, Mark, Node};
use super::Report;

/// A value and where it is in the file.
#[derive(Debug, Clone)]
pub(crate) struct Spanned<T> {
    pub value: T,
    pub mark: Mark,
}

/// The whole file.
#[derive(Debug, Default)]
pub(crate) struct RawConfig {
    pub redis: Option<RawRedis>,
    pub etcd: Option<RawEtcd>,
    pub zookeeper: Option<RawZookeeper>,
    pub postgres: Option<RawSql>,
    pub mysql: Option<RawSql>,
    pub embedded: Option<RawEmbedded>,
    pub lock: RawLock,
    pub worker: RawWorker,
    pub history: RawHistory,
    pub alerts: RawAlerts,
    pub dashboard: Option<RawDashboard>,
    /// The `jobs:` list and where it starts (`None` if the key is missing).
    pub jobs: Option<Spanned<Vec<RawJob>>>,
}

#[derive(Debug)]
pub(crate) struct RawRedis {
    /// Where the section's value starts.
    pub mark: Mark,
    /// Where the `redis` key is written.
    pub key: Mark,
    pub nodes: Option<Spanned<Vec<RawRedisNode>>>,
    /// `cluster`: the seed URLs of a Redis Cluster that is the whole store (instead of `nodes`).
    pub cluster: Option<Spanned<Vec<Spanned<String>>>>,
    /// `min_replicas_acked`, for `cluster` (a Sentinel group has its own).
    pub min_replicas_acked: Option<Spanned<String>>,
    pub key_prefix: Option<Spanned<String>>,
    pub ca_file: Option<Spanned<String>>,
    pub cert_file: Option<Spanned<String>>,
    pub key_file: Option<Spanned<String>>,
}

/// One of `redis.nodes`: a server's URL, or a Sentinel-managed group.
#[derive(Debug)]
pub(crate) enum RawRedisNode {
    Url(Spanned<String>),
    /// Boxed: a group's fields are many next to a URL.
    Sentinel(Box<RawSentinelGroup>),
}

/// `redis.nodes[i]` as a mapping: the Sentinels that name a group's master, and how to reach both.
#[derive(Debug)]
pub(crate) struct RawSentinelGroup {
    /// Where the mapping starts.
    pub mark: Mark,
    pub sentinels: Option<Spanned<Vec<Spanned<String>>>>,
    pub master: Option<Spanned<String>>,
    pub username: Option<Spanned<String>>,
    pub password: Option<Spanned<String>>,
    pub sentinel_username: Option<Spanned<String>>,
    pub sentinel_password: Option<Spanned<String>>,
    pub tls: Option<Spanned<String>>,
    pub db: Option<Spanned<String>>,
    pub min_replicas_acked: Option<Spanned<String>>,
}

/// `etcd:`: the cluster's endpoints, TLS and auth, with the names of etcd's own client config file.
#[derive(Debug)]
pub(crate) struct RawEtcd {
    /// Where the `etcd` key is written.
    pub mark: Mark,
    pub endpoints: Option<Spanned<Vec<Spanned<String>>>>,
    pub key_prefix: Option<Spanned<String>>,
    pub username: Option<Spanned<String>>,
    pub password: Option<Spanned<String>>,
    pub trusted_ca_file: Option<Spanned<String>>,
    pub cert_file: Option<Spanned<String>>,
    pub key_file: Option<Spanned<String>>,
}

/// `zookeeper:`: the ensemble's client addresses, session timeout, digest auth and TLS.
#[derive(Debug)]
pub(crate) struct RawZookeeper {
    /// Where the `zookeeper` key is written.
    pub mark: Mark,
    pub hosts: Option<Spanned<Vec<Spanned<String>>>>,
    pub key_prefix: Option<Spanned<String>>,
    pub session_timeout: Option<Spanned<String>>,
    pub username: Option<Spanned<String>>,
    pub password: Option<Spanned<String>>,
    pub tls: Option<RawZookeeperTls>,
}

/// `zookeeper.tls:`: the CA of the ensemble's certificates and an optional client certificate.
#[derive(Debug)]
pub(crate) struct RawZookeeperTls {
    /// Where the `tls` mapping starts.
    pub mark: Mark,
    pub ca_file: Option<Spanned<String>>,
    pub cert_file: Option<Spanned<String>>,
    pub key_file: Option<Spanned<String>>,
}

/// `postgres:` or `mysql:`: one SQL server, its TLS settings (libpq's `sslmode` names) and pool.
#[derive(Debug)]
pub(crate) struct RawSql {
    /// Where the section's key (`postgres` or `mysql`) is written.
    pub mark: Mark,
    pub url: Option<Spanned<String>>,
    pub key_prefix: Option<Spanned<String>>,
    pub tls: Option<Spanned<String>>,
    pub ca_file: Option<Spanned<String>>,
    pub cert_file: Option<Spanned<String>>,
    pub key_file: Option<Spanned<String>>,
    pub pool_size: Option<Spanned<String>>,
}

#[derive(Debug)]
pub(crate) struct RawEmbedded {
    /// Where the `embedded` key is written.
    pub mark: Mark,
    pub path: Option<Spanned<String>>,
}

#[derive(Debug, Default)]
pub(crate) struct RawLock {
    pub ttl: Option<Spanned<String>>,
    pub renew_every: Option<Spanned<String>>,
    pub node_timeout: Option<Spanned<String>>,
    pub drift_factor: Option<Spanned<String>>,
    pub retries: Option<Spanned<String>>,
    pub retry_delay: Option<Spanned<String>>,
}

#[derive(Debug, Default)]
pub(crate) struct RawWorker {
    pub id: Option<Spanned<String>>,
    pub shutdown_grace: Option<Spanned<String>>,
    pub max_clock_offset: Option<Spanned<String>>,
    pub clock_check_every: Option<Spanned<String>>,
    pub heartbeat_every: Option<Spanned<String>>,
    pub listen: Option<Spanned<String>>,
}

/// Alert hooks: `alerts:` (the defaults) and each job's own.
#[derive(Debug, Default)]
pub(crate) struct RawAlerts {
    pub on_failure: Option<Spanned<OneOrList>>,
    pub on_recovery: Option<Spanned<OneOrList>>,
}

/// `dashboard:`: who may see the worker's web pages and use its controls.
#[derive(Debug)]
pub(crate) struct RawDashboard {
    /// Where the `dashboard` key is written.
    pub mark: Mark,
    pub enabled: Option<Spanned<String>>,
    pub token: Option<Spanned<String>>,
    /// `tokens:`, each `{name, token}`, and where the list starts.
    pub tokens: Option<Spanned<Vec<RawDashboardToken>>>,
    pub controls: Option<Spanned<String>>,
    pub public: Option<Spanned<String>>,
    pub allowed_hosts: Option<Spanned<Vec<Spanned<String>>>>,
}

/// One of `dashboard.tokens`.
#[derive(Debug)]
pub(crate) struct RawDashboardToken {
    pub mark: Mark,
    pub name: Option<Spanned<String>>,
    pub token: Option<Spanned<String>>,
}

#[derive(Debug, Default)]
pub(crate) struct RawHistory {
    pub keep_ticks: Option<Spanned<String>>,
    pub missed_lookback: Option<Spanned<String>>,
}

#[derive(Debug)]
pub(crate) struct RawJob {
    pub alerts: RawAlerts,
    /// Where the job's entry starts (its first key), for "missing field" errors.
    pub mark: Mark,
    pub name: Option<Spanned<String>>,
    pub schedule: Option<Spanned<String>>,
    pub timezone: Option<Spanned<String>>,
    pub command: Option<Spanned<OneOrList>>,
    pub env: Vec<(Spanned<String>, Spanned<String>)>,
    pub inherit_env: Option<Spanned<OneOrList>>,
    pub workdir: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
    pub stop_grace: Option<Spanned<String>>,
    pub overlap: Option<Spanned<String>>,
    pub misfire_grace: Option<Spanned<String>>,
    pub jitter: Option<Spanned<String>>,
    pub retries: Option<Spanned<String>>,
    pub retry_backoff: Option<Spanned<String>>,
    pub retry_backoff_max: Option<Spanned<String>>,
    pub enabled: Option<Spanned<String>>,
    pub output_tail: Option<Spanned<String>>,
}

/// A value written either as one scalar or as a list of scalars (`command`, `inherit_env`).
#[derive(Debug)]
pub(crate) enum OneOrList {
    /// `field: value` (`command: "string"`, `inherit_env: none`).
    One(String),
    /// `field: [value, ...]` (`command: [prog, arg, ...]`, `inherit_env: [NAME, ...]`).
    List(Vec<Spanned<String>>),
    /// Present but of the wrong shape (already reported).
    Invalid,
}

/// Reads the document; `None` (an empty file) reads as an empty configuration.
pub(crate) fn read(root: Option<&Node>, report: &mut Report) -> RawConfig {
    let Some(root) = root else {
        return RawConfig::default();
    };
    let Some(mut top) = Fields::of(root, "", report) else {
        return RawConfig::default();
    };
    let redis_key = top.key_mark("redis");
    let redis = top
        .take("redis")
        .and_then(|node| read_redis(node, redis_key.unwrap_or(node.mark), report));
    let etcd_key = top.key_mark("etcd");
    let etcd = top
        .take("etcd")
        .and_then(|node| read_etcd(node, etcd_key.unwrap_or(node.mark), report));
    let zookeeper_key = top.key_mark("zookeeper");
    let zookeeper = top
        .take("zookeeper")
        .and_then(|node| read_zookeeper(node, zookeeper_key.unwrap_or(node.mark), report));
    let postgres_key = top.key_mark("postgres");
    let postgres = top
        .take("postgres")
        .and_then(|node| read_sql(node, "postgres", postgres_key.unwrap_or(node.mark), report));
    let mysql_key = top.key_mark("mysql");
    let mysql = top
        .take("mysql")
        .and_then(|node| read_sql(node, "mysql", mysql_key.unwrap_or(node.mark), report));
    let embedded_key = top.key_mark("embedded");
    let embedded = top
        .take("embedded")
        .and_then(|node| read_embedded(node, embedded_key.unwrap_or(node.mark), report));
    let lock = top
        .take("lock")
        .and_then(|node| read_lock(node, report))
        .unwrap_or_default();
    let worker = top
        .take("worker")
        .and_then(|node| read_worker(node, report))
        .unwrap_or_default();
    let history = top
        .take("history")
        .and_then(|node| read_history(node, report))
        .unwrap_or_default();
    let alerts = top
        .take("alerts")
        .and_then(|node| {
            let mut fields = Fields::of(node, "alerts", report)?;
            let alerts = read_alerts(&mut fields, "alerts", report);
            fields.finish(report);
            Some(alerts)
        })
        .unwrap_or_default();
    let dashboard_key = top.key_mark("dashboard");
    let dashboard = top
        .take("dashboard")
        .and_then(|node| read_dashboard(node, dashboard_key.unwrap_or(node.mark), report));
    let jobs = top.take("jobs").map(|node| Spanned {
        value: read_jobs(node, report),
        mark: node.mark,
    });
    top.finish(report);
    RawConfig {
        redis,
        etcd,
        zookeeper,
        postgres,
        mysql,
        embedded,
        lock,
        worker,
        history,
        alerts,
        dashboard,
        jobs,
    }
}

fn read_redis(node: &Node, key: Mark, report: &mut Report) -> Option<RawRedis> {
    let mut fields = Fields::of(node, "redis", report)?;
    let nodes = fields
        .take("nodes")
        .and_then(|list| redis_nodes(list, report));
    let cluster = fields
        .take("cluster")
        .and_then(|list| scalars(list, "redis.cluster", report));
    let min_replicas_acked = fields.scalar("min_replicas_acked", report);
    let key_prefix = fields.scalar("key_prefix", report);
    let ca_file = fields.scalar("ca_file", report);
    let cert_file = fields.scalar("cert_file", report);
    let key_file = fields.scalar("key_file", report);
    fields.finish(report);
    Some(RawRedis {
        mark: node.mark,
        key,
        nodes,
        cluster,
        min_replicas_acked,
        key_prefix,
        ca_file,
        cert_file,
        key_file,
    })
}

/// `redis.nodes`: each a URL, or a mapping that names a Sentinel-managed group.
fn redis_nodes(list: &Node, report: &mut Report) -> Option<Spanned<Vec<RawRedisNode>>> {
    let items = seq(list, "redis.nodes", report)?;
    let nodes = items.iter().enumerate().filter_map(|(i, item)| {
        let path = format!("redis.nodes[{i}]");
        if !matches!(item.kind, Kind::Map(_)) {
            return scalar(item, &path, report).map(RawRedisNode::Url);
        }
        let mut fields = Fields::of(item, &path, report)?;
        let group = RawSentinelGroup {
            mark: item.mark,
            sentinels: fields
                .take("sentinels")
                .and_then(|list| scalars(list, &format!("{path}.sentinels"), report)),
            master: fields.scalar("master", report),
            username: fields.scalar("username", report),
            password: fields.scalar("password", report),
            sentinel_username: fields.scalar("sentinel_username", report),
            sentinel_password: fields.scalar("sentinel_password", report),
            tls: fields.scalar("tls", report),
            db: fields.scalar("db", report),
            min_replicas_acked: fields.scalar("min_replicas_acked", report),
        };
        fields.finish(report);
        Some(RawRedisNode::Sentinel(Box::new(group)))
    });
    Some(Spanned {
        value: nodes.collect(),
        mark: list.mark,
    })
}

fn read_etcd(node: &Node, key: Mark, report: &mut Report) -> Option<RawEtcd> {
    let mut fields = Fields::of(node, "etcd", report)?;
    let endpoints = fields
        .take("endpoints")
        .and_then(|list| scalars(list, "etcd.endpoints", report));
    let etcd = RawEtcd {
        mark: key,
        endpoints,
        key_prefix: fields.scalar("key_prefix", report),
        username: fields.scalar("username", report),
        password: fields.scalar("password", report),
        trusted_ca_file: fields.scalar("trusted_ca_file", report),
        cert_file: fields.scalar("cert_file", report),
        key_file: fields.scalar("key_file", report),
    };
    fields.finish(report);
    Some(etcd)
}

fn read_zookeeper(node: &Node, key: Mark, report: &mut Report) -> Option<RawZookeeper> {
    let mut fields = Fields::of(node, "zookeeper", report)?;
    let hosts = fields
        .take("hosts")
        .and_then(|list| scalars(list, "zookeeper.hosts", report));
    let tls = fields.take("tls").and_then(|tls| {
        let mut tls_fields = Fields::of(tls, "zookeeper.tls", report)?;
        let raw = RawZookeeperTls {
            mark: tls.mark,
            ca_file: tls_fields.scalar("ca_file", report),
            cert_file: tls_fields.scalar("cert_file", report),
            key_file: tls_fields.scalar("key_file", report),
        };
        tls_fields.finish(report);
        Some(raw)
    });
    let zookeeper = RawZookeeper {
        mark: key,
        hosts,
        key_prefix: fields.scalar("key_prefix", report),
        session_timeout: fields.scalar("session_timeout", report),
        username: fields.scalar("username", report),
        password: fields.scalar("password", report),
        tls,
    };
    fields.finish(report);
    Some(zookeeper)
}

/// `postgres:` or `mysql:` (`section`): both take the same fields.
fn read_sql(node: &Node, section: &str, key: Mark, report: &mut Report) -> Option<RawSql> {
    let mut fields = Fields::of(node, section, report)?;
    let sql = RawSql {
        mark: key,
        url: fields.scalar("url", report),
        key_prefix: fields.scalar("key_prefix", report),
        tls: fields.scalar("tls", report),
        ca_file: fields.scalar("ca_file", report),
        cert_file: fields.scalar("cert_file", report),
        key_file: fields.scalar("key_file", report),
        pool_size: fields.scalar("pool_size", report),
    };
    fields.finish(report);
    Some(sql)
}

/// A list of single values (`redis.nodes`, `etcd.endpoints`), each with its position.
fn scalars(list: &Node, path: &str, report: &mut Report) -> Option<Spanned<Vec<Spanned<String>>>> {
    let items = seq(list, path, report)?;
    let values = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| scalar(item, &format!("{path}[{i}]"), report));
    Some(Spanned {
        value: values.collect(),
        mark: list.mark,
    })
}

fn read_embedded(node: &Node, key: Mark, report: &mut Report) -> Option<RawEmbedded> {
    let mut fields = Fields::of(node, "embedded", report)?;
    let path = fields.scalar("path", report);
    fields.finish(report);
    Some(RawEmbedded { mark: key, path })
}

fn read_lock(node: &Node, report: &mut Report) -> Option<RawLock> {
    let mut fields = Fields::of(node, "lock", report)?;
    let lock = RawLock {
        ttl: fields.scalar("ttl", report),
        renew_every: fields.scalar("renew_every", report),
        node_timeout: fields.scalar("node_timeout", report),
        drift_factor: fields.scalar("drift_factor", report),
        retries: fields.scalar("retries", report),
        retry_delay: fields.scalar("retry_delay", report),
    };
    fields.finish(report);
    Some(lock)
}

fn read_dashboard(node: &Node, key: Mark, report: &mut Report) -> Option<RawDashboard> {
    let mut fields = Fields::of(node, "dashboard", report)?;
    let tokens = fields.take("tokens").and_then(|list| {
        let items = seq(list, "dashboard.tokens", report)?;
        let tokens = items.iter().enumerate().filter_map(|(i, item)| {
            let mut fields = Fields::of(item, &format!("dashboard.tokens[{i}]"), report)?;
            let token = RawDashboardToken {
                mark: item.mark,
                name: fields.scalar("name", report),
                token: fields.scalar("token", report),
            };
            fields.finish(report);
            Some(token)
        });
        Some(Spanned {
            value: tokens.collect(),
            mark: list.mark,
        })
    });
    let dashboard = RawDashboard {
        mark: key,
        enabled: fields.scalar("enabled", report),
        token: fields.scalar("token", report),
        tokens,
        controls: fields.scalar("controls", report),
        public: fields.scalar("public", report),
        allowed_hosts: fields
            .take("allowed_hosts")
            .and_then(|list| scalars(list, "dashboard.allowed_hosts", report)),
    };
    fields.finish(report);
    Some(dashboard)
}

fn read_history(node: &Node, report: &mut Report) -> Option<RawHistory> {
    let mut fields = Fields::of(node, "history", report)?;
    let history = RawHistory {
        keep_ticks: fields.scalar("keep_ticks", report),
        missed_lookback: fields.scalar("missed_lookback", report),
    };
    fields.finish(report);
    Some(history)
}

fn read_worker(node: &Node, report: &mut Report) -> Option<RawWorker> {
    let mut fields = Fields::of(node, "worker", report)?;
    let worker = RawWorker {
        id: fields.scalar("id", report),
        shutdown_grace: fields.scalar("shutdown_grace", report),
        max_clock_offset: fields.scalar("max_clock_offset", report),
        clock_check_every: fields.scalar("clock_check_every", report),
        heartbeat_every: fields.scalar("heartbeat_every", report),
        listen: fields.scalar("listen", report),
    };
    fields.finish(report);
    Some(worker)
}

fn read_jobs(node: &Node, report: &mut Report) -> Vec<RawJob> {
    let Some(items) = seq(node, "jobs", report) else {
        return Vec::new();
    };
    items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| read_job(item, &format!("jobs[{i}]"), report))
        .collect()
}

fn read_job(node: &Node, path: &str, report: &mut Report) -> Option<RawJob> {
    let mut fields = Fields::of(node, path, report)?;
    let command = fields.take("command").map(|value| {
        let expected = "a list of arguments or a shell command string";
        one_or_list(value, &format!("{path}.command"), expected, report)
    });
    let env = fields
        .take("env")
        .map(|value| read_env(value, &format!("{path}.env"), report))
        .unwrap_or_default();
    let inherit_env = fields.take("inherit_env").map(|value| {
        let expected = "`all`, `none` or a list of variable names";
        one_or_list(value, &format!("{path}.inherit_env"), expected, report)
    });
    let alerts = read_alerts(&mut fields, path, report);
    let job = RawJob {
        alerts,
        mark: fields.first_key_mark(),
        name: fields.scalar("name", report),
        schedule: fields.scalar("schedule", report),
        timezone: fields.scalar("timezone", report),
        command,
        env,
        inherit_env,
        workdir: fields.scalar("workdir", report),
        timeout: fields.scalar("timeout", report),
        stop_grace: fields.scalar("stop_grace", report),
        overlap: fields.scalar("overlap", report),
        misfire_grace: fields.scalar("misfire_grace", report),
        jitter: fields.scalar("jitter", report),
        retries: fields.scalar("retries", report),
        retry_backoff: fields.scalar("retry_backoff", report),
        retry_backoff_max: fields.scalar("retry_backoff_max", report),
        enabled: fields.scalar("enabled", report),
        output_tail: fields.scalar("output_tail", report),
    };
    fields.finish(report);
    Some(job)
}

/// `on_failure` and `on_recovery` of a section at `path`: commands, like a job's `command`.
fn read_alerts(fields: &mut Fields<'_>, path: &str, report: &mut Report) -> RawAlerts {
    let expected = "a list of arguments or a shell command string";
    let mut hook = |name: &'static str| {
        let field = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        fields
            .take(name)
            .map(|value| one_or_list(value, &field, expected, report))
    };
    RawAlerts {
        on_failure: hook("on_failure"),
        on_recovery: hook("on_recovery"),
    }
}

/// One scalar or a list of scalars; anything else is reported as not what `expected` describes.
fn one_or_list(node: &Node, path: &str, expected: &str, report: &mut Report) -> Spanned<OneOrList> {
    let value = match &node.kind {
        Kind::Scalar(text) => OneOrList::One(text.to_string()),
        Kind::Seq(items) => {
            let values = items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| scalar(item, &format!("{path}[{i}]"), report));
            OneOrList::List(values.collect())
        }
        Kind::Null | Kind::Map(_) => {
            let found = node.describe();
            report.error(
                node.mark,
                path,
                format!("expected {expected}, found {found}"),
            );
            OneOrList::Invalid
        }
    };
    Spanned {
        value,
        mark: node.mark,
    }
}

fn read_env(
    node: &Node,
    path: &str,
    report: &mut Report,
) -> Vec<(Spanned<String>, Spanned<String>)> {
    let Some(mut fields) = Fields::of(node, path, report) else {
        return Vec::new();
    };
    let mut env = Vec::new();
    for i in 0..fields.entries.len() {
        let (key, value) = fields.entries[i];
        fields.taken[i] = true;
        let name = Spanned {
            value: key.to_string(),
            mark: fields.key_marks[i],
        };
        let value = match &value.kind {
            Kind::Null => Some(Spanned {
                value: String::new(),
                mark: value.mark,
            }),
            _ => scalar(value, &format!("{path}.{key}"), report),
        };
        env.extend(value.map(|value| (name, value)));
    }
    env
}

/// The entries of one mapping, taken one by one; what is left over is an unknown field.
struct Fields<'a> {
    path: String,
    mark: Mark,
    entries: Vec<(&'a str, &'a Node)>,
    key_marks: Vec<Mark>,
    taken: Vec<bool>,
    known: Vec<&'static str>,
}

impl<'a> Fields<'a> {
    /// The fields of `node`, which must be a mapping with single-value keys (or empty).
    fn of(node: &'a Node, path: &str, report: &mut Report) -> Option<Fields<'a>> {
        let mut fields = Fields {
            path: path.to_string(),
            mark: node.mark,
            entries: Vec::new(),
            key_marks: Vec::new(),
            taken: Vec::new(),
            known: Vec::new(),
        };
        let entries = match &node.kind {
            Kind::Map(entries) => entries,
            Kind::Null => return Some(fields),
            Kind::Scalar(_) | Kind::Seq(_) => {
                let what = if path.is_empty() { "the file" } else { path };
                report.error(
                    node.mark,
                    path,
                    format!(
                        "expected a mapping (`key: value` lines) for {what}, found {}",
                        node.describe()
                    ),
                );
                return None;
            }
        };
        // The first entry of each key, by key: a mapping of thousands of keys (an `env`) is checked for
        // duplicates in linear time, not quadratic.
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(entries.len());
        for (key, value) in entries.iter() {
            let Kind::Scalar(name) = &key.kind else {
                report.error(
                    key.mark,
                    path,
                    format!("expected a field name, found {}", key.describe()),
                );
                continue;
            };
            if let Some(&first) = seen.get(&**name) {
                let line = fields.key_marks[first].line;
                report.error(
                    key.mark,
                    &join(path, name),
                    format!("duplicate key `{name}` (first given on line {line})"),
                );
                continue;
            }
            seen.insert(&**name, fields.entries.len());
            fields.entries.push((&**name, value));
            fields.key_marks.push(key.mark);
            fields.taken.push(false);
        }
        Some(fields)
    }

    /// The value of `name`, if present and not null.
    fn take(&mut self, name: &'static str) -> Option<&'a Node> {
        self.known.push(name);
        let index = self.entries.iter().position(|(key, _)| *key == name)?;
        self.taken[index] = true;
        let node = self.entries[index].1;
        (!matches!(node.kind, Kind::Null)).then_some(node)
    }

    /// The single value of `name`, if present.
    fn scalar(&mut self, name: &'static str, report: &mut Report) -> Option<Spanned<String>> {
        let node = self.take(name)?;
        scalar(node, &join(&self.path, name), report)
    }

    /// Where the key `name` is written, if it is.
    fn key_mark(&self, name: &str) -> Option<Mark> {
        let index = self.entries.iter().position(|(key, _)| *key == name)?;
        Some(self.key_marks[index])
    }

    fn first_key_mark(&self) -> Mark {
        self.key_marks.first().copied().unwrap_or(self.mark)
    }

    /// Reports every field that nobody took.
    fn finish(self, report: &mut Report) {
        let expected = self
            .known
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ");
        for (i, (key, _)) in self.entries.iter().enumerate() {
            if !self.taken[i] {
                report.error(
                    self.key_marks[i],
                    &join(&self.path, key),
                    format!("unknown field `{key}`; expected one of {expected}"),
                );
            }
        }
    }
}

fn scalar(node: &Node, path: &str, report: &mut Report) -> Option<Spanned<String>> {
    match &node.kind {
        Kind::Scalar(text) => Some(Spanned {
            value: text.to_string(),
            mark: node.mark,
        }),
        Kind::Null => None,
        Kind::Seq(_) | Kind::Map(_) => {
            report.error(
                node.mark,
                path,
                format!("expected a single value, found {}", node.describe()),
            );
            None
        }
    }
}

fn seq<'a>(node: &'a Node, path: &str, report: &mut Report) -> Option<&'a [Node]> {
    match &node.kind {
        Kind::Seq(items) => Some(items),
        _ => {
            report.error(
                node.mark,
                path,
                format!("expected a list, found {}", node.describe()),
            );
            None
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}
