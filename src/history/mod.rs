//! Run history: each worker's account of each `(job, tick)` it took part in, kept by the store itself.
//!
//! An [`Entry`] is written by the worker that knows the fact — the winner its run (once when the job
//! starts, again when it ends, naming the workers that raced), a worker that skipped or gave up a tick its
//! reason (once per tick: a skip's [`Entry::id`] names no worker), a loser only when its loss was not the
//! routine one its claim order expected, the worker whose check found a tick unclaimed the miss — to every
//! node, after the fact and off the claim's path. Each node keeps
//! the entries of the newest [`HistorySettings::keep_ticks`] ticks of each job, so memory stays flat however
//! long the cluster runs. A reader asks a majority and [`merge`]s: a minority of nodes that lost or never
//! got an entry loses no history, as long as it reached a majority.
//!
//! Entries are JSON with stable field names (`docs/history.md`); readers ignore fields they do not know and
//! tolerate missing ones, so workers of different versions share one history.

pub mod tick;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::lock::Series;
use crate::schedule::Tick;

/// How much history the store keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct HistorySettings {
    /// The newest this many ticks of each job are kept on each node (with every worker's entries for them).
    pub keep_ticks: usize,
    /// How far back a worker that starts (or resumes) looks for ticks nobody claimed, to report them missed.
    pub missed_lookback: Duration,
}

impl Default for HistorySettings {
    fn default() -> Self {
        HistorySettings {
            keep_ticks: DEFAULT_KEEP_TICKS,
            missed_lookback: DEFAULT_MISSED_LOOKBACK,
        }
    }
}

impl HistorySettings {
    /// The most ticks of a job a store holds before it cuts them back to [`HistorySettings::keep_ticks`]:
    /// a quarter more (`keep_ticks × 1.25`, rounded down). The slack lets a store look at a job's size
    /// only now and then ([`HistorySettings::checks_bound_at`]) instead of on every write, and cut a
    /// quarter of its ticks at once instead of one per write.
    pub fn most_ticks(&self) -> usize {
        self.keep_ticks.saturating_add(self.keep_ticks / 4)
    }

    /// The trim rule, given a job's distinct ticks newest first: the newest tick to drop with every older
    /// one — the first past the newest `keep_ticks` — once there are more than
    /// [`HistorySettings::most_ticks`]; `None` while the job is within the bound. The SQL, embedded and
    /// Redis stores run the same rule in their statements and scripts (`records::the_bound_holds_with_its_slack`
    /// holds every store to it).
    pub(crate) fn newest_dropped<T: Copy>(&self, ticks_newest_first: &[T]) -> Option<T> {
        if ticks_newest_first.len() <= self.most_ticks() {
            return None;
        }
        ticks_newest_first.get(self.keep_ticks).copied()
    }

    /// Whether a write of an entry of `tick` checks its job's size against [`HistorySettings::most_ticks`]
    /// (and cuts it back to `keep_ticks` if it is larger): one tick in `keep_ticks / 50` (every tick below
    /// 100 kept), picked by a hash of the tick, so every node and every writer checks at the same ticks,
    /// whatever the schedule's period. A job past `most_ticks` is cut at the next check: with the default
    /// 200, one tick in 4, it holds 250 ticks plus the 4 written since on average, more than 30 more
    /// with a chance of 1 in 5,000 per cut (about one every 50 ticks).
    pub fn checks_bound_at(&self, tick: i64) -> bool {
        let every = (self.keep_ticks / 50).max(1) as u64;
        every == 1 || mix(tick as u64).is_multiple_of(every)
    }
}

/// A 64-bit finaliser (SplitMix64's): every bit of `x` moves every bit of the result, so ticks a fixed
/// period apart still fall evenly over any modulus.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The default of [`HistorySettings::keep_ticks`].
pub const DEFAULT_KEEP_TICKS: usize = 200;
/// The default of [`HistorySettings::missed_lookback`].
pub const DEFAULT_MISSED_LOOKBACK: Duration = Duration::from_secs(3600);

/// The writer part of the [`Entry::id`] of an entry about its whole tick (`skipped`, `missed`). Those
/// kinds never carry a worker there, so a worker named `-` cannot make two facts share an id.
pub const TICK_LEVEL: &str = "-";

