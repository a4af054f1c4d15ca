//! Times in the views: how they are written for a person, how a tick given back is read, and the RFC 3339
//! form that goes beside every tick held in epoch milliseconds.
//!
//! The history entries and the members' runs under way hold their tick as stored, in milliseconds since the
//! Unix epoch; the views keep those types as they are (the store writes them) and add `tick_rfc3339` when
//! they are serialised ([`entries`], [`entry`], [`member`]), so that a reader of the JSON needs no
//! conversion and can hand either form back to `explain` ([`parse_tick`]).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};

use crate::history::tick::TickRecord;
use crate::history::Entry;
use crate::membership::{Member, Running, Sharer};

/// An instant as RFC 3339 in UTC, with milliseconds only when it has any: `2026-11-23T10:00:00Z`,
/// `2026-11-23T10:00:00.012Z` (the form [`parse_tick`] reads back).
pub fn instant(at: DateTime<Utc>) -> String {
    use chrono::{Datelike as _, Timelike as _};
    let year = at.year();
    let millis = at.timestamp_subsec_millis();
    if !(0..=9999).contains(&year) || millis > 999 {
        let format = if millis == 0 {
            SecondsFormat::Secs
        } else {
            SecondsFormat::Millis
        };
        return at.to_rfc3339_opts(format, true);
    }
    // Written digit by digit: a page of the dashboard writes tens of thousands of these, and chrono's
    // formatter takes several times as long. The result is chrono's (a unit test holds them equal).
    let mut text = String::with_capacity(24);
    push_digits(&mut text, year as u32, 4);
    for (separator, value) in [
        ('-', at.month()),
        ('-', at.day()),
        ('T', at.hour()),
        (':', at.minute()),
        (':', at.second()),
    ] {
        text.push(separator);
        push_digits(&mut text, value, 2);
    }
    if millis != 0 {
        text.push('.');
        push_digits(&mut text, millis, 3);
    }
    text.push('Z');
    text
}

/// Writes the last `width` decimal digits of `value`, with leading zeros.
fn push_digits(text: &mut String, value: u32, width: u32) {
    for place in (0..width).rev() {
        text.push(char::from(b'0' + (value / 10u32.pow(place) % 10) as u8));
    }
}

/// [`instant`] of milliseconds since the Unix epoch, as the entries hold ticks; the number itself if it is
/// out of chrono's range.
pub fn instant_ms(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms).map_or_else(|| ms.to_string(), instant)
}

/// A duration in milliseconds as a person reads it: `850ms`, `1.288s`, `2m 5s`.
pub fn duration_ms(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{}.{:03}s", ms / 1000, ms % 1000)
    } else {
        humantime::format_duration(std::time::Duration::from_secs(ms / 1000)).to_string()
    }
}

/// A tick as the views print it: RFC 3339 (`2026-11-23T10:00:00Z`, any offset, as the tables and
/// `tick_rfc3339` print it) or milliseconds since the Unix epoch (`1795436705000`, as the JSON's `tick` of
/// entries and runs) — also inside a run under way as `status` prints it, `JOB@TICK#TOKEN`. The error
/// says both forms.
pub fn parse_tick(text: &str) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    let text = text.rsplit_once('@').map_or(text, |(_, tick)| tick);
    let text = text.split_once('#').map_or(text, |(tick, _)| tick);
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<i64>()
            .ok()
            .and_then(DateTime::from_timestamp_millis)
            .ok_or_else(|| format!("{text} milliseconds since the Unix epoch is out of range"));
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!(
                "{e}; expected an RFC 3339 timestamp such as 2026-11-23T10:00:00Z or milliseconds since \
                 the Unix epoch such as 1795436705000 (as history and status print ticks)"
            )
        })
}

/// The RFC 3339 form of a tick in epoch milliseconds; `None` (JSON `null`) out of chrono's range.
fn rfc3339(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
}

/// An entry as stored, then `tick_rfc3339`.
#[derive(Serialize)]
struct StampedEntry<'a> {
    #[serde(flatten)]
    entry: &'a Entry,
    tick_rfc3339: Option<DateTime<Utc>>,
}

