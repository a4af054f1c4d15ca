//! The executor: carries out a [`Plan`] on the [`Cluster`], at the plan's times, and writes down in the
//! timeline what it did.
//!
//! It never blocks on the cluster: whatever has to wait — for the long job's holder to show up, for a
//! rollout's process to exit or start, for the instant a worker races a tick — is a step put back on the
//! queue for later, so that every other fault still begins and ends on time (a stall of every node must
//! end before the TTL, whatever else is going on).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use super::config::faketime_spec;
use super::nodes::Nodes;
use super::rollout::Rollout;
use super::{now_ms, watch_latency, Cluster, State};
use crate::chaos::faults::{Case, Fault, ProxyMode, Target};
use crate::chaos::plan::Plan;
use crate::chaos::timeline::Happening;

/// How often a waiting step looks again.
pub(super) const POLL: Duration = Duration::from_millis(50);
/// How long after a planned failover was asked the harness waits for a master other than the old one
/// (then any master that serves ends the failover's window: the Sentinels gave it up).
const NEW_MASTER_PATIENCE: Duration = Duration::from_secs(30);
/// How long after a fault of a group's master the harness waits for the group to serve again at all;
/// then the window ends anyway, and the misses after it are the checker's to explain.
const SERVE_PATIENCE: Duration = Duration::from_secs(60);

/// What a begun episode hit, so that its end can undo it.
#[derive(Debug, Clone)]
enum Hit {
    Instance(usize),
    Worker(usize),
    Node(usize),
    /// A Sentinel group's data node.
    DataNode {
        data: usize,
    },
    /// The nodes a stall of every node stopped.
    Nodes(Vec<usize>),
    Proxy,
}

/// An episode between its beginning and its end.
enum Active {
    /// To be undone at the episode's end.
    Hit(Hit),
    /// Looking for the long job's holder until the deadline.
    Seeking {
        deadline: Instant,
    },
    /// A kill aimed at `instance`'s race of `tick`, due at the episode's `Fire` step.
    Aimed {
        instance: usize,
        tick: i64,
    },
    /// A ghost's keys for `tick`, due at the episode's `Fire` step.
    Ghost {
        tick: i64,
    },
    Rollout(Rollout),
    /// After a fault of a Sentinel group's master (undone, or a planned failover asked): waiting for the
    /// group to serve again — with a master other than `old`, until `patience` passes.
    Recovering {
        old: Option<usize>,
        patience: Instant,
        deadline: Instant,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Begin,
    /// Look again (a holder, a rollout).
    Poll,
    /// Act at a precise instant computed at the beginning.
    Fire,
    End,
}

/// The steps to come, by time since the plan's start.
struct Queue {
    heap: BinaryHeap<Reverse<(Duration, usize, usize, Step)>>,
    sequence: usize,
}

impl Queue {
    fn push(&mut self, at: Duration, episode: usize, step: Step) {
        self.sequence += 1;
        self.heap.push(Reverse((at, self.sequence, episode, step)));
    }
}

impl Cluster {
    /// Carries out the plan; returns when its last fault is undone and the plan's time is up.
    pub fn execute(&mut self, plan: &Plan) {
        let start = Instant::now();
        let mut queue = Queue {
            heap: BinaryHeap::new(),
            sequence: 0,
        };
        for (index, episode) in plan.episodes.iter().enumerate() {
            queue.push(Duration::from_millis(episode.at_ms), index, Step::Begin);
        }
        let mut active: HashMap<usize, Active> = HashMap::new();
        while let Some(Reverse((at, _, index, step))) = queue.heap.pop() {
            std::thread::sleep(at.saturating_sub(start.elapsed()));
            let episode = plan.episodes[index];
            let fault = episode.fault;
            let state = match step {
                Step::Begin => self.begin(index, fault, episode.case),
                Step::Poll | Step::Fire => match active.remove(&index) {
                    Some(state) => self.advance(index, fault, episode.case, state, step),
                    None => None,
                },
                Step::End => match active.remove(&index) {
                    Some(Active::Hit(hit)) => self.end(fault, hit),
                    _ => None,
                },
            };
            let now = start.elapsed();
            match &state {
                Some(Active::Hit(_)) if step != Step::End => queue.push(
                    now + Duration::from_millis(fault.duration_ms()),
                    index,
                    Step::End,
                ),
                Some(Active::Seeking { .. } | Active::Recovering { .. }) => {
                    queue.push(now + POLL, index, Step::Poll)
                }
                Some(Active::Aimed { .. } | Active::Ghost { .. }) => {
                    let due = self.due_ms(fault, &state);
                    let wait = Duration::from_millis(due.saturating_sub(now_ms()).max(0) as u64);
                    queue.push(now + wait, index, Step::Fire);
                }
                Some(Active::Rollout(rollout)) => {
                    queue.push(now + rollout.wait(), index, Step::Poll)
                }
                _ => {}
            }
            if let Some(state) = state {
                active.insert(index, state);
            }
        }
        std::thread::sleep(Duration::from_secs(plan.secs).saturating_sub(start.elapsed()));
    }