/// What an entry says about its `(job, tick)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// This worker won the tick and ran (or is running) the job.
    Run,
    /// Nobody ran the tick (or this series of it), and why as the writer found (`reason`): `overlap`,
    /// `superseded`, `no_quorum`, `contended`, `lease_expired`, `shutdown`, `paused`, … One per tick and
    /// series: a second worker's skip replaces the first ([`Entry::id`]).
    Skipped,
    /// This worker raced and another claimant won (`by`), and that was not the routine loss to the first
    /// in its claim order (which is not written: the winner's `raced` names the losers).
    Lost,
    /// Nobody claimed the tick by the end of its window; written once, by the worker whose check claimed it
    /// (its id, like a skip's, names no worker).
    Missed,
    /// An operator's control of the job — `pause` or `resume`, from the command line or the dashboard —
    /// with its `action` (`paused`, `resumed`), `by`, `reason` and, for a pause, `until`. Not about a tick:
    /// its `tick` is when the control was made (cluster time, ms), so it sorts among the ticks; the
    /// readers list it on its own line and never count it as a tick (not run, not missed, not overdue).
    /// One per control: its id carries [`Entry::control_id`], so two controls in one millisecond are
    /// both kept.
    Control,
    /// A kind written by a newer version of redcron.
    #[serde(other)]
    Unknown,
}

impl Kind {
    /// The stable name, as in the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Skipped => "skipped",
            Kind::Lost => "lost",
            Kind::Missed => "missed",
            Kind::Control => "control",
            Kind::Unknown => "unknown",
        }
    }
}

/// One worker's account of one `(job, tick)`. Field names are stable (`docs/history.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub job: String,
    /// The tick, milliseconds since the Unix epoch (UTC).
    pub tick: i64,
    /// The worker that wrote the entry.
    pub worker: String,
    pub kind: Kind,
    /// Why the tick was skipped, lost or missed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The claimant that won the tick, where this worker learnt it (`lost`); the holder of the job
    /// (`skipped`, `overlap`); who paused the job (`skipped`, `paused`); who asked for a trigger's run
    /// (`run` with `trigger`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The fencing token of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    /// How the run ended: `success`, `failure`, `timeout`, `lease_lost`, `shutdown`, `spawn_failed`;
    /// absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The job's definition as the writer saw it ([`crate::config::JobConfig::fingerprint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The `redcron trigger` request this entry is about (its tick is the request's time); absent for the
    /// schedule's ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// The retry attempt (1, 2, …) this entry is about; absent for a tick's first run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// On the end of a run that failed and is tried again: the wait, in milliseconds, before its next
    /// attempt is raced. Such a run is not its tick's final outcome (the alert hooks pass it over). Absent
    /// on every other entry — and on the entries of workers that predate the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
    /// On a winner's run entry: the workers that raced for the tick as the winner saw them (the live
    /// members that run the job), in the order the tick's ranking ([`crate::lock::order::rank`]) put
    /// them — so the winner's place is its index. A routine loser writes nothing: this list is how
    /// `explain` names it. Absent on other entries and on the entries of workers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raced: Option<Vec<String>>,
    /// On the end of a run whose outcome is not `success`: the last bytes of its standard output, at most
    /// the job's `output_tail` (UTF-8, lossy). Absent when the job's `output_tail` is 0, or it printed nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_out: Option<String>,
    /// As [`Entry::tail_out`], of its standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_err: Option<String>,
    /// On a `control` entry: what the control did, `paused` or `resumed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// On a `control` entry of a pause with an end (`--for`): when the pause ends by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    /// On a `control` entry: the control's own id (32 hex digits, random), part of [`Entry::id`] so that
    /// no two controls share an identity, whoever made them and however close together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_id: Option<String>,
    /// When the writer wrote this version of the entry (its cluster time).
    pub recorded_at: DateTime<Utc>,
}

/// What a `control` entry records: the action on the job, by whom, why, until when (a pause's end).
#[derive(Debug, Clone, PartialEq)]
pub struct Control {
    /// `paused` or `resumed` ([`CONTROL_PAUSED`], [`CONTROL_RESUMED`]).
    pub action: &'static str,
    /// Who, as the pause record names it: `user@host`, or `NAME via dashboard from ADDRESS`.
    pub by: String,
    /// The reason given (may be empty).
    pub reason: String,
    /// A pause's end, if it has one.
    pub until: Option<DateTime<Utc>>,
}

