//! The cluster under test and the hand that breaks it: 5 lock nodes (append-only, fsync always), one of
//! them behind the [`Proxy`], 3 etcd members, one PostgreSQL or MariaDB server, 3 ZooKeeper members, or
//! one Sentinel group, or a Redis Cluster of 3 masters with a replica each ([`nodes`]); the [`Ledger`];
//! 4 worker processes with their clocks; and the executor that carries out a [`Plan`], writing down in a [`Timeline`] what it
//! did and when.
//!
//! - [`journal`]: each worker process's events, stamped with their real arrival time;
//! - [`executor`]: the plan carried out, fault by fault, into the timeline;
//! - [`rollout`]: a rolling config change, one worker at a time;
//! - [`ghost`]: a crashed contender's keys, written straight into the nodes;
//! - [`garbage`]: garbage planted straight into the store;
//! - [`config`]: the workers' jobs file (two versions) and clocks;
//! - [`nodes`]: the store's processes: Redis nodes, etcd or ZooKeeper members, a SQL server, a Sentinel
//!   group's or a Redis Cluster's data nodes.

mod config;
mod executor;
mod garbage;
mod ghost;
mod journal;
mod nodes;
mod rollout;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use self::config::{config, faketime_spec};
use self::journal::{follow, Journal};
use self::nodes::Nodes;
use super::claims::{self, ClaimWrite};
use super::facts::InstanceLog;
use super::ledger::Ledger;
use super::plan::{Plan, JUMPER, PROXIED_NODE, VERSIONS, WORKERS};
use super::probe::{Probe, Stall};
use super::proxy::Proxy;
use super::store::{StoreKind, GROUP_ACKS, GROUP_DATA_NODES};
use super::timeline::{Happening, Timeline};
use crate::support::libfaketime;
use crate::support::{EtcdCluster, Persistence, RedisCluster, SentinelGroup, TestDir, Worker};
use testkit::sharded::ShardedRedis;
use testkit::{SqlServer, ZkEnsemble};

/// The job that outlives the TTL.
pub const LONG_JOB: &str = "long";
/// How long the long job runs between its first and its last write.
pub const LONG_MS: u64 = 5_500;
/// The workers' shutdown grace: running jobs may finish within it.
const SHUTDOWN_GRACE_S: u64 = 15;
/// A worker gets its shutdown grace, then its jobs' SIGTERM-to-SIGKILL grace, to exit after SIGTERM.
const EXIT_LIMIT: Duration = Duration::from_secs(SHUTDOWN_GRACE_S + 15);
/// The misfire grace of every job: above the largest clock offset (3 s), so late workers still race.
pub const GRACE_S: u64 = 5;

/// Real time, Unix ms.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A way to break the cluster on purpose, to see the checker fail (`REDCRON_CHAOS_BREAK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    /// Workers 0-1 list nodes 0-2 and workers 2-3 list nodes 2-4: each counts a "majority" of 2 of its 3,
    /// which is what counting reachable instead of configured nodes does in a partition (Redis only:
    /// etcd members answer for their cluster, whichever a worker lists).
    SplitQuorum,
    /// The long job escapes the worker's process group (`setsid`), so a worker that lost its lease cannot
    /// stop it: the job goes on without its lease, as if the lease-loss stop were missing. (Ignoring
    /// SIGTERM no longer does that: SIGKILL follows by the lease's deadline.)
    EscapeStop,
}

