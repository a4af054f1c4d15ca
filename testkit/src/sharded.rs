//! [`ShardedRedis`]: a real Redis Cluster — masters serving the 16384 slots, each with its replicas —
//! made of cluster-enabled `redis-server` processes ([`RedisCluster`]) on free loopback ports, to kill,
//! hang, fail over and revive.
//!
//! The cluster is formed with the `redis` crate, not `redis-cli --cluster`: `CLUSTER MEET` from the first
//! node, `CLUSTER ADDSLOTSRANGE` splitting the slots evenly over the masters, `CLUSTER REPLICATE` for
//! each replica, and it counts as started only once every node says `cluster_state:ok` and every replica
//! `master_link_status:up`. Nodes fsync every write (`appendfsync always`), promote any replica however
//! far behind (`cluster-replica-validity-factor 0`, so that a test's failover always happens) and resync
//! without delay (`repl-diskless-sync-delay 0`).
//!
//! [`SharedShardedRedis`] is one such cluster per test process, for tests that do not disturb its
//! nodes, each under a key prefix of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::redis::{Persistence, RedisCluster};

/// How long forming the cluster, a failover or a resync may take on a loaded 2-core machine.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(40);
/// How long one query to a node may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Options for [`ShardedRedis`]; start with [`ShardedRedis::builder`].
#[derive(Debug, Clone)]
pub struct ShardedRedisBuilder {
    masters: usize,
    replicas_per_master: usize,
    node_timeout: Duration,
    password: Option<String>,
    settings: Vec<(String, String)>,
}

impl ShardedRedisBuilder {
    pub fn masters(mut self, masters: usize) -> Self {
        self.masters = masters;
        self
    }

    pub fn replicas_per_master(mut self, replicas: usize) -> Self {
        self.replicas_per_master = replicas;
        self
    }

    /// `cluster-node-timeout`: how long a master is unreachable before its replicas may take over.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Require this password on every node (`requirepass`, and `masterauth` for the replicas).
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// Set `name` to `value` on every node, besides what the harness sets.
    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Starts every node, forms the cluster and waits until it serves; panics naming what is missing.
    pub fn start(self) -> ShardedRedis {
        assert!(self.masters > 0, "a cluster needs a master");
        let total = self.masters * (1 + self.replicas_per_master);
        let node_timeout = self.node_timeout.as_millis().to_string();
        let mut builder = RedisCluster::builder()
            .nodes(total)
            .persistence(Persistence::AppendOnlyAlways)
            .cluster_enabled(true)
            .config("cluster-node-timeout", &node_timeout)
            .config("cluster-replica-validity-factor", "0")
            .config("cluster-allow-reads-when-down", "no")
            .config("repl-diskless-sync-delay", "0");
        if let Some(password) = &self.password {
            builder = builder.password(password);
        }
        for (name, value) in &self.settings {
            builder = builder.config(name, value);
        }
        let cluster = ShardedRedis {
            nodes: builder.start(),
            masters: self.masters,
            node_timeout: self.node_timeout,
        };
        cluster.form(self.replicas_per_master);
        cluster
    }
}

/// A Redis Cluster of `masters × (1 + replicas)` nodes: nodes `0..masters` start as the masters (master
/// `m` serving the `m`-th of the slots split evenly), the others as replicas, node `masters + k` of
/// master `k % masters`. All killed on drop.
pub struct ShardedRedis {
    nodes: RedisCluster,
    masters: usize,
    node_timeout: Duration,
}

impl ShardedRedis {
    /// Three masters with one replica each, `cluster-node-timeout` 2 s.
    pub fn start() -> ShardedRedis {
        ShardedRedis::builder().start()
    }

    pub fn builder() -> ShardedRedisBuilder {
        ShardedRedisBuilder {
            masters: 3,
            replicas_per_master: 1,
            node_timeout: Duration::from_secs(2),
            password: None,
            settings: Vec::new(),
        }
    }

    /// The nodes, to kill, hang, continue or restart one ([`RedisCluster::kill`], …), to read a node's
    /// log or to query it.
    pub fn nodes(&self) -> &RedisCluster {
        &self.nodes
    }

