//! The faults a plan is made of: what each one does to the cluster, and how it is written in a plan.
//!
//! A fault is pure data (the [`super::plan`] draws them from a seed); the harness's executor carries each
//! one out, and undoes it after its duration. Some are aimed at run time: "the long job's holder" and
//! "the first racer" are whichever worker process is that when the fault comes due.

use std::fmt;

use super::plan::NODES;

/// What the proxy in front of [`super::plan::PROXIED_NODE`] does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProxyMode {
    /// Forward as is.
    Clean,
    /// Delay each chunk by 0..=`max_ms`.
    Slow { max_ms: u64 },
    /// Delay as `Slow`, and close the connection on a chunk with probability `drop_per_mille`/1000.
    Flaky { max_ms: u64, drop_per_mille: u64 },
}

impl ProxyMode {
    pub fn is_clean(self) -> bool {
        self == ProxyMode::Clean
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyMode::Clean => write!(f, "clean"),
            ProxyMode::Slow { max_ms } => write!(f, "slow (0-{max_ms} ms per chunk)"),
            ProxyMode::Flaky {
                max_ms,
                drop_per_mille,
            } => {
                write!(
                    f,
                    "flaky (0-{max_ms} ms, drops {drop_per_mille}\u{2030} of chunks)"
                )
            }
        }
    }
}

/// Which worker a worker fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Target {
    Worker(usize),
    /// Whichever live worker is running the long job when the fault comes due.
    LongHolder,
    /// The live worker whose cluster time is furthest ahead (it races each tick first, or with the
    /// others), `after_ms` after the real instant at which it reaches the next tick: its claim's rounds
    /// are in flight then.
    FirstRacer {
        after_ms: u64,
    },
}

/// A crashed contender's leftovers, written straight into the nodes for an upcoming tick of a job: its
/// lease on the nodes of `leased` (a bit mask), and, on the nodes of `confirmed` (a subset of `leased`
/// that is always a minority), its claim of the tick — as if it had crashed between its two rounds, or
/// in the middle of the second one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ghost {
    /// Index into the cluster's jobs ([`super::jobs`]).
    pub job: usize,
    /// The config version whose lease key the ghost used (jobs differ in `overlap` between versions).
    pub version: usize,
    pub leased: u8,
    pub confirmed: u8,
    /// The lease's TTL on the nodes.
    pub ttl_ms: u64,
    /// Written this long before the first live worker races the tick.
    pub lead_ms: u64,
}

impl Ghost {
    /// The nodes of a bit mask, in order.
    pub fn nodes(mask: u8) -> Vec<usize> {
        (0..NODES).filter(|n| mask & (1 << n) != 0).collect()
    }
}

/// Garbage planted straight into the store ([`crate::support::garbage`]): for every job, trigger
/// requests that no `redcron` can have written (an absurd `not_after`, a far-future `requested_at`, not
/// JSON, a bad id…), and for `huge_job` a 64 KiB request and a 64 KiB blob besides; two junk member
/// records; and a junk history entry of `history_job` an hour ahead, the job's newest, which every worker
/// that starts afterwards reads. On Redis it is written straight to the nodes of `nodes` (a bit mask: a
/// minority or a majority), the requests to expire after [`GARBAGE_KEPT_MS`]; on etcd through a plain
/// client, for good. Its keys carry `tag`, unique within the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Garbage {
    pub tag: u8,
    pub nodes: u8,
    /// Index into the cluster's jobs ([`super::jobs`]).
    pub huge_job: usize,
    pub history_job: usize,
}

/// How long the planted trigger requests stay on the Redis nodes (the nodes drop them, as they drop real
/// requests past their window): long enough for every worker to read them, while 64 KiB a second per
/// node and worker would otherwise pile up plant after plant.
pub const GARBAGE_KEPT_MS: i64 = 30_000;

