//! A tick's merged account: the entries of one `(job, series, tick)` folded into one [`TickRecord`] — the
//! fact that accounts for the tick, and the notes beside it.
//!
//! Workers write one entry each about what they did, and which workers write depends on their version: a
//! current winner writes its run with the workers that raced ([`Entry::raced`]), and a routine loser writes
//! nothing; a worker of an earlier version writes a `lost` entry for every tick it lost. [`group`] reads
//! both the same way, so the readers (`history`, `explain`, `status`, `trigger`) count ticks, not entries:
//! - the **record** is the run (an ended one over one still running), else the miss, else a skip, else
//!   whatever entry there is (a loss whose winner recorded nothing, a kind this version does not know);
//! - **other runs** of the same series by other workers are a double run, a broken promise, kept apart so
//!   that no reader can hide it;
//! - the **notes** are every other entry: the anomalies (a loss that was not routine, a skip beside a run)
//!   and the per-loser entries of earlier versions; readers show them all but a racer's skip for not
//!   winning in time beside a run ([`TickRecord::shown_notes`]).
//!
//! A `control` entry (a pause or resume, [`Kind::Control`]) is about the job, not a tick: [`group`] leaves
//! it out, so no reader counts it as a tick; [`controls`] picks them out for the readers that list them.

use std::cmp::Ordering;

use super::{Entry, Kind};
use crate::lock::Series;
use crate::schedule::Tick;

/// The merged account of one `(job, series, tick)`.
#[derive(Debug, Clone, PartialEq)]
pub struct TickRecord {
    /// The entry that accounts for the tick: its run, else its miss, else a skip, else the first entry.
    pub record: Entry,
    /// Runs of the same `(job, series, tick)` by other workers than the record's: each `(job, tick)` runs
    /// once, so any entry here is a double run.
    pub other_runs: Vec<Entry>,
    /// Every other entry of the tick: anomalies, and the per-loser entries of earlier versions.
    pub notes: Vec<Entry>,
}

impl TickRecord {
    /// The job.
    pub fn job(&self) -> &str {
        &self.record.job
    }

    /// The tick (a trigger request's time for a trigger's record).
    pub fn tick(&self) -> Tick {
        self.record.tick()
    }

    /// The series: the schedule, a retry attempt or a trigger request.
    pub fn series(&self) -> Series {
        self.record.series()
    }

    /// The run that accounts for the tick, if a worker ran it.
    pub fn run(&self) -> Option<&Entry> {
        (self.record.kind == Kind::Run).then_some(&self.record)
    }

    /// Whether more than one worker ran this `(job, series, tick)`.
    pub fn double_run(&self) -> bool {
        !self.other_runs.is_empty()
    }

    /// The notes a reader shows beside the record: every note but, beside a run, a racer's skip for
    /// not winning in time (`no_quorum`, `contended`): the run accounts for the tick, and [`Self::raced`]
    /// still names that worker — shown as a skip, a tick that ran would read as one that was skipped.
    pub fn shown_notes(&self) -> impl Iterator<Item = &Entry> {
        let ran = self.run().is_some();
        self.notes.iter().filter(move |note| {
            !(ran
                && note.kind == Kind::Skipped
                && matches!(note.reason.as_deref(), Some("no_quorum" | "contended")))
        })
    }

    /// Every entry of the record: the record, the other runs, the notes.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        std::iter::once(&self.record)
            .chain(&self.other_runs)
            .chain(&self.notes)
    }

    /// The workers that raced for the tick: the winner's view ([`Entry::raced`], in rank order) when its
    /// run names them, then every other worker whose entry says it took part — it ran the tick, lost it,
    /// or could not win it (`no_quorum`, `contended`, `lease_expired`, `no_slot`). Each once.
    pub fn raced(&self) -> Vec<String> {
        let view = self
            .run()
            .and_then(|run| run.raced.clone())
            .unwrap_or_default();
        let mut raced = view;
        for entry in self.entries().filter(|e| raced_for_it(e)) {
            if !raced.contains(&entry.worker) {
                raced.push(entry.worker.clone());
            }
        }
        raced
    }

    /// The winner's place in its own view of the race (0: it was first in the tick's ranking), when its
    /// run names the racers and itself among them.
    pub fn winner_place(&self) -> Option<usize> {
        let run = self.run()?;
        run.raced.as_ref()?.iter().position(|w| *w == run.worker)
    }

    /// The workers of the winner's view that recorded nothing about the tick: routine losers, which found
    /// it confirmed (`already_claimed`) and, since the winner names them, write no entry. Empty without a
    /// view (an earlier version's run: its losers wrote `lost` entries).
    pub fn silent(&self) -> Vec<&str> {
        let Some(view) = self.run().and_then(|run| run.raced.as_ref()) else {
            return Vec::new();
        };
        view.iter()
            .filter(|w| !self.entries().any(|e| e.worker == **w))
            .map(String::as_str)
            .collect()
    }
}

