//! [`RedisCluster`]: N independent `redis-server` processes on free loopback ports, to crash and revive.
//!
//! The lock's safety argument is about nodes that crash, hang, lose their data or come back with it, so
//! each node can be killed (SIGKILL), hung (SIGSTOP: connections are accepted but never answered, unlike a
//! refused connection), continued, restarted on the same port (with its AOF when persistence is on), and
//! flushed; nodes may require a password. Like redis-rs's `redis-test`, a node counts as started only
//! once it answers PING — and, unlike it, only once its own process listens on its port (another test's
//! node could answer there: [`crate::ports`]); a node that never does fails the test with its log.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::children;

/// How long a starting node may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long assertion helpers wait on a node.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether nodes keep their data across [`RedisCluster::restart`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// `--save "" --appendonly no`: a restarted node comes back empty.
    None,
    /// `--appendonly yes --appendfsync always`: every acknowledged write survives a SIGKILL.
    AppendOnlyAlways,
}

/// Options for [`RedisCluster`]; start with [`RedisCluster::builder`].
#[derive(Debug, Clone)]
pub struct RedisClusterBuilder {
    nodes: usize,
    persistence: Persistence,
    tls: bool,
    client_certificates: bool,
    password: Option<String>,
    settings: Vec<(String, String)>,
    cluster_enabled: bool,
}

impl RedisClusterBuilder {
    pub fn nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes;
        self
    }

    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Serve TLS only, with a certificate for 127.0.0.1 signed by a CA of the cluster's own (made with
    /// `openssl`: [`RedisCluster::ca_file`]); URLs become `rediss://127.0.0.1:<port>/#insecure`
    /// ([`RedisCluster::verified_url`] checks the certificate instead).
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// With [`Self::tls`]: the servers require a client certificate signed by the cluster's CA
    /// (`tls-auth-clients yes`): [`RedisCluster::client_identity`].
    pub fn client_certificates(mut self, required: bool) -> Self {
        self.client_certificates = required;
        self
    }

    /// Require this password (`requirepass`); URLs become `redis://:<password>@127.0.0.1:<port>`.
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// Starts every node from a config file of its own (`redis.conf` in its directory) that sets `name`
    /// to `value`, besides what the other options set. A node with a config file keeps what `CONFIG
    /// REWRITE` writes there — what Sentinel sends a node it reconfigures — across
    /// [`RedisCluster::restart`], as a server restarted by its operator does.
    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Start every node as a Redis Cluster node (`cluster-enabled yes`), its cluster state in
    /// `nodes.conf` in its directory and its cluster bus on a free port of its own (`cluster-port`,
    /// kept across [`RedisCluster::restart`]); [`crate::ShardedRedis`] makes a cluster of them.
    pub fn cluster_enabled(mut self, enabled: bool) -> Self {
        self.cluster_enabled = enabled;
        self
    }

    /// Starts every node and waits until each answers PING; panics (with the node's log) otherwise.
    pub fn start(self) -> RedisCluster {
        crate::require_program("redis-server", "redis-server");
        let dir = tempfile::Builder::new()
            .prefix("redcron-redis-")
            .tempdir()
            .expect("cannot create a temporary directory");
        if self.tls {
            crate::require_program("openssl", "openssl");
            crate::etcd::make_certificates(dir.path());
            // The sync client used by `ping` needs a crypto provider too.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            persistence: self.persistence,
            tls: self.tls,
            client_certificates: self.tls && self.client_certificates,
            password: self.password,
            config_file: !self.settings.is_empty(),
            cluster_enabled: self.cluster_enabled,
            _dir: dir,
        };
        for i in 0..self.nodes {
            let dir = cluster._dir.path().join(format!("node{i}"));
            std::fs::create_dir(&dir).expect("cannot create a node directory");
            if cluster.config_file {
                let lines: String = self
                    .settings
                    .iter()
                    .map(|(name, value)| format!("{name} {value}\n"))
                    .collect();
                std::fs::write(dir.join(CONFIG_FILE), lines).expect("cannot write a node config");
            }
            // Pushed before starting so that Drop cleans up even if a later node fails.
            cluster.nodes.push(Node {
                port: 0,
                bus_port: 0,
                dir,
                child: None,
                stopped: false,
            });
            cluster.start_on_free_port(i);
        }
        cluster
    }
}

