//! The status view: the workers the store knows and the jobs of the config file, as they stand now.
//!
//! [`read_status`] gathers the members, each job's recent history, the pauses and the trigger requests, and
//! [`status_of`] works out, without I/O, what an operator asks first: which workers are alive and which run another
//! config than most of them, and for each job whether it is paused, its next tick, its last run, how many
//! runs failed in a row, its last success, and whether it is *overdue*: its newest tick whose window has
//! ended has no entry at all, so nobody accounted for it (no worker alive, or all of them stuck), while
//! earlier ticks had entries (a job with none is new).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use futures_util::stream::{FuturesOrdered, StreamExt};
use serde::Serialize;
use tokio::sync::Semaphore;

use super::history;
use super::time;
use super::Notes;
use crate::config::{Config, JobConfig};
use crate::history::tick::{self, TickRecord};
use crate::history::{Entry, Kind};
use crate::lock::{PauseRead, QuorumFailure};
use crate::membership::Member;
use crate::store::{Read, Store};
use crate::trigger::TriggerRequest;

/// How many entries of each job the status reads, newest first: enough for the failures in a row and the
/// last success of most jobs (the store keeps `history.keep_ticks` ticks per job anyway). Pauses and
/// resumes (`control` entries) are not counted ([`newest_of`]).
pub const ENTRIES_PER_JOB: usize = 2000;

/// How many times the entries asked for a status read of one job may take when pauses and resumes are
/// among them: a job paused and resumed beside each of its ticks (automation) still has its newest ticks
/// read, while a job with endless controls costs a bounded read.
const CONTROLS_ALLOWANCE: usize = 16;

/// A tick's window is taken as ended this long after [`JobConfig::window_end`], for the workers' history
/// writes (made after the fact, in the background) to land.
pub const SETTLE: Duration = Duration::from_secs(5);

/// What the status is computed from, as read from the store.
#[derive(Debug, Clone, Default)]
pub struct StatusInputs {
    /// Every worker the store knows, alive or dead.
    pub members: Vec<Member>,
    /// The newest [`ENTRIES_PER_JOB`] entries of each job of the config, in the config's order, newest
    /// first.
    pub histories: Vec<Vec<Entry>>,
    /// The pause of each job of the config, in the config's order.
    pub pauses: Vec<Option<PauseRead>>,
    /// The trigger requests the nodes hold, claimed or not.
    pub triggers: Vec<TriggerRequest>,
    pub notes: Notes,
}

/// How many history entries [`read_status`] holds at once, all jobs together: a job's entries are dropped
/// as soon as its status is known, so the status of 10,000 jobs costs this much memory, not every job's
/// history at once (10,000 jobs × [`ENTRIES_PER_JOB`] would be gigabytes in the worker that serves it).
/// The same bound as `history`'s reads.
pub use super::history::ENTRIES_IN_FLIGHT;
/// The most jobs whose histories [`read_status`] reads at once (the store's load stays bounded too).
const JOBS_IN_FLIGHT: usize = 128;

/// Reads from `store` and works out the status of `jobs` of `config` at `now`, each job from its newest
/// `entries_per_job` entries: the members, pauses and trigger requests once, then the jobs' histories a
/// few at a time ([`ENTRIES_IN_FLIGHT`]), each job's entries dropped once its status is known. Fails only
/// when no majority answered a read.
pub async fn read_status(
    store: &Store,
    config: &Config,
    jobs: &[&JobConfig],
    entries_per_job: usize,
    now: DateTime<Utc>,
) -> Result<Status, QuorumFailure> {
    let mut notes = Notes::new(store);
    let members = notes.keep(store.members().await?);
    let names: Vec<String> = jobs.iter().map(|job| job.name.clone()).collect();
    let pauses = notes.keep(store.pauses(&names).await?);
    let triggers = notes.keep(store.triggers().await?);
    let at_once = (ENTRIES_IN_FLIGHT / entries_per_job.max(1)).clamp(1, JOBS_IN_FLIGHT);
    let budget = history::entry_budget();
    let mut waiting = jobs.iter().copied().zip(pauses);
    let mut reads = FuturesOrdered::new();
    let mut statuses = Vec::with_capacity(jobs.len());
    loop {
        while reads.len() < at_once {
            let Some((job, pause)) = waiting.next() else {
                break;
            };
            reads.push_back(history_of(store, &budget, job, pause, entries_per_job));
        }
        let Some((job, pause, read)) = reads.next().await else {
            break;
        };
        let entries = notes.keep(read?);
        statuses.push(full_job_status(
            job, &entries, pause, &triggers, &members, now,
        ));
    }
    notes.groups = store.groups();
    Ok(assemble(config, members, statuses, notes, now))
}

