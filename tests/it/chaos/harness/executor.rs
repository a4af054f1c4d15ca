//! The executor: carries out a [`Plan`] on the [`Cluster`], at the plan's times, and writes down in the
//! timeline what it did. A fault aimed at "the long job's holder" is resolved here, from the journal.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use super::config::faketime_spec;
use super::{now_ms, watch_latency, Cluster, State};
use crate::chaos::plan::{Case, Fault, Happening, Plan, ProxyMode, Target};

/// What a begun episode hit, so that its end can undo it.
#[derive(Debug, Clone, Copy)]
enum Hit {
    Instance(usize),
    Worker(usize),
    Node(usize),
    Proxy,
    Nothing,
}

impl Cluster {
    /// Carries out the plan; returns when its last fault is undone and the plan's time is up.
    pub fn execute(&mut self, plan: &Plan) {
        let start = Instant::now();
        // (when, sequence, episode, is_end)
        let mut queue: BinaryHeap<Reverse<(Duration, usize, usize, bool)>> = BinaryHeap::new();
        for (index, episode) in plan.episodes.iter().enumerate() {
            queue.push(Reverse((
                Duration::from_millis(episode.at_ms),
                index,
                index,
                false,
            )));
        }
        let mut hits: HashMap<usize, Hit> = HashMap::new();
        let mut sequence = plan.episodes.len();
        while let Some(Reverse((at, _, index, is_end))) = queue.pop() {
            std::thread::sleep(at.saturating_sub(start.elapsed()));
            let episode = plan.episodes[index];
            if is_end {
                if let Some(hit) = hits.remove(&index) {
                    self.end(episode.fault, hit);
                }
                continue;
            }
            let hit = self.begin(episode.fault, episode.case);
            if !matches!(hit, Hit::Nothing) {
                hits.insert(index, hit);
                sequence += 1;
                let end = start.elapsed() + Duration::from_millis(episode.fault.duration_ms());
                queue.push(Reverse((end, sequence, index, true)));
            }
        }
        std::thread::sleep(Duration::from_secs(plan.secs).saturating_sub(start.elapsed()));
    }

    fn begin(&mut self, fault: Fault, case: Option<Case>) -> Hit {
        let skip = |cluster: &mut Cluster, why: &str| {
            cluster.timeline.push(
                now_ms(),
                Happening::Skipped {
                    fault,
                    why: why.to_string(),
                },
            );
            Hit::Nothing
        };
        match fault {
            Fault::Pause { target, .. } | Fault::Crash { target, .. } => {
                let found = match target {
                    Target::Worker(worker) => self.running_instance(worker).map(|i| (i, None)),
                    Target::LongHolder => self
                        .find_long_holder(case.is_some())
                        .map(|(i, run)| (i, Some(run))),
                };
                let Some((instance, run_id)) = found else {
                    return skip(self, "no running target");
                };
                let worker = self.instances[instance].worker;
                if let (Some(case), Some(run_id)) = (case, run_id) {
                    self.timeline.push(
                        now_ms(),
                        Happening::CaseBegan {
                            case,
                            instance,
                            run_id,
                        },
                    );
                }
                if let Fault::Pause { .. } = fault {
                    self.signal(
                        instance,
                        libc::SIGSTOP,
                        State::Stopped,
                        Happening::WorkerStopped { instance },
                    );
                    Hit::Instance(instance)
                } else {
                    // Its jobs live on, orphaned, as after a real crash; the handle is kept for the logs.
                    self.signal(
                        instance,
                        libc::SIGKILL,
                        State::Killed,
                        Happening::WorkerKilled { instance },
                    );
                    Hit::Worker(worker)
                }
            }
            Fault::KillNode { node, .. } => {
                self.nodes.kill(node);
                self.timeline
                    .push(now_ms(), Happening::NodeDown { node, hung: false });
                Hit::Node(node)
            }
            Fault::HangNode { node, .. } => {
                self.nodes.stop(node);
                self.timeline
                    .push(now_ms(), Happening::NodeDown { node, hung: true });
                Hit::Node(node)
            }
            Fault::Proxy { mode, .. } => {
                self.proxy.set(mode);
                // Start each degraded phase by cutting what is open: the clients must reconnect.
                self.proxy.cut();
                self.timeline.push(now_ms(), Happening::Proxy { mode });
                Hit::Proxy
            }
            Fault::Jump { worker, offset_ms } => {
                std::fs::write(&self.clock_file, faketime_spec(offset_ms))
                    .expect("cannot write the clock file");
                self.offsets[worker] = offset_ms;
                self.timeline
                    .push(now_ms(), Happening::Clock { worker, offset_ms });
                Hit::Nothing
            }
        }
    }

    fn end(&mut self, fault: Fault, hit: Hit) {
        match (fault, hit) {
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
            (Fault::KillNode { .. }, Hit::Node(node)) => {
                self.nodes.restart(node);
                watch_latency(&self.nodes, node);
                self.timeline.push(now_ms(), Happening::NodeUp { node });
            }
            (Fault::HangNode { .. }, Hit::Node(node)) => {
                self.nodes.cont(node);
                self.timeline.push(now_ms(), Happening::NodeUp { node });
            }
            (Fault::Proxy { .. }, Hit::Proxy) => {
                self.proxy.set(ProxyMode::Clean);
                self.timeline.push(
                    now_ms(),
                    Happening::Proxy {
                        mode: ProxyMode::Clean,
                    },
                );
            }
            _ => {}
        }
    }

    /// A running worker process whose long job is running. For a deterministic case, waits (up to 12 s)
    /// for a run that has just started, so that the pause lands before its first renewal.
    fn find_long_holder(&self, fresh: bool) -> Option<(usize, String)> {
        let deadline = Instant::now() + Duration::from_secs(if fresh { 12 } else { 3 });
        loop {
            let running: Vec<usize> = (0..self.instances.len())
                .filter(|&i| self.instances[i].state == State::Running)
                .collect();
            let since = if fresh { now_ms() - 250 } else { 0 };
            if let Some(found) = self.journal.long_run(&running, since) {
                return Some(found);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.journal.wait(left.min(Duration::from_millis(100)));
        }
    }
}
