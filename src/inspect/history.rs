//! The history view: the run history — runs and ticks not run — of several jobs, one record per tick,
//! newest first.
//!
//! The store answers per job ([`Store::history`]) and counts entries; a tick has one entry when the
//! winner names the racers (a routine loser writes nothing) and one per worker when earlier versions wrote
//! it. [`read`] asks each job for a few entries per tick wanted and asks that job again, for more, while
//! its page came back full before `limit` ticks were known (up to [`MAX_ENTRIES_PER_JOB`]); [`Merge`]
//! folds each job's entries into [`TickRecord`]s as they come and keeps the newest `limit`, whichever
//! jobs they belong to. So the history of 10,000 jobs holds `limit` records and the pages of the jobs
//! being read ([`ENTRIES_IN_FLIGHT`]), never every job's pages at once.
//!
//! Pauses and resumes (`control` entries) are listed beside the ticks, on their own ([`History::controls`]):
//! `limit` counts ticks only, and the controls listed are those made since the oldest tick listed (all
//! that were read, when fewer ticks than `limit` exist), at most [`MAX_CONTROLS`], the newest.

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use serde::Serialize;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::time;
use super::Notes;
use crate::history::tick::{self, TickRecord};
use crate::history::{Entry, Query};
use crate::lock::QuorumFailure;
use crate::schedule::Tick;
use crate::store::{Read, Store};

/// The most ticks one read of the history shows (`history --limit`, `/api/history?limit=`).
pub const MAX_LIMIT: usize = 5000;

/// Entries read per tick wanted, at first: a tick of earlier versions has one per worker that raced.
const ENTRIES_PER_TICK: usize = 4;

/// The most entries `history` reads of one job, however few ticks they make.
pub const MAX_ENTRIES_PER_JOB: usize = 40_000;

/// How many entries [`read`] holds at once in pages not yet merged, all jobs together (one job's page
/// larger than this is read alone).
pub const ENTRIES_IN_FLIGHT: usize = 32_768;

/// A budget of [`ENTRIES_IN_FLIGHT`] entries for [`newest_entries`]: each read holds its share of it.
pub(crate) fn entry_budget() -> Semaphore {
    Semaphore::new(ENTRIES_IN_FLIGHT)
}

/// The most jobs [`read`] reads at once (the store's load stays bounded too).
const JOBS_IN_FLIGHT: usize = 128;

/// The most controls listed, the newest: a job paused and resumed without end lists no more than this.
pub const MAX_CONTROLS: usize = 5_000;

/// Reads the newest `limit` ticks of `jobs` at or after `since` from `store` (from a majority of its
/// nodes): each job's newest entries, read again for more while its answer was full and held fewer than
/// `limit` whole ticks (up to [`MAX_ENTRIES_PER_JOB`]), merged as each job's answer comes. At most
/// [`JOBS_IN_FLIGHT`] jobs and [`ENTRIES_IN_FLIGHT`] entries are read at once.
pub async fn read(
    store: &Store,
    jobs: &[String],
    since: Option<DateTime<Utc>>,
    limit: usize,
) -> Result<History, QuorumFailure> {
    let budget = entry_budget();
    let mut notes = Notes::new(store);
    let mut merge = Merge::new(limit);
    let mut waiting = jobs.iter();
    let mut reads = FuturesUnordered::new();
    loop {
        while reads.len() < JOBS_IN_FLIGHT {
            let Some(job) = waiting.next() else {
                break;
            };
            reads.push(read_job(store, &budget, job, since, limit));
        }
        // Unordered: a page waiting to be merged holds its share of the budget, and a job asking again
        // for more must not wait for pages that are only waiting for it.
        let Some(read) = reads.next().await else {
            break;
        };
        let page = read?;
        let entries = notes.keep(page.read);
        merge.add(entries, page.asked);
    }
    Ok(merge.finish(notes))
}

/// One job's answer, with what it was asked for and its share of the read's budget.
pub(crate) struct Page<'a> {
    /// The last read of the job: its entries came from it, and so do the nodes it notes.
    pub(crate) read: Read<Vec<Entry>>,
    pub(crate) asked: usize,
    _budget: Option<SemaphorePermit<'a>>,
}

