//! The explain view: one tick's story across the cluster.
//!
//! [`read`] gathers every entry the workers wrote for `(job, tick)`, whether the history reaches back before
//! it, and the members; [`explain`] tells the story: who raced (the winner's view of them when its run
//! names them — routine losers record nothing — else each loser's entry), who won with which token, how
//! the run ended
//! — or why nobody ran it (the skips with their reasons, a `missed` entry), or that no entry exists at all,
//! with a hint at why — and a one-word verdict. A tick that is not an instant of the job's schedule is said
//! to be so, with the nearest ticks before and after it — unless its entries are those of a
//! `redcron trigger` request, whose run's tick is the request's time.

use chrono::{DateTime, Utc};
use futures_util::future::{join, join_all};
use serde::Serialize;

use super::status::{alive, SETTLE};
use super::story::{describe, gone, no_entry_hint, pause_note};
use super::time::{self, instant, instant_ms};
use super::Notes;
use crate::config::JobConfig;
use crate::history::tick::{self, raced_for_it, TickRecord};
use crate::history::{Entry, HistorySettings, Kind, Query, CONTROL_PAUSED};
use crate::lock::{PauseRead, QuorumFailure};
use crate::membership::Member;
use crate::schedule::Tick;
use crate::store::Store;

/// The most entries read for one tick (a few per worker).
const ENTRIES_PER_TICK: usize = 1000;
/// The entries read from before the tick: enough to see past a few pauses and resumes (`control`
/// entries) to a tick's, and to find the latest control before the tick if it is near.
const ENTRIES_BEFORE: usize = 16;

/// What the explanation of a tick is computed from, as read from the store.
#[derive(Debug, Clone, Default)]
pub struct ExplainInputs {
    /// Every entry of the tick, as stored (the merge's order).
    pub entries: Vec<Entry>,
    /// Whether the store holds entries of the job from before this tick (of ticks: a pause or resume
    /// does not count).
    pub earlier: bool,
    /// The latest pause or resume (`control` entry) among the newest entries before the tick, if any.
    pub control_before: Option<Entry>,
    /// The job's pause as the store holds it now (`status`'s `paused`): whether a pause told as the
    /// latest before the tick still stands.
    pub paused_now: Option<PauseRead>,
    /// The workers the store knows, to tell a run under way from one whose worker died.
    pub members: Vec<Member>,
    pub notes: Notes,
}

/// Reads what the story of `tick` of `job` needs from `store` (from a majority of its nodes).
pub async fn read(store: &Store, job: &str, tick: Tick) -> Result<ExplainInputs, QuorumFailure> {
    let queries = [
        Query {
            job: job.to_string(),
            since: Some(tick),
            until: Some(tick),
            limit: ENTRIES_PER_TICK,
        },
        // Whether the history reaches back before this tick at all, for the hint, and the latest
        // pause or resume before it.
        Query {
            job: job.to_string(),
            since: None,
            until: Some(Tick(tick.0 - 1)),
            limit: ENTRIES_BEFORE,
        },
    ];
    let mut notes = Notes::new(store);
    let mut histories = Vec::with_capacity(queries.len());
    for read in join_all(queries.iter().map(|query| store.history(query))).await {
        histories.push(notes.keep(read?));
    }
    let jobs = [job.to_string()];
    let (members, pauses) = join(store.members(), store.pauses(&jobs)).await;
    let members = notes.keep(members?);
    let paused_now = notes.keep(pauses?).pop().flatten();
    let before = histories.pop().unwrap_or_default();
    // A read full of controls cannot tell: taken as earlier history, as before controls existed.
    let earlier = before.iter().any(|e| !e.is_control()) || before.len() >= ENTRIES_BEFORE;
    let control_before = before.iter().find(|e| e.is_control()).cloned();
    let entries = histories.pop().unwrap_or_default();
    Ok(ExplainInputs {
        entries,
        earlier,
        control_before,
        paused_now,
        members,
        notes,
    })
}

/// How a tick ended up, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// A worker ran it and the run succeeded (exit 0).
    Ran,
    /// A worker ran it and the run ended without success: a non-zero exit, a signal, a timeout, a lost
    /// lease, or a job that could not start.
    Failed,
    /// A worker runs it now.
    Running,
    /// A worker started it, and is no longer alive: the run's end will never be recorded.
    Unfinished,
    /// Entries account for it, none of them a run.
    NotRun,
    /// Its window has not ended yet (or it lies ahead): workers may still race it.
    NotYet,
    /// Its window has ended and no entry accounts for it.
    NoEntry,
}

