//! The race for a batch of due claims: claim them together, retry what is not final with the same
//! claimant, and settle each final outcome — run what was won, record what was not.
//!
//! A claim is a scheduled tick, a trigger request or a retry attempt ([`Series`]). Claims due at one instant
//! travel in one batch (on Redis one pipelined round trip per node and round for every 128 claims), and
//! each outcome is acted on as soon as it is decided ([`crate::store::Store::claim_each`]), so one job's
//! split vote never holds back another job's start. Each keeps its claimant across retries, so a retry
//! continues the claim instead of competing with it. What a worker learns about a claim it did not run (lost to another claimant,
//! skipped for overlap or a pause, given up at the end of its window) goes to the history — except a
//! routine loss, to the worker first in the tick's claim order, which the winner's run entry tells
//! (`raced`) — and a scheduled tick given up
//! is checked for a miss. A trigger or a retry that finds the job busy (`overlap:
//! skip`) waits for it, retrying every [`BUSY_RETRY`] until its window ends, since it asks for a run
//! *besides* the schedule's.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::Either;
use futures_util::FutureExt as _;
use tokio::task::JoinSet;
use tracing::{error, info, info_span, warn, Instrument as _, Span};

use super::{run, BusyGuard, Context};
use crate::config::{ClaimantHere, JobConfig};
use crate::history::Kind;
use crate::lock::{ClaimOutcome, ClaimRequest, Lease, Overlap, Refusal, Series};
use crate::logging::events;
use crate::schedule::Tick;

/// The first wait before a tick that found no quorum is raced again; it doubles up to the maximum.
/// How far ahead of cluster time a tick may be when its claim is sent: the timers that wake the race
/// may fire a little early, and a clock measured again moves by milliseconds; a tick further ahead
/// waits until it is due.
const EARLY_SLACK_MS: i64 = 100;

const NO_QUORUM_BACKOFF: Duration = Duration::from_millis(250);
const NO_QUORUM_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How often a trigger or a retry that found the job busy claims it again.
const BUSY_RETRY: Duration = Duration::from_secs(1);

/// One claim to race: a scheduled tick, a trigger request or a retry attempt.
pub(super) struct Due {
    /// Shared with the agenda and the other claims of the job: a tick costs no copy of its definition.
    pub(super) job: Arc<JobConfig>,
    pub(super) tick: Tick,
    pub(super) series: Series,
    /// When it stops being raced (cluster time): the tick's window, the trigger's, the retry's.
    pub(super) until: DateTime<Utc>,
    /// How long after the batch's start it is first claimed (the job's jitter).
    pub(super) delay: Duration,
}

impl Due {
    /// A scheduled tick: raced after the job's jitter, until its window ends ([`give_up_at`]).
    pub(super) fn scheduled(job: &Arc<JobConfig>, tick: Tick) -> Due {
        Due {
            job: Arc::clone(job),
            tick,
            series: Series::Schedule,
            until: give_up_at(job, tick),
            delay: job.jitter_for(tick),
        }
    }
}

/// One claim being raced: the job, its claim request (one claimant, kept across retries), and when to
/// try again.
struct Pending {
    job: Arc<JobConfig>,
    request: ClaimRequest,
    until: DateTime<Utc>,
    retry_at: tokio::time::Instant,
    /// The next wait after a `NoQuorum` (doubles up to [`NO_QUORUM_BACKOFF_MAX`]).
    backoff: Duration,
    /// What its latest claim came to, once it was claimed (and must be claimed again).
    last: Option<ClaimOutcome>,
}

impl Pending {
    /// The span of this claim's events: its trigger or retry attempt, if it is one.
    fn span(&self) -> Span {
        series_span(&self.request.series)
    }
}

/// A span that adds `trigger` (the request's id) or `attempt` to the events of a claim outside the
/// schedule, and to its run's.
pub(super) fn series_span(series: &Series) -> Span {
    match series {
        Series::Schedule => Span::none(),
        Series::Trigger(id) => info_span!("claim", trigger = %id),
        Series::Retry(attempt) => info_span!("claim", attempt = *attempt),
    }
}