    fn skip(&mut self, fault: Fault, why: &str) -> Option<Active> {
        self.timeline.push(
            now_ms(),
            Happening::Skipped {
                fault,
                why: why.to_string(),
            },
        );
        None
    }

    fn begin(&mut self, index: usize, fault: Fault, case: Option<Case>) -> Option<Active> {
        match fault {
            Fault::Pause {
                target: Target::LongHolder,
                ..
            }
            | Fault::Crash {
                target: Target::LongHolder,
                ..
            } => {
                // For a deterministic case, wait (up to 12 s) for a run that has just started, so that
                // the pause lands before its first renewal.
                let patience = Duration::from_secs(if case.is_some() { 12 } else { 3 });
                let deadline = Instant::now() + patience;
                self.advance(index, fault, case, Active::Seeking { deadline }, Step::Poll)
            }
            Fault::Pause {
                target: Target::Worker(worker),
                ..
            }
            | Fault::Crash {
                target: Target::Worker(worker),
                ..
            } => match self.running_instance(worker) {
                Some(instance) => Some(self.hit_worker(fault, instance)),
                None => self.skip(fault, "no running target"),
            },
            Fault::Pause {
                target: Target::FirstRacer { .. },
                ..
            } => self.skip(fault, "pauses are not aimed at races"),
            Fault::Crash {
                target: Target::FirstRacer { .. },
                ..
            } => match self.first_racer() {
                Some((instance, tick)) => Some(Active::Aimed { instance, tick }),
                None => self.skip(fault, "no running worker"),
            },
            Fault::KillLeader { .. } | Fault::HangLeader { .. } if self.nodes.is_group() => {
                let Some(master) = self.nodes.master_for(index) else {
                    return self.skip(fault, "the group does not serve (a failover is going on)");
                };
                let hung = matches!(fault, Fault::HangLeader { .. });
                Some(self.hit_data_node(master, true, hung))
            }
            Fault::KillReplica { .. } | Fault::HangReplica { .. } => {
                let replicas = self.nodes.replicas();
                if replicas.is_empty() {
                    return self.skip(fault, "the group's master streams to no replica");
                }
                let replica = replicas[index % replicas.len()];
                let hung = matches!(fault, Fault::HangReplica { .. });
                Some(self.hit_data_node(replica, false, hung))
            }
            Fault::Failover => {
                let Some(master) = self.nodes.master_for(index) else {
                    return self.skip(fault, "the group does not serve (a failover is going on)");
                };
                let asked = match &self.nodes {
                    Nodes::Sentinel(group) => group.start_failover(),
                    // The master's replica takes its slots over.
                    Nodes::Sharded(cluster) => match cluster.nodes().online_replicas(master) {
                        Some(replicas) if !replicas.is_empty() => {
                            cluster.start_failover(replicas[index % replicas.len()])
                        }
                        _ => Err(format!("master {master} streams to no replica")),
                    },
                    _ => Err("no Sentinel group or Redis Cluster on this store".to_string()),
                };
                if let Err(why) = asked {
                    return self.skip(fault, &why);
                }
                let at = now_ms();
                self.timeline.push(at, Happening::FailoverAsked { master });
                self.timeline.push(
                    at,
                    Happening::NodeDown {
                        node: 0,
                        hung: false,
                    },
                );
                Some(Self::recovering(Some(master)))
            }
            // A fault of a node that is down or hung already (the executor running late after a slow
            // step, or a leader fault that hit the same node) has no target: skipped, never a panic.
            Fault::KillNode { node, .. } | Fault::HangNode { node, .. }
                if !self.nodes.is_serving(node) =>
            {
                self.skip(fault, "the node is down or hung already")
            }
            Fault::KillNode { node, .. } => {
                self.nodes.kill(node);
                self.timeline
                    .push(now_ms(), Happening::NodeDown { node, hung: false });
                Some(Active::Hit(Hit::Node(node)))
            }
            Fault::HangNode { node, .. } => {
                self.nodes.stop(node);
                self.timeline
                    .push(now_ms(), Happening::NodeDown { node, hung: true });
                Some(Active::Hit(Hit::Node(node)))
            }
            Fault::KillLeader { .. } | Fault::HangLeader { .. } => {
                let Some(node) = self.nodes.leader() else {
                    return self.skip(fault, "no leader (an election is going on)");
                };
                let hung = matches!(fault, Fault::HangLeader { .. });
                if hung {
                    self.nodes.stop(node);
                } else {
                    self.nodes.kill(node);
                }
                self.timeline
                    .push(now_ms(), Happening::NodeDown { node, hung });
                Some(Active::Hit(Hit::Node(node)))
            }
            Fault::StallAll { .. } => {
                let nodes: Vec<usize> = (0..self.nodes.len())
                    .filter(|&node| self.nodes.is_serving(node))
                    .collect();
                for &node in &nodes {
                    self.nodes.stop(node);
                }
                let at = now_ms();
                for &node in &nodes {
                    self.timeline
                        .push(at, Happening::NodeDown { node, hung: true });
                }
                Some(Active::Hit(Hit::Nodes(nodes)))
            }
            Fault::Proxy { mode, .. } => {
                let Some(proxy) = &self.proxy else {
                    return self.skip(fault, "no proxy on this store");
                };
                proxy.set(mode);
                // Start each degraded phase by cutting what is open: the clients must reconnect.
                proxy.cut();
                self.timeline.push(now_ms(), Happening::Proxy { mode });
                Some(Active::Hit(Hit::Proxy))
            }
            Fault::Jump { worker, offset_ms } => {
                std::fs::write(&self.clock_file, faketime_spec(offset_ms))
                    .expect("cannot write the clock file");
                self.offsets[worker] = offset_ms;
                self.timeline
                    .push(now_ms(), Happening::Clock { worker, offset_ms });
                None
            }
            Fault::Rollout {
                version,
                order,
                gap_ms,
                ..
            } => {
                self.timeline.push(
                    now_ms(),
                    Happening::Rollout {
                        version,
                        done: false,
                    },
                );
                let rollout = Rollout::new(version, order, Duration::from_millis(gap_ms));
                self.advance(index, fault, case, Active::Rollout(rollout), Step::Poll)
            }
            Fault::Garbage(garbage) => {
                self.plant_garbage(garbage);
                None
            }
            Fault::Ghost(ghost) => match self.ghost_tick(ghost.lead_ms) {
                Some(tick) => Some(Active::Ghost { tick }),
                None => self.skip(fault, "no running worker"),
            },
        }
    }

