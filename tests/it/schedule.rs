//! Schedule: the cron forms we accept and the DST rule, in Europe/Berlin and America/New_York.
//!
//! Pure computation: no Redis, no clock. Each DST test walks the ticks across the transition night and
//! checks both what fires and how far apart in real time the fires are.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use redcron::schedule::{Schedule, Tick};

const BERLIN: Tz = chrono_tz::Europe::Berlin;
const NEW_YORK: Tz = chrono_tz::America::New_York;

fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .expect("test timestamp")
        .with_timezone(&Utc)
}

fn schedule(expr: &str, tz: Tz) -> Schedule {
    Schedule::parse(expr, tz).unwrap_or_else(|e| panic!("{expr}: {e}"))
}

/// The fire times of `expr` after `after`, formatted in the schedule's zone.
fn next(expr: &str, tz: Tz, after: &str, count: usize) -> Vec<String> {
    let schedule = schedule(expr, tz);
    schedule
        .ticks_after(at(after))
        .take(count)
        .map(|t| schedule.format_tick(t))
        .collect()
}

/// The ticks of `expr` in `[from, to)`.
fn ticks_between(expr: &str, tz: Tz, from: &str, to: &str) -> Vec<Tick> {
    let schedule = schedule(expr, tz);
    let start = at(from) - chrono::Duration::milliseconds(1);
    let end = at(to).timestamp_millis();
    schedule
        .ticks_after(start)
        .take_while(|t| t.as_millis() < end)
        .collect()
}

/// The distinct gaps (in seconds) between consecutive ticks.
fn gaps(ticks: &[Tick]) -> Vec<i64> {
    let mut gaps: Vec<i64> = ticks
        .windows(2)
        .map(|w| (w[1].as_millis() - w[0].as_millis()) / 1000)
        .collect();
    gaps.sort_unstable();
    gaps.dedup();
    gaps
}

/// A 5-field expression has minute precision: it fires at second 0.
#[test]
fn five_fields_fire_at_second_zero() {
    let got = next("*/15 * * * *", Tz::UTC, "2026-01-01T00:00:30Z", 3);
    assert_eq!(
        got,
        [
            "2026-01-01T00:15:00+00:00",
            "2026-01-01T00:30:00+00:00",
            "2026-01-01T00:45:00+00:00"
        ]
    );
}

/// A 6-field expression has seconds first.
#[test]
fn six_fields_have_seconds_first() {
    let got = next("*/20 * * * * *", Tz::UTC, "2026-01-01T00:00:00Z", 3);
    assert_eq!(
        got,
        [
            "2026-01-01T00:00:20+00:00",
            "2026-01-01T00:00:40+00:00",
            "2026-01-01T00:01:00+00:00"
        ]
    );
    let got = next("30 0 12 * * *", Tz::UTC, "2026-01-01T00:00:00Z", 1);
    assert_eq!(got, ["2026-01-01T12:00:30+00:00"]);
}

/// "Strictly after": a fire time itself is not returned again, and milliseconds count.
#[test]
fn next_after_is_strictly_after() {
    let s = schedule("*/15 * * * *", Tz::UTC);
    assert_eq!(
        s.next_after(at("2026-01-01T00:15:00Z")),
        Some(Tick(at("2026-01-01T00:30:00Z").timestamp_millis()))
    );
    assert_eq!(
        s.next_after(at("2026-01-01T00:14:59.999Z")),
        Some(Tick(at("2026-01-01T00:15:00Z").timestamp_millis()))
    );
}

/// The macros stand for their usual 5-field forms.
#[test]
fn macros() {
    let after = "2026-05-13T10:20:00Z"; // a Wednesday
    assert_eq!(
        next("@hourly", Tz::UTC, after, 1),
        ["2026-05-13T11:00:00+00:00"]
    );
    assert_eq!(
        next("@daily", Tz::UTC, after, 1),
        ["2026-05-14T00:00:00+00:00"]
    );
    assert_eq!(
        next("@weekly", Tz::UTC, after, 1),
        ["2026-05-17T00:00:00+00:00"]
    );
    assert_eq!(
        next("@monthly", Tz::UTC, after, 1),
        ["2026-06-01T00:00:00+00:00"]
    );
    assert_eq!(
        next("@yearly", Tz::UTC, after, 1),
        ["2027-01-01T00:00:00+00:00"]
    );
    assert_eq!(
        next("@annually", Tz::UTC, after, 1),
        ["2027-01-01T00:00:00+00:00"]
    );
    assert_eq!(
        next("@DAILY", Tz::UTC, after, 1),
        ["2026-05-14T00:00:00+00:00"]
    );
}