/// N `redis-server` processes, all killed on drop.
pub struct RedisCluster {
    nodes: Vec<Node>,
    persistence: Persistence,
    tls: bool,
    client_certificates: bool,
    password: Option<String>,
    /// Whether each node starts from its [`CONFIG_FILE`] (see [`RedisClusterBuilder::config`]).
    config_file: bool,
    /// Whether the nodes are Redis Cluster nodes ([`RedisClusterBuilder::cluster_enabled`]).
    cluster_enabled: bool,
    _dir: tempfile::TempDir,
}

/// The config file of a node started with [`RedisClusterBuilder::config`], in its directory.
const CONFIG_FILE: &str = "redis.conf";

struct Node {
    port: u16,
    /// The cluster bus port of a Redis Cluster node (0 for any other).
    bus_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    stopped: bool,
}

impl RedisCluster {
    /// `n` nodes without persistence.
    pub fn start(n: usize) -> RedisCluster {
        RedisCluster::builder().nodes(n).start()
    }

    /// Three nodes without persistence, unless told otherwise.
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder {
            nodes: 3,
            persistence: Persistence::None,
            tls: false,
            client_certificates: false,
            password: None,
            settings: Vec::new(),
            cluster_enabled: false,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `redis://127.0.0.1:<port>` of every node, in order: what a `jobs.yaml` lists.
    pub fn urls(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.url(i)).collect()
    }

    /// The nodes as a YAML flow list, `["redis://…", …]`: what `redis.nodes` of a `jobs.yaml` says.
    pub fn nodes_yaml(&self) -> String {
        let quoted: Vec<String> = self.urls().iter().map(|url| format!("\"{url}\"")).collect();
        format!("[{}]", quoted.join(", "))
    }

    /// The URL of node `i`, with the password if there is one.
    pub fn url(&self, i: usize) -> String {
        let auth = self
            .password
            .as_ref()
            .map_or(String::new(), |password| format!(":{password}@"));
        if self.tls {
            // Self-signed certificate: skip verification (test only).
            format!("rediss://{auth}127.0.0.1:{}/#insecure", self.port(i))
        } else {
            format!("redis://{auth}127.0.0.1:{}", self.port(i))
        }
    }

    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// Node `i`'s cluster bus port (`cluster-port`), for `CLUSTER MEET`; 0 unless
    /// [`RedisClusterBuilder::cluster_enabled`].
    pub fn bus_port(&self, i: usize) -> u16 {
        self.nodes[i].bus_port
    }

    /// The node's process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// Whether node `i` runs and is not hung by [`Self::stop`].
    pub fn is_serving(&self, i: usize) -> bool {
        self.nodes[i].child.is_some() && !self.nodes[i].stopped
    }

    /// Node `i`'s directory (its data, its append-only file, its log).
    pub fn dir(&self, i: usize) -> &std::path::Path {
        &self.nodes[i].dir
    }