/// Reads the newest entries of `job`: `limit` × [`ENTRIES_PER_TICK`], then four times as many while the
/// answer is full and holds fewer than `limit` whole ticks, up to [`MAX_ENTRIES_PER_JOB`].
async fn read_job<'a>(
    store: &Store,
    budget: &'a Semaphore,
    job: &str,
    since: Option<DateTime<Utc>>,
    limit: usize,
) -> Result<Page<'a>, QuorumFailure> {
    let first = limit.saturating_mul(ENTRIES_PER_TICK);
    let since = since.map(|t| Tick(t.timestamp_millis()));
    newest_entries(
        store,
        budget,
        job,
        since,
        first,
        MAX_ENTRIES_PER_JOB,
        |entries, asked| whole_ticks(entries, asked) >= limit,
    )
    .await
}

/// Reads the newest entries of `job` (with ticks at or after `since`) from `store`: `first` of them, then
/// four times as many while the answer came back full and `enough(entries, asked)` says it is not, up to
/// `most`. Each read holds its share of `budget` (all of it at most) until the page is dropped, so the
/// readers of many jobs together hold a bounded number of entries.
pub(crate) async fn newest_entries<'a>(
    store: &Store,
    budget: &'a Semaphore,
    job: &str,
    since: Option<Tick>,
    first: usize,
    most: usize,
    enough: impl Fn(&[Entry], usize) -> bool,
) -> Result<Page<'a>, QuorumFailure> {
    let most = most.max(1);
    let mut asked = first.clamp(1, most);
    loop {
        let share = u32::try_from(asked.min(ENTRIES_IN_FLIGHT)).unwrap_or(u32::MAX);
        // `None` only if the semaphore were closed, which it never is: the read goes on unbudgeted.
        let permit = budget.acquire_many(share).await.ok();
        let query = Query {
            job: job.to_string(),
            since,
            until: None,
            limit: asked,
        };
        let read = store.history(&query).await?;
        if read.value.len() < asked || asked >= most || enough(&read.value, asked) {
            return Ok(Page {
                read,
                asked,
                _budget: permit,
            });
        }
        drop(read);
        drop(permit);
        asked = asked.saturating_mul(ENTRIES_PER_TICK).min(most);
    }
}

