//! One won tick: the job's child process, run under a lease watchdog.
//!
//! The child must be gone by the lease's deadline, whatever happens: past it, another worker may hold
//! the job. So the watchdog renews the lease on schedule (`renew_every` apart, retrying a renewal that
//! merely timed out), and stops the child — SIGTERM, then SIGKILL after the job's `stop_grace`, but
//! never later than the deadline:
//! - when the lease has only `stop_grace` left without a confirmed renewal, so that SIGKILL, if it
//!   comes to that, falls on the deadline;
//! - at once when a majority answers that the lease is not held (another holder may already run);
//! - at the job's timeout, and at the end of a shutdown's grace (at once after a second signal).
//!
//! Renewals go on while the child stops, so the lease stays held while the child lives; one that is
//! confirmed then does not take the stop back. However the run ends, its lease is released and
//! `run.finished` says how it ended.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use tracing::{error, info, info_span, warn, Instrument};

use super::env::job_environment;
use super::slots::Slot;
use super::Context;
use crate::config::JobConfig;
use crate::history::{Entry, Kind};
use crate::lock::{renew_when_left, Lease, RenewError};
use crate::logging::events;
use crate::membership::Running;
use crate::metrics::Metrics;
use crate::process::reaper::RUN_MARKER;
use crate::process::{ChildSpec, ExitKind, ProcessError, RunningChild};
use crate::store::Store;

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Failure,
    Timeout,
    LeaseLost,
    Shutdown,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
            Outcome::Timeout => "timeout",
            Outcome::LeaseLost => "lease_lost",
            Outcome::Shutdown => "shutdown",
        }
    }
}

/// How the watch over a running child ended.
enum Watched {
    /// The child exited by itself.
    Exited(Result<ExitKind, ProcessError>),
    /// The child must be stopped, for this reason; `now`: SIGKILL right after SIGTERM.
    Stop { outcome: Outcome, now: bool },
}

/// Runs `job` under `lease` and releases it; returns the run's final history entry, or `None` if it was
/// not run (for the retries and the alert hooks, [`super::retry::after_run`]). The start may wait for a
/// child slot until `until` (cluster time), the end of the claim's window.
///
/// Not an `async fn`: its arguments would be kept in the future beside the copies `supervise` keeps, and
/// a herd holds thousands of these futures at once.
pub(crate) fn run(
    context: Arc<Context>,
    job: Arc<JobConfig>,
    lease: Lease,
    until: DateTime<Utc>,
) -> impl Future<Output = Option<Entry>> + Send {
    let run_id = uuid::Uuid::new_v4();
    let span = info_span!("run", job = %job.name, tick = %lease.tick, run_id = %run_id, token = lease.token);
    supervise(context, job, lease, until, run_id).instrument(span)
}

