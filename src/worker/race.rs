//! The race for a batch of due ticks: claim them together, retry what is not final with the same
//! claimant, and settle each final outcome — run what was won, record what was not.
//!
//! Ticks due at one instant travel in one batch (one pipelined round trip per node and round). Each tick
//! keeps its claimant across retries, so a retry continues the claim instead of competing with it. What a
//! worker learns about a tick it did not run (lost to another claimant, skipped for overlap, given up at
//! the end of its window) goes to the history, and a tick given up is checked for a miss.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::{run, BusyGuard, Context};
use crate::config::JobConfig;
use crate::history::Kind;
use crate::lock::{ClaimOutcome, ClaimRequest};
use crate::schedule::Tick;

/// The first wait before a tick that found no quorum is raced again; it doubles up to the maximum.
const NO_QUORUM_BACKOFF: Duration = Duration::from_millis(250);
const NO_QUORUM_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// One tick being raced: the job, its claim request (one claimant, kept across retries), and when to
/// try again.
struct Pending {
    job: JobConfig,
    request: ClaimRequest,
    guard: Option<BusyGuard>,
    retry_at: tokio::time::Instant,
    /// The next wait after a `NoQuorum` (doubles up to [`NO_QUORUM_BACKOFF_MAX`]).
    backoff: Duration,
}

/// Claims a batch of due ticks (one pipelined round trip per node and round) and settles each outcome in
/// its own task; returns when every run (and every retry) has ended.
///
/// An outcome that is not final — no quorum, a contender of the same tick between its rounds (or crashed
/// there), a claim won by a worker that was paused until its lease expired — is retried with the *same*
/// request, so the retry continues this worker's claim instead of competing with it, until the job's
/// misfire grace ends or its next tick is due. Ticks retried at one instant travel together again, so a
/// retry costs one round trip per node however many jobs it carries.
pub(super) async fn race(context: Arc<Context>, batch: Vec<(JobConfig, Tick, Option<BusyGuard>)>) {
    let mut settling = JoinSet::new();
    let first_tick = batch.first().map_or(Tick(0), |(_, tick, _)| *tick);
    let now = tokio::time::Instant::now() + stagger(&context, first_tick);
    let mut pending: Vec<Pending> = batch
        .into_iter()
        .map(|(job, tick, guard)| Pending {
            request: ClaimRequest::new(
                &context.worker_id,
                &job.name,
                tick,
                job.overlap,
                &job.fingerprint(),
            ),
            retry_at: now + job.jitter_for(tick),
            job,
            guard,
            backoff: NO_QUORUM_BACKOFF,
        })
        .collect();
    while let Some(ready_at) = pending.iter().map(|p| p.retry_at).min() {
        tokio::select! {
            _ = tokio::time::sleep_until(ready_at) => {}
            _ = context.shutdown.graceful() => {}
        }
        if context.shutdown.is_requested() {
            for p in &pending {
                info!(event = "tick.skipped", job = %p.job.name, tick = %p.request.tick, reason = "shutdown",
                      "Skipped: shutdown was requested while the tick was being raced");
                context.note(
                    &p.job,
                    p.request.tick,
                    Kind::Skipped,
                    Some("shutdown"),
                    None,
                );
            }
            break;
        }
        let now = tokio::time::Instant::now();
        let (ready, waiting): (Vec<Pending>, Vec<Pending>) =
            pending.into_iter().partition(|p| p.retry_at <= now);
        pending = waiting;
        let requests: Vec<ClaimRequest> = ready.iter().map(|p| p.request.clone()).collect();
        let claimed_at = std::time::Instant::now();
        let outcomes = context.store.claim_many(&requests).await;
        context.metrics.claimed(claimed_at.elapsed());
        for (mut p, outcome) in ready.into_iter().zip(outcomes) {
            context.note_other_definition(&p.job, p.request.tick, outcome.other());
            let wait = match &outcome {
                // Won, but too close to (or past) the lease's deadline to start: the process was paused.
                // The same claimant claims the tick again, with a fresh lease (see `run::start`).
                ClaimOutcome::Won(lease) if lease.remaining() <= p.job.stop_grace => {
                    Some(Duration::ZERO)
                }
                ClaimOutcome::NoQuorum(_) => {
                    let wait = p.backoff;
                    p.backoff = (p.backoff * 2).min(NO_QUORUM_BACKOFF_MAX);
                    Some(wait)
                }
                other => other.retry_in(),
            };
            let Some(wait) = wait else {
                settling.spawn(settle(
                    Arc::clone(&context),
                    p.job,
                    p.request.tick,
                    p.guard,
                    outcome,
                ));
                continue;
            };
            let retry_at =
                context.clock.now() + chrono::Duration::from_std(wait).unwrap_or_default();
            if retry_at >= give_up_at(&p.job, p.request.tick) {
                give_up(&context, &p, &outcome);
                continue;
            }
            retrying(&p, &outcome, wait);
            p.retry_at = tokio::time::Instant::now() + wait;
            pending.push(p);
        }
    }
    while settling.join_next().await.is_some() {}
}

