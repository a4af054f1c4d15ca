//! The store a config names: one [`StoreConfig`], whose variant is the store section given.
//!
//! Each variant owns what differs between stores outside the store's own module: its section's name, the
//! environment variables its settings take (kept from jobs), its line in `redcron check`, and its node
//! count. Every one of these is a `match` on the variant, so a new store's variant makes the compiler
//! point at each; its readiness rule and everything it does at run time are its backend's
//! ([`crate::store::Backend`]), which [`crate::store::Store::open`] builds from the variant.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// The one store of a config: exactly one store section is given (two are an error naming both), and
/// none means the embedded store.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreConfig {
    /// `redis:`: the Redlock protocol on N independent Redis nodes (servers or Sentinel groups).
    Redis(RedisConfig),
    /// `etcd:`: an etcd cluster.
    Etcd(EtcdConfig),
    /// `zookeeper:`: a ZooKeeper ensemble.
    Zookeeper(ZookeeperConfig),
    /// `embedded:`, or no store section: a SQLite file of this host.
    Embedded(EmbeddedConfig),
    /// `postgres:` or `mysql:`: one SQL database server (its dialect says which).
    Sql(SqlConfig),
}

impl StoreConfig {
    /// The config's top-level section that configures this store.
    pub(crate) fn section(&self) -> &'static str {
        match self {
            StoreConfig::Redis(_) => "redis",
            StoreConfig::Etcd(_) => "etcd",
            StoreConfig::Zookeeper(_) => "zookeeper",
            StoreConfig::Embedded(_) => "embedded",
            StoreConfig::Sql(sql) => sql.dialect.section(),
        }
    }

    /// The environment variables this store's settings take through `${VAR}` (`variables_under` a
    /// section gives those written under it), which are the store's secrets: never passed to a job unless
    /// the job's `env` names them. Redis URLs and etcd's settings may hold passwords, so every variable
    /// of their section is kept; the embedded store's one setting is a file path, no secret, so a
    /// variable it shares with jobs (a state directory) stays theirs.
    pub(crate) fn env_vars(
        &self,
        variables_under: &dyn Fn(&str) -> BTreeSet<String>,
    ) -> BTreeSet<String> {
        match self {
            StoreConfig::Redis(_)
            | StoreConfig::Etcd(_)
            | StoreConfig::Zookeeper(_)
            | StoreConfig::Sql(_) => variables_under(self.section()),
            StoreConfig::Embedded(_) => BTreeSet::new(),
        }
    }

    /// What `redcron check` says of the store (after `store: `), addresses without passwords.
    pub(crate) fn summary(&self) -> String {
        match self {
            StoreConfig::Redis(redis) => match redis.nodes.as_slice() {
                [RedisNode::Cluster(cluster)] => format!(
                    "a Redis Cluster, {} seed{}: {}",
                    cluster.seeds.len(),
                    if cluster.seeds.len() == 1 { "" } else { "s" },
                    cluster
                        .seeds
                        .iter()
                        .map(|seed| redact(seed))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                nodes => {
                    let nodes: Vec<String> = nodes.iter().map(RedisNode::label).collect();
                    format!("{} Redis nodes: {}", nodes.len(), nodes.join(", "))
                }
            },
            StoreConfig::Etcd(etcd) => format!(
                "etcd, {} endpoint{}: {}",
                etcd.endpoints.len(),
                if etcd.endpoints.len() == 1 { "" } else { "s" },
                etcd.endpoints.join(", ")
            ),
            StoreConfig::Zookeeper(zk) => format!(
                "ZooKeeper, {} host{}: {} (session timeout {}{}{})",
                zk.hosts.len(),
                if zk.hosts.len() == 1 { "" } else { "s" },
                zk.hosts.join(", "),
                super::show_duration(zk.session_timeout),
                if zk.tls.is_some() { ", TLS" } else { "" },
                match &zk.auth {
                    Some((user, _)) => format!(", digest auth as {user}"),
                    None => String::new(),
                }
            ),
            StoreConfig::Embedded(embedded) => format!(
                "embedded, database {} (shared by the workers of this host that use it). No shared \
                 store: every host that runs this file runs every job; configure redis:, etcd:, \
                 zookeeper:, postgres: or mysql: for workers on several hosts",
                embedded.path.display()
            ),
            StoreConfig::Sql(sql) => format!(
                "{}, database {} (TLS {}, a pool of {} connections)",
                match sql.dialect {
                    SqlDialect::Postgres => "PostgreSQL",
                    SqlDialect::Mysql => "MySQL/MariaDB",
                },
                redact(&sql.url),
                sql.tls.name(),
                sql.pool_size
            ),
        }
    }

    /// `check`'s lines under the store's summary: with a Sentinel group among the Redis nodes, each node
    /// of the majority and what it is (a server, or a group with its Sentinels and the replicas a write
    /// needs); the TLS files; and how many answers a claim needs. Nothing for the other stores, whose
    /// one line says it all.
    pub(crate) fn topology(&self) -> Vec<String> {
        let StoreConfig::Redis(redis) = self else {
            return Vec::new();
        };
        if let [RedisNode::Cluster(cluster)] = redis.nodes.as_slice() {
            let mut lines = vec![format!("  {}", cluster.topology())];
            if let Some(ca) = &redis.tls.ca_file {
                lines.push(format!(
                    "  TLS certificates verified against {} (not the Mozilla roots)",
                    ca.display()
                ));
            }
            lines.push("  `redcron status` names each shard's slots and master now".to_string());
            return lines;
        }
        let count = redis.nodes.len();
        let groups = redis
            .nodes
            .iter()
            .any(|node| matches!(node, RedisNode::Sentinel(_)));
        // Servers are all named by the summary; with a group, each node's line says what it is.
        let mut lines: Vec<String> = redis
            .nodes
            .iter()
            .enumerate()
            .filter(|_| groups)
            .map(|(i, node)| {
                let what = match node {
                    RedisNode::Server(url) => format!("{}, one server", redact(url)),
                    RedisNode::Sentinel(group) => group.topology(),
                    RedisNode::Cluster(cluster) => cluster.topology(),
                };
                format!("  node {} of {count}: {what}", i + 1)
            })
            .collect();
        if let Some(ca) = &redis.tls.ca_file {
            lines.push(format!(
                "  TLS certificates verified against {} (not the Mozilla roots)",
                ca.display()
            ));
        }
        if let Some((cert, _)) = &redis.tls.client_identity {
            lines.push(format!("  TLS client certificate {}", cert.display()));
        }
        // A majority, as `crate::lock::quorum` counts it (config sits below the lock).
        let needed = count / 2 + 1;
        lines.push(format!(
            "  a claim needs {needed} of the {count} node{} to agree{}",
            if count == 1 { "" } else { "s" },
            if groups {
                "; `redcron status` names each group's master now"
            } else {
                ""
            }
        ));
        lines
    }

    /// How many nodes the store has as configured: Redis nodes, etcd members (an etcd pause is in the
    /// cluster's committed state, which every member applies), or the one database file.
    pub(crate) fn nodes(&self) -> usize {
        match self {
            StoreConfig::Redis(redis) => redis.nodes.len(),
            StoreConfig::Etcd(etcd) => etcd.endpoints.len(),
            StoreConfig::Zookeeper(zk) => zk.hosts.len(),
            StoreConfig::Embedded(_) | StoreConfig::Sql(_) => 1,
        }
    }
}

