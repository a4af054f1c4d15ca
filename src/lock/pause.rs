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

impl Pause {
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

impl Pause {
    /// How long the pause has left at `now`, for a TTL: `None` for a pause without end, zero once it ended.
    pub fn left(&self, now: DateTime<Utc>) -> Option<std::time::Duration> {
        self.until
            .map(|until| (until - now).to_std().unwrap_or_default())
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
}
