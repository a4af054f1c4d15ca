//! The history view: the run history — runs and ticks not run — of several jobs, one record per tick,
//! newest first.
//!
//! The store answers per job ([`Store::history`]) and counts entries; a tick has one entry when the
//! winner names the racers (a routine loser writes nothing) and one per worker when earlier versions wrote
//! it. [`read`] asks every job for a few entries per tick wanted and asks again, for more, while a job's
//! page came back full before `limit` ticks were known (up to [`MAX_ENTRIES_PER_JOB`]); [`history`] folds
//! the entries into [`TickRecord`]s and keeps the newest `limit`, whichever jobs they belong to.
//!
//! Pauses and resumes (`control` entries) are listed beside the ticks, on their own ([`History::controls`]):
//! `limit` counts ticks only, and the controls listed are those made since the oldest tick listed (all
//! that were read, when fewer ticks than `limit` exist).

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use serde::Serialize;

use super::time;
use super::Notes;
use crate::history::tick::{self, TickRecord};
use crate::history::{Entry, Query};
use crate::lock::QuorumFailure;
use crate::schedule::Tick;
use crate::store::Store;

/// Entries read per tick wanted, at first: a tick of earlier versions has one per worker that raced.
const ENTRIES_PER_TICK: usize = 4;

/// The most entries `history` reads of one job, however few ticks they make.
pub const MAX_ENTRIES_PER_JOB: usize = 40_000;

/// What the history view is computed from, as read from the store.
#[derive(Debug, Clone, Default)]
pub struct HistoryInputs {
    /// The newest entries of each job asked for, newest first.
    pub histories: Vec<Vec<Entry>>,
    /// How many entries of each job were asked for: a job that gave this many may have older ones, and its
    /// oldest tick in the answer may lack some of its entries.
    pub asked: usize,
    pub notes: Notes,
}

/// Reads the entries of the newest `limit` ticks of each of `jobs` at or after `since` from `store` (from
/// a majority of its nodes), asking again for more while a job's answer was full and fewer than `limit`
/// whole ticks came back, up to [`MAX_ENTRIES_PER_JOB`].
pub async fn read(
    store: &Store,
    jobs: &[String],
    since: Option<DateTime<Utc>>,
    limit: usize,
) -> Result<HistoryInputs, QuorumFailure> {
    let mut asked = limit
        .saturating_mul(ENTRIES_PER_TICK)
        .min(MAX_ENTRIES_PER_JOB);
    loop {
        let queries: Vec<Query> = jobs
            .iter()
            .map(|job| Query {
                job: job.clone(),
                since: since.map(|t| Tick(t.timestamp_millis())),
                until: None,
                limit: asked,
            })
            .collect();
        let mut notes = Notes::new(store);
        let mut histories = Vec::with_capacity(queries.len());
        for read in join_all(queries.iter().map(|query| store.history(query))).await {
            histories.push(notes.keep(read?));
        }
        let inputs = HistoryInputs {
            histories,
            asked,
            notes,
        };
        if asked >= MAX_ENTRIES_PER_JOB || newest(&inputs, limit).complete {
            return Ok(inputs);
        }
        asked = asked
            .saturating_mul(ENTRIES_PER_TICK)
            .min(MAX_ENTRIES_PER_JOB);
    }
}