    /// A waiting episode's next step: `Poll` looks again, `Fire` acts.
    fn advance(
        &mut self,
        index: usize,
        fault: Fault,
        case: Option<Case>,
        state: Active,
        step: Step,
    ) -> Option<Active> {
        match (state, step) {
            (Active::Seeking { deadline }, Step::Poll) => match self.long_holder(case.is_some()) {
                Some((instance, run_id)) => {
                    if let Some(case) = case {
                        self.timeline.push(
                            now_ms(),
                            Happening::CaseBegan {
                                case,
                                instance,
                                run_id,
                            },
                        );
                    }
                    Some(self.hit_worker(fault, instance))
                }
                None if Instant::now() < deadline => Some(Active::Seeking { deadline }),
                None => self.skip(fault, "no running target"),
            },
            (Active::Aimed { instance, tick }, Step::Fire) => {
                if self.instances[instance].state != State::Running {
                    return self.skip(fault, "the first racer went down before its race");
                }
                self.timeline
                    .push(now_ms(), Happening::AimedKill { instance, tick });
                Some(self.hit_worker(fault, instance))
            }
            (Active::Ghost { tick }, Step::Fire) => {
                if let Fault::Ghost(ghost) = fault {
                    self.write_ghost(index, ghost, tick);
                }
                None
            }
            (
                Active::Recovering {
                    old,
                    patience,
                    deadline,
                },
                Step::Poll,
            ) => {
                let now = Instant::now();
                let serving = self.nodes.serving().filter(|shards| {
                    shards.iter().all(|&(master, _)| Some(master) != old) || now >= patience
                });
                match serving {
                    Some(shards) => {
                        let at = now_ms();
                        self.timeline.push(at, Happening::GroupServes { shards });
                        self.timeline.push(at, Happening::NodeUp { node: 0 });
                        None
                    }
                    None if now >= deadline => {
                        self.timeline.push(now_ms(), Happening::NodeUp { node: 0 });
                        None
                    }
                    None => Some(Active::Recovering {
                        old,
                        patience,
                        deadline,
                    }),
                }
            }
            (Active::Rollout(mut rollout), Step::Poll) => {
                if rollout.poll(self) {
                    let version = rollout.version();
                    self.timeline.push(
                        now_ms(),
                        Happening::Rollout {
                            version,
                            done: true,
                        },
                    );
                    None
                } else {
                    Some(Active::Rollout(rollout))
                }
            }
            (state, _) => Some(state),
        }
    }

