//! The timeline: what the harness actually did (and saw), with real times — the faults as executed.
//!
//! A seed fixes the plan but not its timing: which worker holds the long job, or races a tick first, is
//! decided when a fault comes due, and a rollout's steps wait for processes to exit and start. So the
//! checker never reads the plan; it reads this.

use super::faults::{Case, Fault, ProxyMode};

/// One thing the harness did (or saw), at a real time in Unix milliseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Happening {
    /// A worker process was spawned: the `instance`-th process overall, for worker `worker`, on config
    /// version `config` (0 unless a rollout changed it).
    WorkerSpawned {
        worker: usize,
        instance: usize,
        #[serde(default)]
        config: usize,
    },
    WorkerStopped {
        instance: usize,
    },
    WorkerContinued {
        instance: usize,
    },
    /// SIGKILLed (its jobs, if any, live on).
    WorkerKilled {
        instance: usize,
    },
    /// Told to shut down (SIGTERM): at the end of the run, or by a rollout. It races no new tick.
    WorkerShutdown {
        instance: usize,
    },
    /// The next kill hits `instance` a few milliseconds after its clock reached `tick` (Unix ms): while
    /// its claim of the tick is in flight.
    AimedKill {
        instance: usize,
        tick: i64,
    },
    /// A rolling change to config `version` began (`done: false`) or ended.
    Rollout {
        version: usize,
        done: bool,
    },
    /// Node `node` serves clients on `port` (on 127.0.0.1), for the whole run: what a worker's log names
    /// when it connects to a member (a ZooKeeper session rides one member).
    NodePort {
        node: usize,
        port: u16,
    },
    NodeDown {
        node: usize,
        hung: bool,
    },
    NodeUp {
        node: usize,
    },
    /// Data node `data` of the Sentinel group was killed or hung (`hung`), as its master or a replica.
    /// A fault of the master takes the group — node 0 — out of reach: a `NodeDown` of node 0 comes
    /// with it, and its `NodeUp` once the group serves again ([`Happening::GroupServes`]).
    DataNodeDown {
        data: usize,
        hung: bool,
        master: bool,
    },
    /// Data node `data` was restarted (on its data and config file) or continued.
    DataNodeUp {
        data: usize,
    },
    /// A planned failover of the group was asked of its Sentinels while `master` was its master (a
    /// `NodeDown` of node 0 comes with it).
    FailoverAsked {
        master: usize,
    },
    /// After a fault of one of its data nodes, the group serves again: per shard (a Sentinel group is
    /// one), its master, which says it is one (and every Sentinel names it), and the replicas it
    /// streams to (at least `min_replicas_acked`).
    GroupServes {
        shards: Vec<(usize, Vec<usize>)>,
    },
    /// The harness's probe saw the node answer slowly (or not at all) until `until` (see `probe`).
    NodeStalled {
        node: usize,
        until: i64,
    },
    Proxy {
        mode: ProxyMode,
    },
    /// A worker's wall-clock offset from real time, from now on (also the initial one).
    Clock {
        worker: usize,
        offset_ms: i64,
    },
    /// A crashed contender's keys were written for `tick` (Unix ms) of `job`: its lease value `value`
    /// under `key` (TTL `ttl_ms`) on the nodes `leased`, and its claim of the tick on `confirmed`.
    Ghost {
        job: String,
        tick: i64,
        key: String,
        value: String,
        ttl_ms: u64,
        leased: Vec<usize>,
        confirmed: Vec<usize>,
    },
    /// Garbage plant `tag` was written ([`super::faults::Garbage`]): on the Redis nodes `nodes` (empty on
    /// etcd; a Sentinel group's master, as its data node), the trigger requests `requests` and the member records `members` (their ids, those written
    /// somewhere), and a junk history entry of `history` if it was written; `failed` says what was not.
    Garbage {
        tag: u8,
        nodes: Vec<usize>,
        requests: Vec<String>,
        members: Vec<String>,
        history: Option<String>,
        failed: Vec<String>,
    },
    /// A deterministic case began: `instance` was paused while running `run_id`.
    CaseBegan {
        case: Case,
        instance: usize,
        run_id: String,
    },
    /// A planned fault was not carried out, and why.
    Skipped {
        fault: Fault,
        why: String,
    },
}

/// What happened, in order of real time.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub entries: Vec<(i64, Happening)>,
}

impl Timeline {
    pub fn push(&mut self, at_ms: i64, happening: Happening) {
        self.entries.push((at_ms, happening));
    }
}
