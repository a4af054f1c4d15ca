//! Missed ticks: a dead man's switch inside the cluster, raised once per tick by one live worker.
//!
//! A tick that nobody ran, and that nobody skipped on purpose (`overlap`, `superseded`), is *missed*. A
//! worker suspects a tick when it gave up racing it (no quorum, contended, its lease expired), when it finds
//! it past its misfire grace (it was paused or late), and at start for the ticks since the last entry of each
//! job (at most [`LOOKBACK_TICKS`], within `history.missed_lookback`): the ticks that ran out while every
//! worker was down. Once the tick's window has ended (plus the largest allowed clock offset, and time for
//! the winner's entry to land), the worker reads the tick's history from a majority. No run and no
//! deliberate skip: it claims the tick's *alarm* — a claim of `(<job>:missed, tick)` through the same
//! protocol, which a job name cannot collide with — and only the worker granted the alarm logs `tick.missed`
//! (ERROR) and records the miss. G1 makes that at most once across the cluster. Windows end on cluster
//! time: a worker whose store has clocks checks nothing before it has measured them once.
//!
//! Alarms of one job are claimed in tick order, and G1′ refuses a tick's alarm once a later one was granted:
//! a worker that suspects an older tick after another worker raised a newer one stays silent (reported in
//! the docs as a limit: at most once, nearly always exactly once).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tracing::{debug, error, warn};

use super::race::give_up_at;
use super::Context;
use crate::config::JobConfig;
use crate::history::{Entry, Kind, Query};
use crate::lock::{ClaimOutcome, ClaimRequest, Overlap, Series};
use crate::logging::events;
use crate::schedule::Tick;

/// The most ticks per job a starting worker looks back at.
pub(crate) const LOOKBACK_TICKS: usize = 10;
/// Time after a tick's window for its winner's history entry to reach the nodes.
const ENTRY_SETTLE: Duration = Duration::from_secs(2);
/// The wait before a check that found no majority is tried again.
const RECHECK_AFTER: Duration = Duration::from_secs(5);

/// A tick to check, with its job's definition (shared with the agenda, not copied).
type Suspect = (Arc<JobConfig>, Tick);
/// Suspects to check: (job name, tick) → job.
type Suspects = BTreeMap<(String, Tick), Arc<JobConfig>>;

/// The worker's handle on the missed-tick checker.
pub(crate) struct Sentinel {
    queue: mpsc::UnboundedSender<Suspect>,
}

impl Sentinel {
    /// Starts the checker for `jobs`; `max_clock_offset` is added to every window before a check.
    pub(crate) fn start(
        context: Arc<Context>,
        jobs: Vec<Arc<JobConfig>>,
        max_clock_offset: Duration,
    ) -> (Sentinel, tokio::task::JoinHandle<()>) {
        let (queue, suspects) = mpsc::unbounded_channel();
        // Kept across a restart of the checker ([`super::background`]), so that suspects sent meanwhile
        // are checked by the next one.
        let suspects = Arc::new(tokio::sync::Mutex::new(suspects));
        let shutdown = context.shutdown.clone();
        let task = super::background::spawn("missed_checker", shutdown, move || {
            let (context, jobs, suspects) =
                (Arc::clone(&context), jobs.clone(), Arc::clone(&suspects));
            watch(context, jobs, suspects, max_clock_offset)
        });
        (Sentinel { queue }, task)
    }

    /// Asks for `tick` of `job` to be checked once its window has ended.
    pub(crate) fn suspect(&self, job: &Arc<JobConfig>, tick: Tick) {
        let _ = self.queue.send((Arc::clone(job), tick));
    }
}