/// The Redis nodes of the lock.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// The nodes of the majority, in the order written; at least one, each a distinct server or group.
    pub nodes: Vec<RedisNode>,
    /// The certificates of the nodes' TLS connections.
    pub tls: RedisTls,
}

/// The certificates of a Redis store's TLS connections (`redis.ca_file`, `cert_file`, `key_file`): for
/// every `rediss://` node and every group with `tls: true`, its Sentinels included. The files are read
/// when the store opens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RedisTls {
    /// The CA that signed the servers' certificates (absolute), trusted instead of the Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// A client certificate and its key (absolute), for servers that ask for one
    /// (`tls-auth-clients yes`, Redis's default with TLS).
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

impl RedisTls {
    /// Whether any certificate file is configured.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.client_identity.is_some()
    }
}

impl RedisConfig {
    /// A store on `nodes` whose TLS connections, if any, trust the Mozilla roots and present no
    /// certificate.
    pub fn on(nodes: Vec<RedisNode>) -> RedisConfig {
        RedisConfig {
            nodes,
            tls: RedisTls::default(),
        }
    }

    /// The URLs of the nodes that are single servers (those two names of one server could share).
    pub(crate) fn server_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter_map(|node| match node {
                RedisNode::Server(url) => Some(url.clone()),
                RedisNode::Sentinel(_) | RedisNode::Cluster(_) => None,
            })
            .collect()
    }
}

