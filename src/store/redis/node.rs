//! One Redis node of the lock: its address (never shown with a password), its connection, and whether
//! its answers count ([`super::admission`]).
//!
//! A node is a server's URL, or a Sentinel-managed group whose master is looked up and followed
//! through failovers ([`super::sentinel`]); a group's writes count only once `WAIT` says the replicas
//! it needs have them.
//!
//! The connection is opened lazily and opened again after an I/O error, so a node that is down when the
//! worker starts, or that dies later, is simply a failed vote until it is back. Each new connection is
//! identified (`INFO`) before anything is sent on it, so no answer of a server that restarted, is a
//! replica, evicts keys, or is another node under a second name counts by accident. Every request is
//! bounded by the caller's per-node timeout: a hung node (SIGSTOP, a black-holed route) costs one timeout
//! per round, never a TCP or client timeout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ClientTlsConfig, Pipeline, TlsCertificates, Value};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::time::Instant;

use super::admission::{self, Identity, Registry, Standing, RECHECK};
use super::cluster::{self, Cluster};
use super::sentinel::{self, Group};
pub(crate) use crate::config::redact;
use crate::config::{RedisNode, RedisTls};
use crate::store::StoreError;

/// Where a node's server is: one address, or whichever server a Sentinel group names its master.
#[derive(Clone)]
pub(super) enum Target {
    /// Boxed: a client is large next to a group's handle.
    Server(Box<redis::Client>),
    Group(Arc<Group>),
    /// A whole Redis Cluster: each command goes to the master of its key's slot ([`super::cluster`]).
    Cluster(Arc<Cluster>),
}

impl Target {
    /// The target of a configured node, and its label; a group's watcher starts here (inside a Tokio
    /// runtime). Fails only on a URL that cannot name a Redis server.
    /// `hold` is how long a cluster's shard is held off when a master appears that may lack its
    /// writes ([`Registry::for_shards`]).
    pub(super) fn of(
        node: &RedisNode,
        certificates: Option<&TlsCertificates>,
        hold: Duration,
    ) -> Result<(String, Target), StoreError> {
        match node {
            RedisNode::Server(url) => {
                let label = redact(url);
                let client = match certificates {
                    Some(certificates) if url.starts_with("rediss://") => {
                        redis::Client::build_with_tls(url.as_str(), certificates.clone())
                    }
                    _ => redis::Client::open(url.as_str()),
                };
                let client = client.map_err(|error| StoreError::InvalidNode {
                    url: label.clone(),
                    reason: error.to_string().replace(url.as_str(), &label),
                })?;
                Ok((label, Target::Server(Box::new(client))))
            }
            RedisNode::Sentinel(config) => {
                let group = Group::start(config, certificates.cloned());
                Ok((group.label().to_string(), Target::Group(group)))
            }
            RedisNode::Cluster(config) => {
                let cluster = Cluster::new(config, certificates.cloned(), hold)?;
                Ok((cluster.label().to_string(), Target::Cluster(cluster)))
            }
        }
    }

    pub(super) fn group(&self) -> Option<&Group> {
        match self {
            Target::Server(_) | Target::Cluster(_) => None,
            Target::Group(group) => Some(group),
        }
    }
}

/// The certificates of `tls`, read from their files and checked now, so that a file that is missing or
/// holds no PEM certificate (or key) stops the store at start with the field and the path; `None` when none is configured
/// (TLS connections then trust the Mozilla roots and present no certificate).
pub(super) fn certificates(tls: &RedisTls) -> Result<Option<TlsCertificates>, StoreError> {
    if !tls.is_set() {
        return Ok(None);
    }
    let read = |field: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|error| StoreError::RedisTls {
            field,
            path: path.to_path_buf(),
            reason: format!("cannot read it: {error}"),
        })
    };
    // Parsed as a connection parses them (rustls' PEM reader), which skips what is not PEM: a file
    // without a certificate would trust nothing, or present nothing, without a word.
    let certificates_in = |field: &'static str, path: &std::path::Path| {
        let pem = read(field, path)?;
        let parsed: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
        match parsed {
            Ok(found) if !found.is_empty() => Ok(pem),
            Ok(_) => Err("holds no PEM certificate".to_string()),
            Err(error) => Err(format!("not a PEM certificate: {error}")),
        }
        .map_err(|reason| StoreError::RedisTls {
            field,
            path: path.to_path_buf(),
            reason,
        })
    };
    let root_cert = match &tls.ca_file {
        Some(path) => Some(certificates_in("redis.ca_file", path)?),
        None => None,
    };
    let client_tls = match &tls.client_identity {
        Some((cert, key)) => {
            let client_key = read("redis.key_file", key)?;
            if let Err(error) = PrivateKeyDer::from_pem_slice(&client_key) {
                return Err(StoreError::RedisTls {
                    field: "redis.key_file",
                    path: key.clone(),
                    reason: format!("holds no PEM private key: {error}"),
                });
            }
            Some(ClientTlsConfig {
                client_cert: certificates_in("redis.cert_file", cert)?,
                client_key,
            })
        }
        None => None,
    };
    let certificates = TlsCertificates {
        client_tls,
        root_cert,
    };
    Ok(Some(certificates))
}