/// Reads what the status of `jobs` needs, with the newest `entries_per_job` entries of each (controls not
/// counted, [`newest_of`]): a page of the dashboard reads its own jobs only, and fewer entries of each.
pub async fn read_jobs(
    store: &Store,
    jobs: &[&JobConfig],
    entries_per_job: usize,
) -> Result<StatusInputs, QuorumFailure> {
    let mut notes = Notes::new(store);
    let members = notes.keep(store.members().await?);
    let budget = history::entry_budget();
    let reads = jobs
        .iter()
        .map(|job| newest_of(store, &budget, &job.name, entries_per_job));
    let mut histories = Vec::with_capacity(jobs.len());
    for read in join_all(reads).await {
        histories.push(notes.keep(read?));
    }
    let names: Vec<String> = jobs.iter().map(|job| job.name.clone()).collect();
    let pauses = notes.keep(store.pauses(&names).await?);
    let triggers = notes.keep(store.triggers().await?);
    notes.groups = store.groups();
    Ok(StatusInputs {
        members,
        histories,
        pauses,
        triggers,
        notes,
    })
}

/// What `status` reports. Field names are stable (docs/history.md).
#[derive(Debug, Serialize)]
pub struct Status {
    pub now: DateTime<Utc>,
    /// The config file this command read, and its [`Config::fingerprint`].
    pub config: ConfigSummary,
    /// The `config_fingerprint` that more than half of the live workers announce, if one does.
    pub config_majority: Option<String>,
    pub workers: Vec<WorkerStatus>,
    pub jobs: Vec<JobStatus>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// A config file and its fingerprint.
#[derive(Debug, Serialize)]
pub struct ConfigSummary {
    pub path: String,
    pub fingerprint: String,
}

/// A worker's last announcement (as stored; each run under way with `tick_rfc3339`), with how its config
/// compares.
#[derive(Debug, Serialize)]
pub struct WorkerStatus {
    #[serde(flatten, serialize_with = "time::member")]
    pub member: Member,
    /// Its config differs from [`Status::config_majority`] (from this command's config when no fingerprint
    /// has a majority); never for a worker that announces no fingerprint.
    pub config_differs: bool,
    /// It runs the config this command read.
    pub runs_this_config: bool,
}

/// One job of the config file, with what the history says of it.
#[derive(Debug, Serialize)]
pub struct JobStatus {
    pub name: String,
    pub schedule: String,
    pub timezone: String,
    pub enabled: bool,
    /// The job's pause (`redcron pause`), with on how many nodes it stands; `null` when not paused.
    pub paused: Option<PauseRead>,
    pub next_tick: Option<DateTime<Utc>>,
    /// The `run` entry of the newest tick that was run (ended or still running).
    #[serde(serialize_with = "time::entry")]
    pub last_run: Option<Entry>,
    /// The last run has no end, and its worker is no longer alive: it died or was cut off during the run,
    /// and the run's end will never be recorded.
    pub unfinished: bool,
    /// The runs under way now, as the live workers announce them.
    pub running: Vec<RunningNow>,
    /// Ended runs in a row, newest first, whose outcome is not `success` (within the history read).
    pub failures_in_a_row: usize,
    /// The `run` entry of the newest run that succeeded.
    #[serde(serialize_with = "time::entry")]
    pub last_success: Option<Entry>,
    /// Set when the newest tick whose window has ended has no entry at all, though an earlier tick has.
    pub overdue: Option<Overdue>,
    /// `redcron trigger` requests of the job that no worker has run yet and that may still be claimed.
    pub pending_triggers: Vec<TriggerRequest>,
}

/// A run of a job under way, as a live worker announces it.
#[derive(Debug, PartialEq, Serialize)]
pub struct RunningNow {
    pub worker: String,
    /// Milliseconds since the Unix epoch, as in the entries.
    pub tick: i64,
    /// The same tick in RFC 3339 (`null` if out of range).
    pub tick_rfc3339: Option<DateTime<Utc>>,
    pub token: u64,
}

/// A tick nobody accounted for.
#[derive(Debug, Serialize)]
pub struct Overdue {
    /// The tick nobody accounted for.
    pub tick: DateTime<Utc>,
    /// When its window ended: the job's next tick or the end of its `misfire_grace`, whichever came first.
    pub window_ended_at: DateTime<Utc>,
}

/// `job`'s newest `limit` entries ([`newest_of`]), with what came along.
async fn history_of<'a>(
    store: &Store,
    budget: &Semaphore,
    job: &'a JobConfig,
    pause: Option<PauseRead>,
    limit: usize,
) -> (
    &'a JobConfig,
    Option<PauseRead>,
    Result<Read<Vec<Entry>>, QuorumFailure>,
) {
    (job, pause, newest_of(store, budget, &job.name, limit).await)
}