/// Claims a batch of due ticks (together: see [`crate::store::Claims`]) and settles each outcome in
/// its own task; returns when every run (and every retry) has ended.
///
/// An outcome that is not final — no quorum, a contender of the same tick between its rounds (or crashed
/// there), a claim won by a worker that was paused until its lease expired — is retried with the *same*
/// request, so the retry continues this worker's claim instead of competing with it, until the job's
/// misfire grace ends or its next tick is due. Ticks retried at one instant travel together again, so a
/// retry costs the round trips of one batch, not one per job.
///
/// A claim of a scheduled tick is sent only once the tick is due on cluster time, give or take
/// [`EARLY_SLACK_MS`].
pub(super) async fn race(context: Arc<Context>, batch: Vec<Due>) {
    let mut settling = JoinSet::new();
    let now = tokio::time::Instant::now();
    // One view of the live workers, and one spread, for the whole batch (a herd may carry thousands of
    // jobs).
    let members = context.live_members();
    let spread = crate::lock::order::spread(context.store.settings().retry_delay, batch.len());
    let mut pending: Vec<Pending> = batch
        .into_iter()
        .map(|due| {
            let first_claim = now + due.delay + stagger(&context, members.as_deref(), &due, spread);
            let request = ClaimRequest::new(
                &context.worker_id,
                &due.job.name,
                due.tick,
                due.job.overlap,
                &due.job.fingerprint(),
            );
            let request = match due.series {
                Series::Schedule => request,
                series => request.in_series(series, Tick(due.until.timestamp_millis())),
            };
            Pending {
                request,
                retry_at: first_claim,
                job: due.job,
                until: due.until,
                backoff: NO_QUORUM_BACKOFF,
                last: None,
            }
        })
        .collect();
    while let Some(ready_at) = pending.iter().map(|p| p.retry_at).min() {
        // Only sleep for a later claim: a timer, even an expired one, waits for the next millisecond tick,
        // and a worker's own claims of a tick are due at once (half a millisecond of every tick to start).
        if ready_at > tokio::time::Instant::now() {
            tokio::select! {
                _ = tokio::time::sleep_until(ready_at) => {}
                _ = context.shutdown.graceful() => {}
            }
        }
        if context.shutdown.is_requested() {
            for p in &pending {
                p.span().in_scope(|| {
                    info!(event = events::tick::SKIPPED, job = %p.job.name, tick = %p.request.tick, reason = "shutdown",
                          "Skipped: shutdown was requested while the tick was being raced")
                });
                let (tick, series) = (p.request.tick, &p.request.series);
                context.note(&p.job, tick, series, Kind::Skipped, Some("shutdown"), None);
            }
            break;
        }
        let now = tokio::time::Instant::now();
        let (ready, waiting): (Vec<Pending>, Vec<Pending>) =
            pending.into_iter().partition(|p| p.retry_at <= now);
        pending = waiting;
        // A retry waits for the batch before it to be decided (a stall of the nodes holds every claim of
        // it), so it may come to be sent after its window: given up then, as its wait would have been.
        let cluster_now = context.clock.now();
        // A tick that is not due on cluster time: raced before a correction of the clock, which moved it
        // back since. It is held back until it is due, never claimed early (which would also take every
        // earlier tick of the job from the other workers: a later tick claimed refuses them). (No tick is
        // raced before the store's clocks were measured once: see `worker::run`.)
        let (ready, early): (Vec<Pending>, Vec<Pending>) = ready.into_iter().partition(|p| {
            // Triggers and retries carry the time they were asked for, not a tick of the schedule.
            p.request.series != Series::Schedule
                || p.request.tick.as_millis() <= cluster_now.timestamp_millis() + EARLY_SLACK_MS
        });
        for mut p in early {
            let ahead = p.request.tick.as_millis() - cluster_now.timestamp_millis();
            p.retry_at = tokio::time::Instant::now()
                + Duration::from_millis(u64::try_from(ahead).unwrap_or(0));
            pending.push(p);
        }
        let (ready, ended): (Vec<Pending>, Vec<Pending>) = ready
            .into_iter()
            .partition(|p| p.last.is_none() || cluster_now < p.until);
        for p in ended {
            if let Some(last) = &p.last {
                p.span().in_scope(|| give_up(&context, &p, last));
            }
        }
        if ready.is_empty() {
            continue;
        }
        let requests: Vec<ClaimRequest> = ready.iter().map(|p| p.request.clone()).collect();
        let mut ready: Vec<Option<Pending>> = ready.into_iter().map(Some).collect();
        let claimed_at = std::time::Instant::now();
        // Each outcome is acted on as soon as it is decided: a won tick starts while another job's split
        // vote of the same batch is still being retried inside the store.
        context
            .store
            .claim_each(&requests, |index, outcome| {
                let Some(p) = ready.get_mut(index).and_then(Option::take) else {
                    return;
                };
                if let Some(p) = act_on(&context, &mut settling, p, outcome) {
                    pending.push(p);
                }
            })
            .await;
        context.metrics.claimed(claimed_at.elapsed());
    }
    while settling.join_next().await.is_some() {}
}