/// Runs the job to its end; returns the run's final history entry (also for a child that could not be
/// started), or `None` if it was not run.
async fn supervise(
    context: Arc<Context>,
    job: Arc<JobConfig>,
    lease: Lease,
    until: DateTime<Utc>,
    run_id: uuid::Uuid,
) -> Option<Entry> {
    let (context, job) = (&*context, &*job);
    // The watchdog keeps the lease from the win on, also while the run waits to start.
    let mut renewer = Renewer::new(context, lease);
    // The slot is held until the run has ended: its child exited and its output was read.
    let (mut child, _slot) = match start(context, job, &mut renewer, until, run_id).await {
        Ok(started) => started,
        Err(ended) => return ended,
    };
    let lease = &renewer.lease;
    let started = tokio::time::Instant::now();
    // The run's history entry: written now (a run under way), and again with how it ended.
    let mut entry = context.entry(job, lease.tick, &lease.series, Kind::Run);
    entry.token = Some(lease.token);
    entry.run_id = Some(run_id.to_string());
    entry.started_at = Some(entry.recorded_at);
    entry.raced = context.ranked(&job.name, lease.tick);
    if lease.series.attempt() == 0 {
        // The schedule lag of a retry would be its backoff.
        context
            .metrics
            .run_started(&job.name, lease.tick, entry.recorded_at);
    }
    context.recorder.note(entry.clone());
    let run_key = run_id.to_string();
    let running = Running {
        job: job.name.clone(),
        tick: lease.tick.as_millis(),
        token: lease.token,
    };
    context.set_running(&run_key, Some(running));
    let (exit, outcome) = match watch(context, job, &mut child, &mut renewer, started).await {
        Watched::Exited(exit) => {
            let success = matches!(&exit, Ok(kind) if kind.success());
            let outcome = if success {
                Outcome::Success
            } else {
                Outcome::Failure
            };
            (exit, outcome)
        }
        Watched::Stop { outcome, now } => {
            let exit = stop(context, job, &mut child, &mut renewer, outcome, now).await;
            (exit, outcome)
        }
    };
    context.store.release_soon(&renewer.lease).await;
    context.set_running(&run_key, None);
    let duration_ms = started.elapsed().as_millis() as u64;
    if outcome != Outcome::Success {
        // Read whole: `watch` and `stop` return once the output was (or was abandoned after SIGKILL).
        let tails = child.tails();
        (entry.tail_out, entry.tail_err) = (tails.stdout, tails.stderr);
    }
    let outcome = outcome.as_str();
    entry.recorded_at = context.clock.now();
    entry.ended_at = Some(entry.recorded_at);
    entry.outcome = Some(outcome.to_string());
    entry.retry_in_ms = super::retry::retry_in_ms(job, &renewer.lease.series, outcome);
    entry.duration_ms = Some(duration_ms);
    match &exit {
        Ok(ExitKind::Code(code)) => entry.exit_code = Some(*code),
        Ok(ExitKind::Signal(signal)) => entry.signal = Some(*signal),
        Err(err) => entry.reason = Some(err.to_string()),
    }
    context.recorder.note(entry.clone());
    context
        .metrics
        .run_finished(&job.name, outcome, started.elapsed());
    match exit {
        Ok(ExitKind::Code(code)) => {
            info!(
                event = events::run::FINISHED,
                outcome,
                exit_code = code,
                duration_ms,
                "Job finished"
            )
        }
        Ok(ExitKind::Signal(signal)) => {
            info!(
                event = events::run::FINISHED,
                outcome, signal, duration_ms, "Job finished"
            )
        }
        Err(err) => {
            error!(event = events::run::FINISHED, outcome, error = %err, duration_ms, "Job finished")
        }
    }
    Some(entry)
}

