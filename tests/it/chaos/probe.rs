//! Measured node stalls: faults the plan did not inject but the machine did.
//!
//! With `appendfsync always` every write waits for an fsync, and on a shared disk one slow fsync (another
//! process flushing a build) stalls all five nodes at the same moment for 100 ms or more — a majority
//! not answering within `node_timeout`, exactly as if the plan had hung three nodes. The probe is the
//! checker's witness of that: one thread per node sends `PING` every [`PERIOD`] straight to the node
//! (not through the proxy) and records every answer slower than [`STALL`]. The checker counts a node
//! as unusable during a measured stall, and says so when a miss is explained by one.
//!
//! On etcd the probe asks each member for a linearizable read through its JSON gateway (a fresh
//! connection each time, so a restarted member is picked up at once): the member must hear from the
//! leader that it still leads before it answers, so a read stalls on every member during an election
//! or while the leader cannot reach a majority — exactly when a claim cannot commit. A refused
//! connection (a killed member) is the plan's business, as on Redis.
//!
//! On a SQL server the probe commits what a claim commits: an update of one row of a table of its own
//! (`chaos_probe`, as the administrator), in a transaction of its own, which waits for the server's
//! fsync as every claim does. A commit slower than 150 ms, or one without an answer, is a stall; a
//! refused connection (the server killed) is the plan's business.
//!
//! On a Sentinel group the probe writes as a claim does: a `SET` of a key of its own and a `WAIT` for
//! every replica a Sentinel lists and does not think down (`min_replicas_acked: all`), on the master
//! the Sentinels name, so it stalls while the master hangs, while the group fails over (no
//! master answers, or one without a replica: a `WAIT` that sees none), and while a replica's full
//! resynchronisation or an fsync holds the writes up. A write slower than [`GROUP_STALL`] or not
//! acknowledged is a stall of the group, node 0.
//!
//! On a Redis Cluster the probe does the same on every shard each round, on the masters `CLUSTER
//! NODES` names, each write to a key of its shard's slots with a `WAIT` for the shard's replicas that
//! no node thinks failed: a round with a shard unanswered, unacknowledged or slow is a stall of the
//! cluster, node 0.
//!
//! On ZooKeeper the probe writes, as a claim does: a `setData` through each member, answered once the
//! leader has a quorum's acknowledgement, so it stalls during an election as etcd's read does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::harness::now_ms;
use super::store::StoreKind;

/// How often each node is probed.
const PERIOD: Duration = Duration::from_millis(40);
/// An answer slower than this is a stall.
const STALL: Duration = Duration::from_millis(50);
/// An etcd answer slower than this is a stall: a linearizable read is a round to the leader, and a
/// loaded machine makes that tens of milliseconds without any fault.
const ETCD_STALL: Duration = Duration::from_millis(100);
/// A SQL commit slower than this is a stall: it is an fsync on a disk shared with the whole machine.
const SQL_STALL: Duration = Duration::from_millis(150);
/// A Sentinel group's write acknowledged slower than this is a stall: two fsyncs in a row (the master's
/// and the replica's) on the shared disk.
const GROUP_STALL: Duration = Duration::from_millis(100);
/// How often a Sentinel group is probed: each probe is a write every data node fsyncs, and a stall
/// shorter than [`GROUP_STALL`] does not count anyway.
const GROUP_PERIOD: Duration = Duration::from_millis(100);
/// Longest wait for one answer (a hung node is in the plan anyway).
const GIVE_UP: Duration = Duration::from_secs(1);

/// A stall of node `node` during `[from, to]`, Unix ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub node: usize,
    pub from: i64,
    pub to: i64,
}

pub struct Probe {
    stop: Arc<AtomicBool>,
    stalls: Arc<Mutex<Vec<Stall>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Probe {
    /// Starts probing each of `ports` (node `i` at `ports[i]` on loopback) of a `store` cluster.
    pub fn start(ports: &[u16], store: StoreKind) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let stalls = Arc::new(Mutex::new(Vec::new()));
        let threads = ports
            .iter()
            .enumerate()
            .map(|(node, &port)| {
                let (stop, stalls) = (Arc::clone(&stop), Arc::clone(&stalls));
                std::thread::Builder::new()
                    .name(format!("chaos-probe-{node}"))
                    .spawn(move || match store {
                        StoreKind::Redis => probe(node, port, &stop, &stalls),
                        StoreKind::Etcd => probe_etcd(node, port, &stop, &stalls),
                        StoreKind::Zookeeper => probe_zookeeper(node, port, &stop, &stalls),
                        StoreKind::Postgres | StoreKind::Mariadb => {
                            probe_sql(store, port, &stop, &stalls)
                        }
                        StoreKind::RedisSentinel | StoreKind::RedisCluster => {
                            unreachable!(
                                "a group is probed by `Probe::start_group` or `start_cluster`"
                            )
                        }
                    })
                    .expect("cannot start a probe thread")
            })
            .collect();
        Probe {
            stop,
            stalls,
            threads,
        }
    }