/// One fault; each undoes itself after its duration (except a clock jump, which stays).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Fault {
    /// SIGSTOP the worker, SIGCONT it after `ms`.
    Pause { target: Target, ms: u64 },
    /// SIGKILL the worker (its running jobs live on, orphaned, as after a real crash); start a new
    /// process with the same config and id after `down_ms`.
    Crash { target: Target, down_ms: u64 },
    /// SIGKILL the node; restart it on the same port, with its append-only file, after `down_ms`.
    KillNode { node: usize, down_ms: u64 },
    /// SIGSTOP the node (connections hang, they are not refused); SIGCONT after `ms`.
    HangNode { node: usize, ms: u64 },
    /// SIGKILL whichever etcd member leads when the fault comes due (an election follows); restart it
    /// on its ports and data directory after `down_ms`.
    KillLeader { down_ms: u64 },
    /// SIGSTOP whichever etcd member leads when the fault comes due (the others elect a new leader; it
    /// rejoins as a follower); SIGCONT after `ms`.
    HangLeader { ms: u64 },
    /// On a Sentinel group, `KillLeader` and `HangLeader` hit its master (found when the fault comes
    /// due): killed, it is restarted after `down_ms` on its data and config file, a master until the
    /// Sentinels convert it; hung longer than their `down-after-milliseconds`, it is replaced, and
    /// demoted once continued. This one asks the Sentinels for a planned failover (`SENTINEL
    /// FAILOVER`): a replica is promoted while the old master still runs, and it is demoted later.
    Failover,
    /// SIGKILL one of the Sentinel group's replicas (found when the fault comes due); restart it after
    /// `down_ms` on its data and config file (a replica of the master it followed).
    KillReplica { down_ms: u64 },
    /// SIGSTOP one of the Sentinel group's replicas; SIGCONT after `ms`.
    HangReplica { ms: u64 },
    /// SIGSTOP every running lock node at once, SIGCONT them after `ms` (less than the TTL): what one
    /// slow fsync does to nodes with `appendfsync always` on a shared disk.
    StallAll { ms: u64 },
    /// Set the proxy's mode for `ms`, then back to clean.
    Proxy { mode: ProxyMode, ms: u64 },
    /// Step the worker's wall clock to `offset_ms` from real time (its monotonic clock is untouched).
    Jump { worker: usize, offset_ms: i64 },
    /// A rolling config change: restart the workers one at a time, in `order` (SIGTERM, wait for the
    /// process to exit, start it on config `version`, wait for `worker.started`, wait `gap_ms`). The
    /// fleet runs two config versions meanwhile. `estimate_ms` is how long the plan reserves for it.
    Rollout {
        version: usize,
        order: [usize; super::plan::WORKERS],
        gap_ms: u64,
        estimate_ms: u64,
    },
    /// Leave a crashed contender's keys for an upcoming tick (see [`Ghost`]).
    Ghost(Ghost),
    /// Plant garbage in the store (see [`Garbage`]).
    Garbage(Garbage),
}

impl Fault {
    /// How long the fault lasts (0 for a clock jump and a ghost; the estimate for a rollout; for a
    /// planned failover, [`FAILOVER_MS`]).
    pub fn duration_ms(&self) -> u64 {
        match *self {
            Fault::Pause { ms, .. }
            | Fault::HangNode { ms, .. }
            | Fault::HangLeader { ms }
            | Fault::HangReplica { ms }
            | Fault::StallAll { ms }
            | Fault::Proxy { ms, .. } => ms,
            Fault::Crash { down_ms, .. }
            | Fault::KillNode { down_ms, .. }
            | Fault::KillLeader { down_ms }
            | Fault::KillReplica { down_ms } => down_ms,
            Fault::Failover => FAILOVER_MS,
            Fault::Rollout { estimate_ms, .. } => estimate_ms,
            Fault::Jump { .. } | Fault::Ghost(_) | Fault::Garbage(_) => 0,
        }
    }

    /// A fault that takes a worker down (a rollout takes one down at a time).
    pub fn is_worker_fault(&self) -> bool {
        matches!(
            self,
            Fault::Pause { .. } | Fault::Crash { .. } | Fault::Rollout { .. }
        )
    }

    /// A fault that takes one node (or member) down: a given one, or the leader; on a Sentinel group,
    /// one of its data nodes (the master, planned failovers included, or a replica).
    pub fn is_node_fault(&self) -> bool {
        self.node().is_some()
            || matches!(
                self,
                Fault::KillLeader { .. }
                    | Fault::HangLeader { .. }
                    | Fault::Failover
                    | Fault::KillReplica { .. }
                    | Fault::HangReplica { .. }
            )
    }