impl Control {
    /// The record of `pause`, just written: its `by`, reason and end.
    pub fn paused(pause: &crate::lock::Pause) -> Control {
        Control {
            action: CONTROL_PAUSED,
            by: pause.by.clone(),
            reason: pause.reason.clone(),
            until: pause.until,
        }
    }

    /// The record of a resume by `by`, for `reason`.
    pub fn resumed(by: String, reason: String) -> Control {
        Control {
            action: CONTROL_RESUMED,
            by,
            reason,
            until: None,
        }
    }
}

/// The `action` of a `control` entry of a pause.
pub const CONTROL_PAUSED: &str = "paused";
/// The `action` of a `control` entry of a resume.
pub const CONTROL_RESUMED: &str = "resumed";

impl Entry {
    /// A new entry of `kind` by `worker` for `(job, tick)`, recorded now; the other fields empty.
    pub fn new(job: &str, tick: Tick, worker: &str, kind: Kind, now: DateTime<Utc>) -> Entry {
        Entry {
            job: job.to_string(),
            tick: tick.as_millis(),
            worker: worker.to_string(),
            kind,
            reason: None,
            by: None,
            token: None,
            run_id: None,
            started_at: None,
            ended_at: None,
            outcome: None,
            exit_code: None,
            signal: None,
            duration_ms: None,
            fingerprint: None,
            trigger: None,
            attempt: None,
            retry_in_ms: None,
            raced: None,
            tail_out: None,
            tail_err: None,
            action: None,
            until: None,
            control_id: None,
            recorded_at: now,
        }
    }

    /// A `control` entry of `job`: `control` made at `now` (cluster time) by `writer` (`cli`,
    /// `dashboard`), with a fresh [`Entry::control_id`]; its tick is `now` in milliseconds.
    pub fn control(job: &str, control: &Control, writer: &str, now: DateTime<Utc>) -> Entry {
        let mut entry = Entry::new(
            job,
            Tick(now.timestamp_millis()),
            writer,
            Kind::Control,
            now,
        );
        entry.action = Some(control.action.to_string());
        entry.by = Some(control.by.clone());
        entry.reason = Some(control.reason.clone()).filter(|r| !r.is_empty());
        entry.until = control.until;
        entry.control_id = Some(uuid::Uuid::new_v4().simple().to_string());
        entry
    }

    /// Whether this entry records a control (`pause`, `resume`) rather than something about a tick.
    pub fn is_control(&self) -> bool {
        self.kind == Kind::Control
    }

    /// The same entry, about `series`: a trigger request's or a retry attempt's.
    pub fn in_series(mut self, series: &Series) -> Entry {
        self.trigger = series.trigger().map(str::to_string);
        self.attempt = Some(series.attempt()).filter(|attempt| *attempt > 0);
        self
    }

    /// The series this entry is about.
    pub fn series(&self) -> Series {
        match (&self.trigger, self.attempt) {
            (Some(id), _) => Series::Trigger(id.clone()),
            (None, Some(attempt)) if attempt > 0 => Series::Retry(attempt),
            _ => Series::Schedule,
        }
    }

    /// The entry's identity in the store: one per (tick, writer, kind) — and series, for a trigger's or a
    /// retry's — so that a later version of the same fact (a run that ended) replaces the earlier one.
    ///
    /// A `skipped` or `missed` entry says why nobody ran its tick, a fact of the tick rather than of its
    /// writer: its writer part is [`TICK_LEVEL`] (`<tick>|-|skipped`), so a second worker that writes the
    /// same skip replaces the first instead of adding to it. The other kinds keep their writer (`run`,
    /// `lost`: one per worker), as every earlier version wrote them. A `control` entry's writer part is
    /// its [`Entry::control_id`] (`<ms>|<control id>|control`): unique per control, so two controls of the
    /// same millisecond, even by the same writer, are two entries.
    pub fn id(&self) -> String {
        let writer = match self.kind {
            Kind::Skipped | Kind::Missed => TICK_LEVEL,
            Kind::Control => self.control_id.as_deref().unwrap_or(self.worker.as_str()),
            Kind::Run | Kind::Lost | Kind::Unknown => self.worker.as_str(),
        };
        let id = format!("{}|{writer}|{}", self.tick, self.kind.as_str());
        match self.series().tag() {
            Some(tag) => format!("{id}|{tag}"),
            None => id,
        }
    }

