//! [`SentinelGroup`]: a Redis master with replicas and the Sentinels that fail it over, on free loopback
//! ports, to kill, fail over and watch follow.
//!
//! The data nodes are a [`RedisCluster`] (node 0 starts as the master, the others replicate it), each
//! running from a config file of its own that the Sentinels rewrite as they reconfigure it, so a data
//! node restarted ([`SentinelGroup::restart`]) comes back with the role they last gave it; the
//! Sentinels are `redis-server --sentinel` processes, each with a config file of its own (Sentinel
//! rewrites it). The group counts as started once every Sentinel names the master and knows every
//! replica — before that, a failover could not happen. Everything is killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{children, Persistence, RedisCluster};

/// The name the Sentinels monitor the master under.
pub const MASTER_NAME: &str = "redcron-test";

/// How long a group may take to start (replication up, every replica known to every Sentinel).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a failover may take, from the old master's death to a new one every Sentinel names.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// Options for [`SentinelGroup`]; start with [`SentinelGroup::builder`].
#[derive(Debug, Clone)]
pub struct SentinelGroupBuilder {
    replicas: usize,
    sentinels: usize,
    password: Option<String>,
    sentinel_password: Option<String>,
    down_after: Duration,
    tls: bool,
    persistence: Persistence,
    data_settings: Vec<(String, String)>,
}

impl SentinelGroupBuilder {
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    pub fn sentinels(mut self, sentinels: usize) -> Self {
        self.sentinels = sentinels;
        self
    }

    /// The data nodes require this password (`requirepass`, and `masterauth` on the replicas).
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// The Sentinels require this password of their clients (and of each other).
    pub fn sentinel_password(mut self, password: &str) -> Self {
        self.sentinel_password = Some(password.to_owned());
        self
    }

    /// How long the master may be silent before a Sentinel thinks it down (default 1 s).
    pub fn down_after(mut self, down_after: Duration) -> Self {
        self.down_after = down_after;
        self
    }

    /// Everything over TLS only: the data nodes (replication too) and the Sentinels, with certificates
    /// signed by the data nodes' CA ([`SentinelGroup::ca_file`]); no client certificate is asked for.
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Whether the data nodes keep their data across a restart (default: they do not).
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Sets `name` to `value` in every data node's config file.
    pub fn data_config(mut self, name: &str, value: &str) -> Self {
        self.data_settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Starts the data nodes, makes nodes 1.. replicas of node 0, starts the Sentinels, and waits until
    /// every Sentinel knows every replica; panics with the logs otherwise.
    pub fn start(self) -> SentinelGroup {
        crate::require_program("redis-server", "redis-server");
        // A replica is in sync only after its first transfer, which a master delays 5 s by default to
        // serve several at once: at once here, so that a write can be acknowledged. On every node, not
        // just the first master, and in its config file, so also after a restart: after a failover the
        // replica that is left may need a full transfer from the promoted one (it was ahead of it), and
        // 5 s without a replica's acknowledgement is 5 s of ticks no group answer counts for.
        let mut nodes = RedisCluster::builder()
            .nodes(1 + self.replicas)
            .persistence(self.persistence)
            .config("repl-diskless-sync-delay", "0")
            .tls(self.tls);
        // Any node may be a replica after a failover: replication over TLS on every one.
        if self.tls {
            nodes = nodes.config("tls-replication", "yes");
        }
        for (name, value) in &self.data_settings {
            nodes = nodes.config(name, value);
        }
        if let Some(password) = &self.password {
            nodes = nodes.password(password);
        }
        let data = nodes.start();
        let dir = tempfile::Builder::new()
            .prefix("redcron-sentinel-")
            .tempdir()
            .expect("cannot create a temporary directory");
        let mut group = SentinelGroup {
            data,
            sentinels: Vec::new(),
            master: MASTER_NAME.to_string(),
            password: self.password.clone(),
            sentinel_password: self.sentinel_password.clone(),
            down_after: self.down_after,
            tls: self.tls,
            quorum: self.sentinels / 2 + 1,
            _dir: dir,
        };
        for i in 1..=self.replicas {
            group.make_replica(i);
        }
        // Each node's file says what it is now, as the Sentinels' own reconfigurations will.
        for i in 0..=self.replicas {
            let () = group.data.query(i, redis::cmd("CONFIG").arg("REWRITE"));
        }
        group.wait_for_replicas(self.replicas);
        for i in 0..self.sentinels {
            let dir = group._dir.path().join(format!("sentinel{i}"));
            std::fs::create_dir(&dir).expect("cannot create a Sentinel directory");
            group.sentinels.push(Sentinel {
                port: 0,
                dir,
                child: None,
            });
            group.start_sentinel(i);
        }
        group.wait_until_ready(self.replicas);
        group
    }
}

/// A master, its replicas and its Sentinels, all killed on drop.
pub struct SentinelGroup {
    /// The data nodes; node 0 is the first master.
    pub data: RedisCluster,
    sentinels: Vec<Sentinel>,
    master: String,
    password: Option<String>,
    sentinel_password: Option<String>,
    down_after: Duration,
    tls: bool,
    /// How many Sentinels must agree that the master is down.
    quorum: usize,
    _dir: tempfile::TempDir,
}

struct Sentinel {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl SentinelGroup {
    /// One master, two replicas, three Sentinels, no passwords, unless told otherwise.
    pub fn builder() -> SentinelGroupBuilder {
        SentinelGroupBuilder {
            replicas: 2,
            sentinels: 3,
            password: None,
            sentinel_password: None,
            down_after: Duration::from_secs(1),
            tls: false,
            persistence: Persistence::None,
            data_settings: Vec::new(),
        }
    }