/// A Redis node: a lazily connected, self-reconnecting multiplexed connection whose server was
/// identified before its first use.
pub(crate) struct Node {
    /// The redacted address, for logs and errors.
    pub(crate) label: String,
    index: usize,
    target: Target,
    config: AsyncConnectionConfig,
    /// How long opening and identifying a connection may take.
    connect_timeout: Duration,
    /// The lock's per-node timeout: what a round waits for this node's answer.
    node_timeout: Duration,
    registry: Arc<Registry>,
    /// The connection in use or on its way; `None` before the first and after one failed.
    link: Mutex<Option<Connecting>>,
    /// A cluster's connections, one per master (empty for any other target).
    masters: cluster::Links,
}

/// A connection being opened and identified, shared by every request that waits for it.
type Connecting = Shared<BoxFuture<'static, Result<Arc<Session>, String>>>;

/// An open, identified connection.
struct Session {
    connection: MultiplexedConnection,
    /// The server's `host:port` for a group's master (messages name it); empty for a plain node.
    address: String,
    /// The group's epoch when its master was looked up (0 for a plain node): an older one is replaced.
    epoch: u64,
    identity: Identity,
    /// When the checks were last read on this connection.
    checked: Mutex<Instant>,
    /// What a later reading of the checks said, if it differs from the first.
    latest: Mutex<Option<Identity>>,
}

impl Node {
    /// Prepares node `index` of `target` without connecting (the connection is opened on first use);
    /// `registry` is shared by the store's nodes.
    pub(super) fn new(
        label: String,
        target: Target,
        index: usize,
        node_timeout: Duration,
        registry: Arc<Registry>,
    ) -> Node {
        // Connecting may take longer than one vote (TLS, a remote link); the attempt goes on in the
        // background while votes that cannot wait for it count the node as failed.
        let connect_timeout = Duration::from_secs(2).max(node_timeout * 4);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // No response timeout here: each round bounds its own wait (see `eval`).
            .set_response_timeout(None);
        Node {
            label,
            index,
            target,
            config,
            connect_timeout,
            node_timeout,
            registry,
            link: Mutex::new(None),
            masters: cluster::Links::default(),
        }
    }