impl<'a> StampedEntry<'a> {
    fn of(entry: &'a Entry) -> StampedEntry<'a> {
        StampedEntry {
            entry,
            tick_rfc3339: rfc3339(entry.tick),
        }
    }
}

/// Serialises entries as stored, each with its tick also in RFC 3339 (`tick_rfc3339`), for
/// `#[serde(serialize_with)]`.
pub(crate) fn entries<S: Serializer>(entries: &[Entry], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(entries.iter().map(StampedEntry::of))
}

/// A tick's record as the views print it: the record's entry as stored with `tick_rfc3339`, then the
/// other workers' runs of it (a double run) and its notes, each stamped the same way.
#[derive(Serialize)]
struct StampedRecord<'a> {
    #[serde(flatten)]
    record: StampedEntry<'a>,
    other_runs: Vec<StampedEntry<'a>>,
    notes: Vec<StampedEntry<'a>>,
}

/// Serialises tick records ([`TickRecord`]), each as its record's fields with `tick_rfc3339`, and
/// `other_runs` and `notes` as entries are, for `#[serde(serialize_with)]`.
pub(crate) fn records<S: Serializer>(
    records: &[TickRecord],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(records.iter().map(|r| StampedRecord {
        record: StampedEntry::of(&r.record),
        other_runs: r.other_runs.iter().map(StampedEntry::of).collect(),
        notes: r.notes.iter().map(StampedEntry::of).collect(),
    }))
}

/// [`entries`] of at most one entry (`null` for none).
pub(crate) fn entry<S: Serializer>(
    entry: &Option<Entry>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    entry.as_ref().map(StampedEntry::of).serialize(serializer)
}

/// A run under way as a member announces it (`job`, `tick`, `token`), with `tick_rfc3339` beside the tick.
#[derive(Serialize)]
struct StampedRunning<'a> {
    job: &'a str,
    tick: i64,
    tick_rfc3339: Option<DateTime<Utc>>,
    token: u64,
}

/// A member as stored, in the order [`Member`] declares its fields, each run under way with its tick also
/// in RFC 3339. Lists every field, so that a field added to [`Member`] does not compile until it is here.
#[derive(Serialize)]
struct StampedMember<'a> {
    id: &'a str,
    host: &'a str,
    pid: u32,
    version: &'a str,
    config_fingerprint: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    clock_offset_ms: Option<i64>,
    started_at: DateTime<Utc>,
    running: Vec<StampedRunning<'a>>,
    heartbeat_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    honours: Option<&'a [String]>,
    state: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    seen_at: Option<DateTime<Utc>>,
    alive: bool,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    shared_with: &'a [Sharer],
}