/// What `explain` reports. Field names are stable (docs/history.md).
#[derive(Debug, Serialize)]
pub struct Explanation {
    pub job: String,
    pub tick: DateTime<Utc>,
    /// The tick in milliseconds since the Unix epoch, as in the entries.
    pub tick_ms: i64,
    /// Whether the tick is an instant of the job's schedule.
    pub on_schedule: bool,
    /// The `redcron trigger` requests made at this instant, when its entries say so (two requests made in
    /// the same millisecond share it; each is claimed and run on its own).
    pub triggers: Vec<String>,
    /// The job's nearest ticks strictly before and after it.
    pub previous_tick: Option<DateTime<Utc>>,
    pub next_tick: Option<DateTime<Utc>>,
    pub verdict: Verdict,
    /// The workers that raced for the tick: the winner's view of them (`raced` on its run), then every
    /// worker whose entry says it ran it, lost it, or failed to win it.
    pub raced: Vec<String>,
    /// The `run` entries (one per series, unless something is badly wrong), each series' latest attempt
    /// first, each with `tick_rfc3339`; a failed run's carries the end of its output (`tail_out`,
    /// `tail_err`) when its worker kept it.
    #[serde(serialize_with = "time::entries")]
    pub runs: Vec<Entry>,
    /// Every entry of the tick, as stored, each with `tick_rfc3339`.
    #[serde(serialize_with = "time::entries")]
    pub entries: Vec<Entry>,
    /// The tick's records, one per series (the schedule, each retry attempt, each trigger request), as
    /// `history` lists them in `ticks`.
    #[serde(serialize_with = "time::records")]
    pub records: Vec<TickRecord>,
    /// The job's pause now, as `status` gives it (`null`: not paused).
    pub paused_now: Option<PauseRead>,
    /// The story, one sentence a line.
    pub story: Vec<String>,
    /// What may explain a tick nobody accounted for.
    pub hint: Option<String>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// What the story of a tick depends on besides its entries.
pub(crate) struct Facts<'a> {
    pub job: &'a JobConfig,
    pub now: DateTime<Utc>,
    pub history: &'a HistorySettings,
    /// Whether the store holds entries of the job from before this tick.
    pub earlier: bool,
    /// The workers the store knows, to tell a run under way from one whose worker died.
    pub members: &'a [Member],
}

/// The story of `tick` of `job` at `now`, told by what [`read`] gathered; `history` is the config's
/// history settings, for the hint at a tick with no entry.
pub fn explain(
    job: &JobConfig,
    history: &HistorySettings,
    tick: Tick,
    inputs: ExplainInputs,
    now: DateTime<Utc>,
) -> Explanation {
    let ExplainInputs {
        entries,
        earlier,
        control_before,
        paused_now,
        members,
        notes,
    } = inputs;
    let facts = &Facts {
        job,
        now,
        history,
        earlier,
        members: &members,
    };
    let schedule = &job.schedule;
    let on_schedule = schedule.last_at_or_before(tick.to_utc()) == Some(tick);
    let previous_tick = schedule.last_at_or_before(Tick(tick.0 - 1).to_utc());
    let next_tick = schedule.next_after(tick.to_utc());
    // A trigger's run has the request's time as its tick: an instant off the schedule, by design.
    let triggers = first_of_each(entries.iter().filter_map(|e| e.trigger.clone()));
    let mut story = instant_lines(job, tick, &triggers, on_schedule, previous_tick, next_tick);
    story.extend(pause_lines(control_before.as_ref(), paused_now.as_ref()));
    let records = tick::group(entries.iter().cloned());
    let (raced, race_lines) = race_lines(&records, &entries, facts.members);
    story.extend(race_lines);
    let runs = runs_of(&records, &mut story);
    story.extend(runs.iter().map(describe));
    story.extend(entries.iter().filter(|e| e.kind != Kind::Run).map(describe));
    let (verdict, hint) = verdict_of(facts, tick, on_schedule, &records, &mut story);
    Explanation {
        job: job.name.clone(),
        tick: tick.to_utc(),
        tick_ms: tick.0,
        on_schedule,
        triggers,
        previous_tick: previous_tick.map(Tick::to_utc),
        next_tick: next_tick.map(Tick::to_utc),
        verdict,
        raced,
        runs,
        entries,
        records,
        paused_now,
        story,
        hint,
        notes,
    }
}