impl Breakage {
    pub fn parse(text: &str) -> Option<Breakage> {
        match text {
            "split-quorum" => Some(Breakage::SplitQuorum),
            "escape-stop" => Some(Breakage::EscapeStop),
            _ => None,
        }
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Stopped,
    Killed,
    ShutDown,
}

/// One worker process.
struct Instance {
    worker: usize,
    handle: Arc<Worker>,
    recorder: Option<JoinHandle<()>>,
    state: State,
}
/// The cluster under test.
pub struct Cluster {
    pub dir: TestDir,
    nodes: Nodes,
    /// In front of [`PROXIED_NODE`], on Redis only.
    pub proxy: Option<Proxy>,
    pub ledger: Ledger,
    /// Per worker, its jobs file in each config version.
    configs: Vec<[PathBuf; VERSIONS]>,
    /// Per worker, the config version its next process starts on.
    versions: [usize; WORKERS],
    offsets: [i64; WORKERS],
    clock_file: PathBuf,
    instances: Vec<Instance>,
    journal: Arc<Journal>,
    pub timeline: Timeline,
    probe: Option<Probe>,
    /// Workers that did not exit in time after SIGTERM at the end.
    pub slow_exits: Vec<String>,
    /// Workers that exited before the end without the harness stopping them.
    pub unplanned_exits: Vec<String>,
    /// The stalls the probe measured, once it is finished.
    pub stalls: Vec<Stall>,
    /// Real time when the workers were all up and the plan started.
    pub started_ms: i64,
}

impl Cluster {
    /// Starts the nodes, the proxy, the ledger and the workers; returns once every worker has logged
    /// `worker.started`.
    pub fn start(plan: &Plan, breakage: Option<Breakage>) -> Cluster {
        crate::support::require_program("redis-cli", "redis-tools");
        let store = plan.store;
        let dir = TestDir::new();
        let (nodes, proxy, urls) = match store {
            StoreKind::Redis => {
                let nodes = RedisCluster::builder()
                    .nodes(store.nodes())
                    .persistence(Persistence::AppendOnlyAlways)
                    .start();
                for node in 0..nodes.len() {
                    watch_latency(&nodes, node);
                }
                let proxy = Proxy::start(nodes.port(PROXIED_NODE), plan.seed);
                let mut urls = nodes.urls();
                urls[PROXIED_NODE] = proxy.url();
                (Nodes::Redis(nodes), Some(proxy), urls)
            }
            StoreKind::Etcd => {
                assert!(
                    breakage != Some(Breakage::SplitQuorum),
                    "split-quorum breaks Redis quorums; etcd members answer for their cluster"
                );
                let members = EtcdCluster::with_members(store.nodes());
                let endpoints = members.endpoints();
                (Nodes::Etcd(members), None, endpoints)
            }
            StoreKind::Postgres | StoreKind::Mariadb => {
                assert!(
                    breakage != Some(Breakage::SplitQuorum),
                    "split-quorum breaks Redis quorums; a SQL store is one server"
                );
                let server = SqlServer::start(store.sql_kind().expect("a SQL store"));
                super::sql_claims::record_grants(&server);
                let url = server.url();
                (Nodes::Sql(server), None, vec![url])
            }
            StoreKind::Zookeeper => {
                assert!(
                    breakage != Some(Breakage::SplitQuorum),
                    "split-quorum breaks Redis quorums; ZooKeeper members answer for their ensemble"
                );
                let members = ZkEnsemble::start(store.nodes());
                let hosts = members.addresses();
                (Nodes::Zookeeper(members), None, hosts)
            }
            StoreKind::RedisSentinel => {
                assert!(
                    breakage != Some(Breakage::SplitQuorum),
                    "split-quorum breaks Redis quorums; a Sentinel group is one node"
                );
                // Every data node keeps the history of its append-only file: a replica's full
                // resynchronisation rewrites it, and the checker reads every write ever made
                // ([`super::claims::read_group`]).
                let group = SentinelGroup::builder()
                    .replicas(GROUP_DATA_NODES - 1)
                    .sentinels(3)
                    .persistence(Persistence::AppendOnlyAlways)
                    .data_config("aof-disable-auto-gc", "yes")
                    .start();
                for node in 0..group.data.len() {
                    watch_latency(&group.data, node);
                }
                let node = group.node_yaml();
                (Nodes::Sentinel(Box::new(group)), None, vec![node])
            }
            StoreKind::RedisCluster => {
                assert!(
                    breakage != Some(Breakage::SplitQuorum),
                    "split-quorum breaks Redis quorums; a Redis Cluster is one node"
                );
                // As a Sentinel group's: the history of every data node's append-only file is kept.
                let cluster = ShardedRedis::builder()
                    .config("aof-disable-auto-gc", "yes")
                    .start();
                for node in 0..cluster.len() {
                    watch_latency(cluster.nodes(), node);
                }
                let field = cluster.cluster_yaml();
                (Nodes::Sharded(cluster), None, vec![field])
            }
        };
        let probe = match &nodes {
            Nodes::Sentinel(group) => {
                Probe::start_group(&group.sentinel_addresses(), group.master_name())
            }
            Nodes::Sharded(cluster) => Probe::start_cluster(cluster.nodes().urls()),
            _ => {
                let ports: Vec<u16> = (0..nodes.len()).map(|n| nodes.probe_port(n)).collect();
                Probe::start(&ports, store)
            }
        };
        let ledger = Ledger::start(dir.path());
        let configs = (0..WORKERS)
            .map(|w| {
                let listed: Vec<String> = match breakage {
                    Some(Breakage::SplitQuorum) if w < 2 => urls[..3].to_vec(),
                    Some(Breakage::SplitQuorum) => urls[2..].to_vec(),
                    _ => urls.clone(),
                };
                std::array::from_fn(|version| {
                    dir.write(
                        format!("w{w}.v{version}.yaml"),
                        config(w, version, store, &listed, ledger.script(), breakage),
                    )
                })
            })
            .collect();
        let clock_file = dir.join("w3.faketime");
        std::fs::write(&clock_file, faketime_spec(plan.offsets[JUMPER]))
            .expect("cannot write the clock file");
        let mut cluster = Cluster {
            dir,
            nodes,
            proxy,
            ledger,
            configs,
            versions: [0; WORKERS],
            offsets: plan.offsets,
            clock_file,
            instances: Vec::new(),
            journal: Arc::new(Journal::default()),
            timeline: Timeline::default(),
            probe: Some(probe),
            stalls: Vec::new(),
            slow_exits: Vec::new(),
            unplanned_exits: Vec::new(),
            started_ms: 0,
        };
        let at = now_ms();
        // A group's data nodes are not nodes of the majority (the group is node 0).
        for node in (0..cluster.nodes.len()).filter(|_| !store.is_group()) {
            let port = cluster.nodes.probe_port(node);
            cluster
                .timeline
                .push(at, Happening::NodePort { node, port });
        }
        for (worker, offset_ms) in plan.offsets.iter().enumerate() {
            cluster.timeline.push(
                at,
                Happening::Clock {
                    worker,
                    offset_ms: *offset_ms,
                },
            );
        }
        for worker in 0..WORKERS {
            cluster.spawn(worker);
        }
        for instance in &cluster.instances {
            instance
                .handle
                .wait_for_event("worker.started", Duration::from_secs(20))
                .unwrap_or_else(|| {
                    panic!(
                        "w{} did not start: {}",
                        instance.worker,
                        instance.handle.stderr()
                    )
                });
        }
        cluster.started_ms = now_ms();
        cluster
    }

