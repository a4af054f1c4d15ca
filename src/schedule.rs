//! Cron schedules: parsing (via `croner`), time zones, the DST rule, and the tick identity.
//!
//! `croner` matches an expression against wall-clock times; this module turns wall-clock matches into
//! instants in the job's time zone, which is where daylight-saving time has to be decided. The rule,
//! stated on [`Schedule`], is Vixie cron's: a job whose hour field is a wildcard follows elapsed time, any
//! other job follows the wall clock and fires once per wall-clock time. Nothing here does I/O or reads
//! the clock, so the worker, `redcron next` and the tests all compute the same ticks.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use chrono::{
    DateTime, LocalResult, NaiveDateTime, Offset as _, SecondsFormat, TimeZone as _, Utc,
};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// One scheduled instant of a job, as milliseconds since the Unix epoch in UTC.
///
/// Every worker derives the same `Tick` from the same schedule, whatever its own clock says, which makes
/// `(job, tick)` a cluster-wide identity: it names the lease, the claim and the floor of the fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(pub i64);

impl Tick {
    /// Milliseconds since the Unix epoch (UTC).
    pub fn as_millis(self) -> i64 {
        self.0
    }

    /// The tick as a UTC date-time.
    pub fn to_utc(self) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(self.0).unwrap_or(chrono::DateTime::UNIX_EPOCH)
    }
}

impl fmt::Display for Tick {
    /// RFC 3339 in UTC with millisecond precision, e.g. `2026-11-22T02:30:00.000Z`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}",
            self.to_utc()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    }
}

/// Why a cron expression was rejected; the reason names the offending field where it can.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cron expression {expression:?}: {reason}")]
pub struct ScheduleError {
    pub expression: String,
    pub reason: String,
}

/// The macros accepted in place of five fields, and what they stand for.
const MACROS: [(&str, &str); 6] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

const FIELDS_5: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];
const FIELDS_6: [&str; 6] = [
    "second",
    "minute",
    "hour",
    "day-of-month",
    "month",
    "day-of-week",
];

/// Scanning for a change of UTC offset looks this far at a time; tz rules never change an offset twice
/// within it.
const SCAN_STEP_SECS: i64 = 6 * 3600;

/// Bound on the steps of one search (offset changes crossed plus repeated wall-clock times skipped).
const MAX_STEPS: usize = 100_000;

/// How far back [`Schedule::last_at_or_before`] looks: well beyond the longest gap of an expression that
/// fires at all (`0 0 29 2 *` can be 8 years apart, 2096 to 2104).
const LOOK_BACK_LIMIT: chrono::Duration = chrono::Duration::days(50 * 366);

/// A job's schedule: a cron expression in a time zone.
///
/// Expressions have 5 fields (`minute hour day-of-month month day-of-week`, firing at second 0), or 6
/// with seconds first, or one of `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@hourly`.
/// Day-of-month takes `L` (last day) and `W` (nearest weekday), day-of-week takes `L` (last such weekday
/// of the month) and `#` (`5#2`: the second Friday); when both day fields are restricted, either may
/// match, as in Vixie cron.
///
/// # Daylight-saving time
/// A job whose **hour field is a wildcard** (`*` or `*/n`, e.g. `*/30 * * * *`, `0 * * * *`,
/// `* * * * * *`) follows *elapsed time*: when clocks go back it fires in both passes of the repeated
/// hour, and when clocks go forward the wall-clock times that do not exist are simply not fired (no real
/// time was skipped). **Every other job** follows the *wall clock* and fires once per wall-clock time:
/// in a repeated hour only in its first pass, and a time inside a skipped hour fires at the first instant
/// after the jump (`30 2 * * *` in Europe/Berlin fires at 03:00 CEST on 2026-03-29), once even if several
/// of its times fall into the gap. Ticks are therefore strictly increasing and never repeated.
#[derive(Debug, Clone)]
pub struct Schedule {
    expression: String,
    timezone: Tz,
    /// Shared: croner keeps a byte per possible year (~5 KB per expression), jobs are cloned per tick, and
    /// jobs with the same expression share one ([`PARSED`]).
    cron: Arc<Cron>,
    elapsed_time: bool,
}