/// What becomes of one claim's outcome: settled in its own task if it is final, given up at the end of
/// its window, or returned to be raced again after its wait.
fn act_on(
    context: &Arc<Context>,
    settling: &mut JoinSet<()>,
    mut p: Pending,
    outcome: ClaimOutcome,
) -> Option<Pending> {
    context.note_other_definition(&p.job, p.request.tick, outcome.other());
    let wait = match &outcome {
        // Won, but too close to (or past) the lease's deadline to start: the process was paused.
        // The same claimant claims the tick again, with a fresh lease (see `run::start`).
        ClaimOutcome::Won(lease) if lease.remaining() <= p.job.stop_grace => Some(Duration::ZERO),
        ClaimOutcome::NoQuorum(_) | ClaimOutcome::Fault(_) => {
            let wait = p.backoff;
            p.backoff = (p.backoff * 2).min(NO_QUORUM_BACKOFF_MAX);
            Some(wait)
        }
        // A trigger or a retry waits for the run that holds the job.
        ClaimOutcome::Busy { .. } if p.request.series != Series::Schedule => Some(BUSY_RETRY),
        other => other.retry_in(),
    };
    let Some(wait) = wait else {
        let span = p.span();
        let (job, tick, series) = (p.job, p.request.tick, p.request.series);
        let context = Arc::clone(context);
        // A won tick's task holds its run; any other outcome is a log line and a note, settled in a task
        // a tenth of that size (most of a herd's claims are lost ones).
        match outcome {
            ClaimOutcome::Won(lease) => {
                let won = span.in_scope(|| run_won(context, job, tick, series, p.until, lease));
                settling.spawn(won.instrument(span));
            }
            outcome => {
                let settled = async move { settle(&context, &job, tick, &series, outcome) };
                settling.spawn(settled.instrument(span));
            }
        }
        return None;
    };
    let Some(wait) = within_window(context.clock.now(), p.until, wait) else {
        p.span().in_scope(|| give_up(context, &p, &outcome));
        return None;
    };
    p.span().in_scope(|| retrying(&p, &outcome, wait));
    p.retry_at = tokio::time::Instant::now() + wait;
    p.last = Some(outcome);
    Some(p)
}

/// The wait before a claim that was not final is sent again, at `now` (cluster time), for a window that
/// ends at `until`: `wait`, or — when that would land at or past the window's end — one last attempt
/// [`LAST_ATTEMPT_BEFORE`] before the end, so that a majority back a second before the window closes still
/// grants the tick (G4 in `docs/protocol.md`: a tick is granted when a majority answers *within* its
/// misfire grace; a backoff of up to [`NO_QUORUM_BACKOFF_MAX`] gave it up with that much of its window left).
/// `None`: no time left for another attempt; the claim is given up.
fn within_window(now: DateTime<Utc>, until: DateTime<Utc>, wait: Duration) -> Option<Duration> {
    let left = (until - now).to_std().ok()?;
    if wait < left {
        return Some(wait);
    }
    let last = left.checked_sub(LAST_ATTEMPT_BEFORE)?;
    (!last.is_zero()).then_some(last)
}

/// How long before the end of its window a claim's last attempt is sent: long enough for one round
/// trip to the store on a loaded machine, short beside the backoff it cuts.
const LAST_ATTEMPT_BEFORE: Duration = Duration::from_millis(100);