/// Takes a slot for the child ([`super::slots`]), spawns it with its environment (see
/// [`job_environment`]) and logs `run.started`. If it must not start, releases the lease and logs why:
/// `Err(None)`; if it could not start, also the run's final history entry: `Err(Some(entry))`.
async fn start(
    context: &Context,
    job: &JobConfig,
    renewer: &mut Renewer<'_>,
    until: DateTime<Utc>,
    run_id: uuid::Uuid,
) -> Result<(RunningChild, Slot), Option<Entry>> {
    let slot = take_slot(context, renewer, until).await;
    let lease = &renewer.lease;
    let mut redcron = vec![
        ("REDCRON_JOB".to_string(), job.name.clone()),
        ("REDCRON_TICK".to_string(), lease.tick.to_string()),
        ("REDCRON_FENCING_TOKEN".to_string(), lease.token.to_string()),
        // Inherited by the job's descendants: how the worker tells whose the processes left behind are.
        (RUN_MARKER.to_string(), run_id.to_string()),
        ("REDCRON_WORKER_ID".to_string(), context.worker_id.clone()),
    ];
    if let Some(id) = lease.series.trigger() {
        redcron.push(("REDCRON_TRIGGER".to_string(), id.to_string()));
    }
    let attempt = lease.series.attempt().to_string();
    redcron.push(("REDCRON_ATTEMPT".to_string(), attempt));
    let spec = ChildSpec {
        command: job.command.clone(),
        env: job_environment(
            &context.worker_env,
            &job.inherit_env,
            &context.secret_env_vars,
            &job.env,
            &redcron,
        ),
        workdir: job.workdir.clone(),
        stop_grace: job.stop_grace,
    };
    // The claim may have been granted just before this process was paused (GC, SIGSTOP, a VM freeze): a
    // job must never start on a lease whose deadline has passed, nor on one so near its deadline that it
    // would be stopped at once. The tick stays claimed and is not run.
    let slot = match slot {
        Waited::Slot(slot) if lease.remaining() > job.stop_grace => slot,
        waited => {
            let reason = match waited {
                Waited::Slot(_) => {
                    error!(
                        event = events::lease::LOST,
                        error =
                            "lease deadline (less stop_grace) passed before the job could start",
                        "Lease lost before the job started: not starting it"
                    );
                    context.metrics.lease_lost(&job.name);
                    "lease_expired"
                }
                // The renewal that found it lost logged it (`lease.lost`) and counted it.
                Waited::Lost => "lease_expired",
                Waited::Shutdown => {
                    info!(
                        event = events::tick::SKIPPED,
                        reason = "shutdown",
                        "Skipped: shutdown was requested while the run waited for a slot"
                    );
                    "shutdown"
                }
                Waited::NoSlot => {
                    let max_children = context.child_slots.capacity();
                    error!(event = events::tick::SKIPPED, reason = "no_slot", max_children,
                           "Skipped: this worker ran its most children at once until the tick's window ended (see fd_limit in worker.started)");
                    "no_slot"
                }
            };
            context.metrics.tick_skipped(&job.name, reason);
            context.store.release(lease).await;
            let mut entry = context.entry(job, lease.tick, &lease.series, Kind::Skipped);
            entry.reason = Some(reason.to_string());
            entry.token = Some(lease.token);
            context.recorder.note(entry);
            return Err(None);
        }
    };
    match RunningChild::spawn_keeping(&spec, job.output_tail) {
        Ok(child) => {
            info!(
                event = events::run::STARTED,
                pid = child.pid(),
                "Job started"
            );
            Ok((child, slot))
        }
        Err(err) => {
            error!(event = events::run::FINISHED, outcome = Outcome::Failure.as_str(), error = %err, duration_ms = 0u64,
                   "Could not start the job");
            let failure = Outcome::Failure.as_str();
            context
                .metrics
                .run_finished(&job.name, failure, Duration::ZERO);
            context.store.release(lease).await;
            let mut entry = context.entry(job, lease.tick, &lease.series, Kind::Run);
            entry.token = Some(lease.token);
            entry.run_id = Some(run_id.to_string());
            entry.outcome = Some(failure.to_string());
            entry.retry_in_ms = super::retry::retry_in_ms(job, &lease.series, failure);
            entry.reason = Some(format!("could not start: {err}"));
            entry.ended_at = Some(entry.recorded_at);
            entry.duration_ms = Some(0);
            context.recorder.note(entry.clone());
            Err(Some(entry))
        }
    }
}

/// What the wait for a child slot came to.
enum Waited {
    Slot(Slot),
    /// No slot freed within the wait's bound.
    NoSlot,
    /// A renewal during the wait found the lease lost.
    Lost,
    /// Shutdown was requested during the wait: a run that has not started does not start then.
    Shutdown,
}

/// Waits for a child slot (a herd may fill every slot) until `until`, the end of the claim's window, or
/// until shutdown is requested, renewing the lease meanwhile. A renewal that is due is made first: in a
/// herd, thousands of won ticks queue behind each other's spawns on the runtime's threads, and one that
/// comes to start late must not find its lease too near its deadline to start.
async fn take_slot(context: &Context, renewer: &mut Renewer<'_>, until: DateTime<Utc>) -> Waited {
    if renewer.is_due() && renewer.next().await == Renewal::Lost {
        return Waited::Lost;
    }
    let window = (until - context.clock.now()).to_std().unwrap_or_default();
    let take = context.child_slots.take(window);
    tokio::pin!(take);
    loop {
        tokio::select! {
            // A slot free at once is taken even during shutdown: the tick is granted to this worker, so
            // no other may run it, and the run gets the shutdown grace like any other (see `settle`).
            biased;
            slot = &mut take => return slot.map_or(Waited::NoSlot, Waited::Slot),
            () = context.shutdown.graceful() => return Waited::Shutdown,
            renewal = renewer.next() => {
                if renewal == Renewal::Lost {
                    return Waited::Lost;
                }
            }
        }
    }
}