    /// When an aimed kill or a ghost is due (Unix ms).
    fn due_ms(&self, fault: Fault, state: &Option<Active>) -> i64 {
        match (fault, state) {
            (
                Fault::Crash {
                    target: Target::FirstRacer { after_ms },
                    ..
                },
                Some(Active::Aimed { instance, tick }),
            ) => tick - self.skew(*instance) + after_ms as i64,
            (Fault::Ghost(ghost), Some(Active::Ghost { tick })) => {
                self.first_race_ms(*tick) - ghost.lead_ms as i64
            }
            _ => now_ms(),
        }
    }

    /// Pauses or kills `instance`, per `fault`.
    fn hit_worker(&mut self, fault: Fault, instance: usize) -> Active {
        let worker = self.instances[instance].worker;
        if let Fault::Pause { .. } = fault {
            self.signal(
                instance,
                libc::SIGSTOP,
                State::Stopped,
                Happening::WorkerStopped { instance },
            );
            Active::Hit(Hit::Instance(instance))
        } else {
            // Its jobs live on, orphaned, as after a real crash; the handle is kept for the logs.
            self.signal(
                instance,
                libc::SIGKILL,
                State::Killed,
                Happening::WorkerKilled { instance },
            );
            Active::Hit(Hit::Worker(worker))
        }
    }

    /// Kills or hangs (`hung`) data node `data` of the Sentinel group, its `master` or a replica; a fault
    /// of the master takes the group, node 0, out of reach.
    fn hit_data_node(&mut self, data: usize, master: bool, hung: bool) -> Active {
        if hung {
            self.nodes.stop(data);
        } else {
            self.nodes.kill(data);
        }
        let at = now_ms();
        self.timeline
            .push(at, Happening::DataNodeDown { data, hung, master });
        // With `min_replicas_acked: all` a replica down is waited for too, until the Sentinels think it
        // down: the group's one node is out of reach from a fault of any of its data nodes.
        self.timeline
            .push(at, Happening::NodeDown { node: 0, hung });
        Active::Hit(Hit::DataNode { data })
    }

    /// Waiting for the group to serve again after a fault of its master (`old`, for a planned
    /// failover: until a new one serves).
    fn recovering(old: Option<usize>) -> Active {
        let now = Instant::now();
        Active::Recovering {
            old,
            patience: now + NEW_MASTER_PATIENCE,
            deadline: now + SERVE_PATIENCE,
        }
    }

