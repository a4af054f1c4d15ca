//! Cron schedules: parsing (via `croner`), time zones, the DST rule, and the tick identity.

use std::fmt;

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
        write!(f, "{}", self.to_utc().to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    }
}

/// A job's schedule: a cron expression in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    // Filled in by the schedule implementation.
}