/// One node of the Redis majority: a server, or the master of a Sentinel-managed group.
#[derive(Debug, Clone, PartialEq)]
pub enum RedisNode {
    /// A `redis://` or `rediss://` URL, as written (after `${VAR}` substitution); may hold a password, so
    /// shown only redacted ([`redact`]).
    Server(String),
    /// Whichever server the group's Sentinels name as its master, followed through failovers.
    Sentinel(SentinelGroup),
    /// A whole Redis Cluster (`redis.cluster`), the store's only node: each job's keys on the master
    /// of its `{job}` hash slot.
    Cluster(ClusterSeeds),
}

impl RedisNode {
    /// How logs, errors and `check` name the node: its redacted URL, or the group's
    /// `sentinel://MASTER@host:port,…` (never a password).
    pub fn label(&self) -> String {
        match self {
            RedisNode::Server(url) => redact(url),
            RedisNode::Sentinel(group) => group.label(),
            RedisNode::Cluster(cluster) => cluster.label(),
        }
    }
}

/// A Sentinel-managed master and its replicas (`redis.nodes[i]: {sentinels, master, …}`): one node of
/// the majority. Its `Debug` never shows a password.
#[derive(Clone, PartialEq)]
pub struct SentinelGroup {
    /// The name the Sentinels monitor the master under (`sentinel monitor NAME …`).
    pub master: String,
    /// `host:port` of the Sentinels, asked in turn for the master's address; at least one, distinct.
    pub sentinels: Vec<String>,
    /// The data nodes' user and password (`username`, `password`), if they require one.
    pub username: Option<String>,
    pub password: Option<String>,
    /// The Sentinels' own user and password (`sentinel_username`, `sentinel_password`), if they differ.
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
    /// `tls: true`: both the Sentinels and the data nodes are reached over TLS (`rediss://`).
    pub tls: bool,
    /// The database number on the data nodes (`db`, default 0).
    pub db: i64,
    /// How many replicas must have each write before the group's answer counts (`min_replicas_acked`,
    /// checked with `WAIT`): what lets a promoted replica keep every claim this group confirmed.
    pub min_replicas_acked: ReplicaAcks,
}

/// A Redis Cluster that is the whole store (`redis: {cluster: [URL, …], min_replicas_acked}`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSeeds {
    /// The `redis://` or `rediss://` URLs of some of the cluster's nodes, asked in turn for the slot
    /// map; the first one's user, password and TLS reach every node. May hold passwords: shown only
    /// redacted.
    pub seeds: Vec<String>,
    /// How many replicas of a shard's master must have each write before its answer counts (`WAIT`).
    pub min_replicas_acked: ReplicaAcks,
}

impl ClusterSeeds {
    /// `cluster://host:port,host:port`: what logs and errors call the cluster (never a password).
    pub fn label(&self) -> String {
        let hosts: Vec<String> = self
            .seeds
            .iter()
            .map(|seed| {
                let shown = redact(seed);
                let without_scheme = shown.split_once("://").map_or(shown.as_str(), |(_, r)| r);
                let host = without_scheme
                    .rsplit_once('@')
                    .map_or(without_scheme, |(_, h)| h);
                host.split('/').next().unwrap_or(host).to_string()
            })
            .collect();
        format!("cluster://{}", hosts.join(","))
    }

    /// What `check` says of the cluster: where the slot map comes from, and when a shard's answer
    /// counts.
    fn topology(&self) -> String {
        let acked = match self.min_replicas_acked {
            ReplicaAcks::All => "once every replica of its master that the cluster sees online \
                                 has the writes (WAIT)"
                .to_string(),
            ReplicaAcks::Exactly(0) => "from its master alone (min_replicas_acked: 0)".to_string(),
            ReplicaAcks::Exactly(1) => {
                "once 1 replica of its master has the writes (WAIT)".to_string()
            }
            ReplicaAcks::Exactly(n) => {
                format!("once {n} replicas of its master have the writes (WAIT)")
            }
        };
        format!(
            "Redis Cluster {}: the slot map read from its nodes (CLUSTER SHARDS); each job's keys on \
             the master of its {{job}} slot, whose answer decides the job's claims {acked}",
            self.label()
        )
    }
}

/// How many of a group's replicas must acknowledge a write (`WAIT`) before the group's answer counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaAcks {
    /// `all` (the default): every replica the Sentinels know and do not think down, at least one. A
    /// replica the Sentinels promote while the old master still takes writes (a planned failover, a
    /// master that resumes during its own failover) no longer acknowledges them, so no write counts
    /// that the promoted replica lacks.
    All,
    /// A number: that many replicas, whichever. With more replicas than this, a write can count that
    /// the replica promoted next lacks, and a failover can lose a claim (docs/store-redis.md).
    Exactly(u32),
}