impl Schedule {
    /// Parses `expr` (5 or 6 fields, or a macro) to be evaluated in `tz`.
    pub fn parse(expr: &str, tz: Tz) -> Result<Schedule, ScheduleError> {
        let error = |reason: String| ScheduleError {
            expression: expr.to_string(),
            reason,
        };
        let trimmed = expr.trim();
        let expanded = if trimmed.starts_with('@') {
            let found = MACROS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(trimmed));
            match found {
                Some((_, fields)) => *fields,
                None => return Err(error(format!("unknown macro {trimmed}; known: @yearly, @annually, @monthly, @weekly, @daily, @hourly"))),
            }
        } else {
            trimmed
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let names: &[&str] = match fields.len() {
            5 => &FIELDS_5,
            6 => &FIELDS_6,
            n => return Err(error(format!("expected 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first), found {n}"))),
        };
        let cron = match parsed(expanded) {
            Some(cron) => cron,
            None => {
                let cron = parser()
                    .parse(expanded)
                    .map_err(|e| error(explain(&fields, names, &e)))?;
                keep_parsed(expanded, cron)
            }
        };
        let elapsed_time = cron.pattern.hours.from_wildcard;
        Ok(Schedule {
            expression: expr.to_string(),
            timezone: tz,
            cron,
            elapsed_time,
        })
    }

    /// A warning for an expression that is almost certainly a mistake, or `None`: a wildcard `*` in the
    /// finest field (seconds with 6 fields, minutes with 5) under a restricted coarser time field, such as
    /// `* */15 * * * *` (every second of every fifteenth minute: 60 runs in a row) or `* 30 2 * * *` (60
    /// runs at 02:30). It names how many runs come in a row and the expression that runs once, which is
    /// what was meant nearly always. A restricted finest field (`*/10 * 9-17 * * *`, every 10 s in those
    /// hours) is deliberate, and so is a day field restricted under wildcard times (`* * * * 1`, every
    /// minute on Mondays); macros never trip it.
    pub fn burst_warning(&self) -> Option<String> {
        let trimmed = self.expression.trim();
        if trimmed.starts_with('@') {
            return None;
        }
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        // The time fields, finest first.
        let names: &[&str] = if fields.len() == 6 {
            &["second", "minute", "hour"]
        } else {
            &["minute", "hour"]
        };
        let wildcards = fields.iter().take_while(|field| **field == "*").count();
        if wildcards == 0 || wildcards >= names.len() {
            return None;
        }
        let in_a_row = 60u64.pow(wildcards as u32);
        let once: Vec<&str> = fields
            .iter()
            .enumerate()
            .map(|(i, field)| if i < wildcards { "0" } else { field })
            .collect();
        Some(format!(
            "{:?} fires every {} of each {} it matches ({in_a_row} runs in a row); \
             to run once at those times, write {:?}",
            self.expression,
            names[0],
            names[wildcards],
            once.join(" ")
        ))
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone the expression is evaluated in.
    pub fn timezone(&self) -> Tz {
        self.timezone
    }

    /// Whether this schedule follows elapsed time across DST changes (its hour field is a wildcard);
    /// otherwise it follows the wall clock. See the DST rule on [`Schedule`].
    pub fn follows_elapsed_time(&self) -> bool {
        self.elapsed_time
    }

    /// The first fire time strictly after `after`, or `None` if the expression never fires again
    /// (e.g. `0 0 30 2 *`). Fire times fall on whole seconds; the answer depends only on `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<Tick> {
        // Walk the UTC time line one stretch of constant UTC offset at a time: within a stretch,
        // wall clock and UTC differ by a constant, so croner's wall-clock search maps back exactly.
        let mut start = after.timestamp().checked_add(1)?;
        for _ in 0..MAX_STEPS {
            let offset = self.offset_at(start)?;
            let wall = naive(start.checked_add(offset)?)?;
            let matched = self.next_wall_match(wall)?;
            let candidate = matched.and_utc().timestamp() - offset;
            match self.next_offset_change(start, candidate) {
                None => {
                    if !self.elapsed_time && self.is_second_pass(matched, candidate) {
                        start = candidate + 1;
                        continue;
                    }
                    return Some(Tick(candidate.checked_mul(1000)?));
                }
                Some(change) => {
                    let new_offset = self.offset_at(change)?;
                    let gap_end = naive(change.checked_add(new_offset)?)?;
                    if !self.elapsed_time && new_offset > offset && matched < gap_end {
                        // A wall-clock time inside the skipped hour: fire right after the jump.
                        return Some(Tick(change.checked_mul(1000)?));
                    }
                    start = change;
                }
            }
        }
        None
    }