/// The story's first lines: the job and the instant (in the job's zone too), and why it is asked about
/// when it is no tick of the schedule — a trigger's extra run, or an instant between two ticks.
fn instant_lines(
    job: &JobConfig,
    tick: Tick,
    triggers: &[String],
    on_schedule: bool,
    previous_tick: Option<Tick>,
    next_tick: Option<Tick>,
) -> Vec<String> {
    let schedule = &job.schedule;
    let mut lines = vec![format!("{} at {}", job.name, instant(tick.to_utc()))];
    if schedule.timezone() != chrono_tz::UTC {
        lines[0].push_str(&format!(
            " ({} in {})",
            schedule.format_tick(tick),
            schedule.timezone().name()
        ));
    }
    if !triggers.is_empty() {
        lines.push(format!(
            "{} asked for by `redcron trigger` (request{} {}){}",
            if triggers.len() == 1 {
                "an extra run"
            } else {
                "extra runs"
            },
            if triggers.len() == 1 { "" } else { "s" },
            triggers.join(", "),
            if on_schedule {
                ""
            } else {
                ", not a tick of the schedule"
            }
        ));
    } else if !on_schedule {
        let show = |t: Option<Tick>| t.map_or("none".to_string(), |t| instant(t.to_utc()));
        lines.push(format!(
            "{} is not a tick of {} ({schedule}); the nearest are {} before and {} after",
            instant(tick.to_utc()),
            job.name,
            show(previous_tick),
            show(next_tick)
        ));
    }
    lines
}

/// A pause in force at the tick, as far as the latest control before it says (it may have ended by
/// its `until`, which the sentence gives), and whether a pause stands now: a resume after the tick is
/// not among the entries read.
fn pause_lines(control_before: Option<&Entry>, paused_now: Option<&PauseRead>) -> Vec<String> {
    let Some(pause) = control_before.filter(|c| c.action.as_deref() == Some(CONTROL_PAUSED)) else {
        return Vec::new();
    };
    vec![
        format!(
            "the latest pause or resume before it: {}, at {}",
            describe(pause),
            instant_ms(pause.tick)
        ),
        match paused_now {
            Some(read) => format!("the job is paused now: {}", pause_note(read)),
            None => {
                "the job is not paused now: the pause was lifted (`redcron resume`) or ended since"
                    .to_string()
            }
        },
    ]
}

/// Who raced the tick, and the lines that say so: the winners' views name the racers, routine losers
/// included; the entries name the rest (and all of them, on the entries of earlier versions, where
/// each loser wrote one).
fn race_lines(
    records: &[TickRecord],
    entries: &[Entry],
    members: &[Member],
) -> (Vec<String>, Vec<String>) {
    let views: Vec<&TickRecord> = records.iter().filter(|r| view(r).is_some()).collect();
    let raced = first_of_each(
        views
            .iter()
            .filter_map(|r| view(r))
            .flatten()
            .cloned()
            .chain(
                entries
                    .iter()
                    .filter(|e| raced_for_it(e))
                    .map(|e| e.worker.clone()),
            ),
    );
    let mut lines = Vec::new();
    if views.is_empty() && !raced.is_empty() {
        lines.push(format!(
            "raced by {} worker{}: {}",
            raced.len(),
            if raced.len() == 1 { "" } else { "s" },
            raced.join(", ")
        ));
    }
    lines.extend(views.iter().filter_map(|r| race(r, members)));
    (raced, lines)
}

/// The runs, each series' latest attempt first, the one that ended first. Each series (the schedule,
/// each trigger request, each retry attempt) runs once; several runs of one series are a broken
/// promise, which `story` is told in capitals.
fn runs_of(records: &[TickRecord], story: &mut Vec<String>) -> Vec<Entry> {
    let runs: Vec<Entry> = records
        .iter()
        .flat_map(|r| r.run().into_iter().chain(&r.other_runs))
        .cloned()
        .collect();
    let distinct = first_of_each(runs.iter().map(Entry::series)).len();
    if distinct < runs.len() {
        story.push(format!(
            "DOUBLE RUN: {} runs recorded for {} claim{} of this tick: each (job, tick) should run once",
            runs.len(),
            distinct,
            if distinct == 1 { "" } else { "s" }
        ));
    }
    runs
}