/// `job`'s newest `limit` entries other than pauses and resumes (`control` entries), which say nothing
/// of a tick and must not push the ticks out of a fixed-size read: read `limit` entries, then more while
/// the answer was full and controls took some of it, up to [`CONTROLS_ALLOWANCE`] times `limit`. Only
/// the newest `limit` entries of ticks are kept, and the budget's share is given back before this returns
/// (a caller that holds the entries of many jobs holds at most `limit` of each).
async fn newest_of(
    store: &Store,
    budget: &Semaphore,
    job: &str,
    limit: usize,
) -> Result<Read<Vec<Entry>>, QuorumFailure> {
    let ticks_in = |entries: &[Entry]| entries.iter().filter(|e| !e.is_control()).count();
    let most = limit.saturating_mul(CONTROLS_ALLOWANCE);
    let page = history::newest_entries(store, budget, job, None, limit, most, |entries, _| {
        ticks_in(entries) >= limit
    })
    .await?;
    let mut read = page.read;
    read.value.retain(|entry| !entry.is_control());
    read.value.truncate(limit);
    Ok(read)
}

/// The status of `config`'s jobs and of the workers at `now`, from what [`read_jobs`] gathered of all of
/// them.
pub fn status(config: &Config, inputs: StatusInputs, now: DateTime<Utc>) -> Status {
    status_of(config, &config.jobs.iter().collect::<Vec<_>>(), inputs, now)
}

/// The status of `jobs` of `config` (in that order, as [`read_jobs`] read them) and of the workers at
/// `now`.
pub fn status_of(
    config: &Config,
    jobs: &[&JobConfig],
    inputs: StatusInputs,
    now: DateTime<Utc>,
) -> Status {
    let StatusInputs {
        members,
        histories,
        pauses,
        triggers,
        notes,
    } = inputs;
    let mut pauses = pauses.into_iter();
    let statuses = jobs
        .iter()
        .copied()
        .zip(
            histories
                .iter()
                .map(Vec::as_slice)
                .chain(std::iter::repeat(&[][..])),
        )
        .map(|(job, entries)| {
            let pause = pauses.next().flatten();
            full_job_status(job, entries, pause, &triggers, &members, now)
        })
        .collect();
    assemble(config, members, statuses, notes, now)
}

/// One job's status from its `entries` (newest first), its pause and the trigger requests.
fn full_job_status(
    job: &JobConfig,
    entries: &[Entry],
    paused: Option<PauseRead>,
    triggers: &[TriggerRequest],
    members: &[Member],
    now: DateTime<Utc>,
) -> JobStatus {
    JobStatus {
        paused,
        pending_triggers: pending_triggers(&job.name, triggers, entries, now),
        ..job_status(job, entries, members, now)
    }
}

/// The status of the workers beside the jobs' `statuses`, as `config` sees them.
fn assemble(
    config: &Config,
    members: Vec<Member>,
    statuses: Vec<JobStatus>,
    notes: Notes,
    now: DateTime<Utc>,
) -> Status {
    let ours = config.fingerprint();
    let majority = config_majority(&members);
    let reference = majority.clone().unwrap_or_else(|| ours.clone());
    let workers = members
        .into_iter()
        .map(|member| WorkerStatus {
            config_differs: !member.config_fingerprint.is_empty()
                && member.config_fingerprint != reference,
            runs_this_config: member.config_fingerprint == ours,
            member,
        })
        .collect();
    Status {
        now,
        config: ConfigSummary {
            path: config.path.display().to_string(),
            fingerprint: ours,
        },
        config_majority: majority,
        workers,
        jobs: statuses,
        notes,
    }
}

/// The fingerprint that more than half of the live workers announce.
fn config_majority(members: &[Member]) -> Option<String> {
    let live: Vec<&str> = members
        .iter()
        .filter(|m| m.alive)
        .map(|m| m.config_fingerprint.as_str())
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for fingerprint in &live {
        *counts.entry(fingerprint).or_default() += 1;
    }
    counts
        .into_iter()
        .find(|(fingerprint, count)| !fingerprint.is_empty() && count * 2 > live.len())
        .map(|(fingerprint, _)| fingerprint.to_string())
}