    /// The name the Sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.master
    }

    /// `127.0.0.1:port` of each Sentinel.
    pub fn sentinel_addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| format!("127.0.0.1:{}", sentinel.port))
            .collect()
    }

    /// The group as a node of the Redis store, with its passwords.
    pub fn config(
        &self,
        min_replicas_acked: redcron::config::ReplicaAcks,
    ) -> redcron::config::SentinelGroup {
        redcron::config::SentinelGroup {
            password: self.password.clone(),
            sentinel_password: self.sentinel_password.clone(),
            tls: self.tls,
            ..group_config(self.sentinel_addresses(), min_replicas_acked)
        }
    }

    /// The CA that signed a TLS group's certificates (data nodes and Sentinels), for `redis.ca_file`.
    pub fn ca_file(&self) -> PathBuf {
        self.data.ca_file()
    }

    /// The group as one entry of `redis.nodes` in YAML flow style, with its passwords.
    pub fn node_yaml(&self) -> String {
        let mut yaml = format!(
            "{{sentinels: [{}], master: {}",
            self.sentinel_addresses().join(", "),
            self.master
        );
        if let Some(password) = &self.password {
            yaml.push_str(&format!(", password: \"{password}\""));
        }
        if let Some(password) = &self.sentinel_password {
            yaml.push_str(&format!(", sentinel_password: \"{password}\""));
        }
        if self.tls {
            yaml.push_str(", tls: true");
        }
        yaml.push('}');
        yaml
    }

    /// The data node the Sentinel `i` names as the master now, if it names one of ours.
    pub fn master_per(&self, i: usize) -> Option<usize> {
        let reply: Option<(String, String)> = self.sentinel_query(
            i,
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.master),
        )?;
        let port: u16 = reply?.1.parse().ok()?;
        (0..self.data.len()).find(|&node| self.data.port(node) == port)
    }

    /// The data node that every live Sentinel names as the master and that says it is one.
    pub fn master(&self) -> Option<usize> {
        let live: Vec<usize> = (0..self.sentinels.len())
            .filter(|&i| self.sentinels[i].child.is_some())
            .collect();
        let first = self.master_per(*live.first()?)?;
        let agreed = live.iter().all(|&i| self.master_per(i) == Some(first));
        (agreed && self.role(first).as_deref() == Some("master")).then_some(first)
    }

    /// Waits until every live Sentinel names a master other than `old` and it says it is one; that
    /// node. Panics with the Sentinels' logs after [`FAILOVER_TIMEOUT`].
    pub fn wait_for_new_master(&self, old: usize) -> usize {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        loop {
            if let Some(master) = self.master().filter(|&master| master != old) {
                return master;
            }
            assert!(
                Instant::now() < deadline,
                "no new master within {FAILOVER_TIMEOUT:?}; Sentinel logs:\n{}",
                self.sentinel_logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Asks Sentinel 0 to fail the master over now (`SENTINEL FAILOVER`: the old master becomes a
    /// replica, alive), and waits for the new master and for the old one to follow it in sync (the
    /// Sentinels convert it seconds after the switch; until then `min_replicas_acked: all` waits for
    /// it); the new master.
    pub fn failover(&self) -> usize {
        let old = self
            .master()
            .expect("the group has a master before a failover");
        self.start_failover()
            .unwrap_or_else(|why| panic!("{why}:\n{}", self.sentinel_logs()));
        let new = self.wait_for_new_master(old);
        self.wait_until_following(old, new);
        new
    }

    /// Waits until data node `i` is a replica of node `master` with its link up; panics with the
    /// Sentinels' logs after [`FAILOVER_TIMEOUT`].
    pub fn wait_until_following(&self, i: usize, master: usize) {
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        let port = format!("master_port:{}", self.data.port(master));
        loop {
            let info = self
                .data
                .client(i)
                .get_connection_with_timeout(Duration::from_millis(500))
                .ok()
                .and_then(|mut connection| {
                    redis::cmd("INFO")
                        .arg("replication")
                        .query::<String>(&mut connection)
                        .ok()
                })
                .unwrap_or_default();
            let following = info.lines().any(|l| l.trim() == "role:slave")
                && info.lines().any(|l| l.trim() == port)
                && info.lines().any(|l| l.trim() == "master_link_status:up");
            if following {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {i} does not follow node {master} within {FAILOVER_TIMEOUT:?}:\n{info}\n{}",
                self.sentinel_logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Asks Sentinel 0 to fail the master over (`SENTINEL FAILOVER`) and returns as soon as it agreed;
    /// the failover goes on in the background. `Err` says why it refused (one is under way already, no
    /// replica is fit).
    pub fn start_failover(&self) -> Result<(), String> {
        self.sentinel_query::<redis::Value>(
            0,
            redis::cmd("SENTINEL").arg("FAILOVER").arg(&self.master),
        )
        .and_then(|reply| match reply {
            redis::Value::Okay => Some(()),
            redis::Value::SimpleString(ok) if ok == "OK" => Some(()),
            _ => None,
        })
        .ok_or_else(|| "SENTINEL FAILOVER refused".to_string())
    }

    /// Restarts data node `i` as its operator would: on its data and its config file, which says the
    /// role the Sentinels last gave it (they rewrite it with each reconfiguration) — a replica comes back
    /// a replica of the master it followed, a master comes back a master, and the Sentinels convert it
    /// if they promoted another meanwhile.
    pub fn restart(&mut self, i: usize) {
        self.data.restart(i);
    }

    /// The data nodes that data node `master` streams its writes to ([`RedisCluster::online_replicas`]).
    pub fn online_replicas(&self, master: usize) -> Option<Vec<usize>> {
        self.data.online_replicas(master)
    }

    /// The master, if the group serves writes that count: every live Sentinel names it, it says it is
    /// a master, and it streams to at least `min_replicas_acked` replicas.
    pub fn serving(&self, min_replicas_acked: usize) -> Option<usize> {
        let master = self.master()?;
        let replicas = self.online_replicas(master)?;
        (replicas.len() >= min_replicas_acked).then_some(master)
    }

    /// How many replicas the first live Sentinel lists and does not think down (no `s_down`, `o_down`
    /// or `disconnected` flag): what redcron's `min_replicas_acked: all` waits for.
    pub fn replicas_up(&self) -> Option<usize> {
        let first = (0..self.sentinels.len()).find(|&i| self.sentinels[i].child.is_some())?;
        let reply: redis::Value = self.sentinel_query(
            first,
            redis::cmd("SENTINEL").arg("REPLICAS").arg(&self.master),
        )?;
        let redis::Value::Array(replicas) = reply else {
            return None;
        };
        let up = replicas
            .into_iter()
            .filter(|replica| {
                let fields = flat_fields(replica.clone());
                fields.iter().any(|(key, flags)| {
                    key == "flags"
                        && !flags
                            .split(',')
                            .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
                })
            })
            .count();
        Some(up)
    }

    /// `ROLE`'s first field on data node `i` (`master`, `slave`), if it answers.
    pub fn role(&self, i: usize) -> Option<String> {
        let client = self.data.client(i);
        let mut connection = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        connection
            .set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let reply: redis::Value = redis::cmd("ROLE").query(&mut connection).ok()?;
        match reply {
            redis::Value::Array(items) => match items.first()? {
                redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
                _ => None,
            },
            _ => None,
        }
    }

    /// Every Sentinel's log.
    pub fn sentinel_logs(&self) -> String {
        self.sentinels
            .iter()
            .enumerate()
            .map(|(i, sentinel)| {
                let log =
                    std::fs::read_to_string(sentinel.dir.join("sentinel.log")).unwrap_or_default();
                format!("--- sentinel {i} (port {}):\n{log}", sentinel.port)
            })
            .collect()
    }

    /// Waits until node 0's writes reach `replicas` replicas: a write and `WAIT` on one connection
    /// until every replica acknowledges it. (`state=online` is not enough: after a diskless transfer the
    /// master streams to a replica only once it has sent its first acknowledgement, up to a second
    /// later.)
    fn wait_for_replicas(&self, replicas: usize) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut connection = self.data.connection(0);
        loop {
            let acked: redis::RedisResult<(String, usize)> = redis::pipe()
                .cmd("SET")
                .arg("redcron-testkit:replicated")
                .arg(1)
                .cmd("WAIT")
                .arg(replicas)
                .arg(100)
                .query(&mut connection);
            if matches!(acked, Ok((_, acked)) if acked >= replicas) {
                let () = self
                    .data
                    .query(0, redis::cmd("DEL").arg("redcron-testkit:replicated"));
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replicas did not acknowledge a write within {READY_TIMEOUT:?}: {acked:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Makes data node `i` a replica of node 0 (the first master).
    fn make_replica(&self, i: usize) {
        if let Some(password) = &self.password {
            let () = self.data.query(
                i,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("masterauth")
                    .arg(password),
            );
        }
        let () = self.data.query(
            i,
            redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(self.data.port(0)),
        );
    }

    /// Runs `cmd` on Sentinel `i`; `None` if it does not answer or refuses.
    pub fn sentinel_query<T: redis::FromRedisValue>(
        &self,
        i: usize,
        cmd: &redis::Cmd,
    ) -> Option<T> {
        let auth = self
            .sentinel_password
            .as_ref()
            .map_or(String::new(), |password| format!(":{password}@"));
        let url = match self.tls {
            // Signed by the group's own CA: not verified here (test only).
            true => format!(
                "rediss://{auth}127.0.0.1:{}/#insecure",
                self.sentinels[i].port
            ),
            false => format!("redis://{auth}127.0.0.1:{}", self.sentinels[i].port),
        };
        let client = redis::Client::open(url).ok()?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        connection
            .set_read_timeout(Some(Duration::from_millis(1_000)))
            .ok()?;
        cmd.query(&mut connection).ok()
    }

    fn start_sentinel(&mut self, i: usize) {
        for _ in 0..5 {
            self.sentinels[i].port = crate::free_port();
            match self.try_start_sentinel(i) {
                Ok(()) => return,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("Sentinel {i} did not start:\n{log}"),
            }
        }
        panic!("Sentinel {i}: no free port found in 5 attempts");
    }

    fn try_start_sentinel(&mut self, i: usize) -> Result<(), String> {
        let sentinel = &self.sentinels[i];
        let quorum = self.quorum;
        let mut conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel resolve-hostnames no\n\
             sentinel monitor {name} 127.0.0.1 {master} {quorum}\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} 5000\n\
             sentinel parallel-syncs {name} 2\n",
            port = sentinel.port,
            dir = sentinel.dir.display(),
            name = self.master,
            master = self.data.port(0),
            down = self.down_after.as_millis(),
        );
        if let Some(password) = &self.password {
            conf.push_str(&format!("sentinel auth-pass {} {password}\n", self.master));
        }
        if let Some(password) = &self.sentinel_password {
            conf.push_str(&format!(
                "requirepass {password}\nsentinel sentinel-pass {password}\n"
            ));
        }
        if self.tls {
            // Clients, the data nodes and the other Sentinels over TLS only, on the data nodes' CA.
            let certs = self.data.ca_file();
            let dir = certs
                .parent()
                .expect("the CA file is in the cluster's directory");
            conf = conf.replacen(
                &format!("port {}\n", sentinel.port),
                &format!(
                    "port 0\ntls-port {}\ntls-cert-file {cert}\ntls-key-file {key}\n\
                     tls-ca-cert-file {ca}\ntls-replication yes\ntls-auth-clients no\n",
                    sentinel.port,
                    cert = dir.join("cert.pem").display(),
                    key = dir.join("key.pem").display(),
                    ca = certs.display(),
                ),
                1,
            );
        }
        let path = sentinel.dir.join("sentinel.conf");
        std::fs::write(&path, conf).expect("cannot write a Sentinel config");
        let console =
            std::fs::File::create(sentinel.dir.join("console.log")).expect("cannot create a log");
        let mut command = Command::new("redis-server");
        command
            .arg(&path)
            .arg("--sentinel")
            .current_dir(&sentinel.dir)
            .stdin(Stdio::null())
            .stdout(console.try_clone().expect("cannot duplicate a file handle"))
            .stderr(console);
        let mut child =
            children::spawn(command).unwrap_or_else(|e| panic!("cannot run redis-server: {e}"));
        let port = sentinel.port;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                children::kill_and_reap(&mut child);
                return Err(format!(
                    "Sentinel exited ({status}); its log:\n{}",
                    self.sentinel_log(i)
                ));
            }
            if crate::ports::listened_on_by(child.id(), port) {
                self.sentinels[i].child = Some(child);
                return Ok(());
            }
            if Instant::now() >= deadline {
                children::kill_and_reap(&mut child);
                return Err(format!(
                    "Sentinel did not listen within 5 s; its log:\n{}",
                    self.sentinel_log(i)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn sentinel_log(&self, i: usize) -> String {
        let dir = &self.sentinels[i].dir;
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        format!("{}{}", read("console.log"), read("sentinel.log"))
    }

    /// Waits until every Sentinel names node 0 as the master and lists `replicas` replicas that are up,
    /// and knows the other Sentinels.
    fn wait_until_ready(&self, replicas: usize) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let others = self.sentinels.len() - 1;
        loop {
            let ready = (0..self.sentinels.len()).all(|i| {
                let master = self.sentinel_query::<redis::Value>(
                    i,
                    redis::cmd("SENTINEL").arg("MASTER").arg(&self.master),
                );
                let fields = master.map(flat_fields).unwrap_or_default();
                let field = |name: &str| {
                    fields
                        .iter()
                        .find(|(key, _)| key == name)
                        .map(|(_, value)| value.clone())
                };
                let count = |name: &str| field(name).and_then(|v| v.parse::<usize>().ok());
                self.master_per(i) == Some(0)
                    && count("num-slaves") == Some(replicas)
                    && count("num-other-sentinels") == Some(others)
                    && field("flags").as_deref() == Some("master")
            });
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Sentinel group was not ready within {READY_TIMEOUT:?}; logs:\n{}",
                self.sentinel_logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills Sentinel `i` (SIGKILL).
    pub fn kill_sentinel(&mut self, i: usize) {
        if let Some(mut child) = self.sentinels[i].child.take() {
            children::kill_and_reap(&mut child);
        }
    }

    /// How long the master may be silent before a Sentinel thinks it down.
    pub fn down_after(&self) -> Duration {
        self.down_after
    }
}

/// The group at `sentinels` (as [`MASTER_NAME`]), without passwords, as a node of the Redis store.
pub fn group_config(
    sentinels: Vec<String>,
    min_replicas_acked: redcron::config::ReplicaAcks,
) -> redcron::config::SentinelGroup {
    redcron::config::SentinelGroup {
        master: MASTER_NAME.to_string(),
        sentinels,
        username: None,
        password: None,
        sentinel_username: None,
        sentinel_password: None,
        tls: false,
        db: 0,
        min_replicas_acked,
    }
}

/// The `field value field value …` reply of `SENTINEL MASTER` as pairs.
fn flat_fields(reply: redis::Value) -> Vec<(String, String)> {
    let redis::Value::Array(items) = reply else {
        return Vec::new();
    };
    let text = |value: &redis::Value| match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(text) => text.clone(),
        other => format!("{other:?}"),
    };
    items
        .chunks(2)
        .filter_map(|pair| match pair {
            [key, value] => Some((text(key), text(value))),
            _ => None,
        })
        .collect()
}

impl Drop for SentinelGroup {
    /// Kills the Sentinels first (so that none fails anything over while the data nodes die).
    fn drop(&mut self) {
        for sentinel in &mut self.sentinels {
            if let Some(mut child) = sentinel.child.take() {
                children::kill_and_reap(&mut child);
            }
        }
    }
}