/// What became of the tick, with its closing lines told to `story`, and a hint where nothing was
/// recorded of a tick whose window has closed.
fn verdict_of(
    facts: &Facts<'_>,
    tick: Tick,
    on_schedule: bool,
    records: &[TickRecord],
    story: &mut Vec<String>,
) -> (Verdict, Option<String>) {
    let window_ends = facts.job.window_end(tick);
    let settled = window_ends + chrono::Duration::from_std(SETTLE).unwrap_or_default();
    let verdict = if let Some(run) = records.iter().find_map(TickRecord::run) {
        if run.ended_at.is_some() {
            if run.outcome.as_deref() == Some("success") {
                Verdict::Ran
            } else {
                Verdict::Failed
            }
        } else if alive(facts.members, &run.worker) {
            Verdict::Running
        } else {
            story.push(gone(facts.members, &run.worker));
            Verdict::Unfinished
        }
    } else if facts.now < settled {
        Verdict::NotYet
    } else if !records.is_empty() {
        Verdict::NotRun
    } else {
        Verdict::NoEntry
    };
    let mut hint = None;
    match verdict {
        Verdict::NotYet if facts.now < tick.to_utc() => {
            story.push("not yet: the tick lies ahead".to_string())
        }
        Verdict::NotYet if facts.now < window_ends => story.push(format!(
            "not yet: its window is open until {}; workers may still race it",
            instant(window_ends)
        )),
        Verdict::NotYet => story.push(format!(
            "not yet: its window closed at {}, and the workers' entries may still be landing",
            instant(window_ends)
        )),
        Verdict::NotRun => story.push("nobody ran it".to_string()),
        Verdict::NoEntry if !on_schedule => {
            story.push("no entry: no worker races an instant that is not a tick".to_string())
        }
        Verdict::NoEntry => {
            story.push("no entry: nobody accounted for this tick".to_string());
            hint = Some(no_entry_hint(facts));
        }
        Verdict::Ran | Verdict::Failed | Verdict::Running | Verdict::Unfinished => {}
    }
    (verdict, hint)
}

/// The winner's view of the racers, if its run names them.
fn view(record: &TickRecord) -> Option<&Vec<String>> {
    record.run()?.raced.as_ref()
}

/// The race of a record whose run names the racers: who raced (the winner's view), the winner's place
/// and token, and the others, which recorded nothing: routine losers that found the tick confirmed — or,
/// for a worker whose last announcement (in `members`) came before the tick and which is gone, a worker
/// that died before it could race (the winner's view of the live workers lags a death by a few
/// heartbeats).
fn race(record: &TickRecord, members: &[Member]) -> Option<String> {
    let run = record.run()?;
    let view = run.raced.as_ref()?;
    let mut text = format!("raced by {} (the winner's view)", view.join(", "));
    if let Some(tag) = record.series().tag() {
        text.push_str(&format!(" for {tag}"));
    }
    match record.winner_place() {
        Some(place) => text.push_str(&format!("; {} won at place {place}", run.worker)),
        None => text.push_str(&format!("; {} won, outside its own view", run.worker)),
    }
    if let Some(token) = run.token {
        text.push_str(&format!(" with token {token}"));
    }
    let tick = DateTime::from_timestamp_millis(run.tick).unwrap_or_default();
    let gone_before = |worker: &str| {
        members
            .iter()
            .find(|m| m.id == worker && !m.alive)
            .and_then(|m| m.seen_at.filter(|seen| *seen < tick))
    };
    let (gone, silent): (Vec<&str>, Vec<&str>) = record
        .silent()
        .into_iter()
        .partition(|worker| gone_before(worker).is_some());
    if !silent.is_empty() {
        text.push_str(&format!(
            "; {} found the tick confirmed: already_claimed, routine, not recorded",
            silent.join(", ")
        ));
    }
    for worker in gone {
        if let Some(seen) = gone_before(worker) {
            text.push_str(&format!(
                "; {worker} did not race: it was gone (last seen {})",
                instant(seen)
            ));
        }
    }
    Some(text)
}

/// Each item once, in the order of its first appearance.
fn first_of_each<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    items.fold(Vec::new(), |mut kept, item| {
        if !kept.contains(&item) {
            kept.push(item);
        }
        kept
    })
}

#[cfg(test)]
mod tests;