/// `L` (last day / last weekday), `W` (nearest weekday) and `#` (nth weekday).
#[test]
fn last_nearest_weekday_and_nth() {
    assert_eq!(
        next("0 0 L * *", Tz::UTC, "2026-02-01T00:00:00Z", 1),
        ["2026-02-28T00:00:00+00:00"]
    );
    assert_eq!(
        next("0 0 L 2 *", Tz::UTC, "2027-03-01T00:00:00Z", 1),
        ["2028-02-29T00:00:00+00:00"]
    );
    // 2026-08-15 is a Saturday: the nearest weekday is Friday the 14th.
    assert_eq!(
        next("0 9 15W * *", Tz::UTC, "2026-08-01T00:00:00Z", 1),
        ["2026-08-14T09:00:00+00:00"]
    );
    // 2026-08-01 is a Saturday: 1W does not leave the month, so Monday the 3rd.
    assert_eq!(
        next("0 9 1W * *", Tz::UTC, "2026-07-31T00:00:00Z", 1),
        ["2026-08-03T09:00:00+00:00"]
    );
    // Second Friday of the month, and last Friday of the month.
    assert_eq!(
        next("0 9 * * 5#2", Tz::UTC, "2026-08-01T00:00:00Z", 2),
        ["2026-08-14T09:00:00+00:00", "2026-09-11T09:00:00+00:00"]
    );
    assert_eq!(
        next("0 9 * * 5L", Tz::UTC, "2026-08-01T00:00:00Z", 1),
        ["2026-08-28T09:00:00+00:00"]
    );
    assert_eq!(
        next("0 9 * * FRI#1", Tz::UTC, "2026-08-01T00:00:00Z", 1),
        ["2026-08-07T09:00:00+00:00"]
    );
}

/// A schedule is evaluated in its own time zone.
#[test]
fn time_zone_is_honoured() {
    let s = schedule("0 9 * * *", NEW_YORK);
    assert_eq!(s.timezone(), NEW_YORK);
    assert_eq!(s.expression(), "0 9 * * *");
    let tick = s.next_after(at("2026-01-10T00:00:00Z")).expect("fires");
    assert_eq!(tick.to_string(), "2026-01-10T14:00:00.000Z");
    assert_eq!(s.format_tick(tick), "2026-01-10T09:00:00-05:00");
}

/// Berlin, clocks forward (2026-03-29 02:00 CET → 03:00 CEST): a fixed-time job in the skipped hour
/// fires once at 03:00, then at 02:30 again the next day.
#[test]
fn berlin_spring_forward_fixed_time() {
    let got = next("30 2 * * *", BERLIN, "2026-03-27T12:00:00Z", 4);
    assert_eq!(
        got,
        [
            "2026-03-28T02:30:00+01:00",
            "2026-03-29T03:00:00+02:00",
            "2026-03-30T02:30:00+02:00",
            "2026-03-31T02:30:00+02:00"
        ]
    );
    // Several times in the gap still give one fire.
    let got = next("0,30 2 * * *", BERLIN, "2026-03-28T12:00:00Z", 3);
    assert_eq!(
        got,
        [
            "2026-03-29T03:00:00+02:00",
            "2026-03-30T02:00:00+02:00",
            "2026-03-30T02:30:00+02:00"
        ]
    );
}

/// Berlin, clocks back (2026-10-25 03:00 CEST → 02:00 CET): a fixed-time job fires once, in the first pass.
#[test]
fn berlin_fall_back_fixed_time() {
    let got = next("30 2 * * *", BERLIN, "2026-10-23T12:00:00Z", 4);
    assert_eq!(
        got,
        [
            "2026-10-24T02:30:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-26T02:30:00+01:00",
            "2026-10-27T02:30:00+01:00"
        ]
    );
    let got = next("0,30 2 * * *", BERLIN, "2026-10-24T12:00:00Z", 3);
    assert_eq!(
        got,
        [
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-26T02:00:00+01:00"
        ]
    );
    // Asked from inside the second pass, it does not fire there either.
    let got = next("* 2 * * *", BERLIN, "2026-10-25T01:10:00Z", 1);
    assert_eq!(got, ["2026-10-26T02:00:00+01:00"]);
}

/// Berlin, clocks back: `*/30 * * * *` fires twice per real hour all night, 4 times in the 2 real hours
/// of wall-clock 02:00-03:00, with no gap and no duplicate.
#[test]
fn berlin_fall_back_wildcard_hour_follows_elapsed_time() {
    let ticks = ticks_between(
        "*/30 * * * *",
        BERLIN,
        "2026-10-24T22:00:00Z",
        "2026-10-25T04:00:00Z",
    );
    assert_eq!(ticks.len(), 12, "6 real hours, 2 fires each");
    assert_eq!(gaps(&ticks), [1800]);
    let s = schedule("*/30 * * * *", BERLIN);
    let two_oclock: Vec<String> = ticks
        .iter()
        .map(|t| s.format_tick(*t))
        .filter(|t| t.contains("T02:"))
        .collect();
    assert_eq!(
        two_oclock,
        [
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T02:30:00+01:00"
        ]
    );
}

