//! Retries of a failed run: `retries: N` more attempts, each claimed through the lock as attempt `k` of
//! the same tick ([`Series::Retry`]), so exactly one worker runs it, with a token above the failed run's.
//!
//! The worker that ran the tick decides, once the run ended: a run that ended in `failure` (a non-zero exit,
//! or a job that could not start) or `timeout` is tried again, until an attempt succeeds or `retries` more
//! attempts have run. A run that lost its lease is not (the lock took the job away, not the job failed, and
//! another worker may already hold it), nor one stopped by a shutdown. Attempt `k` waits
//! [`crate::config::RetryPolicy::delay`] after the attempt before it ended, then is raced like a trigger:
//! while another run holds the job (`overlap: skip`) it waits for it, within the job's `misfire_grace`.
//! Only the final outcome reaches the alert hooks; the failed attempt's history entry says that another
//! follows (`retry_in_ms`), so that no alert takes it for the tick's outcome. The wait lives in this
//! worker: if it dies or shuts down before the retry, the retry is lost (recorded as skipped, `shutdown`,
//! when it shuts down).
//!
//! A retry runs the job as the config in force defines it *when the retry is due*, not as it was when the
//! failed attempt ran: a reload meanwhile may have removed the job (or renamed it), disabled it, or changed
//! it. The retry of a job that is gone or disabled is not run, and recorded as skipped (`removed`,
//! `disabled`); one whose attempt the new definition's `retries` no longer allow is skipped too
//! (`retries_lowered`, and its failure reaches the alert hooks as final); any other runs the new definition
//! (its command, environment, timeout, overlap rule, and its `retries` and backoff for what follows).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::race::{self, series_span, Due};
use super::Context;
use crate::config::JobConfig;
use crate::history::{Entry, Kind};
use crate::lock::Series;
use crate::logging::events;
use crate::schedule::Tick;

/// Whether a run that ended with `outcome` is tried again (when attempts are left).
fn retried(outcome: &str) -> bool {
    matches!(outcome, "failure" | "timeout")
}

/// The wait in milliseconds before the next attempt, if a run of `job` in `series` that ended with
/// `outcome` is tried again: a `failure` or `timeout` of a scheduled tick with attempts left (triggers are
/// not retried: the operator asked for one run, and `trigger --wait` reports its outcome). `None`: the run
/// is its tick's final outcome. The run's final history entry carries it (`retry_in_ms`) and
/// [`after_run`] follows the entry, so what the history says and what this worker does cannot differ.
pub(super) fn retry_in_ms(job: &JobConfig, series: &Series, outcome: &str) -> Option<u64> {
    let attempt = series.attempt();
    let again = retried(outcome) && series.trigger().is_none() && attempt < job.retry.retries;
    again.then(|| u64::try_from(job.retry.delay(attempt + 1).as_millis()).unwrap_or(u64::MAX))
}

/// After a run of `(job, tick)` in `series` ended (`ended`, its final entry): waits and races the next
/// attempt if the entry says one follows ([`retry_in_ms`]; done once that attempt — and any after it — is
/// settled), else hands the tick's final outcome to the alert hooks.
///
/// A boxed future rather than an `async fn`: the race runs the attempt, which comes back here when it
/// ended, and the compiler cannot infer the `Send` of a future that contains itself.
pub(super) fn after_run(
    context: Arc<Context>,
    job: Arc<JobConfig>,
    tick: Tick,
    series: Series,
    ended: Entry,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(retry(context, job, tick, series, ended))
}

async fn retry(
    context: Arc<Context>,
    job: Arc<JobConfig>,
    tick: Tick,
    series: Series,
    ended: Entry,
) {
    let attempt = series.attempt();
    let Some(wait_ms) = ended.retry_in_ms else {
        let failed = ended.outcome.as_deref().is_some_and(retried);
        if failed && attempt > 0 && series.trigger().is_none() {
            warn!(event = events::run::RETRIES_EXHAUSTED, job = %job.name, tick = %tick, attempts = attempt + 1,
                  "The job failed on every attempt; no retry is left");
        }
        super::alerts::after_run(context, job, ended);
        return;
    };
    let next = Series::Retry(attempt + 1);
    let wait = Duration::from_millis(wait_ms);
    let span = series_span(&next);
    span.in_scope(|| {
        info!(event = events::run::RETRY_SCHEDULED, job = %job.name, tick = %tick,
              outcome = ended.outcome.as_deref().unwrap_or(""), retry_in_ms = wait.as_millis() as u64,
              "The run failed: trying again after the backoff");
    });
    tokio::select! {
        () = tokio::time::sleep(wait) => {}
        () = context.shutdown.graceful() => {
            span.in_scope(|| {
                info!(event = events::tick::SKIPPED, job = %job.name, tick = %tick, reason = "shutdown",
                      "Skipped: shutdown was requested while the retry waited for its backoff");
            });
            context.note(&job, tick, &next, Kind::Skipped, Some("shutdown"), None);
            return;
        }
    }
    // The job as it is now: a reload during the backoff may have removed, disabled or changed it.
    let job = match context.job_now(&job.name) {
        Ok(now) if attempt < now.retry.retries => now,
        Ok(now) => {
            span.in_scope(|| {
                info!(event = events::tick::SKIPPED, job = %now.name, tick = %tick, reason = "retries_lowered",
                      retries = now.retry.retries,
                      "Skipped: a reload lowered the job's retries while this retry waited; the last failure stands");
            });
            context.note(
                &now,
                tick,
                &next,
                Kind::Skipped,
                Some("retries_lowered"),
                None,
            );
            // No retry follows after all: the failure is the tick's final outcome.
            let mut ended = ended;
            ended.retry_in_ms = None;
            super::alerts::after_run(context, now, ended);
            return;
        }
        Err(reason) => {
            span.in_scope(|| {
                info!(event = events::tick::SKIPPED, job = %job.name, tick = %tick, reason,
                      "Skipped: a reload removed or disabled the job while this retry waited; it is not retried");
            });
            context.note(&job, tick, &next, Kind::Skipped, Some(reason), None);
            return;
        }
    };
    let grace = chrono::Duration::from_std(job.misfire_grace).unwrap_or_default();
    let due = Due {
        until: context.clock.now() + grace,
        job,
        tick,
        series: next,
        delay: Duration::ZERO,
    };
    race::race(context, vec![due]).await;
}
