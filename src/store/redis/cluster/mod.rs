//! A Redis Cluster as the store's one node (`redis.cluster`): each job's keys live on its `{job}` hash
//! slot, so each claim is decided by the master of that slot as a single server decides it, and the
//! cluster's own failover (a replica promoted by the other masters' vote) is followed through the slot
//! map.
//!
//! - **The slot map** is read with `CLUSTER SHARDS` (Redis 7.0 or later) from a known master or a seed:
//!   at the first request, after a `MOVED`, a connection error, a `READONLY` reply, a slot no master
//!   serves or a `WAIT` shortfall, and every [`REFRESH_EVERY`] while the store is in use. What a server
//!   sends is bounded ([`MOST_SHARDS`], [`MOST_NODES`]) and validated before it is used.
//! - **A pipeline is cut per master**: each master is sent the commands on its slots, in their order
//!   (script calls are cut per slot before, by [`super::scripts::Calls`]), with `WAIT` for its replicas
//!   appended, and the answers are put back in the pipeline's order. A master that fails fails only its
//!   own commands (an error value in their places): a dead master costs the claims of its slots only.
//! - **`MOVED` and `ASK`** are followed once within the request: a command that got one did not run.
//!   After `MOVED` the map is read again and the command routed by it; after `ASK` (a slot being
//!   migrated) the command goes to the named master after `ASKING`.
//! - **Each master is identified** as a standalone node is (`INFO`, [`super::admission`]), its standing
//!   kept per shard (a shard is named by the first slot it serves) in a [`Registry`] of the cluster's
//!   own: a replica is never written to, an evicting server never counts, a new master that may lack the
//!   shard's writes is held off for the lock's TTL, and one promoted from the master this process knew
//!   counts at once when writes count only after `WAIT` (`min_replicas_acked` ≥ 1).
//!
//! What a failover can lose, and why `WAIT` for every replica (`min_replicas_acked: all`, the default)
//! keeps every counted claim, is argued in `docs/protocol.md` (*Sentinel groups and Redis Cluster*).

mod send;
mod slots;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{
    AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo as _, RedisConnectionInfo,
    TlsCertificates, Value,
};
use tokio::time::Instant;
use tracing::{info, warn};

pub(crate) use self::send::{Link, Links};
pub use self::slots::slot;
use self::slots::{parse_shards, split, Shard, SlotMap};
use super::admission::Registry;
use super::node::redact;
use crate::config::{ClusterSeeds, ReplicaAcks};
use crate::logging::events;
use crate::store::{GroupState, StoreError};

/// How often the slot map is read again while requests come: a replica that came back (which `WAIT`
/// must then count) or a failover no request has met yet.
const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// The least time between two readings that errors ask for, so that a dead master's errors do not
/// read the map once per request.
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_millis(250);

/// A Redis Cluster: its seeds, how to reach its nodes, its slot map and its shards' standing.
pub(crate) struct Cluster {
    /// `cluster://host:port,…` (never a password).
    label: String,
    /// `(host, port)` of the seeds, asked for the map after the masters already known.
    seeds: Vec<(String, u16)>,
    /// The first seed's user, password (and database 0), used on every node.
    settings: RedisConnectionInfo,
    /// `Some(insecure)` when the nodes are reached over TLS (the first seed is `rediss://`).
    tls: Option<bool>,
    certificates: Option<TlsCertificates>,
    acks: ReplicaAcks,
    registry: Registry,
    map: Mutex<Arc<SlotMap>>,
    /// Held while the map is read, so that one reading is under way at a time.
    reading: tokio::sync::Mutex<()>,
    /// When a reading was last started.
    asked: Mutex<Option<Instant>>,
    /// Per shard (by its first slot): its master as last read, and the failovers seen.
    seen: Mutex<BTreeMap<u16, Seen>>,
    /// How many readings changed the map.
    epoch: AtomicU64,
}

/// What this process has seen of one shard's master.
#[derive(Debug, Clone, Default)]
struct Seen {
    master: String,
    failovers: u64,
    last_failover: Option<chrono::DateTime<chrono::Utc>>,
}

