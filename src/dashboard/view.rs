//! The dashboard's pure part: which jobs a request's filter selects and which page of them it shows, and
//! what each tick looks like in a strip or a chart. No I/O and no clock: unit-tested on values.

use std::collections::HashMap;

use crate::config::JobConfig;
use crate::history::tick::TickRecord;
use crate::history::{Entry, Kind};
use crate::inspect::time::instant_ms;

/// Ticks shown in each job's strip on `/`.
pub(super) const STRIP: usize = 20;
/// Entries read per job for `/`: enough for [`STRIP`] ticks with a retry or a skip beside some.
pub(super) const ENTRIES_FOR_STRIP: usize = 2 * STRIP;
/// Jobs per page on `/` unless `per` says otherwise, and the most it may say.
pub(super) const DEFAULT_PER_PAGE: usize = 100;
pub(super) const MAX_PER_PAGE: usize = 1000;
/// The longest search text kept.
const MAX_QUERY: usize = 200;

/// How a tick ended up, as a strip's cell and a chart's bar show it (colour *and* text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Ran and succeeded.
    Ran,
    /// Ran and did not succeed (exit code, signal, lease lost, shutdown, could not start).
    Failed,
    /// Ran past its timeout and was stopped.
    TimedOut,
    /// Nobody claimed it within its window.
    Missed,
    /// Nobody ran it, for a reason (paused, overlap, shutdown, …).
    Skipped,
    /// Runs now (or its worker died before recording its end).
    Running,
}

impl Outcome {
    /// The stable name: the CSS class is `t-<name>`, the HTML's `data-outcome` this.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Outcome::Ran => "ran",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Missed => "missed",
            Outcome::Skipped => "skipped",
            Outcome::Running => "running",
        }
    }

    /// The label shown beside the colour.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::TimedOut => "timed out",
            other => other.name(),
        }
    }

    /// A short form of [`Outcome::label`] that fits a strip's cell (the full label is in the cell's
    /// tooltip).
    pub(crate) fn short(self) -> &'static str {
        match self {
            Outcome::Ran => "ran",
            Outcome::Failed => "fail",
            Outcome::TimedOut => "t/o",
            Outcome::Missed => "miss",
            Outcome::Skipped => "skip",
            Outcome::Running => "run",
        }
    }

    /// The outcome of the tick `record` accounts for.
    pub(crate) fn of(record: &TickRecord) -> Outcome {
        Outcome::of_entry(&record.record)
    }

    /// The outcome an entry says.
    pub(crate) fn of_entry(entry: &Entry) -> Outcome {
        match entry.kind {
            Kind::Run => match (entry.ended_at, entry.outcome.as_deref()) {
                (None, _) => Outcome::Running,
                (Some(_), Some("success")) => Outcome::Ran,
                (Some(_), Some("timeout")) => Outcome::TimedOut,
                (Some(_), _) => Outcome::Failed,
            },
            Kind::Missed => Outcome::Missed,
            // A control never reaches here as a tick's record ([`crate::history::tick::group`] leaves
            // it out); should one be asked about, it is no run.
            Kind::Skipped | Kind::Lost | Kind::Control | Kind::Unknown => Outcome::Skipped,
        }
    }
}

/// One tick as a cell of a strip or a bar of the chart.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Cell {
    pub tick_ms: i64,
    pub outcome: Outcome,
    /// One line for a tooltip: when, what, by whom, with which token, how long.
    pub title: String,
    /// A shorter line for a strip's tooltip, without the token and the duration: a page of 1,000 jobs'
    /// strips stays small (unique numbers do not compress).
    pub brief: String,
    /// From the tick to the run's start, if it started.
    pub start_delay_ms: Option<u64>,
    pub duration_ms: Option<u64>,
}

