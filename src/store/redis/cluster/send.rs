//! Sending a pipeline to a Redis Cluster: each command to the master of its slot, with `WAIT` for
//! that master's replicas, its redirections followed once, and the answers put back in order; each
//! master's connection identified and its standing kept per shard.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, Value};
use tokio::time::Instant;

use super::slots::{route, split, Route, Shard, SlotMap};
use super::{Cluster, REFRESH_AT_MOST_EVERY, REFRESH_EVERY};
use crate::config::ReplicaAcks;
use crate::store::redis::admission::{Identity, Standing, RECHECK};
use crate::store::redis::node::{identify, is_readonly, send_loading_scripts, with_wait};

/// How many masters' connections one node keeps; beyond this, those no longer in the map are closed.
const MOST_LINKS: usize = 256;

/// One node's connections to the cluster's masters, by `host:port`.
#[derive(Default)]
pub(crate) struct Links(Mutex<HashMap<String, Connecting>>);

/// A master's connection being opened and identified, shared by every request that waits for it.
type Connecting = Shared<BoxFuture<'static, Result<Arc<Master>, String>>>;

/// An open connection to a master, identified.
struct Master {
    connection: MultiplexedConnection,
    address: String,
    identity: Mutex<Identity>,
    /// When the checks were last read.
    checked: Mutex<Instant>,
    /// The shards this server was admitted for in the registry.
    admitted: Mutex<HashSet<u16>>,
}

impl Master {
    fn identity(&self) -> Identity {
        self.identity
            .lock()
            .map(|identity| identity.clone())
            .unwrap_or_default()
    }
}

/// What a node lends the cluster for one request: its connections and its connection settings.
pub(crate) struct Link<'a> {
    pub(crate) masters: &'a Links,
    pub(crate) config: &'a AsyncConnectionConfig,
    pub(crate) connect_timeout: Duration,
    pub(crate) node_timeout: Duration,
}