/// One job's status from its `entries` (newest first); not paused, no pending triggers.
fn job_status(
    job: &JobConfig,
    entries: &[Entry],
    members: &[Member],
    now: DateTime<Utc>,
) -> JobStatus {
    // One run per tick: the run of its latest attempt (the records have it first), the one that ended
    // of a double run; a tick whose losers wrote nothing counts as one whose losers wrote entries.
    let mut seen = std::collections::HashSet::new();
    let records = tick::group(entries.iter().cloned());
    let runs: Vec<&Entry> = records
        .iter()
        .filter_map(TickRecord::run)
        .filter(|run| seen.insert(run.tick))
        .collect();
    let mut runs = runs.into_iter();
    let last_run = runs.clone().next().cloned();
    let succeeded = |e: &&Entry| e.outcome.as_deref() == Some("success");
    let failures_in_a_row = runs
        .clone()
        .filter(|e| e.ended_at.is_some())
        .take_while(|e| !succeeded(e))
        .count();
    let last_success = runs.find(succeeded).cloned();
    let running = members
        .iter()
        .filter(|m| m.alive)
        .flat_map(|m| {
            m.running
                .iter()
                .filter(|r| r.job == job.name)
                .map(|r| RunningNow {
                    worker: m.id.clone(),
                    tick: r.tick,
                    tick_rfc3339: DateTime::from_timestamp_millis(r.tick),
                    token: r.token,
                })
        })
        .collect();
    let unfinished = last_run
        .as_ref()
        .is_some_and(|run| run.ended_at.is_none() && !alive(members, &run.worker));
    JobStatus {
        unfinished,
        name: job.name.clone(),
        schedule: job.schedule.expression().to_string(),
        timezone: job.schedule.timezone().name().to_string(),
        enabled: job.enabled,
        paused: None,
        next_tick: job.schedule.next_after(now).map(|t| t.to_utc()),
        last_run,
        running,
        failures_in_a_row,
        last_success,
        overdue: overdue(job, entries, now),
        pending_triggers: Vec::new(),
    }
}

/// The requests of `triggers` for `job` still waiting for a run at `now`: within their window, and with
/// no run of theirs in the job's `entries` (the worker that wins a request deletes it, but a node that
/// missed the delete still holds it).
fn pending_triggers(
    job: &str,
    triggers: &[TriggerRequest],
    entries: &[Entry],
    now: DateTime<Utc>,
) -> Vec<TriggerRequest> {
    triggers
        .iter()
        .filter(|request| request.job == job && request.not_after > now)
        .filter(|request| {
            !entries
                .iter()
                .any(|e| e.kind == Kind::Run && e.trigger.as_deref() == Some(request.id.as_str()))
        })
        .cloned()
        .collect()
}

/// Whether `worker` announced itself lately.
pub fn alive(members: &[Member], worker: &str) -> bool {
    members.iter().any(|m| m.id == worker && m.alive)
}

/// The newest tick of an enabled `job` whose window ([`JobConfig::window_end`], plus [`SETTLE`]) has ended
/// by `now`, if no entry accounts for it while an earlier tick has one.
fn overdue(job: &JobConfig, entries: &[Entry], now: DateTime<Utc>) -> Option<Overdue> {
    if !job.enabled {
        return None;
    }
    let ended_by = now - chrono::Duration::from_std(SETTLE).ok()?;
    let mut tick = job.schedule.last_at_or_before(ended_by)?;
    // Windows end in tick order, and only the few ticks of the last misfire grace can still be open.
    while job.window_end(tick) > ended_by {
        tick = job
            .schedule
            .last_at_or_before(tick.to_utc() - chrono::Duration::milliseconds(1))?;
    }
    // No entry before it: the job is new (or its history is gone), and nobody was expected to account
    // for its ticks yet — as the workers' own miss check treats it. A pause or resume (`control`) is
    // about the job, not a tick: it neither serves a tick nor accounts for one.
    let ticks = || entries.iter().filter(|e| !e.is_control());
    let served_before = ticks().any(|e| e.tick < tick.as_millis());
    if !served_before || ticks().any(|e| e.tick == tick.as_millis()) {
        return None;
    }
    Some(Overdue {
        tick: tick.to_utc(),
        window_ended_at: job.window_end(tick),
    })
}

#[cfg(test)]
mod tests;
