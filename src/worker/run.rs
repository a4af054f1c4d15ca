//! One won tick: the job's child process, run under a lease watchdog.
//!
//! The watchdog renews the lease every `renew_every`. A renewal that merely timed out is retried until the
//! lease's deadline; once the lease is lost (a majority denies it, or the deadline passes) the child is
//! stopped at once — a job must never go on running without its lease. The timeout and a shutdown stop the
//! child the same way. However the run ends, its lease is released and `run.finished` says how it ended.

use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, info_span, warn, Instrument};

use super::Context;
use crate::clock::boot;
use crate::config::JobConfig;
use crate::lock::{Lease, RenewError};
use crate::process::{ChildSpec, ExitKind, RunningChild};

/// After SIGTERM, how long a child that must stop gets before SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(10);

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

/// Runs `job` under `lease` and releases it.
pub(crate) async fn run(context: Arc<Context>, job: JobConfig, lease: Lease) {
    let run_id = uuid::Uuid::new_v4();
    let span = info_span!("run", job = %job.name, tick = %lease.tick, run_id = %run_id, token = lease.token);
    supervise(&context, &job, lease, run_id)
        .instrument(span)
        .await;
}

async fn supervise(context: &Context, job: &JobConfig, mut lease: Lease, run_id: uuid::Uuid) {
    let spec = ChildSpec {
        command: job.command.clone(),
        env: job
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        workdir: job.workdir.clone(),
    };
    let env = vec![
        ("REDCRON_JOB".to_string(), job.name.clone()),
        ("REDCRON_TICK".to_string(), lease.tick.to_string()),
        ("REDCRON_FENCING_TOKEN".to_string(), lease.token.to_string()),
        ("REDCRON_RUN_ID".to_string(), run_id.to_string()),
        ("REDCRON_WORKER_ID".to_string(), context.worker_id.clone()),
    ];
    // The claim may have been granted just before this process was paused (GC, SIGSTOP, a VM freeze): a
    // job must never start on a lease whose deadline has passed. The tick stays claimed and is not run.
    if !lease.is_valid() {
        error!(
            event = "lease.lost",
            error = "lease deadline passed before the job could start",
            "Lease lost before the job started: not starting it"
        );
        context.store.release(&lease).await;
        return;
    }
    let started = tokio::time::Instant::now();
    let mut child = match RunningChild::spawn(&spec, &env) {
        Ok(child) => child,
        Err(err) => {
            error!(event = "run.finished", outcome = Outcome::Failure.as_str(), error = %err, duration_ms = 0u64,
                   "Could not start the job");
            context.store.release(&lease).await;
            return;
        }
    };
    info!(event = "run.started", pid = child.pid(), "Job started");

    let renew_every = context.store.settings().renew_every;
    let timeout = job.timeout.map(|timeout| started + timeout);
    let mut next_renewal = started + renew_every;
    let mut grace_end: Option<tokio::time::Instant> = None;
    let far = started + Duration::from_secs(100 * 365 * 24 * 3600);

    let (exit, outcome) = loop {
        tokio::select! {
            exit = child.wait() => {
                let outcome = match &exit {
                    Ok(kind) if kind.success() => Outcome::Success,
                    _ => Outcome::Failure,
                };
                break (exit, outcome);
            }
            _ = tokio::time::sleep_until(next_renewal) => {
                match context.store.renew(&mut lease).await {
                    Ok(()) => next_renewal = tokio::time::Instant::now() + renew_every,
                    Err(RenewError::Unconfirmed(failure)) => {
                        warn!(event = "lease.renew_failed", error = %failure,
                              remaining_ms = lease.remaining().as_millis() as u64,
                              "Renewal not confirmed by a majority; retrying until the lease's deadline");
                        let retry = (lease.remaining() / 4).max(Duration::from_millis(20));
                        next_renewal = tokio::time::Instant::now() + retry;
                    }
                    Err(lost) => {
                        error!(event = "lease.lost", error = %lost, "Lease lost: stopping the job");
                        break (child.stop(KILL_GRACE).await, Outcome::LeaseLost);
                    }
                }
            }
            // The deadline is watched on its own too: a lease is never trusted past it, whatever the
            // renewal schedule.
            _ = boot::sleep_until(lease.deadline()) => {
                if !lease.is_valid() {
                    error!(event = "lease.lost", error = "lease deadline passed without a confirmed renewal",
                           "Lease lost: stopping the job");
                    break (child.stop(KILL_GRACE).await, Outcome::LeaseLost);
                }
            }
            _ = tokio::time::sleep_until(timeout.unwrap_or(far)), if timeout.is_some() => {
                warn!(event = "run.timeout", timeout_ms = job.timeout.map_or(0, |t| t.as_millis() as u64),
                      "Job timed out: stopping it");
                break (child.stop(KILL_GRACE).await, Outcome::Timeout);
            }
            _ = context.shutdown.graceful(), if grace_end.is_none() => {
                grace_end = Some(tokio::time::Instant::now() + context.shutdown_grace);
                info!(event = "run.draining", grace_ms = context.shutdown_grace.as_millis() as u64,
                      "Shutdown requested: the job may finish within the grace");
            }
            _ = tokio::time::sleep_until(grace_end.unwrap_or(far)), if grace_end.is_some() => {
                break (child.stop(KILL_GRACE).await, Outcome::Shutdown);
            }
            _ = context.shutdown.immediate() => {
                child.kill_now();
                break (child.wait().await, Outcome::Shutdown);
            }
        }
    };

    context.store.release(&lease).await;
    let duration_ms = started.elapsed().as_millis() as u64;
    let outcome = outcome.as_str();
    match exit {
        Ok(ExitKind::Code(code)) => {
            info!(
                event = "run.finished",
                outcome,
                exit_code = code,
                duration_ms,
                "Job finished"
            )
        }
        Ok(ExitKind::Signal(signal)) => {
            info!(
                event = "run.finished",
                outcome, signal, duration_ms, "Job finished"
            )
        }
        Err(err) => {
            error!(event = "run.finished", outcome, error = %err, duration_ms, "Job finished")
        }
    }
}
