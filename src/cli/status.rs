//! `redcron status`: the workers the store knows and the jobs of the config file, as they stand now.
//!
//! Reads the members and each job's recent history from a majority of the nodes ([`super::read`]), then
//! works out — without I/O, so it is unit-tested — what an operator asks first: which workers are alive and
//! which run another config than most of them, and for each job whether it is paused, its next tick, its
//! last run, how many runs failed in a row, its last success, and whether it is *overdue*: its newest tick whose window has ended
//! has no entry at all, so nobody accounted for it (no worker alive, or all of them stuck), while earlier
//! ticks had entries (a job with none is new).

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::read::{Notes, Reader};
use super::{load, render, ConfigArg};
use crate::config::{Config, JobConfig};
use crate::history::{Entry, Kind, Query};
use crate::lock::PauseRead;
use crate::membership::Member;
use crate::trigger::TriggerRequest;

/// How many entries of each job `status` reads, newest first: enough for the failures in a row and the
/// last success of most jobs (the store keeps `history.keep_ticks` ticks per job anyway).
pub(super) const ENTRIES_PER_JOB: usize = 2000;

/// A tick's window is taken as ended this long after [`JobConfig::window_end`], for the workers' history
/// writes (made after the fact, in the background) to land.
pub(super) const SETTLE: Duration = Duration::from_secs(5);

