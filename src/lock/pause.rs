//! A paused job: the value of its `…:{<job>}:paused` key on each node.
//!
//! `redcron pause` writes the key to every node (with a TTL for `--for`, so that it expires by itself on each
//! node) and succeeds once a majority took it; both rounds of every claim of the job refuse while the key is
//! there (see `ACQUIRE` and `CONFIRM` in [`crate::store::redis::scripts`]). Since every grant needs a
//! majority of confirmations, and every majority meets the pause's, no claim whose confirmation reaches a
//! node after the pause did is granted — on any worker, also on one that never heard of the pause.
//!
//! The value is `<until ms>|<by>|<reason>`: the reason last, so that it may hold any text (a `|` too);
//! `until` is `0` for a pause without end.
//!
//! A pause never shortens a pause in force by accident: writing one is a compare-and-set in every store
//! ([`Pause::decide`], and the `PAUSE` script on Redis) that keeps a pause in force which outlasts the new
//! one, unless the command said `--replace` ([`InForce::Replace`]); and a pause that had ended by the
//! time it was written (`pause --for 1ms`) is not written at all ([`PauseOutcome::AlreadyOver`]).

use chrono::{DateTime, Utc};
use serde::Serialize;

/// A job's pause, as written by `redcron pause` and read back by the claims and `redcron status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// When it ends by itself (`--for`), or `None` until `redcron resume`.
    pub until: Option<DateTime<Utc>>,
    /// Who paused it (`user@host` of the command).
    pub by: String,
    /// Why (`--reason`), possibly empty.
    pub reason: String,
}

/// The longest pause with an end (`--for`): a pause meant to last longer is a pause until `resume`.
pub const MAX_FOR: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);

impl Pause {
    /// How long a pause is to last, as an operator writes it (`pause --for`, the dashboard's pause):
    /// a duration above zero and at most [`MAX_FOR`].
    pub fn parse_for(text: &str) -> Result<std::time::Duration, String> {
        let duration = humantime::parse_duration(text.trim()).map_err(|e| {
            format!("{text:?} is not a duration ({e}); expected e.g. 90s, 30m, 2h, 1day")
        })?;
        if duration.is_zero() || duration > MAX_FOR {
            return Err(format!(
                "{text:?}: a pause lasts more than zero and at most a year; leave --for out to pause until `redcron resume`"
            ));
        }
        Ok(duration)
    }

    /// The value stored on the nodes.
    pub fn to_value(&self) -> String {
        let until = self.until.map_or(0, |until| until.timestamp_millis());
        // `by` is the only field a `|` would break; the reason, last, may hold one.
        format!("{until}|{}|{}", self.by.replace('|', "/"), self.reason)
    }

    /// Reads a stored value; never fails (a value that does not parse is a pause without end, its whole
    /// text the reason, since nothing proves the job free).
    pub fn from_value(value: &str) -> Pause {
        let mut fields = value.splitn(3, '|');
        let until = fields.next().and_then(|ms| ms.parse::<i64>().ok());
        match (until, fields.next(), fields.next()) {
            (Some(until), Some(by), Some(reason)) => Pause {
                until: (until > 0)
                    .then(|| DateTime::from_timestamp_millis(until))
                    .flatten(),
                by: by.to_string(),
                reason: reason.to_string(),
            },
            _ => Pause {
                until: None,
                by: String::new(),
                reason: value.to_string(),
            },
        }
    }
}

/// A pause as read from the nodes: the one found on the most of them, and on how many.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PauseRead {
    #[serde(flatten)]
    pub pause: Pause,
    /// How many of the nodes that answered hold it (1 for the embedded store; every endpoint for etcd,
    /// whose committed state every member applies); a pause on fewer than a majority of the configured
    /// nodes does not stop every claim.
    pub nodes: usize,
}

/// What writing a pause does to a pause in force that lasts longer than the new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InForce {
    /// Keeps it, unchanged: a shorter `pause --for` never shortens a pause in force (the default).
    KeepLonger,
    /// Replaces it (`pause --replace`).
    Replace,
}

impl InForce {
    /// The word the `PAUSE` script takes.
    pub fn as_arg(self) -> &'static str {
        match self {
            InForce::KeepLonger => "keep",
            InForce::Replace => "replace",
        }
    }
}

/// How writing a pause ended, on a majority of the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseOutcome {
    /// The pause was written.
    Paused,
    /// A pause in force outlasts the new one and stays, unchanged ([`InForce::KeepLonger`]); nothing was
    /// written.
    LongerKept(Pause),
    /// The pause had ended by the time it was written (its `until` had passed on the writer's clock):
    /// nothing was written, and a pause in force stays.
    AlreadyOver,
}

