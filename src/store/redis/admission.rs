//! Which Redis servers may vote: each node is identified by what it is, not by its URL, whenever a
//! connection to it is opened, and checked against the deployment's assumptions (`docs/protocol.md`,
//! *Assumptions the deployment must honour*) before any of its answers counts.
//!
//! On every new connection (at start, and after each reconnection) the node is asked `INFO` (and, where
//! the server allows it, `CONFIG GET appendfsync`), and its [`Identity`] decides its [`Standing`]:
//!
//! - **refused** (answers nothing, as a node down): a replica (`role` not `master`: it takes no write, and a
//!   promoted replica is a node that forgot records), a Redis Cluster node (a script call carries many
//!   jobs' keys), or a `maxmemory-policy` other than `noeviction` (an evicted claim record is a forgotten
//!   claim, an evicted lease an early expiry); or a second name of a server that another configured node
//!   already is (the same `run_id`): one server votes once, whatever its names.
//! - **held off** for the lock's TTL and drift (its answers are sent, so that its writes land, but count
//!   as failures): a node whose `run_id` changed since this process last saw it — it restarted — unless
//!   it fsyncs every write before replying (`appendonly yes`, `appendfsync always`) before and after:
//!   any other may have restarted empty. That is Redlock's delayed restart: by the end of the hold every lease granted
//!   before the restart has either expired or been renewed, and a renewal puts a lost lease key back
//!   with its fence and claim record (`scripts::RENEW`), so the node answers again as it did before it
//!   lost them. Not held off either: a Sentinel group's new master that was promoted from the master this
//!   process knew (its `master_replid2` is that master's `master_replid`), when the group counts writes
//!   only once `WAIT` says its replicas have them (`min_replicas_acked` ≥ 1, [`super::sentinel`]): the
//!   promoted replica holds every write that counted. Also held off: a name that takes over a server from another node (a changed resolution),
//!   so that no round counts the server under both names.
//! - **counted** otherwise. Persistence off (`aof_enabled:0`, or `appendfsync` not `always`) is warned
//!   about, once per server, at `WARN`: what it costs is stated in `docs/protocol.md`, and the hold above
//!   is what this process can do about it.
//!
//! The checks are read again every [`RECHECK`] on the open connection, so that `CONFIG SET
//! maxmemory-policy` or `REPLICAOF` on a live node is noticed without a reconnection.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;
use tracing::{error, warn};

use crate::logging::events;

/// How often the checks are read again on an open connection.
pub(super) const RECHECK: Duration = Duration::from_secs(10);

/// What a node said it is, from `INFO` (and `CONFIG GET appendfsync`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Identity {
    /// `run_id`: a random id the server draws at each start.
    pub(super) run_id: String,
    /// `role`: `master` or `slave`.
    pub(super) role: String,
    /// `maxmemory_policy`.
    pub(super) maxmemory_policy: String,
    /// `cluster_enabled:1`.
    pub(super) cluster: bool,
    /// `aof_enabled:1`.
    pub(super) aof: bool,
    /// `appendfsync`, when the server lets us read it.
    pub(super) appendfsync: Option<String>,
    /// `master_replid`: the replication history the server's data belongs to.
    pub(super) replid: String,
    /// `master_replid2`: the history a promoted replica continues (its old master's replid), or zeros.
    pub(super) replid2: String,
}

impl Identity {
    /// Parses the text of `INFO` (all default sections); `None` without a `run_id`.
    pub(super) fn parse(info: &str, appendfsync: Option<String>) -> Option<Identity> {
        let mut identity = Identity {
            appendfsync,
            ..Identity::default()
        };
        for line in info.lines() {
            let Some((field, value)) = line.trim_end().split_once(':') else {
                continue;
            };
            match field {
                "run_id" => identity.run_id = value.to_string(),
                "role" => identity.role = value.to_string(),
                "maxmemory_policy" => identity.maxmemory_policy = value.to_string(),
                "cluster_enabled" => identity.cluster = value == "1",
                "aof_enabled" => identity.aof = value == "1",
                "master_replid" => identity.replid = value.to_string(),
                "master_replid2" => identity.replid2 = value.to_string(),
                _ => {}
            }
        }
        (!identity.run_id.is_empty()).then_some(identity)
    }