    /// Starts probing the Sentinel group whose Sentinels are at `sentinels` (`host:port`) as `master`:
    /// one thread, for node 0.
    pub fn start_group(sentinels: &[String], master: &str) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let stalls = Arc::new(Mutex::new(Vec::new()));
        let (sentinels, master) = (sentinels.to_vec(), master.to_string());
        let thread = {
            let (stop, stalls) = (Arc::clone(&stop), Arc::clone(&stalls));
            std::thread::Builder::new()
                .name("chaos-probe-group".to_string())
                .spawn(move || probe_group(&sentinels, &master, &stop, &stalls))
                .expect("cannot start a probe thread")
        };
        Probe {
            stop,
            stalls,
            threads: vec![thread],
        }
    }

    /// Starts probing the Redis Cluster whose data nodes are at `urls`: one thread, for node 0.
    pub fn start_cluster(urls: Vec<String>) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let stalls = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, stalls) = (Arc::clone(&stop), Arc::clone(&stalls));
            std::thread::Builder::new()
                .name("chaos-probe-cluster".to_string())
                .spawn(move || probe_cluster(&urls, &stop, &stalls))
                .expect("cannot start a probe thread")
        };
        Probe {
            stop,
            stalls,
            threads: vec![thread],
        }
    }

    /// Stops probing and returns the stalls seen, in time order.
    pub fn finish(self) -> Vec<Stall> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
        let mut stalls = self
            .stalls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        stalls.sort_by_key(|s| s.from);
        stalls
    }
}

fn probe(node: usize, port: u16, stop: &AtomicBool, stalls: &Mutex<Vec<Stall>>) {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a loopback URL is valid");
    let mut connection: Option<redis::Connection> = None;
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        if connection.is_none() {
            // A killed node refuses at once; a restarted one is picked up on the next round.
            connection = client.get_connection_with_timeout(GIVE_UP).ok();
            if let Some(c) = &connection {
                let _ = c.set_read_timeout(Some(GIVE_UP));
            }
        }
        if let Some(c) = connection.as_mut() {
            let (sent, started) = (now_ms(), Instant::now());
            let answered = redis::cmd("PING").query::<String>(c).is_ok();
            let took = started.elapsed();
            // A dropped connection (killed node) is the plan's business; a slow answer is a stall.
            if took > STALL {
                let mut all = stalls.lock().unwrap_or_else(|p| p.into_inner());
                all.push(Stall {
                    node,
                    from: sent,
                    to: sent + took.as_millis() as i64,
                });
            }
            if !answered {
                connection = None;
            }
        }
        std::thread::sleep(PERIOD.saturating_sub(tick.elapsed()));
    }
}

fn probe_etcd(node: usize, port: u16, stop: &AtomicBool, stalls: &Mutex<Vec<Stall>>) {
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        let refused = std::net::TcpStream::connect(("127.0.0.1", port)).is_err();
        if !refused {
            let (sent, started) = (now_ms(), Instant::now());
            let answered = crate::support::linearizable_read(port, GIVE_UP);
            let took = started.elapsed();
            // A member without a leader may also refuse the read at once: that is a stall too, until the
            // next probe.
            if took > ETCD_STALL || !answered {
                let mut all = stalls.lock().unwrap_or_else(|p| p.into_inner());
                all.push(Stall {
                    node,
                    from: sent,
                    to: sent + took.max(PERIOD).as_millis() as i64,
                });
            }
        }
        std::thread::sleep(PERIOD.saturating_sub(tick.elapsed()));
    }
}

/// Probes the ZooKeeper member on `port` with one write every [`PERIOD`]: a `setData` of the probe's node
/// in a session of its own on that member, which the member forwards to the leader and answers once a
/// quorum committed it — as every claim is. A write slower than [`ETCD_STALL`], or one without an answer
/// (an election, a leader that cannot reach a quorum), is a stall; a refused connection (a killed
/// member) is the plan's business, and a session lost with its member is made again next time.
fn probe_zookeeper(node: usize, port: u16, stop: &AtomicBool, stalls: &Mutex<Vec<Stall>>) {
    use testkit::zookeeper::{WireError, ZkSession, NO_NODE};

    let path = format!("/chaos-probe-{node}");
    let mut session: Option<ZkSession> = None;
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        let refused = std::net::TcpStream::connect(("127.0.0.1", port)).is_err();
        if refused {
            session = None;
        } else {
            let (sent, started) = (now_ms(), Instant::now());
            if session.is_none() {
                session = ZkSession::connect(port, GIVE_UP * 2).ok();
            }
            let answered = session
                .as_mut()
                .is_some_and(|s| match s.set_data(&path, b"probe") {
                    Err(WireError::Code(NO_NODE)) => s.create(&path, b"probe").is_ok(),
                    other => other.is_ok(),
                });
            let took = started.elapsed();
            if took > ETCD_STALL || !answered {
                let mut all = stalls.lock().unwrap_or_else(|p| p.into_inner());
                all.push(Stall {
                    node,
                    from: sent,
                    to: sent + took.max(PERIOD).as_millis() as i64,
                });
            }
            if !answered {
                session = None;
            }
        }
        std::thread::sleep(PERIOD.saturating_sub(tick.elapsed()));
    }
}