/// How long this worker waits before its first claim of `due`: its place in the claim order among
/// `members` ([`crate::lock::order`]) times `spread`, the spread cut to the claim's window divided by the
/// places, so that every place claims within the window (a backup past it would claim a tick nobody may
/// run any more). The embedded store has no contenders: no wait.
fn stagger(context: &Context, members: Option<&[String]>, due: &Due, spread: Duration) -> Duration {
    if !context.store.is_shared() {
        return Duration::ZERO;
    }
    let window = (due.until - context.clock.now())
        .to_std()
        .unwrap_or_default();
    let places = u32::try_from(members.map_or(1, <[String]>::len).max(1)).unwrap_or(u32::MAX);
    let spread = spread.min(window / places);
    crate::lock::order::delay(members, &context.worker_id, &due.job.name, due.tick, spread)
}

/// Logs a retry of a tick whose outcome was not final.
fn retrying(p: &Pending, outcome: &ClaimOutcome, wait: Duration) {
    let (job, tick, retry_in_ms) = (&p.job.name, p.request.tick, wait.as_millis() as u64);
    match outcome {
        ClaimOutcome::NoQuorum(failure) => {
            warn!(event = events::tick::RETRYING, job = %job, tick = %tick, reason = "no_quorum", error = %failure,
                  retry_in_ms, "No majority of the store's nodes granted the claim; racing again")
        }
        ClaimOutcome::Fault(fault) => {
            error!(event = events::tick::RETRYING, job = %job, tick = %tick, reason = fault.reason(), error = %fault,
                   retry_in_ms, "The store cannot take claims until someone acts; racing again")
        }
        ClaimOutcome::Contended { holder, .. } => {
            info!(event = events::tick::RETRYING, job = %job, tick = %tick, reason = "contended",
                  holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()), retry_in_ms,
                  "Another worker holds the lease for this tick without having claimed it; racing again once it has decided or its lease expired")
        }
        ClaimOutcome::Busy { holder, .. } => {
            info!(event = events::tick::RETRYING, job = %job, tick = %tick, reason = "busy",
                  holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()), retry_in_ms,
                  "Another run holds the job; claiming again once it has ended")
        }
        _ => {
            warn!(event = events::tick::RETRYING, job = %job, tick = %tick, reason = "lease_expired",
                  retry_in_ms, "Won the tick, but the lease expired before the job could start (was this process paused?); claiming it again")
        }
    }
}

/// Logs and records a claim given up at the end of its window, and why, and has a scheduled tick checked
/// for a miss (the cluster-wide ERROR, once, is `tick.missed`).
fn give_up(context: &Context, p: &Pending, outcome: &ClaimOutcome) {
    let reason = match outcome {
        ClaimOutcome::NoQuorum(_) => "no_quorum",
        ClaimOutcome::Fault(fault) => fault.reason(),
        ClaimOutcome::Contended { .. } => "contended",
        ClaimOutcome::Busy { .. } => "overlap",
        _ => "lease_expired",
    };
    let (tick, series) = (p.request.tick, &p.request.series);
    let by = outcome.other().map(|holder| holder.worker.as_str());
    context.note(&p.job, tick, series, Kind::Skipped, Some(reason), by);
    if *series == Series::Schedule {
        context.suspect(&p.job, tick);
    }
    let (job, tick) = (&p.job.name, p.request.tick);
    let window = window_words(&p.job, tick, series);
    match outcome {
        ClaimOutcome::NoQuorum(failure) => {
            warn!(event = events::tick::SKIPPED, job = %job, tick = %tick, reason = "no_quorum", error = %failure,
                   "Skipped: no majority of the store's nodes granted the claim {window} (`error` says what each node said)")
        }
        ClaimOutcome::Fault(fault) => {
            error!(event = events::tick::SKIPPED, job = %job, tick = %tick, reason = fault.reason(), error = %fault,
                   "Skipped: the store could not take claims within the grace")
        }
        ClaimOutcome::Contended { holder, .. } => {
            warn!(event = events::tick::SKIPPED, job = %job, tick = %tick, reason = "contended",
                   holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()),
                   "Skipped: another worker held this tick's lease without claiming it {window}")
        }
        ClaimOutcome::Busy { holder, .. } => {
            info!(event = events::tick::SKIPPED, job = %job, tick = %tick, reason = "overlap",
                  holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()),
                  "Skipped: another run held the job {window}")
        }
        _ => {
            warn!(event = events::tick::SKIPPED, job = %job, tick = %tick, reason = "lease_expired",
                   "Skipped: every lease won for this tick expired before the job could start, {window}")
        }
    }
}