impl Cell {
    /// The cell of `record`.
    pub(super) fn of(record: &TickRecord) -> Cell {
        let entry = &record.record;
        let outcome = Outcome::of(record);
        let mut brief = format!("{} {}", instant_ms(entry.tick), outcome.label());
        let mut details = String::new();
        if entry.kind == Kind::Run {
            brief.push_str(&format!(" on {}", entry.worker));
            if let Some(token) = entry.token {
                details.push_str(&format!(", token {token}"));
            }
            if let Some(ms) = entry.duration_ms {
                details.push_str(&format!(", {}", crate::inspect::time::duration_ms(ms)));
            }
        } else if let Some(reason) = &entry.reason {
            brief.push_str(&format!(" ({reason})"));
        }
        if let Some(attempt) = entry.attempt {
            brief.push_str(&format!(", attempt {attempt}"));
        }
        if entry.trigger.is_some() {
            brief.push_str(", triggered");
        }
        let title = format!("{brief}{details}");
        let start_delay_ms = entry
            .started_at
            .map(|at| at.timestamp_millis().saturating_sub(entry.tick).max(0) as u64);
        Cell {
            tick_ms: entry.tick,
            outcome,
            title,
            brief,
            start_delay_ms,
            duration_ms: entry.duration_ms,
        }
    }
}

/// The newest `count` ticks of `entries` (one job's, newest first), oldest first as a strip reads.
pub(super) fn strip(entries: Vec<Entry>, count: usize) -> Vec<Cell> {
    let records = crate::history::tick::group(entries);
    let mut cells: Vec<Cell> = records.iter().take(count).map(Cell::of).collect();
    cells.reverse();
    cells
}

/// Which jobs `/` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum StateFilter {
    #[default]
    All,
    Paused,
    Running,
    /// The last run did not succeed.
    Failing,
    Overdue,
    Disabled,
}

impl StateFilter {
    /// Every filter, as the form's `<select>` offers them.
    pub(super) const ALL: [StateFilter; 6] = [
        StateFilter::All,
        StateFilter::Paused,
        StateFilter::Running,
        StateFilter::Failing,
        StateFilter::Overdue,
        StateFilter::Disabled,
    ];

    /// The query parameter's value.
    pub(super) fn name(self) -> &'static str {
        match self {
            StateFilter::All => "all",
            StateFilter::Paused => "paused",
            StateFilter::Running => "running",
            StateFilter::Failing => "failing",
            StateFilter::Overdue => "overdue",
            StateFilter::Disabled => "disabled",
        }
    }

    fn parse(text: &str) -> StateFilter {
        StateFilter::ALL
            .into_iter()
            .find(|filter| filter.name() == text)
            .unwrap_or_default()
    }
}

/// What `/`'s query asks for: a search, a state, a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Filter {
    /// Jobs whose name contains this (ignoring case); empty for all.
    pub query: String,
    pub state: StateFilter,
    /// From 1.
    pub page: usize,
    pub per_page: usize,
}

impl Filter {
    /// The filter of `/`'s query parameters; anything unknown or out of range is taken as its default.
    pub(super) fn from_params(params: &HashMap<String, String>) -> Filter {
        let number = |name: &str| {
            params
                .get(name)
                .and_then(|v| v.trim().parse::<usize>().ok())
        };
        let query: String = params
            .get("q")
            .map(|q| q.trim().chars().take(MAX_QUERY).collect())
            .unwrap_or_default();
        Filter {
            query,
            state: params
                .get("state")
                .map(|s| StateFilter::parse(s.trim()))
                .unwrap_or_default(),
            page: number("page").unwrap_or(1).clamp(1, 1_000_000),
            per_page: number("per")
                .unwrap_or(DEFAULT_PER_PAGE)
                .clamp(1, MAX_PER_PAGE),
        }
    }

    /// Whether `job` passes the parts of the filter that the config alone decides.
    pub(super) fn admits(&self, job: &JobConfig) -> bool {
        let named =
            self.query.is_empty() || job.name.to_lowercase().contains(&self.query.to_lowercase());
        named && (self.state != StateFilter::Disabled || !job.enabled)
    }

    /// The query string of this filter on `page` (for the paging links), `&`-separated, encoded.
    pub(super) fn query_for(&self, page: usize) -> String {
        let mut parts = Vec::new();
        if !self.query.is_empty() {
            parts.push(format!("q={}", super::pages::encode_query(&self.query)));
        }
        if self.state != StateFilter::All {
            parts.push(format!("state={}", self.state.name()));
        }
        if self.per_page != DEFAULT_PER_PAGE {
            parts.push(format!("per={}", self.per_page));
        }
        parts.push(format!("page={page}"));
        parts.join("&")
    }
}