    /// Why this server must not vote, whoever else it is; `None` if it may. `in_cluster`: it was
    /// reached as a node of `redis.cluster`, which must be a Redis Cluster node; any other must not.
    pub(super) fn refusal(&self, in_cluster: bool) -> Option<String> {
        if self.role != "master" {
            return Some(format!(
                "is a replica (role:{}), which takes no write and forgets records when promoted: not \
                 counted; list primaries only (`REPLICAOF NO ONE` makes it one), or the Sentinels of its group \
                 as a node (`{{sentinels: […], master: NAME}}`)",
                self.role
            ));
        }
        if self.cluster && !in_cluster {
            return Some(
                "is a Redis Cluster node (cluster_enabled:1); a claim's script call carries many jobs' \
                 keys: not counted; use standalone servers, or list the cluster's nodes under \
                 `redis.cluster`"
                    .to_string(),
            );
        }
        if in_cluster && !self.cluster {
            return Some(
                "is not a Redis Cluster node (cluster_enabled:0): not counted; list a standalone \
                 server under `redis.nodes`"
                    .to_string(),
            );
        }
        if !self.maxmemory_policy.is_empty() && self.maxmemory_policy != "noeviction" {
            return Some(format!(
                "evicts keys (maxmemory-policy {}): an evicted claim record is a forgotten claim, an \
                 evicted lease an early expiry: not counted; run `CONFIG SET maxmemory-policy \
                 noeviction` (and set it in redis.conf)",
                self.maxmemory_policy
            ));
        }
        None
    }

    /// Whether this server was promoted from a replica of the server that had replication id `replid`:
    /// it has that server's data up to its promotion.
    pub(super) fn continues(&self, replid: &str) -> bool {
        !replid.is_empty() && replid.bytes().any(|b| b != b'0') && self.replid2 == replid
    }

    /// Whether this server keeps every write it acknowledged across a crash: `appendonly yes` with
    /// `appendfsync always` (it fsyncs the append-only file before it replies), both read.
    pub(super) fn durable(&self) -> bool {
        self.aof && self.appendfsync.as_deref() == Some("always")
    }

    /// What this server's persistence lacks for `docs/protocol.md`'s assumption 1, if anything.
    pub(super) fn persistence_gap(&self) -> Option<String> {
        if !self.aof {
            return Some("appendonly is off".to_string());
        }
        match self.appendfsync.as_deref() {
            Some("always") | None => None,
            Some(other) => Some(format!("appendfsync is {other}, not always")),
        }
    }
}

/// Whether a node's answers count now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Standing {
    Counted,
    /// Sent to, not counted: why, until when.
    HeldOff(String, Instant),
    /// Not sent to: why.
    Refused(String),
}

/// What the store knows of its nodes' servers: the run id each node last reported, and which node votes
/// for each server. Shared by the nodes of one store.
pub(crate) struct Registry {
    /// The nodes' labels (redacted URLs), by index.
    labels: Vec<String>,
    /// For a Redis Cluster's registry, the cluster's label: its nodes are its shards, each indexed by
    /// the first slot it serves, and every one is a Redis Cluster node ([`Identity::refusal`]).
    shards_of: Option<String>,
    /// How long a restarted node is held off: the lock's TTL plus its drift (every lease of before the
    /// restart has expired or renewed by then, and every round that started before it has ended).
    hold: Duration,
    /// Per node: what stands behind it, for what a new server under its name means.
    behind: Vec<Behind>,
    state: Mutex<State>,
}

/// What stands behind a node of the store, for what a new server under its name (a new `run_id`)
/// means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behind {
    /// One server: a new run id is that server restarted, which forgot nothing with `appendfsync
    /// always` before and after.
    Server,
    /// A Sentinel group: a new run id may be another server, with other data, whatever its
    /// persistence. With `follows_promotions` (its answers count only once its replicas have the
    /// writes) a replica promoted from the master this process knew counts at once; any other new
    /// server is held off.
    Group { follows_promotions: bool },
}

#[derive(Default)]
struct State {
    /// Per node: the run id it last reported, when it counts from, and why not until then.
    nodes: HashMap<usize, Seen>,
    /// Per run id: the node that votes for that server.
    owners: HashMap<String, usize>,
    /// The run ids whose voting node stopped reporting them, with that node and when: another node that
    /// reports one takes it over; the same node reporting it again within [`RECHECK`] is a connection of
    /// its to the server it restarted from (later, a name that resolves to that server again).
    released: HashMap<String, (usize, Instant)>,
    /// The run ids whose missing persistence was warned about.
    warned: std::collections::HashSet<String>,
}