/// Which end of its window a claim was given up at, in words: a scheduled tick's window ends at the
/// job's next tick or at the end of its misfire grace, whichever comes first, and a skip cut off by the
/// next tick must not say "within the grace"; a trigger or a retry has a window of its own.
fn window_words(job: &JobConfig, tick: Tick, series: &Series) -> &'static str {
    if *series != Series::Schedule {
        return "before its window ended";
    }
    let grace = chrono::Duration::from_std(job.misfire_grace).unwrap_or(chrono::TimeDelta::MAX);
    let next_first = match (
        job.schedule.next_after(tick.to_utc()),
        tick.to_utc().checked_add_signed(grace),
    ) {
        (Some(next), Some(graced)) => next.to_utc() < graced,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if next_first {
        "before the job's next tick was due"
    } else {
        "within the misfire grace"
    }
}

/// When a tick that has not been settled stops being raced: at the job's next tick or the end of its
/// misfire grace, whichever comes first.
pub(super) fn give_up_at(job: &JobConfig, tick: Tick) -> chrono::DateTime<Utc> {
    job.window_end(tick)
}

/// Runs a won tick (its start may wait for a child slot until `until`, the end of the claim's window),
/// then its retries or alert hooks. A trigger request that was won is handled: it is deleted from the store.
///
/// Also when shutdown was requested while racing: the tick is granted to this worker, so no other worker
/// may run it; the run gets the shutdown grace like any running job.
///
/// Not an `async fn`: the run's future is made here, so that the task does not also keep the arguments it
/// was made from (a herd holds thousands of these tasks at once).
fn run_won(
    context: Arc<Context>,
    job: Arc<JobConfig>,
    tick: Tick,
    series: Series,
    until: DateTime<Utc>,
    lease: Lease,
) -> impl std::future::Future<Output = ()> + Send {
    if let Some(id) = series.trigger() {
        context.store.forget_trigger(id);
    }
    info!(event = events::tick::WON, job = %job.name, tick = %tick, token = lease.token, "Won the tick");
    // While the run is under way here, this worker skips the job's next ticks (`overlap: skip`).
    let guard = (job.overlap == Overlap::Skip).then(|| BusyGuard::enter(&context, &job.name));
    let run = run::run(Arc::clone(&context), Arc::clone(&job), lease, until);
    // Chained rather than awaited in an `async` block, which would keep the run's future twice (the
    // block's copy and the one it awaits).
    run.then(move |ended| {
        // This worker no longer runs the job: its next ticks are raced here again meanwhile.
        drop(guard);
        match ended {
            Some(ended) => Either::Left(super::retry::after_run(context, job, tick, series, ended)),
            None => Either::Right(std::future::ready(())),
        }
    })
}