impl Cluster {
    /// The cluster of `config`, its map not read yet (the first request, or [`Cluster::warm_up`],
    /// reads it). Fails only on a seed URL that cannot name a Redis server.
    pub(super) fn new(
        config: &ClusterSeeds,
        certificates: Option<TlsCertificates>,
        hold: Duration,
    ) -> Result<Arc<Cluster>, StoreError> {
        let label = config.label();
        let mut seeds = Vec::new();
        let mut first = None;
        for url in &config.seeds {
            let invalid = |reason: String| StoreError::InvalidNode {
                url: redact(url),
                reason: reason.replace(url.as_str(), &redact(url)),
            };
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|error| invalid(error.to_string()))?;
            let (host, port, tls) = match info.addr() {
                ConnectionAddr::Tcp(host, port) => (host.clone(), *port, None),
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure,
                    ..
                } => (host.clone(), *port, Some(*insecure)),
                _ => return Err(invalid("a cluster node is reached over TCP".to_string())),
            };
            first.get_or_insert((info.redis_settings().clone(), tls));
            seeds.push((host, port));
        }
        let Some((settings, tls)) = first else {
            return Err(StoreError::NoNodes(0));
        };
        let registry = Registry::for_shards(label.clone(), hold, config.min_replicas_acked.any());
        Ok(Arc::new(Cluster {
            label,
            seeds,
            settings,
            tls,
            certificates,
            acks: config.min_replicas_acked,
            registry,
            map: Mutex::default(),
            reading: tokio::sync::Mutex::new(()),
            asked: Mutex::new(None),
            seen: Mutex::default(),
            epoch: AtomicU64::new(0),
        }))
    }

    /// `cluster://host:port,…`.
    pub(super) fn label(&self) -> &str {
        &self.label
    }

    /// Reads the slot map in the background, so that the first round does not wait for it.
    pub(super) fn warm_up(self: &Arc<Self>, bound: Duration) {
        let cluster = Arc::clone(self);
        tokio::spawn(async move { drop(cluster.map(bound).await) });
    }

    /// Each shard's slots and master, and the failovers this process has seen of it.
    pub(super) fn states(&self) -> Vec<GroupState> {
        let map = self.current();
        let seen = self
            .seen
            .lock()
            .map(|seen| seen.clone())
            .unwrap_or_default();
        map.shards
            .iter()
            .map(|shard| {
                let seen = seen.get(&shard.first()).cloned().unwrap_or_default();
                GroupState {
                    group: format!("{} {}", self.label, shard.slots()),
                    master: Some(shard.master.clone()),
                    failovers: seen.failovers,
                    last_failover: seen.last_failover,
                }
            })
            .collect()
    }

    fn current(&self) -> Arc<SlotMap> {
        self.map
            .lock()
            .map(|map| Arc::clone(&map))
            .unwrap_or_default()
    }

    /// Reads the slot map now (within `timeout`) if it never was: whether the cluster can be reached.
    pub(super) async fn identify(&self, timeout: Duration) -> Result<(), String> {
        self.map(timeout).await.map(drop)
    }

    /// The slot map, read now (within `bound`) if it never was.
    async fn map(&self, bound: Duration) -> Result<Arc<SlotMap>, String> {
        let map = self.current();
        if map.read_at.is_some() {
            return Ok(map);
        }
        match tokio::time::timeout(bound, self.read(None)).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "{}: no slot map within {} ms",
                self.label,
                bound.as_millis()
            )),
        }
    }

    /// Reads the map again in the background, unless a reading started less than `within` ago.
    fn refresh(self: &Arc<Self>, within: Duration) {
        let Ok(mut asked) = self.asked.lock() else {
            return;
        };
        if asked.is_some_and(|at| at.elapsed() < within) {
            return;
        }
        // Noted now, not when the reading starts: every request that fails meanwhile would spawn
        // one more reading otherwise.
        *asked = Some(Instant::now());
        drop(asked);
        let cluster = Arc::clone(self);
        tokio::spawn(async move {
            let bound = REFRESH_EVERY;
            drop(tokio::time::timeout(bound, cluster.read(None)).await);
        });
    }

    /// Reads the map from the first master or seed that answers, unless a reading that started after
    /// `since` has already ended; stores it and notes the shards whose master changed.
    async fn read(&self, since: Option<Instant>) -> Result<Arc<SlotMap>, String> {
        let _reading = self.reading.lock().await;
        let current = self.current();
        if let (Some(read_at), Some(since)) = (current.read_at, since) {
            if read_at > since {
                return Ok(current);
            }
        }
        if let Ok(mut asked) = self.asked.lock() {
            *asked = Some(Instant::now());
        }
        let mut candidates: Vec<(String, u16)> = current
            .shards
            .iter()
            .filter_map(|shard| split(&shard.master))
            .collect();
        for seed in &self.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let mut failures = Vec::new();
        for (host, port) in candidates {
            match self.ask_shards(&host, port).await {
                Ok(map) => {
                    let map = Arc::new(map);
                    self.note(&current, &map);
                    if let Ok(mut slot) = self.map.lock() {
                        *slot = Arc::clone(&map);
                    }
                    return Ok(map);
                }
                Err(why) => failures.push(format!("{host}:{port}: {why}")),
            }
        }
        let why = format!(
            "{}: no node gave the slot map: {}",
            self.label,
            failures.join("; ")
        );
        warn!(event = events::store::CLUSTER_MAP_FAILED, node = %self.label, error = %why,
              "Could not read the Redis Cluster's slot map");
        Err(why)
    }

    /// `CLUSTER SHARDS` from `host:port`, parsed.
    async fn ask_shards(&self, host: &str, port: u16) -> Result<SlotMap, String> {
        let client = self.client(host, port)?;
        let exchange = async {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(2)));
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|error| error.to_string())?;
            redis::cmd("CLUSTER")
                .arg("SHARDS")
                .query_async::<Value>(&mut connection)
                .await
                .map_err(|error| match error.to_string() {
                    text if text.contains("unknown subcommand") => {
                        "CLUSTER SHARDS is unknown: redcron needs Redis 7.0 or later".to_string()
                    }
                    text => format!("CLUSTER SHARDS failed: {text}"),
                })
        };
        let reply = tokio::time::timeout(Duration::from_secs(3), exchange)
            .await
            .map_err(|_| "no answer within 3000 ms".to_string())??;
        parse_shards(&reply, self.tls.is_some())
    }

    /// Notes each shard whose master differs in `new` from `old` (a failover, or a shard first seen).
    fn note(&self, old: &SlotMap, new: &SlotMap) {
        if old.shards != new.shards {
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        // A shard named by a first slot that no longer begins one (a resharding moved it): its
        // master may now be another shard's, which takes it over.
        let firsts: HashSet<u16> = new.shards.iter().map(Shard::first).collect();
        let gone: Vec<u16> = seen
            .keys()
            .filter(|first| !firsts.contains(first))
            .copied()
            .collect();
        for first in gone {
            seen.remove(&first);
            self.registry.retire(usize::from(first));
        }
        for shard in &new.shards {
            let entry = seen.entry(shard.first()).or_default();
            if entry.master.is_empty() {
                entry.master = shard.master.clone();
                continue;
            }
            if entry.master != shard.master {
                info!(event = events::store::MASTER_SWITCHED, node = %self.label,
                      shard = %shard.describe(), old_master = %entry.master,
                      "A new master serves the shard's slots");
                entry.master = shard.master.clone();
                entry.failovers += 1;
                entry.last_failover = Some(chrono::Utc::now());
            }
        }
    }

    /// A client for `host:port` with the first seed's credentials and TLS.
    fn client(&self, host: &str, port: u16) -> Result<redis::Client, String> {
        let address = match self.tls {
            Some(insecure) => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure,
                tls_params: None,
            },
            None => ConnectionAddr::Tcp(host.to_string(), port),
        };
        let info = address
            .into_connection_info()
            .map_err(|error| format!("{host}:{port}: {error}"))?
            .set_redis_settings(self.settings.clone());
        let client = match (&self.certificates, self.tls) {
            (Some(certificates), Some(_)) => {
                redis::Client::build_with_tls(info, certificates.clone())
            }
            _ => redis::Client::open(info),
        };
        client.map_err(|error| format!("{host}:{port}: {error}"))
    }
}