/// What `history` reports. Field names are stable (docs/history.md).
#[derive(Debug, Serialize)]
pub struct History {
    /// Every entry of the listed ticks and of the listed controls as stored (each with `tick_rfc3339`),
    /// newest tick first, then by job, worker and kind.
    #[serde(serialize_with = "time::entries")]
    pub entries: Vec<Entry>,
    /// The ticks, newest first: each one's record with `tick_rfc3339`, `other_runs` and `notes`. Never a
    /// control: `limit` counts these.
    #[serde(serialize_with = "time::records")]
    pub ticks: Vec<TickRecord>,
    /// The pauses and resumes (`control` entries, with `tick_rfc3339`: when they were made) of the listed
    /// jobs since the oldest tick listed, newest first; not counted by `limit`.
    #[serde(serialize_with = "time::entries")]
    pub controls: Vec<Entry>,
    /// Set when fewer ticks than asked are listed because a job had more than [`MAX_ENTRIES_PER_JOB`]
    /// entries in them: says which job, and from which tick back the list may miss some.
    pub cut_short: Option<String>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// The newest `limit` ticks of what [`read`] gathered.
pub fn history(inputs: HistoryInputs, limit: usize) -> History {
    let Newest {
        ticks,
        controls,
        complete,
        horizon,
    } = newest(&inputs, limit);
    let cut_short = match horizon {
        Some((job, tick)) if !complete => Some(format!(
            "{} of {limit} ticks listed: {job} has more than {} entries in its newest ones; ticks at or \
             before {} are left out",
            ticks.len(),
            inputs.asked,
            time::instant_ms(tick)
        )),
        _ => None,
    };
    let mut entries: Vec<Entry> = ticks
        .iter()
        .flat_map(TickRecord::entries)
        .chain(&controls)
        .cloned()
        .collect();
    entries.sort_by(|a, b| {
        b.tick
            .cmp(&a.tick)
            .then_with(|| a.job.cmp(&b.job))
            .then_with(|| a.worker.cmp(&b.worker))
            .then_with(|| a.kind.as_str().cmp(b.kind.as_str()))
    });
    History {
        entries,
        ticks,
        controls,
        cut_short,
        notes: inputs.notes,
    }
}

/// The newest ticks that the entries read tell whole.
struct Newest {
    /// At most `limit` records, newest first.
    ticks: Vec<TickRecord>,
    /// The controls among the whole ticks' time, since the oldest tick kept when more were cut; newest
    /// first.
    controls: Vec<Entry>,
    /// Whether these are the newest `limit` ticks, or all there are.
    complete: bool,
    /// The job whose full answer reached back least far, and the oldest tick of it: the ticks at or
    /// before it may lack entries the store holds (or be missing).
    horizon: Option<(String, i64)>,
}

/// The newest `limit` ticks of several jobs' entries, from the ticks every answer holds whole: a job's
/// full answer (as many entries as asked) may lack entries of its oldest tick and everything older, so
/// only ticks after the latest such tick of any job are certain to be the newest and whole.
fn newest(inputs: &HistoryInputs, limit: usize) -> Newest {
    let horizon = inputs
        .histories
        .iter()
        .filter(|entries| entries.len() >= inputs.asked)
        .filter_map(|entries| entries.iter().map(|e| (e.tick, &e.job)).min())
        .max()
        .map(|(tick, job)| (job.clone(), tick));
    let after = horizon.as_ref().map(|(_, tick)| *tick);
    let whole = inputs
        .histories
        .iter()
        .flatten()
        .filter(|e| after.is_none_or(|after| e.tick > after))
        .cloned();
    let whole: Vec<Entry> = whole.collect();
    let mut controls = tick::controls(&whole);
    let mut ticks = tick::group(whole);
    let complete = horizon.is_none() || ticks.len() >= limit;
    if ticks.len() > limit {
        ticks.truncate(limit);
        // Older ticks were cut: so are the controls older than the oldest tick kept.
        let oldest = ticks.last().map_or(i64::MIN, |record| record.record.tick);
        controls.retain(|control| control.tick >= oldest);
    }
    controls.sort_by(|a, b| b.tick.cmp(&a.tick).then_with(|| a.job.cmp(&b.job)));
    Newest {
        ticks,
        controls,
        complete,
        horizon,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Kind;

    fn entry(job: &str, tick: i64, worker: &str, kind: Kind) -> Entry {
        Entry::new(job, Tick(tick), worker, kind, DateTime::UNIX_EPOCH)
    }

    fn run(job: &str, tick: i64, worker: &str) -> Entry {
        entry(job, tick, worker, Kind::Run)
    }

    fn inputs(histories: Vec<Vec<Entry>>, asked: usize) -> HistoryInputs {
        HistoryInputs {
            histories,
            asked,
            notes: Notes::default(),
        }
    }

    /// Several jobs' ticks come out as one list, newest tick first, cut at the limit in ticks, with every
    /// entry of the listed ticks.
    #[test]
    fn the_jobs_are_merged_newest_tick_first_and_limited_in_ticks() {
        let mut lost = entry("a", 3000, "w2", Kind::Lost);
        lost.reason = Some("already_claimed".into());
        let a = vec![run("a", 3000, "w1"), lost, run("a", 1000, "w1")];
        let b = vec![run("b", 3000, "w2"), run("b", 2000, "w1")];
        let history = history(inputs(vec![a, b], 100), 3);
        let seen: Vec<(&str, i64)> = history
            .ticks
            .iter()
            .map(|r| (r.job(), r.tick().0))
            .collect();
        assert_eq!(seen, [("a", 3000), ("b", 3000), ("b", 2000)]);
        assert_eq!(history.ticks[0].notes.len(), 1);
        assert_eq!(history.entries.len(), 4);
        assert_eq!(history.cut_short, None);
    }

    /// `limit` counts ticks only: the pauses and resumes are listed beside them, those since the oldest
    /// tick listed, newest first, and never as a tick.
    #[test]
    fn controls_are_listed_beside_the_ticks_and_not_counted() {
        let control = |action: &'static str, ms: i64| {
            let what = crate::history::Control {
                action,
                by: "ops@host".into(),
                reason: String::new(),
                until: None,
            };
            let made = DateTime::from_timestamp_millis(ms).unwrap_or_default();
            Entry::control("a", &what, "cli", made)
        };
        let a = vec![
            control("resumed", 3500),
            run("a", 3000, "w1"),
            control("paused", 2500),
            run("a", 2000, "w1"),
            control("resumed", 1500),
            run("a", 1000, "w1"),
        ];
        let listed = history(inputs(vec![a.clone()], 100), 2);
        let ticks: Vec<i64> = listed.ticks.iter().map(|r| r.tick().0).collect();
        assert_eq!(ticks, [3000, 2000]);
        let controls: Vec<(i64, Option<&str>)> = listed
            .controls
            .iter()
            .map(|c| (c.tick, c.action.as_deref()))
            .collect();
        assert_eq!(controls, [(3500, Some("resumed")), (2500, Some("paused"))]);
        assert_eq!(listed.entries.len(), 4);
        let all = history(inputs(vec![a], 100), 10);
        assert_eq!((all.ticks.len(), all.controls.len()), (3, 3));
    }

    /// A job's full answer may lack entries of its oldest tick and older ones: only ticks after it count,
    /// and fewer than asked means reading again; with all there is, or enough, it is complete.
    #[test]
    fn a_full_answer_counts_only_the_ticks_it_holds_whole() {
        // Legacy ticks of 3 entries each, read 4 entries at a time: the second tick may be cut.
        let tick = |t: i64| {
            vec![
                run("a", t, "w1"),
                entry("a", t, "w2", Kind::Lost),
                entry("a", t, "w3", Kind::Lost),
            ]
        };
        let page: Vec<Entry> = tick(5000).into_iter().chain(tick(4000)).take(4).collect();
        let short = newest(&inputs(vec![page.clone()], 4), 2);
        assert!(!short.complete);
        assert_eq!(short.ticks.len(), 1);
        assert_eq!(short.horizon, Some(("a".to_string(), 4000)));
        let whole: Vec<Entry> = tick(5000).into_iter().chain(tick(4000)).collect();
        assert!(newest(&inputs(vec![whole.clone()], 12), 2).complete);
        assert_eq!(newest(&inputs(vec![whole], 12), 2).ticks.len(), 2);
        // Fewer entries than asked: all there is, complete however few ticks.
        assert!(newest(&inputs(vec![tick(5000)], 4), 2).complete);
        // Cut at the bound: said so, naming the job and the tick.
        let cut = history(inputs(vec![page], 4), 2);
        let said = cut.cut_short.expect("cut short");
        assert!(
            said.starts_with("1 of 2 ticks listed: a has more than 4 entries"),
            "{said}"
        );
    }

    /// The JSON lists each entry as stored, and each tick as its record's fields, both with the tick also
    /// in RFC 3339, and the notes flat.
    #[test]
    fn each_entry_and_tick_carries_its_tick_in_rfc_3339() {
        let mut lost = entry("a", 1_795_436_705_012, "w2", Kind::Lost);
        lost.by = Some("w1".into());
        let mut inputs = inputs(vec![vec![run("a", 1_795_436_705_012, "w1"), lost]], 20);
        inputs.notes.store = "embedded:/tmp/x".to_string();
        let json = serde_json::to_value(history(inputs, 20)).expect("json");
        assert_eq!(json["entries"][0]["tick"], 1_795_436_705_012_i64);
        assert_eq!(
            json["entries"][0]["tick_rfc3339"],
            "2026-11-23T12:25:05.012Z"
        );
        assert_eq!(json["entries"][0]["worker"], "w1");
        let tick = &json["ticks"][0];
        assert_eq!(tick["tick"], 1_795_436_705_012_i64);
        assert_eq!(tick["tick_rfc3339"], "2026-11-23T12:25:05.012Z");
        assert_eq!(
            (&tick["worker"], &tick["kind"]),
            (&"w1".into(), &"run".into())
        );
        assert_eq!(tick["other_runs"], serde_json::json!([]));
        assert_eq!(tick["notes"][0]["by"], "w1");
        assert_eq!(tick["notes"][0]["tick_rfc3339"], "2026-11-23T12:25:05.012Z");
        assert!(json["cut_short"].is_null());
        assert_eq!(json["store"], "embedded:/tmp/x");
        assert_eq!(json["missing_nodes"], serde_json::json!([]));
    }
}