/// Arguments of `status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON (field names in docs/history.md) instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// What `status` reports. Field names are stable (docs/history.md).
#[derive(Debug, Serialize)]
pub(super) struct Status {
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

#[derive(Debug, Serialize)]
pub(super) struct ConfigSummary {
    pub path: String,
    pub fingerprint: String,
}

/// A worker's last announcement (as stored), with how its config compares.
#[derive(Debug, Serialize)]
pub(super) struct WorkerStatus {
    #[serde(flatten)]
    pub member: Member,
    /// Its config differs from [`Status::config_majority`] (from this command's config when no fingerprint
    /// has a majority); never for a worker that announces no fingerprint.
    pub config_differs: bool,
    /// It runs the config this command read.
    pub runs_this_config: bool,
}

/// One job of the config file, with what the history says of it.
#[derive(Debug, Serialize)]
pub(super) struct JobStatus {
    pub name: String,
    pub schedule: String,
    pub timezone: String,
    pub enabled: bool,
    /// The job's pause (`redcron pause`), with on how many nodes it stands; `null` when not paused.
    pub paused: Option<PauseRead>,
    pub next_tick: Option<DateTime<Utc>>,
    /// The `run` entry of the newest tick that was run (ended or still running).
    pub last_run: Option<Entry>,
    /// The last run has no end, and its worker is no longer alive: it died or was cut off during the run,
    /// and the run's end will never be recorded.
    pub unfinished: bool,
    /// The runs under way now, as the live workers announce them.
    pub running: Vec<RunningNow>,
    /// Ended runs in a row, newest first, whose outcome is not `success` (within the history read).
    pub failures_in_a_row: usize,
    /// The `run` entry of the newest run that succeeded.
    pub last_success: Option<Entry>,
    /// Set when the newest tick whose window has ended has no entry at all, though an earlier tick has.
    pub overdue: Option<Overdue>,
    /// `redcron trigger` requests of the job that no worker has run yet and that may still be claimed.
    pub pending_triggers: Vec<TriggerRequest>,
}

#[derive(Debug, Serialize)]
pub(super) struct RunningNow {
    pub worker: String,
    /// Milliseconds since the Unix epoch, as in the entries.
    pub tick: i64,
    pub token: u64,
}

#[derive(Debug, Serialize)]
pub(super) struct Overdue {
    /// The tick nobody accounted for.
    pub tick: DateTime<Utc>,
    /// When its window ended: the job's next tick or the end of its `misfire_grace`, whichever came first.
    pub window_ended_at: DateTime<Utc>,
}

/// Carries out `status`.
pub(super) fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let config = match load(&args.config.config) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    let read = Reader::open(&config).and_then(|mut reader| {
        let members = reader.members()?;
        let queries: Vec<Query> = config
            .jobs
            .iter()
            .map(|job| Query {
                job: job.name.clone(),
                since: None,
                until: None,
                limit: ENTRIES_PER_JOB,
            })
            .collect();
        let histories = reader.histories(&queries)?;
        let names: Vec<String> = config.jobs.iter().map(|job| job.name.clone()).collect();
        let pauses = reader.pauses(&names)?;
        let triggers = reader.triggers()?;
        Ok((members, histories, pauses, triggers, reader.notes()))
    });
    let (members, histories, pauses, triggers, notes) = match read {
        Ok(read) => read,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let now = Utc::now();
    let mut status = status(&config, members, &histories, now, notes);
    for ((job, paused), entries) in status.jobs.iter_mut().zip(pauses).zip(&histories) {
        job.paused = paused;
        job.pending_triggers = pending_triggers(&job.name, &triggers, entries, now);
    }
    render::deliver(&status, &status.notes, args.json, render::status)
}

/// The status of `config`'s jobs (`histories` in the same order, newest first) and of `members`, at `now`.
pub(super) fn status(
    config: &Config,
    members: Vec<Member>,
    histories: &[Vec<Entry>],
    now: DateTime<Utc>,
    notes: Notes,
) -> Status {
    let ours = config.fingerprint();
    let majority = config_majority(&members);
    let reference = majority.clone().unwrap_or_else(|| ours.clone());
    let jobs = config
        .jobs
        .iter()
        .zip(
            histories
                .iter()
                .map(Vec::as_slice)
                .chain(std::iter::repeat(&[][..])),
        )
        .map(|(job, entries)| job_status(job, entries, &members, now))
        .collect();
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
        jobs,
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

fn job_status(
    job: &JobConfig,
    entries: &[Entry],
    members: &[Member],
    now: DateTime<Utc>,
) -> JobStatus {
    // One run per tick: its last attempt (the merged entries have it first).
    let mut seen = std::collections::HashSet::new();
    let runs: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.kind == Kind::Run && seen.insert(e.tick))
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
pub(super) fn alive(members: &[Member], worker: &str) -> bool {
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
    // for its ticks yet — as the workers' own miss check treats it.
    let served_before = entries.iter().any(|e| e.tick < tick.as_millis());
    if !served_before || entries.iter().any(|e| e.tick == tick.as_millis()) {
        return None;
    }
    Some(Overdue {
        tick: tick.to_utc(),
        window_ended_at: job.window_end(tick),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Tick;

    const YAML: &str = "jobs:\n  - name: every-minute\n    schedule: \"* * * * *\"\n    command: [\"/bin/true\"]\n";

    fn config() -> Config {
        crate::config::parse(YAML, std::path::Path::new("jobs.yaml")).expect("a valid config")
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap_or_default()
    }

    fn member(id: &str, fingerprint: &str, alive: bool) -> Member {
        let json = format!(
            r#"{{"id":"{id}","config_fingerprint":"{fingerprint}","started_at":"2026-11-23T10:00:00Z","alive":{alive}}}"#
        );
        serde_json::from_str(&json).expect("a member")
    }

    fn run(tick_secs: i64, outcome: &str) -> Entry {
        let mut entry = Entry::new(
            "every-minute",
            Tick(tick_secs * 1000),
            "w1",
            Kind::Run,
            at(tick_secs),
        );
        entry.ended_at = Some(at(tick_secs + 1));
        entry.outcome = Some(outcome.to_string());
        entry
    }

    #[test]
    fn a_worker_is_marked_when_its_config_differs_from_most_live_workers() {
        let config = config();
        let ours = config.fingerprint();
        let members = vec![
            member("a", "other", true),
            member("b", "other", true),
            member("c", &ours, true),
            member("d", "older", false),
        ];
        let status = status(&config, members, &[vec![]], at(600), Notes::default());
        assert_eq!(status.config_majority.as_deref(), Some("other"));
        let marks: Vec<(bool, bool)> = status
            .workers
            .iter()
            .map(|w| (w.config_differs, w.runs_this_config))
            .collect();
        assert_eq!(
            marks,
            [(false, false), (false, false), (true, true), (true, false)]
        );
    }

    #[test]
    fn without_a_majority_this_config_is_the_reference() {
        let config = config();
        let ours = config.fingerprint();
        let members = vec![member("a", "other", true), member("b", &ours, true)];
        let status = status(&config, members, &[vec![]], at(600), Notes::default());
        assert_eq!(status.config_majority, None);
        assert!(status.workers[0].config_differs && !status.workers[1].config_differs);
    }

    #[test]
    fn failures_in_a_row_last_success_and_overdue() {
        let config = config();
        // Newest first, as the store answers: two failures since the last success.
        let entries = vec![
            run(540, "timeout"),
            run(480, "failure"),
            run(420, "success"),
        ];
        let now = at(600);
        let job = &status(&config, vec![], &[entries], now, Notes::default()).jobs[0];
        assert_eq!(job.failures_in_a_row, 2);
        assert_eq!(job.last_success.as_ref().map(|e| e.tick), Some(420_000));
        assert_eq!(job.last_run.as_ref().map(|e| e.tick), Some(540_000));
        // The newest tick whose window (30 s + 5 s) ended by 600 s is 540 s: accounted for.
        assert!(job.overdue.is_none());
        let later = &status(
            &config,
            vec![],
            &[vec![run(540, "success")]],
            at(660),
            Notes::default(),
        )
        .jobs[0];
        let overdue = later.overdue.as_ref().expect("600 s has no entry");
        assert_eq!(overdue.tick, at(600));
        assert_eq!(overdue.window_ended_at, at(630));
        // A job with no entry before that tick is new: nobody was expected to account for it.
        let new = &status(&config, vec![], &[vec![]], at(660), Notes::default()).jobs[0];
        assert!(new.overdue.is_none());
    }

    #[test]
    fn a_trigger_is_pending_until_its_run_is_recorded_or_its_window_ends() {
        let requested =
            TriggerRequest::new("every-minute", at(600), Duration::from_secs(30), "ops@vm");
        let other_job = TriggerRequest::new("other", at(600), Duration::from_secs(30), "ops@vm");
        let triggers = [requested.clone(), other_job];
        let pending =
            |entries: &[Entry], now| pending_triggers("every-minute", &triggers, entries, now);
        assert_eq!(pending(&[], at(610)), std::slice::from_ref(&requested));
        // Its window has ended: nobody will claim it any more (`trigger` exited 4).
        assert!(pending(&[], at(630)).is_empty());
        // A worker ran it (and a node that missed the delete still holds the request).
        let mut ran = run(600, "success");
        ran.trigger = Some(requested.id.clone());
        assert!(pending(&[ran], at(610)).is_empty());
    }
}
