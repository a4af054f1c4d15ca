//! The fault plan: a reproducible list of fault episodes drawn from a seed, and the timeline of what the
//! harness actually did.
//!
//! The plan is pure data, generated before anything starts, so a seed always yields the same plan (and
//! the plan is printed, so a failing run can be read without re-running it). What a seed cannot fix is
//! timing: which worker holds the long job when "pause the holder" comes due is decided at run time. So
//! the checker never reads the plan; it reads the [`Timeline`], the faults as executed, with real times.

use std::fmt;

/// Redis lock nodes.
pub const NODES: usize = 5;
/// Worker processes.
pub const WORKERS: usize = 4;
/// The lock node that workers reach through the latency/drop proxy.
pub const PROXIED_NODE: usize = NODES - 1;
/// The worker whose clock jumps during the run (the others keep a fixed offset).
pub const JUMPER: usize = 3;
/// No more node faults than this at once: a minority of [`NODES`].
const MAX_NODE_FAULTS: usize = 2;
/// No more worker faults than this at once, so that at least two workers are always up.
const MAX_WORKER_FAULTS: usize = 2;
/// Faults start no earlier than this after the workers are up (they settle first)…
const WARMUP_MS: u64 = 6_000;
/// …and every fault has ended this long before the run ends, so the last ticks of the window run in calm.
const CALM_END_MS: u64 = 9_000;

/// SplitMix64 (Steele, Lea and Flood, 2014): tiny, and the same sequence for a seed on every platform and
/// with every version of every crate, which is what a printed seed must promise.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`); the modulo bias is irrelevant at these sizes.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// What the proxy in front of [`PROXIED_NODE`] does to traffic.
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
}

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
    /// Set the proxy's mode for `ms`, then back to clean.
    Proxy { mode: ProxyMode, ms: u64 },
    /// Step the worker's wall clock to `offset_ms` from real time (its monotonic clock is untouched).
    Jump { worker: usize, offset_ms: i64 },
}

impl Fault {
    /// How long the fault lasts (0 for a clock jump).
    pub fn duration_ms(&self) -> u64 {
        match *self {
            Fault::Pause { ms, .. } | Fault::HangNode { ms, .. } | Fault::Proxy { ms, .. } => ms,
            Fault::Crash { down_ms, .. } | Fault::KillNode { down_ms, .. } => down_ms,
            Fault::Jump { .. } => 0,
        }
    }

    fn is_worker_fault(&self) -> bool {
        matches!(self, Fault::Pause { .. } | Fault::Crash { .. })
    }

    fn node(&self) -> Option<usize> {
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
            Fault::Proxy { mode, ms } => write!(f, "proxy {mode} for {ms} ms"),
            Fault::Jump { worker, offset_ms } => {
                write!(f, "step w{worker}'s clock to {offset_ms:+} ms")
            }
        }
    }
}

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

/// A fault at `at_ms` after the plan's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Episode {
    pub at_ms: u64,
    pub fault: Fault,
    pub case: Option<Case>,
}

impl Episode {
    fn end_ms(&self) -> u64 {
        self.at_ms + self.fault.duration_ms()
    }

    fn overlaps(&self, from: u64, to: u64) -> bool {
        self.at_ms < to && from < self.end_ms().max(self.at_ms + 1)
    }
}

/// Timing the plan needs to know about the cluster under test.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The lease TTL.
    pub ttl_ms: u64,
    /// How long the long job runs between its first and its last write.
    pub long_ms: u64,
}

/// A seeded fault plan for a run of `secs` seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub seed: u64,
    pub secs: u64,
    /// Each worker's initial wall-clock offset from real time, in ms.
    pub offsets: [i64; WORKERS],
    /// Sorted by `at_ms`.
    pub episodes: Vec<Episode>,
}