impl Cluster {
    /// The connection to the master at `address` in `link`, or the one on its way.
    fn master(&self, link: &Link<'_>, address: &str, map: &SlotMap) -> Connecting {
        let Ok(mut masters) = link.masters.0.lock() else {
            return async { Err("the cluster's connection lock is poisoned (a bug)".to_string()) }
                .boxed()
                .shared();
        };
        if let Some(current) = masters.get(address) {
            if !matches!(current.peek(), Some(Err(_))) {
                return current.clone();
            }
        }
        if masters.len() >= MOST_LINKS {
            masters.retain(|known, _| map.shard_at(known).is_some());
        }
        let client = split(address).map(|(host, port)| self.client(&host, port));
        let key = address.to_string();
        let (config, bound, address) = (
            link.config.clone(),
            link.connect_timeout,
            address.to_string(),
        );
        let opening = async move {
            let client = client.ok_or_else(|| format!("{address} is not host:port"))??;
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|error| format!("master {address}: {error}"))?;
            let identity = tokio::time::timeout(bound, identify(&mut connection))
                .await
                .map_err(|_| {
                    format!(
                        "master {address}: INFO: no answer within {} ms",
                        bound.as_millis()
                    )
                })?
                .map_err(|why| format!("master {address}: {why}"))?;
            Ok(Arc::new(Master {
                connection,
                address,
                identity: Mutex::new(identity),
                checked: Mutex::new(Instant::now()),
                admitted: Mutex::default(),
            }))
        }
        .boxed()
        .shared();
        tokio::spawn(opening.clone().map(|_| ()));
        masters.insert(key, opening.clone());
        opening
    }

    /// Forgets `master`'s connection after it failed or its server stopped being a master.
    fn drop_master(link: &Link<'_>, master: &Arc<Master>) {
        let Ok(mut masters) = link.masters.0.lock() else {
            return;
        };
        let is_current = matches!(
            masters.get(&master.address).and_then(|current| current.peek()),
            Some(Ok(current)) if Arc::ptr_eq(current, master)
        );
        if is_current {
            masters.remove(&master.address);
        }
    }

    /// Reads the checks again on `master` in the background, when the last reading is older than
    /// [`RECHECK`] (a `CLUSTER FAILOVER` or `CONFIG SET` changes nothing on the connection).
    fn recheck(self: &Arc<Self>, master: &Arc<Master>) {
        let Ok(mut checked) = master.checked.lock() else {
            return;
        };
        if checked.elapsed() < RECHECK {
            return;
        }
        *checked = Instant::now();
        let (cluster, master) = (Arc::clone(self), Arc::clone(master));
        tokio::spawn(async move {
            let mut connection = master.connection.clone();
            let Ok(Ok(identity)) = tokio::time::timeout(RECHECK, identify(&mut connection)).await
            else {
                return;
            };
            if identity == master.identity() {
                return;
            }
            let shards: Vec<u16> = master
                .admitted
                .lock()
                .map(|admitted| admitted.iter().copied().collect())
                .unwrap_or_default();
            for shard in shards {
                cluster.registry.admit(usize::from(shard), &identity);
            }
            if let Ok(mut current) = master.identity.lock() {
                *current = identity;
            }
        });
    }

    /// How many replicas must acknowledge `shard`'s writes.
    fn acks_for(&self, shard: &Shard) -> u32 {
        match self.acks {
            ReplicaAcks::All => shard.replicas_up.max(1),
            ReplicaAcks::Exactly(n) => n,
        }
    }

    /// Sends `pipeline` to the cluster, each command to the master of its slot, within `deadline`:
    /// one value per command, in order — the command's answer, or an error value that says why its
    /// master's answer does not count (the master failed, is held off or refused, or `WAIT` fell
    /// short).
    pub(crate) async fn eval(
        self: &Arc<Self>,
        link: &Link<'_>,
        pipeline: &Pipeline,
        deadline: Instant,
    ) -> Vec<Value> {
        let commands: Vec<&Cmd> = pipeline.cmd_iter().collect();
        let bound = deadline.saturating_duration_since(Instant::now());
        let map = match self.map(bound.min(link.connect_timeout)).await {
            Ok(map) => map,
            Err(why) => return commands.iter().map(|_| error_value(&why)).collect(),
        };
        if map
            .read_at
            .is_some_and(|read_at| read_at.elapsed() >= REFRESH_EVERY)
        {
            self.refresh(REFRESH_EVERY);
        }
        let mut values: Vec<Option<Value>> = commands.iter().map(|_| None).collect();
        let everything: Vec<usize> = (0..commands.len()).collect();
        self.route_and_send(link, &map, &commands, &everything, &mut values, deadline)
            .await;
        // A `MOVED`: the map was stale. Read it again (once), and send those commands by it.
        let moved: Vec<usize> = redirected(&values, "MOVED");
        if !moved.is_empty() && Instant::now() < deadline {
            let since = map.read_at;
            let map = match tokio::time::timeout_at(deadline, self.read(since)).await {
                Ok(Ok(map)) => map,
                _ => Arc::clone(&map),
            };
            self.route_and_send(link, &map, &commands, &moved, &mut values, deadline)
                .await;
        }
        // An `ASK`: the slot is migrating; its key is on the named master, asked with `ASKING`.
        let asked: Vec<usize> = redirected(&values, "ASK");
        let mut by_target: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for index in asked {
            if let Some(target) = values[index].as_ref().and_then(target_of) {
                by_target.entry(target).or_default().push(index);
            }
        }
        let (map, commands) = (&map, &commands);
        let sends = by_target.into_iter().filter_map(|(target, indices)| {
            let shard = map
                .shard_at(&target)
                .map(|shard| map.shards[shard].clone())?;
            Some(async move {
                let answer = self
                    .send(link, map, &shard, commands, &indices, true, deadline)
                    .await;
                (indices, answer)
            })
        });
        for (indices, answer) in join_all(sends).await {
            fill(&mut values, &indices, answer);
        }
        values
            .into_iter()
            .map(|value| value.unwrap_or_else(|| error_value("no answer (a bug)")))
            .collect()
    }

    /// Sends the commands `indices` of `commands` to their masters by `map`, filling `values`.
    async fn route_and_send(
        self: &Arc<Self>,
        link: &Link<'_>,
        map: &SlotMap,
        commands: &[&Cmd],
        indices: &[usize],
        values: &mut [Option<Value>],
        deadline: Instant,
    ) {
        let mut per_shard: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &index in indices {
            let shard = match route(commands[index]) {
                Route::Slot(slot) => map.shard_of(slot).ok_or_else(|| {
                    self.refresh(REFRESH_AT_MOST_EVERY);
                    format!(
                        "{}: slot {slot} is served by no master in the slot map",
                        self.label
                    )
                }),
                Route::Any if !map.shards.is_empty() => Ok(0),
                Route::Any => Err(format!("{}: the slot map has no master", self.label)),
                Route::Spans => Err(
                    "a command's keys are on several slots, which no Redis Cluster master runs \
                     (a bug)"
                        .to_string(),
                ),
            };
            match shard {
                Ok(shard) => per_shard.entry(shard).or_default().push(index),
                Err(why) => values[index] = Some(error_value(&why)),
            }
        }
        let sends = per_shard.into_iter().map(|(shard, indices)| async move {
            let shard = &map.shards[shard];
            let answer = self
                .send(link, map, shard, commands, &indices, false, deadline)
                .await;
            (indices, answer)
        });
        for (indices, answer) in join_all(sends).await {
            fill(values, &indices, answer);
        }
    }

    /// Sends the commands `indices` of `commands` to `shard`'s master (after `ASKING` each, with
    /// `asking`), with `WAIT` for its replicas: their values, or why the master's answer does not
    /// count.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        self: &Arc<Self>,
        link: &Link<'_>,
        map: &SlotMap,
        shard: &Shard,
        commands: &[&Cmd],
        indices: &[usize],
        asking: bool,
        deadline: Instant,
    ) -> Result<Vec<Value>, String> {
        let name = format!("{} {}", self.label, shard.describe());
        let no_answer = || {
            let left = deadline.saturating_duration_since(Instant::now());
            format!(
                "{name}: no answer within the round ({} ms left)",
                left.as_millis()
            )
        };
        let master =
            match tokio::time::timeout_at(deadline, self.master(link, &shard.master, map)).await {
                Ok(Ok(master)) => master,
                Ok(Err(why)) => {
                    self.refresh(REFRESH_AT_MOST_EVERY);
                    return Err(format!("{name}: {why}"));
                }
                Err(_) => return Err(no_answer()),
            };
        self.recheck(&master);
        let identity = master.identity();
        let index = usize::from(shard.first());
        let first_time = master
            .admitted
            .lock()
            .map(|mut admitted| admitted.insert(shard.first()))
            .unwrap_or(false);
        if first_time {
            self.registry.admit(index, &identity);
        }
        if let Standing::Refused(why) = self.registry.standing(index, &identity) {
            // A master demoted (a failover) or otherwise unfit: the map says who serves now.
            Self::drop_master(link, &master);
            self.refresh(REFRESH_AT_MOST_EVERY);
            return Err(why);
        }
        let acks = self.acks_for(shard);
        let mut pipeline = redis::pipe();
        for &index in indices {
            if asking {
                pipeline.cmd("ASKING");
            }
            pipeline.add_command(commands[index].clone());
        }
        if acks > 0 {
            pipeline = with_wait(&pipeline, acks, deadline, link.node_timeout);
        }
        let mut connection = master.connection.clone();
        let exchange = send_loading_scripts(&pipeline, &mut connection);
        let mut values = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok(values)) => values,
            Ok(Err(error)) => {
                let demoted = is_readonly(&error.to_string());
                if error.is_unrecoverable_error() || error.is_io_error() || demoted {
                    Self::drop_master(link, &master);
                    self.refresh(REFRESH_AT_MOST_EVERY);
                }
                return Err(format!("{name}: {error}"));
            }
            Err(_) => return Err(no_answer()),
        };
        let expected = indices.len() * if asking { 2 } else { 1 } + usize::from(acks > 0);
        if values.len() != expected {
            return Err(format!(
                "{name}: answered {} results for {expected} commands",
                values.len()
            ));
        }
        if acks > 0 {
            let acked = match values.pop() {
                Some(Value::Int(acked)) => acked,
                _ => -1,
            };
            if acked < i64::from(acks) {
                // The writes landed on the master, but a failover may promote a replica without
                // them: they do not count. A replica down, or a master cut off from its replicas
                // (the cluster may be promoting one): the map is read again.
                self.refresh(REFRESH_AT_MOST_EVERY);
                return Err(format!(
                    "{name} has the writes, but WAIT saw {} of the {acks} replicas it needs within \
                     the round: not counted",
                    acked.max(0)
                ));
            }
        }
        if asking {
            values = values.into_iter().skip(1).step_by(2).collect();
        }
        if values
            .iter()
            .any(|value| matches!(value, Value::ServerError(e) if is_readonly(&format!("{e:?}"))))
        {
            Self::drop_master(link, &master);
            self.refresh(REFRESH_AT_MOST_EVERY);
            return Err(format!(
                "{name}: master {} became a replica (READONLY): reading the slot map again",
                master.address
            ));
        }
        // Decided after the answer too, as for a single node ([`super::node::Node::eval`]).
        match self.registry.standing(index, &identity) {
            Standing::Counted => Ok(values),
            Standing::HeldOff(why, _) | Standing::Refused(why) => Err(why),
        }
    }
}