/// How long this worker waits before its first claim of a batch due at `tick`.
///
/// Workers on cluster time wake for a tick at the same instant, and contenders that reach the nodes at the
/// same moment split their votes — with a node or two down, a split can last until the tick's window ends.
/// So each worker starts after a delay of up to a quarter of `retry_delay`, drawn from a stable hash of
/// (worker id, tick): usually one worker claims the tick's jobs alone and the others find them claimed, and
/// which worker goes first changes from tick to tick. The embedded store has no contenders: no delay.
fn stagger(context: &Context, tick: Tick) -> Duration {
    if !context.store.is_shared() {
        return Duration::ZERO;
    }
    let spread = context.store.settings().retry_delay / 4;
    let key = format!("{}\n{}", context.worker_id, tick.as_millis());
    let fraction = (crate::config::fnv1a(key.as_bytes()) % 1_000_000) as f64 / 1_000_000.0;
    spread.mul_f64(fraction)
}

/// Logs a retry of a tick whose outcome was not final.
fn retrying(p: &Pending, outcome: &ClaimOutcome, wait: Duration) {
    let (job, tick, retry_in_ms) = (&p.job.name, p.request.tick, wait.as_millis() as u64);
    match outcome {
        ClaimOutcome::NoQuorum(failure) => {
            warn!(event = "tick.retrying", job = %job, tick = %tick, reason = "no_quorum", error = %failure,
                  retry_in_ms, "No majority of Redis nodes answered; racing again")
        }
        ClaimOutcome::Contended { holder, .. } => {
            info!(event = "tick.retrying", job = %job, tick = %tick, reason = "contended",
                  holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()), retry_in_ms,
                  "Another worker holds the lease for this tick without having claimed it; racing again once it has decided or its lease expired")
        }
        _ => {
            warn!(event = "tick.retrying", job = %job, tick = %tick, reason = "lease_expired",
                  retry_in_ms, "Won the tick, but the lease expired before the job could start (was this process paused?); claiming it again")
        }
    }
}

/// Logs and records a tick given up at the end of its grace, and why, and has it checked for a miss (the
/// cluster-wide ERROR, once, is `tick.missed`).
fn give_up(context: &Context, p: &Pending, outcome: &ClaimOutcome) {
    let reason = match outcome {
        ClaimOutcome::NoQuorum(_) => "no_quorum",
        ClaimOutcome::Contended { .. } => "contended",
        _ => "lease_expired",
    };
    context.note(&p.job, p.request.tick, Kind::Skipped, Some(reason), None);
    context.suspect(&p.job, p.request.tick);
    let (job, tick) = (&p.job.name, p.request.tick);
    match outcome {
        ClaimOutcome::NoQuorum(failure) => {
            warn!(event = "tick.skipped", job = %job, tick = %tick, reason = "no_quorum", error = %failure,
                   "Skipped: no majority of Redis nodes answered within the grace")
        }
        ClaimOutcome::Contended { holder, .. } => {
            warn!(event = "tick.skipped", job = %job, tick = %tick, reason = "contended",
                   holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()),
                   "Skipped: another worker held this tick's lease without claiming it until the grace ended")
        }
        _ => {
            warn!(event = "tick.skipped", job = %job, tick = %tick, reason = "lease_expired",
                   "Skipped: every lease won for this tick expired before the job could start, until the grace ended")
        }
    }
}

/// When a tick that has not been settled stops being raced: at the job's next tick or the end of its
/// misfire grace, whichever comes first.
pub(super) fn give_up_at(job: &JobConfig, tick: Tick) -> chrono::DateTime<Utc> {
    job.window_end(tick)
}

/// Acts on a final claim outcome: runs a won tick, logs a lost one.
async fn settle(
    context: Arc<Context>,
    job: JobConfig,
    tick: Tick,
    guard: Option<BusyGuard>,
    outcome: ClaimOutcome,
) {
    match outcome {
        // Also when shutdown was requested while racing: the tick is granted to this worker, so no other
        // worker may run it; the run gets the shutdown grace like any running job.
        ClaimOutcome::Won(lease) => {
            info!(event = "tick.won", job = %job.name, tick = %tick, token = lease.token, "Won the tick");
            run::run(Arc::clone(&context), job, lease).await;
        }
        ClaimOutcome::AlreadyClaimed { by } => {
            info!(event = "tick.lost", job = %job.name, tick = %tick, reason = "already_claimed",
                  by = by.as_ref().map_or("unknown", |by| by.worker.as_str()),
                  "Lost the tick: another worker claimed it");
            let by = by.map(|by| by.worker);
            context.note(
                &job,
                tick,
                Kind::Lost,
                Some("already_claimed"),
                by.as_deref(),
            );
        }
        ClaimOutcome::Busy { holder, ttl } => {
            info!(event = "tick.lost", job = %job.name, tick = %tick, reason = "busy",
                  holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()),
                  holder_tick = %holder.as_ref().and_then(|h| h.tick).map_or(String::new(), |t| t.to_string()),
                  holder_ttl_ms = ttl.map_or(0, |ttl| ttl.as_millis() as u64),
                  "Lost the tick: the previous run still holds the job");
            let by = holder.map(|holder| holder.worker);
            context.note(&job, tick, Kind::Skipped, Some("overlap"), by.as_deref());
        }
        ClaimOutcome::Paused(pause) => {
            info!(event = "tick.skipped", job = %job.name, tick = %tick, reason = "paused",
                  paused_by = %pause.by, paused_reason = %pause.reason,
                  paused_until = %pause.until.map_or(String::new(), |until| until.to_rfc3339()),
                  "Skipped: the job is paused (redcron pause)");
            context.note(&job, tick, Kind::Skipped, Some("paused"), None);
        }
        ClaimOutcome::Contended { .. } | ClaimOutcome::NoQuorum(_) => {
            // Never settled: `race` retries these until it gives up, and logs that.
        }
    }
    drop(guard);
}