    /// The nodes, to kill, hang, continue or restart one.
    pub fn nodes_mut(&mut self) -> &mut RedisCluster {
        &mut self.nodes
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node's URL (with the password): seeds for `redis.cluster`.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.urls()
    }

    /// Its `cluster-node-timeout`: how long a master is unreachable before its replicas may take over.
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// `cluster: ["redis://…", …]`: the `redis:` section's field for this cluster.
    pub fn cluster_yaml(&self) -> String {
        format!("cluster: {}", self.nodes.nodes_yaml())
    }

    /// Node `i`'s id in the cluster (`CLUSTER MYID`); panics if it does not answer.
    pub fn node_id(&self, i: usize) -> String {
        self.query(i, &redis::cmd("CLUSTER").arg("MYID").clone())
            .unwrap_or_else(|e| panic!("cluster node {i}: CLUSTER MYID: {e}"))
    }

    /// Node `i`'s role as it says (`master` or `slave`); `None` if it does not answer.
    pub fn role(&self, i: usize) -> Option<String> {
        let reply: redis::Value = self.query(i, &redis::cmd("ROLE")).ok()?;
        match reply {
            redis::Value::Array(items) => match items.first()? {
                redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
                redis::Value::SimpleString(text) => Some(text.clone()),
                _ => None,
            },
            _ => None,
        }
    }

    /// The live nodes that say they are masters serving slots, each with its slot ranges.
    pub fn masters(&self) -> Vec<(usize, Vec<(u16, u16)>)> {
        (0..self.len())
            .filter(|&i| self.nodes.is_serving(i))
            .filter_map(|i| {
                let (flags, ranges) = self.own_line(i)?;
                (flags.contains("master") && !ranges.is_empty()).then_some((i, ranges))
            })
            .collect()
    }

    /// The live node that says it is the master serving `slot`, if one does.
    pub fn master_of_slot(&self, slot: u16) -> Option<usize> {
        self.masters()
            .into_iter()
            .find(|(_, ranges)| ranges.iter().any(|&(a, b)| a <= slot && slot <= b))
            .map(|(i, _)| i)
    }

    /// The master serving `key`'s slot ([`slot_of`]).
    pub fn master_of(&self, key: &str) -> Option<usize> {
        self.master_of_slot(slot_of(key))
    }

    /// `GET key` on the master of its slot; panics if no master serves it.
    pub fn get(&self, key: &str) -> Option<String> {
        let master = self
            .master_of(key)
            .unwrap_or_else(|| panic!("no master serves the slot of {key}"));
        self.nodes.get(master, key)
    }

    /// `SET key value` on the master of its slot; panics if that fails.
    pub fn set(&self, key: &str, value: impl redis::ToRedisArgs) {
        let master = self
            .master_of(key)
            .unwrap_or_else(|| panic!("no master serves the slot of {key}"));
        let () = self
            .nodes
            .query(master, redis::cmd("SET").arg(key).arg(value));
    }