impl Plan {
    /// Draws the plan for `seed`; the same arguments always give the same plan.
    ///
    /// Constraints, so that every fault stays within what the protocol claims to survive: at most
    /// [`MAX_NODE_FAULTS`] nodes down or hung at once (a minority; the degraded proxy is not counted, so
    /// the checker sees a majority unusable only when that coincides with two node faults), at most
    /// [`MAX_WORKER_FAULTS`] workers paused or crashed at once, one proxy phase at a time, only node
    /// faults in the calm stretches around the deterministic cases, and nothing at the start and end of
    /// the run.
    pub fn generate(seed: u64, secs: u64, timing: Timing) -> Plan {
        let mut rng = SplitMix64::new(seed);
        let total_ms = secs * 1000;
        let skew = |rng: &mut SplitMix64| rng.between(1000, 3000) as i64;
        let offsets = [0, skew(&mut rng), -skew(&mut rng), 0];
        let mut episodes: Vec<Episode> = Vec::new();

        // The deterministic cases first, each with a calm stretch that worker and proxy faults stay out of.
        let mut calm: Vec<(u64, u64)> = Vec::new();
        let cases = [
            (
                Case::StaleWriteRejected,
                25,
                timing.ttl_ms + timing.long_ms + 1_000,
            ),
            (Case::LeaseLossStopsJob, 60, timing.ttl_ms + 500),
        ];
        for (case, percent, pause_ms) in cases {
            let at_ms = total_ms * percent / 100;
            let (from, to) = (
                at_ms.saturating_sub(3_000),
                at_ms + pause_ms.max(timing.long_ms) + 2_000,
            );
            if from < WARMUP_MS || to + CALM_END_MS > total_ms || calm.iter().any(|c| c.1 > from) {
                continue;
            }
            calm.push((from, to));
            episodes.push(Episode {
                at_ms,
                fault: Fault::Pause {
                    target: Target::LongHolder,
                    ms: pause_ms,
                },
                case: Some(case),
            });
        }

        // The jumper's clock steps every 12-20 s, outside the calm stretches, to a new offset in
        // -3..=3 s at least 1 s away from the current one.
        let mut offset_of_jumper = offsets[JUMPER];
        let mut at = WARMUP_MS + rng.between(1_000, 6_000);
        while at + CALM_END_MS < total_ms {
            if let Some(&(_, to)) = calm.iter().find(|&&(from, to)| from <= at && at < to) {
                at = to + 500;
                continue;
            }
            let mut offset_ms = rng.between(0, 6_000) as i64 - 3_000;
            if (offset_ms - offset_of_jumper).abs() < 1_000 {
                offset_ms = if offset_of_jumper > 0 { -2_000 } else { 2_000 };
            }
            offset_of_jumper = offset_ms;
            episodes.push(Episode {
                at_ms: at,
                fault: Fault::Jump {
                    worker: JUMPER,
                    offset_ms,
                },
                case: None,
            });
            at += rng.between(12_000, 20_000);
        }

        let mut at = WARMUP_MS;
        loop {
            at += rng.between(400, 2_500);
            if at + CALM_END_MS >= total_ms {
                break;
            }
            let fault = match rng.below(90) {
                0..=19 => Fault::KillNode {
                    node: rng.below(NODES as u64) as usize,
                    down_ms: rng.between(500, 6_000),
                },
                20..=39 => Fault::HangNode {
                    node: rng.below(NODES as u64) as usize,
                    ms: rng.between(300, 5_000),
                },
                40..=54 => {
                    let max_ms = rng.between(20, 150);
                    let mode = if rng.chance(500) {
                        ProxyMode::Slow { max_ms }
                    } else {
                        ProxyMode::Flaky {
                            max_ms,
                            drop_per_mille: rng.between(20, 150),
                        }
                    };
                    Fault::Proxy {
                        mode,
                        ms: rng.between(2_000, 10_000),
                    }
                }
                55..=64 => Fault::Pause {
                    target: Target::Worker(rng.below(WORKERS as u64) as usize),
                    ms: rng.between(300, 4_000),
                },
                65..=74 => Fault::Pause {
                    target: Target::LongHolder,
                    ms: timing.ttl_ms + rng.between(200, timing.long_ms),
                },
                75..=81 => Fault::Crash {
                    target: Target::Worker(rng.below(WORKERS as u64) as usize),
                    down_ms: rng.between(500, 6_000),
                },
                _ => Fault::Crash {
                    target: Target::LongHolder,
                    down_ms: rng.between(500, 6_000),
                },
            };
            let episode = Episode {
                at_ms: at,
                fault,
                case: None,
            };
            // A calm stretch keeps every worker and the proxy healthy (the takeover in a case needs a
            // live worker and a quorum); up to two node faults still leave a quorum.
            let disturbs_case = !matches!(fault, Fault::KillNode { .. } | Fault::HangNode { .. });
            if episode.end_ms() + CALM_END_MS > total_ms
                || (disturbs_case && calm.iter().any(|&(from, to)| episode.overlaps(from, to)))
                || !fits(&episodes, &episode)
            {
                continue;
            }
            episodes.push(episode);
        }
        episodes.sort_by_key(|e| e.at_ms);
        Plan {
            seed,
            secs,
            offsets,
            episodes,
        }
    }