/// Probes a Sentinel group every [`GROUP_PERIOD`] with a write that must reach a replica, as a claim's (see
/// the module): on the master a Sentinel names, looked up again after every failed write.
fn probe_group(sentinels: &[String], master: &str, stop: &AtomicBool, stalls: &Mutex<Vec<Stall>>) {
    let connect = |url: &str| {
        let client = redis::Client::open(url).ok()?;
        let connection = client.get_connection_with_timeout(GIVE_UP).ok()?;
        connection.set_read_timeout(Some(GIVE_UP)).ok()?;
        Some(connection)
    };
    let find_master = || {
        sentinels.iter().find_map(|sentinel| {
            let mut connection = connect(&format!("redis://{sentinel}"))?;
            let (host, port): (String, u16) = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(master)
                .query(&mut connection)
                .ok()?;
            connect(&format!("redis://{host}:{port}"))
        })
    };
    // As `min_replicas_acked: all` counts them: the replicas a Sentinel lists and does not think down.
    let replicas_up = || {
        sentinels.iter().find_map(|sentinel| {
            let mut connection = connect(&format!("redis://{sentinel}"))?;
            let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(master)
                .query(&mut connection)
                .ok()?;
            let up = replicas.iter().filter(|fields| {
                fields
                    .chunks(2)
                    .find(|pair| pair[0] == "flags")
                    .and_then(|pair| pair.get(1))
                    .is_some_and(|flags| {
                        !flags
                            .split(',')
                            .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
                    })
            });
            Some(up.count().max(1))
        })
    };
    let mut connection: Option<redis::Connection> = None;
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        let (sent, started) = (now_ms(), Instant::now());
        if connection.is_none() {
            connection = find_master();
        }
        let needed = replicas_up().unwrap_or(1);
        let acknowledged = connection.as_mut().is_some_and(|c| {
            let reply: redis::RedisResult<((), i64)> = redis::pipe()
                .cmd("SET")
                .arg("chaos-probe")
                .arg(sent)
                .cmd("WAIT")
                .arg(needed)
                .arg(GIVE_UP.as_millis() as u64)
                .query(c);
            matches!(reply, Ok((_, acked)) if acked >= needed as i64)
        });
        let took = started.elapsed();
        if took > GROUP_STALL || !acknowledged {
            let mut all = stalls.lock().unwrap_or_else(|p| p.into_inner());
            all.push(Stall {
                node: 0,
                from: sent,
                to: sent + took.max(GROUP_PERIOD).as_millis() as i64,
            });
        }
        if !acknowledged {
            // A demoted master, a dropped connection: the Sentinels are asked again.
            connection = None;
        }
        std::thread::sleep(GROUP_PERIOD.saturating_sub(tick.elapsed()));
    }
}

/// One shard as the cluster's probe writes to it: its master's address, a key of its slots, and how
/// many replicas `min_replicas_acked: all` waits for (those no node thinks failed, at least one).
struct ProbedShard {
    master: String,
    key: String,
    replicas_up: usize,
}

/// The shards as the first node of `urls` to answer sees them (`CLUSTER NODES`), trying `first` before
/// the others (the node that answered last); `None` if none answers.
fn cluster_view(urls: &[String], first: &mut usize) -> Option<Vec<ProbedShard>> {
    let order = (0..urls.len()).map(|i| (*first + i) % urls.len());
    let (answered, text) = order.into_iter().find_map(|i| {
        let mut connection = connect_to(&urls[i])?;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut connection)
            .ok()?;
        Some((i, text))
    })?;
    *first = answered;
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    let failed = |flags: &str| flags.split(',').any(|f| f == "fail" || f == "fail?");
    let shards = lines
        .iter()
        .filter(|f| f.len() > 8 && f[2].contains("master") && !failed(f[2]))
        .filter_map(|f| {
            let first_slot: u16 = f[8].split('-').next()?.parse().ok()?;
            let key = (0u32..)
                .map(|n| format!("chaos-probe{{{n}}}"))
                .find(|key| testkit::slot_of(key) == first_slot)?;
            let replicas_up = lines
                .iter()
                .filter(|r| r.len() > 3 && r[3] == f[0] && !failed(r[2]))
                .count();
            Some(ProbedShard {
                master: format!("redis://{}", f[1].split('@').next()?),
                key,
                replicas_up: replicas_up.max(1),
            })
        })
        .collect();
    Some(shards)
}