impl State {
    /// Notes that node `node` is now the server `identity`, no longer run id `old`: the old server's
    /// vote is released (another node may take it over), and the node counts from `counts_from`.
    fn replace(
        &mut self,
        node: usize,
        old: &str,
        identity: &Identity,
        counts_from: Instant,
        why_held: String,
    ) {
        let now = Instant::now();
        if self.owners.get(old) == Some(&node) {
            self.owners.remove(old);
            self.released.insert(old.to_string(), (node, now));
        }
        self.nodes.insert(
            node,
            Seen {
                run_id: identity.run_id.clone(),
                replid: identity.replid.clone(),
                durable: identity.durable(),
                counts_from,
                why_held,
            },
        );
    }
}

struct Seen {
    run_id: String,
    /// The server's `master_replid` when it was admitted.
    replid: String,
    /// Whether the server said it was durable ([`Identity::durable`]).
    durable: bool,
    counts_from: Instant,
    why_held: String,
}

impl Registry {
    /// A registry for nodes labelled `labels`, with what stands `behind` each (by index), holding new
    /// servers under a node's name off for `hold` as [`Behind`] says.
    pub(crate) fn new(labels: Vec<String>, hold: Duration, behind: Vec<Behind>) -> Registry {
        Registry {
            labels,
            shards_of: None,
            hold,
            behind,
            state: Mutex::default(),
        }
    }

    /// A registry for the shards of the Redis Cluster labelled `cluster`, node `i` being the shard whose
    /// first slot is `i`: each shard is a group whose master the cluster's failover may replace, which
    /// counts at once when it continues the old one's history and writes count only after `WAIT`
    /// (`follows_promotions`), and is held off for `hold` otherwise.
    pub(crate) fn for_shards(
        cluster: String,
        hold: Duration,
        follows_promotions: bool,
    ) -> Registry {
        Registry {
            labels: Vec::new(),
            shards_of: Some(cluster),
            hold,
            behind: vec![Behind::Group { follows_promotions }],
            state: Mutex::default(),
        }
    }

    fn label(&self, node: usize) -> String {
        match &self.shards_of {
            Some(cluster) => format!("{cluster} shard at slot {node}"),
            None => self
                .labels
                .get(node)
                .map_or("?", String::as_str)
                .to_string(),
        }
    }

    /// What stands behind node `node`.
    fn behind(&self, node: usize) -> Behind {
        match self.shards_of {
            Some(_) => self.behind.first().copied().unwrap_or(Behind::Server),
            None => self.behind.get(node).copied().unwrap_or(Behind::Server),
        }
    }