/// Acts on a final claim outcome other than a win ([`run_won`]): logs and records a lost or skipped tick.
/// A trigger request refused for a pause or as out of bounds is handled: it is deleted from the store.
fn settle(context: &Context, job: &JobConfig, tick: Tick, series: &Series, outcome: ClaimOutcome) {
    if let (Some(id), ClaimOutcome::Paused(_) | ClaimOutcome::Refused(_)) =
        (series.trigger(), &outcome)
    {
        context.store.forget_trigger(id);
    }
    match outcome {
        ClaimOutcome::AlreadyClaimed { by } => {
            let claimant = by.as_ref().map_or("unknown", |by| by.worker.as_str());
            // The nodes refuse a tick once a later one of the series is confirmed (claims only grow): that
            // says nothing of who, if anyone, claimed this one — the history does.
            let reason = match by.as_ref().and_then(|by| by.tick) {
                Some(later) if later > tick => {
                    info!(event = events::tick::LOST, job = %job.name, tick = %tick, reason = "later_tick_claimed",
                          by = claimant, by_tick = %later,
                          "Lost the tick: a later tick of the job was claimed first, so this one can no longer be (whether it ran is in the history)");
                    "later_tick_claimed"
                }
                _ => {
                    // A claimant of this host is most often this worker before a restart: not another
                    // host that took the tick away.
                    let here = crate::config::claimant_here(claimant, &context.worker_id);
                    let message = match here {
                        None => "Lost the tick: another worker claimed it",
                        Some(ClaimantHere::SameId) => "Lost the tick: a worker with this worker's id claimed it (this worker before a restart, or another process given the same worker.id)",
                        Some(ClaimantHere::OtherProcess) => "Lost the tick: another process of this host claimed it (this worker before a restart, or a second worker on this host)",
                    };
                    info!(event = events::tick::LOST, job = %job.name, tick = %tick, reason = "already_claimed",
                          by = claimant, by_this_host = here.is_some(), "{message}");
                    "already_claimed"
                }
            };
            let by = by.map(|by| by.worker);
            // The winner's run entry names every worker that raced (`raced`): a routine loss adds nothing.
            let ranked = context.ranked(&job.name, tick);
            if !routine_loss(ranked.as_deref(), reason, by.as_deref()) {
                context.note(job, tick, series, Kind::Lost, Some(reason), by.as_deref());
            }
        }
        ClaimOutcome::Busy { holder, ttl } => {
            info!(event = events::tick::LOST, job = %job.name, tick = %tick, reason = "busy",
                  holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()),
                  holder_tick = %holder.as_ref().and_then(|h| h.tick).map_or(String::new(), |t| t.to_string()),
                  holder_ttl_ms = ttl.map_or(0, |ttl| ttl.as_millis() as u64),
                  "Lost the tick: the previous run still holds the job");
            let by = holder.map(|holder| holder.worker);
            context.note(
                job,
                tick,
                series,
                Kind::Skipped,
                Some("overlap"),
                by.as_deref(),
            );
        }
        ClaimOutcome::Paused(pause) => {
            info!(event = events::tick::SKIPPED, job = %job.name, tick = %tick, reason = "paused",
                  paused_by = %pause.by, paused_reason = %pause.reason,
                  paused_until = %pause.until.map_or(String::new(), |until| until.to_rfc3339()),
                  "Skipped: the job is paused (redcron pause)");
            // Every worker finds the pause, and each records it: the skip's id is one per tick, so the
            // store keeps one record however many write it. (Leaving it to the worker first in the tick's
            // order lost it when the views disagreed — that worker's own view may still lack itself or
            // rank another first — and a paused tick then read as missed.)
            // `by` keeps who paused it (`redcron pause`'s user@host, or the dashboard's token name and
            // address) in the history, beside the tick it cost.
            context.note(
                job,
                tick,
                series,
                Kind::Skipped,
                Some("paused"),
                Some(&pause.by),
            );
        }
        ClaimOutcome::Refused(refusal) => {
            error!(event = events::tick::SKIPPED, job = %job.name, tick = %tick, reason = refusal.reason(),
                   error = %refusal, "Skipped: the store refuses this claim as out of bounds");
            // A tick far ahead is not written to the history: it would stand there as the job's newest
            // tick, and a clock far off would write one per tick.
            if let Refusal::TokenLimit { .. } = refusal {
                context.note(
                    job,
                    tick,
                    series,
                    Kind::Skipped,
                    Some(refusal.reason()),
                    None,
                );
            }
        }
        ClaimOutcome::Won(_)
        | ClaimOutcome::Contended { .. }
        | ClaimOutcome::NoQuorum(_)
        | ClaimOutcome::Fault(_) => {
            // A win is run (`run_won`); the others are never settled: `race` retries them until it gives
            // up, and logs that.
        }
    }
}