fn connect_to(url: &str) -> Option<redis::Connection> {
    let client = redis::Client::open(url).ok()?;
    let connection = client.get_connection_with_timeout(GIVE_UP).ok()?;
    connection.set_read_timeout(Some(GIVE_UP)).ok()?;
    Some(connection)
}

/// Probes a Redis Cluster every [`GROUP_PERIOD`] with a write to every shard that must reach its
/// replicas, as a claim's: a `SET` of a key of the shard's slots and a `WAIT` for the replicas no node
/// thinks failed, on the master the cluster names. A round in which a shard has no master that
/// answers so, any write is slower than [`GROUP_STALL`], or the cluster serves fewer masters than
/// `masters` is a stall of the cluster, node 0.
fn probe_cluster(urls: &[String], stop: &AtomicBool, stalls: &Mutex<Vec<Stall>>) {
    let mut first = 0;
    let mut masters: std::collections::HashMap<String, redis::Connection> = Default::default();
    let mut expected = 0;
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        let (sent, started) = (now_ms(), Instant::now());
        let shards = cluster_view(urls, &mut first).unwrap_or_default();
        expected = expected.max(shards.len());
        let mut acknowledged = shards.len() == expected;
        for shard in &shards {
            if !masters.contains_key(&shard.master) {
                match connect_to(&shard.master) {
                    Some(connection) => masters.insert(shard.master.clone(), connection),
                    None => {
                        acknowledged = false;
                        continue;
                    }
                };
            }
            let Some(connection) = masters.get_mut(&shard.master) else {
                continue;
            };
            let reply: redis::RedisResult<((), i64)> = redis::pipe()
                .cmd("SET")
                .arg(&shard.key)
                .arg(sent)
                .cmd("WAIT")
                .arg(shard.replicas_up)
                .arg(GIVE_UP.as_millis() as u64)
                .query(connection);
            if !matches!(reply, Ok((_, acked)) if acked >= shard.replicas_up as i64) {
                // A demoted master, a dropped connection: connected again next round.
                masters.remove(&shard.master);
                acknowledged = false;
            }
        }
        let took = started.elapsed();
        if took > GROUP_STALL || !acknowledged {
            let mut all = stalls.lock().unwrap_or_else(|p| p.into_inner());
            all.push(Stall {
                node: 0,
                from: sent,
                to: sent + took.max(GROUP_PERIOD).as_millis() as i64,
            });
        }
        std::thread::sleep(GROUP_PERIOD.saturating_sub(tick.elapsed()));
    }
}

/// Probes the SQL server of `store` on `port` with one committed update every [`PERIOD`] (see the module).
fn probe_sql(store: StoreKind, port: u16, stop: &AtomicBool, stalls: &Mutex<Vec<Stall>>) {
    use sqlx::Connection as _;
    use testkit::sql::{ADMIN, ADMIN_PASSWORD, DATABASE};

    let kind = store.sql_kind().expect("a SQL store");
    let (scheme, plain) = match kind {
        testkit::SqlKind::Postgres => ("postgres", "sslmode=disable"),
        testkit::SqlKind::Mariadb => ("mysql", "ssl-mode=DISABLED"),
    };
    let url = format!("{scheme}://{ADMIN}:{ADMIN_PASSWORD}@127.0.0.1:{port}/{DATABASE}?{plain}");
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    sqlx::any::install_default_drivers();
    let mut connection: Option<sqlx::AnyConnection> = None;
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        if connection.is_none() {
            let connect =
                async { tokio::time::timeout(GIVE_UP, sqlx::AnyConnection::connect(&url)).await };
            connection = runtime.block_on(connect).ok().and_then(Result::ok);
        }
        if let Some(c) = connection.as_mut() {
            let (sent, started) = (now_ms(), Instant::now());
            let update = async {
                let statement = sqlx::query("UPDATE chaos_probe SET n = n + 1 WHERE id = 1");
                tokio::time::timeout(GIVE_UP, statement.execute(c)).await
            };
            let answered = matches!(runtime.block_on(update), Ok(Ok(_)));
            let took = started.elapsed();
            if took > SQL_STALL || !answered {
                let mut all = stalls.lock().unwrap_or_else(|p| p.into_inner());
                all.push(Stall {
                    node: 0,
                    from: sent,
                    to: sent + took.max(PERIOD).as_millis() as i64,
                });
            }
            if !answered {
                // A connection that timed out may be mid-statement: a new one next time.
                connection = None;
            }
        }
        std::thread::sleep(PERIOD.saturating_sub(tick.elapsed()));
    }
}