/// Watches the running child until it exits or must be stopped: renewals, the lease's stop point, the
/// timeout, the shutdown grace.
async fn watch(
    context: &Context,
    job: &JobConfig,
    child: &mut RunningChild,
    renewer: &mut Renewer<'_>,
    started: tokio::time::Instant,
) -> Watched {
    let timeout = job.timeout.map(|timeout| started + timeout);
    let far = started + Duration::from_secs(100 * 365 * 24 * 3600);
    let mut grace_end: Option<tokio::time::Instant> = None;
    let stop = |outcome| Watched::Stop {
        outcome,
        now: false,
    };
    let gone = context.store.lease_gone(&renewer.lease);
    tokio::pin!(gone);
    loop {
        // Renewals move the deadline, so the stop point is recomputed on every turn.
        let stop_at = lease_now() + renewer.lease.remaining().saturating_sub(job.stop_grace);
        tokio::select! {
            exit = child.wait() => return Watched::Exited(exit),
            renewal = renewer.next() => {
                if renewal == Renewal::Lost {
                    return stop(Outcome::LeaseLost);
                }
            }
            () = &mut gone => {
                error!(event = events::lease::LOST, error = "the store took the lease away (its lease key is gone)",
                       "Lease lost: the job is stopped");
                context.metrics.lease_lost(&job.name);
                return stop(Outcome::LeaseLost);
            }
            () = sleep_until(stop_at) => {
                error!(event = events::lease::EXPIRING, remaining_ms = renewer.lease.remaining().as_millis() as u64,
                       stop_grace_ms = job.stop_grace.as_millis() as u64,
                       "Lease not renewed by stop_grace before its deadline: stopping the job so that it is gone by then");
                context.metrics.lease_lost(&job.name);
                return stop(Outcome::LeaseLost);
            }
            () = tokio::time::sleep_until(timeout.unwrap_or(far)), if timeout.is_some() => {
                warn!(event = events::run::TIMEOUT, timeout_ms = job.timeout.map_or(0, |t| t.as_millis() as u64),
                      "Job timed out: stopping it");
                return stop(Outcome::Timeout);
            }
            () = context.shutdown.graceful(), if grace_end.is_none() => {
                grace_end = Some(tokio::time::Instant::now() + context.shutdown_grace);
                info!(event = events::run::DRAINING, grace_ms = context.shutdown_grace.as_millis() as u64,
                      "Shutdown requested: the job may finish within the grace");
            }
            () = tokio::time::sleep_until(grace_end.unwrap_or(far)), if grace_end.is_some() => {
                return stop(Outcome::Shutdown);
            }
            () = context.shutdown.immediate() => {
                return Watched::Stop { outcome: Outcome::Shutdown, now: true };
            }
        }
    }
}

/// Stops the child: SIGTERM now, SIGKILL after `stop_grace` but never later than the lease's deadline
/// (at once when `now`, or when a second shutdown signal comes). Renewals go on meanwhile.
async fn stop(
    context: &Context,
    job: &JobConfig,
    child: &mut RunningChild,
    renewer: &mut Renewer<'_>,
    outcome: Outcome,
    now: bool,
) -> Result<ExitKind, ProcessError> {
    let kill_at = if now {
        lease_now()
    } else {
        renewer.lease.deadline().min(lease_now() + job.stop_grace)
    };
    let kill_in = kill_at.saturating_duration_since(lease_now());
    info!(event = events::run::STOPPING, reason = outcome.as_str(), kill_in_ms = kill_in.as_millis() as u64,
          "Stopping the job: SIGTERM now, SIGKILL if it has not exited by the lease's deadline or stop_grace");
    let kill = async {
        tokio::select! {
            () = sleep_until(kill_at) => {}
            () = context.shutdown.immediate() => {}
        }
    };
    let stopping = child.stop_when(kill);
    tokio::pin!(stopping);
    loop {
        tokio::select! {
            exit = &mut stopping => return exit,
            renewal = renewer.next() => {
                if renewal == Renewal::Renewed {
                    info!(event = events::lease::RENEWED_WHILE_STOPPING,
                          "Lease renewed while the job is being stopped; the stop goes on");
                }
            }
        }
    }
}