/// One page of a list: the items on it, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Page<T> {
    pub items: Vec<T>,
    /// From 1; past the last page is the last page.
    pub number: usize,
    pub pages: usize,
    pub total: usize,
}

/// Page `number` (from 1) of `items`, `per_page` a page.
pub(super) fn page<T>(items: Vec<T>, number: usize, per_page: usize) -> Page<T> {
    let total = items.len();
    let pages = total.div_ceil(per_page.max(1)).max(1);
    let number = number.clamp(1, pages);
    let items = items
        .into_iter()
        .skip((number - 1) * per_page)
        .take(per_page)
        .collect();
    Page {
        items,
        number,
        pages,
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Tick;

    fn run(tick: i64, outcome: Option<&str>) -> Entry {
        let at = chrono::DateTime::from_timestamp_millis(tick).unwrap_or_default();
        let mut entry = Entry::new("j", Tick(tick), "w1", Kind::Run, at);
        entry.token = Some(7);
        entry.started_at = Some(at + chrono::Duration::milliseconds(40));
        if let Some(outcome) = outcome {
            entry.ended_at = Some(at + chrono::Duration::seconds(1));
            entry.outcome = Some(outcome.into());
            entry.duration_ms = Some(960);
        }
        entry
    }

    #[test]
    fn each_tick_has_one_outcome_with_a_word() {
        let cases = [
            (run(1_000, Some("success")), Outcome::Ran),
            (run(2_000, Some("failure")), Outcome::Failed),
            (run(3_000, Some("lease_lost")), Outcome::Failed),
            (run(4_000, Some("timeout")), Outcome::TimedOut),
            (run(5_000, None), Outcome::Running),
        ];
        for (entry, outcome) in cases {
            assert_eq!(Outcome::of_entry(&entry), outcome);
        }
        let at = chrono::DateTime::UNIX_EPOCH;
        let missed = Entry::new("j", Tick(6_000), "-", Kind::Missed, at);
        assert_eq!(Outcome::of_entry(&missed), Outcome::Missed);
        let skipped = Entry::new("j", Tick(7_000), "-", Kind::Skipped, at);
        assert_eq!(Outcome::of_entry(&skipped), Outcome::Skipped);
        assert_eq!(Outcome::TimedOut.label(), "timed out");
        assert_eq!(Outcome::TimedOut.name(), "timed_out");
    }

    #[test]
    fn a_strip_is_the_newest_ticks_oldest_first() {
        let entries: Vec<Entry> = (1..=30)
            .rev()
            .map(|i| run(i * 1_000, Some("success")))
            .collect();
        let cells = strip(entries, 20);
        assert_eq!(cells.len(), 20);
        assert_eq!(cells[0].tick_ms, 11_000);
        assert_eq!(cells[19].tick_ms, 30_000);
        assert_eq!(cells[19].start_delay_ms, Some(40));
        assert!(
            cells[19].title.contains("ran on w1, token 7"),
            "{}",
            cells[19].title
        );
    }

    #[test]
    fn filters_and_pages_take_anything_and_stay_in_range() {
        let params = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        };
        let plain = Filter::from_params(&params(&[]));
        assert_eq!(
            plain,
            Filter {
                query: String::new(),
                state: StateFilter::All,
                page: 1,
                per_page: DEFAULT_PER_PAGE
            }
        );
        let odd = Filter::from_params(&params(&[
            ("state", "nonsense"),
            ("page", "-3"),
            ("per", "99999999"),
            ("q", &"x".repeat(5000)),
        ]));
        assert_eq!(odd.state, StateFilter::All);
        assert_eq!((odd.page, odd.per_page), (1, MAX_PER_PAGE));
        assert_eq!(odd.query.len(), MAX_QUERY);
        let paged = page((0..250).collect::<Vec<_>>(), 3, 100);
        assert_eq!((paged.items.len(), paged.pages, paged.total), (50, 3, 250));
        let past = page((0..250).collect::<Vec<_>>(), 9, 100);
        assert_eq!((past.number, past.items[0]), (3, 200));
        let empty = page(Vec::<u8>::new(), 1, 100);
        assert_eq!((empty.pages, empty.items.len()), (1, 0));
        let f = Filter::from_params(&params(&[("q", "a b&c"), ("state", "paused")]));
        assert_eq!(f.query_for(2), "q=a%20b%26c&state=paused&page=2");
    }
}