/// Puts `answer` (one value per index, or why they all failed) into `values` at `indices`.
fn fill(values: &mut [Option<Value>], indices: &[usize], answer: Result<Vec<Value>, String>) {
    match answer {
        Ok(answers) => {
            for (&index, value) in indices.iter().zip(answers) {
                values[index] = Some(value);
            }
        }
        Err(why) => {
            for &index in indices {
                values[index] = Some(error_value(&why));
            }
        }
    }
}

/// The indices whose value is a `code` redirection (`MOVED` or `ASK`).
fn redirected(values: &[Option<Value>], code: &str) -> Vec<usize> {
    values
        .iter()
        .enumerate()
        .filter(
            |(_, value)| matches!(value, Some(Value::ServerError(error)) if error.code() == code),
        )
        .map(|(index, _)| index)
        .collect()
}

/// The `host:port` a redirection names (`MOVED 3999 127.0.0.1:6381`).
fn target_of(value: &Value) -> Option<String> {
    let Value::ServerError(error) = value else {
        return None;
    };
    let target = error.details()?.split_whitespace().nth(1)?;
    split(target).map(|(host, port)| format!("{host}:{port}"))
}

/// An error value in a command's place: what [`super::round`] and the readers count as that command
/// failed, with `why` (one line; never a password: `why` names nodes by address only).
fn error_value(why: &str) -> Value {
    let line: String = why
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect();
    redis::parse_redis_value(format!("-CLUSTER {line}\r\n").as_bytes()).unwrap_or(Value::Nil)
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::target_of;

    /// A redirection names where the key is.
    #[test]
    fn a_redirection_names_its_target() {
        let moved = redis::parse_redis_value(b"-MOVED 3999 127.0.0.1:6381\r\n").unwrap();
        assert_eq!(target_of(&moved).as_deref(), Some("127.0.0.1:6381"));
        let Value::ServerError(error) = &moved else {
            panic!("not an error: {moved:?}")
        };
        assert_eq!(error.code(), "MOVED");
        assert_eq!(target_of(&Value::Okay), None);
    }
}