    /// How many episodes of each kind, for the summary line.
    pub fn summary(&self) -> String {
        let count =
            |pred: &dyn Fn(&Fault) -> bool| self.episodes.iter().filter(|e| pred(&e.fault)).count();
        format!(
            "{} worker pauses ({} of the long job's holder), {} worker crashes, {} node kills, {} node hangs, \
             {} proxy phases, {} clock steps",
            count(&|f| matches!(f, Fault::Pause { .. })),
            count(&|f| matches!(f, Fault::Pause { target: Target::LongHolder, .. })),
            count(&|f| matches!(f, Fault::Crash { .. })),
            count(&|f| matches!(f, Fault::KillNode { .. })),
            count(&|f| matches!(f, Fault::HangNode { .. })),
            count(&|f| matches!(f, Fault::Proxy { .. })),
            count(&|f| matches!(f, Fault::Jump { .. })),
        )
    }
}

/// Whether `new` keeps the plan within its constraints, assuming a holder-targeted worker fault may hit
/// any worker.
fn fits(episodes: &[Episode], new: &Episode) -> bool {
    let (from, to) = (new.at_ms, new.end_ms().max(new.at_ms + 1));
    let overlapping: Vec<&Episode> = episodes.iter().filter(|e| e.overlaps(from, to)).collect();
    match new.fault {
        Fault::KillNode { node, .. } | Fault::HangNode { node, .. } => {
            let busy: Vec<usize> = overlapping.iter().filter_map(|e| e.fault.node()).collect();
            !busy.contains(&node) && busy.len() < MAX_NODE_FAULTS
        }
        Fault::Pause { target, .. } | Fault::Crash { target, .. } => {
            let busy: Vec<&Episode> = overlapping
                .iter()
                .copied()
                .filter(|e| e.fault.is_worker_fault())
                .collect();
            let same = |e: &&Episode| match (e.fault, target) {
                (Fault::Pause { target: t, .. } | Fault::Crash { target: t, .. }, _) => t == target,
                _ => false,
            };
            busy.len() < MAX_WORKER_FAULTS && !busy.iter().any(same)
        }
        Fault::Proxy { .. } => !overlapping
            .iter()
            .any(|e| matches!(e.fault, Fault::Proxy { .. })),
        Fault::Jump { .. } => true,
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let offsets: Vec<String> = self
            .offsets
            .iter()
            .enumerate()
            .map(|(w, o)| {
                if w == JUMPER {
                    format!("w{w} {o:+} ms, then steps")
                } else {
                    format!("w{w} {o:+} ms")
                }
            })
            .collect();
        writeln!(
            f,
            "plan (seed {}, {} s): clocks {}",
            self.seed,
            self.secs,
            offsets.join(", ")
        )?;
        for e in &self.episodes {
            let case = e.case.map(|c| format!("  [case: {c}]")).unwrap_or_default();
            writeln!(f, "  {:>7.1} s  {}{case}", e.at_ms as f64 / 1000.0, e.fault)?;
        }
        Ok(())
    }
}