    /// Notes that node `node` (re)connected to a server that says it is `identity`, logs what is wrong
    /// with it, and returns its standing now.
    pub(super) fn admit(&self, node: usize, identity: &Identity) -> Standing {
        let label = self.label(node);
        let now = Instant::now();
        let Ok(mut state) = self.state.lock() else {
            return Standing::Refused("the node registry is poisoned (a bug)".to_string());
        };
        let behind = self.behind(node);
        let follows = behind
            == Behind::Group {
                follows_promotions: true,
            };
        // A group's master may move back to a server it moved from (A → B → A, each promoted from
        // the one before): that server continues the current one's history, which a connection left
        // over from before cannot.
        let promoted_back = follows
            && state
                .nodes
                .get(&node)
                .is_some_and(|seen| identity.continues(&seen.replid));
        let stale = !promoted_back
            && state
                .released
                .get(&identity.run_id)
                .is_some_and(|&(by, at)| by == node && now < at + RECHECK);
        if stale {
            // A connection that reached the server this node restarted from, admitted after one that
            // reached the new server: it is on its way out, and must not turn the node back.
            return Standing::Refused(format!(
                "node {label} answered on a connection to a server it no longer is"
            ));
        }
        let previous = state
            .nodes
            .get(&node)
            .map(|seen| (seen.run_id.clone(), seen.durable, seen.replid.clone()));
        let restarted = previous
            .as_ref()
            .is_some_and(|(run, ..)| *run != identity.run_id);
        if let Some((old, _, old_replid)) = previous
            .as_ref()
            .filter(|(_, _, old_replid)| restarted && follows && identity.continues(old_replid))
        {
            // A failover: the group's new master is a replica of the old one, promoted, and every write
            // that counted reached a replica (`WAIT`) before it did. It holds what the old one held.
            tracing::info!(
                event = events::store::MASTER_SWITCHED,
                node = %label,
                old_run_id = %old,
                run_id = %identity.run_id,
                replid = %old_replid,
                "The group's new master was promoted from the old one's replicas; it counts at once"
            );
            let old = old.clone();
            state.replace(node, &old, identity, now, String::new());
        } else if let Some((old, was_durable, _)) = previous.filter(|_| restarted) {
            // A server that fsyncs every write before it replies, before and after its restart, forgot
            // nothing this process counted: no hold. Any other may have come back empty, and under a
            // group's name a new server may be another one, whose data is not the old one's.
            let hold = if was_durable && identity.durable() && behind == Behind::Server {
                Duration::ZERO
            } else {
                self.hold
            };
            let until = now + hold;
            warn!(
                event = events::store::NODE_RESTARTED,
                node = %label,
                old_run_id = %old,
                run_id = %identity.run_id,
                held_ms = hold.as_millis() as u64,
                "Node restarted; without `appendfsync always` its answers do not count until every \
                 lease of before the restart has ended or been restored (Redlock's delayed restart)"
            );
            let why_held = match behind {
                Behind::Server => format!(
                    "restarted (run_id {old} is now {}) without `appendfsync always`: not counted \
                     until {} ms after the restart",
                    identity.run_id,
                    hold.as_millis()
                ),
                Behind::Group { .. } => format!(
                    "a new master (run_id {old} is now {}) that was not promoted from the one this \
                     process knew: not counted until {} ms after it appeared",
                    identity.run_id,
                    hold.as_millis()
                ),
            };
            state.replace(node, &old, identity, until, why_held);
        } else {
            state.nodes.entry(node).or_insert_with(|| Seen {
                run_id: identity.run_id.clone(),
                replid: identity.replid.clone(),
                durable: identity.durable(),
                counts_from: now,
                why_held: String::new(),
            });
        }
        if let Some(gap) = identity.persistence_gap() {
            if state.warned.insert(identity.run_id.clone()) {
                warn!(
                    event = events::store::NODE_UNSAFE,
                    node = %label,
                    run_id = %identity.run_id,
                    problem = %gap,
                    "Node runs without `appendonly yes` and `appendfsync always`: a crash or restart \
                     forgets the claims it confirmed; see docs/protocol.md, assumption 1"
                );
            }
        }
        drop(state);
        let standing = self.standing(node, identity);
        if let Standing::Refused(why) = &standing {
            error!(
                event = events::store::NODE_REFUSED,
                node = %label,
                run_id = %identity.run_id,
                error = %why,
                "Node refused: its answers do not count until this is fixed"
            );
        }
        standing
    }

    /// Forgets node `node` (a cluster's shard that no longer exists under that first slot): the
    /// server it voted for may be taken over by another node, after the hold of a server taken over.
    pub(super) fn retire(&self, node: usize) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if let Some(seen) = state.nodes.remove(&node) {
            if state.owners.get(&seen.run_id) == Some(&node) {
                state.owners.remove(&seen.run_id);
                state.released.insert(seen.run_id, (node, Instant::now()));
            }
        }
    }

    /// The standing now of node `node`, connected to `identity`: refused for what the server is, or as a
    /// second name of a server another node votes for; held off while a hold lasts; else counted.
    pub(super) fn standing(&self, node: usize, identity: &Identity) -> Standing {
        if let Some(why) = identity.refusal(self.shards_of.is_some()) {
            return Standing::Refused(format!("node {} {why}", self.label(node)));
        }
        let now = Instant::now();
        let Ok(mut state) = self.state.lock() else {
            return Standing::Refused("the node registry is poisoned (a bug)".to_string());
        };
        // A check on a connection older than the node's latest (a second connection of the node, still
        // on the server it restarted from): that connection is on its way out, and must change nothing —
        // taking its server's run id back would hold the node off as a name taking over a server.
        if state
            .nodes
            .get(&node)
            .is_some_and(|seen| seen.run_id != identity.run_id)
        {
            return Standing::Refused(format!(
                "node {} answered on a connection to a server it no longer is",
                self.label(node)
            ));
        }
        let owner = match state.owners.get(&identity.run_id) {
            Some(owner) => *owner,
            None => {
                state.owners.insert(identity.run_id.clone(), node);
                let released_by = state.released.remove(&identity.run_id).map(|(by, _)| by);
                if released_by.is_some_and(|by| by != node) {
                    // Another node voted for this server until it stopped reporting it (a changed
                    // resolution): this one waits until every round that counted the other has ended.
                    // The same node coming back to it (a group's master moved back) is still one
                    // vote per round: nothing to wait for.
                    let why = format!(
                        "took over server {} from another node: not counted for {} ms",
                        identity.run_id,
                        self.hold.as_millis()
                    );
                    if let Some(seen) = state.nodes.get_mut(&node) {
                        seen.counts_from = seen.counts_from.max(now + self.hold);
                        seen.why_held = why;
                    }
                }
                node
            }
        };
        if owner != node {
            return Standing::Refused(format!(
                "node {} is the same server as node {} (run_id {}): not counted, so that one server \
                 never votes twice; list each server once in redis.nodes",
                self.label(node),
                self.label(owner),
                identity.run_id
            ));
        }
        let Some(seen) = state.nodes.get(&node) else {
            return Standing::Counted;
        };
        if now < seen.counts_from {
            return Standing::HeldOff(
                format!("node {} {}", self.label(node), seen.why_held),
                seen.counts_from,
            );
        }
        Standing::Counted
    }
}