/// How many ticks one job's answer holds whole: all of them if it had fewer entries than `asked`, else
/// those after its oldest tick (whose other entries may be older than the answer reaches).
fn whole_ticks(entries: &[Entry], asked: usize) -> usize {
    let horizon = (entries.len() >= asked)
        .then(|| entries.iter().map(|e| e.tick).min())
        .flatten();
    let ticks: std::collections::HashSet<(i64, crate::lock::Series)> = entries
        .iter()
        .filter(|e| !e.is_control() && horizon.is_none_or(|h| e.tick > h))
        .map(|e| (e.tick, e.series()))
        .collect();
    ticks.len()
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
    /// jobs since the oldest tick listed, newest first; not counted by `limit`; at most [`MAX_CONTROLS`].
    #[serde(serialize_with = "time::entries")]
    pub controls: Vec<Entry>,
    /// Set when fewer ticks than asked are listed because a job had more than [`MAX_ENTRIES_PER_JOB`]
    /// entries in them: says which job, and from which tick back the list may miss some.
    pub cut_short: Option<String>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// The newest `limit` ticks of several jobs, merged one job's answer at a time. It holds at most `limit`
/// records and [`MAX_CONTROLS`] controls, and the result does not depend on the order the jobs come in:
/// a job's full answer (as many entries as asked) may lack entries of its oldest tick and everything
/// older, so only ticks after the latest such tick of any job (the *horizon*) are certain to be the
/// newest and whole, and cutting to the newest `limit` before a later job moves the horizon keeps what
/// cutting after it would.
#[derive(Debug)]
struct Merge {
    limit: usize,
    /// At most `limit` records, newest first ([`tick::newest_first`]), all after the horizon.
    ticks: Vec<TickRecord>,
    /// The controls after the horizon (and, once ticks were cut, since the oldest tick kept), newest
    /// first, at most [`MAX_CONTROLS`].
    controls: Vec<Entry>,
    /// Whether whole ticks beyond the newest `limit` were left out.
    cut: bool,
    /// The job whose full answer reached back least far, the oldest tick of it, and how many entries that
    /// answer had: the ticks at or before it may lack entries the store holds (or be missing).
    horizon: Option<(String, i64, usize)>,
}

impl Merge {
    fn new(limit: usize) -> Merge {
        Merge {
            limit,
            ticks: Vec::new(),
            controls: Vec::new(),
            cut: false,
            horizon: None,
        }
    }

    /// Adds one job's newest entries, asked for `asked` of them.
    fn add(&mut self, entries: Vec<Entry>, asked: usize) {
        if entries.len() >= asked {
            let oldest = entries.iter().map(|e| (e.tick, &e.job)).min();
            if let Some((tick, job)) = oldest {
                let later = self
                    .horizon
                    .as_ref()
                    .is_none_or(|(held_job, held, _)| (tick, job) > (*held, held_job));
                if later {
                    self.horizon = Some((job.clone(), tick, asked));
                }
            }
        }
        let after = self.horizon.as_ref().map(|(_, tick, _)| *tick);
        let after_horizon = |e: &Entry| after.is_none_or(|after| e.tick > after);
        let whole: Vec<Entry> = entries.into_iter().filter(after_horizon).collect();
        self.controls.extend(tick::controls(&whole));
        let records = tick::group(whole);
        let held = std::mem::take(&mut self.ticks);
        let (kept, cut) = newest_of(held, records, self.limit, |r| {
            after.is_none_or(|after| r.record.tick > after)
        });
        self.ticks = kept;
        self.cut |= cut;
        self.controls.retain(after_horizon);
        if self.cut {
            // Older ticks were cut: so are the controls older than the oldest tick kept.
            let oldest = self
                .ticks
                .last()
                .map_or(i64::MIN, |record| record.record.tick);
            self.controls.retain(|control| control.tick >= oldest);
        }
        self.controls
            .sort_by(|a, b| b.tick.cmp(&a.tick).then_with(|| a.job.cmp(&b.job)));
        self.controls.truncate(MAX_CONTROLS);
    }

    /// Whether the ticks held are the newest `limit` of the jobs added, or all there are.
    fn complete(&self) -> bool {
        self.horizon.is_none() || self.ticks.len() >= self.limit
    }

    /// What `history` reports of the jobs added, with `notes` from their reads.
    fn finish(self, notes: Notes) -> History {
        let complete = self.complete();
        let Merge {
            limit,
            ticks,
            controls,
            horizon,
            ..
        } = self;
        let cut_short = match horizon {
            Some((job, tick, asked)) if !complete => Some(format!(
                "{} of {limit} ticks listed: {job} has more than {asked} entries in its newest ones; ticks \
                 at or before {} are left out",
                ticks.len(),
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
            notes,
        }
    }
}

/// The newest `limit` of two lists of records, each newest first, that `keep` keeps; and whether any
/// kept one was left out for the limit.
fn newest_of(
    a: Vec<TickRecord>,
    b: Vec<TickRecord>,
    limit: usize,
    keep: impl Fn(&TickRecord) -> bool,
) -> (Vec<TickRecord>, bool) {
    let mut a = a.into_iter().filter(&keep).peekable();
    let mut b = b.into_iter().filter(&keep).peekable();
    let mut merged = Vec::with_capacity(limit.min(a.size_hint().1.unwrap_or(0) + 64));
    while merged.len() < limit {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if tick::newest_first(y, x) == Ordering::Less => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        };
        match next {
            Some(record) => merged.push(record),
            None => break,
        }
    }
    let cut = a.next().is_some() || b.next().is_some();
    (merged, cut)
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

    /// The jobs' answers (each asked for `asked` entries) merged.
    fn merged(histories: Vec<Vec<Entry>>, asked: usize, limit: usize) -> Merge {
        let mut merge = Merge::new(limit);
        for entries in histories {
            merge.add(entries, asked);
        }
        merge
    }

    /// What `history` reports of the jobs' answers (each asked for `asked` entries).
    fn history(histories: Vec<Vec<Entry>>, asked: usize, limit: usize) -> History {
        merged(histories, asked, limit).finish(Notes::default())
    }

    /// Several jobs' ticks come out as one list, newest tick first, cut at the limit in ticks, with every
    /// entry of the listed ticks.
    #[test]
    fn the_jobs_are_merged_newest_tick_first_and_limited_in_ticks() {
        let mut lost = entry("a", 3000, "w2", Kind::Lost);
        lost.reason = Some("already_claimed".into());
        let a = vec![run("a", 3000, "w1"), lost, run("a", 1000, "w1")];
        let b = vec![run("b", 3000, "w2"), run("b", 2000, "w1")];
        let history = history(vec![a, b], 100, 3);
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
        let listed = history(vec![a.clone()], 100, 2);
        let ticks: Vec<i64> = listed.ticks.iter().map(|r| r.tick().0).collect();
        assert_eq!(ticks, [3000, 2000]);
        let controls: Vec<(i64, Option<&str>)> = listed
            .controls
            .iter()
            .map(|c| (c.tick, c.action.as_deref()))
            .collect();
        assert_eq!(controls, [(3500, Some("resumed")), (2500, Some("paused"))]);
        assert_eq!(listed.entries.len(), 4);
        let all = history(vec![a], 100, 10);
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
        let short = merged(vec![page.clone()], 4, 2);
        assert!(!short.complete());
        assert_eq!(short.ticks.len(), 1);
        assert_eq!(short.horizon, Some(("a".to_string(), 4000, 4)));
        assert_eq!(whole_ticks(&page, 4), 1);
        let whole: Vec<Entry> = tick(5000).into_iter().chain(tick(4000)).collect();
        assert_eq!(whole_ticks(&whole, 12), 2);
        assert!(merged(vec![whole.clone()], 12, 2).complete());
        assert_eq!(merged(vec![whole], 12, 2).ticks.len(), 2);
        // Fewer entries than asked: all there is, complete however few ticks.
        assert!(merged(vec![tick(5000)], 4, 2).complete());
        // Cut at the bound: said so, naming the job and the tick.
        let cut = history(vec![page], 4, 2);
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
        let merge = merged(vec![vec![run("a", 1_795_436_705_012, "w1"), lost]], 20, 20);
        let notes = Notes {
            store: "embedded:/tmp/x".to_string(),
            ..Notes::default()
        };
        let json = serde_json::to_value(merge.finish(notes)).expect("json");
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

    /// Merged one job at a time, the jobs give the same list in any order — a full answer that moves the
    /// horizon, coming after records were already cut to the limit, included — and never more than
    /// `limit` records are held.
    #[test]
    fn the_merge_keeps_the_newest_whatever_the_order_and_holds_at_most_the_limit() {
        let job = |name: &str, ticks: &[i64]| -> Vec<Entry> {
            ticks.iter().map(|&t| run(name, t, "w1")).collect()
        };
        // `c` is a full answer (asked 3, got 3): its oldest tick, 5000, is the horizon.
        let answers = vec![
            job("a", &[9000, 7000, 3000]),
            job("b", &[8000, 6000, 4000, 2000]),
            job("c", &[9500, 8500, 5000]),
        ];
        let listed = |order: &[usize]| {
            let mut merge = Merge::new(3);
            for &i in order {
                let asked = if i == 2 { 3 } else { 100 };
                merge.add(answers[i].clone(), asked);
                assert!(merge.ticks.len() <= 3);
            }
            let history = merge.finish(Notes::default());
            history
                .ticks
                .iter()
                .map(|r| (r.job().to_string(), r.tick().0))
                .collect::<Vec<_>>()
        };
        let expected = [("c", 9500), ("a", 9000), ("c", 8500)]
            .map(|(job, tick)| (job.to_string(), tick))
            .to_vec();
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0], [0, 2, 1]] {
            assert_eq!(listed(&order), expected, "order {order:?}");
        }
        // With a limit beyond what is whole, the horizon cuts every job at 5000, and says so.
        let mut merge = Merge::new(10);
        for (i, answer) in answers.into_iter().enumerate() {
            merge.add(answer, if i == 2 { 3 } else { 100 });
        }
        let history = merge.finish(Notes::default());
        let ticks: Vec<i64> = history.ticks.iter().map(|r| r.tick().0).collect();
        assert_eq!(ticks, [9500, 9000, 8500, 8000, 7000, 6000]);
        assert!(history.cut_short.is_some());
    }

    /// A job paused and resumed without end lists the newest [`MAX_CONTROLS`] of its controls.
    #[test]
    fn the_controls_listed_are_bounded() {
        let control = |ms: i64| {
            let what = crate::history::Control {
                action: "paused",
                by: "ops@host".into(),
                reason: String::new(),
                until: None,
            };
            let made = DateTime::from_timestamp_millis(ms).unwrap_or_default();
            Entry::control("a", &what, "cli", made)
        };
        let many: Vec<Entry> = (0..MAX_CONTROLS as i64 + 10)
            .rev()
            .map(|i| control(1000 + i))
            .collect();
        let listed = history(vec![many], usize::MAX, 20);
        assert_eq!(listed.controls.len(), MAX_CONTROLS);
        assert_eq!(listed.controls[0].tick, 1000 + MAX_CONTROLS as i64 + 9);
    }
}