impl ReplicaAcks {
    /// Whether any replica must acknowledge: with none, a failover is a restart of the node.
    pub fn any(self) -> bool {
        self != ReplicaAcks::Exactly(0)
    }
}

impl std::fmt::Display for ReplicaAcks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicaAcks::All => f.write_str("all"),
            ReplicaAcks::Exactly(n) => write!(f, "{n}"),
        }
    }
}

impl SentinelGroup {
    /// `sentinel://MASTER@host:port,host:port`: what logs and errors call the group.
    pub fn label(&self) -> String {
        format!("sentinel://{}@{}", self.master, self.sentinels.join(","))
    }

    /// What `check` says of the group: its Sentinels, and when its answer counts.
    fn topology(&self) -> String {
        let count = self.sentinels.len();
        let acked = match self.min_replicas_acked {
            ReplicaAcks::All => {
                "its master's answer counts once every replica the Sentinels know as up has the \
                 writes (WAIT)"
                    .to_string()
            }
            ReplicaAcks::Exactly(0) => {
                "its master's answer counts alone (min_replicas_acked: 0)".to_string()
            }
            ReplicaAcks::Exactly(1) => {
                "its master's answer counts once 1 replica has the writes (WAIT)".to_string()
            }
            ReplicaAcks::Exactly(n) => {
                format!("its master's answer counts once {n} replicas have the writes (WAIT)")
            }
        };
        format!(
            "Sentinel group {:?}, its master looked up from {count} Sentinel{} ({}); {acked}{}{}",
            self.master,
            if count == 1 { "" } else { "s" },
            self.sentinels.join(", "),
            if self.tls { "; TLS" } else { "" },
            if self.db != 0 {
                format!("; database {}", self.db)
            } else {
                String::new()
            },
        )
    }
}

impl std::fmt::Debug for SentinelGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |secret: &Option<String>| secret.as_ref().map(|_| "***");
        f.debug_struct("SentinelGroup")
            .field("master", &self.master)
            .field("sentinels", &self.sentinels)
            .field("username", &self.username)
            .field("password", &hidden(&self.password))
            .field("sentinel_username", &self.sentinel_username)
            .field("sentinel_password", &hidden(&self.sentinel_password))
            .field("tls", &self.tls)
            .field("db", &self.db)
            .field("min_replicas_acked", &self.min_replicas_acked)
            .finish()
    }
}

/// The etcd cluster of the store (`etcd:`), with the settings etcd's own clients take.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdConfig {
    /// `http://host:port` or `https://host:port` of the cluster's members (client URLs), as written; at
    /// least one, each distinct, all of one scheme.
    pub endpoints: Vec<String>,
    /// etcd's user name and password (`username`, `password`), when the cluster has auth enabled.
    pub user: Option<(String, String)>,
    /// The CA that signed the members' certificates (`trusted_ca_file`, absolute); without it, https
    /// endpoints are verified against the Mozilla roots. Only with https endpoints.
    pub trusted_ca_file: Option<PathBuf>,
    /// A client certificate and its key (`cert_file`, `key_file`, absolute), for clusters that require
    /// client certificates. Both or neither; only with https endpoints.
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

/// The ZooKeeper ensemble of the store (`zookeeper:`). Its `Debug` never shows the password.
#[derive(Clone, PartialEq)]
pub struct ZookeeperConfig {
    /// The members' client addresses, `host:port`, as written (host lowercased); at least one, each
    /// distinct.
    pub hosts: Vec<String>,
    /// The session timeout asked of the ensemble (`session_timeout`, default `lock.ttl`): at least
    /// 2 × `lock.renew_every` and at most `lock.ttl`. The ensemble may negotiate another one (within
    /// its tickTime × 2 … × 20); the store goes by the negotiated one.
    pub session_timeout: Duration,
    /// Digest auth (`username`, `password`): both or neither. The password is a secret: kept from jobs
    /// and never logged.
    pub auth: Option<(String, String)>,
    /// TLS (`tls:`), when the ensemble serves its clients over TLS.
    pub tls: Option<ZookeeperTls>,
}

impl std::fmt::Debug for ZookeeperConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperConfig")
            .field("hosts", &self.hosts)
            .field("session_timeout", &self.session_timeout)
            .field(
                "auth",
                &self.auth.as_ref().map(|(user, _)| (user, "<redacted>")),
            )
            .field("tls", &self.tls)
            .finish()
    }
}