/// What one renewal came to (already logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    Renewed,
    Unconfirmed,
    Lost,
}

/// A renewal's result, with the lease it renewed.
type Renewing<'a> = Pin<Box<dyn Future<Output = (Lease, Result<(), RenewError>)> + Send + 'a>>;

/// The lease of a run and its renewals: when the next one is due, and the one on its way.
struct Renewer<'a> {
    store: &'a Store,
    metrics: &'a Metrics,
    lease: Lease,
    next_at: LeaseInstant,
    in_flight: Option<Renewing<'a>>,
}

impl<'a> Renewer<'a> {
    fn new(context: &'a Context, lease: Lease) -> Renewer<'a> {
        let (store, metrics) = (&context.store, &context.metrics);
        let next_at = on_schedule(store, &lease);
        Renewer {
            store,
            metrics,
            lease,
            next_at,
            in_flight: None,
        }
    }

    /// Whether a renewal is due now or on its way.
    fn is_due(&self) -> bool {
        !self.lease.is_lost() && (self.in_flight.is_some() || lease_now() >= self.next_at)
    }

    /// Sends the next renewal when it is due and returns what it came to, logged; never returns once the
    /// lease is lost. Cancel-safe: a renewal on its way is kept and awaited by the next call.
    async fn next(&mut self) -> Renewal {
        if self.lease.is_lost() {
            return std::future::pending().await;
        }
        if self.in_flight.is_none() {
            sleep_until(self.next_at).await;
            let (store, mut lease) = (self.store, self.lease.clone());
            self.in_flight = Some(Box::pin(async move {
                let result = store.renew(&mut lease).await;
                (lease, result)
            }));
        }
        let Some(in_flight) = self.in_flight.as_mut() else {
            return std::future::pending().await;
        };
        let (lease, result) = in_flight.await;
        self.in_flight = None;
        self.lease = lease;
        match result {
            Ok(()) => {
                self.next_at = on_schedule(self.store, &self.lease);
                Renewal::Renewed
            }
            Err(RenewError::Unconfirmed(failure)) => {
                let remaining = self.lease.remaining();
                warn!(event = events::lease::RENEW_FAILED, error = %failure, remaining_ms = remaining.as_millis() as u64,
                      "Renewal not confirmed by a majority; retrying until the lease's deadline");
                self.metrics.lease_renew_failed(&self.lease.job);
                self.next_at = lease_now() + (remaining / 4).max(Duration::from_millis(20));
                Renewal::Unconfirmed
            }
            Err(lost) => {
                error!(event = events::lease::LOST, error = %lost, "Lease lost: the job is stopped (or, still waiting to start, not started)");
                self.metrics.lease_lost(&self.lease.job);
                Renewal::Lost
            }
        }
    }
}

/// When `lease` is due for renewal: once it has `ttl − drift − renew_every` left, i.e. `renew_every`
/// after the start of the claim or renewal that set its deadline, so that a renewal confirmed within
/// `node_timeout` still leaves it the slack that `stop_grace` fits in.
fn on_schedule(store: &Store, lease: &Lease) -> LeaseInstant {
    let left = renew_when_left(store.settings());
    lease_now() + lease.remaining().saturating_sub(left)
}

// The clock of `Lease::deadline()`: every wait on the lease goes through these two, so a change of
// that clock is a change here only.
type LeaseInstant = crate::clock::boot::BootInstant;

fn lease_now() -> LeaseInstant {
    LeaseInstant::now()
}

async fn sleep_until(at: LeaseInstant) {
    crate::clock::boot::sleep_until(at).await
}