    /// The connection in use, or the one on its way (started now if there is none, or the last failed).
    /// A cluster's node has none of its own: its masters' connections are in `masters`.
    fn connecting(&self) -> Connecting {
        let Ok(mut link) = self.link.lock() else {
            return async { Err("the node's connection lock is poisoned (a bug)".to_string()) }
                .boxed()
                .shared();
        };
        if let Some(current) = link.as_ref() {
            let replaced = |session: &Arc<Session>| {
                self.target
                    .group()
                    .is_some_and(|group| session.epoch < group.epoch())
            };
            match current.peek() {
                Some(Err(_)) => {}
                Some(Ok(session)) if replaced(session) => {}
                _ => return current.clone(),
            }
        }
        let (target, config) = (self.target.clone(), self.config.clone());
        let (registry, index, bound) =
            (Arc::clone(&self.registry), self.index, self.connect_timeout);
        let opening = async move {
            let (client, address, epoch) = match &target {
                Target::Server(client) => ((**client).clone(), String::new(), 0),
                Target::Group(group) => {
                    let master = group.master().await?;
                    (master.client, master.address, master.epoch)
                }
                Target::Cluster(_) => {
                    return Err("a cluster has one connection per master (a bug)".to_string());
                }
            };
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|error| match address.as_str() {
                    "" => error.to_string(),
                    _ => format!("master {address}: {error}"),
                })?;
            // A server that accepts and then hangs must not hold the connection up for good.
            let checks = async {
                if let Some(group) = target.group() {
                    sentinel::check_master(&mut connection, &address).await?;
                    group.connected(&address);
                }
                identify(&mut connection).await
            };
            let identity = tokio::time::timeout(bound, checks)
                .await
                .map_err(|_| format!("INFO: no answer within {} ms", bound.as_millis()))??;
            registry.admit(index, &identity);
            Ok(Arc::new(Session {
                connection,
                address,
                epoch,
                identity,
                checked: Mutex::new(Instant::now()),
                latest: Mutex::new(None),
            }))
        }
        .boxed()
        .shared();
        // Opened in the background, so that a vote that gives up on it does not stop it.
        tokio::spawn(opening.clone().map(|_| ()));
        *link = Some(opening.clone());
        opening
    }

    /// Forgets `session` after it failed, so that the next request opens a new connection (unless one
    /// is already on its way).
    fn drop_session(&self, session: &Arc<Session>) {
        let Ok(mut link) = self.link.lock() else {
            return;
        };
        let is_current = matches!(
            link.as_ref().and_then(|current| current.peek()),
            Some(Ok(current)) if Arc::ptr_eq(current, session)
        );
        if is_current {
            *link = None;
        }
    }

    /// Reads the checks again on `session` in the background, when the last reading is older than
    /// [`RECHECK`]: a `CONFIG SET` or `REPLICAOF` on a live server changes nothing on the connection.
    fn recheck(&self, session: &Arc<Session>) {
        let Ok(mut checked) = session.checked.lock() else {
            return;
        };
        if checked.elapsed() < RECHECK {
            return;
        }
        *checked = Instant::now();
        let mut connection = session.connection.clone();
        let (registry, index) = (Arc::clone(&self.registry), self.index);
        let (session, timeout) = (Arc::clone(session), RECHECK);
        tokio::spawn(async move {
            if let Ok(Ok(identity)) = tokio::time::timeout(timeout, identify(&mut connection)).await
            {
                if identity != session.current() {
                    registry.admit(index, &identity);
                    if let Ok(mut latest) = session.latest.lock() {
                        *latest = Some(identity);
                    }
                }
            }
        });
    }

    /// Sends a pipeline of `EVALSHA`s and returns one value per command, or why the node failed or does
    /// not count, all within `timeout`.
    ///
    /// A node refused by its checks ([`super::admission`]) is sent nothing; one held off (restarted) is
    /// sent the pipeline, so that its writes land, and its answer counts as a failure that says why.
    ///
    /// A node that restarted (or flushed its script cache) answers `NOSCRIPT`; the scripts are then loaded
    /// and the pipeline sent once more. That is safe because a `NOSCRIPT` command did not run, and every
    /// script is idempotent for the same value anyway. A server error in one command comes back as
    /// `Value::ServerError` in its slot, so one bad key does not hide the answers for the others.
    pub(crate) async fn eval(
        &self,
        pipeline: &Pipeline,
        timeout: Duration,
    ) -> Result<Vec<Value>, String> {
        let deadline = Instant::now() + timeout;
        if let Target::Cluster(cluster) = &self.target {
            let link = cluster::Link {
                masters: &self.masters,
                config: &self.config,
                connect_timeout: self.connect_timeout,
                node_timeout: self.node_timeout,
            };
            return Ok(cluster.eval(&link, pipeline, deadline).await);
        }
        let no_answer = || format!("no answer within {} ms", timeout.as_millis());
        let session = match tokio::time::timeout_at(deadline, self.connecting()).await {
            Ok(Ok(session)) => session,
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(no_answer()),
        };
        self.recheck(&session);
        let identity = session.current();
        let standing = self.registry.standing(self.index, &identity);
        if let Standing::Refused(why) = standing {
            if self.target.group().is_some() {
                // A group's server that stopped being a fit master (demoted, say): look it up again.
                self.drop_session(&session);
            }
            return Err(why);
        }
        let group = self.target.group();
        let acks = match group.map(Group::acks_needed).transpose() {
            Ok(acks) => acks.unwrap_or(0),
            Err(why) => {
                if let Target::Group(group) = &self.target {
                    Group::recount(group);
                }
                return Err(why);
            }
        };
        let waited;
        let pipeline = if acks > 0 {
            waited = with_wait(pipeline, acks, deadline, self.node_timeout);
            &waited
        } else {
            pipeline
        };
        let mut connection = session.connection.clone();
        let exchange = send_loading_scripts(pipeline, &mut connection);
        let mut values = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(values)) => values,
            Ok(Err(error)) => {
                let demoted = group.is_some() && is_readonly(&error.to_string());
                if error.is_unrecoverable_error() || error.is_io_error() || demoted {
                    self.drop_session(&session);
                }
                return Err(match demoted {
                    true => format!("master {} became a replica (READONLY)", session.address),
                    false => error.to_string(),
                });
            }
            Err(_) => return Err(no_answer()),
        };
        if group.is_some() {
            values = self.group_answer(&session, values, acks)?;
        }
        // Decided after the answer too: a hold or a refusal that began while the pipeline was on its way
        // (another name of the server was admitted meanwhile) counts.
        match self.registry.standing(self.index, &identity) {
            Standing::Counted => Ok(values),
            Standing::HeldOff(why, _) | Standing::Refused(why) => Err(why),
        }
    }

    /// A group's answer on `session`, or why it does not count: a `READONLY` reply (the master was
    /// demoted: the session is dropped and the master looked up again), or, with `acks` > 0, fewer
    /// replicas than that acknowledging the writes (`WAIT`'s reply, the last value, is taken off).
    fn group_answer(
        &self,
        session: &Arc<Session>,
        mut values: Vec<Value>,
        acks: u32,
    ) -> Result<Vec<Value>, String> {
        if values
            .iter()
            .any(|value| matches!(value, Value::ServerError(e) if is_readonly(&format!("{e:?}"))))
        {
            self.drop_session(session);
            return Err(format!(
                "master {} became a replica (READONLY): looking the master up again",
                session.address
            ));
        }
        if acks == 0 {
            return Ok(values);
        }
        let acked = match values.pop() {
            Some(Value::Int(acked)) => acked,
            _ => -1,
        };
        if acked >= i64::from(acks) {
            return Ok(values);
        }
        // Too few replicas have the writes: a lagging group, or a master cut off from its replicas
        // (the Sentinels may have promoted one). The connection stays: dropping it would let the
        // pipelines queued behind this `WAIT` run on the server after newer ones sent on a new
        // connection. The Sentinels are asked in the background whether the master moved; if so, the
        // group's epoch ends this connection.
        if let Target::Group(group) = &self.target {
            let (group, address) = (Arc::clone(group), session.address.clone());
            tokio::spawn(async move { group.verify(&address).await });
        }
        Err(format!(
            "master {} has the writes, but WAIT saw {} of the {acks} replicas it needs within the \
             round: not counted",
            session.address,
            acked.max(0)
        ))
    }

    /// Opens and identifies the connection now (if it is not open yet), within `timeout`: what this node
    /// is, or why it could not be told.
    pub(crate) async fn identify(&self, timeout: Duration) -> Result<(), String> {
        if let Target::Cluster(cluster) = &self.target {
            return cluster.identify(timeout).await;
        }
        match tokio::time::timeout(timeout, self.connecting()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        }
    }

    /// The group's master and failovers as this process has seen them, or each cluster shard's; none
    /// for a plain server.
    pub(crate) fn group_states(&self) -> Vec<crate::store::GroupState> {
        match &self.target {
            Target::Server(_) => Vec::new(),
            Target::Group(group) => vec![group.state()],
            Target::Cluster(cluster) => cluster.states(),
        }
    }

    /// Starts connecting in the background, so that the first round does not pay for the connection
    /// (a cluster's: reads its slot map).
    pub(crate) fn warm_up(&self) {
        match &self.target {
            Target::Cluster(cluster) => cluster.warm_up(self.connect_timeout),
            _ => drop(self.connecting()),
        }
    }
}