    /// The node a node fault hits, if the plan names it (not for the leader's).
    pub fn node(&self) -> Option<usize> {
        match *self {
            Fault::KillNode { node, .. } | Fault::HangNode { node, .. } => Some(node),
            _ => None,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = |t: &Target| match t {
            Target::Worker(w) => format!("w{w}"),
            Target::LongHolder => "the long job's holder".to_string(),
            Target::FirstRacer { after_ms } => {
                format!("the first racer {after_ms} ms into its race of a tick")
            }
        };
        match self {
            Fault::Pause { target: t, ms } => write!(f, "pause {} for {ms} ms", target(t)),
            Fault::Crash { target: t, down_ms } => {
                write!(f, "crash {}, restart after {down_ms} ms", target(t))
            }
            Fault::KillNode { node, down_ms } => {
                write!(f, "kill node {node}, restart after {down_ms} ms")
            }
            Fault::HangNode { node, ms } => write!(f, "hang node {node} for {ms} ms"),
            Fault::KillLeader { down_ms } => {
                write!(
                    f,
                    "kill the leader (a group's master), restart it after {down_ms} ms"
                )
            }
            Fault::HangLeader { ms } => {
                write!(f, "hang the leader (a group's master) for {ms} ms")
            }
            Fault::Failover => write!(f, "fail a master over (SENTINEL FAILOVER, or CLUSTER FAILOVER on its replica)"),
            Fault::KillReplica { down_ms } => {
                write!(f, "kill a replica, restart it after {down_ms} ms")
            }
            Fault::HangReplica { ms } => write!(f, "hang a replica for {ms} ms"),
            Fault::StallAll { ms } => write!(f, "stall every node for {ms} ms"),
            Fault::Proxy { mode, ms } => write!(f, "proxy {mode} for {ms} ms"),
            Fault::Jump { worker, offset_ms } => {
                write!(f, "step w{worker}'s clock to {offset_ms:+} ms")
            }
            Fault::Rollout {
                version,
                order,
                gap_ms,
                ..
            } => {
                let order: Vec<String> = order.iter().map(|w| format!("w{w}")).collect();
                write!(
                    f,
                    "roll config v{version} out to {} ({gap_ms} ms apart)",
                    order.join(", ")
                )
            }
            Fault::Ghost(g) => write!(
                f,
                "ghost contender of {} (v{} lease key): lease on nodes {:?}, claim on {:?}, TTL {} ms, {} ms before the race",
                super::jobs()[g.job].name,
                g.version,
                Ghost::nodes(g.leased),
                Ghost::nodes(g.confirmed),
                g.ttl_ms,
                g.lead_ms
            ),
            Fault::Garbage(g) => write!(
                f,
                "plant garbage #{} ({}): bad trigger requests for every job, 64 KiB ones for {}, junk members, \
                 a junk history entry of {}",
                g.tag,
                if g.nodes == 0 {
                    "through a client".to_string()
                } else {
                    format!("on nodes {:?}", Ghost::nodes(g.nodes))
                },
                super::jobs()[g.huge_job].name,
                super::jobs()[g.history_job].name
            ),
        }
    }
}

/// What a plan reserves for a planned failover of a Sentinel group: the Sentinels' promotion, the other
/// replica's reconfiguration and the workers' reconnection take a few seconds.
pub const FAILOVER_MS: u64 = 3_000;

/// The deterministic cases that every run contains (when it is long enough), in a calm stretch of the
/// plan so that nothing else decides their outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Case {
    /// Pause the long job's holder right after its job started, until after the job's last write: the
    /// lease expires, another worker takes the job over, and the paused holder's job — still running,
    /// since nobody stopped it — writes late. The ledger must reject that write by its token.
    StaleWriteRejected,
    /// Pause the holder past its lease's TTL but resume it before its job's last write: once resumed,
    /// the worker must see the lease lost and stop the job (`lease_lost`), so that last write never
    /// happens.
    LeaseLossStopsJob,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Case::StaleWriteRejected => "stale write rejected",
            Case::LeaseLossStopsJob => "lease loss stops the job",
        })
    }
}