/// TLS to a ZooKeeper ensemble: the CA that signed the members' certificates, and a client certificate
/// with its key when the ensemble asks for one. Absolute paths, read when the store opens.
#[derive(Debug, Clone, PartialEq)]
pub struct ZookeeperTls {
    /// The CA file (`ca_file`, PEM).
    pub ca_file: PathBuf,
    /// The client certificate and its key (`cert_file`, `key_file`, PEM): both or neither.
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

/// The embedded store (`embedded:`, or no other store section): one SQLite database file that the workers of one host
/// share.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddedConfig {
    /// The database file, absolute: `embedded.path` (relative to the config file's directory), or by
    /// default `<key_prefix>.db` in `$STATE_DIRECTORY` (systemd's `StateDirectory=`) if set, else in
    /// the config file's directory.
    pub path: PathBuf,
}

/// The SQL database of the store (`postgres:` or `mysql:`): one server (a primary), reached with a pool of
/// connections. Tables are named `<key_prefix>_<table>` in the URL's database.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlConfig {
    /// Which server speaks: the section's name.
    pub dialect: SqlDialect,
    /// `postgres://user:pass@host:port/db` or `mysql://user:pass@host:port/db`, as written (after `${VAR}`
    /// substitution): it may hold a password, so display it only redacted. It names a host and a
    /// database, and carries no query string (TLS is [`SqlConfig::tls`]).
    pub url: String,
    /// How the connection uses TLS (`tls`, default `prefer`).
    pub tls: SqlTls,
    /// The CA that signed the server's certificate (`ca_file`, absolute); without it, a verifying mode
    /// checks against the Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// A client certificate and its key (`cert_file`, `key_file`, absolute). Both or neither.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// Connections the worker keeps to the server at most (`pool_size`, default
    /// [`SqlConfig::DEFAULT_POOL_SIZE`], 1 to 64).
    pub pool_size: u32,
}

impl SqlConfig {
    /// `pool_size` unless given: a batch of claims is one transaction on one connection; renewals, history
    /// writes and the CLI's reads take the others.
    pub const DEFAULT_POOL_SIZE: u32 = 8;
}

/// The SQL server a [`SqlConfig`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlDialect {
    /// PostgreSQL 13 or later (`postgres:`).
    Postgres,
    /// MySQL 8.0 or later, or MariaDB 10.6 or later (`mysql:`).
    Mysql,
}

impl SqlDialect {
    /// The config section that names this server: `postgres` or `mysql`.
    pub fn section(self) -> &'static str {
        match self {
            SqlDialect::Postgres => "postgres",
            SqlDialect::Mysql => "mysql",
        }
    }
}

/// `tls:` of a SQL store, with libpq's `sslmode` names (MySQL's `ssl-mode` means the same by other names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqlTls {
    /// `disable`: never TLS.
    Disable,
    /// `prefer` (the default, as libpq's and MySQL's clients): TLS if the server offers it, unverified.
    #[default]
    Prefer,
    /// `require`: TLS or no connection, the certificate unverified.
    Require,
    /// `verify-ca`: TLS with a certificate signed by the CA (`ca_file`, else the Mozilla roots).
    VerifyCa,
    /// `verify-full`: as `verify-ca`, and the certificate names the URL's host.
    VerifyFull,
}

impl SqlTls {
    /// The setting's name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            SqlTls::Disable => "disable",
            SqlTls::Prefer => "prefer",
            SqlTls::Require => "require",
            SqlTls::VerifyCa => "verify-ca",
            SqlTls::VerifyFull => "verify-full",
        }
    }

    /// The mode named `name` (as [`SqlTls::name`] gives it), if any.
    pub fn from_name(name: &str) -> Option<SqlTls> {
        [
            SqlTls::Disable,
            SqlTls::Prefer,
            SqlTls::Require,
            SqlTls::VerifyCa,
            SqlTls::VerifyFull,
        ]
        .into_iter()
        .find(|mode| mode.name() == name)
    }
}

/// A store address for logs and errors: the URL with any password replaced by `***`.
///
/// `redis://user:secret@host:6379/2` becomes `redis://user:***@host:6379/2`; a URL that does not parse is
/// shown as its scheme and host part only, so nothing after an `@` can leak.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => return "<invalid URL>".to_string(),
    };
    // The authority ends at the first '/' after the last '@' (passwords may contain '/', but not '@').
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let (userinfo, host) = (&rest[..at], &rest[at + 1..]);
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://{userinfo}@{host}"),
    }
}