impl Session {
    /// What the server said it is at the last reading of the checks.
    fn current(&self) -> Identity {
        match self.latest.lock() {
            Ok(latest) => latest.clone().unwrap_or_else(|| self.identity.clone()),
            Err(_) => self.identity.clone(),
        }
    }
}

/// The pairs of `urls` (as redacted labels) that resolve to a common socket address, with that address:
/// two names of one server, which would vote twice were they not identified by `run_id`. URLs that do
/// not parse or resolve (a host unknown here) are left out: a worker tells those apart when it connects.
pub(crate) fn shared_addresses(urls: &[String]) -> Vec<(String, String, std::net::SocketAddr)> {
    use std::net::ToSocketAddrs as _;
    let resolved: Vec<(String, Vec<std::net::SocketAddr>)> = urls
        .iter()
        .filter_map(|url| {
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).ok()?;
            let (host, port) = match info.addr() {
                redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
                redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
                _ => return None,
            };
            let addresses = (host.as_str(), port).to_socket_addrs().ok()?.collect();
            Some((redact(url), addresses))
        })
        .collect();
    let mut shared = Vec::new();
    for (i, (first, theirs)) in resolved.iter().enumerate() {
        for (second, ours) in &resolved[i + 1..] {
            if let Some(address) = theirs.iter().find(|address| ours.contains(address)) {
                shared.push((first.clone(), second.clone(), *address));
            }
        }
    }
    shared
}