    /// The entry's tick.
    pub fn tick(&self) -> Tick {
        Tick(self.tick)
    }

    /// About the bytes the entry holds, in memory or as JSON before escaping: its output tails, the
    /// workers it names, and an allowance for its bounded fields. It bounds the history writer's queue
    /// and each of its writes ([`crate::worker`]'s recorder), without serializing the entry.
    pub(crate) fn held_bytes(&self) -> usize {
        const FIELDS: usize = 512;
        let tails = [&self.tail_out, &self.tail_err]
            .into_iter()
            .flatten()
            .map(String::len)
            .sum::<usize>();
        let raced = self
            .raced
            .iter()
            .flatten()
            .map(|id| id.len() + 3)
            .sum::<usize>();
        FIELDS + self.job.len() + tails + raced
    }

    /// The entry as stored: one line of JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain strings, numbers and timestamps cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a stored entry; the error says what was wrong, for a warning that names the node.
    pub fn from_json(text: &str) -> Result<Entry, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Whether `self` says more than `other` about the same fact: an ended run over a running one, then
    /// the later version.
    fn supersedes(&self, other: &Entry) -> bool {
        (self.ended_at.is_some(), self.recorded_at) > (other.ended_at.is_some(), other.recorded_at)
    }
}

/// Merges the entries read from several nodes: one per identity (the most complete version), newest tick
/// first, then by worker and kind, the latest attempt first.
pub fn merge(replicas: impl IntoIterator<Item = Vec<Entry>>) -> Vec<Entry> {
    let mut by_id: HashMap<String, Entry> = HashMap::new();
    for entry in replicas.into_iter().flatten() {
        match by_id.get(&entry.id()) {
            Some(kept) if !entry.supersedes(kept) => {}
            _ => {
                by_id.insert(entry.id(), entry);
            }
        }
    }
    let mut merged: Vec<Entry> = by_id.into_values().collect();
    merged.sort_by(|a, b| {
        b.tick
            .cmp(&a.tick)
            .then_with(|| a.worker.cmp(&b.worker))
            .then_with(|| a.kind.as_str().cmp(b.kind.as_str()))
            .then_with(|| b.attempt.cmp(&a.attempt))
            .then_with(|| a.trigger.cmp(&b.trigger))
    });
    merged
}