/// Berlin, clocks forward: a wildcard-hour job just carries on in real time (no 02:xx exists).
#[test]
fn berlin_spring_forward_wildcard_hour() {
    let ticks = ticks_between(
        "*/30 * * * *",
        BERLIN,
        "2026-03-28T22:00:00Z",
        "2026-03-29T04:00:00Z",
    );
    assert_eq!(ticks.len(), 12);
    assert_eq!(gaps(&ticks), [1800]);
    let got = next("*/30 * * * *", BERLIN, "2026-03-29T00:15:00Z", 3);
    assert_eq!(
        got,
        [
            "2026-03-29T01:30:00+01:00",
            "2026-03-29T03:00:00+02:00",
            "2026-03-29T03:30:00+02:00"
        ]
    );
}

/// Hourly and every-second jobs also fire by elapsed time through both Berlin transitions.
#[test]
fn berlin_hourly_and_every_second() {
    for (from, to) in [
        ("2026-03-28T20:00:00Z", "2026-03-29T06:00:00Z"),
        ("2026-10-24T20:00:00Z", "2026-10-25T06:00:00Z"),
    ] {
        let hourly = ticks_between("0 * * * *", BERLIN, from, to);
        assert_eq!(
            (hourly.len(), gaps(&hourly)),
            (10, vec![3600]),
            "hourly {from}"
        );
        let at_hour = ticks_between("@hourly", BERLIN, from, to);
        assert_eq!(at_hour, hourly);
    }
    let every_second = ticks_between(
        "* * * * * *",
        BERLIN,
        "2026-10-24T23:30:00Z",
        "2026-10-25T01:30:00Z",
    );
    assert_eq!((every_second.len(), gaps(&every_second)), (7200, vec![1]));
}

/// New York, clocks forward (2026-03-08 02:00 EST → 03:00 EDT) and back (2026-11-01 02:00 EDT → 01:00 EST).
#[test]
fn new_york_fixed_time() {
    let got = next("30 2 * * *", NEW_YORK, "2026-03-06T12:00:00Z", 3);
    assert_eq!(
        got,
        [
            "2026-03-07T02:30:00-05:00",
            "2026-03-08T03:00:00-04:00",
            "2026-03-09T02:30:00-04:00"
        ]
    );
    let got = next("30 1 * * *", NEW_YORK, "2026-10-30T12:00:00Z", 3);
    assert_eq!(
        got,
        [
            "2026-10-31T01:30:00-04:00",
            "2026-11-01T01:30:00-04:00",
            "2026-11-02T01:30:00-05:00"
        ]
    );
    // A job at 02:30 on the fall-back day is not in the repeated hour (01:00-02:00) at all.
    let got = next("30 2 * * *", NEW_YORK, "2026-10-31T12:00:00Z", 2);
    assert_eq!(
        got,
        ["2026-11-01T02:30:00-05:00", "2026-11-02T02:30:00-05:00"]
    );
}

/// New York, both transitions: `*/30 * * * *` keeps 30 real minutes between fires, and fires in both
/// passes of 01:00-02:00 on the fall-back night.
#[test]
fn new_york_wildcard_hour() {
    let spring = ticks_between(
        "*/30 * * * *",
        NEW_YORK,
        "2026-03-08T04:00:00Z",
        "2026-03-08T10:00:00Z",
    );
    assert_eq!((spring.len(), gaps(&spring)), (12, vec![1800]));
    let fall = ticks_between(
        "*/30 * * * *",
        NEW_YORK,
        "2026-11-01T03:00:00Z",
        "2026-11-01T09:00:00Z",
    );
    assert_eq!((fall.len(), gaps(&fall)), (12, vec![1800]));
    let s = schedule("*/30 * * * *", NEW_YORK);
    let one_oclock: Vec<String> = fall
        .iter()
        .map(|t| s.format_tick(*t))
        .filter(|t| t.contains("T01:"))
        .collect();
    assert_eq!(
        one_oclock,
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:30:00-04:00",
            "2026-11-01T01:00:00-05:00",
            "2026-11-01T01:30:00-05:00"
        ]
    );
}