    /// Every fire time strictly after `after`, in order.
    pub fn ticks_after(&self, after: DateTime<Utc>) -> impl Iterator<Item = Tick> + '_ {
        let first = self.next_after(after);
        std::iter::successors(first, move |tick| self.next_after(tick.to_utc()))
    }

    /// The last fire time at or before `at`, or `None` if there is none in the 50 years before it.
    ///
    /// A bisection over [`Schedule::next_after`] (about 60 calls), so a sparse schedule costs no more
    /// than a dense one.
    pub fn last_at_or_before(&self, at: DateTime<Utc>) -> Option<Tick> {
        let target = Tick(at.timestamp_millis());
        let fires_by_target =
            |from: DateTime<Utc>| self.next_after(from).is_some_and(|t| t <= target);
        // Find `low` with a tick in (low, at]: look back 1 s, 2 s, 4 s, … up to the bound.
        let mut window = chrono::Duration::seconds(1);
        let mut low = at.checked_sub_signed(window)?;
        while !fires_by_target(low) {
            if window > LOOK_BACK_LIMIT {
                return None;
            }
            window = window * 2;
            low = at.checked_sub_signed(window)?;
        }
        // Invariant: a tick in (low, at], none in (high, at]. Ticks fall on whole seconds, so once the
        // two are a second apart the first tick after `low` is the last one by `at`.
        let mut high = at;
        while high - low > chrono::Duration::seconds(1) {
            let middle = low + (high - low) / 2;
            if fires_by_target(middle) {
                low = middle;
            } else {
                high = middle;
            }
        }
        self.next_after(low)
    }

    /// The tick as a date-time in this schedule's time zone.
    pub fn local(&self, tick: Tick) -> DateTime<Tz> {
        tick.to_utc().with_timezone(&self.timezone)
    }

    /// The tick in this schedule's time zone as RFC 3339 with seconds, e.g. `2026-10-25T02:30:00+02:00`.
    pub fn format_tick(&self, tick: Tick) -> String {
        self.local(tick)
            .to_rfc3339_opts(SecondsFormat::AutoSi, false)
    }

    /// The first wall-clock time at or after `wall` that the expression matches.
    fn next_wall_match(&self, wall: NaiveDateTime) -> Option<NaiveDateTime> {
        // UTC has no DST, so croner walks a plain wall clock here.
        let found = self
            .cron
            .find_next_occurrence(&Utc.from_utc_datetime(&wall), true);
        found.ok().map(|t| t.naive_utc())
    }

    /// The UTC offset, in seconds, in force at `secs` (Unix seconds).
    fn offset_at(&self, secs: i64) -> Option<i64> {
        let utc = DateTime::from_timestamp(secs, 0)?;
        Some(i64::from(
            self.timezone
                .offset_from_utc_datetime(&utc.naive_utc())
                .fix()
                .local_minus_utc(),
        ))
    }

    /// The first second in `(from, until]` whose UTC offset differs from the one at `from`, if any.
    fn next_offset_change(&self, from: i64, until: i64) -> Option<i64> {
        let offset = self.offset_at(from)?;
        let mut low = from;
        while low < until {
            let high = (low + SCAN_STEP_SECS).min(until);
            if self.offset_at(high) != Some(offset) {
                let (mut same, mut changed) = (low, high);
                while changed - same > 1 {
                    let middle = same + (changed - same) / 2;
                    if self.offset_at(middle) == Some(offset) {
                        same = middle;
                    } else {
                        changed = middle;
                    }
                }
                return Some(changed);
            }
            low = high;
        }
        None
    }

    /// Whether `instant` is the second (later) pass of the repeated wall-clock time `wall`.
    fn is_second_pass(&self, wall: NaiveDateTime, instant: i64) -> bool {
        match self.timezone.from_local_datetime(&wall) {
            LocalResult::Ambiguous(_, later) => later.timestamp() == instant,
            LocalResult::Single(_) | LocalResult::None => false,
        }
    }
}

impl fmt::Display for Schedule {
    /// `"30 2 * * *" in Europe/Berlin`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} in {}", self.expression, self.timezone)
    }
}

/// The expressions parsed in this process and still in use by a schedule: jobs that share an expression
/// (a herd of `0 * * * *`) share one parsed `Cron`, ~5 KB each. 1,000 jobs on one expression took 10 MB
/// of a worker's idle heap, half of it in copies of the same `Cron`.
static PARSED: LazyLock<Mutex<HashMap<String, Weak<Cron>>>> = LazyLock::new(Mutex::default);