/// The checker: looks back at start, then checks each suspected tick when its window has ended, until
/// shutdown.
async fn watch(
    context: Arc<Context>,
    jobs: Vec<Arc<JobConfig>>,
    suspects: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Suspect>>>,
    max_clock_offset: Duration,
) {
    let mut suspects = suspects.lock().await;
    // Which windows have ended is a question of cluster time: before the store's clocks were measured
    // once, this host's clock (seconds ahead, maybe) could call a tick missed that has not come yet.
    // Suspects wait in the queue meanwhile.
    while !context.clock.is_known() {
        tokio::select! {
            () = context.shutdown.graceful() => return,
            () = context.clock.moved() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    let margin = chrono::Duration::from_std(max_clock_offset + ENTRY_SETTLE).unwrap_or_default();
    // When to check, and what: (job name, tick) → job.
    let mut due: BTreeMap<DateTime<Utc>, Suspects> = BTreeMap::new();
    for (job, tick) in look_back(&context, &jobs).await {
        due.entry(context.clock.now())
            .or_default()
            .insert((job.name.clone(), tick), job);
    }
    loop {
        let wait = due.keys().next().map_or(Duration::from_secs(3600), |at| {
            (*at - context.clock.now()).to_std().unwrap_or_default()
        });
        tokio::select! {
            () = context.shutdown.graceful() => return,
            received = suspects.recv() => {
                let Some((job, tick)) = received else { return };
                let end = give_up_at(&job, tick);
                let at = end.checked_add_signed(margin).unwrap_or(end);
                due.entry(at).or_default().insert((job.name.clone(), tick), job);
                continue;
            }
            () = tokio::time::sleep(wait) => {}
        }
        let now = context.clock.now();
        let ready: Vec<_> = due.range(..=now).map(|(at, _)| *at).collect();
        let mut batch: Suspects = BTreeMap::new();
        for at in ready {
            batch.extend(due.remove(&at).unwrap_or_default());
        }
        for ((_, tick), job) in check(&context, batch).await {
            let lookback =
                chrono::Duration::from_std(context.store.history_settings().missed_lookback)
                    .unwrap_or_default();
            if tick
                .to_utc()
                .checked_add_signed(lookback)
                .is_none_or(|end| end > now)
            {
                let at = now + chrono::Duration::from_std(RECHECK_AFTER).unwrap_or_default();
                due.entry(at)
                    .or_default()
                    .insert((job.name.clone(), tick), job);
            }
        }
    }
}

/// The ticks a starting worker suspects: per job, those after its newest history entry whose window has
/// ended, within the look-back, newest [`LOOKBACK_TICKS`]. A job with no history at all is new: nothing.
async fn look_back(context: &Context, jobs: &[Arc<JobConfig>]) -> Vec<Suspect> {
    let now = context.clock.now();
    let lookback = chrono::Duration::from_std(context.store.history_settings().missed_lookback)
        .unwrap_or_default();
    let mut suspects = Vec::new();
    for job in jobs {
        let query = Query {
            job: job.name.clone(),
            since: None,
            until: None,
            limit: NEWEST_READ,
        };
        let newest = match context.store.history(&query).await {
            Ok(read) => {
                context.warn_skipped(&read.skipped);
                match newest_tick(&read.value, NEWEST_READ) {
                    Some(tick) => tick,
                    None => continue,
                }
            }
            Err(failure) => {
                warn!(event = events::tick::MISSED_CHECK_FAILED, job = %job.name, error = %failure,
                      "Could not read the job's history at start: ticks missed while no worker ran are not reported");
                continue;
            }
        };
        let from = newest.to_utc().max(now - lookback);
        let mut ticks: Vec<Tick> = Vec::new();
        let mut next = job.schedule.next_after(from);
        while let Some(tick) = next.filter(|t| give_up_at(job, *t) <= now) {
            ticks.push(tick);
            next = job.schedule.next_after(tick.to_utc());
            if ticks.len() > LOOKBACK_TICKS * 100 {
                break;
            }
        }
        let skip = ticks.len().saturating_sub(LOOKBACK_TICKS);
        suspects.extend(
            ticks
                .into_iter()
                .skip(skip)
                .map(|tick| (Arc::clone(job), tick)),
        );
    }
    suspects
}

/// The entries a starting worker reads of each job to find its newest tick: a few more than one, for the
/// pauses and resumes (`control` entries, not about a tick) that may be newer than it.
const NEWEST_READ: usize = 16;

/// The newest tick in `entries` (newest first, as read with `limit`), passing over `control` entries:
/// a pause or resume says nothing of the ticks before it. When every entry read is a control and the
/// read was full, the oldest of them (the ticks after it are suspected, the ones before it not: fewer
/// suspects, never a false one); with none but controls in a read that was not full, the job has no
/// ticks yet (`None`, new).
fn newest_tick(entries: &[Entry], limit: usize) -> Option<Tick> {
    match entries.iter().find(|e| !e.is_control()) {
        Some(entry) => Some(entry.tick()),
        None if entries.len() >= limit => entries.last().map(Entry::tick),
        None => None,
    }
}

/// Checks `batch`; returns the suspects whose check could not be made (no majority) for a later try.
async fn check(context: &Context, batch: Suspects) -> Vec<((String, Tick), Arc<JobConfig>)> {
    let mut retry = Vec::new();
    let mut by_job: BTreeMap<String, Vec<(Tick, Arc<JobConfig>)>> = BTreeMap::new();
    for ((name, tick), job) in batch {
        by_job.entry(name).or_default().push((tick, job));
    }
    for (name, ticks) in by_job {
        let (first, last) = match (ticks.first(), ticks.last()) {
            (Some((first, _)), Some((last, _))) => (*first, *last),
            _ => continue,
        };
        let query = Query {
            job: name.clone(),
            since: Some(first),
            until: Some(last),
            limit: 5_000,
        };
        let entries = match context.store.history(&query).await {
            Ok(read) => {
                context.warn_skipped(&read.skipped);
                read.value
            }
            Err(failure) => {
                debug!(event = events::tick::MISSED_CHECK_FAILED, job = %name, error = %failure,
                       "Could not read the job's history to check for missed ticks; trying again");
                retry.extend(
                    ticks
                        .into_iter()
                        .map(|(tick, job)| ((name.clone(), tick), job)),
                );
                continue;
            }
        };
        let accounted: BTreeSet<i64> = entries
            .iter()
            .filter(|entry| accounts_for(entry))
            .map(|entry| entry.tick)
            .collect();
        for (tick, job) in ticks {
            if accounted.contains(&tick.as_millis()) {
                continue;
            }
            // A loser's entry names the claimant only when its loss was not routine (a routine one is
            // not written): a tick whose expected winner claimed it and died reads as unclaimed.
            let claimed_by = entries
                .iter()
                .filter(|e| e.tick == tick.as_millis())
                .find_map(|e| e.by.clone());
            if !raise(context, &job, tick, claimed_by).await {
                retry.push(((name.clone(), tick), job));
            }
        }
    }
    retry
}

/// Whether `entry` says what became of its tick: a run, a miss already raised, or a deliberate skip — not
/// an entry of a trigger request whose time happens to be the tick's.
fn accounts_for(entry: &Entry) -> bool {
    if entry.trigger.is_some() {
        return false;
    }
    match entry.kind {
        Kind::Run | Kind::Missed => true,
        Kind::Skipped => matches!(
            entry.reason.as_deref(),
            Some("overlap" | "superseded" | "paused")
        ),
        Kind::Lost | Kind::Control | Kind::Unknown => false,
    }
}

/// Claims the alarm of `(job, tick)`; the worker granted it logs and records the miss. Returns `false`
/// when the claim could not be decided (no majority): check again later.
async fn raise(context: &Context, job: &JobConfig, tick: Tick, claimed_by: Option<String>) -> bool {
    let alarm = format!("{}:missed", job.name);
    let request = ClaimRequest::new(
        &context.worker_id,
        &alarm,
        tick,
        Overlap::Allow,
        &job.fingerprint(),
    );
    match context.store.claim(&request).await {
        ClaimOutcome::Won(lease) => {
            context.store.release(&lease).await;
            let reason = if claimed_by.is_some() {
                "no_run_recorded"
            } else {
                "unclaimed"
            };
            error!(event = events::tick::MISSED, job = %job.name, tick = %tick, reason,
                   claimed_by = claimed_by.as_deref().unwrap_or(""),
                   window_ended_at = %give_up_at(job, tick).to_rfc3339(),
                   "Missed: nobody ran this tick within its window");
            context.metrics.tick_missed(&job.name);
            let mut entry = context.entry(job, tick, &Series::Schedule, Kind::Missed);
            entry.reason = Some(reason.to_string());
            entry.by = claimed_by;
            context.recorder.note(entry);
            true
        }
        ClaimOutcome::NoQuorum(_) | ClaimOutcome::Contended { .. } | ClaimOutcome::Fault(_) => {
            false
        }
        // Another worker raised it (or a later tick's alarm): at most once. No alarm is ever paused (no job
        // name holds the `:` of its pseudo-job's), so `Paused` cannot come; it would settle it too. A
        // refusal (the tick far ahead of the store's clock, the token at its bound) is final as well.
        ClaimOutcome::AlreadyClaimed { .. }
        | ClaimOutcome::Busy { .. }
        | ClaimOutcome::Paused(_)
        | ClaimOutcome::Refused(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Control, CONTROL_PAUSED};

    fn control(ms: i64) -> Entry {
        let what = Control {
            action: CONTROL_PAUSED,
            by: "ops@host".into(),
            reason: String::new(),
            until: None,
        };
        let made = DateTime::from_timestamp_millis(ms).unwrap_or_default();
        Entry::control("j", &what, "cli", made)
    }

    /// A starting worker looks back from the newest tick, past any newer pause or resume; a job with only
    /// controls has no tick yet; a read full of controls looks back from the oldest of them.
    #[test]
    fn the_look_back_starts_at_the_newest_tick_not_at_a_control() {
        let run = Entry::new("j", Tick(1_000), "w1", Kind::Run, Utc::now());
        assert!(!accounts_for(&control(1_000)));
        let entries = vec![control(5_000), control(4_000), run];
        assert_eq!(newest_tick(&entries, 16), Some(Tick(1_000)));
        assert_eq!(newest_tick(&entries[..2], 16), None);
        assert_eq!(newest_tick(&entries[..2], 2), Some(Tick(4_000)));
        assert_eq!(newest_tick(&[], 16), None);
    }
}
