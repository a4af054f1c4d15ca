//! A rolling config change, as an operator does one: one worker at a time, SIGTERM (its running jobs
//! finish within the shutdown grace), wait for the process to exit, start it on the new config, wait
//! for its `worker.started`, pause, and on to the next. Meanwhile the fleet runs two config versions.
//!
//! The executor polls it; it never blocks. A worker that is paused when its turn comes is waited for; one
//! that is crashed just gets the new config for its restart.

use std::time::{Duration, Instant};

use super::executor::POLL;
use super::{Cluster, State, EXIT_LIMIT};
use crate::chaos::plan::WORKERS;
use crate::chaos::timeline::Happening;

/// How long a new process may take to log `worker.started` before the rollout moves on anyway.
const START_LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// The next worker's turn.
    Next,
    /// SIGTERM sent to `instance`; waiting for it to exit.
    Draining { instance: usize, since: Instant },
    /// `instance` spawned on the new config; waiting for it to be ready.
    Starting { instance: usize, since: Instant },
    /// Waiting before the next worker.
    Gap { until: Instant },
}

/// A rollout in progress.
pub(super) struct Rollout {
    version: usize,
    order: [usize; WORKERS],
    gap: Duration,
    position: usize,
    phase: Phase,
}

impl Rollout {
    pub(super) fn new(version: usize, order: [usize; WORKERS], gap: Duration) -> Rollout {
        Rollout {
            version,
            order,
            gap,
            position: 0,
            phase: Phase::Next,
        }
    }

    pub(super) fn version(&self) -> usize {
        self.version
    }

    /// How long until the next poll is useful.
    pub(super) fn wait(&self) -> Duration {
        match self.phase {
            Phase::Gap { until } => until.saturating_duration_since(Instant::now()),
            _ => POLL,
        }
    }

    /// Moves the rollout on as far as it can now; true once every worker runs the new config.
    pub(super) fn poll(&mut self, cluster: &mut Cluster) -> bool {
        loop {
            match self.phase {
                Phase::Next => {
                    let Some(&worker) = self.order.get(self.position) else {
                        return true;
                    };
                    let paused = cluster
                        .instances
                        .iter()
                        .any(|i| i.worker == worker && i.state == State::Stopped);
                    if paused {
                        return false;
                    }
                    cluster.versions[worker] = self.version;
                    match cluster.running_instance(worker) {
                        Some(instance) => {
                            cluster.signal(
                                instance,
                                libc::SIGTERM,
                                State::ShutDown,
                                Happening::WorkerShutdown { instance },
                            );
                            self.phase = Phase::Draining {
                                instance,
                                since: Instant::now(),
                            };
                        }
                        // Crashed: its restart (the crash's end) starts it on the new config.
                        None => self.position += 1,
                    }
                }
                Phase::Draining { instance, since } => {
                    if !cluster.exited(instance) {
                        if since.elapsed() < EXIT_LIMIT {
                            return false;
                        }
                        cluster.kill_slow(instance, "a rollout's SIGTERM");
                    }
                    let worker = cluster.instances[instance].worker;
                    let instance = cluster.spawn(worker);
                    self.phase = Phase::Starting {
                        instance,
                        since: Instant::now(),
                    };
                }
                Phase::Starting { instance, since } => {
                    let ready = cluster.journal.has(instance, "worker.started")
                        || cluster.instances[instance].state != State::Running
                        || since.elapsed() > START_LIMIT;
                    if !ready {
                        return false;
                    }
                    self.phase = Phase::Gap {
                        until: Instant::now() + self.gap,
                    };
                }
                Phase::Gap { until } => {
                    if Instant::now() < until {
                        return false;
                    }
                    self.position += 1;
                    self.phase = Phase::Next;
                }
            }
        }
    }
}