/// The `INFO` text of a reply.
pub(super) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// The value of `CONFIG GET appendfsync`'s reply (an array or a map of name and value).
pub(super) fn config_value(value: &Value) -> Option<String> {
    match value {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, value)| text(value)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Behind, Identity, Registry, Standing};

    const INFO: &str = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\n# Replication\r\n\
                        role:master\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n# Persistence\r\n\
                        aof_enabled:0\r\n# Cluster\r\ncluster_enabled:0\r\n";

    /// A primary with `noeviction` may vote; a replica, a Cluster node and an evicting server may not, and
    /// each refusal says what to change.
    #[test]
    fn refusals_name_what_to_fix() {
        let primary = Identity::parse(INFO, None).expect("a run id");
        assert_eq!(primary.run_id, "abc123");
        assert_eq!(primary.refusal(false), None);
        assert!(primary
            .refusal(true)
            .unwrap()
            .contains("not a Redis Cluster node"));
        assert_eq!(
            primary.persistence_gap().as_deref(),
            Some("appendonly is off")
        );
        let replica = Identity::parse(&INFO.replace("role:master", "role:slave"), None).unwrap();
        assert!(replica.refusal(false).unwrap().contains("REPLICAOF NO ONE"));
        let lru = INFO.replace("noeviction", "allkeys-lru");
        let evicting = Identity::parse(&lru, None).unwrap();
        assert!(evicting
            .refusal(false)
            .unwrap()
            .contains("CONFIG SET maxmemory-policy noeviction"));
        let cluster = INFO.replace("cluster_enabled:0", "cluster_enabled:1");
        let cluster_node = Identity::parse(&cluster, None).unwrap();
        assert!(cluster_node
            .refusal(false)
            .unwrap()
            .contains("redis.cluster"));
        assert_eq!(cluster_node.refusal(true), None);
        let cluster_replica = cluster.replace("role:master", "role:slave");
        let cluster_replica = Identity::parse(&cluster_replica, None).unwrap();
        assert!(cluster_replica.refusal(true).is_some());
        let aof = INFO.replace("aof_enabled:0", "aof_enabled:1");
        let everysec = Identity::parse(&aof, Some("everysec".to_string())).unwrap();
        assert!(everysec.persistence_gap().unwrap().contains("everysec"));
        let always = Identity::parse(&aof, Some("always".to_string())).unwrap();
        assert_eq!(always.persistence_gap(), None);
        assert_eq!(Identity::parse("# Server\r\n", None), None);
    }

    /// A node's second connection still on the server it restarted from (the reads' connection, say)
    /// changes nothing when it is checked: it is refused, and the node's current connection still counts
    /// (taking the stale run id back as a server taken over from another node would hold the node off
    /// for the lock's TTL: seconds of no majority).
    #[test]
    fn a_connection_to_the_server_a_node_restarted_from_changes_nothing() {
        let registry = Registry::new(
            vec!["n0".into(), "n1".into()],
            Duration::from_secs(2),
            vec![Behind::Server, Behind::Server],
        );
        let aof = INFO.replace("aof_enabled:0", "aof_enabled:1");
        let before = Identity::parse(&aof, Some("always".to_string())).expect("a run id");
        let after = Identity::parse(&aof.replace("abc123", "def456"), Some("always".to_string()))
            .expect("a run id");
        assert!(matches!(registry.admit(0, &before), Standing::Counted));
        assert!(matches!(registry.admit(0, &after), Standing::Counted));
        assert!(matches!(
            registry.standing(0, &before),
            Standing::Refused(why) if why.contains("no longer is")
        ));
        assert!(matches!(registry.standing(0, &after), Standing::Counted));
        // Nor when such a connection is admitted after the node's current one.
        assert!(matches!(
            registry.admit(0, &before),
            Standing::Refused(why) if why.contains("no longer is")
        ));
        assert!(matches!(registry.standing(0, &after), Standing::Counted));
    }

    /// A Sentinel group's new master counts at once when it was promoted from the master this process
    /// knew (its `master_replid2` is that master's `master_replid`) and the group's writes count only
    /// once replicas have them; a new server that continues nothing (the master restarted empty), or any
    /// new server of a node whose writes a replica need not have, is held off as a restart.
    #[test]
    fn a_promoted_replica_of_a_group_counts_at_once_and_nothing_else_does() {
        let zeros = "0000000000000000000000000000000000000000";
        let server = |run: &str, replid: &str, replid2: &str| {
            let info = format!("{INFO}master_replid:{replid}\r\nmaster_replid2:{replid2}\r\n");
            Identity::parse(&info.replace("abc123", run), None).expect("a run id")
        };
        let old = server("run-a", "replid-a", zeros);
        let promoted = server("run-b", "replid-b", "replid-a");
        let restarted = server("run-c", "replid-c", zeros);
        let hold = Duration::from_secs(60);

        let group = Registry::new(
            vec!["g0".into()],
            hold,
            vec![Behind::Group {
                follows_promotions: true,
            }],
        );
        assert!(matches!(group.admit(0, &old), Standing::Counted));
        assert!(matches!(group.admit(0, &promoted), Standing::Counted));
        // Moved back (A → B → A): the first server, promoted from the second, counts at once too,
        // and is no second vote.
        let back = server("run-a", "replid-a2", "replid-b");
        assert!(matches!(group.admit(0, &back), Standing::Counted));
        assert!(matches!(group.standing(0, &back), Standing::Counted));
        assert!(matches!(
            group.admit(0, &restarted),
            Standing::HeldOff(why, _) if why.contains("not promoted from")
        ));

        let without_acks = Registry::new(
            vec!["g0".into()],
            hold,
            vec![Behind::Group {
                follows_promotions: false,
            }],
        );
        assert!(matches!(without_acks.admit(0, &old), Standing::Counted));
        assert!(matches!(
            without_acks.admit(0, &promoted),
            Standing::HeldOff(..)
        ));
        // A promotion from a history of zeros (no master before) continues nothing.
        assert!(!old.continues(zeros));

        // Durable servers: a server's own restart forgot nothing, but another server under a group's
        // name (no promotion from the one known) may hold other data.
        let durable = |run: &str, replid: &str| {
            let info = format!("{INFO}master_replid:{replid}\r\nmaster_replid2:{zeros}\r\n")
                .replace("aof_enabled:0", "aof_enabled:1")
                .replace("abc123", run);
            Identity::parse(&info, Some("always".into())).expect("a run id")
        };
        let (first, second) = (durable("run-d", "replid-d"), durable("run-e", "replid-e"));
        assert!(first.durable() && second.durable());
        let server = Registry::new(vec!["n0".into()], hold, vec![Behind::Server]);
        assert!(matches!(server.admit(0, &first), Standing::Counted));
        assert!(matches!(server.admit(0, &second), Standing::Counted));
        let group = Registry::new(
            vec!["g0".into()],
            hold,
            vec![Behind::Group {
                follows_promotions: true,
            }],
        );
        assert!(matches!(group.admit(0, &first), Standing::Counted));
        assert!(matches!(
            group.admit(0, &second),
            Standing::HeldOff(why, _) if why.contains("not promoted from")
        ));
    }
}