    /// Undoes `hit`; after a fault of a group's data node, what is left to wait for.
    fn end(&mut self, fault: Fault, hit: Hit) -> Option<Active> {
        match (fault, hit) {
            (
                Fault::KillLeader { .. }
                | Fault::HangLeader { .. }
                | Fault::KillReplica { .. }
                | Fault::HangReplica { .. },
                Hit::DataNode { data },
            ) => {
                if matches!(fault, Fault::KillLeader { .. } | Fault::KillReplica { .. }) {
                    self.nodes.restart(data);
                    if let Some(nodes) = self.nodes.redis() {
                        watch_latency(nodes, data);
                    }
                } else {
                    self.nodes.cont(data);
                }
                self.timeline.push(now_ms(), Happening::DataNodeUp { data });
                return Some(Self::recovering(None));
            }
            (Fault::Pause { .. }, Hit::Instance(instance)) => {
                self.signal(
                    instance,
                    libc::SIGCONT,
                    State::Running,
                    Happening::WorkerContinued { instance },
                );
            }
            (Fault::Crash { .. }, Hit::Worker(worker)) => {
                self.spawn(worker);
            }
            (Fault::KillNode { .. } | Fault::KillLeader { .. }, Hit::Node(node)) => {
                self.nodes.restart(node);
                if let Some(nodes) = self.nodes.redis() {
                    watch_latency(nodes, node);
                }
                self.timeline.push(now_ms(), Happening::NodeUp { node });
            }
            (Fault::HangNode { .. } | Fault::HangLeader { .. }, Hit::Node(node)) => {
                self.nodes.cont(node);
                self.timeline.push(now_ms(), Happening::NodeUp { node });
            }
            (Fault::StallAll { .. }, Hit::Nodes(nodes)) => {
                for &node in &nodes {
                    self.nodes.cont(node);
                }
                let at = now_ms();
                for node in nodes {
                    self.timeline.push(at, Happening::NodeUp { node });
                }
            }
            (Fault::Proxy { .. }, Hit::Proxy) => {
                if let Some(proxy) = &self.proxy {
                    proxy.set(ProxyMode::Clean);
                }
                self.timeline.push(
                    now_ms(),
                    Happening::Proxy {
                        mode: ProxyMode::Clean,
                    },
                );
            }
            _ => {}
        }
        None
    }

    /// A running worker process whose long job is running; for a deterministic case, one whose run
    /// started within the last 250 ms.
    fn long_holder(&self, fresh: bool) -> Option<(usize, String)> {
        let running: Vec<usize> = (0..self.instances.len())
            .filter(|&i| self.instances[i].state == State::Running)
            .collect();
        let since = if fresh { now_ms() - 250 } else { 0 };
        self.journal.long_run(&running, since)
    }

    /// How far process `instance`'s cluster time (its clock plus the offset to the nodes it measured) is
    /// ahead of real time: it races a tick that long before the real instant.
    fn skew(&self, instance: usize) -> i64 {
        self.offsets[self.instances[instance].worker] + self.journal.measured_offset(instance)
    }

    /// The running process whose cluster time is furthest ahead (it races each tick first, or with the
    /// others), and the next tick it races at least 30 ms from now.
    fn first_racer(&self) -> Option<(usize, i64)> {
        let instance = (0..self.instances.len())
            .filter(|&i| self.instances[i].state == State::Running)
            .max_by_key(|&i| (self.skew(i), i))?;
        let tick = (now_ms() + 30 + self.skew(instance) + 999).div_euclid(1000) * 1000;
        Some((instance, tick))
    }

    /// The real time (Unix ms) at which the first running worker's cluster time reaches `tick`.
    fn first_race_ms(&self, tick: i64) -> i64 {
        let ahead = (0..self.instances.len())
            .filter(|&i| self.instances[i].state == State::Running)
            .map(|i| self.skew(i))
            .max()
            .unwrap_or(0);
        tick - ahead
    }

    /// The next tick that the first running worker races at least `lead_ms` + 20 ms from now.
    fn ghost_tick(&self, lead_ms: u64) -> Option<i64> {
        if !self.instances.iter().any(|i| i.state == State::Running) {
            return None;
        }
        let ahead = now_ms() - self.first_race_ms(0);
        Some((ahead + lead_ms as i64 + 20 + 999).div_euclid(1000) * 1000)
    }
}