impl Pause {
    /// How long the pause has left at `now`, for a TTL: `None` for a pause without end, zero once it ended.
    pub fn left(&self, now: DateTime<Utc>) -> Option<std::time::Duration> {
        self.until
            .map(|until| (until - now).to_std().unwrap_or_default())
    }

    /// Whether this pause, standing at `now`, lasts longer than `other`: it has no end and `other` has
    /// one, or it ends after `other` and after `now`.
    pub fn outlasts(&self, other: &Pause, now: DateTime<Utc>) -> bool {
        match (self.until, other.until) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(mine), Some(theirs)) => mine > theirs && mine > now,
        }
    }

    /// What writing this pause does at `now`, where `current` is the pause standing (if any): keeps
    /// `current` if it outlasts this one (unless `in_force` is [`InForce::Replace`]), refuses this one if
    /// it has ended, else writes it ([`PauseOutcome::Paused`]). Every store decides this atomically with
    /// its write: on etcd and the embedded store by this function, on Redis by the `PAUSE` script, which
    /// mirrors it.
    pub fn decide(
        &self,
        current: Option<&Pause>,
        in_force: InForce,
        now: DateTime<Utc>,
    ) -> PauseOutcome {
        if let Some(current) = current {
            if in_force == InForce::KeepLonger && current.outlasts(self, now) {
                return PauseOutcome::LongerKept(current.clone());
            }
        }
        match self.until {
            Some(until) if until <= now => PauseOutcome::AlreadyOver,
            _ => PauseOutcome::Paused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_garbage_reads_as_a_pause() {
        let pause = Pause {
            until: DateTime::from_timestamp_millis(1_795_436_805_000),
            by: "ops@vm|x".to_string(),
            reason: "migration | step 2".to_string(),
        };
        let read = Pause::from_value(&pause.to_value());
        assert_eq!(read.until, pause.until);
        assert_eq!(read.by, "ops@vm/x");
        assert_eq!(read.reason, pause.reason);
        let forever = Pause::from_value("0|ops@vm|");
        assert_eq!(forever.until, None);
        assert_eq!(forever.reason, "");
        assert_eq!(Pause::from_value("junk").reason, "junk");
    }

    fn ending(at: Option<i64>) -> Pause {
        Pause {
            until: at.and_then(DateTime::from_timestamp_millis),
            by: "ops".to_string(),
            reason: String::new(),
        }
    }

    #[test]
    fn a_pause_in_force_that_outlasts_the_new_one_is_kept_unless_replaced() {
        let now = DateTime::from_timestamp_millis(10_000).unwrap_or_default();
        let keep = InForce::KeepLonger;
        let (forever, long, short) = (ending(None), ending(Some(60_000)), ending(Some(20_000)));
        assert_eq!(
            short.decide(Some(&long), keep, now),
            PauseOutcome::LongerKept(long.clone())
        );
        assert_eq!(
            short.decide(Some(&forever), keep, now),
            PauseOutcome::LongerKept(forever.clone())
        );
        // Longer, or as long: written (a pause without end over another updates who and why).
        assert_eq!(long.decide(Some(&short), keep, now), PauseOutcome::Paused);
        assert_eq!(forever.decide(Some(&long), keep, now), PauseOutcome::Paused);
        assert_eq!(
            forever.decide(Some(&forever), keep, now),
            PauseOutcome::Paused
        );
        assert_eq!(long.decide(Some(&long), keep, now), PauseOutcome::Paused);
        assert_eq!(
            short.decide(Some(&long), InForce::Replace, now),
            PauseOutcome::Paused
        );
        assert_eq!(short.decide(None, keep, now), PauseOutcome::Paused);
    }

    #[test]
    fn a_pause_over_when_written_is_refused_and_keeps_the_one_in_force() {
        let now = DateTime::from_timestamp_millis(10_000).unwrap_or_default();
        let (over, long) = (ending(Some(10_000)), ending(Some(60_000)));
        assert_eq!(
            over.decide(None, InForce::KeepLonger, now),
            PauseOutcome::AlreadyOver
        );
        assert_eq!(
            over.decide(Some(&long), InForce::KeepLonger, now),
            PauseOutcome::LongerKept(long.clone())
        );
        assert_eq!(
            over.decide(Some(&long), InForce::Replace, now),
            PauseOutcome::AlreadyOver
        );
        // A standing key whose end has passed (an etcd lease rounds up to whole seconds) is no pause in
        // force: it does not keep a new one out.
        let ended = ending(Some(9_000));
        assert_eq!(
            ending(Some(20_000)).decide(Some(&ended), InForce::KeepLonger, now),
            PauseOutcome::Paused
        );
    }
}