    /// Starts a process for `worker` with its clock, on its current config version.
    fn spawn(&mut self, worker: usize) -> usize {
        let config = self.versions[worker];
        let builder = Worker::builder(&self.configs[worker][config]);
        let builder = match worker {
            JUMPER => {
                // The file, not FAKETIME (which would take precedence over it), so the clock can step.
                let library = libfaketime()
                    .expect("libfaketime.so.1 (package faketime) is needed for the clock steps");
                builder
                    .env("LD_PRELOAD", &library.to_string_lossy())
                    .env(
                        "FAKETIME_TIMESTAMP_FILE",
                        &self.clock_file.to_string_lossy(),
                    )
                    .env("FAKETIME_CACHE_DURATION", "1")
            }
            _ if self.offsets[worker] != 0 => {
                builder.faketime(&faketime_spec(self.offsets[worker]))
            }
            _ => builder,
        };
        // A clock step moves the wall clock only, as NTP or a VM resume would; the monotonic clock, which
        // measures leases, never jumps.
        let builder = builder.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        let handle = Arc::new(builder.spawn());
        let instance = self.instances.len();
        self.timeline.push(
            now_ms(),
            Happening::WorkerSpawned {
                worker,
                instance,
                config,
            },
        );
        let recorder = follow(Arc::clone(&handle), instance, Arc::clone(&self.journal));
        self.instances.push(Instance {
            worker,
            handle,
            recorder: Some(recorder),
            state: State::Running,
        });
        instance
    }

    fn signal(&mut self, instance: usize, signal: i32, state: State, happening: Happening) {
        let pid = self.instances[instance].handle.pid();
        // SAFETY: kill has no memory effects. The process is our child and is reaped only when its
        // `Worker` is dropped at the end, so its pid cannot have been reused.
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
        self.instances[instance].state = state;
        self.timeline.push(now_ms(), happening);
    }

    /// The running (not paused, not killed) process of `worker`.
    fn running_instance(&self, worker: usize) -> Option<usize> {
        self.instances
            .iter()
            .rposition(|i| i.worker == worker && i.state == State::Running)
    }

    /// Reports that `instance` did not exit within [`EXIT_LIMIT`] of `what`, and kills it.
    fn kill_slow(&mut self, instance: usize, what: &str) {
        self.slow_exits.push(format!(
            "w{} (process #{instance}) did not exit within {} s of {what}",
            self.instances[instance].worker,
            EXIT_LIMIT.as_secs()
        ));
        self.signal(
            instance,
            libc::SIGKILL,
            State::Killed,
            Happening::WorkerKilled { instance },
        );
    }