/// Whether a lost claim is routine, and goes unrecorded: `already_claimed` by the worker first in the
/// tick's order as this worker ranks it (`ranked`, [`Context::ranked`]) — the winner it expected, whose run
/// entry names this worker among those that raced. Any other loss (a later tick claimed, a claimant this
/// worker did not expect, no view of the members) is an anomaly `explain` shows: recorded.
fn routine_loss(ranked: Option<&[String]>, reason: &str, by: Option<&str>) -> bool {
    let first = ranked.and_then(<[String]>::first).map(String::as_str);
    reason == "already_claimed" && by.is_some() && by == first
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|id| id.to_string()).collect()
    }

    /// A loss to the worker first in the loser's order is routine (nothing written); a loss to anyone
    /// else, a later tick's claim, or a loss without a view is written.
    #[test]
    fn only_a_loss_to_the_expected_winner_goes_unrecorded() {
        let ranked = view(&["w2", "w1", "w3"]);
        let ranked = Some(ranked.as_slice());
        assert!(routine_loss(ranked, "already_claimed", Some("w2")));
        assert!(!routine_loss(ranked, "already_claimed", Some("w3")));
        assert!(!routine_loss(ranked, "later_tick_claimed", Some("w2")));
        assert!(!routine_loss(ranked, "already_claimed", None));
        assert!(!routine_loss(None, "already_claimed", Some("w2")));
    }

    /// A retry whose backoff fits the window waits it out; one that would land at or past the window's
    /// end is sent once more just before the end; with no time left for one, the claim is given up.
    #[test]
    fn the_last_retry_lands_just_before_the_window_ends() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).expect("valid");
        let after = |ms: i64| now + chrono::Duration::milliseconds(ms);
        let ms = Duration::from_millis;
        assert_eq!(within_window(now, after(5_000), ms(2_000)), Some(ms(2_000)));
        // 1.5 s of the window left, a backoff of 2 s: one more attempt 100 ms before the end.
        assert_eq!(within_window(now, after(1_500), ms(2_000)), Some(ms(1_400)));
        assert_eq!(within_window(now, after(1_500), ms(1_500)), Some(ms(1_400)));
        // No time left for an attempt: given up.
        assert_eq!(within_window(now, after(100), ms(250)), None);
        assert_eq!(within_window(now, after(50), ms(250)), None);
        assert_eq!(within_window(now, after(-10), ms(250)), None);
        // After the last attempt, the next backoff finds less than the margin left: given up.
        let at_last = after(1_400);
        assert_eq!(within_window(at_last, after(1_500), ms(2_000)), None);
    }

    /// A skip of a tick whose next tick came before the end of its grace says so; one whose grace ended
    /// first says that; a trigger's says its own window.
    #[test]
    fn a_skip_names_the_end_of_its_window() {
        let job = |schedule: &str, grace: &str| {
            let text = format!("jobs:\n  - name: a\n    schedule: \"{schedule}\"\n    command: [\"true\"]\n    misfire_grace: {grace}\n");
            let config =
                crate::config::parse_with_env(&text, std::path::Path::new("jobs.yaml"), &|_| None)
                    .expect("valid");
            config.jobs[0].clone()
        };
        let tick = Tick(1_800_000_000_000);
        assert_eq!(
            window_words(&job("* * * * * *", "5s"), tick, &Series::Schedule),
            "before the job's next tick was due"
        );
        assert_eq!(
            window_words(&job("0 * * * * *", "5s"), tick, &Series::Schedule),
            "within the misfire grace"
        );
        assert_eq!(
            window_words(&job("* * * * * *", "5s"), tick, &Series::Retry(1)),
            "before its window ended"
        );
    }

    /// The size of what `f` returns, without calling it (a future's size is known from its type alone).
    fn size_of_output<A, R>(_: &impl FnOnce(A) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// The task spawned per claim settled (every won, lost or skipped tick of every worker) stays small:
    /// a herd or a high tick rate holds thousands of them at once.
    #[test]
    fn settle_tasks_are_small() {
        let won = |(context, job, tick, series, until, lease): (
            Arc<Context>,
            Arc<JobConfig>,
            Tick,
            Series,
            DateTime<Utc>,
            Lease,
        )| {
            run_won(context, job, tick, series, until, lease).instrument(Span::none())
        };
        let other = |(context, job, tick, series, outcome): (
            Arc<Context>,
            Arc<JobConfig>,
            Tick,
            Series,
            ClaimOutcome,
        )| {
            async move { settle(&context, &job, tick, &series, outcome) }.instrument(Span::none())
        };
        let (won, other) = (size_of_output(&won), size_of_output(&other));
        println!("settle task: {won} bytes for a won tick, {other} for any other outcome");
        assert!(won <= 100_000, "a won tick's task is {won} bytes");
        assert!(other <= 1_000, "a lost tick's task is {other} bytes");
    }
}