/// Over a whole year in Berlin, ticks strictly increase; an elapsed-time job fires exactly 48 times a
/// day of real time, and a daily job exactly once per calendar day.
#[test]
fn a_year_of_ticks_in_berlin() {
    let half_hourly = ticks_between(
        "*/30 * * * *",
        BERLIN,
        "2026-01-01T00:00:00Z",
        "2027-01-01T00:00:00Z",
    );
    assert_eq!(half_hourly.len(), 365 * 48);
    assert_eq!(gaps(&half_hourly), [1800]);
    let s = schedule("30 2 * * *", BERLIN);
    let daily: Vec<Tick> = s
        .ticks_after(at("2025-12-31T12:00:00Z"))
        .take(365)
        .collect();
    assert!(daily.windows(2).all(|w| w[0] < w[1]));
    let mut days: Vec<String> = daily
        .iter()
        .map(|t| s.local(*t).date_naive().to_string())
        .collect();
    days.dedup();
    assert_eq!(days.len(), 365);
    assert_eq!(days.last().map(String::as_str), Some("2026-12-31"));
}

/// An expression that names an impossible date never fires.
#[test]
fn impossible_date_never_fires() {
    assert_eq!(
        schedule("0 0 30 2 *", Tz::UTC).next_after(at("2026-01-01T00:00:00Z")),
        None
    );
}

/// Bad expressions are rejected with a reason that names the field where it can.
#[test]
fn bad_expressions_are_rejected() {
    let reason = |expr: &str| Schedule::parse(expr, Tz::UTC).expect_err(expr).to_string();
    assert!(
        reason("61 * * * *").contains("minute field \"61\""),
        "{}",
        reason("61 * * * *")
    );
    assert!(
        reason("0 25 * * *").contains("hour field"),
        "{}",
        reason("0 25 * * *")
    );
    assert!(reason("0 0 * * * * *").contains("found 7"));
    assert!(reason("* * * *").contains("found 4"));
    assert!(reason("").contains("found 0"));
    assert!(reason("@reboot").contains("unknown macro"));
    assert!(reason("*/0 * * * *").contains("minute field"));
    assert!(
        reason("0 0 * * 5#6").contains("day-of-week field"),
        "{}",
        reason("0 0 * * 5#6")
    );
    assert!(reason("x y z a b").starts_with("invalid cron expression \"x y z a b\""));
}

/// The DST rule is decided by the hour field alone.
#[test]
fn elapsed_time_follows_the_hour_field() {
    for expr in [
        "* * * * *",
        "*/30 * * * *",
        "0 * * * *",
        "@hourly",
        "* * * * * *",
        "0 0 */2 * * *",
    ] {
        assert!(schedule(expr, BERLIN).follows_elapsed_time(), "{expr}");
    }
    for expr in [
        "30 2 * * *",
        "0,30 2 * * *",
        "* 2 * * *",
        "@daily",
        "0 0 1-5 * *",
    ] {
        assert!(!schedule(expr, BERLIN).follows_elapsed_time(), "{expr}");
    }
}

/// `last_at_or_before` is the inverse of `next_after`: the tick itself when `at` is one, else the one
/// before; dense, sparse and DST-shifted schedules alike, and `None` for one that never fired.
#[test]
fn last_at_or_before_finds_the_previous_tick() {
    let last = |expr: &str, tz: Tz, when: &str| {
        let schedule = schedule(expr, tz);
        schedule
            .last_at_or_before(at(when))
            .map(|t| schedule.format_tick(t))
    };
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        last("* * * * * *", BERLIN, "2026-03-01T10:00:00.500Z"),
        some("2026-03-01T11:00:00+01:00")
    );
    assert_eq!(
        last("*/5 * * * *", Tz::UTC, "2026-03-01T10:05:00Z"),
        some("2026-03-01T10:05:00+00:00")
    );
    assert_eq!(
        last("*/5 * * * *", Tz::UTC, "2026-03-01T10:04:59.999Z"),
        some("2026-03-01T10:00:00+00:00")
    );
    assert_eq!(
        last("0 0 1 1 *", Tz::UTC, "2026-12-31T23:59:59Z"),
        some("2026-01-01T00:00:00+00:00")
    );
    // The skipped 02:30 of the spring-forward night fires at 03:00 CEST (see the DST rule).
    assert_eq!(
        last("30 2 * * *", BERLIN, "2026-03-29T03:10:00+02:00"),
        some("2026-03-29T03:00:00+02:00")
    );
    assert_eq!(
        last("0 0 29 2 *", Tz::UTC, "2028-02-28T00:00:00Z"),
        some("2024-02-29T00:00:00+00:00")
    );
    // The same instants as `next_after` finds, going the other way.
    let every = schedule("7,13 */3 * * *", NEW_YORK);
    for tick in every.ticks_after(at("2026-11-01T00:00:00Z")).take(40) {
        assert_eq!(every.last_at_or_before(tick.to_utc()), Some(tick));
        let before = tick.to_utc() - chrono::Duration::milliseconds(1);
        let previous = every.last_at_or_before(before).expect("an earlier tick");
        assert_eq!(every.next_after(previous.to_utc()), Some(tick));
    }
}