/// Whether the entry's worker took part in the race: it ran the tick, lost it, or could not win it.
pub fn raced_for_it(entry: &Entry) -> bool {
    match entry.kind {
        Kind::Run | Kind::Lost => true,
        Kind::Skipped => matches!(
            entry.reason.as_deref(),
            Some("no_quorum" | "contended" | "lease_expired" | "no_slot")
        ),
        Kind::Missed | Kind::Control | Kind::Unknown => false,
    }
}

/// The `control` entries among `entries` (pauses and resumes), in the order given.
pub fn controls<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Vec<Entry> {
    entries
        .into_iter()
        .filter(|e| e.is_control())
        .cloned()
        .collect()
}

/// Folds entries (merged: one per identity, as [`super::merge`] gives them) into one record per
/// `(job, series, tick)`, newest tick first, then by job, then by series: the retry attempts latest first,
/// then the schedule's first attempt, then the trigger requests by id. Within a record the entries keep
/// the order they came in. `control` entries are left out: they are not about a tick.
pub fn group(entries: impl IntoIterator<Item = Entry>) -> Vec<TickRecord> {
    let mut groups: Vec<Vec<Entry>> = Vec::new();
    let mut entries: Vec<Entry> = entries.into_iter().filter(|e| !e.is_control()).collect();
    // A stable sort: within a record the merge's order stays.
    entries.sort_by(order);
    for entry in entries {
        match groups.last_mut() {
            Some(group) if order(&group[0], &entry) == Ordering::Equal => group.push(entry),
            _ => groups.push(vec![entry]),
        }
    }
    groups.into_iter().map(fold).collect()
}

/// The order [`group`] gives records in: newest tick first, then job, then series.
pub fn newest_first(a: &TickRecord, b: &TickRecord) -> Ordering {
    order(&a.record, &b.record)
}

/// The order of records: newest tick first, then job, then series (latest attempt first, then the
/// schedule, then triggers by id); equal for the entries of one record.
fn order(a: &Entry, b: &Entry) -> Ordering {
    let series = |e: &Entry| match e.series() {
        Series::Retry(attempt) => (0, u32::MAX - attempt, None),
        Series::Schedule => (0, u32::MAX, None),
        Series::Trigger(id) => (1, 0, Some(id)),
    };
    b.tick
        .cmp(&a.tick)
        .then_with(|| a.job.cmp(&b.job))
        .then_with(|| series(a).cmp(&series(b)))
}

/// One record of the entries of one `(job, series, tick)` (at least one).
fn fold(mut entries: Vec<Entry>) -> TickRecord {
    let precedence = |e: &Entry| match e.kind {
        Kind::Run if e.ended_at.is_some() => 0,
        Kind::Run => 1,
        Kind::Missed => 2,
        Kind::Skipped => 3,
        Kind::Lost | Kind::Unknown | Kind::Control => 4,
    };
    let first = (0..entries.len())
        .min_by_key(|&i| (precedence(&entries[i]), i))
        .unwrap_or(0);
    let record = entries.remove(first);
    let (other_runs, notes) = if record.kind == Kind::Run {
        entries.into_iter().partition(|e| e.kind == Kind::Run)
    } else {
        (Vec::new(), entries)
    };
    TickRecord {
        record,
        other_runs,
        notes,
    }
}

#[cfg(test)]
mod tests;