/// The parsed `Cron` of `expanded` if a schedule still uses one.
fn parsed(expanded: &str) -> Option<Arc<Cron>> {
    let parsed = PARSED.lock().unwrap_or_else(PoisonError::into_inner);
    parsed.get(expanded).and_then(Weak::upgrade)
}

/// Shares `cron`, parsed from `expanded`, with the schedules parsed later; forgets expressions no
/// schedule uses any more (after a reload).
fn keep_parsed(expanded: &str, cron: Cron) -> Arc<Cron> {
    let cron = Arc::new(cron);
    let mut parsed = PARSED.lock().unwrap_or_else(PoisonError::into_inner);
    // Now and then, so that parsing N distinct expressions stays linear.
    if parsed.len() >= 64 && parsed.len().is_power_of_two() {
        parsed.retain(|_, kept| kept.strong_count() > 0);
    }
    parsed.insert(expanded.to_string(), Arc::downgrade(&cron));
    cron
}

/// croner's parser, configured for our forms: seconds optional (5 fields mean second 0), no year field.
fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

/// croner does not say which field is wrong; find the first that fails on its own.
fn explain(fields: &[&str], names: &[&str], error: &croner::errors::CronError) -> String {
    for (index, field) in fields.iter().enumerate() {
        let alone: Vec<&str> = (0..fields.len())
            .map(|i| if i == index { *field } else { "*" })
            .collect();
        if let Err(e) = parser().parse(&alone.join(" ")) {
            return format!("{} field {field:?}: {e}", names[index]);
        }
    }
    error.to_string()
}

fn naive(secs: i64) -> Option<NaiveDateTime> {
    DateTime::from_timestamp(secs, 0).map(|t| t.naive_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wildcard below a restricted time field is warned of with the run count and the
    /// expression that runs once; ordinary schedules are not.
    #[test]
    fn a_wildcard_under_a_restricted_time_field_is_warned_of() {
        let warning = |expr: &str| {
            Schedule::parse(expr, chrono_tz::UTC)
                .expect("valid")
                .burst_warning()
        };
        let every_second = warning("* */15 * * * *").expect("warned");
        assert!(
            every_second.contains("every second of each minute")
                && every_second.contains("60 runs in a row")
                && every_second.contains("\"0 */15 * * * *\""),
            "{every_second}"
        );
        let at_0230 = warning("* 30 2 * * *").expect("warned");
        assert!(at_0230.contains("\"0 30 2 * * *\""), "{at_0230}");
        let hour = warning("* * 2 * * *").expect("warned");
        assert!(
            hour.contains("every second of each hour")
                && hour.contains("3600 runs in a row")
                && hour.contains("\"0 0 2 * * *\""),
            "{hour}"
        );
        let minutes = warning("* 2 * * *").expect("warned");
        assert!(
            minutes.contains("every minute of each hour") && minutes.contains("\"0 2 * * *\""),
            "{minutes}"
        );
        for fine in [
            "* * * * * *",
            "* * * * *",
            "*/5 * * * *",
            "0 */15 * * * *",
            "30 2 * * *",
            "0 * * * *",
            "*/10 * 9-17 * * 1-5",
            "*/5 9-17 * * *",
            "0 * 2 * * *",
            "* * * * 1",
            "@hourly",
            "@daily",
        ] {
            assert_eq!(warning(fine), None, "{fine}");
        }
    }

    #[test]
    fn schedules_of_one_expression_share_one_parse_and_keep_their_own_zone() {
        let utc = Schedule::parse("17 3 * * 2", chrono_tz::UTC).expect("valid");
        let berlin = Schedule::parse(" 17 3 * * 2 ", chrono_tz::Europe::Berlin).expect("valid");
        let other = Schedule::parse("18 3 * * 2", chrono_tz::UTC).expect("valid");
        assert!(Arc::ptr_eq(&utc.cron, &berlin.cron));
        assert!(!Arc::ptr_eq(&utc.cron, &other.cron));
        let after = DateTime::from_timestamp(1_800_000_000, 0).expect("valid");
        assert_ne!(utc.next_after(after), berlin.next_after(after));
        // Once no schedule uses it, the next parse of it is a new one.
        let kept = Arc::downgrade(&utc.cron);
        drop((utc, berlin));
        assert!(kept.upgrade().is_none());
        let again = Schedule::parse("17 3 * * 2", chrono_tz::UTC).expect("valid");
        assert_eq!(again.expression(), "17 3 * * 2");
    }
}