/// Which entries to read: a job's, with ticks in `[since, until]`, at most `limit` entries, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub job: String,
    pub since: Option<Tick>,
    pub until: Option<Tick>,
    pub limit: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trim rule: nothing while a job holds at most `most_ticks` ticks; past it, every tick after the
    /// newest `keep_ticks` goes.
    #[test]
    fn a_job_past_its_most_ticks_is_cut_back_to_keep_ticks() {
        let settings = HistorySettings {
            keep_ticks: 8,
            ..HistorySettings::default()
        };
        assert_eq!(settings.most_ticks(), 10);
        let ticks: Vec<i64> = (0..11).rev().collect();
        assert_eq!(settings.newest_dropped(&ticks[..10]), None);
        assert_eq!(settings.newest_dropped(&ticks), Some(2));
        assert_eq!(settings.newest_dropped::<i64>(&[]), None);
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).unwrap_or_default()
    }

    #[test]
    fn an_ended_run_supersedes_the_running_one_whatever_the_order_of_nodes() {
        let mut running = Entry::new("backup", Tick(1000), "w1", Kind::Run, at(1));
        running.token = Some(7);
        let mut ended = running.clone();
        ended.ended_at = Some(at(5));
        ended.outcome = Some("success".into());
        ended.recorded_at = at(5);
        for replicas in [
            vec![vec![running.clone()], vec![ended.clone()]],
            vec![vec![ended.clone()], vec![running.clone()]],
        ] {
            let merged = merge(replicas);
            assert_eq!(merged, vec![ended.clone()]);
        }
    }

    #[test]
    fn merged_entries_are_newest_tick_first_and_distinct_per_worker_and_kind() {
        let a = Entry::new("j", Tick(1000), "w1", Kind::Run, at(1));
        let b = Entry::new("j", Tick(1000), "w2", Kind::Lost, at(1));
        let c = Entry::new("j", Tick(2000), "w2", Kind::Run, at(2));
        let merged = merge(vec![vec![a.clone(), b.clone()], vec![c.clone(), a.clone()]]);
        assert_eq!(merged, vec![c, a, b]);
    }

    #[test]
    fn a_skip_or_miss_is_one_per_tick_and_series_whoever_writes_it() {
        let skip = |worker: &str, series: &Series| {
            let mut entry = Entry::new("j", Tick(1000), worker, Kind::Skipped, at(1));
            entry.reason = Some("paused".into());
            entry.in_series(series)
        };
        assert_eq!(skip("w1", &Series::Schedule).id(), "1000|-|skipped");
        assert_eq!(
            skip("w1", &Series::Schedule).id(),
            skip("w2", &Series::Schedule).id()
        );
        assert_eq!(skip("w1", &Series::Retry(2)).id(), "1000|-|skipped|retry:2");
        let missed = Entry::new("j", Tick(1000), "w3", Kind::Missed, at(1));
        assert_eq!(missed.id(), "1000|-|missed");
        // A run and a loser's entry stay one per worker, with the ids every version wrote.
        let run = Entry::new("j", Tick(1000), "w1", Kind::Run, at(1));
        assert_eq!(run.id(), "1000|w1|run");
        let lost = Entry::new("j", Tick(1000), "w2", Kind::Lost, at(1));
        assert_eq!(lost.id(), "1000|w2|lost");
        // Two workers' skips of one tick merge into one; the run beside them stays.
        let mut later = skip("w2", &Series::Schedule);
        later.recorded_at = at(2);
        let merged = merge(vec![
            vec![skip("w1", &Series::Schedule), run.clone()],
            vec![later.clone()],
        ]);
        assert_eq!(merged, vec![run, later]);
    }

    /// A control's id carries its own id: two controls of the same millisecond by the same writer are two
    /// entries after the merge, and a control's JSON round-trips with its fields.
    #[test]
    fn two_controls_of_one_millisecond_are_both_kept() {
        let what = Control {
            action: CONTROL_PAUSED,
            by: "ops@host".into(),
            reason: "migration".into(),
            until: Some(at(7_200)),
        };
        let a = Entry::control("j", &what, "cli", at(3_600));
        let b = Entry::control("j", &what, "cli", at(3_600));
        assert_eq!(a.tick, b.tick);
        assert_ne!(a.id(), b.id());
        let control_id = a.control_id.clone().unwrap_or_default();
        assert_eq!(a.id(), format!("3600000|{control_id}|control"));
        assert_eq!(merge(vec![vec![a.clone()], vec![b, a.clone()]]).len(), 2);
        let json = a.to_json();
        assert!(json.contains(r#""kind":"control""#) && json.contains(r#""action":"paused""#));
        assert_eq!(Entry::from_json(&json).ok(), Some(a));
    }

    /// The size check comes at every tick for a small bound, and at about one tick in `keep / 50` for a
    /// large one, also for a schedule whose ticks are a round period apart.
    #[test]
    fn the_bound_is_checked_now_and_then_whatever_the_period() {
        let small = HistorySettings {
            keep_ticks: 8,
            ..HistorySettings::default()
        };
        assert_eq!(small.most_ticks(), 10);
        assert!((0..100).all(|n| small.checks_bound_at(n * 60_000)));
        let default = HistorySettings::default();
        assert_eq!(default.most_ticks(), 250);
        for period in [1_000, 60_000, 3_600_000, 86_400_000] {
            let checked = (0..6_000)
                .filter(|n| default.checks_bound_at(1_795_000_000_000 + n * period))
                .count();
            assert!((1_300..1_700).contains(&checked), "{period}: {checked}");
        }
    }

    #[test]
    fn entries_from_other_versions_are_read() {
        let newer = r#"{"job":"j","tick":5,"worker":"w","kind":"retried","attempt":2,"recorded_at":"2026-11-23T10:00:00Z"}"#;
        let entry = Entry::from_json(newer).expect("a newer kind and field are tolerated");
        assert_eq!(entry.kind, Kind::Unknown);
        let older = r#"{"job":"j","tick":5,"worker":"w","kind":"run","recorded_at":"2026-11-23T10:00:00Z"}"#;
        assert!(Entry::from_json(older).is_ok());
        assert!(Entry::from_json("not json").is_err());
    }
}