/// Serialises a member as stored, each of its runs under way with `tick_rfc3339`, for
/// `#[serde(serialize_with)]` (also flattened).
pub(crate) fn member<S: Serializer>(member: &Member, serializer: S) -> Result<S::Ok, S::Error> {
    let Member {
        id,
        host,
        pid,
        version,
        config_fingerprint,
        clock_offset_ms,
        started_at,
        running,
        heartbeat_ms,
        honours,
        state,
        seen_at,
        alive,
        shared_with,
    } = member;
    let running = running
        .iter()
        .map(|Running { job, tick, token }| StampedRunning {
            job,
            tick: *tick,
            tick_rfc3339: rfc3339(*tick),
            token: *token,
        })
        .collect();
    StampedMember {
        id,
        host,
        pid: *pid,
        version,
        config_fingerprint,
        clock_offset_ms: *clock_offset_ms,
        started_at: *started_at,
        running,
        heartbeat_ms: *heartbeat_ms,
        honours: honours.as_deref(),
        state,
        seen_at: *seen_at,
        alive: *alive,
        shared_with,
    }
    .serialize(serializer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Kind;

    /// The hand-written [`instant`] writes what chrono writes, across the years and with and without
    /// milliseconds.
    #[test]
    fn instants_are_written_as_chrono_writes_them() {
        let mut ms: i64 = -62_135_596_800_000; // 0001-01-01
        let step = 7_777_777_777_i64 + 13;
        while ms < 253_402_300_799_000 {
            let at = DateTime::from_timestamp_millis(ms).expect("in range");
            let format = if at.timestamp_subsec_millis() == 0 {
                SecondsFormat::Secs
            } else {
                SecondsFormat::Millis
            };
            assert_eq!(instant(at), at.to_rfc3339_opts(format, true), "{ms}");
            ms += step;
        }
        let whole = DateTime::from_timestamp(1_795_729_570, 0).expect("in range");
        assert_eq!(instant(whole), "2026-11-26T21:46:10Z");
        assert_eq!(instant_ms(1_795_729_570_012), "2026-11-26T21:46:10.012Z");
    }
    use crate::schedule::Tick;

    /// A tick is read back in both forms the views print it, and a wrong one names both forms.
    #[test]
    fn a_tick_is_read_as_rfc_3339_or_epoch_milliseconds() {
        let tick = DateTime::from_timestamp_millis(1_795_436_705_012).expect("in range");
        assert_eq!(parse_tick("1795436705012"), Ok(tick));
        assert_eq!(parse_tick("2026-11-23T12:25:05.012Z"), Ok(tick));
        assert_eq!(parse_tick(&instant(tick)), Ok(tick));
        assert_eq!(parse_tick("2026-11-23T13:25:05.012+01:00"), Ok(tick));
        // The other forms the tables print: a run under way in `status`, a second's tick, the JSON's
        // nanoseconds.
        assert_eq!(
            parse_tick("rollup@2026-11-23T12:25:05.012Z#1795436705000000"),
            Ok(tick)
        );
        let whole = DateTime::from_timestamp_millis(1_795_436_705_000).expect("in range");
        assert_eq!(parse_tick(&instant_ms(1_795_436_705_000)), Ok(whole));
        let json = serde_json::json!(tick);
        assert_eq!(parse_tick(json.as_str().unwrap_or_default()), Ok(tick));
        assert_eq!(
            parse_tick("-1000"),
            Ok(DateTime::UNIX_EPOCH - chrono::Duration::seconds(1))
        );
        let error = parse_tick("yesterday").expect_err("neither form");
        assert!(
            error.contains("RFC 3339") && error.contains("milliseconds since the Unix epoch"),
            "{error}"
        );
        let error = parse_tick("99999999999999999999").expect_err("out of range");
        assert!(error.contains("out of range"), "{error}");
    }

    /// The JSON of an entry and of a member is the stored one plus `tick_rfc3339` beside each tick.
    #[test]
    fn ticks_in_milliseconds_carry_rfc_3339_beside_them() {
        let entry = Entry::new(
            "j",
            Tick(1_795_436_705_000),
            "w1",
            Kind::Run,
            DateTime::UNIX_EPOCH,
        );
        let mut json = serde_json::to_value(StampedEntry::of(&entry)).expect("json");
        assert_eq!(json["tick_rfc3339"], "2026-11-23T12:25:05Z");
        json.as_object_mut().map(|o| o.remove("tick_rfc3339"));
        assert_eq!(json, serde_json::to_value(&entry).expect("json"));

        let stored = r#"{"id":"w1","host":"h","pid":7,"version":"1","config_fingerprint":"f",
            "clock_offset_ms":-3,"started_at":"2026-11-23T10:00:00Z",
            "running":[{"job":"j","tick":1795436705000,"token":9}],"heartbeat_ms":5000,
            "honours":["pause"],"state":"running","seen_at":"2026-11-23T10:25:06Z","alive":true}"#;
        let member: Member = serde_json::from_str(stored).expect("a member");
        let mut json = member_json(&member);
        assert_eq!(json["running"][0]["tick_rfc3339"], "2026-11-23T12:25:05Z");
        json["running"][0]
            .as_object_mut()
            .map(|o| o.remove("tick_rfc3339"));
        assert_eq!(json, serde_json::to_value(&member).expect("json"));
        // Without runs under way: the stored text itself, fields in their order, absent ones absent.
        let bare: Member =
            serde_json::from_str(r#"{"id":"w2","started_at":"2026-11-23T10:00:00Z"}"#)
                .expect("a member");
        let mut text = Vec::new();
        super::member(&bare, &mut serde_json::Serializer::new(&mut text)).expect("json");
        assert_eq!(
            String::from_utf8_lossy(&text),
            serde_json::to_string(&bare).expect("json")
        );
    }

    fn member_json(member: &Member) -> serde_json::Value {
        super::member(member, serde_json::value::Serializer).expect("json")
    }
}