/// `pipeline` with `WAIT acks` appended, within the round's budget (`node_timeout`; the round's
/// own `deadline` is how long a straggler is watched), with a quarter left for the answer to come
/// back, so that a shortfall is reported as one, not as a timeout. `WAIT … 0` would block the
/// connection for good, so the wait is at least a millisecond.
pub(super) fn with_wait(
    pipeline: &Pipeline,
    acks: u32,
    deadline: Instant,
    node_timeout: Duration,
) -> Pipeline {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .min(node_timeout);
    let left = left - left / 4;
    let mut with_wait = pipeline.clone();
    with_wait
        .cmd("WAIT")
        .arg(acks)
        .arg(left.as_millis().max(1) as u64);
    with_wait
}

/// Sends `pipeline` on `connection`; after a `NOSCRIPT` (the server restarted, or its script cache was
/// flushed) loads the scripts and sends it once more. That is safe because a `NOSCRIPT` command did not
/// run, and every script is idempotent for the same value anyway.
pub(super) async fn send_loading_scripts(
    pipeline: &Pipeline,
    connection: &mut MultiplexedConnection,
) -> redis::RedisResult<Vec<Value>> {
    let first = pipeline.query_async::<Vec<Value>>(connection).await;
    if !needs_scripts(&first) {
        return first;
    }
    load_scripts(connection).await?;
    pipeline.query_async::<Vec<Value>>(connection).await
}

/// Loads every script of the store into the server on `connection`'s cache, after it answered `NOSCRIPT`
/// (it restarted, or its script cache was flushed).
async fn load_scripts(connection: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    let mut load = redis::pipe();
    for source in super::scripts::sources() {
        load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    for source in super::history::sources() {
        load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    for source in super::triggers::sources() {
        load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    for source in super::pause::sources() {
        load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    load.query_async::<()>(connection).await
}

/// Asks the server on `connection` what it is: `INFO` (its default sections) and, where the server
/// allows it (not renamed, not denied by an ACL), `CONFIG GET appendfsync`.
pub(super) async fn identify(connection: &mut MultiplexedConnection) -> Result<Identity, String> {
    let info: Value = redis::cmd("INFO")
        .query_async(connection)
        .await
        .map_err(|error| format!("INFO failed: {error}"))?;
    let appendfsync = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync")
        .query_async::<Value>(connection)
        .await
        .ok()
        .and_then(|value| admission::config_value(&value));
    let text = admission::text(&info).ok_or_else(|| "INFO gave no text".to_string())?;
    Identity::parse(&text, appendfsync).ok_or_else(|| "INFO named no run_id".to_string())
}

/// Whether an error says that the server is a replica now (it refuses writes).
pub(super) fn is_readonly(text: &str) -> bool {
    text.contains("READONLY")
}

/// Whether a reply says that a script is not in the node's cache.
fn needs_scripts(reply: &redis::RedisResult<Vec<Value>>) -> bool {
    let is_noscript = |text: &str| text.contains("NOSCRIPT");
    match reply {
        Err(error) => {
            error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                || is_noscript(&error.to_string())
        }
        Ok(values) => values
            .iter()
            .any(|value| matches!(value, Value::ServerError(e) if is_noscript(&format!("{e:?}")))),
    }
}

#[cfg(test)]
mod tests {
    use super::{redact, shared_addresses};

    /// Two names that resolve to one address are reported as a pair; distinct ports are not.
    #[test]
    fn two_names_of_one_address_are_found() {
        let urls = [
            "redis://127.0.0.1:32101".to_string(),
            "redis://:pw@localhost:32101/1".to_string(),
            "redis://127.0.0.1:32102".to_string(),
        ];
        let shared = shared_addresses(&urls);
        assert_eq!(shared.len(), 1, "{shared:?}");
        assert_eq!(shared[0].0, "redis://127.0.0.1:32101");
        assert_eq!(shared[0].1, "redis://:***@localhost:32101/1");
        assert_eq!(shared[0].2.port(), 32101);
    }

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://:s3cret@host:6379/2"),
            "redis://:***@host:6379/2"
        );
        assert_eq!(
            redact("rediss://app:p@ss:w/rd@host:6380"),
            "rediss://app:***@host:6380"
        );
        assert_eq!(redact("redis://app@host"), "redis://app@host");
        assert_eq!(redact("host:6379"), "<invalid URL>");
    }
}