    /// Whether process `instance` has exited (its stdout closed).
    fn exited(&self, instance: usize) -> bool {
        self.instances[instance]
            .recorder
            .as_ref()
            .is_none_or(|r| r.is_finished())
    }

    /// What each lock node confirmed, from its append-only file (read at the end of the run); on etcd,
    /// every claim record the cluster committed, from its history ([`super::etcd_claims`]); on a SQL
    /// server, every claim and lease row it committed, from its triggers' table ([`super::sql_claims`]);
    /// on ZooKeeper, every claim record each member logged, from its transaction log
    /// ([`super::zk_claims`]); on a Sentinel group or a Redis Cluster, what its data nodes' append-only
    /// files show it confirmed ([`claims::read_group`]: a job's keys live on one shard, so a write two
    /// data nodes hold is its master's and its replica's).
    pub fn claim_writes(&self) -> Vec<ClaimWrite> {
        let nodes = match &self.nodes {
            Nodes::Redis(nodes) => nodes,
            Nodes::Etcd(members) => {
                return super::etcd_claims::read_history(&members.endpoints(), members.len())
            }
            Nodes::Sql(server) => return super::sql_claims::read_grants(server),
            Nodes::Zookeeper(members) => return super::zk_claims::read_logs(members),
            Nodes::Sentinel(group) => &group.data,
            Nodes::Sharded(cluster) => cluster.nodes(),
        };
        let dirs: Vec<PathBuf> = (0..nodes.len())
            .map(|node| nodes.dir(node).join("appendonlydir"))
            .collect();
        if self.nodes.is_group() {
            return claims::read_group(&dirs, GROUP_ACKS + 1);
        }
        dirs.iter()
            .enumerate()
            .flat_map(|(node, dir)| claims::read_aof(node, dir))
            .collect()
    }
    /// Resumes paused workers and asks every live one to shut down (SIGTERM: running jobs finish within
    /// the grace), waits for them to exit, and for orphaned jobs of crashed workers to end.
    pub fn shut_down(&mut self) {
        self.find_unplanned_exits();
        for instance in 0..self.instances.len() {
            if self.instances[instance].state == State::Stopped {
                self.signal(
                    instance,
                    libc::SIGCONT,
                    State::Running,
                    Happening::WorkerContinued { instance },
                );
            }
        }
        for instance in 0..self.instances.len() {
            if self.instances[instance].state == State::Running {
                self.signal(
                    instance,
                    libc::SIGTERM,
                    State::ShutDown,
                    Happening::WorkerShutdown { instance },
                );
            }
        }
        // A recorder ends when its worker's stdout closes. A worker gets its shutdown grace, then its
        // jobs' SIGTERM-to-SIGKILL grace, to exit; one that takes longer is killed and reported.
        let deadline = Instant::now() + EXIT_LIMIT;
        while Instant::now() < deadline
            && self
                .instances
                .iter()
                .any(|i| i.recorder.as_ref().is_some_and(|r| !r.is_finished()))
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        for index in 0..self.instances.len() {
            if self.instances[index]
                .recorder
                .as_ref()
                .is_some_and(|r| !r.is_finished())
            {
                self.kill_slow(index, "SIGTERM");
            }
            if let Some(recorder) = self.instances[index].recorder.take() {
                // A panic here was a non-JSON line, which the checker reports from the raw lines.
                let _ = recorder.join();
            }
        }
        let orphans: Vec<i32> = self
            .instances
            .iter()
            .enumerate()
            .filter(|(_, i)| i.state == State::Killed)
            .flat_map(|(index, _)| self.journal.events(index))
            .filter(|(_, e)| e["event"] == "run.started")
            .filter_map(|(_, e)| e["pid"].as_i64().map(|pid| pid as i32))
            .collect();
        let deadline = Instant::now() + Duration::from_millis(LONG_MS + 5_000);
        while orphans.iter().any(|&pid| alive(pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(probe) = self.probe.take() {
            self.stalls = probe.finish();
            for stall in &self.stalls {
                let until = stall.to;
                self.timeline.push(
                    stall.from,
                    Happening::NodeStalled {
                        node: stall.node,
                        until,
                    },
                );
            }
            self.timeline.entries.sort_by_key(|(at, _)| *at);
        }
    }

    /// Worker processes that ended without the harness killing them: their stdout closed (the recorder
    /// finished) while the harness still counted them as running or paused. Each is reported, and
    /// counted as down from its last event on.
    fn find_unplanned_exits(&mut self) {
        for index in 0..self.instances.len() {
            let instance = &self.instances[index];
            let ended = instance.recorder.as_ref().is_some_and(|r| r.is_finished());
            if !ended || !matches!(instance.state, State::Running | State::Stopped) {
                continue;
            }
            let events = self.journal.events(index);
            let (at, last) = events
                .last()
                .map_or((now_ms(), "nothing".to_string()), |(at, e)| {
                    (*at, e["event"].as_str().unwrap_or("?").to_string())
                });
            self.unplanned_exits.push(format!(
                "w{} (process #{index}) exited at {} without being told to (its last event: {last}); \
                 `worker.stopping` there means a SIGINT/SIGTERM/SIGHUP from outside the test",
                instance.worker,
                super::report::show_time(at)
            ));
            self.instances[index].state = State::Killed;
            self.timeline
                .push(at, Happening::WorkerKilled { instance: index });
        }
        self.timeline.entries.sort_by_key(|(at, _)| *at);
    }

    /// Every process's log: the recorded events, and the raw lines that were not JSON.
    pub fn logs(&self) -> Vec<InstanceLog> {
        self.instances
            .iter()
            .enumerate()
            .map(|(index, instance)| InstanceLog {
                instance: index,
                worker: instance.worker,
                events: self.journal.events(index),
                bad_lines: instance
                    .handle
                    .lines()
                    .into_iter()
                    .filter(|line| {
                        !matches!(serde_json::from_str::<Value>(line), Ok(Value::Object(_)))
                    })
                    .collect(),
            })
            .collect()
    }

    /// Each process's clock offset as its log shows it (median of log timestamp − arrival), to confirm
    /// that the skews and steps took effect.
    pub fn observed_offsets(&self) -> Vec<String> {
        (0..self.instances.len())
            .map(|index| {
                let mut skews: Vec<i64> = self
                    .journal
                    .events(index)
                    .iter()
                    .filter_map(|(at, e)| {
                        Some(super::facts::parse_instant(e["timestamp"].as_str()?)? - at)
                    })
                    .collect();
                skews.sort_unstable();
                let (min, max) = (
                    skews.first().copied().unwrap_or(0),
                    skews.last().copied().unwrap_or(0),
                );
                let median = skews.get(skews.len() / 2).copied().unwrap_or(0);
                format!(
                    "w{} #{index}: median {median:+} ms (from {min:+} to {max:+})",
                    self.instances[index].worker
                )
            })
            .collect()
    }

    /// Each node's worst stalls since its last start, by cause (`LATENCY LATEST`): `event latest-ms max-ms`
    /// (Redis nodes only).
    pub fn node_stalls(&self) -> Vec<String> {
        let Some(nodes) = self.nodes.redis() else {
            return vec!["none on etcd, ZooKeeper or SQL".to_string()];
        };
        let name = if self.nodes.is_group() {
            "data node"
        } else {
            "node"
        };
        (0..nodes.len())
            .map(|node| {
                let latest: Vec<(String, i64, i64, i64)> =
                    nodes.query(node, redis::cmd("LATENCY").arg("LATEST"));
                let events: Vec<String> = latest
                    .iter()
                    .map(|(event, _, last, max)| format!("{event} {last}/{max} ms"))
                    .collect();
                format!(
                    "{name} {node}: {}",
                    if events.is_empty() {
                        "none".into()
                    } else {
                        events.join(", ")
                    }
                )
            })
            .collect()
    }

    pub fn stderr_of_all(&self) -> String {
        self.instances
            .iter()
            .enumerate()
            .filter(|(_, i)| !i.handle.stderr().trim().is_empty())
            .map(|(index, i)| {
                format!(
                    "--- w{} #{index} stderr ---\n{}",
                    i.worker,
                    i.handle.stderr()
                )
            })
            .collect()
    }
}
/// Whether process `pid` exists and is not a zombie (an orphan's zombie may linger: PID 1 in a
/// container need not reap it).
fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which ends at the last ')'.
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
}

/// Asks node `i` to record its own stalls over 50 ms (`LATENCY LATEST` shows them), for the summary.
fn watch_latency(nodes: &RedisCluster, node: usize) {
    let () = nodes.query(
        node,
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("latency-monitor-threshold")
            .arg(50),
    );
}