    /// The live nodes that replicate master `master` (by its id), whatever their link's state.
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        let id = self.node_id(master);
        (0..self.len())
            .filter(|&i| i != master && self.nodes.is_serving(i))
            .filter(|&i| self.master_id_of(i).as_deref() == Some(id.as_str()))
            .collect()
    }

    /// Fails master `replica`'s master over to it (`CLUSTER FAILOVER` on the replica), and waits until
    /// it serves as a master and every live node says `cluster_state:ok`.
    pub fn failover(&self, replica: usize) {
        self.start_failover(replica)
            .unwrap_or_else(|why| panic!("{why}"));
        self.wait_for("the replica to be promoted by CLUSTER FAILOVER", || {
            self.role(replica).as_deref() == Some("master") && self.all_ok()
        });
    }

    /// Asks replica `replica` to take its master's slots over (`CLUSTER FAILOVER`) and returns as soon
    /// as it agreed; the failover goes on in the background. `Err` says why it refused (not a replica,
    /// not answering).
    pub fn start_failover(&self, replica: usize) -> Result<(), String> {
        let reply: Result<String, _> =
            self.query(replica, &redis::cmd("CLUSTER").arg("FAILOVER").clone());
        reply
            .map(drop)
            .map_err(|e| format!("cluster node {replica}: CLUSTER FAILOVER: {e}"))
    }

    /// Every shard's master and the replicas it streams to, if the cluster serves writes that count
    /// under `min_replicas_acked: all`: every live node says `cluster_state:ok`, as many nodes say they
    /// are masters serving slots as the cluster was built with, each streams to at least one replica,
    /// and every live node is a master or streams from one.
    pub fn serving(&self) -> Option<Vec<(usize, Vec<usize>)>> {
        if !self.all_ok() {
            return None;
        }
        let masters = self.masters();
        if masters.len() != self.masters {
            return None;
        }
        let shards: Vec<(usize, Vec<usize>)> = masters
            .into_iter()
            .map(|(master, _)| Some((master, self.nodes.online_replicas(master)?)))
            .collect::<Option<_>>()?;
        let streams = |node: usize| {
            shards
                .iter()
                .any(|(master, replicas)| *master == node || replicas.contains(&node))
        };
        let every = (0..self.len())
            .filter(|&node| self.nodes.is_serving(node))
            .all(streams);
        (every && shards.iter().all(|(_, replicas)| !replicas.is_empty())).then_some(shards)
    }

    /// After master `old` of `slot` was killed or hung: waits until another live node serves the slot
    /// and every live node says `cluster_state:ok`; that node.
    pub fn wait_for_new_master(&self, slot: u16, old: usize) -> usize {
        let mut found = None;
        self.wait_for("a replica to take over the slot", || {
            found = self.master_of_slot(slot).filter(|&m| m != old);
            found.is_some() && self.all_ok()
        });
        found.unwrap_or(old)
    }

    /// Waits until node `i` is a replica whose link to its master is up (after a restart of an old
    /// master, say).
    pub fn wait_until_replica(&self, i: usize) {
        self.wait_for("the node to replicate its master", || {
            self.role(i).as_deref() == Some("slave")
                && self
                    .info_field(i, "replication", "master_link_status")
                    .as_deref()
                    == Some("up")
        });
    }

    /// Waits until every live node says `cluster_state:ok`.
    pub fn wait_until_ok(&self) {
        self.wait_for("cluster_state:ok on every live node", || self.all_ok());
    }

    fn all_ok(&self) -> bool {
        (0..self.len())
            .filter(|&i| self.nodes.is_serving(i))
            .all(|i| {
                self.info_of(i, "CLUSTER", "INFO")
                    .contains("cluster_state:ok")
            })
    }

    /// Runs `cmd` on node `i` with a query timeout.
    fn query<T: redis::FromRedisValue>(&self, i: usize, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut connection = self
            .nodes
            .client(i)
            .get_connection_with_timeout(QUERY_TIMEOUT)?;
        connection.set_read_timeout(Some(QUERY_TIMEOUT))?;
        cmd.query(&mut connection)
    }

    /// The text of `first second` (`CLUSTER INFO`, `INFO replication`) on node `i`, or empty.
    fn info_of(&self, i: usize, first: &str, second: &str) -> String {
        self.query::<String>(i, redis::cmd(first).arg(second))
            .unwrap_or_default()
    }

    fn info_field(&self, i: usize, section: &str, field: &str) -> Option<String> {
        let text = self.info_of(i, "INFO", section);
        text.lines().find_map(|line| {
            let (name, value) = line.trim_end().split_once(':')?;
            (name == field).then(|| value.to_string())
        })
    }

    /// The id of the master node `i` replicates, from its own line of `CLUSTER NODES`.
    fn master_id_of(&self, i: usize) -> Option<String> {
        let nodes = self.info_of(i, "CLUSTER", "NODES");
        let line = nodes.lines().find(|line| line.contains("myself"))?;
        let master = line.split_whitespace().nth(3)?;
        (master != "-").then(|| master.to_string())
    }

    /// Node `i`'s flags and slot ranges, from its own line of `CLUSTER NODES`.
    fn own_line(&self, i: usize) -> Option<(String, Vec<(u16, u16)>)> {
        let nodes = self.info_of(i, "CLUSTER", "NODES");
        let line = nodes.lines().find(|line| line.contains("myself"))?;
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = fields.get(2)?.to_string();
        let ranges = fields
            .iter()
            .skip(8)
            .filter(|field| !field.starts_with('['))
            .filter_map(|field| match field.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => field.parse().ok().map(|slot| (slot, slot)),
            })
            .collect();
        Some((flags, ranges))
    }

    /// Polls `done` until it holds; panics after [`SETTLE_TIMEOUT`] naming `what`, with each node's
    /// view of the cluster.
    fn wait_for(&self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !done() {
            if Instant::now() > deadline {
                let views: Vec<String> = (0..self.len())
                    .map(|i| {
                        let log = self.nodes.log(i);
                        let lines: Vec<&str> = log.lines().collect();
                        let tail = lines[lines.len().saturating_sub(12)..].join("\n");
                        let view = self.info_of(i, "CLUSTER", "NODES");
                        format!("node {i}:\n{view}its log ends:\n{tail}\n")
                    })
                    .collect();
                panic!(
                    "the Redis Cluster did not settle within {SETTLE_TIMEOUT:?}: waited for {what}\n{}",
                    views.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Meets every node, gives the masters their slots, makes the replicas replicate, and waits until
    /// the cluster serves.
    fn form(&self, replicas_per_master: usize) {
        let total = self.len();
        for i in 1..total {
            let meet = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(self.nodes.port(i))
                .arg(self.nodes.bus_port(i))
                .clone();
            let reply: Result<String, _> = self.query(0, &meet);
            reply.unwrap_or_else(|e| panic!("cluster node 0: CLUSTER MEET node {i}: {e}"));
        }
        let per_master = 16384 / self.masters;
        for m in 0..self.masters {
            let start = m * per_master;
            let end = if m + 1 == self.masters {
                16383
            } else {
                start + per_master - 1
            };
            let add = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(start)
                .arg(end)
                .clone();
            let reply: Result<String, _> = self.query(m, &add);
            reply.unwrap_or_else(|e| panic!("cluster node {m}: CLUSTER ADDSLOTSRANGE: {e}"));
        }
        self.wait_for("every node to know every other", || {
            (0..total).all(|i| {
                self.info_of(i, "CLUSTER", "NODES")
                    .lines()
                    .filter(|line| !line.contains("handshake") && !line.contains("noaddr"))
                    .count()
                    == total
            })
        });
        let ids: Vec<String> = (0..self.masters).map(|m| self.node_id(m)).collect();
        for k in 0..self.masters * replicas_per_master {
            let replica = self.masters + k;
            let replicate = redis::cmd("CLUSTER")
                .arg("REPLICATE")
                .arg(&ids[k % self.masters])
                .clone();
            // A replica may not know its master's flags yet; try until it does.
            self.wait_for("a replica to accept CLUSTER REPLICATE", || {
                self.query::<String>(replica, &replicate).is_ok()
            });
        }
        self.wait_until_ok();
        for k in 0..self.masters * replicas_per_master {
            self.wait_until_replica(self.masters + k);
        }
        // A master ignores a manual failover from a node it does not know as its replica yet: wait until
        // every node's view has each master with all its replicas.
        self.wait_for("every node to see each master's replicas", || {
            (0..total).all(|i| {
                let view = self.info_of(i, "CLUSTER", "NODES");
                ids.iter().all(|id| {
                    view.lines()
                        .filter(|line| line.split_whitespace().nth(3) == Some(id.as_str()))
                        .count()
                        == replicas_per_master
                })
            })
        });
    }
}

/// The hash slot of `key`, as Redis Cluster computes it (redcron's own computation, which
/// `tests::slots_are_the_servers_slots` checks against the server's `CLUSTER KEYSLOT`).
pub fn slot_of(key: &str) -> u16 {
    redcron::store::redis::key_slot(key.as_bytes())
}

/// The process's shared cluster, once started; taken (and so dropped) at exit.
static SHARED: Mutex<Option<Arc<ShardedRedis>>> = Mutex::new(None);

/// The number in the next [`SharedShardedRedis`]'s prefix.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The process's one Redis Cluster (3 masters, 1 replica each), shared by the tests that neither stop
/// nor flush its nodes, and a key prefix no other [`SharedShardedRedis`] of the process has: a store with
/// that prefix sees nothing of the other tests' keys. Started by the first test that asks for it, its
/// nodes killed when the process exits (`atexit`).
pub struct SharedShardedRedis {
    cluster: Arc<ShardedRedis>,
    prefix: String,
}

impl SharedShardedRedis {
    /// The shared cluster, started if this is the process's first; with a new prefix,
    /// `redcron-shared-<n>`.
    pub fn get() -> SharedShardedRedis {
        let mut shared = SHARED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let cluster = match shared.as_ref() {
            Some(cluster) => Arc::clone(cluster),
            None => {
                let cluster = Arc::new(ShardedRedis::start());
                *shared = Some(Arc::clone(&cluster));
                // SAFETY: `drop_at_exit` is an `extern "C" fn()` with no arguments, as `atexit` wants;
                // registered once, with the cluster it drops.
                unsafe {
                    libc::atexit(drop_at_exit);
                }
                cluster
            }
        };
        let prefix = format!("redcron-shared-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        SharedShardedRedis { cluster, prefix }
    }

    /// The cluster: its seeds and nodes. Its nodes are not to be stopped, killed or flushed.
    pub fn cluster(&self) -> &ShardedRedis {
        &self.cluster
    }

    /// This test's key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

/// Drops the shared cluster at exit: kills its nodes and removes their directories. Never panics.
extern "C" fn drop_at_exit() {
    let taken = SHARED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take();
    drop(taken);
}

#[cfg(test)]
mod tests {
    use super::{slot_of, ShardedRedis};

    /// The slots Redis computes (`CLUSTER KEYSLOT`), hash tags included.
    #[test]
    fn slots_are_the_servers_slots() {
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(
            slot_of("{user1000}.following"),
            slot_of("{user1000}.followers")
        );
        let cluster = ShardedRedis::start();
        for key in ["foo", "rc:{nightly}:lease", "a{}b", "{x}{y}"] {
            let slot: u16 = cluster
                .nodes()
                .query(0, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key));
            assert_eq!(slot_of(key), slot, "{key}");
        }
    }

    /// `CLUSTER FAILOVER` on a replica makes it its master's master, and the old master its replica.
    #[test]
    fn a_planned_failover_swaps_a_master_and_its_replica() {
        let cluster = ShardedRedis::start();
        let master = cluster.master_of("{job}").expect("a master");
        let replica = cluster.replicas_of(master)[0];
        cluster.failover(replica);
        assert_eq!(cluster.master_of("{job}"), Some(replica));
        cluster.wait_until_replica(master);
    }

    /// A killed master's slots move to its replica; the old master comes back as a replica of it.
    #[test]
    fn a_killed_master_is_replaced_by_its_replica_and_comes_back_as_one() {
        let mut cluster = ShardedRedis::start();
        let key = "{job}:fence";
        let master = cluster.master_of(key).expect("a master serves every slot");
        let replicas = cluster.replicas_of(master);
        assert_eq!(replicas.len(), 1, "one replica per master");
        let () = cluster
            .nodes()
            .query(master, redis::cmd("SET").arg(key).arg("7"));
        cluster.nodes_mut().kill(master);
        let new = cluster.wait_for_new_master(slot_of(key), master);
        assert_eq!(new, replicas[0], "the old master's replica took over");
        assert_eq!(cluster.nodes().get(new, key).as_deref(), Some("7"));
        cluster.nodes_mut().restart(master);
        cluster.wait_until_replica(master);
    }
}