    /// Crashes node `i`: SIGKILL, and reap it. Its port refuses connections until [`Self::restart`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            children::kill_and_reap(&mut child);
        }
        self.nodes[i].stopped = false;
    }

    /// Hangs node `i` (SIGSTOP): connections are accepted but get no answer, as with a frozen VM.
    pub fn stop(&mut self, i: usize) {
        let pid = self
            .pid(i)
            .unwrap_or_else(|| panic!("node {i} is not running"));
        children::signal(pid, libc::SIGSTOP);
        self.nodes[i].stopped = true;
    }

    /// Resumes a node hung by [`Self::stop`].
    pub fn cont(&mut self, i: usize) {
        if let Some(pid) = self.pid(i) {
            children::signal(pid, libc::SIGCONT);
        }
        self.nodes[i].stopped = false;
    }

    /// Kills node `i` if it runs, then starts it again on the same port and directory: with
    /// [`Persistence::AppendOnlyAlways`] it reloads its data, without persistence it comes back empty; a
    /// node with a config file ([`RedisClusterBuilder::config`]) comes back with what the file says now.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        // The port was ours a moment ago; retry briefly in case the kernel has not let go of it yet.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.try_start(i) {
                Ok(()) => return,
                Err(log) if log.contains("Address already in use") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(log) => panic!(
                    "redis node {i} did not restart on port {}:\n{log}",
                    self.port(i)
                ),
            }
        }
    }

    /// Whether node `i` answers PING within half a second.
    pub fn ping(&self, i: usize) -> bool {
        ping(&self.client(i), Duration::from_millis(500))
    }

    /// The data nodes that data node `master` streams its writes to (`INFO replication`:
    /// `state=online`), if it answers within half a second.
    pub fn online_replicas(&self, master: usize) -> Option<Vec<usize>> {
        let client = self.client(master);
        let mut connection = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        connection
            .set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut connection)
            .ok()?;
        Some(
            info.lines()
                .filter(|line| line.starts_with("slave") && line.contains("state=online"))
                .filter_map(|line| {
                    let port = line.split(',').find_map(|f| f.strip_prefix("port="))?;
                    let port: u16 = port.parse().ok()?;
                    (0..self.len()).find(|&node| self.port(node) == port)
                })
                .collect(),
        )
    }

    /// A client for node `i`, for assertions (presenting the client certificate where the servers
    /// require one).
    pub fn client(&self, i: usize) -> redis::Client {
        let url = self.url(i);
        if !self.client_certificates {
            return redis::Client::open(url).expect("a redis:// URL on loopback is valid");
        }
        let (cert, key) = self.client_identity();
        let read = |path: &std::path::Path| std::fs::read(path).expect("the test certificates");
        let certificates = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&cert),
                client_key: read(&key),
            }),
            root_cert: None,
        };
        redis::Client::build_with_tls(url, certificates).expect("the test certificates parse")
    }

    /// The CA that signed the TLS servers' certificates (PEM), for `redis.ca_file`.
    pub fn ca_file(&self) -> PathBuf {
        self._dir.path().join("ca.pem")
    }

    /// A client certificate and its key signed by [`Self::ca_file`]'s CA, for `redis.cert_file` and
    /// `redis.key_file` (the servers' own, which is good for clients too).
    pub fn client_identity(&self) -> (PathBuf, PathBuf) {
        let dir = self._dir.path();
        (dir.join("cert.pem"), dir.join("key.pem"))
    }

    /// Node `i`'s TLS URL without `#insecure`: a client must verify the certificate against
    /// [`Self::ca_file`] (no public root signed it).
    pub fn verified_url(&self, i: usize) -> String {
        self.url(i).replace("/#insecure", "")
    }

    /// A connection to node `i` (2 s timeouts); panics if the node does not answer.
    pub fn connection(&self, i: usize) -> redis::Connection {
        let connection = self
            .client(i)
            .get_connection_with_timeout(QUERY_TIMEOUT)
            .unwrap_or_else(|e| panic!("cannot connect to redis node {i}: {e}"));
        connection
            .set_read_timeout(Some(QUERY_TIMEOUT))
            .expect("a positive timeout is accepted");
        connection
    }

    /// Runs `cmd` on node `i` and converts the reply; panics on any error.
    pub fn query<T: redis::FromRedisValue>(&self, i: usize, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.connection(i))
            .unwrap_or_else(|e| panic!("redis node {i}: {e}"))
    }

    /// `GET key` on node `i`.
    pub fn get(&self, i: usize, key: &str) -> Option<String> {
        self.query(i, redis::cmd("GET").arg(key))
    }

    /// `KEYS pattern` on node `i`, sorted.
    pub fn keys(&self, i: usize, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self.query(i, redis::cmd("KEYS").arg(pattern));
        keys.sort();
        keys
    }

    /// `FLUSHALL` on node `i`: it loses its data but keeps running.
    pub fn flushall(&self, i: usize) {
        let () = self.query(i, &redis::cmd("FLUSHALL"));
    }

    /// The node's log file (and anything it printed before opening it).
    pub fn log(&self, i: usize) -> String {
        let node = &self.nodes[i];
        let read = |name: &str| std::fs::read_to_string(node.dir.join(name)).unwrap_or_default();
        format!("{}{}", read("console.log"), read("redis.log"))
    }

    fn start_on_free_port(&mut self, i: usize) {
        for _ in 0..5 {
            let ports = crate::free_ports(2);
            self.nodes[i].port = ports[0];
            if self.cluster_enabled {
                self.nodes[i].bus_port = ports[1];
            }
            match self.try_start(i) {
                Ok(()) => return,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!(
                    "redis node {i} did not start on port {}:\n{log}",
                    self.port(i)
                ),
            }
        }
        panic!("redis node {i}: no free port found in 5 attempts");
    }

    /// Starts node `i` on its port and waits for PING; on failure, kills it and returns its log.
    fn try_start(&mut self, i: usize) -> Result<(), String> {
        let node = &self.nodes[i];
        let console =
            std::fs::File::create(node.dir.join("console.log")).expect("cannot create a log file");
        let mut command = Command::new("redis-server");
        if self.config_file {
            // First: the options after it override what the file says, and `CONFIG REWRITE` writes
            // them all back into it.
            command.arg(node.dir.join(CONFIG_FILE));
        }
        if self.tls {
            let certs = self._dir.path();
            command
                .args(["--port", "0", "--tls-port", &node.port.to_string()])
                .arg("--tls-cert-file")
                .arg(certs.join("cert.pem"))
                .arg("--tls-key-file")
                .arg(certs.join("key.pem"))
                .arg("--tls-ca-cert-file")
                .arg(certs.join("ca.pem"))
                .args([
                    "--tls-auth-clients",
                    if self.client_certificates {
                        "yes"
                    } else {
                        "no"
                    },
                ]);
        } else {
            command.args(["--port", &node.port.to_string()]);
        }
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        if self.cluster_enabled {
            command
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ])
                .args(["--cluster-port", &node.bus_port.to_string()]);
            if let Some(password) = &self.password {
                // A replica authenticates to its master with the cluster's one password.
                command.args(["--masterauth", password]);
            }
        }
        command
            .args(["--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(&node.dir)
            .arg("--logfile")
            .arg(node.dir.join("redis.log"))
            .current_dir(&node.dir)
            .stdin(Stdio::null())
            .stdout(console.try_clone().expect("cannot duplicate a file handle"))
            .stderr(console);
        match self.persistence {
            Persistence::None => command.args(["--appendonly", "no"]),
            Persistence::AppendOnlyAlways => {
                command.args(["--appendonly", "yes", "--appendfsync", "always"])
            }
        };
        let mut child =
            children::spawn(command).unwrap_or_else(|e| panic!("cannot run redis-server: {e}"));
        let client = self.client(i);
        let deadline = Instant::now() + READY_TIMEOUT;
        let outcome = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break Err(format!("redis-server exited ({status})"));
            }
            // Answering is not enough: another process may hold the port ([`crate::ports`]).
            if ping(&client, Duration::from_millis(200))
                && crate::ports::listened_on_by(child.id(), node.port)
            {
                break Ok(());
            }
            if Instant::now() >= deadline {
                let whose = if crate::ports::listened_on_by(child.id(), node.port) {
                    ""
                } else {
                    " on a port of its own (Address already in use by another process?)"
                };
                break Err(format!(
                    "redis-server did not answer PING{whose} within {READY_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match outcome {
            Ok(()) => {
                self.nodes[i].child = Some(child);
                self.nodes[i].stopped = false;
                Ok(())
            }
            Err(why) => {
                children::kill_and_reap(&mut child);
                Err(format!("{why}; its log:\n{}", self.log(i)))
            }
        }
    }
}

impl Drop for RedisCluster {
    /// Kills every node, stopped ones included, and reaps them.
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                children::kill_and_reap(&mut child);
            }
        }
    }
}

/// Whether the server of `client` answers PING (not LOADING, not silence) within `timeout`.
fn ping(client: &redis::Client, timeout: Duration) -> bool {
    let Ok(mut connection) = client.get_connection_with_timeout(timeout) else {
        return false;
    };
    if connection.set_read_timeout(Some(timeout)).is_err() {
        return false;
    }
    redis::cmd("PING")
        .query::<String>(&mut connection)
        .is_ok_and(|reply| reply == "PONG")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose port another server holds is not counted as started because that server answers
    /// PING: the start fails with the node's own "Address already in use", which makes the harness try a
    /// new port.
    #[test]
    fn a_node_whose_port_another_server_holds_does_not_start() {
        let other = RedisCluster::start(1);
        let mut cluster = RedisCluster::start(1);
        cluster.kill(0);
        cluster.nodes[0].port = other.port(0);
        let error = cluster
            .try_start(0)
            .expect_err("the port is the other node's");
        assert!(error.contains("Address already in use"), "{error}");
    }
}
