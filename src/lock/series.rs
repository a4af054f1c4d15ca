//! Series of claims: a scheduled tick, a trigger (`redcron trigger`) and a retry attempt are claims of
//! different series of one job.
//!
//! All series of a job share its lease key (with `overlap: skip`, so the overlap rule holds across them)
//! and its fence counter (so every token is above every earlier run's, whichever series ran it), but each
//! has claim records of its own, so that a trigger or a retry never makes a scheduled tick unclaimable.
//! The schedule keeps its one claim record per job (`…:claim`, unchanged since v2: no migration), with G1′
//! within it. A trigger request and a retry attempt are one-off instances, each with a claim record of its
//! own (`…:claim:trigger:<id>`, `…:claim:retry:<tick>:<attempt>`) that expires once its window has ended
//! (the nodes refuse a claim of it after that): one record per *instance* rather than one per series,
//! because G1′ within a series of one-offs would lose instances claimed out of order — a trigger requested
//! at `t1` by a host whose clock is behind, seen after one requested at `t2 > t1`, or the retry of a slow
//! run that failed after the retry of a later, quick one.

use std::fmt;

use crate::schedule::Tick;

/// Which series a claim belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum Series {
    /// The job's scheduled ticks.
    #[default]
    Schedule,
    /// One `redcron trigger` request, by its id (letters and digits only); its tick is the request's time.
    Trigger(String),
    /// Retry attempt `n` (1, 2, …) of a failed run; its tick is the failed run's.
    Retry(u32),
}

impl Series {
    /// The tag written into lease values of this series (`None` for the schedule, whose values stay as they
    /// were): `trigger:<id>` or `retry:<n>`.
    pub fn tag(&self) -> Option<String> {
        match self {
            Series::Schedule => None,
            Series::Trigger(id) => Some(format!("trigger:{id}")),
            Series::Retry(attempt) => Some(format!("retry:{attempt}")),
        }
    }

    /// Reads a tag written by [`Series::tag`]; a missing or unknown tag is the schedule.
    pub fn from_tag(tag: Option<&str>) -> Series {
        match tag.and_then(|tag| tag.split_once(':')) {
            Some(("trigger", id)) => Series::Trigger(id.to_string()),
            Some(("retry", n)) => n.parse().map_or(Series::Schedule, Series::Retry),
            _ => Series::Schedule,
        }
    }

    /// The suffix of this series' claim record key after `…:claim`, and of its lease key after `…:lease`
    /// with `overlap: allow`: empty for the schedule (whose lease key then ends in the tick), else one
    /// instance's own.
    pub(crate) fn key_suffix(&self, tick: Tick) -> String {
        match self {
            Series::Schedule => String::new(),
            Series::Trigger(id) => format!(":trigger:{id}"),
            Series::Retry(attempt) => format!(":retry:{}:{attempt}", tick.as_millis()),
        }
    }

    /// The attempt number: 0 outside the retries.
    pub fn attempt(&self) -> u32 {
        match self {
            Series::Retry(attempt) => *attempt,
            Series::Schedule | Series::Trigger(_) => 0,
        }
    }

    /// The trigger request's id, for a trigger.
    pub fn trigger(&self) -> Option<&str> {
        match self {
            Series::Trigger(id) => Some(id),
            Series::Schedule | Series::Retry(_) => None,
        }
    }
}

impl fmt::Display for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tag() {
            Some(tag) => f.write_str(&tag),
            None => f.write_str("schedule"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_unknown_tags_are_the_schedule() {
        for series in [
            Series::Schedule,
            Series::Trigger("0b7c".into()),
            Series::Retry(3),
        ] {
            assert_eq!(Series::from_tag(series.tag().as_deref()), series);
        }
        assert_eq!(Series::from_tag(Some("newer:1")), Series::Schedule);
        assert_eq!(Series::from_tag(Some("retry:x")), Series::Schedule);
    }

    #[test]
    fn each_instance_has_its_own_key_suffix() {
        assert_eq!(Series::Schedule.key_suffix(Tick(5)), "");
        assert_eq!(
            Series::Trigger("ab".into()).key_suffix(Tick(5)),
            ":trigger:ab"
        );
        assert_eq!(Series::Retry(2).key_suffix(Tick(5)), ":retry:5:2");
    }
}