/// One thing the harness did (or saw), at a real time in Unix milliseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Happening {
    /// A worker process was spawned: the `instance`-th process overall, for worker `worker`.
    WorkerSpawned {
        worker: usize,
        instance: usize,
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
    /// Told to shut down at the end of the run.
    WorkerShutdown {
        instance: usize,
    },
    NodeDown {
        node: usize,
        hung: bool,
    },
    NodeUp {
        node: usize,
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

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        ttl_ms: 2_000,
        long_ms: 5_500,
    };

    /// A seed always gives the same plan, and different seeds different plans.
    #[test]
    fn plans_are_reproducible_from_their_seed() {
        assert_eq!(Plan::generate(7, 90, TIMING), Plan::generate(7, 90, TIMING));
        assert_ne!(Plan::generate(7, 90, TIMING), Plan::generate(8, 90, TIMING));
        let mut a = SplitMix64::new(0);
        assert_eq!(
            a.next_u64(),
            0xe220_a839_7b1d_cdaf,
            "SplitMix64's reference output"
        );
    }

    /// Over many seeds: never more than a minority of nodes down, never more than two workers down, both
    /// deterministic cases present in a 90 s plan, and every fault over before the calm end.
    #[test]
    fn plans_respect_their_constraints() {
        for seed in 0..300 {
            let plan = Plan::generate(seed, 90, TIMING);
            let cases: Vec<Case> = plan.episodes.iter().filter_map(|e| e.case).collect();
            assert_eq!(
                cases,
                [Case::StaleWriteRejected, Case::LeaseLossStopsJob],
                "seed {seed}"
            );
            assert!((1000..=3000).contains(&plan.offsets[1]));
            assert!((-3000..=-1000).contains(&plan.offsets[2]));
            for t in (0..90_000).step_by(50) {
                let active: Vec<&Episode> = plan
                    .episodes
                    .iter()
                    .filter(|e| e.at_ms <= t && t < e.end_ms())
                    .collect();
                let nodes = active.iter().filter(|e| e.fault.node().is_some()).count();
                let workers = active.iter().filter(|e| e.fault.is_worker_fault()).count();
                assert!(
                    nodes <= MAX_NODE_FAULTS,
                    "seed {seed} at {t}: {nodes} nodes"
                );
                assert!(workers <= MAX_WORKER_FAULTS, "seed {seed} at {t}");
            }
            for e in &plan.episodes {
                assert!(e.at_ms >= WARMUP_MS && e.end_ms() + CALM_END_MS <= 90_000);
            }
        }
    }

    /// A short run (the CI default) still gets faults of every kind over a handful of seeds.
    #[test]
    fn short_plans_still_inject_every_kind_of_fault() {
        let plans: Vec<Plan> = (0..5).map(|s| Plan::generate(s, 60, TIMING)).collect();
        let any = |pred: &dyn Fn(&Fault) -> bool| {
            plans
                .iter()
                .any(|p| p.episodes.iter().any(|e| pred(&e.fault)))
        };
        assert!(any(&|f| matches!(f, Fault::KillNode { .. })));
        assert!(any(&|f| matches!(f, Fault::HangNode { .. })));
        assert!(any(&|f| matches!(f, Fault::Proxy { .. })));
        assert!(any(&|f| matches!(f, Fault::Crash { .. })));
        assert!(any(&|f| matches!(f, Fault::Jump { .. })));
    }
}
